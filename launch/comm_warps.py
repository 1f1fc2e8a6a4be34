"""The communication warps and the protocol's per-tile logic, shared by every arch.

A kernel that mixes this in provides, per CTA: 96 communication threads, a sub-tile ring in
shared memory (``epi_slots`` slots of 128 x 32 bf16 or fp16, row pitch ``epi_pitch``
elements, chunk order as ``tma_push`` says) fed by its MMA warps through an mbarrier
pipeline, and the attributes ``bn, world, mode, multicast, comm, num_sub, epi_slots,
tile_bytes, comm_bar`` (and ``cta_group``, ``tma_push``, ``bulk_results``, ``peers_first``,
``pair_n``, ``push_all``, default 1 / False; ``f16``: the elements are fp16, not bf16).
Everything here - tile classes, receive slots, pushes, waits, stamps, and through its bases
the round schedule (``launch.schedule``), the push CTAs (``launch.push_ctas``), the sums
(``launch.reductions``) and AR's results (``launch.ar_results``) - is independent of how the
tile was computed (wgmma on sm90, tcgen05 on sm100). The sub-tile ring's chunk geometry is
``launch.sub_tile``'s.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline

from . import layout, protocol, ptx, trace
from .ar_results import ArResults
from .geometry import BM, EPI_N
from .push_ctas import PushCtas
from .reductions import Reductions
from .schedule import TileSchedule
from .sub_tile import CHUNK_ITERS, COMM_THREADS, EPI_PITCH, SUB_BYTES, SUB_CHUNKS

Int32 = cutlass.Int32
Int64 = cutlass.Int64

_FOREIGN, _OWN, _MIXED = protocol.TILE_FOREIGN, protocol.TILE_OWN, protocol.TILE_MIXED

# The element types a kernel computes, pushes and returns (x, w and the output alike):
# name -> the CuTe DSL type. Partials and sums stay fp32 inside the kernel either way.
DTYPES = {"bf16": cutlass.BFloat16, "f16": cutlass.Float16}
# Operand types narrower than the output (x and w only): name -> the CuTe DSL type. Such a
# kernel scales each accumulator by x's row scale and w's column scale before rounding it
# to the output type, as torch._scaled_mm does.
IN_DTYPES = {"e4m3": cutlass.Float8E4M3FN}
# Bytes of one k-block row of an operand tile (the TMA's 128-byte swizzle): 64 bf16 / fp16
# elements, 128 fp8 ones.
BK_BYTES = 128


def element_type(dtype: str) -> type:
    """The CuTe DSL type of a kernel's element type name."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


