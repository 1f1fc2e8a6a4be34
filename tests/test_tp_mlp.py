"""rsar_core.tp_mlp and its report on a CPU-only machine.

- The block math in float32 / float64 on tiny sizes: seeded weights, shards that tile the full
  weights, sharded partials that sum to the single-device reference, a bias added once, the
  fp8 references that dequantize each rank's operands.
- The four variants on 2 CPU processes (gloo, tests/tp_mlp_child.py) with a stand-in for
  GemmRsAr: each passes ``check_every_rank`` in bf16, f16, fp8 row and block scales, with and
  without a bias; a stand-in that skips the reduction, drops the bias or adds it on every rank
  is caught; every variant's timed ``down`` adds the bias once.
- The report's lines from a result dict (the last line is what the GPU scripts pick).
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from rsar_core import tp_mlp
from rsar_core.quantize import SCALE_MODES, quantizers
from rsar_core.reference import scaled_product
from rsar_core.tp_mlp_report import LABELS, report_lines, summarize
from script_runs import REPO, plain_env

CPU = torch.device("cpu")
H, I, T = 128, 512, 37
TOL = 2e-2  # the worker's check


@pytest.fixture(scope="module")
def full64():
    return (tp_mlp.make_input(3, T, H, CPU, torch.float64),
            *tp_mlp.make_weights(3, H, I, CPU, torch.float64))


# --------------------------------------------------------------------------- block math
def test_weights_seeded_and_scaled(full64):
    x, wg, wu, wd = full64
    assert x.shape == (T, H) and wg.shape == wu.shape == (I, H) and wd.shape == (H, I)
    again = tp_mlp.make_weights(3, H, I, CPU, torch.float64)
    assert all(torch.equal(a, b) for a, b in zip((wg, wu, wd), again))
    assert torch.equal(x, tp_mlp.make_input(3, T, H, CPU, torch.float64))
    assert not torch.equal(wg, tp_mlp.make_weights(4, H, I, CPU, torch.float64)[0])
    assert not torch.equal(wg, wu)
    assert abs(float(wg.std()) - H ** -0.5) < 0.1 * H ** -0.5
    assert abs(float(wd.std()) - I ** -0.5) < 0.1 * I ** -0.5
    bf = tp_mlp.make_weights(3, H, I, CPU)
    assert all(t.dtype == torch.bfloat16 for t in bf)
    assert tp_mlp.fingerprint(*bf) == tp_mlp.fingerprint(*tp_mlp.make_weights(3, H, I, CPU))
    assert tp_mlp.fingerprint(*bf) != tp_mlp.fingerprint(*tp_mlp.make_weights(5, H, I, CPU))


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_shards_tile_the_full_weights(full64, world):
    _, wg, wu, wd = full64
    shards = [tp_mlp.shard_weights(wg, wu, wd, r, world) for r in range(world)]
    for g, u, d in shards:
        assert g.shape == u.shape == (I // world, H) and d.shape == (H, I // world)
        assert g.is_contiguous() and u.is_contiguous() and d.is_contiguous()
    assert torch.equal(torch.cat([s[0] for s in shards]), wg)
    assert torch.equal(torch.cat([s[1] for s in shards]), wu)
    assert torch.equal(torch.cat([s[2] for s in shards], dim=1), wd)
    with pytest.raises(ValueError, match="not divisible"):
        tp_mlp.shard_weights(wg, wu, wd, 0, 3)
    with pytest.raises(ValueError, match="rank"):
        tp_mlp.shard_weights(wg, wu, wd, world, world)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_sharded_partials_sum_to_the_reference(full64, world):
    x, wg, wu, wd = full64
    want = (F.silu(x @ wg.T) * (x @ wu.T)) @ wd.T  # float64, from the full weights
    ref = tp_mlp.reference_block(x, wg, wu, wd)
    assert ref.shape == (T, H) and ref.dtype == torch.float32
    torch.testing.assert_close(ref.double(), want, rtol=1e-5, atol=1e-6)
    total = torch.zeros(T, H, dtype=torch.float64)
    for r in range(world):
        g, u, d = tp_mlp.shard_weights(wg, wu, wd, r, world)
        h = tp_mlp.mlp_hidden(x, tp_mlp.fuse_gate_up(g, u))
        assert h.shape == (T, I // world) and h.is_contiguous()
        total += h @ d.T
    torch.testing.assert_close(total, want, rtol=1e-10, atol=1e-12)
    assert float(want.norm()) > 0.1 * (T * H) ** 0.5  # activations of order one


def test_bf16_shards_stay_within_the_check(full64):
    x, wg, wu, wd = full64
    ref = tp_mlp.reference_block(x, wg, wu, wd)
    acc = torch.zeros(T, H)
    for r in range(2):
        g, u, d = (t.to(torch.bfloat16) for t in tp_mlp.shard_weights(wg, wu, wd, r, 2))
        acc += (tp_mlp.mlp_hidden(x.to(torch.bfloat16), tp_mlp.fuse_gate_up(g, u)) @ d.T).float()
    assert 1e-4 < tp_mlp.rel_error(acc.to(torch.bfloat16), ref) < TOL / 2


def test_padded_rows_and_rel_error():
    assert [tp_mlp.padded_rows(t, 2) for t in (1, 2, 3, 4096, 4097)] == [2, 2, 4, 4096, 4098]
    assert tp_mlp.padded_rows(101, 8) == 104
    ref = torch.ones(4, 4)
    assert tp_mlp.rel_error(ref.clone(), ref) == 0.0
    assert tp_mlp.rel_error(ref * 1.01, ref) == pytest.approx(0.01, rel=1e-4)
    bad = ref.clone()
    bad[0, 0] = float("nan")
    assert tp_mlp.rel_error(bad, ref) == float("inf")


def test_bias_seeded_of_the_outputs_magnitude(full64):
    x, wg, wu, wd = full64
    b = tp_mlp.make_bias(3, H, CPU)
    assert b.shape == (H,) and b.dtype == torch.bfloat16 and b.is_contiguous()
    assert torch.equal(b, tp_mlp.make_bias(3, H, CPU))
    assert not torch.equal(b, tp_mlp.make_bias(4, H, CPU))
    b32 = tp_mlp.make_bias(3, H, CPU, torch.float32)
    assert not any(torch.equal(b32, t[0, :H].float()) for t in (wg, wu, wd))  # own stream
    ref = tp_mlp.reference_block(x, wg, wu, wd)
    assert 0.5 * float(ref.std()) < float(b32.std()) < 2 * float(ref.std())
    with_b = tp_mlp.reference_block(x, wg, wu, wd, bias=b32)
    torch.testing.assert_close(with_b, ref + b32)
    # missing or added twice: far outside the check
    assert tp_mlp.rel_error(ref, with_b) > 10 * TOL
    assert tp_mlp.rel_error(with_b + b32, with_b) > 10 * TOL


@pytest.mark.parametrize("scales, hidden", [("row", 64), ("block", 200)])
def test_fp8_reference_dequantizes_each_ranks_operands(scales, hidden):
    x = tp_mlp.make_input(3, 9, hidden, CPU)
    full = tp_mlp.make_weights(3, hidden, 512, CPU)  # K = 256 per rank
    b = tp_mlp.make_bias(3, hidden, CPU)
    quant_h, quant_w = quantizers(scales)
    want = torch.zeros(9, hidden, dtype=torch.float64)
    for r in range(2):
        wg, wu, wd = tp_mlp.shard_weights(*full, r, 2)
        h8, sh = quant_h(tp_mlp.mlp_hidden(x, tp_mlp.fuse_gate_up(wg, wu)))
        w8, sw = quant_w(wd)
        want += scaled_product(h8, w8, sh, sw)
    ref8 = tp_mlp.reference_block_fp8(x, *full, 2, scales)
    assert ref8.shape == (9, hidden) and ref8.dtype == torch.float32
    torch.testing.assert_close(ref8.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tp_mlp.reference_block_fp8(x, *full, 2, scales, bias=b),
                               ref8 + b.float())
    # close to the bf16 block, not equal: quantization moves it by a few percent
    assert 1e-3 < tp_mlp.rel_error(ref8, tp_mlp.reference_block(x, *full)) < 0.1


def test_baseline_error_names_the_refusal(monkeypatch):
    from rsar_core import reference

    def refuse(*a, **kw):
        raise ValueError("unsupported here\nsecond line")

    h8, sh = quantizers("block")[0](torch.randn(5, 256))
    w8, sw = quantizers("block")[1](torch.randn(200, 256))
    monkeypatch.setattr(reference, "scaled_mm", refuse)
    assert tp_mlp.baseline_error(h8, w8, sh, sw, torch.bfloat16) == "ValueError: unsupported here"
    monkeypatch.setattr(reference, "scaled_mm", lambda *a, **kw: None)
    assert tp_mlp.baseline_error(h8, w8, sh, sw, torch.bfloat16) is None


def test_check_every_rank_refuses_a_wrong_output_without_the_exchange():
    y = torch.zeros(4, 8, dtype=torch.float16)
    c = tp_mlp.check_every_rank(y, None, (4, 8), torch.bfloat16, TOL)
    assert c == {"ok": False, "error": "output (4, 8) torch.float16, expected (4, 8) "
                                       "torch.bfloat16"}
    assert not tp_mlp.check_every_rank(y, None, (5, 8), torch.float16, TOL)["ok"]


# --------------------------------------------------------------------------- on 2 CPU ranks
@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp_mlp")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", str(REPO / "tests" / "tp_mlp_child.py"),
                        "variants", str(out)], capture_output=True, text=True, timeout=240,
                       env=plain_env(OMP_NUM_THREADS="1"), cwd=str(REPO),
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads((out / "variants.json").read_text())


@pytest.mark.parametrize("case", ["bf16", "f16", "e4m3_row", "e4m3_block", "bf16_bias",
                                  "e4m3_block_bias"])
def test_every_variant_passes(two_ranks, case):
    r = two_ranks[case]
    assert sorted(r["checks"]) == sorted(tp_mlp.VARIANTS)
    for name, c in r["checks"].items():
        # both ranks hold the whole block, and the same one
        assert c["ok"] and len(c["rel_err"]) == 2 and max(c["rel_err"]) < 1e-2, (name, c)
        assert c["rank_diff"] == 0.0, (name, c)
    assert r["calls"] == [1, 1]  # one fused AR and one fused RS call: the fused variants
    assert r["block_calls"] == ([1, 1] if "block" in case else [0, 0])
    assert r["bias_calls"] == ([1, 1] if "bias" in case else [0, 0])


@pytest.mark.parametrize("case", ["bf16_bias", "e4m3_block_bias"])
def test_every_timed_down_adds_the_bias_once(two_ranks, case):
    r = two_ranks[case]
    b_sum = float(tp_mlp.make_bias(0, 128 if case == "bf16_bias" else 200, CPU)
                  .sum(dtype=torch.float64))
    assert r["bias_sums"] == [b_sum]  # the seeded b_down reached the fused op
    # (with the bias) - (without) - b_down: bf16 rounding, not 0.5 (missing) or 1 (twice)
    assert sorted(r["down_bias"]) == sorted(tp_mlp.VARIANTS)
    assert all(d < 0.1 for d in r["down_bias"].values()), r["down_bias"]


@pytest.mark.parametrize("case, failing", [
    ("no_reduce", {"fused_ar"}),
    ("bias_dropped", {"fused_ar", "fused_rs_ag"}),
    ("bias_twice", {"fused_ar", "fused_rs_ag"}),
])
def test_a_wrong_op_is_caught(two_ranks, case, failing):
    checks = two_ranks[case]["checks"]
    assert {n for n, c in checks.items() if not c["ok"]} == failing
    assert all(min(checks[n]["rel_err"]) > 0.1 for n in failing)


def test_object_collectives_and_the_timing_barrier(two_ranks):
    assert two_ranks["gathered"] == [{"rank": 0}, {"rank": 1}]
    assert two_ranks["broadcast"] == "from 1"
    assert two_ranks["median_us"] > 0


# --------------------------------------------------------------------------- report
def _result(ok: bool = True) -> dict:
    us = {"fused_ar": {"block": 1000.0, "down": 300.0}, "mm_ar": {"block": 1100.0, "down": 400.0},
          "fused_rs_ag": {"block": 1050.0, "down": 350.0},
          "mm_rs_ag": {"block": 1150.0, "down": 450.0}}
    checks = {n: {"ok": True, "rel_err": [2.5e-3, 2.5e-3], "rank_diff": 0.0}
              for n in tp_mlp.VARIANTS}
    if not ok:
        checks["fused_ar"] = {"ok": False, "rel_err": [0.7, 0.7], "rank_diff": 0.0}
    return {"config": {"world": 2, "launcher": "mpirun", "gpu": "NVIDIA H200 x2",
                       "transport": "unicast", "hidden": 4096, "inter": 14336, "tokens": 4096,
                       "padded_tokens": 4096, "seed": 0, "iters": 20, "warmup": 5},
            "tol": TOL, "weights_identical": True, "should_run": {"ar": True, "rs": True},
            "checks": checks, "us": us, "summary": summarize(4096, us), "ok": ok}


def test_summarize():
    s = _result()["summary"]
    assert s["tokens_per_s"]["fused_ar"] == pytest.approx(4096 / 1e-3)
    assert s["speedup"]["AR"] == {"block": pytest.approx(1.1), "down": pytest.approx(4 / 3)}
    assert s["speedup"]["RS+AG"]["block"] == pytest.approx(1150 / 1050)


def test_report_readable():
    text = "\n".join(report_lines(_result()))
    assert "2 ranks (mpirun)" in text and "7168 per rank" in text
    assert all(LABELS[n] in text for n in tp_mlp.VARIANTS)
    assert "rank 0 2.50e-03  rank 1 2.50e-03  ok" in text
    assert "4,096,000" in text  # tokens/s of the fused AR block
    assert "AR     block x1.10, down+comm x1.33" in text
    assert text.splitlines()[-1] == "rsar tp_worker: all 4 checks passed (rel err < 0.02)"
    bad = "\n".join(report_lines(_result(ok=False)))
    assert "FAIL" in bad and bad.splitlines()[-1] == "rsar tp_worker: 1 of 4 checks FAILED"


def test_report_with_block_scales_and_no_baselines():
    res = _result()
    res["config"].update(dtype="e4m3", scales="block")
    for n in tp_mlp.BASELINES:
        del res["checks"][n], res["us"][n]
    res["summary"] = summarize(4096, res["us"])
    res["baseline_error"] = "ValueError: Invalid scaling configuration."
    res["unavailable"] = list(tp_mlp.BASELINES)
    text = "\n".join(report_lines(res))
    assert "(padded 4096 for RS), e4m3, block scales, seed 0" in text
    assert "128 x 128 block" in text and "BlockWise1x128" in text
    for n in tp_mlp.BASELINES:
        assert f"{LABELS[n]:<34s} n/a (baseline unavailable" in text
    assert "speedup" not in text.split("baselines n/a")[0]
    assert "(ValueError: Invalid scaling configuration.)" in text
    assert text.splitlines()[-1] == "rsar tp_worker: all 2 checks passed (rel err < 0.02)"


def test_report_says_bias_and_row_scales():
    res = _result()
    res["config"].update(bias=True, dtype="e4m3", scales="row")
    text = "\n".join(report_lines(res))
    assert "(padded 4096 for RS), e4m3, row scales, bias b_down, seed 0" in text
    assert "fused variants pass bias=b_down; baselines add it to rank 0's" in text
    assert "torch._scaled_mm (row-wise)" in text and "n/a" not in text
    res["config"]["bias"] = False
    assert "bias" not in "\n".join(report_lines(res))
    assert SCALE_MODES == ("row", "block")
