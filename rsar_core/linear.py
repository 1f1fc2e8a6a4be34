"""A row-parallel linear layer that always runs: rsar's fused op where it can and should,
torch's GEMM and the communicator's collective where not.

    from rsar_core.linear import AutoRowParallelLinear

    layer = AutoRowParallelLinear(w_shard, op=op)                  # GPU: fused when it pays
    layer = AutoRowParallelLinear(w_shard, comm=pg, all_reduce=True)  # no op: unfused only
    y = layer(x_shard)            # (..., K_local) -> (..., N) (AR) or (ceil(M/world), N) (RS)

Each call takes the fused path (``torch.ops.rsar.gemm_rsar`` on the op's registered handle)
when all of these hold, else the unfused one:

- an op was given and, at construction, ``op.can_run(weight)`` held on every rank (the
  ranks agree once, over the op's bootstrap, so they never split between paths);
- x is on a device the op runs on (CUDA) and of the op's input dtype;
- ``path="auto"`` (default): ``op.should_run(x)`` (the measured table expects the fused op to
  win); ``path="fused"``: M <= the op's max_M only; ``path="unfused"``: never.

The unfused path is ``torch.mm`` (fp8: ``torch._scaled_mm`` for per-tensor or per-row scales
on CUDA, else the dequantized product) and then the collective of the communicator:

- a torch.distributed ProcessGroup (NCCL on GPU, gloo on CPU; gloo on CUDA tensors works
  for the all-reduce): ``dist.all_reduce``; RS by ``reduce_scatter_single`` on NCCL, by an
  all-reduce and this rank's rows elsewhere;
- an mpi4py communicator: the partial sum goes to the host as float32 and back
  (``Allreduce``: MPI has no bf16 type, and a CUDA-aware MPI cannot be assumed); slow, not
  capturable in a CUDA graph (such a call raises UnsupportedError);
- anything else (a custom Bootstrap): no unfused path; a call that needs one raises
  UnsupportedError naming what came in.

The result equals the fused op's: each rank's partial rounded to the result dtype before the
sum, the bias added once after it, RS rows past M zero. Which path ran is observable:
``fused_calls`` / ``unfused_calls`` (eager calls; calls traced by torch.compile are not
counted), ``last_path`` and ``last_reason``, and a debug line on the ``rsar`` logger per call.
Inference only: the output of a call where autograd records an input has a backward that
raises UnsupportedError.
"""
from __future__ import annotations

import logging
import sys
from typing import Any

import torch
from torch import nn

from .errors import RsarTypeError, RsarValueError, UnsupportedError

__all__ = ["AutoRowParallelLinear", "Collective", "PATHS"]

log = logging.getLogger("rsar")

PATHS = ("auto", "fused", "unfused")
_FP8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))
_BLOCK = 128   # fp8 block-wise scales cover 128-element k-groups / 128 x 128 weight blocks


class _NoBackward(torch.autograd.Function):
    """Identity forward; a backward that says the layer is for inference (the fused op has
    no backward, and the unfused collective would give wrong gradients silently)."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        raise UnsupportedError("AutoRowParallelLinear is for inference: its output has no "
                               "backward (run it under torch.no_grad() or inference_mode())")


def _inference_only(y: torch.Tensor, *inputs: torch.Tensor | None) -> torch.Tensor:
    recorded = [t for t in inputs if t is not None and t.requires_grad]
    if torch.is_grad_enabled() and recorded:
        return _NoBackward.apply(y.detach(), *recorded)
    return y


class Collective:
    """The unfused path's all-reduce and reduce-scatter over what an op was built on.

    ``comm``: a torch.distributed ProcessGroup, an mpi4py communicator, an rsar Bootstrap
    (its group or communicator is used), or None: torch.distributed's default group when it
    is initialised, else mpi4py's COMM_WORLD.
    """

    def __init__(self, comm: Any = None) -> None:
        self.kind, self.handle, self.rank, self.world = _resolve(comm)
        self.what = f"{type(comm).__module__}.{type(comm).__qualname__}"

    @property
    def backend(self) -> str:
        """"nccl", "gloo", ... for a torch group; "mpi"; "none" where no unfused path exists."""
        if self.kind == "torch":
            import torch.distributed as dist
            return str(dist.get_backend(self.handle)).lower()
        return self.kind

    def _require(self, y: torch.Tensor) -> None:
        if self.kind == "none":
            raise UnsupportedError(
                f"no unfused path over a {self.what}: the unfused collective needs a "
                "torch.distributed ProcessGroup or an mpi4py communicator (pass comm= one)")
        if (y.is_cuda and torch.cuda.is_current_stream_capturing()
                and (self.kind == "mpi" or "nccl" not in self.backend)):
            raise UnsupportedError(
                f"the unfused path over {self.backend} goes through the host and cannot be "
                "captured in a CUDA graph: capture shapes that take the fused path, or give "
                "the layer an NCCL group (comm=)")

    def all_reduce(self, y: torch.Tensor) -> torch.Tensor:
        """Sum of every rank's ``y``, on every rank (``y`` may be overwritten)."""
        self._require(y)
        if self.kind == "torch":
            import torch.distributed as dist
            dist.all_reduce(y, group=self.handle)
            return y
        from mpi4py import MPI
        buf = y.detach().to("cpu", torch.float32).contiguous()
        self.handle.Allreduce(MPI.IN_PLACE, buf.numpy(), op=MPI.SUM)
        return buf.to(y.device, y.dtype)

    def reduce_scatter(self, y: torch.Tensor) -> torch.Tensor:
        """This rank's rows of the sum of every rank's ``y`` ((world * rows, N) -> (rows, N))."""
        rows = y.shape[0] // self.world
        self._require(y)
        if self.kind == "torch" and "nccl" in self.backend:
            import torch.distributed as dist
            out = y.new_empty((rows, y.shape[1]))
            rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            rs(out, y, group=self.handle)
            return out
        # gloo's reduce-scatter takes no CUDA tensors, MPI none of bf16: the all-reduce serves
        return self.all_reduce(y)[self.rank * rows:(self.rank + 1) * rows].contiguous()


