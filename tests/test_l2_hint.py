"""``Tuning.l2_hint``: the mainloop's TMA loads of x and w tagged with an L2 eviction
priority (``createpolicy``'s, or CUTLASS's fixed policy words), where otherwise they carry
the DSL's own cache-hint operand, 0; left at None, ``choose_gemm_l2_hint`` decides.
Validated against ``L2_HINTS``, refused by the sm100 kernel, changing nothing but
``Variant.l2_hint``; its kernels tag every load with the policy and keep the untagged
kernel's wgmmas, none serialized, nothing spilled."""
from __future__ import annotations

import dataclasses
import re

import pytest

from launch import Dtypes, Hardware, Shape, Tuning, resolve
from launch.geometry import L2_HINTS
from launch.rules import GEMM_L2_HINT, choose_gemm_l2_hint
from rsar_core.errors import RsarValueError

H100 = Hardware("sm_90a", 132, 132)
OFF = Tuning(l2_hint="")
CALLS = [  # the ping-pong GEMM alone, pairs along N, a partial-row box, a fused RS, an fp8 AR
    (Shape(2048, 7168, 1024, "gemm"), Dtypes(), OFF),
    (Shape(512, 7168, 1024, "gemm"), Dtypes(), OFF.replace(pair_n=True, bn=112, stages=7)),
    (Shape(129, 7168, 1024, "gemm"), Dtypes(), OFF.replace(cta_group=1)),
    (Shape(2048, 7168, 1024, "rs"), Dtypes(), OFF),
    (Shape(1024, 7168, 4096, "ar"), Dtypes("bf16", "e4m3"), OFF),
]
IDS = ["pingpong", "pairs-n", "x-box", "rs", "fp8-ar"]
LOAD = re.compile(r"cp\.async\.bulk\.tensor\.\dd\.shared::\w+\.global\S*L2::cache_hint "
                  r"\[[^\]]+\], \[[^\]]+\], \[[^\]]+\],(?: %rs\d+,)? (%rd\d+);")


def test_one_of_the_hints_only():
    for bad in ("evict_last", "LAST", 2, True, "fixed"):
        with pytest.raises(RsarValueError, match=r"Tuning\.l2_hint must be None or one of"):
            Tuning(l2_hint=bad)
    assert Tuning(l2_hint="last").changed() == {"l2_hint": "last"}
    assert Tuning(l2_hint="").changed() == {"l2_hint": ""}
    assert Tuning().changed() == {}


@pytest.mark.parametrize("shape,dtypes,hint", [
    (Shape(2048, 7168, 1024, "gemm"), Dtypes(), GEMM_L2_HINT),
    (Shape(512, 8192, 1024, "gemm"), Dtypes("f16"), GEMM_L2_HINT),
    (Shape(16384, 7168, 512, "gemm"), Dtypes(), GEMM_L2_HINT),
    (Shape(511, 7168, 1024, "gemm"), Dtypes(), ""),  # M < 512: mixed, -1.7..+1.5%
    (Shape(2048, 7168, 4096, "gemm"), Dtypes(), ""),  # K 4096 / 9216: a tie
    (Shape(2048, 7168, 1024, "gemm"), Dtypes("bf16", "e4m3"), ""),  # fp8: not timed
    (Shape(2048, 7168, 1024, "rs"), Dtypes(), ""),  # the fused op: two GPUs decide
    (Shape(2048, 7168, 1024, "ar"), Dtypes(), ""),
])
def test_the_rule(shape, dtypes, hint):
    assert choose_gemm_l2_hint(shape.mode, shape.M, shape.K, bool(dtypes.operands)) == hint
    _, v = resolve(shape, H100, 2, "unicast", dtypes)
    assert v.l2_hint == L2_HINTS.index(hint)
    # an explicit "" is the DSL's operand, whatever the rule says
    assert resolve(shape, H100, 2, "unicast", dtypes, OFF)[1].l2_hint == 0


