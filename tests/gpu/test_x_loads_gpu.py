"""How x is loaded where the last tile row is partial.

x's box of the last tile row's rows (``Tuning.x_box``, ``Variant.x_rows``): the tile's
other rows are not loaded there, so their garbage must stay in output rows past M; the sums
are the same products in the same order, so the result is bitwise the whole-box plan's, on
every tile form the box runs with (64 / 128 rows, one tile row or several, 1-CTA tiles and
2x1 clusters, the split-K tail, the TMA and thread stores, fp16).

mpirun -n 2 python -m pytest -q tests/gpu/test_x_loads_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from gpu_ops import get_op
from rsar_core.reference import rank_inputs
from launch.geometry import X_ROWS
from test_fused_gpu import check_gemm_only, check_gemm_only_bitwise, knobs


def _dev() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


@pytest.mark.parametrize("form", [
    {"bm": 64, "bn": 112}, {"bm": 64, "bn": 112, "sk": True}, {"bm": 64, "bn": 256},
    {"bm": 64, "bn": 112, "tma_store": False}, {"bm": 128, "bn": 64},
    {"bm": 128, "bn": 128, "sk": True}, {"bm": 128, "bn": 176, "tma_store": False}],
    ids=["r64", "r64sk", "r64bn256", "r64ts0", "bn64", "sk", "bn176ts0"])
@pytest.mark.parametrize("N", [7168, 2880])
@pytest.mark.parametrize("M,K", [(1, 64), (1, 4096), (7, 1024), (8, 9216), (9, 4096),
                                 (17, 960), (32, 4096), (33, 1024), (63, 9216), (64, 4096),
                                 (65, 1024), (100, 4096), (129, 4096), (190, 960),
                                 (1000, 9216), (3000, 4096)])
def test_gemm_only_x_box(comm, M, K, N, form):
    """The box on the last tile row of any M: the only tile row below 64 rows, or the
    partial last one of several (M=129: a box of 8 rows after a whole tile row; M=1000: 112
    of 128, a box that divides no tile)."""
    op = get_op(comm, N, False)
    x, w = rank_inputs(M * 5 + K + N, op.rank, M, N, K, _dev())
    with knobs(op, x_box=True, cta_group=1, **form) as boxed, \
            knobs(op, x_box=False, cta_group=1, **form) as whole:
        bm = form["bm"]
        tail = M - (M - 1) // bm * bm
        rows = next((r for r in X_ROWS if tail <= r < bm), 0)
        assert boxed.variant(M, K, mode="gemm").x_rows == rows
        assert whole.variant(M, K, mode="gemm").x_rows == 0
        # twice: the second call finds the stages' unloaded rows holding the first's data
        check_gemm_only_bitwise(boxed, whole, x, w)
        check_gemm_only_bitwise(boxed, whole, x, w)


@pytest.mark.parametrize("form", [{"bn": 256}, {"bn": 128}, {"bn": 224, "tma_store": False}],
                         ids=["bn256", "bn128", "bn224ts0"])
@pytest.mark.parametrize("N", [7168, 2880])
@pytest.mark.parametrize("M,K", [(129, 4096), (200, 1024), (224, 9216), (240, 1024),
                                 (300, 4096), (520, 9216), (640, 1024), (1100, 4096),
                                 (3000, 960)])
def test_gemm_only_x_box_on_pairs(comm, M, K, N, form):
    """2x1 clusters along M: the last tile row's box on either CTA of a pair, and the pair's
    padding tile (an odd row count) reloading that row in the box too; where the box is at
    most half the tile, the second MMA warp group (and the padding tile) leaves the tensor
    pipes idle. Bitwise the whole-box plan's."""
    op = get_op(comm, N, False)
    x, w = rank_inputs(M * 7 + K + N, op.rank, M, N, K, _dev())
    with knobs(op, x_box=True, cta_group=2, **form) as boxed, \
            knobs(op, x_box=False, cta_group=2, **form) as whole:
        tail = M - (M - 1) // 128 * 128
        rows = next((r for r in X_ROWS if tail <= r < 128), 0)
        assert boxed.plan(M, K, mode="gemm").cta_group == 2
        assert boxed.variant(M, K, mode="gemm").x_rows == rows
        check_gemm_only_bitwise(boxed, whole, x, w)
        check_gemm_only_bitwise(boxed, whole, x, w)


def test_x_box_after_larger_calls_and_fp16(comm):
    """Unloaded rows hold what a larger call left in shared memory (NaN rows of x here):
    nothing of it reaches the output of a small call."""
    op = get_op(comm, 7168, False)
    with knobs(op, x_box=True, cta_group=1) as boxed:
        xb, w = rank_inputs(3, op.rank, 64, op.N, 4096, _dev())
        xb[1:] = float("nan")
        boxed.gemm_only(xb, w)  # the 64-row plan, whole boxes: NaN rows land in the stages
        for M in (1, 5, 16, 24):
            x, _ = rank_inputs(M, op.rank, M, op.N, 4096, _dev())
            check_gemm_only(boxed, x, w)
        # several tile rows: whole boxes of NaN rows, then calls ending on a partial row
        xb, _ = rank_inputs(4, op.rank, 512, op.N, 4096, _dev())
        xb[::3] = float("nan")
        boxed.gemm_only(xb, w)
        for M in (129, 300, 440):
            assert boxed.variant(M, 4096, mode="gemm").x_rows > 0
            x, _ = rank_inputs(M, op.rank, M, op.N, 4096, _dev())
            check_gemm_only(boxed, x, w)
    half = get_op(comm, 7168, False, dtype=torch.float16)
    x, w = rank_inputs(13, half.rank, 20, half.N, 4096, _dev(), dtype=torch.float16)
    with knobs(half, x_box=True) as boxed, knobs(half, x_box=False) as whole:
        assert boxed.variant(20, 4096, mode="gemm").x_rows > 0
        check_gemm_only_bitwise(boxed, whole, x, w)


@pytest.mark.parametrize("M", [129, 160, 192])
@pytest.mark.parametrize("N,K", [(7168, 1024), (8192, 1024), (5120, 9216), (8192, 4096)])
def test_default_tail_row_one_cta(comm, M, N, K):
    """``choose_gemm_tail_one_cta``: by default the GEMM alone at M 129-192 runs 1-CTA tiles
    at K <= 1024 where it would pair the two tile rows, and the pairs from K=4096; both with
    the last row's box. Each against float64, then the plan without the box, on the same
    workspace."""
    op = get_op(comm, N, False)
    x, w = rank_inputs(M * 3 + N + K, op.rank, M, N, K, _dev())
    p, v = op.plan(M, K, mode="gemm"), op.variant(M, K, mode="gemm")
    assert p.cta_group == (1 if K <= 1024 else 2)
    assert v.x_rows == next(r for r in X_ROWS if M - 128 <= r)
    check_gemm_only(op, x, w)
    with knobs(op, x_box=False) as unboxed:
        assert unboxed.plan(M, K, mode="gemm").cta_group == 2
        assert unboxed.variant(M, K, mode="gemm").x_rows == 0
        check_gemm_only(unboxed, x, w)
    check_gemm_only(op, x, w)  # after the pair plan ran on the same workspace
