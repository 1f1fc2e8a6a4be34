"""When the fused op is expected to beat torch.mm + NCCL (``GemmRsAr.should_run``).

The table holds speedups (unfused time / fused time) that ``scripts/bench.py`` measured on
2x H200 (NV18), N=7168, 2026-11-29 (docs/PERF.md). A shape is judged by its nearest
measured point in (log2 M, log2 K); re-measure and update the table when the kernel or the
machine changes.
"""
from __future__ import annotations

import math

# (M, K) -> (RS speedup, AR speedup), world 2
MEASURED_2X_H200: dict[tuple[int, int], tuple[float, float]] = {
    (128, 1024): (1.96, 2.12), (512, 1024): (1.35, 1.50), (2048, 1024): (1.24, 1.22),
    (4096, 1024): (1.49, 1.34), (8192, 1024): (1.48, 1.32),
    (128, 4096): (1.92, 1.94), (512, 4096): (1.28, 1.19), (2048, 4096): (1.03, 1.14),
    (4096, 4096): (1.19, 1.17), (8192, 4096): (1.04, 1.07),
}
MIN_SPEEDUP = 1.0


def expected_speedup(mode: str, M: int, K: int) -> float:
    lm, lk = math.log2(max(M, 1)), math.log2(max(K, 1))
    (m, k), ratios = min(MEASURED_2X_H200.items(),
                         key=lambda kv: (math.log2(kv[0][0]) - lm) ** 2 + (math.log2(kv[0][1]) - lk) ** 2)
    return ratios[1] if mode == "ar" else ratios[0]


def fused_wins(mode: str, M: int, N: int, K: int, world: int) -> bool:
    return expected_speedup(mode, M, K) > MIN_SPEEDUP
