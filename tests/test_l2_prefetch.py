"""``Tuning.l2_prefetch`` (an experiment): the producer prefetches its later k-blocks into
L2. Its validation and sm100's refusal are tests/test_tuning.py's; here it is passed to
the variant as asked, and compiled for sm_90a as prefetches beside the loads that leave
every load, wgmma and barrier of the kernel as it was (no spill, no serialized wgmma); off,
it is not in the PTX (the default variants' PTX is pinned by tests/test_variant_identity.py)."""
from __future__ import annotations

import dataclasses

import pytest

from launch import Hardware, Shape, Tuning, resolve

H100 = Hardware("sm_90a", 132)
PREFETCH = "cp.async.bulk.prefetch.tensor.2d.L2.global"


@pytest.mark.parametrize("mode", ["gemm", "rs", "ar"])
def test_the_variant_takes_the_distance_and_nothing_else_moves(mode):
    shape = Shape(256, 7168, 9216, mode)
    plan, v = resolve(shape, H100, 2, "unicast", tuning=Tuning(l2_prefetch=8))
    plan0, v0 = resolve(shape, H100, 2, "unicast")
    assert plan == plan0 and v == dataclasses.replace(v0, l2_prefetch=8)
    assert v0.l2_prefetch == 0 and "l2_prefetch=8" in v.describe()


def test_the_cache_name_carries_it():
    from launch.disk_cache import entry_name
    _, v = resolve(Shape(256, 7168, 9216, "gemm"), H100, 2, "unicast",
                   tuning=Tuning(l2_prefetch=8))
    assert "_l2p8" in entry_name(v) and "_l2p" not in entry_name(
        dataclasses.replace(v, l2_prefetch=0))


@pytest.mark.parametrize("M,tuning", [
    (256, {}),                                    # 2x1 clusters along M: w multicast
    (256, {"pair_n": True, "bn": 112}),           # pairs along N: x multicast
    (300, {"cta_group": 1}),                      # x's box on the last tile row
    (2048, {}),                                   # ping-pong warp groups
    (2048, {"bm": 64, "cta_group": 1}),           # 64-row tiles
], ids=["pairs", "pairs-n", "box", "pingpong", "rows64"])
def test_prefetches_beside_unchanged_loads(ptx_of, tmp_path, M, tuning):
    pytest.importorskip("cutlass")
    from ptx_checks import ptxas_log
    K = 1024 if "bm" not in tuning and M == 2048 else 9216  # 2048 x 7168 x 1024: ping-pong
    _, on = resolve(Shape(M, 7168, K, "gemm"), H100, 2, "unicast",
                    tuning=Tuning(l2_prefetch=8, **tuning))
    assert on.pingpong == (K == 1024) and on.x_rows == (64 if M == 300 else 0)
    off = dataclasses.replace(on, l2_prefetch=0)
    p_on, p_off = ptx_of(on), ptx_of(off)
    assert PREFETCH not in p_off and p_on.count(PREFETCH) >= 2  # w's block and x's
    for op in ("wgmma.mma_async", "cp.async.bulk.tensor.2d.shared", "mbarrier.try_wait",
               "mbarrier.arrive", "stmatrix"):
        assert p_on.count(op) == p_off.count(op), op
    log = ptxas_log(p_on, tmp_path)
    assert " 0 bytes spill stores" in log, log[-800:]
    for note in ("C7514", "C7517", "C7520"):
        assert note not in log, log[-800:]


def test_a_fused_kernel_compiles_it(ptx_of):
    pytest.importorskip("cutlass")
    _, v = resolve(Shape(4096, 7168, 4096, "rs"), H100, 2, "unicast",
                   tuning=Tuning(l2_prefetch=4))
    assert PREFETCH in ptx_of(v)
