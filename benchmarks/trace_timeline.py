"""Where a fused call spends its time: per-CTA event times from a traced launch.

    mpirun -n 2 python3 benchmarks/trace_timeline.py --N 7168 --K 1024 --M 128 512 --mode rs ar

For each shape and mode it warms up, times the kernel of the op's tuning (the options below),
then launches the same plan from the op retuned with ``trace=True`` (``launch.trace``: one
store of %globaltimer per event and CTA)
and prints, per rank, each event's time since the first CTA started (min / median / max
over the CTAs that reached it, in us). ``--json`` keeps the raw per-CTA times.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _summary(ev: dict[str, list[int | None]],
             ctas: list[int] | None = None) -> dict[str, tuple[float, float, float, int]]:
    """min / median / max (us) and count of each event over ``ctas`` (default: all)."""
    out = {}
    for name, per_cta in ev.items():
        pick = per_cta if ctas is None else [per_cta[c] for c in ctas if c < len(per_cta)]
        vals = [v / 1e3 for v in pick if v is not None]
        if vals:
            out[name] = (min(vals), statistics.median(vals), max(vals), len(vals))
    return out


def _parts(plan) -> dict[str, list[int]]:
    """The CTAs of the pushing part(s) and of the own part (lanes in order: peer parts
    first, the own part last), or all CTAs where every lane does both (peers-first order)."""
    if plan.peers_first or plan.mode == "gemm":
        return {"all lanes": list(range(plan.grid))}
    parts: dict[str, list[int]] = {"pushing lanes": [], "own lanes": []}
    for c in range(plan.grid):
        own = (c // plan.cta_group) // plan.chunk == plan.world - 1
        parts["own lanes" if own else "pushing lanes"].append(c)
    return parts


def _print_rounds(everyone: list[dict], plan) -> None:
    """When each part's CTAs finished their i-th tile (median / max over the part, us):
    successive rows are the rounds' pace."""
    parts = _parts(plan)
    cols = [(r, name, ctas) for r in everyone for name, ctas in parts.items()]
    heads = [f"r{r['rank']} {name} med / max" for r, name, _ in cols]
    width = max(len(h) for h in heads)
    print(f"  {'tile done':16s}" + "".join(f" | {h:>{width}s}" for h in heads))
    from launch.trace import TILE_SLOTS
    for i in range(TILE_SLOTS):
        key = f"tile_done_{i}"
        stats = [_summary({key: r["events"][key]}, ctas).get(key) for r, _, ctas in cols]
        if not any(stats):
            break
        cells = "".join(f" | {f'{s[1]:.2f} {s[2]:.2f}' if s else '-':>{width}s}" for s in stats)
        print(f"  {i:<16d}{cells}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--N", type=int, default=7168)
    p.add_argument("--K", type=int, nargs="+", default=[1024])
    p.add_argument("--M", type=int, nargs="+", default=[128, 512, 2048])
    p.add_argument("--mode", nargs="+", default=["rs", "ar"], choices=["rs", "ar"])
    p.add_argument("--bn", type=int, default=None, help="force the tile width")
    p.add_argument("--peers-first", action="store_true")
    p.add_argument("--pair-n", action="store_true",
                   help="2x1 clusters pairing tiles along N (Tuning.pair_n)")
    p.add_argument("--push-all", action="store_true",
                   help="AR on the push-all plan (Tuning.push_all; world 2, M <= 1024)")
    p.add_argument("--push", choices=["lsu", "tma", "tma_all"], default=None,
                   help="how partials leave (Tuning.push; default: the rule's)")
    p.add_argument("--queue", type=int, default=1, metavar="Q",
                   help="queue Q traced launches back to back and show the last: ranks then start "
                        "it aligned by the previous exchange, at steady clocks (default 1: one "
                        "launch after a barrier, which shows any host-side skew between ranks)")
    p.add_argument("--push-window", type=int, choices=[0, 1], default=None,
                   help="1: one sub-tile's bulk copies in flight at a time, 0: a tile's copies "
                        "at once (Tuning.push_window; default: the op's rule)")
    p.add_argument("--json", dest="json_path")
    a = p.parse_args()
    if a.queue < 1:
        p.error("--queue must be at least 1")

    from mpi4py import MPI
    import torch
    comm = MPI.COMM_WORLD
    rank = comm.rank
    torch.cuda.set_device(rank % torch.cuda.device_count())
    from rsar_core import GemmRsAr, Tuning
    rows = []
    for mode in a.mode:
        tuning = Tuning(bn=a.bn, peers_first=True if a.peers_first else None, pair_n=a.pair_n,
                        push_window=None if a.push_window is None else bool(a.push_window),
                        push_all=True if a.push_all and mode == "ar" else None, push=a.push)
        op = GemmRsAr(max(a.M), a.N, all_reduce=(mode == "ar"), comm=comm, tuning=tuning)
        traced = op.retune(trace=True)  # the same plans, recording event times
        for K in a.K:
            for M in a.M:
                g = torch.Generator(device="cuda").manual_seed(7 + rank)
                x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
                w = torch.randn(a.N, K, device="cuda", generator=g).to(torch.bfloat16)
                for _ in range(5):
                    op(x, w)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                comm.Barrier()
                start.record()
                for _ in range(50):
                    op(x, w)
                end.record()
                end.synchronize()
                plain_us = start.elapsed_time(end) * 1e3 / 50
                for _ in range(3):
                    traced(x, w)
                traced.clear_trace()
                comm.Barrier()
                for _ in range(a.queue):  # each launch overwrites the events it reaches
                    traced(x, w)
                ev = traced.read_trace(M, K)
                op.check()
                plan = op.plan(M, K)
                everyone = comm.gather(dict(rank=rank, events=ev), root=0)
                if rank == 0:
                    print(f"\n{mode} M={M} N={a.N} K={K}: {plain_us:.1f} us untraced; plan BN={plan.bn} "
                          f"grid={plan.grid} rounds={plan.rounds} tiles={plan.num_tiles}"
                          + (" pairs along N" if plan.pair_n else "")
                          + (" push-all" if plan.push_all else "")
                          + (f"; launch {a.queue} of {a.queue} queued" if a.queue > 1 else ""))
                    sums = [_summary(r["events"]) for r in everyone]
                    names = [n for n in ev if any(n in s for s in sums)
                             and not n.startswith("tile_done_")]
                    head = "".join(f" | rank {r['rank']} min / med / max (n)" for r in everyone)
                    print(f"  {'event':16s}{head}")
                    for n in names:
                        cells = "".join(
                            f" | {s[n][0]:6.2f} {s[n][1]:6.2f} {s[n][2]:6.2f} ({s[n][3]:3d})" if n in s
                            else " |" + " " * 29 for s in sums)
                        print(f"  {n:16s}{cells}")
                    _print_rounds(everyone, plan)
                    rows.append(dict(mode=mode, M=M, N=a.N, K=K, untraced_us=plain_us, queue=a.queue,
                                     bn=plan.bn,
                                     grid=plan.grid, rounds=plan.rounds, ranks=everyone))
        traced.close()
        op.close()
    if rank == 0 and a.json_path:
        Path(a.json_path).write_text(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
