"""``Tuning.dyn_tiles`` (an experiment): the plain GEMM (ping-pong or cooperative) with its
tiles handed out at run time by a counter in the workspace (``launch.dyn_tiles``). Validated as a
bool, refused by the fused ops and by kernels it has no form in, changing nothing but
``Variant.dyn_tiles``; its kernels compile with the static order's wgmmas, none serialized,
nothing spilled, the 2x1 clusters' units sent to the second CTA by ``st.async``."""
from __future__ import annotations

import dataclasses
import re

import pytest

from launch import Dtypes, Hardware, Shape, Tuning, resolve
from launch import layout
from rsar_core.errors import RsarValueError

H100 = Hardware("sm_90a", 132, 132)
PP_PAIRS = Shape(2048, 7168, 1024, "gemm")  # the default plan: ping-pong 176 on 2x1 clusters
PP_ONE = Tuning(cta_group=1, bn=176, pingpong=True)


def test_a_bool_only():
    with pytest.raises(RsarValueError, match=r"Tuning\.dyn_tiles must be True or False"):
        Tuning(dyn_tiles=1)
    assert Tuning(dyn_tiles=True).changed() == {"dyn_tiles": True}


@pytest.mark.parametrize("mode", ["rs", "ar"])
def test_the_fused_ops_refuse_it(mode):
    with pytest.raises(RsarValueError, match=r"Tuning\.dyn_tiles.*plain GEMM"):
        resolve(Shape(2048, 7168, 1024, mode), H100, 2, "unicast", tuning=Tuning(dyn_tiles=True))


def test_it_changes_the_variant_only():
    plan, v = resolve(PP_PAIRS, H100, 2, "unicast")
    plan_d, v_d = resolve(PP_PAIRS, H100, 2, "unicast", tuning=Tuning(dyn_tiles=True))
    assert v.pingpong and v.cta_group == 2 and plan_d == plan
    assert v_d == dataclasses.replace(v, dyn_tiles=1) and "dyn_tiles=1" in v_d.describe()


def test_kernels_without_a_form_of_it_refuse():
    pytest.importorskip("cutlass")
    from launch.cache import kernel_for
    _, v = resolve(Shape(1024, 8192, 1024, "gemm"), H100, 2, "unicast",
                   tuning=Tuning(tma_store=False, dyn_tiles=True))
    assert not v.tma_store
    with pytest.raises(ValueError, match="TMA store"):
        kernel_for(v)


def test_its_counter_words_sit_in_the_control_region_alone():
    words = [layout.CTRL_EPOCH, layout.CTRL_EXIT_COUNT, layout.CTRL_ABORT,
             layout.CTRL_TILE_NEXT, layout.CTRL_TILE_DONE]
    assert len(set(words)) == len(words) and max(words) + 4 <= layout.CTRL_DONE


@pytest.mark.parametrize("shape,tuning", [
    (PP_PAIRS, Tuning()), (PP_PAIRS, PP_ONE),
    (Shape(1024, 8192, 1024, "gemm"), Tuning()),  # cooperative, 1-CTA 256 wide
    (Shape(4096, 7168, 4096, "gemm"), Tuning(pingpong=False, cta_group=2, bn=224)),
], ids=["pingpong-pairs", "pingpong-one-cta", "cooperative", "cooperative-pairs"])
def test_its_kernels_compile_like_the_static_ones(ptx_of, shape, tuning, tmp_path):
    pytest.importorskip("cutlass")
    from ptx_checks import ptxas_log
    _, v = resolve(shape, H100, 2, "unicast", tuning=tuning)
    _, v_d = resolve(shape, H100, 2, "unicast", tuning=tuning.replace(dyn_tiles=True))
    assert v_d == dataclasses.replace(v, dyn_tiles=1)
    ptx, ptx_d = ptx_of(v), ptx_of(v_d)
    mma = r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k\d+\S*"
    assert re.findall(mma, ptx_d) == re.findall(mma, ptx)
    assert "atom.relaxed.gpu.global.add.u32" in ptx_d and "atom.relaxed.gpu" not in ptx
    assert ("st.async.shared::cluster" in ptx_d) == (v.cta_group == 2)
    for text in (ptx, ptx_d):
        log = ptxas_log(text, tmp_path)
        for code in ("C7514", "C7517", "C7520"):  # no wgmma serialized
            assert code not in log, log[-2000:]
        assert " 0 bytes spill stores" in log, log[-2000:]


def test_sm100_refuses_it():
    with pytest.raises(RsarValueError, match=r"Tuning\.dyn_tiles.*sm_100a kernel has none"):
        resolve(Shape(2048, 7168, 1024, "gemm"), Hardware("sm_100a", 148, 148), 2, "unicast",
                tuning=Tuning(dyn_tiles=True))
