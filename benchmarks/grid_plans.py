"""The plans and kernel variants the issue's grid runs by default, one line per shape and
mode.

    python3 benchmarks/grid_plans.py                # print them
    python3 benchmarks/grid_plans.py --write FILE --reason TEXT
                                        # the snapshot tests/test_grid_plans.py checks

A plan rule that moves a grid shape shows up as a changed line, so a change that claims to
leave the grid alone can be checked, and one that does not names the shapes to re-measure.
``--write`` keeps each unchanged entry's ``reason`` and gives every changed one ``--reason``
(the rule and the PERF.md section that measured it).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GRID_N = (7168, 8192)
GRID_K = (1024, 4096, 9216)
GRID_M = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def grid_plans(sm_count: int = 132, world: int = 2) -> dict[str, dict]:
    """"M x N x K mode" -> the default sm90 unicast plan's fields and its variant's knobs."""
    from launch.resolve import Hardware, Shape, resolve
    out = {}
    for N in GRID_N:
        for K in GRID_K:
            for M in GRID_M:
                for mode in ("rs", "ar", "gemm"):
                    p, v = resolve(Shape(M, N, K, mode), Hardware("sm_90a", sm_count), world,
                                   "unicast")
                    out[f"{M} x {N} x {K} {mode}"] = {
                        "bn": p.bn, "cta_group": p.cta_group, "rounds": p.rounds,
                        "lag": p.lag, "chunk": p.chunk, "band": p.band,
                        "peers_first": int(p.peers_first), "flat": int(p.flat),
                        "pair_n": int(p.pair_n), "push_all": int(p.push_all), "sk": p.sk,
                        "split_row": int(p.split_row), "stages": v.stages,
                        "early_copy": v.early_copy, "push_window": v.push_window,
                        "tma_store": v.tma_store, "pingpong": v.pingpong}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", type=Path, default=None)
    p.add_argument("--reason", default=None,
                   help="with --write: why the entries that changed moved")
    a = p.parse_args(argv)
    plans = grid_plans()
    if a.write is not None:
        old = json.loads(a.write.read_text()) if a.write.exists() else {}
        for k, v in plans.items():
            was = {f: x for f, x in old.get(k, {}).items() if f != "reason"}
            if was == v and "reason" in old.get(k, {}):
                v["reason"] = old[k]["reason"]
            elif was and was != v:
                if not a.reason:
                    p.error(f"{k} moved: --reason must say why")
                v["reason"] = a.reason
        a.write.write_text(json.dumps(plans, indent=0, sort_keys=True) + "\n")
    else:
        for k, v in plans.items():
            print(k, " ".join(f"{f}={x}" for f, x in v.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
