"""Block-wise fp8 scales on the CPU (DeepSeek-V3 style: x's per row and 128-element k-group,
w's per 128 x 128 block): the layouts a call accepts and the bits they give the kernel,
what is refused before any launch, the plans and variants such calls run, and the PTX of
those variants (a k-group's products promoted into the sums with their scales)."""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from launch.cache import CACHE
from launch.variant import Variant
from launch.tuning import Tuning
from op_stub import cpu_op, planning_op
from rsar_core import gemm_rsar
from rsar_core.errors import RsarValueError, UnsupportedError
from rsar_core.reference import rank_fp8_inputs, scaled_product
from rsar_core.validate import (SCALE_BLOCK, SCALE_STRIDE_SHIFT, SCALE_W_COLMAJOR,
                                SCALE_X_MMAJOR, check_scales)

FP8 = torch.float8_e4m3fn
CPU = torch.device("cpu")


def _inputs(M: int = 6, N: int = 200, K: int = 384):
    return rank_fp8_inputs(2, 0, M, N, K, CPU, block=True)


def test_block_layouts_give_the_kernel_their_bits():
    x, w, sx, sw = _inputs()  # M 6, N 200 (two w blocks, the second partial), K 384
    assert sx.shape == (6, 3) and sw.shape == (2, 3)
    row = SCALE_BLOCK | 3 << SCALE_STRIDE_SHIFT
    assert check_scales(sx, sw, 6, 200, CPU, "e4m3", 384) == row
    m_major = sx.t().contiguous().t()  # torch's BlockWise1x128 layout
    assert check_scales(m_major, sw, 6, 200, CPU, "e4m3", 384) == (
        SCALE_BLOCK | SCALE_X_MMAJOR | 6 << SCALE_STRIDE_SHIFT)
    padded = torch.empty(3, 8)[:, :6].t()  # M-major, rows padded to 8 (TMA-aligned)
    assert check_scales(padded, sw, 6, 200, CPU, "e4m3", 384) == (
        SCALE_BLOCK | SCALE_X_MMAJOR | 8 << SCALE_STRIDE_SHIFT)
    col_w = sw.t().contiguous().t()
    assert check_scales(sx, col_w, 6, 200, CPU, "e4m3", 384) == row | SCALE_W_COLMAJOR


def test_without_k_the_old_forms_are_unchanged():
    """One k-group: a (M, 1) x scale is per row; per-tensor and per-row w stay as they were."""
    assert check_scales(torch.ones(6, 1), torch.ones(200), 6, 200, CPU, "e4m3", 128) == 3
    assert check_scales(torch.ones(()), torch.ones(()), 6, 200, CPU, "e4m3", 384) == 0


@pytest.mark.parametrize("case,match", [
    ("x_block_w_row", r"so w_scale must be too: .*shape \(2, 3\), got \(200,\)"),
    ("x_row_w_block", r"so x_scale must be too: .*shape \(6, 3\), got \(6, 1\)"),
    ("x_wrong_groups", r"so x_scale must be too: .*got \(6, 2\)"),
    ("w_wrong_blocks", r"so w_scale must be too: .*shape \(2, 3\), got \(3, 3\)"),
    ("x_strided", r"row-major or M-major"),
    ("w_strided", r"must be dense, row-major or column-major"),
])
def test_bad_block_scales_are_refused_before_any_launch(monkeypatch, case, match):
    op = cpu_op(monkeypatch, "ar", N=200, input_dtype=FP8)
    x, w, sx, sw = _inputs()
    bad = {
        "x_block_w_row": (sx, torch.ones(200)),
        "x_row_w_block": (torch.ones(6, 1), sw),
        "x_wrong_groups": (torch.ones(6, 2), sw),
        "w_wrong_blocks": (sx, torch.ones(3, 3)),
        "x_strided": (torch.ones(6, 6)[:, ::2], sw),
        "w_strided": (sx, torch.ones(2, 6)[:, ::2]),
    }[case]
    with pytest.raises(RsarValueError, match=match):
        op(x, w, *bad)
    y = op(x, w, sx, sw)  # still usable
    assert torch.allclose(y.float(), scaled_product(x, w, sx, sw).float(), rtol=1e-2, atol=1e-3)


