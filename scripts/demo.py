#!/usr/bin/env python3
"""rsar's main job: the fused GEMM + reduce-scatter / all-reduce, checked and timed.

    mpirun -n 2 python3 scripts/demo.py [--M 1000 4096] [--N 7168] [--K 4096] [--iters 20]

Every rank (one GPU each) builds a GemmRsAr for reduce-scatter (RS) and one for all-reduce
(AR), runs each shape on seeded random inputs, compares the result with a float32
reference of sum_r x_r @ w_r.T (relative error must stay below 1e-2) and times the fused
op (median of --iters calls, CUDA events). Rank 0 prints every rank's report.

Exit status, the same on every rank: 0 every check passed, 1 a check failed,
2 this host cannot run the fused op (no CUDA GPU, one rank, too few GPUs, no kernel
for this GPU): one plain sentence from rank 0 says which (2 is also argparse's exit
for a bad command line).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CANNOT_RUN = 2

TOL = 1e-2
MAX_M = 8192
HINT = "run scripts/mc_diag.py for details"

_WORLD_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")
_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")


def _env_int(names: tuple[str, ...], default: int) -> int:
    for v in names:
        val = os.environ.get(v)
        if val:
            try:
                return int(val)
            except ValueError:
                pass
    return default


def launcher_world() -> int:
    """World size as the MPI launcher set it (1 when started by hand)."""
    return _env_int(_WORLD_VARS, 1)


def launcher_rank() -> int:
    return _env_int(_RANK_VARS, 0)


def cannot_run_reason(cuda_available: bool, device_count: int, world: int,
                      capability: tuple[int, int] | None, gpu_name: str = "") -> str | None:
    """Why this host cannot run the demo, as one plain sentence; None when it can."""
    if not cuda_available or device_count < 1:
        return ("rsar demo: no CUDA GPU on this host; the fused op needs 2+ NVLink-connected "
                f"GPUs ({HINT})")
    if device_count < 2:
        return (f"rsar demo: only 1 CUDA GPU on this host; the fused op needs 2+ "
                f"NVLink-connected GPUs ({HINT})")
    if world < 2:
        return ("rsar demo: started as a single process; run one rank per GPU, e.g. "
                "`mpirun -n 2 python3 scripts/demo.py`")
    if world > device_count:
        return (f"rsar demo: {world} ranks but only {device_count} CUDA GPUs on this host; "
                f"run at most one rank per GPU (mpirun -n {device_count} ...)")
    from rsar_core.gemm_rsar import kernel_arch_for  # repo root is on sys.path (above)
    if capability is not None and kernel_arch_for(tuple(capability)) is None:
        cc = f"{capability[0]}.{capability[1]}"
        return (f"rsar demo: no rsar kernel for this GPU yet ({gpu_name or 'GPU'}, compute "
                f"capability {cc}); rsar has kernels for compute capability 9.0, 10.0 and 10.3")
    return None


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--M", type=int, nargs="+", default=[1000, 4096], help="rows of x (<= 8192)")
    p.add_argument("--N", type=int, default=7168, help="rows of w, columns of the output")
    p.add_argument("--K", type=int, default=4096, help="the reduced (sharded) dimension")
    p.add_argument("--iters", type=int, default=20, help="timed calls per case")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if any(not 0 < m <= MAX_M for m in args.M):
        p.error(f"--M values must be in 1..{MAX_M}")
    if args.iters < 1:
        p.error("--iters must be >= 1")
    return args


def _say(msg: str) -> None:
    if launcher_rank() == 0:
        print(msg, flush=True)


def time_op(torch: Any, op: Any, x: Any, w: Any, iters: int, warmup: int = 3) -> float:
    """Median time of one fused call in microseconds (CUDA events on the current stream)."""
    for _ in range(warmup):
        op(x, w)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        s.record()
        op(x, w)
        e.record()
    torch.cuda.synchronize()
    op.check()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e3


def run_case(torch: Any, op: Any, seed: int, M: int, K: int, iters: int) -> dict[str, Any]:
    from rsar_core.reference import rank_inputs, reference_sum, rel_error, rs_rows

    dev = op.device
    x, w = rank_inputs(seed, op.rank, M, op.N, K, dev)
    y = op(x, w)
    torch.cuda.synchronize()
    op.check()
    ref = reference_sum(seed, op.world, M, op.N, K, dev)
    if not op.all_reduce:
        ref = rs_rows(ref, op.rank, op.world)
    ref_shape = tuple(ref.shape)
    shape_ok = tuple(y.shape) == ref_shape
    err = rel_error(y, ref) if shape_ok else float("inf")
    del ref
    us = time_op(torch, op, x, w, iters)
    tflops = 2.0 * M * op.N * K / (us * 1e-6) / 1e12
    return {"out": tuple(y.shape), "err": err, "us": us, "tflops": tflops,
            "ok": shape_ok and err < TOL, "error": None if shape_ok else
            f"output shape {tuple(y.shape)}, expected {ref_shape}"}


def report_lines(rank: int, world: int, gpu: str, rows: list[dict[str, Any]]) -> list[str]:
    lines = [f"rank {rank}/{world} on {gpu}"]
    for r in rows:
        head = (f"  {r['mode'].upper()}  M={r['M']:<5d} N={r['N']} K={r['K']}  "
                f"{r['transport']:<9s}")
        if r.get("error"):
            lines.append(f"{head} FAIL  {r['error']}")
            continue
        out = "x".join(str(d) for d in r["out"])
        verdict = "ok  " if r["ok"] else "FAIL"
        lines.append(f"{head} out {out:<11s} rel err {r['err']:.2e} {verdict}  "
                     f"median {r['us']:8.1f} us ({r['tflops']:.0f} TFLOP/s per rank)")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    world = launcher_world()
    try:
        import torch
    except ImportError as e:
        _say(f"rsar demo: torch is not installed ({e}); pip install -e . first")
        return EXIT_CANNOT_RUN

    cuda = torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
    cap = name = None
    if cuda and count >= 2 and 2 <= world <= count:
        dev_index = launcher_rank() % count
        cap = tuple(torch.cuda.get_device_capability(dev_index))
        name = torch.cuda.get_device_name(dev_index)
    why = cannot_run_reason(cuda, count, world, cap, name or "")
    if why:
        _say(why)  # every rank sees the same host, so every rank stops here alike
        return EXIT_CANNOT_RUN

    from mpi4py import MPI

    from rsar_core import GemmRsAr

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    gpu = f"{torch.cuda.get_device_name()} (device {torch.cuda.current_device()})"
    if rank == 0:
        print(f"rsar demo: {world} ranks, N={args.N} K={args.K}, M in {args.M}, "
              f"median of {args.iters} calls", flush=True)

    rows: list[dict[str, Any]] = []
    for all_reduce in (False, True):
        mode = "ar" if all_reduce else "rs"
        try:
            op = GemmRsAr(max_M=MAX_M, N=args.N, all_reduce=all_reduce, comm=comm)
        except Exception as e:
            rows += [{"mode": mode, "M": M, "N": args.N, "K": args.K, "transport": "-",
                      "ok": False, "error": f"construction: {type(e).__name__}: {e}"}
                     for M in args.M]
            continue
        try:
            for i, M in enumerate(args.M):
                row = {"mode": mode, "M": M, "N": args.N, "K": args.K,
                       "transport": op.transport}
                try:
                    row.update(run_case(torch, op, args.seed + 17 * i, M, args.K, args.iters))
                except Exception as e:
                    row.update(ok=False, error=f"{type(e).__name__}: {e}")
                rows.append(row)
        finally:
            op.close()

    nfail = sum(not r["ok"] for r in rows)
    reports = comm.gather(report_lines(rank, world, gpu, rows), root=0)
    total = comm.allreduce(len(rows), op=MPI.SUM)
    failed = comm.allreduce(nfail, op=MPI.SUM)
    if rank == 0:
        for lines in reports:
            print("\n".join(lines))
        if failed:
            print(f"rsar demo: {failed} of {total} checks FAILED", flush=True)
        else:
            print(f"rsar demo: all {total} checks passed (rel err < {TOL:g})", flush=True)
    return EXIT_FAILED if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
