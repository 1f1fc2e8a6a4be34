"""Argument checks of GemmRsAr: every one runs before any launch and names its limit."""
from __future__ import annotations

from typing import Any, Iterable

import torch

from launch.geometry import BLACKWELL, N_ALIGN
from launch.tuning import Tuning

from .errors import RsarTypeError, RsarValueError, UnsupportedError

MAX_WORLD = 16
K_ALIGN = 64
K_ALIGN_FP8 = 128  # an fp8 k-block (launch.comm_warps.BK_BYTES)
SM100_N_ALIGN = 128
# Lets ranks share a GPU (check_one_gpu_per_rank): functional tests on a one-GPU host.
SHARED_GPU_ENV = "RSAR_ALLOW_SHARED_GPU"


def check_tuning(tuning: Any, bootstrap: Any) -> Tuning:
    """``tuning`` (None: ``Tuning()``), the same on every rank of ``bootstrap``: a variant
    compiled on one rank and not another would leave the other's launch waiting. Collective;
    every rank sees every rank's value, so all raise together or none does."""
    if tuning is None:
        tuning = Tuning()
    if not isinstance(tuning, Tuning):
        raise RsarTypeError(f"tuning must be a rsar Tuning (or None), got "
                            f"{type(tuning).__name__}")
    mine = tuning.describe()
    seen = [b.decode() for b in bootstrap.allgather(mine.encode())]
    if any(t != seen[0] for t in seen):
        by_rank = "; ".join(f"rank {r}: {t}" for r, t in enumerate(seen))
        raise RsarValueError(f"every rank must build the op with the same tuning, got {by_rank}")
    return tuning


def agree_hardware(bootstrap: Any, arch: str | None, sm_count: int,
                   pair_ctas: int) -> tuple[str | None, int, int]:
    """The (arch, SMs, CTAs resident as 2x1 clusters) every rank of ``bootstrap`` plans on.

    A fused call's plan (its grid, tile order and rounds) must be one plan on every rank, or
    a rank waits on a tile its peer never sends; boards of one model can differ in their GPC
    layout (H100s hold 30 or 32 4x1 clusters, PERF.md (be)), so each rank's counts are
    gathered and the least taken. Collective; ranks on different archs all raise together."""
    mine = f"{arch or '-'} {int(sm_count)} {int(pair_ctas)}".encode()
    seen = [b.decode().split() for b in bootstrap.allgather(mine)]
    if any(a != seen[0][0] for a, _, _ in seen):
        by_rank = "; ".join(f"rank {r}: {a}" for r, (a, _, _) in enumerate(seen))
        raise UnsupportedError(f"every rank must run on one GPU architecture, got {by_rank}")
    return arch, min(int(s) for _, s, _ in seen), min(int(p) for _, _, p in seen)


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


# torch dtype -> the kernels' name of operand types narrower than the output
# (``launch.comm_warps.IN_DTYPES``): x and w of such an op come with scales
IN_DTYPES = {torch.float8_e4m3fn: "e4m3"}


def check_input_dtype(input_dtype: Any, dtype: torch.dtype) -> str:
    """The kernels' name of an op's operand type: "" where x and w are of the op's
    ``dtype``, "e4m3" for float8_e4m3fn operands (scaled, results in ``dtype``)."""
    if input_dtype is None or input_dtype == dtype:
        return ""
    if input_dtype not in IN_DTYPES:
        raise RsarTypeError(f"input_dtype must be None (x and w of dtype {dtype}) or "
                            f"torch.float8_e4m3fn, got {input_dtype!r}")
    return IN_DTYPES[input_dtype]


def k_align(input_dtype: str) -> int:
    """K's multiple: one k-block of the operand type (64 bf16 / fp16, 128 fp8 elements)."""
    return K_ALIGN_FP8 if input_dtype else K_ALIGN


def _scale_rows(name: str, s: Any, n: int, what: str, device: torch.device) -> int:
    """1 where ``s`` holds one fp32 scale per ``what`` (n of them), 0 where it holds one for
    the whole tensor."""
    _scale_tensor(name, s, device)
    if not s.is_contiguous():
        raise RsarValueError(f"{name} must be contiguous, got strides {s.stride()}")
    shape = tuple(s.shape)
    if s.numel() == 1 and len(shape) <= 2:
        return 0
    if len(shape) <= 2 and s.numel() == n and max(shape) == n:
        return 1
    raise RsarValueError(f"{name} must hold one scale (shape () or (1,)), block-wise ones "
                         f"with the other scale's (x: (M, K / 128), w: (ceil(N / 128), "
                         f"K / 128)), or one per {what} ((n,), (n, 1) or (1, n) with n={n}), "
                         f"got shape {shape}")


