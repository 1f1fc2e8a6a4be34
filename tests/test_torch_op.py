"""rsar::gemm_rsar as a torch.library op, on the CPU: schema, registry, fake shapes, compile.

A stand-in with the attributes the fake kernel reads (world, N, all_reduce) plays the
GemmRsAr; for the compile tests the registered op's kernel is also registered for the CPU,
so it looks up the stand-in, whose __call__ is the float32 reference for rank 0: the rows
rank 0 would own of x @ w.T (RS, padded to a multiple of world) or all of it (AR).
"""
from __future__ import annotations

import gc
import shutil

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch._subclasses.fake_tensor import FakeTensorMode

from rsar_core import torch_op
from rsar_core.reference import rs_rows, scaled_product
from rsar_core.torch_op import RowParallelLinear, gemm_rsar, lookup, register, unregister
from torch_op_fixtures import _cpu_kernel, _fresh_dynamo  # noqa: F401 (autouse)


class StandIn:
    """What the op needs of a GemmRsAr, with a CPU reference as the call."""

    def __init__(self, N: int, all_reduce: bool, world: int = 2, rank: int = 0,
                 dtype: torch.dtype = torch.bfloat16) -> None:
        self.N, self.all_reduce, self.world, self.rank = N, all_reduce, world, rank
        self.dtype = dtype
        self.calls = 0

    def __call__(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        assert x.dtype == w.dtype == self.dtype and w.shape[0] == self.N
        full = x.float() @ w.float().T
        if not self.all_reduce:
            full = rs_rows(full, self.rank, self.world)
        return full.to(self.dtype).contiguous()


def _inputs(M: int, N: int, K: int, seed: int = 0,
            dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype)
    w = (torch.randn(N, K, generator=g) * K ** -0.5).to(dtype)
    return x, w


def _rows(M: int, world: int, ar: bool) -> int:
    return M if ar else -(-M // world)


# ------------------------------------------------------------------ schema and registry
def test_schema():
    ov = torch.ops.rsar.gemm_rsar.default
    assert str(ov._schema) == ("rsar::gemm_rsar(Tensor x, Tensor w, int handle, "
                               "Tensor? bias=None) -> Tensor")
    assert not ov._schema.is_mutable
    assert torch._C._dispatch_has_kernel_for_dispatch_key(torch_op.OP_NAME, "CUDA")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(torch_op.OP_NAME, "Meta")


def test_register_idempotent_and_unregister():
    a, b = StandIn(384, False), StandIn(384, False)
    ha = register(a)
    assert register(a) == ha and lookup(ha) is a
    hb = register(b)
    assert hb != ha and lookup(hb) is b
    assert torch_op._decode(ha) == (2, 384, False)
    assert torch_op._decode(register(StandIn(7168, True, world=8))) == (8, 7168, True)
    unregister(a)
    unregister(a)  # no-op the second time
    with pytest.raises(RuntimeError, match="names no registered op"):
        lookup(ha)
    ha2 = register(a)
    assert ha2 not in (ha, hb), "handles are never reused"
    unregister(a)
    unregister(b)


def test_collected_op_leaves_registry():
    s = StandIn(128, True)
    h = register(s)
    assert h in torch_op._REGISTRY
    del s
    gc.collect()
    assert h not in torch_op._REGISTRY
    with pytest.raises(RuntimeError, match="names no registered op"):
        lookup(h)


def test_on_close_hook_is_used():
    """An op exposing ``_on_close`` (callables its close() runs) drops its handle on close."""
    class Closable(StandIn):
        def __init__(self) -> None:
            super().__init__(256, False)
            self._on_close: list = []

        def close(self) -> None:
            for cb in self._on_close:
                cb()

    c = Closable()
    h = register(c)
    c.close()
    with pytest.raises(RuntimeError, match="names no registered op"):
        lookup(h)


def test_unknown_handle_errors():
    x, w = _inputs(8, 128, 64)
    with pytest.raises(RuntimeError, match="names no registered op"):
        torch.ops.rsar.gemm_rsar(x, w, 12345)
    with FakeTensorMode() as mode:
        fx, fw = mode.from_tensor(x), mode.from_tensor(w)
        with pytest.raises(RuntimeError, match="names no registered op"):
            torch.ops.rsar.gemm_rsar(fx, fw, 12345)


# ------------------------------------------------------------------ the fake kernel
@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("world", [2, 4, 8])
def test_fake_shapes(world, ar):
    s = StandIn(384, ar, world=world)
    h = register(s)
    with FakeTensorMode():
        for M in (1, 2, 3, 7, 127, 128, 129, 1000, 8191, 8192):
            x = torch.empty(M, 256, dtype=torch.bfloat16)
            w = torch.empty(384, 256, dtype=torch.bfloat16)
            y = torch.ops.rsar.gemm_rsar(x, w, h)
            assert tuple(y.shape) == (_rows(M, world, ar), 384), (M, world, ar)
            assert y.dtype == torch.bfloat16 and y.is_contiguous()
    assert s.calls == 0, "the fake kernel must not call the op"


def test_fake_checks_shapes():
    s = StandIn(384, False)
    h = register(s)
    with FakeTensorMode():
        x = torch.empty(64, 256, dtype=torch.bfloat16)
        with pytest.raises(RuntimeError, match="N=384"):
            torch.ops.rsar.gemm_rsar(x, torch.empty(128, 256, dtype=torch.bfloat16), h)
        with pytest.raises(RuntimeError, match="K=256"):
            torch.ops.rsar.gemm_rsar(x, torch.empty(384, 128, dtype=torch.bfloat16), h)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
def test_fake_symbolic_M(ar):
    """make_fx with symbolic shapes: the output rows are an expression of M, not a number."""
    from torch.fx.experimental.proxy_tensor import make_fx
    s = StandIn(128, ar, world=4)
    h = register(s)
    x, w = _inputs(10, 128, 64)
    gm = make_fx(lambda x, w: torch.ops.rsar.gemm_rsar(x, w, h), tracing_mode="symbolic")(x, w)
    out = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    out = out[0] if isinstance(out, (list, tuple)) else out
    rows = out.meta["val"].shape[0]
    assert isinstance(rows, torch.SymInt)
    if not ar:
        assert "//" in str(rows), str(rows)
    for M in (2, 5, 9, 10, 13):
        xm, wm = _inputs(M, 128, 64, seed=M)
        assert gm(xm, wm).shape == (_rows(M, 4, ar), 128)


def test_fake_follows_the_ops_dtype():
    s = StandIn(384, False, dtype=torch.float16)
    h = register(s)
    with FakeTensorMode():
        x = torch.empty(64, 256, dtype=torch.float16)
        w = torch.empty(384, 256, dtype=torch.float16)
        assert torch.ops.rsar.gemm_rsar(x, w, h).dtype == torch.float16
        with pytest.raises(TypeError, match="must be torch.float16"):
            torch.ops.rsar.gemm_rsar(x.to(torch.bfloat16), w, h)
    assert s.calls == 0


def test_opcheck_cpu():
    """torch.library.opcheck on the CPU kernel: schema, fake vs real, AOT dispatch."""
    for ar, dtype in ((False, torch.bfloat16), (True, torch.bfloat16), (False, torch.float16)):
        h = register(s := StandIn(256, ar, world=2, dtype=dtype))
        for M in (3, 64):
            x, w = _inputs(M, 256, 128, seed=M, dtype=dtype)
            torch.library.opcheck(torch.ops.rsar.gemm_rsar.default, (x, w, h))
        unregister(s)


# ------------------------------------------------------------------ torch.compile
class Block(nn.Module):
    """Something before and after the op, so the compiler has to schedule around it."""

    def __init__(self, op, weight):
        super().__init__()
        self.proj = RowParallelLinear(op, weight)

    def forward(self, x):
        y = self.proj(x * 2)
        return y.float() * 0.5


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
def test_compile_one_graph_dynamic(ar):
    s = StandIn(384, ar, world=2)
    _, w = _inputs(1, 384, 128)
    block = Block(s, w)
    cnt = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(block, backend=cnt, fullgraph=True, dynamic=True)
    # Not M <= 2: one output row meets the compiler's size-1 specialisation (a second graph,
    # as for any op whose output can have one row), which is not what this test is about.
    for M in (3, 5, 64, 127, 129, 1000):
        x, _ = _inputs(M, 384, 128, seed=M)
        got = compiled(x)
        want = block(x)
        assert got.shape == (_rows(M, 2, ar), 384)
        assert torch.equal(got, want), f"M={M}"
    assert cnt.frame_count == 1, f"{cnt.frame_count} compiles for 6 values of M"
    # The handle is a constant of the graph, not a graph input.
    code = cnt.graphs[0].code
    assert "gemm_rsar" in code
    assert str(block.proj.handle) in code


def test_explain_no_graph_breaks():
    s = StandIn(256, False, world=2)
    _, w = _inputs(1, 256, 64)
    block = Block(s, w)
    x, _ = _inputs(33, 256, 64)
    ex = torch._dynamo.explain(block)(x)
    assert ex.graph_count == 1 and ex.graph_break_count == 0, ex


def test_compile_helper_with_op_argument():
    """gemm_rsar(x, w, op) on a registered op traces to one graph too."""
    s = StandIn(128, True, world=2)
    register(s)
    _, w = _inputs(1, 128, 64)

    def f(x, w, op):
        return gemm_rsar(torch.relu(x), w, op) + 1

    cnt = CompileCounterWithBackend("aot_eager")
    cf = torch.compile(f, backend=cnt, fullgraph=True, dynamic=True)
    for M in (5, 17, 40):
        x, _ = _inputs(M, 128, 64, seed=M)
        assert torch.equal(cf(x, w, s), f(x, w, s))
    assert cnt.frame_count == 1
    unregister(s)


@pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
                    reason="Inductor's CPU backend needs a C++ compiler")
@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
def test_compile_inductor_cpu(ar):
    """The default backend (Inductor) around the op: same numbers as eager, one graph."""
    s = StandIn(256, ar, world=2)
    _, w = _inputs(1, 256, 64)
    block = Block(s, w)
    cnt = CompileCounterWithBackend("inductor")
    compiled = torch.compile(block, backend=cnt, fullgraph=True, dynamic=True)
    for M in (7, 96, 301):
        x, _ = _inputs(M, 256, 64, seed=M)
        got = compiled(x)
        assert got.shape == (_rows(M, 2, ar), 256)
        torch.testing.assert_close(got, block(x), rtol=0, atol=0)
    assert cnt.frame_count == 1


def test_row_parallel_linear_module():
    s = StandIn(128, False)
    _, w = _inputs(1, 128, 64)
    m = RowParallelLinear(s, w)
    assert isinstance(m.weight, nn.Parameter) and not m.weight.requires_grad
    assert "weight" in m.state_dict() and m.handle == register(s)
    assert "mode=rs" in repr(m)
    p = nn.Parameter(w.clone())
    assert RowParallelLinear(s, p).weight is p
    with pytest.raises(ValueError, match="N=128"):
        RowParallelLinear(s, w[:64])
    x, _ = _inputs(9, 128, 64)
    assert m(x).shape == (5, 128)


def test_helper_registers_on_first_compiled_call():
    """An op not yet registered: the first compiled call breaks at register(), then works."""
    s = StandIn(128, False, world=2)
    _, w = _inputs(1, 128, 64)
    cf = torch.compile(lambda x: gemm_rsar(x, w, s), backend="aot_eager")
    x, _ = _inputs(11, 128, 64)
    assert torch.equal(cf(x), s(x, w))
    assert lookup(register(s)) is s
    assert torch.equal(cf(x), s(x, w))
    unregister(s)


# ------------------------------------------------------------------ fp8 operands
class ScaledStandIn(StandIn):
    """An fp8 op's stand-in: fp8 x and w with float32 scales, results in ``dtype``."""

    input_dtype = torch.float8_e4m3fn

    def __call__(self, x, w, *, x_scale=None, w_scale=None):
        self.calls += 1
        assert x.dtype == w.dtype == self.input_dtype and x_scale is not None
        full = scaled_product(x, w, x_scale, w_scale).float()
        if not self.all_reduce:
            full = rs_rows(full, self.rank, self.world)
        return full.to(self.dtype).contiguous()


def _fp8_inputs(M: int, N: int, K: int, seed: int = 0):
    from rsar_core.reference import rank_fp8_inputs
    return rank_fp8_inputs(seed, 0, M, N, K, torch.device("cpu"))


def test_scaled_schema():
    ov = torch.ops.rsar.gemm_rsar_scaled.default
    assert str(ov._schema) == ("rsar::gemm_rsar_scaled(Tensor x, Tensor w, Tensor x_scale, "
                               "Tensor w_scale, int handle, Tensor? bias=None) -> Tensor")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(torch_op.SCALED_OP_NAME, "CUDA")


@pytest.mark.parametrize("ar", [False, True])
def test_scaled_fake_and_opcheck(ar):
    s = ScaledStandIn(256, ar)
    h = register(s)
    for M in (3, 64):
        x, w, sx, sw = _fp8_inputs(M, 256, 128, seed=M)
        # test_schema compares the inputs before and after, which the CPU cannot do in fp8
        torch.library.opcheck(torch.ops.rsar.gemm_rsar_scaled.default, (x, w, sx, sw, h),
                              test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))
    with FakeTensorMode():
        x = torch.empty(64, 128, dtype=torch.float8_e4m3fn)
        w = torch.empty(256, 128, dtype=torch.float8_e4m3fn)
        sx, sw = torch.empty(64, 1), torch.empty(())
        y = torch.ops.rsar.gemm_rsar_scaled(x, w, sx, sw, h)
        assert y.shape == (_rows(64, 2, ar), 256) and y.dtype == torch.bfloat16
        with pytest.raises(TypeError, match="x_scale must be float32"):
            torch.ops.rsar.gemm_rsar_scaled(x, w, sx.double(), sw, h)
        with pytest.raises(TypeError, match="with scales: call rsar::gemm_rsar_scaled"):
            torch.ops.rsar.gemm_rsar(x, w, h)
        with pytest.raises(TypeError, match="must be torch.float8_e4m3fn"):
            torch.ops.rsar.gemm_rsar_scaled(x.to(torch.bfloat16), w, sx, sw, h)
    unregister(s)


