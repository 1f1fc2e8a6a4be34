"""scripts/gemm_one_gpu.py: bad arguments are refused before a GPU is touched, and each
column name maps to the plan and kernel variant it stands for."""
import pytest

from fake_cuda import FakeCuda
from script_runs import load_script, run_script


def _run(*args: str):
    return run_script("gemm_one_gpu.py", *args)


def _module():
    return load_script("gemm_one_gpu.py", "gemm_one_gpu")


def test_a_bad_column_is_refused_before_a_gpu_is_touched():
    r = _run("--columns", "default,c5")
    assert r.returncode == 2 and "unknown column part 'c5'" in r.stderr


def test_columns_are_the_plans_they_name():
    from launch.plan import make_plan
    mod = _module()
    plan, v = mod.column_plan("default", 2048, 8192, 4096)
    assert plan == make_plan(2048, 8192, 4096, 2, 132, "gemm")
    assert (v.mode, v.bn, v.cta_group, v.pdl, v.push, v.stages) == ("gemm", plan.bn,
                                                                    plan.cta_group, 1, "tma", 0)
    # the GEMM alone's rules (ping-pong at 2048 x 7168 x 4096) are the default column's
    plan, v = mod.column_plan("default", 2048, 7168, 4096)
    assert plan == make_plan(2048, 7168, 4096, 2, 132, "gemm", pingpong=None)
    assert (plan.pingpong, v.pingpong, v.bn, v.stages) == (True, 1, 176, 5)
    # the op's default_stages where it applies; stages3 turns it off
    assert mod.column_plan("default", 1024, 7168, 4096)[1].stages == 4
    assert mod.column_plan("stages3", 1024, 7168, 4096)[1].stages == 3
    plan, v = mod.column_plan("c1+bn256", 2048, 7168, 4096)
    assert (plan.cta_group, plan.bn, v.cta_group, v.bn) == (1, 256, 1, 256)
    with pytest.raises(ValueError):
        mod.column_plan("bn100", 512, 8192, 4096)  # no such tile width
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
    # --dtype e4m3: fp8 operands at depth K run the bf16 plan of depth K / 2 (where no
    # bf16-only rule fires: ping-pong takes 2048 x 7168 x 4096 in bf16 only)
    f8 = mod.column_plan("default", 2048, 8192, 8192, dtype="e4m3")
    half_depth = mod.column_plan("default", 2048, 8192, 4096)
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


def test_block_scaled_columns_run_128_or_64_wide_tiles():
    """--scales block: the op's block-wise plans (128-wide tiles, or a bn64 column's 64; the
    kernel variant with ``block_scales``), fp8 plans at half the depth; other widths and
    non-fp8 columns are refused, so the sweep skips them at that shape."""
    import dataclasses

    from launch.plan import make_plan
    from launch.resolve import Dtypes, Hardware, Shape, resolve_variant
    mod = _module()
    for name, M, N in (("default", 2048, 7168), ("c2", 4096, 7168), ("c1", 1, 2880),
                       ("sk", 700, 7168)):
        plan, v = mod.column_plan(name, M, N, 4096, dtype="e4m3", block=True)
        want = make_plan(M, N, 2048, 2, 132, "gemm", bn=128, **mod.column_knobs(name))
        assert plan == want and plan.bn == 128
        untuned = resolve_variant(Shape(M, N, 4096, "gemm"), Hardware("sm_90a", 132), 2,
                                  "unicast", Dtypes("bf16", "e4m3", True))
        assert v.block_scales == 1 and v.in_dtype == "e4m3"
        if name == "default":
            assert v == untuned
    plan, v = mod.column_plan("bn64+c1", 512, 7168, 4096, dtype="e4m3", block=True)
    assert (plan.bn, plan.cta_group, v.bn, v.block_scales) == (64, 1, 64, 1)
    assert mod.column_plan("ts0", 2048, 7168, 4096, dtype="e4m3", block=True)[1].tma_store == 0
    # without block scales the same column keeps its own width and no block_scales
    assert mod.column_plan("default", 2048, 7168, 4096, dtype="e4m3")[1].block_scales == 0
    for name in ("bn256", "c1+bn224", "bn160"):
        with pytest.raises(ValueError, match="64 or 128"):
            mod.column_plan(name, 2048, 7168, 4096, dtype="e4m3", block=True)
    with pytest.raises(ValueError, match="fp8"):
        mod.column_plan("default", 2048, 7168, 4096, block=True)


