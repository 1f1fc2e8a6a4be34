"""The 2-process CPU child of the tensor-parallel MLP tests, over torch.distributed gloo:

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/tp_mlp_child.py MODE OUT

MODE ``variants``: rsar_core.tp_mlp's four variants for every case of CASES, each checked
with ``check_every_rank`` against the float32 reference, plus the object collectives and the
timing barrier of rsar_core.launcher / rsar_core.timing; rank 0 writes OUT/variants.json.
MODE ``worker``: scripts/tp_worker.py's ``run()`` with --bias on T=101 tokens; rank 0 writes
OUT/worker.json (the result dict and the report lines), every rank OUT/rankR.json.

``FakeGemmRsAr`` stands in for GemmRsAr on CPU: the same call and output contract, done with
gloo, with faults on request (no reduction, bias dropped or added on every rank).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

_TESTS = Path(__file__).resolve().parent
for _p in (_TESTS.parent, _TESTS):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from rsar_core import launcher, reference, timing, tp_mlp  # noqa: E402
from rsar_core.quantize import quantizers  # noqa: E402
from rsar_core.reference import is_block_scaled, scaled_product  # noqa: E402

# name: (dtype, scales, bias, fault, hidden, inter); fault "" | "no_reduce" | "drop" | "twice"
CASES = {
    "bf16": ("bf16", "row", False, "", 128, 256),
    "f16": ("f16", "row", False, "", 128, 256),
    "e4m3_row": ("e4m3", "row", False, "", 128, 256),
    "e4m3_block": ("e4m3", "block", False, "", 200, 512),
    "bf16_bias": ("bf16", "row", True, "", 128, 256),
    "e4m3_block_bias": ("e4m3", "block", True, "", 200, 512),
    "no_reduce": ("bf16", "row", False, "no_reduce", 128, 256),
    "bias_dropped": ("bf16", "row", True, "drop", 128, 256),
    "bias_twice": ("bf16", "row", True, "twice", 128, 256),
}
TOKENS = 101  # odd: the RS shards cover a padding row


class FakeGemmRsAr:
    """Partial x @ w.T in float32 (fp8: of the scaled operands), summed over the ranks, then
    RS keeps rows [rank*local_M, (rank+1)*local_M) of the sum padded to ceil(M/world)*world."""

    transport = "fake-gloo"

    def __init__(self, all_reduce: bool, fault: str = "") -> None:
        self.all_reduce, self.fault = all_reduce, fault
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.calls = self.block_calls = self.bias_calls = 0
        self.bias_sums: list[float] = []
        self.prepared: list[list] = []

    def warmup(self, Ms, K: int, *, block_scales: bool = False, bias: bool = False) -> None:
        self.prepared += [[M, K, "ar" if self.all_reduce else "rs"]
                          + (["block"] if block_scales else []) + (["bias"] if bias else [])
                          for M in Ms]

    def can_run(self, w) -> bool:
        return w.dim() == 2 and w.is_contiguous()

    def should_run(self, x) -> bool:
        return True

    def check(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __call__(self, x, w, x_scale=None, w_scale=None, *, out=None, bias=None):
        assert x.is_contiguous() and w.is_contiguous(), "GemmRsAr takes contiguous tensors"
        assert out is None, "the worker does not pass out="
        self.calls += 1
        fp8 = x.dtype == torch.float8_e4m3fn
        assert w.dtype == x.dtype and fp8 == (x_scale is not None) == (w_scale is not None)
        if fp8 and is_block_scaled(w, w_scale):
            M, K = x.shape
            kb, nb = K // 128, -(-w.shape[0] // 128)
            assert tuple(x_scale.shape) == (M, kb) and tuple(w_scale.shape) == (nb, kb)
            assert x_scale.is_contiguous() or (x_scale.stride(0) == 1
                                               and x_scale.stride(1) >= M), x_scale.stride()
            self.block_calls += 1
        p = (scaled_product(x, w, x_scale, w_scale) if fp8 else x.double() @ w.double().T)
        p = p.float()
        out_dt = torch.bfloat16 if fp8 else x.dtype
        if bias is not None:  # GemmRsAr's contract: (N,) of the result dtype, contiguous
            assert bias.dtype == out_dt and tuple(bias.shape) == (w.shape[0],), bias
            assert bias.is_contiguous() and bias.data_ptr() % 16 == 0
            self.bias_calls += 1
            self.bias_sums.append(float(bias.sum(dtype=torch.float64)))
            if self.fault == "twice":
                p = p + bias.float()
        if self.fault != "no_reduce":
            dist.all_reduce(p)
        if bias is not None and self.fault not in ("drop", "twice"):
            p = p + bias.float()  # once, in fp32, to the reduced sum before rounding
        if self.all_reduce:
            return p.to(out_dt)
        M = x.shape[0]
        Mp = tp_mlp.padded_rows(M, self.world)
        full = torch.zeros(Mp, p.shape[1])
        full[:M] = p
        local = Mp // self.world
        return full[self.rank * local:(self.rank + 1) * local].to(out_dt).contiguous()


def stand_in_scaled_mm(x, w, x_scale, w_scale, out_dtype=None, out=None):
    """``reference.scaled_mm`` where torch's cannot run on this CPU: the float64 product of
    the scaled operands, rounded to ``out_dtype``."""
    y = scaled_product(x, w, x_scale, w_scale).to(out_dtype or torch.bfloat16)
    return out.copy_(y) if out is not None else y


def _case(name: str) -> dict:
    dtype_name, scales, with_bias, fault, H, I = CASES[name]
    rank, world, cpu = dist.get_rank(), dist.get_world_size(), torch.device("cpu")
    dt = torch.bfloat16 if dtype_name == "e4m3" else getattr(torch, {"bf16": "bfloat16",
                                                                     "f16": "float16"}[dtype_name])
    fp8 = dtype_name == "e4m3"
    x = tp_mlp.make_input(0, TOKENS, H, cpu, dt)
    full = tp_mlp.make_weights(0, H, I, cpu, dt)
    b = tp_mlp.make_bias(0, H, cpu, dt) if with_bias else None
    wg, wu, wd = tp_mlp.shard_weights(*full, rank, world)
    w_gu = tp_mlp.fuse_gate_up(wg, wu)
    w_scale = None
    if fp8:
        wd, w_scale = quantizers(scales)[1](wd)
    ops = (FakeGemmRsAr(True, fault), FakeGemmRsAr(False, fault if fault != "no_reduce" else ""))
    variants = tp_mlp.make_variants(x, w_gu, wd, *ops, world, w_scale, scales, bias=b)
    ref = None
    if rank == 0:
        ref = (tp_mlp.reference_block_fp8(x, *full, world, scales, bias=b) if fp8
               else tp_mlp.reference_block(x, *full, bias=b))
    checks = {n: tp_mlp.check_every_rank(variants[n]["block"](), ref, (TOKENS, H), dt, 2e-2)
              for n in tp_mlp.VARIANTS}
    out = {"checks": checks, "calls": [op.calls for op in ops],
           "block_calls": [op.block_calls for op in ops],
           "bias_calls": [op.bias_calls for op in ops], "bias_sums": ops[0].bias_sums[:1]}
    if with_bias and not fault:  # each variant's timed `down`: with the bias minus without
        plain = tp_mlp.make_variants(x, w_gu, wd, *ops, world, w_scale, scales)
        h = tp_mlp.mlp_hidden(x, w_gu)
        out["down_bias"] = {n: float((variants[n]["down"](h).float()
                                      - plain[n]["down"](h).float() - b.float()).abs().max())
                            for n in tp_mlp.VARIANTS}
    return out


def _variants(out_dir: Path) -> None:
    reference.scaled_mm = stand_in_scaled_mm  # torch's block-wise one has no CPU kernel
    rank = dist.get_rank()
    res = {name: _case(name) for name in CASES}
    res["gathered"] = launcher.all_gather_object({"rank": rank})
    res["broadcast"] = launcher.broadcast_object(f"from {rank}", src=1)
    res["median_us"] = timing.median_us(lambda: torch.ones(8).sum(), 3, 1, torch.device("cpu"))
    if rank == 0:
        (out_dir / "variants.json").write_text(json.dumps(res))


def _worker(out_dir: Path) -> None:
    from script_runs import load_script
    tpw = load_script("tp_worker.py", "rsar_tp_worker")
    args = tpw.parse(["--hidden", "128", "--inter", "256", "--tokens", str(TOKENS),
                      "--iters", "3", "--warmup", "1", "--bias"])
    ops = (FakeGemmRsAr(True), FakeGemmRsAr(False))
    ctx = {"rank": dist.get_rank(), "world": dist.get_world_size(),
           "device": torch.device("cpu"), "launcher": "torchrun", "gpu": "CPU",
           "op_ar": ops[0], "op_rs": ops[1], "clock": "wall clock"}
    code, res = tpw.run(ctx, args)
    (out_dir / f"rank{ctx['rank']}.json").write_text(json.dumps(
        {"code": code, "calls": [op.calls for op in ops],
         "bias_calls": [op.bias_calls for op in ops],
         "prepared": ops[0].prepared + ops[1].prepared}))
    if res is not None:
        (out_dir / "worker.json").write_text(json.dumps(
            {"result": res, "report": tpw.report_lines(res)}))


if __name__ == "__main__":
    mode, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    {"variants": _variants, "worker": _worker}[mode](out)
    dist.destroy_process_group()
