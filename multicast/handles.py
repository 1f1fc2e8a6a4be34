"""Shareable handles: export, exchange and import of CUDA memory (and multicast) handles.

Two kinds travel between the ranks:
- FABRIC handles are 64 opaque bytes; they cross the bootstrap like any message (and
  work across hosts of one NVLink domain). The exporting object must still exist when a
  peer imports, so the exporter keeps its reference until every rank has imported.
- POSIX file descriptors cannot cross MPI; they go over SCM_RIGHTS (fdpass). Every fd
  received is a new descriptor owned by the receiver, closed right after the import
  (the imported handle keeps the allocation alive).
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Iterable

from .bootstrap import Bootstrap
from .errors import HandleExchangeError, RsarValueError

__all__ = [
    "FABRIC", "POSIX_FD", "KINDS", "FdExchange",
    "handle_type", "attribute_for", "device_supports", "alloc_prop", "mc_prop",
    "export_handle", "import_handle", "close_fds",
    "allgather_handles", "broadcast_handle", "default_fd_exchange",
]

log = logging.getLogger("rsar.multicast")

FABRIC = "fabric"
POSIX_FD = "posix_fd"
KINDS = (FABRIC, POSIX_FD)

FABRIC_HANDLE_BYTES = 64

# exchange_fds(bs, fd) -> list indexed by rank of new fds (own slot None).
FdExchange = Callable[[Bootstrap, int], "list[int | None]"]


def default_fd_exchange(bs: Bootstrap, fd: int) -> list[int | None]:
    # Imported late: the socket machinery is only needed on the POSIX-fd path.
    from .fdpass import exchange_fds

    return exchange_fds(bs, fd)


def handle_type(drv: Any, kind: str) -> Any:
    """The CUmemAllocationHandleType for a kind name."""
    t = drv.raw.CUmemAllocationHandleType
    if kind == FABRIC:
        return t.CU_MEM_HANDLE_TYPE_FABRIC
    if kind == POSIX_FD:
        return t.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    raise RsarValueError(f"handle kind must be one of {KINDS}, got {kind!r}")


def alloc_prop(drv: Any, device: int, kind: str) -> Any:
    """CUmemAllocationProp: pinned memory on ``device``, shareable as ``kind``."""
    raw = drv.raw
    prop = raw.CUmemAllocationProp()
    prop.type = raw.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = raw.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    prop.requestedHandleTypes = handle_type(drv, kind)
    return prop


def mc_prop(drv: Any, num_devices: int, size: int, kind: str) -> Any:
    """CUmulticastObjectProp for ``num_devices`` devices, shareable as ``kind``."""
    prop = drv.raw.CUmulticastObjectProp()
    prop.numDevices = num_devices
    prop.size = size
    prop.handleTypes = int(handle_type(drv, kind))
    prop.flags = 0
    return prop


def attribute_for(drv: Any, kind: str) -> Any:
    a = drv.raw.CUdevice_attribute
    if kind == FABRIC:
        return a.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED
    if kind == POSIX_FD:
        return a.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
    raise RsarValueError(f"handle kind must be one of {KINDS}, got {kind!r}")


def device_supports(drv: Any, device: int, kind: str) -> bool:
    """Whether the device reports the handle kind; a failed query counts as no."""
    ok, value = drv.try_call("cuDeviceGetAttribute", attribute_for(drv, kind), device)
    return bool(ok and int(value))


def export_handle(drv: Any, handle: Any, kind: str) -> bytes | int:
    """Fabric -> 64 bytes; POSIX -> a new fd the caller owns."""
    out = drv.cuMemExportToShareableHandle(handle, handle_type(drv, kind), 0)
    if kind == FABRIC:
        data = bytes(out) if isinstance(out, (bytes, bytearray)) else bytes(out.data)
        if len(data) != FABRIC_HANDLE_BYTES:
            raise HandleExchangeError(f"fabric handle of {len(data)} bytes, expected 64")
        return data
    return int(out)


def import_handle(drv: Any, shareable: bytes | int, kind: str) -> Any:
    """A peer's shareable handle -> a CUmemGenericAllocationHandle owned by this rank."""
    if kind == FABRIC:
        if not isinstance(shareable, (bytes, bytearray)) or len(shareable) != FABRIC_HANDLE_BYTES:
            raise HandleExchangeError(f"not a 64-byte fabric handle: {shareable!r:.80}")
        # The C API takes a pointer to the 64-byte CUmemFabricHandle; the bindings make
        # one from any buffer.
        return drv.cuMemImportFromShareableHandle(bytearray(shareable), handle_type(drv, kind))
    if not isinstance(shareable, int) or shareable < 0:
        raise HandleExchangeError(f"not a file descriptor: {shareable!r}")
    # The bindings pass the fd's value as the void* osHandle, as the C API expects.
    return drv.cuMemImportFromShareableHandle(shareable, handle_type(drv, kind))


def close_fds(fds: Iterable[int | None]) -> None:
    for fd in fds:
        if fd is not None and fd >= 0:
            try:
                os.close(fd)
            except OSError as e:
                log.debug("closing fd %d: %s", fd, e)


def allgather_handles(bs: Bootstrap, kind: str, mine: bytes | int,
                      fd_exchange: FdExchange) -> list[Any]:
    """Every rank's shareable handle, indexed by rank.

    Fabric: the bytes of every rank (own included). POSIX: new fds received from each
    peer, own slot None; the caller closes them (and its own ``mine``).
    """
    if kind == FABRIC:
        got = bs.allgather(bytes(mine))  # type: ignore[arg-type]
        bad = [r for r, h in enumerate(got) if len(h) != FABRIC_HANDLE_BYTES]
        if bad:
            raise HandleExchangeError(f"ranks {bad} sent malformed fabric handles")
        return got
    fds = list(fd_exchange(bs, int(mine)))  # type: ignore[arg-type]
    if len(fds) != bs.world:
        close_fds(fds)
        raise HandleExchangeError(f"fd exchange returned {len(fds)} entries for {bs.world} ranks")
    return fds


def broadcast_handle(bs: Bootstrap, kind: str, mine: bytes | int | None, root: int,
                     fd_exchange: FdExchange) -> bytes | int | None:
    """``root``'s shareable handle on every other rank (None on root).

    POSIX fds only travel through the all-to-all fd exchange, so the other ranks put a
    placeholder descriptor in and everything but root's fd is closed again.
    """
    if kind == FABRIC:
        mine_b = bytes(mine) if bs.rank == root else None  # type: ignore[arg-type]
        data = bs.broadcast(mine_b, root)
        if len(data) != FABRIC_HANDLE_BYTES:
            raise HandleExchangeError(f"rank {root} broadcast a malformed fabric handle")
        return None if bs.rank == root else data
    placeholder = None
    if bs.rank == root:
        fd = int(mine)  # type: ignore[arg-type]
    else:
        placeholder = fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fds = list(fd_exchange(bs, fd))
    finally:
        if placeholder is not None:
            os.close(placeholder)
    keep = None if bs.rank == root else fds[root]
    close_fds(f for r, f in enumerate(fds) if r != root or bs.rank == root)
    return keep
