"""The small-M rules of PERF.md (bd): deep mainloops on the plain GEMM's 64-row tiles
(``rows64_deep`` / ``ROWS64_DEEP_STAGES``), 80 / 96-wide 64-row pairs at K >= 4096, 4x1
clusters of 64-row tiles at four tile rows (``choose_gemm_quads``) and 96-wide pairs at four
128-row tile rows (``choose_gemm_pairs96``). What each rule picks, where it stops, that the
stage table is what the kernel's shared memory holds, and that every plan they pick
compiles."""
from __future__ import annotations

import pytest

from launch import Hardware, Shape, Tuning, resolve
from launch.resolve import Dtypes
from launch.rules import (QUAD_MIN_K, QUAD_NS, ROWS64_DEEP_MIN_K, ROWS64_DEEP_STAGES,
                          ROWS64_FIT_STAGES, choose_gemm_pairs_short, choose_gemm_quads,
                          choose_gemm_rows64_pairs)

H100 = Hardware("sm_90a", 132, 132, 128)


def test_deep_stages_fit():
    assert all(ROWS64_DEEP_STAGES[b] <= ROWS64_FIT_STAGES[b] for b in ROWS64_DEEP_STAGES)


@pytest.mark.parametrize("bn", sorted(ROWS64_FIT_STAGES))
def test_stage_table_is_what_fits(bn):
    """The most stages a 64-row tile of each width holds beside a 2-slot ring: the kernel
    takes the table's count and refuses one more."""
    pytest.importorskip("cutlass")
    from launch.sm90_kernel import Sm90FusedKernel
    from launch.variant import Variant
    deep = ROWS64_FIT_STAGES[bn]

    def kernel(stages):
        return Sm90FusedKernel(Variant("sm_90a", bn, 2, "gemm", "unicast", 1, push="tma",
                                       tma_store=1, stages=stages, bm=64))
    assert kernel(deep).ab_stage == deep
    with pytest.raises(ValueError, match="ring slots"):
        kernel(deep + 1)


def test_quads_pick_the_narrowest_width_of_one_round():
    assert choose_gemm_quads(256, 2880, 9216, 32) == 96  # 30 columns of 96
    assert choose_gemm_quads(256, 2048, 4096, 32) == 96
    assert choose_gemm_quads(256, 3072, 4096, 32) == 96  # 32 of 96 fill every cluster
    assert choose_gemm_quads(256, 3072, 4096, 30) == 128  # an H100 holding 30
    assert choose_gemm_quads(256, 2880, 9216, 30) == 96
    assert choose_gemm_quads(256, 2881, 9216, 30) == 128
    assert choose_gemm_quads(193, 3584, 4096, 32) == 128
    assert choose_gemm_quads(256, 3592, 4096, 32) is None  # past the widest N timed
    assert choose_gemm_quads(256, 3072, QUAD_MIN_K, 30) == 128
    for M, K in ((192, 9216), (257, 9216), (256, QUAD_MIN_K - 1), (256, 1025), (64, 9216)):
        assert choose_gemm_quads(M, 2880, K, 32) is None


def test_quads_at_short_k_take_96_only():
    assert choose_gemm_quads(256, 2880, 1024, 32) == 96
    assert choose_gemm_quads(200, 1536, 512, 32) == 96
    assert choose_gemm_quads(256, 3072, 1024, 30) is None  # no 128 there (it lost at 256)
    p, v = resolve(Shape(256, 2880, 1024, "gemm"), H100, 2, "unicast")
    assert (p.bm, p.bn, p.cta_group, v.stages) == (64, 96, 4, ROWS64_DEEP_STAGES[96])


