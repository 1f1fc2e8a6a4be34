"""GPU tests: run under ``mpirun -n 2 python -m pytest tests/gpu`` on a 2-GPU machine.

Every rank runs the same tests in the same order (the op is collective). Without CUDA,
without a second GPU, or outside an MPI launch of >= 2 ranks, they skip.
"""
from __future__ import annotations

import os

import pytest


def _mpi_world() -> int:
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"):
        if os.environ.get(var):
            return int(os.environ[var])
    return 1


def gpu_skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    from rsar_core.validate import SHARED_GPU_ENV
    if torch.cuda.device_count() < 2 and os.environ.get(SHARED_GPU_ENV) != "1":
        return f"needs 2 GPUs ({SHARED_GPU_ENV}=1: ranks share one, slowly)"
    if _mpi_world() < 2:
        return "run under mpirun -n 2"
    return None


def pytest_collection_modifyitems(config, items):
    reason = gpu_skip_reason()
    if reason:
        mark = pytest.mark.skip(reason=reason)
        for it in items:
            if "/gpu/" in str(it.fspath):
                it.add_marker(mark)


@pytest.fixture(scope="session")
def comm():
    from mpi4py import MPI
    import torch
    c = MPI.COMM_WORLD
    torch.cuda.set_device(c.Get_rank() % torch.cuda.device_count())
    return c


@pytest.fixture(scope="module", autouse=True)
def _close_shared_ops():
    """Each module's shared ops (``gpu_ops.get_op``) are closed before the next module runs."""
    yield
    from gpu_ops import close_ops
    close_ops()
