"""benchmarks/width_costs.py on synthetic sweep rows (no GPU): a GEMM whose time is rounds x
width x a known cost per column gives that cost back, and the pick follows it."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("cutlass")  # column_plan resolves kernels' variants

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("width_costs", ROOT / "benchmarks" / "width_costs.py")
wc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wc)

COST = {256: 1.0, 224: 1.03, 208: 1.05, 176: 1.09, 128: 1.2}


def _rows() -> list[dict]:
    from gemm_one_gpu import column_plan
    rows = []
    for M, N, K in ((2048, 7168, 1024), (512, 7168, 4096), (4096, 8192, 9216)):
        us = {"mm": 100.0, "default": 110.0}
        for cg in (1, 2):
            for w, c in COST.items():
                plan = column_plan(f"c{cg}+bn{w}", M, N, K)[0]
                us[f"c{cg}+bn{w}"] = plan.rounds * plan.bn * c * K / 1e4
        rows.append(dict(M=M, N=N, K=K, us=us))
    return rows


def test_costs_come_back(tmp_path, capsys):
    rows = _rows()
    fit = wc.fitted(wc.per_column(rows))
    assert fit == pytest.approx(COST)
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(rows))
    assert wc.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "fitted TILE_COST: {256: 1.00, 224: 1.03, 208: 1.05, 176: 1.09, 128: 1.20}" in out
    # 2048 x 7168 x 1024: 224 wide fills 4 rounds (512 tiles); 176 wide 5 rounds of 656
    assert "| 2048 | 7168 | 1024 | 100.0 | 0.909 |" in out
