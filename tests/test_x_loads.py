"""How x is loaded where the last tile row is partial: x's box of that row's rows
(``Tuning.x_box`` / ``Variant.x_rows``). It is validated once, refused (sm100) or left out
where no kernel has it (fused ops, fp8, pairs along N, ping-pong) before anything compiles,
resolved by its rule when left at None, and compiled for sm_90a changing only the producer's
loads and, on 128-row tiles, the MMA warp group whose rows all lie past x (no spill, no
serialized wgmma)."""
from __future__ import annotations

import pytest

from launch import Dtypes, Hardware, Shape, Tuning, resolve
from launch.geometry import X_ROWS
from launch.resolve import x_rows_for
from launch.rules import X_BOX_UNEVEN, choose_x_box
from rsar_core.errors import RsarValueError

H100 = Hardware("sm_90a", 132)


@pytest.mark.parametrize("bad", ["yes", 1, 0])
def test_tuning_refuses_non_bools(bad):
    with pytest.raises(RsarValueError, match="x_box"):
        Tuning(x_box=bad)


def test_sm100_refuses_the_box():
    with pytest.raises(RsarValueError, match="x_box"):
        resolve(Shape(1, 7168, 1024, "gemm"), Hardware("sm_100a", 148), 2, "unicast",
                tuning=Tuning(x_box=True))


@pytest.mark.parametrize("M,rows", [(1, 8), (8, 8), (9, 16), (16, 16), (17, 32), (32, 32),
                                    (33, 48), (48, 48), (49, 0), (64, 0)])
def test_x_box_rows_on_64_row_tiles(M, rows):
    plan, v = resolve(Shape(M, 7168, 4096, "gemm"), H100, 2, "unicast",
                      tuning=Tuning(x_box=True))
    assert plan.bm == 64 and v.x_rows == rows
    assert resolve(Shape(M, 7168, 4096, "gemm"), H100, 2, "unicast",
                   tuning=Tuning(x_box=False))[1].x_rows == 0


@pytest.mark.parametrize("M,rows", [(1, 8), (20, 32), (33, 48), (49, 64), (64, 64), (65, 80),
                                    (100, 112), (112, 112), (113, 0), (128, 0), (129, 8),
                                    (192, 64), (200, 80), (224, 96), (240, 112), (256, 0),
                                    (300, 48), (4097, 8)])
def test_x_box_rows_on_128_row_tiles(M, rows):
    """fp16 keeps the 128-row plans at small M: boxes up to 64 rows there, on the last tile
    row of any M."""
    plan, v = resolve(Shape(M, 7168, 4096, "gemm"), H100, 2, "unicast", Dtypes("f16"),
                      Tuning(x_box=True, cta_group=1))
    assert plan.bm == 128 and v.x_rows == rows


@pytest.mark.parametrize("shape,dtypes,tuning", [
    (Shape(1, 7168, 4096, "rs"), Dtypes(), {}),
    (Shape(1, 7168, 4096, "ar"), Dtypes(), {}),
    (Shape(1, 7168, 4096, "gemm"), Dtypes("bf16", "e4m3"), {}),
    (Shape(100, 7168, 4096, "gemm"), Dtypes(), {"pair_n": True}),
    (Shape(4100, 7168, 1024, "gemm"), Dtypes(), {"pingpong": True, "bn": 192}),
], ids=["rs", "ar", "fp8", "pn", "pp"])
def test_x_box_only_where_a_kernel_has_it(shape, dtypes, tuning):
    """A Tuning with x_box=True serves every call of its op: calls the box has no kernel
    for load whole tiles, as without it."""
    _, v = resolve(shape, H100, 2, "unicast", dtypes, Tuning(x_box=True, **tuning))
    assert v.x_rows == 0


@pytest.mark.parametrize("M,rows,even", [(129, 8, 8), (300, 48, 64), (310, 64, 64), (520, 8, 8),
                                         (640, 0, 0), (1100, 80, 0), (1150, 0, 0)])
def test_x_box_on_pairs(M, rows, even):
    """2x1 clusters along M box the last tile row as 1-CTA tiles do (the pair's padding tile
    reloads that row, so it loads the box too), by default (the rule) and where a Tuning
    asks (the rule's boxes dividing no tile only with ``X_BOX_UNEVEN``); x_box=False keeps
    whole boxes; pairs along N have no box."""
    for t in (Tuning(cta_group=2, bn=128, x_box=True), Tuning(cta_group=2, bn=128)):
        plan, v = resolve(Shape(M, 8192, 4096, "gemm"), H100, 2, "unicast", tuning=t)
        want = rows if t.x_box or X_BOX_UNEVEN else even
        assert plan.cta_group == 2 and not plan.pair_n and v.x_rows == want
    plan, v = resolve(Shape(M, 8192, 4096, "gemm"), H100, 2, "unicast",
                      tuning=Tuning(cta_group=2, bn=128, x_box=False))
    assert plan.cta_group == 2 and v.x_rows == 0
    plan, v = resolve(Shape(M, 8192, 4096, "gemm"), H100, 2, "unicast",
                      tuning=Tuning(cta_group=2, bn=128, pair_n=True))
    assert plan.pair_n and v.x_rows == 0


