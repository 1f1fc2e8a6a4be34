"""``Tuning.tma_promo``: the mainloop's loads of x and w through descriptors the driver
encodes with an L2 promotion (``launch.tma_descs``), where otherwise they use the DSL atoms'
own. Validated against ``TMA_PROMOS``, refused by the sm100 kernel, changing nothing but
``Variant.tma_promo``; its kernels load every tile through the three descriptor parameters
and keep the atoms' kernel's loads and wgmmas, none serialized, nothing spilled."""
from __future__ import annotations

import dataclasses
import re

import pytest

from launch import Dtypes, Hardware, Shape, Tuning, resolve
from launch.geometry import TMA_PROMOS
from rsar_core.errors import RsarValueError

H100 = Hardware("sm_90a", 132, 132)
CALLS = [  # 2x1 clusters sharing w, pairs along N sharing x, a partial-row box, a fused RS, fp8
    (Shape(2048, 7168, 1024, "gemm"), Dtypes(), Tuning()),
    (Shape(512, 7168, 1024, "gemm"), Dtypes(), Tuning(pair_n=True, bn=112, stages=7)),
    (Shape(129, 7168, 1024, "gemm"), Dtypes(), Tuning(cta_group=1)),
    (Shape(2048, 7168, 1024, "rs"), Dtypes(), Tuning()),
    (Shape(1024, 7168, 4096, "ar"), Dtypes("bf16", "e4m3"), Tuning()),
]
IDS = ["pingpong-pairs", "pairs-n", "x-box", "rs", "fp8-ar"]
LOAD = re.compile(r"cp\.async\.bulk\.tensor\.\dd\.shared::\w+\.global\S* \[[^\]]+\], "
                  r"\[(%rd\d+), \{")


def test_one_of_the_promotions_only():
    for bad in ("256", "L2_256B", 128, True, "128b"):
        with pytest.raises(RsarValueError, match=r"Tuning\.tma_promo must be None or one of"):
            Tuning(tma_promo=bad)
    assert Tuning(tma_promo="128B").changed() == {"tma_promo": "128B"}
    assert Tuning().changed() == {}


@pytest.mark.parametrize("shape,dtypes,base", CALLS, ids=IDS)
def test_it_changes_the_variant_only(shape, dtypes, base):
    plan, v = resolve(shape, H100, 2, "unicast", dtypes, base)
    assert v.tma_promo == 0
    for i, promo in enumerate(TMA_PROMOS):
        plan_p, v_p = resolve(shape, H100, 2, "unicast", dtypes, base.replace(tma_promo=promo))
        assert plan_p == plan
        assert v_p == dataclasses.replace(v, tma_promo=i)
        assert (f"tma_promo={i}" in v_p.describe()) == bool(i)


def test_sm100_refuses_it():
    with pytest.raises(RsarValueError, match=r"Tuning\.tma_promo.*sm_100a kernel has none"):
        resolve(Shape(1024, 7168, 1024, "rs"), Hardware("sm_100a", 148, 148), 2, "unicast",
                tuning=Tuning(tma_promo="256B"))


def test_the_kernel_refuses_an_index_past_the_promotions():
    pytest.importorskip("cutlass")
    from launch.sm90_kernel import Sm90FusedKernel
    _, v = resolve(Shape(1024, 7168, 1024, "gemm"), H100, 2, "unicast")
    with pytest.raises(ValueError, match="tma_promo must index"):
        Sm90FusedKernel(dataclasses.replace(v, tma_promo=len(TMA_PROMOS)))


def _load_params(ptx: str) -> list[int]:
    """The kernel parameter each mainloop load's descriptor address is taken from
    (``cvta.param`` of a ``mov.b64`` of the parameter's symbol), in load order."""
    out = []
    for reg in LOAD.findall(ptx):
        cvta = re.search(rf"cvta\.param\.u64\s+{re.escape(reg)}, (%rd\d+);", ptx)
        src = cvta and re.search(rf"mov\.b64\s+{re.escape(cvta.group(1))}, \w+_param_(\d+);",
                                 ptx)
        out.append(int(src.group(1)) if src else -1)
    return out


@pytest.mark.parametrize("shape,dtypes,base", CALLS, ids=IDS)
def test_its_kernels_load_through_the_driver_s_descriptors(ptx_of, shape, dtypes, base,
                                                           tmp_path):
    pytest.importorskip("cutlass")
    from ptx_checks import ptxas_log
    _, v = resolve(shape, H100, 2, "unicast", dtypes, base)
    _, v_p = resolve(shape, H100, 2, "unicast", dtypes, base.replace(tma_promo="256B"))
    ptx, ptx_p = ptx_of(v), ptx_of(v_p)
    loads, loads_p = _load_params(ptx), _load_params(ptx_p)
    assert len(loads_p) == len(loads) and -1 not in loads_p
    # x's (and the box's) descriptors are parameters 0 (1), w's 2: 128 bytes, 64-byte aligned
    assert set(loads_p) == ({0, 1, 2} if v.x_rows else {0, 2})
    for i in set(loads_p):
        assert re.search(rf"\.param \.align 64 \.b8 \w+_param_{i}\[128\]", ptx_p)
    prefetch = r"prefetch\.tensormap"  # each descriptor's, as the atoms' (and the store's)
    assert len(re.findall(prefetch, ptx_p)) == len(re.findall(prefetch, ptx))
    mma = r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k\d+\S*"
    assert re.findall(mma, ptx_p) == re.findall(mma, ptx)
    log = ptxas_log(ptx_p, tmp_path)
    for code in ("C7514", "C7517", "C7520"):  # no wgmma serialized
        assert code not in log, log[-2000:]
    assert " 0 bytes spill stores" in log, log[-2000:]
