"""Byte layout of one symmetric workspace (identical on every rank).

    CTRL    epoch word, CTA-exit counter, abort word, started[src] (and done[src]) words
            written by peers
    TRACE   per-CTA event times of the last launch of a trace variant (``launch.trace``)
    SK      split-K tails (``launch.plan``): a u32 flag per lane (set by a lane that stored a
            piece, cleared by the lane that adds it: local, so no epoch), then a slot of
            BM x BN fp32 accumulators per lane
    ARRIVE  u32 stamps [tile][src]: src has delivered its partial of tile for epoch e (value e+1)
    RESULT  u32 stamps [tile]: the owner has broadcast the reduced tile (AR)
    RECV    (unicast) world regions of tile-contiguous bf16 partial slots: one per peer, and
            a last one where a rank parks its own rows of a tile it shares with other owners
    PART    (multicast) this rank's own partial tiles, reduced in place by multimem.ld_reduce
    OUT     (AR) reduced tiles broadcast by their owners, tile-contiguous

Flags are never cleared: a stamp holds the epoch it was written for, and a waiter compares
with wrap-safe signed arithmetic, so the same words serve every launch and a captured CUDA
graph replays without host help.
"""
from __future__ import annotations

from dataclasses import dataclass

from .geometry import (BM, SK_CTAS, SK_MAX_PIECES, TILE_NS, ceil_div, max_recv_slots,
                       padded_n)

CTRL_EPOCH = 0
CTRL_EXIT_COUNT = 4
CTRL_ABORT = 8
CTRL_DONE = 256  # + 4 * src: written at exit (the default exit), read by no one
CTRL_STARTED = 384  # + 8 * src: src has started launch e: (e + 1, its shape word)
MAX_WORLD = 16
_ALIGN = 4096
TRACE_OFF = 4096
TRACE_EVENTS = 34    # u64 %globaltimer values per CTA
TRACE_CTAS = 256
TRACE_BYTES = TRACE_CTAS * TRACE_EVENTS * 8
SK_OFF = -(-(TRACE_OFF + TRACE_BYTES) // _ALIGN) * _ALIGN  # a constant the kernels build in
SK_SLOTS_OFF = SK_OFF + _ALIGN  # after the flags


def _up(x: int, a: int = _ALIGN) -> int:
    return ceil_div(x, a) * a


@dataclass(frozen=True)
class WorkspaceLayout:
    max_M: int
    N: int
    world: int
    transport: str
    arrive_off: int
    result_off: int
    recv_off: int
    recv_region_bytes: int
    part_off: int
    out_off: int
    total_bytes: int
    max_tiles: int

    @staticmethod
    def build(max_M: int, N: int, world: int, transport: str = "unicast") -> "WorkspaceLayout":
        max_tiles = ceil_div(max_M, BM) * ceil_div(N, min(TILE_NS))  # the narrowest, the most
        # tile-indexed buffers hold whole tiles: a partial last tile column's too
        n_tiles = padded_n(N)
        # one split-K slot per lane that can store a piece (at most one a launch): a lane below
        # the unit count, or in the plain GEMM's one widened round below SK_MAX_PIECES times
        # it, so at any width no more than that many fp32 copies of the rows
        sk_bytes = min(SK_CTAS * BM * max(TILE_NS),
                       SK_MAX_PIECES * ceil_div(max_M, BM) * BM * n_tiles) * 4
        off = _up(SK_SLOTS_OFF + sk_bytes)
        arrive_off = off
        off = _up(off + 4 * max_tiles * world)
        result_off = off
        off = _up(off + 4 * max_tiles)
        rows_bytes = ceil_div(max_M, BM) * BM * n_tiles * 2  # every tile of the largest call
        region = max(max_recv_slots(max_M, N, world, bn) * BM * bn * 2 for bn in TILE_NS)
        recv_off = part_off = 0
        if transport == "unicast":
            recv_off = off
            off = _up(off + world * region)
        else:
            part_off = off
            off = _up(off + rows_bytes)
        out_off = off
        off = _up(off + rows_bytes)
        return WorkspaceLayout(
            max_M=max_M, N=N, world=world, transport=transport, arrive_off=arrive_off,
            result_off=result_off, recv_off=recv_off, recv_region_bytes=region,
            part_off=part_off, out_off=out_off, total_bytes=off, max_tiles=max_tiles,
        )
