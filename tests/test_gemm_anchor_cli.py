"""benchmarks/gemm_anchor.py refuses bad arguments before it touches MPI or a GPU."""
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gemm_anchor.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60)


def test_missing_example_file_is_named():
    r = _run("--example", "/nonexistent/dense_gemm_persistent.py")
    assert r.returncode == 2 and "no such file" in r.stderr


def test_shapes_must_be_triples():
    r = _run("--shapes", "128,7168")
    assert r.returncode == 2 and "M,N,K triples" in r.stderr
    r = _run("--shapes", "128,7168,0")
    assert r.returncode == 2 and "M,N,K triples" in r.stderr
