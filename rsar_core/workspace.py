"""The symmetric workspace one or more GemmRsAr frontends launch into.

A workspace is one SymmetricMemory allocation laid out by ``launch.layout`` for the largest
(max_M, N) it must serve, its host-mapped error record, and the launch ordering of the
device. RS and AR frontends, and frontends of different N, can share one instead of each
holding a max_M x N buffer and its flags: they launch one after another, and the shared
epoch counts their launches.
"""
from __future__ import annotations

import logging
import os
import socket
from typing import Any

import torch

from launch.layout import WorkspaceLayout
from multicast.bootstrap import Bootstrap, make_bootstrap
from multicast.symmetric import SymmetricMemory

from .errors import ClosedError, UnsupportedError
from .ordering import LaunchOrder
from .validate import SHARED_GPU_ENV, check_construction, check_one_gpu_per_rank

log = logging.getLogger("rsar")


def _gpu_identity(device: torch.device) -> str:
    """Host and UUID of ``device`` ("" if this torch cannot tell): equal on two ranks only
    when they share the GPU."""
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return f"{socket.gethostname()} GPU-{uuid}" if uuid else ""


# The multicast kernels are compiled and PTX-checked, but have not run on a GPU: the machines
# rsar was built on forbid multicast. Until they have, the op takes them only when asked.
AUTO_UNICAST = ("unicast, since rsar's multicast kernels have not been validated on a GPU "
                "yet (RSAR_MULTICAST=on uses them)")


# Notices already logged by this process (ranks sharing one GPU)
_NOTICES: set[str] = set()


class Workspace:
    """Symmetric memory for frontends with ``max_M`` and ``N`` up to the given ones.

    Collective: construct and close it on every rank of ``comm``, in the same order.
    Frontends that share it must be used from one thread; calls on different streams are
    ordered (see ``rsar_core.ordering``).
    """

    def __init__(self, max_M: int, N: int, comm: Any = None) -> None:
        self._mem: SymmetricMemory | None = None
        self.bootstrap: Bootstrap = make_bootstrap(comm)
        check_construction(max_M, N, self.bootstrap.world)
        if not torch.cuda.is_available():
            raise UnsupportedError("rsar needs a CUDA device; none is visible")
        self.max_M, self.N = max_M, N
        self.rank, self.world = self.bootstrap.rank, self.bootstrap.world
        self.device = torch.device("cuda", torch.cuda.current_device())
        # Every rank decides from the same gathered data, so all raise or none does.
        allow = os.environ.get(SHARED_GPU_ENV, "") == "1"
        got = [g.decode().split("|", 1) for g in self.bootstrap.allgather(
            f"{int(allow)}|{_gpu_identity(self.device)}".encode())]
        shared = check_one_gpu_per_rank([gpu for _, gpu in got],
                                        all(flag == "1" for flag, _ in got))
        if shared and shared not in _NOTICES:
            _NOTICES.add(shared)  # once per process: every workspace of a test run shares it
            log.warning("%s", shared)
        need = self.bytes_needed(max_M, N, self.world)  # the transport is known after setup
        self._mem = SymmetricMemory(need, self.bootstrap, device=self.device.index,
                                    auto_off=AUTO_UNICAST)
        self.transport = self._mem.transport
        self.layout = WorkspaceLayout.build(max_M, N, self.world, self.transport)
        # Host-mapped error record: the kernel reports a timed-out wait here and the host
        # reads it without synchronising the stream.
        self.err = torch.zeros(8, dtype=torch.int32, pin_memory=True)
        self.err_np = self.err.numpy()
        self.order = LaunchOrder.for_device(self.device)
        log.debug("workspace rank %d/%d max_M=%d N=%d: %d bytes, transport=%s, handles=%s, "
                  "policy: %s", self.rank, self.world, max_M, N, self._mem.nbytes,
                  self.transport, self._mem.handle_type, self._mem.policy_reason)

    @staticmethod
    def bytes_needed(max_M: int, N: int, world: int) -> int:
        """Device memory one rank's workspace takes for ``max_M`` and ``N`` (before rounding
        up to the allocation granularity), whichever transport setup ends with."""
        check_construction(max_M, N, world)
        return max(WorkspaceLayout.build(max_M, N, world, t).total_bytes
                   for t in ("unicast", "multicast"))

    @property
    def mem(self) -> SymmetricMemory:
        """The symmetric memory (``transport``, ``policy_reason``, ``handle_type``, peer
        pointers); ClosedError once the workspace is closed."""
        if self._mem is None:
            raise ClosedError("the workspace is closed")
        return self._mem

    @property
    def closed(self) -> bool:
        """Whether ``close()`` ran (the memory is released)."""
        return self._mem is None

    def fits(self, max_M: int, N: int, world: int, device: torch.device) -> str | None:
        """Why a frontend of (max_M, N) cannot use this workspace, or None if it can."""
        if world != self.world:
            return f"the workspace spans {self.world} ranks, the frontend {world}"
        if device != self.device:
            return f"the workspace is on {self.device}, the frontend on {device}"
        if max_M > self.max_M or N > self.N:
            return (f"the workspace holds max_M={self.max_M}, N={self.N}; the frontend needs "
                    f"max_M={max_M}, N={N}")
        return None

    def close(self) -> None:
        """Collective; idempotent. Waits for this device's work to finish first."""
        mem, self._mem = self._mem, None
        if mem is not None:
            torch.cuda.synchronize(self.device)
            mem.close()

    def __enter__(self) -> "Workspace":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
