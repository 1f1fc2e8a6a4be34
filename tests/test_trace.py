"""The event-time trace (launch.trace): compiled only into trace variants, decoded per CTA."""
from __future__ import annotations

import struct

import pytest

from launch import layout, trace


def test_events_fit_and_have_unique_slots():
    assert len(trace.NAMES) == len(set(trace.NAMES)) <= layout.TRACE_EVENTS
    assert max(trace.NAMES) < trace.TILE_DONE  # the per-tile slots follow the events
    assert trace.TILE_DONE + trace.TILE_SLOTS == layout.TRACE_EVENTS and trace.TILE_SLOTS >= 15
    # the region sits between CTRL's words and the first stamp array
    assert layout.TRACE_OFF >= layout.CTRL_DONE + 4 * layout.MAX_WORLD
    assert layout.CTRL_STARTED >= layout.CTRL_DONE + 4 * layout.MAX_WORLD
    assert layout.TRACE_OFF >= layout.CTRL_STARTED + 8 * layout.MAX_WORLD
    assert layout.CTRL_STARTED % 8 == 0  # 8-byte (stamp, shape) pairs
    lay = layout.WorkspaceLayout.build(256, 1024, 2)
    assert lay.arrive_off >= layout.TRACE_OFF + layout.TRACE_BYTES


def test_decode_is_relative_to_the_first_start_and_skips_unreached_events():
    n = 3
    vals = [0] * (layout.TRACE_CTAS * layout.TRACE_EVENTS)
    for c, t0 in enumerate([1_000_500, 1_000_000, 1_002_000]):
        vals[c * layout.TRACE_EVENTS + trace.START] = t0
        vals[c * layout.TRACE_EVENTS + trace.EXIT] = t0 + 9_000
    vals[1 * layout.TRACE_EVENTS + trace.DEFER_DONE] = 1_004_000
    vals[2 * layout.TRACE_EVENTS + trace.TILE_DONE + 1] = 1_007_000
    ev = trace.decode(struct.pack(f"<{len(vals)}Q", *vals), n)
    assert ev["start"] == [500, 0, 2000]
    assert ev["exit"] == [9500, 9000, 11000]
    assert ev["defer_done"] == [None, 4000, None]
    assert ev["tile_done_1"] == [None, None, 7000] and ev["tile_done_0"] == [None] * n
    tiles = {f"tile_done_{i}" for i in range(trace.TILE_SLOTS)}
    assert set(ev) == set(trace.NAMES.values()) | tiles


def test_only_trace_variants_write_times(ptx_of):
    pytest.importorskip("cutlass")
    from launch.variant import Variant
    store = "st.relaxed.gpu.global.u64"
    plain = ptx_of(Variant("sm_90a", 128, 2, "rs", "unicast", push="tma"))
    traced = ptx_of(Variant("sm_90a", 128, 2, "rs", "unicast", push="tma", trace=1))
    assert store not in plain
    assert traced.count(store) >= 12 and "%globaltimer" in traced
