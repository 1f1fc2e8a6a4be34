"""Functional checks of a SymmetricMemory on real GPUs, for diagnostics and GPU tests.

What the fused kernel relies on, checked one piece at a time: every rank's buffer is
readable and writable from every other rank through its peer pointer, both by the copy
engines (cuMemcpy) and by the SMs (plain loads and stores in a kernel); system-scope
atomics from all ranks on one word add up exactly; peer copies run at NVLink speed (and
what rate SM-issued stores, loads and bulk copies reach with a given number of SMs);
and, only where a multicast mapping exists, multimem loads and stores reach every rank.

Every check is collective: all ranks call the same checks in the same order with the
same arguments. The device work of each step runs through ``agree``, so a CUDA error on
any rank raises the same PeerError on every rank; wrong data is a result, not an error.

Buffer layout used (``region_bytes`` gives the size to allocate), P = pattern bytes:
    [0, P)                 O: the owner's own pattern, read by peers
    [P, 2P)                X: scratch for kernel reads
    [2P + q*P, 3P + q*P)   S_q: written by rank q through its peer pointer
    [(2+world)P, +4096)    C: the atomic counter (first word)
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from .agree import agree, all_true
from .bootstrap import Bootstrap
from .errors import RsarValueError
from .driver import Driver, default_driver
from .handles import FABRIC, alloc_prop, device_supports, handle_type
from .nvrtc_kernels import PTR, U32, U64, KernelModule

__all__ = [
    "CheckResult", "PATTERN_BYTES", "region_bytes", "pattern", "device_scope",
    "load_kernels", "fabric_export", "pattern_check", "atomic_check", "bandwidth_check",
    "sm_bandwidth_check", "multicast_check",
]

PATTERN_BYTES = 1 << 20
COUNTER_BYTES = 4096
_BLOCK = 256
_GRID = 264  # two waves of 132 SMs; the copies are tiny, any grid covers them


@dataclass
class CheckResult:
    """One check's outcome. ``ok`` is None when the check was skipped (``detail`` says why)."""

    name: str
    ok: bool | None
    detail: str
    value: float | None = None
    unit: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return "skip" if self.ok is None else ("pass" if self.ok else "fail")

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status
        return d


def region_bytes(world: int, pattern_bytes: int = PATTERN_BYTES) -> int:
    """Bytes a SymmetricMemory needs for ``pattern_check`` and ``atomic_check``."""
    return (2 + world) * pattern_bytes + COUNTER_BYTES


def _offsets(world: int, p: int) -> dict[str, Any]:
    return {"own": 0, "scratch": p, "slot": lambda q: (2 + q) * p, "counter": (2 + world) * p}


def pattern(writer: int, nwords: int) -> np.ndarray:
    """32-bit words that differ by position and by writer, so a word read from the wrong
    rank, the wrong offset or a stale buffer shows."""
    i = np.arange(nwords, dtype=np.uint64)
    mixed = (i * np.uint64(2654435761) + np.uint64((writer + 1) * 40503)) & np.uint64(0xFFFFFFFF)
    return mixed.astype(np.uint32) ^ np.uint32((writer & 0xFF) << 24)


def _mismatch(got: np.ndarray, want: np.ndarray) -> tuple[int, str]:
    bad = np.flatnonzero(got != want)
    if not bad.size:
        return 0, ""
    i = int(bad[0])
    return int(bad.size), f"word {i}: got {int(got[i]):#010x}, want {int(want[i]):#010x}"


@contextlib.contextmanager
def device_scope(drv: Driver, device: int) -> Iterator[None]:
    """The device's primary context, current for the calls inside (restored after).

    SymmetricMemory's mappings are process-wide virtual addresses with access granted to
    the device, so any context of that device may copy and launch on them.
    """
    drv.cuCtxPushCurrent(drv.primary_context(device))
    try:
        yield
    finally:
        drv.cuCtxPopCurrent()


def _dtoh(drv: Driver, ptr: int, nwords: int) -> np.ndarray:
    out = np.empty(nwords, dtype=np.uint32)
    # Always an address, never the array: the bindings would read a 1-element array as
    # an integer pointer.
    drv.cuMemcpyDtoH(out.ctypes.data, ptr, out.nbytes)
    return out


