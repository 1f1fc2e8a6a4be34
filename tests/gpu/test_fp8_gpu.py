"""Ops built with input_dtype=torch.float8_e4m3fn: scaled fp8 operands, bf16 / fp16 results.
RS and AR on every plan family, per-tensor and per-row scales, the GEMM alone against
torch._scaled_mm, partial tiles, out=, an fp8 op and a bf16 op on one workspace, and bad
input refused before a good call; against float64 references on NaN-poisoned outputs.
Block-wise scales (x per row and 128-element k-group, w per 128 x 128 block): default and
forced plans, the GEMM alone against float64 and torch's block-wise scaled_mm, every scale
layout the op takes giving one result bitwise, out=, and bad scales refused.

mpirun -n 2 python -m pytest -q tests/gpu/test_fp8_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from gpu_ops import get_op
from rsar_core import GemmRsAr, RsarTypeError, RsarValueError, Workspace
from rsar_core.reference import (BLOCK, rank_fp8_inputs, reference_fp8_sum, rel_error,
                                 rs_rows, scaled_mm, scaled_product)
from test_fused_gpu import TOL, check, check_result, knobs, poisoned_call

FP8 = torch.float8_e4m3fn


def _dev() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def _op(comm, N: int, ar: bool, max_M: int = 4096, dtype: torch.dtype = torch.bfloat16):
    return get_op(comm, N, ar, max_M=max_M, dtype=dtype, input_dtype=FP8)


def check_fp8(op: GemmRsAr, seed: int, M: int, K: int, per_row: bool = True,
              block: bool = False) -> None:
    """One call on every rank's seeded inputs (``block``: block-wise scales, row-major)
    against the float64 sum, on a NaN-poisoned output."""
    x, w, sx, sw = rank_fp8_inputs(seed, op.rank, M, op.N, K, _dev(), per_row, block)
    y = poisoned_call(op, x, w, sx, sw)
    check_result(op, y, reference_fp8_sum(seed, op.world, M, op.N, K, _dev(), per_row, block),
                 M, K)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("N", [384, 7168])
@pytest.mark.parametrize("K", [128, 2048, 8192])
@pytest.mark.parametrize("M", [1, 128, 129, 700, 1000, 4096])
def test_default_plans(comm, M, N, K, ar):
    """What an fp8 op runs by default (planned at half its K): push-all and pairs along N
    at one tile row, peers-first, the flat order and the split-K tail, 2x1 clusters."""
    check_fp8(_op(comm, N, ar), seed=M * 3 + K + N, M=M, K=K)


@pytest.mark.parametrize("per_row", [False, True], ids=["tensor", "row"])
@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("M,K", [(1, 1024), (300, 4096), (2048, 2048)])
def test_scale_kinds(comm, M, K, ar, per_row):
    check_fp8(_op(comm, 7168, ar), seed=M + K + per_row, M=M, K=K, per_row=per_row)


@pytest.mark.parametrize("forced", [
    dict(cta_group=1), dict(cta_group=2), dict(peers_first=True, cta_group=1),
    dict(bn=64), dict(peers_first=True, flat=True, sk=True)],
    ids=["c1", "c2", "c1pf", "bn64", "flatsk"])
@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("M,K", [(129, 2048), (1000, 8192), (4096, 2048)])
def test_forced_plans(comm, M, K, ar, forced):
    with knobs(_op(comm, 7168, ar), **forced) as op:
        check_fp8(op, seed=M + 7 * K + len(forced), M=M, K=K)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("N", [2880, 1000])
@pytest.mark.parametrize("M,K", [(1, 1024), (300, 4096), (1000, 128)])
def test_partial_tiles(comm, M, N, K, ar):
    """N that ends each tile row on a partial tile: the last columns' scales are clamped."""
    check_fp8(_op(comm, N, ar), seed=M + 5 * N + K, M=M, K=K)


