"""``rsar::gemm_rsar``: GemmRsAr as a torch.library custom op, for torch.compile and CUDA graphs.

    from rsar_core.torch_op import RowParallelLinear, register, gemm_rsar

    op = GemmRsAr(max_M, N, all_reduce=False, comm=comm)
    layer = RowParallelLinear(op, w)                  # registers op, w: (N, K), op.dtype
    y = torch.compile(layer, fullgraph=True)(x)       # or: gemm_rsar(x, w, op)

A custom op cannot take a Python object, so the schema carries an integer ``handle`` that
names a live GemmRsAr in this module's registry:

    rsar::gemm_rsar(Tensor x, Tensor w, int handle, Tensor? bias=None) -> Tensor
    rsar::gemm_rsar_scaled(Tensor x, Tensor w, Tensor x_scale, Tensor w_scale, int handle,
                           Tensor? bias=None) -> Tensor   # ops built with fp8 input_dtype

``bias``: (N,) of the op's dtype, added once to the reduced sum (``GemmRsAr.__call__``).

- ``register(op)`` returns the handle (idempotent per instance); ``unregister(op)`` drops it.
  The registry holds the op weakly: a collected op leaves it by itself (weakref.finalize),
  and register() adds its unregister to the op's ``_on_close`` list, so ``close()`` drops
  the handle too; a call through a dropped handle raises ClosedError.
- The CUDA kernel looks the op up and calls it: the same launch, on the current stream, so
  it captures into a CUDA graph like a direct call. Every rank must make the same calls in
  the same order, compiled or not (the op is collective).
- The fake (meta) kernel gives the output shape from the registered op's world, N and
  all_reduce: RS ``(ceil(M / world), N)``, AR ``(M, N)``, of the op's dtype (x and w
  must be its input dtype: the scaled op's fp8, the plain op's the result's; a bias the
  result's dtype, shape (N,)); ceil-div on SymInts, so one dynamic-shape graph serves
  every M.
- Handles are never reused in a process, and a handle encodes ``(world, N, all_reduce)``
  besides a serial number. A compiled graph that has the handle as a constant therefore
  means the same output shapes in any process that hands out the same handle, which keeps
  Inductor's / AOTAutograd's on-disk caches (keyed on the graph code) sound.
- No autograd formula: the op is for inference (its backward would need an all-gather).
  RowParallelLinear keeps its weight with ``requires_grad=False``.

Importing this module defines the op but touches no GPU; it does not import gemm_rsar.
"""
from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any

import torch
from torch import nn

from .errors import ClosedError, RsarError, RsarTypeError, RsarValueError

__all__ = ["OP_NAME", "SCALED_OP_NAME", "register", "unregister", "lookup", "gemm_rsar",
           "gemm_rsar_scaled", "RowParallelLinear"]

OP_NAME = "rsar::gemm_rsar"
SCALED_OP_NAME = "rsar::gemm_rsar_scaled"

# handle = serial << 40 | N << 6 | world << 1 | all_reduce  (serial >= 1, so handle > 0)
_N_BITS, _WORLD_BITS = 34, 5
_SERIAL_SHIFT = 1 + _WORLD_BITS + _N_BITS
_MAX_SERIAL = (1 << (63 - _SERIAL_SHIFT)) - 1

_ATTR = "_rsar_torch_handle"           # set on the registered instance
_LOCK = threading.RLock()           # re-entrant: a finalizer may run inside register()
_SERIALS = itertools.count(1)
# handle -> (weak or strong reference to the op, its finalizer or None)
_REGISTRY: dict[int, tuple[Any, Any]] = {}


def _encode(serial: int, world: int, N: int, all_reduce: bool) -> int:
    if not 0 < world < (1 << _WORLD_BITS):
        raise RsarValueError(f"world must be in 1..{(1 << _WORLD_BITS) - 1}, got {world}")
    if not 0 < N < (1 << _N_BITS):
        raise RsarValueError(f"N must be in 1..{(1 << _N_BITS) - 1}, got {N}")
    if serial > _MAX_SERIAL:
        raise RsarError("rsar: out of torch op handles")
    return (serial << _SERIAL_SHIFT) | (N << (1 + _WORLD_BITS)) | (world << 1) | int(all_reduce)


