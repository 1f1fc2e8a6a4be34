"""scripts/gemm_one_gpu.py: bad arguments are refused before a GPU is touched, and each
column name maps to the plan and kernel variant it stands for."""
import pytest

from fake_cuda import FakeCuda
from script_runs import load_script, run_script


def _run(*args: str):
    return run_script("gemm_one_gpu.py", *args)


def _module():
    return load_script("gemm_one_gpu.py", "gemm_one_gpu")


def test_bad_columns_and_shapes_are_refused():
    r = _run("--columns", "default,c5")
    assert r.returncode == 2 and "unknown column part 'c5'" in r.stderr
    r = _run("--shapes", "128,7168")
    assert r.returncode == 2 and "M,N,K triples" in r.stderr
    r = _run("--shapes", "a,b,c")
    assert r.returncode == 2 and "M,N,K triples" in r.stderr
    r = _run("--iters", "0")
    assert r.returncode == 2 and "--iters" in r.stderr
    r = _run("--dtype", "f32")
    assert r.returncode == 2 and "--dtype" in r.stderr


def test_columns_are_the_plans_they_name():
    from launch.plan import make_plan
    mod = _module()
    plan, v = mod.column_plan("default", 2048, 7168, 4096)
    assert plan == make_plan(2048, 7168, 4096, 2, 132, "gemm")
    assert (v.mode, v.bn, v.cta_group, v.pdl, v.push, v.stages) == ("gemm", plan.bn,
                                                                    plan.cta_group, 1, "tma", 0)
    # the op's default_stages where it applies; stages3 turns it off
    assert mod.column_plan("default", 1024, 7168, 4096)[1].stages == 4
    assert mod.column_plan("stages3", 1024, 7168, 4096)[1].stages == 3
    plan, v = mod.column_plan("c1+bn256", 2048, 7168, 4096)
    assert (plan.cta_group, plan.bn, v.cta_group, v.bn) == (1, 256, 1, 256)
    with pytest.raises(ValueError):
        mod.column_plan("bn96", 512, 8192, 4096)  # no such tile width
    # a forced width that does not divide N ends each tile row on a partial tile
    assert mod.column_plan("bn224", 512, 8192, 4096)[0].tiles_n == 37
    plan, _ = mod.column_plan("band4", 16384, 8192, 9216)
    assert plan == make_plan(16384, 8192, 9216, 2, 132, "gemm", band=4) and plan.band == 4
    assert mod.column_plan("band0", 16384, 8192, 9216)[0].band == 0
    assert mod.column_plan("default", 16384, 8192, 9216)[0].band != 4
    # the TMA store is the GEMM alone's default; ts0 forces the threads' copy-out
    assert mod.column_plan("default", 2048, 7168, 4096)[1].tma_store == 1
    assert mod.column_plan("ts0", 2048, 7168, 4096)[1].tma_store == 0
    assert mod.column_plan("ts0+c1", 2048, 7168, 4096)[1].cta_group == 1
    # --dtype f16: the same plans' fp16 kernels
    import dataclasses
    bf = mod.column_plan("c1+bn256", 2048, 7168, 4096)
    half = mod.column_plan("c1+bn256", 2048, 7168, 4096, dtype="f16")
    assert half[0] == bf[0] and bf[1].dtype == "bf16"
    assert half[1] == dataclasses.replace(bf[1], dtype="f16")
    # --dtype e4m3: fp8 operands at depth K run the bf16 plan of depth K / 2
    f8 = mod.column_plan("default", 2048, 7168, 8192, dtype="e4m3")
    half_depth = mod.column_plan("default", 2048, 7168, 4096)
    assert f8[0] == half_depth[0] and f8[1] == dataclasses.replace(half_depth[1], in_dtype="e4m3")


def test_fp8_inputs_and_the_scaled_mm_anchor():
    import torch
    from rsar_core.reference import scaled_mm
    mod = _module()
    sets = mod.input_sets(64, 128, 256, torch.device("cpu"), torch.float8_e4m3fn, "row")
    assert len(sets) >= 2 and all(len(s) == 4 for s in sets)
    x, w, sx, sw = sets[0]
    assert x.dtype == w.dtype == torch.float8_e4m3fn and sx.shape == (64, 1) and sw.shape == (128,)
    y = torch.empty(64, 128, dtype=torch.bfloat16)
    assert scaled_mm(x, w, sx, sw, y.dtype, out=y) is y
    want = (x.double() * sx.double()) @ (w.double() * sw.double().reshape(-1, 1)).t()
    assert ((y.double() - want).norm() / want.norm()).item() < 1e-2
    x, w, sx, sw = mod.input_sets(64, 128, 256, torch.device("cpu"), torch.float8_e4m3fn,
                                  "tensor")[0]
    assert sx.shape == () and sw.shape == ()


def test_stages_column_is_checked_against_shared_memory():
    pytest.importorskip("cutlass")
    mod = _module()
    _, v = mod.column_plan("c2+bn224+stages4", 2048, 7168, 4096)
    assert v.stages == 4
    with pytest.raises(ValueError, match="stages"):
        mod.column_plan("bn256+stages6", 2048, 8192, 4096)


def test_geomean_line_averages_each_column_where_it_ran():
    rows = [{"us": {"mm": 10.0, "default": 5.0, "c1": 20.0}},
            {"us": {"mm": 10.0, "default": 20.0}}]  # c1 skipped at the second shape
    g = _module().geomeans(rows)
    assert list(g) == ["default", "c1"]
    assert g["default"] == pytest.approx(1.0) and g["c1"] == pytest.approx(0.5)
    assert _module().geomeans([]) == {}


@pytest.mark.parametrize("dry,tries", [(0, 4), (1, 4), (2, 4), (9, 4), (9, 1)])
def test_a_block_whose_stream_ran_dry_is_taken_again_with_a_longer_sleep(monkeypatch, dry,
                                                                         tries):
    import torch
    mod = _module()
    fake = FakeCuda(dry)
    for name in ("Event", "_sleep", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    calls = []
    us, again = mod.queued_block(lambda x, w: calls.append(x), [(1, 2), (3, 4)], 5,
                                 host_us=10.0, tries=tries)
    blocks = min(dry, tries - 1) + 1
    assert us == [10.0] * 5 and again == blocks - 1
    assert len(calls) == 5 * blocks and calls[:5] == [1, 3, 1, 3, 1]
    # 10 us per call at 2 GHz, doubled for each block taken again
    assert fake.sleeps == [5 * 10 * 2000 * 2 ** i for i in range(blocks)]
