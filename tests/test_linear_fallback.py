"""AutoRowParallelLinear on the CPU: the unfused path over gloo (2 processes) and mpi4py
(mpiexec -n 2) against a float64 reference, the path choice, counters, and bad input.

The fused path's plumbing (handle, torch.ops call, bias, reshape, counters) runs on CPU
tensors through a stand-in op whose call is a correct AR / RS of its own (torch.mm + gloo):
the layer then believes it fused, and the answer must still match the reference.
"""
from __future__ import annotations

import logging
import sys
from typing import Any

import pytest
import torch

from multicast.bootstrap import Bootstrap
from rsar_core.errors import RsarTypeError, RsarValueError, UnsupportedError
from rsar_core.linear import AutoRowParallelLinear

WORLD = 2
BF16_TOL = 1e-2        # relative to the reference's largest value: bf16 rounding of a sum
F32_TOL = 1e-5


# ------------------------------------------------------------------ shared by the workers
def full_inputs(seed: int, M: int, N: int, K: int, world: int = WORLD,
                bias: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The unsharded x (M, world*K), w (N, world*K) and bias (N,), float64, fresh per seed."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, world * K, generator=g, dtype=torch.float64)
    w = torch.randn(N, world * K, generator=g, dtype=torch.float64) * (world * K) ** -0.5
    b = torch.randn(N, generator=g, dtype=torch.float64) if bias else None
    return x, w, b


def shard(t: torch.Tensor, rank: int, world: int = WORLD) -> torch.Tensor:
    k = t.shape[-1] // world
    return t[..., rank * k:(rank + 1) * k].contiguous()


def rs_rows(full: torch.Tensor, rank: int, world: int = WORLD) -> torch.Tensor:
    """Rank's rows of ``full`` padded with zero rows to a multiple of ``world``."""
    M = full.shape[0]
    rows = -(-M // world)
    pad = torch.zeros(rows * world - M, full.shape[1], dtype=full.dtype)
    return torch.cat([full, pad])[rank * rows:(rank + 1) * rows]


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


class SumOp:
    """What the layer needs of a GemmRsAr, on CPU, with a correct (unfused) call inside."""

    def __init__(self, N: int, all_reduce: bool, max_M: int = 64, can: bool = True,
                 should: bool = True, dtype: torch.dtype = torch.bfloat16) -> None:
        import torch.distributed as dist
        from multicast.bootstrap import TorchBootstrap
        self.N, self.all_reduce, self.max_M, self.dtype = N, all_reduce, max_M, dtype
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self._can, self._should = can, should
        self._ws = type("WS", (), {"bootstrap": TorchBootstrap(None)})()
        self._on_close: list = []
        self.calls = 0

    def can_run(self, w: Any) -> bool:
        return self._can

    def should_run(self, x: torch.Tensor) -> bool:
        return self._should and x.shape[0] <= self.max_M

    def __call__(self, x: torch.Tensor, w: torch.Tensor, *,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
        import torch.distributed as dist
        self.calls += 1
        y = (x.float() @ w.float().T).to(self.dtype)
        dist.all_reduce(y)
        if bias is not None:
            y = y + bias
        if not self.all_reduce:
            y = rs_rows(y, self.rank, self.world).contiguous()
        return y


# ------------------------------------------------------------------ gloo worker cases
def _rank() -> int:
    import torch.distributed as dist
    return dist.get_rank()


def _case_unfused() -> dict[str, Any]:
    r = _rank()
    out: dict[str, Any] = {}
    # AR and RS, bf16, with and without bias, M not a multiple of the world
    for ar in (True, False):
        for with_bias in (False, True):
            x, w, b = full_inputs(10 + 2 * ar + with_bias, 37, 48, 64, bias=with_bias)
            bb = None if b is None else b.to(torch.bfloat16)
            layer = AutoRowParallelLinear(shard(w, r).to(torch.bfloat16), all_reduce=ar,
                                          bias=bb, comm=None)
            y = layer(shard(x, r).to(torch.bfloat16))
            ref = x @ w.T + (0 if b is None else b)
            if not ar:
                ref = rs_rows(ref, r)
            key = f"{'ar' if ar else 'rs'}_bias{int(with_bias)}"
            out[key] = {"err": rel_err(y, ref), "shape": list(y.shape),
                        "dtype": str(y.dtype), "unfused": layer.unfused_calls,
                        "fused": layer.fused_calls, "path": layer.last_path,
                        "reason": layer.last_reason,
                        "pad_zero": bool((y[ref.shape[0]:] == 0).all()) if not ar else True}
            if not ar and r == WORLD - 1:
                # rank 1 owns row 18 (M=37: 19 rows each), a padding row that must stay 0
                out[key]["pad_zero"] = bool((y[-1] == 0).all())
    # fp32, 3-D activations (batch, seq, K)
    x, w, b = full_inputs(20, 10, 32, 64, bias=True)
    layer = AutoRowParallelLinear(shard(w, r).float(), all_reduce=True, bias=b.float())
    y = layer(shard(x, r).float().reshape(2, 5, 64))
    out["ar_f32_3d"] = {"err": rel_err(y.reshape(10, 32), x @ w.T + b), "shape": list(y.shape)}
    # fp8 operands: per-tensor, per-row and block-wise scales (dequantized on the CPU)
    for kind in ("tensor", "row", "block"):
        out[f"fp8_{kind}"] = _fp8_case(r, kind)
    # inference only: the backward of a call that autograd recorded raises
    x, w, _ = full_inputs(30, 8, 16, 64)
    layer = AutoRowParallelLinear(shard(w, r).float(), all_reduce=True)
    xs = shard(x, r).float().requires_grad_()
    y = layer(xs)
    try:
        y.sum().backward()
        out["backward"] = "no error"
    except UnsupportedError as e:
        out["backward"] = str(e)
    return out


def _fp8_case(r: int, kind: str) -> dict[str, Any]:
    M, N, K = 24, 256, 256
    x, w, _ = full_inputs(40 + len(kind), M, N, K)
    g = torch.Generator().manual_seed(41)
    xq = shard(x, r).to(torch.float8_e4m3fn)
    wq = shard(w, r).mul(4).to(torch.float8_e4m3fn)
    if kind == "tensor":
        xs, ws = torch.rand(1, generator=g) + 0.5, torch.rand(1, generator=g) * 0.25 + 0.1
        xs_full, ws_full = xs.double(), ws.double()
    elif kind == "row":
        xs, ws = torch.rand(M, generator=g) + 0.5, torch.rand(N, generator=g) * 0.25 + 0.1
        xs_full, ws_full = xs.double()[:, None], ws.double()[:, None]
    else:
        xs = torch.rand(M, K // 128, generator=g) + 0.5
        ws = torch.rand(N // 128, K // 128, generator=g) * 0.25 + 0.1
        xs_full = xs.double().repeat_interleave(128, 1)
        ws_full = ws.double().repeat_interleave(128, 0).repeat_interleave(128, 1)
    layer = AutoRowParallelLinear(wq, all_reduce=True, weight_scale=ws)
    y = layer(xq, xs)
    # every rank's partial rounded to bf16 and summed: compute both ranks' here
    import torch.distributed as dist
    part = (xq.double() * xs_full) @ (wq.double() * ws_full).T
    gathered = [torch.empty_like(part) for _ in range(WORLD)]
    dist.all_gather(gathered, part)
    ref = sum(gathered)
    return {"err": rel_err(y, ref), "dtype": str(y.dtype)}


def _case_fused_standin() -> dict[str, Any]:
    from rsar_core import torch_op
    for name, opdef in ((torch_op.OP_NAME, torch_op._gemm_rsar),):
        if "cpu" not in opdef._backend_fns:
            torch.library.register_kernel(name, "cpu", opdef._init_fn)
    r = _rank()
    out: dict[str, Any] = {}
    for ar in (True, False):
        x, w, b = full_inputs(50 + ar, 21, 48, 64, bias=True)
        op = SumOp(48, ar)
        layer = AutoRowParallelLinear(shard(w, r).to(torch.bfloat16), op=op,
                                      bias=b.to(torch.bfloat16))
        layer.fused_device_types = ("cpu",)
        xin = shard(x, r).to(torch.bfloat16)
        y = layer(xin.reshape(3, 7, 64) if ar else xin)
        ref = x @ w.T + b
        ref = ref if ar else rs_rows(ref, r)
        out["ar" if ar else "rs"] = {
            "err": rel_err(y.reshape(ref.shape), ref), "fused": layer.fused_calls,
            "unfused": layer.unfused_calls, "op_calls": op.calls, "path": layer.last_path,
            "shape": list(y.shape)}
    # torch.compile(fullgraph=True) traces both paths' choice and the op (counters: eager only)
    x, w, b = full_inputs(55, 8, 48, 64, bias=True)
    for path in ("fused", "auto"):
        op = SumOp(48, True)
        layer = AutoRowParallelLinear(shard(w, r).to(torch.bfloat16), op=op,
                                      bias=b.to(torch.bfloat16), path=path)
        layer.fused_device_types = ("cpu",)
        f = torch.compile(layer, fullgraph=True, backend="aot_eager")
        with torch.no_grad():
            y = f(shard(x, r).to(torch.bfloat16).reshape(2, 4, 64))
        out[f"compiled_{path}"] = {"err": rel_err(y.reshape(8, 48), x @ w.T + b),
                                   "op_calls": op.calls, "counted": layer.fused_calls}
    # the choice: should_run false, M past max_M with path="fused", another dtype, CPU
    op = SumOp(48, True, max_M=16, should=False)
    x, w, _ = full_inputs(60, 20, 48, 64)
    wl = shard(w, r).to(torch.bfloat16)
    auto = AutoRowParallelLinear(wl, op=op)
    auto.fused_device_types = ("cpu",)
    forced = AutoRowParallelLinear(wl, op=op, path="fused")
    forced.fused_device_types = ("cpu",)
    never = AutoRowParallelLinear(wl, op=op, path="unfused")
    xb = shard(x, r).to(torch.bfloat16)
    cpu_only = AutoRowParallelLinear(wl, op=op)     # fused_device_types: CUDA only
    out["choices"] = {
        "should_false": list(auto.choose(xb[:8])),
        "forced_small": list(forced.choose(xb[:8])),
        "forced_past_max": list(forced.choose(xb)),
        "other_dtype": list(forced.choose(xb[:8].float())),
        "never": list(never.choose(xb[:8])),
        "cpu": list(cpu_only.choose(xb[:8])),
    }
    y_forced = forced(xb[:8])
    out["forced_err"] = rel_err(y_forced, x[:8] @ w.T)
    out["forced_counts"] = [forced.fused_calls, forced.unfused_calls]
    y_past = forced(xb)                              # unfused, the same answer
    out["past_err"] = rel_err(y_past, x @ w.T)
    out["past_counts"] = [forced.fused_calls, forced.unfused_calls]
    # ranks that disagree on can_run: both unfused, said so
    split = AutoRowParallelLinear(wl, op=SumOp(48, True, can=(r == 0)), path="fused")
    split.fused_device_types = ("cpu",)
    out["split"] = list(split.choose(xb[:8]))
    return out


def _case_mpi() -> dict[str, Any]:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    r = comm.Get_rank()
    out: dict[str, Any] = {}
    for ar in (True, False):
        x, w, b = full_inputs(70 + ar, 13, 40, 64, bias=True)
        layer = AutoRowParallelLinear(shard(w, r).to(torch.bfloat16), comm=comm,
                                      all_reduce=ar, bias=b.to(torch.bfloat16))
        y = layer(shard(x, r).to(torch.bfloat16))
        ref = x @ w.T + b
        ref = ref if ar else rs_rows(ref, r)
        out["ar" if ar else "rs"] = {"err": rel_err(y, ref), "shape": list(y.shape),
                                     "backend": layer.comm.backend}
    return out


CASES = {"unfused": _case_unfused, "fused_standin": _case_fused_standin, "mpi": _case_mpi}


# ------------------------------------------------------------------ the tests
@pytest.fixture(scope="module")
def unfused(tmp_path_factory):
    from dist_workers import run_gloo
    return run_gloo(__file__, "unfused", tmp_path_factory.mktemp("unfused"))


def test_unfused_matches_float64(unfused):
    for r, res in enumerate(unfused):
        for key in ("ar_bias0", "ar_bias1", "rs_bias0", "rs_bias1"):
            c = res[key]
            assert c["err"] < BF16_TOL, (r, key, c)
            assert c["dtype"] == "torch.bfloat16"
            assert (c["unfused"], c["fused"], c["path"]) == (1, 0, "unfused"), c
            assert c["reason"] == "no op"
            assert c["pad_zero"], (r, key)
        assert res["ar_bias0"]["shape"] == [37, 48]
        assert res["rs_bias1"]["shape"] == [19, 48]
        assert res["ar_f32_3d"]["err"] < F32_TOL and res["ar_f32_3d"]["shape"] == [2, 5, 32]
        for kind in ("tensor", "row", "block"):
            c = res[f"fp8_{kind}"]
            assert c["err"] < BF16_TOL and c["dtype"] == "torch.bfloat16", (r, kind, c)
        assert "inference" in res["backward"], res["backward"]


def test_fused_path_plumbing_and_choice(tmp_path):
    from dist_workers import run_gloo
    for r, res in enumerate(run_gloo(__file__, "fused_standin", tmp_path)):
        for key, shape in (("ar", [3, 7, 48]), ("rs", [11, 48])):
            c = res[key]
            assert c["err"] < BF16_TOL, (r, key, c)
            assert (c["fused"], c["unfused"], c["op_calls"], c["path"]) == (1, 0, 1, "fused")
            assert c["shape"] == shape
        for path in ("fused", "auto"):
            c = res[f"compiled_{path}"]
            assert c["err"] < BF16_TOL and c["op_calls"] >= 1 and c["counted"] == 0, c
        ch = res["choices"]
        assert ch["should_false"] == ["unfused", "op.should_run is false"]
        assert ch["forced_small"] == ["fused", 'path="fused"']
        assert ch["forced_past_max"][0] == "unfused" and "max_M=16" in ch["forced_past_max"][1]
        assert ch["other_dtype"][0] == "unfused" and "float32" in ch["other_dtype"][1]
        assert ch["never"] == ["unfused", 'path="unfused"']
        assert ch["cpu"] == ["unfused", "x is on cpu"]
        assert res["forced_err"] < BF16_TOL and res["forced_counts"] == [1, 0]
        assert res["past_err"] < BF16_TOL and res["past_counts"] == [1, 1]
        assert res["split"][0] == "unfused" and "rank(s) [1]" in res["split"][1]


def test_mpi4py_unfused(tmp_path):
    from mpirun import find_mpiexec, mpiexec_flags
    from dist_workers import run_mpiexec
    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec")
    for r, res in enumerate(run_mpiexec(mpiexec, mpiexec_flags(mpiexec), __file__, "mpi",
                                        tmp_path)):
        assert res["ar"]["err"] < BF16_TOL and res["ar"]["shape"] == [13, 40], res
        assert res["rs"]["err"] < BF16_TOL and res["rs"]["shape"] == [7, 40], res
        assert res["ar"]["backend"] == "mpi"


# ------------------------------------------------------------------ one process: bad input
class _Boot(Bootstrap):
    """A bootstrap of no torch group or MPI communicator: the fused op's set-up could use
    it, the unfused path cannot."""
    rank, world = 0, 2

    def allgather(self, data: bytes) -> list[bytes]:
        return [data, data]

    def broadcast(self, data: bytes | None, root: int = 0) -> bytes:
        return data or b""

    def barrier(self) -> None:
        pass


def _w(N: int = 16, K: int = 64, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(N, K, generator=torch.Generator().manual_seed(1)).to(dtype)


def test_no_unfused_path_is_a_clear_error(caplog):
    layer = AutoRowParallelLinear(_w(), comm=_Boot(), all_reduce=True)
    assert layer.comm.backend == "none"
    with pytest.raises(UnsupportedError, match="no unfused path over a .*_Boot.*ProcessGroup "
                                               "or an mpi4py communicator"):
        layer(torch.randn(4, 64))


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(weight=torch.randn(3, 4, 5)), RsarValueError, r"2-D \(N, K\) tensor, got shape"),
    (dict(path="always"), RsarValueError, "path must be one of"),
    (dict(all_reduce=None), RsarValueError, "all_reduce .* must be given when no op is"),
    (dict(bias=torch.randn(15)), RsarValueError, r"bias must be \(N=16,\), got \(15,\)"),
    (dict(bias=torch.randn(16, dtype=torch.float64)), RsarTypeError, "bias must be torch.float32"),
    (dict(bias=[0.0] * 16), RsarTypeError, "bias must be a torch.Tensor or None, got list"),
    (dict(comm=object()), RsarTypeError, "comm must be a torch.distributed ProcessGroup"),
    (dict(weight_scale=torch.ones(1)), RsarValueError, "weight_scale is for an fp8 weight only"),
    (dict(weight=_w(dtype=torch.float8_e4m3fn)), RsarValueError, r"needed by\) an fp8 weight"),
])
def test_bad_construction(kwargs, exc, match):
    args = dict(weight=_w(), comm=_Boot(), all_reduce=True)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        AutoRowParallelLinear(args.pop("weight"), **args)


def test_op_binds_the_layer():
    class Op:
        N, all_reduce, world, max_M, dtype = 16, True, 2, 64, torch.bfloat16

        def can_run(self, w: Any) -> bool:
            return True

    with pytest.raises(RsarValueError, match=r"weight must be \(N=16, K\) for this op"):
        AutoRowParallelLinear(_w(N=8, dtype=torch.bfloat16), op=Op(), comm=_Boot())
    with pytest.raises(RsarValueError, match="all_reduce=False but the op was built with"):
        AutoRowParallelLinear(_w(dtype=torch.bfloat16), op=Op(), comm=_Boot(),
                              all_reduce=False)
    with pytest.raises(RsarTypeError, match="weight must be torch.bfloat16"):
        AutoRowParallelLinear(_w(), op=Op(), comm=_Boot())


def test_bad_call():
    layer = AutoRowParallelLinear(_w(), comm=_Boot(), all_reduce=True)
    with pytest.raises(RsarValueError, match=r"x must be \(\.\.\., K=64\), got \(4, 32\)"):
        layer(torch.randn(4, 32))
    with pytest.raises(RsarTypeError, match="x must be a torch.Tensor, got list"):
        layer([[1.0] * 64])
    with pytest.raises(RsarValueError, match="x_scale is for an fp8 layer only"):
        layer(torch.randn(4, 64), torch.ones(1))
    with pytest.raises(RsarTypeError, match="x must be torch.float32 .*got torch.bfloat16"):
        layer(torch.randn(4, 64, dtype=torch.bfloat16))


def test_debug_line_names_the_path(caplog, monkeypatch):
    layer = AutoRowParallelLinear(_w(), comm=_Boot(), all_reduce=True)
    monkeypatch.setattr(layer.comm, "all_reduce", lambda y: y * 2)   # a fake sum of 2 ranks
    x = torch.randn(4, 64)
    with caplog.at_level(logging.DEBUG, logger="rsar"):
        y = layer(x)
    assert torch.allclose(y, 2 * (x @ layer.weight.T), rtol=1e-5, atol=1e-5)
    assert any("unfused path (no op), M=4 K=64 N=16" in m for m in caplog.messages), \
        caplog.messages
    assert (layer.unfused_calls, layer.fused_calls, layer.last_path) == (1, 0, "unfused")


if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
    from dist_workers import worker_main
    worker_main(CASES)
