"""The issue's grid runs the plans in tests/grid_plans.json by default. A rule that moves a grid
shape fails here, naming the shapes: re-measure them (docs/PERF.md says which plans each
grid of record ran), then refresh the snapshot with
``python3 benchmarks/grid_plans.py --write tests/grid_plans.json --reason TEXT`` (each entry
that moved carries its ``reason``)."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_grid_plans_match_the_snapshot():
    spec = importlib.util.spec_from_file_location("grid_plans", ROOT / "benchmarks" / "grid_plans.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    want = {k: {f: x for f, x in v.items() if f != "reason"}
            for k, v in json.loads((ROOT / "tests" / "grid_plans.json").read_text()).items()}
    got = mod.grid_plans()
    assert set(got) == set(want)
    moved = {k: (want[k], got[k]) for k in got if got[k] != want[k]}
    assert not moved, "grid plans moved (snapshot, now): " + "; ".join(
        f"{k}: " + ", ".join(f"{f} {want[k][f]} -> {got[k][f]}" for f in got[k]
                             if got[k][f] != want[k].get(f))
        for k in list(moved)[:8])
