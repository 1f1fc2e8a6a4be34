"""AR's results back to every rank (``CommWarps``): an owner stamps each reduced tile's
result words on its peers, and a rank copies the tiles others own from OUT into the caller's
output, after its last round or, with the lag round, two rounds after its push
(``early_copy``).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute

from . import protocol, ptx, trace
from .geometry import BM
from .sub_tile import CHUNK_ITERS, SUB_CHUNKS

Int32 = cutlass.Int32
Int64 = cutlass.Int64


class ArResults:
    """Mixin of ``CommWarps``: reads its ``world, num_sub, tile_bytes, comm_bar``, its schedule,
    chunk geometry and loads."""

    @cute.jit
    def _stamp_results(self, t, peer_tab, result_off, stamp, rank):
        for p in cutlass.range_constexpr(self.world):
            if Int32(p) != rank:
                ptx.stamp_sys(protocol.peer_base(peer_tab, Int32(p)) + result_off
                              + Int64(t) * Int64(4), stamp)

    @cute.jit
    def _ar_copy_out(self, ctid, cta, num_ctas, num_tiles, tiles_n, rank, epoch, M, N, ws,
                     out_addr, result_off, out_off, timeout_ns, err_addr):
        """Tiles other ranks own arrive reduced in OUT; copy them to the caller's output."""
        j_tile = cta
        while j_tile < num_tiles:
            owner = self._ar_owner(j_tile, num_tiles)
            if owner != rank:
                self._copy_result(ctid, cta, j_tile, owner, tiles_n, rank, epoch, M, N, ws,
                                  out_addr, result_off, out_off, timeout_ns, err_addr)
            j_tile = j_tile + num_ctas

    @cute.jit
    def _copying_early(self, lag):
        """Whether results are copied back during the rounds (``early_copy`` with the lag
        round): an owner reduces a tile a round after its push, so the result of the tile
        pushed two rounds back can be copied while this round's bulk copies are in flight
        (2x H200, K=1024, M 4096-16384: 4-11% faster). Without the lag round the owner
        waits for the stamp of the tile just pushed: a copy in front of it cost up to 5%
        (M=512), so such launches copy everything after their last round."""
        return (lag & Int32(1)) != Int32(0)

    @cute.jit
    def _copy_back_round(self, ctid, cta, rnd, chunk, lag, num_tiles, tiles_m, tiles_n, local_M,
                         rank, epoch, M, N, ws, out_addr, result_off, out_off, timeout_ns,
                         err_addr):
        """During round ``rnd`` (``_copying_early``): the result of the tile this CTA pushed
        in round ``rnd - 2``. Its owner reduced it in round ``rnd - 1``, whose work depends
        only on pushes of earlier rounds, all stamped before this CTA reaches round ``rnd``:
        the wait closes no cycle."""
        if self._copying_early(lag) & (rnd >= Int32(2)):
            self._copy_back(ctid, cta, rnd - Int32(2), chunk, lag, num_tiles, tiles_m, tiles_n,
                            local_M, rank, epoch, M, N, ws, out_addr, result_off, out_off,
                            timeout_ns, err_addr)

    @cute.jit
    def _copy_back(self, ctid, cta, src, chunk, lag, num_tiles, tiles_m, tiles_n, local_M, rank,
                   epoch, M, N, ws, out_addr, result_off, out_off, timeout_ns, err_addr):
        """The result of the tile this CTA computed in round ``src``, if another rank owns it,
        into the caller's output. Every tile another rank owns is pushed by exactly one CTA
        here, so these copies cover them all."""
        t = self._scheduled(rank, cta, src, chunk, lag, num_tiles, tiles_m, tiles_n, local_M)
        if t >= Int32(0):
            owner = self._ar_owner(t, num_tiles)
            if owner != rank:
                self._copy_result(ctid, cta, t, owner, tiles_n, rank, epoch, M, N, ws, out_addr,
                                  result_off, out_off, timeout_ns, err_addr)

    @cute.jit
    def _copy_result(self, ctid, cta, j_tile, owner, tiles_n, rank, epoch, M, N, ws, out_addr,
                     result_off, out_off, timeout_ns, err_addr):
        """Wait for ``owner``'s result stamp of tile ``j_tile``, then copy the reduced tile from
        OUT to the caller's output (the 96 threads together)."""
        if ctid == 0:
            protocol.wait_stamp(ws + result_off + Int64(j_tile) * Int64(4), epoch + Int32(1),
                                timeout_ns, err_addr, ws, rank, j_tile, owner, epoch,
                                Int32(protocol.KIND_RESULT))
        self.comm_bar.arrive_and_wait()
        self._mark(ws, cta, trace.COPY_WAITED, ctid == 0)
        tm = j_tile // tiles_n
        tn = j_tile - tm * tiles_n
        base = ws + out_off + Int64(j_tile) * Int64(self.tile_bytes)
        ahead = None
        if cutlass.const_expr(self._prefetching()):
            ahead = self._sub_loads(ctid, 0, base, tm * Int32(self.bm), tn, True)
        for e in cutlass.range_constexpr(self.num_sub):
            vals = []
            geo = []
            if cutlass.const_expr(self._prefetching()):
                vals = ahead
                if cutlass.const_expr(e + 1 < self.num_sub):
                    ahead = self._sub_loads(ctid, e + 1, base, tm * Int32(self.bm), tn, True)
            for j in cutlass.range_constexpr(self.chunk_iters):
                c, grow, sub_off, col, smem_off = self._chunk_geom(ctid, j, e, tm * Int32(self.bm), tn)
                geo.append((c, grow, col))
                if cutlass.const_expr(not self._prefetching()):
                    vals.append(self._ld_if(c < Int32(self.sub_chunks), base + sub_off, False))
            for j in cutlass.range_constexpr(self.chunk_iters):
                c, grow, col = geo[j]
                if (c < Int32(self.sub_chunks)) & (grow < M) & (col < N):
                    v = vals[j]
                    ptx.st_v4(out_addr + (Int64(grow) * Int64(N) + Int64(col)) * Int64(2),
                              v[0], v[1], v[2], v[3])
