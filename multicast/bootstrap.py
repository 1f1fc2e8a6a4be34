"""The bootstrap: the few host-side collectives that symmetric-memory setup needs.

Setup only ever moves small byte strings between the ranks of one job (handles, socket
names, ok/failed flags), so the interface is three calls: allgather, broadcast, barrier.
Two implementations cover the launchers rsar embeds into: an mpi4py communicator
(mpirun) and a torch.distributed ProcessGroup (torchrun, serving stacks).

Neither mpi4py nor torch is imported here until a caller actually hands one in:
importing ``mpi4py.MPI`` initialises MPI, which a torch-only job must not do.
"""
from __future__ import annotations

import logging
import sys
from abc import ABC, abstractmethod
from typing import Any

from .errors import BootstrapError, RsarTypeError, RsarValueError

__all__ = ["Bootstrap", "MpiBootstrap", "TorchBootstrap", "make_bootstrap"]

log = logging.getLogger("rsar.multicast")


def _check_bytes(data: Any, what: str) -> bytes:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise RsarTypeError(f"{what} takes bytes, got {type(data).__name__}")
    return bytes(data)


class Bootstrap(ABC):
    """Host-side collectives over the ranks of one job.

    Every call is collective: every rank of the group must make the same calls in the
    same order. ``rank`` and ``world`` are this process's place in the group.
    """

    rank: int
    world: int

    @abstractmethod
    def allgather(self, data: bytes) -> list[bytes]:
        """Every rank contributes ``data``; every rank gets the list indexed by rank."""

    @abstractmethod
    def broadcast(self, data: bytes | None, root: int = 0) -> bytes:
        """``root``'s ``data`` reaches every rank (other ranks may pass None)."""

    @abstractmethod
    def barrier(self) -> None:
        """Return only once every rank has entered the barrier."""

    def _check_root(self, root: int) -> int:
        if not isinstance(root, int) or isinstance(root, bool) or not 0 <= root < self.world:
            raise RsarValueError(
                f"broadcast root must be a rank in [0, {self.world}), got {root!r}")
        return root

    def _check_gathered(self, out: list[Any]) -> list[bytes]:
        # A bootstrap that silently lost or reordered a rank would corrupt every
        # handle exchange above it; check the shape once here.
        if len(out) != self.world or not all(isinstance(x, bytes) for x in out):
            raise BootstrapError(
                f"allgather returned {len(out)} entries of types "
                f"{sorted({type(x).__name__ for x in out})}, expected {self.world} bytes objects"
            )
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, world={self.world})"


class MpiBootstrap(Bootstrap):
    """Bootstrap over an mpi4py communicator (pickle-based lowercase collectives)."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.rank = int(comm.Get_rank())
        self.world = int(comm.Get_size())

    def allgather(self, data: bytes) -> list[bytes]:
        data = _check_bytes(data, "allgather")
        try:
            out = self.comm.allgather(data)
        except Exception as e:  # MPI errors are usually fatal; this covers the rest
            raise BootstrapError(f"MPI allgather failed on rank {self.rank}: {e}") from e
        return self._check_gathered(list(out))

    def broadcast(self, data: bytes | None, root: int = 0) -> bytes:
        root = self._check_root(root)
        if self.rank == root:
            data = _check_bytes(data, "broadcast")
        try:
            out = self.comm.bcast(data if self.rank == root else None, root=root)
        except Exception as e:
            raise BootstrapError(f"MPI broadcast failed on rank {self.rank}: {e}") from e
        if not isinstance(out, bytes):
            raise BootstrapError(f"MPI broadcast delivered {type(out).__name__}, expected bytes")
        return out

    def barrier(self) -> None:
        try:
            self.comm.Barrier()
        except Exception as e:
            raise BootstrapError(f"MPI barrier failed on rank {self.rank}: {e}") from e


class TorchBootstrap(Bootstrap):
    """Bootstrap over a torch.distributed ProcessGroup (None = the default group).

    Uses the object collectives, which work with gloo on CPU. With an NCCL group torch
    stages the pickled objects through the current CUDA device, so set it first.
    """

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise BootstrapError("TorchBootstrap needs torch.distributed to be initialised")
        self._dist = dist
        self.group = group
        self.rank = int(dist.get_rank(group))
        self.world = int(dist.get_world_size(group))
        if self.rank < 0:
            raise BootstrapError("this process is not a member of the given ProcessGroup")

    def _global_rank(self, group_rank: int) -> int:
        # broadcast_object_list takes a global rank for src; translate from the group's.
        if self.group is None:
            return group_rank
        return int(self._dist.get_global_rank(self.group, group_rank))

    def allgather(self, data: bytes) -> list[bytes]:
        data = _check_bytes(data, "allgather")
        out: list[Any] = [None] * self.world
        try:
            self._dist.all_gather_object(out, data, group=self.group)
        except Exception as e:
            raise BootstrapError(f"torch all_gather_object failed on rank {self.rank}: {e}") from e
        return self._check_gathered(out)

    def broadcast(self, data: bytes | None, root: int = 0) -> bytes:
        root = self._check_root(root)
        if self.rank == root:
            data = _check_bytes(data, "broadcast")
        box: list[Any] = [data if self.rank == root else None]
        try:
            self._dist.broadcast_object_list(box, src=self._global_rank(root), group=self.group)
        except Exception as e:
            raise BootstrapError(
                f"torch broadcast_object_list failed on rank {self.rank}: {e}"
            ) from e
        if not isinstance(box[0], bytes):
            raise BootstrapError(
                f"torch broadcast delivered {type(box[0]).__name__}, expected bytes"
            )
        return box[0]

    def barrier(self) -> None:
        try:
            self._dist.barrier(group=self.group)
        except Exception as e:
            raise BootstrapError(f"torch barrier failed on rank {self.rank}: {e}") from e


def _is_mpi_comm(obj: Any) -> bool:
    # Only look if mpi4py.MPI is already loaded: an mpi4py communicator cannot exist
    # otherwise, and importing it would initialise MPI as a side effect.
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and isinstance(obj, mpi.Comm)


def _is_torch_group(obj: Any) -> bool:
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return False
    pg = getattr(dist, "ProcessGroup", None)
    return pg is not None and isinstance(obj, pg)


def make_bootstrap(comm: Any = None) -> Bootstrap:
    """Turn what the caller handed in into a Bootstrap.

    Accepts a Bootstrap (returned as is), an mpi4py communicator, a torch.distributed
    ProcessGroup, or None: mpi4py's COMM_WORLD, or torch.distributed's default group where
    that is initialised and MPI sees this process alone (a torchrun launch).
    """
    if isinstance(comm, Bootstrap):
        return comm
    if comm is None:
        from mpi4py import MPI

        dist = sys.modules.get("torch.distributed")
        if (MPI.COMM_WORLD.Get_size() == 1 and dist is not None and dist.is_available()
                and dist.is_initialized() and dist.get_world_size() > 1):
            log.debug("bootstrap: no communicator given, using torch.distributed's default group")
            return TorchBootstrap(None)
        log.debug("bootstrap: no communicator given, using mpi4py COMM_WORLD")
        return MpiBootstrap(MPI.COMM_WORLD)
    if _is_mpi_comm(comm):
        return MpiBootstrap(comm)
    if _is_torch_group(comm):
        return TorchBootstrap(comm)
    raise RsarTypeError(
        "comm must be a multicast.bootstrap.Bootstrap, an mpi4py communicator, a "
        f"torch.distributed ProcessGroup or None, got {type(comm).__module__}."
        f"{type(comm).__qualname__}"
    )
