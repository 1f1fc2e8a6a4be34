"""Shared harness for the worker scripts that tests/mpirun.py launches under mpiexec.

A worker calls ``main({name: scenario})``; ``argv[1]`` picks the scenario, the rest are
its arguments. Each rank writes what its scenario returned (or the traceback of what
it raised) to $RSAR_TEST_OUT/rank<r>.json for the test to assert on.
"""
from __future__ import annotations

import faulthandler
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from multicast.errors import PeerError  # noqa: E402

Scenario = Callable[..., dict[str, Any]]


def rank_file(rank: int) -> Path:
    return Path(os.environ["RSAR_TEST_OUT"]) / f"rank{rank}.json"


def write_result(rank: int, result: dict[str, Any]) -> None:
    path = rank_file(rank)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, default=repr))
    tmp.replace(path)  # the test never reads half a file


def peer_error(e: PeerError, started: float) -> dict[str, Any]:
    """What a test needs to know about a PeerError this rank caught."""
    return {
        "step": e.step,
        "failures": {str(r): m for r, m in e.failures.items()},
        "cause": type(e.__cause__).__name__ if e.__cause__ is not None else None,
        "message": str(e),
        "elapsed": time.monotonic() - started,
    }


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def main(scenarios: dict[str, Scenario], rank_of: Callable[[], int] | None = None) -> None:
    limit = float(os.environ.get("RSAR_TEST_WORKER_LIMIT", "60"))
    # A hung rank prints where it hangs and exits, instead of waiting for the kill.
    faulthandler.dump_traceback_later(limit, exit=True)
    name, args = sys.argv[1], sys.argv[2:]
    if rank_of is None:
        from mpi4py import MPI

        rank = MPI.COMM_WORLD.Get_rank()
    else:
        rank = rank_of()
    try:
        result = scenarios[name](*args)
    except BaseException as e:  # report everything, including a wrong scenario name
        result = {"unexpected": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    result.setdefault("rank", rank)
    write_result(rank, result)
    faulthandler.cancel_dump_traceback_later()