def test_a_block_call_returns_the_blockwise_product(monkeypatch):
    """The scales broadcast over the blocks they scale: a wrong block would show (scales
    spread over 2^-4..2^5)."""
    op = cpu_op(monkeypatch, "ar", N=200, input_dtype=FP8)
    x, w, sx, sw = _inputs()
    y = op(x, w, sx, sw)
    want = torch.zeros(6, 200, dtype=torch.float64)
    for k in range(3):
        xs = x[:, 128 * k:128 * (k + 1)].double() * sx[:, k:k + 1].double()
        for b in range(2):
            ws = w[128 * b:128 * (b + 1), 128 * k:128 * (k + 1)].double() * float(sw[b, k])
            want[:, 128 * b:128 * (b + 1)] += xs @ ws.T
    assert torch.allclose(y.float(), want.float(), rtol=1e-2, atol=1e-3)
    per_row = scaled_product(x, w, sx[:, :1].contiguous(), sw[:1, :1].reshape(()))
    assert not torch.allclose(y.float(), per_row.float(), rtol=1e-1)


def test_block_plans_are_128_wide_and_their_variants_marked(monkeypatch):
    seen: list = []
    monkeypatch.setattr(gemm_rsar.GemmRsAr, "pair_ctas", property(lambda self: self.sm_count))
    monkeypatch.setattr(gemm_rsar.GemmRsAr, "quad_ctas", property(lambda self: self.sm_count))
    monkeypatch.setattr(CACHE, "get", lambda v: seen.append(v) or object())
    for mode in ("rs", "ar"):
        op = planning_op(mode, input_dtype=FP8)
        op.max_M = 16384
        op.warmup([1, 128, 700, 4096, 16384], 7168, block_scales=True)
        op._prepare(2048, 4096, "gemm", block=True)
        op.warmup([4096], 7168)  # the same M with other scales: its own plan and variant
    blocks = [v for v in seen if v.block_scales]
    assert len(blocks) == 2 * 6 and {v.bn for v in blocks} == {128}
    assert {v.in_dtype for v in seen} == {"e4m3"}
    assert [v for v in seen if not v.block_scales and v.bn != 128]  # default widths elsewhere
    op = planning_op("rs", input_dtype=FP8, tuning=Tuning(bn=64))
    assert op.plan(4096, 7168, block=True).bn == 64


def test_block_scales_refuse_other_widths_and_archs(monkeypatch):
    x, w, sx, sw = _inputs()
    wide = cpu_op(monkeypatch, "rs", N=200, input_dtype=FP8, tuning=Tuning(bn=256))
    with pytest.raises(RsarValueError, match="64 or 128 wide"):
        wide(x, w, sx, sw)
    op = cpu_op(monkeypatch, "rs", N=200, input_dtype=FP8)
    assert op(x, w, sx, sw).shape == (3, 200)
    monkeypatch.setattr(gemm_rsar.GemmRsAr, "pair_ctas", property(lambda self: self.sm_count))
    monkeypatch.setattr(gemm_rsar.GemmRsAr, "quad_ctas", property(lambda self: self.sm_count))
    sm100 = planning_op("rs", arch="sm_100a", input_dtype=FP8)
    with pytest.raises(UnsupportedError, match="sm90"):
        sm100.plan(4096, 7168, block=True)
    bf16 = planning_op("rs")
    with pytest.raises(RsarValueError, match="for fp8 operands"):
        check_scales(sx, sw, 6, 200, CPU, "", 384)
    with pytest.raises(RsarValueError, match="fp8 ops"):
        bf16.plan(4096, 7168, block=True)


def test_block_kernels_are_fp8_tiles_of_at_most_128():
    from launch.sm90_kernel import Sm90FusedKernel
    for bn in (160, 192, 224, 256):
        with pytest.raises(ValueError, match="64 or 128 wide"):
            Sm90FusedKernel(Variant("sm_90a", bn, 2, "rs", "unicast", in_dtype="e4m3", block_scales=1))
    with pytest.raises(ValueError, match="fp8 operands"):
        Sm90FusedKernel(Variant("sm_90a", 128, 2, "rs", "unicast", block_scales=1))
    # no shared scale buffer: the mainloop keeps every stage the bf16 plan has
    for mode, push in (("gemm", "tma"), ("rs", "tma"), ("ar", "tma_all"), ("rs", "lsu")):
        bf16 = Sm90FusedKernel(Variant("sm_90a", 128, 2, mode, "unicast", push=push))
        blk = Sm90FusedKernel(Variant("sm_90a", 128, 2, mode, "unicast", push=push, in_dtype="e4m3",
                              block_scales=1))
        assert (blk.ab_stage, blk.epi_slots) == (bf16.ab_stage, bf16.epi_slots)


def test_block_scales_name_their_cache_entry():
    from launch import disk_cache
    v = Variant("sm_90a", 128, 2, "rs", "unicast", push="tma", in_dtype="e4m3")
    b = dataclasses.replace(v, block_scales=1)
    assert disk_cache.entry_name(b) != disk_cache.entry_name(v) and "_bs1" in disk_cache.entry_name(b)
    assert "block_scales=1" in b.describe()


