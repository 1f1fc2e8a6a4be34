"""Per-CTA event times inside one launch, for finding where a fused call spends its time.

A variant compiled with ``trace=1`` has one thread of each role write ``%globaltimer`` (ns)
at the events below into the workspace's TRACE region (``launch.layout``), slot
``[cta][event]``; default variants compile none of it. Each launch overwrites what it
reaches, so the host clears the region before the launch it wants to read
(``GemmRsAr.read_trace``). Times are per GPU: compare ranks by durations, not by clocks.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute

from . import layout, ptx

Int32 = cutlass.Int32
Int64 = cutlass.Int64

# event slots (round events: the first round, and the last round that had a tile)
START = 0          # communication warps start (after reading the epoch)
PEERS_DONE = 1     # peers finished the previous launch (first write to them may go)
MMA_FIRST_K = 2    # MMA warps: first k-tile of the first tile landed in smem
MMA_ACC_DONE = 3   # MMA warps: first tile's accumulators complete
FIRST_SUB = 4      # communication: first sub-tile of the first tile taken from the ring
FIRST_TILE_SENT = 5    # communication: first tile's sub-tiles all handed on
FIRST_STAMPED = 6  # communication: first tile's arrival stamps written
DIRECT_WAITED = 7  # communication: peers' partials of the first own tile are in
LAST_SUB = 8       # communication: last tile's first sub-tile taken from the ring
LAST_STAMPED = 9   # communication: last tile done and stamped
DEFER_WAITED = 10  # shared tiles: last wait for the peers' partials done
DEFER_DONE = 11    # shared tiles: all reduced
COPY_WAITED = 12   # AR: last result stamp from another owner seen
COPY_DONE = 13     # AR: all other owners' tiles copied out
EXIT_BARRIER = 14  # whole CTA reached the exit barrier
EXIT = 15          # CTA's exit bookkeeping done (last CTA: peers told)
MMA_LAST_DONE = 16  # MMA warps: last tile's sub-tiles all in the ring
FIRST_LANDED = 17  # communication: first pushed tile's bulk copies complete (written at peers)
FIRST_FENCED = 18  # communication: ... and the system-scope fence before its stamps passed
#                   (absent where an RS first tile is own-only: it takes no fence)
TILE_DONE = 19     # slots 19..33: communication done with the CTA's i-th tile (pushed and
TILE_SLOTS = layout.TRACE_EVENTS - TILE_DONE  # stamped, or reduced), its first 15 tiles

NAMES = {v: k.lower() for k, v in dict(globals()).items()
         if k.isupper() and isinstance(v, int) and not k.startswith("_")
         and k not in ("TILE_DONE", "TILE_SLOTS")}


@cute.jit
def mark(ws: Int64, cta: Int32, event: cutlass.Constexpr):
    """One thread records the time of ``event`` for its CTA."""
    if cta < Int32(layout.TRACE_CTAS):
        ptx.st_u64_relaxed_gpu(
            ws + Int64(layout.TRACE_OFF) + (Int64(cta) * Int64(layout.TRACE_EVENTS)
                                            + Int64(event)) * Int64(8),
            ptx.globaltimer())


@cute.jit
def mark_tile(ws: Int64, cta: Int32, i: Int32):
    """One thread records when its CTA's communication finished its i-th tile."""
    if (cta < Int32(layout.TRACE_CTAS)) & (i < Int32(TILE_SLOTS)):
        ptx.st_u64_relaxed_gpu(
            ws + Int64(layout.TRACE_OFF) + (Int64(cta) * Int64(layout.TRACE_EVENTS)
                                            + Int64(TILE_DONE) + Int64(i)) * Int64(8),
            ptx.globaltimer())


def decode(raw: bytes, grid: int) -> dict[str, list[int | None]]:
    """The region's bytes as {event name: [ns since the launch's first START, or None] per
    CTA}, for the ``grid`` CTAs of the traced launch; ``tile_done_<i>``: when the CTA's
    communication finished its i-th tile."""
    import struct
    n = min(grid, layout.TRACE_CTAS)
    vals = struct.unpack_from(f"<{n * layout.TRACE_EVENTS}Q", raw)
    starts = [vals[c * layout.TRACE_EVENTS + START] for c in range(n)]
    t0 = min((s for s in starts if s), default=0)
    out: dict[str, list[int | None]] = {}
    slots = sorted(NAMES.items()) + [(TILE_DONE + i, f"tile_done_{i}") for i in range(TILE_SLOTS)]
    for ev, name in slots:
        out[name] = [(v - t0) if (v := vals[c * layout.TRACE_EVENTS + ev]) else None
                     for c in range(n)]
    return out
