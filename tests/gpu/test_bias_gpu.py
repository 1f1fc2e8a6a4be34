"""A bias on the fused op: ``op(x, w, bias=b)`` returns sum_r x_r @ w_r.T + b, the bias added
once by the exchange's sums before their rounding. RS and AR on every plan family, fp16 and
fp8 ops, partial tiles, out=, bitwise repeatability, and bad biases refused before a launch;
against float32 / float64 references on NaN-poisoned outputs. The bias is drawn as large as
the sums, so a bias dropped or added twice misses the tolerance by ~50x.

mpirun -n 2 python -m pytest -q tests/gpu/test_bias_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from gpu_ops import get_op
from rsar_core import GemmRsAr, RsarTypeError, RsarValueError
from rsar_core.reference import (rank_fp8_inputs, rank_inputs, reference_fp8_sum,
                                 reference_sum, rel_error)
from test_fused_gpu import check_result, knobs, op_push

FP8 = torch.float8_e4m3fn


def _dev() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def _bias(seed: int, N: int, dtype: torch.dtype) -> torch.Tensor:
    """The same bias on every rank (a seeded draw), of the sums' spread (~1.4) and more."""
    g = torch.Generator(device=_dev())
    g.manual_seed(seed * 7919 + 13)
    return (torch.randn(N, generator=g, device=_dev()) * 2.0).to(dtype)


def _poisoned(op: GemmRsAr, x: torch.Tensor, w: torch.Tensor, *scales: torch.Tensor,
              bias: torch.Tensor) -> torch.Tensor:
    """The call with its output allocation full of NaN first (``test_fused_gpu.poisoned_call``)."""
    rows = x.shape[0] if op.all_reduce else op.plan(x.shape[0], x.shape[1]).local_M
    for _ in range(2):
        bait = torch.full((rows, op.N), float("nan"), dtype=op.dtype, device=x.device)
        ptr = bait.data_ptr()
        del bait
        y = op(x, w, *scales, bias=bias)
        if y.data_ptr() == ptr:
            return y
    raise AssertionError("allocator did not reuse the poisoned block")


def check_bias(op: GemmRsAr, seed: int, M: int, K: int) -> torch.Tensor:
    x, w = rank_inputs(seed, op.rank, M, op.N, K, _dev(), dtype=op.dtype)
    b = _bias(seed, op.N, op.dtype)
    y = _poisoned(op, x, w, bias=b)
    ref = reference_sum(seed, op.world, M, op.N, K, _dev(), dtype=op.dtype) + b.float()
    check_result(op, y, ref, M, K)
    return y


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("N", [7168, 2880])
@pytest.mark.parametrize("M,K", [(1, 1024), (129, 4096), (300, 9216), (1000, 1024),
                                 (4096, 4096)])
def test_default_plans(comm, M, N, K, ar):
    """What an op runs by default with a bias: push-all and pairs along N at one tile row,
    peers-first, the flat order with the split-K tail, 2x1 clusters with the lag round,
    partial tiles at N=2880 (the bias read up to N's edge only)."""
    check_bias(get_op(comm, N, ar), seed=M * 5 + K + N, M=M, K=K)


@pytest.mark.parametrize("forced", [
    dict(cta_group=1), dict(cta_group=2),
    dict(peers_first=True, cta_group=1), dict(bn=64),
    dict(pingpong=True, bn=128), dict(prefetch=False)],
    ids=["c1", "c2", "c1pf", "bn64", "pp128", "noprefetch"])
@pytest.mark.parametrize("push", ["lsu", None], ids=["lsu", "tma"])
@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("M,K", [(129, 1024), (1000, 4096)])
def test_forced_plans(comm, M, K, ar, push, forced):
    """Thread-store pushes and bulk copies, each order, cluster shape and MMA role, and the
    reductions with and without their prefetch: each of those sums adds the bias."""
    if push == "lsu" and forced.get("pingpong"):
        pytest.skip("ping-pong runs with bulk-copy pushes only in these tests")
    with knobs(get_op(comm, 7168, ar), push=push, **forced) as op:
        check_bias(op, seed=M + 3 * K + len(forced), M=M, K=K)


