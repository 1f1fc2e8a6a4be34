"""SymmetricMemory: one buffer per rank, mapped on every rank, optionally multicast-bound.

Each rank allocates the same number of bytes through the driver's virtual memory API,
shares a handle with its peers, and maps every peer's buffer into its own address
space, so a kernel can load and store peer memory through plain pointers. When the
policy allows and every device supports it, the buffers are also bound to one NVLink
multicast object whose mapping reaches all of them at once.

Construction and ``close()`` are collective: every rank of the communicator must call
them, in the same order. Any rank's failure during construction reaches every rank,
which all raise the same error (or, for multicast under RSAR_MULTICAST=auto, all
continue with unicast).
"""
from __future__ import annotations

import contextlib
import logging
import math
import struct
import sys
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from .agree import agree, all_true
from .bootstrap import Bootstrap, make_bootstrap
from .driver import Driver, default_driver
from .errors import ClosedError, CudaDriverError, PeerError, RsarValueError
from .handles import (
    FABRIC, POSIX_FD, FdExchange, allgather_handles, alloc_prop, close_fds, default_fd_exchange,
    device_supports, export_handle, import_handle,
)
from .multicast_setup import (
    MulticastState, access_desc, agree_policy, attempt, free_multicast_range,
    query_granularity, release_multicast, setup_multicast,
)
from .policy import PolicyDecision

__all__ = ["SymmetricMemory"]

log = logging.getLogger("rsar.multicast")


def _round_up(n: int, g: int) -> int:
    return (n + g - 1) // g * g


def _torch_device() -> int | None:
    # Only consult torch if the caller already uses it: importing torch here would
    # cost seconds and initialise CUDA as a side effect.
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
    except Exception:
        pass
    return None


class _DeviceContext:
    """The device this allocation lives on, and a context to make driver calls in.

    If no context is current, the device's primary context (the one the CUDA runtime
    and torch use) is retained and made current, so later kernel launches on this
    thread find it. If a context of another device is current, driver calls are made
    with ours pushed and popped around them, leaving the caller's context alone.
    """

    def __init__(self, drv: Driver, device: int | None) -> None:
        self._drv = drv
        drv.cuInit(0)
        cur = drv.cuCtxGetCurrent()
        cur_dev = int(drv.cuCtxGetDevice()) if int(cur) else None
        if device is None:
            device = cur_dev if cur_dev is not None else _torch_device()
            if device is None:
                device = 0  # CUDA's current device when nothing chose one
        count = int(drv.cuDeviceGetCount())
        if not 0 <= device < count:
            raise RsarValueError(f"device {device} out of range: {count} CUDA device(s) visible")
        self.device = int(device)
        if cur_dev == self.device:
            self.ctx = cur
        else:
            self.ctx = drv.primary_context(self.device)
            if not int(cur):
                drv.cuCtxSetCurrent(self.ctx)

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        drv = self._drv
        if int(drv.cuCtxGetCurrent()) == int(self.ctx):
            yield
            return
        drv.cuCtxPushCurrent(self.ctx)
        try:
            yield
        finally:
            drv.cuCtxPopCurrent()


@dataclass
class _PeerMapping:
    handle: Any = None
    va: int = 0
    mapped: bool = False


