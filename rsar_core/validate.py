"""Argument checks of GemmRsAr: every one runs before any launch and names its limit."""
from __future__ import annotations

from typing import Any, Iterable

import torch

from launch.plan import BLACKWELL, N_ALIGN

from .errors import RsarTypeError, RsarValueError, UnsupportedError

MAX_WORLD = 16
K_ALIGN = 64
SM100_N_ALIGN = 128
# Lets ranks share a GPU (check_one_gpu_per_rank): functional tests on a one-GPU host.
SHARED_GPU_ENV = "RSAR_ALLOW_SHARED_GPU"


def check_construction(max_M: int, N: int, world: int) -> None:
    for name, v in (("max_M", max_M), ("N", N)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise RsarTypeError(f"{name} must be an int, got {type(v).__name__}")
    if not 1 < world <= MAX_WORLD:
        hint = (" (one process: launch the workers with mpirun -n N, or pass their "
                "torch.distributed ProcessGroup as comm)") if world == 1 else ""
        raise RsarValueError(f"world size must be in 2..{MAX_WORLD}, got {world}{hint}")
    if 128 % world:
        raise RsarValueError(f"128 must be divisible by the world size, got world={world}")
    if max_M < 1:
        raise RsarValueError(f"max_M must be >= 1, got {max_M}")
    if N <= 0 or N % N_ALIGN:
        raise RsarValueError(f"N must be a positive multiple of {N_ALIGN} (16-byte output "
                             f"rows), got {N}")


# torch dtype -> the kernels' element type name (``launch.comm_warps.DTYPES``)
DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}


def check_dtype(dtype: Any) -> str:
    """The kernels' name of an op's element type: bfloat16 or float16."""
    if dtype not in DTYPES:
        raise RsarTypeError(f"dtype must be torch.bfloat16 or torch.float16, got {dtype!r}")
    return DTYPES[dtype]


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a kernel element type name (the scripts' ``--dtype``)."""
    return {v: k for k, v in DTYPES.items()}[name]


def check_arch_width(N: int, arch: str | None) -> None:
    """Blackwell's kernel runs whole tiles only (sm90 plans take a partial last tile
    column): N a multiple of 128 there."""
    if arch in BLACKWELL and N % SM100_N_ALIGN:
        raise UnsupportedError(f"N={N}: the {arch} kernel needs N a multiple of "
                               f"{SM100_N_ALIGN} (partial tiles at N's edge are sm90's so far)")


def check_one_gpu_per_rank(gpus: list[str], allow_shared: bool = False) -> str | None:
    """``gpus``: every rank's GPU identity (host and UUID), in rank order; "" where unknown.

    The fused kernel waits on peers' pushes with every rank's persistent grid resident. Two
    ranks on one GPU cannot both be resident: the GPU time-slices their processes, and each
    wait lasts a slice (one H200: ~4 ms a call instead of 20-200 us). Under MPS the grids
    would share the SMs and could wait on each other forever. Raises ValueError, or with
    ``allow_shared`` (functional tests on a one-GPU host) returns the message for a warning."""
    first: dict[str, int] = {}
    for rank, gpu in enumerate(gpus):
        if not gpu:
            continue
        if gpu in first:
            why = (f"ranks {first[gpu]} and {rank} are on the same GPU ({gpu}): rsar needs one "
                   f"GPU per rank")
            if allow_shared:
                return (why + f"; {SHARED_GPU_ENV}=1 lets them share it, each call taking "
                        f"milliseconds (functional tests only; not under MPS)")
            raise RsarValueError(why + ". Select each rank's device before constructing, e.g. "
                                 f"torch.cuda.set_device(local_rank) ({SHARED_GPU_ENV}=1 lets "
                                 f"ranks share a GPU, slowly, for functional tests)")
        first[gpu] = rank
    return None


def weight_of(w: Any) -> Any:
    """Accept a tensor or a module-like object holding ``.weight``."""
    if isinstance(w, torch.Tensor):
        return w
    inner = getattr(w, "weight", None)
    if isinstance(inner, torch.Tensor):
        return inner
    return w


def _check_matrix(name: str, t: Any, device: torch.device, dtype: torch.dtype) -> None:
    if not isinstance(t, torch.Tensor):
        raise RsarTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        other = (f"; an op for such inputs is built with dtype={t.dtype}"
                 if t.dtype in DTYPES else "")
        raise RsarTypeError(f"{name} must be {str(dtype).removeprefix('torch.')} (this op's "
                            f"dtype), got {t.dtype}{other}")
    if t.dim() != 2:
        raise RsarValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    if t.device != device:
        raise RsarValueError(f"{name} must be on {device}, got {t.device}")
    if not t.is_contiguous():
        raise RsarValueError(f"{name} must be contiguous (row-major), got strides {t.stride()}")
    if t.data_ptr() % 16:
        raise RsarValueError(
            f"{name} must start on a 16-byte boundary (got a view at an odd offset)")


def check_weight(w: torch.Tensor, N: int, device: torch.device,
                 dtype: torch.dtype = torch.bfloat16) -> None:
    _check_matrix("w", w, device, dtype)
    n, k = w.shape
    if n != N:
        raise RsarValueError(f"w must have N={N} rows (w is (N, K)), got {n}")
    if k <= 0 or k % K_ALIGN:
        raise RsarValueError(f"K must be a positive multiple of {K_ALIGN}, got K={k}")


def check_call(x: Any, w: Any, max_M: int, N: int, device: torch.device,
               dtype: torch.dtype = torch.bfloat16) -> None:
    _check_matrix("x", x, device, dtype)
    w = weight_of(w)
    check_weight(w, N, device, dtype)
    m, k = x.shape
    if not 0 < m <= max_M:
        raise RsarValueError(f"M must be in 1..max_M={max_M}, got M={m}")
    if k != w.shape[1]:
        raise RsarValueError(f"x has K={k} but w has K={w.shape[1]}")


def check_warmup(Ms: Iterable[Any], K: Any, max_M: int) -> list[int]:
    """``warmup``'s shapes as ints, each M in 1..max_M and K a positive multiple of K_ALIGN
    (the limits ``check_call`` puts on a call's tensors)."""
    Ms = list(Ms)
    for M in Ms:
        if isinstance(M, bool) or not isinstance(M, int) or not 0 < M <= max_M:
            raise RsarValueError(f"warmup: M must be an int in 1..max_M={max_M}, got {M!r}")
    if isinstance(K, bool) or not isinstance(K, int) or K <= 0 or K % K_ALIGN:
        raise RsarValueError(f"warmup: K must be a positive multiple of {K_ALIGN}, got {K!r}")
    return Ms


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def check_out(out: Any, shape: tuple[int, int], device: torch.device, x: torch.Tensor,
              w: torch.Tensor) -> None:
    """``out=`` of a call: where the kernel writes the result, so the same rules as the
    inputs (their dtype too), the call's result shape, and no byte shared with x or w (the
    kernel reads them while it writes)."""
    _check_matrix("out", out, device, x.dtype)
    if tuple(out.shape) != shape:
        raise RsarValueError(f"out must have shape {shape} for this call, got {tuple(out.shape)}")
    if torch.is_grad_enabled() and out.requires_grad:
        raise RsarValueError("out must not require grad (the op is for inference)")
    lo, hi = _byte_range(out)
    for name, t in (("x", x), ("w", w)):
        a, b = _byte_range(t)
        if lo < b and a < hi:
            raise RsarValueError(f"out overlaps {name}: the kernel reads {name} while it "
                                 f"writes out")
