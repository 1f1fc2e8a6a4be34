"""Nsight Compute's details pages side by side (no GPU): one column per file, one row per
metric, for the kernels `scripts/gpu_runs.sh OUT profile` / `profile-pn` profiled.

    ncu -i REP.ncu-rep --page details --csv > details_NAME.csv      # what gpu_runs.sh writes
    python3 benchmarks/ncu_details.py details_*.csv [--metric "L2 Hit Rate" ...] [--all]

Reads the CSV's "Section Name", "Metric Name", "Metric Unit" and "Metric Value" columns
(other columns, and the rule rows some versions add, are ignored) of the file's first
kernel. Without ``--metric`` it prints ``DEFAULT_METRICS``, the counters the GEMM's A/Bs have
turned on: time and clock, the tensor and memory pipes, L2 and DRAM traffic, occupancy.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

DEFAULT_METRICS = (
    "Duration", "Elapsed Cycles", "SM Frequency", "Compute (SM) Throughput",
    "Memory Throughput", "DRAM Throughput", "L1/TEX Hit Rate", "L2 Hit Rate",
    "Mem Busy", "Max Bandwidth", "Executed Ipc Active", "Issue Slots Busy",
    "Achieved Occupancy", "Registers Per Thread", "Dynamic Shared Memory Per Block",
    "Grid Size", "Cluster Size",
)


def read_details(path: Path) -> dict[str, tuple[str, str]]:
    """{metric name: (value, unit)} of the first kernel in an ncu ``--page details --csv``
    export; a name met in two sections keeps the first."""
    out: dict[str, tuple[str, str]] = {}
    with path.open(newline="") as f:
        first_id = None
        for row in csv.DictReader(f):
            name = row.get("Metric Name")
            if not name:
                continue
            first_id = first_id if first_id is not None else row.get("ID")
            if row.get("ID") != first_id:
                break
            out.setdefault(name, (row.get("Metric Value", ""), row.get("Metric Unit", "")))
    return out


def table(files: list[Path], metrics: list[str] | None = None) -> str:
    got = {f: read_details(f) for f in files}
    if metrics is None:
        metrics = [m for m in DEFAULT_METRICS if any(m in d for d in got.values())]
    lines = ["| metric | " + " | ".join(f.stem for f in files) + " |",
             "|" + "---|" * (len(files) + 1)]
    for m in metrics:
        unit = next((d[m][1] for d in got.values() if m in d and d[m][1]), "")
        cells = [got[f][m][0] if m in got[f] else "-" for f in files]
        lines.append(f"| {m}{f' ({unit})' if unit else ''} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", nargs="+", type=Path)
    p.add_argument("--metric", action="append", default=None,
                   help="a metric name as the details page spells it (repeatable)")
    p.add_argument("--all", action="store_true", help="every metric any file has")
    a = p.parse_args(argv)
    metrics = a.metric
    if a.all:
        metrics = list(dict.fromkeys(m for f in a.csv for m in read_details(f)))
    print(table(a.csv, metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