@pytest.mark.parametrize("per_row", [False, True], ids=["tensor", "row"])
@pytest.mark.parametrize("M,N,K", [(1, 7168, 1024), (320, 7168, 4096), (2048, 7168, 2048),
                                   (4096, 8192, 8192), (1000, 2880, 2048), (300, 1000, 128)])
def test_gemm_only_against_scaled_mm(comm, M, N, K, per_row):
    """The GEMM alone against the float64 product of the scaled fp8 inputs, and close to
    torch._scaled_mm with fast accumulation (cuBLAS / CUTLASS) on the same inputs (where
    it takes N)."""
    op = _op(comm, N, False, max_M=4096)
    x, w, sx, sw = rank_fp8_inputs(M + N + K, op.rank, M, N, K, _dev(), per_row)
    op.gemm_only(x, w, x_scale=sx, w_scale=sw)
    y = op.gemm_only(x, w, x_scale=sx, w_scale=sw)
    torch.cuda.synchronize()
    ref = scaled_product(x, w, sx, sw)
    assert y.dtype == torch.bfloat16 and not torch.isnan(y).any()
    assert rel_error(y, ref) < 4e-3
    if N % 16:
        return  # torch._scaled_mm takes N in multiples of 16
    assert rel_error(y, scaled_mm(x, w, sx, sw).double()) < 4e-3


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
def test_fp16_results_and_out(comm, ar):
    """fp8 operands, fp16 results, into ``out=``."""
    op = _op(comm, 1024, ar, dtype=torch.float16)
    M, K = 640, 2048
    x, w, sx, sw = rank_fp8_inputs(21, op.rank, M, op.N, K, _dev())
    rows = M if ar else op.plan(M, K).local_M
    out = torch.full((rows, op.N), float("nan"), dtype=torch.float16, device=_dev())
    assert op(x, w, x_scale=sx, w_scale=sw, out=out) is out
    torch.cuda.synchronize()
    ref = reference_fp8_sum(21, op.world, M, op.N, K, _dev())
    ref = ref if ar else rs_rows(ref, op.rank, op.world)
    assert rel_error(out, ref) < TOL


def test_fp8_and_bf16_ops_share_a_workspace(comm):
    with Workspace(max_M=2048, N=1024, comm=comm) as ws:
        f8 = GemmRsAr(2048, 1024, all_reduce=True, input_dtype=FP8, workspace=ws)
        bf = GemmRsAr(2048, 1024, all_reduce=False, workspace=ws)
        try:
            for i, (M, K) in enumerate([(1000, 1024), (64, 4096), (2048, 128)]):
                check_fp8(f8, seed=200 + i, M=M, K=K)
                check(bf, seed=300 + i, M=M, K=K)
        finally:
            f8.close()
            bf.close()


def test_bad_input_is_refused_and_the_op_stays_usable(comm):
    op = _op(comm, 384, True)
    x, w, sx, sw = rank_fp8_inputs(5, op.rank, 64, op.N, 256, _dev())
    with pytest.raises(RsarValueError, match="x_scale and w_scale"):
        op(x, w)
    with pytest.raises(RsarValueError, match="one per row of x"):
        op(x, w, x_scale=sx[:10], w_scale=sw)
    with pytest.raises(RsarTypeError, match="float32"):
        op(x, w, x_scale=sx.double(), w_scale=sw)
    with pytest.raises(RsarTypeError, match="input_dtype"):
        op(x.float().bfloat16(), w, x_scale=sx, w_scale=sw)
    x64, w64, sx64, sw64 = rank_fp8_inputs(5, op.rank, 64, op.N, 192, _dev())
    with pytest.raises(RsarValueError, match="multiple of 128"):
        op(x64, w64, x_scale=sx64, w_scale=sw64)
    check_fp8(op, seed=6, M=64, K=256)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
