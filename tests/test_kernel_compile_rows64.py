"""64-row tiles (``Variant.bm`` 64, ``Tuning.bm``): the plain sm90 GEMM on one MMA warp group
of 128 threads beside the producer / store warp group (256 threads), on 1-CTA tiles or 2x1
clusters along M (the pair's two 64-row tiles share w's tile, each CTA loading half of it
for both). Here: they compile for sm_90a with a wgmma of 64 rows as wide as the tile, no
spill or serialized wgmma; the kernel, the planner and the resolver refuse them wherever
they have no form (fused ops, pairs along N, fp8, ping-pong, sm100) before anything
compiles."""
from __future__ import annotations

import pytest

pytest.importorskip("cutlass")

from ptx_checks import ptxas_log  # noqa: E402
from launch import Hardware, Shape, Tuning, resolve  # noqa: E402
from launch.plan import make_plan  # noqa: E402
from launch.variant import Variant  # noqa: E402
from rsar_core.errors import RsarValueError  # noqa: E402

ROWS64 = [
    Variant("sm_90a", 128, 2, "gemm", "unicast", push="tma", pdl=1, tma_store=1, bm=64),
    Variant("sm_90a", 256, 2, "gemm", "unicast", push="tma", pdl=1, tma_store=1, bm=64),
    Variant("sm_90a", 112, 2, "gemm", "unicast", push="tma", pdl=1, tma_store=1, bm=64),
    Variant("sm_90a", 224, 2, "gemm", "unicast", push="tma", pdl=1, sk=1, bm=64),
    # choose_gemm_split's default: 64-row tiles, one round cut along K, TMA stores
    Variant("sm_90a", 112, 2, "gemm", "unicast", push="tma", pdl=1, tma_store=1, sk=1, bm=64),
    Variant("sm_90a", 64, 2, "gemm", "unicast", push="tma", pdl=1, dtype="f16", bm=64),
    # 2x1 clusters along M: w's tile multicast to both 64-row tiles (half of it each)
    Variant("sm_90a", 112, 2, "gemm", "unicast", 2, push="tma", pdl=1, tma_store=1, bm=64),
    Variant("sm_90a", 128, 2, "gemm", "unicast", 2, push="tma", pdl=1, tma_store=1, bm=64),
    Variant("sm_90a", 64, 2, "gemm", "unicast", 2, push="tma", pdl=1, tma_store=1, bm=64),
    Variant("sm_90a", 112, 2, "gemm", "unicast", 2, push="tma", pdl=1, tma_store=1, bm=64,
            x_rows=16),
]


@pytest.mark.parametrize("v", ROWS64, ids=lambda v: v.describe().replace(" ", "-"))
def test_rows64_compile(ptx_of, v, tmp_path):
    from launch.sm90_kernel import Sm90FusedKernel
    k = Sm90FusedKernel(v)
    assert (k.bm, k.threads, k.num_mma_threads, k.num_mma_wg) == (64, 256, 128, 1)
    ptx = ptx_of(v)
    assert f"wgmma.mma_async.sync.aligned.m64n{v.bn}k16" in ptx
    assert ".reqntid 256, 1, 1" in ptx
    log = ptxas_log(ptx, tmp_path)
    assert " 0 bytes spill stores" in log, log[-800:]
    for note in ("C7514", "C7517", "C7520"):
        assert note not in log, log[-800:]


@pytest.mark.parametrize("v", [
    Variant("sm_90a", 128, 2, "rs", "unicast", push="tma", bm=64),
    Variant("sm_90a", 128, 2, "gemm", "unicast", 2, push="tma", pair_n=1, bm=64),
    Variant("sm_90a", 128, 2, "gemm", "unicast", push="tma", tma_store=1, pingpong=1, bm=64),
    Variant("sm_90a", 128, 2, "gemm", "unicast", push="tma", in_dtype="e4m3", bm=64),
    Variant("sm_90a", 128, 2, "gemm", "unicast", push="tma", bm=96),
], ids=["rs", "pairs-n", "pingpong", "fp8", "bm96"])
def test_kernel_refuses(v):
    from launch.sm90_kernel import Sm90FusedKernel
    with pytest.raises(ValueError, match="BM|64-row"):
        Sm90FusedKernel(v)