# ``check_scales``' bits beyond the per-row flags (0, 1): block-wise scales, x's M-major,
# w's column-major; x's block scale stride above SCALE_STRIDE_SHIFT
# (``launch.fp8_scales.Fp8Scales._block_strides``)
SCALE_BLOCK, SCALE_X_MMAJOR, SCALE_W_COLMAJOR = 4, 8, 16
SCALE_STRIDE_SHIFT = 8
# the k-group of block-wise scales, and the w block's rows
SCALE_BLOCK_K = 128


def _scale_tensor(name: str, s: Any, device: torch.device) -> None:
    """A scale tensor's type, dtype and device, whatever its form."""
    if not isinstance(s, torch.Tensor):
        raise RsarTypeError(f"{name} must be a torch.Tensor of float32 scales, got "
                            f"{type(s).__name__}")
    if s.dtype != torch.float32:
        raise RsarTypeError(f"{name} must be float32, got {s.dtype}")
    if s.device != device:
        raise RsarValueError(f"{name} must be on {device}, got {s.device}")


def _block_bits(x_scale: torch.Tensor, w_scale: torch.Tensor, M: int, nb: int, kb: int) -> int:
    """The bits of block-wise scales: x's (M, kb) row-major or M-major (torch's layout,
    stride (1, S) with S >= M), w's (nb, kb) row-major or column-major."""
    if x_scale.dim() != 2 or tuple(x_scale.shape) != (M, kb):
        raise RsarValueError(
            f"w_scale is block-wise ({nb} x {kb}: one per 128 x 128 block of w), so x_scale "
            f"must be too: one per row of x and 128-element k-group, shape ({M}, {kb}), got "
            f"{tuple(x_scale.shape)}")
    bits = SCALE_BLOCK
    if x_scale.is_contiguous():
        stride = kb
    elif x_scale.stride(0) == 1 and x_scale.stride(1) >= M:
        bits |= SCALE_X_MMAJOR
        stride = x_scale.stride(1)
    else:
        raise RsarValueError(f"x_scale ({M}, {kb}) must be row-major or M-major (strides "
                             f"({kb}, 1) or (1, S) with S >= {M}), got {x_scale.stride()}")
    if stride >= 1 << (31 - SCALE_STRIDE_SHIFT):
        raise RsarValueError(f"x_scale's stride {stride} is too large for the kernel "
                             f"(at most {(1 << (31 - SCALE_STRIDE_SHIFT)) - 1})")
    if not w_scale.is_contiguous():
        if w_scale.stride() != (1, nb):
            raise RsarValueError(f"w_scale ({nb}, {kb}) must be dense, row-major or "
                                 f"column-major, got strides {w_scale.stride()}")
        bits |= SCALE_W_COLMAJOR
    return bits | stride << SCALE_STRIDE_SHIFT


def check_scales(x_scale: Any, w_scale: Any, M: int, N: int, device: torch.device,
                 input_dtype: str, K: int = 0) -> int:
    """The kernel's scale bits of a call (bit 0: x's scale per row, bit 1: w's per output
    column; ``SCALE_BLOCK`` and the bits above it: block-wise scales, DeepSeek-style, x's
    per row and 128-element k-group, w's per 128 x 128 block): fp8 ops need both scales,
    others take none. ``K``: the call's depth (block-wise scales are recognised with it)."""
    if not input_dtype:
        if x_scale is not None or w_scale is not None:
            raise RsarValueError("x_scale / w_scale are for fp8 operands: this op's x and w are "
                                 "its dtype (build it with input_dtype=torch.float8_e4m3fn)")
        return 0
    if x_scale is None or w_scale is None:
        raise RsarValueError("an fp8 op needs x_scale and w_scale (float32: one value, or one "
                             "per row of x / per row of w, or block-wise), as torch._scaled_mm "
                             "does")
    _scale_tensor("x_scale", x_scale, device)
    _scale_tensor("w_scale", w_scale, device)
    kb, nb = K // SCALE_BLOCK_K, -(-N // SCALE_BLOCK_K)
    if K and w_scale.dim() == 2 and w_scale.numel() > 1 and tuple(w_scale.shape) == (nb, kb):
        return _block_bits(x_scale, w_scale, M, nb, kb)
    if K and kb > 1 and x_scale.dim() == 2 and tuple(x_scale.shape) == (M, kb):
        raise RsarValueError(
            f"x_scale is block-wise ({M} x {kb}: one per row and 128-element k-group), so "
            f"w_scale must be too: one per 128 x 128 block of w, shape ({nb}, {kb}), got "
            f"{tuple(w_scale.shape)}")
    return (_scale_rows("x_scale", x_scale, M, "row of x", device)
            | _scale_rows("w_scale", w_scale, N, "row of w (output column)", device) << 1)


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
        other = ""
        if t.dtype in DTYPES and name != "out":
            other = (f"; an op for such inputs is built with dtype={t.dtype}"
                     + (" and input_dtype=None" if dtype in IN_DTYPES else ""))
        elif t.dtype in IN_DTYPES and name != "out":
            other = f"; an op for such inputs is built with input_dtype={t.dtype}"
        role = "input_dtype" if dtype in IN_DTYPES else "dtype"
        raise RsarTypeError(f"{name} must be {str(dtype).removeprefix('torch.')} (this op's "
                            f"{role}), got {t.dtype}{other}")
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
    """``dtype``: the operands' (the op's input dtype)."""
    _check_matrix("w", w, device, dtype)
    n, k = w.shape
    if n != N:
        raise RsarValueError(f"w must have N={N} rows (w is (N, K)), got {n}")
    align = k_align(IN_DTYPES.get(dtype, ""))
    if k <= 0 or k % align:
        fp8 = " for fp8 operands" if align != K_ALIGN else ""
        raise RsarValueError(f"K must be a positive multiple of {align}{fp8}, got K={k}")


