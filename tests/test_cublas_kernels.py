"""``benchmarks/cublas_kernels.py``: its shape parsing and how it reads a profiler trace (the
GPU run itself needs a GPU)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import cublas_kernels as ck  # noqa: E402


def test_shapes_parse_and_refuse():
    assert ck.parse_shapes("256,2880,9216; 128,2880,4096;") == [(256, 2880, 9216),
                                                                 (128, 2880, 4096)]
    for bad in ("256,2880", "256,2880,x", "0,2880,9216", "256,2880,9216,1"):
        with pytest.raises(ValueError, match="M,N,K of positive integers"):
            ck.parse_shapes(bad)


def _kernel(name, ts, dur, grid):
    return {"cat": "kernel", "name": name, "ts": ts, "dur": dur,
            "args": {"grid": grid, "block": [384, 1, 1], "shared memory": 200000,
                     "registers per thread": 168}}


def test_the_last_call_s_kernels_in_order():
    events = [{"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1}]
    for c in range(3):  # a GEMM and its split-K reduction per call, listed out of order
        events += [_kernel("reduce", 10 * c + 5, 1.5, [40, 1, 1]),
                   _kernel("nvjet_gemm", 10 * c, 4.0 + c, [132, 1, 3])]
    ks = ck.kernels_of_last_call(events, 3)
    assert [k["name"] for k in ks] == ["nvjet_gemm", "reduce"]
    assert ks[0]["us"] == 6.0 and ks[0]["grid"] == [132, 1, 3] and ks[0]["regs"] == 168


def test_a_trace_that_does_not_split_into_calls_is_refused():
    events = [_kernel("a", 0, 1, [1, 1, 1]), _kernel("b", 1, 1, [1, 1, 1]),
              _kernel("c", 2, 1, [1, 1, 1])]
    with pytest.raises(RuntimeError, match="not one plan per call"):
        ck.kernels_of_last_call(events, 2)
