"""fp8 operands on the CPU: what an op built with input_dtype=torch.float8_e4m3fn accepts,
refuses and returns, the plans and variants it would launch, and the PTX of those variants
(fp8 MMAs, the scale loads, and no fp8 instruction in a bf16 variant)."""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from launch.cache import CACHE
from launch.variant import Variant
from launch.plan import make_plan
from launch.geometry import plan_depth
from op_stub import cpu_op, planning_op
from rsar_core import gemm_rsar
from rsar_core.errors import RsarTypeError, RsarValueError
from rsar_core.reference import (rank_fp8_inputs, reference_fp8_sum, scaled_product)
from rsar_core.validate import check_input_dtype, check_scales

FP8 = torch.float8_e4m3fn
CPU = torch.device("cpu")


def _inputs(M: int = 6, K: int = 128, per_row: bool = True):
    return rank_fp8_inputs(1, 0, M, 128, K, CPU, per_row)


def test_input_dtype_names():
    assert check_input_dtype(None, torch.bfloat16) == ""
    assert check_input_dtype(torch.float16, torch.float16) == ""
    assert check_input_dtype(FP8, torch.bfloat16) == "e4m3"
    for bad in (torch.float8_e5m2, torch.int8, torch.float32, "e4m3"):
        with pytest.raises(RsarTypeError, match="input_dtype must be None"):
            check_input_dtype(bad, torch.bfloat16)


