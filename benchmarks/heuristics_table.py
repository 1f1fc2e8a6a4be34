"""Print the ``rsar_core.heuristics`` table from ``scripts/bench.py --json`` outputs.

    python3 benchmarks/heuristics_table.py grid.json k2048.json dense.json [--newer again.json ...]

(the grid, K=2048 at the grid's M, and the off-grid M of ``rsar_core.heuristics``'s docstring:
every (M, K) of the product of the M and K seen must be present).

Per (M, K): the lowest, over the measured N, of the RS and AR speedups over torch.mm + NCCL,
rounded down to 2 digits (a shape runs fused only if every N of it won); the (M, K) points of
each group of files after a ``--newer`` (measured after a plan change) replace those before
it. Paste the printed dict into rsar_core/heuristics.py.
"""
from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path


def table(rows: list[dict]) -> dict[tuple[int, int], tuple[float, float]]:
    acc: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        q = r["ratios"]
        if "rs_speedup" in q and "ar_speedup" in q:
            acc[(r["M"], r["K"])].append((q["rs_speedup"], q["ar_speedup"]))

    def low(xs: list[float]) -> float:
        return math.floor(min(xs) * 100) / 100
    return {mk: (low([a for a, _ in v]), low([b for _, b in v])) for mk, v in sorted(acc.items())}


def groups_of(argv: list[str]) -> list[list[str]]:
    """The file groups of the command line: a new group after each ``--newer``."""
    groups: list[list[str]] = [[]]
    for a in argv:
        if a == "--newer":
            groups.append([])
        else:
            groups[-1].append(a)
    return groups


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        raise SystemExit(0 if argv else 2)
    groups = groups_of(argv)
    missing = [p for g in groups for p in g if not Path(p).is_file()]
    if missing:
        raise SystemExit(f"heuristics_table: no such file: {', '.join(missing)}")
    t: dict[tuple[int, int], tuple[float, float]] = {}
    for paths in groups:
        # each re-measurement after a plan change replaces the (M, K) points it holds
        t.update(table([r for path in paths for r in json.load(open(path))]))
    print("MEASURED_2X_H200: dict[tuple[int, int], tuple[float, float]] = {")
    for k in sorted({k for _, k in t}):
        items = [f"({m}, {k}): {t[(m, k)]}" for m in sorted({m for m, kk in t if kk == k})]
        for i in range(0, len(items), 3):
            print("    " + ", ".join(items[i:i + 3]) + ",")
    print("}")


if __name__ == "__main__":
    main()
