"""The host side of a call (CPU): the launcher's fixed-argument cells, the stream order by
handle, ``out=`` and ``warmup``."""
from __future__ import annotations

import pytest
import torch

from launch.cache import ARG_KINDS, CACHE, HEAD_ARGS
from launch.fast_call import FastCall
from op_stub import cpu_op, planning_op
from rsar_core import RsarTypeError, RsarValueError
from rsar_core import gemm_rsar
from rsar_core.ordering import LaunchOrder
from rsar_core.validate import check_out


def _bound_call() -> tuple[FastCall, list]:
    """A FastCall whose entry point records the values its cells hold at each call."""
    seen: list = []
    fc = FastCall(object(), ARG_KINDS)  # no executor: the generic path, until bound below
    fc._fast, fc._packed, fc._has_result = True, None, False
    fc._capi = lambda packed: seen.append(tuple(c.value for c in fc._cells))
    return fc, seen


def _head(*vals: int) -> tuple[int, ...]:
    """A call's head arguments (tensors, scales, their bits, the bias), zero past ``vals``."""
    return vals + (0,) * (HEAD_ARGS - len(vals))


def test_call_with_stores_what_changed_and_launches_the_whole_argument_list():
    fc, seen = _bound_call()
    n = len(ARG_KINDS) - HEAD_ARGS - 1
    a = tuple(range(100, 100 + n))
    b = tuple(range(200, 200 + n))
    h1, h2 = _head(1, 2, 3), _head(4, 5, 6, 11, 12, 3)
    fc.call_with(h1, a, 7)
    fc.call_with(h2, a, 8)
    fc.call_with(h1, b, 7)
    fc(*range(len(ARG_KINDS) - 1), 9)  # the generic form in between: every cell, the cache forgotten
    fc.call_with(h1, b, 7)
    assert seen == [(*h1, *a, 7), (*h2, *a, 8), (*h1, *b, 7),
                    (*range(len(ARG_KINDS) - 1), 9), (*h1, *b, 7)]


def test_call_with_refuses_a_short_argument_list():
    fc, seen = _bound_call()
    with pytest.raises(ValueError, match=f"{len(ARG_KINDS)} arguments expected"):
        fc.call_with(_head(1, 2, 3), tuple(range(len(ARG_KINDS) - HEAD_ARGS - 2)), 7)
    assert seen == []


def test_call_with_without_the_fast_path_calls_the_generic_one():
    got: list = []
    fc = FastCall(lambda *a: got.append(a), ARG_KINDS)
    assert not fc.fast
    fc.call_with(_head(1, 2, 3, 4, 5, 1), tuple(range(len(ARG_KINDS) - HEAD_ARGS - 1)), 0)
    assert len(got) == 1 and [int(v) for v in got[0][:6]] == [1, 2, 3, 4, 5, 1]


class _Stream:
    def __init__(self, handle: int) -> None:
        self.cuda_stream, self.waited = handle, []

    def wait_event(self, ev) -> None:
        self.waited.append(ev.recorded_on)


class _Event:
    def record(self, stream) -> None:
        self.recorded_on = stream.cuda_stream


def test_launch_order_waits_only_at_a_switch(monkeypatch):
    streams = {h: _Stream(h) for h in (11, 22)}
    current = [11]
    looked_up = []

    def current_stream(device):
        looked_up.append(current[0])
        return streams[current[0]]
    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    order, dev = LaunchOrder(), torch.device("cpu")
    for h in (11, 11, 11, 22, 22, 11):
        current[0] = h
        order.before_launch(h, dev)
    assert order.switches == 2
    assert streams[22].waited == [11] and streams[11].waited == [22]
    assert looked_up == [11, 22, 11]  # a Stream object only where the stream changed


def test_launch_order_adds_nothing_inside_a_capture(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device: pytest.fail("no stream lookup inside a capture"))
    order = LaunchOrder()
    order.before_launch(5, torch.device("cpu"))
    order.before_launch(6, torch.device("cpu"))
    assert order.switches == 0


def _xw():
    return torch.randn(6, 64).bfloat16(), torch.randn(128, 64).bfloat16()


