"""scripts/precompile.py fills the cache with every variant a default plan can launch."""
import importlib.util
import random
from pathlib import Path

import pytest

from launch.resolve import Hardware, Shape, resolve_variant


def default_variant(arch: str, world: int, tr: str, M: int, N: int, K: int, sms: int,
                    mode: str):
    return resolve_variant(Shape(M, N, K, mode), Hardware(arch, sms), world, tr)

_spec = importlib.util.spec_from_file_location(
    "precompile", Path(__file__).resolve().parents[1] / "scripts" / "precompile.py")
precompile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(precompile)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("world", [2, 4])
def test_every_default_plan_has_a_precompiled_variant(arch, world):
    vs = precompile.variants(arch, world, ["unicast", "multicast"])
    assert all(v.pdl == int(arch == "sm_90a") for v in vs)
    listed = set(vs)
    rng = random.Random(7)
    shapes = [(rng.randint(1, 70000), 128 * rng.randint(1, 80), 64 * rng.randint(1, 256))
              for _ in range(3000)]
    if arch == "sm_90a":  # N that ends each tile row on a partial tile
        shapes += [(rng.randint(1, 70000), 8 * rng.randint(1, 1280), 64 * rng.randint(1, 256))
                   for _ in range(1500)]
    # and every M just past a tile row at the widths the small-M rules pick between
    shapes += [(M, N, K) for M in range(65, 2049, 64) for N in (7168, 8192)
               for K in (1024, 2048, 4096, 9216)]
    for M, N, K in shapes:
        for mode in ("rs", "ar", "gemm"):
            for tr in ("unicast", "multicast"):
                if mode == "gemm" and tr == "multicast":
                    continue
                v = default_variant(arch, world, tr, M, N, K, 132, mode)
                assert v in listed, (M, N, K, mode, tr, v.describe())


def test_other_sm_counts_need_their_own_variants_and_get_them():
    """Plans follow the SM count: a 114-SM H100 PCIe launches variants a 132-SM build lacks;
    ``--sm-count 114`` covers nearly all of them (the shapes ``variants`` walks were chosen
    for 132 SMs; a variant it misses compiles at first use and is stored in the cache)."""
    only132 = set(precompile.variants("sm_90a", 2, ["unicast"]))
    both = set(precompile.variants("sm_90a", 2, ["unicast"], (132, 114)))
    assert only132 < both
    rng = random.Random(11)
    missed = total = 0
    for _ in range(1500):
        M, N, K = rng.randint(1, 20000), 128 * rng.randint(1, 80), 64 * rng.randint(1, 150)
        for mode in ("rs", "ar", "gemm"):
            v = default_variant("sm_90a", 2, "unicast", M, N, K, 114, mode)
            total += 1
            missed += v not in both
    assert missed <= total // 500, (missed, total)


def test_f16_builds_the_bf16_variants_again_for_fp16():
    """fp16 ops run bf16's plans, but for the GEMM alone's rules of docs/PERF.md (ai), bf16's
    only (``launch.resolve._fill_rules``)."""
    import dataclasses
    bf = precompile.variants("sm_90a", 2, ["unicast"])
    both = precompile.variants("sm_90a", 2, ["unicast"], dtypes=("bf16", "f16"))
    half = [v for v in both if v.dtype == "f16"]
    assert set(bf) <= set(both) and len(both) == len(bf) + len(half)
    assert ({dataclasses.replace(v, dtype="bf16") for v in half if v.mode != "gemm"}
            == {v for v in bf if v.mode != "gemm"})
    assert all(v.bm == 128 and not v.pingpong for v in half)


def test_unknown_dtypes_are_refused(tmp_path):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, str(Path(precompile.__file__)), "--arch", "sm_90a",
                        "--world", "2", "--out", str(tmp_path), "--dtypes", "bf16,f32"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--dtypes takes a comma-separated list of bf16, f16, e4m3, e4m3-block" in r.stderr
    assert not any(tmp_path.iterdir())


