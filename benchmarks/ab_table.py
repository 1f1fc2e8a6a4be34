"""A same-run A/B read back from ``scripts/gemm_one_gpu.py --json`` files (no GPU): per shape,
each column's ratio torch.mm / column in every run (seeded order), and its gain over a base
column (default ``default``, the plan a rule would replace) in the same run; then per column
the geomean gain and how many shapes it won in every run.

    python3 benchmarks/ab_table.py run_seed1.json run_seed2.json [--base default]
        [--markdown]

Why in the same run: the anchors and our kernels drift together between runs and machines
(H100s of one model differ in the clusters they hold: the rows carry ``clusters``), so a
rule's evidence is the gain against the plan it replaces, measured call by call beside it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grid_runs import geomean  # noqa: E402 (the records' geomean, one definition)


def load(paths: list[str]) -> list[list[dict]]:
    return [json.loads(Path(p).read_text()) for p in paths]


def table(runs: list[list[dict]], base: str) -> tuple[list[str], dict[tuple, dict]]:
    """(columns other than the anchor and ``base``, in first-seen order; {(M, N, K):
    {column: {"vs_mm": [per run], "gain": [per run]}}}) over the shapes where a run timed
    both the column and ``base``; a run that lacks either leaves None."""
    cols: list[str] = []
    out: dict[tuple, dict] = {}
    for i, rows in enumerate(runs):
        for r in rows:
            us = r["us"]
            b, mm = us.get(base), us.get("mm")
            for c, t in us.items():
                if c in ("mm", base) or t is None or b is None:
                    continue
                if c not in cols:
                    cols.append(c)
                e = out.setdefault((r["M"], r["N"], r["K"]), {}).setdefault(
                    c, {"vs_mm": [None] * len(runs), "gain": [None] * len(runs)})
                e["vs_mm"][i] = mm / t if mm else None
                e["gain"][i] = b / t
            if b is not None and mm:
                e = out.setdefault((r["M"], r["N"], r["K"]), {}).setdefault(
                    base, {"vs_mm": [None] * len(runs), "gain": [None] * len(runs)})
                e["vs_mm"][i] = mm / b
                e["gain"][i] = 1.0
    return cols, out


def summary(cols: list[str], rows: dict[tuple, dict]) -> dict[str, dict]:
    """Per column: the geomean gain over every reading, and the shapes where it gained in
    every run (``won``) and lost in every run (``lost``), of those it ran at."""
    out = {}
    for c in cols:
        gains, won, lost, shapes = [], 0, 0, 0
        for cells in rows.values():
            g = [x for x in cells.get(c, {}).get("gain", []) if x is not None]
            if not g:
                continue
            shapes += 1
            gains += g
            won += all(x > 1 for x in g)
            lost += all(x < 1 for x in g)
        if gains:
            out[c] = {"geomean_gain": geomean(gains),
                      "shapes": shapes, "won": won, "lost": lost}
    return out


def _ratios(xs: list) -> str:
    return " / ".join("-" if x is None else f"{x:.3f}" for x in xs)


def _gains(xs: list) -> str:
    return " / ".join("-" if x is None else f"{x - 1:+.1%}" for x in xs)


def render(cols: list[str], rows: dict[tuple, dict], base: str, markdown: bool) -> str:
    head = ["shape", f"{base} (vs torch.mm)"] + [f"{c} (gain)" for c in cols]
    lines = []
    if markdown:
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    else:
        lines.append("  ".join(head))
    for (M, N, K) in sorted(rows, key=lambda k: (k[2], k[1], k[0])):
        cells = rows[(M, N, K)]
        row = [f"{M} x {N} x {K}", _ratios(cells[base]["vs_mm"]) if base in cells else "-"]
        row += [_gains(cells[c]["gain"]) if c in cells else "-" for c in cols]
        lines.append("| " + " | ".join(row) + " |" if markdown else "  ".join(row))
    lines.append("")
    for c, s in summary(cols, rows).items():
        lines.append(f"{c}: geomean gain over {base} {s['geomean_gain'] - 1:+.1%}, won at "
                     f"{s['won']} and lost at {s['lost']} of {s['shapes']} shapes in every run")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="gemm_one_gpu.py --json files, one per seeded order")
    p.add_argument("--base", default="default", help="the column the others are gains over")
    p.add_argument("--markdown", action="store_true", help="a Markdown table")
    a = p.parse_args(argv)
    cols, rows = table(load(a.runs), a.base)
    if not rows:
        print(f"no shape timed both {a.base!r} and another column", file=sys.stderr)
        return 1
    print(render(cols, rows, a.base, a.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
