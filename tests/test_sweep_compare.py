"""benchmarks/sweep_compare.py on canned bench rows (no GPU)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "sweep_compare", Path(__file__).resolve().parents[1] / "benchmarks" / "sweep_compare.py")
sc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sc)

ROWS = [
    dict(M=128, N=7168, K=1024, us={"rsar_rs": 20.0, "rs_bn64": 16.0, "rs_nopdl": 19.9}),
    dict(M=256, N=7168, K=1024, us={"rsar_rs": 24.0, "rs_bn64": 25.0}),
    dict(M=4096, N=7168, K=1024, us={"rsar_rs": 130.0}),  # the variant was not timed here
]


def test_speedups_geomean_and_wins(tmp_path, capsys):
    got = sc.compare(ROWS, "rsar_rs", ["rs_bn64", "rs_nopdl"])
    assert [round(p[4], 3) for p in got["rs_bn64"]] == [1.25, 0.96]
    assert len(got["rs_nopdl"]) == 1
    text = sc.report(ROWS, "rsar_rs", ["rs_bn64", "rs_nopdl"])
    assert "geomean 1.095" in text and "faster beyond noise at 1: 128x7168x1024" in text
    assert "rs_nopdl: geomean 1.005" in text and "faster beyond noise at 0" in text
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(ROWS))
    assert sc.main([str(path), "--vs", "rsar_rs:rs_bn64"]) == 0
    assert "| 128 | 7168 | 1024 | 20.0 | 1.250 |" in capsys.readouterr().out
