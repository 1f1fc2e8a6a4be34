"""``launch.rules.choose_gemm_quads128``: the bf16 GEMM alone at three 128-row tile rows (M
320-384) and K >= 4096 runs 128-row tiles on 4x1 clusters along M, 96 wide, where the tile
columns fill 90-100% of one round of the GPU's 4x1 clusters (docs/PERF.md (bh)); elsewhere,
in fp16, in the fused ops and under a forced Tuning the plans stay (no GPU)."""
from __future__ import annotations

import itertools

import pytest

from launch import Dtypes, Hardware, Shape, Tuning, resolve
from launch.rules import QUAD128_BN, choose_gemm_quads128

H200 = Hardware("sm_90a", 132, 132, 120)  # 30 4x1 clusters, as the H100 of (bh) and (bf)'s H200
H100_32 = Hardware("sm_90a", 132, 132, 128)  # 32 of them


@pytest.mark.parametrize("M,N,K,clusters,want", [
    (384, 2880, 9216, 30, 96), (320, 2560, 4096, 30, 96), (352, 2880, 4096, 30, 96),
    (320, 2304, 4096, 30, None),  # 24 columns: 80% of a round (-9% at K=4096)
    (384, 3072, 4096, 30, None),  # 32 columns: two rounds on 30 (-33..-41%)
    (384, 3072, 9216, 32, 96),  # the same columns fill a GPU holding 32
    (384, 2560, 9216, 32, None),  # 27 of 32: 84%
    (448, 2880, 9216, 30, None), (512, 2880, 4096, 30, None),  # four rows: -3..+3%
    (319, 2880, 9216, 30, None), (256, 2880, 9216, 30, None),
    (384, 2880, 2048, 30, None), (384, 2880, 1024, 30, None)])
def test_the_rule(M, N, K, clusters, want):
    assert choose_gemm_quads128(M, N, K, clusters) == want


@pytest.mark.parametrize("M,N,K", list(itertools.product((320, 384), (2560, 2880), (4096, 9216))))
def test_the_default_plan(M, N, K):
    """One round of 96-wide columns, one cluster each; every tile scheduled once (the fourth
    CTA of each cluster runs a padding tile that is never stored)."""
    p, v = resolve(Shape(M, N, K, "gemm"), H200, 2, "unicast")
    assert (p.bm, p.bn, p.cta_group, v.cta_group, p.rounds) == (128, QUAD128_BN, 4, 4, 1)
    assert p.grid == 4 * -(-N // QUAD128_BN) <= H200.quad_ctas
    seen = [t for c in range(p.grid) if (t := p.scheduled(0, c, 0)) >= 0]
    assert sorted(seen) == list(range(p.num_tiles))
    # M=320: the last row's 64 rows of x in a box of 64 (choose_x_box), as the A/B ran it
    assert v.x_rows == (64 if M == 320 else 0)


@pytest.mark.parametrize("M,N,K", [(384, 2880, 9216), (320, 2560, 4096)])
def test_plans_stay_elsewhere(M, N, K):
    shape = Shape(M, N, K, "gemm")
    for dtypes in (Dtypes("f16"), Dtypes("bf16", "e4m3")):  # unmeasured: the plans before
        assert resolve(shape, H200, 2, "unicast", dtypes)[0].cta_group != 4
    for t in (Tuning(bn=112), Tuning(cta_group=2), Tuning(cta_group=1), Tuning(bm=128)):
        assert resolve(shape, H200, 2, "unicast", tuning=t)[0].cta_group != 4
    for mode in ("rs", "ar"):
        assert resolve(Shape(M, N, K, mode), H200, 2, "unicast")[0].cta_group != 4
    # a GPU holding 32: 30 columns fill 94%, 27 only 84%
    assert (resolve(shape, H100_32, 2, "unicast")[0].cta_group == 4) is (N == 2880)


def test_forced_four_tile_rows_still_run():
    p, _ = resolve(Shape(384, 2880, 9216, "gemm"), H200, 2, "unicast",
                   tuning=Tuning(cta_group=4, bn=128))
    assert (p.bm, p.bn, p.cta_group) == (128, 128, 4)