@pytest.mark.parametrize("M,K", [(1, 1024), (1000, 4096), (4096, 1024)])
def test_push_ctas(comm, M, K):
    """RS with push CTAs: staged tiles reach their owners, whose sums add the bias."""
    op = get_op(comm, 7168, False)
    if op.transport != "unicast" or op_push(op) == "lsu" or op.arch != "sm_90a":
        pytest.skip("push CTAs are an sm90 RS plan over unicast with bulk-copy pushes")
    with knobs(op, push_ctas=8) as pushing:
        check_bias(pushing, seed=M + K, M=M, K=K)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("M,K", [(129, 1024), (2048, 4096)])
def test_fp16(comm, M, K, ar):
    check_bias(get_op(comm, 7168, ar, dtype=torch.float16), seed=M + K + 1, M=M, K=K)


@pytest.mark.parametrize("scales", ["tensor", "row", "block"])
@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("M,K", [(1, 1024), (1000, 4096)])
def test_fp8(comm, M, K, ar, scales):
    """fp8 operands, one scale each, per row or block-wise: the scaled partials' sum plus
    the bias (torch._scaled_mm(bias=)'s result, summed over ranks with the bias once)."""
    op = get_op(comm, 7168, ar, max_M=4096, input_dtype=FP8)
    per_row, block = scales != "tensor", scales == "block"
    x, w, sx, sw = rank_fp8_inputs(M + K, op.rank, M, op.N, K, _dev(), per_row, block)
    b = _bias(M + K, op.N, op.dtype)
    y = _poisoned(op, x, w, sx, sw, bias=b)
    ref = (reference_fp8_sum(M + K, op.world, M, op.N, K, _dev(), per_row, block)
           + b.double())
    check_result(op, y, ref, M, K)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
def test_bias_once_out_and_repeat(comm, ar):
    """The biased result less the unbiased one is the bias (added once, in fp32, before the
    rounding: within two bf16 steps of each element); ``out=`` takes the same bits; a second
    call gives the same bits."""
    op = get_op(comm, 7168, ar)
    M, K = 700, 4096
    x, w = rank_inputs(41, op.rank, M, op.N, K, _dev())
    b = _bias(41, op.N, op.dtype)
    plain = op(x, w)
    y = op(x, w, bias=b)
    out = torch.full_like(y, float("nan"))
    again = op(x, w, bias=b, out=out)
    torch.cuda.synchronize()
    op.check()
    assert again is out and torch.equal(y, out)
    rows = min(M, y.shape[0]) if ar else max(0, min(y.shape[0], M - op.rank * y.shape[0]))
    diff = (y[:rows].float() - plain[:rows].float()) - b.float()
    # each result is one rounding of its fp32 sum: 2 ulps of the larger of the two
    ulp = torch.maximum(y[:rows].float().abs(), plain[:rows].float().abs()) * 2.0 ** -7
    assert (diff.abs() <= 2 * ulp + 1e-6).all(), float((diff.abs() - 2 * ulp).max())
    assert rel_error(y[:rows], plain[:rows].float() + b.float()) < 1e-2


def test_bad_bias_refused_then_usable(comm):
    """A bias of the wrong type, dtype, shape, device or alignment raises before any
    launch, and the next good call is correct."""
    op = get_op(comm, 7168, False)
    M, K = 129, 1024
    x, w = rank_inputs(3, op.rank, M, op.N, K, _dev())
    good = _bias(3, op.N, op.dtype)
    bad = [
        ([1.0] * op.N, RsarTypeError),
        (good.float(), RsarTypeError),
        (good[:-8], RsarValueError),
        (good.view(1, -1), RsarValueError),
        (good.cpu(), RsarValueError),
        (_bias(4, op.N + 1, op.dtype)[1:], RsarValueError),  # 2 B off a 16-B boundary
        (torch.stack([good, good], 1)[:, 0], RsarValueError),  # not contiguous
    ]
    for b, err in bad:
        with pytest.raises(err):
            op(x, w, bias=b)
    check_bias(op, seed=3, M=M, K=K)
