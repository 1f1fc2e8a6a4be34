"""4x1 clusters (``Tuning(cta_group=4)``): four tile rows sharing w's tile, each CTA loading a
quarter and multicasting it to the other three, as cuBLAS runs four tile rows of 64 at M <=
256 off the grid (PERF.md (bc): 96 x 64 tiles on 2 x 4 clusters at 256 x 2880). The plain
sm90 GEMM of bf16 / fp16 operands only: no default plan takes them but those of
``choose_gemm_quads`` and ``choose_gemm_quads128``; the fused op, sm100, fp8, widths that are
not multiples of 32, the split-K tail, ping-pong and pairs along N refuse them before anything
compiles; their plans schedule every tile once; their kernels compile with w's loads
multicast and nothing spilled."""
from __future__ import annotations

import itertools
import re

import pytest

from launch import Hardware, Shape, Tuning, resolve
from launch.geometry import QUAD
from rsar_core.errors import RsarValueError

H100 = Hardware("sm_90a", 132, 132, 128)


def test_tuning_accepts_four_and_not_three():
    assert Tuning(cta_group=4).cta_group == 4
    with pytest.raises(RsarValueError, match="4 \\(the plain GEMM's 4x1"):
        Tuning(cta_group=3)


@pytest.mark.parametrize("M,N,K", [(128, 2880, 4096), (256, 2880, 1536), (256, 5120, 9216),
                                   (512, 7168, 1024), (4096, 8192, 4096), (300, 2880, 9216)])
def test_no_default_plan_takes_them_but_the_rule(M, N, K):
    """Unforced, only ``choose_gemm_quads`` (tests/test_small_m_deep.py) and
    ``choose_gemm_quads128`` (tests/test_quads128.py) pick them."""
    for mode in ("gemm", "rs", "ar"):
        p, v = resolve(Shape(M, N, K, mode), H100, 2, "unicast")
        assert p.cta_group != QUAD and v.cta_group != QUAD


@pytest.mark.parametrize("tuning,shape,why", [
    (Tuning(cta_group=4), Shape(256, 2880, 9216, "rs"), "plain sm90 GEMM"),
    (Tuning(cta_group=4), Shape(256, 2880, 9216, "ar"), "plain sm90 GEMM"),
    (Tuning(cta_group=4, bn=112), Shape(256, 2880, 9216, "gemm"), "multiples of 32"),
    (Tuning(cta_group=4, bn=80, bm=64), Shape(256, 2880, 9216, "gemm"), "multiples of 32"),
    (Tuning(cta_group=4, sk=True), Shape(256, 2880, 9216, "gemm"), "Tuning.sk"),
    (Tuning(cta_group=4, pingpong=True, bn=128), Shape(4096, 2880, 9216, "gemm"), "pingpong"),
    (Tuning(cta_group=4, pair_n=True), Shape(256, 2880, 9216, "gemm"), "pair_n"),
])
def test_refused_before_anything_compiles(tuning, shape, why):
    with pytest.raises(RsarValueError, match=re.escape(why)):
        resolve(shape, H100, 2, "unicast", tuning=tuning)


def test_refused_on_sm100_and_fp8():
    from launch.resolve import Dtypes
    with pytest.raises(RsarValueError, match="plain sm90 GEMM"):
        resolve(Shape(256, 2880, 9216, "gemm"), Hardware("sm_100a", 148, 148), 2, "unicast",
                tuning=Tuning(cta_group=4))
    with pytest.raises(RsarValueError, match="bf16 / fp16"):
        resolve(Shape(256, 2880, 9216, "gemm"), H100, 2, "unicast",
                dtypes=Dtypes("bf16", "e4m3"), tuning=Tuning(cta_group=4))


@pytest.mark.parametrize("bm,bn", [(64, 64), (64, 96), (64, 128), (128, 128), (128, 256)])
@pytest.mark.parametrize("M,N", [(1, 1000), (128, 2880), (200, 2880), (256, 5120),
                                 (513, 7168)])
def test_plans_schedule_every_tile_once(M, N, bm, bn):
    """Each lane a cluster of four tile rows of one tile column; a cluster past the last
    tile row computes padding tiles (reloading that row) that are never stored; the grid
    holds no more clusters than the GPU can keep resident (``quad_ctas``)."""
    p, v = resolve(Shape(M, N, 4096, "gemm"), H100, 2, "unicast",
                   tuning=Tuning(cta_group=4, bm=bm, bn=bn))
    assert (p.cta_group, p.cluster_mn, v.cta_group, p.bm, p.bn) == (4, (4, 1), 4, bm, bn)
    assert p.grid % 4 == 0 and p.grid <= H100.quad_ctas
    assert p.tiles_m == -(-M // bm) and p.pairs_m == -(-p.tiles_m // 4)
    seen = [t for c, r in itertools.product(range(p.grid), range(p.rounds))
            if (t := p.scheduled(0, c, r)) >= 0]
    assert sorted(seen) == list(range(p.num_tiles))


def test_grid_capped_by_resident_clusters():
    p, _ = resolve(Shape(512, 7168, 4096, "gemm"), Hardware("sm_90a", 132, 132, 96), 2,
                   "unicast", tuning=Tuning(cta_group=4, bn=128))
    assert p.grid == 96 and p.rounds == -(-p.num_units // 24)


def test_the_kernel_refuses_them_fused():
    pytest.importorskip("cutlass")
    from launch.sm90_kernel import Sm90FusedKernel
    from launch.variant import Variant
    for v in (Variant("sm_90a", 128, 2, "rs", "unicast", 4),
              Variant("sm_90a", 112, 2, "gemm", "unicast", 4, push="tma", tma_store=1)):
        with pytest.raises(ValueError, match="4x1 clusters run the plain GEMM"):
            Sm90FusedKernel(v)


@pytest.mark.parametrize("bm,bn,stages", [(64, 96, 10), (64, 64, 13), (128, 128, 0),
                                          (128, 96, 0)])
def test_their_kernels_compile(ptx_of, tmp_path, bm, bn, stages):
    pytest.importorskip("cutlass")
    from ptx_checks import ptxas_log
    _, v = resolve(Shape(256, 2880, 9216, "gemm"), H100, 2, "unicast",
                   tuning=Tuning(cta_group=4, bm=bm, bn=bn, stages=stages or None))
    ptx = ptx_of(v)
    assert f".m64n{bn}k16." in ptx
    # w's quarter-tiles go to all four CTAs; x's loads stay the CTA's own
    assert "multicast::cluster" in ptx
    log = ptxas_log(ptx, tmp_path)
    for code in ("C7514", "C7517", "C7520"):
        assert code not in log, log[-2000:]
    assert " 0 bytes spill stores" in log, log[-2000:]