def test_torch_op_compiled_and_in_a_cuda_graph(comm, ar):
    """``rsar::gemm_rsar_scaled`` through an fp8 RowParallelLinear: eager, torch.compile
    (fullgraph), and replayed from a CUDA graph with fresh inputs copied in."""
    from rsar_core.torch_op import RowParallelLinear
    op = _op(comm, 1024, ar)
    M, K = 256, 2048
    x, w, sx, sw = rank_fp8_inputs(31, op.rank, M, op.N, K, _dev())
    layer = RowParallelLinear(op, w, weight_scale=sw)
    ref = reference_fp8_sum(31, op.world, M, op.N, K, _dev())
    ref = ref if ar else rs_rows(ref, op.rank, op.world)
    assert rel_error(layer(x, sx), ref) < TOL
    compiled = torch.compile(layer, fullgraph=True)
    assert rel_error(compiled(x, sx), ref) < TOL
    xs, sxs = x.clone(), sx.clone()
    layer(xs, sxs)  # compiled and planned before capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = layer(xs, sxs)
    x2, _, sx2, _ = rank_fp8_inputs(32, op.rank, M, op.N, K, _dev())
    xs.copy_(x2)
    sxs.copy_(sx2)
    y.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    op.check()
    ref2 = torch.zeros(M, op.N, dtype=torch.float64, device=_dev())
    for r in range(op.world):
        xr, _, sxr, _ = rank_fp8_inputs(32, r, M, op.N, K, _dev())
        _, wr, _, swr = rank_fp8_inputs(31, r, M, op.N, K, _dev())
        ref2 += scaled_product(xr, wr, sxr, swr)
    ref2 = ref2 if ar else rs_rows(ref2, op.rank, op.world)
    assert rel_error(y, ref2) < TOL


# ---------------------------------------------------------------- block-wise scales
def _m_major(s: torch.Tensor, S: int) -> torch.Tensor:
    """Block-wise x scales (M, K / 128) laid out M-major, stride (1, S), S >= M (torch's
    BlockWise1x128 layout); the S - M entries past each k-group's M are NaN, so a kernel
    that reads them shows."""
    M, kb = s.shape
    buf = torch.full((kb, S), float("nan"), dtype=s.dtype, device=s.device)
    buf[:, :M] = s.t()
    return buf[:, :M].t()


def _col_major(s: torch.Tensor) -> torch.Tensor:
    """Block-wise w scales (ceil(N / 128), K / 128), column-major: stride (1, ceil(N / 128))."""
    return s.t().contiguous().t()


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("N", [384, 7168, 2880])
@pytest.mark.parametrize("K", [128, 1024, 4096])
@pytest.mark.parametrize("M", [1, 129, 700, 4096])
def test_block_default_plans(comm, M, N, K, ar):
    """Block-wise scales on the plans an fp8 op picks for them (128-wide tiles at half the
    depth: push-all, peers-first, flat and split-K orders, 2x1 clusters where they win);
    N=2880 ends each tile row on a partial tile, whose w block is the last, short one."""
    check_fp8(_op(comm, N, ar), seed=M * 5 + K + N + 1, M=M, K=K, block=True)


@pytest.mark.parametrize("forced", [
    dict(bn=64), dict(cta_group=1), dict(cta_group=2),
    dict(peers_first=True, flat=True, sk=True)],
    ids=["bn64", "c1", "c2", "flatsk"])
@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("M,N,K", [(129, 7168, 1024), (1000, 2880, 4096), (4096, 7168, 1024)])
def test_block_forced_plans(comm, M, N, K, ar, forced):
    """Block-wise scales on forced plans: 64-wide tiles (two tile columns per w block),
    1-CTA tiles, 2x1 clusters sharing w's tile, and the split-K tail (a tile's k-groups cut
    between two CTAs, each promoting its own)."""
    with knobs(_op(comm, N, ar), **forced) as op:
        check_fp8(op, seed=M + 3 * K + N + len(forced), M=M, K=K, block=True)


@pytest.mark.parametrize("M,N,K", [(1, 7168, 1024), (320, 7168, 4096), (2048, 7168, 2048),
                                   (4096, 7168, 4096), (1000, 2880, 2048), (300, 384, 128)])