@pytest.mark.parametrize("M,rows,even", [(33, 48, 64), (300, 48, 64), (65, 80, 0),
                                         (200, 80, 0), (224, 96, 0), (240, 112, 0),
                                         (1000, 112, 0)])
def test_uneven_boxes_follow_their_switch(M, rows, even):
    """The rule's box (x_box None) takes 48 / 80 / 96 / 112 rows, which divide no tile, only
    while ``X_BOX_UNEVEN`` says so (else the next box dividing the tile, or the whole
    tile); an explicit x_box=True always may."""
    t = dict(cta_group=1, bn=128)
    for x_box, want in ((True, rows), (None, rows if X_BOX_UNEVEN else even)):
        plan, v = resolve(Shape(M, 7168, 4096, "gemm"), H100, 2, "unicast", Dtypes("f16"),
                          Tuning(x_box=x_box, **t))
        assert plan.bm == 128 and v.x_rows == want


def test_x_box_rows_are_whole_swizzle_atoms():
    assert all(r % 8 == 0 for r in X_ROWS) and sorted(X_ROWS) == list(X_ROWS)


@pytest.mark.parametrize("M", [1, 8, 33, 64, 128])
def test_x_box_default_follows_the_rule(M):
    plan, v = resolve(Shape(M, 7168, 4096, "gemm"), H100, 2, "unicast")
    want = x_rows_for(M, plan, Dtypes(), uneven=X_BOX_UNEVEN) if choose_x_box(plan.mode, M) else 0
    assert v.x_rows == want


@pytest.mark.parametrize("v", [
    dict(mode="rs"), dict(cta_group=2, pair_n=1), dict(x_rows=64), dict(x_rows=12),
    dict(in_dtype="e4m3")], ids=["rs", "pn", "whole", "odd", "fp8"])
def test_kernel_refuses_a_box_it_cannot_load(v):
    pytest.importorskip("cutlass")
    from launch.sm90_kernel import Sm90FusedKernel
    from launch.variant import Variant
    fields = dict(push="tma", bm=64 if "x_rows" in v else 128, x_rows=8)
    fields.update(v)
    mode = fields.pop("mode", "gemm")
    cg = fields.pop("cta_group", 1)
    with pytest.raises(ValueError, match="x_rows"):
        Sm90FusedKernel(Variant("sm_90a", 112, 2, mode, "unicast", cg, **fields))


@pytest.mark.parametrize("bm,rows", [(64, 8), (64, 32), (64, 48), (128, 48), (128, 64),
                                     (128, 80), (128, 112)])
def test_x_box_compiles_with_the_box_bytes(ptx_of, tmp_path, bm, rows):
    """Each stage expects x's box of ``rows`` rows and w's tile (the last tile row's loads),
    and nothing else moves."""
    pytest.importorskip("cutlass")
    import dataclasses
    import re
    from launch.variant import Variant
    from ptx_checks import ptxas_log
    base = Variant("sm_90a", 112, 2, "gemm", "unicast", push="tma", pdl=1, tma_store=1, bm=bm)
    boxed = ptx_of(dataclasses.replace(base, x_rows=rows))
    whole = ptx_of(base)
    tx = lambda ptx: set(int(n) for n in re.findall(r"mov\.b32\s+%r\d+, (\d+);", ptx)
                         if int(n) in ((bm + 112) * 128, (rows + 112) * 128))
    assert tx(whole) == {(bm + 112) * 128} and tx(boxed) == {(rows + 112) * 128}
    for op in ("wgmma.mma_async", "cp.async.bulk.tensor.2d.global", "stmatrix"):
        assert whole.count(op) == boxed.count(op), op
    # the tail row's box is a load of its own; the other rows expect the rest of x's tile
    load = "cp.async.bulk.tensor.2d.shared::cta.global"
    assert boxed.count(load) > whole.count(load) > 0
    assert "mbarrier.expect_tx" in boxed and "mbarrier.expect_tx" not in whole
    assert f"{(bm - rows) * 128};" in boxed
    log = ptxas_log(boxed, tmp_path)
    assert " 0 bytes spill stores" in log, log[-800:]
    for note in ("C7514", "C7517", "C7520"):
        assert note not in log, log[-800:]


@pytest.mark.parametrize("cta_group", [1, 2])
def test_idle_half_adds_waits_not_wgmmas(ptx_of, tmp_path, cta_group):
    """128-row tiles with a box of at most 64 rows: on the last tile row the second MMA warp
    group (and a pair's padding tile) waits for and releases each stage without a wgmma, a
    path of its own beside the mainloop, which stays as it was."""
    pytest.importorskip("cutlass")
    import dataclasses
    from launch.variant import Variant
    from ptx_checks import ptxas_log
    base = Variant("sm_90a", 256, 2, "gemm", "unicast", cta_group, push="tma", pdl=1,
                   tma_store=1)
    boxed = ptx_of(dataclasses.replace(base, x_rows=8))
    whole = ptx_of(base)
    assert boxed.count("wgmma.mma_async") == whole.count("wgmma.mma_async") > 0
    assert boxed.count("mbarrier.try_wait") > whole.count("mbarrier.try_wait")
    log = ptxas_log(boxed, tmp_path)
    assert " 0 bytes spill stores" in log, log[-800:]
    for note in ("C7514", "C7517", "C7520"):
        assert note not in log, log[-800:]