class CommWarps(TileSchedule, PushCtas, Reductions, ArResults):
    """Mixin: device methods of the communication role (see module docstring), with the
    tile schedule (``launch.schedule``), the push CTAs' role (``launch.push_ctas``), the
    sums (``launch.reductions``) and AR's results (``launch.ar_results``)."""

    cta_group = 1  # 2: the schedule runs over 2-CTA pair-tiles (sm100, ``launch.plan``)
    # True: sub-tiles sit in the ring as unpadded 64-B rows whose four 16-B chunks are
    # permuted, chunk c of row r at c ^ ((r >> 1) & 3) (conflict-free for stmatrix and the
    # reads), and every partial buffer (receive slots, park, multicast partials) holds that
    # same image, so pushes are single bulk copies of whole row ranges.
    tma_push = False
    # True (with tma_push, AR, unicast): an own tile's reduced sub-tile is written back over
    # the own partial in its ring slot and sent to every peer's OUT as one bulk copy, instead
    # of 16-B thread stores per peer.
    bulk_results = False
    # True: the peers-first schedule (``TilePlan.peers_first``)
    peers_first = False
    # True (with peers_first): its flat order over all lists (``TilePlan.flat``)
    flat = False
    # True (1-CTA flat orders): the split-K tail (``TilePlan.sk``, ``_segment``)
    sk = False
    # True (RS 1-CTA round order): a tile row two owners share is split between their lists
    # (``TilePlan.split_row``)
    split_row = False
    # True (with cta_group 2): the pair-tile is two tiles of one row (``TilePlan.pair_n``)
    pair_n = False
    # True (AR, unicast, bulk-copy pushes): every rank pushes every tile to every peer and
    # reduces every tile itself, after its last push (``TilePlan.push_all``)
    push_all = False
    # True: record event times (``launch.trace``)
    trace = False
    # True (world 2, unicast): the peer's chunks of a direct reduction, and AR's copy-out,
    # are loaded one sub-tile ahead, so one sub-tile's loads are in flight while the one
    # before is summed (a trace showed a 57 KB own tile taking ~10 us to reduce after the
    # GEMM ended: seven L2 round trips in a row, one per sub-tile)
    prefetch = False
    # True (AR over unicast, owner plans): with the lag round a CTA copies the result of each
    # tile it pushed into the caller's output two rounds later, while its next pushes are in
    # flight, instead of every CTA copying its share of all results after its last tile
    # (``_copy_back_round``)
    early_copy = False
    # > 0 (bulk-copy pushes): after each sub-tile's copies, wait until at most this many of
    # the CTA's copy groups are still in flight. The TMA unit issues the mainloop's loads
    # behind the pushes queued on it, so a CTA with a whole tile of pushes in flight starves
    # its next GEMM; one group at a time sped up AR at M 1024-4096 by 1.6-2.3% and
    # RS's peers-first plans by up to 7% (docs/PERF.md (n)), but slowed RS at K=1024 from
    # M=2048 by 3-8%, where the link needs every CTA's copies in flight.
    push_window = 0
    # True (RS, unicast, bulk-copy pushes, flat order): CTAs from ``chunk`` up only push
    # (``launch.plan.push_plan``). The others stage a peer's tile in this rank's OUT region
    # (AR's, unused by RS) and stamp its own ARRIVE word at GPU scope; a push CTA copies it
    # to the owner, fences once at system scope and stamps the owner (``_push_role``).
    push_ctas = False
    push_threads = COMM_THREADS  # the kernel's push CTAs copy with this many threads
    # True: the exit without system fences or ``done`` stamps (``protocol.finish_launch``)
    lean_exit = False
    # True: elements are fp16 (``DTYPES``); the pack / unpack below follow it
    f16 = False
    # True (RS / AR): every sum of the exchange adds bias[col] (N elements of the output
    # type, 16-byte aligned) as one more addend before its rounding, on rows below M: RS's
    # padding rows stay zero. The multicast switch returns its sums rounded, so there the
    # bias is added to the rounded sum (a second rounding).
    bias = False

    @property
    def copies_early(self) -> bool:
        return (self.early_copy and self.mode == "ar" and self.comm and not self.push_all
                and not self.multicast)

    @property
    def defer_release(self) -> bool:
        """Bulk-copy pushes leave the ring slots of a tile taken until every copy of the
        tile has read its slot, so all of a tile's copies are in flight at once (one wait
        per tile, not one per sub-tile). Measured neutral to 3% faster (docs/PERF.md (c)):
        the ~2 us a CTA needs to send a 128x128 tile is the link's, not the waits'. Needs a
        ring that holds the whole tile, or the MMA warps could not fill the next sub-tile."""
        return (self.tma_push and self.comm and not self.multicast
                and self.epi_slots >= self.num_sub)

    bm = BM  # rows of a tile
    epi_n = EPI_N  # columns of a sub-tile: 32, or 16 for widths 16 past a multiple of 32

    @property
    def swizzled(self) -> bool:
        return self.tma_push or self.epi_n != EPI_N

    @property
    def sub_bytes(self) -> int:
        return self.bm * self.epi_n * 2

    @property
    def window_groups(self) -> int:
        """Sub-tile copy groups ``push_window`` keeps in flight: the window is measured in
        32-column sub-tiles, so 16-column ones keep as many bytes in flight in twice the
        groups."""
        return self.push_window * (EPI_N // self.epi_n)

    @property
    def sub_chunks(self) -> int:
        return self.sub_bytes // 16

    @property
    def chunk_iters(self) -> int:
        return -(-self.sub_chunks // COMM_THREADS)

    @property
    def row_bytes(self) -> int:
        return self.epi_n * 2

    @property
    def row_chunks(self) -> int:
        return self.epi_n // 8

    @property
    def epi_pitch(self) -> int:
        """Row pitch of the sub-tile ring, in elements."""
        return self.epi_n if self.swizzled else EPI_PITCH

    @cute.jit
    def _mark(self, ws, cta, event: cutlass.Constexpr, pred=True):
        if cutlass.const_expr(self.trace):
            if pred:
                trace.mark(ws, cta, event)

    # ------------------------------------------------------------------ communication warps
    @cute.jit
    def _arrive_word(self, arrive_off, t, src):
        """Offset in a workspace of the stamp rank ``src`` sets when tile t's part has landed
        (``launch.layout``: one word per tile and sending rank)."""
        return arrive_off + Int64(t * Int32(self.world) + src) * Int64(4)

    @cute.jit
    def _tile_class(self, t, tm, rank, local_M, padded_M, num_tiles):
        """(class, first owner, last owner) of tile t, as ``launch.plan`` defines them."""
        cls = Int32(_OWN)
        o_lo = rank
        o_hi = rank
        if cutlass.const_expr(self.mode == "rs"):
            m0 = tm * Int32(self.bm)
            o_lo = m0 // local_M
            o_hi = (cutlass.min(m0 + Int32(self.bm), padded_M) - Int32(1)) // local_M
            if (o_lo != rank) | (o_hi != rank):
                cls = Int32(_FOREIGN)
                if (o_lo <= rank) & (rank <= o_hi):
                    cls = Int32(_MIXED)
        if cutlass.const_expr(self.mode == "ar" and self.push_all):
            cls = Int32(_MIXED)
            o_lo = Int32(0)
            o_hi = Int32(self.world - 1)
        elif cutlass.const_expr(self.mode == "ar"):
            o_lo = self._ar_owner(t, num_tiles)
            o_hi = o_lo
            if o_lo != rank:
                cls = Int32(_FOREIGN)
        return cls, o_lo, o_hi

    @cute.jit
    def _ar_owner(self, t, num_tiles):
        """The rank that reduces AR tile t (``TilePlan.tile_owner``)."""
        return t * Int32(self.world) // num_tiles

    @cute.jit
    def _slot(self, owner, t, tm, tn, tiles_n, local_M, num_tiles):
        s = Int32(0)
        if cutlass.const_expr(self.push_all):
            s = t
        elif cutlass.const_expr(self.mode == "rs"):
            s = (tm - (owner * local_M) // Int32(self.bm)) * tiles_n + tn
        else:
            s = t - (owner * num_tiles + Int32(self.world - 1)) // Int32(self.world)
        return s

    @cute.jit
    def _comm_role(self, ctid, cta, num_ctas, num_tiles, tiles_m, tiles_n, epi_pipe, sC_ptr,
                   out_addr, M, N, shape, ws, peer_tab, mc_base, err_addr, rank, local_M, padded_M,
                   chunk, rounds, lag, timeout_ns, arrive_off, result_off, recv_off, region_bytes,
                   part_off, out_off, k_tiles=None):
        epoch = Int32(0)
        if cutlass.const_expr(self.comm):
            epoch = ptx.ld_relaxed_gpu(ws + Int64(layout.CTRL_EPOCH))
            self._mark(ws, cta, trace.START, ctid == 0)
            if ctid == 0:
                if cta == Int32(0):
                    protocol.announce_start(ws, peer_tab, epoch, self.world, rank, shape)
                protocol.wait_peers_started(ws, epoch, self.world, rank, shape, timeout_ns,
                                            err_addr)
            self.comm_bar.arrive_and_wait()
            self._mark(ws, cta, trace.PEERS_DONE, ctid == 0)
        stamp = epoch + Int32(1)
        smem_base = sC_ptr.toint()
        rows_end = M
        if cutlass.const_expr(self.mode == "rs"):
            rows_end = padded_M
        self_region = Int64(self.world - 1) * region_bytes
        epi_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.epi_slots)
        rel_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.epi_slots)
        tiles_done = Int32(0)  # trace: tiles this CTA has finished

        for rnd in range(rounds):
            t = self._scheduled(rank, cta, rnd, chunk, lag, num_tiles, tiles_m, tiles_n, local_M,
                                k_tiles)
            if t >= Int32(0):
                first = (ctid == 0) & (tiles_done == Int32(0))
                tm = t // tiles_n
                tn = t - tm * tiles_n
                m0 = tm * Int32(self.bm)
                cls, o_lo, o_hi = self._tile_class(t, tm, rank, local_M, padded_M, num_tiles)
                own_slot = self._slot(rank, t, tm, tn, tiles_n, local_M, num_tiles)
                # direct: sum straight from the sub-tile ring (a tile only this rank owns, unicast)
                if cutlass.const_expr(not self.comm):
                    direct = True
                elif cutlass.const_expr(self.multicast):
                    direct = False
                else:
                    direct = cls == Int32(_OWN)
                    if direct:
                        # the peers' partials must all be in before the first sum
                        if ctid == 0:
                            self._wait_arrivals(t, ws, arrive_off, stamp, timeout_ns, err_addr,
                                                rank, epoch, False)
                        self.comm_bar.arrive_and_wait()
                        self._mark(ws, cta, trace.DIRECT_WAITED, first)
                own_slot_addr = ws + recv_off + Int64(own_slot) * Int64(self.tile_bytes)
                ahead = None
                if cutlass.const_expr(self._prefetching()):
                    ahead = self._sub_loads(ctid, 0, own_slot_addr, m0, tn, direct)

                for e in cutlass.range_constexpr(self.num_sub):
                    pre = ahead
                    if cutlass.const_expr(self._prefetching() and e + 1 < self.num_sub):
                        ahead = self._sub_loads(ctid, e + 1, own_slot_addr, m0, tn, direct)
                    epi_pipe.consumer_wait(epi_state)
                    if cutlass.const_expr(e == 0):
                        self._mark(ws, cta, trace.FIRST_SUB, first)
                        self._mark(ws, cta, trace.LAST_SUB, ctid == 0)
                    slot_smem = smem_base + epi_state.index * Int32(self.bm * self.epi_pitch * 2)
                    if cutlass.const_expr(self.comm and not self.multicast):
                        if direct:
                            self._reduce_sub(ctid, e, slot_smem, own_slot_addr, region_bytes, m0, tn,
                                             rows_end, t, out_addr, N, rank, local_M, peer_tab,
                                             out_off, True, pre)
                        elif cutlass.const_expr(self.tma_push):
                            self._push_sub_bulk(ctid, e, slot_smem, t, tm, tn, m0, rows_end, o_lo,
                                                rank, local_M, tiles_n, num_tiles, peer_tab,
                                                recv_off, region_bytes, own_slot_addr + self_region,
                                                ws + out_off + Int64(t) * Int64(self.tile_bytes))
                        else:
                            self._push_sub(ctid, e, slot_smem, t, tm, tn, m0, rows_end, o_lo, rank,
                                           local_M, tiles_n, num_tiles, peer_tab, recv_off,
                                           region_bytes, own_slot_addr + self_region)
                    else:
                        self._copy_sub(ctid, e, slot_smem, t, tn, m0, rows_end, ws, part_off,
                                       out_addr, N)
                    if cutlass.const_expr(not self.defer_release):
                        epi_pipe.consumer_release(rel_state)
                        rel_state.advance()
                    epi_state.advance()

                if cutlass.const_expr(self.comm):
                    if cutlass.const_expr(self.defer_release):
                        if ctid == 0:
                            ptx.bulk_wait_read_all()
                    self.comm_bar.arrive_and_wait()
                    if cutlass.const_expr(self.defer_release):
                        for _e in cutlass.range_constexpr(self.num_sub):
                            epi_pipe.consumer_release(rel_state)
                            rel_state.advance()
                    self._mark(ws, cta, trace.FIRST_TILE_SENT, first)
                    if cutlass.const_expr(self.copies_early):
                        # while this tile's bulk copies are in flight
                        self._copy_back_round(ctid, cta, rnd, chunk, lag, num_tiles, tiles_m,
                                              tiles_n, local_M, rank, epoch, M, N, ws,
                                              out_addr, result_off, out_off, timeout_ns,
                                              err_addr)
                    # An RS tile only this rank owns went straight to the output: no stamp
                    # follows it, so no system fence either (the exit's fence covers its stores).
                    signals = True
                    if cutlass.const_expr(self.mode == "rs" and not self.multicast):
                        signals = cls != Int32(_OWN)
                    if ctid == 0:
                        if cutlass.const_expr(self.push_ctas):
                            if signals:
                                # staged here: a push CTA of this GPU takes it on
                                ptx.bulk_wait_all()
                                ptx.fence_proxy_async_global()
                                ptx.fence_gpu()
                                ptx.st_relaxed_gpu(ws + self._arrive_word(arrive_off, t, rank),
                                                   stamp)
                        else:
                            if signals:
                                if cutlass.const_expr(self.tma_push):
                                    # the bulk copies this thread issued have landed
                                    ptx.bulk_wait_all()
                                    ptx.fence_proxy_async_global()
                                    self._mark(ws, cta, trace.FIRST_LANDED, first)
                                ptx.fence_sys()
                                self._mark(ws, cta, trace.FIRST_FENCED, first)
                                word = self._arrive_word(arrive_off, t, rank)
                                for o in range(o_lo, o_hi + Int32(1)):
                                    if cutlass.const_expr(self.multicast):
                                        ptx.stamp_sys(protocol.peer_base(peer_tab, o) + word,
                                                      stamp)
                                    else:
                                        if o != rank:
                                            ptx.stamp_sys(protocol.peer_base(peer_tab, o) + word,
                                                          stamp)
                                if cutlass.const_expr(self.mode == "ar" and not self.multicast):
                                    if direct:
                                        self._stamp_results(t, peer_tab, result_off, stamp, rank)
                        self._mark(ws, cta, trace.FIRST_STAMPED, first)
                        self._mark(ws, cta, trace.LAST_STAMPED)
                        if cutlass.const_expr(self.trace):
                            trace.mark_tile(ws, cta, tiles_done)
                    if cutlass.const_expr(self.multicast):
                        if cls == Int32(_OWN):
                            self._deferred_reduce(ctid, t, tm, tn, m0, tiles_n, num_tiles, ws, peer_tab,
                                                  mc_base, out_addr, M, N, rank, local_M, padded_M,
                                                  arrive_off, result_off, recv_off, region_bytes,
                                                  part_off, out_off, stamp, epoch, timeout_ns, err_addr)
                if cutlass.const_expr(self.trace):
                    tiles_done = tiles_done + Int32(1)
            elif cutlass.const_expr(self.copies_early):
                self._copy_back_round(ctid, cta, rnd, chunk, lag, num_tiles, tiles_m, tiles_n,
                                      local_M, rank, epoch, M, N, ws, out_addr, result_off,
                                      out_off, timeout_ns, err_addr)

        if cutlass.const_expr(self.mode == "rs" or self.push_all):
            # tiles shared with other owners: every push of this CTA is out, now sum own rows
            for rnd in range(rounds):
                t = self._scheduled(rank, cta, rnd, chunk, lag, num_tiles, tiles_m, tiles_n,
                                    local_M, k_tiles)
                if t >= Int32(0):
                    tm = t // tiles_n
                    tn = t - tm * tiles_n
                    cls, o_lo, o_hi = self._tile_class(t, tm, rank, local_M, padded_M, num_tiles)
                    if cls == Int32(_MIXED):
                        self._deferred_reduce(ctid, t, tm, tn, tm * Int32(self.bm), tiles_n, num_tiles, ws,
                                              peer_tab, mc_base, out_addr, M, N, rank, local_M,
                                              padded_M, arrive_off, result_off, recv_off,
                                              region_bytes, part_off, out_off, stamp, epoch,
                                              timeout_ns, err_addr, cta)
            self._mark(ws, cta, trace.DEFER_DONE, ctid == 0)
        if cutlass.const_expr(self.copies_early):
            # the results of this CTA's pushes not copied back during the rounds
            for src in range(rounds):
                if not (self._copying_early(lag) & (src + Int32(2) < rounds)):
                    self._copy_back(ctid, cta, src, chunk, lag, num_tiles, tiles_m, tiles_n,
                                    local_M, rank, epoch, M, N, ws, out_addr, result_off,
                                    out_off, timeout_ns, err_addr)
            self._mark(ws, cta, trace.COPY_DONE, ctid == 0)
        elif cutlass.const_expr(self.mode == "ar" and not self.push_all):
            self._ar_copy_out(ctid, cta, num_ctas, num_tiles, tiles_n, rank, epoch, M, N, ws,
                              out_addr, result_off, out_off, timeout_ns, err_addr)
            self._mark(ws, cta, trace.COPY_DONE, ctid == 0)

    # ---- per sub-tile work of the 96 communication threads: each owns chunks
    #      c = ctid + 96 j (16 bytes, row c // 4, column chunk c % 4); loads are all issued
    #      before the first use so each thread keeps several in flight.
    @cute.jit
    def _chunk_geom(self, ctid, j: cutlass.Constexpr, e: cutlass.Constexpr, m0, tn):
        c = ctid + Int32(j * COMM_THREADS)
        row = c // Int32(self.row_chunks)
        cc = c - row * Int32(self.row_chunks)
        pc = cc  # where chunk cc of the row sits in smem and in every partial buffer
        if cutlass.const_expr(self.swizzled and self.epi_n == EPI_N):
            pc = cc ^ ((row >> Int32(1)) & Int32(3))
        elif cutlass.const_expr(self.swizzled):
            pc = cc ^ ((row >> Int32(2)) & Int32(1))
        sub_off = Int64(e * self.sub_bytes) + Int64(row * Int32(self.row_bytes) + pc * Int32(16))
        col = tn * Int32(self.bn) + Int32(e * self.epi_n) + cc * Int32(8)
        smem_off = row * Int32(self.epi_pitch * 2) + pc * Int32(16)
        return c, m0 + row, sub_off, col, smem_off

    @cute.jit
    def _inside_n(self, e: cutlass.Constexpr, tn, N):
        """Whether sub-tile e of tile column tn lies wholly inside N's columns: only a partial
        last tile column (``launch.plan.PARTIAL_NS``) has sub-tiles that do not. Columns past
        N hold the product of w's zero fill; they travel in the workspace with their tile
        and are never stored to the output."""
        return tn * Int32(self.bn) + Int32((e + 1) * self.epi_n) <= N

    @cute.jit
    def _copy_sub(self, ctid, e: cutlass.Constexpr, slot_smem, t, tn, m0, rows_end, ws, part_off,
                  out_addr, N):
        """Plain GEMM: the sub-tile to the output; multicast: to this rank's partial buffer."""
        for j in cutlass.range_constexpr(self.chunk_iters):
            c, grow, sub_off, col, smem_off = self._chunk_geom(ctid, j, e, m0, tn)
            keep = (c < Int32(self.sub_chunks)) & (grow < rows_end)
            if cutlass.const_expr(not self.comm):
                keep = keep & (col < N)
            if keep:
                v0, v1, v2, v3 = ptx.ld_shared_v4(slot_smem + smem_off)
                if cutlass.const_expr(self.comm):
                    ptx.st_v4(ws + part_off + Int64(t) * Int64(self.tile_bytes) + sub_off, v0, v1, v2, v3)
                else:
                    ptx.st_v4(out_addr + (Int64(grow) * Int64(N) + Int64(col)) * Int64(2), v0, v1, v2, v3)

    @cute.jit
    def _push_sub(self, ctid, e: cutlass.Constexpr, slot_smem, t, tm, tn, m0, rows_end, owner, rank,
                  local_M, tiles_n, num_tiles, peer_tab, recv_off, region_bytes, park_addr):
        """Rows a peer owns go to its receive slot; own rows of a shared tile are parked."""
        for j in cutlass.range_constexpr(self.chunk_iters):
            c, grow, sub_off, col, smem_off = self._chunk_geom(ctid, j, e, m0, tn)
            if (c < Int32(self.sub_chunks)) & (grow < rows_end):
                v0, v1, v2, v3 = ptx.ld_shared_v4(slot_smem + smem_off)
                dest = owner
                if cutlass.const_expr(self.mode == "rs"):
                    dest = grow // local_M
                if dest != rank:
                    ptx.st_v4(self._recv_slot_addr(dest, rank, t, tm, tn, tiles_n, local_M,
                                                   num_tiles, peer_tab, recv_off, region_bytes)
                              + sub_off, v0, v1, v2, v3)
                else:
                    ptx.st_v4(park_addr + sub_off, v0, v1, v2, v3)

    @cute.jit
    def _push_sub_bulk(self, ctid, e: cutlass.Constexpr, slot_smem, t, tm, tn, m0, rows_end, owner,
                       rank, local_M, tiles_n, num_tiles, peer_tab, recv_off, region_bytes,
                       park_addr, stage_addr=None):
        """``_push_sub`` as bulk copies: one per owner's row range of the sub-tile, issued
        by one thread, which also holds the slot until the copies have read it."""
        if ctid == 0:
            rows = cutlass.min(Int32(self.bm), rows_end - m0)
            if cutlass.const_expr(self.mode == "rs"):
                o_first = m0 // local_M
                o_last = (m0 + rows - Int32(1)) // local_M
                for o in range(o_first, o_last + Int32(1)):
                    r0 = cutlass.max(o * local_M - m0, Int32(0))
                    r1 = cutlass.min((o + Int32(1)) * local_M - m0, rows)
                    self._bulk_rows(e, o, r0, r1, slot_smem, t, tm, tn, rank, local_M, tiles_n,
                                    num_tiles, peer_tab, recv_off, region_bytes, park_addr,
                                    stage_addr)
            elif cutlass.const_expr(self.push_all):
                for o in cutlass.range_constexpr(self.world):  # every peer, and parked
                    self._bulk_rows(e, Int32(o), Int32(0), rows, slot_smem, t, tm, tn, rank,
                                    local_M, tiles_n, num_tiles, peer_tab, recv_off,
                                    region_bytes, park_addr)
            else:
                self._bulk_rows(e, owner, Int32(0), rows, slot_smem, t, tm, tn, rank, local_M,
                                tiles_n, num_tiles, peer_tab, recv_off, region_bytes, park_addr)
            ptx.bulk_commit()
            if cutlass.const_expr(self.push_window > 0):
                ptx.bulk_wait_pending(self.window_groups - 1)
            if cutlass.const_expr(not self.defer_release and self.window_groups != 1):
                # the slot is released next: its copies must have read it (a window of one
                # has waited for them to complete)
                ptx.bulk_wait_read_all()

    @cute.jit
    def _bulk_rows(self, e: cutlass.Constexpr, dest, r0, r1, slot_smem, t, tm, tn, rank, local_M,
                   tiles_n, num_tiles, peer_tab, recv_off, region_bytes, park_addr,
                   stage_addr=None):
        """Rows [r0, r1) of sub-tile e to dest's receive slot (with push CTAs: staged at
        ``stage_addr`` for them), or parked when dest is this rank."""
        if r1 > r0:
            sub_off = Int64(e * self.sub_bytes) + Int64(r0 * Int32(self.row_bytes))
            dst = park_addr + sub_off
            if dest != rank:
                if cutlass.const_expr(self.push_ctas):
                    dst = stage_addr + sub_off
                else:
                    dst = self._recv_slot_addr(dest, rank, t, tm, tn, tiles_n, local_M,
                                               num_tiles, peer_tab, recv_off,
                                               region_bytes) + sub_off
            ptx.bulk_s2g(dst, slot_smem + r0 * Int32(self.row_bytes), (r1 - r0) * Int32(self.row_bytes))

    @cute.jit
    def _recv_slot_addr(self, dest, rank, t, tm, tn, tiles_n, local_M, num_tiles, peer_tab,
                        recv_off, region_bytes):
        """Address, in dest's workspace, of the receive slot that holds this rank's partial
        of tile t."""
        slot = self._slot(dest, t, tm, tn, tiles_n, local_M, num_tiles)
        src_idx = (rank - dest - Int32(1) + Int32(self.world)) % Int32(self.world)
        return (protocol.peer_base(peer_tab, dest) + recv_off + Int64(src_idx) * region_bytes
                + Int64(slot) * Int64(self.tile_bytes))

    def _use_dtype(self, dtype: str, in_dtype: str = "") -> None:
        """The kernel's element types: ``elem`` (``DTYPES``) for the output and the partials,
        ``f16`` for the pack / unpack below; ``ab_elem`` for x and w (``in_dtype`` of
        ``IN_DTYPES``, or "": ``elem``), ``bk`` their k-block, ``scaled`` whether the
        epilogue applies scales (fp8 operands)."""
        self.elem = element_type(dtype)
        self.f16 = dtype == "f16"
        if in_dtype and in_dtype not in IN_DTYPES:
            raise ValueError(f"in_dtype must be one of {tuple(IN_DTYPES)} or '', got "
                             f"{in_dtype!r}")
        self.ab_elem = IN_DTYPES[in_dtype] if in_dtype else self.elem
        self.scaled = bool(in_dtype)
        self.bk = BK_BYTES * 8 // self.ab_elem.width

    @cute.jit
    def _wait_arrivals(self, t, ws, arrive_off, stamp, timeout_ns, err_addr, rank, epoch,
                       include_self: cutlass.Constexpr):
        for s in cutlass.range_constexpr(self.world):
            if include_self or Int32(s) != rank:
                protocol.wait_stamp(ws + self._arrive_word(arrive_off, t, Int32(s)), stamp,
                                    timeout_ns, err_addr, ws, rank, t, Int32(s), epoch,
                                    Int32(protocol.KIND_ARRIVE))