def test_block_gemm_only_against_float64_and_torch(comm, M, N, K):
    """The GEMM alone with block-wise scales against the float64 product of the scaled fp8
    inputs (the per-row bound), then against torch's BlockWise1x128 x BlockWise128x128
    scaled_mm on the same inputs where this torch and shape have it (else skipped, after
    the float64 check has passed)."""
    op = _op(comm, N, False, max_M=4096)
    x, w, sx, sw = rank_fp8_inputs(M + N + K + 3, op.rank, M, N, K, _dev(), block=True)
    op.gemm_only(x, w, sx, sw)
    y = op.gemm_only(x, w, sx, sw)
    torch.cuda.synchronize()
    assert y.dtype == torch.bfloat16 and y.shape == (M, N) and not torch.isnan(y).any()
    assert rel_error(y, scaled_product(x, w, sx, sw)) < 4e-3
    try:
        anchor = scaled_mm(x, w, sx, sw)
        torch.cuda.synchronize()
    except Exception as e:  # no block-wise scaled_mm for this shape or torch build
        why = (str(e).strip().splitlines() or [""])[0]
        pytest.skip(f"float64 check passed; torch's block-wise anchor n/a: "
                    f"{type(e).__name__}: {why}")
    assert rel_error(y, anchor.double()) < 4e-3


@pytest.mark.parametrize("M,N,K,forced", [
    (129, 7168, 1152, dict(bn=64)),
    (2048, 7168, 2176, dict(bn=64)),
    (129, 7168, 1152, dict(cta_group=1)),
    (2048, 7168, 2176, dict(cta_group=2)),
    (1000, 2880, 4224, dict(cta_group=2)),
    (2048, 7168, 2176, dict(cta_group=2, pair_n=True)),
    (1000, 2880, 4480, dict(cta_group=1, sk=True)),
    (640, 7168, 4480, dict(cta_group=1, sk=True))],
    ids=["bn64-9", "bn64-17", "c1-9", "c2-17", "c2-33", "pn-17", "sk-35", "sk8-35"])
def test_block_gemm_only_forced_plans(comm, M, N, K, forced):
    """The GEMM alone's two product sets (two k-groups a trip, an odd count's last alone:
    the ids name the k-group count) on forced plans: 64-wide tiles, 1-CTA tiles, 2x1
    clusters sharing w's or x's tile, and the split-K tail (each piece of a tile's k-groups
    promoted on its own, then summed), against the float64 product."""
    op = _op(comm, N, False, max_M=2048)
    x, w, sx, sw = rank_fp8_inputs(M + N + K + len(forced), op.rank, M, N, K, _dev(),
                                   block=True)
    with knobs(op, **forced) as tuned:
        # the split-K cases do cut tiles (the tail's pieces over idle SMs)
        assert bool(tuned.plan(M, K, "gemm", block=True).sk) == bool(forced.get("sk"))
        y = tuned.gemm_only(x, w, sx, sw)
    torch.cuda.synchronize()
    assert y.shape == (M, N) and not torch.isnan(y).any()
    assert rel_error(y, scaled_product(x, w, sx, sw)) < 4e-3