def _decode(handle: int) -> tuple[int, int, bool]:
    """(world, N, all_reduce) that ``handle`` was made for."""
    return ((handle >> 1) & ((1 << _WORLD_BITS) - 1),
            (handle >> (1 + _WORLD_BITS)) & ((1 << _N_BITS) - 1),
            bool(handle & 1))


def _drop(handle: int) -> None:
    with _LOCK:
        entry = _REGISTRY.pop(handle, None)
    if entry is not None and entry[1] is not None:
        entry[1].detach()


@torch.compiler.disable  # a graph break if compiled code calls it (see gemm_rsar)
def register(op: Any) -> int:
    """Give ``op`` (a GemmRsAr, or anything with ``world``, ``N``, ``all_reduce`` and
    ``__call__(x, w)``) an integer handle for ``torch.ops.rsar.gemm_rsar``.

    Idempotent: the same instance gets the same handle until ``unregister(op)``. Register
    before ``torch.compile`` traces a call (RowParallelLinear does so in ``__init__``).
    """
    with _LOCK:
        h = op.__dict__.get(_ATTR) if hasattr(op, "__dict__") else None
        if h is not None and h in _REGISTRY and _deref(_REGISTRY[h][0]) is op:
            return h
        world, N, ar = int(op.world), int(op.N), bool(op.all_reduce)
        h = _encode(next(_SERIALS), world, N, ar)
        try:
            ref: Any = weakref.ref(op)
            fin: Any = weakref.finalize(op, _drop, h)
            fin.atexit = False
        except TypeError:   # not weakly referenceable: held until unregister()
            ref, fin = op, None
        _REGISTRY[h] = (ref, fin)
        setattr(op, _ATTR, h)
    hooks = getattr(op, "_on_close", None)
    if isinstance(hooks, list):
        hooks.append(lambda: _drop(h))
    return h


@torch.compiler.disable
def unregister(op: Any) -> None:
    """Drop ``op``'s handle; later calls through it raise. No-op when not registered."""
    h = op.__dict__.get(_ATTR) if hasattr(op, "__dict__") else None
    if h is None:
        return
    with _LOCK:
        entry = _REGISTRY.get(h)
        if entry is not None and _deref(entry[0]) is op:
            del _REGISTRY[h]
        else:
            entry = None
        try:
            delattr(op, _ATTR)
        except AttributeError:
            pass
    if entry is not None and entry[1] is not None:
        entry[1].detach()


def _deref(ref: Any) -> Any:
    return ref() if isinstance(ref, weakref.ref) else ref


def lookup(handle: int) -> Any:
    """The live op registered under ``handle``; ``ClosedError`` if there is none."""
    entry = _REGISTRY.get(handle)
    op = _deref(entry[0]) if entry is not None else None
    if op is None:
        raise ClosedError(
            f"{OP_NAME}: handle {handle} names no registered op (never registered, "
            "unregistered, closed, or garbage-collected); pass the handle that "
            "rsar_core.torch_op.register(op) returns")
    return op


# ---------------------------------------------------------------------------- the op
# An explicit schema: inferred, ``handle: int`` would become ``SymInt`` and could be traced
# as a symbol; ``int`` keeps it a constant of every graph.
# ``bias`` comes last, with a default, so calls written before it (x, w, handle) still bind.
@torch.library.custom_op(OP_NAME, mutates_args=(), device_types="cuda",
                         schema="(Tensor x, Tensor w, int handle, Tensor? bias=None) -> Tensor")
