"""The split-K tail's pieces in the sm90 kernel's MMA warps (``TilePlan.sk``).

The last round's units are cut along K onto idle lanes: a later piece stores its fp32
accumulators in its lane's workspace slot and raises the slot's flag (``_sk_store``); the
lane of the unit's first piece adds every later piece's slot, in piece order, so every
launch sums the same way (``_sk_add``), then runs the unit's epilogue.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute

from . import layout, protocol, ptx
from .geometry import BM

Int32 = cutlass.Int32
Int64 = cutlass.Int64


class SplitKPieces:
    """Mixin of ``Sm90FusedKernel``. Reads the kernel's ``bn``, ``num_mma_threads`` and
    ``mma_bar``."""

    @cute.jit
    def _sk_slot(self, mtid, lane, ws):
        """This thread's part of lane ``lane``'s slot: its accumulator fragment, 16 B per step,
        the 256 threads' steps contiguous."""
        return (ws + Int64(layout.SK_SLOTS_OFF) + Int64(lane) * Int64(self.bm * self.bn * 4)
                + Int64(mtid * 16))

    @cute.jit
    def _sk_store(self, mtid, acc, lane, ws):
        """A unit's later piece (``TilePlan.sk``): the fp32 accumulators into this lane's slot,
        then its flag, for the lane of the unit's first piece, which finishes the unit."""
        slot = self._sk_slot(mtid, lane, ws)
        for i in cutlass.range_constexpr(cute.size(acc) // 4):
            ptx.st_v4_f32(slot + Int64(i * self.num_mma_threads * 16), acc[4 * i],
                          acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3])
        self.mma_bar.arrive_and_wait()
        if mtid == Int32(0):
            ptx.fence_gpu()
            ptx.st_relaxed_gpu(ws + Int64(layout.SK_OFF) + Int64(lane) * Int64(4), Int32(1))

    @cute.jit
    def _sk_add(self, mtid, acc, lane, pieces, u, rank, ws, timeout_ns, err_addr):
        """The finishing piece (k from 0): for each later piece, on the next lanes, wait for its
        flag (the pieces run in the same round), clear it for the next launch, add its slot;
        in piece order, so every launch sums the same way."""
        for p in range(1, pieces):
            if mtid == Int32(0):
                flag = ws + Int64(layout.SK_OFF) + Int64(lane + p) * Int64(4)
                protocol.wait_stamp(flag, Int32(1), timeout_ns, err_addr, ws, rank, u,
                                    lane + p, Int32(0), Int32(protocol.KIND_SK), True)
                ptx.st_relaxed_gpu(flag, Int32(0))
            self.mma_bar.arrive_and_wait()
            slot = self._sk_slot(mtid, lane + p, ws)
            for i in cutlass.range_constexpr(cute.size(acc) // 4):
                v = ptx.ld_v4_f32_cg(slot + Int64(i * self.num_mma_threads * 16))
                for j in cutlass.range_constexpr(4):
                    acc[4 * i + j] = acc[4 * i + j] + v[j]
