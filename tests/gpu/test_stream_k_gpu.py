"""Stream-K (``Tuning.stream``): the plain GEMM's one partial round spread along K over every
lane, on 1-CTA tiles and 2x1 clusters along M, 128- and 64-row tiles, against float64; the
pieces' flags reset for the next launch (a second call on other inputs is right too) and the
sums land in the same order every launch (a repeat is bitwise equal); refused on the fused op
before any launch, the op still usable after.

mpirun -n 2 python -m pytest -q tests/gpu/test_stream_k_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from gpu_ops import get_op
from rsar_core import RsarValueError
from rsar_core.reference import rank_inputs
from test_fused_gpu import check_gemm_only, knobs


def _dev() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


@pytest.mark.parametrize("M,N,K,fields", [
    (512, 2880, 9216, {}), (512, 2880, 4096, {}), (500, 2880, 4096, {}),
    (512, 2880, 9216, {"cta_group": 1, "bn": 96}), (449, 2888, 1024, {"cta_group": 1, "bn": 96}),
    (256, 2880, 4096, {"cta_group": 1, "bm": 64, "bn": 96}),
    (200, 2880, 9216, {"cta_group": 2, "bm": 64, "bn": 96}),
    (300, 5120, 4096, {"cta_group": 1}), (384, 2880, 1024, {"cta_group": 2, "bn": 128})])
def test_stream_k(comm, M, N, K, fields):
    op = get_op(comm, N, False)
    with knobs(op, stream=True, **fields) as streamed:
        p = streamed.plan(M, K, mode="gemm")
        assert p.stream and p.rounds >= 2, p
        x, w = rank_inputs(M * 11 + K + N, op.rank, M, N, K, _dev())
        y = check_gemm_only(streamed, x, w).clone()
        x2, w2 = rank_inputs(M * 13 + K + N, op.rank, M, N, K, _dev())
        check_gemm_only(streamed, x2, w2)  # the flags were reset, the slots rewritten
        y_again = streamed.gemm_only(x, w)
        torch.cuda.synchronize()
        assert torch.equal(y, y_again)


def test_fused_call_refused_then_usable(comm):
    op = get_op(comm, 2880, False)
    x, w = rank_inputs(5, op.rank, 512, op.N, 4096, _dev())
    with knobs(op, stream=True) as streamed:
        with pytest.raises(RsarValueError, match="stream"):
            streamed(x, w)
        check_gemm_only(streamed, x, w)
