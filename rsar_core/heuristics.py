"""When the fused op is expected to beat torch.mm + NCCL (``GemmRsAr.should_run``).

The table holds speedups (unfused time / fused time) that ``scripts/bench.py`` measured on
2x H200 (NV18), the lowest over N in {7168, 8192} and over the runs given, so a point runs
fused only if it won at every measured N: the grid's M (powers of two, 128-16384) at K 1024 /
4096 / 9216 from grids (o2) and (p) (docs/perf/grid-2026-11-30o2.json, -p.json), K=2048 at
those M from (k) (docs/perf/k2048-2026-11-30k.json, before every change since, so it
understates the fused op there), and M between them, multiples of 64 up to 1920 and 2560 /
3072 / 3584 / 6144, at K 1024-9216 (docs/PERF.md (p), docs/perf/dense-m-2026-11-30p-*.json),
M 576-1408 again after the flat peers-first rule and M 320-1152 at K 4096 / 9216 after the
split-K tail rule (docs/PERF.md (q), docs/perf/flat-rule-2026-11-30q-*.json, then
split-k-tail-2026-11-30q-*.json), and M 1088 / 1152 after RS split its shared tile row there
(docs/PERF.md (r), the M 1088 and 1152 rows of docs/perf/split-row-2026-11-30r-*.json),
each group after a ``--newer``. Printed by
``benchmarks/heuristics_table.py`` from those files. To re-measure the points off the
grid:

    mpirun -n 2 python3 scripts/bench.py --plan-sweep --only mm_rs,rsar_rs,mm_ar,rsar_ar \
        --N 7168 8192 --K 1024 2048 4096 9216 --M 192 320 384 448 576 640 704 768 832 896 \
        960 1152 1280 1408 1536 1664 1792 1920 2560 3072 3584 6144 --json dense.json

Off the grid's powers of two the fused op's time steps with the tile rows a plan needs and
with rows two owners share (RS), so speedups are not smooth in M: 576 x 7168 x 4096 measured
0.80x between 1.19x at M=512 and 1.05x at 768. A shape between measured points is
therefore given the lowest speedup of the table points around it (M and K), not an
interpolation, and runs fused only when that beats the run-to-run noise (3%). Other world
sizes use this world-2 table until they are measured, and so do N off the measured ones
(N = 2880, whose plans end each tile row on a partial tile, is correct but not yet timed
on two GPUs: docs/PERF.md (y)). Re-measure and update the table when
the kernel or the machine changes.
"""
from __future__ import annotations

from bisect import bisect_left

