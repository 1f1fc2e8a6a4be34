import pytest

from rsar_core import heuristics


def test_measured_points_and_interpolation_between_them():
    table = heuristics.MEASURED_2X_H200
    for (m, k), (rs, ar) in table.items():
        assert heuristics.expected_speedup("rs", m, k) == pytest.approx(rs)
        assert heuristics.expected_speedup("ar", m, k) == pytest.approx(ar)
    # between measured points: the lowest of the points around it, not an interpolation
    # (the fused op's time steps with tile rows: 576 x 4096 measured far below 512 and 640)
    assert heuristics.expected_speedup("rs", 544, 4096) == min(table[(512, 4096)][0],
                                                               table[(576, 4096)][0])
    corners = [table[(m, k)][1] for m in (2560, 3072) for k in (2048, 4096)]
    assert heuristics.expected_speedup("ar", 3000, 3000) == min(corners)
    # outside the measured range: clamped to the edge
    assert heuristics.expected_speedup("ar", 64, 512) == pytest.approx(table[(128, 1024)][1])
    assert heuristics.expected_speedup("rs", 10 ** 6, 10 ** 5) == pytest.approx(table[(16384, 9216)][0])
    assert heuristics.fused_wins("rs", 3000, 7168, 1024, 2)
    # long K at large M runs fused since its plans pair tile rows (choose_fused_cluster), up
    # to where RS's lowest measured speedup nears the noise (16384 x 9216: 1.04, (n))
    assert heuristics.fused_wins("rs", 8192, 7168, 9216, 2)
    edge = table[(16384, 9216)][0] > heuristics.MIN_SPEEDUP
    assert heuristics.fused_wins("rs", 16384, 7168, 9216, 2) == edge
    # AR beat the unfused path at every measured shape (2026-11-30 (i))
    assert heuristics.fused_wins("ar", 16384, 8192, 9216, 2)
    # small M runs fused now that its plans fill the SMs (choose_small_m)
    assert heuristics.fused_wins("rs", 128, 7168, 4096, 2)


def test_threshold(monkeypatch):
    monkeypatch.setattr(heuristics, "MIN_SPEEDUP", 1.5)
    assert heuristics.fused_wins("rs", 8192, 7168, 1024, 2)
    assert not heuristics.fused_wins("rs", 8192, 7168, 4096, 2)


def test_every_entry_that_runs_fused_won_beyond_noise():
    for (m, k), (rs, ar) in heuristics.MEASURED_2X_H200.items():
        assert heuristics.fused_wins("rs", m, 7168, k, 2) == (rs > 1.03)
        assert heuristics.fused_wins("ar", m, 7168, k, 2) == (ar > 1.03)


def test_a_measured_tie_stays_unfused(monkeypatch):
    """A point within the noise of the unfused path (RS with long K at M=256-512 measured
    1.02-1.04x before the stamps were fenced once, 2026-11-30 (g)) stays unfused."""
    table = dict(heuristics.MEASURED_2X_H200)
    table[(512, 9216)] = (1.02, 1.2)
    monkeypatch.setattr(heuristics, "MEASURED_2X_H200", table)
    assert not heuristics.fused_wins("rs", 512, 7168, 9216, 2)
    assert heuristics.fused_wins("ar", 512, 7168, 9216, 2)


def test_off_grid_m_where_the_fused_op_lost_runs_unfused():
    """Shapes between the grid's powers of two that measured below the unfused path (PERF.md
    (p)) stay unfused, and so does anything between them and a winning neighbour."""
    table = heuristics.MEASURED_2X_H200
    assert table[(576, 4096)][0] < 1.0 and not heuristics.fused_wins("rs", 576, 7168, 4096, 2)
    assert not heuristics.fused_wins("rs", 530, 7168, 4096, 2)  # 5 tile rows, like 576
    assert not heuristics.fused_wins("rs", 320, 7168, 9216, 2)
    assert heuristics.fused_wins("rs", 512, 7168, 4096, 2)
    for (m, k), (rs, ar) in table.items():
        for mode, v in (("rs", rs), ("ar", ar)):
            if v < 1.0:
                assert not heuristics.fused_wins(mode, m, 8192, k, 2), (mode, m, k)


def test_the_table_covers_every_m_at_every_k():
    """``expected_speedup`` looks up neighbours on both axes: a hole would raise KeyError."""
    table = heuristics.MEASURED_2X_H200
    ms = sorted({m for m, _ in table})
    ks = sorted({k for _, k in table})
    assert [(m, k) for m in ms for k in ks if (m, k) not in table] == []
    for M in range(1, 20000, 37):
        for K in (1, 1500, 3000, 5000, 20000):
            heuristics.expected_speedup("rs", M, K)


def test_remembered_answers_follow_the_table_and_threshold(monkeypatch):
    assert heuristics.fused_wins("rs", 16384, 7168, 1024, 2)
    assert heuristics.fused_wins("rs", 16384, 7168, 1024, 2)  # remembered
    monkeypatch.setattr(heuristics, "MIN_SPEEDUP", 10.0)
    assert not heuristics.fused_wins("rs", 16384, 7168, 1024, 2)
    monkeypatch.setattr(heuristics, "MIN_SPEEDUP", 1.03)
    table = {k: (0.5, 0.5) for k in heuristics.MEASURED_2X_H200}
    monkeypatch.setattr(heuristics, "MEASURED_2X_H200", table)
    assert not heuristics.fused_wins("rs", 16384, 7168, 1024, 2)
    monkeypatch.undo()
    assert heuristics.fused_wins("rs", 16384, 7168, 1024, 2)