def check_call(x: Any, w: Any, max_M: int, N: int, device: torch.device,
               dtype: torch.dtype = torch.bfloat16) -> None:
    """``dtype``: the operands' (the op's input dtype)."""
    _check_matrix("x", x, device, dtype)
    w = weight_of(w)
    check_weight(w, N, device, dtype)
    m, k = x.shape
    if not 0 < m <= max_M:
        raise RsarValueError(f"M must be in 1..max_M={max_M}, got M={m}")
    if k != w.shape[1]:
        raise RsarValueError(f"x has K={k} but w has K={w.shape[1]}")


def check_bias(bias: Any, N: int, device: torch.device, dtype: torch.dtype) -> None:
    """``bias=`` of a call: N values of the op's result ``dtype``, added once to the reduced
    sum in fp32 (the kernel reads them as one dense row). A bias that requires grad is
    accepted, as x and w are: the result's backward raises (``inference_only``)."""
    if not isinstance(bias, torch.Tensor):
        raise RsarTypeError(f"bias must be a torch.Tensor, got {type(bias).__name__}")
    if bias.dtype != dtype:
        raise RsarTypeError(f"bias must be {str(dtype).removeprefix('torch.')} (this op's "
                            f"result dtype), got {bias.dtype}")
    if tuple(bias.shape) != (N,):
        raise RsarValueError(f"bias must have shape ({N},) (one value per output column), "
                             f"got {tuple(bias.shape)}")
    if bias.device != device:
        raise RsarValueError(f"bias must be on {device}, got {bias.device}")
    if not bias.is_contiguous():
        raise RsarValueError(f"bias must be contiguous, got stride {bias.stride()}")
    if bias.data_ptr() % 16:  # as x, w and out: the kernel may read it in 16-byte pieces
        raise RsarValueError("bias must start on a 16-byte boundary (got a view at an odd "
                             "offset)")


def check_warmup(Ms: Iterable[Any], K: Any, max_M: int, input_dtype: str = "") -> list[int]:
    """``warmup``'s shapes as ints, each M in 1..max_M and K a positive multiple of the
    operand type's k-block (the limits ``check_call`` puts on a call's tensors)."""
    Ms = list(Ms)
    for M in Ms:
        if isinstance(M, bool) or not isinstance(M, int) or not 0 < M <= max_M:
            raise RsarValueError(f"warmup: M must be an int in 1..max_M={max_M}, got {M!r}")
    align = k_align(input_dtype)
    if isinstance(K, bool) or not isinstance(K, int) or K <= 0 or K % align:
        raise RsarValueError(f"warmup: K must be a positive multiple of {align}, got {K!r}")
    return Ms


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def check_out(out: Any, shape: tuple[int, int], device: torch.device, x: torch.Tensor,
              w: torch.Tensor, dtype: torch.dtype | None = None,
              extra: tuple[tuple[str, Any], ...] = ()) -> None:
    """``out=`` of a call: where the kernel writes the result, so the same rules as the
    inputs, of the op's ``dtype`` (default: x's), the call's result shape, and no byte
    shared with x, w or the (name, tensor) pairs of ``extra`` (fp8 scales, bias; None
    skipped):
    the kernel reads them while it writes."""
    _check_matrix("out", out, device, x.dtype if dtype is None else dtype)
    if tuple(out.shape) != shape:
        raise RsarValueError(f"out must have shape {shape} for this call, got {tuple(out.shape)}")
    if torch.is_grad_enabled() and out.requires_grad:
        raise RsarValueError("out must not require grad (the op is for inference)")
    lo, hi = _byte_range(out)
    for name, t in (("x", x), ("w", w), *((n, t) for n, t in extra if t is not None)):
        a, b = _byte_range(t)
        if lo < b and a < hi:
            raise RsarValueError(f"out overlaps {name}: the kernel reads {name} while it "
                                 f"writes out")