def _resolve(comm: Any) -> tuple[str, Any, int, int]:
    from multicast.bootstrap import Bootstrap, MpiBootstrap, TorchBootstrap
    if isinstance(comm, TorchBootstrap):
        comm = comm.group if comm.group is not None else _default_group()
    elif isinstance(comm, MpiBootstrap):
        comm = comm.comm
    elif isinstance(comm, Bootstrap):
        return "none", comm, int(comm.rank), int(comm.world)
    if comm is None:
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            comm = _default_group()
        else:
            from mpi4py import MPI
            comm = MPI.COMM_WORLD
    dist = sys.modules.get("torch.distributed")
    if dist is not None and isinstance(comm, getattr(dist, "ProcessGroup", ())):
        return "torch", comm, int(dist.get_rank(comm)), int(dist.get_world_size(comm))
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and isinstance(comm, mpi.Comm):
        return "mpi", comm, int(comm.Get_rank()), int(comm.Get_size())
    raise RsarTypeError(
        "comm must be a torch.distributed ProcessGroup, an mpi4py communicator, an rsar "
        f"Bootstrap or None, got {type(comm).__module__}.{type(comm).__qualname__}")


def _default_group() -> Any:
    import torch.distributed as dist
    return dist.group.WORLD


def _bootstrap_of(op: Any) -> Any:
    ws = getattr(op, "_ws", None) or getattr(op, "workspace", None)
    return getattr(ws, "bootstrap", None)


