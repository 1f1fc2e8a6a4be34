"""Staggered k-blocks (``Tuning.k_stagger`` / ``Variant.k_stagger``): validated once, refused
where no kernel has them (sm100, block-wise fp8 scales) before anything compiles, resolved
by ``launch.rules.choose_k_stagger`` when left at None, and compiled for sm_90a with the
rotation in the producer only (no spill, no serialized wgmma)."""
from __future__ import annotations

import pytest

from launch import Dtypes, Hardware, Shape, Tuning, resolve
from launch.rules import choose_k_stagger
from rsar_core.errors import RsarValueError

H100 = Hardware("sm_90a", 132)


@pytest.mark.parametrize("bad", ["yes", 1, 0])
def test_tuning_refuses_non_bools(bad):
    with pytest.raises(RsarValueError, match="k_stagger"):
        Tuning(k_stagger=bad)


@pytest.mark.parametrize("mode", ["gemm", "rs", "ar"])
@pytest.mark.parametrize("M", [1, 64, 300, 4096])
def test_forced_either_way(mode, M):
    shape = Shape(M, 7168, 4096, mode)
    assert resolve(shape, H100, 2, "unicast", tuning=Tuning(k_stagger=True))[1].k_stagger == 1
    assert resolve(shape, H100, 2, "unicast", tuning=Tuning(k_stagger=False))[1].k_stagger == 0


def test_refused_where_no_kernel_has_it():
    with pytest.raises(RsarValueError, match="k_stagger"):
        resolve(Shape(64, 7168, 1024, "gemm"), H100, 2, "unicast",
                Dtypes("bf16", "e4m3", True), Tuning(k_stagger=True))
    with pytest.raises(RsarValueError, match="k_stagger"):
        resolve(Shape(64, 7168, 1024, "rs"), Hardware("sm_100a", 148), 2, "unicast",
                tuning=Tuning(k_stagger=True))


@pytest.mark.parametrize("mode", ["gemm", "rs", "ar"])
@pytest.mark.parametrize("M", [1, 8, 16, 24, 64, 128, 300, 4096])
@pytest.mark.parametrize("K", [1024, 4096, 9216])
def test_default_follows_the_rule(mode, M, K):
    plan, v = resolve(Shape(M, 7168, K, mode), H100, 2, "unicast")
    assert v.k_stagger == int(choose_k_stagger(plan.mode, plan.bm, plan.tiles_m, K))
    # block-wise fp8 scales never stagger, whatever the rule says
    _, vb = resolve(Shape(M, 7168, K, mode), H100, 2, "unicast", Dtypes("bf16", "e4m3", True))
    assert vb.k_stagger == 0
    # the sm100 kernel has no form of it
    _, v100 = resolve(Shape(M, 7168, K, mode), Hardware("sm_100a", 148), 2, "unicast")
    assert v100.k_stagger == 0


def test_compiles_with_the_rotation_in_the_producer(ptx_of, tmp_path):
    pytest.importorskip("cutlass")
    from launch.variant import Variant
    from ptx_checks import ptxas_log
    base = Variant("sm_90a", 112, 2, "gemm", "unicast", push="tma", pdl=1, tma_store=1, sk=1,
                   bm=64)
    import dataclasses
    staggered = dataclasses.replace(base, k_stagger=1)
    plain, rotated = ptx_of(base), ptx_of(staggered)
    assert plain != rotated
    # the same MMA and store code: only the producer's k coordinate differs
    for op in ("wgmma.mma_async.sync.aligned.m64n112k16", "cp.async.bulk.tensor.2d.global"):
        assert plain.count(op) == rotated.count(op), op
    log = ptxas_log(rotated, tmp_path)
    assert " 0 bytes spill stores" in log, log[-800:]
    for note in ("C7514", "C7517", "C7520"):
        assert note not in log, log[-800:]
