"""NVLink multicast: the collective policy decision, then the setup and teardown sequence.

This is the only module that creates a multicast object, and it does so only after the
policy (RSAR_MULTICAST and the site switches, agreed across ranks) allowed it.

Setup order (as PyTorch symmetric memory, NCCL NVLS and NVSHMEM do it):
1. granularity from cuMulticastGetGranularity (the allocation is rounded to it);
2. rank 0 creates the multicast object and exports a shareable handle;
3. the handle reaches every rank (fabric bytes over the bootstrap, or a POSIX fd);
4. every rank imports it, then adds its device; all ranks agree BEFORE anyone binds,
   because binding needs every participating device added;
5. every rank binds its local allocation, then maps the multicast range; agree again.
Rank 0's creation reference lives until the object is torn down, and at teardown it
is released only after every other rank has released its reference.

Every step runs through ``agree``: a failure on any rank raises the same PeerError on
every rank, which the caller turns into a joint fallback to unicast (auto) or a joint
error (on). No rank is left waiting in a collective its peers abandoned.
"""
from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Mapping

from .agree import agree
from .bootstrap import Bootstrap
from .errors import MulticastPolicyError, RsarValueError
from .handles import (
    POSIX_FD, FdExchange, broadcast_handle, close_fds, export_handle, import_handle, mc_prop,
)
from .policy import PolicyDecision, decide, resolve

__all__ = [
    "MulticastState", "ROOT", "agree_policy", "multicast_support", "query_granularity",
    "setup_multicast", "release_multicast", "free_multicast_range", "access_desc", "attempt",
]

log = logging.getLogger("rsar.multicast")

ROOT = 0


@dataclass
class MulticastState:
    """What this rank holds of one multicast object, so teardown undoes exactly that."""

    rank: int
    device: int
    size: int
    granularity: int
    handle: Any = None  # rank ROOT: the creation reference; others: the imported one
    added: bool = False
    bound: bool = False
    va: int = 0
    mapped: bool = False


def multicast_support(drv: Any, device: int) -> tuple[bool, str]:
    """(supported, why not) for one device; a failed query is an answer, not an error."""
    attr = drv.raw.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED
    ok, value = drv.try_call("cuDeviceGetAttribute", attr, device)
    if not ok:
        return False, f"device {device}: cuDeviceGetAttribute(MULTICAST_SUPPORTED) failed: {value}"
    if not int(value):
        return False, f"device {device} reports CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED=0"
    return True, ""


def agree_policy(bs: Bootstrap, drv: Any, device: int, env: Mapping[str, str] | None,
                 auto_off: str = "") -> tuple[PolicyDecision, bool, str]:
    """The policy of the whole group: (decision, try multicast, reason), equal on all ranks
    (``auto_off``: see ``policy.decide``).

    Environments may differ between ranks; multicast is tried only if every rank allows
    it and every device supports it. If any rank asked for ``on`` where that cannot be
    had, or any rank's configuration is invalid, every rank raises the same error.
    """
    vote: dict[str, Any] = {}
    local_exc: Exception | None = None
    try:
        d = decide(env, auto_off=auto_off)
        supported, why = multicast_support(drv, device) if d.allowed else (False, "not queried")
        vote = {"requested": d.requested, "allowed": d.allowed, "reason": d.reason,
                "supported": supported, "why": why}
    except Exception as e:
        local_exc = e
        vote = {"error": "ValueError" if isinstance(e, ValueError) else "MulticastPolicyError",
                "message": str(e)}
    votes = [json.loads(v) for v in bs.allgather(json.dumps(vote).encode())]

    failed = {r: v for r, v in enumerate(votes) if "error" in v}
    if failed:
        text = "; ".join(f"rank {r}: {v['message']}" for r, v in sorted(failed.items()))
        cls = RsarValueError if any(v["error"] == "ValueError" for v in failed.values()) \
            else MulticastPolicyError
        raise cls(f"multicast policy: {text}") from local_exc

    on_ranks = [r for r, v in enumerate(votes) if v["requested"] == "on"]
    requested = "on" if on_ranks else (
        "off" if all(v["requested"] == "off" for v in votes) else "auto")
    forbidding = [(r, v["reason"]) for r, v in enumerate(votes) if not v["allowed"]]
    mine = votes[bs.rank]
    if forbidding:
        r, why = forbidding[0]
        if on_ranks:
            raise MulticastPolicyError(
                f"RSAR_MULTICAST=on on rank(s) {on_ranks}, but multicast is off on rank {r}: {why}")
        reason = mine["reason"] if not mine["allowed"] else f"rank {r}: {why}"
        decision = PolicyDecision(requested, False, reason)
        return decision, False, reason

    decision = PolicyDecision(requested, True, mine["reason"])
    if bs.world == 1 and requested != "on":
        return decision, False, "a single rank has no peer to multicast to"
    unsupported = [v["why"] for v in votes if not v["supported"]]
    use, reason = resolve(decision, not unsupported, "; ".join(unsupported))
    return decision, use, reason