# (M, K) -> (RS speedup, AR speedup), world 2
MEASURED_2X_H200: dict[tuple[int, int], tuple[float, float]] = {
    (128, 1024): (1.3, 1.74), (192, 1024): (1.29, 1.37), (256, 1024): (1.52, 1.45),
    (320, 1024): (1.37, 1.32), (384, 1024): (1.43, 1.38), (448, 1024): (1.34, 1.36),
    (512, 1024): (1.52, 1.42), (576, 1024): (1.26, 1.28), (640, 1024): (1.31, 1.3),
    (704, 1024): (1.33, 1.36), (768, 1024): (1.51, 1.37), (832, 1024): (1.24, 1.35),
    (896, 1024): (1.28, 1.38), (960, 1024): (0.97, 1.36), (1024, 1024): (1.56, 1.39),
    (1088, 1024): (1.19, 1.34), (1152, 1024): (1.23, 1.38), (1280, 1024): (1.51, 1.36),
    (1408, 1024): (1.27, 1.42), (1536, 1024): (1.62, 1.45), (1664, 1024): (1.33, 1.4),
    (1792, 1024): (1.53, 1.37), (1920, 1024): (1.43, 1.46), (2048, 1024): (1.64, 1.43),
    (2560, 1024): (1.77, 1.53), (3072, 1024): (1.78, 1.53), (3584, 1024): (1.8, 1.55),
    (4096, 1024): (1.87, 1.56), (6144, 1024): (1.82, 1.53), (8192, 1024): (2.01, 1.57),
    (16384, 1024): (2.11, 1.59),
    (128, 2048): (1.21, 1.64), (192, 2048): (1.02, 1.2), (256, 2048): (1.24, 1.33),
    (320, 2048): (0.97, 1.27), (384, 2048): (1.17, 1.35), (448, 2048): (1.19, 1.34),
    (512, 2048): (1.31, 1.36), (576, 2048): (0.97, 1.21), (640, 2048): (1.07, 1.24),
    (704, 2048): (1.03, 1.34), (768, 2048): (1.35, 1.39), (832, 2048): (1.08, 1.34),
    (896, 2048): (1.11, 1.37), (960, 2048): (0.97, 1.38), (1024, 2048): (1.32, 1.4),
    (1088, 2048): (1.1, 1.29), (1152, 2048): (1.17, 1.34), (1280, 2048): (1.25, 1.37),
    (1408, 2048): (1.13, 1.4), (1536, 2048): (1.4, 1.45), (1664, 2048): (1.23, 1.39),
    (1792, 2048): (1.33, 1.42), (1920, 2048): (1.41, 1.46), (2048, 2048): (1.42, 1.5),
    (2560, 2048): (1.57, 1.55), (3072, 2048): (1.56, 1.56), (3584, 2048): (1.59, 1.59),
    (4096, 2048): (1.57, 1.6), (6144, 2048): (1.56, 1.54), (8192, 2048): (1.59, 1.61),
    (16384, 2048): (1.61, 1.63),
    (128, 4096): (1.21, 1.55), (192, 4096): (0.98, 1.11), (256, 4096): (1.26, 1.31),
    (320, 4096): (0.8, 1.03), (384, 4096): (1.02, 1.19), (448, 4096): (0.93, 1.22),
    (512, 4096): (1.15, 1.34), (576, 4096): (0.8, 1.01), (640, 4096): (0.89, 1.11),
    (704, 4096): (0.84, 1.02), (768, 4096): (1.04, 1.16), (832, 4096): (0.94, 1.14),
    (896, 4096): (0.96, 1.19), (960, 4096): (0.94, 1.22), (1024, 4096): (1.26, 1.31),
    (1088, 4096): (0.89, 1.1), (1152, 4096): (1.01, 1.19), (1280, 4096): (1.09, 1.21),
    (1408, 4096): (1.08, 1.25), (1536, 4096): (1.25, 1.35), (1664, 4096): (1.1, 1.21),
    (1792, 4096): (1.13, 1.27), (1920, 4096): (1.2, 1.33), (2048, 4096): (1.26, 1.36),
    (2560, 4096): (1.34, 1.44), (3072, 4096): (1.32, 1.44), (3584, 4096): (1.32, 1.44),
    (4096, 4096): (1.32, 1.45), (6144, 4096): (1.27, 1.43), (8192, 4096): (1.31, 1.44),
    (16384, 4096): (1.34, 1.49),
    (128, 9216): (1.12, 1.4), (192, 9216): (0.79, 0.89), (256, 9216): (1.09, 1.15),
    (320, 9216): (0.65, 0.78), (384, 9216): (0.91, 1.05), (448, 9216): (0.82, 1.1),
    (512, 9216): (1.06, 1.14), (576, 9216): (0.7, 0.86), (640, 9216): (0.92, 1.04),
    (704, 9216): (0.78, 0.86), (768, 9216): (0.91, 0.98), (832, 9216): (0.95, 0.95),
    (896, 9216): (0.97, 1.03), (960, 9216): (1.0, 1.11), (1024, 9216): (1.11, 1.17),
    (1088, 9216): (0.78, 0.88), (1152, 9216): (0.9, 1.0), (1280, 9216): (0.94, 1.01),
    (1408, 9216): (1.02, 1.07), (1536, 9216): (1.16, 1.2), (1664, 9216): (0.96, 0.98),
    (1792, 9216): (1.0, 1.05), (1920, 9216): (1.05, 1.11), (2048, 9216): (1.13, 1.18),
    (2560, 9216): (1.21, 1.23), (3072, 9216): (1.12, 1.22), (3584, 9216): (1.17, 1.22),
    (4096, 9216): (1.13, 1.2), (6144, 9216): (1.18, 1.11), (8192, 9216): (1.05, 1.13),
    (16384, 9216): (1.04, 1.16),
}
MIN_SPEEDUP = 1.03  # above the ~3% run-to-run spread of the benchmark


def _around(axis: list[int], v: int) -> tuple[int, int]:
    """The measured values of a sorted axis on either side of v (v itself where measured;
    the edge outside the measured range)."""
    v = min(max(v, axis[0]), axis[-1])
    i = bisect_left(axis, v)
    return (axis[i] if axis[i] == v else axis[i - 1]), axis[i]


_axes_of: tuple[object, list[int], list[int]] | None = None


def _axes() -> tuple[list[int], list[int]]:
    """The table's M and K axes, sorted; derived again only when the table object changes
    (``should_run`` may be asked before every call)."""
    global _axes_of
    table = MEASURED_2X_H200
    if _axes_of is None or _axes_of[0] is not table:
        _axes_of = (table, sorted({m for m, _ in table}), sorted({k for _, k in table}))
    return _axes_of[1], _axes_of[2]


def expected_speedup(mode: str, M: int, K: int) -> float:
    """The lowest measured speedup among the table points around (M, K): the point itself
    where measured, else the (up to four) neighbours in M and K."""
    which = 1 if mode == "ar" else 0
    ms, ks = _axes()
    return min(MEASURED_2X_H200[(m, k)][which]
               for m in _around(ms, max(M, 1)) for k in _around(ks, max(K, 1)))


_wins: dict[tuple[str, int, int], bool] = {}
_wins_of: tuple[object, float] | None = None


def fused_wins(mode: str, M: int, N: int, K: int, world: int) -> bool:
    """Whether the measured table expects the fused ``mode`` ("rs" / "ar") to beat torch.mm
    + NCCL at (M, K). N and ``world`` are accepted for the callers' sake but not used: the
    table was measured on 2x H200 over unicast at N 7168 / 8192 (module docstring).
    Remembered per (mode, M, K): ``should_run`` may be asked before every call, and the
    table walk takes ~4 us of host time against ~0.3 for the lookup."""
    global _wins_of
    of = (MEASURED_2X_H200, MIN_SPEEDUP)
    if _wins_of is None or _wins_of[0] is not of[0] or _wins_of[1] != of[1]:
        _wins.clear()
        _wins_of = of
    key = (mode, M, K)
    hit = _wins.get(key)
    if hit is None:
        if len(_wins) >= 65536:
            _wins.clear()
        hit = _wins[key] = expected_speedup(mode, M, K) > MIN_SPEEDUP
    return hit
