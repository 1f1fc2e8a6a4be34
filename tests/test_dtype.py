"""An op's element type (bfloat16 or float16) on the CPU: what it accepts and refuses, what it
returns, and the kernels it would compile."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from launch.cache import CACHE
from op_stub import cpu_op, planning_op
from rsar_core import gemm_rsar
from rsar_core.errors import RsarTypeError, RsarValueError
from rsar_core.reference import rank_inputs, reference_sum
from rsar_core.validate import check_dtype


def _xw(dtype: torch.dtype, M: int = 6):
    return torch.randn(M, 64).to(dtype), (torch.randn(128, 64) / 8).to(dtype)


@pytest.mark.parametrize("dtype,name", [(torch.bfloat16, "bf16"), (torch.float16, "f16")])
def test_check_dtype_names_the_kernels_type(dtype, name):
    assert check_dtype(dtype) == name


@pytest.mark.parametrize("bad", [torch.float32, torch.int8, "bf16", None, torch.float8_e4m3fn])
def test_check_dtype_refuses_the_rest(bad):
    with pytest.raises(RsarTypeError, match="torch.bfloat16 or torch.float16"):
        check_dtype(bad)


@pytest.mark.parametrize("mode", ["rs", "ar"])
def test_an_f16_op_returns_f16(monkeypatch, mode):
    op = cpu_op(monkeypatch, mode, torch.float16)
    x, w = _xw(torch.float16)
    y = op(x, w)
    want = (x.float() @ w.float().t()).half()
    assert y.dtype == torch.float16
    assert torch.equal(y, want if mode == "ar" else want[: y.shape[0]])
    out = torch.full((y.shape[0], 128), float("nan"), dtype=torch.float16)
    assert op(x, w, out=out) is out and torch.equal(out, y)


@pytest.mark.parametrize("op_dtype,x_dtype,w_dtype,match", [
    (torch.float16, torch.bfloat16, torch.float16,
     r"x must be float16 \(this op's dtype\), got torch.bfloat16; an op for such inputs is "
     r"built with dtype=torch.bfloat16"),
    (torch.float16, torch.float16, torch.bfloat16, "w must be float16"),
    (torch.bfloat16, torch.float16, torch.bfloat16, "dtype=torch.float16"),
    (torch.bfloat16, torch.float32, torch.bfloat16, r"got torch.float32$"),
])
def test_inputs_of_another_dtype_are_refused(monkeypatch, op_dtype, x_dtype, w_dtype, match):
    op = cpu_op(monkeypatch, "rs", op_dtype)
    x, _ = _xw(x_dtype)
    _, w = _xw(w_dtype)
    with pytest.raises(RsarTypeError, match=match):
        op(x, w)
    assert op(*_xw(op_dtype)).dtype == op_dtype  # still usable
    assert not op.can_run(w) if w_dtype != op_dtype else op.can_run(w)


def test_out_of_another_dtype_is_refused(monkeypatch):
    op = cpu_op(monkeypatch, "ar", torch.float16)
    x, w = _xw(torch.float16)
    with pytest.raises(RsarTypeError, match="out must be float16"):
        op(x, w, out=torch.empty(6, 128, dtype=torch.bfloat16))


def test_the_variants_differ_by_dtype_only(monkeypatch):
    """An fp16 op plans exactly what a bf16 one does (same bytes, same MMA rate) and
    compiles the same variants with dtype f16."""
    seen: dict = {torch.bfloat16: [], torch.float16: []}
    monkeypatch.setattr(gemm_rsar.GemmRsAr, "pair_ctas", property(lambda self: self.sm_count))
    monkeypatch.setattr(gemm_rsar.GemmRsAr, "quad_ctas", property(lambda self: self.sm_count))
    for dtype, vs in seen.items():
        monkeypatch.setattr(CACHE, "get", lambda v, vs=vs: vs.append(v) or object())
        for mode in ("rs", "ar"):
            op = planning_op(mode, dtype=dtype)
            op.max_M = 8192
            op.warmup([128, 1000, 4096], 4096)
            # the GEMM alone where no bf16-only rule fires (ping-pong from 2048 x 7168, (aq))
            op._prepare(1024, 1024, "gemm")
    bf, half = seen[torch.bfloat16], seen[torch.float16]
    assert len(bf) == len(half) >= 6
    assert {v.dtype for v in bf} == {"bf16"} and {v.dtype for v in half} == {"f16"}
    assert [dataclasses.replace(v, dtype="bf16") for v in half] == bf


def test_reference_inputs_follow_the_dtype():
    dev = torch.device("cpu")
    x, w = rank_inputs(3, 1, 5, 16, 64, dev, dtype=torch.float16)
    xb, wb = rank_inputs(3, 1, 5, 16, 64, dev)
    assert x.dtype == w.dtype == torch.float16 and xb.dtype == torch.bfloat16
    assert torch.allclose(x.float(), xb.float(), rtol=1e-2, atol=1e-2)  # the same draws
    ref = reference_sum(3, 2, 5, 16, 64, dev, dtype=torch.float16)
    x0, w0 = rank_inputs(3, 0, 5, 16, 64, dev, dtype=torch.float16)
    assert torch.allclose(ref, x0.float() @ w0.float().T + x.float() @ w.float().T)


def test_construction_refuses_a_bad_dtype_before_anything_else(monkeypatch):
    monkeypatch.setattr(gemm_rsar, "make_bootstrap",
                        lambda comm: type("B", (), {"world": 2, "rank": 0})())
    with pytest.raises(RsarTypeError, match="dtype"):
        gemm_rsar.GemmRsAr(128, 128, dtype=torch.float32)
    with pytest.raises(RsarValueError, match="N must be"):  # the shape checks come first
        gemm_rsar.GemmRsAr(128, 100, dtype=torch.float32)
