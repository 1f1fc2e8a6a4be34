"""Several runs of ``scripts/gemm_one_gpu.py --json`` read together: one column's ratio
torch.mm / column per shape in every run, and the issue's target judged on them (no GPU).

    python3 benchmarks/grid_runs.py run1.json run2.json run3.json [--column default]
        [--floor 0.97] [--goal 1.02]

Why: single readings of the long shapes move by up to 6% between runs of one kernel
(docs/PERF.md (aq)), more than the margins the target asks about. Per shape it prints each
run's ratio and, where the rows carry them (``block_ratios``), the range over every block of
every run; then each run's geomean, the geomean of the per-shape medians, and the shapes
below ``--floor``: by their median, and those below it in every reading (every run, every
block) - a shape below in some readings only is within the noise.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def ratios(runs: list[list[dict]], column: str) -> dict[tuple, dict]:
    """{(M, N, K): {"runs": [ratio per run or None], "readings": [every block's ratio, or
    the run's ratio where the row has none]}} over the shapes any run timed ``column`` at
    with its anchor."""
    out: dict[tuple, dict] = {}
    for i, rows in enumerate(runs):
        for r in rows:
            us = r["us"]
            if us.get("mm") is None or us.get(column) is None:
                continue
            key = (r["M"], r["N"], r["K"])
            e = out.setdefault(key, {"runs": [None] * len(runs), "readings": []})
            e["runs"][i] = us["mm"] / us[column]
            e["readings"] += r.get("block_ratios", {}).get(column) or [e["runs"][i]]
    return out


def report(runs: list[list[dict]], column: str = "default", floor: float = 0.97,
           goal: float = 1.02) -> str:
    got = ratios(runs, column)
    if not got:
        return f"{column}: no shape timed with its anchor"
    lines = [f"torch.mm / {column}, {len(runs)} runs",
             "| M | N | K | " + " | ".join(f"run {i + 1}" for i in range(len(runs)))
             + " | median | every reading |", "|" + "---|" * (len(runs) + 5)]
    medians = {}
    for (M, N, K), e in sorted(got.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        present = [x for x in e["runs"] if x is not None]
        medians[(M, N, K)] = statistics.median(present)
        cells = " | ".join("-" if x is None else f"{x:.3f}" for x in e["runs"])
        lines.append(f"| {M} | {N} | {K} | {cells} | {medians[(M, N, K)]:.3f} | "
                     f"{min(e['readings']):.3f}-{max(e['readings']):.3f} |")
    for i in range(len(runs)):
        xs = [e["runs"][i] for e in got.values() if e["runs"][i] is not None]
        if xs:
            lines.append(f"- run {i + 1}: geomean {geomean(xs):.3f}x over {len(xs)} shapes, "
                         f"{sum(x < floor for x in xs)} below {floor}")
    gm = geomean(list(medians.values()))
    below = sorted(k for k, m in medians.items() if m < floor)
    always = sorted(k for k in below if max(got[k]["readings"]) < floor)
    name = " ".join(f"{M}x{N}x{K}" for M, N, K in always) or "-"
    lines += [f"- per-shape medians: geomean {gm:.3f}x ({'meets' if gm >= goal else 'short of'}"
              f" {goal}x), {len(below)} shapes below {floor} by their median",
              f"- below {floor} in every reading: {len(always)}: {name}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", nargs="+", type=Path, help="gemm_one_gpu.py --json outputs, a run each")
    p.add_argument("--column", default="default")
    p.add_argument("--floor", type=float, default=0.97)
    p.add_argument("--goal", type=float, default=1.02)
    a = p.parse_args(argv)
    print(report([json.loads(f.read_text()) for f in a.json], a.column, a.floor, a.goal))
    return 0


if __name__ == "__main__":
    sys.exit(main())