@pytest.mark.parametrize("M,N,K,clusters,bn", [
    (512, 2048, 1024, 66, 80), (384, 2560, 2048, 66, 80), (448, 2880, 1024, 66, 96),
    (257, 3072, 2048, 66, 96), (512, 3168, 1024, 66, 96), (512, 3169, 1024, 66, None),
    (512, 2560, 1024, 59, 96), (512, 2880, 1024, 59, None), (256, 2048, 1024, 66, None),
    (512, 2040, 1024, 66, None), (300, 128, 1024, 66, None),
    (513, 2048, 1024, 66, None), (512, 2048, 2049, 66, None)])
def test_short_pairs_take_the_narrowest_width_of_one_round(M, N, K, clusters, bn):
    assert choose_gemm_pairs_short(M, N, K, clusters) == bn


@pytest.mark.parametrize("M,N,K,bn", [(512, 2880, 1024, 96), (384, 2048, 2048, 80),
                                      (448, 2560, 1024, 80), (512, 3072, 2048, 96)])
def test_short_pairs_are_the_default_there(M, N, K, bn):
    p, v = resolve(Shape(M, N, K, "gemm"), H100, 2, "unicast")
    assert (p.bm, p.bn, p.cta_group, p.rounds, v.stages) == (128, bn, 2, 1, 0)
    forced = resolve(Shape(M, N, K, "gemm"), H100, 2, "unicast",
                     tuning=Tuning(bn=bn, cta_group=2))
    assert forced == (p, v)  # the plan and kernel the A/B timed
    for dtypes, tuning, mode in ((Dtypes("f16"), Tuning(), "gemm"),
                                 (Dtypes(), Tuning(bn=112), "gemm"), (Dtypes(), Tuning(), "rs")):
        other, _ = resolve(Shape(M, N, K, mode), H100, 2, "unicast", dtypes, tuning)
        assert (other.bn, other.cta_group) != (bn, 2)


@pytest.mark.parametrize("M,N,K", [(256, 2880, 9216), (256, 2880, 4096), (200, 2048, 4096),
                                   (224, 3584, 9216)])
def test_quads_are_the_default_there(M, N, K):
    p, v = resolve(Shape(M, N, K, "gemm"), H100, 2, "unicast")
    assert (p.bm, p.cta_group, p.rounds) == (64, 4, 1) and p.bn in QUAD_NS
    assert p.grid <= H100.quad_ctas
    assert v.stages == ROWS64_DEEP_STAGES.get(p.bn, 0)  # 128 wide: the kernel's own


@pytest.mark.parametrize("M,N,K,mode,dtypes,tuning", [
    (256, 2880, 9216, "rs", Dtypes(), Tuning()),            # the fused op keeps its plans
    (256, 2880, 9216, "gemm", Dtypes("f16"), Tuning()),     # measured on bf16 only
    (256, 2880, 9216, "gemm", Dtypes("bf16", "e4m3"), Tuning()),
    (256, 2880, 9216, "gemm", Dtypes(), Tuning(bn=128)),     # anything forced: no rule
    (256, 2880, 9216, "gemm", Dtypes(), Tuning(cta_group=2)),
    (256, 2880, 1536, "gemm", Dtypes(), Tuning()),           # K 1025-2047: not timed
    (256, 3080, 1024, "gemm", Dtypes(), Tuning()),           # 96 needs two rounds
    (256, 7168, 9216, "gemm", Dtypes(), Tuning()),           # two rounds: none fits
])
def test_quads_not_taken(M, N, K, mode, dtypes, tuning):
    p, _ = resolve(Shape(M, N, K, mode), H100, 2, "unicast", dtypes, tuning)
    assert p.cta_group != 4


def test_quads_fall_back_where_occupancy_is_unknown():
    """Without the occupancy query (a CPU plan), every SM counts: 33 clusters."""
    p, _ = resolve(Shape(256, 2880, 9216, "gemm"), Hardware("sm_90a", 132), 2, "unicast")
    assert (p.cta_group, p.bn, p.grid) == (4, 96, 120)


