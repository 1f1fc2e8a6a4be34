"""``Tuning.l2_prefetch`` (an experiment): the producer prefetches its later k-blocks into
L2. A prefetch moves bytes into L2 and nothing else, so every result is bitwise the default
plan's: the plain GEMM on its plan kinds (2x1 clusters along M and along N, 1-CTA tiles with
x's last-row box, ping-pong, 64-row tiles, K shorter than the distance), and the fused RS /
AR against float64 and bitwise against the same op without it.

mpirun -n 2 python -m pytest -q tests/gpu/test_l2_prefetch_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from gpu_ops import get_op
from rsar_core.reference import rank_inputs
from test_fused_gpu import check, check_gemm_only_bitwise, knobs, poisoned_call


def _dev() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


@pytest.mark.parametrize("ahead", [1, 8, 32])
@pytest.mark.parametrize("M,N,K,fields", [
    (256, 7168, 9216, {}),                                 # pairs along M (w multicast)
    (256, 7168, 4096, {"pair_n": True, "bn": 112}),        # pairs along N (x multicast)
    (300, 7168, 4096, {"cta_group": 1}),                   # x's box on the last tile row
    (2048, 7168, 1024, {}),                                # ping-pong warp groups
    (100, 2880, 4096, {}),                                 # 64-row tiles on pairs
    (1, 8192, 1024, {}),                                   # decode, 64-row tiles
    (1000, 5120, 64, {}),                                  # one k-block: nothing to prefetch
], ids=["pairs", "pairs-n", "box", "pingpong", "rows64", "decode", "k64"])
def test_gemm_only_bitwise(comm, M, N, K, fields, ahead):
    op = get_op(comm, N, False)
    x, w = rank_inputs(M * 7 + K + N + ahead, op.rank, M, N, K, _dev())
    with knobs(op, l2_prefetch=ahead, **fields) as pre, knobs(op, **fields) as plain:
        assert pre.plan(M, K, mode="gemm") == plain.plan(M, K, mode="gemm")
        check_gemm_only_bitwise(pre, plain, x, w)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("M,K", [(1, 4096), (1000, 4096), (4096, 1024)])
def test_fused_correct_and_bitwise(comm, M, K, ar):
    op = get_op(comm, 7168, ar)
    with knobs(op, l2_prefetch=8) as pre:
        check(pre, seed=M * 5 + K + int(ar), M=M, K=K)
        x, w = rank_inputs(M + K, op.rank, M, op.N, K, _dev())
        assert torch.equal(poisoned_call(pre, x, w), poisoned_call(op, x, w))
