"""benchmarks/ncu_metrics_table.py on canned ``ncu --csv --metrics`` logs (no GPU)."""
from __future__ import annotations

import csv
import importlib.util
import io
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "ncu_metrics_table",
    Path(__file__).resolve().parents[1] / "benchmarks" / "ncu_metrics_table.py")
nm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nm)

HEAD = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
        "Block Size", "Grid Size", "Device", "CC", "Section Name", "Metric Name",
        "Metric Unit", "Metric Value"]
HW = "lrc__request_sectors_op_read_coalescing_achieved_type_hardware.sum"
T = "gpu__time_duration.sum"


def _log(path: Path, launches: list[tuple[str, dict[str, str]]]) -> Path:
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL)
    w.writerow(HEAD)
    for i, (kernel, metrics) in enumerate(launches):
        for name, value in metrics.items():
            w.writerow([i, 1, "python3", "h", kernel, 1, 7, "(384, 1, 1)", "(132, 1, 1)", 0,
                        "9.0", "Command line profiler metrics", name, "", value])
    # the program's own lines and ncu's notes around the CSV
    path.write_text("==PROF== Connected\n2048 x 7168 x 1024: mm 40.0 us\n" + buf.getvalue()
                    + "==PROF== Disconnected\n")
    return path


def test_medians_per_kernel_skip_other_kernels(tmp_path):
    log = _log(tmp_path / "lrc_2048_7168_1024_default.log", [
        ("sm90_xmma_gemm_f64f64_f64f64_f64_tn_n", {T: "500,224", HW: "1"}),  # the check's f64
        ("nvjet_sm90_tst_176x128_64x5_1x2_h_bz_TNN", {T: "39,744", HW: "2,514,000"}),
        ("kernel_cutlass_kernel_launchsm90_kernelSm90FusedKernel_object", {T: "42,752", HW: "1,285,000"}),
        ("nvjet_sm90_tst_176x128_64x5_1x2_h_bz_TNN", {T: "39,968", HW: "2,583,000"}),
        ("kernel_cutlass_kernel_launchsm90_kernelSm90FusedKernel_object", {T: "43,104", HW: "n/a"}),
        ("nvjet_sm90_tst_176x128_64x5_1x2_h_bz_TNN", {T: "40,100", HW: "2,600,000"}),
    ])
    m = nm.medians(log)
    assert set(m) == {"cuBLAS", "ours"}
    assert m["cuBLAS"][T] == 39968 and m["cuBLAS"][HW] == 2583000 and m["cuBLAS"]["launches"] == 3
    # a counter ncu reports as n/a is left out of that launch's median, not read as zero
    assert m["ours"][T] == (42752 + 43104) / 2 and m["ours"][HW] == 1285000


def test_table_scales_known_metrics(tmp_path, capsys):
    log = _log(tmp_path / "a.log", [
        ("nvjet_x", {T: "40,000", HW: "2,500,000"}),
        ("Sm90FusedKernel_y", {T: "43,000", HW: "1,250,000"})])
    empty = _log(tmp_path / "b.log", [("other_kernel", {T: "1"})])
    assert nm.main([str(log), str(empty), "--metric", T, "--metric", HW]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split()[-4:] == ["us", "merged", "hw", "M"]
    cub = next(ln for ln in lines if "cuBLAS" in ln).split()
    ours = next(ln for ln in lines if "ours" in ln).split()
    assert cub[-2:] == ["40.000", "2.500"] and ours[-2:] == ["43.000", "1.250"]
    assert "b" in err and "no launch" in err


def test_not_a_metrics_log(tmp_path):
    bad = tmp_path / "bad.log"
    bad.write_text('"Kernel Name","Value"\n"k","1"\n')
    with pytest.raises(ValueError, match="ID"):
        nm.medians(bad)