def test_block_inputs_bits_and_an_anchor_that_may_be_missing(monkeypatch):
    """--scales block: input sets with (M, K / 128) x and (ceil(N / 128), K / 128) w scales;
    the launcher passes the op's scale bits for them (``check_scales``: block-wise, layout);
    torch's block-wise scaled_mm, where it raises (this CPU build, say), is recorded as
    n/a for the shape and the geomeans leave that shape out."""
    import types

    import torch
    from rsar_core.reference import call_refusal, scaled_mm
    from rsar_core.validate import SCALE_BLOCK, check_scales
    mod = _module()
    cpu = torch.device("cpu")
    sets = mod.input_sets(64, 2880, 512, cpu, torch.float8_e4m3fn, "block")
    assert len(sets) >= 2
    x, w, sx, sw = sets[0]
    assert x.dtype == w.dtype == torch.float8_e4m3fn
    # x's scales M-major, the layout torch's block-wise scaled_mm takes without a copy
    assert sx.shape == (64, 4) and sw.shape == (23, 4) and sx.stride() == (1, 64)
    assert sx.dtype == sw.dtype == torch.float32
    assert not torch.equal(sets[0][2], sets[1][2])
    bits = check_scales(sx, sw, 64, 2880, cpu, "e4m3", 512)
    assert bits & SCALE_BLOCK and not bits & 3
    # the launcher hands the kernel those bits; without them, bits from the scales' sizes
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda dev=None: types.SimpleNamespace(cuda_stream=7))
    seen = []
    plan = types.SimpleNamespace(M=64, N=2880, local_M=64, padded_M=64, chunk=0, rounds=1,
                                 sched_word=0, grid=132)
    lay = types.SimpleNamespace(arrive_off=0, result_off=0, recv_off=0, recv_region_bytes=0,
                                part_off=0, out_off=0)
    y = torch.empty(64, 2880, dtype=torch.bfloat16)
    ws = err = torch.zeros(8, dtype=torch.int32)
    mod.launcher(lambda *a: seen.append(a), plan, y, ws, err, lay, 512, bits)(*sets[0])
    row = mod.input_sets(64, 2880, 512, cpu, torch.float8_e4m3fn, "row")[0]
    mod.launcher(lambda *a: seen.append(a), plan, y, ws, err, lay, 512)(*row)
    mod.launcher(lambda *a: seen.append(a), plan, y, ws, err, lay, 512)(*row[:2])
    assert [a[5] for a in seen] == [bits, 3, 0]
    assert seen[0][3:5] == (sx.data_ptr(), sw.data_ptr()) and seen[0][9] == 512
    assert all(a[6] == 0 for a in seen)  # the bias address: the plain GEMM takes none
    assert all(a[-1] == 7 for a in seen)
    # torch's anchor: a reason where it raises, None where it runs
    try:
        scaled_mm(*sets[0], torch.bfloat16)
    except Exception as e:
        why = call_refusal(lambda *a: scaled_mm(*a, torch.bfloat16), *sets[0])
        assert why and why.startswith(type(e).__name__ + ": ")
    else:
        assert call_refusal(lambda *a: scaled_mm(*a, torch.bfloat16), *sets[0]) is None

    def refuses(*a):
        raise RuntimeError("block-wise scaling is not supported here\nmore")
    assert call_refusal(refuses, *sets[0]) == \
        "RuntimeError: block-wise scaling is not supported here"
    rows = [{"us": {"mm": 10.0, "default": 5.0}},
            {"us": {"mm": None, "default": 1.0}},  # the anchor n/a at this shape
            {"us": {"mm": 10.0, "default": 20.0}}]
    assert mod.geomeans(rows) == pytest.approx({"default": 1.0})
    assert mod.geomeans(rows[1:2]) == {}


def test_stages_column_is_checked_against_shared_memory():
    pytest.importorskip("cutlass")
    mod = _module()
    _, v = mod.column_plan("c2+bn224+stages4", 2048, 7168, 4096)
    assert v.stages == 4
    with pytest.raises(ValueError, match="stages"):
        mod.column_plan("bn256+stages6", 2048, 8192, 4096)
    # block-wise scales' kernel (128-wide, its scales staged beside the tiles)
    _, v = mod.column_plan("stages4", 2048, 7168, 4096, dtype="e4m3", block=True)
    assert (v.stages, v.bn, v.block_scales) == (4, 128, 1)


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
    us, again = mod.queued_calls([lambda x, w: calls.append(x)], [(1, 2), (3, 4)],
                                 mod.call_schedule(1, 5, 2), host_us=10.0, tries=tries)
    blocks = min(dry, tries - 1) + 1
    assert us == [[10.0] * 5] and again == blocks - 1
    assert len(calls) == 5 * blocks and calls[:5] == [1, 3, 1, 3, 1]
    # 10 us per call at 2 GHz, doubled for each block taken again
    assert fake.sleeps == [5 * 10 * 2000 * 2 ** i for i in range(blocks)]


@pytest.mark.parametrize("columns,nsets", [(2, 2), (3, 8), (5, 2), (4, 4)])
def test_calls_interleave_takes_every_column_in_turn_on_fresh_inputs(columns, nsets):
    sched = _module().call_schedule(columns, 6, nsets)
    assert [c for c, _ in sched] == list(range(columns)) * 6
    # no call runs on the inputs of the call just before it (they would sit in L2)
    assert all(a[1] != b[1] for a, b in zip(sched, sched[1:]))
    assert _module().call_schedule(1, 5, 2) == [(0, 0), (0, 1), (0, 0), (0, 1), (0, 0)]


