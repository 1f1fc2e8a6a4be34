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

This file doubles as that 2-process child: ``python -m torch.distributed.run ... this_file``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from script_runs import REPO, load_script, plain_env as _plain_env, torch_sees_gpu

SCRIPT = REPO / "scripts" / "tp_worker.py"

tpw = load_script("tp_worker.py", "rsar_tp_worker")


# =========================================================================== the 2-process child
class FakeGemmRsAr:
    """Stand-in for GemmRsAr on CPU: the same call and output contract, done with gloo.

    Partial x @ w.T in float32, summed over the ranks (unless ``broken``), then RS keeps
    rows [rank*local_M, (rank+1)*local_M) of the sum padded to ceil(M/world)*world rows.
    """

    transport = "fake-gloo"

    def __init__(self, all_reduce: bool, broken: bool = False) -> None:
        import torch.distributed as dist
        self.all_reduce, self.broken = all_reduce, broken
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.mode = "ar" if all_reduce else "rs"
        self.calls = 0
        self.prepared: list = []

    def warmup(self, Ms, K: int) -> None:
        # GemmRsAr's compile-ahead step, which the worker runs before the first call
        self.prepared += [[M, K, self.mode] for M in Ms]

    def can_run(self, w) -> bool:
        return w.dim() == 2 and w.is_contiguous()

    def should_run(self, x) -> bool:
        return True

    def check(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __call__(self, x, w, x_scale=None, w_scale=None):
        import torch
        import torch.distributed as dist
        assert x.is_contiguous() and w.is_contiguous(), "GemmRsAr takes contiguous tensors"
        self.calls += 1
        fp8 = x.dtype == torch.float8_e4m3fn
        assert w.dtype == x.dtype and fp8 == (x_scale is not None) == (w_scale is not None)
        if fp8:  # an fp8 op: (x_scale * x) @ (w_scale * w).T, bf16 results
            p = (x.float() * x_scale.reshape(-1, 1)) @ (w.float() * w_scale.reshape(-1, 1)).T
        else:
            p = x.float() @ w.float().T
        out = torch.bfloat16 if fp8 else x.dtype
        if not self.broken:
            dist.all_reduce(p)
        if self.all_reduce:
            return p.to(out)
        M = x.shape[0]
        Mp = tpw.padded_rows(M, self.world)
        full = torch.zeros(Mp, p.shape[1])
        full[:M] = p
        local = Mp // self.world
        return full[self.rank * local:(self.rank + 1) * local].to(out).contiguous()


def _child() -> int:
    import torch
    import torch.distributed as dist
    out_dir = Path(os.environ["TPW_TEST_OUT"])
    broken = os.environ.get("TPW_TEST_BROKEN") == "1"
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    args = tpw.parse(["--hidden", "128", "--inter", "256", "--tokens", "101",
                      "--iters", "3", "--warmup", "1",
                      "--dtype", os.environ.get("TPW_TEST_DTYPE", "bf16")])
    ctx = {"rank": rank, "world": world, "device": torch.device("cpu"), "launcher": "torchrun",
           "gpu": "CPU", "op_ar": FakeGemmRsAr(True, broken), "op_rs": FakeGemmRsAr(False),
           "clock": "wall clock"}
    code, res = tpw.run(ctx, args)
    calls = {"ar": ctx["op_ar"].calls, "rs": ctx["op_rs"].calls}
    prepared = ctx["op_ar"].prepared + ctx["op_rs"].prepared
    (out_dir / f"rank{rank}.json").write_text(json.dumps({"code": code, "calls": calls,
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
@pytest.mark.parametrize("extra", [[], ["--torchrun"], ["--tokens", "100", "--json", "x.json"]])
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
def _gloo_run(tmp_path: Path, broken: bool, dtype: str = "bf16"):
    env = _plain_env(TPW_TEST_OUT=str(tmp_path), TPW_TEST_BROKEN="1" if broken else "0",
                     TPW_TEST_DTYPE=dtype, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
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
