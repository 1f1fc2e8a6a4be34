"""Where a worker process stands in its job: rank, world and local rank as mpirun or torchrun
set them, and torch.distributed started beside an MPI communicator.

The environment readers take ``env`` (default ``os.environ``) and never touch MPI, torch or a
GPU, so a worker can decide what to say before anything slow or fallible starts.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Open MPI, then MPICH / Intel MPI (PMI), then PMIx launchers.
MPI_WORLD_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")
MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
MPI_LOCAL_WORLD_VARS = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")
MPI_LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
TORCHRUN_MARK = "TORCHELASTIC_RUN_ID"  # set by torchrun for its workers


def env_int(names: tuple[str, ...], default: int, env: Mapping[str, str] | None = None) -> int:
    """The first of ``names`` set to an integer in ``env``, else ``default``."""
    env = os.environ if env is None else env
    for name in names:
        val = env.get(name)
        if val:
            try:
                return int(val)
            except ValueError:  # a malformed value: the next name may still answer
                pass
    return default


def world_size(torchrun: bool, env: Mapping[str, str] | None = None) -> int:
    """World size as the launcher set it (1 when started by hand)."""
    return env_int(("WORLD_SIZE",) if torchrun else MPI_WORLD_VARS, 1, env)


def rank(torchrun: bool, env: Mapping[str, str] | None = None) -> int:
    """This process's rank as the launcher set it (0 when started by hand)."""
    return env_int(("RANK",) if torchrun else MPI_RANK_VARS, 0, env)


def local_world_size(torchrun: bool, env: Mapping[str, str] | None = None) -> int:
    """Ranks on this host, which must fit on its GPUs (the world where the launcher says
    nothing more precise)."""
    if torchrun:
        return env_int(("LOCAL_WORLD_SIZE", "WORLD_SIZE"), 1, env)
    return env_int(MPI_LOCAL_WORLD_VARS + MPI_WORLD_VARS, 1, env)


def local_rank(torchrun: bool, env: Mapping[str, str] | None = None) -> int:
    """This process's rank among those on its host (the global rank where an MPI launcher
    does not say)."""
    if torchrun:
        return env_int(("LOCAL_RANK",), 0, env)
    return env_int(MPI_LOCAL_RANK_VARS, rank(False, env), env)


def gpu_index(torchrun: bool, device_count: int, env: Mapping[str, str] | None = None) -> int:
    """The GPU this rank takes: LOCAL_RANK under torchrun, the rank modulo the visible GPUs
    under mpirun (one host)."""
    return (local_rank(True, env) if torchrun else rank(False, env)) % max(device_count, 1)


def started_by_torchrun(env: Mapping[str, str] | None = None) -> bool:
    """Whether torchrun started this process (and no MPI launcher did: mpirun can run a
    script that itself came from a torchrun job's environment)."""
    env = os.environ if env is None else env
    return bool(env.get(TORCHRUN_MARK)) and not any(env.get(v) for v in MPI_WORLD_VARS)


def printing_rank(torchrun: bool, env: Mapping[str, str] | None = None) -> int:
    """The rank to print a refusal (rank 0 speaks, the others stay quiet), whichever
    launcher started the job, also when a torchrun job forgot to say so."""
    return rank(torchrun or started_by_torchrun(env), env)


def free_port() -> int:
    """A TCP port on the loopback interface that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Distributed:
    """torch.distributed is up on ``device``; ``mpi_comm`` is mpi4py's COMM_WORLD under
    mpirun, None under torchrun."""

    rank: int
    world: int
    device: Any
    mpi_comm: Any = None

    @property
    def comm(self) -> Any:
        """The communicator to give GemmRsAr: the MPI one, else the default ProcessGroup."""
        if self.mpi_comm is not None:
            return self.mpi_comm
        import torch.distributed as dist
        return dist.group.WORLD


def init_distributed(torchrun: bool, backend: str = "nccl") -> Distributed:
    """Make this rank's GPU current and start torch.distributed on it.

    torchrun: from its environment, GPU = LOCAL_RANK. mpirun: over a TCP rendezvous on
    127.0.0.1 whose port rank 0 broadcasts over COMM_WORLD (one host), GPU = rank modulo
    the visible GPUs.
    """
    import torch
    import torch.distributed as dist
    dev = torch.device("cuda", gpu_index(torchrun, torch.cuda.device_count()))
    torch.cuda.set_device(dev)
    if torchrun:
        dist.init_process_group(backend, device_id=dev)
        return Distributed(dist.get_rank(), dist.get_world_size(), dev)
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    r, w = comm.Get_rank(), comm.Get_size()
    port = comm.bcast(free_port() if r == 0 else None)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=r,
                            world_size=w, device_id=dev)
    return Distributed(r, w, dev, comm)


def rank_on_gpu(script: str) -> tuple[Any, int, Any] | None:
    """(COMM_WORLD, this rank, its torch device) with the rank's GPU made current, for a
    measurement started under mpirun; or None after printing why not (no CUDA GPU, or fewer
    than two ranks)."""
    import torch
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    if not torch.cuda.is_available() or comm.Get_size() < 2:
        print(f"{script} needs 2+ ranks under mpirun, each with a CUDA GPU")
        return None
    r = comm.Get_rank()
    torch.cuda.set_device(r % torch.cuda.device_count())
    return comm, r, torch.device("cuda", torch.cuda.current_device())


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj`` over torch.distributed's default group, in rank order."""
    import torch.distributed as dist
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank, over torch.distributed's default group."""
    import torch.distributed as dist
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
