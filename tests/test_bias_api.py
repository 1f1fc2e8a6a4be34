"""``bias=`` of the fused op, on the CPU: its checks, the call (a CPU stand-in for the launch),
the plan-cache key, variant and launch head, precompile's bias twins, and the torch ops."""
from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch._subclasses.fake_tensor import FakeTensorMode

from launch.cache import CACHE, HEAD_ARGS
from op_stub import cpu_op, planning_op
from rsar_core import RsarTypeError, RsarValueError, UnsupportedError, gemm_rsar, torch_op
from rsar_core.reference import rs_rows
from rsar_core.torch_op import RowParallelLinear, register, unregister
from rsar_core.validate import check_bias, check_out
from torch_op_fixtures import _cpu_kernel, _fresh_dynamo  # noqa: F401 (autouse)

CPU = torch.device("cpu")
N = 128

_spec = importlib.util.spec_from_file_location(
    "precompile", Path(__file__).resolve().parents[1] / "scripts" / "precompile.py")
precompile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(precompile)


def _xwb(M: int = 6, K: int = 64, seed: int = 0, dtype: torch.dtype = torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype)
    w = (torch.randn(N, K, generator=g) * K ** -0.5).to(dtype)
    b = torch.randn(N, generator=g).to(dtype)
    return x, w, b


def _want(x, w, b, rows: int) -> torch.Tensor:
    """The bias added to the float32 sum before its one rounding; RS: rank 0's rows."""
    return (x.float() @ w.float().t() + b.float())[:rows].to(b.dtype)


# ------------------------------------------------------------------ check_bias
@pytest.mark.parametrize("bad,match,err", [
    (lambda: [0.0] * N, "bias must be a torch.Tensor, got list", RsarTypeError),
    (lambda: torch.zeros(N), r"bias must be bfloat16 \(this op's result dtype\), got "
                             r"torch.float32", RsarTypeError),
    (lambda: torch.zeros(N, dtype=torch.float8_e4m3fn), "must be bfloat16", RsarTypeError),
    (lambda: torch.zeros(1, N, dtype=torch.bfloat16), r"shape \(128,\).*got \(1, 128\)",
     RsarValueError),
    (lambda: torch.zeros(N + 8, dtype=torch.bfloat16), r"shape \(128,\).*got \(136,\)",
     RsarValueError),
    (lambda: torch.zeros((), dtype=torch.bfloat16), r"shape \(128,\).*got \(\)", RsarValueError),
    (lambda: torch.zeros(2 * N, dtype=torch.bfloat16)[::2], "contiguous", RsarValueError),
    (lambda: torch.zeros(N + 8, dtype=torch.bfloat16)[1: N + 1], "16-byte boundary",
     RsarValueError),
    (lambda: torch.zeros(N, dtype=torch.bfloat16, device="meta"), "bias must be on cpu, got meta",
     RsarValueError),
])
def test_check_bias_refuses(bad, match, err):
    with pytest.raises(err, match=match):
        check_bias(bad(), N, CPU, torch.bfloat16)


def test_check_bias_takes_the_ops_result_dtype_and_a_bias_that_requires_grad():
    check_bias(torch.zeros(N, dtype=torch.bfloat16), N, CPU, torch.bfloat16)
    check_bias(torch.zeros(N, dtype=torch.float16), N, CPU, torch.float16)
    check_bias(nn.Parameter(torch.zeros(N, dtype=torch.bfloat16)), N, CPU, torch.bfloat16)
    with pytest.raises(RsarTypeError, match="must be float16"):
        check_bias(torch.zeros(N, dtype=torch.bfloat16), N, CPU, torch.float16)


def test_check_out_refuses_a_buffer_that_overlaps_the_bias():
    x, w, _ = _xwb()
    flat = torch.zeros(8 * N, dtype=torch.bfloat16)
    out = flat[: 6 * N].view(6, N)
    with pytest.raises(RsarValueError, match="out overlaps bias"):
        check_out(out, (6, N), CPU, x, w, extra=(("bias", flat[5 * N: 6 * N]),))
    check_out(out, (6, N), CPU, x, w, extra=(("bias", flat[6 * N: 7 * N]), ("none", None)))