def test_interleaved_calls_are_timed_and_handed_back_per_column(monkeypatch):
    import torch
    mod = _module()
    fake = FakeCuda(0)
    for name in ("Event", "_sleep", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    calls = []
    fns = [lambda x, w, c=c: calls.append((c, x)) for c in range(3)]
    us, again = mod.queued_calls(fns, [(1, 2), (3, 4)], mod.call_schedule(3, 4, 2),
                                 host_us=10.0)
    assert again == 0 and us == [[10.0] * 4] * 3
    assert calls[:6] == [(0, 1), (1, 3), (2, 1), (0, 3), (1, 1), (2, 3)]
    assert fake.sleeps == [12 * 10 * 2000]  # the sleep covers every column's calls


def test_block_ratios_read_each_block_against_the_anchor_of_that_block():
    r = _module().block_ratios({"mm": [10.0, 12.0], "default": [10.0, 10.0], "c1": [20.0]})
    assert r == {"default": [1.0, 1.2], "c1": [0.5]}
    assert _module().block_ratios({"default": [1.0]}) == {}


def test_interleave_takes_blocks_or_calls():
    r = _run("--interleave", "rounds")
    assert r.returncode == 2 and "invalid choice: 'rounds'" in r.stderr


def test_each_column_is_checked_on_what_it_computed():
    """A column that writes the shared output and one that returns its own result (torch's
    block-wise anchor, which has no out=) are both checked, on fresh NaN-poisoned output;
    a wrong column or a raised error flag stops the run, naming column and shape."""
    import torch
    check_columns = _module().check_columns
    g = torch.Generator().manual_seed(7)
    x, w = torch.randn(8, 16, generator=g), torch.randn(4, 16, generator=g)
    ref = x.double() @ w.double().t()
    y = torch.empty(8, 4)
    err = torch.zeros(8, dtype=torch.int32)

    def writes(a, b):
        assert torch.isnan(y).all()  # poisoned before each column
        y.copy_(a @ b.t())

    def returns(a, b):
        return a @ b.t()
    errors = check_columns({"writes": writes, "mm": returns}, (x, w), y, ref, err, "8x4x16")
    assert set(errors) == {"writes", "mm"} and max(errors.values()) < 1e-6
    # a column that returns its result but leaves y alone is not read from y
    assert check_columns({"mm": returns}, (x, w), y, ref, err, "8x4x16")["mm"] < 1e-6
    with pytest.raises(RuntimeError, match="wrong at 8x4x16"):
        check_columns({"wrong": lambda a, b: -(a @ b.t())}, (x, w), y, ref, err, "8x4x16")
    with pytest.raises(RuntimeError, match="leaves y at 8x4x16: rel err nan"):
        check_columns({"leaves y": lambda a, b: None}, (x, w), y, ref, err, "8x4x16")
    err[0] = 3
    with pytest.raises(RuntimeError, match="writes at 8x4x16"):
        check_columns({"writes": writes}, (x, w), y, ref, err, "8x4x16")


def test_box_columns_change_only_the_box():
    import dataclasses
    mod = _module()
    for M, K in ((1, 1024), (129, 1024), (2048, 1024)):
        plan, v = mod.column_plan("c1+xb", M, 7168, K)
        p, v0 = mod.column_plan("c1+xb0", M, 7168, K)
        assert p == plan and v0 == dataclasses.replace(v, x_rows=0)
        assert v.x_rows == (8 if M % 128 == 1 else 0)
    # joined with the split-K switch, each keeps its own field
    _, v = mod.column_plan("sk0+xb", 1, 7168, 4096)
    assert (v.sk, v.x_rows) == (0, 8)


def test_build_jobs_compiles_what_the_cache_lacks_once(tmp_path, monkeypatch):
    import sys
    from pathlib import Path
    mod = _module()
    sys.path.insert(0, str(Path(mod.__file__).resolve().parent))
    import precompile
    built = []
    monkeypatch.setattr(precompile, "build",
                        lambda vs, out, jobs, spawn: built.append((vs, out, jobs, spawn)))
    monkeypatch.setenv("RSAR_KERNEL_CACHE", str(tmp_path))
    a = mod.parse(["--columns", "default,xb0,sk0", "--shapes", "1,7168,4096;8,7168,4096",
                   "--build-jobs", "3"])
    mod.build_columns(a, 132, None, False)
    (vs, out, jobs, spawn), = built
    # spawned workers: this process has initialized CUDA by then
    assert out == tmp_path and jobs == 3 and spawn
    want = {mod.column_plan(c, M, 7168, 4096)[1] for c in ("default", "xb0", "sk0")
            for M in (1, 8)}
    assert set(vs) == want and len(vs) == len(want)
    # what the cache already holds is not built again
    from launch.disk_cache import entry_path
    held = vs[0]
    entry_path(held, tmp_path).write_bytes(b"x")
    built.clear()
    mod.build_columns(a, 132, None, False)
    assert held not in built[0][0] and len(built[0][0]) == len(want) - 1
    # without a cache to fill, nothing is built
    monkeypatch.delenv("RSAR_KERNEL_CACHE")
    built.clear()
    mod.build_columns(a, 132, None, False)
    assert built == []
