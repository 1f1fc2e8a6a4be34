"""A GemmRsAr that plans without a device (no communicator, no workspace): its plans and the
kernel variants it would launch are what CPU tests look at."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from launch.cache import default_push
from rsar_core.gemm_rsar import GemmRsAr


def planning_op(mode: str = "rs", transport: str = "unicast", arch: str = "sm_90a",
                N: int = 7168, world: int = 2, sm_count: int = 132,
                dtype: torch.dtype = torch.bfloat16) -> GemmRsAr:
    from rsar_core.validate import check_dtype
    op = object.__new__(GemmRsAr)
    op.dtype, op._elem = dtype, check_dtype(dtype)
    op.N, op.world, op.sm_count, op.mode, op.arch = N, world, sm_count, mode, arch
    op.all_reduce, op.transport = mode == "ar", transport
    op.push = default_push(arch, transport, mode)
    op._set_default_knobs()
    op._plans = {}
    op.rank, op.timeout_ns = 0, 5_000_000_000
    # the fields a launch's fixed arguments read, all zero: nothing here launches
    op._ws = SimpleNamespace(
        mem=SimpleNamespace(local_ptr=0, peer_ptrs_dev=0, multicast_ptr=0),
        layout=SimpleNamespace(arrive_off=0, result_off=0, recv_off=0, recv_region_bytes=0,
                               part_off=0, out_off=0),
        err=SimpleNamespace(data_ptr=lambda: 0), closed=False)
    return op