def _gemm_rsar(x: torch.Tensor, w: torch.Tensor, handle: int,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """reduce_scatter(x @ w.T) or all_reduce(x @ w.T) (+ bias) by the GemmRsAr behind
    ``handle``."""
    op = lookup(handle)
    # without a bias the op is called as before: registered stand-ins may not take one
    return op(x, w) if bias is None else op(x, w, bias=bias)


@torch.library.custom_op(SCALED_OP_NAME, mutates_args=(), device_types="cuda",
                         schema="(Tensor x, Tensor w, Tensor x_scale, Tensor w_scale, int handle,"
                                " Tensor? bias=None) -> Tensor")
def _gemm_rsar_scaled(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor,
                      w_scale: torch.Tensor, handle: int,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
    """The fp8 op behind ``handle`` on scaled operands (``GemmRsAr.__call__``)."""
    op = lookup(handle)
    if bias is None:
        return op(x, w, x_scale=x_scale, w_scale=w_scale)
    return op(x, w, x_scale=x_scale, w_scale=w_scale, bias=bias)


@_gemm_rsar.register_fake
def _gemm_rsar_fake(x: torch.Tensor, w: torch.Tensor, handle: int,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    return _fake(x, w, handle, scaled=False, bias=bias)


@_gemm_rsar_scaled.register_fake
def _gemm_rsar_scaled_fake(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor,
                           w_scale: torch.Tensor, handle: int,
                           bias: torch.Tensor | None = None) -> torch.Tensor:
    for name, t in (("x_scale", x_scale), ("w_scale", w_scale)):
        if t.dtype != torch.float32:
            raise RsarTypeError(f"{SCALED_OP_NAME}: {name} must be float32, got {t.dtype}")
    return _fake(x, w, handle, scaled=True, bias=bias)


def _fake(x: torch.Tensor, w: torch.Tensor, handle: int, scaled: bool,
          bias: torch.Tensor | None = None) -> torch.Tensor:
    handle = int(handle)
    op = lookup(handle)
    world, N, all_reduce = int(op.world), int(op.N), bool(op.all_reduce)
    if (world, N, all_reduce) != _decode(handle):
        raise ClosedError(f"{OP_NAME}: the op behind handle {handle} changed its world/N/"
                          f"all_reduce since register() to {(world, N, all_reduce)}")
    if x.dim() != 2 or w.dim() != 2:
        raise RsarValueError(f"{OP_NAME}: x and w must be 2-D, got {tuple(x.shape)} and "
                             f"{tuple(w.shape)}")
    torch._check(w.shape[0] == N, lambda: f"{OP_NAME}: w must have N={N} rows, got {w.shape[0]}")
    torch._check(x.shape[1] == w.shape[1],
                 lambda: f"{OP_NAME}: x has K={x.shape[1]} but w has K={w.shape[1]}")
    dtype = op.dtype
    in_dtype = getattr(op, "input_dtype", dtype)
    if scaled != _takes_scales(op):
        raise RsarTypeError(
            f"{SCALED_OP_NAME if scaled else OP_NAME}: the op behind handle {handle} takes "
            + (f"{in_dtype} operands with scales: call {SCALED_OP_NAME}" if not scaled else
               f"{in_dtype} operands without scales: call {OP_NAME}"))
    if x.dtype != in_dtype or w.dtype != in_dtype:
        raise RsarTypeError(f"{OP_NAME}: x and w must be {in_dtype} (the op's input dtype), "
                             f"got {x.dtype} and {w.dtype}")
    if bias is not None:
        if bias.dtype != dtype:
            raise RsarTypeError(f"{OP_NAME}: bias must be {dtype} (the op's result dtype), "
                                f"got {bias.dtype}")
        if bias.dim() != 1:
            raise RsarValueError(f"{OP_NAME}: bias must be 1-D (N={N},), got shape "
                                 f"{tuple(bias.shape)}")
        torch._check(bias.shape[0] == N,
                     lambda: f"{OP_NAME}: bias must have N={N} values, got {bias.shape[0]}")
    M = x.shape[0]
    rows = M if all_reduce else (M + world - 1) // world
    return x.new_empty((rows, N), dtype=dtype)


def _takes_scales(op: Any) -> bool:
    """Whether ``op``'s operands are narrower than its result (fp8): its calls carry scales."""
    return getattr(op, "input_dtype", op.dtype) != op.dtype


def gemm_rsar(x: torch.Tensor, w: torch.Tensor, op: Any,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.ops.rsar.gemm_rsar(x, w, register(op), bias)``.

    Compiles to the bare op once ``op`` is registered. Under torch.compile with an op not
    yet registered, the first trace breaks the graph at register() (fullgraph=True refuses
    it) and the next trace, guarded on the new handle, is whole: register first.
    """
    h = getattr(op, _ATTR, None)
    if h is None:
        h = register(op)
    return torch.ops.rsar.gemm_rsar(x, w, h, bias)


def gemm_rsar_scaled(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor,
                     w_scale: torch.Tensor, op: Any,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.ops.rsar.gemm_rsar_scaled(x, w, x_scale, w_scale, register(op), bias)``, for
    an op built with an fp8 ``input_dtype`` (registration as in ``gemm_rsar``)."""
    h = getattr(op, _ATTR, None)
    if h is None:
        h = register(op)
    return torch.ops.rsar.gemm_rsar_scaled(x, w, x_scale, w_scale, h, bias)


class RowParallelLinear(nn.Module):
    """``y = reduce_scatter(x @ weight.T)`` (RS op) or ``all_reduce(...)`` (AR op).

    ``weight``: this rank's (N, K) shard, of the op's input dtype, on the op's device. Kept
    as a Parameter (``requires_grad=False`` unless a Parameter is passed in); the module
    holds ``op`` alive, so its handle stays valid for the module's life (close the op
    yourself). For an fp8 op, ``weight_scale`` (float32: one value, one per row of
    ``weight``, or block-wise, one per 128 x 128 block: (ceil(N / 128), K / 128)) is kept as
    a buffer and ``forward(x, x_scale)`` takes the activations' scales (one value, one per
    row of x, or with block-wise weights one per row and 128-element k-group: (M, K / 128))
    with the fp8 x they quantized. ``bias``: (N,) of the op's dtype (the result's, fp8 ops
    included), kept as ``weight`` is and added once to the reduced sum; None: no bias (the
    ``bias`` attribute is None, as in nn.Linear(bias=False)).
    """

    def __init__(self, op: Any, weight: torch.Tensor,
                 weight_scale: torch.Tensor | None = None,
                 bias: torch.Tensor | None = None) -> None:
        super().__init__()
        if weight.dim() != 2 or weight.shape[0] != op.N:
            raise RsarValueError(f"weight must be (N={op.N}, K), got {tuple(weight.shape)}")
        if bias is not None and not isinstance(bias, torch.Tensor):
            raise RsarTypeError(f"bias must be a torch.Tensor or None, got "
                                f"{type(bias).__name__}")
        if bias is not None and tuple(bias.shape) != (op.N,):
            raise RsarValueError(f"bias must be (N={op.N},), got {tuple(bias.shape)}")
        self.scaled = _takes_scales(op)
        if self.scaled != (weight_scale is not None):
            raise RsarValueError("weight_scale is for (and needed by) ops with an fp8 "
                                 "input_dtype" if self.scaled else
                                 "weight_scale is for ops with an fp8 input_dtype only")
        self.op = op
        self.handle = register(op)
        self.weight = _parameter(weight)
        self.bias = None if bias is None else _parameter(bias)
        self.register_buffer("weight_scale", weight_scale)

    def forward(self, x: torch.Tensor, x_scale: torch.Tensor | None = None) -> torch.Tensor:
        if self.scaled:
            if x_scale is None:
                raise RsarValueError("an fp8 RowParallelLinear needs x_scale with x")
            return torch.ops.rsar.gemm_rsar_scaled(x, self.weight, x_scale, self.weight_scale,
                                                   self.handle, self.bias)
        if x_scale is not None:
            raise RsarValueError("x_scale is for an fp8 RowParallelLinear only")
        return torch.ops.rsar.gemm_rsar(x, self.weight, self.handle, self.bias)

    def extra_repr(self) -> str:
        mode = "ar" if self.op.all_reduce else "rs"
        return (f"N={self.weight.shape[0]}, K={self.weight.shape[1]}, mode={mode}, "
                f"world={self.op.world}, bias={self.bias is not None}, handle={self.handle}")


def _parameter(t: torch.Tensor) -> nn.Parameter:
    """``t`` as a module parameter: a Parameter as given, else one without a gradient (the
    op has no backward)."""
    return t if isinstance(t, nn.Parameter) else nn.Parameter(t, requires_grad=False)
