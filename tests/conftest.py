"""Shared pytest setup: the repository root is importable, and tests/ helpers too.

Multi-process tests launch workers through tests/mpirun.py (``run_mpi``), which finds
mpiexec and skips cleanly where there is none.
"""
from __future__ import annotations

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parent
for _p in (_TESTS.parent, _TESTS):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
