"""Blackwell (sm100a) fused GEMM + reduce-scatter / all-reduce, one persistent kernel.

Compiled and PTX-checked on CPU-only CI; it has not run on a Blackwell GPU here (docs/SM100.md).

Warp roles (288 threads, one CTA per SM, persistent over the round schedule of ``launch.plan``):
- warps 0-3 (epilogue, 128 threads): thread i owns TMEM lane / tile row i; per 32-column
  sub-tile: ``tcgen05.ld`` of the fp32 accumulator row (fp8 operands: times the row's and
  each column's scale), round to bf16 / fp16, 64 bytes into a
  slot of the sub-tile ring ``sC`` (128 x 32 per slot, row pitch EPI_PITCH) - the exact format the
  communication warps consume on sm90 - through a PipelineAsync (consumer: the 96 comm threads);
- warp 4 (MMA): ``tcgen05.mma`` from the A/B smem ring into a double-buffered TMEM
  accumulator; with ``cta_group`` 2 only the even CTA of the cluster issues (256 x BN pair-tile,
  each CTA's TMEM holding its own 128 rows);
- warp 5 (TMA): loads of x and w tiles (each CTA of a pair loads its 128 rows of x and half of
  the w tile) into the A/B ring;
- warps 6-8 (communication, 96 threads): ``CommWarps._comm_role``, shared with sm90 unchanged.

With ``cta_group`` 2 the two CTAs of a cluster compute the two vertically adjacent tiles of one
pair-tile; a pair past the last tile row (odd tile rows) computes zero-filled rows that the
schedule never hands to the communication warps (``TileSchedule._scheduled`` returns -1).
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
import cutlass.utils as utils
from cutlass.cute.nvgpu import cpasync, tcgen05
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from . import layout, protocol, ptx
from .comm_warps import BK_BYTES, CommWarps
from .geometry import BM, EPI_N
from .sub_tile import COMM_THREADS as _COMM_THREADS
from .sub_tile import EPI_PITCH as _EPI_PITCH
from .variant import Variant

Int32 = cutlass.Int32
Int64 = cutlass.Int64
Float32 = cutlass.Float32

_EPI_WARPS = 4
_MMA_WARP = 4
_TMA_WARP = 5
_COMM_WARP0 = 6
_THREADS = 32 * (_COMM_WARP0 + _COMM_THREADS // 32)  # 288
_ACC_STAGES = 2
# named barriers: 0 = whole CTA (cute.arch.barrier), 1 = comm warps, 2 = TMEM pointer hand-off,
# 3 = epilogue warps before the TMEM free
_BAR_COMM, _BAR_TMEM_ALLOC, _BAR_EPI = 1, 2, 3
_SMEM_BYTES = 232448  # sm_100 dynamic shared memory per block


class Sm100FusedKernel(CommWarps):
    """One compiled ``Variant``: (BN, world, mode, transport, cta_group, dtype, in_dtype,
    bias); the sm90 kernel's tuning choices are not this kernel's."""

    def __init__(self, v: Variant) -> None:
        if v.tuning() or v.push != "lsu":
            raise ValueError(f"the sm100 kernel has no tuning knobs yet, got {v.tuning()} "
                             f"push={v.push}")
        bn, world, mode, transport, cta_group = v.bn, v.world, v.mode, v.transport, v.cta_group
        dtype, in_dtype, bias = v.dtype, v.in_dtype, v.bias
        # partials and output of ``dtype``; x and w of ``in_dtype`` (fp8: scaled in the
        # epilogue, ``Sm90FusedKernel``) or the same; fp32 accumulators
        self._use_dtype(dtype, in_dtype)
        self._use_bias(bias, mode)
        if bn not in (128, 256):
            raise ValueError(f"BN must be 128 or 256, got {bn}")
        if mode not in ("rs", "ar", "gemm"):
            raise ValueError(f"mode must be rs, ar or gemm, got {mode!r}")
        if transport not in ("unicast", "multicast"):
            raise ValueError(f"transport must be unicast or multicast, got {transport!r}")
        if cta_group not in (1, 2):
            raise ValueError(f"cta_group must be 1 or 2, got {cta_group}")
        self.bn, self.world, self.mode, self.transport = bn, world, mode, transport
        self.cta_group = cta_group
        self.multicast = transport == "multicast"
        self.comm = mode != "gemm"
        self.threads = _THREADS
        self.num_sub = bn // EPI_N
        self.tile_bytes = BM * bn * 2
        self.mma_tiler = (BM * cta_group, bn, self.bk)
        # per CTA and stage: 128 rows of x, BN / cta_group rows of w, one k-block each
        ab_bytes = (BM + bn // cta_group) * BK_BYTES
        slot_bytes = BM * _EPI_PITCH * 2
        self.epi_slots = 4
        if (_SMEM_BYTES - 2048 - 4 * slot_bytes) // ab_bytes < 4:
            self.epi_slots = 2  # BN=256, 1-CTA: keep 4 mainloop stages
        self.ab_stage = min(8, (_SMEM_BYTES - 2048 - self.epi_slots * slot_bytes) // ab_bytes)
        self.tmem_cols = _ACC_STAGES * bn  # 256 or 512: a power of two, as tcgen05.alloc wants
        self.comm_bar = pipeline.NamedBarrier(barrier_id=_BAR_COMM, num_threads=_COMM_THREADS)

    # ------------------------------------------------------------------ host side
    def _layouts(self) -> None:
        group = tcgen05.CtaGroup.TWO if self.cta_group == 2 else tcgen05.CtaGroup.ONE
        self.tiled_mma = utils.sm100.make_trivial_tiled_mma(
            self.ab_elem, self.ab_elem, cute.nvgpu.OperandMajorMode.K,
            cute.nvgpu.OperandMajorMode.K, Float32, group, self.mma_tiler[:2])
        self.cluster_layout_vmnk = cute.tiled_divide(
            cute.make_layout((self.cta_group, 1, 1)), (self.tiled_mma.thr_id.shape,))
        self.a_smem_staged = utils.sm100.make_smem_layout_a(
            self.tiled_mma, self.mma_tiler, self.ab_elem, self.ab_stage)
        self.b_smem_staged = utils.sm100.make_smem_layout_b(
            self.tiled_mma, self.mma_tiler, self.ab_elem, self.ab_stage)

    @cute.jit
    def __call__(
        self,
        x_addr: Int64, w_addr: Int64, out_addr: Int64,
        sx_addr: Int64, sw_addr: Int64, scale_bits: Int32, bias_addr: Int64,
        M: Int32, N: Int32, K: Int32,
        ws: Int64, peer_tab: Int64, mc_base: Int64, err_addr: Int64,
        rank: Int32, local_M: Int32, padded_M: Int32, chunk: Int32, rounds: Int32, lag: Int32,
        grid: Int32, timeout_ns: Int64,
        arrive_off: Int64, result_off: Int64, recv_off: Int64, region_bytes: Int64,
        part_off: Int64, out_off: Int64,
        stream: cuda.CUstream,
    ):
        self._layouts()
        K = cute.assume(K, divby=self.bk)
        N = cute.assume(N, divby=128)
        a_ptr = cute.make_ptr(self.ab_elem, x_addr, cute.AddressSpace.gmem, assumed_align=16)
        b_ptr = cute.make_ptr(self.ab_elem, w_addr, cute.AddressSpace.gmem, assumed_align=16)
        mA = cute.make_tensor(a_ptr, cute.make_layout((M, K), stride=(K, 1)))
        mB = cute.make_tensor(b_ptr, cute.make_layout((N, K), stride=(K, 1)))

        a_stage = cute.slice_(self.a_smem_staged, (None, None, None, 0))
        b_stage = cute.slice_(self.b_smem_staged, (None, None, None, 0))
        tma_a, tma_tA = cute.nvgpu.make_tiled_tma_atom_A(
            utils.sm100.cluster_shape_to_tma_atom_A((self.cta_group, 1), self.tiled_mma.thr_id),
            mA, a_stage, self.mma_tiler, self.tiled_mma, self.cluster_layout_vmnk.shape)
        tma_b, tma_tB = cute.nvgpu.make_tiled_tma_atom_B(
            utils.sm100.cluster_shape_to_tma_atom_B((self.cta_group, 1), self.tiled_mma.thr_id),
            mB, b_stage, self.mma_tiler, self.tiled_mma, self.cluster_layout_vmnk.shape)
        self.tma_bytes = (cute.size_in_bytes(self.ab_elem, a_stage)
                          + cute.size_in_bytes(self.ab_elem, b_stage)) * self.cta_group

        @cute.struct
        class SharedStorage:
            ab_mbar: cute.struct.MemRange[Int64, self.ab_stage * 2]
            acc_mbar: cute.struct.MemRange[Int64, _ACC_STAGES * 2]
            epi_mbar: cute.struct.MemRange[Int64, self.epi_slots * 2]
            tmem_dealloc_mbar: Int64
            tmem_addr: Int32
            sA: cute.struct.Align[
                cute.struct.MemRange[self.ab_elem, cute.cosize(self.a_smem_staged)], 1024]
            sB: cute.struct.Align[
                cute.struct.MemRange[self.ab_elem, cute.cosize(self.b_smem_staged)], 1024]
            sC: cute.struct.Align[
                cute.struct.MemRange[self.elem, BM * _EPI_PITCH * self.epi_slots], 128]

        self.shared_storage = SharedStorage
        self.kernel(
            tma_a, tma_tA, tma_b, tma_tB, self.tiled_mma, self.cluster_layout_vmnk,
            self.a_smem_staged, self.b_smem_staged,
            out_addr, sx_addr, sw_addr, scale_bits, bias_addr, M, N, K, ws, peer_tab, mc_base,
            err_addr,
            rank, local_M, padded_M, chunk, rounds, lag, timeout_ns, arrive_off, result_off,
            recv_off, region_bytes, part_off, out_off,
        ).launch(grid=[grid, 1, 1], block=[self.threads, 1, 1], cluster=(self.cta_group, 1, 1),
                 min_blocks_per_mp=1, stream=stream)

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(
        self,
        tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
        tiled_mma: cute.TiledMma, cluster_layout_vmnk: cute.Layout,
        a_smem_staged: cute.ComposedLayout, b_smem_staged: cute.ComposedLayout,
        out_addr: Int64, sx_addr: Int64, sw_addr: Int64, scale_bits: Int32, bias_addr: Int64,
        M: Int32, N: Int32, K: Int32,
        ws: Int64, peer_tab: Int64, mc_base: Int64, err_addr: Int64,
        rank: Int32, local_M: Int32, padded_M: Int32, chunk: Int32, rounds: Int32, lag: Int32,
        timeout_ns: Int64, arrive_off: Int64, result_off: Int64, recv_off: Int64, region_bytes: Int64,
        part_off: Int64, out_off: Int64,
    ):
        self._bias_at(bias_addr, M)
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        cta, _, _ = cute.arch.block_idx()
        num_ctas, _, _ = cute.arch.grid_dim()
        if warp_idx == _TMA_WARP:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
        two_cta = self.cta_group == 2
        mma_v = cta % Int32(self.cta_group)
        is_leader = mma_v == Int32(0)
        lane = cta // Int32(self.cta_group)  # schedule lane: the CTA, or its cluster
        rank_in_cluster = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cluster_coord = cluster_layout_vmnk.get_flat_coord(rank_in_cluster)

        tiles_m = (M + Int32(BM - 1)) // Int32(BM)
        tiles_n = N // Int32(self.bn)
        num_tiles = tiles_m * tiles_n

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        ab_pipe = pipeline.PipelineTmaUmma.create(
            barrier_storage=storage.ab_mbar.data_ptr(),
            num_stages=self.ab_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            tx_count=self.tma_bytes,
            cta_layout_vmnk=cluster_layout_vmnk,
            defer_sync=True,
        )
        acc_pipe = pipeline.PipelineUmmaAsync.create(
            barrier_storage=storage.acc_mbar.data_ptr(),
            num_stages=_ACC_STAGES,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                     _EPI_WARPS * self.cta_group),
            cta_layout_vmnk=cluster_layout_vmnk,
            defer_sync=True,
        )
        epi_pipe = pipeline.PipelineAsync.create(
            barrier_storage=storage.epi_mbar.data_ptr(),
            num_stages=self.epi_slots,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 32 * _EPI_WARPS),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, _COMM_THREADS),
            defer_sync=True,
        )
        tmem = cutlass.memory.TmemAllocator(
            storage.tmem_addr.ptr,
            barrier_for_retrieve=pipeline.NamedBarrier(
                barrier_id=_BAR_TMEM_ALLOC, num_threads=32 * (_EPI_WARPS + 1)),
            allocator_warp_id=0,
            is_two_cta=two_cta,
            two_cta_tmem_dealloc_mbar_ptr=storage.tmem_dealloc_mbar.ptr,
        )
        pipeline_init_arrive(cluster_shape_mn=cluster_layout_vmnk, is_relaxed=True)

        sA = storage.sA.get_tensor(a_smem_staged.outer, swizzle=a_smem_staged.inner)
        sB = storage.sB.get_tensor(b_smem_staged.outer, swizzle=b_smem_staged.inner)
        sC_ptr = storage.sC.data_ptr()

        gA = cute.local_tile(mA, cute.slice_(self.mma_tiler, (None, 0, None)), (None, None))
        gB = cute.local_tile(mB, cute.slice_(self.mma_tiler, (0, None, None)), (None, None))
        thr_mma = tiled_mma.get_slice(mma_v)
        tCgA = thr_mma.partition_A(gA)
        tCgB = thr_mma.partition_B(gB)
        tAsA, tAgA = cpasync.tma_partition(
            tma_a, cluster_coord[2],
            cute.make_layout(cute.slice_(cluster_layout_vmnk, (0, 0, None, 0)).shape),
            cute.group_modes(sA, 0, 3), cute.group_modes(tCgA, 0, 3))
        tBsB, tBgB = cpasync.tma_partition(
            tma_b, cluster_coord[1],
            cute.make_layout(cute.slice_(cluster_layout_vmnk, (0, None, 0, 0)).shape),
            cute.group_modes(sB, 0, 3), cute.group_modes(tCgB, 0, 3))
        k_tiles = cute.size(gA, mode=[3])
        a_mask = None
        b_mask = None
        if cutlass.const_expr(two_cta):
            a_mask = cpasync.create_tma_multicast_mask(cluster_layout_vmnk, cluster_coord, mcast_mode=2)
            b_mask = cpasync.create_tma_multicast_mask(cluster_layout_vmnk, cluster_coord, mcast_mode=1)
        tCrA = tiled_mma.make_fragment_A(sA)
        tCrB = tiled_mma.make_fragment_B(sB)
        acc_shape = tiled_mma.partition_shape_C(self.mma_tiler[:2])
        tCtAcc_fake = tiled_mma.make_fragment_C(cute.append(acc_shape, _ACC_STAGES))

        pipeline_init_wait(cluster_shape_mn=cluster_layout_vmnk)

        if warp_idx == _TMA_WARP:
            prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.ab_stage)
            for rnd in range(rounds):
                u = self._scheduled_unit(rank, lane, rnd, chunk, lag, num_tiles, tiles_m,
                                         tiles_n, local_M)
                if u >= Int32(0):
                    mu = u // tiles_n  # tile row (1-CTA) or pair-tile row (2-CTA)
                    tn = u - mu * tiles_n
                    tAgA_t = tAgA[(None, mu, None)]
                    tBgB_t = tBgB[(None, tn, None)]
                    for k in range(k_tiles):
                        ab_pipe.producer_acquire(prod)
                        cute.copy(tma_a, tAgA_t[(None, k)], tAsA[(None, prod.index)],
                                  tma_bar_ptr=ab_pipe.producer_get_barrier(prod), mcast_mask=a_mask)
                        cute.copy(tma_b, tBgB_t[(None, k)], tBsB[(None, prod.index)],
                                  tma_bar_ptr=ab_pipe.producer_get_barrier(prod), mcast_mask=b_mask)
                        ab_pipe.producer_commit(prod)
                        prod.advance()
            ab_pipe.producer_tail(prod)

        if warp_idx == _MMA_WARP:
            tmem.wait_for_alloc()
            tmem_ptr = tmem.retrieve_ptr(Float32)
            tCtAcc_base = cute.make_tensor(tmem_ptr, tCtAcc_fake.layout)
            if is_leader:
                cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stage)
                acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, _ACC_STAGES)
                num_kb = cute.size(tCrA, mode=[2])
                for rnd in range(rounds):
                    u = self._scheduled_unit(rank, lane, rnd, chunk, lag, num_tiles, tiles_m,
                                             tiles_n, local_M)
                    if u >= Int32(0):
                        acc_pipe.producer_acquire(acc_state)
                        tCtAcc = tCtAcc_base[(None, None, None, acc_state.index)]
                        tiled_mma.set(tcgen05.Field.ACCUMULATE, False)
                        for _k in range(k_tiles):
                            ab_pipe.consumer_wait(cons)
                            for kb in cutlass.range_constexpr(num_kb):
                                cute.gemm(tiled_mma, tCtAcc, tCrA[(None, None, kb, cons.index)],
                                          tCrB[(None, None, kb, cons.index)], tCtAcc)
                                tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
                            ab_pipe.consumer_release(cons)
                            cons.advance()
                        acc_pipe.producer_commit(acc_state)
                        acc_state.advance()
                acc_pipe.producer_tail(acc_state)

        if warp_idx < _EPI_WARPS:
            tmem.allocate(self.tmem_cols)
            tmem.wait_for_alloc()
            tmem_ptr = tmem.retrieve_ptr(Float32)
            tmem_base = ptx.ld_shared_u32(storage.tmem_addr.ptr.toint())
            self._epilogue_role(tidx, warp_idx, lane, cta, rank, rounds, chunk, lag, num_tiles,
                                tiles_m, tiles_n, local_M, tmem_base, sC_ptr, acc_pipe, epi_pipe,
                                M, sx_addr, sw_addr, scale_bits)
            pipeline.NamedBarrier(barrier_id=_BAR_EPI, num_threads=32 * _EPI_WARPS).arrive_and_wait()
            tmem.relinquish_alloc_permit()
            tmem.free(tmem_ptr)

        if warp_idx >= _COMM_WARP0:
            self._comm_role(tidx - Int32(32 * _COMM_WARP0), cta, num_ctas, num_tiles, tiles_m,
                            tiles_n, epi_pipe, sC_ptr, out_addr, M, N,
                            protocol.shape_word(M, K), ws, peer_tab, mc_base, err_addr, rank,
                            local_M, padded_M, chunk, rounds, lag, timeout_ns, arrive_off,
                            result_off, recv_off, region_bytes, part_off, out_off)

        if cutlass.const_expr(self.comm):
            cute.arch.barrier()
            if tidx == 0:
                epoch = ptx.ld_relaxed_gpu(ws + Int64(layout.CTRL_EPOCH))
                protocol.finish_launch(ws, peer_tab, epoch, num_ctas, self.world, rank,
                                       self.lean_exit)

    # ------------------------------------------------------------------ epilogue warps
    @cute.jit
    def _epilogue_role(self, tidx, warp_idx, lane, cta, rank, rounds, chunk, lag, num_tiles,
                       tiles_m, tiles_n, local_M, tmem_base, sC_ptr, acc_pipe, epi_pipe,
                       M, sx_addr, sw_addr, scale_bits):
        """TMEM -> registers -> bf16 -> the sub-tile ring: thread ``tidx`` owns row ``tidx``
        of the CTA's 128-row tile (TMEM lane ``tidx``), 64 bytes per 32-column sub-tile.
        fp8 operands: each value times x's scale for the row and w's for the column
        (``scale_bits`` as on sm90; whole tiles only here, so no column is past N)."""
        row_smem = sC_ptr.toint() + tidx * Int32(_EPI_PITCH * 2)
        lane_addr = tmem_base + ((warp_idx * Int32(32)) << Int32(16))
        acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, _ACC_STAGES)
        epi_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.epi_slots)
        for rnd in range(rounds):
            u = self._scheduled_unit(rank, lane, rnd, chunk, lag, num_tiles, tiles_m, tiles_n,
                                     local_M)
            if u >= Int32(0):
                # the tile the communication warps see: -1 for a zero-filled padding half
                t = self._scheduled(rank, cta, rnd, chunk, lag, num_tiles, tiles_m, tiles_n,
                                    local_M)
                s_row = Float32(1.0)
                if cutlass.const_expr(self.scaled):
                    s_row = self._row_scale(t, tiles_n, tidx, M, sx_addr, scale_bits)
                acc_pipe.consumer_wait(acc_state)
                col0 = lane_addr + acc_state.index * Int32(self.bn)
                for e in cutlass.range_constexpr(self.num_sub):
                    v = ptx.tmem_ld_row32(col0 + Int32(e * EPI_N))
                    if cutlass.const_expr(e == self.num_sub - 1):
                        # every column of this accumulator stage is in registers: hand it back
                        cute.arch.fence_view_async_tmem_load()
                        with cute.arch.elect_one():
                            acc_pipe.consumer_release(acc_state)
                    if t >= Int32(0):
                        if cutlass.const_expr(self.scaled):
                            v = self._scaled_row(v, t, tiles_n, e, s_row, sw_addr, scale_bits)
                        packed = [self._pack2(v[2 * i], v[2 * i + 1]) for i in range(16)]
                        epi_pipe.producer_acquire(epi_state)
                        dst = row_smem + epi_state.index * Int32(BM * _EPI_PITCH * 2)
                        for q in cutlass.range_constexpr(4):
                            ptx.st_shared_v4(dst + Int32(16 * q), packed[4 * q], packed[4 * q + 1],
                                             packed[4 * q + 2], packed[4 * q + 3])
                        epi_pipe.producer_commit(epi_state)
                        epi_state.advance()
                acc_state.advance()

    @cute.jit
    def _row_scale(self, t, tiles_n, tidx, M, sx_addr, scale_bits):
        """fp8 operands: x's scale for this thread's row of tile ``t`` (a row past M, or a
        padding tile's, reads the last or the first row's: never stored)."""
        sx = cute.make_tensor(cute.make_ptr(Float32, sx_addr, cute.AddressSpace.gmem,
                                            assumed_align=4), cute.make_layout(M))
        tm = cutlass.max(t, Int32(0)) // tiles_n
        return sx[cutlass.min(tm * Int32(BM) + tidx, M - Int32(1)) * (scale_bits & Int32(1))]

    @cute.jit
    def _scaled_row(self, v, t, tiles_n, e, s_row, sw_addr, scale_bits):
        """The 32 accumulators of sub-tile ``e`` of this thread's row of tile ``t``, times
        the row's x scale ``s_row`` and each column's w scale."""
        tn = t - (t // tiles_n) * tiles_n
        sw = cute.make_tensor(cute.make_ptr(Float32, sw_addr, cute.AddressSpace.gmem,
                                            assumed_align=4), cute.make_layout(tiles_n * self.bn))
        col_step = (scale_bits >> Int32(1)) & Int32(1)
        col0 = tn * Int32(self.bn) + Int32(e * EPI_N)
        return [v[j] * (s_row * sw[(col0 + Int32(j)) * col_step]) for j in range(EPI_N)]
