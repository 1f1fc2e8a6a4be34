#!/usr/bin/env python3
"""A tensor-parallel transformer MLP block on rsar: checked against one GPU, and timed.

    mpirun -n 2 python3 scripts/tp_worker.py [--tokens 4096] [--json out.json]
    torchrun --nproc-per-node 2 scripts/tp_worker.py --torchrun [--tokens 4096]
    mpirun -n 2 python3 scripts/tp_worker.py --dtype e4m3 [--scales block] [--json out.json]
    mpirun -n 2 python3 scripts/tp_worker.py --bias [--dtype e4m3] [--json out.json]

The block (hidden H, intermediate I, T tokens): y = down(SiLU(gate(x)) * up(x)) [+ b_down].
Every rank draws the full weights from --seed and keeps its shard; the down projection is
row-parallel, so its output is a partial sum the ranks reduce, four ways (rsar_core.tp_mlp):
fused AR, fused RS + all_gather, torch.mm + NCCL all_reduce, torch.mm + NCCL RS + all_gather.
--dtype e4m3 runs the down projection on fp8 operands (rsar_core.quantize): --scales row (h
per token, w_down per output channel; baselines torch._scaled_mm) or block (h per token and
128-group, w_down per 128 x 128 block, sm90; baselines F.scaled_mm, n/a where torch refuses
the shape). --bias adds b_down: fused calls pass bias=, the baselines add it to rank 0's
partial before the collective, as vLLM's RowParallelLinear does.

Each variant's output on every rank is checked against a float32 reference of the block on
rank 0 (relative error < 2e-2; with fp8, of each rank's quantized operands), then timed: the
median of --iters calls (CUDA events), the slower rank, the whole block and the down
projection + communication alone. GemmRsAr's communicator: mpi4py's COMM_WORLD under mpirun
(torch.distributed runs beside it for the baselines), the default ProcessGroup under
torchrun. Exit status, alike on every rank: 0 every check passed, 1 a check failed (or a
rank raised), 2 this host or launch cannot run the worker (rank 0 says why in one sentence).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

try:
    import torch

    from rsar_core import launcher, timing, tp_mlp
    from rsar_core.quantize import SCALE_MODES, quantizers
    from rsar_core.tp_mlp_report import PREFIX, report_lines, summarize
except ImportError as e:  # said plainly in main(), not as a traceback
    _MISSING: ImportError | None = e
    PREFIX, SCALE_MODES = "rsar tp_worker:", ("row", "block")
else:
    _MISSING = None

EXIT_OK, EXIT_FAILED, EXIT_CANNOT_RUN = 0, 1, 2
TOL = 2e-2
HINT = "run scripts/mc_diag.py for details"
N_ALIGN = 8        # GemmRsAr's N (= hidden): a multiple of 8 (sm90; 128 on sm100)
K_ALIGN = 64       # GemmRsAr's K (= intermediate / world): a multiple of 64,
K_ALIGN_FP8 = 128  # ... and of 128 for fp8 operands
DTYPE_NAMES = ("bf16", "f16", "e4m3")  # e4m3: a bf16 block with an fp8 down projection
KERNEL_CAPS = {(9, 0): "H100/H200", (10, 0): "B200/GB200", (10, 3): "B300/GB300"}
BLOCK_CAPS = {(9, 0)}  # block-wise fp8 scales: GemmRsAr runs them on sm90 so far


def cannot_run_reason(cuda_available: bool, device_count: int, world: int,
                      capability: tuple[int, int] | None, gpu_name: str = "", *,
                      torchrun: bool = False, torchrun_without_flag: bool = False,
                      local_world: int | None = None, block_scales: bool = False) -> str | None:
    """Why this host or launch cannot run the worker, as one sentence; None if it can."""
    if not cuda_available or device_count < 2:
        have = "no CUDA GPU" if not cuda_available or device_count < 1 else "only 1 CUDA GPU"
        return (f"{PREFIX} {have} on this host; the tensor-parallel MLP worker needs 2+ "
                f"NVLink-connected GPUs ({HINT})")
    if torchrun_without_flag:
        return (f"{PREFIX} started by torchrun without --torchrun; run `torchrun "
                f"--nproc-per-node 2 scripts/tp_worker.py --torchrun` (or use mpirun -n 2)")
    if world < 2:
        how = ("torchrun --nproc-per-node 2 scripts/tp_worker.py --torchrun" if torchrun
               else "mpirun -n 2 python3 scripts/tp_worker.py")
        return f"{PREFIX} started as a single process; run one rank per GPU, e.g. `{how}`"
    local = world if local_world is None else local_world
    if local > device_count:
        return (f"{PREFIX} {local} ranks on this host but only {device_count} CUDA GPUs; run "
                f"at most one rank per GPU")
    cc = capability and f"{capability[0]}.{capability[1]}"
    if capability is not None and tuple(capability) not in KERNEL_CAPS:
        have = " and ".join(f"{a}.{b} ({n})" for (a, b), n in KERNEL_CAPS.items())
        return (f"{PREFIX} no rsar kernel for this GPU yet ({gpu_name or 'GPU'}, compute "
                f"capability {cc}); rsar has kernels for compute capability {have}")
    if block_scales and capability is not None and tuple(capability) not in BLOCK_CAPS:
        return (f"{PREFIX} block-wise fp8 scales run on compute capability 9.0 (H100/H200) "
                f"so far, not on this GPU ({gpu_name or 'GPU'}, compute capability {cc}); "
                f"use --scales row")
    return None


def size_problem(inter: int, world: int, k_align: int = K_ALIGN) -> str | None:
    """Why --inter does not shard over ``world`` ranks for GemmRsAr (parse() checked the
    rest); None if it does."""
    if inter <= 0 or inter % world:
        return (f"{PREFIX} --inter must be a positive multiple of the world size {world}, "
                f"got {inter}")
    if (inter // world) % k_align:
        return (f"{PREFIX} --inter / world must be a multiple of {k_align} (the K of the "
                f"fused op), got {inter} / {world} = {inter // world}")
    return None


def block_dtype(name: str) -> torch.dtype:
    """The dtype of the block's activations and weights (fp8 is the down projection's only)."""
    from rsar_core.validate import torch_dtype
    return torch.bfloat16 if name == "e4m3" else torch_dtype(name)


def run(ctx: dict[str, Any], args: argparse.Namespace) -> tuple[int, dict[str, Any] | None]:
    """The collective body: (exit status, the result on rank 0, else None). ``ctx``: rank,
    world, device, launcher, gpu, op_ar, op_rs (GemmRsAr), clock; torch.distributed is up."""
    rank, world, dev = ctx["rank"], ctx["world"], ctx["device"]
    op_ar, op_rs = ctx["op_ar"], ctx["op_rs"]
    T, H, I = args.tokens, args.hidden, args.inter
    fp8 = args.dtype == "e4m3"
    scales = args.scales if fp8 else None
    dtype = block_dtype(args.dtype)

    # The full weights from the seed on every rank; each rank keeps its shard.
    x = tp_mlp.make_input(args.seed, T, H, dev, dtype)
    full = tp_mlp.make_weights(args.seed, H, I, dev, dtype)
    b_down = tp_mlp.make_bias(args.seed, H, dev, dtype) if args.bias else None
    prints = launcher.all_gather_object(tp_mlp.fingerprint(x, *full, *(
        [b_down] if args.bias else [])))
    identical = all(p == prints[0] for p in prints)
    wg_r, wu_r, wd_r = tp_mlp.shard_weights(*full, rank, world)
    w_gu = tp_mlp.fuse_gate_up(wg_r, wu_r)
    w_scale = None
    if fp8:  # the down projection's weight, quantized once
        wd_r, w_scale = quantizers(scales)[1](wd_r)
    for op in (op_ar, op_rs):
        if not op.can_run(wd_r):
            raise RuntimeError(f"GemmRsAr.can_run(w_down shard {tuple(wd_r.shape)}) is False "
                               f"on rank {rank}")
    h0 = tp_mlp.mlp_hidden(x, w_gu)
    should = {"ar": bool(op_ar.should_run(h0)), "rs": bool(op_rs.should_run(h0))}
    variants = tp_mlp.make_variants(x, w_gu, wd_r, op_ar, op_rs, world, w_scale,
                                    scales or "row", bias=b_down)
    base_why = None
    if fp8:  # where torch's scaled matmul refuses these operands on any rank: n/a on all
        h8, sh = quantizers(scales)[0](h0)
        whys = launcher.all_gather_object(tp_mlp.baseline_error(h8, wd_r, sh, w_scale, dtype))
        base_why = next((w for w in whys if w), None)
    names = [n for n in tp_mlp.VARIANTS if not (base_why and n in tp_mlp.BASELINES)]
    # compile every kernel before the first timed call, on every rank
    kw = {k: True for k, on in (("block_scales", scales == "block"), ("bias", args.bias)) if on}
    for op in (op_ar, op_rs):
        op.warmup([T], wd_r.shape[1], **kw)
    timing.barrier(dev)

    # Correctness: every variant on every rank against rank 0's float32 reference.
    ref = None
    if rank == 0:
        ref = (tp_mlp.reference_block_fp8(x, *full, world, scales, bias=b_down) if fp8
               else tp_mlp.reference_block(x, *full, bias=b_down))
    full = None
    checks: dict[str, dict[str, Any]] = {}
    for name in names:
        y = variants[name]["block"]()
        timing.sync(dev)
        for op in (op_ar, op_rs):
            op.check()
        checks[name] = tp_mlp.check_every_rank(y, ref, (T, H), x.dtype, TOL)
    del ref
    checks = launcher.broadcast_object(checks if rank == 0 else None)  # rank 0's verdicts
    if dev.type == "cuda":
        torch.cuda.empty_cache()  # the reference's memory, before timing

    # Timing: the whole block, and the down projection + communication from a ready h.
    us: dict[str, dict[str, float]] = {}
    for name in names:
        v = variants[name]
        mine = {"block": timing.median_us(v["block"], args.iters, args.warmup, dev),
                "down": timing.median_us(lambda: v["down"](h0), args.iters, args.warmup, dev)}
        for op in (op_ar, op_rs):
            op.check()
        us[name] = timing.slowest(launcher.all_gather_object(mine))

    ok = identical and all(c.get("ok") for c in checks.values())
    if rank != 0:
        return (EXIT_OK if ok else EXIT_FAILED), None
    res = {
        "config": {"world": world, "launcher": ctx["launcher"], "gpu": ctx["gpu"],
                   "transport": getattr(op_ar, "transport", "?"), "hidden": H, "inter": I,
                   "tokens": T, "padded_tokens": tp_mlp.padded_rows(T, world),
                   "seed": args.seed, "dtype": args.dtype, "scales": scales,
                   "bias": args.bias, "iters": args.iters, "warmup": args.warmup},
        "tol": TOL, "weights_identical": identical, "should_run": should, "checks": checks,
        "us": us, "summary": summarize(T, us), "clock": ctx.get("clock", "CUDA events"),
        "ok": ok,
    }
    if base_why:
        res["baseline_error"], res["unavailable"] = base_why, list(tp_mlp.BASELINES)
    return (EXIT_OK if ok else EXIT_FAILED), res


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=4096, help="H, the model width (N of the fused op)")
    p.add_argument("--inter", type=int, default=14336,
                   help="I, the MLP width; I/world is the K of the fused op (multiple of 64)")
    p.add_argument("--tokens", type=int, default=4096, help="T, rows of x (M of the fused op)")
    p.add_argument("--iters", type=int, default=20, help="timed calls per variant")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls before timing")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the input")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default="bf16",
                   help="element type of the block (e4m3: bf16, the down projection on fp8)")
    p.add_argument("--scales", choices=SCALE_MODES, default="row",
                   help="fp8 scales of the down projection (--dtype e4m3): row or block")
    p.add_argument("--bias", action="store_true", help="the down projection adds b_down")
    p.add_argument("--torchrun", action="store_true",
                   help="started by torchrun: NCCL from its environment, GPU = LOCAL_RANK")
    p.add_argument("--json", dest="json_path", metavar="PATH", help="write the result here (rank 0)")
    a = p.parse_args(argv)
    if a.hidden <= 0 or a.hidden % N_ALIGN:
        p.error(f"--hidden must be a positive multiple of {N_ALIGN}")
    if a.inter <= 0 or a.inter % K_ALIGN:
        p.error(f"--inter must be a positive multiple of {K_ALIGN}")
    if a.dtype == "e4m3" and a.inter % K_ALIGN_FP8:
        p.error(f"--inter must be a multiple of {K_ALIGN_FP8} with --dtype e4m3")
    if a.scales != "row" and a.dtype != "e4m3":
        p.error(f"--scales {a.scales} needs --dtype e4m3 (fp8 operands have scales; "
                f"{a.dtype} has none)")
    for name, low in (("tokens", 1), ("iters", 1), ("warmup", 0)):
        if getattr(a, name) < low:
            p.error(f"--{name} must be >= {low}")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    tr = args.torchrun
    if _MISSING is not None:
        print(f"{PREFIX} {_MISSING}; pip install -e . first", flush=True)
        return EXIT_CANNOT_RUN
    speaks = launcher.printing_rank(tr) == 0
    # Only the printing rank fails: torchrun and mpiexec stop every worker once one exits
    # non-zero, which could kill the printing rank before it has said why.
    world = launcher.world_size(tr)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cap, name = None, ""
    if count >= 2:
        idx = launcher.gpu_index(tr, count)
        cap, name = tuple(torch.cuda.get_device_capability(idx)), torch.cuda.get_device_name(idx)
    why = cannot_run_reason(count > 0, count, world, cap, name, torchrun=tr,
                            torchrun_without_flag=not tr and launcher.started_by_torchrun(),
                            local_world=launcher.local_world_size(tr),
                            block_scales=args.dtype == "e4m3" and args.scales == "block")
    why = why or size_problem(args.inter, world, K_ALIGN_FP8 if args.dtype == "e4m3" else K_ALIGN)
    if why:  # every rank sees the same host and launch, so every rank stops here alike
        if speaks:
            print(why, flush=True)
        return EXIT_CANNOT_RUN if speaks else EXIT_OK

    d = None
    try:
        d = launcher.init_distributed(tr)
        torch.set_float32_matmul_precision("highest")  # a float32 reference, not TF32
        from rsar_core import GemmRsAr
        fp8 = torch.float8_e4m3fn if args.dtype == "e4m3" else None
        op_ar, op_rs = (GemmRsAr(args.tokens, args.hidden, all_reduce=ar, comm=d.comm,
                                 dtype=block_dtype(args.dtype), input_dtype=fp8)
                        for ar in (True, False))
        gpus = sorted(set(launcher.all_gather_object(torch.cuda.get_device_name(d.device))))
        ctx = {"rank": d.rank, "world": d.world, "device": d.device,
               "launcher": "torchrun" if tr else "mpirun",
               "gpu": f"{' / '.join(gpus)} x{d.world}", "op_ar": op_ar, "op_rs": op_rs,
               "clock": "CUDA events"}
        if d.rank == 0:
            sc = f" ({args.scales} scales)" if args.dtype == "e4m3" else ""
            sc += " + bias" if args.bias else ""
            print(f"{PREFIX} {d.world} ranks ({ctx['launcher']}), H={args.hidden} "
                  f"I={args.inter} T={args.tokens} {args.dtype}{sc}: checking, then timing ...",
                  flush=True)
        code, res = run(ctx, args)
        op_rs.close()
        op_ar.close()
    except Exception as e:
        rank = d.rank if d else launcher.rank(tr)
        print(f"{PREFIX} rank {rank} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        traceback.print_exc()
        sys.stderr.flush()
        if not tr:  # a peer may wait in a collective or the rendezvous: end the whole job
            from mpi4py import MPI
            MPI.COMM_WORLD.Abort(EXIT_FAILED)
        return EXIT_FAILED  # torchrun stops the other workers when one fails

    if res is not None:  # rank 0
        try:
            nccl = torch.cuda.nccl.version()
        except Exception:  # informational only
            nccl = None
        res["run"] = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                      "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
                      "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl}
        print("\n".join(report_lines(res)), flush=True)
        if args.json_path:
            Path(args.json_path).write_text(json.dumps(res, indent=1))
    torch.distributed.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
