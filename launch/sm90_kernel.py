"""Hopper (sm90a) fused GEMM + reduce-scatter / all-reduce, one persistent kernel.

Warp roles (384 threads, one CTA per SM, persistent over tiles):
- warp 0: TMA loads of x and w tiles into a multi-stage smem ring (mbarrier pipeline);
- warps 1-3 (96 threads): communication - they drain finished output sub-tiles from a
  second smem ring and move them (to peers, to the workspace, to the output), wait for
  peers' stamps and reduce, so the exchange of tile i overlaps the mainloop of tile i+1;
- warp groups 1-2: wgmma on 128 x BN tiles (64 rows each), then stmatrix of the fp32
  accumulators as bf16 into the sub-tile ring (128 x 32 per slot).

Per tile on rank r (ownership and order: ``launch.plan``), the communication warps:
- rows a peer owns: push the bf16 partial into that owner's receive slot (unicast), or
  write it to this rank's own partial buffer (multicast); after the tile, one thread fences
  at system scope and stamps the owner's arrival word [tile][r] with epoch+1;
- a tile only r owns: wait for every peer's stamp first, then per sub-tile add the peers'
  partials (local receive slots, or one ``multimem.ld_reduce``) to the own partial in
  fp32 and store bf16 to the output; AR also sends the reduced tile to every peer
  (unicast stores, or ``multimem.st``) and stamps their result words;
- a tile r shares with other owners (RS, local_M not a multiple of 128): own rows are
  parked in the workspace and reduced after the CTA's last tile, so no CTA waits while it
  still owes a peer data (that is what keeps the protocol deadlock-free);
- AR, after the last tile: copy the tiles other ranks reduced into the caller's output as
  their result stamps arrive.
The last CTA to exit advances the epoch (device memory) and stamps ``done`` on every peer;
a rank writes into a peer's workspace only after that peer's ``done`` shows it finished
the previous launch. Mode ``gemm`` compiles the communication out (plain GEMM).
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
import cutlass.tensor_utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from . import layout, protocol, ptx
from .plan import BK, BM, EPI_N

Int32 = cutlass.Int32
Int64 = cutlass.Int64
Float32 = cutlass.Float32
BF16 = cutlass.BFloat16

_SUB_BYTES = BM * EPI_N * 2        # one 128 x 32 bf16 sub-tile, contiguous in workspace slots
_SUB_CHUNKS = _SUB_BYTES // 16     # 16-byte pieces per sub-tile
_EPI_PITCH = EPI_N + 8             # padded smem row (80 B): stmatrix and 16-B reads conflict-free
_COMM_THREADS = 96
_CHUNK_ITERS = -(-_SUB_CHUNKS // _COMM_THREADS)
_ROW_LAYOUT = cutlass.tensor_utils.LayoutEnum.ROW_MAJOR

# tile classes
_FOREIGN, _OWN, _MIXED = 0, 1, 2


class Sm90FusedKernel:
    """One compiled variant: (BN, world, mode, transport). Everything else is a launch argument."""

    def __init__(self, bn: int, world: int, mode: str, transport: str) -> None:
        if bn not in (128, 256):
            raise ValueError(f"BN must be 128 or 256, got {bn}")
        if mode not in ("rs", "ar", "gemm"):
            raise ValueError(f"mode must be rs, ar or gemm, got {mode!r}")
        if transport not in ("unicast", "multicast"):
            raise ValueError(f"transport must be unicast or multicast, got {transport!r}")
        self.bn, self.world, self.mode, self.transport = bn, world, mode, transport
        self.multicast = transport == "multicast"
        self.comm = mode != "gemm"
        self.num_mma_wg = 2
        self.threads = 384
        self.num_mma_threads = 256
        self.producer_regs = 104  # 128 x 104 + 256 x 200 = 384 x 168: what the CTA holds at launch
        self.mma_regs = 200
        self.num_sub = bn // EPI_N
        self.epi_slots = 2 if bn == 256 else 4  # leaves smem for 4 (BN=256) or 5 mainloop stages
        self.tile_bytes = BM * bn * 2
        smem = cutlass.memory.get_smem_capacity_in_bytes("sm_90")
        ab_bytes = (BM * BK + bn * BK) * 2
        epi_bytes = BM * _EPI_PITCH * 2 * self.epi_slots
        self.ab_stage = min(8, (smem - 4096 - epi_bytes) // ab_bytes)
        self.comm_bar = pipeline.NamedBarrier(barrier_id=2, num_threads=_COMM_THREADS)

    # ------------------------------------------------------------------ host side
    def _layouts(self) -> None:
        row = _ROW_LAYOUT
        self.tiled_mma = sm90_utils.make_trivial_tiled_mma(
            BF16, BF16, row.sm90_mma_major_mode(), row.sm90_mma_major_mode(), Float32,
            (2, 1, 1), tiler_mn=(64, self.bn))
        atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(row, BF16, BK), BF16)
        self.a_smem_staged = cute.tile_to_shape(atom, (BM, BK, self.ab_stage), order=(0, 1, 2))
        self.b_smem_staged = cute.tile_to_shape(atom, (self.bn, BK, self.ab_stage), order=(0, 1, 2))

    @cute.jit
    def __call__(
        self,
        x_addr: Int64, w_addr: Int64, out_addr: Int64,
        M: Int32, N: Int32, K: Int32,
        ws: Int64, peer_tab: Int64, mc_base: Int64, err_addr: Int64,
        rank: Int32, local_M: Int32, padded_M: Int32, chunk: Int32, rounds: Int32, lag: Int32,
        grid: Int32, timeout_ns: Int64,
        arrive_off: Int64, result_off: Int64, recv_off: Int64, region_bytes: Int64,
        part_off: Int64, out_off: Int64,
        stream: cuda.CUstream,
    ):
        self._layouts()
        K = cute.assume(K, divby=BK)
        N = cute.assume(N, divby=128)
        a_ptr = cute.make_ptr(BF16, x_addr, cute.AddressSpace.gmem, assumed_align=16)
        b_ptr = cute.make_ptr(BF16, w_addr, cute.AddressSpace.gmem, assumed_align=16)
        mA = cute.make_tensor(a_ptr, cute.make_layout((M, K), stride=(K, 1)))
        mB = cute.make_tensor(b_ptr, cute.make_layout((N, K), stride=(K, 1)))
        op = cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
        tma_a, tma_tA = cute.nvgpu.cpasync.make_tiled_tma_atom(
            op, mA, cute.slice_(self.a_smem_staged, (None, None, 0)), (BM, BK))
        tma_b, tma_tB = cute.nvgpu.cpasync.make_tiled_tma_atom(
            op, mB, cute.slice_(self.b_smem_staged, (None, None, 0)), (self.bn, BK))

        @cute.struct
        class SharedStorage:
            ab_mbar: cute.struct.MemRange[Int64, self.ab_stage * 2]
            epi_mbar: cute.struct.MemRange[Int64, self.epi_slots * 2]
            sA: cute.struct.Align[
                cute.struct.MemRange[BF16, cute.cosize(self.a_smem_staged)], 1024]
            sB: cute.struct.Align[
                cute.struct.MemRange[BF16, cute.cosize(self.b_smem_staged)], 1024]
            sC: cute.struct.Align[
                cute.struct.MemRange[BF16, BM * _EPI_PITCH * self.epi_slots], 128]

        self.shared_storage = SharedStorage
        self.kernel(
            tma_a, tma_tA, tma_b, tma_tB, self.tiled_mma, self.a_smem_staged, self.b_smem_staged,
            out_addr, M, N, K, ws, peer_tab, mc_base, err_addr, rank, local_M, padded_M,
            chunk, rounds, lag, timeout_ns, arrive_off, result_off, recv_off, region_bytes,
            part_off, out_off,
        ).launch(grid=[grid, 1, 1], block=[self.threads, 1, 1], cluster=(1, 1, 1),
                 min_blocks_per_mp=1, stream=stream)

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(
        self,
        tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
        tiled_mma: cute.TiledMma,
        a_smem_staged: cute.ComposedLayout, b_smem_staged: cute.ComposedLayout,
        out_addr: Int64, M: Int32, N: Int32, K: Int32,
        ws: Int64, peer_tab: Int64, mc_base: Int64, err_addr: Int64,
        rank: Int32, local_M: Int32, padded_M: Int32, chunk: Int32, rounds: Int32, lag: Int32,
        timeout_ns: Int64, arrive_off: Int64, result_off: Int64, recv_off: Int64, region_bytes: Int64,
        part_off: Int64, out_off: Int64,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        cta, _, _ = cute.arch.block_idx()
        num_ctas, _, _ = cute.arch.grid_dim()
        if warp_idx == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_b)

        tiles_m = (M + Int32(BM - 1)) // Int32(BM)
        tiles_n = N // Int32(self.bn)
        num_tiles = tiles_m * tiles_n

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        a_stage = cute.slice_(a_smem_staged, (None, None, 0))
        b_stage = cute.slice_(b_smem_staged, (None, None, 0))
        ab_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.ab_mbar.data_ptr(),
            num_stages=self.ab_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_wg * 4),
            tx_count=cute.size_in_bytes(BF16, a_stage) + cute.size_in_bytes(BF16, b_stage),
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
            defer_sync=True,
        )
        epi_pipe = pipeline.PipelineAsync.create(
            barrier_storage=storage.epi_mbar.data_ptr(),
            num_stages=self.epi_slots,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_threads),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, _COMM_THREADS),
            defer_sync=True,
        )
        pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)

        sA = storage.sA.get_tensor(a_smem_staged.outer, swizzle=a_smem_staged.inner)
        sB = storage.sB.get_tensor(b_smem_staged.outer, swizzle=b_smem_staged.inner)
        sC_ptr = storage.sC.data_ptr()
        sC = cute.make_tensor(sC_ptr, cute.make_layout(
            (BM, EPI_N, self.epi_slots), stride=(_EPI_PITCH, 1, BM * _EPI_PITCH)))

        gA = cute.local_tile(mA, (BM, BK), (None, None))
        gB = cute.local_tile(mB, (self.bn, BK), (None, None))
        tAsA, tAgA = cute.nvgpu.cpasync.tma_partition(
            tma_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
        tBsB, tBgB = cute.nvgpu.cpasync.tma_partition(
            tma_b, 0, cute.make_layout(1), cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
        k_tiles = cute.size(gA, mode=[3])

        wg_idx = cute.arch.make_warp_uniform(tidx // 128)
        pipeline_init_wait(cluster_shape_mn=(1, 1))

        if wg_idx == 0:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.ab_stage)
                for rnd in range(rounds):
                    t = self._scheduled(rank, cta, rnd, chunk, lag, num_tiles, tiles_m, tiles_n,
                                        local_M)
                    if t >= Int32(0):
                        tm = t // tiles_n
                        tn = t - tm * tiles_n
                        tAgA_t = tAgA[(None, tm, None)]
                        tBgB_t = tBgB[(None, tn, None)]
                        prod.reset_count()
                        for _k in range(k_tiles):
                            ab_pipe.producer_acquire(prod)
                            cute.copy(tma_a, tAgA_t[(None, prod.count)], tAsA[(None, prod.index)],
                                      tma_bar_ptr=ab_pipe.producer_get_barrier(prod))
                            cute.copy(tma_b, tBgB_t[(None, prod.count)], tBsB[(None, prod.index)],
                                      tma_bar_ptr=ab_pipe.producer_get_barrier(prod))
                            ab_pipe.producer_commit(prod)
                            prod.advance()
                ab_pipe.producer_tail(prod)
            else:
                self._comm_role(tidx - 32, cta, num_ctas, num_tiles, tiles_m, tiles_n, epi_pipe,
                                sC_ptr, out_addr, M, N, ws, peer_tab, mc_base, err_addr, rank,
                                local_M, padded_M, chunk, rounds, lag, timeout_ns, arrive_off,
                                result_off, recv_off, region_bytes, part_off, out_off)
        else:
            cute.arch.setmaxregister_increase(self.mma_regs)
            self._mma_role(tidx - 128, cta, num_tiles, tiles_m, tiles_n, k_tiles, rank, local_M,
                           chunk, rounds, lag, tiled_mma, sA, sB, sC, ab_pipe, epi_pipe)

        if cutlass.const_expr(self.comm):
            cute.arch.barrier()
            if tidx == 0:
                epoch = ptx.ld_relaxed_gpu(ws + Int64(layout.CTRL_EPOCH))
                protocol.finish_launch(ws, peer_tab, epoch, num_ctas, self.world, rank, True)

    # ------------------------------------------------------------------ MMA warp groups
    @cute.jit
    def _mma_role(self, mtid, cta, num_tiles, tiles_m, tiles_n, k_tiles, rank, local_M, chunk,
                  rounds, lag, tiled_mma: cute.TiledMma, sA, sB, sC, ab_pipe, epi_pipe):
        thr_mma = tiled_mma.get_slice(mtid)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        acc = cute.make_rmem_tensor(
            thr_mma.partition_C(cute.make_identity_tensor((BM, self.bn))).shape, Float32)
        num_k_blocks = cute.size(tCrA, mode=[2])

        r2s_atom = sm90_utils.sm90_get_smem_store_op(_ROW_LAYOUT, elem_ty_d=BF16, elem_ty_acc=Float32)
        stm_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), BF16)
        tiled_r2s = cute.make_tiled_copy_S(r2s_atom, cute.make_tiled_copy_C_atom(stm_atom, tiled_mma))
        thr_r2s = tiled_r2s.get_slice(mtid)
        tRS_sC = thr_r2s.partition_D(sC)
        tRS_rAcc = tiled_r2s.retile(acc)
        rD_shape = cute.shape(thr_r2s.partition_S(sC))
        tRS_rD = cute.make_rmem_tensor(rD_shape[:3], Float32)
        tRS_rD_out = cute.make_rmem_tensor(rD_shape[:3], BF16)
        size_rD = cute.size(tRS_rD)

        read_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stage)
        rel_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stage)
        epi_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.epi_slots)
        for rnd in range(rounds):
            t = self._scheduled(rank, cta, rnd, chunk, lag, num_tiles, tiles_m, tiles_n, local_M)
            if t >= Int32(0):
                read_state.reset_count()
                rel_state.reset_count()
                acc.fill(0.0)
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                cute.nvgpu.warpgroup.fence()
                ab_pipe.consumer_wait(read_state)
                for kb in cutlass.range_constexpr(num_k_blocks):
                    cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, read_state.index)],
                              tCrB[(None, None, kb, read_state.index)], acc)
                cute.nvgpu.warpgroup.commit_group()
                read_state.advance()
                for _k in range(1, k_tiles):
                    ab_pipe.consumer_wait(read_state)
                    for kb in cutlass.range_constexpr(num_k_blocks):
                        cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, read_state.index)],
                                  tCrB[(None, None, kb, read_state.index)], acc)
                    cute.nvgpu.warpgroup.commit_group()
                    cute.nvgpu.warpgroup.wait_group(1)
                    ab_pipe.consumer_release(rel_state)
                    rel_state.advance()
                    read_state.advance()
                cute.nvgpu.warpgroup.wait_group(0)
                ab_pipe.consumer_release(rel_state)
                rel_state.advance()

                for e in cutlass.range_constexpr(self.num_sub):
                    for v in cutlass.range_constexpr(size_rD):
                        tRS_rD[v] = tRS_rAcc[e * size_rD + v]
                    tRS_rD_out.store(tRS_rD.load().to(BF16))
                    epi_pipe.producer_acquire(epi_state)
                    cute.copy(tiled_r2s, tRS_rD_out, tRS_sC[(None, None, None, epi_state.index)])
                    epi_pipe.producer_commit(epi_state)
                    epi_state.advance()

    # ------------------------------------------------------------------ schedule (mirrors launch.plan)
    @cute.jit
    def _list_start(self, o, num_tiles, tiles_m, tiles_n, local_M):
        s = Int32(0)
        if cutlass.const_expr(self.mode == "ar"):
            s = (o * num_tiles + Int32(self.world - 1)) // Int32(self.world)
        if cutlass.const_expr(self.mode == "rs"):
            s = cutlass.min((o * local_M + Int32(BM - 1)) // Int32(BM), tiles_m) * tiles_n
        return s

    @cute.jit
    def _scheduled(self, rank, cta, rnd, chunk, lag, num_tiles, tiles_m, tiles_n, local_M):
        """The tile this CTA computes in round ``rnd``, or -1 (see ``TilePlan.scheduled``)."""
        t = Int32(-1)
        if cutlass.const_expr(self.mode == "gemm"):
            t = rnd * chunk + cta
            if t >= num_tiles:
                t = Int32(-1)
        else:
            part = cta // chunk
            j = cta - part * chunk
            o = rank
            k = rnd - lag
            if part < Int32(self.world - 1):
                o = (rank + Int32(1) + part) % Int32(self.world)
                k = rnd
            start = self._list_start(o, num_tiles, tiles_m, tiles_n, local_M)
            end = self._list_start(o + Int32(1), num_tiles, tiles_m, tiles_n, local_M)
            if o + Int32(1) == Int32(self.world):
                end = num_tiles
            idx = k * chunk + j
            if (k >= Int32(0)) & (idx < end - start):
                t = start + idx
        return t

    # ------------------------------------------------------------------ communication warps
    @cute.jit
    def _tile_class(self, t, tm, rank, local_M, padded_M, num_tiles):
        """(class, first owner, last owner) of tile t, as ``launch.plan`` defines them."""
        cls = Int32(_OWN)
        o_lo = rank
        o_hi = rank
        if cutlass.const_expr(self.mode == "rs"):
            m0 = tm * Int32(BM)
            o_lo = m0 // local_M
            o_hi = (cutlass.min(m0 + Int32(BM), padded_M) - Int32(1)) // local_M
            if (o_lo != rank) | (o_hi != rank):
                cls = Int32(_FOREIGN)
                if (o_lo <= rank) & (rank <= o_hi):
                    cls = Int32(_MIXED)
        if cutlass.const_expr(self.mode == "ar"):
            o_lo = t * Int32(self.world) // num_tiles
            o_hi = o_lo
            if o_lo != rank:
                cls = Int32(_FOREIGN)
        return cls, o_lo, o_hi

    @cute.jit
    def _slot(self, owner, t, tm, tn, tiles_n, local_M, num_tiles):
        s = Int32(0)
        if cutlass.const_expr(self.mode == "rs"):
            s = (tm - (owner * local_M) // Int32(BM)) * tiles_n + tn
        else:
            s = t - (owner * num_tiles + Int32(self.world - 1)) // Int32(self.world)
        return s

    @cute.jit
    def _comm_role(self, ctid, cta, num_ctas, num_tiles, tiles_m, tiles_n, epi_pipe, sC_ptr,
                   out_addr, M, N, ws, peer_tab, mc_base, err_addr, rank, local_M, padded_M,
                   chunk, rounds, lag, timeout_ns, arrive_off, result_off, recv_off, region_bytes,
                   part_off, out_off):
        epoch = Int32(0)
        if cutlass.const_expr(self.comm):
            epoch = ptx.ld_relaxed_gpu(ws + Int64(layout.CTRL_EPOCH))
            if ctid == 0:
                protocol.wait_peers_done(ws, epoch, self.world, rank, timeout_ns, err_addr)
            self.comm_bar.arrive_and_wait()
        stamp = epoch + Int32(1)
        smem_base = sC_ptr.toint()
        rows_end = M
        if cutlass.const_expr(self.mode == "rs"):
            rows_end = padded_M
        self_region = Int64(self.world - 1) * region_bytes
        epi_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.epi_slots)

        for rnd in range(rounds):
            t = self._scheduled(rank, cta, rnd, chunk, lag, num_tiles, tiles_m, tiles_n, local_M)
            if t >= Int32(0):
                tm = t // tiles_n
                tn = t - tm * tiles_n
                m0 = tm * Int32(BM)
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
                own_slot_addr = ws + recv_off + Int64(own_slot) * Int64(self.tile_bytes)

                for e in cutlass.range_constexpr(self.num_sub):
                    epi_pipe.consumer_wait(epi_state)
                    slot_smem = smem_base + epi_state.index * Int32(BM * _EPI_PITCH * 2)
                    if cutlass.const_expr(self.comm and not self.multicast):
                        if direct:
                            self._reduce_sub(ctid, e, slot_smem, own_slot_addr, region_bytes, m0, tn,
                                             rows_end, t, out_addr, N, rank, local_M, peer_tab,
                                             out_off, True)
                        else:
                            self._push_sub(ctid, e, slot_smem, t, tm, tn, m0, rows_end, o_lo, rank,
                                           local_M, tiles_n, num_tiles, peer_tab, recv_off,
                                           region_bytes, own_slot_addr + self_region)
                    else:
                        self._copy_sub(ctid, e, slot_smem, t, tn, m0, rows_end, ws, part_off,
                                       out_addr, N)
                    epi_pipe.consumer_release(epi_state)
                    epi_state.advance()

                if cutlass.const_expr(self.comm):
                    self.comm_bar.arrive_and_wait()
                    if ctid == 0:
                        ptx.fence_sys()
                        for o in range(o_lo, o_hi + Int32(1)):
                            if cutlass.const_expr(self.multicast):
                                ptx.st_release_sys(protocol.peer_base(peer_tab, o) + arrive_off
                                                   + Int64(t * Int32(self.world) + rank) * Int64(4), stamp)
                            else:
                                if o != rank:
                                    ptx.st_release_sys(protocol.peer_base(peer_tab, o) + arrive_off
                                                       + Int64(t * Int32(self.world) + rank) * Int64(4), stamp)
                        if cutlass.const_expr(self.mode == "ar" and not self.multicast):
                            if direct:
                                self._stamp_results(t, peer_tab, result_off, stamp, rank)
                    if cutlass.const_expr(self.multicast):
                        if cls == Int32(_OWN):
                            self._deferred_reduce(ctid, t, tm, tn, m0, tiles_n, num_tiles, ws, peer_tab,
                                                  mc_base, out_addr, M, N, rank, local_M, padded_M,
                                                  arrive_off, result_off, recv_off, region_bytes,
                                                  part_off, out_off, stamp, epoch, timeout_ns, err_addr)

        if cutlass.const_expr(self.mode == "rs"):
            # tiles shared with other owners: every push of this CTA is out, now sum own rows
            for rnd in range(rounds):
                t = self._scheduled(rank, cta, rnd, chunk, lag, num_tiles, tiles_m, tiles_n, local_M)
                if t >= Int32(0):
                    tm = t // tiles_n
                    tn = t - tm * tiles_n
                    cls, o_lo, o_hi = self._tile_class(t, tm, rank, local_M, padded_M, num_tiles)
                    if cls == Int32(_MIXED):
                        self._deferred_reduce(ctid, t, tm, tn, tm * Int32(BM), tiles_n, num_tiles, ws,
                                              peer_tab, mc_base, out_addr, M, N, rank, local_M,
                                              padded_M, arrive_off, result_off, recv_off,
                                              region_bytes, part_off, out_off, stamp, epoch,
                                              timeout_ns, err_addr)
        if cutlass.const_expr(self.mode == "ar"):
            self._ar_copy_out(ctid, cta, num_ctas, num_tiles, tiles_n, rank, epoch, M, N, ws,
                              out_addr, result_off, out_off, timeout_ns, err_addr)

    # ---- per sub-tile work of the 96 communication threads: each owns chunks
    #      c = ctid + 96 j (16 bytes, row c // 4, column chunk c % 4); loads are all issued
    #      before the first use so each thread keeps several in flight.
    @cute.jit
    def _chunk_geom(self, ctid, j: cutlass.Constexpr, e: cutlass.Constexpr, m0, tn):
        c = ctid + Int32(j * _COMM_THREADS)
        row = c // Int32(4)
        cc = c - row * Int32(4)
        sub_off = Int64(e * _SUB_BYTES) + Int64(c) * Int64(16)
        col = tn * Int32(self.bn) + Int32(e * EPI_N) + cc * Int32(8)
        smem_off = row * Int32(_EPI_PITCH * 2) + cc * Int32(16)
        return c, m0 + row, sub_off, col, smem_off

    @cute.jit
    def _copy_sub(self, ctid, e: cutlass.Constexpr, slot_smem, t, tn, m0, rows_end, ws, part_off,
                  out_addr, N):
        """Plain GEMM: the sub-tile to the output; multicast: to this rank's partial buffer."""
        for j in cutlass.range_constexpr(_CHUNK_ITERS):
            c, grow, sub_off, col, smem_off = self._chunk_geom(ctid, j, e, m0, tn)
            if (c < Int32(_SUB_CHUNKS)) & (grow < rows_end):
                v0, v1, v2, v3 = ptx.ld_shared_v4(slot_smem + smem_off)
                if cutlass.const_expr(self.comm):
                    ptx.st_v4(ws + part_off + Int64(t) * Int64(self.tile_bytes) + sub_off, v0, v1, v2, v3)
                else:
                    ptx.st_v4(out_addr + (Int64(grow) * Int64(N) + Int64(col)) * Int64(2), v0, v1, v2, v3)

    @cute.jit
    def _push_sub(self, ctid, e: cutlass.Constexpr, slot_smem, t, tm, tn, m0, rows_end, owner, rank,
                  local_M, tiles_n, num_tiles, peer_tab, recv_off, region_bytes, park_addr):
        """Rows a peer owns go to its receive slot; own rows of a shared tile are parked."""
        for j in cutlass.range_constexpr(_CHUNK_ITERS):
            c, grow, sub_off, col, smem_off = self._chunk_geom(ctid, j, e, m0, tn)
            if (c < Int32(_SUB_CHUNKS)) & (grow < rows_end):
                v0, v1, v2, v3 = ptx.ld_shared_v4(slot_smem + smem_off)
                dest = owner
                if cutlass.const_expr(self.mode == "rs"):
                    dest = grow // local_M
                if dest != rank:
                    slot = self._slot(dest, t, tm, tn, tiles_n, local_M, num_tiles)
                    src_idx = (rank - dest - Int32(1) + Int32(self.world)) % Int32(self.world)
                    ptx.st_v4(protocol.peer_base(peer_tab, dest) + recv_off
                              + Int64(src_idx) * region_bytes
                              + Int64(slot) * Int64(self.tile_bytes) + sub_off, v0, v1, v2, v3)
                else:
                    ptx.st_v4(park_addr + sub_off, v0, v1, v2, v3)

    @cute.jit
    def _reduce_sub(self, ctid, e: cutlass.Constexpr, own_smem, own_slot_addr, region_bytes, m0, tn,
                    rows_end, t, out_addr, N, rank, local_M, peer_tab, out_off,
                    from_smem: cutlass.Constexpr):
        """Own partial (smem sub-tile, or the parked copy at own_slot_addr + (world-1) regions)
        plus every peer's partial (receive regions 0..world-2 at own_slot_addr), to the output."""
        batch = max(1, 8 // max(1, self.world - 1))
        for j0 in cutlass.range_constexpr(0, _CHUNK_ITERS, batch):
            own = []
            peers = []
            geo = []
            for j in cutlass.range_constexpr(j0, min(j0 + batch, _CHUNK_ITERS)):
                c, grow, sub_off, col, smem_off = self._chunk_geom(ctid, j, e, m0, tn)
                live = c < Int32(_SUB_CHUNKS)
                if cutlass.const_expr(j * _COMM_THREADS + _COMM_THREADS <= _SUB_CHUNKS):
                    live = True
                geo.append((live, grow, sub_off, col))
                src = own_slot_addr + sub_off
                if cutlass.const_expr(from_smem):
                    own.append(self._ld_if(live, own_smem + smem_off, True))
                else:
                    own.append(self._ld_if(live, src + Int64(self.world - 1) * region_bytes, False))
                for s in cutlass.range_constexpr(self.world - 1):
                    peers.append(self._ld_if(live, src + Int64(s) * region_bytes, False))
            for jj in cutlass.range_constexpr(len(geo)):
                live, grow, sub_off, col = geo[jj]
                mine = grow < rows_end
                if cutlass.const_expr(self.mode == "rs"):
                    mine = mine & (grow // local_M == rank)
                if live & mine:
                    r = self._sum(own[jj], peers[jj * (self.world - 1):(jj + 1) * (self.world - 1)])
                    self._store_result(r[0], r[1], r[2], r[3], grow, col, t, sub_off, out_addr, N,
                                       rank, local_M, peer_tab, out_off, Int64(0))

    @cute.jit
    def _ld_if(self, pred, addr, shared: cutlass.Constexpr):
        """16-byte load, skipped (zeros) where pred is false: the last chunk round of a
        sub-tile is only partly populated, and reading past it would leave the buffer."""
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

    @cute.jit
    def _sum(self, own, peers):
        a = []
        for w in cutlass.range_constexpr(4):
            lo, hi = ptx.bf16x2_to_f32(own[w])
            a.append(lo)
            a.append(hi)
        for p in peers:
            for w in cutlass.range_constexpr(4):
                lo, hi = ptx.bf16x2_to_f32(p[w])
                a[2 * w] = a[2 * w] + lo
                a[2 * w + 1] = a[2 * w + 1] + hi
        return (ptx.f32_to_bf16x2(a[0], a[1]), ptx.f32_to_bf16x2(a[2], a[3]),
                ptx.f32_to_bf16x2(a[4], a[5]), ptx.f32_to_bf16x2(a[6], a[7]))

    @cute.jit
    def _wait_arrivals(self, t, ws, arrive_off, stamp, timeout_ns, err_addr, rank, epoch,
                       include_self: cutlass.Constexpr):
        for s in cutlass.range_constexpr(self.world):
            if include_self or Int32(s) != rank:
                protocol.wait_stamp(ws + arrive_off + Int64(t * Int32(self.world) + Int32(s)) * Int64(4),
                                    stamp, timeout_ns, err_addr, ws, rank, t, Int32(s), epoch,
                                    Int32(protocol.KIND_ARRIVE))

    @cute.jit
    def _stamp_results(self, t, peer_tab, result_off, stamp, rank):
        for p in cutlass.range_constexpr(self.world):
            if Int32(p) != rank:
                ptx.st_release_sys(protocol.peer_base(peer_tab, Int32(p)) + result_off
                                   + Int64(t) * Int64(4), stamp)

    @cute.jit
    def _store_result(self, r0, r1, r2, r3, grow, col, t, sub_off, out_addr, N, rank, local_M,
                      peer_tab, out_off, mc_base):
        out_row = grow
        if cutlass.const_expr(self.mode == "rs"):
            out_row = grow - rank * local_M
        ptx.st_v4(out_addr + (Int64(out_row) * Int64(N) + Int64(col)) * Int64(2), r0, r1, r2, r3)
        if cutlass.const_expr(self.mode == "ar"):
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
                         region_bytes, part_off, out_off, stamp, epoch, timeout_ns, err_addr):
        """Own rows of tile t from the workspace: parked own partial (unicast) or every rank's
        partial through the multicast mapping."""
        if ctid == 0:
            self._wait_arrivals(t, ws, arrive_off, stamp, timeout_ns, err_addr, rank, epoch,
                                self.multicast)
        self.comm_bar.arrive_and_wait()
        own_slot = self._slot(rank, t, tm, tn, tiles_n, local_M, num_tiles)
        rows_end = M
        if cutlass.const_expr(self.mode == "rs"):
            rows_end = padded_M
        for e in cutlass.range_constexpr(self.num_sub):
            if cutlass.const_expr(self.multicast):
                for j in cutlass.range_constexpr(_CHUNK_ITERS):
                    c, grow, sub_off, col, smem_off = self._chunk_geom(ctid, j, e, m0, tn)
                    mine = (c < Int32(_SUB_CHUNKS)) & (grow < rows_end)
                    if cutlass.const_expr(self.mode == "rs"):
                        mine = mine & (grow // local_M == rank)
                    if mine:
                        r0, r1, r2, r3 = ptx.multimem_ld_reduce_bf16x8(
                            mc_base + part_off + Int64(t) * Int64(self.tile_bytes) + sub_off)
                        self._store_result(r0, r1, r2, r3, grow, col, t, sub_off, out_addr, N,
                                           rank, local_M, peer_tab, out_off, mc_base)
            else:
                self._reduce_sub(ctid, e, Int32(0), ws + recv_off + Int64(own_slot) * Int64(self.tile_bytes),
                                 region_bytes, m0, tn, rows_end, t, out_addr, N, rank, local_M,
                                 peer_tab, out_off, False)
        self.comm_bar.arrive_and_wait()
        if cutlass.const_expr(self.mode == "ar"):
            if ctid == 0:
                ptx.fence_sys()
                self._stamp_results(t, peer_tab, result_off, stamp, rank)

    @cute.jit
    def _ar_copy_out(self, ctid, cta, num_ctas, num_tiles, tiles_n, rank, epoch, M, N, ws,
                     out_addr, result_off, out_off, timeout_ns, err_addr):
        """Tiles other ranks own arrive reduced in OUT; copy them to the caller's output."""
        j_tile = cta
        while j_tile < num_tiles:
            owner = j_tile * Int32(self.world) // num_tiles
            if owner != rank:
                if ctid == 0:
                    protocol.wait_stamp(ws + result_off + Int64(j_tile) * Int64(4), epoch + Int32(1),
                                        timeout_ns, err_addr, ws, rank, j_tile, owner, epoch,
                                        Int32(protocol.KIND_RESULT))
                self.comm_bar.arrive_and_wait()
                tm = j_tile // tiles_n
                tn = j_tile - tm * tiles_n
                base = ws + out_off + Int64(j_tile) * Int64(self.tile_bytes)
                for e in cutlass.range_constexpr(self.num_sub):
                    vals = []
                    geo = []
                    for j in cutlass.range_constexpr(_CHUNK_ITERS):
                        c, grow, sub_off, col, smem_off = self._chunk_geom(ctid, j, e, tm * Int32(BM), tn)
                        geo.append((c, grow, col))
                        vals.append(self._ld_if(c < Int32(_SUB_CHUNKS), base + sub_off, False))
                    for j in cutlass.range_constexpr(_CHUNK_ITERS):
                        c, grow, col = geo[j]
                        if (c < Int32(_SUB_CHUNKS)) & (grow < M):
                            v = vals[j]
                            ptx.st_v4(out_addr + (Int64(grow) * Int64(N) + Int64(col)) * Int64(2),
                                      v[0], v[1], v[2], v[3])
            j_tile = j_tile + num_ctas
