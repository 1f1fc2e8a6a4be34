"""benchmarks/ncu_details.py on canned Nsight Compute details exports (no GPU)."""
from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "ncu_details", Path(__file__).resolve().parents[1] / "benchmarks" / "ncu_details.py")
nd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nd)

HEAD = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
        "Block Size", "Grid Size", "Device", "CC", "Section Name", "Metric Name",
        "Metric Unit", "Metric Value", "Rule Name", "Rule Type", "Rule Description"]


def _export(path: Path, kernels: list[list[tuple]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(HEAD)
        for i, metrics in enumerate(kernels):
            for section, name, unit, value in metrics:
                w.writerow([i, 1, "python3", "h", "Sm90FusedKernel", 1, 7, "(384, 1, 1)",
                            "(132, 1, 1)", 0, "9.0", section, name, unit, value, "", "", ""])
            # a rule row: no metric
            w.writerow([i, 1, "python3", "h", "k", 1, 7, "", "", 0, "9.0", "SOL", "", "", "",
                        "SOLBottleneck", "OPT", "advice"])
    return path


def test_first_kernel_of_each_file_side_by_side(tmp_path, capsys):
    a = _export(tmp_path / "details_default.csv", [
        [("GPU Speed Of Light Throughput", "Duration", "us", "42.9"),
         ("Memory Workload Analysis", "L2 Hit Rate", "%", "91.2"),
         ("Memory Workload Analysis", "Duration", "us", "0")],  # a name again: the first stays
        [("GPU Speed Of Light Throughput", "Duration", "us", "99")]])  # a second kernel
    b = _export(tmp_path / "details_pn.csv", [
        [("GPU Speed Of Light Throughput", "Duration", "us", "47.1")]])
    assert nd.read_details(a) == {"Duration": ("42.9", "us"), "L2 Hit Rate": ("91.2", "%")}
    text = nd.table([a, b])
    assert "| metric | details_default | details_pn |" in text
    assert "| Duration (us) | 42.9 | 47.1 |" in text
    assert "| L2 Hit Rate (%) | 91.2 | - |" in text
    assert "Achieved Occupancy" not in text  # in no file
    assert nd.main([str(a), str(b), "--metric", "L2 Hit Rate"]) == 0
    out = capsys.readouterr().out
    assert "L2 Hit Rate" in out and "Duration" not in out
    assert nd.main([str(a), "--all"]) == 0
    assert "| Duration (us) | 42.9 |" in capsys.readouterr().out