def test_check_out_takes_a_buffer_of_the_result_shape():
    x, w = _xw()
    dev = torch.device("cpu")
    check_out(torch.empty(6, 128, dtype=torch.bfloat16), (6, 128), dev, x, w)
    big = torch.empty(10, 128, dtype=torch.bfloat16)
    check_out(big[2:8], (6, 128), dev, x, w)  # a contiguous row range of a larger buffer


@pytest.mark.parametrize("bad,match,err", [
    (lambda: torch.empty(6, 128), "bfloat16", RsarTypeError),
    (lambda: torch.empty(5, 128, dtype=torch.bfloat16), r"shape \(6, 128\)", RsarValueError),
    (lambda: torch.empty(128, 6, dtype=torch.bfloat16).t(), "contiguous", RsarValueError),
    (lambda: torch.empty(6, 128, dtype=torch.bfloat16, requires_grad=True), "grad",
     RsarValueError),
    (lambda: [0], "torch.Tensor", RsarTypeError),
])
def test_check_out_refuses(bad, match, err):
    x, w = _xw()
    with pytest.raises(err, match=match):
        check_out(bad(), (6, 128), torch.device("cpu"), x, w)


def test_check_out_refuses_a_buffer_that_overlaps_an_input():
    flat = torch.randn(80 * 128).bfloat16()
    out = flat[: 6 * 128].view(6, 128)
    w = flat[5 * 128: 5 * 128 + 128 * 64].view(128, 64)  # shares out's last row
    x = torch.randn(6, 64).bfloat16()
    with pytest.raises(RsarValueError, match="overlaps w"):
        check_out(out, (6, 128), torch.device("cpu"), x, w)
    xs = flat[6 * 128 - 1: 6 * 128 - 1 + 6 * 64].view(6, 64)  # one element in common
    with pytest.raises(RsarValueError, match="overlaps x"):
        check_out(out, (6, 128), torch.device("cpu"), xs, torch.randn(128, 64).bfloat16())
    check_out(out, (6, 128), torch.device("cpu"), flat[6 * 128: 6 * 128 + 384].view(6, 64),
              flat[2048: 2048 + 8192].view(128, 64))  # neighbours, no byte shared


def test_the_call_fills_out_and_returns_it(monkeypatch):
    op = cpu_op(monkeypatch, "ar")
    x, w = _xw()
    out = torch.full((6, 128), float("nan"), dtype=torch.bfloat16)
    y = op(x, w, out=out)
    assert y is out and torch.equal(y, (x.float() @ w.float().t()).bfloat16())
    rs = cpu_op(monkeypatch, "rs")
    with pytest.raises(RsarValueError, match=r"shape \(3, 128\)"):
        rs(x, w, out=out)  # RS returns this rank's (ceil(M / world), N) shard
    assert rs(x, w, out=out[:3]) is not None


def test_warmup_plans_and_compiles_each_m_without_launching(monkeypatch):
    seen: list = []
    monkeypatch.setattr(CACHE, "get", lambda v: seen.append(v) or (lambda *a: pytest.fail(
        "warmup must not launch")))
    monkeypatch.setattr(gemm_rsar.GemmRsAr, "pair_ctas", property(lambda self: self.sm_count))
    monkeypatch.setattr(gemm_rsar.GemmRsAr, "quad_ctas", property(lambda self: self.sm_count))
    op = planning_op("rs")
    op.max_M = 4096
    op.warmup([128, 1000, 4096], 1024)
    assert len(seen) >= 2 and len(op._plans) == 3
    for M, K in ((128, 1024), (1000, 1024), (4096, 1024)):
        plan, _ = op._plan_and_kernel(M, K, "rs")  # already there: nothing compiles again
        assert plan.M == M
    assert len(op._plans) == 3


@pytest.mark.parametrize("Ms,K,match", [
    ([0], 1024, "M must be an int in 1..max_M=4096"),
    ([5000], 1024, "max_M"),
    ([128.0], 1024, "M must be an int"),
    ([True], 1024, "M must be an int"),
    ([128], 1000, "K must be a positive multiple of 64"),
    ([128], 0, "K must be"),
])
def test_warmup_refuses_bad_values_before_compiling(monkeypatch, Ms, K, match):
    monkeypatch.setattr(CACHE, "get", lambda v: pytest.fail("nothing may compile"))
    op = planning_op("rs")
    op.max_M = 4096
    with pytest.raises(RsarValueError, match=match):
        op.warmup([128, *Ms], K)
    assert op._plans == {}
