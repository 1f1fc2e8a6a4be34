"""Launch worker scripts under mpiexec from pytest and collect what each rank reported.

Workers (tests/mpi/*.py, built on tests/mpi/_worker.py) write one JSON file per rank
into a directory given in RSAR_TEST_OUT; ``run_mpi`` returns those per-rank results
next to the exit status and output, so tests assert on what every rank saw.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
MPI_WORKERS = TESTS_DIR / "mpi"


def find_mpiexec() -> str | None:
    """mpiexec next to this interpreter (the mpich wheel's), else on PATH, else None.

    RSAR_MPIEXEC overrides both. The interpreter's own bin/ comes first because mpi4py
    there is linked against that MPI; a different MPI's launcher would start N
    unrelated singletons.
    """
    override = os.environ.get("RSAR_MPIEXEC")
    if override:
        return override if os.access(override, os.X_OK) else None
    # Not resolved: a venv's bin/python is a symlink, and its mpiexec lives in the venv.
    here = Path(sys.executable).parent
    for name in ("mpiexec", "mpirun"):
        cand = here / name
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    for name in ("mpiexec", "mpirun"):
        found = shutil.which(name)
        if found:
            return found
    return None


@functools.lru_cache(maxsize=None)
def mpiexec_flags(mpiexec: str) -> tuple[str, ...]:
    """Extra flags this launcher needs to run N ranks on a small (CI) machine.

    RSAR_MPIEXEC_FLAGS (split on spaces) replaces the guess, for sites that need more.
    """
    override = os.environ.get("RSAR_MPIEXEC_FLAGS")
    if override is not None:
        return tuple(override.split())
    try:
        out = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    if "Open MPI" in out or "OpenRTE" in out:
        flags = ["--oversubscribe"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            flags.append("--allow-run-as-root")
        return tuple(flags)
    return ()  # mpich's hydra: oversubscribes and runs as root without being asked


def mpi_available() -> tuple[bool, str]:
    if find_mpiexec() is None:
        return False, "no mpiexec next to the interpreter or on PATH"
    try:
        import importlib.util

        if importlib.util.find_spec("mpi4py") is None:
            return False, "mpi4py is not installed"
    except (ImportError, ValueError):
        return False, "mpi4py is not importable"
    return True, ""


def require_mpiexec() -> str:
    """The mpiexec to use, or skip the calling test."""
    ok, why = mpi_available()
    if not ok:
        pytest.skip(why)
    return find_mpiexec()  # type: ignore[return-value]


@dataclass
class MpiRun:
    cmd: list[str]
    returncode: int
    stdout: str
    stderr: str
    elapsed: float
    results: list[dict[str, Any] | None] = field(default_factory=list)

    def describe(self) -> str:
        return (
            f"command: {' '.join(self.cmd)}\nexit: {self.returncode} after {self.elapsed:.1f}s\n"
            f"--- stdout ---\n{self.stdout[-4000:]}\n--- stderr ---\n{self.stderr[-4000:]}\n"
            f"--- results ---\n{json.dumps(self.results, indent=1)[-4000:]}"
        )

    def ok_results(self) -> list[dict[str, Any]]:
        """Every rank's result, failing the test with the full picture if any is missing
        or the launch failed."""
        assert self.returncode == 0 and all(r is not None for r in self.results), self.describe()
        bad = [r for r in self.results if r.get("unexpected")]  # type: ignore[union-attr]
        assert not bad, self.describe()
        return self.results  # type: ignore[return-value]


def run_mpi(
    n: int,
    script: str | Path,
    *args: str,
    out_dir: Path,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
) -> MpiRun:
    """Run ``mpiexec -n n python script args...``; kill the whole job after ``timeout``.

    ``script`` is a path or a file name under tests/mpi/. Each rank's JSON result lands
    in ``results[rank]`` (None if that rank wrote none).
    """
    mpiexec = require_mpiexec()
    path = Path(script)
    if not path.is_absolute():
        path = MPI_WORKERS / path
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("rank*.json"):
        old.unlink()
    run_env = dict(os.environ)
    run_env.update(env or {})
    run_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), run_env.get("PYTHONPATH", "")) if p
    )
    run_env["RSAR_TEST_OUT"] = str(out_dir)
    run_env["RSAR_TEST_WORLD"] = str(n)
    # Workers dump their stacks and exit shortly before we would kill them.
    run_env["RSAR_TEST_WORKER_LIMIT"] = str(max(1.0, timeout - 3.0))
    cmd = [mpiexec, *mpiexec_flags(mpiexec), "-n", str(n), sys.executable, "-u", str(path), *args]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=run_env,
        cwd=str(REPO_ROOT),
        start_new_session=True,  # so a timeout can kill mpiexec and every rank at once
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        stdout, stderr = proc.communicate()
        run = MpiRun(cmd, -9, stdout, stderr, time.monotonic() - start, _read(out_dir, n))
        pytest.fail(f"mpiexec did not finish within {timeout:g}s\n{run.describe()}")
    run = MpiRun(cmd, proc.returncode, stdout, stderr, time.monotonic() - start)
    run.results = _read(out_dir, n)
    return run


def _read(out_dir: Path, n: int) -> list[dict[str, Any] | None]:
    results: list[dict[str, Any] | None] = []
    for r in range(n):
        f = out_dir / f"rank{r}.json"
        results.append(json.loads(f.read_text()) if f.exists() else None)
    return results
