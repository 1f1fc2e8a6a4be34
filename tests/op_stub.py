"""A GemmRsAr that plans without a device (no communicator, no workspace): its plans and the
kernel variants it would launch are what CPU tests look at."""
from __future__ import annotations

from launch.cache import default_push
from rsar_core.gemm_rsar import GemmRsAr


def planning_op(mode: str = "rs", transport: str = "unicast", arch: str = "sm_90a",
                N: int = 7168, world: int = 2, sm_count: int = 132) -> GemmRsAr:
    op = object.__new__(GemmRsAr)
    op.N, op.world, op.sm_count, op.mode, op.arch = N, world, sm_count, mode, arch
    op.all_reduce, op.transport = mode == "ar", transport
    op.push = default_push(arch, transport, mode)
    op._set_default_knobs()
    op._plans = {}
    return op
