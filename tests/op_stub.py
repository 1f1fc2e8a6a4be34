"""A GemmRsAr that plans without a device (no communicator, no workspace): its plans and the
kernel variants it would launch are what CPU tests look at."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from launch.tuning import Tuning
from rsar_core.gemm_rsar import GemmRsAr
from rsar_core.reference import scaled_product


def retuned(op: GemmRsAr, **changes) -> GemmRsAr:
    """A planning op like ``op`` with its tuning changed (``GemmRsAr.retune`` without a
    workspace)."""
    new = object.__new__(GemmRsAr)
    new.__dict__.update(op.__dict__)
    new.tuning, new._plans = op.tuning.replace(**changes), {}
    return new


def planning_op(mode: str = "rs", transport: str = "unicast", arch: str = "sm_90a",
                N: int = 7168, world: int = 2, sm_count: int = 132,
                dtype: torch.dtype = torch.bfloat16,
                input_dtype: torch.dtype | None = None,
                tuning: Tuning | None = None) -> GemmRsAr:
    from rsar_core.validate import check_input_dtype
    op = object.__new__(GemmRsAr)
    op.dtype = dtype
    op.input_dtype = input_dtype if check_input_dtype(input_dtype, dtype) else dtype
    op.N, op.world, op.sm_count, op.mode, op.arch = N, world, sm_count, mode, arch
    op._pairs = sm_count  # the agreed 2x1 occupancy (every SM, as the tests' GPU)
    op.all_reduce, op.transport = mode == "ar", transport
    op.tuning = tuning or Tuning()
    op._plans = {}
    op.rank, op.timeout_ns = 0, 5_000_000_000
    # the fields a launch's fixed arguments read, all zero: nothing here launches
    op._ws = SimpleNamespace(
        mem=SimpleNamespace(local_ptr=0, peer_ptrs_dev=0, multicast_ptr=0),
        layout=SimpleNamespace(arrive_off=0, result_off=0, recv_off=0, recv_region_bytes=0,
                               part_off=0, out_off=0),
        err=SimpleNamespace(data_ptr=lambda: 0), closed=False)
    return op


def cpu_op(monkeypatch, mode: str = "rs", dtype: torch.dtype = torch.bfloat16,
           N: int = 128, max_M: int = 64, input_dtype: torch.dtype | None = None,
           tuning: Tuning | None = None) -> GemmRsAr:
    """A planning op on the CPU that calls like the real one (checks, plan, output, ``out=``)
    but whose launch is the float32 product (fp8: of the scaled operands) rounded to the
    output's dtype, rank 0's rows (plus ``bias=``, in float32 before the rounding)."""
    op = planning_op(mode, N=N, dtype=dtype, input_dtype=input_dtype, tuning=tuning)
    op.max_M, op.device = max_M, torch.device("cpu")
    monkeypatch.setattr(op, "_require_kernel", lambda: None, raising=False)
    monkeypatch.setattr(op, "check", lambda: None, raising=False)
    monkeypatch.setattr(op, "_prepare",
                        lambda M, K, mode, *, block=False, bias=False: (
                            op._resolve(M, K, mode, block, bias)[0], None, ()), raising=False)

    def launch(prepared, x, w, y, x_scale=None, w_scale=None, bits=0, bias=None):
        if x_scale is not None:
            full = scaled_product(x, w, x_scale, w_scale).float().to(y.dtype).float()
        else:
            full = x.float() @ w.float().t()
        if bias is not None:
            full = full + bias.float()
        full = full.to(y.dtype)
        y.copy_(full if mode == "ar" else full[: y.shape[0]])
    monkeypatch.setattr(op, "_launch_prepared", launch, raising=False)
    return op
