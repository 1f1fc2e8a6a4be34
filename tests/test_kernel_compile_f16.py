"""fp16 variants compile for sm_90a and sm_100a, and their PTX multiplies, converts and
reduces fp16 and never bf16 (and bf16 variants the reverse): a kernel that mixed the two
would compute garbage without failing anything but a numerical check on a GPU."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("cutlass")

from ptx_checks import assert_protocol_ptx  # noqa: E402
from launch.variant import Variant  # noqa: E402

F16 = [
    # the defaults of RS on 2x1 clusters, AR with early copies, the GEMM alone's TMA store
    Variant("sm_90a", 256, 2, "rs", "unicast", 2, push="tma", pdl=1, prefetch=1, dtype="f16"),
    Variant("sm_90a", 224, 2, "ar", "unicast", push="tma_all", pdl=1, prefetch=1,
            early_copy=1, dtype="f16"),
    Variant("sm_90a", 64, 2, "ar", "unicast", push="tma_all", push_all=1, pdl=1, dtype="f16"),
    Variant("sm_90a", 160, 2, "gemm", "unicast", push="tma", pdl=1, sk=1, tma_store=1,
            dtype="f16"),
    # thread-store pushes, and the multicast reduction (compiled only: multicast is off here)
    Variant("sm_90a", 128, 4, "rs", "unicast", dtype="f16"),
    Variant("sm_90a", 128, 2, "ar", "multicast", pdl=1, dtype="f16"),
]


def _kinds(ptx: str, pattern: str) -> set[str]:
    return set(re.findall(pattern, ptx))


@pytest.mark.parametrize("v", F16, ids=lambda v: v.describe().replace(" ", "-"))
def test_f16_variant_ptx(ptx_of, v):
    ptx = ptx_of(v)
    assert _kinds(ptx, r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.(\w+\.\w+\.\w+)") == {
        "f32.f16.f16"}
    assert "cvt.rn.f16x2.f32" in ptx and "bf16" not in ptx
    if v.mode != "gemm" and v.transport == "unicast":
        assert "cvt.f32.f16" in ptx  # partials unpacked for the fp32 sum
    if v.transport == "multicast":
        assert "multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.f16x2" in ptx
    assert_protocol_ptx(ptx, v)


def test_bf16_variant_has_no_f16(ptx_of):
    ptx = ptx_of(Variant("sm_90a", 128, 2, "ar", "multicast", pdl=1))
    assert "f16x2" not in ptx.replace("bf16x2", "") and "cvt.f32.f16" not in ptx
    assert ".f32.bf16.bf16" in ptx


def test_sm100_f16_variant_ptx(ptx_of):
    ptx = ptx_of(Variant("sm_100a", 256, 2, "rs", "unicast", 2, dtype="f16"))
    assert "tcgen05.mma" in ptx and "cvt.rn.f16x2.f32" in ptx and "bf16" not in ptx


def test_unknown_dtype_is_refused():
    from launch.sm90_kernel import Sm90FusedKernel
    with pytest.raises(ValueError, match="dtype must be one of"):
        Sm90FusedKernel(Variant("sm_90a", 128, 2, "rs", "unicast", dtype="f32"))


def test_dtype_names_its_cache_entry():
    from launch import disk_cache
    v = Variant("sm_90a", 128, 2, "rs", "unicast", push="tma")
    half = Variant("sm_90a", 128, 2, "rs", "unicast", push="tma", dtype="f16")
    assert disk_cache.entry_name(half) != disk_cache.entry_name(v)
    assert "_f16_" in disk_cache.entry_name(half) and "f16" not in disk_cache.entry_name(v)
    assert half.describe().endswith(" f16") and "f16" not in v.describe()
