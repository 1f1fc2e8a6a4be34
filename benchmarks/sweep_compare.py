"""Side-by-side speedups of plan variants over the default, from ``scripts/bench.py --json``.

    python3 benchmarks/sweep_compare.py small.json [more.json ...] \\
        --vs rsar_rs:rs_nopdl,rs_bn64 --vs rsar_ar:ar_owner,ar_all64,ar_nopdl \\
        --vs gemm_only:gemm_nopdl,gemm_bn64,gemm_pn64

For each ``--vs BASE:VARIANT,...`` and each shape that timed them, prints BASE's time and
each variant's speedup over it (BASE time / variant time; > 1 means the variant is faster),
then per variant the geometric mean, the range and the shapes it won by more than the
run-to-run noise (3%): what a plan rule would be drawn from.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

NOISE = 1.03


def compare(rows: list[dict], base: str, variants: list[str]) -> dict[str, list[tuple]]:
    """{variant: [(M, N, K, base us, speedup), ...]} over the rows that timed both."""
    out: dict[str, list[tuple]] = {v: [] for v in variants}
    for r in rows:
        us = r["us"]
        if base not in us:
            continue
        for v in variants:
            if v in us and us[v] > 0:
                out[v].append((r["M"], r["N"], r["K"], us[base], us[base] / us[v]))
    return out


def report(rows: list[dict], base: str, variants: list[str]) -> str:
    got = compare(rows, base, variants)
    shapes = sorted({s[:4] for pts in got.values() for s in pts})
    lines = [f"{base} against " + ", ".join(variants),
             "| M | N | K | " + base + " us | " + " | ".join(variants) + " |",
             "|" + "---|" * (4 + len(variants))]
    for M, N, K, t in shapes:
        cells = []
        for v in variants:
            hit = [p[4] for p in got[v] if p[:3] == (M, N, K)]
            cells.append(f"{hit[0]:.3f}" if hit else "-")
        lines.append(f"| {M} | {N} | {K} | {t:.1f} | " + " | ".join(cells) + " |")
    for v in variants:
        sp = [p[4] for p in got[v]]
        if not sp:
            lines.append(f"- {v}: not timed")
            continue
        gm = math.exp(sum(math.log(x) for x in sp) / len(sp))
        wins = [f"{M}x{N}x{K}" for M, N, K, _, x in got[v] if x > NOISE]
        lines.append(f"- {v}: geomean {gm:.3f}, {min(sp):.3f}-{max(sp):.3f} over {len(sp)} "
                     f"shapes; faster beyond noise at {len(wins)}: {' '.join(wins) or '-'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", nargs="+")
    p.add_argument("--vs", action="append", required=True, metavar="BASE:VARIANT,...")
    a = p.parse_args(argv)
    rows = [r for path in a.json for r in json.load(open(path))]
    for spec in a.vs:
        base, _, variants = spec.partition(":")
        if not variants:
            p.error(f"--vs {spec!r}: expected BASE:VARIANT[,VARIANT...]")
        print(report(rows, base, variants.split(",")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