@pytest.mark.parametrize("M,N,K,bn", [(128, 2880, 4096, 64), (128, 2880, 9216, 64),
                                      (100, 2048, 9216, 64), (256, 2880, 9216, 96),
                                      (128, 5120, 4096, 80), (80, 6144, 9216, 96)])
def test_deep_stages_on_64_row_plans(M, N, K, bn):
    p, v = resolve(Shape(M, N, K, "gemm"), H100, 2, "unicast")
    assert (p.bm, p.bn) == (64, bn) and v.stages == ROWS64_DEEP_STAGES[bn]


@pytest.mark.parametrize("K", [1024, 2048, 4096])
def test_64_wide_pairs_run_deep_at_any_k(K):
    p, v = resolve(Shape(128, 2880, K, "gemm"), H100, 2, "unicast")
    assert (p.bm, p.bn, p.cta_group, v.stages) == (64, 64, 2, ROWS64_DEEP_STAGES[64])


def test_quads_128_wide_run_deep_but_pairs_128_wide_do_not():
    _, quad = resolve(Shape(256, 3584, 9216, "gemm"), H100, 2, "unicast")
    _, pair = resolve(Shape(128, 8192, 9216, "gemm"), H100, 2, "unicast")
    assert (quad.bn, quad.cta_group, quad.stages) == (128, 4, ROWS64_DEEP_STAGES[128])
    assert (pair.bn, pair.cta_group, pair.stages) == (128, 2, 0)


@pytest.mark.parametrize("M,N,K,bn", [(512, 2880, 9216, 96), (448, 2560, 4096, 96),
                                      (512, 3072, 4096, 96), (512, 3584, 4096, 112),
                                      (384, 3584, 9216, 112), (512, 2880, 2560, 112)])
def test_four_tile_rows_pair_96_wide_where_one_round_fits(M, N, K, bn):
    """``choose_gemm_pairs96``: the 112-wide pairs at four 128-row tile rows and K >= 4096
    become 96-wide pairs (the kernel's own 7 stages) where those fit one round (K 2049-4095:
    neither this rule nor ``choose_gemm_pairs_short``)."""
    p, v = resolve(Shape(M, N, K, "gemm"), H100, 2, "unicast")
    assert (p.bm, p.bn, p.rounds) == (128, bn, 1)
    if bn == 96:
        assert (p.cta_group, v.stages) == (2, 0)


def test_pairs_take_80_and_96_at_every_k():
    assert choose_gemm_rows64_pairs(128, 5120, 66) == 80
    assert choose_gemm_rows64_pairs(128, 6144, 66) == 96
    for K in (1024, 4096):  # PERF.md (bf), one H200: at every K
        assert resolve(Shape(128, 5120, K, "gemm"), H100, 2, "unicast")[0].bn == 80
    assert choose_gemm_rows64_pairs(128, 7168, 66) == 112  # the grid's plans stay
    assert choose_gemm_rows64_pairs(128, 8192, 66) == 128


@pytest.mark.parametrize("M,N,K", [(128, 7168, ROWS64_DEEP_MIN_K - 1), (128, 7168, 1024),
                                   (512, 2880, 9216), (1024, 7168, 4096), (128, 7168, 9216),
                                   (64, 7168, 9216), (128, 8192, 9216)])
def test_no_deep_stages_elsewhere(M, N, K):
    p, v = resolve(Shape(M, N, K, "gemm"), H100, 2, "unicast")
    assert not (p.bm == 64 and v.stages in ROWS64_DEEP_STAGES.values())


@pytest.mark.parametrize("M,N,K", [(256, 2880, 9216), (224, 3584, 9216), (128, 2880, 9216),
                                   (128, 5120, 4096)])
def test_their_kernels_compile(ptx_of, M, N, K):
    pytest.importorskip("cutlass")
    _, v = resolve(Shape(M, N, K, "gemm"), H100, 2, "unicast")
    assert f".m64n{v.bn}k16." in ptx_of(v)