# ---------------------------------------------------------------- PTX of block variants
cutlass = pytest.importorskip("cutlass")

BLOCK_VARIANTS = [
    # the GEMM alone's TMA store with the split-K tail, RS on 2x1 clusters, AR with early
    # copies on 64-wide tiles, fp16 results at world 4
    Variant("sm_90a", 128, 2, "gemm", "unicast", push="tma", pdl=1, sk=1, tma_store=1,
            in_dtype="e4m3", block_scales=1),
    Variant("sm_90a", 128, 2, "rs", "unicast", 2, push="tma", pdl=1, prefetch=1,
            in_dtype="e4m3", block_scales=1),
    Variant("sm_90a", 64, 2, "ar", "unicast", push="tma_all", pdl=1, prefetch=1,
            early_copy=1, in_dtype="e4m3", block_scales=1),
    Variant("sm_90a", 128, 4, "rs", "unicast", dtype="f16", in_dtype="e4m3", block_scales=1),
]


@pytest.mark.parametrize("v", BLOCK_VARIANTS, ids=lambda v: v.describe().replace(" ", "-"))
def test_block_variant_ptx(ptx_of, v):
    """Each k-group's wgmmas start a fresh product set and are waited for before their
    products are added (one fma each): on the GEMM alone with the TMA store, two k-groups at a
    time into two sets (the first waited for with one group still in flight), elsewhere one;
    none is left in flight across a loop edge. The scales are read-only loads per thread (two
    x rows, one w block): three for each of a tile's first two k-groups and three after each
    k-group's adds; nothing is staged in shared memory for an epilogue to scale."""
    from ptx_checks import assert_protocol_ptx
    ptx = ptx_of(v)
    mmas = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k(\d+)\.(\w+\.\w+\.\w+)",
                          ptx))
    assert mmas == {(str(v.bn), "32", "f32.e4m3.e4m3")}
    waits = re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+);", ptx)
    pairs = v.mode == "gemm" and v.tma_store
    assert sorted(set(waits)) == (["0", "1"] if pairs else ["0"])
    assert len(re.findall(r"ld\.global\.nc\.f32", ptx)) == 12
    # two k-groups' adds in the loop, one in the odd count's tail
    assert len(re.findall(r"fma\.rn\.f32", ptx)) >= 3 * v.bn // 2
    assert "cp.async.ca" not in ptx
    assert_protocol_ptx(ptx, v)


@pytest.mark.parametrize("v", BLOCK_VARIANTS, ids=lambda v: v.describe().replace(" ", "-"))
def test_block_variant_wgmmas_stay_async(ptx_of, v, tmp_path):
    """ptxas keeps every wgmma asynchronous and spills nothing at world 2. A product set
    read while a wgmma is in flight across a loop edge makes it serialize them all (C7514),
    and two sets at the fused kernels' 200 registers spill in the mainloop; both measured
    slower than one set (docs/PERF.md (ae))."""
    from ptx_checks import ptxas_log
    log = ptxas_log(ptx_of(v), tmp_path)
    assert "C7514" not in log and "C7517" not in log, log[-2000:]
    if v.world == 2:  # (world 4's thread-store communication code spills a few bytes, bf16's too)
        assert " 0 bytes spill stores" in log, log[-2000:]


def test_block_pairs_take_the_first_warp_groups_registers():
    """Two product sets on the GEMM alone with the TMA store, whose first warp group only
    issues copies (40 registers each, 232 for the MMA threads); one set elsewhere, where the
    communication threads keep their 104."""
    from launch.sm90_kernel import Sm90FusedKernel
    pairs = Sm90FusedKernel(Variant("sm_90a", 128, 2, "gemm", "unicast", push="tma", tma_store=1, in_dtype="e4m3",
                            block_scales=1))
    assert pairs.block_pairs and (pairs.producer_regs, pairs.mma_regs) == (40, 232)
    assert 128 * pairs.producer_regs + 256 * pairs.mma_regs <= 65536
    for mode, kw in (("gemm", {"push": "tma"}), ("rs", {"push": "tma"}),
                     ("ar", {"push": "tma_all"})):
        one = Sm90FusedKernel(Variant("sm_90a", 128, 2, mode, "unicast", in_dtype="e4m3", block_scales=1, **kw))
        assert not one.block_pairs and (one.producer_regs, one.mma_regs) == (104, 200)
    row = Sm90FusedKernel(Variant("sm_90a", 128, 2, "gemm", "unicast", push="tma", tma_store=1, in_dtype="e4m3"))
    assert not row.block_pairs and (row.producer_regs, row.mma_regs) == (104, 200)
