"""Tiles handed out at run time (``Variant.dyn_tiles``, an experiment on the plain GEMM).

The static schedule gives lane l unit ``rnd * lanes + l`` in every round, whatever its
neighbours have done. Here a lane's first two units are still ``l`` and ``l + lanes``, and
every later one is the next position of a counter in the workspace (``layout.CTRL_TILE_NEXT``)
plus ``2 * lanes``, so the units in flight stay about one round of consecutive positions and
units next to each other start at about the same time, however the lanes drift: their
requests for the same x and w sectors can then be merged in L2 (docs/perf/HISTORY.md (av):
at cuBLAS's own plan its dynamic order gets twice the merges of our static one).

- The producer warp fetches one unit ahead (the atomic's latency runs under the current
  unit's loads) and passes each unit, in order, through a ring of ``ID_SLOTS`` words in
  shared memory to the MMA warps and the store warp; a unit past the last is the end, and
  every reader reads it too.
- On 2x1 clusters the leader CTA's producer fetches, and sends each unit to the other
  CTA's producer through a mailbox of ``ID_SLOTS`` words in that CTA (one ``st.async``
  that also completes the word's mbarrier there; the reader hands the slot back with a
  remote arrive), which puts it in its own ring.
- Positions go through the band order as in the static schedule (``TileSchedule``).
- The counter needs no host reset: each lane adds one to ``CTRL_TILE_DONE`` when it has
  fetched past the last unit, and the lane that completes the count zeroes both words (no
  lane fetches after that), so the next launch on the workspace starts from zero.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline

from . import layout, ptx

Int32 = cutlass.Int32
Int64 = cutlass.Int64

ID_SLOTS = 4  # units the producer may run ahead of the slowest reader


class DynTiles:
    """Mixin of ``Sm90FusedKernel``: the producer, ping-pong and store loops of
    ``dyn_tiles`` kernels. Reads the kernel's schedule methods, ``_load_unit``,
    ``_store_tile``, ``_pp_mainloop`` / ``_pp_epilogue`` and ``num_mma_threads``."""

    def _dyn_fields(self) -> dict:
        """Shared-memory fields of the unit ring."""
        fields = {"ids_mbar": cute.struct.MemRange[Int64, 2 * ID_SLOTS],
                  "ids": cute.struct.MemRange[Int32, ID_SLOTS]}
        if self.cta_group == 2:
            fields.update({"mail_mbar": cute.struct.MemRange[Int64, 2 * ID_SLOTS],
                           "mail": cute.struct.MemRange[Int32, ID_SLOTS]})
        return fields

    @cute.jit
    def _dyn_ring(self, storage):
        """(pipeline, words, mailbox) of the unit ring: written by the producer warp, read
        by every MMA thread and the store warp; the mailbox (2x1 clusters: (full and empty
        barriers, words); else None), its barriers initialized here by thread 0."""
        ring = pipeline.PipelineAsync.create(
            barrier_storage=storage.ids_mbar.data_ptr(),
            num_stages=ID_SLOTS,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 32),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                     self.num_mma_threads + 32),
            defer_sync=True,
        )
        words = cute.make_tensor(storage.ids.data_ptr(), cute.make_layout(ID_SLOTS))
        mail = None
        if cutlass.const_expr(self.cta_group == 2):
            full = storage.mail_mbar.data_ptr()
            empty = full + ID_SLOTS
            if cute.arch.thread_idx()[0] == Int32(0):
                for s in cutlass.range_constexpr(ID_SLOTS):
                    cute.arch.mbarrier_init(full + s, 1)  # the reader's arm; then 4 bytes
                    cute.arch.mbarrier_init(empty + s, 1)  # the reader's (remote) hand-back
            mail = (full, empty, storage.mail.data_ptr())
        return ring, words, mail

    @cute.jit
    def _dyn_unit(self, pos, num_tiles, tiles_m, tiles_n, lag):
        """The unit at ``pos`` of the flat order (bands as ``lag`` says), or -1 past the
        last: the static schedule's unit of lane ``pos`` in round 0."""
        return self._scheduled_unit(Int32(0), pos, Int32(0), num_tiles, lag, num_tiles,
                                    tiles_m, tiles_n, Int32(0))

    @cute.jit
    def _dyn_put(self, ids, state, u):
        """The producer warp puts unit ``u`` in the ring. Returns the state."""
        ring, words, _ = ids
        ring.producer_acquire(state)
        words[state.index] = u
        ring.producer_commit(state)
        state.advance()
        return state

    @cute.jit
    def _dyn_take(self, ids, state):
        """A reader's next unit (-1: the end). Returns (unit, state)."""
        ring, words, _ = ids
        ring.consumer_wait(state)
        u = words[state.index]
        ring.consumer_release(state)
        state.advance()
        return u, state

    @cute.jit
    def _dyn_send(self, ids, mstate, u):
        """The leader's producer warp sends unit ``u`` to the other CTA's mailbox. Returns
        the mailbox state."""
        full, empty, words = ids[2]
        cute.arch.mbarrier_wait(empty + mstate.index, mstate.phase)
        if cute.arch.lane_idx() == Int32(0):
            ptx.st_async_peer_u32((words + mstate.index).toint(), u,
                                  (full + mstate.index).toint(), Int32(1))
        mstate.advance()
        return mstate

    @cute.jit
    def _dyn_receive(self, ids, mstate):
        """The other CTA's producer warp: the leader's next unit. Returns (unit, state)."""
        full, empty, words = ids[2]
        first = cute.arch.lane_idx() == Int32(0)
        if first:
            cute.arch.mbarrier_arrive_and_expect_tx(full + mstate.index, 4)
        cute.arch.mbarrier_wait(full + mstate.index, mstate.phase)
        u = cute.make_tensor(words, cute.make_layout(ID_SLOTS))[mstate.index]
        # the leader sends nothing after the end: no hand-back to a CTA that may have exited
        if first & (u >= Int32(0)):
            cute.arch.mbarrier_arrive(empty + mstate.index, peer_cta_rank_in_cluster=Int32(0))
        mstate.advance()
        return u, mstate

    @cute.jit
    def _dyn_next(self, ids, mstate, lead, pos, num_tiles, tiles_m, tiles_n, lag):
        """The producer warp's next unit: the one at ``pos`` (the leader's, sent on to the
        other CTA), or the leader's (the other CTA). Returns (unit, mailbox state)."""
        u = Int32(-1)
        if cutlass.const_expr(self.cta_group == 1):
            u = self._dyn_unit(pos, num_tiles, tiles_m, tiles_n, lag)
        else:
            if lead:
                u = self._dyn_unit(pos, num_tiles, tiles_m, tiles_n, lag)
                mstate = self._dyn_send(ids, mstate, u)
            else:
                u, mstate = self._dyn_receive(ids, mstate)
        return u, mstate

    @cute.jit
    def _dyn_producer(self, loads, prod, ids, ws, lane, v_in_pair, num_ctas, num_tiles,
                      tiles_m, tiles_n, lag, k_tiles):
        """The producer warp of lane ``lane`` (CTA ``v_in_pair`` of its cluster): fetch (the
        cluster's first CTA) or receive, announce and load each unit. Returns the mainloop
        pipeline state."""
        lanes = num_ctas // Int32(self.cta_group)
        lead = v_in_pair == Int32(0)
        first = cute.arch.lane_idx() == Int32(0)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, ID_SLOTS)
        # the mailbox: the leader writes (a producer's phases), the other CTA reads
        mstate = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, ID_SLOTS)
        if cutlass.const_expr(self.cta_group == 2):
            if not lead:
                mstate = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                      ID_SLOTS)
        u, mstate = self._dyn_next(ids, mstate, lead, lane, num_tiles, tiles_m, tiles_n, lag)
        state = self._dyn_put(ids, state, u)
        j = Int32(0)
        while u >= Int32(0):
            got = Int32(0)
            if lead & (j > Int32(0)) & first:  # issued now, read after this unit's loads
                got = ptx.atom_add_relaxed_gpu(ws + Int64(layout.CTRL_TILE_NEXT), Int32(1))
            prod = self._load_unit(loads, u, Int32(0), k_tiles, prod)
            pos = lane + lanes
            if j > Int32(0):
                pos = cute.arch.shuffle_sync(got, 0) + Int32(2) * lanes
            u, mstate = self._dyn_next(ids, mstate, lead, pos, num_tiles, tiles_m, tiles_n,
                                       lag)
            state = self._dyn_put(ids, state, u)
            j = j + Int32(1)
        if lead & first:
            # acq_rel: this lane's fetches are performed before its count, and the lane
            # that completes the count zeroes the counter after every fetch
            done = ptx.atom_add_acq_rel_gpu(ws + Int64(layout.CTRL_TILE_DONE), Int32(1))
            if done == lanes - Int32(1):
                ptx.st_relaxed_gpu(ws + Int64(layout.CTRL_TILE_NEXT), Int32(0))
                ptx.st_relaxed_gpu(ws + Int64(layout.CTRL_TILE_DONE), Int32(0))
        return prod

    @cute.jit
    def _store_dyn(self, st, ids, v_in_pair, tiles_m, epi_state, rel_state):
        """The store warp's loop over the units the ring announces (a pair's padding tile
        is not stored)."""
        tiles_n = st.tiles_n
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, ID_SLOTS)
        u, state = self._dyn_take(ids, state)
        while u >= Int32(0):
            tm, tn, real = self._unit_tile(u, v_in_pair, tiles_m, tiles_n)
            if real:
                epi_state, rel_state = self._store_tile(st, tm * tiles_n + tn, epi_state,
                                                        rel_state)
            u, state = self._dyn_take(ids, state)

    @cute.jit
    def _pingpong_dyn(self, grp, v_in_pair, tiles_m, tiles_n, main_turn, epi_turn, ctx, ids,
                      read_state, rel_state, epi_state):
        """Both MMA warp groups over the units the ring announces, the i-th unit group
        ``i % 2``'s (``_pingpong_role``'s turns). Every group reads every unit; the group
        of unit i reads unit i + 1 before it passes a turn, and passes it only if there is
        one, so no turn is left open at the end."""
        ab_pipe = ctx.ab_pipe
        k_tiles = ctx.k_tiles
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, ID_SLOTS)
        u, state = self._dyn_take(ids, state)
        i = Int32(0)
        while u >= Int32(0):
            mine = (i - (i // Int32(2)) * Int32(2)) == grp
            _, _, real = self._unit_tile(u, v_in_pair, tiles_m, tiles_n)
            nxt = Int32(-1)
            if mine:
                if i > Int32(0):
                    self._turn_wait(main_turn, grp)
                read_state, rel_state = self._pp_mainloop(ctx, read_state, rel_state)
                nxt, state = self._dyn_take(ids, state)
                if nxt >= Int32(0):
                    self._turn_pass(main_turn, grp)
                cute.nvgpu.warpgroup.wait_group(0)
                ab_pipe.consumer_release(rel_state)
                rel_state.advance()
                if i > Int32(0):
                    self._turn_wait(epi_turn, grp)
                if real:
                    epi_state = self._pp_epilogue(ctx, epi_state)
                if nxt >= Int32(0):
                    self._turn_pass(epi_turn, grp)
            else:
                nxt, state = self._dyn_take(ids, state)
                read_state.advance(k_tiles)
                rel_state.advance(k_tiles)
                if real:
                    epi_state.advance(Int32(self.num_sub))
            u = nxt
            i = i + Int32(1)

    @cute.jit
    def _mma_dyn(self, c, ids, read_state, rel_state, epi_state, tiles_done):
        """The cooperative MMA warp groups over the units the ring announces."""
        k_tiles = c.k_tiles
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, ID_SLOTS)
        u, state = self._dyn_take(ids, state)
        while u >= Int32(0):
            read_state, rel_state, epi_state, tiles_done = self._mma_unit(
                c, u, Int32(0), k_tiles, read_state, rel_state, epi_state, tiles_done)
            u, state = self._dyn_take(ids, state)
