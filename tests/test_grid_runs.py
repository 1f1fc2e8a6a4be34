"""benchmarks/grid_runs.py on canned gemm_one_gpu.py rows (no GPU)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "grid_runs", Path(__file__).resolve().parents[1] / "benchmarks" / "grid_runs.py")
gr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gr)


def _row(M, mm, ours, blocks=None):
    r = {"M": M, "N": 7168, "K": 1024, "us": {"mm": mm, "default": ours}}
    if blocks is not None:
        r["block_ratios"] = {"default": blocks}
    return r


RUN1 = [_row(128, 9.0, 10.0, [0.90, 0.92]), _row(256, 9.5, 10.0, [0.94, 0.98]),
        _row(512, 11.0, 10.0)]
RUN2 = [_row(128, 9.2, 10.0, [0.91, 0.93]), _row(256, 9.6, 10.0, [0.95, 0.97]),
        _row(512, 10.6, 10.0), {"M": 1024, "N": 7168, "K": 1024,
                                "us": {"mm": None, "default": 10.0}}]  # anchor n/a


def test_every_run_and_reading_is_read_per_shape():
    got = gr.ratios([RUN1, RUN2], "default")
    assert sorted(got) == [(128, 7168, 1024), (256, 7168, 1024), (512, 7168, 1024)]
    assert got[(128, 7168, 1024)]["runs"] == pytest.approx([0.90, 0.92])
    # block ratios where a row has them, the run's ratio where it has none
    assert got[(128, 7168, 1024)]["readings"] == [0.90, 0.92, 0.91, 0.93]
    assert got[(512, 7168, 1024)]["readings"] == pytest.approx([1.1, 1.06])


def test_a_shape_is_below_the_floor_in_every_reading_or_within_the_noise():
    text = gr.report([RUN1, RUN2])
    assert "| 128 | 7168 | 1024 | 0.900 | 0.920 | 0.910 | 0.900-0.930 |" in text
    assert "- run 1: geomean 0.980x over 3 shapes, 2 below 0.97" in text
    # 256: its median (0.955) is below 0.97 but one block read 0.98: within the noise
    assert "2 shapes below 0.97 by their median" in text
    assert "below 0.97 in every reading: 1: 128x7168x1024" in text
    assert "short of 1.02x" in text
    assert "meets 0.97x" in gr.report([RUN1, RUN2], goal=0.97)
    assert gr.report([RUN1], column="c1") == "c1: no shape timed with its anchor"


def test_cli(tmp_path, capsys):
    paths = []
    for i, run in enumerate((RUN1, RUN2)):
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text(json.dumps(run))
    assert gr.main([str(p) for p in paths] + ["--floor", "0.95"]) == 0
    out = capsys.readouterr().out
    assert "torch.mm / default, 2 runs" in out and "below 0.95 in every reading: 1" in out
