"""Which kernels torch.mm (cuBLAS) launches at given shapes, with their grid, block, shared
memory and device time: the plan cuBLAS chose, to set beside ours.

    python3 benchmarks/cublas_kernels.py --shapes "256,2880,9216;128,2880,4096" [--json OUT]

x is [M, K] and w [N, K] in bf16, y = x @ w.T as ``GemmRsAr.gemm_only`` computes it. Each
shape runs 20 warm-up calls, then 5 under torch.profiler; the kernels of the last call are
reported (a split-K plan launches a reduction kernel after the GEMM's). The nvjet names give
the CTA tile (our N x our M), BK x stages, then the cluster.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """"M,N,K;M,N,K" -> [(M, N, K), ...]; ValueError on a malformed entry."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        dims = part.split(",")
        if len(dims) != 3 or not all(d.strip().isdigit() and int(d) > 0 for d in dims):
            raise ValueError(f"a shape is M,N,K of positive integers, got {part!r}")
        out.append(tuple(int(d) for d in dims))
    return out


def kernels_of_last_call(events: list[dict], calls: int) -> list[dict]:
    """The GPU kernel events of a trace, split into ``calls`` equal runs: the last run's, each
    as name, grid, block, shared memory, registers and microseconds."""
    ks = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    if not ks or len(ks) % calls:
        raise RuntimeError(f"{len(ks)} kernels in {calls} calls: not one plan per call")
    per = len(ks) // calls
    return [{"name": e["name"], "grid": e["args"].get("grid"), "block": e["args"].get("block"),
             "smem": e["args"].get("shared memory"), "regs": e["args"].get("registers per thread"),
             "us": round(e["dur"], 1)} for e in ks[-per:]]


def profile_shape(M: int, N: int, K: int, calls: int = 5) -> list[dict]:
    import torch
    from torch.profiler import ProfilerActivity, profile
    x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    w = (torch.randn(N, K, device="cuda") / K ** 0.5).to(torch.bfloat16)
    for _ in range(20):
        torch.mm(x, w.t())
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            torch.mm(x, w.t())
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    return kernels_of_last_call(events, calls)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", required=True, help='"M,N,K;M,N,K..."')
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    shapes = parse_shapes(a.shapes)
    rows: list[Any] = []
    for M, N, K in shapes:
        ks = profile_shape(M, N, K)
        rows.append({"M": M, "N": N, "K": K, "kernels": ks})
        print(f"{M} x {N} x {K}: " + "; ".join(
            f"{k['name'][:90]} grid={k['grid']} block={k['block']} smem={k['smem']} "
            f"regs={k['regs']} {k['us']} us" for k in ks), flush=True)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
