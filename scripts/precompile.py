"""Fill an rsar kernel cache ahead of deployment (no GPU needed), for one arch and world size.

    python3 scripts/precompile.py --arch sm_90a --world 2 --out /opt/rsar-kernels
    RSAR_KERNEL_CACHE=/opt/rsar-kernels mpirun -n 2 python3 my_worker.py

Every variant a GemmRsAr of that arch and world can launch is compiled: BN 128 and 256,
modes rs / ar / gemm, the transports, and (sm100) 1- and 2-CTA. Compiles run in parallel
processes.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def variants(arch: str, world: int, transports: list[str]) -> list:
    from launch.cache import Variant, default_push
    from launch.plan import BLACKWELL
    groups = (1, 2) if arch in BLACKWELL else (1,)
    return [Variant(arch, bn, world, mode, tr, cg, push=default_push(arch, tr, mode)) for bn in (128, 256)
            for mode in ("rs", "ar", "gemm") for tr in transports for cg in groups
            if not (mode == "gemm" and tr == "multicast")]


def _build(args: tuple) -> tuple[str, float]:
    v, out = args
    from launch import disk_cache
    from launch.cache import compile_variant
    t0 = time.perf_counter()
    disk_cache.store(v, compile_variant(v, exportable=True), Path(out))
    return v.describe(), time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", required=True, choices=["sm_90a", "sm_100a", "sm_103a"])
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--transports", default="unicast,multicast")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = p.parse_args()
    todo = [(v, a.out) for v in variants(a.arch, a.world, a.transports.split(","))]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        for name, dt in pool.map(_build, todo):
            print(f"  {name}: {dt:.1f} s", flush=True)
    print(f"rsar precompile: {len(todo)} variants for {a.arch}, world {a.world}, into {a.out} "
          f"in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
