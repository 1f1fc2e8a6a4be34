"""When the fused op is expected to beat torch.mm + NCCL (``GemmRsAr.should_run``).

The table holds speedups (unfused time / fused time) that ``scripts/bench.py`` measured on
2x H200 (NV18), 2026-11-30 (o), grid (o2) (RS peers-first from four to eight tile rows at
K <= 4096, on top of (n)'s straight-line reductions, unfenced RS own tiles and one-sub-tile
push windows, (l)'s early result copies, sub-tile-ahead loads, push-all AR at small M and
programmatic dependent launch; each column's calls timed in interleaved blocks), the
lowest over N in {7168, 8192}, so a point runs fused only if it won at every measured N
(docs/PERF.md; printed by ``scripts/heuristics_table.py`` from
docs/perf/grid-2026-11-30o2.json and, for K=2048, docs/perf/k2048-2026-11-30k.json, which
predates every change since (k) and so understates the fused op there). A shape's speedup is interpolated bilinearly in (log2 M,
log2 K) between the measured points around it (clamped to the measured range), and it runs
fused only when that beats the run-to-run noise (3%). Other world sizes use this world-2
table until they are measured. Re-measure and update the table when the kernel or the
machine changes.
"""
from __future__ import annotations

import math

# (M, K) -> (RS speedup, AR speedup), world 2
MEASURED_2X_H200: dict[tuple[int, int], tuple[float, float]] = {
    (128, 1024): (1.31, 1.74), (256, 1024): (1.52, 1.45), (512, 1024): (1.52, 1.42),
    (1024, 1024): (1.56, 1.4), (2048, 1024): (1.66, 1.43), (4096, 1024): (1.9, 1.58),
    (8192, 1024): (2.02, 1.58), (16384, 1024): (2.11, 1.6),
    (128, 2048): (1.21, 1.64), (256, 2048): (1.24, 1.33), (512, 2048): (1.31, 1.36),
    (1024, 2048): (1.32, 1.4), (2048, 2048): (1.42, 1.5), (4096, 2048): (1.57, 1.6),
    (8192, 2048): (1.59, 1.61), (16384, 2048): (1.61, 1.63),
    (128, 4096): (1.21, 1.55), (256, 4096): (1.26, 1.35), (512, 4096): (1.19, 1.34),
    (1024, 4096): (1.27, 1.32), (2048, 4096): (1.27, 1.38), (4096, 4096): (1.32, 1.45),
    (8192, 4096): (1.31, 1.47), (16384, 4096): (1.34, 1.49),
    (128, 9216): (1.12, 1.4), (256, 9216): (1.13, 1.2), (512, 9216): (1.07, 1.15),
    (1024, 9216): (1.13, 1.18), (2048, 9216): (1.14, 1.18), (4096, 9216): (1.15, 1.2),
    (8192, 9216): (1.05, 1.18), (16384, 9216): (1.04, 1.16),
}
MIN_SPEEDUP = 1.03  # above the ~3% run-to-run spread of the benchmark


def _bracket(axis: list[int], v: int) -> tuple[int, int, float]:
    """Neighbours of v on a sorted axis and v's position between them in log2 (0..1)."""
    v = min(max(v, axis[0]), axis[-1])
    hi = next(i for i, a in enumerate(axis) if a >= v)
    lo = max(hi - 1, 0)
    if axis[hi] == axis[lo]:
        return axis[lo], axis[hi], 0.0
    return axis[lo], axis[hi], (math.log2(v) - math.log2(axis[lo])) / (
        math.log2(axis[hi]) - math.log2(axis[lo]))


def expected_speedup(mode: str, M: int, K: int) -> float:
    which = 1 if mode == "ar" else 0
    ms = sorted({m for m, _ in MEASURED_2X_H200})
    ks = sorted({k for _, k in MEASURED_2X_H200})
    m0, m1, fm = _bracket(ms, max(M, 1))
    k0, k1, fk = _bracket(ks, max(K, 1))
    at = lambda m, k: MEASURED_2X_H200[(m, k)][which]  # noqa: E731
    lo = at(m0, k0) * (1 - fm) + at(m1, k0) * fm
    hi = at(m0, k1) * (1 - fm) + at(m1, k1) * fm
    return lo * (1 - fk) + hi * fk


def fused_wins(mode: str, M: int, N: int, K: int, world: int) -> bool:
    return expected_speedup(mode, M, K) > MIN_SPEEDUP
