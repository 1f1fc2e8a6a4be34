"""Where a kernel's warps wait, from Nsight Compute's SASS source page: warp samples summed by
what the instruction is doing (a stage wait, a wgmma wait, the epilogue, ...).

    ncu --clock-control none -k regex:Sm90FusedKernel --launch-skip 1 --launch-count 1 \\
        --set full --import-source yes -o REP \\
        python3 scripts/gemm_one_gpu.py --columns default --shapes 2048,7168,1024 --iters 1 --blocks 1
    ncu -i REP.ncu-rep --page source --csv --print-source sass > src.csv
    python3 benchmarks/sass_stalls.py src.csv [--top 20] [--context 8]

A wait on an mbarrier is a ``SYNCS.PHASECHK.TRANS64.TRYWAIT`` followed by a predicated branch
back to it: the samples of that loop count as the wait (``mbarrier wait``). Samples are per
warp, so every role shows (the producer's empty-stage waits, an idle warp's sleep): an
instruction's executed count tells roles apart (the MMA warps run the mainloop's wgmma
``k_blocks x tiles`` times). How docs/PERF.md (ao) found the GEMM alone's mainloop waiting
on k-blocks, not on its epilogue. ``--context N`` prints the N instructions before each of
the top ones: a ``long_sb`` wait names no load, the lines above it do.
"""
from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter

# (category, test on the instruction text): the first match names an instruction's samples
CATEGORIES = (
    ("wgmma issue", lambda s: s.startswith("HGMMA") or s.startswith("WARPGROUP.ARRIVE")),
    ("wgmma wait", lambda s: s.startswith("WARPGROUP.DEPBAR")),
    ("epilogue convert", lambda s: s.startswith("F2FP")),
    ("epilogue smem store", lambda s: s.startswith("STSM") or s.startswith("STS")),
    ("fence", lambda s: s.startswith("FENCE") or s.startswith("MEMBAR")),
    ("mbarrier arrive", lambda s: s.startswith("SYNCS.ARRIVE")),
    ("sleep", lambda s: "NANOSLEEP" in s),
    ("tma issue", lambda s: s.startswith("UTMALDG") or s.startswith("UBLKCP")
     or s.startswith("UTMASTG") or s.startswith("UTMACMDFLUSH")),
    ("global memory", lambda s: s.startswith("LDG") or s.startswith("STG")
     or s.startswith("RED") or s.startswith("ATOM")),
)


def _opcode(src: str) -> str:
    """The instruction without its guard predicate (``@!P0 BRA x`` -> ``BRA x``)."""
    s = src.strip()
    return s.split(None, 1)[1] if s.startswith("@") and " " in s else s


def read_rows(path: str) -> list[dict]:
    """The source page's instruction rows: address, text, samples, executed count, and the
    stall reasons' sample counts (``stall_*`` columns, not-issued ones left out)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    names = rows[head]
    col = {n: i for i, n in enumerate(names)}
    stalls = [n for n in names if n.startswith("stall_") and "Not Issued" not in n]
    out = []
    for r in rows[head + 1:]:
        if len(r) < len(names):
            continue
        num = lambda n: int(float(r[col[n]] or 0))  # noqa: E731
        out.append({"addr": r[col["Address"]], "src": r[col["Source"]].strip(),
                    "samples": num("# Samples"), "executed": num("Instructions Executed"),
                    "stalls": {n[6:]: num(n) for n in stalls}})
    return out


def categorize(rows: list[dict]) -> Counter:
    """Samples by category; a try-wait loop (the TRYWAIT and the branch after it) is an
    ``mbarrier wait``."""
    got: Counter = Counter()
    for i, r in enumerate(rows):
        op = _opcode(r["src"])
        near = [_opcode(rows[j]["src"]) for j in range(max(0, i - 4), i)]
        if "TRYWAIT" in op or (op.startswith("BRA") and any("TRYWAIT" in p for p in near)):
            got["mbarrier wait"] += r["samples"]
            continue
        cat = next((c for c, test in CATEGORIES if test(op)), None)
        got[cat or ("branch" if op.startswith("BRA") else "other")] += r["samples"]
    return got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    p.add_argument("--top", type=int, default=15, help="instructions with the most samples")
    p.add_argument("--context", type=int, default=0, metavar="N",
                   help="print the N instructions before each of the top ones")
    a = p.parse_args(argv)
    rows = read_rows(a.csv)
    if not rows:
        print(f"{a.csv}: no instruction rows", file=sys.stderr)
        return 1
    total = sum(r["samples"] for r in rows)
    print(f"{total} warp samples over {len(rows)} instructions")
    for cat, n in categorize(rows).most_common():
        print(f"  {cat:20s} {n:7d}  {100 * n / max(total, 1):5.1f}%")
    print(f"top {a.top} instructions (samples, executed, main stall reasons):")
    for i in sorted(range(len(rows)), key=lambda i: -rows[i]["samples"])[:a.top]:
        r = rows[i]
        why = ", ".join(f"{k} {v}" for k, v in Counter(r["stalls"]).most_common(2) if v)
        print(f"  {r['samples']:6d} {r['executed']:7d}  {r['src'][:56]:56s} {why}")
        for c in rows[max(0, i - a.context):i]:
            print(f"         {c['addr']:>8s} {c['executed']:7d}  {c['src'][:72]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