@pytest.mark.parametrize("mode", ["rs", "ar"])
@pytest.mark.parametrize("per_row", [False, True], ids=["tensor", "row"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_an_fp8_op_returns_the_scaled_product_in_its_dtype(monkeypatch, mode, per_row, dtype):
    op = cpu_op(monkeypatch, mode, dtype, input_dtype=FP8)
    x, w, sx, sw = _inputs(per_row=per_row)
    y = op(x, w, x_scale=sx, w_scale=sw)
    want = scaled_product(x, w, sx, sw).to(dtype)
    assert y.dtype == dtype
    assert torch.allclose(y.float(), (want if mode == "ar" else want[: y.shape[0]]).float(),
                          rtol=1e-2, atol=1e-3)
    out = torch.full((y.shape[0], 128), float("nan"), dtype=dtype)
    assert op(x, w, x_scale=sx, w_scale=sw, out=out) is out and torch.equal(out, y)


@pytest.mark.parametrize("shapes,bits", [
    (((), ()), 0), (((1,), (1, 1)), 0), (((6,), ()), 1), (((6, 1), (128,)), 3),
    (((), (1, 128)), 2), (((1, 6), (128, 1)), 3)])
def test_scale_shapes_give_the_kernel_its_bits(shapes, bits):
    sx, sw = (torch.ones(s) for s in shapes)
    assert check_scales(sx, sw, 6, 128, CPU, "e4m3") == bits


def test_one_row_takes_either_scale_form():
    assert check_scales(torch.ones(1, 1), torch.ones(()), 1, 128, CPU, "e4m3") == 0


@pytest.mark.parametrize("sx,sw,err,match", [
    (None, torch.ones(()), RsarValueError, "needs x_scale and w_scale"),
    (torch.ones(()), None, RsarValueError, "needs x_scale and w_scale"),
    (torch.ones(5), torch.ones(()), RsarValueError, r"one per row of x .*n=6\), got shape \(5,\)"),
    (torch.ones(()), torch.ones(64), RsarValueError, "output column"),
    (torch.ones(6, 2), torch.ones(()), RsarValueError, r"got shape \(6, 2\)"),
    (torch.ones(1, 1, 6), torch.ones(()), RsarValueError, "got shape"),
    (torch.ones((), dtype=torch.float64), torch.ones(()), RsarTypeError, "float32, got"),
    (torch.ones((), dtype=torch.bfloat16), torch.ones(()), RsarTypeError, "float32, got"),
    (torch.ones(12)[::2], torch.ones(()), RsarValueError, "contiguous"),
    ([1.0], torch.ones(()), RsarTypeError, "torch.Tensor of float32"),
])
def test_bad_scales_are_refused_before_any_launch(monkeypatch, sx, sw, err, match):
    op = cpu_op(monkeypatch, "ar", input_dtype=FP8)
    x, w, good_x, good_w = _inputs()
    with pytest.raises(err, match=match):
        op(x, w, x_scale=sx, w_scale=sw)
    assert op(x, w, x_scale=good_x, w_scale=good_w).shape == (6, 128)  # still usable


def test_scales_are_refused_by_an_op_without_fp8(monkeypatch):
    op = cpu_op(monkeypatch, "rs")
    x, w = torch.randn(6, 64).bfloat16(), torch.randn(128, 64).bfloat16()
    with pytest.raises(RsarValueError, match="for fp8 operands"):
        op(x, w, x_scale=torch.ones(()), w_scale=torch.ones(()))


@pytest.mark.parametrize("x_dtype,w_dtype,match", [
    (torch.bfloat16, FP8, r"x must be float8_e4m3fn \(this op's input_dtype\), got "
                          r"torch.bfloat16; an op for such inputs is built with "
                          r"dtype=torch.bfloat16 and input_dtype=None"),
    (FP8, torch.float16, "w must be float8_e4m3fn"),
])
def test_operands_of_another_dtype_are_refused(monkeypatch, x_dtype, w_dtype, match):
    op = cpu_op(monkeypatch, "rs", input_dtype=FP8)
    x, w, sx, sw = _inputs()
    with pytest.raises(RsarTypeError, match=match):
        op(x.float().to(x_dtype), w.float().to(w_dtype), x_scale=sx, w_scale=sw)
    assert not op.can_run(w.float().to(torch.bfloat16)) and op.can_run(w)


def test_a_bf16_op_names_input_dtype_for_fp8_inputs(monkeypatch):
    op = cpu_op(monkeypatch, "rs")
    x, w, _, _ = _inputs()
    with pytest.raises(RsarTypeError, match="input_dtype=torch.float8_e4m3fn"):
        op(x, w)


def test_fp8_k_is_a_multiple_of_128(monkeypatch):
    op = cpu_op(monkeypatch, "rs", input_dtype=FP8)
    x, w, sx, sw = _inputs(K=192)
    with pytest.raises(RsarValueError, match="multiple of 128 for fp8"):
        op(x, w, x_scale=sx, w_scale=sw)
    with pytest.raises(RsarValueError, match="multiple of 128"):
        op.warmup([64], 192)


def test_out_must_be_the_result_dtype_and_apart_from_the_scales(monkeypatch):
    op = cpu_op(monkeypatch, "ar", input_dtype=FP8)
    x, w, sx, sw = _inputs()
    with pytest.raises(RsarTypeError, match=r"out must be bfloat16 \(this op's dtype\)"):
        op(x, w, x_scale=sx, w_scale=sw, out=torch.empty(6, 128, dtype=FP8))
    buf = torch.empty(6 * 128 + 64, dtype=torch.bfloat16)
    out = buf[64:].view(6, 128)
    sx_in = buf[:12].view(torch.float32)  # 6 fp32 scales in out's allocation, before it
    op(x, w, x_scale=sx_in.reshape(6, 1), w_scale=sw, out=out)  # apart: fine
    inside = buf[64:76].view(torch.float32)
    with pytest.raises(RsarValueError, match="out overlaps x_scale"):
        op(x, w, x_scale=inside, w_scale=sw, out=out)


def test_plans_take_half_the_depth(monkeypatch):
    """An fp8 op plans a call of depth K as a bf16 op plans K / 2 (the same k-block count,
    bytes and MMA time per k-block), launches the same variants with fp8 operands, and
    passes the call's own K to the kernel."""
    assert plan_depth(4096, "e4m3") == 2048 and plan_depth(4096) == 4096
    seen: dict = {"": [], "e4m3": []}
    monkeypatch.setattr(gemm_rsar.GemmRsAr, "pair_ctas", property(lambda self: self.sm_count))
    monkeypatch.setattr(gemm_rsar.GemmRsAr, "quad_ctas", property(lambda self: self.sm_count))
    fixed = {}
    for name, vs in seen.items():
        monkeypatch.setattr(CACHE, "get", lambda v, vs=vs: vs.append(v) or object())
        for mode in ("rs", "ar"):
            op = planning_op(mode, input_dtype=FP8 if name else None)
            op.max_M = 8192
            K = 8192 if name else 4096
            op.warmup([128, 1000, 4096], K)
            # depth 1024 both ways, where no bf16-only rule fires (ping-pong from M=2048, (aq))
            op._prepare(1024, K // 4, "gemm")
            fixed[name, mode] = op._prepare(1000, K, mode)[2]
            push_all = None if mode == "ar" else False  # the rule's, where a kernel runs it
            assert op.plan(1000, K) == make_plan(1000, 7168, 4096, 2, 132, mode,
                                                 pair_ctas=132, push_all=push_all)
    bf, f8 = seen[""], seen["e4m3"]
    assert len(bf) == len(f8) >= 6 and {v.in_dtype for v in f8} == {"e4m3"}
    # evict-last loads are a bf16 / fp16 rule (choose_gemm_l2_hint: fp8 was not timed with it)
    assert {v.l2_hint for v in f8} == {0} and {v.l2_hint for v in bf} != {0}
    assert ([dataclasses.replace(v, in_dtype="", l2_hint=0) for v in f8]
            == [dataclasses.replace(v, l2_hint=0) for v in bf])
    for mode in ("rs", "ar"):
        assert fixed["", mode][2] == 4096 and fixed["e4m3", mode][2] == 8192  # the kernel's K


def test_should_run_reads_the_table_at_half_the_depth(monkeypatch):
    calls = []
    monkeypatch.setattr(gemm_rsar.heuristics, "fused_wins",
                        lambda mode, M, N, K, world: calls.append(K) or True)
    op = planning_op("rs", input_dtype=FP8)
    op.max_M = 4096
    assert op.should_run(torch.empty(256, 4096, dtype=FP8))
    assert calls == [2048]


def test_reference_fp8_sum_adds_each_ranks_scaled_product():
    x0, w0, sx0, sw0 = rank_fp8_inputs(3, 0, 5, 16, 128, CPU)
    x1, w1, sx1, sw1 = rank_fp8_inputs(3, 1, 5, 16, 128, CPU)
    assert x0.dtype == FP8 and sx0.shape == (5, 1) and sw0.shape == (16,)
    assert not torch.equal(x0.float(), x1.float())
    ref = reference_fp8_sum(3, 2, 5, 16, 128, CPU)
    assert torch.allclose(ref, scaled_product(x0, w0, sx0, sw0) + scaled_product(x1, w1, sx1, sw1))
    assert rank_fp8_inputs(3, 0, 5, 16, 128, CPU, per_row=False)[2].shape == ()


def test_unknown_in_dtype_is_refused():
    from launch.sm90_kernel import Sm90FusedKernel
    with pytest.raises(ValueError, match="in_dtype must be one of"):
        Sm90FusedKernel(Variant("sm_90a", 128, 2, "rs", "unicast", in_dtype="e5m2"))


@pytest.mark.parametrize("bn", [64, 128, 160, 192, 224, 256])
@pytest.mark.parametrize("mode,push", [("gemm", "tma"), ("rs", "tma"), ("ar", "tma_all"),
                                       ("rs", "lsu")])
@pytest.mark.parametrize("stages", [0, 4])
def test_staged_scales_cost_no_stage_or_ring_slot(bn, mode, push, stages):
    """An fp8 variant's shared scale buffer fits in what the bf16 variant of the same plan
    leaves over: the same mainloop stages and sub-tile ring, so fp8 plans keep bf16's."""
    from launch.sm90_kernel import Sm90FusedKernel
    kw = dict(push=push, stages=stages)
    try:
        bf16 = Sm90FusedKernel(Variant("sm_90a", bn, 2, mode, "unicast", **kw))
    except ValueError:
        with pytest.raises(ValueError):
            Sm90FusedKernel(Variant("sm_90a", bn, 2, mode, "unicast", in_dtype="e4m3", **kw))
        return
    fp8 = Sm90FusedKernel(Variant("sm_90a", bn, 2, mode, "unicast", in_dtype="e4m3", **kw))
    assert (fp8.ab_stage, fp8.epi_slots) == (bf16.ab_stage, bf16.epi_slots)


def test_in_dtype_names_its_cache_entry():
    from launch import disk_cache
    v = Variant("sm_90a", 128, 2, "rs", "unicast", push="tma")
    f8 = dataclasses.replace(v, in_dtype="e4m3")
    assert disk_cache.entry_name(f8) != disk_cache.entry_name(v)
    assert "_ine4m3_" in disk_cache.entry_name(f8) and "e4m3" not in disk_cache.entry_name(v)
    assert f8.describe().endswith(" in=e4m3")


# ---------------------------------------------------------------- PTX of fp8 variants
cutlass = pytest.importorskip("cutlass")

FP8_VARIANTS = [
    # RS on 2x1 clusters, AR with early copies, the GEMM alone's TMA store with the split-K
    # tail on a partial-tile width, thread-store pushes with fp16 results
    Variant("sm_90a", 256, 2, "rs", "unicast", 2, push="tma", pdl=1, prefetch=1,
            in_dtype="e4m3"),
    Variant("sm_90a", 224, 2, "ar", "unicast", push="tma_all", pdl=1, prefetch=1,
            early_copy=1, in_dtype="e4m3"),
    Variant("sm_90a", 160, 2, "gemm", "unicast", push="tma", pdl=1, sk=1, tma_store=1,
            in_dtype="e4m3"),
    Variant("sm_90a", 128, 4, "rs", "unicast", dtype="f16", in_dtype="e4m3"),
    # the multicast reduction (compiled only: multicast is off on the GPU machines here)
    Variant("sm_90a", 128, 2, "ar", "multicast", pdl=1, in_dtype="e4m3"),
]


@pytest.mark.parametrize("v", FP8_VARIANTS, ids=lambda v: v.describe().replace(" ", "-"))
def test_fp8_variant_ptx(ptx_of, v):
    from ptx_checks import assert_protocol_ptx
    ptx = ptx_of(v)
    mmas = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k(\d+)\.(\w+\.\w+\.\w+)",
                          ptx))
    assert mmas == {(str(v.bn), "32", "f32.e4m3.e4m3")}
    out = "f16x2" if v.dtype == "f16" else "bf16x2"
    assert f"cvt.rn.{out}.f32" in ptx
    if v.transport == "multicast":
        assert f"multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.{out}" in ptx
    # the scales: staged by asynchronous 4-byte copies as each tile starts (a row's and a
    # column's per MMA thread), then read from shared memory, one load per distinct row (2)
    # and pair of adjacent columns (BN / 8) of a thread's fragment; none from global memory
    assert len(re.findall(r"cp\.async\.ca\.shared\.global \[%r\d+\], \[%rd\d+\], 4;", ptx)) == 2
    assert "cp.async.wait_group" in ptx
    assert len(re.findall(r"ld\.shared\.b32", ptx)) >= 2
    assert len(re.findall(r"ld\.shared\.v2\.b32", ptx)) >= v.bn // 8
    assert not re.findall(r"ld\.global(?:\.nc)?\.(?:b32|f32)", ptx)
    assert_protocol_ptx(ptx, v)


@pytest.mark.parametrize("v", [
    Variant("sm_100a", 256, 2, "rs", "unicast", 2, in_dtype="e4m3"),
    Variant("sm_100a", 128, 2, "gemm", "unicast", in_dtype="e4m3")],
    ids=lambda v: v.describe().replace(" ", "-"))
def test_sm100_fp8_variant_ptx(ptx_of, v):
    """Blackwell (compiled, not run): tcgen05 fp8 MMAs, one row scale a tile and one column
    scale per value of each 32-column sub-tile."""
    ptx = ptx_of(v)
    assert set(re.findall(r"tcgen05\.mma\.cta_group::\d\.kind::(\w+)", ptx)) == {"f8f6f4"}
    assert "cvt.rn.bf16x2.f32" in ptx
    assert len(re.findall(r"ld\.global\.b32", ptx)) == 1 + v.bn


def test_a_bf16_variant_has_no_fp8_or_scale(ptx_of):
    ptx = ptx_of(Variant("sm_90a", 224, 2, "gemm", "unicast", push="tma", pdl=1, tma_store=1))
    assert "e4m3" not in ptx and "k16.f32.bf16.bf16" in ptx
    assert not re.findall(r"ld\.global(?:\.nc)?\.(?:b32|f32)", ptx)
    assert "cp.async.ca" not in ptx
