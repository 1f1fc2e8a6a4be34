from rsar_core import heuristics


def test_nearest_measured_point_decides():
    assert heuristics.expected_speedup("rs", 128, 1024) == heuristics.MEASURED_2X_H200[(128, 1024)][0]
    assert heuristics.expected_speedup("ar", 8000, 4000) == heuristics.MEASURED_2X_H200[(8192, 4096)][1]
    assert heuristics.fused_wins("rs", 3000, 7168, 1024, 2)
    # measured losses stay unfused: long K at large M, and RS at M=128 with K >= 4096
    assert not heuristics.fused_wins("rs", 16384, 7168, 9216, 2)
    assert not heuristics.fused_wins("ar", 8192, 8192, 9216, 2)
    assert not heuristics.fused_wins("rs", 128, 7168, 4096, 2)


def test_threshold(monkeypatch):
    monkeypatch.setattr(heuristics, "MIN_SPEEDUP", 1.5)
    assert heuristics.fused_wins("rs", 8192, 7168, 1024, 2)
    assert not heuristics.fused_wins("rs", 8192, 7168, 4096, 2)


def test_every_entry_that_runs_fused_won_beyond_noise():
    for (m, k), (rs, ar) in heuristics.MEASURED_2X_H200.items():
        assert heuristics.fused_wins("rs", m, 7168, k, 2) == (rs > 1.03)
        assert heuristics.fused_wins("ar", m, 7168, k, 2) == (ar > 1.03)