def _htod(drv: Driver, ptr: int, data: np.ndarray) -> None:
    data = np.ascontiguousarray(data)
    drv.cuMemcpyHtoD(ptr, data.ctypes.data, data.nbytes)


def load_kernels(bs: Bootstrap, device: int,
                 drv: Driver | None = None) -> tuple[KernelModule | None, str]:
    """(kernels, "") on every rank, or (None, why) on every rank if any rank cannot
    compile or load them (NVRTC missing, say): then the SM-path checks are skipped."""
    drv = drv if drv is not None else default_driver()

    def load() -> tuple[KernelModule | None, str]:
        with device_scope(drv, device):
            try:
                return KernelModule(device, drv), ""
            except Exception as e:  # no NVRTC, an unknown architecture: skip, say why
                return None, f"{type(e).__name__}: {e}"

    km, why = agree(bs, "load check kernels", load)
    if all_true(bs, km is not None):
        return km, ""
    if km is not None:
        with device_scope(drv, device):
            km.unload()
    return None, why or "check kernels unavailable on a peer rank"


def fabric_export(device: int, drv: Driver | None = None) -> dict[str, Any]:
    """Can this device create and export a FABRIC handle? A local probe: one minimum-size
    allocation, created, exported and released at once. The usual refusal is
    CUDA_ERROR_NOT_PERMITTED, when the process may use no IMEX channel."""
    drv = drv if drv is not None else default_driver()
    if not device_supports(drv, device, FABRIC):
        return {"exported": False, "error": "device reports no fabric handle support"}
    raw = drv.raw
    prop = alloc_prop(drv, device, FABRIC)
    with device_scope(drv, device):
        ok, gran = drv.try_call("cuMemGetAllocationGranularity", prop,
                                raw.CUmemAllocationGranularity_flags
                                .CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        if not ok:
            return {"exported": False, "error": f"cuMemGetAllocationGranularity: {gran}"}
        ok, handle = drv.try_call("cuMemCreate", int(gran), prop, 0)
        if not ok:
            return {"exported": False, "error": f"cuMemCreate: {handle}"}
        try:
            ok, out = drv.try_call("cuMemExportToShareableHandle", handle,
                                   handle_type(drv, FABRIC), 0)
        finally:
            drv.cuMemRelease(handle)
    return {"exported": ok, "error": None if ok else f"cuMemExportToShareableHandle: {out}"}


def _need(sm: Any, nbytes: int, what: str) -> None:
    if sm.nbytes < nbytes:
        raise RsarValueError(f"{what} needs a SymmetricMemory of at least {nbytes} bytes, "
                             f"got {sm.nbytes}")


def pattern_check(sm: Any, bs: Bootstrap, kernels: KernelModule | None,
                  drv: Driver | None = None, pattern_bytes: int = PATTERN_BYTES) -> CheckResult:
    """Every rank writes its pattern locally; reads each peer's through the peer pointer
    (copy engine, and SM loads if ``kernels``); stores its pattern into each peer's
    slot with SM stores; then checks what the peers stored into its own slots."""
    drv = drv if drv is not None else default_driver()
    _need(sm, region_bytes(sm.world, pattern_bytes), "pattern_check")
    me, world, n = sm.rank, sm.world, pattern_bytes // 4
    off = _offsets(world, pattern_bytes)
    mine = pattern(me, n)
    bad: dict[str, int] = {}
    first: dict[str, str] = {}

    def record(key: str, got: np.ndarray, want: np.ndarray) -> None:
        count, where = _mismatch(got, want)
        bad[key] = count
        if count:
            first[key] = where

    def write_own() -> None:
        with device_scope(drv, sm.device):
            _htod(drv, sm.local_ptr + off["own"], mine)
            drv.cuCtxSynchronize()
            record("local round trip", _dtoh(drv, sm.local_ptr + off["own"], n), mine)

    def access_peers() -> None:
        with device_scope(drv, sm.device):
            for p in range(world):
                if p == me:
                    continue
                want = pattern(p, n)
                record(f"read rank {p} (copy engine)",
                       _dtoh(drv, sm.peer_ptrs[p] + off["own"], n), want)
                if kernels is None:
                    continue
                kernels.launch("rsar_copy_u32", _GRID, _BLOCK, [
                    (sm.local_ptr + off["scratch"], PTR), (sm.peer_ptrs[p] + off["own"], PTR),
                    (n, U64)])
                drv.cuCtxSynchronize()
                record(f"read rank {p} (SM loads)",
                       _dtoh(drv, sm.local_ptr + off["scratch"], n), want)
                kernels.launch("rsar_copy_u32", _GRID, _BLOCK, [
                    (sm.peer_ptrs[p] + off["slot"](me), PTR), (sm.local_ptr + off["own"], PTR),
                    (n, U64)])
            drv.cuCtxSynchronize()

    def check_slots() -> None:
        with device_scope(drv, sm.device):
            for q in range(world):
                if q != me:
                    record(f"written by rank {q} (SM stores)",
                           _dtoh(drv, sm.local_ptr + off["slot"](q), n), pattern(q, n))

    agree(bs, "pattern check: write", write_own)
    if world > 1:
        agree(bs, "pattern check: access peers", access_peers)
        if kernels is not None:
            agree(bs, "pattern check: stored by peers", check_slots)
    failed = {k: v for k, v in bad.items() if v}
    mib = pattern_bytes / (1 << 20)
    if failed:
        detail = "; ".join(f"{k}: {v} wrong words ({first[k]})" for k, v in failed.items())
    else:
        detail = f"{len(bad)} transfers of {mib:g} MiB exact"
        if world == 1:
            detail += "; world of 1: no peer to check"
        elif kernels is None:
            detail += "; SM loads/stores not checked (no check kernels)"
    return CheckResult("peer load/store", not failed, detail,
                       data={"mismatches": bad, "first_mismatch": first,
                             "pattern_bytes": pattern_bytes})


def atomic_check(sm: Any, bs: Bootstrap, kernels: KernelModule | None,
                 drv: Driver | None = None, blocks: int = 100, threads: int = 1000,
                 times: int = 1) -> CheckResult:
    """Every rank adds 1 to every rank's counter (its own included) blocks*threads*times
    times with system-scope atomics, all ranks at once; each counter must hold exactly
    world * blocks * threads * times."""
    drv = drv if drv is not None else default_driver()
    if kernels is None:
        return CheckResult("peer atomics", None, "skipped: no check kernels (NVRTC unavailable)")
    _need(sm, region_bytes(sm.world), "atomic_check")
    counter = _offsets(sm.world, PATTERN_BYTES)["counter"]
    expected = sm.world * blocks * threads * times
    if expected >= 1 << 32:
        raise RsarValueError(f"{expected} additions overflow the 32-bit counter")

    def reset() -> None:
        with device_scope(drv, sm.device):
            drv.cuMemsetD32(sm.local_ptr + counter, 0, 1)
            drv.cuCtxSynchronize()

    def add() -> None:
        with device_scope(drv, sm.device):
            for r in range(sm.world):
                kernels.launch("rsar_add_sys_u32", blocks, threads,
                               [(sm.peer_ptrs[r] + counter, PTR), (times, U32)])
            drv.cuCtxSynchronize()

    def read() -> int:
        with device_scope(drv, sm.device):
            return int(_dtoh(drv, sm.local_ptr + counter, 1)[0])

    agree(bs, "atomic check: reset", reset)
    agree(bs, "atomic check: add", add)
    got = agree(bs, "atomic check: read", read)
    ok = got == expected
    detail = (f"counter {got} == {expected} ({sm.world} ranks x {blocks}x{threads} threads"
              f" x {times})" if ok else f"counter {got}, expected {expected}")
    return CheckResult("peer atomics", ok, detail, data={"got": got, "expected": expected})


@contextlib.contextmanager
def _timing(drv: Driver, bs: Bootstrap, sm: Any, what: str) -> Iterator[dict[str, Any]]:
    """A non-blocking stream and two events on every rank (agreed), destroyed on exit, and
    ``timed_ms(run, iters)`` timing runs queued on that stream."""
    raw = drv.raw
    res: dict[str, Any] = {}

    def setup() -> None:
        with device_scope(drv, sm.device):
            res["stream"] = drv.cuStreamCreate(raw.CUstream_flags.CU_STREAM_NON_BLOCKING)
            res["ev"] = [drv.cuEventCreate(raw.CUevent_flags.CU_EVENT_DEFAULT) for _ in range(2)]

    def timed_ms(run: Callable[[], None], iters: int) -> float:
        """Milliseconds of ``iters`` runs on the stream after one untimed warm-up run."""
        stream, (ev0, ev1) = res["stream"], res["ev"]
        run()  # warm-up: the first use sets up paths
        drv.cuEventRecord(ev0, stream)
        for _ in range(iters):
            run()
        drv.cuEventRecord(ev1, stream)
        drv.cuEventSynchronize(ev1)
        return float(drv.cuEventElapsedTime(ev0, ev1))

    try:
        agree(bs, f"{what}: setup", setup)
        res["timed_ms"] = timed_ms
        yield res
    finally:
        if res:
            with device_scope(drv, sm.device):
                for ev in res.get("ev", []):
                    drv.try_call("cuEventDestroy", ev)
                if "stream" in res:
                    drv.try_call("cuStreamDestroy", res["stream"])


def bandwidth_check(sm: Any, bs: Bootstrap, nbytes: int, iters: int = 5,
                    drv: Driver | None = None) -> CheckResult:
    """cuMemcpyDtoDAsync of ``nbytes`` from the local buffer to each peer's, timed with
    CUDA events: one sender at a time (one-way GB/s per peer), then every rank sending
    to the next at once. ``sm`` needs 2 * nbytes (source half, destination half)."""
    drv = drv if drv is not None else default_driver()
    if sm.world == 1:
        return CheckResult("peer copy bandwidth", None, "skipped: world of 1, no peer")
    _need(sm, 2 * nbytes, "bandwidth_check")
    me, world = sm.rank, sm.world
    one_way: dict[str, float] = {}
    with _timing(drv, bs, sm, "bandwidth") as res:
        def timed_copy(peer: int) -> float:
            src, dst = sm.local_ptr, sm.peer_ptrs[peer] + nbytes
            ms = res["timed_ms"](
                lambda: drv.cuMemcpyDtoDAsync(dst, src, nbytes, res["stream"]), iters)
            return nbytes * iters / (ms * 1e-3) / 1e9

        for sender in range(world):
            def send(sender: int = sender) -> None:
                if me != sender:
                    return
                with device_scope(drv, sm.device):
                    for p in range(world):
                        if p != me:
                            one_way[str(p)] = timed_copy(p)
            agree(bs, f"bandwidth: rank {sender} sends", send)

        def all_send() -> float:
            with device_scope(drv, sm.device):
                return timed_copy((me + 1) % world)

        concurrent = agree(bs, "bandwidth: all ranks send", all_send)
    low = min(one_way.values())
    detail = (", ".join(f"to rank {p}: {g:.1f} GB/s" for p, g in one_way.items())
              + f"; all ranks at once: {concurrent:.1f} GB/s each"
              + f" ({nbytes / (1 << 20):g} MiB x {iters})")
    return CheckResult("peer copy bandwidth", True, detail, value=round(low, 2), unit="GB/s",
                       data={"one_way_gbps": one_way, "concurrent_gbps": concurrent,
                             "bytes": nbytes, "iters": iters})


SM_BW_CTAS = (8, 16, 33, 66, 99, 132)
SM_BW_MODES = {  # name: (kernel, threads per CTA, the peer's buffer is the destination)
    "push_stores": ("rsar_copy_v4", 512, True),
    "pull_loads": ("rsar_copy_v4", 512, False),
    "push_bulk": ("rsar_push_bulk", 128, True),
    "push_tiles": ("rsar_push_tiles", 128, True),
}
SM_BW_BOTH_MODES = ("push_stores", "push_bulk", "push_tiles")
SM_BW_TILE_BYTES = 65536  # push_tiles: a 128 x 256 bf16 tile, the fused kernel's unit
SM_BW_BOTH_CTAS = (66, 132)
BULK_BYTES = 8192


def sm_bw_split(nbytes: int, ctas: int) -> int:
    """Bytes each of ``ctas`` CTAs moves: an equal share of ``nbytes`` in whole 8 KB bulk
    copies (so every mode moves the same bytes)."""
    return max(BULK_BYTES, nbytes // ctas // BULK_BYTES * BULK_BYTES)


def sm_bandwidth_check(sm: Any, bs: Bootstrap, kernels: KernelModule | None, nbytes: int,
                       ctas: tuple[int, ...] = SM_BW_CTAS, iters: int = 3,
                       drv: Driver | None = None) -> CheckResult:
    """GB/s one rank gets to (or from) the next rank's memory from ``ctas`` CTAs, one CTA
    per SM: 16-byte thread stores, 16-byte thread loads, and 8 KB bulk copies from shared
    memory (sm_90+), which is how the fused kernel pushes, also with the fused kernel's
    per-tile completion (wait, system fence, flag release every 64 KB). Rank 0 moves the
    data while the others wait; then every rank pushes to the next at once (the slowest
    rank's rate). Informational (the copy-engine figure is ``bandwidth_check``'s). ``sm``
    needs 2 * nbytes, as for ``bandwidth_check``."""
    drv = drv if drv is not None else default_driver()
    if sm.world == 1:
        return CheckResult("SM-driven peer bandwidth", None, "skipped: world of 1, no peer")
    if kernels is None:
        return CheckResult("SM-driven peer bandwidth", None, "skipped: no check kernels")
    _need(sm, 2 * nbytes, "sm_bandwidth_check")
    ctas = tuple(n for n in ctas if n * BULK_BYTES <= nbytes)  # a whole bulk copy each
    if not ctas:
        return CheckResult("SM-driven peer bandwidth", None,
                           f"skipped: {nbytes} bytes is less than one bulk copy per CTA")
    with device_scope(drv, sm.device):
        bulk = kernels.has("rsar_push_bulk")
    bulk = all_true(bs, bulk)
    modes = {k: v for k, v in SM_BW_MODES.items() if v[0] == "rsar_copy_v4" or bulk}
    me, peer = sm.rank, (sm.rank + 1) % sm.world
    table: dict[str, dict[str, float]] = {m: {} for m in modes}
    with _timing(drv, bs, sm, "SM bandwidth") as res:
        def launch(mode: str, n: int, per_cta: int) -> None:
            name, threads, push = modes[mode]
            if name == "rsar_push_bulk":
                args = [(sm.peer_ptrs[peer] + nbytes, PTR), (per_cta, U64)]
            elif name == "rsar_push_tiles":  # flags: the first words of the peer's source half
                args = [(sm.peer_ptrs[peer] + nbytes, PTR), (sm.peer_ptrs[peer], PTR),
                        (per_cta, U64), (SM_BW_TILE_BYTES, U32)]
            elif push:
                args = [(sm.peer_ptrs[peer] + nbytes, PTR), (sm.local_ptr, PTR),
                        (per_cta // 16, U64)]
            else:
                args = [(sm.local_ptr + nbytes, PTR), (sm.peer_ptrs[peer], PTR),
                        (per_cta // 16, U64)]
            kernels.launch(name, n, threads, args, res["stream"])

        def gbps(mode: str, n: int) -> float:
            per_cta = sm_bw_split(nbytes, n)
            with device_scope(drv, sm.device):
                ms = res["timed_ms"](lambda: launch(mode, n, per_cta), iters)
            return round(per_cta * n * iters / (ms * 1e-3) / 1e9, 1)

        def one_way(mode: str, n: int) -> None:
            if me == 0:
                table[mode][str(n)] = gbps(mode, n)

        for mode in modes:
            for n in ctas:
                agree(bs, f"SM bandwidth: {mode} from {n} CTAs", lambda m=mode, n=n: one_way(m, n))
        # every rank pushing to the next at once, as the fused kernel's exchange does: the
        # slowest rank's rate (a link that is full-duplex for copies may not be for SM writes)
        both: dict[str, dict[str, float]] = {}
        for mode in (m for m in SM_BW_BOTH_MODES if m in modes):
            for n in (c for c in SM_BW_BOTH_CTAS if c in ctas):
                bs.barrier()
                got = agree(bs, f"SM bandwidth: {mode} from {n} CTAs, all ranks",
                            lambda m=mode, n=n: gbps(m, n))
                rates = [float(b) for b in bs.allgather(repr(got).encode())]
                both.setdefault(mode, {})[str(n)] = min(rates)
    table = json.loads(bs.broadcast(json.dumps(table).encode() if me == 0 else None, root=0))
    best = max((g for row in table.values() for g in row.values()), default=0.0)
    detail = "; ".join(f"{m}: " + ", ".join(f"{g:.0f}" for g in row.values())
                       for m, row in table.items())
    detail = f"GB/s rank 0 -> rank 1 from {', '.join(map(str, ctas))} CTAs: {detail}"
    if both:
        detail += "; all ranks at once, each (slowest rank): " + "; ".join(
            f"{m} " + ", ".join(f"{g:.0f} from {n}" for n, g in row.items())
            for m, row in both.items())
    return CheckResult("SM-driven peer bandwidth", True, detail, value=best, unit="GB/s",
                       data={"gbps": table, "all_ranks_gbps": both, "bytes": nbytes,
                             "iters": iters})


def multicast_check(sm: Any, bs: Bootstrap, kernels: KernelModule | None,
                    drv: Driver | None = None, pattern_bytes: int = PATTERN_BYTES) -> CheckResult:
    """Only on a multicast-mapped SymmetricMemory: ``multimem.ld_reduce`` of every
    rank's word must equal the sum; a ``multimem.st`` by rank 0 must reach every rank."""
    drv = drv if drv is not None else default_driver()
    if sm.transport != "multicast" or not sm.multicast_ptr:
        return CheckResult("multicast ld_reduce/st", None,
                           f"skipped: transport is {sm.transport} ({sm.policy_reason})")
    if kernels is not None:
        with device_scope(drv, sm.device):
            has_mc = kernels.has("rsar_mc_st_u32")
    if kernels is None or not all_true(bs, has_mc):
        return CheckResult("multicast ld_reduce/st", None,
                           "skipped: multimem kernels unavailable (needs sm_90+ and NVRTC)")
    _need(sm, region_bytes(sm.world, pattern_bytes), "multicast_check")
    me, world, n = sm.rank, sm.world, pattern_bytes // 4
    off = _offsets(world, pattern_bytes)
    base = 0x5A000000
    want_sum = np.full(n, world * (world + 1) // 2, dtype=np.uint32)
    want_st = np.arange(n, dtype=np.uint32) ^ np.uint32(base)
    out: dict[str, Any] = {}

    def write() -> None:
        with device_scope(drv, sm.device):
            _htod(drv, sm.local_ptr + off["own"], np.full(n, me + 1, dtype=np.uint32))
            drv.cuCtxSynchronize()

    def reduce() -> None:
        with device_scope(drv, sm.device):
            kernels.launch("rsar_mc_ld_reduce_u32", _GRID, _BLOCK, [
                (sm.local_ptr + off["scratch"], PTR), (sm.multicast_ptr + off["own"], PTR),
                (n, U64)])
            drv.cuCtxSynchronize()
            out["reduce"] = _mismatch(_dtoh(drv, sm.local_ptr + off["scratch"], n), want_sum)

    def store() -> None:
        if me != 0:
            return
        with device_scope(drv, sm.device):
            kernels.launch("rsar_mc_st_u32", _GRID, _BLOCK, [
                (sm.multicast_ptr + off["slot"](0), PTR), (base, U32), (n, U64)])
            drv.cuCtxSynchronize()

    def check_store() -> None:
        with device_scope(drv, sm.device):
            out["store"] = _mismatch(_dtoh(drv, sm.local_ptr + off["slot"](0), n), want_st)

    agree(bs, "multicast check: write", write)
    agree(bs, "multicast check: ld_reduce", reduce)
    agree(bs, "multicast check: st", store)
    agree(bs, "multicast check: read st", check_store)
    failed = {k: v for k, v in out.items() if v[0]}
    detail = ("; ".join(f"{k}: {c} wrong words ({w})" for k, (c, w) in failed.items())
              if failed else f"ld_reduce sum and rank 0's st exact over {n} words")
    return CheckResult("multicast ld_reduce/st", not failed, detail,
                       data={k: v[0] for k, v in out.items()})
