"""The float32 reference the tests and the benchmark compare against.

Each rank's inputs come from a seeded generator, so any rank can rebuild every rank's
x_r and w_r and form sum_r x_r @ w_r.T without moving them between processes.
"""
from __future__ import annotations

import torch

from .validate import SCALE_BLOCK_K as BLOCK  # block-wise fp8 scales' k-group and w block


def rank_inputs(seed: int, rank: int, M: int, N: int, K: int, device: torch.device,
                scale: float = 1.0, dtype: torch.dtype = torch.bfloat16
                ) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1009 + rank)
    x = (torch.randn(M, K, generator=g, device=device) * scale).to(dtype)
    w = (torch.randn(N, K, generator=g, device=device) * (K ** -0.5)).to(dtype)
    return x, w


def reference_sum(seed: int, world: int, M: int, N: int, K: int,
                  device: torch.device, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """sum_r x_r @ w_r.T in float32 over every rank's ``rank_inputs`` (rounded to ``dtype``)."""
    acc = torch.zeros(M, N, dtype=torch.float32, device=device)
    for r in range(world):
        x, w = rank_inputs(seed, r, M, N, K, device, dtype=dtype)
        acc += x.float() @ w.float().T
    return acc


def rank_fp8_inputs(seed: int, rank: int, M: int, N: int, K: int, device: torch.device,
                    per_row: bool = True, block: bool = False,
                    m_major: bool = False) -> tuple[torch.Tensor, ...]:
    """(x, w, x_scale, w_scale) of one rank for an fp8 op: float8_e4m3fn operands of unit
    spread and float32 scales around 1 (x) and K^-1/2 (w), one per row of x / of w where
    ``per_row``, else one each; with ``block``, DeepSeek-style block-wise scales: x's per
    row and 128-element k-group, (M, K / 128), w's per 128 x 128 block, (ceil(N / 128),
    K / 128), both row-major (x's M-major with ``m_major``: torch's BlockWise1x128 layout,
    which the benchmarks give both kernels), spread over 2^-4..2^5 so that a scale applied
    to the wrong block shows."""
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1013 + rank)
    x = torch.randn(M, K, generator=g, device=device).to(torch.float8_e4m3fn)
    w = torch.randn(N, K, generator=g, device=device).to(torch.float8_e4m3fn)
    if block:
        kb = K // BLOCK
        sx = torch.exp2(torch.randint(-4, 5, (M, kb), generator=g, device=device).float()
                        + torch.rand(M, kb, generator=g, device=device))
        nb = -(-N // BLOCK)
        sw = torch.exp2(torch.randint(-4, 5, (nb, kb), generator=g, device=device).float()
                        + torch.rand(nb, kb, generator=g, device=device)) * K ** -0.5
        if m_major:
            sx = sx.t().contiguous().t()
        return x, w, sx, sw
    shape_x, shape_w = ((M, 1), (N,)) if per_row else ((), ())
    sx = 0.75 + 0.5 * torch.rand(shape_x, generator=g, device=device)
    sw = (0.75 + 0.5 * torch.rand(shape_w, generator=g, device=device)) * K ** -0.5
    return x, w, sx, sw


def is_block_scaled(w: torch.Tensor, w_scale: torch.Tensor) -> bool:
    """Whether ``w_scale`` is block-wise: (ceil(N / 128), K / 128), not one value or one
    per row of w."""
    N, K = w.shape
    return (w_scale.dim() == 2 and w_scale.numel() > 1
            and tuple(w_scale.shape) == (-(-N // BLOCK), K // BLOCK))


def scaled_product(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor,
                   w_scale: torch.Tensor) -> torch.Tensor:
    """(x_scale * x) @ (w_scale * w).T in float64: what an fp8 op's rank contributes (scales
    one each, one per row, or block-wise, each broadcast over the elements it scales)."""
    if is_block_scaled(w, w_scale):
        N = w.shape[0]
        xs = x.double() * x_scale.double().repeat_interleave(BLOCK, dim=1)
        full_w = w_scale.double().repeat_interleave(BLOCK, dim=0)[:N]
        ws = w.double() * full_w.repeat_interleave(BLOCK, dim=1)
        return xs @ ws.T
    xs = x.double() * x_scale.double().reshape(-1, 1)
    ws = w.double() * w_scale.double().reshape(-1, 1)
    return xs @ ws.T


def scaled_mm(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
              out_dtype: torch.dtype = torch.bfloat16,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """torch._scaled_mm(x, w.T) with fast accumulation, on an fp8 op's operands and scales
    in the shapes GemmRsAr takes (one value each, or one per row of x / of w): the fp8
    anchor of the benchmarks and tests, accumulating as the kernel's tensor cores do.
    Block-wise scales go to ``torch.nn.functional.scaled_mm`` (BlockWise1x128 x
    BlockWise128x128, in the layouts it takes: x's M-major, w's as a view), which promotes
    each k-group's products to fp32 as the kernel does; it has no ``out``, so ``out`` is
    then filled by a copy (a benchmark times it without ``out``)."""
    if is_block_scaled(w, w_scale):
        import torch.nn.functional as F
        st = F.ScalingType
        a = x_scale  # (M, K / 128), stride (1, M): a copy unless it is so already
        if x_scale.stride() != (1, x_scale.shape[0]):
            a = x_scale.t().contiguous().t()
        y = F.scaled_mm(x, w.t(), a, st.BlockWise1x128, w_scale.t(), st.BlockWise128x128,
                        output_dtype=out_dtype)
        if out is not None:
            out.copy_(y)
            return out
        return y
    a = x_scale.reshape(-1, 1) if x_scale.numel() > 1 else x_scale
    b = w_scale.reshape(1, -1) if w_scale.numel() > 1 else w_scale
    kw = {} if out is None else {"out": out}
    return torch._scaled_mm(x, w.t(), scale_a=a, scale_b=b, out_dtype=out_dtype,
                            use_fast_accum=True, **kw)


def call_refusal(fn, *args) -> str | None:
    """None where ``fn(*args)`` runs, else why not ("Type: first line of the message"): how
    the benchmarks probe an anchor once per shape (torch's block-wise scaled_mm refuses some
    shapes and builds) and report it n/a there instead of stopping."""
    try:
        fn(*args)
    except Exception as e:  # any refusal: the anchor is n/a, the caller goes on
        msg = str(e).strip().splitlines()
        return f"{type(e).__name__}: {msg[0] if msg else ''}"
    return None


def reference_fp8_sum(seed: int, world: int, M: int, N: int, K: int, device: torch.device,
                      per_row: bool = True, block: bool = False) -> torch.Tensor:
    """sum_r of ``scaled_product`` over every rank's ``rank_fp8_inputs``, in float64."""
    acc = torch.zeros(M, N, dtype=torch.float64, device=device)
    for r in range(world):
        acc += scaled_product(*rank_fp8_inputs(seed, r, M, N, K, device, per_row, block))
    return acc


def rs_rows(full: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """The RS shard of a full (M, N) result: padded to a multiple of world, rows of rank."""
    M, N = full.shape
    padded = -(-M // world) * world
    local = padded // world
    out = torch.zeros(padded, N, dtype=full.dtype, device=full.device)
    out[:M] = full
    return out[rank * local:(rank + 1) * local]


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    got = got.float()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))
