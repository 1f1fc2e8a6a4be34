"""Dynamic fp8 (float8_e4m3fn) quantization of the operands GemmRsAr takes with scales.

Each row, 128-element group or 128 x 128 block is scaled so that its largest magnitude maps to
fp8's largest finite value, and returns with its float32 scales in the layout GemmRsAr (and
torch's scaled matmul) takes: t ~= q.float() * scale, broadcast over what each scale covers.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .validate import SCALE_BLOCK_K as BLOCK

FP8_MAX = 448.0  # float8_e4m3fn's largest finite value
# An all-zero row or block would divide by zero; any positive scale quantizes it to zeros.
_MIN_SCALE = 1e-12
SCALE_MODES = ("row", "block")

Quantizer = Callable[[torch.Tensor], "tuple[torch.Tensor, torch.Tensor]"]


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(t as fp8, its (rows, 1) float32 scales): one scale per row (per token for
    activations, per output channel for weights)."""
    scale = (t.abs().amax(dim=1, keepdim=True).float() / FP8_MAX).clamp_min(_MIN_SCALE)
    return (t.float() / scale).to(torch.float8_e4m3fn), scale


def quantize_groups(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(t as fp8, its (rows, cols / 128) float32 scales): one scale per row and 128-element
    group of columns (DeepSeek-style activations). The scales are M-major, strides
    (1, rows): torch's BlockWise1x128 layout, which GemmRsAr takes too."""
    M, K = t.shape
    if K % BLOCK:
        raise ValueError(f"block-wise scales need columns a multiple of {BLOCK}, got {K}")
    g = t.float().reshape(M, K // BLOCK, BLOCK)
    scale = (g.abs().amax(dim=2) / FP8_MAX).clamp_min(_MIN_SCALE)
    q = (g / scale.unsqueeze(2)).reshape(M, K).to(torch.float8_e4m3fn)
    return q, scale.t().contiguous().t()


def quantize_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(w as fp8, its (ceil(N / 128), K / 128) float32 scales, row-major): one scale per
    128 x 128 block of w (N, K) (block-wise weights). Where N is not a multiple of 128 the
    last block row covers the rows there are."""
    N, K = w.shape
    if K % BLOCK:
        raise ValueError(f"block-wise scales need K a multiple of {BLOCK}, got {K}")
    nb, kb = -(-N // BLOCK), K // BLOCK
    # zero rows past N leave the last block row's amax that of the rows there are
    b = F.pad(w.float(), (0, 0, 0, nb * BLOCK - N)).reshape(nb, BLOCK, kb, BLOCK)
    scale = (b.abs().amax(dim=(1, 3)) / FP8_MAX).clamp_min(_MIN_SCALE)
    q = (b / scale[:, None, :, None]).reshape(nb * BLOCK, K)[:N]
    return q.to(torch.float8_e4m3fn).contiguous(), scale.contiguous()


def quantizers(scales: str = "row") -> tuple[Quantizer, Quantizer]:
    """(quantize activations, quantize weights) for a scale mode of ``SCALE_MODES``: per row
    and per output channel, or per row and 128-group and per 128 x 128 block."""
    if scales == "row":
        return quantize_rows, quantize_rows
    if scales == "block":
        return quantize_groups, quantize_blocks
    raise ValueError(f"scales must be one of {SCALE_MODES}, got {scales!r}")
