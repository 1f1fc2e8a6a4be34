"""scripts/bench.py's ratios and report, on canned timings (no GPU)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "bench", Path(__file__).resolve().parents[1] / "scripts" / "bench.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def _row(M, us):
    row = dict(M=M, N=7168, K=1024, world=2, us=us, peer_gbps=390.0, bound_rs=100.0, bound_ar=150.0)
    row["ratios"] = bench._ratios(us, row)
    return row


def test_ratios_and_report():
    us = {"mm": 100.0, "mm_rs": 300.0, "mm_ar": 400.0, "rsar_rs": 150.0, "rsar_ar": 200.0,
          "gemm_only": 125.0, "torch_rs": 450.0, "gemm_b8_s0": 110.0, "gemm_b0_s4": 90.0}
    r = _row(4096, us)["ratios"]
    assert r["rs_speedup"] == 2.0 and r["ar_speedup"] == 2.0 and r["vs_torch_rs"] == 3.0
    assert r["gemm_vs_cublas"] == 0.8 and r["rs_over_bound"] == 1.5
    assert r["best_tuned"] == "gemm_b0_s4" and abs(r["best_tuned_vs_cublas"] - 100 / 90) < 1e-9
    md = bench.markdown([_row(4096, us), _row(512, {k: v / 2 for k, v in us.items()})])
    assert "| 4096 | 7168 | 1024 |" in md and "geomean rs_speedup: 2.000" in md
    assert "gemm_b0_s4" in md and "best vs cuBLAS" in md


def test_bias_columns_give_their_own_speedups():
    us = {"mm": 100.0, "mm_rs": 300.0, "rsar_rs": 150.0, "mm_rs_b": 320.0, "rsar_rs_b": 160.0,
          "mm_ar_b": 450.0, "rsar_ar_b": 150.0}
    r = _row(4096, us)["ratios"]
    assert r["rs_b_speedup"] == 2.0 and r["ar_b_speedup"] == 3.0
    md = bench.markdown([_row(4096, us)])
    assert "geomean rs_b_speedup (with a bias): 2.000" in md
    assert "with a bias" not in bench.markdown([_row(4096, {"mm": 1.0, "rsar_rs": 1.0})])


def test_geomean_ignores_missing():
    assert bench.geomean([2.0, None, 8.0]) == 4.0


def test_shuffled_column_order_depends_on_seed_and_shape_only():
    names = [f"c{i}" for i in range(12)]
    assert bench.column_order(names, None, 128, 7168, 1024) == names
    a = bench.column_order(names, 1, 16384, 8192, 9216)
    assert sorted(a) == sorted(names) and a != names
    assert a == bench.column_order(list(names), 1, 16384, 8192, 9216)  # every rank alike
    assert a != bench.column_order(names, 2, 16384, 8192, 9216)
    assert a != bench.column_order(names, 1, 16384, 7168, 9216)
    assert names == [f"c{i}" for i in range(12)]  # the caller's list is left alone


def test_blocks_put_every_column_after_different_columns():
    names = [f"c{i}" for i in range(10)]
    for seed in (None, 3):
        orders = [bench.column_order(names, seed, 4096, 7168, 4096, block=b) for b in range(5)]
        assert orders[0] == bench.column_order(names, seed, 4096, 7168, 4096)
        assert all(sorted(o) == names for o in orders)
        assert orders == [bench.column_order(names, seed, 4096, 7168, 4096, block=b)
                          for b in range(5)]  # every rank alike
        assert len({tuple(o) for o in orders}) == 5
        for n in names:
            before = {o[o.index(n) - 1] if o.index(n) else None for o in orders}
            places = {o.index(n) for o in orders}
            assert len(before) >= 2 and len(places) >= 2


def test_spread_is_median_and_interquartile_range_in_percent():
    us, iqr = bench.spread([1.0, 1.0, 1.0, 1.0, 1.0])
    assert us == 1000.0 and iqr == 0.0
    us, iqr = bench.spread([0.9, 1.0, 1.0, 1.0, 1.1, 1.2, 0.8, 1.0])
    assert us == 1000.0 and 5.0 < iqr < 20.0
    assert bench.spread([2.0])[1] == 0.0  # too few calls for quartiles


def test_markdown_reports_the_spread_when_rows_have_it():
    row = {"M": 128, "N": 7168, "K": 1024, "us": {"mm": 10.0}, "bound_rs": 10.0, "ratios": {},
           "iqr_pct": {"mm": 2.5}}
    assert "interquartile range" in bench.markdown([row]) and "mm 2.5" in bench.markdown([row])
    del row["iqr_pct"]  # rows of older runs
    assert "interquartile range" not in bench.markdown([row])


def test_columns_run_on_retuned_ops_built_once():
    """A column's callable is the op retuned by its Tuning fields (or that op's method), built
    at the column's first shape and reused after; the base op keeps its own tuning."""
    from launch.tuning import Tuning

    class Op:
        def __init__(self, tuning=Tuning()):
            self.tuning, self.built = tuning, []

        def retune(self, **changes):
            self.built.append(changes)
            return Op(self.tuning.replace(**changes))

        def __call__(self, x, w):
            return self.tuning

        def gemm_only(self, x, w):
            return ("gemm", self.tuning)

    op = Op()
    bench._RETUNED.clear()
    col = bench._with(op, op, bn=64, push_all=True)
    assert col(None, None) == Tuning(bn=64, push_all=True) and op.tuning == Tuning()
    assert bench._with(op, op, push_all=True, bn=64) is col and len(op.built) == 1
    g = bench._with(op, op.gemm_only, bn=128)
    assert g(None, None) == ("gemm", Tuning(bn=128))
    f = bench._forced(op, 1, None, op, bn=224)
    assert f(None, None) == Tuning(bn=224, cta_group=1, push="lsu", peers_first=False)
    bench._RETUNED.clear()


