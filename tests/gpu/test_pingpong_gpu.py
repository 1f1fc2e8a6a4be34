"""Ping-pong MMA warp groups (``Tuning.pingpong``, ``launch.pingpong``): whole tiles per warp
group, taken by turns. The same wgmmas in the same order as the cooperative kernel's at the
same width, so every result must equal the cooperative one bit for bit, besides matching
the float64 reference.

mpirun -n 2 python -m pytest -q tests/gpu/test_pingpong_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from gpu_ops import get_op
from rsar_core.errors import RsarValueError
from rsar_core.reference import rank_inputs
from test_fused_gpu import check, check_gemm_only_bitwise, knobs


def _dev() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


@pytest.mark.parametrize("N", [7168, 8192, 2880])
@pytest.mark.parametrize("bn,cta_group", [(192, 1), (192, 2), (160, 1), (160, 2), (128, 1),
                                          (128, 2)])
@pytest.mark.parametrize("M,K", [(1, 64), (129, 1024), (640, 4096), (1000, 1024),
                                 (2048, 9216), (4100, 1024)])
def test_gemm_only_pingpong(comm, M, N, K, bn, cta_group):
    """The GEMM alone: rounds of one tile (a lane with one tile leaves the second group
    idle), odd and even round counts, a partial last tile row and column."""
    op = get_op(comm, N, False)
    x, w = rank_inputs(M * 3 + K + N + bn, op.rank, M, op.N, K, _dev())
    force = {"bn": bn, "cta_group": cta_group}
    with knobs(op, pingpong=True, **force) as pingpong, knobs(op, **force) as cooperative:
        check_gemm_only_bitwise(pingpong, cooperative, x, w)


@pytest.mark.parametrize("N", [7168, 8192])
@pytest.mark.parametrize("bn,stages", [(192, 5), (176, 5), (144, 6)])
@pytest.mark.parametrize("M,K", [(1000, 1024), (4100, 1024), (2048, 4096)])
def test_gemm_only_pingpong_short_ring(comm, M, N, K, bn, stages):
    """Ping-pong with more mainloop stages than a whole-tile ring leaves room for (192 wide:
    3 slots of 6; 176: 8 of 11; 144 at 6 stages: 5 of 9): the two groups' sub-tiles share
    the short ring, whose oldest slot the store warp hands back once its store has read it."""
    op = get_op(comm, N, False)
    x, w = rank_inputs(M * 5 + K + N + bn, op.rank, M, op.N, K, _dev())
    force = {"bn": bn, "cta_group": 2}
    with knobs(op, pingpong=True, stages=stages, **force) as pingpong, \
            knobs(op, **force) as cooperative:
        check_gemm_only_bitwise(pingpong, cooperative, x, w)


@pytest.mark.parametrize("M,N", [(8192, 7168), (8192, 8192), (2048, 7168), (3000, 7168),
                                 (1300, 8192), (2000, 5120), (3000, 2880)])
def test_gemm_only_default_pingpong_plan(comm, M, N):
    """The plan the op runs by default at K=1024 where ``choose_gemm_pingpong`` takes
    ping-pong (3+ tiles a lane, its modelled time below the cooperative plan's; 5 mainloop
    stages at 176 / 192 wide, ``default_stages``; partial last tile rows and columns too)
    against the cooperative kernel at the same width."""
    op = get_op(comm, N, False)
    v = op.variant(M, 1024, "gemm")
    assert v.pingpong and v.cta_group == 2, v.describe()
    assert v.stages == (5 if v.bn in (176, 192) else 0), v.describe()
    x, w = rank_inputs(M * 7 + N, op.rank, M, op.N, 1024, _dev())
    with knobs(op, bn=v.bn, cta_group=2, pingpong=False) as cooperative:
        check_gemm_only_bitwise(op, cooperative, x, w)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("force", [{}, {"cta_group": 2}, {"peers_first": True},
                                   {"peers_first": True, "flat": True}],
                         ids=["c1", "c2", "pf", "flat"])
@pytest.mark.parametrize("M,K", [(1, 64), (300, 1024), (1000, 4096), (2048, 1024)])
@pytest.mark.parametrize("bn", [128, 160])
def test_fused_pingpong(comm, M, K, force, ar, bn):
    """The fused op on 128-wide tiles (104 / 200 registers) and 160-wide ones (72 / 216;
    at N=7168 a partial last tile column): against the float64 sum, then bitwise against
    the cooperative kernel on the same plan."""
    op = get_op(comm, 7168, ar)
    force = {"bn": bn, "cta_group": 1, **force}
    with knobs(op, pingpong=True, **force) as pingpong:
        check(pingpong, seed=M + K + int(ar), M=M, K=K)
        x, w = rank_inputs(M * 5 + K, op.rank, M, op.N, K, _dev())
        y = pingpong(x, w)
    with knobs(op, **force) as cooperative:
        y0 = cooperative(x, w)
    torch.cuda.synchronize()
    assert torch.equal(y, y0)


def test_pingpong_refuses_wide_tiles_before_launch(comm):
    """A plan too wide for whole tiles per warp group is refused before anything launches,
    and the op's next call runs."""
    op = get_op(comm, 7168, False)
    x, w = rank_inputs(11, op.rank, 4096, op.N, 1024, _dev())
    with knobs(op, pingpong=True, bn=256) as wide:
        with pytest.raises(RsarValueError, match="at most 192"):
            wide.gemm_only(x, w)
        with pytest.raises(RsarValueError, match="at most 160"):
            wide(x, w)
    check(op, seed=12, M=4096, K=1024)
