"""First-call latency of a new worker, with or without a precompiled kernel cache.

    mpirun -n 2 python3 benchmarks/cold_start.py                                  # compiles
    RSAR_KERNEL_CACHE=DIR mpirun -n 2 python3 benchmarks/cold_start.py            # loads

Reports, slowest rank: constructing GemmRsAr (workspace setup), the first call (kernel
compile or cache load, plus the launch), and a second call, each to completion.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--M", type=int, default=4096)
    p.add_argument("--N", type=int, default=7168)
    p.add_argument("--K", type=int, default=4096)
    p.add_argument("--json", dest="json_path")
    a = p.parse_args()
    t_start = time.perf_counter()
    from mpi4py import MPI
    import torch
    from rsar_core import GemmRsAr
    from rsar_core.reference import rank_inputs
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    x, w = rank_inputs(0, rank, a.M, a.N, a.K, dev)
    torch.cuda.synchronize()
    t_imports = time.perf_counter() - t_start
    comm.Barrier()

    def timed(fn):
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        return out, time.perf_counter() - t0

    op, t_ctor = timed(lambda: GemmRsAr(a.M, a.N, comm=comm))
    _, t_first = timed(lambda: op(x, w))
    _, t_second = timed(lambda: op(x, w))
    op.check()
    op.close()
    res = {k: max(comm.allgather(v)) for k, v in
           dict(imports_s=t_imports, construct_s=t_ctor, first_call_s=t_first,
                second_call_s=t_second).items()}
    res.update(cache=os.environ.get("RSAR_KERNEL_CACHE", "") or "off", M=a.M, N=a.N, K=a.K)
    if rank == 0:
        print(f"rsar cold start (kernel cache: {res['cache']}): construct {res['construct_s']*1e3:.0f} ms, "
              f"first call {res['first_call_s']*1e3:.0f} ms, second call {res['second_call_s']*1e3:.1f} ms "
              f"(imports + CUDA init {res['imports_s']:.1f} s), M={a.M} N={a.N} K={a.K}")
        if a.json_path:
            Path(a.json_path).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