def query_granularity(drv: Any, bs: Bootstrap, kind: str, size: int) -> int:
    """The multicast granularity every rank can live with (agreed; lcm over ranks).

    The minimum granularity is what BindMem requires; the recommended one can be
    hundreds of MiB, which a small workspace would waste.
    """
    flag = drv.raw.CUmulticastGranularity_flags.CU_MULTICAST_GRANULARITY_MINIMUM

    def query() -> int:
        return int(drv.cuMulticastGetGranularity(mc_prop(drv, bs.world, size, kind), flag))

    mine = agree(bs, "multicast granularity", query)
    grans = [int(g) for g in bs.allgather(str(mine).encode())]
    return math.lcm(*grans)


def setup_multicast(drv: Any, bs: Bootstrap, *, decision: PolicyDecision, device: int,
                    local_handle: Any, size: int, granularity: int, kind: str,
                    fd_exchange: FdExchange) -> MulticastState:
    """Create (rank 0), share, import, add, bind and map one multicast object.

    Raises PeerError on every rank if any rank fails a step, after undoing what this
    rank had done. ``size`` must be a multiple of the multicast granularity.
    """
    if not decision.allowed:
        # The caller checks too; this guard keeps any future caller from creating a
        # multicast object against the site's policy.
        raise MulticastPolicyError(f"multicast setup refused: {decision.reason}")
    live = decide(os.environ)
    if not live.allowed:
        # The process environment is the site's word and outranks an ``env`` mapping a
        # caller handed in: creating a multicast object where it is forbidden can take a
        # shared host's GPUs down.
        raise MulticastPolicyError(f"multicast setup refused by this process's environment: "
                                   f"{live.reason}")
    st = MulticastState(rank=bs.rank, device=device, size=size, granularity=granularity)
    try:
        _run_setup(drv, bs, st, local_handle, kind, fd_exchange)
    except BaseException:
        for e in release_multicast(drv, bs, st, collective=False) + free_multicast_range(drv, st):
            log.debug("rank %d: multicast cleanup after failed setup: %s", bs.rank, e)
        raise
    log.debug("rank %d: multicast mapped at %#x (%d bytes)", bs.rank, st.va, size)
    return st


def _run_setup(drv: Any, bs: Bootstrap, st: MulticastState, local_handle: Any, kind: str,
               fd_exchange: FdExchange) -> None:
    def create() -> Any:
        if bs.rank != ROOT:
            return None
        st.handle = drv.cuMulticastCreate(mc_prop(drv, bs.world, st.size, kind))
        return export_handle(drv, st.handle, kind)

    exported = agree(bs, "multicast create", create,
                     undo=lambda fd: close_fds([fd]) if kind == POSIX_FD else None)
    try:
        received = broadcast_handle(bs, kind, exported, ROOT, fd_exchange)
    finally:
        if kind == POSIX_FD and bs.rank == ROOT:
            close_fds([exported])

    def import_() -> None:
        if bs.rank == ROOT:
            return
        try:
            st.handle = import_handle(drv, received, kind)  # type: ignore[arg-type]
        finally:
            if kind == POSIX_FD:
                close_fds([received])  # type: ignore[list-item]

    agree(bs, "multicast import", import_)

    def add_device() -> None:
        drv.cuMulticastAddDevice(st.handle, st.device)
        st.added = True

    # Every device must be in the team before any rank binds memory.
    agree(bs, "multicast add device", add_device)

    def bind() -> None:
        drv.cuMulticastBindMem(st.handle, 0, local_handle, 0, st.size, 0)
        st.bound = True

    agree(bs, "multicast bind", bind)

    def map_() -> None:
        st.va = int(drv.cuMemAddressReserve(st.size, st.granularity, 0, 0))
        drv.cuMemMap(st.va, st.size, 0, st.handle, 0)
        st.mapped = True
        drv.cuMemSetAccess(st.va, st.size, [access_desc(drv, st.device)], 1)

    agree(bs, "multicast map", map_)


def attempt(errors: list[Exception], fn: Any, *args: Any) -> None:
    """One teardown step: keep its error and go on, so one failure leaks nothing else."""
    try:
        fn(*args)
    except Exception as e:
        errors.append(e)


def access_desc(drv: Any, device: int) -> Any:
    """Read-write access for one device."""
    d = drv.raw.CUmemAccessDesc()
    d.location.type = drv.raw.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    d.location.id = device
    d.flags = drv.raw.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    return d


def release_multicast(drv: Any, bs: Bootstrap, st: MulticastState,
                      collective: bool) -> list[Exception]:
    """Unmap, unbind, release; returns the errors met (teardown goes on regardless).

    ``collective`` (normal close, every rank here): peers release first, then a barrier,
    then rank 0 drops the creation reference. After a failed setup step the agreement
    already ordered the ranks, so no barrier is needed (or safe) there.
    """
    errors: list[Exception] = []
    if st.mapped:
        attempt(errors, drv.cuMemUnmap, st.va, st.size)
        st.mapped = False
    if st.bound:
        attempt(errors, drv.cuMulticastUnbind, st.handle, st.device, 0, st.size)
        st.bound = False
    if collective:
        if st.rank != ROOT and st.handle is not None:
            attempt(errors, drv.cuMemRelease, st.handle)
            st.handle = None
        attempt(errors, bs.barrier)
    if st.handle is not None:
        attempt(errors, drv.cuMemRelease, st.handle)
        st.handle = None
    return errors


def free_multicast_range(drv: Any, st: MulticastState) -> list[Exception]:
    if not st.va:
        return []
    va, st.va = st.va, 0
    errors: list[Exception] = []
    attempt(errors, drv.cuMemAddressFree, va, st.size)
    return errors
