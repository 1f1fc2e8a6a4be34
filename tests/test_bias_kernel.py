"""Kernels with a bias (``Variant.bias``): the exchange's sums read it through L1 (16-byte
read-only loads, none in the same kernel without a bias), on every transport and arch, with
nothing spilled and every wgmma asynchronous; plain GEMM kernels refuse one."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

pytest.importorskip("cutlass")

from launch.variant import Variant  # noqa: E402
from launch.cache import kernel_for  # noqa: E402
from launch.disk_cache import entry_name  # noqa: E402
from ptx_checks import ptxas_log  # noqa: E402

BIASED = [
    # the defaults' shapes: RS with the reductions' prefetch, push-all AR
    Variant("sm_90a", 256, 2, "rs", "unicast", push="tma", pdl=1, prefetch=1, bias=1),
    Variant("sm_90a", 128, 2, "ar", "unicast", push="tma_all", pdl=1, prefetch=1, push_all=1,
            bias=1),
    # the switch's sums (compiled only: multicast stays off on the machines here)
    Variant("sm_90a", 256, 2, "ar", "multicast", bias=1),
    Variant("sm_100a", 256, 2, "rs", "unicast", bias=1),
]


@pytest.mark.parametrize("v", BIASED, ids=lambda v: v.describe().replace(" ", "-"))
def test_bias_read_by_the_sums(ptx_of, v, tmp_path):
    ptx = ptx_of(v)
    loads = len(re.findall(r"ld\.global\.nc\.v4\.b32", ptx))
    # one 16-byte bias read per 16-byte chunk a sum produces: at least one per sub-tile
    assert loads >= v.bn // 32, loads
    assert "ld.global.nc.v4" not in ptx_of(replace(v, bias=0))
    log = ptxas_log(ptx, tmp_path, v.arch)
    for code in ("C7514", "C7517", "C7520"):
        assert code not in log, log[-2000:]
    assert " 0 bytes spill stores" in log, log[-2000:]


def test_bias_is_part_of_the_variant():
    v = BIASED[0]
    assert entry_name(v) != entry_name(replace(v, bias=0))
    assert v.describe().endswith(" bias")


def test_plain_gemm_refuses_a_bias():
    with pytest.raises(ValueError, match="RS and AR kernels only"):
        kernel_for(Variant("sm_90a", 256, 2, "gemm", "unicast", push="tma", tma_store=1, bias=1))
    with pytest.raises(ValueError, match="RS and AR kernels only"):
        kernel_for(Variant("sm_100a", 256, 2, "gemm", "unicast", bias=1))