def test_plans_and_tuning():
    p = make_plan(200, 7168, 4096, 2, 132, "gemm", bm=64)
    assert (p.bm, p.tiles_m, p.cta_group) == (64, 4, 1) and p.num_tiles == 4 * p.tiles_n
    assert p.band == 16  # choose_band at K > 1024
    assert make_plan(200, 7168, 4096, 2, 132, "gemm", bm=64, bn=112).tiles_n == 64
    assert make_plan(200, 7168, 4096, 2, 132, "gemm").bm == 128
    assert make_plan(300, 7168, 4096, 2, 132, "gemm", bm=64, sk=True).sk > 1
    # choose_gemm_rows64_pairs: 64 < M <= 128, the narrowest of 64 / 80 / 96 / 112 / 128 whose
    # tile columns fit one round of 2x1 clusters; None where none does (N=10240) or outside M
    from launch.rules import choose_gemm_rows64_pairs
    for M, N, want in ((65, 2880, 64), (128, 2880, 64), (100, 5120, 80), (128, 7168, 112),
                       (80, 8192, 128), (128, 10240, None), (64, 7168, None),
                       (129, 7168, None)):
        assert choose_gemm_rows64_pairs(M, N, 66) == want, (M, N)
        p = make_plan(M, N, 4096, 2, 132, "gemm", bm=None)
        if want:
            assert (p.bm, p.bn, p.cta_group, p.band) == (64, want, 2, 8), (M, N)
        else:
            assert (p.bm, p.cta_group) != (64, 2), (M, N)
    assert make_plan(128, 7168, 4096, 2, 132, "gemm", bm=None, cta_group=1).cta_group == 1
    assert make_plan(128, 7168, 4096, 2, 132, "gemm", bm=128).bm == 128  # 128 asked for
    # 50 clusters resident: 56 tile columns of 128 do not fit one round, the 1-CTA plan stays
    p = make_plan(128, 7168, 4096, 2, 132, "gemm", bm=None, pair_ctas=100)
    assert (p.bm, p.cta_group) == (128, 1)
    assert make_plan(128, 5120, 4096, 2, 132, "gemm", bm=None, pair_ctas=100).bn == 112
    pair = make_plan(200, 7168, 4096, 2, 132, "gemm", bm=64, cta_group=2, bn=112)
    assert (pair.bm, pair.tiles_m, pair.cta_group, pair.num_units) == (64, 4, 2, 2 * 64)
    assert (pair.grid, pair.rounds) == (132, 2)
    for bad in ({"mode": "rs"}, {"cta_group": 2, "sk": True}, {"pair_n": True},
                {"arch": "sm_100a"}):
        kw = {"mode": "gemm", **bad}
        mode = kw.pop("mode")
        with pytest.raises(ValueError, match="64-row"):
            make_plan(200, 7168, 4096, 2, 132, mode, bm=64, **kw)
    hw = Hardware("sm_90a", 132, 132)
    plan, v = resolve(Shape(200, 7168, 1024, "gemm"), hw, 2, "unicast", tuning=Tuning(bm=64))
    assert plan.bm == v.bm == 64 and not v.pingpong and "BM=64" in v.describe()
    # 64-row tiles keep the rules' ping-pong out even where it would fire
    assert not resolve(Shape(8192, 7168, 1024, "gemm"), hw, 2, "unicast",
                       tuning=Tuning(bm=64))[1].pingpong
    with pytest.raises(RsarValueError, match="Tuning.bm"):
        Tuning(bm=96)
    with pytest.raises(RsarValueError, match="64-row tiles run the plain GEMM"):
        resolve(Shape(200, 7168, 1024, "rs"), hw, 2, "unicast", tuning=Tuning(bm=64))
    from launch.resolve import Dtypes
    with pytest.raises(RsarValueError, match="fp8"):
        resolve(Shape(200, 7168, 1024, "gemm"), hw, 2, "unicast", Dtypes("bf16", "e4m3"),
                Tuning(bm=64))
