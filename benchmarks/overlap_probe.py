"""Would dedicated push SMs pay? The plain GEMM kernel on 132 - P SMs while P other SMs of the
same GPU push a fused RS call's bytes to the peer GPU, against each alone.

    python3 benchmarks/overlap_probe.py --shapes "2048,7168,1024;4096,7168,1024" --push-ctas 0,8,16,33

One process, two GPUs of one host (GPU 0 computes and pushes, GPU 1 receives; no MPI, no
symmetric memory, no multicast). For each shape and P:

- ``gemm``: the plain GEMM kernel (``GemmRsAr.gemm_only``'s plan, made for 132 - P SMs);
- ``push``: ``rsar_push_tiles`` (``multicast.nvrtc_kernels``) on P CTAs, moving the bytes a
  world-2 RS call sends (M x N / 2 bf16) as 8 KB bulk copies with the fused kernel's per-tile
  completion (wait, system fence, flag release every 64 KB);
- ``both``: the two launched together on two streams, each timed from a common event.

The fused kernel today pushes from the SMs that compute, and its mainloop slows while they
push (docs/PERF.md (j), (p)). If the GEMM on 132 - P SMs keeps its alone pace next to the
pushes, and the pushes keep theirs, a fused kernel with P push SMs would take about
max(gemm, push) plus a tile: that time is printed as ``model`` against the GEMM on every SM.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TILE_BYTES = 65536  # a 128 x 256 bf16 tile, the unit of the fused kernel's per-tile completion
BULK_BYTES = 8192


def _gemm_one_gpu() -> Any:
    spec = importlib.util.spec_from_file_location(
        "gemm_one_gpu", Path(__file__).resolve().parents[1] / "scripts" / "gemm_one_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def push_bytes(M: int, N: int) -> int:
    """Bytes one rank of a world-2 RS call sends: the peer's half of the (M, N) bf16
    partial, rounded up to whole 8 KB bulk copies."""
    return -(-(M * N) // BULK_BYTES) * BULK_BYTES


def per_cta_bytes(total: int, ctas: int, unit: int = TILE_BYTES) -> int:
    """Each CTA's share of ``total`` in whole ``unit``s (64 KB tiles, or the bytes between
    two fences), rounded up: every CTA moves the same, so each share ends on a fence."""
    return -(-total // ctas // unit) * unit


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="2048,7168,1024;4096,7168,1024;512,7168,9216",
                   help="M,N,K;M,N,K;...")
    p.add_argument("--push-ctas", default="0,8,16,24,33",
                   help="comma-separated P (0: the GEMM on every SM, no pushes)")
    p.add_argument("--fence-bytes", type=int, default=TILE_BYTES,
                   help="bytes each push CTA sends between two system fences and flag "
                        "releases (a multiple of 64 KB: 65536 is a tile, as the fused kernel "
                        "does; more batches tiles under one fence)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--self", dest="loopback", action="store_true",
                   help="push into GPU 0's own memory: a smoke test of this script on a "
                        "one-GPU host, not a link measurement")
    a = p.parse_args(argv)
    try:
        a.shape_list = [tuple(int(v) for v in s.split(",")) for s in a.shapes.split(";")]
        a.ctas = [int(v) for v in a.push_ctas.split(",")]
    except ValueError:
        p.error("--shapes takes M,N,K triples and --push-ctas ints")
    if any(len(s) != 3 or min(s) <= 0 for s in a.shape_list):
        p.error("--shapes takes M,N,K triples of positive ints, ';'-separated")
    if any(not 0 <= c <= 66 for c in a.ctas):
        p.error("--push-ctas: each P in 0..66")
    if a.iters < 1:
        p.error("--iters must be >= 1")
    if a.fence_bytes < TILE_BYTES or a.fence_bytes % TILE_BYTES:
        p.error("--fence-bytes must be a positive multiple of 65536")
    return a


def _enable_peer(torch: Any) -> None:
    from cuda.bindings import runtime as rt
    torch.cuda.set_device(0)
    err, = rt.cudaDeviceEnablePeerAccess(1, 0)
    if int(err) not in (0, int(rt.cudaError_t.cudaErrorPeerAccessAlreadyEnabled)):
        raise RuntimeError(f"cudaDeviceEnablePeerAccess(1): {err}")


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    import torch
    if torch.cuda.device_count() < 2 and not a.loopback:
        print("overlap_probe needs two GPUs of one host (--self: a smoke test on one)",
              file=sys.stderr)
        return 2
    if not a.loopback:
        _enable_peer(torch)
    from launch.cache import CACHE
    from launch.layout import WorkspaceLayout
    from multicast.nvrtc_kernels import PTR, U32, U64, KernelModule
    g1 = _gemm_one_gpu()
    dev = torch.device("cuda", 0)
    sm_count = torch.cuda.get_device_properties(dev).multi_processor_count
    lay = WorkspaceLayout.build(max(s[0] for s in a.shape_list),
                                max(s[1] for s in a.shape_list), 2)
    ws = torch.zeros(lay.total_bytes, dtype=torch.uint8, device=dev)
    err = torch.zeros(8, dtype=torch.int32, device=dev)
    from rsar_core.gemm_rsar import _pair_ctas
    km = KernelModule(0)
    most = max(push_bytes(M, N) for M, N, _ in a.shape_list)
    peer = torch.device("cuda", 0 if a.loopback else 1)
    dst = torch.empty(most + a.fence_bytes * 66, dtype=torch.uint8, device=peer)
    flags = torch.zeros(66 * 32, dtype=torch.int32, device=peer)
    s_gemm, s_push = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    rows = []
    for M, N, K in a.shape_list:
        sets = g1.input_sets(M, N, K, dev)
        nsets = len(sets)
        y = torch.empty(M, N, dtype=torch.bfloat16, device=dev)
        total = push_bytes(M, N)
        for P in a.ctas:
            sms = sm_count - P
            plan, v = g1.column_plan("default", M, N, K, sms,
                                     min(_pair_ctas(0, sm_count), sms))
            gemm = g1.launcher(CACHE.get(v), plan, y, ws, err, lay)
            per = per_cta_bytes(total, P, a.fence_bytes) if P else 0

            def push() -> None:
                km.launch("rsar_push_tiles", P, 128,
                          [(dst.data_ptr(), PTR), (flags.data_ptr(), PTR), (per, U64),
                           (a.fence_bytes, U32)], torch.cuda.current_stream(dev).cuda_stream)

            y.fill_(float("nan"))
            gemm(*sets[0])
            torch.cuda.synchronize()
            ref = sets[0][0].double() @ sets[0][1].double().t()
            rel = ((y.double() - ref).norm() / ref.norm()).item()
            if not rel < 1e-2 or err[0].item():
                raise RuntimeError(f"GEMM on {sms} SMs at {M}x{N}x{K}: rel err {rel:.2e}")
            t: dict[str, list[float]] = {"gemm": [], "push": [], "both_gemm": [],
                                         "both_push": []}
            for i in range(a.iters):
                x, w = sets[i % nsets]
                for kind in ("gemm", "push", "both") if P else ("gemm",):
                    start = torch.cuda.Event(enable_timing=True)
                    ends = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
                    torch.cuda._sleep(1_000_000)
                    start.record()
                    s_gemm.wait_event(start)
                    s_push.wait_event(start)
                    if kind in ("gemm", "both"):
                        with torch.cuda.stream(s_gemm):
                            gemm(x, w)
                            ends[0].record()
                    if kind in ("push", "both"):
                        with torch.cuda.stream(s_push):
                            push()
                            ends[1].record()
                    torch.cuda.current_stream(dev).wait_stream(s_gemm)
                    torch.cuda.current_stream(dev).wait_stream(s_push)
                    torch.cuda.synchronize()
                    if kind == "gemm":
                        t["gemm"].append(start.elapsed_time(ends[0]) * 1e3)
                    elif kind == "push":
                        t["push"].append(start.elapsed_time(ends[1]) * 1e3)
                    else:
                        t["both_gemm"].append(start.elapsed_time(ends[0]) * 1e3)
                        t["both_push"].append(start.elapsed_time(ends[1]) * 1e3)
            us = {k: statistics.median(v) for k, v in t.items() if v}
            row = {"M": M, "N": N, "K": K, "push_ctas": P, "gemm_sms": sms,
                   "fence_bytes": a.fence_bytes,
                   "push_bytes": per * P, "us": us}
            if P:
                row["push_gbps_alone"] = per * P / us["push"] / 1e3
                row["push_gbps_both"] = per * P / us["both_push"] / 1e3
                row["gemm_slowdown"] = us["both_gemm"] / us["gemm"]
            rows.append(row)
            line = f"{M} x {N} x {K}, P={P:2d}: gemm {us['gemm']:.1f} us on {sms} SMs"
            if P:
                line += (f"; push {us['push']:.1f} us ({row['push_gbps_alone']:.0f} GB/s); "
                         f"together gemm {us['both_gemm']:.1f} us "
                         f"(x{row['gemm_slowdown']:.3f}), push {us['both_push']:.1f} us "
                         f"({row['push_gbps_both']:.0f} GB/s)")
            print(line, flush=True)
    base = {(r["M"], r["N"], r["K"]): r["us"]["gemm"] for r in rows if r["push_ctas"] == 0}
    for r in rows:
        b = base.get((r["M"], r["N"], r["K"]))
        if r["push_ctas"] and b:
            r["model_us"] = max(r["us"]["both_gemm"], r["us"]["both_push"])
            print(f"{r['M']} x {r['N']} x {r['K']}, P={r['push_ctas']:2d}: model "
                  f"{r['model_us']:.1f} us = {r['model_us'] / b:.2f}x the GEMM on every SM")
    if a.json is not None:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
