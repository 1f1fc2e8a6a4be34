"""The float32 reference the tests and the benchmark compare against.

Each rank's inputs come from a seeded generator, so any rank can rebuild every rank's
x_r and w_r and form sum_r x_r @ w_r.T without moving them between processes.
"""
from __future__ import annotations

import torch


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
                    per_row: bool = True) -> tuple[torch.Tensor, ...]:
    """(x, w, x_scale, w_scale) of one rank for an fp8 op: float8_e4m3fn operands of unit
    spread and float32 scales around 1 (x) and K^-1/2 (w), one per row of x / of w where
    ``per_row``, else one each."""
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1013 + rank)
    x = torch.randn(M, K, generator=g, device=device).to(torch.float8_e4m3fn)
    w = torch.randn(N, K, generator=g, device=device).to(torch.float8_e4m3fn)
    shape_x, shape_w = ((M, 1), (N,)) if per_row else ((), ())
    sx = 0.75 + 0.5 * torch.rand(shape_x, generator=g, device=device)
    sw = (0.75 + 0.5 * torch.rand(shape_w, generator=g, device=device)) * K ** -0.5
    return x, w, sx, sw


def scaled_product(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor,
                   w_scale: torch.Tensor) -> torch.Tensor:
    """(x_scale * x) @ (w_scale * w).T in float64: what an fp8 op's rank contributes."""
    xs = x.double() * x_scale.double().reshape(-1, 1)
    ws = w.double() * w_scale.double().reshape(-1, 1)
    return xs @ ws.T


def scaled_mm(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
              out_dtype: torch.dtype = torch.bfloat16,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """torch._scaled_mm(x, w.T) with fast accumulation, on an fp8 op's operands and scales
    in the shapes GemmRsAr takes (one value each, or one per row of x / of w): the fp8
    anchor of the benchmarks and tests, accumulating as the kernel's tensor cores do."""
    a = x_scale.reshape(-1, 1) if x_scale.numel() > 1 else x_scale
    b = w_scale.reshape(1, -1) if w_scale.numel() > 1 else w_scale
    kw = {} if out is None else {"out": out}
    return torch._scaled_mm(x, w.t(), scale_a=a, scale_b=b, out_dtype=out_dtype,
                            use_fast_accum=True, **kw)


def reference_fp8_sum(seed: int, world: int, M: int, N: int, K: int, device: torch.device,
                      per_row: bool = True) -> torch.Tensor:
    """sum_r of ``scaled_product`` over every rank's ``rank_fp8_inputs``, in float64."""
    acc = torch.zeros(M, N, dtype=torch.float64, device=device)
    for r in range(world):
        acc += scaled_product(*rank_fp8_inputs(seed, r, M, N, K, device, per_row))
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
