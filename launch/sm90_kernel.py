"""Hopper (sm90a) fused GEMM + reduce-scatter / all-reduce, one persistent kernel.

Warp roles (384 threads per CTA, one CTA per SM):
- warp group 0: warp 0 issues the TMA loads of x and w tiles into a multi-stage smem ring;
- warp groups 1-2: wgmma on 128 x BN tiles (each group 64 rows), then the epilogue, which
  is also the communication: the tile is staged through smem in 128 x 32 sub-tiles and
  moved with 16-byte stores.

Per tile, on rank r (see ``launch.plan`` for ownership and order):
1. rows a peer owns: bf16 partials are pushed straight into that owner's receive slot
   (unicast) or written to this rank's own partial buffer (multicast); then one thread
   fences at system scope and stamps the owner's arrival word with epoch+1;
2. rows r owns: wait for every peer's stamp, add the peers' partials (unicast: local
   receive slots; multicast: one ``multimem.ld_reduce``) to this rank's own partial in
   fp32, write bf16 to the output; AR also sends the reduced tile to every peer
   (unicast stores / ``multimem.st``) and stamps their result words;
3. AR only, after the last tile: copy the tiles other ranks reduced from the workspace
   into the caller's output as their result stamps arrive.
The last CTA to exit advances the epoch (kept in device memory) and stamps ``done`` on
every peer; a rank writes into a peer's workspace only after the peer's ``done`` shows it
finished the previous launch. Mode ``gemm`` compiles the communication out (the plain
GEMM, for measuring the mainloop alone).
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.memory
import cutlass.tensor_utils
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from . import layout, protocol, ptx
from .plan import BK, BM, EPI_N

Int32 = cutlass.Int32
Int64 = cutlass.Int64
Float32 = cutlass.Float32
BF16 = cutlass.BFloat16

_SUB_BYTES = BM * EPI_N * 2  # one 128 x 32 bf16 sub-tile, contiguous in workspace slots


class Sm90FusedKernel:
    """One compiled variant: (BN, world, mode, transport). Everything else is a launch argument."""

    def __init__(self, bn: int, world: int, mode: str, transport: str) -> None:
        if bn not in (128, 256):
            raise ValueError(f"BN must be 128 or 256, got {bn}")
        if mode not in ("rs", "ar", "gemm"):
            raise ValueError(f"mode must be rs, ar or gemm, got {mode!r}")
        if transport not in ("unicast", "multicast"):
            raise ValueError(f"transport must be unicast or multicast, got {transport!r}")
        self.bn = bn
        self.world = world
        self.mode = mode
        self.transport = transport
        self.multicast = transport == "multicast"
        self.tile_shape_mnk = (BM, bn, BK)
        self.atom_layout_mnk = (2, 1, 1)
        self.num_mma_wg = 2
        self.threads_per_wg = 128
        self.threads = (1 + self.num_mma_wg) * self.threads_per_wg
        self.num_epi_threads = self.num_mma_wg * self.threads_per_wg
        self.epi_tile = (BM, EPI_N)
        self.epi_stage = 2
        self.load_regs = 40
        self.mma_regs = 232
        self.smem_capacity = cutlass.memory.get_smem_capacity_in_bytes("sm_90")
        self.buffer_align_bytes = 1024
        self.epi_bar = pipeline.NamedBarrier(barrier_id=1, num_threads=self.num_epi_threads)
        ab_bytes = (BM * BK + bn * BK) * 2
        epi_bytes = BM * EPI_N * 2 * self.epi_stage
        self.ab_stage = min(8, (self.smem_capacity - 2048 - epi_bytes) // ab_bytes)
        self.num_sub = bn // EPI_N
        self.tile_bytes = BM * bn * 2

    # ------------------------------------------------------------------ host side
    def _layouts(self):
        row = cutlass.tensor_utils.LayoutEnum.ROW_MAJOR
        self.tiled_mma = sm90_utils.make_trivial_tiled_mma(
            BF16, BF16, row.sm90_mma_major_mode(), row.sm90_mma_major_mode(), Float32,
            self.atom_layout_mnk, tiler_mn=(64, self.bn),
        )
        a_atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(row, BF16, BK), BF16)
        self.a_smem_staged = cute.tile_to_shape(a_atom, (BM, BK, self.ab_stage), order=(0, 1, 2))
        b_atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(row, BF16, BK), BF16)
        self.b_smem_staged = cute.tile_to_shape(b_atom, (self.bn, BK, self.ab_stage),
                                                order=(0, 1, 2))
        c_atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(row, BF16, EPI_N), BF16)
        self.c_smem_staged = cute.tile_to_shape(c_atom, (BM, EPI_N, self.epi_stage),
                                                order=(0, 1, 2))

    @cute.jit
    def __call__(
        self,
        x_addr: Int64, w_addr: Int64, out_addr: Int64,
        M: Int32, N: Int32, K: Int32,
        ws: Int64, peer_tab: Int64, mc_base: Int64, err_addr: Int64,
        rank: Int32, local_M: Int32, padded_M: Int32, rot: Int32, grid: Int32,
        timeout_ns: Int64,
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
            pipe_mbar: cute.struct.MemRange[Int64, self.ab_stage * 2]
            sA: cute.struct.Align[
                cute.struct.MemRange[BF16, cute.cosize(self.a_smem_staged)],
                self.buffer_align_bytes]
            sB: cute.struct.Align[
                cute.struct.MemRange[BF16, cute.cosize(self.b_smem_staged)],
                self.buffer_align_bytes]
            sC: cute.struct.Align[
                cute.struct.MemRange[BF16, cute.cosize(self.c_smem_staged)],
                self.buffer_align_bytes]

        self.shared_storage = SharedStorage
        self.kernel(
            tma_a, tma_tA, tma_b, tma_tB, self.tiled_mma,
            self.a_smem_staged, self.b_smem_staged, self.c_smem_staged,
            out_addr, M, N, K, ws, peer_tab, mc_base, err_addr, rank, local_M, padded_M,
            rot, timeout_ns, arrive_off, result_off, recv_off, region_bytes, part_off, out_off,
        ).launch(grid=[grid, 1, 1], block=[self.threads, 1, 1], cluster=(1, 1, 1),
                 min_blocks_per_mp=1, stream=stream)

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(
        self,
        tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
        tiled_mma: cute.TiledMma,
        a_smem_staged: cute.ComposedLayout, b_smem_staged: cute.ComposedLayout,
        c_smem_staged: cute.ComposedLayout,
        out_addr: Int64, M: Int32, N: Int32, K: Int32,
        ws: Int64, peer_tab: Int64, mc_base: Int64, err_addr: Int64,
        rank: Int32, local_M: Int32, padded_M: Int32, rot: Int32, timeout_ns: Int64,
        arrive_off: Int64, result_off: Int64, recv_off: Int64, region_bytes: Int64,
        part_off: Int64, out_off: Int64,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        cta, _, _ = cute.arch.block_idx()
        num_ctas, _, _ = cute.arch.grid_dim()
        if warp_idx == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_b)

        epoch = Int32(0)
        if cutlass.const_expr(self.mode != "gemm"):
            epoch = ptx.ld_relaxed_gpu(ws + Int64(layout.CTRL_EPOCH))

        tiles_m = (M + Int32(BM - 1)) // Int32(BM)
        tiles_n = N // Int32(self.bn)
        num_tiles = tiles_m * tiles_n

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        a_stage_layout = cute.slice_(a_smem_staged, (None, None, 0))
        b_stage_layout = cute.slice_(b_smem_staged, (None, None, 0))
        tma_bytes = cute.size_in_bytes(BF16, a_stage_layout) + cute.size_in_bytes(BF16, b_stage_layout)
        mainloop = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.pipe_mbar.data_ptr(),
            num_stages=self.ab_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_wg * 4),
            tx_count=tma_bytes,
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
            defer_sync=True,
        )
        pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)

        sA = storage.sA.get_tensor(a_smem_staged.outer, swizzle=a_smem_staged.inner)
        sB = storage.sB.get_tensor(b_smem_staged.outer, swizzle=b_smem_staged.inner)
        sC = storage.sC.get_tensor(c_smem_staged.outer, swizzle=c_smem_staged.inner)

        gA = cute.local_tile(mA, (BM, BK), (None, None))         # (BM, BK, RestM, RestK)
        gB = cute.local_tile(mB, (self.bn, BK), (None, None))    # (BN, BK, RestN, RestK)
        tAsA, tAgA = cute.nvgpu.cpasync.tma_partition(
            tma_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
        tBsB, tBgB = cute.nvgpu.cpasync.tma_partition(
            tma_b, 0, cute.make_layout(1), cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
        k_tiles = cute.size(gA, mode=[3])

        wg_idx = cute.arch.make_warp_uniform(tidx // self.threads_per_wg)
        thr_mma = tiled_mma.get_slice(
            cute.make_layout(self.num_mma_wg, stride=self.threads_per_wg)(wg_idx - 1))
        tCsA = thr_mma.partition_A(sA)
        tCsB = thr_mma.partition_B(sB)
        tCrA = tiled_mma.make_fragment_A(tCsA)
        tCrB = tiled_mma.make_fragment_B(tCsB)
        acc_shape = thr_mma.partition_C(
            cute.make_identity_tensor((BM, self.bn))).shape
        accumulators = cute.make_rmem_tensor(acc_shape, Float32)

        pipeline_init_wait(cluster_shape_mn=(1, 1))

        if wg_idx == 0:
            cute.arch.setmaxregister_decrease(self.load_regs)
            if warp_idx == 0:
                prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.ab_stage)
                i = cta
                while i < num_tiles:
                    t = i + rot
                    if t >= num_tiles:
                        t = t - num_tiles
                    tm = t // tiles_n
                    tn = t - tm * tiles_n
                    tAgA_t = tAgA[(None, tm, None)]
                    tBgB_t = tBgB[(None, tn, None)]
                    prod.reset_count()
                    for _k in range(k_tiles):
                        mainloop.producer_acquire(prod)
                        cute.copy(tma_a, tAgA_t[(None, prod.count)], tAsA[(None, prod.index)],
                                  tma_bar_ptr=mainloop.producer_get_barrier(prod))
                        cute.copy(tma_b, tBgB_t[(None, prod.count)], tBsB[(None, prod.index)],
                                  tma_bar_ptr=mainloop.producer_get_barrier(prod))
                        mainloop.producer_commit(prod)
                        prod.advance()
                    i = i + num_ctas
                mainloop.producer_tail(prod)
        else:
            cute.arch.setmaxregister_increase(self.mma_regs)
            etid = tidx - self.threads_per_wg
            read_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stage)
            rel_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stage)
            num_k_blocks = cute.size(tCrA, mode=[2])

            # registers -> smem (stmatrix), as a 128 x 32 bf16 sub-tile
            r2s_atom = sm90_utils.sm90_get_smem_store_op(
                cutlass.tensor_utils.LayoutEnum.ROW_MAJOR, elem_ty_d=BF16, elem_ty_acc=Float32)
            stm_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), BF16)
            tiled_r2s = cute.make_tiled_copy_S(r2s_atom, cute.make_tiled_copy_C_atom(stm_atom, tiled_mma))
            thr_r2s = tiled_r2s.get_slice(etid)
            tRS_sC = thr_r2s.partition_D(sC)
            tRS_rAcc = tiled_r2s.retile(accumulators)
            rD_shape = cute.shape(thr_r2s.partition_S(sC))
            tRS_rD = cute.make_rmem_tensor(rD_shape[:3], Float32)
            tRS_rD_out = cute.make_rmem_tensor(rD_shape[:3], BF16)
            size_rD = cute.size(tRS_rD)

            # smem -> registers, 16 bytes per thread: thread e covers row e//4 (+64), cols (e%4)*8
            s2r_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BF16, num_bits_per_copy=128)
            tiled_s2r = cute.make_tiled_copy_tv(
                s2r_atom, cute.make_layout((64, 4), stride=(4, 1)), cute.make_layout((1, 8)))
            thr_s2r = tiled_s2r.get_slice(etid)
            tSR_sC = thr_s2r.partition_S(sC)
            frag = cute.make_rmem_tensor(cute.shape(tSR_sC[(None, None, None, 0)]), BF16)
            frag32 = cute.recast_tensor(frag, Int32)

            row_in_pass = etid // Int32(4)
            col_chunk = etid - row_in_pass * Int32(4)
            done_checked = Int32(0)
            sub_count = Int32(0)

            i = cta
            while i < num_tiles:
                t = i + rot
                if t >= num_tiles:
                    t = t - num_tiles
                tm = t // tiles_n
                tn = t - tm * tiles_n

                # ---------------- mainloop
                read_state.reset_count()
                rel_state.reset_count()
                accumulators.fill(0.0)
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                cute.nvgpu.warpgroup.fence()
                mainloop.consumer_wait(read_state)
                for kb in cutlass.range_constexpr(num_k_blocks):
                    cute.gemm(tiled_mma, accumulators, tCrA[(None, None, kb, read_state.index)],
                              tCrB[(None, None, kb, read_state.index)], accumulators)
                cute.nvgpu.warpgroup.commit_group()
                read_state.advance()
                for _k in range(1, k_tiles):
                    mainloop.consumer_wait(read_state)
                    for kb in cutlass.range_constexpr(num_k_blocks):
                        cute.gemm(tiled_mma, accumulators, tCrA[(None, None, kb, read_state.index)],
                                  tCrB[(None, None, kb, read_state.index)], accumulators)
                    cute.nvgpu.warpgroup.commit_group()
                    cute.nvgpu.warpgroup.wait_group(1)
                    mainloop.consumer_release(rel_state)
                    rel_state.advance()
                    read_state.advance()
                cute.nvgpu.warpgroup.wait_group(0)
                mainloop.consumer_release(rel_state)
                rel_state.advance()

                # ---------------- epilogue = communication
                m0 = tm * Int32(BM)
                n0 = tn * Int32(self.bn)
                has_own = True
                has_foreign = False
                o_lo = rank
                o_hi = rank
                owner = rank
                if cutlass.const_expr(self.mode == "rs"):
                    row_end = cutlass.min(m0 + Int32(BM), padded_M)
                    o_lo = m0 // local_M
                    o_hi = (row_end - Int32(1)) // local_M
                    has_own = (o_lo <= rank) & (rank <= o_hi)
                    has_foreign = (o_lo != rank) | (o_hi != rank)
                if cutlass.const_expr(self.mode == "ar"):
                    owner = t * Int32(self.world) // num_tiles
                    o_lo = owner
                    o_hi = owner
                    has_own = owner == rank
                    has_foreign = owner != rank
                if cutlass.const_expr(self.multicast and self.mode != "gemm"):
                    has_foreign = True  # every rank's partial goes to its own buffer first

                if cutlass.const_expr(self.mode != "gemm"):
                    if done_checked == Int32(0):
                        if etid == 0:
                            protocol.wait_peers_done(ws, epoch, self.world, rank, timeout_ns, err_addr)
                        done_checked = Int32(1)

                if has_foreign:
                    for e in cutlass.range_constexpr(self.num_sub):
                        stage = sub_count % Int32(self.epi_stage)
                        self._acc_to_smem(e, tRS_rAcc, tRS_rD, tRS_rD_out, size_rD, tiled_r2s, tRS_sC, stage)
                        cute.copy(tiled_s2r, tSR_sC[(None, None, None, stage)], frag)
                        for p in cutlass.range_constexpr(2):
                            grow = m0 + Int32(p * 64) + row_in_pass
                            q = Int32(p * 256) + etid
                            sub_off = Int64(e * _SUB_BYTES) + Int64(q) * Int64(16)
                            if cutlass.const_expr(self.multicast):
                                valid = grow < M
                                if cutlass.const_expr(self.mode == "rs"):
                                    valid = grow < padded_M
                                if valid:
                                    dst = ws + part_off + Int64(t) * Int64(self.tile_bytes) + sub_off
                                    ptx.st_v4(dst, frag32[4 * p], frag32[4 * p + 1],
                                              frag32[4 * p + 2], frag32[4 * p + 3])
                            else:
                                dest_rank = owner
                                valid = grow < M
                                slot = Int32(0)
                                if cutlass.const_expr(self.mode == "rs"):
                                    dest_rank = grow // local_M
                                    valid = grow < padded_M
                                    slot = (tm - (dest_rank * local_M) // Int32(BM)) * tiles_n + tn
                                else:
                                    slot = t - (owner * num_tiles + Int32(self.world - 1)) // Int32(self.world)
                                if valid & (dest_rank != rank):
                                    src_idx = (rank - dest_rank - Int32(1) + Int32(self.world)) % Int32(self.world)
                                    dst = (protocol.peer_base(peer_tab, dest_rank) + recv_off
                                           + Int64(src_idx) * region_bytes
                                           + Int64(slot) * Int64(self.tile_bytes) + sub_off)
                                    ptx.st_v4(dst, frag32[4 * p], frag32[4 * p + 1],
                                              frag32[4 * p + 2], frag32[4 * p + 3])
                        sub_count = sub_count + Int32(1)
                        self.epi_bar.arrive_and_wait()
                    if etid == 0:
                        ptx.fence_sys()
                        if cutlass.const_expr(self.multicast):
                            for o in range(o_lo, o_hi + Int32(1)):
                                ptx.st_release_sys(
                                    protocol.peer_base(peer_tab, o) + arrive_off
                                    + Int64(t * Int32(self.world) + rank) * Int64(4), epoch + Int32(1))
                        else:
                            for o in range(o_lo, o_hi + Int32(1)):
                                if o != rank:
                                    ptx.st_release_sys(
                                        protocol.peer_base(peer_tab, o) + arrive_off
                                        + Int64(t * Int32(self.world) + rank) * Int64(4), epoch + Int32(1))

                if has_own:
                    if cutlass.const_expr(self.mode != "gemm"):
                        if etid == 0:
                            for s in cutlass.range_constexpr(self.world):
                                if cutlass.const_expr(self.multicast) or Int32(s) != rank:
                                    protocol.wait_stamp(
                                        ws + arrive_off + Int64(t * Int32(self.world) + Int32(s)) * Int64(4),
                                        epoch + Int32(1), timeout_ns, err_addr, ws, rank, t, Int32(s),
                                        epoch, Int32(protocol.KIND_ARRIVE))
                        self.epi_bar.arrive_and_wait()
                    for e in cutlass.range_constexpr(self.num_sub):
                        stage = sub_count % Int32(self.epi_stage)
                        if cutlass.const_expr(not self.multicast):
                            self._acc_to_smem(e, tRS_rAcc, tRS_rD, tRS_rD_out, size_rD, tiled_r2s, tRS_sC, stage)
                            cute.copy(tiled_s2r, tSR_sC[(None, None, None, stage)], frag)
                        for p in cutlass.range_constexpr(2):
                            grow = m0 + Int32(p * 64) + row_in_pass
                            q = Int32(p * 256) + etid
                            sub_off = Int64(e * _SUB_BYTES) + Int64(q) * Int64(16)
                            col = n0 + Int32(e * EPI_N) + col_chunk * Int32(8)
                            valid = grow < M
                            out_row = grow
                            if cutlass.const_expr(self.mode == "rs"):
                                valid = (grow < padded_M) & (grow // local_M == rank)
                                out_row = grow - rank * local_M
                            if valid:
                                r0 = frag32[4 * p]
                                r1 = frag32[4 * p + 1]
                                r2 = frag32[4 * p + 2]
                                r3 = frag32[4 * p + 3]
                                if cutlass.const_expr(self.multicast):
                                    r0, r1, r2, r3 = ptx.multimem_ld_reduce_bf16x8(
                                        mc_base + part_off + Int64(t) * Int64(self.tile_bytes) + sub_off)
                                elif cutlass.const_expr(self.mode != "gemm"):
                                    slot = Int32(0)
                                    if cutlass.const_expr(self.mode == "rs"):
                                        slot = (tm - (rank * local_M) // Int32(BM)) * tiles_n + tn
                                    else:
                                        slot = t - (rank * num_tiles + Int32(self.world - 1)) // Int32(self.world)
                                    a0, a1 = ptx.bf16x2_to_f32(r0)
                                    a2, a3 = ptx.bf16x2_to_f32(r1)
                                    a4, a5 = ptx.bf16x2_to_f32(r2)
                                    a6, a7 = ptx.bf16x2_to_f32(r3)
                                    for s in cutlass.range_constexpr(self.world - 1):
                                        src_base = (ws + recv_off + Int64(s) * region_bytes
                                                    + Int64(slot) * Int64(self.tile_bytes) + sub_off)
                                        v0, v1, v2, v3 = ptx.ld_v4_cg(src_base)
                                        b0, b1 = ptx.bf16x2_to_f32(v0)
                                        b2, b3 = ptx.bf16x2_to_f32(v1)
                                        b4, b5 = ptx.bf16x2_to_f32(v2)
                                        b6, b7 = ptx.bf16x2_to_f32(v3)
                                        a0, a1, a2, a3 = a0 + b0, a1 + b1, a2 + b2, a3 + b3
                                        a4, a5, a6, a7 = a4 + b4, a5 + b5, a6 + b6, a7 + b7
                                    r0 = ptx.f32_to_bf16x2(a0, a1)
                                    r1 = ptx.f32_to_bf16x2(a2, a3)
                                    r2 = ptx.f32_to_bf16x2(a4, a5)
                                    r3 = ptx.f32_to_bf16x2(a6, a7)
                                dst = out_addr + (Int64(out_row) * Int64(N) + Int64(col)) * Int64(2)
                                ptx.st_v4(dst, r0, r1, r2, r3)
                                if cutlass.const_expr(self.mode == "ar"):
                                    tile_off = out_off + Int64(t) * Int64(self.tile_bytes) + sub_off
                                    if cutlass.const_expr(self.multicast):
                                        ptx.multimem_st_v4(mc_base + tile_off, r0, r1, r2, r3)
                                    else:
                                        for pp in cutlass.range_constexpr(self.world):
                                            if Int32(pp) != rank:
                                                ptx.st_v4(protocol.peer_base(peer_tab, Int32(pp)) + tile_off,
                                                          r0, r1, r2, r3)
                        sub_count = sub_count + Int32(1)
                        self.epi_bar.arrive_and_wait()
                    if cutlass.const_expr(self.mode == "ar"):
                        if etid == 0:
                            ptx.fence_sys()
                            for pp in cutlass.range_constexpr(self.world):
                                if Int32(pp) != rank:
                                    ptx.st_release_sys(protocol.peer_base(peer_tab, Int32(pp)) + result_off
                                                       + Int64(t) * Int64(4), epoch + Int32(1))
                i = i + num_ctas

            if cutlass.const_expr(self.mode == "ar"):
                self._ar_copy_out(etid, cta, num_ctas, num_tiles, tiles_n, rank, epoch, M, N, ws,
                                  out_addr, result_off, out_off, timeout_ns, err_addr,
                                  row_in_pass, col_chunk)

        if cutlass.const_expr(self.mode != "gemm"):
            cute.arch.barrier()
            if tidx == 0:
                protocol.finish_launch(ws, peer_tab, epoch, num_ctas, self.world, rank, True)

    @cute.jit
    def _acc_to_smem(self, e: cutlass.Constexpr, tRS_rAcc, tRS_rD, tRS_rD_out, size_rD: cutlass.Constexpr,
                     tiled_r2s, tRS_sC, stage):
        for v in cutlass.range_constexpr(size_rD):
            tRS_rD[v] = tRS_rAcc[e * size_rD + v]
        tRS_rD_out.store(tRS_rD.load().to(BF16))
        cute.copy(tiled_r2s, tRS_rD_out, tRS_sC[(None, None, None, stage)])
        self.epi_bar.arrive_and_wait()

    @cute.jit
    def _ar_copy_out(self, etid, cta, num_ctas, num_tiles, tiles_n, rank, epoch, M, N, ws,
                     out_addr, result_off, out_off, timeout_ns, err_addr, row_in_pass, col_chunk):
        """Tiles other ranks own arrive reduced in OUT; copy them to the caller's output."""
        j = cta
        while j < num_tiles:
            owner = j * Int32(self.world) // num_tiles
            if owner != rank:
                if etid == 0:
                    protocol.wait_stamp(ws + result_off + Int64(j) * Int64(4), epoch + Int32(1),
                                        timeout_ns, err_addr, ws, rank, j, owner, epoch,
                                        Int32(protocol.KIND_RESULT))
                self.epi_bar.arrive_and_wait()
                tm = j // tiles_n
                tn = j - tm * tiles_n
                for e in cutlass.range_constexpr(self.num_sub):
                    for p in cutlass.range_constexpr(2):
                        grow = tm * Int32(BM) + Int32(p * 64) + row_in_pass
                        if grow < M:
                            q = Int32(p * 256) + etid
                            src = ws + out_off + Int64(j) * Int64(self.tile_bytes) + Int64(e * _SUB_BYTES) + Int64(q) * Int64(16)
                            v0, v1, v2, v3 = ptx.ld_v4_cg(src)
                            col = tn * Int32(self.bn) + Int32(e * EPI_N) + col_chunk * Int32(8)
                            ptx.st_v4(out_addr + (Int64(grow) * Int64(N) + Int64(col)) * Int64(2), v0, v1, v2, v3)
            j = j + num_ctas