def test_a_plain_op_refuses_the_scaled_call():
    h = register(s := StandIn(256, False))
    with FakeTensorMode():
        x, w = torch.empty(8, 128, dtype=torch.bfloat16), torch.empty(256, 128, dtype=torch.bfloat16)
        with pytest.raises(TypeError, match="without scales: call rsar::gemm_rsar$"):
            torch.ops.rsar.gemm_rsar_scaled(x, w, torch.empty(()), torch.empty(()), h)
    unregister(s)


@pytest.mark.parametrize("ar", [False, True])
def test_scaled_row_parallel_linear_compiles_to_one_graph(ar):
    s = ScaledStandIn(128, ar)
    x, w, sx, sw = _fp8_inputs(16, 128, 256)
    m = RowParallelLinear(s, w, weight_scale=sw)
    assert torch.equal(m.weight_scale, sw) and "weight_scale" in m.state_dict()
    want = m(x, sx)
    ref = ((x.double() * sx.double()) @ (w.double() * sw.double().reshape(-1, 1)).T)
    ref = ref if ar else rs_rows(ref, 0, 2)
    assert torch.allclose(want.double(), ref, rtol=2e-2, atol=1e-2)
    cnt = CompileCounterWithBackend("aot_eager")
    got = torch.compile(m, backend=cnt, fullgraph=True)(x, sx)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert cnt.frame_count == 1
    with pytest.raises(ValueError, match="needs x_scale"):
        m(x)


