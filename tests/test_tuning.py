"""``Tuning``: one frozen value, validated when made (the field and what it accepts named),
agreed across ranks, and refused by ``launch.resolve`` before any launch where a call cannot
take it."""
from __future__ import annotations

import dataclasses

import pytest

from launch import Dtypes, Hardware, Shape, Tuning, resolve, resolve_variant
from op_stub import cpu_op, planning_op, retuned
from rsar_core.errors import RsarTypeError, RsarValueError
from rsar_core.validate import check_tuning


@pytest.mark.parametrize("field,bad", [
    ("bn", 100), ("bn", "256"), ("cta_group", 3), ("cta_group", 5), ("lag", 2), ("band", 256), ("band", -1),
    ("peers_first", 1), ("pair_n", None), ("push", "nvls"), ("stages", 2), ("stages", 17),
    ("epi_slots", -1), ("pdl", None), ("push_ctas", -1), ("push_ctas", True),
    ("pingpong", 1), ("trace", "yes")])
def test_a_bad_value_names_its_field_and_what_it_accepts(field, bad):
    with pytest.raises(RsarValueError, match=rf"Tuning\.{field} must be .*got {bad!r}"):
        Tuning(**{field: bad})


def test_frozen_and_replace_checks_names_and_values():
    t = Tuning(bn=192)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.bn = 128
    assert t.replace(sk=True) == Tuning(bn=192, sk=True) and t == Tuning(bn=192)
    with pytest.raises(RsarValueError, match="no field force_bn"):
        t.replace(force_bn=128)
    with pytest.raises(RsarValueError, match=r"Tuning\.bn"):
        t.replace(bn=100)
    assert Tuning().changed() == {} and t.describe() == "Tuning(bn=192)"


class _Ranks:
    """A bootstrap whose allgather returns what each rank would send."""

    def __init__(self, *others: Tuning):
        self.others = others

    def allgather(self, mine: bytes) -> list[bytes]:
        return [mine] + [t.describe().encode() for t in self.others]


def test_every_rank_must_bring_the_same_tuning():
    assert check_tuning(None, _Ranks(Tuning())) == Tuning()
    assert check_tuning(Tuning(bn=128), _Ranks(Tuning(bn=128))) == Tuning(bn=128)
    with pytest.raises(RsarValueError, match=r"rank 0: Tuning\(bn=128\); rank 1: Tuning\(\)"):
        check_tuning(Tuning(bn=128), _Ranks(Tuning()))
    with pytest.raises(RsarTypeError, match="tuning must be a rsar Tuning"):
        check_tuning({"bn": 128}, _Ranks())


def test_untuned_resolve_is_the_rules_and_tuning_overrides_them():
    shape, hw = Shape(4096, 7168, 4096, "rs"), Hardware("sm_90a", 132, 132)
    plan, v = resolve(shape, hw, 2, "unicast")
    assert (plan.bn, plan.cta_group, v.push, v.pdl, v.prefetch) == (256, 2, "tma", 1, 1)
    v = resolve_variant(shape, hw, 2, "unicast", tuning=Tuning(bn=192, cta_group=1, pdl=False,
                                                               prefetch=False, push="lsu"))
    assert (v.bn, v.cta_group, v.pdl, v.prefetch, v.push) == (192, 1, 0, 0, "lsu")
    # fp8 plans at half the depth: the bf16 plan of K / 2
    f8 = resolve(Shape(4096, 7168, 8192, "rs"), hw, 2, "unicast", Dtypes("bf16", "e4m3"))[0]
    assert f8 == plan


@pytest.mark.parametrize("tuning,shape,match", [
    (Tuning(push_ctas=8), Shape(2048, 7168, 1024, "ar"), "push CTAs are an RS plan"),
    (Tuning(pingpong=True), Shape(4096, 7168, 1024, "rs"), "at most 160"),
    (Tuning(pair_n=True, cta_group=1), Shape(1024, 7168, 1024, "rs"),
     "Tuning\\(cta_group=1, pair_n=True\\) cannot plan"),
    (Tuning(lag=1, peers_first=True), Shape(1024, 7168, 1024, "rs"), "cannot plan"),
])
def test_a_call_the_tuning_cannot_run_is_refused_before_compiling(tuning, shape, match):
    with pytest.raises(RsarValueError, match=match):
        resolve(shape, Hardware("sm_90a", 132, 132), 2, "unicast", tuning=tuning)


@pytest.mark.parametrize("field,value", [("epi_slots", 2), ("stages", 4), ("x_box", True)])
def test_sm100_refuses_the_sm90_kernel_choices(field, value):
    with pytest.raises(RsarValueError, match=rf"Tuning\.{field}.*sm_100a kernel has none"):
        resolve(Shape(1024, 7168, 1024, "rs"), Hardware("sm_100a", 148, 148), 2, "unicast",
                tuning=Tuning(**{field: value}))


def test_a_refused_call_leaves_the_op_usable(monkeypatch):
    import torch
    from rsar_core.gemm_rsar import GemmRsAr
    monkeypatch.setattr(GemmRsAr, "pair_ctas", property(lambda self: self.sm_count))
    monkeypatch.setattr(GemmRsAr, "quad_ctas", property(lambda self: self.sm_count))
    op = cpu_op(monkeypatch, "rs", N=7168, max_M=4096, tuning=Tuning(pingpong=True))
    x = torch.randn(4096, 64, dtype=torch.bfloat16)
    w = torch.randn(7168, 64, dtype=torch.bfloat16)
    with pytest.raises(RsarValueError, match="pingpong.*at most 160"):
        op(x, w)  # the plan's 256-wide tiles cannot run ping-pong beside communication
    x = x[:8]
    y = op(x, w)  # 64 wide at one tile row: the same op runs it
    ref = (x.double() @ w.double().t())[: y.shape[0]]
    torch.testing.assert_close(y.double(), ref, rtol=2e-2, atol=2e-2)


def test_an_op_plans_with_its_own_tuning_only(monkeypatch):
    from rsar_core.gemm_rsar import GemmRsAr
    monkeypatch.setattr(GemmRsAr, "pair_ctas", property(lambda self: self.sm_count))
    monkeypatch.setattr(GemmRsAr, "quad_ctas", property(lambda self: self.sm_count))
    base = planning_op("rs")
    narrow = retuned(base, bn=128)
    assert narrow.plan(4096, 4096).bn == 128 and base.plan(4096, 4096).bn == 256
    assert base.tuning == Tuning() and narrow.tuning == Tuning(bn=128)