class SymmetricMemory:
    """``nbytes`` (rounded up to the granularity) of device memory on every rank.

    Attributes: ``nbytes``, ``size_requested``, ``rank``, ``world``, ``device``,
    ``local_ptr``, ``peer_ptrs`` (index = rank, own entry = local_ptr),
    ``peer_ptrs_dev`` (device array of ``world`` uint64 peer pointers),
    ``multicast_ptr`` (0 when unicast), ``transport`` ("multicast" | "unicast"),
    ``handle_type`` ("fabric" | "posix_fd"), ``policy`` (the group's PolicyDecision),
    ``policy_reason`` (why this transport), ``granularity``.

    ``comm``: a Bootstrap, an mpi4py communicator, a torch ProcessGroup, or None
    (MPI COMM_WORLD). ``device``: CUDA ordinal, default the current context's device.
    ``fd_exchange(bs, fd)`` replaces the SCM_RIGHTS exchange (tests use in-process fds).
    ``auto_off``: why RSAR_MULTICAST=auto (or unset) stays on unicast for this caller
    (``policy.decide``); empty: ``auto`` maps multicast where every device supports it.
    """

    def __init__(self, nbytes: int, comm: Any = None, *, driver: Driver | None = None,
                 env: Mapping[str, str] | None = None, device: int | None = None,
                 fd_exchange: FdExchange | None = None, auto_off: str = "") -> None:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise RsarValueError(f"nbytes must be a positive int, got {nbytes!r}")
        self.size_requested = nbytes
        self._bs: Bootstrap = make_bootstrap(comm)
        self.rank = self._bs.rank
        self.world = self._bs.world
        self._drv = driver if driver is not None else default_driver()
        self._fd_exchange = fd_exchange if fd_exchange is not None else default_fd_exchange

        self._closed = False
        self._ctx: _DeviceContext | None = None
        self._local_handle: Any = None
        self._fabric_blob: bytes | None = None
        self._local_va = 0
        self._local_mapped = False
        self._peers: list[_PeerMapping | None] = []
        self._table = 0
        self._mc: MulticastState | None = None

        self.device = -1
        self.nbytes = 0
        self.granularity = 0
        self.local_ptr = 0
        self.peer_ptrs: list[int] = []
        self.peer_ptrs_dev = 0
        self.multicast_ptr = 0
        self.transport = "unicast"
        self.handle_type = POSIX_FD
        self.policy: PolicyDecision | None = None
        self.policy_reason = ""

        try:
            self._setup(env, device, auto_off)
        except BaseException:
            self._closed = True
            for e in self._release(collective=False):
                log.debug("rank %d: cleanup after failed setup: %s", self.rank, e)
            raise

    # ---- setup -------------------------------------------------------------------

    def _setup(self, env: Mapping[str, str] | None, device: int | None, auto_off: str) -> None:
        bs, drv = self._bs, self._drv
        self._ctx = agree(bs, "select CUDA device", lambda: _DeviceContext(drv, device))
        self.device = self._ctx.device
        with self._ctx.scope():
            decision, try_mc, reason = agree_policy(bs, drv, self.device, env, auto_off)
            self.policy = decision

            # Fabric handles need every rank able to export one; try them only if every
            # device claims support (an IMEX channel may still be missing: _allocate).
            kind = FABRIC if all_true(bs, device_supports(drv, self.device, FABRIC)) else POSIX_FD
            gran = agree(bs, "allocation granularity", lambda: self._alloc_granularity(kind))
            gran = math.lcm(*(int(g) for g in bs.allgather(str(gran).encode())))
            if try_mc:
                try:
                    mc_gran = query_granularity(drv, bs, kind, _round_up(self.size_requested, gran))
                    gran = math.lcm(gran, mc_gran)
                except PeerError as e:
                    if decision.requested == "on":
                        raise
                    try_mc, reason = False, f"multicast granularity query failed, unicast: {e}"
            self.granularity = gran
            self.nbytes = _round_up(self.size_requested, gran)

            self.handle_type = self._allocate(kind)
            self._map_local()
            self._map_peers()

            if try_mc:
                try:
                    self._mc = setup_multicast(
                        drv, bs, decision=decision, device=self.device,
                        local_handle=self._local_handle, size=self.nbytes,
                        granularity=self.granularity, kind=self.handle_type,
                        fd_exchange=self._fd_exchange)
                    self.multicast_ptr = self._mc.va
                    self.transport = "multicast"
                except PeerError as e:
                    if decision.requested == "on":
                        raise
                    reason = f"multicast setup failed, unicast: {e}"
                    log.debug("rank %d: %s", self.rank, reason)
            self.policy_reason = reason

            self._write_peer_table()
            # Zeroing and the table copy must be complete before any peer touches
            # this memory; the agreement is the barrier after the synchronisation.
            agree(bs, "synchronize", drv.cuCtxSynchronize)
        log.debug("rank %d: symmetric memory %d bytes on device %d, %s, %s handles (%s)",
                  self.rank, self.nbytes, self.device, self.transport, self.handle_type,
                  self.policy_reason)

    def _alloc_granularity(self, kind: str) -> int:
        drv = self._drv
        flag = drv.raw.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
        return int(drv.cuMemGetAllocationGranularity(alloc_prop(drv, self.device, kind), flag))

    def _create(self, kind: str) -> None:
        prop = alloc_prop(self._drv, self.device, kind)
        self._local_handle = self._drv.cuMemCreate(self.nbytes, prop, 0)

    def _drop_local_handle(self) -> None:
        if self._local_handle is not None:
            handle, self._local_handle = self._local_handle, None
            self._drv.cuMemRelease(handle)

    def _allocate(self, kind: str) -> str:
        """cuMemCreate with fabric handles if every rank can create AND export one."""
        bs, drv = self._bs, self._drv
        if kind == FABRIC:
            def try_fabric() -> bytes | None:
                try:
                    self._create(FABRIC)
                    blob = export_handle(drv, self._local_handle, FABRIC)
                    return blob  # type: ignore[return-value]
                except CudaDriverError as e:
                    # Typically CUDA_ERROR_NOT_PERMITTED: no IMEX channel on this host.
                    log.debug("rank %d: fabric handle unavailable: %s", self.rank, e)
                    self._drop_local_handle()
                    return None

            blob = agree(bs, "allocate (fabric)", try_fabric)
            if all_true(bs, blob is not None):
                self._fabric_blob = blob
                return FABRIC
            self._drop_local_handle()
        agree(bs, "allocate", lambda: self._create(POSIX_FD))
        return POSIX_FD

    def _map_local(self) -> None:
        drv = self._drv

        def map_() -> None:
            self._local_va = int(drv.cuMemAddressReserve(self.nbytes, self.granularity, 0, 0))
            drv.cuMemMap(self._local_va, self.nbytes, 0, self._local_handle, 0)
            self._local_mapped = True
            drv.cuMemSetAccess(self._local_va, self.nbytes, [access_desc(drv, self.device)], 1)
            drv.cuMemsetD8(self._local_va, 0, self.nbytes)

        agree(self._bs, "map local memory", map_)
        self.local_ptr = self._local_va

    def _map_peers(self) -> None:
        bs, drv, kind = self._bs, self._drv, self.handle_type
        if kind == FABRIC:
            shares = allgather_handles(bs, FABRIC, self._fabric_blob, self._fd_exchange)
        else:
            # undo: a rank that exported while a peer failed closes its fd again.
            fd = agree(bs, "export handle",
                       lambda: export_handle(drv, self._local_handle, POSIX_FD),
                       undo=lambda fd: close_fds([fd]))
            try:
                shares = allgather_handles(bs, POSIX_FD, fd, self._fd_exchange)
            finally:
                close_fds([fd])  # type: ignore[list-item]
        self._peers = [None] * self.world

        def map_() -> None:
            try:
                for r in range(self.world):
                    if r == self.rank:
                        continue
                    p = self._peers[r] = _PeerMapping()
                    p.handle = import_handle(drv, shares[r], kind)
                    p.va = int(drv.cuMemAddressReserve(self.nbytes, self.granularity, 0, 0))
                    drv.cuMemMap(p.va, self.nbytes, 0, p.handle, 0)
                    p.mapped = True
                    drv.cuMemSetAccess(p.va, self.nbytes, [access_desc(drv, self.device)], 1)
            finally:
                if kind == POSIX_FD:
                    close_fds(shares)

        agree(bs, "map peer memory", map_)
        self.peer_ptrs = [self.local_ptr if p is None else p.va for p in self._peers]

    def _write_peer_table(self) -> None:
        drv = self._drv
        nbytes = 8 * self.world

        def write() -> None:
            self._table = int(drv.cuMemAlloc(nbytes))
            drv.cuMemcpyHtoD(self._table, struct.pack(f"<{self.world}Q", *self.peer_ptrs), nbytes)

        agree(self._bs, "peer pointer table", write)
        self.peer_ptrs_dev = self._table

    # ---- teardown ----------------------------------------------------------------

    def _release(self, collective: bool) -> list[Exception]:
        """Give back everything held, in DESIGN order; collect errors, never stop early.

        ``collective`` (close): synchronise and meet the peers first, so no rank unmaps
        memory a peer's kernel may still be reading. After a failed setup step every
        rank already learnt of the failure through ``agree``, so no barrier is needed.
        """
        errors: list[Exception] = []
        if self._ctx is None:
            return errors
        drv, bs = self._drv, self._bs
        try:
            scope = self._ctx.scope()
            scope.__enter__()
        except Exception as e:
            errors.append(e)
            scope = None
        try:
            if collective:
                attempt(errors, drv.cuCtxSynchronize)
                attempt(errors, bs.barrier)
            if self._mc is not None:
                errors += release_multicast(drv, bs, self._mc, collective)
            if self._table:
                attempt(errors, drv.cuMemFree, self._table)
                self._table = 0
            for p in self._peers:
                if p is None:
                    continue
                if p.mapped:
                    attempt(errors, drv.cuMemUnmap, p.va, self.nbytes)
                    p.mapped = False
                if p.handle is not None:
                    attempt(errors, drv.cuMemRelease, p.handle)
                    p.handle = None
            if self._local_mapped:
                attempt(errors, drv.cuMemUnmap, self._local_va, self.nbytes)
                self._local_mapped = False
            if self._local_handle is not None:
                attempt(errors, drv.cuMemRelease, self._local_handle)
                self._local_handle = None
            # Address ranges last: nothing may be mapped in them any more.
            if self._mc is not None:
                errors += free_multicast_range(drv, self._mc)
                self._mc = None
            for p in self._peers:
                if p is not None and p.va:
                    attempt(errors, drv.cuMemAddressFree, p.va, self.nbytes)
                    p.va = 0
            self._peers = []
            if self._local_va:
                attempt(errors, drv.cuMemAddressFree, self._local_va, self.nbytes)
                self._local_va = 0
        finally:
            if scope is not None:
                try:
                    scope.__exit__(None, None, None)
                except Exception as e:
                    errors.append(e)
        self.local_ptr = self.peer_ptrs_dev = self.multicast_ptr = 0
        self.peer_ptrs = []
        return errors

    def close(self) -> None:
        """Collective and idempotent: sync, barrier, unmap multicast, unbind, release
        multicast (rank 0 last), unmap and release peers and local, free the ranges.

        Teardown always runs to the end (and through its barriers, so no peer is left
        waiting); the first error met is raised afterwards.
        """
        if self._closed:
            return
        self._closed = True
        errors = self._release(collective=True)
        for e in errors[1:]:
            log.debug("rank %d: further teardown error: %s", self.rank, e)
        if errors:
            raise errors[0]

    @property
    def closed(self) -> bool:
        return self._closed

    # ---- host access to this rank's bytes ------------------------------------------

    def _local_range(self, offset: int, nbytes: int) -> int:
        if self._closed or self._ctx is None:
            raise ClosedError("the symmetric memory is closed")
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise RsarValueError(f"bytes [{offset}, {offset + nbytes}) are outside the "
                             f"{self.nbytes}-byte allocation")
        return self.local_ptr + offset

    def zero_local(self, offset: int, nbytes: int) -> None:
        """Zero ``nbytes`` of this rank's allocation from ``offset``; returns when done."""
        ptr = self._local_range(offset, nbytes)
        with self._ctx.scope():
            self._drv.cuMemsetD8(ptr, 0, nbytes)
            self._drv.cuCtxSynchronize()

    def read_local(self, offset: int, nbytes: int) -> bytes:
        """A host copy of ``nbytes`` of this rank's allocation from ``offset``."""
        ptr = self._local_range(offset, nbytes)
        buf = bytearray(nbytes)
        with self._ctx.scope():
            self._drv.cuMemcpyDtoH(buf, ptr, nbytes)
        return bytes(buf)

    def __enter__(self) -> "SymmetricMemory":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.transport}, {self.handle_type}"
        return (f"SymmetricMemory(rank={self.rank}/{self.world}, device={self.device}, "
                f"nbytes={self.nbytes}, {state})")
