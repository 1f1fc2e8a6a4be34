"""Nsight Compute's ``--csv --metrics`` logs as one table (no GPU): per log, the median of each
metric over every launch of each kernel, cuBLAS's beside ours.

    ncu --clock-control none -k regex:'Sm90|nvjet' --csv --metrics M1,M2,... \\
        python3 scripts/gemm_one_gpu.py --columns COL --shapes SHAPE --iters 1 --blocks 1 \\
        > OUT/lrc_SHAPE_COL.log                       # what `gpu_runs.sh OUT lrc` writes
    python3 benchmarks/ncu_metrics_table.py OUT/lrc_*.log [--metric NAME ...]

One log holds one shape and one of our columns (the step runs ncu once per pair), so a
log's kernels are cuBLAS's (``nvjet``) and ours (``Sm90FusedKernel``); the f64 reference
GEMM of the run's check and anything else ncu matched are left out. How docs/PERF.md (av)
found that cuBLAS's launches have twice as many L2 requests merged by the L2 request
coalescer (``lrc__request_sectors_op_read_coalescing_achieved_type_hardware``) as ours at the
same plan.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

KERNELS = (("cuBLAS", "nvjet"), ("ours", "Sm90FusedKernel"))

# metric -> (column title, scale) for the columns this table knows; others print as read
SHORT = {
    "gpu__time_duration.sum": ("us", 1e-3),
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": ("tensor%", 1.0),
    "lts__t_sectors_srcunit_tex_op_read.sum": ("L2 rd M", 1e-6),
    "lrc__request_sectors_op_read_coalescable.sum": ("coalescable M", 1e-6),
    "lrc__request_sectors_op_read_coalescing_achieved_type_hardware.sum": ("merged hw M", 1e-6),
    "lrc__request_sectors_op_read_coalescing_achieved_type_programmatic.sum": ("multicast M", 1e-6),
    "lrc__lts2lrc_sectors_op_read.sum": ("from L2 M", 1e-6),
    "lts__t_sector_hit_rate.pct": ("L2 hit%", 1.0),
    "dram__bytes_read.sum": ("DRAM MB", 1e-6),
}


def read_launches(path: Path) -> list[tuple[str, dict[str, float]]]:
    """[(kernel name, {metric: value})] in launch order from one ``ncu --csv`` log; lines
    that are not the CSV (the program's own output, ncu's notes) are skipped."""
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith('"')]
    rows = list(csv.reader(lines))
    if not rows:
        return []
    head = {h: i for i, h in enumerate(rows[0])}
    for need in ("ID", "Kernel Name", "Metric Name", "Metric Value"):
        if need not in head:
            raise ValueError(f"{path}: no {need!r} column (not an ncu --csv --metrics log?)")
    launches: dict[str, tuple[str, dict[str, float]]] = {}
    for r in rows[1:]:
        name, metrics = launches.setdefault(r[head["ID"]], (r[head["Kernel Name"]], {}))
        try:
            metrics[r[head["Metric Name"]]] = float(r[head["Metric Value"]].replace(",", ""))
        except ValueError:
            pass  # "n/a" where a counter is not collected
    return list(launches.values())


def medians(path: Path) -> dict[str, dict[str, float]]:
    """{"cuBLAS" / "ours": {metric: median over that kernel's launches}} of one log."""
    out: dict[str, dict[str, float]] = {}
    launches = read_launches(path)
    for label, key in KERNELS:
        runs = [m for name, m in launches if key in name]
        if runs:
            names = sorted({k for m in runs for k in m})
            out[label] = {k: statistics.median(m[k] for m in runs if k in m) for k in names}
            out[label]["launches"] = float(len(runs))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("logs", nargs="+", type=Path)
    p.add_argument("--metric", action="append", default=None,
                   help="metrics to print, in order (default: those the logs hold)")
    a = p.parse_args(argv)
    tables = [(log, medians(log)) for log in a.logs]
    metrics = a.metric or sorted({k for _, t in tables for m in t.values() for k in m
                                  if k != "launches"}, key=lambda k: (k not in SHORT, k))
    titles = [SHORT.get(m, (m, 1.0))[0] for m in metrics]
    width = max([len(log.stem) for log in a.logs] + [8])
    print(f"{'log':{width}s} {'kernel':7s} {'n':>3s}" + "".join(f" {t:>13s}" for t in titles))
    for log, t in tables:
        if not t:
            print(f"{log.stem:{width}s} (no launch of cuBLAS's or our kernel)", file=sys.stderr)
        for label, m in t.items():
            cells = "".join(
                f" {m[k] * SHORT.get(k, ('', 1.0))[1]:13.3f}" if k in m else f" {'-':>13s}"
                for k in metrics)
            print(f"{log.stem:{width}s} {label:7s} {int(m['launches']):3d}" + cells)
    return 0


if __name__ == "__main__":
    sys.exit(main())
