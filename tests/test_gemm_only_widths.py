"""Widths 80 and 96 (``launch.geometry.GEMM_ONLY_NS``): cuBLAS's tile widths at small M off
the grid (PERF.md (bc)), for the plain sm90 GEMM only and only forced. No planner takes
them (no default plan moves), the fused op and sm100 refuse them, and their kernels (80:
16-column sub-tiles, 96: 32-column) compile on 64- and 128-row tiles, 1-CTA and 2x1
clusters, at the deep stages cuBLAS runs, with m64n80 / m64n96 wgmmas, none serialized,
nothing spilled."""
from __future__ import annotations

import re

import pytest

from launch import Hardware, Shape, Tuning, resolve
from launch.geometry import GEMM_ONLY_NS
from rsar_core.errors import RsarValueError

H100 = Hardware("sm_90a", 132, 132)
SHAPES = [(128, 2880, 4096), (256, 2880, 9216), (256, 5120, 4096), (512, 7168, 1024),
          (4096, 2880, 4096), (130, 960, 1024)]


@pytest.mark.parametrize("M,N,K", SHAPES)
def test_only_the_small_m_rules_take_them(M, N, K):
    """Unforced, only the plain GEMM's small-M cluster plans run them: 64-row ones (PERF.md
    (bd), (bf): ``choose_gemm_rows64_pairs``' 80 / 96, ``choose_gemm_quads``' 96) and 128-row
    pairs at M <= 512 (``choose_gemm_pairs_short``, (be), (bf)); the fused ops never."""
    for mode in ("gemm", "rs", "ar"):
        p, v = resolve(Shape(M, N, K, mode), H100, 2, "unicast")
        if v.bn in GEMM_ONLY_NS:
            assert mode == "gemm" and M <= 512 and (p.bm == 64 or p.cta_group == 2), p


@pytest.mark.parametrize("bn", GEMM_ONLY_NS)
def test_forced_on_the_plain_gemm(bn):
    plan, v = resolve(Shape(256, 2880, 4096, "gemm"), H100, 2, "unicast",
                      tuning=Tuning(bn=bn, bm=64, cta_group=2, stages=10))
    assert (plan.bn, plan.bm, plan.cta_group, v.bn, v.stages) == (bn, 64, 2, bn, 10)
    assert plan.tiles_n == -(-2880 // bn)


@pytest.mark.parametrize("bn", GEMM_ONLY_NS)
@pytest.mark.parametrize("mode", ["rs", "ar"])
def test_the_fused_op_refuses_them(bn, mode):
    with pytest.raises(RsarValueError, match=rf"Tuning\.bn={bn}: the plain sm90 GEMM"):
        resolve(Shape(1024, 7168, 1024, mode), H100, 2, "unicast", tuning=Tuning(bn=bn))
    with pytest.raises(RsarValueError, match=rf"Tuning\.bn={bn}: the plain sm90 GEMM"):
        resolve(Shape(1024, 7168, 1024, "gemm"), Hardware("sm_100a", 148, 148), 2, "unicast",
                tuning=Tuning(bn=bn))


def test_the_kernel_refuses_them_fused():
    pytest.importorskip("cutlass")
    from launch.sm90_kernel import Sm90FusedKernel
    from launch.variant import Variant
    with pytest.raises(ValueError, match="BN=96 runs the plain GEMM"):
        Sm90FusedKernel(Variant("sm_90a", 96, 2, "rs", "unicast"))


@pytest.mark.parametrize("bn,bm,cta_group,stages", [
    (80, 64, 1, 11), (80, 64, 2, 0), (96, 64, 1, 10), (96, 64, 2, 10), (96, 128, 1, 0)])
def test_their_kernels_compile(ptx_of, tmp_path, bn, bm, cta_group, stages):
    pytest.importorskip("cutlass")
    from launch.sm90_kernel import Sm90FusedKernel
    from ptx_checks import ptxas_log
    _, v = resolve(Shape(256, 2880, 4096, "gemm"), H100, 2, "unicast",
                   tuning=Tuning(bn=bn, bm=bm, cta_group=cta_group, stages=stages or None))
    k = Sm90FusedKernel(v)
    assert k.epi_n == (16 if bn == 80 else 32) and k.num_sub * k.epi_n == bn
    ptx = ptx_of(v)
    assert set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16", ptx)) == {str(bn)}
    log = ptxas_log(ptx, tmp_path)
    for code in ("C7514", "C7517", "C7520"):
        assert code not in log, log[-2000:]
    assert " 0 bytes spill stores" in log, log[-2000:]