# ------------------------------------------------------------------ the call
@pytest.mark.parametrize("mode", ["rs", "ar"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_call_adds_the_bias_once(monkeypatch, mode, dtype):
    op = cpu_op(monkeypatch, mode, dtype=dtype)
    x, w, b = _xwb(dtype=dtype)
    rows = 6 if mode == "ar" else 3
    assert torch.equal(op(x, w, bias=b), _want(x, w, b, rows))
    assert torch.equal(op(x, w), (x.float() @ w.float().t())[:rows].to(dtype))
    out = torch.full((rows, N), float("nan"), dtype=dtype)
    assert op(x, w, out=out, bias=b) is out and torch.equal(out, _want(x, w, b, rows))


def test_an_fp8_op_takes_a_bias_of_its_result_dtype(monkeypatch):
    from rsar_core.reference import rank_fp8_inputs, scaled_product
    op = cpu_op(monkeypatch, "ar", input_dtype=torch.float8_e4m3fn)
    x, w, sx, sw = rank_fp8_inputs(3, 0, 6, N, 128, CPU)
    b = torch.randn(N).bfloat16()
    want = (scaled_product(x, w, sx, sw).float().bfloat16().float() + b.float()).bfloat16()
    assert torch.equal(op(x, w, sx, sw, bias=b), want)
    with pytest.raises(RsarTypeError, match="bias must be bfloat16"):
        op(x, w, sx, sw, bias=b.to(torch.float8_e4m3fn))


@pytest.mark.parametrize("bad,match", [
    (lambda b: b.float(), "bias must be bfloat16"),
    (lambda b: b[:64], r"shape \(128,\)"),
    (lambda b: b.reshape(1, N), r"shape \(128,\)"),
    (lambda b: 1.0, "bias must be a torch.Tensor"),
])
def test_a_bad_bias_is_refused_before_any_launch(monkeypatch, bad, match):
    op = cpu_op(monkeypatch, "rs")
    monkeypatch.setattr(op, "_launch_prepared", lambda *a: pytest.fail("launched"),
                        raising=False)
    x, w, b = _xwb()
    with pytest.raises((RsarTypeError, RsarValueError), match=match):
        op(x, w, bias=bad(b))


def test_out_may_not_overlap_the_bias(monkeypatch):
    op = cpu_op(monkeypatch, "ar")
    x, w, _ = _xwb()
    flat = torch.zeros(8 * N, dtype=torch.bfloat16)
    with pytest.raises(RsarValueError, match="out overlaps bias"):
        op(x, w, out=flat[: 6 * N].view(6, N), bias=flat[5 * N: 6 * N])


def test_a_bias_that_requires_grad_marks_the_result(monkeypatch):
    op = cpu_op(monkeypatch, "ar")
    x, w, b = _xwb()
    y = op(x, w, bias=nn.Parameter(b.clone()))
    assert y.requires_grad
    with pytest.raises(UnsupportedError, match="no backward"):
        y.float().sum().backward()
    with torch.no_grad():
        assert not op(x, w, bias=nn.Parameter(b.clone())).requires_grad


# ------------------------------------------------------------------ plan key, variant, launch
def _recording_cache(monkeypatch) -> list:
    seen: list = []
    monkeypatch.setattr(CACHE, "get", lambda v: seen.append(v) or object())
    monkeypatch.setattr(gemm_rsar.GemmRsAr, "pair_ctas", property(lambda self: self.sm_count))
    monkeypatch.setattr(gemm_rsar.GemmRsAr, "quad_ctas", property(lambda self: self.sm_count))
    return seen


@pytest.mark.parametrize("mode", ["rs", "ar"])
def test_a_bias_call_has_its_own_plan_entry_and_variant(monkeypatch, mode):
    """Waits on ``launch.cache.Variant.bias``."""
    seen = _recording_cache(monkeypatch)
    op = planning_op(mode)
    plain = op._prepare(1000, 1024, mode)
    biased = op._prepare(1000, 1024, mode, bias=True)
    assert len(op._plans) == 2 and plain is not biased
    assert [v.bias for v in seen] == [0, 1]
    assert dataclasses.replace(seen[1], bias=0) == seen[0]
    assert op._prepare(1000, 1024, mode, bias=True) is biased  # looked up, not made again
    with pytest.raises(RsarValueError, match="plain GEMM"):
        op._prepare(1000, 1024, "gemm", bias=True)


def test_warmup_with_bias_prepares_the_bias_variants(monkeypatch):
    """Waits on ``launch.cache.Variant.bias``."""
    seen = _recording_cache(monkeypatch)
    op = planning_op("rs")
    op.max_M = 4096
    op.warmup([128, 1000], 1024, bias=True)
    assert seen and all(v.bias == 1 for v in seen)
    for M in (128, 1000):
        key_hits = len(op._plans)
        op._prepare(M, 1024, "rs", bias=True)
        assert len(op._plans) == key_hits


class _Fn:
    def __init__(self) -> None:
        self.heads: list = []

    def call_with(self, head, fixed, stream) -> None:
        self.heads.append(head)


def _launch_op(monkeypatch):
    op = planning_op("ar")
    op.device = torch.device("cuda", 0)
    op._ws.order = type("Order", (), {"before_launch": lambda self, s, d: None})()
    monkeypatch.setattr(gemm_rsar, "raw_stream", lambda index: 0)
    return op


def test_the_launch_head_carries_the_bias_address_after_the_scale_bits(monkeypatch):
    op = _launch_op(monkeypatch)
    fn = _Fn()
    x, w, b = _xwb()
    y = torch.empty(6, N, dtype=torch.bfloat16)
    sx, sw = torch.ones(()), torch.ones(())
    op._launch_prepared((None, fn, ()), x, w, y)
    op._launch_prepared((None, fn, ()), x, w, y, sx, sw, 3, b)
    ptrs = (x.data_ptr(), w.data_ptr(), y.data_ptr())
    assert fn.heads == [(*ptrs, 0, 0, 0, 0), (*ptrs, sx.data_ptr(), sw.data_ptr(), 3, b.data_ptr())]


def test_the_launch_head_has_the_kernels_head_length(monkeypatch):
    """Waits on ``launch.cache.HEAD_ARGS`` counting the bias address."""
    op = _launch_op(monkeypatch)
    fn = _Fn()
    x, w, _ = _xwb()
    op._launch_prepared((None, fn, ()), x, w, torch.empty(6, N, dtype=torch.bfloat16))
    assert len(fn.heads[0]) == HEAD_ARGS


# ------------------------------------------------------------------ precompile --bias
@pytest.mark.parametrize("dtypes", [("bf16",), ("bf16", "e4m3", "e4m3-block")])
def test_precompile_bias_adds_a_twin_of_exactly_the_fused_variants(dtypes):
    """Waits on ``launch.cache.Variant.bias``."""
    base = precompile.variants("sm_90a", 2, ["unicast"], dtypes=dtypes)
    both = precompile.variants("sm_90a", 2, ["unicast"], dtypes=dtypes, bias=True)
    assert all(v.bias == 0 for v in base)
    twins = [v for v in both if v.bias]
    assert set(both) - set(twins) == set(base)
    assert {dataclasses.replace(v, bias=0) for v in twins} == {v for v in base if v.mode != "gemm"}
    assert twins and all(v.mode in ("rs", "ar") for v in twins)


def test_precompile_takes_the_bias_flag(tmp_path):
    """The flag parses (a bad --dtypes then stops it before anything is built)."""
    r = subprocess.run([sys.executable, str(Path(precompile.__file__)), "--arch", "sm_90a",
                        "--world", "2", "--out", str(tmp_path), "--bias", "--dtypes", "f32"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--dtypes takes" in r.stderr
    assert "unrecognized arguments" not in r.stderr
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------ the torch ops
class BiasStandIn:
    """What the op needs of a GemmRsAr (a rank-0 CPU reference as the call), with bias=."""

    def __init__(self, all_reduce: bool, dtype: torch.dtype = torch.bfloat16) -> None:
        self.N, self.all_reduce, self.world, self.dtype = N, all_reduce, 2, dtype
        self.biases: list = []

    def __call__(self, x, w, *, bias=None):
        self.biases.append(bias)
        full = x.float() @ w.float().T
        if bias is not None:
            full = full + bias.float()
        if not self.all_reduce:
            full = rs_rows(full, 0, self.world)
        return full.to(self.dtype).contiguous()


def test_the_schemas_take_an_optional_bias_last():
    for ov in (torch.ops.rsar.gemm_rsar.default, torch.ops.rsar.gemm_rsar_scaled.default):
        arg = ov._schema.arguments[-1]
        assert arg.name == "bias" and str(arg.type) == "Optional[Tensor]"
        assert arg.default_value is None and not arg.kwarg_only


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
def test_the_op_passes_the_bias_and_opchecks(ar):
    s = BiasStandIn(ar)
    h = register(s)
    x, w, b = _xwb(M=5)
    assert torch.equal(torch.ops.rsar.gemm_rsar(x, w, h, b), s(x, w, bias=b))
    assert torch.equal(torch.ops.rsar.gemm_rsar(x, w, h, bias=b), s(x, w, bias=b))
    assert torch.equal(torch_op.gemm_rsar(x, w, s, bias=b), s(x, w, bias=b))
    s.biases.clear()
    torch.ops.rsar.gemm_rsar(x, w, h)
    assert s.biases == [None]
    for M in (3, 64):
        x, w, b = _xwb(M=M, seed=M)
        torch.library.opcheck(torch.ops.rsar.gemm_rsar.default, (x, w, h, b))
    unregister(s)


def test_the_fake_kernel_checks_the_bias():
    h = register(s := BiasStandIn(False))
    with FakeTensorMode():
        x, w = torch.empty(8, 64, dtype=torch.bfloat16), torch.empty(N, 64, dtype=torch.bfloat16)
        y = torch.ops.rsar.gemm_rsar(x, w, h, torch.empty(N, dtype=torch.bfloat16))
        assert tuple(y.shape) == (4, N) and y.dtype == torch.bfloat16
        with pytest.raises(TypeError, match="bias must be torch.bfloat16"):
            torch.ops.rsar.gemm_rsar(x, w, h, torch.empty(N))
        with pytest.raises(ValueError, match="bias must be 1-D"):
            torch.ops.rsar.gemm_rsar(x, w, h, torch.empty(1, N, dtype=torch.bfloat16))
        with pytest.raises(RuntimeError, match="N=128 values"):
            torch.ops.rsar.gemm_rsar(x, w, h, torch.empty(64, dtype=torch.bfloat16))
    assert s.biases == []
    unregister(s)


def test_the_scaled_op_passes_the_bias():
    from rsar_core.reference import rank_fp8_inputs, scaled_product

    class Scaled(BiasStandIn):
        input_dtype = torch.float8_e4m3fn

        def __call__(self, x, w, *, x_scale=None, w_scale=None, bias=None):
            self.biases.append(bias)
            full = scaled_product(x, w, x_scale, w_scale).float()
            return (full if bias is None else full + bias.float()).to(self.dtype)

    s = Scaled(True)
    x, w, sx, sw = rank_fp8_inputs(2, 0, 16, N, 128, CPU)
    b = torch.randn(N).bfloat16()
    y = torch_op.gemm_rsar_scaled(x, w, sx, sw, s, bias=b)
    assert s.biases[-1] is b and torch.equal(y, s(x, w, x_scale=sx, w_scale=sw, bias=b))
    torch_op.gemm_rsar_scaled(x, w, sx, sw, s)
    assert s.biases[-1] is None
    m = RowParallelLinear(s, w, weight_scale=sw, bias=b)
    assert torch.equal(m(x, sx), y)
    with FakeTensorMode():
        fx = torch.empty(16, 128, dtype=torch.float8_e4m3fn)
        fw = torch.empty(N, 128, dtype=torch.float8_e4m3fn)
        with pytest.raises(TypeError, match="bias must be torch.bfloat16"):
            torch.ops.rsar.gemm_rsar_scaled(fx, fw, torch.empty(()), torch.empty(()),
                                            register(s), torch.empty(N, dtype=torch.float8_e4m3fn))
    unregister(s)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
def test_row_parallel_linear_passes_its_bias(ar):
    s = BiasStandIn(ar)
    _, w, b = _xwb()
    m = RowParallelLinear(s, w, bias=b)
    assert isinstance(m.bias, nn.Parameter) and not m.bias.requires_grad
    assert torch.equal(m.bias, b) and "bias" in m.state_dict() and "bias=True" in repr(m)
    p = nn.Parameter(b.clone())
    assert RowParallelLinear(s, w, bias=p).bias is p
    x, _, _ = _xwb(M=9, seed=1)
    assert torch.equal(m(x), s(x, w, bias=b))
    assert s.biases[-2] is m.bias
    plain = RowParallelLinear(s, w)
    assert plain.bias is None and "bias" not in plain.state_dict() and "bias=False" in repr(plain)
    plain(x)
    assert s.biases[-1] is None
    cnt = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(m, backend=cnt, fullgraph=True, dynamic=True)
    for M in (3, 17, 40):
        x, _, _ = _xwb(M=M, seed=M)
        assert torch.equal(compiled(x), m(x))
    assert cnt.frame_count == 1
    with pytest.raises(ValueError, match=r"bias must be \(N=128,\)"):
        RowParallelLinear(s, w, bias=b[:64])
    with pytest.raises(TypeError, match="bias must be a torch.Tensor or None"):
        RowParallelLinear(s, w, bias=1.0)
    unregister(s)
