"""The start of the mpirun-launched measurement scripts: one rank per GPU, or a sentence."""
from __future__ import annotations

from typing import Any


def rank_on_gpu(script: str) -> tuple[Any, int, Any] | None:
    """(COMM_WORLD, this rank, its torch device) with the rank's GPU made current; or None
    after printing why not (no CUDA GPU, or fewer than two ranks)."""
    import torch
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    if not torch.cuda.is_available() or comm.Get_size() < 2:
        print(f"{script} needs 2+ ranks under mpirun, each with a CUDA GPU")
        return None
    rank = comm.Get_rank()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    return comm, rank, torch.device("cuda", torch.cuda.current_device())
