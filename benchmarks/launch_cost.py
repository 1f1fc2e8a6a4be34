"""The fixed cost of one call: tiny-work calls queued back to back, under mpirun.

    mpirun -n 2 python3 benchmarks/launch_cost.py [--N 7168] [--M 128 2048] [--K 64 1024] [--no-pdl]

For each (M, K), microseconds per call (the slower rank's) of a 1-element torch op,
torch.mm, our GEMM alone, and GemmRsAr RS and AR, timed two ways: one CUDA event pair per
call (as ``scripts/bench.py`` times; the median), and one pair around ``--iters`` queued
calls (divided by their number), and the host's microseconds per call while queuing those.
The first minus the second is what a per-call event pair adds; our columns minus torch.mm's at K=64 are the launch's and the protocol's own costs.
"""
from __future__ import annotations

import argparse
import statistics
import time
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--N", type=int, default=7168)
    p.add_argument("--M", type=int, nargs="+", default=[128, 2048])
    p.add_argument("--K", type=int, nargs="+", default=[64, 1024])
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--no-pdl", action="store_true",
                   help="also time our three without programmatic dependent launch (*_nopdl; "
                        "on by default on sm90)")
    a = p.parse_args()
    import torch

    from rsar_core.launcher import rank_on_gpu
    started = rank_on_gpu("launch_cost.py")
    if started is None:
        return 2
    comm, rank, dev = started
    from rsar_core import GemmRsAr
    from rsar_core.reference import rank_inputs
    ops = {m: GemmRsAr(max_M=max(a.M), N=a.N, all_reduce=(m == "ar"), comm=comm)
           for m in ("rs", "ar")}
    nopdl: dict = {}  # --no-pdl: the same ops without programmatic dependent launch
    one = torch.zeros(1, device=dev)

    host = [0.0]  # host microseconds per queued call, the slower rank's

    def timed(fn, per_call: bool) -> float:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        comm.Barrier()
        # hold the stream while the host queues every call (GPU time only, as bench.py)
        torch.cuda._sleep(int(a.iters * 150e-6 * 2e9) + 2_000_000)
        if per_call:
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(a.iters)]
            for s, e in ev:
                s.record()
                fn()
                e.record()
            torch.cuda.synchronize()
            us = statistics.median(s.elapsed_time(e) for s, e in ev) * 1e3
        else:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            t0 = time.perf_counter()
            for _ in range(a.iters):
                fn()
            queued_us = (time.perf_counter() - t0) * 1e6 / a.iters
            e.record()
            torch.cuda.synchronize()
            host[0] = max(comm.allgather(queued_us))
            us = s.elapsed_time(e) * 1e3 / a.iters
        return max(comm.allgather(us))

    try:
        if a.no_pdl:  # on the ops' workspaces; collective: every rank builds them, once
            nopdl.update((m, op.retune(pdl=False)) for m, op in ops.items())
        for M in a.M:
            for K in a.K:
                x, w = rank_inputs(7 + M + K, rank, M, a.N, K, dev)
                cols = {"1-element op": lambda: one.add_(1),
                        "torch.mm": lambda: torch.mm(x, w.t()),
                        "gemm_only": lambda: ops["rs"].gemm_only(x, w),
                        "rsar_rs": lambda: ops["rs"](x, w),
                        "rsar_ar": lambda: ops["ar"](x, w)}
                if nopdl:
                    cols["gemm_only_nopdl"] = lambda: nopdl["rs"].gemm_only(x, w)
                    cols["rsar_rs_nopdl"] = lambda: nopdl["rs"](x, w)
                    cols["rsar_ar_nopdl"] = lambda: nopdl["ar"](x, w)
                for name, fn in cols.items():
                    each, queued = timed(fn, True), timed(fn, False)
                    if rank == 0:
                        print(f"M={M:5d} N={a.N} K={K:5d} {name:14s} events per call {each:7.2f} us"
                              f" | one pair per {a.iters} calls {queued:7.2f} us"
                              f" | host {host[0]:6.2f} us", flush=True)
    finally:
        for op in (*nopdl.values(), *ops.values()):
            op.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
