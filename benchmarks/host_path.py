"""Where a call's host microseconds go: the op's Python path piece by piece, under mpirun.

    mpirun -n 2 python3 benchmarks/host_path.py [--M 128] [--N 7168] [--K 1024] [--json out.json]

An eager serving loop pays the host path of every call; where it is longer than the
kernel (small M), the host, not the GPU, sets the pace. For one shape this prints the CPU
microseconds per call (median of ``--repeats`` loops of ``--iters`` calls, the slower
rank's) of: a one-element torch op and torch.mm (anchors), ``GemmRsAr`` RS / AR /
``gemm_only`` as a caller sees them, and each step of the call on its own (input checks,
the error word, the plan lookup, the output allocation, the stream lookup, the stream
order, the launch, the autograd guard; ``--calls-only`` leaves them out). ``--profile FILE`` also writes a cProfile of the
RS call. With ``RSAR_ALLOW_SHARED_GPU=1`` the ranks may share one GPU: the host figures
hold, the kernels only run slower.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def per_call_us(fn: Callable[[], Any], iters: int, repeats: int, sync: Callable[[], None]) -> float:
    """Median over ``repeats`` loops of the CPU microseconds per call of ``fn``; the GPU is
    drained between loops so a full launch queue never blocks the host."""
    for _ in range(min(iters, 20)):
        fn()
    sync()
    loops = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        loops.append((time.perf_counter() - t0) * 1e6 / iters)
        sync()
    return statistics.median(loops)


def steps(op: Any, x: Any, w: Any, y: Any) -> dict[str, Callable[[], Any]]:
    """Each step of ``GemmRsAr.__call__`` on its own (the launch is the plain GEMM's, which
    is not collective; its host path is the fused kernels')."""
    import torch

    from rsar_core.gemm_rsar import inference_only
    from rsar_core.ordering import raw_stream
    from rsar_core.validate import check_call
    M, K = x.shape
    prepared = op._prepare(M, K, "gemm")
    _, fn, fixed = prepared
    order, index = op.workspace.order, op.device.index
    stream = raw_stream(index)
    head = (x.data_ptr(), w.data_ptr(), y.data_ptr(), 0, 0, 0, 0)  # no fp8 scales, no bias
    return {
        "check_call": lambda: check_call(x, w, op.max_M, op.N, op.device),
        "check (error word)": op.check,
        "plan lookup": lambda: op._prepare(M, K, op.mode),
        "torch.empty (output)": lambda: torch.empty((M, op.N), dtype=torch.bfloat16,
                                                    device=op.device),
        "stream handle": lambda: raw_stream(index),
        "stream order": lambda: order.before_launch(stream, op.device),
        "tensor pointers": lambda: (x.data_ptr(), w.data_ptr(), y.data_ptr()),
        "launch (kernel entry)": lambda: fn.call_with(head, fixed, stream),
        "launch (all of it)": lambda: op._launch_prepared(prepared, x, w, y),
        "autograd guard": lambda: inference_only(y, x, w),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--M", type=int, default=128)
    p.add_argument("--N", type=int, default=7168)
    p.add_argument("--K", type=int, default=1024)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--profile", type=Path, default=None)
    p.add_argument("--calls-only", action="store_true",
                   help="time the whole calls only, not each step (for comparing builds)")
    a = p.parse_args(argv)
    import torch

    from rsar_core.launcher import rank_on_gpu
    started = rank_on_gpu("host_path.py")
    if started is None:
        return 2
    comm, rank, dev = started
    from rsar_core import GemmRsAr
    from rsar_core.reference import rank_inputs
    x, w = rank_inputs(11, rank, a.M, a.N, a.K, dev)
    y = torch.empty(a.M, a.N, dtype=torch.bfloat16, device=dev)
    one = torch.zeros(1, device=dev)

    def sync() -> None:
        torch.cuda.synchronize()
        comm.Barrier()

    rows: dict[str, float] = {}
    with torch.inference_mode(), GemmRsAr(a.M, a.N, comm=comm) as rs, \
            GemmRsAr(a.M, a.N, all_reduce=True, workspace=rs.workspace) as ar:
        calls = {"1-element torch op": lambda: one.add_(1),
                 "torch.mm": lambda: torch.mm(x, w.t(), out=y),
                 "rsar RS op(x, w)": lambda: rs(x, w),
                 "rsar AR op(x, w)": lambda: ar(x, w),
                 "gemm_only(x, w)": lambda: rs.gemm_only(x, w)}
        if not a.calls_only:
            calls["rsar AR op(x, w, out=y)"] = lambda: ar(x, w, out=y)
            calls.update({"  " + k: f for k, f in steps(rs, x, w, y).items()})
        for name, fn in calls.items():
            us = per_call_us(fn, a.iters, a.repeats, sync)
            rows[name] = max(comm.allgather(us))
        if a.profile is not None:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(a.iters):
                rs(x, w)
            prof.disable()
            sync()
            if rank == 0:
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
                a.profile.write_text(out.getvalue())
    if rank == 0:
        print(f"host microseconds per call, M={a.M} N={a.N} K={a.K}, slower rank, "
              f"median of {a.repeats} x {a.iters} calls")
        for name, us in rows.items():
            print(f"{name:26s} {us:7.2f}")
        if a.json is not None:
            a.json.write_text(json.dumps({"M": a.M, "N": a.N, "K": a.K, "us": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
