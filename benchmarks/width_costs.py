"""Tile-width costs from a one-GPU width sweep, and what the planner's lane-cost rule would
pick with them: where ``launch.rules.TILE_COST`` comes from.

    python3 scripts/gemm_one_gpu.py --columns default,c1+bn112,...,c2+bn256 --json sweep.json
    python3 benchmarks/width_costs.py sweep.json [more.json ...]

A column ``cC+bnW`` is the GEMM alone on C-CTA tiles W wide. Its plan has ``rounds`` rounds
of W-wide tiles on every lane, so its time per lane column, ``us / (rounds * W)``, over the
same at 256 wide (same cluster kind, same shape), is that width's cost per column: what
``TILE_COST`` models. Printed per width: the median, the spread, and per K. Then per shape:
the best column, the default's time against it, and the column ``lane_cost`` would pick
with the fitted costs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


def _parse(col: str) -> tuple[int, int] | None:
    """(cta_group, width) of a ``cC+bnW`` column, else None."""
    parts = col.split("+")
    if len(parts) != 2 or parts[0] not in ("c1", "c2") or not parts[1].startswith("bn"):
        return None
    return int(parts[0][1]), int(parts[1][2:])


def per_column(rows: list[dict], sm_count: int = 132) -> dict[tuple[int, int], list[tuple]]:
    """{(cta_group, width): [(M, N, K, cost per column against 256 wide), ...]}."""
    from gemm_one_gpu import column_plan
    out: dict[tuple[int, int], list[tuple]] = {}
    for r in rows:
        M, N, K, us = r["M"], r["N"], r["K"], r["us"]
        unit = {}
        for col, t in us.items():
            cw = _parse(col)
            if cw is None or t is None:
                continue
            plan = column_plan(col, M, N, K, sm_count)[0]
            unit[cw] = t / (plan.rounds * plan.bn)
        for (cg, w), u in unit.items():
            if (cg, 256) in unit:
                out.setdefault((cg, w), []).append((M, N, K, u / unit[(cg, 256)]))
    return out


def fitted(costs: dict[tuple[int, int], list[tuple]]) -> dict[int, float]:
    """Median cost per column of each width over both cluster kinds."""
    widths = sorted({w for _, w in costs})
    return {w: statistics.median(c for (_, ww), pts in costs.items() if ww == w
                                 for *_, c in pts) for w in widths}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", nargs="+", type=Path)
    p.add_argument("--sm-count", type=int, default=132)
    a = p.parse_args(argv)
    rows = [r for f in a.json for r in json.loads(f.read_text())]
    costs = per_column(rows, a.sm_count)
    print("| cluster | width | median | min | max | by K (median) |")
    print("|---|---|---|---|---|---|")
    for (cg, w), pts in sorted(costs.items()):
        cs = [c for *_, c in pts]
        byk = {K: statistics.median(c for _, _, k, c in pts if k == K)
               for K in sorted({k for _, _, k, _ in pts})}
        print(f"| c{cg} | {w} | {statistics.median(cs):.3f} | {min(cs):.3f} | {max(cs):.3f} | "
              + ", ".join(f"K={K}: {c:.3f}" for K, c in byk.items()) + " |")
    fit = fitted(costs)
    print("\nfitted TILE_COST: {" + ", ".join(f"{w}: {c:.2f}" for w, c in
                                              sorted(fit.items(), reverse=True)) + "}")
    from gemm_one_gpu import column_plan
    print("\n| M | N | K | mm us | default | best column | best | lane_cost's pick | pick |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        us = r["us"]
        mm, cols = us.get("mm"), {c: t for c, t in us.items() if _parse(c) and t}
        if not cols or mm is None or "default" not in us:
            continue
        best = min(cols, key=cols.get)
        pick = min(cols, key=lambda c: _model(column_plan(c, r["M"], r["N"], r["K"],
                                                          a.sm_count)[0], fit))
        print(f"| {r['M']} | {r['N']} | {r['K']} | {mm:.1f} | {mm / us['default']:.3f} | "
              f"{best} | {mm / cols[best]:.3f} | {pick} | {mm / cols[pick]:.3f} |")
    return 0


def _model(plan, fit: dict[int, float]) -> float:
    from launch.rules import ONE_CTA_COST
    cost = plan.rounds * plan.bn * fit.get(plan.bn, 1.5)
    return cost * (ONE_CTA_COST if plan.cta_group == 1 and plan.K > 1024 else 1.0)


if __name__ == "__main__":
    sys.exit(main())
