"""Fixtures of the CPU tests that run the ``torch.ops`` op (``rsar_core.torch_op``) on CPU
tensors with a stand-in GemmRsAr: a test module imports them by name."""
from __future__ import annotations

import pytest
import torch

from rsar_core import torch_op


@pytest.fixture(scope="module", autouse=True)
def _cpu_kernel():
    """The CUDA kernel (registry lookup + call) for CPU tensors too; once per process."""
    for name, opdef in ((torch_op.OP_NAME, torch_op._gemm_rsar),
                        (torch_op.SCALED_OP_NAME, torch_op._gemm_rsar_scaled)):
        if "cpu" not in opdef._backend_fns:
            torch.library.register_kernel(name, "cpu", opdef._init_fn)
    yield


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
