"""Launch sequence for an Nsight Compute profile of one shape, under mpirun (2+ ranks).

Each rank runs, in this order: ``--reps`` x the kernel with communication compiled out
(``gemm_only``), ``--reps`` x torch.mm (cuBLAS), then ``--reps`` x the fused RS op. Profile
rank 0 only and select kernels by name, e.g. the third gemm_only launch and the first cuBLAS one:

    mpirun -n 2 bash -c 'if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then
        exec ncu --clock-control none -k regex:"Sm90FusedKernel|nvjet|xmma" \\
             --launch-skip 2 --launch-count 2 --set full -o prof \\
             python3 benchmarks/profile_gemm.py --M 8192 --N 7168 --K 4096;
      else exec python3 benchmarks/profile_gemm.py --M 8192 --N 7168 --K 4096; fi'

``--dtype e4m3 --scales tensor|row|block``: fp8 operands with those scales
(``rsar_core.reference.rank_fp8_inputs``), the anchor then torch's scaled matmul
(``rsar_core.reference.scaled_mm``: cuBLAS, or its block-wise kernel). On a one-GPU host, two
ranks share the GPU with ``RSAR_ALLOW_SHARED_GPU=1`` (the GEMM alone is still one launch).

Fused launches spin on the peer's stamps, so replaying one under ncu on one rank only works
with ``--replay-mode application`` (both ranks rerun); the default selects only non-fused
kernels by stopping after ``--launch-count``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--M", type=int, default=8192)
    p.add_argument("--N", type=int, default=7168)
    p.add_argument("--K", type=int, default=4096)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--fused", action="store_true", help="also run the fused RS op")
    p.add_argument("--epi-slots", type=int, default=0)
    p.add_argument("--band", type=int, default=None, help="unit rows per band (0: row-major; default: the plan's)")
    p.add_argument("--dtype", choices=["bf16", "e4m3"], default="bf16")
    p.add_argument("--scales", choices=["tensor", "row", "block"], default="tensor",
                   help="with --dtype e4m3: one scale each, per row, or block-wise")
    a = p.parse_args()

    import torch
    from mpi4py import MPI
    from rsar_core import GemmRsAr
    comm = MPI.COMM_WORLD
    torch.cuda.set_device(comm.Get_rank() % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator(device=dev).manual_seed(comm.Get_rank())
    fp8 = a.dtype == "e4m3"
    if fp8:
        from rsar_core.reference import rank_fp8_inputs, scaled_mm
        x, w, *scales = rank_fp8_inputs(1, comm.Get_rank(), a.M, a.N, a.K, dev,
                                        per_row=a.scales == "row", block=a.scales == "block")
    else:
        x = torch.randn(a.M, a.K, device=dev, dtype=torch.bfloat16, generator=g)
        w = torch.randn(a.N, a.K, device=dev, dtype=torch.bfloat16, generator=g)
        scales = []
    with GemmRsAr(max_M=a.M, N=a.N, comm=comm,
                  input_dtype=torch.float8_e4m3fn if fp8 else None) as op:
        for _ in range(a.reps):
            op.gemm_only(x, w, *scales, epi_slots=a.epi_slots, band=a.band)
        torch.cuda.synchronize()
        for _ in range(a.reps):
            scaled_mm(x, w, *scales) if fp8 else torch.mm(x, w.t())
        torch.cuda.synchronize()
        if a.fused:
            comm.Barrier()
            for _ in range(a.reps):
                op(x, w, *scales)
            torch.cuda.synchronize()
        comm.Barrier()


if __name__ == "__main__":
    main()
