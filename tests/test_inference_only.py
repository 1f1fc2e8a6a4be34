"""The op has no backward: where autograd would record x or w, backward raises instead of
leaving their gradients silently empty (CPU: the wrapper, and GemmRsAr.__call__ with its
launch replaced by a CPU matmul)."""
from __future__ import annotations

import pytest
import torch

from op_stub import planning_op
from rsar_core import UnsupportedError
from rsar_core.gemm_rsar import inference_only


def _inputs(x_grad: bool = False, w_grad: bool = False):
    x = torch.randn(5, 64).bfloat16().requires_grad_(x_grad)
    w = torch.nn.Parameter(torch.randn(128, 64).bfloat16(), requires_grad=w_grad)
    return x, w


def test_nothing_changes_where_autograd_records_nothing():
    y = torch.randn(5, 128).bfloat16()
    x, w = _inputs()
    assert inference_only(y, x, w) is y
    x, w = _inputs(w_grad=True)
    with torch.no_grad():
        assert inference_only(y, x, w) is y
    with torch.inference_mode():
        assert inference_only(y, x, w) is y


@pytest.mark.parametrize("x_grad,w_grad", [(True, False), (False, True), (True, True)])
def test_backward_raises_where_an_input_needs_a_gradient(x_grad, w_grad):
    y = torch.randn(5, 128).bfloat16()
    x, w = _inputs(x_grad, w_grad)
    out = inference_only(y, x, w)
    assert out.requires_grad and out.data_ptr() == y.data_ptr() and torch.equal(out, y)
    with pytest.raises(UnsupportedError, match="no backward.*no_grad"):
        out.float().sum().backward()
    assert x.grad is None and w.grad is None


def test_the_op_call_marks_its_result(monkeypatch):
    op = planning_op("ar", N=128)
    op.max_M, op.device = 64, torch.device("cpu")
    for name in ("_require_open", "_require_kernel", "check"):
        monkeypatch.setattr(op, name, lambda: None, raising=False)
    monkeypatch.setattr(op, "_prepare",
                        lambda M, K, mode, *a, block=False, bias=False: (
                            op.plan(M, K, mode, block=block), None, ()), raising=False)

    def launch(prepared, x, w, y, *scales):
        y.copy_((x.float() @ w.float().t()).bfloat16())
    monkeypatch.setattr(op, "_launch_prepared", launch, raising=False)

    x, w = _inputs(w_grad=True)
    y = op(x, w)
    assert torch.equal(y, (x.detach().float() @ w.detach().float().t()).bfloat16())
    with pytest.raises(UnsupportedError, match="no backward"):
        y.float().sum().backward()
    with torch.no_grad():
        assert not op(x, w).requires_grad
    assert not op(x.detach(), w.detach()).requires_grad
