"""Push CTAs (RS over unicast, an experiment: ``launch.plan.push_plan``): CTAs that only
push. The other CTAs compute in the flat peers-first order and stage each tile a peer owns
in this rank's OUT region with a GPU-scope stamp; these CTAs copy the staged tiles to their
owners, fence once per ``_PUSH_BATCH`` tiles at system scope and stamp the owners
(docs/PROTOCOL.md, "Push CTAs")."""
from __future__ import annotations

import cutlass
import cutlass.cute as cute

from . import layout, protocol, ptx

Int32 = cutlass.Int32
Int64 = cutlass.Int64

# tiles per system fence, and 16-B loads a thread keeps in flight
_PUSH_BATCH = 2
_COPY_AHEAD = 8
_OWN = protocol.TILE_OWN


class PushCtas:
    """Mixin of the kernels (through ``CommWarps``): the push CTAs' role. Uses the kernel's
    ``push_threads``, ``push_bar``, ``tile_bytes``, ``world`` and ``CommWarps``' schedule,
    tile classes and receive slots."""

    @cute.jit
    def _push_role(self, ptid, cta, num_ctas, num_tiles, tiles_m, tiles_n, shape, ws, peer_tab,
                   err_addr, rank, local_M, padded_M, chunk, rounds, lag, timeout_ns,
                   arrive_off, recv_off, region_bytes, out_off):
        """A push CTA's threads (``push_ctas``; ``ptid``: 0-95 its communication threads,
        then its MMA threads, ``push_threads`` in all): walk the MMA CTAs' flat order
        at positions cta - chunk, + P, ... (P push CTAs); for each tile a peer owns, wait for
        its local stamp, copy the staged tile whole to the owner's receive slot (the owner
        reads its own rows only), fence at system scope and stamp the owner as ``_comm_role``
        does."""
        epoch = ptx.ld_relaxed_gpu(ws + Int64(layout.CTRL_EPOCH))
        if ptid == 0:  # CTA 0 computes: its communication threads announce the start
            protocol.wait_peers_started(ws, epoch, self.world, rank, shape, timeout_ns,
                                        err_addr)
        self.push_bar.arrive_and_wait()
        stamp = epoch + Int32(1)
        pushers = num_ctas - chunk
        first = cta - chunk
        steps = (rounds * chunk - first + pushers - Int32(1)) // pushers
        batch = _PUSH_BATCH
        for b0 in range((steps + Int32(batch - 1)) // Int32(batch)):
            for b in cutlass.range_constexpr(batch):
                t, tm, tn, o_lo, o_hi, live = self._push_tile(
                    b0 * Int32(batch) + Int32(b), steps, first, pushers, rank, chunk, lag,
                    num_tiles, tiles_m, tiles_n, local_M, padded_M)
                if live:
                    word = self._arrive_word(arrive_off, t, rank)
                    if ptid == 0:
                        protocol.wait_stamp(ws + word, stamp, timeout_ns, err_addr, ws, rank, t,
                                            rank, epoch, Int32(protocol.KIND_ARRIVE), True)
                    self.push_bar.arrive_and_wait()
                    src = ws + out_off + Int64(t) * Int64(self.tile_bytes)
                    for o in range(o_lo, o_hi + Int32(1)):
                        if o != rank:
                            dst = self._recv_slot_addr(o, rank, t, tm, tn, tiles_n, local_M,
                                                       num_tiles, peer_tab, recv_off,
                                                       region_bytes)
                            self._copy_tile(ptid, src, dst)
            # one system fence for the batch's copies, then every owner's stamp (the tiles
            # are looked up again: values made inside the copy loop's branches cannot be
            # carried out of them)
            self.push_bar.arrive_and_wait()
            if ptid == 0:
                ptx.fence_sys()
                for b in cutlass.range_constexpr(batch):
                    t, _, _, o_lo, o_hi, live = self._push_tile(
                        b0 * Int32(batch) + Int32(b), steps, first, pushers, rank, chunk, lag,
                        num_tiles, tiles_m, tiles_n, local_M, padded_M)
                    if live:
                        word = self._arrive_word(arrive_off, t, rank)
                        for o in range(o_lo, o_hi + Int32(1)):
                            if o != rank:
                                ptx.stamp_sys(protocol.peer_base(peer_tab, o) + word, stamp)

    @cute.jit
    def _push_tile(self, step, steps, first, pushers, rank, chunk, lag, num_tiles, tiles_m,
                   tiles_n, local_M, padded_M):
        """(t, tile row, tile column, first owner, last owner, live) of a push CTA's step:
        live where the step exists and its tile is one a peer owns (rows of)."""
        i = first + step * pushers
        rnd = i // chunk
        t = Int32(-1)
        if step < steps:
            t = self._scheduled_unit(rank, i - rnd * chunk, rnd, chunk, lag, num_tiles,
                                     tiles_m, tiles_n, local_M)
        tm = Int32(0)
        tn = Int32(0)
        o_lo = Int32(0)
        o_hi = Int32(-1)
        live = t >= Int32(0)
        if live:
            tm = t // tiles_n
            tn = t - tm * tiles_n
            cls, o_lo, o_hi = self._tile_class(t, tm, rank, local_M, padded_M, num_tiles)
            live = cls != Int32(_OWN)
        return t, tm, tn, o_lo, o_hi, live

    @cute.jit
    def _copy_tile(self, ptid, src, dst):
        """A staged tile slot to a peer's receive slot: 16-B L2 loads and stores by a push
        CTA's ``push_threads``, ``_COPY_AHEAD`` loads in flight per thread."""
        pieces = self.tile_bytes // 16
        per_thread = -(-pieces // self.push_threads)
        for j0 in cutlass.range_constexpr(0, per_thread, _COPY_AHEAD):
            vals = []
            for j in cutlass.range_constexpr(j0, min(j0 + _COPY_AHEAD, per_thread)):
                c = ptid + Int32(j * self.push_threads)
                vals.append(self._ld_if(c < Int32(pieces), src + Int64(c) * Int64(16), False))
            for jj in cutlass.range_constexpr(len(vals)):
                c = ptid + Int32((j0 + jj) * self.push_threads)
                if c < Int32(pieces):
                    v0, v1, v2, v3 = vals[jj]
                    ptx.st_v4(dst + Int64(c) * Int64(16), v0, v1, v2, v3)
