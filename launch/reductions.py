"""The owner's sums in the communication warps (``CommWarps``): a tile's own partial and
every peer's, read 16 bytes a chunk from shared memory, the receive slots or the multicast
mapping, added in fp32 (with the bias, ``bias``, as one more addend), rounded once and
stored to the output (and for AR to every peer); prefetching a sub-tile ahead at world 2;
and the deferred reductions of tiles whose rows two owners share, after a CTA's last tile.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute

from . import protocol, ptx, trace
from .geometry import BM
from .sub_tile import CHUNK_ITERS, COMM_THREADS, SUB_BYTES, SUB_CHUNKS

Int32 = cutlass.Int32
Int64 = cutlass.Int64


class Reductions:
    """Mixin of ``CommWarps``: reads its ``world, mode, multicast, comm, num_sub, tile_bytes,
    comm_bar, f16, prefetch, push_all, bias`` and its chunk geometry and stamps."""

    @cute.jit
    def _reduce_sub(self, ctid, e: cutlass.Constexpr, own_smem, own_slot_addr, region_bytes, m0, tn,
                    rows_end, t, out_addr, N, rank, local_M, peer_tab, out_off,
                    from_smem: cutlass.Constexpr, pre=None):
        """Own partial (smem sub-tile, or the parked copy at own_slot_addr + (world-1) regions)
        plus every peer's partial (receive regions 0..world-2 at own_slot_addr), to the output.
        ``pre``: the peer's chunks of this sub-tile (``_sub_loads``, world 2), loaded earlier.
        A sub-tile whose rows are all this rank's (every full tile an owner reduces; bulk-copy
        pushes) runs its chunks as straight-line code: with a branch around each chunk, each chunk's loads
        were waited for before the next chunk began (0.75 us per 8 KB sub-tile, PERF.md (m))."""
        # AR results leave as bulk copies from the slot (direct path only: the slot holds them)
        bulk = self.bulk_results and self.mode == "ar" and not self.multicast and from_smem
        # Bulk-copy pushes only: with thread-store pushes ptxas serialized the MMA warps'
        # wgmma (C7520) once the straight-line copy was in. AR owns whole tiles, RS rows.
        whole = False
        if cutlass.const_expr(self.tma_push):
            whole = (m0 + Int32(self.bm) <= rows_end) & self._inside_n(e, tn, N)
            if cutlass.const_expr(self.mode == "rs"):
                whole = whole & (m0 // local_M == rank) & ((m0 + Int32(self.bm - 1)) // local_M == rank)
        if whole:
            self._reduce_chunks(ctid, e, own_smem, own_slot_addr, region_bytes, m0, tn, rows_end,
                                t, out_addr, N, rank, local_M, peer_tab, out_off, from_smem, bulk,
                                True, pre)
        else:
            self._reduce_chunks(ctid, e, own_smem, own_slot_addr, region_bytes, m0, tn, rows_end,
                                t, out_addr, N, rank, local_M, peer_tab, out_off, from_smem, bulk,
                                False, pre)
        if cutlass.const_expr(bulk):
            # the reduced sub-tile, now in the slot, to every peer's OUT in one copy each
            cute.arch.fence_proxy("async.shared", space="cta")
            self.comm_bar.arrive_and_wait()
            if ctid == 0:
                rows = cutlass.min(Int32(self.bm), rows_end - m0)
                tile_off = out_off + Int64(t) * Int64(self.tile_bytes) + Int64(e * self.sub_bytes)
                for p in cutlass.range_constexpr(self.world):
                    if Int32(p) != rank:
                        ptx.bulk_s2g(protocol.peer_base(peer_tab, Int32(p)) + tile_off, own_smem,
                                     rows * Int32(self.row_bytes))
                ptx.bulk_commit()
                if cutlass.const_expr(not self.defer_release):
                    ptx.bulk_wait_read_all()

    @cute.jit
    def _reduce_chunks(self, ctid, e: cutlass.Constexpr, own_smem, own_slot_addr, region_bytes, m0,
                       tn, rows_end, t, out_addr, N, rank, local_M, peer_tab, out_off,
                       from_smem: cutlass.Constexpr, bulk: cutlass.Constexpr,
                       whole: cutlass.Constexpr, pre=None):
        """``_reduce_sub``'s chunks; ``whole``: every row is this rank's, so only the last,
        partly populated chunk round needs a condition."""
        batch = max(1, 8 // max(1, self.world - 1))
        if cutlass.const_expr(pre is not None):
            batch = 1  # the peer's chunks are in registers: sum each as its own chunk is read
        for j0 in cutlass.range_constexpr(0, self.chunk_iters, batch):
            own = []
            peers = []
            geo = []
            bias_w = []
            for j in cutlass.range_constexpr(j0, min(j0 + batch, self.chunk_iters)):
                c, grow, sub_off, col, smem_off = self._chunk_geom(ctid, j, e, m0, tn)
                live = c < Int32(self.sub_chunks)
                if cutlass.const_expr(j * COMM_THREADS + COMM_THREADS <= self.sub_chunks):
                    live = True
                geo.append((live, grow, sub_off, col, smem_off))
                src = own_slot_addr + sub_off
                if cutlass.const_expr(from_smem):
                    own.append(self._ld_if(live, own_smem + smem_off, True))
                else:
                    own.append(self._ld_if(live, src + Int64(self.world - 1) * region_bytes, False))
                if cutlass.const_expr(pre is not None):
                    peers.append(pre[j])
                else:
                    for s in cutlass.range_constexpr(self.world - 1):
                        peers.append(self._ld_if(live, src + Int64(s) * region_bytes, False))
                if cutlass.const_expr(self.bias):
                    bias_w.append(self._bias_words(grow, col, N))
            for jj in cutlass.range_constexpr(len(geo)):
                live, grow, sub_off, col, smem_off = geo[jj]
                mine = True  # every row of a whole sub-tile is this rank's, every column real
                if cutlass.const_expr(not whole):
                    mine = (grow < rows_end) & (col < N)
                    if cutlass.const_expr(self.mode == "rs"):
                        mine = mine & (grow // local_M == rank)
                if live & mine:
                    addends = peers[jj * (self.world - 1):(jj + 1) * (self.world - 1)]
                    if cutlass.const_expr(self.bias):
                        addends = addends + [bias_w[jj]]
                    r = self._sum(own[jj], addends)
                    self._store_result(r[0], r[1], r[2], r[3], grow, col, t, sub_off, out_addr, N,
                                       rank, local_M, peer_tab, out_off, Int64(0),
                                       not bulk and not self.push_all)
                    if cutlass.const_expr(bulk):
                        ptx.st_shared_v4(own_smem + smem_off, r[0], r[1], r[2], r[3])

    def _prefetching(self) -> bool:
        """Whether reductions load one sub-tile ahead (``prefetch``; world 2 over unicast,
        where the one peer's chunks of a sub-tile, 6 x 16 B a thread, fit the registers of
        the communication warps beside the sub-tile being summed)."""
        return (self.prefetch and self.comm and not self.multicast and self.world == 2
                and self.chunk_iters <= 8)

    @cute.jit
    def _sub_loads(self, ctid, e: cutlass.Constexpr, slot_addr, m0, tn, pred):
        """This thread's 16-byte chunks of sub-tile e at ``slot_addr`` (the peer's receive
        region, or a tile of OUT) where ``pred``, zeros elsewhere: a list of 4-word tuples."""
        vals = []
        for j in cutlass.range_constexpr(self.chunk_iters):
            c, grow, sub_off, col, smem_off = self._chunk_geom(ctid, j, e, m0, tn)
            vals.append(self._ld_if(pred & (c < Int32(self.sub_chunks)), slot_addr + sub_off, False))
        return vals

    @cute.jit
    def _ld_if(self, pred, addr, shared: cutlass.Constexpr):
        """16-byte load, skipped (zeros) where pred is false: the last chunk round of a
        sub-tile is only partly populated, and reading past it would leave the buffer. Where
        ``pred`` is a Python True the load is unconditional, so straight-line callers
        (``_reduce_chunks``) get no branch."""
        if cutlass.const_expr(isinstance(pred, bool) and pred):
            if cutlass.const_expr(shared):
                return ptx.ld_shared_v4(addr)
            return ptx.ld_v4_cg(addr)
        r0 = Int32(0)
        r1 = Int32(0)
        r2 = Int32(0)
        r3 = Int32(0)
        if pred:
            if cutlass.const_expr(shared):
                r0, r1, r2, r3 = ptx.ld_shared_v4(addr)
            else:
                r0, r1, r2, r3 = ptx.ld_v4_cg(addr)
        return r0, r1, r2, r3

    def _use_bias(self, bias: int, mode: str) -> None:
        """``bias`` (``CommWarps.bias``): only the exchange's sums take one."""
        if bias and mode == "gemm":
            raise ValueError("a bias is added by the exchange's sums: RS and AR kernels only")
        self.bias = bool(bias)
        self._bias_args = None

    def _bias_at(self, bias_addr, M) -> None:
        """Keeps the kernel's bias address and M for the sums (trace time: the kernel's
        arguments dominate every use in its body, so the reductions need no parameter)."""
        self._bias_args = (bias_addr, M) if self.bias else None

    @cute.jit
    def _bias_words(self, grow, col, N):
        """bias[col:col + 8] as four words where row ``grow`` is below M, else zeros (a
        mask, not a branch: the reductions' chunks are straight-line code). The address
        stays inside the bias where ``col`` is past N (those sums are never stored)."""
        bias_addr, M = self._bias_args
        c = cutlass.min(col, N - Int32(8))
        w0, w1, w2, w3 = ptx.ld_v4_nc(bias_addr + Int64(c) * Int64(2))
        keep = Int32(0) - Int32(grow < M)
        return (w0 & keep, w1 & keep, w2 & keep, w3 & keep)

    @cute.jit
    def _add_bias(self, r0, r1, r2, r3, grow, col, N):
        """A reduced chunk (four words) plus its bias, rounded again (multicast sums)."""
        return self._sum((r0, r1, r2, r3), [self._bias_words(grow, col, N)])

    def _unpack2(self, u):
        """Two fp32 from a word of two elements (low half first)."""
        return ptx.f16x2_to_f32(u) if self.f16 else ptx.bf16x2_to_f32(u)

    def _pack2(self, lo, hi):
        """A word of two elements rounded from fp32, ``lo`` in the low half."""
        return ptx.f32_to_f16x2(lo, hi) if self.f16 else ptx.f32_to_bf16x2(lo, hi)

    def _ld_reduce8(self, addr):
        """``multimem.ld_reduce`` of 8 elements (16 B), summed in fp32 by the switch."""
        if self.f16:
            return ptx.multimem_ld_reduce_f16x8(addr)
        return ptx.multimem_ld_reduce_bf16x8(addr)

    @cute.jit
    def _sum(self, own, peers):
        a = []
        for w in cutlass.range_constexpr(4):
            lo, hi = self._unpack2(own[w])
            a.append(lo)
            a.append(hi)
        for p in peers:
            for w in cutlass.range_constexpr(4):
                lo, hi = self._unpack2(p[w])
                a[2 * w] = a[2 * w] + lo
                a[2 * w + 1] = a[2 * w + 1] + hi
        return (self._pack2(a[0], a[1]), self._pack2(a[2], a[3]),
                self._pack2(a[4], a[5]), self._pack2(a[6], a[7]))

    @cute.jit
    def _store_result(self, r0, r1, r2, r3, grow, col, t, sub_off, out_addr, N, rank, local_M,
                      peer_tab, out_off, mc_base, to_peers: cutlass.Constexpr = True):
        out_row = grow
        if cutlass.const_expr(self.mode == "rs"):
            out_row = grow - rank * local_M
        ptx.st_v4(out_addr + (Int64(out_row) * Int64(N) + Int64(col)) * Int64(2), r0, r1, r2, r3)
        if cutlass.const_expr(self.mode == "ar" and to_peers):
            tile_off = out_off + Int64(t) * Int64(self.tile_bytes) + sub_off
            if cutlass.const_expr(self.multicast):
                ptx.multimem_st_v4(mc_base + tile_off, r0, r1, r2, r3)
            else:
                for p in cutlass.range_constexpr(self.world):
                    if Int32(p) != rank:
                        ptx.st_v4(protocol.peer_base(peer_tab, Int32(p)) + tile_off, r0, r1, r2, r3)

    @cute.jit
    def _deferred_reduce(self, ctid, t, tm, tn, m0, tiles_n, num_tiles, ws, peer_tab, mc_base,
                         out_addr, M, N, rank, local_M, padded_M, arrive_off, result_off, recv_off,
                         region_bytes, part_off, out_off, stamp, epoch, timeout_ns, err_addr,
                         cta=Int32(0)):
        """Own rows of tile t from the workspace: parked own partial (unicast) or every rank's
        partial through the multicast mapping."""
        if ctid == 0:
            self._wait_arrivals(t, ws, arrive_off, stamp, timeout_ns, err_addr, rank, epoch,
                                self.multicast)
        self.comm_bar.arrive_and_wait()
        self._mark(ws, cta, trace.DEFER_WAITED, ctid == 0)
        own_slot = self._slot(rank, t, tm, tn, tiles_n, local_M, num_tiles)
        rows_end = M
        if cutlass.const_expr(self.mode == "rs"):
            rows_end = padded_M
        slot_addr = ws + recv_off + Int64(own_slot) * Int64(self.tile_bytes)
        for e in cutlass.range_constexpr(self.num_sub):
            if cutlass.const_expr(self.multicast):
                for j in cutlass.range_constexpr(self.chunk_iters):
                    c, grow, sub_off, col, smem_off = self._chunk_geom(ctid, j, e, m0, tn)
                    mine = (c < Int32(self.sub_chunks)) & (grow < rows_end) & (col < N)
                    if cutlass.const_expr(self.mode == "rs"):
                        mine = mine & (grow // local_M == rank)
                    if mine:
                        r0, r1, r2, r3 = self._ld_reduce8(
                            mc_base + part_off + Int64(t) * Int64(self.tile_bytes) + sub_off)
                        if cutlass.const_expr(self.bias):
                            r0, r1, r2, r3 = self._add_bias(r0, r1, r2, r3, grow, col, N)
                        self._store_result(r0, r1, r2, r3, grow, col, t, sub_off, out_addr, N,
                                           rank, local_M, peer_tab, out_off, mc_base)
            else:
                self._reduce_sub(ctid, e, Int32(0), slot_addr, region_bytes, m0, tn, rows_end, t,
                                 out_addr, N, rank, local_M, peer_tab, out_off, False)
        self.comm_bar.arrive_and_wait()
        if cutlass.const_expr(self.mode == "ar" and not self.push_all):
            if ctid == 0:
                ptx.fence_sys()
                self._stamp_results(t, peer_tab, result_off, stamp, rank)
