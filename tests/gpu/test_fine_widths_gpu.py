"""Tile widths 112 / 144 / 176 / 208 (``launch.geometry.FINE_NS``), whose tiles reach the
communication warps in 16-column sub-tiles, against float64 on every path the 32-column
widths run: each push form, 2x1 clusters and pairs along N, the peers-first and flat orders,
the split-K tail, push-all AR, the push window, the GEMM alone (TMA and thread stores,
ping-pong; the GEMM alone's default rules), a bias, fp16 and fp8, the largest call, and random M back to back. N=7168 is
whole at 112 and ends on a partial tile at the others; N=1000 also ends on a partial
16-column sub-tile.

mpirun -n 2 python -m pytest -q tests/gpu/test_fine_widths_gpu.py
"""
from __future__ import annotations

import random

import pytest
import torch

from gpu_ops import MAX_M, get_op
from launch.geometry import FINE_NS, ceil_div
from rsar_core.reference import rank_inputs, reference_sum, rel_error, rs_rows
from test_bias_gpu import check_bias
from test_fp8_gpu import _op as fp8_op, check_fp8
from test_fused_gpu import TOL, check, check_gemm_only, check_gemm_only_bitwise, knobs

NS = [7168, 1000]
SHAPES = [(129, 1024), (1000, 4096), (4096, 1024)]
# name -> Tuning fields besides bn
FORCED = {
    "c1lsu": {"cta_group": 1, "push": "lsu"},
    "c1tma": {"cta_group": 1, "push": "tma"},
    "c1tmaall": {"cta_group": 1, "push": "tma_all"},
    "c2tma": {"cta_group": 2, "push": "tma"},
    "c2lsu": {"cta_group": 2, "push": "lsu"},
    "pf": {"cta_group": 1, "peers_first": True},
    "flatsk": {"peers_first": True, "flat": True, "sk": True},
    "pairn": {"pair_n": True},
    "pushall": {"push_all": True},
    "window0": {"cta_group": 1, "push_window": False},
}


def _dev() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def _skip_why(name: str, bn: int, N: int, M: int, ar: bool) -> str | None:
    if name == "pairn" and ceil_div(N, bn) % 2:
        return f"pairs along N need an even tile-column count; N={N} has {ceil_div(N, bn)}"
    if name == "pushall" and (not ar or M > 1024):
        return "push-all plans are world-2 AR plans up to M=1024"
    return None


@pytest.mark.parametrize("name", list(FORCED))
@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("M,K", SHAPES)
@pytest.mark.parametrize("bn", FINE_NS)
def test_forced_plans(comm, bn, M, K, N, ar, name):
    why = _skip_why(name, bn, N, M, ar)
    if why or (name == "pushall" and comm.Get_size() != 2):
        pytest.skip(why or "push-all plans are world-2 plans")
    with knobs(get_op(comm, N, ar), bn=bn, **FORCED[name]) as op:
        p = op.plan(M, K)
        assert p.bn == bn and p.tiles_n == ceil_div(N, bn)
        check(op, seed=M * 5 + K * 11 + N + bn + len(name), M=M, K=K)


@pytest.mark.parametrize("form", ["c1", "c2", "ts0", "sk"])
@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("M,K", [(128, 1024), (1000, 4096), (2048, 1024), (4100, 9216)])
@pytest.mark.parametrize("bn", FINE_NS)
def test_gemm_only(comm, bn, M, K, N, form):
    """The GEMM alone, TMA stores by default (``ts0``: the threads' copy-out), against the
    float64 product; but for the split-K tail (whose cuts depend on the plan) also bitwise
    against 128-wide tiles of the same form: every width sums K in the same order."""
    fields = {"c1": {"cta_group": 1}, "c2": {"cta_group": 2},
              "ts0": {"cta_group": 1, "tma_store": False}, "sk": {"sk": True}}[form]
    op = get_op(comm, N, False)
    x, w = rank_inputs(M * 3 + K + N + bn, op.rank, M, N, K, _dev())
    with knobs(op, bn=bn, **fields) as fine, knobs(op, bn=128, **fields) as base:
        assert fine.plan(M, K, mode="gemm").bn == bn
        if form == "sk":
            check_gemm_only(fine, x, w)
        else:
            check_gemm_only_bitwise(fine, base, x, w)