def test_e4m3_builds_the_bf16_variants_with_fp8_operands():
    """An fp8 op runs the plan of half its depth, so the bf16 walk's fused plans are the fp8
    ones; the GEMM alone's rules of docs/PERF.md (ai) (fine widths, ping-pong, 64-row tiles)
    are bf16's only, so fp8's GEMM keeps 128-row tiles without ping-pong. On sm100 too."""
    import dataclasses
    bf = precompile.variants("sm_90a", 2, ["unicast"])
    both = precompile.variants("sm_90a", 2, ["unicast"], dtypes=("bf16", "e4m3"))
    fp8 = [v for v in both if v.in_dtype == "e4m3"]
    assert all(v.dtype == "bf16" and not v.pingpong and v.bm == 128 for v in fp8)
    assert any(v.pingpong for v in bf) and any(v.bm == 64 for v in bf)
    fused = {dataclasses.replace(v, in_dtype="") for v in fp8 if v.mode != "gemm"}
    assert fused == {v for v in bf if v.mode != "gemm"}
    b100 = precompile.variants("sm_100a", 2, ["unicast"])
    f100 = precompile.variants("sm_100a", 2, ["unicast"], dtypes=("e4m3",))
    assert {dataclasses.replace(v, in_dtype="") for v in f100} == set(b100)


def test_block_scales_build_the_128_wide_plans_of_each_shape(monkeypatch):
    """``e4m3-block``: the variants an fp8 op launches for calls with block-wise scales (its
    plans at 128-wide tiles), sm90 only; every one the op picks in a sample of shapes."""
    import torch
    from op_stub import planning_op
    from rsar_core import gemm_rsar
    from launch.cache import CACHE
    blk = precompile.variants("sm_90a", 2, ["unicast"], dtypes=("e4m3-block",))
    assert blk and all(v.block_scales and v.in_dtype == "e4m3" and v.bn == 128 for v in blk)
    assert not precompile.variants("sm_100a", 2, ["unicast"], dtypes=("e4m3-block",))
    seen: list = []
    monkeypatch.setattr(gemm_rsar.GemmRsAr, "pair_ctas", property(lambda self: self.sm_count))
    monkeypatch.setattr(gemm_rsar.GemmRsAr, "quad_ctas", property(lambda self: self.sm_count))
    monkeypatch.setattr(CACHE, "get", lambda v: seen.append(v) or object())
    for mode in ("rs", "ar"):
        op = planning_op(mode, N=7168, input_dtype=torch.float8_e4m3fn)
        op.max_M = 16384
        op.warmup([1, 200, 1000, 4096, 16384], 8192, block_scales=True)
        op._prepare(3000, 2048, "gemm", block=True)
    assert seen and set(seen) <= set(blk)


def test_a_world_2_log_builds_a_world_4_cache_with_any_world(tmp_path):
    import dataclasses
    import json

    from launch.variant import Variant
    rs = Variant("sm_90a", 128, 2, "rs", "unicast", push="tma", peers_first=1, pdl=1)
    push_all = Variant("sm_90a", 64, 2, "ar", "unicast", push="tma_all", push_all=1, pdl=1)
    other_arch = Variant("sm_100a", 256, 2, "rs", "unicast")
    log = tmp_path / "used.jsonl"
    log.write_text("".join(json.dumps(dataclasses.asdict(v)) + "\n"
                           for v in (rs, push_all, other_arch, rs)))
    # without it: world-2 entries are not this world's, and are counted as left out
    vs, skipped = precompile.with_logged([], [str(log)], "sm_90a", 4)
    assert vs == [] and skipped == 3
    vs, skipped = precompile.with_logged([], [str(log)], "sm_90a", 4, any_world=True)
    assert vs == [dataclasses.replace(rs, world=4)]  # push-all AR is a world-2 plan
    assert skipped == 2
    # at the log's own world nothing moves, and what the defaults hold is not repeated
    vs, skipped = precompile.with_logged([rs], [str(log)], "sm_90a", 2, any_world=True)
    assert vs == [rs, push_all] and skipped == 1


def test_logged_only_keeps_the_logged_variants_of_its_dtypes():
    """``--logged-only --dtypes bf16``: the suites' bf16 kernels (no bias unless --bias),
    the cache a device call carries; ``dtype_name`` is how a variant is matched."""
    from launch.variant import Variant
    bf16 = Variant("sm_90a", 128, 2, "gemm", "unicast", push="tma", pdl=1)
    half = Variant("sm_90a", 128, 2, "gemm", "unicast", push="tma", pdl=1, dtype="f16")
    fp8 = Variant("sm_90a", 128, 2, "gemm", "unicast", push="tma", pdl=1, in_dtype="e4m3")
    block = Variant("sm_90a", 128, 2, "gemm", "unicast", push="tma", pdl=1, in_dtype="e4m3",
                    block_scales=1)
    biased = Variant("sm_90a", 128, 2, "rs", "unicast", push="tma", pdl=1, bias=1)
    assert [precompile.dtype_name(v) for v in (bf16, half, fp8, block, biased)] == [
        "bf16", "f16", "e4m3", precompile.BLOCK, "bf16"]
