"""x's boxes on the last tile row (``launch.sm90_kernel.x_box_views``), dividing the tile or
not (48 / 80 / 96 / 112): every sampled element of the box's views is the whole tile's, in
shared memory (each stage, swizzled as the MMA reads it) and in global coordinates (the tile
row the TMA loads), on 64- and 128-row tiles. Layout algebra only: traced on the CPU,
nothing launched."""
from __future__ import annotations

import pytest

from launch.geometry import X_ROWS


@pytest.mark.parametrize("bm,x_rows", [(bm, r) for bm in (64, 128) for r in X_ROWS
                                       if r < bm])
def test_box_views_are_the_tiles_first_rows(bm, x_rows):
    pytest.importorskip("cutlass")
    import x_box_views_probe as probe
    probe.MISMATCHES.clear()
    probe.probe(bm, x_rows, 3)
    assert probe.MISMATCHES == []