@pytest.mark.parametrize("bn", [112])
@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("M,K", [(129, 1024), (1000, 4096), (2048, 1024)])
def test_fused_pingpong(comm, bn, M, K, ar):
    """Ping-pong MMA warp groups beside the communication warps (144 is refused: ptxas
    serializes its wgmma; past 160 the registers run out): float64, then bitwise against
    the cooperative kernel on the same plan."""
    op = get_op(comm, 7168, ar)
    with knobs(op, bn=bn, cta_group=1, pingpong=True) as pp:
        check(pp, seed=M + K + bn, M=M, K=K)
        x, w = rank_inputs(M * 5 + K, op.rank, M, op.N, K, _dev())
        y = pp(x, w)
    with knobs(op, bn=bn, cta_group=1) as cooperative:
        y0 = cooperative(x, w)
    torch.cuda.synchronize()
    assert torch.equal(y, y0)


@pytest.mark.parametrize("cta_group", [1, 2])
@pytest.mark.parametrize("bn", [112, 144, 176])
@pytest.mark.parametrize("M,K", [(129, 1024), (2048, 4096), (4100, 1024)])
def test_gemm_only_pingpong(comm, bn, M, K, cta_group):
    op = get_op(comm, 7168, False)
    x, w = rank_inputs(M * 7 + K + bn, op.rank, M, op.N, K, _dev())
    with knobs(op, bn=bn, cta_group=cta_group, pingpong=True) as pp, \
            knobs(op, bn=bn, cta_group=cta_group, pingpong=False) as cooperative:
        check_gemm_only_bitwise(pp, cooperative, x, w)


@pytest.mark.parametrize("N", [7168, 8192, 2880, 5120])
@pytest.mark.parametrize("M,K", [(256, 1024), (512, 4096), (4096, 1024), (8192, 1024),
                                 (1024, 1024), (384, 9216), (8192, 4096)])
def test_gemm_only_default_rules(comm, M, N, K):
    """What the GEMM alone runs by default where ``FINE_GAIN``, ``choose_gemm_pingpong`` or
    the rules of docs/PERF.md (bb) decide (N=5120: 160 wide; N=2880: 64-wide tiles at M=256,
    7 stages on 112-wide pairs at M 384 / 512, 160-wide ping-pong at 8192 x 4096): float64,
    and bitwise against the same plan with ping-pong off."""
    op = get_op(comm, N, False)
    plan = op.plan(M, K, mode="gemm")
    x, w = rank_inputs(M * 11 + K + N, op.rank, M, N, K, _dev())
    with knobs(op, bn=plan.bn, cta_group=plan.cta_group, pingpong=False) as cooperative:
        check_gemm_only_bitwise(op, cooperative, x, w)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("bn", FINE_NS)
def test_bias(comm, bn, N, ar):
    with knobs(get_op(comm, N, ar), bn=bn) as op:
        for M, K in ((129, 4096), (1000, 1024)):
            check_bias(op, seed=M + K + bn + N, M=M, K=K)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("bn", FINE_NS)
def test_fp16(comm, bn, ar):
    with knobs(get_op(comm, 7168, ar, dtype=torch.float16), bn=bn) as op:
        for M, K in ((300, 4096), (2048, 1024)):
            check(op, seed=M + K + bn + 3, M=M, K=K)


@pytest.mark.parametrize("per_row", [False, True], ids=["tensor", "row"])
@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("bn", FINE_NS)
def test_fp8(comm, bn, ar, per_row):
    with knobs(fp8_op(comm, 7168, ar), bn=bn) as op:
        for M, K in ((129, 2048), (1000, 8192)):
            check_fp8(op, seed=M + K + bn, M=M, K=K, per_row=per_row)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("bn", FINE_NS)
def test_largest_call(comm, bn, ar):
    """M = max_M: every receive slot the workspace holds for this width, whose tile rows
    cover more columns than N (N=7168: up to 7280 at 208)."""
    with knobs(get_op(comm, 7168, ar), bn=bn) as op:
        check(op, seed=bn + int(ar), M=MAX_M, K=1024)


@pytest.mark.parametrize("bn", FINE_NS)
def test_back_to_back_random_m(comm, bn):
    """150 queued calls of random M, RS and AR at this width, checked afterwards: stamps,
    receive slots and partial tile columns reused from call to call."""
    rng = random.Random(bn)
    with knobs(get_op(comm, 1000, False), bn=bn) as rs, \
            knobs(get_op(comm, 1000, True), bn=bn) as ar:
        outs = []
        for step in range(150):
            op, M = (rs, ar)[step % 2], rng.randint(1, 3000)
            x, w = rank_inputs(step + bn, op.rank, M, 1000, 512, _dev())
            outs.append((op, step, M, op(x, w)))
        torch.cuda.synchronize()
        for op, step, M, y in outs:
            op.check()
            ref = reference_sum(step + bn, op.world, M, 1000, 512, _dev())
            if not op.all_reduce:
                ref = rs_rows(ref, op.rank, op.world)
            assert rel_error(y, ref) < TOL, (step, M)
