"""scripts/demo.py where it cannot run: one plain sentence and exit status 2, no traceback.

On this (GPU-less) machine the script is started by hand, without mpirun; where an
mpiexec is at hand, also as 2 ranks (the sentence then comes from rank 0 alone). The
reasons for the other hosts it refuses (one GPU, one rank, more ranks than GPUs, a GPU
without a kernel) are checked on the pure function that words them.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from mpirun import find_mpiexec, mpi_available, mpiexec_flags
from script_runs import REPO, load_script, plain_env as _plain_env, torch_sees_gpu

SCRIPT = REPO / "scripts" / "demo.py"

demo = load_script("demo.py", "rsar_demo")
needs_no_gpu = pytest.mark.skipif(torch_sees_gpu(), reason="this host has a CUDA GPU")

NO_GPU = ("rsar demo: no CUDA GPU on this host; the fused op needs 2+ NVLink-connected GPUs "
          "(run scripts/mc_diag.py for details)")


@needs_no_gpu
def test_no_gpu_plain_sentence_and_exit_2():
    p = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                       env=_plain_env(), timeout=120, cwd=str(REPO), stdin=subprocess.DEVNULL)
    assert p.returncode == demo.EXIT_CANNOT_RUN == 2, p.stdout + p.stderr
    assert p.stdout.strip() == NO_GPU
    assert "Traceback" not in p.stdout + p.stderr


@needs_no_gpu
@pytest.mark.mpi
def test_no_gpu_under_mpiexec_one_sentence():
    ok, why = mpi_available()
    if not ok:
        pytest.skip(why)
    mpiexec = find_mpiexec()
    assert mpiexec
    p = subprocess.run([mpiexec, *mpiexec_flags(mpiexec), "-n", "2", sys.executable,
                        str(SCRIPT)], capture_output=True, text=True, env=_plain_env(),
                       timeout=120, cwd=str(REPO), stdin=subprocess.DEVNULL)
    assert p.returncode != 0, p.stdout + p.stderr
    assert p.stdout.count("rsar demo:") == 1 and NO_GPU in p.stdout, p.stdout + p.stderr
    assert "Traceback" not in p.stdout + p.stderr


@pytest.mark.parametrize("cuda, count, world, cap, expect", [
    (False, 0, 1, None, "no CUDA GPU on this host"),
    (False, 0, 2, None, "no CUDA GPU on this host"),
    (True, 0, 2, None, "no CUDA GPU on this host"),
    (True, 1, 2, (9, 0), "only 1 CUDA GPU on this host"),
    (True, 2, 1, (9, 0), "started as a single process"),
    (True, 2, 4, (9, 0), "4 ranks but only 2 CUDA GPUs"),
    (True, 8, 2, (8, 0), "no rsar kernel for this GPU yet"),
    (True, 8, 2, (12, 0), "compute capability 12.0"),
])
def test_cannot_run_reasons(cuda, count, world, cap, expect):
    why = demo.cannot_run_reason(cuda, count, world, cap, "Some GPU")
    assert why is not None and expect in why
    assert why.startswith("rsar demo: ") and "\n" not in why


def test_runs_on_two_hoppers():
    assert demo.cannot_run_reason(True, 2, 2, (9, 0)) is None
    assert demo.cannot_run_reason(True, 8, 8, (9, 0)) is None


def test_report_lines_readable():
    rows = [
        {"mode": "rs", "M": 1000, "N": 7168, "K": 4096, "transport": "unicast",
         "out": (500, 7168), "err": 2.45e-3, "us": 155.0, "tflops": 379.0, "ok": True},
        {"mode": "ar", "M": 4096, "N": 7168, "K": 4096, "transport": "unicast",
         "ok": False, "error": "RsarTimeoutError: rank 0 timed out"},
    ]
    lines = demo.report_lines(0, 2, "NVIDIA H200 (device 0)", rows)
    assert lines[0] == "rank 0/2 on NVIDIA H200 (device 0)"
    assert "RS" in lines[1] and "500x7168" in lines[1] and "2.45e-03 ok" in lines[1]
    assert "155.0 us" in lines[1]
    assert "AR" in lines[2] and "FAIL" in lines[2] and "RsarTimeoutError" in lines[2]