class _Comm:
    """Two ranks seen from one: ``other_dry`` is what the other rank reports per block."""

    def __init__(self, other_dry: list[bool]):
        self.other_dry, self.barriers, self.allgathers = list(other_dry), 0, 0

    def allgather(self, mine):
        self.allgathers += 1
        return [mine, self.other_dry.pop(0) if self.other_dry else False]

    def Barrier(self):
        self.barriers += 1


@pytest.mark.parametrize("mine,other,blocks", [(0, [], 1), (1, [], 2), (0, [True], 2),
                                               (9, [], 4)])
def test_a_block_is_taken_again_on_both_ranks_when_either_ran_dry(mine, other, blocks):
    import types
    from fake_cuda import FakeCuda
    b = object.__new__(bench.Bench)
    fake = FakeCuda(mine)
    b.torch, b.comm, b.retried = types.SimpleNamespace(cuda=fake), _Comm(other), 5
    calls = []
    ms = b.samples(lambda x: calls.append(x), [(1,), (2,)], 3, warmup=2, first=1)
    assert ms == [0.01] * 3 and b.retried == 5 + blocks - 1
    assert calls == [1, 2] + [2, 1, 2] * blocks  # the warm-up, then each block
    assert fake.sleeps == [b.sleep_cycles(3) << i for i in range(blocks)]


def test_calls_that_block_the_host_are_timed_once_without_a_sleep():
    import types
    from fake_cuda import FakeCuda
    b = object.__new__(bench.Bench)
    fake = FakeCuda(9)
    b.torch, b.comm, b.retried = types.SimpleNamespace(cuda=fake), _Comm([]), 0
    assert b.samples(lambda x: None, [(1,)], 2, warmup=0, queued=False) == [0.01] * 2
    assert fake.sleeps == [] and b.retried == 0
    assert b.comm.allgathers == 0  # nothing to agree on


def test_fp8_inputs_pad_with_their_row_scales_and_the_anchor_scales_them():
    """--dtype e4m3: the unfused reduce-scatter's padded x keeps per-row scales in step (the
    padding rows' scales are 1 on zero rows), a per-tensor scale stays one value, and the
    torch._scaled_mm anchor applies both forms."""
    import torch
    from rsar_core.reference import rank_fp8_inputs, scaled_mm, scaled_product
    cpu = torch.device("cpu")
    for per_row in (True, False):
        inputs = rank_fp8_inputs(1, 0, 5, 32, 128, cpu, per_row)
        x, w, sx, sw = bench._pad_rows(inputs, 6)
        assert x.shape == (6, 128) and x.dtype == torch.float8_e4m3fn and w is inputs[1]
        assert not x[5].float().any() and torch.equal(x[:5].float(), inputs[0].float())
        assert sx.shape == ((6, 1) if per_row else ()) and sw is inputs[3]
        y = scaled_mm(*inputs)
        want = scaled_product(*inputs)
        assert y.dtype == torch.bfloat16
        assert ((y.double() - want).norm() / want.norm()).item() < 1e-2
    assert bench._pad_rows((torch.ones(6, 8), torch.ones(4, 8)), 6)[0].shape == (6, 8)


