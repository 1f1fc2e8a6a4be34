"""The ops GPU test modules share: one GemmRsAr per (N, mode, max_M), built on first use and
closed after each module by ``conftest``'s autouse fixture (workspaces are symmetric memory:
every rank must build and close them together, which the fixed test order guarantees)."""
from __future__ import annotations

import torch

from rsar_core import GemmRsAr

MAX_M = 8192
_OPS: dict = {}


def get_op(comm, N: int, ar: bool, max_M: int = MAX_M,
           dtype: torch.dtype = torch.bfloat16,
           input_dtype: torch.dtype | None = None) -> GemmRsAr:
    key = (N, ar, max_M, dtype, input_dtype)
    if key not in _OPS:
        _OPS[key] = GemmRsAr(max_M=max_M, N=N, all_reduce=ar, comm=comm, dtype=dtype,
                             input_dtype=input_dtype)
    return _OPS[key]


def close_ops() -> None:
    for op in _OPS.values():
        op.close()
    _OPS.clear()
