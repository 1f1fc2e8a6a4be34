"""Run a test module's worker on 2 CPU ranks (gloo over TCP, or mpiexec) and collect what
each rank reported.

A test module that calls ``run_gloo(__file__, mode, tmp_path)`` runs itself as a script:
``python MODULE MODE RANK WORLD PORT OUTDIR``; its ``__main__`` block calls
``worker_main(cases)``, which sets up the process group and writes ``OUTDIR/rankR.json``
with each case's results (or the traceback that stopped it).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(TESTS_DIR),
                                         env.get("PYTHONPATH", "")])
    # two ranks on a 2-core CI machine: one thread each, or they fight over the cores
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("RSAR_TEST_OUT", None)
    return env


def _collect(procs: list[subprocess.Popen], out: Path, world: int,
             timeout: float) -> list[dict[str, Any]]:
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            errors = [f.read_text()[-3000:] for f in sorted(out.glob("rank*.json"))]
            raise AssertionError(f"a rank did not finish within {timeout} s; reports: "
                                 + ("\n".join(errors) or "none"))
    results = []
    for r in range(world):
        f = out / f"rank{r}.json"
        if not f.exists():
            raise AssertionError(f"rank {r} wrote no result; output:\n" + "\n".join(logs)[-4000:])
        results.append(json.loads(f.read_text()))
    for r, res in enumerate(results):
        if "error" in res:
            raise AssertionError(f"rank {r} failed:\n{res['error']}")
    return results


def run_gloo(module: str, mode: str, out: Path, world: int = 2,
             timeout: float = 120.0) -> list[dict[str, Any]]:
    """Every rank's report of ``module``'s ``mode`` worker, under a gloo process group."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, module, mode, str(r), str(world), str(port),
                               str(out)], env=_env(), cwd=REPO_ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(world)]
    return _collect(procs, out, world, timeout)


def run_mpiexec(mpiexec: str, flags: tuple[str, ...], module: str, mode: str, out: Path,
                world: int = 2, timeout: float = 120.0) -> list[dict[str, Any]]:
    """As ``run_gloo``, with the ranks started by ``mpiexec`` (RANK -1: ask MPI)."""
    cmd = [mpiexec, *flags, "-n", str(world), sys.executable, module, mode, "-1", str(world),
           "0", str(out)]
    proc = subprocess.Popen(cmd, env=_env(), cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    return _collect([proc], out, world, timeout)


def worker_main(cases: dict[str, Callable[[], dict[str, Any]]]) -> None:
    """Entry point of a worker process: ``argv`` = MODE RANK WORLD PORT OUTDIR. Modes whose
    name starts with "mpi" use no process group (the case builds on mpi4py)."""
    mode, rank, world, port, out = sys.argv[1:6]
    rank, world = int(rank), int(world)
    report: dict[str, Any] = {}
    try:
        if not mode.startswith("mpi"):
            import torch.distributed as dist
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                    rank=rank, world_size=world)
        else:
            from mpi4py import MPI
            rank = MPI.COMM_WORLD.Get_rank()
        report = cases[mode]()
    except BaseException:  # noqa: BLE001  (reported to the test, which fails with it)
        report = {"error": traceback.format_exc()}
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    if not mode.startswith("mpi"):
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()
