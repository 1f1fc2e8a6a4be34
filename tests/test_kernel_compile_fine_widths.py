"""Tile widths 16 past a multiple of 32 (``launch.geometry.FINE_NS``: 112 / 144 / 176 / 208),
for partial last waves: the sm90 kernels hand such tiles over in 16-column sub-tiles
(``Sm90FusedKernel.epi_n``). Here they compile for sm_90a, their wgmma is as wide as the
tile, and ptxas neither spills nor serializes the wgmma. ``Tuning.bn`` takes them on sm90;
the default widths keep their PTX (tests/test_variant_identity.py)."""
from __future__ import annotations

import pytest

pytest.importorskip("cutlass")

from ptx_checks import ptxas_log  # noqa: E402
from launch import Shape, Hardware, Tuning, resolve  # noqa: E402
from launch.geometry import FINE_NS  # noqa: E402
from launch.variant import Variant  # noqa: E402
from rsar_core.errors import RsarValueError  # noqa: E402

FINE = [
    Variant("sm_90a", 112, 2, "rs", "unicast", push="tma", pdl=1, prefetch=1),
    Variant("sm_90a", 144, 2, "ar", "unicast", push="tma_all", pdl=1, prefetch=1,
            early_copy=1, push_window=1),
    Variant("sm_90a", 176, 2, "gemm", "unicast", push="tma", pdl=1, tma_store=1),
    Variant("sm_90a", 208, 2, "ar", "unicast", 2, push="tma_all", prefetch=1, pdl=1),
    Variant("sm_90a", 176, 2, "rs", "unicast", push="tma", in_dtype="e4m3"),
    Variant("sm_90a", 112, 2, "gemm", "unicast", push="tma", tma_store=1, pingpong=1),
]


@pytest.mark.parametrize("v", FINE, ids=lambda v: v.describe().replace(" ", "-"))
def test_fine_width_compiles_whole(ptx_of, v, tmp_path):
    from launch.sm90_kernel import Sm90FusedKernel
    k = Sm90FusedKernel(v)
    assert k.epi_n == 16 and k.num_sub == v.bn // 16
    ptx = ptx_of(v)
    assert f"wgmma.mma_async.sync.aligned.m64n{v.bn}k" in ptx
    if v.push in ("tma", "tma_all") and v.mode != "gemm":
        assert "cp.async.bulk.global.shared" in ptx
    if v.tma_store:
        assert "cp.async.bulk.tensor.2d.global.shared" in ptx
    log = ptxas_log(ptx, tmp_path)
    assert " 0 bytes spill stores" in log, log[-800:]
    for note in ("C7514", "C7517", "C7520"):  # wgmma serialized
        assert note not in log, log[-800:]


def test_the_default_widths_keep_their_ring():
    from launch.sm90_kernel import Sm90FusedKernel
    for bn in (64, 128, 160, 192, 224, 256):
        k = Sm90FusedKernel(Variant("sm_90a", bn, 2, "rs", "unicast", push="tma"))
        assert k.epi_n == 32 and k.num_sub == bn // 32


def test_fused_pingpong_refuses_144():
    from launch.sm90_kernel import Sm90FusedKernel
    with pytest.raises(ValueError, match="144"):
        Sm90FusedKernel(Variant("sm_90a", 144, 2, "rs", "unicast", push="tma", pingpong=1))


@pytest.mark.parametrize("bn", FINE_NS)
def test_tuning_takes_them_on_sm90_only(bn):
    plan, v = resolve(Shape(2048, 7168, 1024, "rs"), Hardware("sm_90a", 132, 132), 2,
                      "unicast", tuning=Tuning(bn=bn))
    assert plan.bn == v.bn == bn and plan.tiles_n == -(-7168 // bn)
    with pytest.raises(RsarValueError, match=f"tiles 128 or 256 wide, not {bn}"):
        resolve(Shape(2048, 7168, 1024, "rs"), Hardware("sm_100a", 148, 148), 2, "unicast",
                tuning=Tuning(bn=bn))


def test_push_window_counts_32_column_sub_tiles():
    """A window of one 32-column sub-tile's copies keeps two 16-column groups in flight, and
    the ring slot is released only once its copies have read it."""
    from launch.sm90_kernel import Sm90FusedKernel
    fine = Sm90FusedKernel(FINE[1])
    assert fine.push_window == 1 and fine.window_groups == 2
    wide = Sm90FusedKernel(Variant("sm_90a", 128, 2, "ar", "unicast", push="tma_all",
                                   push_window=1))
    assert wide.window_groups == 1
