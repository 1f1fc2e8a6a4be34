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
