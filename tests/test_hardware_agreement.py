"""Ranks agree on the hardware they plan on: one fused plan on every rank, even where their
boards differ in SM count or 2x1 cluster occupancy."""
from __future__ import annotations

from launch import Dtypes, Hardware, Shape, resolve
from rsar_core.errors import UnsupportedError
from rsar_core.validate import agree_hardware
from thread_bootstrap import run_ranks

BOARDS = [("sm_90a", 132, 132), ("sm_90a", 132, 120), ("sm_90a", 114, 114), ("sm_90a", 132, 128)]


def test_every_rank_plans_on_the_least_board():
    got = run_ranks(4, lambda bs: agree_hardware(bs, *BOARDS[bs.rank]))
    assert got == [("sm_90a", 114, 114)] * 4


def test_one_board_alone_keeps_its_counts():
    assert run_ranks(2, lambda bs: agree_hardware(bs, "sm_90a", 132, 132)) == [
        ("sm_90a", 132, 132)] * 2


def test_agreed_counts_give_one_plan_where_local_ones_differ():
    """The reason for the agreement: 120 resident pair CTAs on one rank and 132 on the other
    give two different plans at this shape; the agreed counts give one."""
    shape = Shape(16384, 7168, 9216, "rs")
    local = [resolve(shape, Hardware("sm_90a", 132, p), 2, "unicast", Dtypes("bf16"))[0]
             for p in (132, 120)]
    assert local[0] != local[1]
    agreed = run_ranks(2, lambda bs: agree_hardware(bs, "sm_90a", 132, (132, 120)[bs.rank]))
    plans = {resolve(shape, Hardware(a, s, p), 2, "unicast", Dtypes("bf16"))[0]
             for a, s, p in agreed}
    assert len(plans) == 1 and plans == {local[1]}


def test_ranks_on_different_archs_all_raise():
    got = run_ranks(2, lambda bs: agree_hardware(bs, ("sm_90a", "sm_100a")[bs.rank], 132, 132))
    for err in got:
        assert isinstance(err, UnsupportedError)
        assert "rank 0: sm_90a; rank 1: sm_100a" in str(err)


def test_an_unknown_arch_travels_as_such():
    got = run_ranks(2, lambda bs: agree_hardware(bs, (None, "sm_90a")[bs.rank], 132, 132))
    assert all(isinstance(e, UnsupportedError) and "rank 0: -;" in str(e) for e in got)