def test_block_scaled_row_parallel_linear():
    """A DeepSeek-style checkpoint's layer: block-wise weight_scale (one per 128 x 128 block)
    kept as the buffer, the activations' scales per row and 128-element k-group; one graph."""
    from rsar_core.reference import rank_fp8_inputs
    s = ScaledStandIn(256, True)
    x, w, sx, sw = rank_fp8_inputs(4, 0, 16, 256, 384, torch.device("cpu"), block=True)
    m = RowParallelLinear(s, w, weight_scale=sw)
    assert m.weight_scale.shape == (2, 3) and sx.shape == (16, 3)
    want = m(x, sx)
    torch.testing.assert_close(want.double(), scaled_product(x, w, sx, sw), rtol=2e-2, atol=1e-2)
    cnt = CompileCounterWithBackend("aot_eager")
    got = torch.compile(m, backend=cnt, fullgraph=True)(x, sx)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert cnt.frame_count == 1


def test_row_parallel_linear_weight_scale_rules():
    _, w = _inputs(1, 128, 64)
    with pytest.raises(ValueError, match="for ops with an fp8 input_dtype only"):
        RowParallelLinear(StandIn(128, False), w, weight_scale=torch.ones(()))
    with pytest.raises(ValueError, match="x_scale is for an fp8"):
        RowParallelLinear(StandIn(128, False), w)(torch.ones(4, 64).bfloat16(), torch.ones(()))
    _, w8, _, _ = _fp8_inputs(1, 128, 128)
    with pytest.raises(ValueError, match="needed by"):
        RowParallelLinear(ScaledStandIn(128, False), w8)


def test_scaled_helper():
    s = ScaledStandIn(128, True)
    x, w, sx, sw = _fp8_inputs(8, 128, 128)
    y = torch_op.gemm_rsar_scaled(x, w, sx, sw, s)
    assert y.shape == (8, 128) and s.calls == 1
    unregister(s)