def test_block_scales_pad_by_row_and_the_anchor_is_na_where_torch_refuses():
    """--scales block: x's (M, K / 128) scales gain rows of 1 with x's zero rows; w's block
    scales pass through. torch's block-wise scaled_mm raises where a build or shape lacks it
    (this CPU build, say): the shape's anchor columns are then n/a, with the reason, and
    symm_mem's fused op (no block-wise form) is n/a at every shape."""
    import torch
    from rsar_core.reference import call_refusal, rank_fp8_inputs, scaled_mm
    inputs = rank_fp8_inputs(1, 0, 5, 384, 256, torch.device("cpu"), block=True)
    x, w, sx, sw = bench._pad_rows(inputs, 6)
    assert x.shape == (6, 256) and sx.shape == (6, 2) and sw is inputs[3] and w is inputs[1]
    assert torch.equal(sx[:5], inputs[2]) and torch.equal(sx[5], torch.ones(2))
    assert not x[5].float().any()
    # torch's M-major layout (the benchmark's inputs) survives the padding
    mm_inputs = rank_fp8_inputs(1, 0, 5, 384, 256, torch.device("cpu"), block=True,
                                m_major=True)
    padded = bench._pad_rows(mm_inputs, 6)[2]
    assert padded.stride() == (1, 6) and torch.equal(padded[:5], mm_inputs[2])

    def refuses(*a):
        raise ValueError("Invalid scaling configuration.\n- For TensorWise ...")
    why = call_refusal(refuses, *inputs)
    assert why == "ValueError: Invalid scaling configuration."
    assert call_refusal(lambda *a: None, *inputs) is None
    try:
        scaled_mm(*inputs)
    except Exception:  # no block-wise scaled_mm here: reported, not raised
        assert call_refusal(scaled_mm, *inputs).startswith(
            ("ValueError", "RuntimeError", "NotImplementedError", "AttributeError"))
    else:
        assert call_refusal(scaled_mm, *inputs) is None
    assert bench.na_columns(True, None) == ["torch_rs"]
    assert bench.na_columns(True, why) == ["torch_rs", "mm", "mm_rs", "mm_ar"]
    assert bench.na_columns(False, why) == ["mm", "mm_rs", "mm_ar"]
    assert bench.na_columns(False, None) == []
    us = {"rsar_rs": 150.0, "rsar_ar": 200.0, "gemm_only": 125.0}
    row = _row(4096, us)
    row["anchor_error"] = why
    md = bench.markdown([row, _row(512, dict(us, mm=100.0))])
    assert "| 4096 | 7168 | 1024 | - | - | - | - | - | - | 125.0 |" in md
    assert "- M=4096 N=7168 K=1024: fp8 anchor n/a (ValueError: Invalid" in md
    assert "M=512 N=7168 K=1024: fp8 anchor" not in md
    assert "geomean gemm_vs_cublas: 0.800" in md


def test_input_sets_follow_the_dtype_and_the_scale_kind():
    """The sets each column rotates through: (x, w) of the op's dtype, or for fp8
    (x, w, x_scale, w_scale) with one scale each or one per row, enough bytes to pass L2."""
    import argparse
    import torch
    b = object.__new__(bench.Bench)
    b.rank, b.dev = 1, torch.device("cpu")
    for dtype, scales in (("bf16", "tensor"), ("e4m3", "tensor"), ("e4m3", "row"),
                          ("e4m3", "block")):
        b.fp8 = dtype == "e4m3"
        b.dtype = torch.bfloat16
        b.args = argparse.Namespace(scales=scales)
        sets = b.input_sets(64, 256, 512)
        assert len(sets) == 8  # small shapes: the most sets
        x, w, *sc = sets[0]
        assert x.shape == (64, 512) and w.shape == (256, 512)
        if not b.fp8:
            assert x.dtype == torch.bfloat16 and not sc
            continue
        assert x.dtype == w.dtype == torch.float8_e4m3fn and len(sc) == 2
        shapes = {"tensor": ((), ()), "row": ((64, 1), (256,)),
                  "block": ((64, 4), (2, 4))}  # K / 128 k-groups, ceil(N / 128) blocks
        assert (sc[0].shape, sc[1].shape) == shapes[scales]
        assert all(s.dtype == torch.float32 for s in sc)
        assert not torch.equal(sets[0][0].float(), sets[1][0].float())


def test_scales_choices_include_block_wise(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["bench.py", "--dtype", "e4m3", "--scales", "block"])
    a = bench.parse()
    assert (a.dtype, a.scales) == ("e4m3", "block")
    monkeypatch.setattr("sys.argv", ["bench.py", "--dtype", "e4m3", "--scales", "blocks"])
    with pytest.raises(SystemExit) as e:
        bench.parse()
    assert e.value.code == 2 and "--scales" in capsys.readouterr().err
