"""fp8 operands' scales in the sm90 kernel's MMA warps (``Sm90FusedKernel``).

- Per-tensor and per-row scales (``row_scales``) are applied in the epilogue: a tile's BM
  row scales of x and BN column scales of w are copied into shared memory as its mainloop
  starts (``_stage_scales``), then multiply the fp32 accumulators (``_apply_scales``).
- Block-wise scales (``block_scales``, DeepSeek-V3 style: x's per row and 128-element
  k-group, w's per 128 x 128 block) are applied per k-group: each k-group's wgmmas go into a
  product set (``_issue_group`` / ``_retire_group``) that is added to the sums times its two
  scales (``_group_scales``, ``_promote``); ``_block_strides`` decodes their layouts.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute

from . import ptx
from .geometry import BM

Int32 = cutlass.Int32
Int64 = cutlass.Int64


class Fp8Scales:
    """Mixin of ``Sm90FusedKernel``. Reads the kernel's ``bn``."""

    @cute.jit
    def _stage_scales(self, mtid, tm, tn, M, N, sx_addr, sw_addr, scale_bits, sS_ptr):
        """fp8: the tile's BM row scales of x and BN column scales of w copied into shared
        memory as its mainloop starts, one asynchronous 4-byte copy per MMA thread and
        operand, so the epilogue reads them there instead of waiting on L2 with the tensor
        pipes idle (the loads of a fragment's 2 + BN / 4 distinct scales did: docs/PERF.md
        (ac)). A scale of one value (bit 0 / 1 of ``scale_bits`` clear) is copied to every
        entry; rows past M and columns past N (a partial tile) take the last row's and
        column's scale: their products are never stored. The previous unit's epilogue ended
        on a barrier after its reads, so the buffer is free."""
        base = sS_ptr.toint()
        if mtid < Int32(self.bm):
            r = cutlass.min(tm * Int32(self.bm) + mtid, M - Int32(1)) * (scale_bits & Int32(1))
            ptx.cp_async_4(base + mtid * Int32(4), sx_addr + Int64(r) * Int64(4))
        if mtid < Int32(self.bn):
            c = (cutlass.min(tn * Int32(self.bn) + mtid, N - Int32(1))
                 * ((scale_bits >> Int32(1)) & Int32(1)))
            ptx.cp_async_4(base + (Int32(self.bm) + mtid) * Int32(4), sw_addr + Int64(c) * Int64(4))
        cute.arch.cp_async_commit_group()

    @cute.jit
    def _apply_scales(self, acc, tCcC, sS_ptr):
        """fp8 operands: each accumulator times its row's x scale and its column's w scale,
        from the shared buffer ``_stage_scales`` filled (rows first, then columns)."""
        ss = cute.make_tensor(sS_ptr, cute.make_layout(self.bm + self.bn))
        # unrolled in groups of 8 (one loop of up to 128 steps draws the DSL's warning); the
        # compiler keeps one load per distinct row and column of the fragment
        for g in cutlass.range_constexpr(cute.size(acc) // 8):
            for j in cutlass.range_constexpr(8):
                r, c = tCcC[8 * g + j]
                acc[8 * g + j] = acc[8 * g + j] * (ss[r] * ss[self.bm + c])

    def _issue_group(self, mm, read_state, dst) -> None:
        """One k-group's wgmmas into ``dst`` once its stage has landed (block-wise fp8),
        committed as one group: the first overwrites the products, the rest add to them.
        ``mm``: (pipeline, the two MMAs, A and B fragments, k-blocks a stage). Emitted at
        trace time; the caller advances ``read_state``."""
        ab_pipe, mma_z, mma_a, tCrA, tCrB, num_k_blocks = mm
        ab_pipe.consumer_wait(read_state)
        cute.nvgpu.warpgroup.fence()
        for kb in range(num_k_blocks):
            cute.gemm(mma_z if kb == 0 else mma_a, dst, tCrA[(None, None, kb, read_state.index)],
                      tCrB[(None, None, kb, read_state.index)], dst)
        cute.nvgpu.warpgroup.commit_group()

    def _retire_group(self, ab_pipe, rel_state, in_flight: int) -> None:
        """Waits until at most ``in_flight`` wgmma groups are pending, then gives the oldest
        k-group's stage back to the producer; the caller advances ``rel_state``."""
        cute.nvgpu.warpgroup.wait_group(in_flight)
        ab_pipe.consumer_release(rel_state)

    def _group_scales(self, sc, g):
        """Block-wise fp8: (x's scale of this thread's first row, of its second, w's block
        scale) for k-group ``g``, three read-only loads. ``sc``: (x row 0 and row 1 and w
        block addresses, byte strides per k-group of x and of w)."""
        xa0, xa1, wa, xs_k, ws_k = sc
        k = Int64(g)
        return (ptx.ld_f32_nc(xa0 + k * xs_k), ptx.ld_f32_nc(xa1 + k * xs_k),
                ptx.ld_f32_nc(wa + k * ws_k))

    def _promote(self, acc, part, p0, p1) -> None:
        """``acc[i] += part[i] * scale`` (block-wise fp8): a fragment's values run (row, c),
        (row, c+1), (row+8, c), (row+8, c+1), ..., so value i takes row scale ``p0`` or ``p1``
        (x's scale of that row times w's block scale) as i // 2 is even or odd. Emitted
        unrolled at trace time (no staged loop: it reads and writes only registers)."""
        for i in range(cute.size(part)):
            acc[i] = acc[i] + part[i] * (p0 if (i // 2) % 2 == 0 else p1)

    @cute.jit
    def _block_strides(self, scale_bits, N, kb):
        """Byte strides of block-wise scales, (x per row, x per k-group, w per block row,
        w per k-group), from ``scale_bits`` (``rsar_core.validate.check_scales``): bit 3 set,
        x's are M-major (torch's layout), else row-major, their other stride in bits 8-31;
        bit 4 set, w's (ceil(N / 128), ``kb``) are column-major, else row-major (``kb``: the
        k-groups, K / 128, one per fp8 k-block)."""
        big = scale_bits >> Int32(8)
        x_mmajor = (scale_bits >> Int32(3)) & Int32(1)
        xs_row = big + x_mmajor * (Int32(1) - big)
        xs_k = Int32(1) + x_mmajor * (big - Int32(1))
        nb = (N + Int32(127)) // Int32(128)
        w_col = (scale_bits >> Int32(4)) & Int32(1)
        ws_blk = kb + w_col * (Int32(1) - kb)
        ws_k = Int32(1) + w_col * (nb - Int32(1))
        return (Int64(xs_row) * Int64(4), Int64(xs_k) * Int64(4), Int64(ws_blk) * Int64(4),
                Int64(ws_k) * Int64(4))
