"""64-row tiles (``Tuning.bm=64``): the plain GEMM on one MMA warp group, against float64 and
bitwise against 128-row tiles of the same width (each output element sums K in the same
order), with partial tile rows and columns, the TMA and thread stores, 2x1 clusters along M
(a pair of 64-row tiles sharing w's tile), the split-K tail and fp16, cuBLAS's small-M
forms (widths 80 / 96, 10-13 stages; 4x1 clusters along M) and the small-M defaults of
PERF.md (bd); refused on the fused op before any launch, the op still usable after.

mpirun -n 2 python -m pytest -q tests/gpu/test_rows64_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from gpu_ops import get_op
from launch.rules import choose_gemm_quads, choose_gemm_rows64_pairs, choose_gemm_split
from rsar_core import RsarValueError
from rsar_core.reference import rank_inputs
from test_fused_gpu import check_gemm_only, check_gemm_only_bitwise, knobs


def _dev() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


@pytest.mark.parametrize("form", ["ts", "ts0"])
@pytest.mark.parametrize("bn", [64, 112, 128, 176, 256])
@pytest.mark.parametrize("N", [7168, 2880, 1000])
@pytest.mark.parametrize("M,K", [(1, 64), (63, 1024), (64, 4096), (65, 1024), (200, 4096),
                                 (300, 1024), (1000, 9216)])
def test_gemm_only_rows64(comm, M, K, N, bn, form):
    op = get_op(comm, N, False)
    x, w = rank_inputs(M * 13 + K + N + bn, op.rank, M, N, K, _dev())
    fields = {"bn": bn, "cta_group": 1, "tma_store": form == "ts"}
    with knobs(op, bm=64, **fields) as rows64, knobs(op, **fields) as rows128:
        p = rows64.plan(M, K, mode="gemm")
        assert p.bm == 64 and p.tiles_m == -(-M // 64) and p.bn == bn
        check_gemm_only_bitwise(rows64, rows128, x, w)


@pytest.mark.parametrize("cta_group,deep", [(1, True), (2, True), (2, False)])
@pytest.mark.parametrize("bn", [64, 80, 96])
@pytest.mark.parametrize("N", [2880, 5120, 1000])
@pytest.mark.parametrize("M,K", [(1, 64), (100, 4096), (128, 1024), (256, 9216), (300, 4096)])
def test_gemm_only_small_m_forms(comm, M, K, N, bn, cta_group, deep):
    """cuBLAS's forms at small M (PERF.md (bc)): 64-row tiles 64 / 80 / 96 wide
    (``GEMM_ONLY_NS``: 80 in 16-column sub-tiles, 96 in 32) past the default 8 stages where
    they fit, 1-CTA and 2x1 clusters, bitwise against 128-row tiles of the same width."""
    op = get_op(comm, N, False)
    x, w = rank_inputs(M * 7 + K + N + bn + cta_group, op.rank, M, N, K, _dev())
    stages = {"stages": {64: 13, 80: 11, 96: 10}[bn]} if deep else {}  # the most that fit
    with knobs(op, bm=64, bn=bn, cta_group=cta_group, **stages) as small, \
            knobs(op, bn=bn, cta_group=1) as rows128:
        p = small.plan(M, K, mode="gemm")
        assert (p.bm, p.bn, p.cta_group) == (64, bn, cta_group)
        check_gemm_only_bitwise(small, rows128, x, w)


@pytest.mark.parametrize("M,N,K", [(256, 2880, 9216), (200, 2048, 4096), (240, 3584, 4096),
                                   (128, 5120, 4096), (100, 6144, 9216), (128, 2880, 1024),
                                   (512, 2880, 9216), (448, 2560, 4096), (256, 2880, 1024),
                                   (256, 3072, 2048), (512, 2880, 1024), (384, 2048, 2048),
                                   (300, 2560, 1024), (128, 5120, 1024), (96, 6144, 2048),
                                   (160, 4864, 1024), (256, 5120, 9216), (200, 6144, 4096),
                                   (144, 4096, 2048), (320, 2880, 4096), (384, 2560, 9216)])
def test_default_small_m_rules(comm, M, N, K):
    """PERF.md (bd)'s defaults: 4x1 clusters of 64-row tiles (``choose_gemm_quads``), 80 /
    96-wide 64-row pairs and deep stages (``rows64_deep``), 96-wide pairs at four tile rows
    (``choose_gemm_pairs96``), PERF.md (be)'s 80 / 96-wide pairs at K <= 2048
    (``choose_gemm_pairs_short``), (bf)'s at one pair row and at K <= 2048 on 64-row pairs,
    and (bh)'s 4x1 clusters of 128-row tiles (``choose_gemm_quads128``), bitwise against
    1-CTA tiles of the same rows and width."""
    op = get_op(comm, N, False)
    p = op.plan(M, K, mode="gemm")
    if p.cta_group == 1:  # the rules count this GPU's clusters: H100s hold 30 to 32 of 4
        pairs, quads = op.pair_ctas // 2, op.quad_ctas // 4
        assert choose_gemm_quads(M, N, K, quads) is None, (p, quads)
        assert choose_gemm_rows64_pairs(M, N, pairs) is None, (p, pairs)
        pytest.skip(f"no cluster plan at {M} x {N} x {K} on {pairs} 2x1 / {quads} 4x1 clusters")
    x, w = rank_inputs(M * 19 + K + N, op.rank, M, N, K, _dev())
    with knobs(op, bm=p.bm, bn=p.bn, cta_group=1) as single:
        check_gemm_only_bitwise(op, single, x, w)


@pytest.mark.parametrize("bm,bn,stages", [(64, 64, 13), (64, 96, 10), (64, 128, 0),
                                          (128, 128, 0), (128, 96, 0)])
@pytest.mark.parametrize("N", [2880, 5120, 1000])
@pytest.mark.parametrize("M,K", [(1, 64), (100, 4096), (200, 1024), (256, 9216), (300, 4096),
                                 (520, 1024)])
def test_gemm_only_quad_clusters(comm, M, K, N, bm, bn, stages):
    """4x1 clusters along M (``Tuning(cta_group=4)``: w's tile split in quarters, each
    multicast to the four CTAs; clusters past the last tile row compute padding tiles never
    stored; x's last-row box), bitwise against 1-CTA tiles of the same rows and width."""
    op = get_op(comm, N, False)
    x, w = rank_inputs(M * 17 + K + N + bn + bm, op.rank, M, N, K, _dev())
    deep = {"stages": stages} if stages else {}
    with knobs(op, bm=bm, bn=bn, cta_group=4, **deep) as quads, \
            knobs(op, bm=bm, bn=bn, cta_group=1) as single:
        p = quads.plan(M, K, mode="gemm")
        assert (p.bm, p.bn, p.cta_group, p.cluster_mn) == (bm, bn, 4, (4, 1))
        check_gemm_only_bitwise(quads, single, x, w)


@pytest.mark.parametrize("bn", [64, 112, 128, 256])
@pytest.mark.parametrize("N", [7168, 1000])
@pytest.mark.parametrize("M,K", [(1, 64), (64, 1024), (100, 4096), (128, 1024), (129, 9216),
                                 (256, 4096), (300, 1024), (1000, 4096)])
def test_gemm_only_rows64_pairs(comm, M, K, N, bn):
    """2x1 clusters of 64-row tiles along M (w's tile multicast to the pair, each CTA
    loading half; an odd tile-row count leaves one pair's second tile a padding tile; x's
    last-row box where M's last tile row holds 1-32 rows), bitwise against the 1-CTA
    64-row tiles."""
    op = get_op(comm, N, False)
    x, w = rank_inputs(M * 11 + K + N + bn, op.rank, M, N, K, _dev())
    with knobs(op, bm=64, bn=bn, cta_group=2) as pairs, \
            knobs(op, bm=64, bn=bn, cta_group=1) as single:
        p = pairs.plan(M, K, mode="gemm")
        assert (p.bm, p.cta_group, p.tiles_m) == (64, 2, -(-M // 64))
        check_gemm_only_bitwise(pairs, single, x, w)


@pytest.mark.parametrize("N", [2880, 5120, 7168, 8192])
@pytest.mark.parametrize("M,K", [(65, 1024), (80, 4096), (100, 9216), (128, 1024), (128, 4096)])
def test_default_rule_rows64_pairs(comm, M, K, N):
    """``choose_gemm_rows64_pairs``: what the GEMM alone runs by default at 64 < M <= 128
    (64-row tiles on 2x1 clusters along M, 64 / 112 / 128 wide, 80 / 96 at K >= 4096, deep
    stages by ``rows64_deep``; x's box on a last tile row
    of 1-32 rows), bitwise against the 1-CTA 64-row tiles of its width."""
    op = get_op(comm, N, False)
    p = op.plan(M, K, mode="gemm")
    assert (p.bm, p.cta_group) == (64, 2) and p.bn in (64, 80, 96, 112, 128), p
    x, w = rank_inputs(M * 19 + K + N, op.rank, M, N, K, _dev())
    with knobs(op, bm=64, bn=p.bn, cta_group=1) as single:
        check_gemm_only_bitwise(op, single, x, w)


@pytest.mark.parametrize("M,K", [(300, 4096), (600, 9216), (300, 1024)])
def test_split_k_tail_rows64(comm, M, K):
    op = get_op(comm, 7168, False)
    x, w = rank_inputs(M + K, op.rank, M, op.N, K, _dev())
    with knobs(op, bm=64, sk=True) as tail:
        p = tail.plan(M, K, mode="gemm")
        assert p.bm == 64 and p.sk > 1
        check_gemm_only(tail, x, w)


def test_fp16_rows64(comm):
    op = get_op(comm, 7168, False, dtype=torch.float16)
    x, w = rank_inputs(7, op.rank, 200, op.N, 1024, _dev(), dtype=torch.float16)
    with knobs(op, bm=64) as rows64, knobs(op, bn=rows64.plan(200, 1024, mode="gemm").bn,
                                           cta_group=1) as rows128:
        check_gemm_only_bitwise(rows64, rows128, x, w)


def test_fused_call_refused_then_usable(comm):
    op = get_op(comm, 7168, False)
    x, w = rank_inputs(3, op.rank, 200, op.N, 1024, _dev())
    with knobs(op, bm=64) as rows64:
        with pytest.raises(RsarValueError, match="64-row"):
            rows64(x, w)
        check_gemm_only(rows64, x, w)
    y = op(x, w)
    torch.cuda.synchronize()
    op.check()


@pytest.mark.parametrize("N", [7168, 2880, 5120])
@pytest.mark.parametrize("M,K", [(1, 1024), (8, 9216), (17, 4096), (64, 1024), (64, 9216)])
def test_default_rule_rows64(comm, M, K, N):
    """``choose_gemm_rows64`` / ``choose_gemm_split``: what the GEMM alone runs by default at
    M <= 64 (one round cut along K where the rule says so), bitwise against 128-row tiles of
    its width cut the same way."""
    op = get_op(comm, N, False)
    p = op.plan(M, K, mode="gemm")
    pieces = min(op.sm_count // -(-N // p.bn), 8)
    assert p.bm == 64 and p.sk == (pieces if choose_gemm_split(M, K, pieces, M < 64) else 0)
    x, w = rank_inputs(M * 17 + K + N, op.rank, M, N, K, _dev())
    with knobs(op, bm=128, bn=p.bn, cta_group=1, sk=bool(p.sk)) as rows128:
        assert rows128.plan(M, K, mode="gemm").sk == p.sk
        check_gemm_only_bitwise(op, rows128, x, w)
