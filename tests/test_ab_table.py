"""benchmarks/ab_table.py on canned gemm_one_gpu.py rows (no GPU)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "ab_table", Path(__file__).resolve().parents[1] / "benchmarks" / "ab_table.py")
ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab)


def _row(M, mm, default, **cols):
    return {"M": M, "N": 2880, "K": 1024, "us": {"mm": mm, "default": default, **cols}}


SEED1 = [_row(256, 9.0, 10.0, c4=8.0, c2=11.0), _row(512, 10.0, 10.0, c4=12.5)]
SEED2 = [_row(256, 9.2, 10.0, c4=9.0, c2=9.5), _row(512, 10.0, 11.0, c4=10.0),
         {"M": 128, "N": 2880, "K": 1024, "us": {"mm": 8.0, "c4": 7.0}}]  # no base there


def test_gains_are_against_the_base_of_the_same_run():
    cols, rows = ab.table([SEED1, SEED2], "default")
    assert cols == ["c4", "c2"]
    assert set(rows) == {(256, 2880, 1024), (512, 2880, 1024)}  # M=128 lacks the base
    c4 = rows[(256, 2880, 1024)]["c4"]
    assert c4["gain"] == pytest.approx([10 / 8, 10 / 9])
    assert c4["vs_mm"] == pytest.approx([9 / 8, 9.2 / 9])
    assert rows[(256, 2880, 1024)]["default"]["vs_mm"] == pytest.approx([0.9, 0.92])
    assert rows[(512, 2880, 1024)]["c4"]["gain"] == pytest.approx([0.8, 1.1])
    assert "c2" not in rows[(512, 2880, 1024)]


def test_summary_counts_only_shapes_won_or_lost_in_every_run():
    cols, rows = ab.table([SEED1, SEED2], "default")
    s = ab.summary(cols, rows)
    assert (s["c4"]["won"], s["c4"]["lost"], s["c4"]["shapes"]) == (1, 0, 2)  # 512: mixed
    assert (s["c2"]["won"], s["c2"]["lost"]) == (0, 0)  # 256: -9% then +5%
    want = (10 / 8 * 10 / 9 * 0.8 * 1.1) ** 0.25
    assert s["c4"]["geomean_gain"] == pytest.approx(want)


def test_cli_prints_the_table_and_refuses_runs_without_the_base(tmp_path, capsys):
    paths = []
    for i, run in enumerate((SEED1, SEED2)):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(run))
    assert ab.main([str(p) for p in paths] + ["--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| 256 x 2880 x 1024 | 0.900 / 0.920 | +25.0% / +11.1% | -9.1% / +5.3% |" in out
    assert "c4: geomean gain over default" in out
    assert ab.main([str(p) for p in paths] + ["--base", "nothing"]) == 1
