"""Traced on the CPU by tests/test_x_box_views.py (the DSL compiles only functions whose
source is in a file): whether ``launch.sm90_kernel.x_box_views`` picks the elements of
the whole tile that x's box of ``x_rows`` rows stands for."""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils

from launch.sm90_kernel import x_box_views

MISMATCHES: list = []


@cute.jit
def probe(bm: cutlass.Constexpr, x_rows: cutlass.Constexpr, stages: cutlass.Constexpr):
    """Appends to ``MISMATCHES`` every sampled coordinate where the box's view and the whole
    tile's disagree: the shared-memory offset (the stage as the MMA reads it) and the
    global coordinate (the tile of x the TMA loads)."""
    bk = 64
    ab = cutlass.BFloat16
    atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
        sm90_utils.get_smem_layout_atom(cutlass.tensor_utils.LayoutEnum.ROW_MAJOR, ab, bk), ab)
    s_layout = cute.tile_to_shape(atom, (bm, bk, stages), order=(0, 1, 2))
    M, K = 5 * bm, 4 * bk
    gA = cute.local_tile(cute.make_identity_tensor((M, K)), (bm, bk), (None, None))
    gX, sX = x_box_views(gA, s_layout, x_rows, bm, bk, stages)
    # trace-time loops and comparisons: every value here is static
    for m in cutlass.range_constexpr(x_rows):
        for k in (0, 1, 7, 8, 31, 63):
            for s in cutlass.range_constexpr(stages):
                box, tile = cute.crd2idx((m, k, s), sX), cute.crd2idx((m, k, s), s_layout)
                if cutlass.const_expr(box != tile):
                    MISMATCHES.append(("smem", m, k, s, box, tile))
            for tm in (0, 4):
                box, tile = gX[(m, k, tm, 3)], gA[(m, k, tm, 3)]
                if cutlass.const_expr(box != tile):
                    MISMATCHES.append(("gmem", m, k, tm, box, tile))
