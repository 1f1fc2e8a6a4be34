"""Shared pytest setup: the repository root is importable, and tests/ helpers too.

Multi-process tests launch workers through tests/mpirun.py (``run_mpi``), which finds
mpiexec and skips cleanly where there is none.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent
for _p in (_TESTS.parent, _TESTS):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))


@pytest.fixture(scope="module")
def ptx_of():
    """PTX of a kernel variant (``launch.cache.Variant``), compiled once per test module."""
    from launch.cache import compile_variant
    out = {}

    def get(v) -> str:
        if v not in out:
            out[v] = compile_variant(v, keep_ptx=True).artifacts.PTX
        return out[v]
    return get