@pytest.mark.parametrize("mode", ["rs", "ar", "gemm"])
def test_block_scale_layouts_give_one_result_bitwise(comm, mode):
    """x's scales row-major or M-major (stride (1, M), or (1, S) with S > M and NaN between),
    w's row-major or column-major: the same result, bit for bit, as row-major both."""
    M, N, K = 700, 2880, 1024
    op = _op(comm, N, mode == "ar")
    seed = 61 + len(mode)
    x, w, sx, sw = rank_fp8_inputs(seed, op.rank, M, N, K, _dev(), block=True)
    if mode == "gemm":
        first = op.gemm_only(x, w, sx, sw)
        torch.cuda.synchronize()
        assert rel_error(first, scaled_product(x, w, sx, sw)) < 4e-3
    else:
        first = poisoned_call(op, x, w, sx, sw)
        check_result(op, first, reference_fp8_sum(seed, op.world, M, N, K, _dev(), block=True),
                     M, K)
    layouts = [(_m_major(sx, M), sw), (sx, _col_major(sw)), (_m_major(sx, M), _col_major(sw)),
               (_m_major(sx, M + 37), sw), (_m_major(sx, M + 37), _col_major(sw))]
    assert layouts[0][0].stride() == (1, M) and layouts[1][1].stride() == (1, -(-N // BLOCK))
    assert layouts[3][0].stride() == (1, M + 37)
    for a, b in layouts:
        assert torch.equal(a, sx) and torch.equal(b, sw)
        if mode == "gemm":
            y = op.gemm_only(x, w, a, b)
        else:
            y = op(x, w, a, b, out=torch.full_like(first, float("nan")))
        torch.cuda.synchronize()
        op.check()
        assert torch.equal(y, first), f"x_scale {a.stride()}, w_scale {b.stride()}"


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
def test_block_scales_into_out(comm, ar):
    """Block-wise scales, the result into ``out=`` (NaN-filled before the call)."""
    op = _op(comm, 7168, ar)
    M, K = 640, 2048
    x, w, sx, sw = rank_fp8_inputs(71, op.rank, M, op.N, K, _dev(), block=True)
    rows = M if ar else op.plan(M, K, block=True).local_M
    out = torch.full((rows, op.N), float("nan"), dtype=op.dtype, device=_dev())
    assert op(x, w, sx, sw, out=out) is out
    check_result(op, out, reference_fp8_sum(71, op.world, M, op.N, K, _dev(), block=True),
                 M, K)


def test_bad_block_scales_are_refused_before_a_launch(comm):
    """Each malformed block-wise call raises RsarValueError with its NaN-filled ``out=``
    untouched (nothing launched), and a good block-wise call right after it passes."""
    op = _op(comm, 384, True)
    M, K = 64, 512
    kb, nb = K // BLOCK, -(-op.N // BLOCK)
    x, w, sx, sw = rank_fp8_inputs(81, op.rank, M, op.N, K, _dev(), block=True)
    _, _, rx, rw = rank_fp8_inputs(81, op.rank, M, op.N, K, _dev())  # one per row

    def ones(*shape: int) -> torch.Tensor:
        return torch.ones(*shape, device=_dev())

    bad = [
        (sx, rw),                                   # x block-wise, w per row
        (rx, sw),                                   # x per row, w block-wise
        (ones(M, kb + 1), sw),                      # x: a k-group too many
        (sx, ones(nb, kb - 1)),                     # w: a k-group too few
        (sx, ones(nb + 1, kb)),                     # w: a block row too many
        (sx, ones(nb - 1, kb)),                     # w: a block row too few
        (ones(M, 2 * kb)[:, ::2], sw),              # x not dense
        (ones(M * kb).as_strided((M, kb), (1, M - 1)), sw),  # x M-major, stride below M
        (sx, ones(nb, 2 * kb)[:, ::2]),             # w not dense
    ]
    for i, (a, b) in enumerate(bad):
        out = torch.full((M, op.N), float("nan"), dtype=op.dtype, device=_dev())
        with pytest.raises(RsarValueError):
            op(x, w, a, b, out=out)
        torch.cuda.synchronize()
        assert torch.isnan(out).all(), f"bad input {i} wrote the output"
        check_fp8(op, seed=82 + i, M=M, K=K, block=True)
    # tiles wider than a w block: refused for block-wise scales, the call and the GEMM alone
    with knobs(op, bn=256) as wide:
        out = torch.full((M, op.N), float("nan"), dtype=op.dtype, device=_dev())
        with pytest.raises(RsarValueError, match=r"Tuning\.bn"):
            wide(x, w, sx, sw, out=out)
        with pytest.raises(RsarValueError, match=r"Tuning\.bn"):
            wide.gemm_only(x, w, sx, sw)
        torch.cuda.synchronize()
        assert torch.isnan(out).all()
    check_fp8(op, seed=95, M=M, K=K, block=True)