class AutoRowParallelLinear(nn.Module):
    """``y = all_reduce(x @ weight.T) + bias`` (or reduce-scatter), fused where it pays.

    ``weight``: this rank's (N, K) shard. ``op``: a GemmRsAr (or None: unfused only, e.g. on
    CPU where no GemmRsAr can be built); its N, mode and dtypes then bind the layer.
    ``comm``: the unfused path's communicator (default: the one ``op`` was built on; without
    an op, required unless torch.distributed's default group or MPI's world is meant).
    ``all_reduce``: AR or RS; taken from ``op`` (a different value is an error), and needed
    when there is none. ``bias``: (N,), added once to the reduced sum. fp8 (an op with an fp8
    ``input_dtype``, or an fp8 ``weight`` without op): ``weight_scale`` float32, one value,
    one per row of ``weight`` or one per 128 x 128 block, and ``forward(x, x_scale)``;
    ``dtype`` is the result's (default: the op's, else bfloat16 for fp8 and weight's dtype
    otherwise). ``path``: "auto", "fused" or "unfused" (module docstring).
    """

    # Device types the fused path runs on; CPU tests with a stand-in op widen it.
    fused_device_types: tuple[str, ...] = ("cuda",)

    def __init__(self, weight: torch.Tensor, *, op: Any = None, comm: Any = None,
                 all_reduce: bool | None = None, bias: torch.Tensor | None = None,
                 weight_scale: torch.Tensor | None = None, dtype: torch.dtype | None = None,
                 path: str = "auto") -> None:
        super().__init__()
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            raise RsarValueError("weight must be a 2-D (N, K) tensor, got "
                                 + (f"shape {tuple(weight.shape)}" if isinstance(
                                     weight, torch.Tensor) else type(weight).__name__))
        if path not in PATHS:
            raise RsarValueError(f"path must be one of {PATHS}, got {path!r}")
        N = weight.shape[0]
        if op is not None:
            if int(op.N) != N:
                raise RsarValueError(f"weight must be (N={op.N}, K) for this op, got "
                                     f"{tuple(weight.shape)}")
            if all_reduce is not None and bool(all_reduce) != bool(op.all_reduce):
                raise RsarValueError(f"all_reduce={all_reduce} but the op was built with "
                                     f"all_reduce={op.all_reduce}")
            all_reduce = bool(op.all_reduce)
            op_dtype = op.dtype
            if dtype is not None and dtype != op_dtype:
                raise RsarTypeError(f"dtype={dtype} but the op's result dtype is {op_dtype}")
            dtype = op_dtype
            if weight.dtype != getattr(op, "input_dtype", op_dtype):
                raise RsarTypeError(f"weight must be {getattr(op, 'input_dtype', op_dtype)} "
                                    f"(the op's input dtype), got {weight.dtype}")
            if comm is None:
                comm = _bootstrap_of(op)
        elif all_reduce is None:
            raise RsarValueError("all_reduce (True: all-reduce, False: reduce-scatter) must be "
                                 "given when no op is")
        self.scaled = weight.dtype in _FP8
        if self.scaled != (weight_scale is not None):
            raise RsarValueError("weight_scale is for (and needed by) an fp8 weight" if
                                 self.scaled else "weight_scale is for an fp8 weight only")
        if dtype is None:
            dtype = torch.bfloat16 if self.scaled else weight.dtype
        if bias is not None:
            if not isinstance(bias, torch.Tensor):
                raise RsarTypeError(f"bias must be a torch.Tensor or None, got "
                                    f"{type(bias).__name__}")
            if tuple(bias.shape) != (N,):
                raise RsarValueError(f"bias must be (N={N},), got {tuple(bias.shape)}")
            if bias.dtype != dtype:
                raise RsarTypeError(f"bias must be {dtype} (the result dtype), got {bias.dtype}")
        self.comm = Collective(comm)
        if op is not None and int(op.world) != self.comm.world:
            raise RsarValueError(f"the op spans {op.world} ranks but comm {self.comm.world}")
        self.op, self.all_reduce, self.dtype, self.path = op, bool(all_reduce), dtype, path
        self.world, self.rank = self.comm.world, self.comm.rank
        self.in_features, self.out_features = weight.shape[1], N
        self.weight = _parameter(weight)
        self.bias = None if bias is None else _parameter(bias)
        self.register_buffer("weight_scale", weight_scale)
        self.fused_calls = 0
        self.unfused_calls = 0
        self.last_path: str | None = None
        self.last_reason: str | None = None
        self.handle: int | None = None
        self._fusable, self._why_not = self._agree_can_run()
        if self._fusable:
            from .torch_op import register
            self.handle = register(op)

    def _agree_can_run(self) -> tuple[bool, str]:
        """Whether every rank's op can run this weight: asked once, agreed by all, so a call
        never sends one rank down the fused path and its peer down the unfused one."""
        if self.op is None:
            return False, "no op"
        if self.path == "unfused":
            return False, 'path="unfused"'
        here = bool(self.op.can_run(self.weight))
        bs = _bootstrap_of(self.op)
        if bs is not None and int(getattr(bs, "world", 1)) > 1:
            every = [b == b"1" for b in bs.allgather(b"1" if here else b"0")]
        else:
            every = [here]
        if all(every):
            return True, ""
        bad = [r for r, ok in enumerate(every) if not ok]
        return False, f"op.can_run(weight) is false on rank(s) {bad}"

    # ------------------------------------------------------------------ the call
    def choose(self, x: torch.Tensor) -> tuple[str, str]:
        """("fused" | "unfused", why) for a 2-D ``x``: the same answer on every rank for the
        same shape, dtype and device type."""
        if not self._fusable:
            return "unfused", self._why_not
        if x.device.type not in self.fused_device_types:
            return "unfused", f"x is on {x.device.type}"
        in_dtype = getattr(self.op, "input_dtype", self.op.dtype)
        if x.dtype != in_dtype:
            return "unfused", f"x is {x.dtype}, the op takes {in_dtype}"
        if self.path == "fused":
            if 0 < x.shape[0] <= int(self.op.max_M):
                return "fused", 'path="fused"'
            return "unfused", f"M={x.shape[0]} is past max_M={self.op.max_M}"
        if self.op.should_run(x):
            return "fused", "op.should_run"
        return "unfused", "op.should_run is false"

    def forward(self, x: torch.Tensor, x_scale: torch.Tensor | None = None) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise RsarTypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise RsarValueError(f"x must be (..., K={self.in_features}), got "
                                 f"{tuple(x.shape)}")
        if self.scaled != (x_scale is not None):
            raise RsarValueError("an fp8 layer needs x_scale with x" if self.scaled else
                                 "x_scale is for an fp8 layer only")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        path, why = self.choose(x2)
        if path == "fused":
            y = self._fused(x2, x_scale)
        else:
            y = self._unfused(x2, x_scale)
        if not torch.compiler.is_compiling():
            # eager calls only: a counter bumped inside a traced graph would be a guard
            if path == "fused":
                self.fused_calls += 1
            else:
                self.unfused_calls += 1
            self.last_path, self.last_reason = path, why
            if log.isEnabledFor(logging.DEBUG):
                log.debug("rsar AutoRowParallelLinear rank %d/%d: %s path (%s), M=%d K=%d N=%d",
                          self.rank, self.world, path, why, x2.shape[0], self.in_features,
                          self.out_features)
        return y.reshape(*lead, self.out_features) if self.all_reduce else y

    def _fused(self, x: torch.Tensor, x_scale: torch.Tensor | None) -> torch.Tensor:
        if self.scaled:
            return torch.ops.rsar.gemm_rsar_scaled(x, self.weight, x_scale, self.weight_scale,
                                                   self.handle, self.bias)
        return torch.ops.rsar.gemm_rsar(x, self.weight, self.handle, self.bias)

    def _unfused(self, x: torch.Tensor, x_scale: torch.Tensor | None) -> torch.Tensor:
        w = self.weight
        if x.dtype != w.dtype:
            raise RsarTypeError(f"x must be {w.dtype} (the weight's dtype), got {x.dtype}")
        with torch.no_grad():
            if self.scaled:
                y = _scaled_product(x, w, x_scale, self.weight_scale, self.dtype)
            else:
                y = torch.mm(x, w.t())
            M = y.shape[0]
            if self.all_reduce:
                y = self.comm.all_reduce(y)
            else:
                rows = -(-M // self.world)
                if rows * self.world != M:
                    y = torch.cat([y, y.new_zeros((rows * self.world - M, y.shape[1]))])
                y = self.comm.reduce_scatter(y)
                if self.bias is not None:
                    # rows past M stay zero, as the fused op leaves them
                    valid = max(0, min(rows, M - self.rank * rows))
                    y[:valid] += self.bias
                    return _inference_only(y, x, w, self.bias)
            if self.bias is not None:
                y = y + self.bias
        return _inference_only(y, x, w, self.bias)

    def extra_repr(self) -> str:
        mode = "ar" if self.all_reduce else "rs"
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"mode={mode}, world={self.world}, bias={self.bias is not None}, "
                f"path={self.path}, fusable={self._fusable}, comm={self.comm.backend}")


