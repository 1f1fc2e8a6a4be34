from rsar_core import heuristics


def test_nearest_measured_point_decides():
    assert heuristics.expected_speedup("rs", 128, 1024) == 1.96
    assert heuristics.expected_speedup("ar", 8000, 4000) == 1.07
    assert heuristics.fused_wins("rs", 3000, 7168, 2048, 2)


def test_threshold(monkeypatch):
    monkeypatch.setattr(heuristics, "MIN_SPEEDUP", 1.5)
    assert heuristics.fused_wins("rs", 128, 7168, 1024, 2)
    assert not heuristics.fused_wins("rs", 8192, 7168, 4096, 2)
