"""Ping-pong MMA warp groups for the sm90 kernel (``Sm90FusedKernel(..., pingpong=1)``).

The cooperative kernel splits each 128 x BN tile between its two MMA warp groups (64 rows
each), so both reach the epilogue together and the tensor pipes idle while they convert,
store and hand the tile over: +11% a tile at K=1024, +4% at K=4096 on the GEMM alone
(docs/PERF.md (v)). Here each warp group computes whole tiles, the two taking a CTA's
rounds by turns (even rounds the first group, odd the second), so one group's epilogue runs
under the other's mainloop.

- A group issues both 64-row halves of its tile: the cooperative tiled MMA's slices of
  threads t and t + 128 (the same wgmma shape and fragment layout, the second half's smem
  64 rows on), so a thread holds BN fp32 accumulators instead of BN / 2.
- The mainloop stages stay one sequence in the producer's round order: a group waits for
  and releases only its own tiles' stages, and steps over the other group's. It starts
  waiting only once the other group has waited for its last stage of the round before: an
  mbarrier's parity wait cannot tell phase n from n + 2, so a group that stepped a whole
  tile ahead while the other still consumed would take an older phase's data (and the
  extra releases corrupt the stage barriers: error 719 on the GPU).
- The sub-tile ring is filled in round order, as the store and communication warps read
  it, for the same reason: a group starts an epilogue once the other group has taken its
  slots for the round before.
- Both hand-overs are named barriers passed on every round, whether or not it had a tile.
"""
from __future__ import annotations

from collections import namedtuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline

from .geometry import BM

Int32 = cutlass.Int32
Float32 = cutlass.Float32

_GROUP = 128  # threads of a warp group
# what a group's mainloop and epilogue take (``_pp_mainloop``, ``_pp_epilogue``); parts: the
# halves' smem and accumulator partitions
PpCtx = namedtuple("PpCtx", "mma_z mma_a frags ab_pipe epi_pipe tiled_r2s tRS_rD tRS_rD_out "
                   "parts size_rD k_tiles")
# named barriers (2-4 are the kernel's own): "warp group 0 / 1 may start its mainloop's
# waits" (5, 6), "... its epilogue" (7, 8)
_MAIN_BAR = (5, 6)
_EPI_BAR = (7, 8)


