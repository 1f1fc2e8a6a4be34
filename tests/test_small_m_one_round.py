"""PERF.md (bf)'s small-M rules (one H200): 64-row pairs 80 / 96 wide at every K
(``choose_gemm_rows64_pairs``, deep stages), and 128-row pairs 80 / 96 wide at one pair row
(``choose_gemm_pairs_short`` at M 192-256, N >= 4608; 80 wide at 8 stages): the plans and
kernels the A/B timed, nowhere else, and their kernels compile without spills."""
from __future__ import annotations

import pytest

from launch import Dtypes, Hardware, Shape, Tuning, resolve
from launch.rules import (PAIRS_ONE_ROW_STAGES, ROWS64_DEEP_STAGES, choose_gemm_pairs_short,
                          pairs_one_row)

H200 = Hardware("sm_90a", 132, 132, 120)  # the GPU of (bf): 66 2x1 / 30 4x1 clusters


def _plan(M, N, K, *, mode="gemm", dtypes=Dtypes(), tuning=Tuning()):
    return resolve(Shape(M, N, K, mode), H200, 2, "unicast", dtypes, tuning)


@pytest.mark.parametrize("M,N,K,bn", [(128, 5120, 1024, 80), (96, 4608, 2048, 80),
                                      (128, 6144, 1024, 96), (80, 5760, 2048, 96),
                                      (128, 7168, 1024, 112), (128, 8192, 2048, 128),
                                      (128, 2880, 1024, 64)])
def test_rows64_pairs_take_the_narrowest_width_of_one_round_at_every_k(M, N, K, bn):
    p, v = _plan(M, N, K)
    assert (p.bm, p.bn, p.cta_group, p.rounds) == (64, bn, 2, 1)
    # 80 / 96 at their deep stages at every K (timed so, K 1024 / 2048); 112 / 128 the kernel's
    assert v.stages == (ROWS64_DEEP_STAGES[bn] if bn in (64, 80, 96) else 0)
    forced = _plan(M, N, K, tuning=Tuning(bm=64, bn=bn, cta_group=2, stages=v.stages or None))
    assert forced == (p, v)  # the A/B's column


@pytest.mark.parametrize("M,N,K,bn,x_rows", [
    (192, 4608, 1024, 80, 64), (256, 5120, 1024, 80, 0), (256, 5120, 9216, 80, 0),
    # a last row of 72 / 96 rows: boxes that divide no tile (X_BOX_UNEVEN, PERF.md (bh))
    (200, 4864, 4096, 80, 80), (256, 6144, 4096, 96, 0), (224, 5760, 2048, 96, 96)])
def test_one_pair_row_runs_80_or_96_wide_pairs(M, N, K, bn, x_rows):
    p, v = _plan(M, N, K)
    assert (p.bm, p.bn, p.cta_group, p.rounds, p.tiles_m) == (128, bn, 2, 1, 2)
    assert pairs_one_row(p) and v.stages == PAIRS_ONE_ROW_STAGES[bn] and v.x_rows == x_rows
    stages = PAIRS_ONE_ROW_STAGES[bn] or None
    assert _plan(M, N, K, tuning=Tuning(bn=bn, cta_group=2, stages=stages)) == (p, v)


@pytest.mark.parametrize("M,N,K", [
    (191, 5120, 4096), (160, 5120, 1024), (256, 4352, 2048),  # not timed: the old rules
    (256, 7168, 1024), (256, 8192, 4096),                       # 80 / 96 would take 2 rounds
    (257, 5120, 4096)])                                         # two pair rows, K > 2048
def test_one_pair_row_rule_stays_where_it_was_timed(M, N, K):
    p, v = _plan(M, N, K)
    assert not pairs_one_row(p) and v.stages != 8
    assert choose_gemm_pairs_short(M, N, K, 66) in (None, 80, 96)


@pytest.mark.parametrize("mode,dtypes,tuning", [
    ("rs", Dtypes(), Tuning()), ("ar", Dtypes(), Tuning()),   # the fused ops keep their plans
    ("gemm", Dtypes("f16"), Tuning()),                         # timed on bf16 only
    ("gemm", Dtypes("bf16", "e4m3"), Tuning()),
    ("gemm", Dtypes(), Tuning(bn=112)), ("gemm", Dtypes(), Tuning(cta_group=1))])
def test_forced_knobs_other_dtypes_and_fused_ops_keep_their_plans(mode, dtypes, tuning):
    for M, N, K in ((256, 5120, 4096), (128, 5120, 1024)):
        p, v = _plan(M, N, K, mode=mode, dtypes=dtypes, tuning=tuning)
        assert not (p.bn in (80, 96) and p.cta_group == 2), (M, N, K, p)


@pytest.mark.parametrize("M,N,K", [(192, 4608, 1024), (256, 5120, 4096), (96, 6144, 2048)])
def test_their_kernels_compile_without_spills(ptx_of, M, N, K, tmp_path):
    pytest.importorskip("cutlass")
    from ptx_checks import ptxas_log
    _, v = _plan(M, N, K)
    ptx = ptx_of(v)
    assert f"wgmma.mma_async.sync.aligned.m64n{v.bn}k16" in ptx
    log = ptxas_log(ptx, tmp_path)
    assert " 0 bytes spill stores" in log, log[-800:]
    for note in ("C7514", "C7517", "C7520"):
        assert note not in log, log[-800:]
