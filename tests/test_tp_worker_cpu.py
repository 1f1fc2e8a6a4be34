"""scripts/tp_worker.py on a CPU-only machine.

- Where it cannot run (no GPU): one plain sentence, exit status 2, no traceback; started by
  hand, with --torchrun, under mpiexec and under torchrun.
- The block math it factors out, in float32 on tiny sizes: the sharded partial blocks sum
  to the single-device reference, the shards tile the full weights, the seeded weights are
  the same on every call.
- The collective body ``run()`` end to end on 2 CPU processes (torch.distributed gloo,
  started by torch.distributed.run), with a stand-in for GemmRsAr that has the same call
  and output contract: all four variants pass their checks, T not a multiple of the world
  exercises the RS padding, and a stand-in that skips the reduction is caught (exit 1).
- fp8 (--dtype e4m3): the per-row quantizer, and with --scales block the block-wise ones
  (h per row and 128-element group, M-major scales; w per 128 x 128 block, a partial last
  block row), the references that dequantize with them, the parser's refusal of --scales
  block without e4m3, and ``run()`` on gloo with block scales: with a baseline matmul that
  runs (a float64 stand-in for torch's block-wise scaled_mm) all four variants pass, with
  one that refuses the baselines are reported n/a with its reason and the fused ones pass.
- --bias: b_down seeded and of the outputs' magnitude, the references add it once, the fused
  calls get bias= (in GemmRsAr's contract) and warm up with bias=True, every variant's timed
  down projection adds it (fused, or on rank 0's partial before the baselines' collective), JSON and
  report say so; a stand-in that drops the bias or adds it on every rank is caught.

This file doubles as that 2-process child: ``python -m torch.distributed.run ... this_file``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from script_runs import REPO, load_script, plain_env as _plain_env, torch_sees_gpu

from rsar_core.reference import is_block_scaled, scaled_product

SCRIPT = REPO / "scripts" / "tp_worker.py"

tpw = load_script("tp_worker.py", "rsar_tp_worker")


# =========================================================================== the 2-process child
class FakeGemmRsAr:
    """Stand-in for GemmRsAr on CPU: the same call and output contract, done with gloo.

    Partial x @ w.T in float32, summed over the ranks (unless ``broken``), then RS keeps
    rows [rank*local_M, (rank+1)*local_M) of the sum padded to ceil(M/world)*world rows.
    """

    transport = "fake-gloo"

    def __init__(self, all_reduce: bool, broken: bool = False, bias_fault: str = "") -> None:
        import torch.distributed as dist
        # bias_fault: "drop" ignores bias=, "twice" adds it on every rank before the sum
        self.all_reduce, self.broken, self.bias_fault = all_reduce, broken, bias_fault
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.mode = "ar" if all_reduce else "rs"
        self.calls = 0
        self.block_calls = 0
        self.bias_calls = 0
        self.bias_sums: list = []  # float64 sums of the biases it was given
        self.prepared: list = []

    def warmup(self, Ms, K: int, *, block_scales: bool = False, bias: bool = False) -> None:
        # GemmRsAr's compile-ahead step, which the worker runs before the first call
        self.prepared += [[M, K, self.mode] + (["block"] if block_scales else [])
                          + (["bias"] if bias else []) for M in Ms]

    def can_run(self, w) -> bool:
        return w.dim() == 2 and w.is_contiguous()

    def should_run(self, x) -> bool:
        return True

    def check(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __call__(self, x, w, x_scale=None, w_scale=None, *, out=None, bias=None):
        import torch
        import torch.distributed as dist
        assert x.is_contiguous() and w.is_contiguous(), "GemmRsAr takes contiguous tensors"
        self.calls += 1
        fp8 = x.dtype == torch.float8_e4m3fn
        assert w.dtype == x.dtype and fp8 == (x_scale is not None) == (w_scale is not None)
        if fp8 and is_block_scaled(w, w_scale):
            # block-wise, as GemmRsAr takes them: x's (M, K/128) row-major or M-major, w's
            # (ceil(N/128), K/128) dense; each k-group's products times its two scales
            M, K = x.shape
            kb, nb = K // 128, -(-w.shape[0] // 128)
            assert tuple(x_scale.shape) == (M, kb) and tuple(w_scale.shape) == (nb, kb)
            assert x_scale.is_contiguous() or (x_scale.stride(0) == 1
                                               and x_scale.stride(1) >= M), x_scale.stride()
            assert w_scale.is_contiguous() or w_scale.stride() == (1, nb)
            self.block_calls += 1
            p = scaled_product(x, w, x_scale, w_scale).float()
        elif fp8:  # an fp8 op: (x_scale * x) @ (w_scale * w).T, bf16 results
            p = (x.float() * x_scale.reshape(-1, 1)) @ (w.float() * w_scale.reshape(-1, 1)).T
        else:
            p = x.float() @ w.float().T
        out_dt = torch.bfloat16 if fp8 else x.dtype
        assert out is None, "the worker does not pass out="
        if bias is not None:  # GemmRsAr's contract (check_bias): (N,) of the result dtype
            assert bias.dtype == out_dt and tuple(bias.shape) == (w.shape[0],), bias
            assert bias.is_contiguous() and bias.data_ptr() % 16 == 0
            self.bias_calls += 1
            if len(self.bias_sums) < 2:
                self.bias_sums.append(float(bias.sum(dtype=torch.float64)))
            if self.bias_fault == "twice":
                p = p + bias.float()
        if not self.broken:
            dist.all_reduce(p)
        if bias is not None and not self.bias_fault:
            p = p + bias.float()  # once, in fp32, to the reduced sum before rounding
        if self.all_reduce:
            return p.to(out_dt)
        M = x.shape[0]
        Mp = tpw.padded_rows(M, self.world)
        full = torch.zeros(Mp, p.shape[1])
        full[:M] = p  # rows past M stay zero
        local = Mp // self.world
        return full[self.rank * local:(self.rank + 1) * local].to(out_dt).contiguous()


def _stand_in_scaled_mm(x, w, x_scale, w_scale, out_dtype=None, out=None):
    """``rsar_core.reference.scaled_mm`` where torch's (block-wise) scaled_mm cannot run
    (this CPU): the float64 product of the scaled operands, rounded to ``out_dtype``."""
    import torch
    y = scaled_product(x, w, x_scale, w_scale).to(out_dtype or torch.bfloat16)
    if out is not None:
        out.copy_(y)
        return out
    return y


def _refusing_scaled_mm(*a, **kw):
    raise ValueError("stand-in refusal: block-wise scaled_mm unsupported here\nsecond line")


def _down_bias_deltas(args, rank: int, world: int) -> dict:
    """Each variant's ``down`` (what the worker times) with the bias minus the same without
    it, from one h, against b_down: name -> max |(with - without) - b_down| (bf16 rounding;
    about 0.5 where the bias were missing, about 1 where it were added twice)."""
    import torch
    dev = torch.device("cpu")
    dt = tpw.block_dtype(args.dtype)
    x = tpw.make_input(args.seed, args.tokens, args.hidden, dev, dt)
    wg, wu, wd = tpw.shard_weights(*tpw.make_weights(args.seed, args.hidden, args.inter, dev,
                                                     dt), rank, world)
    w_gu = tpw.fuse_gate_up(wg, wu)
    w_scale = None
    if args.dtype == "e4m3":
        wd, w_scale = tpw.quantizers(args.scales)[1](wd)
    b = tpw.make_bias(args.seed, args.hidden, dev, dt)
    ops = (FakeGemmRsAr(True), FakeGemmRsAr(False))
    plain = tpw.make_variants(x, w_gu, wd, *ops, world, w_scale, args.scales)
    biased = tpw.make_variants(x, w_gu, wd, *ops, world, w_scale, args.scales, bias=b)
    h = tpw.mlp_hidden(x, w_gu)
    return {n: float((biased[n]["down"](h).float() - plain[n]["down"](h).float()
                      - b.float()).abs().max()) for n in tpw.VARIANTS}


def _child() -> int:
    import torch
    import torch.distributed as dist
    from rsar_core import reference
    out_dir = Path(os.environ["TPW_TEST_OUT"])
    broken = os.environ.get("TPW_TEST_BROKEN") == "1"
    bias = os.environ.get("TPW_TEST_BIAS") == "1"
    bias_fault = os.environ.get("TPW_TEST_BIAS_FAULT", "")
    # the fp8 baselines' matmul: torch's (""), the float64 stand-in, or one that refuses
    anchor = os.environ.get("TPW_TEST_ANCHOR", "")
    if anchor == "stand-in":
        reference.scaled_mm = _stand_in_scaled_mm
    elif anchor == "refuse":
        reference.scaled_mm = _refusing_scaled_mm
    hidden, inter = os.environ.get("TPW_TEST_SIZES", "128,256").split(",")
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    args = tpw.parse(["--hidden", hidden, "--inter", inter, "--tokens", "101",
                      "--iters", "3", "--warmup", "1",
                      "--dtype", os.environ.get("TPW_TEST_DTYPE", "bf16"),
                      "--scales", os.environ.get("TPW_TEST_SCALES", "row")]
                     + (["--bias"] if bias else []))
    ctx = {"rank": rank, "world": world, "device": torch.device("cpu"), "launcher": "torchrun",
           "gpu": "CPU", "op_ar": FakeGemmRsAr(True, broken, bias_fault),
           "op_rs": FakeGemmRsAr(False, bias_fault=bias_fault), "clock": "wall clock"}
    code, res = tpw.run(ctx, args)
    calls = {"ar": ctx["op_ar"].calls, "rs": ctx["op_rs"].calls}
    block_calls = {"ar": ctx["op_ar"].block_calls, "rs": ctx["op_rs"].block_calls}
    bias_calls = {"ar": ctx["op_ar"].bias_calls, "rs": ctx["op_rs"].bias_calls}
    bias_sums = ctx["op_ar"].bias_sums + ctx["op_rs"].bias_sums
    prepared = ctx["op_ar"].prepared + ctx["op_rs"].prepared
    down_bias = _down_bias_deltas(args, rank, world) if bias and not bias_fault else None
    (out_dir / f"rank{rank}.json").write_text(json.dumps({"code": code, "calls": calls,
                                                          "block_calls": block_calls,
                                                          "bias_calls": bias_calls,
                                                          "bias_sums": bias_sums,
                                                          "down_bias": down_bias,
                                                          "prepared": prepared}))
    if rank == 0:
        (out_dir / "result.json").write_text(json.dumps(res))
        print("\n".join(tpw.report_lines(res)), flush=True)
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(_child())


# =========================================================================== the tests
import pytest  # noqa: E402  (the child above needs no pytest)


needs_no_gpu = pytest.mark.skipif(torch_sees_gpu(), reason="this host has a CUDA GPU")

NO_GPU = ("rsar tp_worker: no CUDA GPU on this host; the tensor-parallel MLP worker needs 2+ "
          "NVLink-connected GPUs (run scripts/mc_diag.py for details)")


def _run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 180):
    return subprocess.run(cmd, capture_output=True, text=True, env=env or _plain_env(),
                          timeout=timeout, cwd=str(REPO), stdin=subprocess.DEVNULL)


# --------------------------------------------------------------------------- no GPU
@needs_no_gpu
@pytest.mark.parametrize("extra", [[], ["--torchrun"], ["--tokens", "100", "--json", "x.json"],
                                   ["--bias"], ["--bias", "--dtype", "e4m3"]])
def test_no_gpu_plain_sentence_and_exit_2(extra):
    p = _run([sys.executable, str(SCRIPT), *extra])
    assert p.returncode == tpw.EXIT_CANNOT_RUN == 2, p.stdout + p.stderr
    assert p.stdout.strip() == NO_GPU
    assert p.stderr.strip() == "" and "Traceback" not in p.stdout + p.stderr


@needs_no_gpu
def test_no_gpu_hidden_devices_too():
    p = _run([sys.executable, str(SCRIPT)], env=_plain_env(CUDA_VISIBLE_DEVICES=""))
    assert p.returncode == 2 and p.stdout.strip() == NO_GPU, p.stdout + p.stderr
    assert "Traceback" not in p.stdout + p.stderr


@needs_no_gpu
@pytest.mark.mpi
def test_no_gpu_under_mpiexec_one_sentence():
    from mpirun import find_mpiexec, mpi_available, mpiexec_flags
    ok, why = mpi_available()
    if not ok:
        pytest.skip(why)
    mpiexec = find_mpiexec()
    p = _run([mpiexec, *mpiexec_flags(mpiexec), "-n", "2", sys.executable, str(SCRIPT)])
    assert p.returncode != 0, p.stdout + p.stderr
    assert p.stdout.count("rsar tp_worker:") == 1 and NO_GPU in p.stdout, p.stdout + p.stderr
    assert "Traceback" not in p.stdout + p.stderr


def _torchrun(*args: str, env: dict[str, str] | None = None, timeout: float = 240):
    return _run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", "2", *args], env=env, timeout=timeout)


@needs_no_gpu
def test_no_gpu_under_torchrun_one_sentence():
    p = _torchrun(str(SCRIPT), "--torchrun")
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert p.stdout.count("rsar tp_worker:") == 1 and NO_GPU in p.stdout, out
    # torchrun reports a failed worker with a traceback of its own; none comes from the worker.
    assert 'tp_worker.py", line' not in out, out


@pytest.mark.parametrize("argv, msg", [
    (["--hidden", "100"], "--hidden must be a positive multiple of 8"),
    (["--inter", "1000"], "--inter must be a positive multiple of 64"),
    (["--tokens", "0"], "--tokens must be >= 1"),
    (["--iters", "0"], "--iters must be >= 1"),
    (["--dtype", "f32"], "argument --dtype: invalid choice"),
    (["--bogus"], "unrecognized arguments"),
    (["--scales", "block"], "--scales block needs --dtype e4m3"),
    (["--dtype", "f16", "--scales", "block"], "--scales block needs --dtype e4m3"),
    (["--dtype", "e4m3", "--scales", "tensor"], "argument --scales: invalid choice"),
])
def test_bad_arguments_are_usage_errors(argv, msg):
    p = _run([sys.executable, str(SCRIPT), *argv])
    assert p.returncode == 2 and msg in p.stderr, p.stdout + p.stderr
    assert "Traceback" not in p.stderr


# --------------------------------------------------------------------------- reasons, sizes
@pytest.mark.parametrize("kw, expect", [
    (dict(cuda_available=False, device_count=0, world=2, capability=None), "no CUDA GPU"),
    (dict(cuda_available=True, device_count=0, world=2, capability=None), "no CUDA GPU"),
    (dict(cuda_available=True, device_count=1, world=2, capability=(9, 0)), "only 1 CUDA GPU"),
    (dict(cuda_available=True, device_count=2, world=1, capability=(9, 0)),
     "started as a single process"),
    (dict(cuda_available=True, device_count=2, world=1, capability=(9, 0), torchrun=True),
     "torchrun --nproc-per-node 2 scripts/tp_worker.py --torchrun"),
    (dict(cuda_available=True, device_count=2, world=1, capability=(9, 0),
          torchrun_without_flag=True), "without --torchrun"),
    (dict(cuda_available=True, device_count=2, world=4, capability=(9, 0)),
     "4 ranks on this host but only 2 CUDA GPUs"),
    (dict(cuda_available=True, device_count=2, world=4, capability=(9, 0), local_world=3),
     "3 ranks on this host"),
    (dict(cuda_available=True, device_count=8, world=2, capability=(8, 0)),
     "no rsar kernel for this GPU yet"),
    (dict(cuda_available=True, device_count=8, world=2, capability=(12, 0)),
     "compute capability 12.0"),
])
def test_cannot_run_reasons(kw, expect):
    why = tpw.cannot_run_reason(**kw, gpu_name="Some GPU")
    assert why is not None and expect in why, why
    assert why.startswith("rsar tp_worker: ") and "\n" not in why


def test_runs_on_two_hoppers():
    assert tpw.cannot_run_reason(True, 2, 2, (9, 0)) is None
    assert tpw.cannot_run_reason(True, 2, 2, (10, 0)) is None  # B200: the sm_100a kernel
    assert tpw.cannot_run_reason(True, 8, 8, (9, 0), torchrun=True, local_world=8) is None
    assert tpw.cannot_run_reason(True, 8, 16, (9, 0), local_world=8) is None  # two hosts


@pytest.mark.parametrize("h, i, t, w, expect", [
    (4096, 14336, 4096, 2, None),
    (4096, 14336, 1, 8, None),            # 14336 / 8 = 1792 = 28 * 64
    (4096, 14336, 4096, 16, None),        # 14336 / 16 = 896 = 14 * 64
    (4096, 4160, 4096, 2, "multiple of 64"),     # 4160 / 2 = 2080 = 32.5 * 64
    (4096, 14400, 4096, 2, "multiple of 64"),   # 7200 % 64 != 0
    (4096, 14336, 4096, 3, "multiple of the world size 3"),
    (2880, 14336, 4096, 2, None),          # partial tiles at N's edge
    (4004, 14336, 4096, 2, "multiple of 8"),
    (4096, 14336, 0, 2, "--tokens"),
])
def test_size_problem(h, i, t, w, expect):
    why = tpw.size_problem(h, i, t, w)
    if expect is None:
        assert why is None, why
    else:
        assert why is not None and expect in why and why.startswith("rsar tp_worker: "), why


def test_launcher_env():
    mpi = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert tpw.launcher_world(False, mpi) == 2 and tpw.launcher_rank(False, mpi) == 1
    assert tpw.launcher_local_world(False, mpi) == 2
    hydra = {"PMI_SIZE": "4", "PMI_RANK": "3", "MPI_LOCALNRANKS": "2"}
    assert tpw.launcher_world(False, hydra) == 4 and tpw.launcher_local_world(False, hydra) == 2
    tr = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
          "TORCHELASTIC_RUN_ID": "x"}
    assert tpw.launcher_world(True, tr) == 2 and tpw.launcher_rank(True, tr) == 1
    assert tpw.started_by_torchrun(tr) and not tpw.started_by_torchrun(mpi)
    assert tpw.printing_rank(False, tr) == 1  # torchrun without --torchrun: RANK decides
    assert tpw.launcher_world(False, {}) == 1 and tpw.launcher_rank(True, {}) == 0


# --------------------------------------------------------------------------- block math
H, I, T = 128, 512, 37


@pytest.fixture(scope="module")
def full32():
    import torch
    return (tpw.make_input(3, T, H, torch.device("cpu"), torch.float32),
            *tpw.make_weights(3, H, I, torch.device("cpu"), torch.float32))


def test_weights_seeded_and_scaled(full32):
    import torch
    x, wg, wu, wd = full32
    assert x.shape == (T, H) and wg.shape == wu.shape == (I, H) and wd.shape == (H, I)
    again = tpw.make_weights(3, H, I, torch.device("cpu"), torch.float32)
    assert all(torch.equal(a, b) for a, b in zip((wg, wu, wd), again))
    assert torch.equal(x, tpw.make_input(3, T, H, torch.device("cpu"), torch.float32))
    other = tpw.make_weights(4, H, I, torch.device("cpu"), torch.float32)
    assert not torch.equal(wg, other[0])
    assert not torch.equal(wg, wu)
    assert abs(float(wg.std()) - H ** -0.5) < 0.1 * H ** -0.5
    assert abs(float(wd.std()) - I ** -0.5) < 0.1 * I ** -0.5
    bf = tpw.make_weights(3, H, I, torch.device("cpu"))
    assert all(t.dtype == torch.bfloat16 for t in bf)
    assert tpw.fingerprint(*bf) == tpw.fingerprint(*tpw.make_weights(3, H, I, torch.device("cpu")))


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_shards_tile_the_full_weights(full32, world):
    import torch
    _, wg, wu, wd = full32
    shards = [tpw.shard_weights(wg, wu, wd, r, world) for r in range(world)]
    for g, u, d in shards:
        assert g.shape == u.shape == (I // world, H) and d.shape == (H, I // world)
        assert g.is_contiguous() and u.is_contiguous() and d.is_contiguous()
    assert torch.equal(torch.cat([s[0] for s in shards]), wg)
    assert torch.equal(torch.cat([s[1] for s in shards]), wu)
    assert torch.equal(torch.cat([s[2] for s in shards], dim=1), wd)


def test_shard_rejects_bad_split(full32):
    _, wg, wu, wd = full32
    with pytest.raises(ValueError, match="not divisible"):
        tpw.shard_weights(wg, wu, wd, 0, 3)
    with pytest.raises(ValueError, match="rank"):
        tpw.shard_weights(wg, wu, wd, 2, 2)


def test_fused_gate_up_is_gate_and_up(full32):
    import torch
    import torch.nn.functional as F
    x, wg, wu, wd = full32
    g, u, _ = tpw.shard_weights(wg, wu, wd, 1, 2)
    h = tpw.mlp_hidden(x, tpw.fuse_gate_up(g, u))
    assert h.shape == (T, I // 2) and h.is_contiguous()
    torch.testing.assert_close(h, F.silu(x @ g.T) * (x @ u.T), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_sharded_partials_sum_to_the_reference(full32, world):
    import torch
    x, wg, wu, wd = full32
    ref = tpw.reference_block(x, wg, wu, wd)
    assert ref.shape == (T, H) and ref.dtype == torch.float32
    total = torch.zeros(T, H)
    for r in range(world):
        g, u, d = tpw.shard_weights(wg, wu, wd, r, world)
        total += tpw.partial_block(x, tpw.fuse_gate_up(g, u), d)
    torch.testing.assert_close(total, ref, rtol=1e-5, atol=1e-5)
    assert tpw.rel_error(total, ref) < 1e-5
    assert float(ref.norm()) > 0.1 * (T * H) ** 0.5  # activations of order one, not vanishing


def test_bf16_block_within_tolerance(full32):
    # The TP path in bf16 (what the GPU run does, less the fused kernel) stays well inside TOL.
    import torch
    x, wg, wu, wd = full32
    ref = tpw.reference_block(x, wg, wu, wd)
    xb = x.to(torch.bfloat16)
    acc = torch.zeros(T, H)
    for r in range(2):
        g, u, d = (t.to(torch.bfloat16) for t in tpw.shard_weights(wg, wu, wd, r, 2))
        acc += tpw.partial_block(xb, tpw.fuse_gate_up(g, u), d).float()
    err = tpw.rel_error(acc.to(torch.bfloat16), ref)
    assert err < tpw.TOL / 2, err


def test_padded_rows_and_rel_error():
    import torch
    assert [tpw.padded_rows(t, 2) for t in (1, 2, 3, 4096, 4097)] == [2, 2, 4, 4096, 4098]
    assert tpw.padded_rows(101, 8) == 104
    ref = torch.ones(4, 4)
    assert tpw.rel_error(ref.clone(), ref) == 0.0
    assert abs(tpw.rel_error(ref * 1.01, ref) - 0.01) < 1e-6
    bad = ref.clone()
    bad[0, 0] = float("nan")
    assert tpw.rel_error(bad, ref) == float("inf")


# --------------------------------------------------------------------------- summary, report
def _result(ok: bool = True) -> dict:
    us = {"fused_ar": {"block": 1000.0, "down": 300.0}, "mm_ar": {"block": 1100.0, "down": 400.0},
          "fused_rs_ag": {"block": 1050.0, "down": 350.0},
          "mm_rs_ag": {"block": 1150.0, "down": 450.0}}
    checks = {n: {"ok": True, "rel_err": [2.5e-3, 2.5e-3], "rank_diff": 0.0}
              for n in tpw.VARIANTS}
    if not ok:
        checks["fused_ar"] = {"ok": False, "rel_err": [0.7, 0.7], "rank_diff": 0.0}
    return {"config": {"world": 2, "launcher": "mpirun", "gpu": "NVIDIA H200 x2",
                       "transport": "unicast", "hidden": 4096, "inter": 14336, "tokens": 4096,
                       "padded_tokens": 4096, "seed": 0, "iters": 20, "warmup": 5},
            "tol": tpw.TOL, "weights_identical": True, "should_run": {"ar": True, "rs": True},
            "checks": checks, "us": us, "summary": tpw.summarize(4096, us), "ok": ok}


def test_summarize():
    s = _result()["summary"]
    assert s["tokens_per_s"]["fused_ar"] == pytest.approx(4096 / 1e-3)
    assert s["speedup"]["AR"] == {"block": pytest.approx(1.1), "down": pytest.approx(4 / 3)}
    assert s["speedup"]["RS+AG"]["block"] == pytest.approx(1150 / 1050)


def test_report_readable():
    text = "\n".join(tpw.report_lines(_result()))
    assert "2 ranks (mpirun)" in text and "7168 per rank" in text
    for n in tpw.VARIANTS:
        assert tpw.LABELS[n] in text
    assert "rank 0 2.50e-03  rank 1 2.50e-03  ok" in text
    assert "4,096,000" in text  # tokens/s of the fused AR block
    assert "AR     block x1.10, down+comm x1.33" in text
    assert text.splitlines()[-1] == "rsar tp_worker: all 4 checks passed (rel err < 0.02)"
    bad = "\n".join(tpw.report_lines(_result(ok=False)))
    assert "FAIL" in bad and bad.splitlines()[-1] == "rsar tp_worker: 1 of 4 checks FAILED"


# --------------------------------------------------------------------------- run() on gloo
def _gloo_run(tmp_path: Path, broken: bool, dtype: str = "bf16", scales: str = "row",
              anchor: str = "", sizes: str = "128,256", bias: bool = False,
              bias_fault: str = ""):
    env = _plain_env(TPW_TEST_OUT=str(tmp_path), TPW_TEST_BROKEN="1" if broken else "0",
                     TPW_TEST_BIAS="1" if bias else "0", TPW_TEST_BIAS_FAULT=bias_fault,
                     TPW_TEST_DTYPE=dtype, TPW_TEST_SCALES=scales, TPW_TEST_ANCHOR=anchor,
                     TPW_TEST_SIZES=sizes, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    p = _torchrun(str(Path(__file__).resolve()), env=env)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text())
             if (tmp_path / f"rank{r}.json").exists() else None for r in range(2)]
    res = (json.loads((tmp_path / "result.json").read_text())
           if (tmp_path / "result.json").exists() else None)
    return p, ranks, res


@pytest.mark.parametrize("dtype", ["bf16", "f16", "e4m3"])
def test_run_end_to_end_on_gloo(tmp_path, dtype):
    p, ranks, res = _gloo_run(tmp_path, broken=False, dtype=dtype)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert [r["code"] for r in ranks] == [0, 0], out
    # correctness once + (warmup + iters) for block and for down; AR and RS each once per
    assert all(r["calls"] == {"ar": 1 + 2 * 4, "rs": 1 + 2 * 4} for r in ranks), ranks
    # the kernels for (M=T, K=I/world) are compiled before the first collective call
    assert all(r["prepared"] == [[101, 128, "ar"], [101, 128, "rs"]] for r in ranks), ranks
    assert res["ok"] and res["weights_identical"]
    assert res["config"]["padded_tokens"] == 102  # T=101 over 2 ranks: RS padding row
    for n in tpw.VARIANTS:
        c = res["checks"][n]
        assert c["ok"] and len(c["rel_err"]) == 2 and max(c["rel_err"]) < 1e-2, c
        assert c["rank_diff"] == 0.0, c
        assert res["us"][n]["block"] > 0 and res["us"][n]["down"] > 0
    assert "all 4 checks passed" in p.stdout
    assert res["config"]["dtype"] == dtype and f"(padded 102 for RS), {dtype}," in p.stdout
    assert res["config"]["scales"] == ("row" if dtype == "e4m3" else None)
    assert "baseline_error" not in res and "unavailable" not in res
    assert all(r["block_calls"] == {"ar": 0, "rs": 0} for r in ranks), ranks
    # without --bias: no bias= reaches the ops, none is compiled, the JSON says so
    assert res["config"]["bias"] is False and "bias" not in p.stdout
    assert all(r["bias_calls"] == {"ar": 0, "rs": 0} for r in ranks), ranks


def test_run_catches_a_missing_reduction(tmp_path):
    p, ranks, res = _gloo_run(tmp_path, broken=True)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert [r["code"] for r in ranks] == [1, 1], out  # every rank exits alike
    assert not res["ok"] and not res["checks"]["fused_ar"]["ok"]
    assert all(res["checks"][n]["ok"] for n in ("mm_ar", "fused_rs_ag", "mm_rs_ag"))
    assert "1 of 4 checks FAILED" in p.stdout


def test_fp8_quantization_and_its_reference():
    """--dtype e4m3: rows quantized to fp8's range with one scale each, and the fp8
    reference is the sum of the ranks' dequantized products (close to the bf16 block, not
    equal: quantization moves it by a few percent)."""
    import torch
    t = torch.randn(5, 64) * torch.tensor([[1.0], [10.0], [0.01], [3.0], [1e-30]])
    q, s = tpw.quantize_rows(t)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (5, 1) and s.dtype == torch.float32
    amax = (q.float().abs().amax(dim=1))
    assert torch.allclose(amax[:4], torch.full((4,), tpw.FP8_MAX))
    assert ((q.float() * s - t).norm(dim=1) / t.norm(dim=1))[:4].max() < 0.06
    x = tpw.make_input(3, 9, 32, torch.device("cpu"))
    full = tpw.make_weights(3, 32, 256, torch.device("cpu"))
    ref8 = tpw.reference_block_fp8(x, *full, 2)
    ref = tpw.reference_block(x, *full)
    err = (ref8 - ref).norm() / ref.norm()
    assert 1e-3 < err < 0.1
    parts = []
    for r in range(2):
        wg, wu, wd = tpw.shard_weights(*full, r, 2)
        h8, sh = tpw.quantize_rows(tpw.mlp_hidden(x, tpw.fuse_gate_up(wg, wu)))
        w8, sw = tpw.quantize_rows(wd)
        parts.append((h8.float() * sh) @ (w8.float() * sw).T)
    assert torch.allclose(ref8, parts[0] + parts[1])


def test_fp8_needs_k_a_multiple_of_128():
    p = _run([sys.executable, str(SCRIPT), "--dtype", "e4m3", "--inter", "192"])
    assert p.returncode == 2 and "multiple of 128 with --dtype e4m3" in p.stderr
    assert "multiple of 128" in tpw.size_problem(128, 384, 16, 2, tpw.K_ALIGN_FP8)


# --------------------------------------------------------------------------- block-wise fp8
def test_scales_option_parses():
    assert tpw.parse([]).scales == "row"
    assert tpw.parse(["--dtype", "e4m3"]).scales == "row"
    assert tpw.parse(["--dtype", "e4m3", "--scales", "block"]).scales == "block"
    with pytest.raises(SystemExit) as e:
        tpw.parse(["--dtype", "bf16", "--scales", "block"])
    assert e.value.code == 2
    p = _run([sys.executable, str(SCRIPT), "--help"])
    assert p.returncode == 0 and "--scales {row,block}" in p.stdout
    assert "--scales block" in p.stdout and "128 x 128 block" in p.stdout


def _spread_groups(M: int, K: int, seed: int = 0):
    """(M, K) float32 whose 128-element groups differ in magnitude by up to 10^+-3, with one
    group all zero (its scale clamps, its values stay zero)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(M, K, generator=g)
    mag = 10.0 ** (6 * torch.rand(M, K // 128, generator=g) - 3)
    t = t * mag.repeat_interleave(128, dim=1)
    t[1, 128:256] = 0.0
    return t


def test_quantize_groups_per_row_and_128_group():
    import torch
    M, K = 37, 384
    t = _spread_groups(M, K)
    q, s = tpw.quantize_groups(t.to(torch.bfloat16))
    assert q.dtype == torch.float8_e4m3fn and q.shape == (M, K) and q.is_contiguous()
    # (M, K/128) float32, M-major: torch's BlockWise1x128 layout, which GemmRsAr takes too
    assert s.dtype == torch.float32 and s.shape == (M, K // 128)
    assert s.stride() == (1, M) and not s.is_contiguous()
    qg = q.float().reshape(M, K // 128, 128)
    amax = qg.abs().amax(dim=2)
    nonzero = t.reshape(M, K // 128, 128).abs().amax(dim=2) > 0
    assert not bool(nonzero[1, 1]) and bool(nonzero.sum() == nonzero.numel() - 1)
    # each group's largest magnitude maps to fp8's largest value
    assert torch.equal(amax[nonzero], torch.full_like(amax[nonzero], tpw.FP8_MAX))
    assert float(amax[1, 1]) == 0.0 and float(s[1, 1]) == pytest.approx(1e-12)
    tb = t.to(torch.bfloat16).float()
    torch.testing.assert_close(s, tb.reshape(M, K // 128, 128).abs().amax(dim=2)
                               .div(tpw.FP8_MAX).clamp_min(1e-12))
    # dequantized: each group within e4m3's rounding (3 mantissa bits) of the input
    deq = (qg * s.unsqueeze(2)).reshape(M, K)
    tg, dg = tb.reshape(M, K // 128, 128), deq.reshape(M, K // 128, 128)
    rel = (dg - tg).norm(dim=2)[nonzero] / tg.norm(dim=2)[nonzero]
    assert float(rel.max()) < 0.06, float(rel.max())
    assert float((deq - tb).abs().max() / tb.abs().max()) < 1 / 16
    # one scale per row loses the groups far below the row's largest value: it is per group
    qr, sr = tpw.quantize_rows(tb)
    dr = (qr.float() * sr).reshape(M, K // 128, 128)
    rel_row = (dr - tg).norm(dim=2)[nonzero] / tg.norm(dim=2)[nonzero]
    assert float(rel_row.max()) > 0.5
    with pytest.raises(ValueError, match="multiple of 128"):
        tpw.quantize_groups(torch.ones(4, 200))


@pytest.mark.parametrize("N", [256, 200, 72])
def test_quantize_blocks_per_128x128_block(N):
    import torch
    K = 256
    g = torch.Generator().manual_seed(2)
    nb, kb = -(-N // 128), K // 128
    mag = 10.0 ** (4 * torch.rand(nb, kb, generator=g) - 2)
    w = torch.randn(N, K, generator=g) * mag.repeat_interleave(128, 0)[:N].repeat_interleave(
        128, 1)
    q, s = tpw.quantize_blocks(w.to(torch.bfloat16))
    assert q.dtype == torch.float8_e4m3fn and q.shape == (N, K) and q.is_contiguous()
    assert s.dtype == torch.float32 and s.shape == (nb, kb) and s.is_contiguous()
    wb = w.to(torch.bfloat16).float()
    full_s = s.repeat_interleave(128, 0)[:N].repeat_interleave(128, 1)
    deq = q.float() * full_s
    for i in range(nb):  # the last block row covers the rows there are (N % 128 of them)
        rows = slice(i * 128, min(N, (i + 1) * 128))
        for j in range(kb):
            cols = slice(j * 128, (j + 1) * 128)
            blk, qb = wb[rows, cols], q.float()[rows, cols]
            assert float(qb.abs().max()) == tpw.FP8_MAX  # the block's amax maps to 448
            assert float(s[i, j]) == pytest.approx(float(blk.abs().max()) / tpw.FP8_MAX,
                                                   rel=1e-6)
            rel = float((deq[rows, cols] - blk).norm() / blk.norm())
            assert rel < 0.06, (i, j, rel)
    # the scales are what the reference and the ops take: rsar_core's block-wise product
    from rsar_core.reference import is_block_scaled
    h = _spread_groups(9, K, seed=3)
    h8, sh = tpw.quantize_groups(h)
    if nb * kb > 1:
        assert is_block_scaled(q, s)
    got = scaled_product(h8, q, sh, s)
    assert tpw.rel_error(got.float(), (h.double() @ wb.double().T).float()) < 0.06
    with pytest.raises(ValueError, match="multiple of 128"):
        tpw.quantize_blocks(torch.ones(128, 192))


def test_quantize_blocks_zero_block_and_quantizers():
    import torch
    w = torch.randn(256, 256)
    w[128:, :128] = 0.0
    q, s = tpw.quantize_blocks(w)
    assert float(s[1, 0]) == pytest.approx(1e-12) and float(q.float()[128:, :128].abs().max()) == 0
    assert tpw.quantizers("row") == (tpw.quantize_rows, tpw.quantize_rows)
    assert tpw.quantizers("block") == (tpw.quantize_groups, tpw.quantize_blocks)
    with pytest.raises(ValueError, match="scales"):
        tpw.quantizers("tensor")


def test_fp8_block_reference_dequantizes_with_the_block_scales():
    """The block-scaled fp8 reference is the sum of the ranks' block-dequantized products:
    close to the bf16 block (quantization moves it by a few percent), not the per-row one."""
    import torch
    x = tpw.make_input(3, 9, 200, torch.device("cpu"))
    full = tpw.make_weights(3, 200, 512, torch.device("cpu"))  # K = 256 per rank, N = 200
    ref8 = tpw.reference_block_fp8(x, *full, 2, "block")
    assert ref8.shape == (9, 200) and ref8.dtype == torch.float32
    ref = tpw.reference_block(x, *full)
    err = tpw.rel_error(ref8, ref)
    assert 1e-3 < err < 0.1, err
    parts = []
    for r in range(2):
        wg, wu, wd = tpw.shard_weights(*full, r, 2)
        h = tpw.mlp_hidden(x, tpw.fuse_gate_up(wg, wu))
        h8, sh = tpw.quantize_groups(h)
        w8, sw = tpw.quantize_blocks(wd)
        assert sh.shape == (9, 2) and sw.shape == (2, 2)
        xs = h8.double() * sh.double().repeat_interleave(128, dim=1)
        ws = w8.double() * sw.double().repeat_interleave(128, 0)[:200].repeat_interleave(128, 1)
        parts.append(xs @ ws.T)
    torch.testing.assert_close(ref8, (parts[0] + parts[1]).float(), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ref8, tpw.reference_block_fp8(x, *full, 2, "row"))


def test_baseline_error_names_the_refusal(monkeypatch):
    import torch
    from rsar_core import reference
    h8, sh = tpw.quantize_groups(torch.randn(5, 256))
    w8, sw = tpw.quantize_blocks(torch.randn(200, 256))
    monkeypatch.setattr(reference, "scaled_mm", _refusing_scaled_mm)
    why = tpw.baseline_error(h8, w8, sh, sw, torch.bfloat16)
    assert why == "ValueError: stand-in refusal: block-wise scaled_mm unsupported here"
    monkeypatch.setattr(reference, "scaled_mm", _stand_in_scaled_mm)
    assert tpw.baseline_error(h8, w8, sh, sw, torch.bfloat16) is None


def test_block_scales_need_sm90():
    why = tpw.cannot_run_reason(True, 2, 2, (10, 0), "NVIDIA B200", block_scales=True)
    assert why is not None and why.startswith("rsar tp_worker: ") and "--scales row" in why
    assert "compute capability 10.0" in why and "\n" not in why
    assert tpw.cannot_run_reason(True, 2, 2, (9, 0), block_scales=True) is None
    assert tpw.cannot_run_reason(True, 2, 2, (10, 0)) is None


def test_report_with_block_scales_and_no_baselines():
    res = _result()
    res["config"].update(dtype="e4m3", scales="block")
    for n in tpw.BASELINES:
        del res["checks"][n], res["us"][n]
    res["summary"] = tpw.summarize(4096, res["us"])
    res["baseline_error"] = "ValueError: Invalid scaling configuration."
    res["unavailable"] = list(tpw.BASELINES)
    text = "\n".join(tpw.report_lines(res))
    assert "(padded 4096 for RS), e4m3, block scales, seed 0" in text
    assert "128 x 128 block" in text and "BlockWise1x128" in text
    for n in tpw.BASELINES:
        assert f"{tpw.LABELS[n]:<34s} n/a (baseline unavailable" in text
    assert "speedup" not in text.split("baselines n/a")[0]
    assert ("baselines n/a: torch's scaled matmul refused these fp8 operands at set-up "
            "(ValueError: Invalid scaling configuration.)") in text
    assert text.splitlines()[-1] == "rsar tp_worker: all 2 checks passed (rel err < 0.02)"
    row = _result()
    row["config"].update(dtype="e4m3", scales="row")
    rt = "\n".join(tpw.report_lines(row))
    assert "e4m3, row scales, seed" in rt and "torch._scaled_mm (row-wise)" in rt
    assert "n/a" not in rt


def _block_run_checks(p, ranks, res, names):
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert [r["code"] for r in ranks] == [0, 0], out
    assert res["ok"] and res["weights_identical"]
    assert res["config"]["dtype"] == "e4m3" and res["config"]["scales"] == "block"
    assert res["config"]["hidden"] == 200 and res["config"]["padded_tokens"] == 102
    # GemmRsAr's block-wise kernels compiled ahead, at (M=T, K=I/world=256)
    assert all(r["prepared"] == [[101, 256, "ar", "block"], [101, 256, "rs", "block"]]
               for r in ranks), ranks
    # every fused call got block-wise scales in a layout GemmRsAr takes (the fake asserts)
    assert all(r["calls"] == r["block_calls"] == {"ar": 1 + 2 * 4, "rs": 1 + 2 * 4}
               for r in ranks), ranks
    assert sorted(res["checks"]) == sorted(names) and sorted(res["us"]) == sorted(names)
    for n in names:
        c = res["checks"][n]
        assert c["ok"] and len(c["rel_err"]) == 2 and max(c["rel_err"]) < 1e-2, c
        assert c["rank_diff"] == 0.0, c
    assert f"all {len(names)} checks passed" in p.stdout
    assert "(padded 102 for RS), e4m3, block scales," in p.stdout


def test_run_block_scales_end_to_end_on_gloo(tmp_path):
    # torch's block-wise scaled_mm has no CPU kernel: a float64 stand-in runs the baselines
    p, ranks, res = _gloo_run(tmp_path, broken=False, dtype="e4m3", scales="block",
                              anchor="stand-in", sizes="200,512")
    _block_run_checks(p, ranks, res, tpw.VARIANTS)
    assert "baseline_error" not in res and "n/a" not in p.stdout
    assert set(res["summary"]["speedup"]) == {"AR", "RS+AG"}


def test_run_block_scales_without_baselines_on_gloo(tmp_path):
    # torch's scaled_mm refuses at set-up: the baselines are n/a with its reason, no crash
    p, ranks, res = _gloo_run(tmp_path, broken=False, dtype="e4m3", scales="block",
                              anchor="refuse", sizes="200,512")
    _block_run_checks(p, ranks, res, ("fused_ar", "fused_rs_ag"))
    why = "ValueError: stand-in refusal: block-wise scaled_mm unsupported here"
    assert res["baseline_error"] == why and res["unavailable"] == list(tpw.BASELINES)
    assert res["summary"]["speedup"] == {}
    assert why in p.stdout and "n/a (baseline unavailable" in p.stdout


def test_run_block_scales_with_this_torch_on_gloo(tmp_path):
    # torch's own scaled_mm on this CPU: it runs the block-wise baselines, or it refuses them
    # and they are n/a with its reason; either way the fused variants pass and nothing crashes
    p, ranks, res = _gloo_run(tmp_path, broken=False, dtype="e4m3", scales="block",
                              sizes="200,512")
    if res and res.get("baseline_error"):
        _block_run_checks(p, ranks, res, ("fused_ar", "fused_rs_ag"))
        assert res["baseline_error"] in p.stdout
    else:
        _block_run_checks(p, ranks, res, tpw.VARIANTS)


# --------------------------------------------------------------------------- --bias
def test_bias_option_parses():
    assert tpw.parse([]).bias is False
    assert tpw.parse(["--bias"]).bias is True
    assert tpw.parse(["--bias", "--dtype", "e4m3", "--scales", "block"]).bias is True
    p = _run([sys.executable, str(SCRIPT), "--help"])
    assert p.returncode == 0 and "--bias" in p.stdout and "b_down" in p.stdout
    usage = tpw.__doc__.split("\n\n")[1]  # the usage lines at the top show the flag
    assert "mpirun -n 2 python3 scripts/tp_worker.py --bias" in usage


def test_bias_seeded_of_the_outputs_magnitude(full32):
    import torch
    cpu = torch.device("cpu")
    b = tpw.make_bias(3, H, cpu)
    assert b.shape == (H,) and b.dtype == torch.bfloat16 and b.is_contiguous()
    assert b.data_ptr() % 16 == 0
    assert torch.equal(b, tpw.make_bias(3, H, cpu)) and not torch.equal(b, tpw.make_bias(4, H, cpu))
    assert tpw.make_bias(3, H, cpu, torch.float16).dtype == torch.float16
    # its own stream: the weights and the input are those of a run without --bias
    x, wg, wu, wd = full32
    assert torch.equal(x, tpw.make_input(3, T, H, cpu, torch.float32))
    assert all(torch.equal(a, c) for a, c in
               zip((wg, wu, wd), tpw.make_weights(3, H, I, cpu, torch.float32)))
    b32 = tpw.make_bias(3, H, cpu, torch.float32)
    assert not any(torch.equal(b32, t[0, :H]) for t in (wg, wu, wd))
    # as large as the outputs: a bias missing or added twice fails the check by far
    ref = tpw.reference_block(x, wg, wu, wd)
    assert 0.5 * float(ref.std()) < float(b32.std()) < 2 * float(ref.std())
    with_b = tpw.reference_block(x, wg, wu, wd, bias=b32)
    assert tpw.rel_error(ref, with_b) > 10 * tpw.TOL
    assert tpw.rel_error(with_b + b32, with_b) > 10 * tpw.TOL


def test_references_add_the_bias_once(full32):
    import torch
    x, wg, wu, wd = full32
    b = tpw.make_bias(3, H, torch.device("cpu"))
    ref = tpw.reference_block(x, wg, wu, wd)
    torch.testing.assert_close(tpw.reference_block(x, wg, wu, wd, bias=b), ref + b.float())
    assert tpw.reference_block(x, wg, wu, wd, bias=None).equal(ref)
    xb = tpw.make_input(3, 9, 256, torch.device("cpu"))
    full = tpw.make_weights(3, 256, 512, torch.device("cpu"))
    b2 = tpw.make_bias(3, 256, torch.device("cpu"))
    for scales in tpw.SCALE_MODES:
        ref8 = tpw.reference_block_fp8(xb, *full, 2, scales)
        got = tpw.reference_block_fp8(xb, *full, 2, scales, bias=b2)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, ref8 + b2.float())


def test_report_and_json_say_bias():
    res = _result()
    res["config"]["bias"] = True
    text = "\n".join(tpw.report_lines(res))
    assert "(padded 4096 for RS), bf16, bias b_down, seed 0" in text
    assert "fused variants pass bias=b_down; baselines add it to rank 0's" in text
    assert json.loads(json.dumps(res))["config"]["bias"] is True
    res["config"]["bias"] = False
    assert "bias" not in "\n".join(tpw.report_lines(res))


def _bias_run_checks(p, ranks, res, names, hidden: int, block: bool = False):
    """A --bias run whose variants all pass: bias= reached every fused call (in the op's
    contract: the fake asserts it), the same b_down on every rank, warm-up compiled the
    bias kernels, and every variant's timed down projection adds b_down once."""
    import torch
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert [r["code"] for r in ranks] == [0, 0], out
    assert res["ok"] and res["weights_identical"] and res["config"]["bias"] is True
    n_calls = 1 + 2 * 4  # correctness once + (warmup + iters) for block and for down
    assert all(r["calls"] == r["bias_calls"] == {"ar": n_calls, "rs": n_calls}
               for r in ranks), ranks
    b_sum = float(tpw.make_bias(0, hidden, torch.device("cpu")).sum(dtype=torch.float64))
    assert all(r["bias_sums"] == [b_sum] * 4 for r in ranks), ranks
    tag = ["block", "bias"] if block else ["bias"]
    K = res["config"]["inter"] // 2
    assert all(r["prepared"] == [[101, K, "ar", *tag], [101, K, "rs", *tag]]
               for r in ranks), ranks
    for r in ranks:  # the timed `down` of every variant, baselines too, adds b_down once
        assert sorted(r["down_bias"]) == sorted(tpw.VARIANTS)
        assert all(d < 0.1 for d in r["down_bias"].values()), r["down_bias"]
    assert sorted(res["checks"]) == sorted(names)
    for n in names:
        c = res["checks"][n]
        assert c["ok"] and max(c["rel_err"]) < 1e-2 and c["rank_diff"] == 0.0, c
        assert res["us"][n]["block"] > 0 and res["us"][n]["down"] > 0
    assert f"all {len(names)} checks passed" in p.stdout and "bias b_down" in p.stdout


@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
def test_run_with_bias_end_to_end_on_gloo(tmp_path, dtype):
    p, ranks, res = _gloo_run(tmp_path, broken=False, dtype=dtype, bias=True)
    _bias_run_checks(p, ranks, res, tpw.VARIANTS, 128)
    assert res["config"]["dtype"] == dtype


def test_run_with_bias_block_scales_on_gloo(tmp_path):
    p, ranks, res = _gloo_run(tmp_path, broken=False, dtype="e4m3", scales="block",
                              anchor="stand-in", sizes="200,512", bias=True)
    _bias_run_checks(p, ranks, res, tpw.VARIANTS, 200, block=True)
    assert all(r["block_calls"] == r["calls"] for r in ranks), ranks


@pytest.mark.parametrize("fault", ["drop", "twice"])
def test_run_with_bias_catches_a_wrong_bias(tmp_path, fault):
    # a fused op that ignores bias= or adds it on every rank fails; the baselines (their
    # rank 0's partial taking it before the collective) pass against the reference that adds it once
    p, ranks, res = _gloo_run(tmp_path, broken=False, bias=True, bias_fault=fault)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert [r["code"] for r in ranks] == [1, 1], out
    assert not res["ok"]
    for n in ("fused_ar", "fused_rs_ag"):
        assert not res["checks"][n]["ok"] and min(res["checks"][n]["rel_err"]) > 0.1
    assert res["checks"]["mm_ar"]["ok"] and res["checks"]["mm_rs_ag"]["ok"]
    assert "2 of 4 checks FAILED" in p.stdout