class PingPongMma:
    """Mixin of ``Sm90FusedKernel``: ``_pingpong_role``. Reads the kernel's ``bn, elem,
    num_sub, epi_slots, ab_stage, tma_push``, its schedule methods and ``_make_mma`` /
    ``_ring_copy``."""

    def _turn_bars(self, ids: tuple) -> tuple:
        return tuple(pipeline.NamedBarrier(barrier_id=b, num_threads=2 * _GROUP) for b in ids)

    @cute.jit
    def _pingpong_role(self, mtid, lane, v_in_pair, num_tiles, tiles_m, tiles_n, k_tiles, rank,
                       local_M, chunk, rounds, lag, tiled_mma: cute.TiledMma, sA, sB, sC,
                       ab_pipe, epi_pipe):
        """Both MMA warp groups (``mtid`` 0-255): each computes the tiles of its rounds and
        hands them to the sub-tile ring, in round order with the other group's."""
        # uniform across the warp group: ptxas serializes wgmmas behind branches it cannot
        # prove uniform (C7520)
        grp = cute.arch.make_warp_uniform(mtid // Int32(_GROUP))
        wt = mtid - grp * Int32(_GROUP)
        thr_lo = tiled_mma.get_slice(wt)
        thr_hi = tiled_mma.get_slice(wt + Int32(_GROUP))
        tCrA_lo = tiled_mma.make_fragment_A(thr_lo.partition_A(sA))
        tCrA_hi = tiled_mma.make_fragment_A(thr_hi.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_lo.partition_B(sB))
        tCcC = thr_lo.partition_C(cute.make_identity_tensor((self.bm, self.bn)))
        acc_lo = cute.make_rmem_tensor(tCcC.shape, Float32)
        acc_hi = cute.make_rmem_tensor(tCcC.shape, Float32)
        num_k_blocks = cute.size(tCrA_lo, mode=[2])

        tiled_r2s, tRS_rD, tRS_rD_out = self._ring_copy(tiled_mma, sC)
        tRS_sC_lo = tiled_r2s.get_slice(wt).partition_D(sC)
        tRS_sC_hi = tiled_r2s.get_slice(wt + Int32(_GROUP)).partition_D(sC)
        tRS_rAcc_lo = tiled_r2s.retile(acc_lo)
        tRS_rAcc_hi = tiled_r2s.retile(acc_hi)
        size_rD = cute.size(tRS_rD)

        main_turn = self._turn_bars(_MAIN_BAR)
        epi_turn = self._turn_bars(_EPI_BAR)
        # the first wgmma of a tile overwrites its accumulators: two MMAs fixed once, so no
        # loop body changes an MMA's state
        mma_z = self._make_mma()
        mma_z.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
        mma_a = self._make_mma()
        mma_a.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
        frags = (tCrA_lo, tCrA_hi, tCrB, acc_lo, acc_hi, num_k_blocks)
        read_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stage)
        rel_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stage)
        # the ring position of the group's next sub-tile: the other group's tiles fill the
        # slots in between
        epi_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.epi_slots)
        ctx = PpCtx(mma_z, mma_a, frags, ab_pipe, epi_pipe, tiled_r2s, tRS_rD, tRS_rD_out,
                    (tRS_sC_lo, tRS_sC_hi, tRS_rAcc_lo, tRS_rAcc_hi), size_rD, k_tiles)
        for rnd in range(rounds):
            u = self._scheduled_unit(rank, lane, rnd, chunk, lag, num_tiles, tiles_m,
                                     tiles_n, local_M, k_tiles)
            mine = (rnd - (rnd // Int32(2)) * Int32(2)) == grp
            _, _, real = self._unit_tile(cutlass.max(u, Int32(0)), v_in_pair, tiles_m,
                                         tiles_n)
            real = real & (u >= Int32(0))
            if mine:
                if rnd > Int32(0):
                    self._turn_wait(main_turn, grp)
                if u >= Int32(0):
                    read_state, rel_state = self._pp_mainloop(ctx, read_state, rel_state)
                    # every stage of this round has been waited for: the other group's
                    # waits of the next round are at most one phase ahead of each
                    # stage's barrier
                    if rnd + Int32(1) < rounds:
                        self._turn_pass(main_turn, grp)
                    # (in this branch: ptxas sees every wgmma retired before the epilogue)
                    cute.nvgpu.warpgroup.wait_group(0)
                    ab_pipe.consumer_release(rel_state)
                    rel_state.advance()
                elif rnd + Int32(1) < rounds:
                    self._turn_pass(main_turn, grp)
                if rnd > Int32(0):
                    self._turn_wait(epi_turn, grp)
                if real:
                    epi_state = self._pp_epilogue(ctx, epi_state)
                if rnd + Int32(1) < rounds:
                    self._turn_pass(epi_turn, grp)
            elif u >= Int32(0):
                read_state.advance(k_tiles)
                rel_state.advance(k_tiles)
                if real:
                    epi_state.advance(Int32(self.num_sub))

    @cute.jit
    def _pp_mainloop(self, ctx, read_state, rel_state):
        """A tile's mainloop on both halves: every stage waited for, all but the last
        released (the caller retires the wgmmas and releases it). Returns the states."""
        mma_z, mma_a, frags, ab_pipe = ctx.mma_z, ctx.mma_a, ctx.frags, ctx.ab_pipe
        k_tiles = ctx.k_tiles
        cute.nvgpu.warpgroup.fence()
        ab_pipe.consumer_wait(read_state)
        self._pp_stage(mma_z, mma_a, frags, read_state.index)
        read_state.advance()
        for _k in range(1, k_tiles):
            ab_pipe.consumer_wait(read_state)
            self._pp_stage(mma_a, mma_a, frags, read_state.index)
            cute.nvgpu.warpgroup.wait_group(1)
            ab_pipe.consumer_release(rel_state)
            rel_state.advance()
            read_state.advance()
        return read_state, rel_state

    @cute.jit
    def _pp_epilogue(self, ctx, epi_state):
        """A finished tile's sub-tiles into the ring, both halves. Returns the state."""
        epi_pipe, tiled_r2s, size_rD = ctx.epi_pipe, ctx.tiled_r2s, ctx.size_rD
        tRS_rD, tRS_rD_out = ctx.tRS_rD, ctx.tRS_rD_out
        tRS_sC_lo, tRS_sC_hi, tRS_rAcc_lo, tRS_rAcc_hi = ctx.parts
        for e in cutlass.range_constexpr(self.num_sub):
            epi_pipe.producer_acquire(epi_state)
            for v in cutlass.range_constexpr(size_rD):
                tRS_rD[v] = tRS_rAcc_lo[e * size_rD + v]
            tRS_rD_out.store(tRS_rD.load().to(self.elem))
            cute.copy(tiled_r2s, tRS_rD_out, tRS_sC_lo[(None, None, None, epi_state.index)])
            for v in cutlass.range_constexpr(size_rD):
                tRS_rD[v] = tRS_rAcc_hi[e * size_rD + v]
            tRS_rD_out.store(tRS_rD.load().to(self.elem))
            cute.copy(tiled_r2s, tRS_rD_out, tRS_sC_hi[(None, None, None, epi_state.index)])
            if cutlass.const_expr(self.tma_push):
                # the slot is read by bulk copies (async proxy)
                cute.arch.fence_proxy("async.shared", space="cta")
            epi_pipe.producer_commit(epi_state)
            epi_state.advance()
        return epi_state

    @cute.jit
    def _turn_wait(self, turn, grp):
        """Waits for this group's turn (``turn``: the two groups' barriers)."""
        if grp == Int32(0):
            turn[0].arrive_and_wait()
        else:
            turn[1].arrive_and_wait()

    @cute.jit
    def _turn_pass(self, turn, grp):
        """Gives the turn to the other group."""
        if grp == Int32(0):
            turn[1].arrive()
        else:
            turn[0].arrive()

    def _pp_stage(self, mma_first, mma_rest, frags, stage) -> None:
        """One stage's wgmmas on both halves of the tile, committed as one group:
        ``mma_first`` issues each half's first k-block (the tile's first stage: one that
        overwrites the accumulators). Emitted at trace time."""
        tCrA_lo, tCrA_hi, tCrB, acc_lo, acc_hi, num_k_blocks = frags
        for kb in range(num_k_blocks):
            mma = mma_first if kb == 0 else mma_rest
            b = tCrB[(None, None, kb, stage)]
            cute.gemm(mma, acc_lo, tCrA_lo[(None, None, kb, stage)], b, acc_lo)
            cute.gemm(mma, acc_hi, tCrA_hi[(None, None, kb, stage)], b, acc_hi)
        cute.nvgpu.warpgroup.commit_group()