def test_sm100_takes_no_rule():
    _, v = resolve(Shape(2048, 7168, 1024, "gemm"), Hardware("sm_100a", 148, 148), 2,
                   "unicast")
    assert v.l2_hint == 0


@pytest.mark.parametrize("shape,dtypes,base", CALLS, ids=IDS)
def test_it_changes_the_variant_only(shape, dtypes, base):
    plan, v = resolve(shape, H100, 2, "unicast", dtypes, base)
    for i, hint in enumerate(L2_HINTS[1:], 1):
        plan_h, v_h = resolve(shape, H100, 2, "unicast", dtypes,
                              dataclasses.replace(base, l2_hint=hint))
        assert plan_h == plan and not v.l2_hint
        assert v_h == dataclasses.replace(v, l2_hint=i)
        assert f"l2_hint={i}" in v_h.describe()


def test_sm100_refuses_it():
    with pytest.raises(RsarValueError, match=r"Tuning\.l2_hint.*sm_100a kernel has none"):
        resolve(Shape(1024, 7168, 1024, "rs"), Hardware("sm_100a", 148, 148), 2, "unicast",
                tuning=Tuning(l2_hint="last"))


def test_the_kernel_refuses_an_index_past_the_hints():
    pytest.importorskip("cutlass")
    from launch.sm90_kernel import Sm90FusedKernel
    _, v = resolve(Shape(1024, 7168, 1024, "gemm"), H100, 2, "unicast")
    with pytest.raises(ValueError, match="l2_hint must index"):
        Sm90FusedKernel(dataclasses.replace(v, l2_hint=len(L2_HINTS)))


def _policies(ptx: str) -> set[str]:
    """The values each mainloop load's cache-hint register holds: ``createpolicy``'s kind,
    or the constant moved into it."""
    out = set()
    for reg in LOAD.findall(ptx):
        made = re.search(rf"createpolicy\.fractional\.L2::evict_(\w+)\.b64\s+{re.escape(reg)},",
                         ptx)
        moved = re.search(rf"mov\.b64\s+{re.escape(reg)}, (\w+);", ptx)
        out.add(made.group(1) if made else moved.group(1) if moved else "?")
    return out


@pytest.mark.parametrize("shape,dtypes,base", CALLS, ids=IDS)
def test_its_kernels_tag_every_load(ptx_of, shape, dtypes, base, tmp_path):
    pytest.importorskip("cutlass")
    from ptx_checks import ptxas_log
    _, v = resolve(shape, H100, 2, "unicast", dtypes, base)
    _, v_h = resolve(shape, H100, 2, "unicast", dtypes,
                     dataclasses.replace(base, l2_hint="last"))
    ptx, ptx_h = ptx_of(v), ptx_of(v_h)
    assert _policies(ptx) == {"0"}  # the DSL's own operand, where CUTLASS's C++ passes normal
    assert _policies(ptx_h) == {"last"}
    assert len(LOAD.findall(ptx_h)) == len(LOAD.findall(ptx))
    mma = r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k\d+\S*"
    assert re.findall(mma, ptx_h) == re.findall(mma, ptx)
    log = ptxas_log(ptx_h, tmp_path)
    for code in ("C7514", "C7517", "C7520"):  # no wgmma serialized
        assert code not in log, log[-2000:]
    assert " 0 bytes spill stores" in log, log[-2000:]


@pytest.mark.parametrize("hint", ["fixed_normal", "fixed_last"])
def test_the_fixed_words_are_cutlass_s(ptx_of, hint):
    """The ``fixed_`` hints load with CUTLASS's policy words, not a ``createpolicy``."""
    pytest.importorskip("cutlass")
    from launch.geometry import L2_POLICY_WORDS
    shape, dtypes, base = CALLS[0]
    _, v_h = resolve(shape, H100, 2, "unicast", dtypes, dataclasses.replace(base, l2_hint=hint))
    ptx = ptx_of(v_h)
    assert _policies(ptx) == {f"{L2_POLICY_WORDS[hint]:#x}"}
    assert "createpolicy" not in ptx