def _expand(scale: torch.Tensor, rows: int, cols: int, block_rows: int) -> torch.Tensor:
    """``scale`` (one value, one per row, or per block of ``block_rows`` x 128) as a
    (rows, cols) or broadcastable float32 factor."""
    s = scale.to(torch.float32)
    if s.numel() == 1:
        return s.reshape(1, 1)
    if s.dim() == 1 or (s.dim() == 2 and s.shape[1] == 1):
        if s.numel() != rows:
            raise RsarValueError(f"a per-row scale needs {rows} values, got {s.numel()}")
        return s.reshape(rows, 1)
    s = s.repeat_interleave(_BLOCK, dim=1)[:, :cols]
    if block_rows > 1:
        s = s.repeat_interleave(block_rows, dim=0)
    if s.shape[0] < rows or s.shape[1] != cols:
        raise RsarValueError(f"a block-wise scale of shape {tuple(scale.shape)} does not "
                             f"cover a ({rows}, {cols}) operand")
    return s[:rows]


def _scaled_product(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor,
                    w_scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(x_scale * x) @ (w_scale * w).T rounded to ``dtype``: ``torch._scaled_mm`` where it
    takes the scales (CUDA, both per-tensor or both per-row), else the dequantized product."""
    M, K = x.shape
    N = w.shape[0]
    if x.is_cuda:
        xs, ws = x_scale.to(torch.float32), w_scale.to(torch.float32)
        if xs.numel() == 1 and ws.numel() == 1:
            return torch._scaled_mm(x, w.t(), scale_a=xs.reshape(()), scale_b=ws.reshape(()),
                                    out_dtype=dtype)
        if xs.numel() == M and ws.numel() == N and xs.dim() <= 2 and ws.dim() <= 2 and (
                xs.dim() == 1 or xs.shape[-1] == 1) and (ws.dim() == 1 or ws.shape[-1] == 1):
            return torch._scaled_mm(x, w.t(), scale_a=xs.reshape(M, 1),
                                    scale_b=ws.reshape(1, N), out_dtype=dtype)
    a = x.to(torch.float32) * _expand(x_scale, M, K, 1)
    b = w.to(torch.float32) * _expand(w_scale, N, K, _BLOCK)
    return (a @ b.t()).to(dtype)


def _parameter(t: torch.Tensor) -> nn.Parameter:
    return t if isinstance(t, nn.Parameter) else nn.Parameter(t, requires_grad=False)
