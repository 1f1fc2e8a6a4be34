"""benchmarks/heuristics_table.py: help, missing files, and the table it prints from bench rows."""
import json

from script_runs import run_script as _run_script


def run_script(*args: str):
    return _run_script(*args, folder="benchmarks")


def _row(M, K, N, rs, ar):
    return {"M": M, "K": K, "N": N, "ratios": {"rs_speedup": rs, "ar_speedup": ar}}


def test_help_and_missing_files():
    r = run_script("heuristics_table.py", "--help")
    assert r.returncode == 0 and "--newer" in r.stdout
    assert run_script("heuristics_table.py").returncode == 2
    r = run_script("heuristics_table.py", "nofile.json")
    assert r.returncode == 1 and "no such file: nofile.json" in r.stderr


def test_lowest_speedup_over_N_and_newer_groups_replace(tmp_path):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps([_row(128, 1024, 7168, 1.509, 1.7), _row(128, 1024, 8192, 1.3, 1.9),
                               _row(256, 1024, 7168, 0.95, 1.2)]))
    new.write_text(json.dumps([_row(256, 1024, 7168, 1.104, 1.25)]))
    r = run_script("heuristics_table.py", str(old), "--newer", str(new))
    assert r.returncode == 0, r.stderr
    assert "(128, 1024): (1.3, 1.7)" in r.stdout  # the lower N of each, rounded down
    assert "(256, 1024): (1.1, 1.25)" in r.stdout  # the newer measurement wins
