"""Ops built with dtype=torch.float16: RS and AR on every plan family, the GEMM alone, partial
tiles, out=, and fp16 and bf16 ops sharing one workspace, against float32 / float64
references on NaN-poisoned outputs.

mpirun -n 2 python -m pytest -q tests/gpu/test_f16_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from gpu_ops import get_op
from rsar_core import GemmRsAr, Workspace
from rsar_core.reference import rank_inputs, rel_error, rs_rows
from test_fused_gpu import TOL, check, knobs

F16 = torch.float16


def _dev() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("N", [384, 7168])
@pytest.mark.parametrize("K", [64, 1024, 4096])
@pytest.mark.parametrize("M", [1, 128, 129, 700, 1000, 4096])
def test_default_plans(comm, M, N, K, ar):
    """What an fp16 op runs by default: push-all and pairs along N at one tile row,
    peers-first, the flat order and the split-K tail, 2x1 clusters with the lag round."""
    check(get_op(comm, N, ar, dtype=F16), seed=M * 3 + K + N, M=M, K=K)


@pytest.mark.parametrize("forced", [
    dict(cta_group=1), dict(cta_group=2),
    dict(peers_first=True, cta_group=1), dict(bn=64)],
    ids=["c1", "c2", "c1pf", "bn64"])
@pytest.mark.parametrize("push", ["lsu", None], ids=["lsu", "tma"])
@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("M,K", [(129, 1024), (1000, 4096), (4096, 1024)])
def test_forced_plans(comm, M, K, ar, push, forced):
    """Thread-store pushes and bulk copies (the fp16 unpack and sum run in both), on each
    order and cluster shape."""
    with knobs(get_op(comm, 7168, ar, dtype=F16), push=push, **forced) as op:
        check(op, seed=M + 7 * K + len(forced), M=M, K=K)


@pytest.mark.parametrize("M,N,K", [(1, 7168, 1024), (320, 7168, 4096), (2048, 7168, 1024),
                                   (4096, 8192, 4096), (1000, 2880, 2048), (300, 1000, 64)])
def test_gemm_only(comm, M, N, K):
    """The GEMM alone (TMA store, 2x1 clusters, 1-CTA plans, the split-K tail, partial tiles)
    against the float64 product of the fp16 inputs."""
    op = get_op(comm, N, False, max_M=4096, dtype=F16)
    x, w = rank_inputs(M + N + K, op.rank, M, N, K, _dev(), dtype=F16)
    op.gemm_only(x, w)  # compiles; the next call allocates its output first
    bait = torch.full((M, N), float("nan"), dtype=F16, device=_dev())
    del bait
    y = op.gemm_only(x, w)
    torch.cuda.synchronize()
    assert y.dtype == F16 and not torch.isnan(y).any()
    assert rel_error(y, x.double() @ w.double().t()) < TOL


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("N", [2880, 1000])
@pytest.mark.parametrize("M,K", [(1, 1024), (300, 4096), (1000, 64), (4096, 1024)])
def test_partial_tiles(comm, M, N, K, ar):
    """N that ends each tile row on a partial tile."""
    check(get_op(comm, N, ar, max_M=4096, dtype=F16), seed=M + 5 * N + K, M=M, K=K)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
def test_out_and_the_fp16_range(comm, ar):
    """``out=`` takes an fp16 buffer. Sums past fp16's range come back inf, as from torch.mm
    on fp16 followed by a collective: each rank's partial is rounded to fp16 before the
    exchange and the sum after it (no wrap, no clamp)."""
    op = get_op(comm, 384, ar, max_M=4096, dtype=F16)
    M, K = 256, 1024

    def inputs(r):
        x, w = rank_inputs(11, r, M, op.N, K, _dev(), dtype=F16)
        x[:8] *= 128  # rows 0-7: partials of std ~32768, past 65504 in a few percent
        return x, w * 256
    x, w = inputs(op.rank)
    rows = M if ar else op.plan(M, K).local_M
    out = torch.full((rows, op.N), float("nan"), dtype=F16, device=_dev())
    assert op(x, w, out=out) is out
    torch.cuda.synchronize()
    op.check()
    ref = torch.zeros(M, op.N, dtype=torch.float32, device=_dev())
    for r in range(op.world):
        xr, wr = inputs(r)
        ref += (xr.float() @ wr.float().t()).to(F16).float()
    if not ar:
        ref = rs_rows(ref, op.rank, op.world)
    # margins around fp16's overflow point (65520 rounds to inf) for the fp32 sums' rounding
    big, finite = ref.abs() >= 65600, ref.abs() < 65000
    if ar or op.rank == 0:  # RS: rows 0-7 are rank 0's
        assert big.sum() > 10
    assert torch.isposinf(out[big & (ref > 0)]).all()
    assert torch.isneginf(out[big & (ref < 0)]).all()
    assert torch.isfinite(out[finite]).all()
    assert rel_error(out[finite], ref[finite]) < TOL


def test_fp16_and_bf16_ops_share_a_workspace(comm):
    """One workspace, an fp16 RS op and a bf16 AR op interleaved: each right every time."""
    with Workspace(max_M=2048, N=1024, comm=comm) as ws:
        ops = [GemmRsAr(2048, 1024, all_reduce=False, dtype=F16, workspace=ws),
               GemmRsAr(2048, 1024, all_reduce=True, workspace=ws)]
        try:
            for i, (M, K) in enumerate([(1000, 1024), (64, 4096), (2048, 64), (129, 1024)]):
                for op in ops:
                    check(op, seed=100 + i, M=M, K=K)
        finally:
            for op in ops:
                op.close()


def test_wrong_dtype_is_refused_and_the_op_stays_usable(comm):
    op = get_op(comm, 384, True, max_M=4096, dtype=F16)
    x, w = rank_inputs(5, op.rank, 64, op.N, 128, _dev())  # bf16
    with pytest.raises(TypeError, match="float16"):
        op(x, w)
    check(op, seed=6, M=64, K=128)
