"""The GEMM alone against cuBLAS and CUTLASS's public CuTe DSL Hopper persistent GEMM, on the
data the benchmark draws (random normal) and on small integers (what that example draws).

    mpirun -n 2 python3 benchmarks/gemm_anchor.py \\
        --example ~/cutlass/examples/python/CuTeDSL/cute/hopper/kernel/dense_gemm/dense_gemm_persistent.py

One process per GPU (each times its own GPU; rank 0 prints). Tensor cores draw less power on
integer-valued inputs, so a power-capped H200 clocks higher on them: every kernel runs 8-10%
faster there (docs/PERF.md (j)), which is why a kernel must be compared with cuBLAS on the
same data. Without ``--example`` only cuBLAS and ours are timed.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = [(8192, 7168, 4096), (2048, 7168, 4096), (16384, 7168, 1024), (2048, 7168, 1024),
          (512, 7168, 1024), (4096, 7168, 9216)]
L2_BYTES = 60 * 2**20


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--example", type=Path, default=None,
                   help="path of CUTLASS's dense_gemm_persistent.py (Hopper, CuTe DSL)")
    p.add_argument("--shapes", default=None, help="M,N,K;M,N,K;... (default: six grid shapes)")
    p.add_argument("--iters", type=int, default=30)
    a = p.parse_args()
    if a.example is not None and not a.example.is_file():
        p.error(f"--example {a.example}: no such file")
    a.shape_list = SHAPES if a.shapes is None else [
        tuple(int(v) for v in s.split(",")) for s in a.shapes.split(";")]
    if any(len(s) != 3 or min(s) <= 0 for s in a.shape_list):
        p.error("--shapes takes M,N,K triples of positive ints, ';'-separated")
    return a


def median_us(torch: Any, fn: Callable, sets: list, iters: int) -> float:
    """Median of ``iters`` calls, each alone behind a GPU sleep, inputs rotating over sets."""
    for i in range(3):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    times = []
    for i in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(200_000)
        start.record()
        fn(*sets[i % len(sets)])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def example_kernel(path: Path, cluster: tuple[int, int]) -> Any:
    """The example's kernel class, built for 128x256 tiles on ``cluster``."""
    import cutlass
    spec = importlib.util.spec_from_file_location("cute_dsl_persistent_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.HopperWgmmaGemmPersistentKernel(cutlass.Float32, (128, 256), cluster, 1, True)


def main() -> int:
    a = parse()
    from mpi4py import MPI
    import torch
    comm = MPI.COMM_WORLD
    torch.cuda.set_device(comm.rank % torch.cuda.device_count())
    from rsar_core import GemmRsAr
    op = GemmRsAr(max(s[0] for s in a.shape_list), a.shape_list[0][1], comm=comm)
    examples: dict = {}
    if a.example is not None:
        import cuda.bindings.driver as cuda
        import cutlass
        import cutlass.cute as cute
        from cutlass.cute.runtime import from_dlpack
        stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
        hw = cutlass.utils.HardwareInfo()

        def as_cute(t):  # (rows, cols) row-major -> (rows, cols, 1), the example's mnkl view
            return from_dlpack(t.unsqueeze(0).permute(1, 2, 0),
                               assumed_align=16).mark_layout_dynamic(leading_dim=1)
    try:
        for M, N, K in a.shape_list:
            if N != op.N:
                op.close()
                op = GemmRsAr(max(s[0] for s in a.shape_list), N, comm=comm)
            nsets = max(2, math.ceil(3 * L2_BYTES / ((M * K + N * K) * 2)))
            rows = {}
            for data in ("normal", "integers"):
                def draw(shape):
                    if data == "normal":
                        return torch.randn(shape, device="cuda").to(torch.bfloat16)
                    return torch.randint(-2, 2, shape, device="cuda").to(torch.bfloat16)
                sets = [(draw((M, K)), draw((N, K))) for _ in range(nsets)]
                rows[f"cublas/{data}"] = median_us(torch, lambda x, w: torch.mm(x, w.t()), sets,
                                                   a.iters)
                rows[f"rsar/{data}"] = median_us(torch, op.gemm_only, sets, a.iters)
                for cluster in ((1, 1), (2, 1)) if a.example is not None else ():
                    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
                    csets = [(as_cute(x), as_cute(w), as_cute(out)) for x, w in sets]
                    if cluster not in examples:
                        examples[cluster] = cute.compile(
                            example_kernel(a.example, cluster), *csets[0],
                            hw.get_max_active_clusters(cluster[0] * cluster[1]), stream)
                    f = examples[cluster]
                    rows[f"example {cluster[0]}x{cluster[1]}/{data}"] = median_us(
                        torch, lambda x, w, c, f=f: f(x, w, c, stream), csets, a.iters)
                    x, w = sets[0]
                    f(*csets[0], stream)
                    ref = x.float() @ w.float().t()
                    err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
                    if err > 1e-2:
                        raise RuntimeError(f"example {cluster} at {M}x{N}x{K}: rel err {err:.2e}")
                del sets
            if comm.rank == 0:
                flop = 2 * M * N * K
                print(f"{M} x {N} x {K}")
                for name, us in rows.items():
                    print(f"  {name:24s} {us:9.1f} us {flop / us / 1e6:6.0f} TFLOP/s "
                          f"(cuBLAS on the same data / this: "
                          f"{rows['cublas/' + name.split('/')[1]] / us:.3f})", flush=True)
    finally:
        op.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
