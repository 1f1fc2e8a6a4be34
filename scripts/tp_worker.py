#!/usr/bin/env python3
"""A tensor-parallel transformer MLP block on rsar: checked against one GPU, and timed.

    mpirun -n 2 python3 scripts/tp_worker.py [--tokens 4096] [--json out.json]
    torchrun --nproc-per-node 2 scripts/tp_worker.py --torchrun [--tokens 4096]
    mpirun -n 2 python3 scripts/tp_worker.py --dtype e4m3 [--scales block] [--json out.json]
    mpirun -n 2 python3 scripts/tp_worker.py --bias [--dtype e4m3] [--json out.json]

The block (hidden H, intermediate I, T tokens, bf16): y = down(SiLU(gate(x)) * up(x)),
plus b_down with --bias.
Weights are generated in full from --seed on every rank and each rank keeps its shard:
gate and up are column-parallel (I/world rows of W_gate and W_up each, fused into one
(2*I/world, H) GEMM), down is row-parallel (the (H, I/world) column slice of W_down), so
each rank's down projection is a partial sum that the ranks must reduce. Four variants
of the same block, on the same shards:

  fused AR           y = GemmRsAr(all_reduce=True)(h, w_down)         (T, H) on every rank
  fused RS + AG      GemmRsAr(all_reduce=False)(h, w_down) -> (T/world, H), then NCCL
                     all_gather_into_tensor to (padded_T, H), sliced [:T] (sequence parallel)
  torch.mm + AR      torch.mm, then NCCL all_reduce
  torch.mm + RS + AG torch.mm, then NCCL reduce_scatter and all_gather

``--dtype e4m3``: the down projection runs on fp8 operands, as fp8 serving stacks run it,
with the scales of ``--scales``:
  row    (default) h quantized per token on every call (one fp32 scale per row of h) and
         the w_down shard per output channel once; the baselines are torch._scaled_mm
         (row-wise, fast accumulation) then NCCL.
  block  DeepSeek-style block-wise scales: h quantized per token and 128-element k-group
         on every call (scales (T, K/128), M-major: torch's BlockWise1x128 layout) and the
         w_down shard per 128 x 128 block once (scales (ceil(H/128), K/128), the last
         block row partial where H is not a multiple of 128); the baselines are
         torch.nn.functional.scaled_mm (BlockWise1x128 x BlockWise128x128) then NCCL.
         Where that kernel refuses the shape or this torch build (tried once at set-up),
         the baseline variants are reported n/a with its reason and the fused ones still
         run. Block-wise scales run on sm90 (H100/H200) so far.
Each block's or group's largest magnitude maps to fp8's largest value (448). The fused
variants are GemmRsAr(input_dtype=float8_e4m3fn) with the scales; gate / up stay bf16.
The reference then takes each rank's quantized h and shard (dequantized with their
scales), so the check measures the op and the exchange, not the quantization.

``--bias``: the down projection has a bias, as a row-parallel output projection does
(Megatron's RowParallelLinear, gpt-oss's attention output): y = down(...) + b_down, b_down
of H elements drawn from --seed (std 0.5, as large as the outputs, so a bias missing or
added twice fails the check), of the block's dtype (bf16, also with e4m3), the same on
every rank. The fused variants pass bias=b_down (added once to the reduced sum, in fp32
before rounding; the RS call adds it to its shard, then the all-gather); the baselines
add it to rank 0's partial before the collective, as vLLM's RowParallelLinear does
(torch.addmm on rank 0; fp8: an in-place add to rank 0's scaled_mm output). The
reference adds it too, both timings include it, and GemmRsAr.warmup compiles the bias
kernels (bias=True).

Every variant's output on every rank is compared with a float32 reference of the whole
block computed on rank 0's GPU from the full weights (relative error < 2e-2), then each
variant is timed (median of --iters calls after warm-up, CUDA events, the slower rank):
the whole block (tokens/s) and the down projection + communication alone.

Launch forms:
  mpirun   the communicator of GemmRsAr is mpi4py's COMM_WORLD; torch.distributed (NCCL)
           is started too, over a TCP rendezvous whose port rank 0 broadcasts over MPI,
           for the NCCL baselines and the all-gather. GPU = rank % device count.
  torchrun (--torchrun) torch.distributed NCCL from torchrun's environment; GemmRsAr gets
           the default ProcessGroup as its communicator. GPU = LOCAL_RANK.

Exit status, the same on every rank: 0 every check passed, 1 a check failed (or a rank
raised), 2 this host or launch cannot run the worker (no CUDA GPU, one rank, too few GPUs,
no kernel for this GPU, sizes that do not shard): one plain sentence from rank 0 says which.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CANNOT_RUN = 2

TOL = 2e-2
PREFIX = "rsar tp_worker:"
HINT = "run scripts/mc_diag.py for details"
N_ALIGN = 8     # GemmRsAr: N (= hidden) must be a multiple of 8 (sm90; 128 on sm100)
K_ALIGN = 64    # GemmRsAr: K (= intermediate / world) must be a multiple of 64
K_ALIGN_FP8 = 128  # ... and of 128 for fp8 operands
# Compute capabilities rsar has a kernel for (GemmRsAr's arch table): sm_90a, sm_100a.
# --dtype: GemmRsAr's torch.bfloat16 / torch.float16; e4m3: a bf16 block whose down
# projection runs on fp8 operands (input_dtype=torch.float8_e4m3fn)
DTYPE_NAMES = ("bf16", "f16", "e4m3")
# --scales of an e4m3 run: one per row of h / per output channel of w_down, or block-wise
# (h per row and 128-element k-group, w_down per 128 x 128 block)
SCALE_MODES = ("row", "block")
FP8_MAX = 448.0  # float8_e4m3fn's largest finite value
FP8_BLOCK = 128  # the k-group of block-wise scales and the side of w's blocks
BLOCK_CAPS = {(9, 0)}  # block-wise fp8 scales: GemmRsAr runs them on sm90 so far
KERNEL_CAPS = {(9, 0): "H100/H200", (10, 0): "B200/GB200", (10, 3): "B300/GB300"}

VARIANTS = ("fused_ar", "mm_ar", "fused_rs_ag", "mm_rs_ag")
LABELS = {
    "fused_ar": "fused AR (GemmRsAr)",
    "mm_ar": "torch.mm + NCCL all_reduce",
    "fused_rs_ag": "fused RS (GemmRsAr) + all_gather",
    "mm_rs_ag": "torch.mm + NCCL RS + all_gather",
}
# (name, fused variant, baseline variant)
PAIRS = (("AR", "fused_ar", "mm_ar"), ("RS+AG", "fused_rs_ag", "mm_rs_ag"))
# the variants torch's (scaled) matmul computes: n/a where it refuses fp8 scales
BASELINES = ("mm_ar", "mm_rs_ag")

_MPI_WORLD_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")
_MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
_TORCHRUN_MARK = "TORCHELASTIC_RUN_ID"  # set by torchrun for its workers


# --------------------------------------------------------------------------- launcher
def _env_int(names: tuple[str, ...], default: int, env: dict[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    for v in names:
        val = env.get(v)
        if val:
            try:
                return int(val)
            except ValueError:
                pass
    return default


def launcher_world(torchrun: bool, env: dict[str, str] | None = None) -> int:
    """World size as the launcher set it (1 when started by hand)."""
    return _env_int(("WORLD_SIZE",) if torchrun else _MPI_WORLD_VARS, 1, env)


def launcher_rank(torchrun: bool, env: dict[str, str] | None = None) -> int:
    return _env_int(("RANK",) if torchrun else _MPI_RANK_VARS, 0, env)


def launcher_local_world(torchrun: bool, env: dict[str, str] | None = None) -> int:
    """Ranks on this host (what must fit on its GPUs)."""
    if torchrun:
        return _env_int(("LOCAL_WORLD_SIZE", "WORLD_SIZE"), 1, env)
    return _env_int(("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS") + _MPI_WORLD_VARS, 1, env)


def started_by_torchrun(env: dict[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return bool(env.get(_TORCHRUN_MARK)) and not any(env.get(v) for v in _MPI_WORLD_VARS)


def printing_rank(torchrun: bool, env: dict[str, str] | None = None) -> int:
    """The rank that prints the cannot-run sentence (0 prints, the others stay quiet)."""
    return launcher_rank(torchrun or started_by_torchrun(env), env)


def cannot_run_reason(cuda_available: bool, device_count: int, world: int,
                      capability: tuple[int, int] | None, gpu_name: str = "", *,
                      torchrun: bool = False, torchrun_without_flag: bool = False,
                      local_world: int | None = None,
                      block_scales: bool = False) -> str | None:
    """Why this host or launch cannot run the worker, as one plain sentence; None if it can."""
    if not cuda_available or device_count < 1:
        return (f"{PREFIX} no CUDA GPU on this host; the tensor-parallel MLP worker needs 2+ "
                f"NVLink-connected GPUs ({HINT})")
    if device_count < 2:
        return (f"{PREFIX} only 1 CUDA GPU on this host; the tensor-parallel MLP worker needs "
                f"2+ NVLink-connected GPUs ({HINT})")
    if torchrun_without_flag:
        return (f"{PREFIX} started by torchrun without --torchrun; run `torchrun "
                f"--nproc-per-node 2 scripts/tp_worker.py --torchrun` (or use mpirun -n 2)")
    if world < 2:
        how = ("torchrun --nproc-per-node 2 scripts/tp_worker.py --torchrun" if torchrun
               else "mpirun -n 2 python3 scripts/tp_worker.py")
        return (f"{PREFIX} started as a single process; run one rank per GPU, e.g. `{how}`")
    local = world if local_world is None else local_world
    if local > device_count:
        return (f"{PREFIX} {local} ranks on this host but only {device_count} CUDA GPUs; run "
                f"at most one rank per GPU")
    if capability is not None and tuple(capability) not in KERNEL_CAPS:
        cc = f"{capability[0]}.{capability[1]}"
        have = " and ".join(f"{a}.{b} ({n})" for (a, b), n in KERNEL_CAPS.items())
        return (f"{PREFIX} no rsar kernel for this GPU yet ({gpu_name or 'GPU'}, compute "
                f"capability {cc}); rsar has kernels for compute capability {have}")
    if block_scales and capability is not None and tuple(capability) not in BLOCK_CAPS:
        cc = f"{capability[0]}.{capability[1]}"
        return (f"{PREFIX} block-wise fp8 scales run on compute capability 9.0 (H100/H200) "
                f"so far, not on this GPU ({gpu_name or 'GPU'}, compute capability {cc}); "
                f"use --scales row")
    return None


def size_problem(hidden: int, inter: int, tokens: int, world: int,
                 k_align: int = K_ALIGN) -> str | None:
    """Why these sizes cannot be sharded over ``world`` ranks for GemmRsAr (whose K must be
    a multiple of ``k_align``); None if they can."""
    if hidden <= 0 or hidden % N_ALIGN:
        return f"{PREFIX} --hidden must be a positive multiple of {N_ALIGN}, got {hidden}"
    if tokens < 1:
        return f"{PREFIX} --tokens must be >= 1, got {tokens}"
    if inter <= 0 or inter % world:
        return (f"{PREFIX} --inter must be a positive multiple of the world size {world}, "
                f"got {inter}")
    if (inter // world) % k_align:
        return (f"{PREFIX} --inter / world must be a multiple of {k_align} (the K of the "
                f"fused op), got {inter} / {world} = {inter // world}")
    return None


# --------------------------------------------------------------------------- block math
# Pure functions of torch tensors on any device: the CPU tests run them on tiny sizes.
def make_input(seed: int, tokens: int, hidden: int, device: Any, dtype: Any = None) -> Any:
    """x: (T, H), the same on every rank (TP replicates the block's input)."""
    import torch
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1009 + 7)
    return torch.randn(tokens, hidden, generator=g, device=device).to(dtype or torch.bfloat16)


def make_weights(seed: int, hidden: int, inter: int, device: Any,
                 dtype: Any = None) -> tuple[Any, Any, Any]:
    """The full weights from ``seed``, identical on every rank that asks with the same seed.

    W_gate, W_up: (I, H) with std H^-1/2; W_down: (H, I) with std I^-1/2, so activations
    stay of order one through the block.
    """
    import torch
    dtype = dtype or torch.bfloat16
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1009 + 1)
    w_gate = (torch.randn(inter, hidden, generator=g, device=device) * hidden ** -0.5).to(dtype)
    w_up = (torch.randn(inter, hidden, generator=g, device=device) * hidden ** -0.5).to(dtype)
    w_down = (torch.randn(hidden, inter, generator=g, device=device) * inter ** -0.5).to(dtype)
    return w_gate, w_up, w_down


BIAS_STD = 0.5  # b_down's std: the block's outputs have a std of about 0.6


def make_bias(seed: int, hidden: int, device: Any, dtype: Any = None) -> Any:
    """b_down: (H,) from ``seed`` (its own stream, so the weights and the input do not
    change with --bias), identical on every rank, contiguous; std BIAS_STD, of the order of
    the block's outputs, so that a bias missing or added twice moves them by far more than
    the tolerance."""
    import torch
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1009 + 3)
    return (torch.randn(hidden, generator=g, device=device) * BIAS_STD).to(
        dtype or torch.bfloat16).contiguous()


def shard_weights(w_gate: Any, w_up: Any, w_down: Any, rank: int,
                  world: int) -> tuple[Any, Any, Any]:
    """This rank's shards, contiguous: gate/up rows (I/world, H), down columns (H, I/world)."""
    inter = w_gate.shape[0]
    if inter % world:
        raise ValueError(f"intermediate size {inter} is not divisible by world {world}")
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    s = inter // world
    lo, hi = rank * s, (rank + 1) * s
    return (w_gate[lo:hi].contiguous(), w_up[lo:hi].contiguous(),
            w_down[:, lo:hi].contiguous())


def fuse_gate_up(w_gate_r: Any, w_up_r: Any) -> Any:
    """One (2*I/world, H) weight so gate and up are one GEMM (as serving stacks do)."""
    import torch
    return torch.cat([w_gate_r, w_up_r], dim=0).contiguous()


def mlp_hidden(x: Any, w_gate_up: Any) -> Any:
    """h = SiLU(x @ W_gate_r.T) * (x @ W_up_r.T): (T, I/world), contiguous, x's dtype."""
    import torch
    import torch.nn.functional as F
    gu = torch.mm(x, w_gate_up.t())
    gate, up = gu.chunk(2, dim=1)
    return F.silu(gate) * up


def quantize_rows(t: Any) -> tuple[Any, Any]:
    """(t as float8_e4m3fn, its (rows, 1) float32 scales): each row scaled so that its
    largest magnitude maps to fp8's largest value (dynamic per-token quantization of
    activations, per-channel of weights)."""
    import torch
    scale = (t.abs().amax(dim=1, keepdim=True).float() / FP8_MAX).clamp_min(1e-12)
    return (t.float() / scale).to(torch.float8_e4m3fn), scale


def quantize_groups(t: Any) -> tuple[Any, Any]:
    """(t as float8_e4m3fn, its (rows, cols / 128) float32 scales, M-major): one scale per
    row and 128-element group of columns, each group's largest magnitude mapped to fp8's
    largest value (DeepSeek-style dynamic quantization of activations). The scales have
    strides (1, rows): torch's BlockWise1x128 layout, which GemmRsAr takes too."""
    import torch
    M, K = t.shape
    if K % FP8_BLOCK:
        raise ValueError(f"block-wise scales need columns a multiple of {FP8_BLOCK}, got {K}")
    g = t.float().reshape(M, K // FP8_BLOCK, FP8_BLOCK)
    scale = (g.abs().amax(dim=2) / FP8_MAX).clamp_min(1e-12)           # (M, K / 128)
    q = (g / scale.unsqueeze(2)).reshape(M, K).to(torch.float8_e4m3fn)
    return q, scale.t().contiguous().t()


def quantize_blocks(w: Any) -> tuple[Any, Any]:
    """(w as float8_e4m3fn, its (ceil(N / 128), K / 128) float32 scales, row-major): one
    scale per 128 x 128 block of w (N, K), each block's largest magnitude mapped to fp8's
    largest value (block-wise weight quantization); where N is not a multiple of 128 the
    last block row covers the rows there are (zero-padded for its amax)."""
    import torch
    import torch.nn.functional as F
    N, K = w.shape
    if K % FP8_BLOCK:
        raise ValueError(f"block-wise scales need K a multiple of {FP8_BLOCK}, got {K}")
    nb, kb = -(-N // FP8_BLOCK), K // FP8_BLOCK
    wp = F.pad(w.float(), (0, 0, 0, nb * FP8_BLOCK - N))
    b = wp.reshape(nb, FP8_BLOCK, kb, FP8_BLOCK)
    scale = (b.abs().amax(dim=(1, 3)) / FP8_MAX).clamp_min(1e-12)      # (nb, kb)
    q = (b / scale[:, None, :, None]).reshape(nb * FP8_BLOCK, K)[:N]
    return q.to(torch.float8_e4m3fn).contiguous(), scale.contiguous()


def quantizers(scales: str = "row") -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """(quantize h, quantize w_down) for ``--scales``: each returns (fp8 tensor, scales)."""
    if scales == "row":
        return quantize_rows, quantize_rows
    if scales == "block":
        return quantize_groups, quantize_blocks
    raise ValueError(f"scales must be one of {SCALE_MODES}, got {scales!r}")


def reference_block_fp8(x: Any, w_gate: Any, w_up: Any, w_down: Any, world: int,
                        scales: str = "row", bias: Any = None) -> Any:
    """The block with its down projection on fp8 operands, in float32 from the full weights:
    the sum over ranks of each rank's quantized h and w_down shard, dequantized with their
    ``scales`` (h computed as each rank computes it, so it quantizes the same way), plus
    ``bias`` (b_down, (H,)) once where given."""
    from rsar_core.reference import scaled_product
    quant_h, quant_w = quantizers(scales)
    out = None
    for r in range(world):
        wg, wu, wd = shard_weights(w_gate, w_up, w_down, r, world)
        h8, sh = quant_h(mlp_hidden(x, fuse_gate_up(wg, wu)))
        w8, sw = quant_w(wd)
        if scales == "block":  # each group's / block's scale over the elements it covers
            part = scaled_product(h8, w8, sh, sw).float()
        else:
            part = (h8.float() * sh) @ (w8.float() * sw).T
        out = part if out is None else out + part
    if bias is not None:
        out = out + bias.float()
    return out


def baseline_error(h8: Any, w8: Any, x_scale: Any, w_scale: Any, out_dtype: Any) -> str | None:
    """None where the fp8 baselines' matmul (``rsar_core.reference.scaled_mm``: torch's
    row-wise or block-wise scaled_mm) runs on these operands, else why not ("Type: first
    line of the message"): torch's block-wise kernel refuses some shapes and builds."""
    from rsar_core import reference
    return reference.call_refusal(reference.scaled_mm, h8, w8, x_scale, w_scale, out_dtype)


def partial_block(x: Any, w_gate_up: Any, w_down_r: Any) -> Any:
    """This rank's unreduced contribution to the block output: (T, H)."""
    import torch
    return torch.mm(mlp_hidden(x, w_gate_up), w_down_r.t())


def reference_block(x: Any, w_gate: Any, w_up: Any, w_down: Any, bias: Any = None) -> Any:
    """The whole block on one device in float32 from the full weights: (T, H) float32,
    plus ``bias`` (b_down, (H,)) where given."""
    import torch.nn.functional as F
    xf = x.float()
    h = F.silu(xf @ w_gate.float().T) * (xf @ w_up.float().T)
    y = h @ w_down.float().T
    return y if bias is None else y + bias.float()


def padded_rows(tokens: int, world: int) -> int:
    """padded_T = ceil(T / world) * world: the rows the RS shards cover."""
    return -(-tokens // world) * world


def rel_error(got: Any, ref: Any) -> float:
    """||got - ref|| / ||ref|| in float32 (inf when got holds a NaN or an inf)."""
    got = got.float()
    err = float((got - ref).norm() / ref.norm().clamp_min(1e-30))
    return err if math.isfinite(err) else float("inf")


def fingerprint(*tensors: Any) -> list[float]:
    """float64 sums: equal on every rank exactly when the seeded tensors came out equal."""
    import torch
    return [float(t.sum(dtype=torch.float64)) for t in tensors]


# --------------------------------------------------------------------------- variants
def _all_gather(out: Any, inp: Any) -> None:
    import torch.distributed as dist
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp)


def _reduce_scatter(out: Any, inp: Any) -> None:
    import torch.distributed as dist
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(out, inp)


def make_variants(x: Any, w_gate_up: Any, w_down_r: Any, op_ar: Any, op_rs: Any,
                  world: int, w_scale: Any = None, scales: str = "row",
                  bias: Any = None) -> dict[str, dict[str, Callable[..., Any]]]:
    """name -> {"down": h -> (T, H), "block": () -> (T, H)} for the four variants.

    ``down`` is the row-parallel down projection plus its communication, from a ready h;
    ``block`` is the whole MLP block from x. Collectives run over torch.distributed's
    default group (NCCL on the GPUs; gloo in the CPU tests). With ``w_scale`` (fp8: the
    fp8 ``w_down_r``'s scales, per channel or per 128 x 128 block as ``scales`` says) every
    variant quantizes h first (per token, or per token and 128-element group) and
    multiplies fp8 operands: GemmRsAr with the scales, or torch's scaled_mm
    (``rsar_core.reference.scaled_mm``: row-wise or block-wise). With ``bias`` (b_down,
    (H,) of the output dtype) the fused calls pass ``bias=`` (GemmRsAr adds it once to the
    reduced sum) and the baselines add it to rank 0's partial before the collective, as
    vLLM's RowParallelLinear does (bf16 / fp16: rank 0's GEMM is ``torch.addmm``; fp8: an
    in-place add to rank 0's scaled_mm output), so ``down`` includes the bias in every
    variant.
    """
    import torch
    import torch.distributed as dist
    T, H = x.shape[0], w_down_r.shape[0]
    Tp = padded_rows(T, world)
    local = Tp // world
    dev, dt = x.device, x.dtype
    bkw = {} if bias is None else {"bias": bias}  # the fused calls' bias=, where there is one

    first = bias is not None and dist.get_rank() == 0  # the rank whose partial takes the bias
    if w_scale is None:
        def fused(op: Any, h: Any) -> Any:
            return op(h, w_down_r, **bkw)

        def product(h: Any, out: Any = None) -> Any:
            if first:
                return torch.addmm(bias, h, w_down_r.t(), out=out)
            return torch.mm(h, w_down_r.t(), out=out)
    else:
        from rsar_core.reference import scaled_mm
        quant_h = quantizers(scales)[0]

        def fused(op: Any, h: Any) -> Any:
            h8, sh = quant_h(h)
            return op(h8, w_down_r, sh, w_scale, **bkw)

        def product(h: Any, out: Any = None) -> Any:
            h8, sh = quant_h(h)
            y = scaled_mm(h8, w_down_r, sh, w_scale, dt, out=out)
            return y.add_(bias) if first else y

    def fused_ar(h: Any) -> Any:
        return fused(op_ar, h)

    def fused_rs_ag(h: Any) -> Any:
        shard = fused(op_rs, h)
        full = torch.empty(Tp, H, dtype=dt, device=dev)
        _all_gather(full, shard)
        return full[:T]

    def mm_ar(h: Any) -> Any:
        y = product(h)
        dist.all_reduce(y)
        return y

    def mm_rs_ag(h: Any) -> Any:
        if Tp == T:  # no padding: the product itself (torch's block-wise one has no out=)
            part = product(h)
        else:
            part = torch.empty(Tp, H, dtype=dt, device=dev)
            product(h, out=part[:T])
            part[T:].zero_()
        shard = torch.empty(local, H, dtype=dt, device=dev)
        _reduce_scatter(shard, part)
        full = torch.empty(Tp, H, dtype=dt, device=dev)
        _all_gather(full, shard)
        return full[:T]

    downs = {"fused_ar": fused_ar, "mm_ar": mm_ar, "fused_rs_ag": fused_rs_ag,
             "mm_rs_ag": mm_rs_ag}
    out: dict[str, dict[str, Callable[..., Any]]] = {}
    for name in VARIANTS:
        down = downs[name]
        out[name] = {"down": down,
                     "block": (lambda d=down: d(mlp_hidden(x, w_gate_up)))}
    return out


# --------------------------------------------------------------------------- timing
def _sync(device: Any) -> None:
    import torch
    if getattr(device, "type", "cpu") == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn: Callable[[], Any], iters: int, warmup: int, device: Any) -> float:
    """Median microseconds of one call on this rank (CUDA events on the current stream;
    wall clock on CPU), after ``warmup`` calls and a barrier across the ranks."""
    import torch
    import torch.distributed as dist
    for _ in range(warmup):
        fn()
    _sync(device)
    dist.barrier()
    _sync(device)
    if getattr(device, "type", "cpu") == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for s, e in zip(starts, ends):
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize(device)
        ms = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    else:
        ms = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms) * 1e3


def summarize(tokens: int, us: dict[str, dict[str, float]]) -> dict[str, Any]:
    """tokens/s of each variant's block and the speedups (baseline time / fused time)."""
    tps = {n: tokens / (t["block"] * 1e-6) for n, t in us.items()
           if t.get("block", 0) > 0}
    speedup: dict[str, dict[str, float]] = {}
    for pair, fused, base in PAIRS:
        if fused in us and base in us:
            speedup[pair] = {part: us[base][part] / us[fused][part]
                             for part in ("block", "down")
                             if us[fused].get(part, 0) > 0 and part in us[base]}
    return {"tokens_per_s": tps, "speedup": speedup}


# --------------------------------------------------------------------------- report
def report_lines(res: dict[str, Any]) -> list[str]:
    """The readable report rank 0 prints, from the result dict (the one --json writes)."""
    c = res["config"]
    lines = [
        f"{PREFIX} tensor-parallel MLP block on {c['world']} ranks ({c['launcher']}), "
        f"{c['gpu']}, rsar transport {c['transport']}",
        f"  hidden {c['hidden']}, intermediate {c['inter']} ({c['inter'] // c['world']} per "
        f"rank), tokens {c['tokens']} (padded {c['padded_tokens']} for RS), "
        f"{c.get('dtype', 'bf16')}, "
        + (f"{c['scales']} scales, " if c.get("scales") else "")
        + ("bias b_down, " if c.get("bias") else "")
        + f"seed {c['seed']}; weights identical on all ranks: "
        f"{'yes' if res.get('weights_identical') else 'NO'}",
    ]
    if c.get("scales"):
        lines.append("  fp8 down projection: "
                     + ("h per token, w_down per output channel; baselines torch._scaled_mm "
                        "(row-wise)" if c["scales"] == "row" else
                        "h per token and 128-element k-group, w_down per 128 x 128 block; "
                        "baselines torch.nn.functional.scaled_mm (BlockWise1x128 x "
                        "BlockWise128x128)"))
    if c.get("bias"):
        lines.append("  bias: fused variants pass bias=b_down; baselines add it to rank 0's "
                     "partial before the collective (torch.addmm; fp8: an add), as vLLM does")
    na = set(res.get("unavailable") or ())
    sr = res.get("should_run")
    if sr:
        lines.append(f"  GemmRsAr.should_run(h): AR {sr.get('ar')}, RS {sr.get('rs')}")
    lines.append(f"correctness vs a float32 single-GPU reference of the whole block (rank 0), "
                 f"rel err < {res['tol']:.0e}:")
    for name in VARIANTS:
        chk = res["checks"].get(name)
        if chk is None:
            if name in na:
                lines.append(f"  {LABELS[name]:<34s} n/a (baseline unavailable, see below)")
            continue
        if chk.get("error"):
            lines.append(f"  {LABELS[name]:<34s} FAIL  {chk['error']}")
            continue
        errs = "  ".join(f"rank {r} {e:.2e}" for r, e in enumerate(chk["rel_err"]))
        verdict = "ok" if chk["ok"] else "FAIL"
        lines.append(f"  {LABELS[name]:<34s} {errs}  {verdict}"
                     + (f"  (ranks differ by up to {chk['rank_diff']:.2e})"
                        if chk.get("rank_diff") else ""))
    us = res.get("us") or {}
    if us:
        lines.append(f"timing: median of {c['iters']} calls after {c['warmup']} warm-up, "
                     f"slowest rank ({res.get('clock', 'CUDA events')}):")
        lines.append(f"  {'variant':<34s} {'block us':>10s} {'tokens/s':>13s} "
                     f"{'down+comm us':>13s}")
        tps = res["summary"]["tokens_per_s"]
        for name in VARIANTS:
            if name not in us:
                if name in na:
                    lines.append(f"  {LABELS[name]:<34s} {'n/a':>10s} {'n/a':>13s} "
                                 f"{'n/a':>13s}")
                continue
            t = us[name]
            lines.append(f"  {LABELS[name]:<34s} {t['block']:10.1f} {tps.get(name, 0):13,.0f} "
                         f"{t['down']:13.1f}")
        sp = res["summary"]["speedup"]
        if sp:
            lines.append("speedup of the fused op (baseline time / fused time):")
            for pair, _, _ in PAIRS:
                if pair in sp:
                    s = sp[pair]
                    lines.append(f"  {pair:<6s} block x{s.get('block', float('nan')):.2f}, "
                                 f"down+comm x{s.get('down', float('nan')):.2f}")
    if na:
        lines.append(f"baselines n/a: torch's scaled matmul refused these fp8 operands at "
                     f"set-up ({res.get('baseline_error') or 'no reason given'}); no speedup")
    n = len(res["checks"])
    bad = sum(not ch.get("ok") for ch in res["checks"].values())
    if not res.get("weights_identical"):
        lines.append(f"{PREFIX} FAILED: the ranks generated different weights or inputs")
    if bad:
        lines.append(f"{PREFIX} {bad} of {n} checks FAILED")
    elif res.get("weights_identical"):
        lines.append(f"{PREFIX} all {n} checks passed (rel err < {res['tol']:g})")
    return lines


# --------------------------------------------------------------------------- the run
def run(ctx: dict[str, Any], args: argparse.Namespace) -> tuple[int, dict[str, Any] | None]:
    """The collective body, on any device: returns (exit status, result on rank 0 else None).

    ``ctx``: rank, world, device, launcher, gpu, op_ar, op_rs (GemmRsAr or a stand-in with
    the same call), clock. torch.distributed must be initialised.
    """
    import torch
    rank, world, dev = ctx["rank"], ctx["world"], ctx["device"]
    op_ar, op_rs = ctx["op_ar"], ctx["op_rs"]
    T, H, I = args.tokens, args.hidden, args.inter

    # Weights and input: full from the seed on every rank, then this rank's shards.
    fp8 = args.dtype == "e4m3"
    scales = getattr(args, "scales", "row") if fp8 else None
    dtype = block_dtype(args.dtype)
    x = make_input(args.seed, T, H, dev, dtype)
    full = make_weights(args.seed, H, I, dev, dtype)
    with_bias = bool(getattr(args, "bias", False))
    # b_down (--bias): the output dtype (bf16 with e4m3 too), the same on every rank
    b_down = make_bias(args.seed, H, dev, dtype) if with_bias else None
    prints = dist_all_gather_object(fingerprint(x, *full, *([b_down] if with_bias else [])))
    identical = all(p == prints[0] for p in prints)
    wg_r, wu_r, wd_r = shard_weights(*full, rank, world)
    w_gu = fuse_gate_up(wg_r, wu_r)
    del wg_r, wu_r
    w_scale = None
    if fp8:  # the down projection's weight, quantized once (per output channel or block)
        wd_r, w_scale = quantizers(scales)[1](wd_r)
    if rank != 0:
        full = None  # only rank 0 needs the full weights (the reference)
    for op in (op_ar, op_rs):
        if not op.can_run(wd_r):
            raise RuntimeError(f"GemmRsAr.can_run(w_down shard {tuple(wd_r.shape)}) is False "
                               f"on rank {rank}")
    h0 = mlp_hidden(x, w_gu)
    should = {"ar": bool(op_ar.should_run(h0)), "rs": bool(op_rs.should_run(h0))}
    variants = make_variants(x, w_gu, wd_r, op_ar, op_rs, world, w_scale, scales or "row",
                             bias=b_down)
    base_why = None
    if fp8:
        # the baselines' scaled matmul, tried once on these operands: where torch refuses
        # them (its block-wise kernel refuses some shapes and builds), the baseline variants
        # are n/a on every rank alike (the reason any rank met)
        h8, sh = quantizers(scales)[0](h0)
        whys = dist_all_gather_object(baseline_error(h8, wd_r, sh, w_scale, dtype))
        base_why = next((w for w in whys if w), None)
        del h8, sh
    names = [n for n in VARIANTS if not (base_why and n in BASELINES)]
    _precompile((op_ar, op_rs), T, wd_r.shape[1], dev, block_scales=scales == "block",
                bias=with_bias)

    # Correctness: every variant's block on every rank against rank 0's float32 reference.
    ref = None
    if rank == 0:
        ref = (reference_block_fp8(x, *full, world, scales, bias=b_down) if fp8
               else reference_block(x, *full, bias=b_down))
    full = None
    checks: dict[str, dict[str, Any]] = {}
    for name in names:
        y = variants[name]["block"]()
        _sync(dev)
        for op in (op_ar, op_rs):
            op.check()
        if tuple(y.shape) != (T, H) or y.dtype != x.dtype:
            checks[name] = {"ok": False, "error": f"output {tuple(y.shape)} {y.dtype}, "
                                                  f"expected ({T}, {H}) {x.dtype}"}
            continue
        got = torch.empty(world * T, H, dtype=y.dtype, device=dev)
        _all_gather(got, y.contiguous())
        if rank == 0:
            errs = [rel_error(got[r * T:(r + 1) * T], ref) for r in range(world)]
            diff = max((float((got[r * T:(r + 1) * T].float() - got[:T].float()).abs().max())
                        for r in range(1, world)), default=0.0)
            checks[name] = {"ok": all(e < TOL for e in errs), "rel_err": errs,
                            "rank_diff": diff if math.isfinite(diff) else float("inf")}
        del got, y
    del ref
    checks = dist_broadcast_object(checks if rank == 0 else None)
    if dev.type == "cuda":
        torch.cuda.empty_cache()

    # Timing: the whole block, and the down projection + communication from a ready h.
    us: dict[str, dict[str, float]] = {}
    for name in names:
        v = variants[name]
        mine = {"block": time_fn(v["block"], args.iters, args.warmup, dev),
                "down": time_fn(lambda: v["down"](h0), args.iters, args.warmup, dev)}
        for op in (op_ar, op_rs):
            op.check()
        every = dist_all_gather_object(mine)
        us[name] = {k: max(m[k] for m in every) for k in mine}  # a step waits for the slowest

    ok = identical and all(c.get("ok") for c in checks.values())
    if rank != 0:
        return (EXIT_OK if ok else EXIT_FAILED), None
    res = {
        "config": {"world": world, "launcher": ctx["launcher"], "gpu": ctx["gpu"],
                   "transport": getattr(op_ar, "transport", "?"), "hidden": H, "inter": I,
                   "tokens": T, "padded_tokens": padded_rows(T, world), "seed": args.seed,
                   "dtype": args.dtype, "scales": scales, "bias": with_bias,
                   "iters": args.iters, "warmup": args.warmup},
        "tol": TOL, "weights_identical": identical, "should_run": should, "checks": checks,
        "us": us, "summary": summarize(T, us), "clock": ctx.get("clock", "CUDA events"),
        "ok": ok,
    }
    if base_why:  # the baseline variants torch's scaled matmul could not run
        res["baseline_error"] = base_why
        res["unavailable"] = list(BASELINES)
    return (EXIT_OK if ok else EXIT_FAILED), res


def block_dtype(name: str) -> Any:
    """The torch dtype of the block's activations and weights for ``--dtype`` (fp8 runs
    the down projection only; the rest of its block is bf16)."""
    import torch
    from rsar_core.validate import torch_dtype
    return torch.bfloat16 if name == "e4m3" else torch_dtype(name)


def _precompile(ops: tuple[Any, ...], M: int, K: int, device: Any,
                block_scales: bool = False, bias: bool = False) -> None:
    """Compile the fused kernels for (M, K) on every rank (``GemmRsAr.warmup``; those of
    block-wise fp8 scales with ``block_scales``, those that add a bias with ``bias``), then
    meet at a barrier, so that the timed calls never wait on a compile."""
    import torch.distributed as dist
    kw: dict[str, bool] = {}
    if block_scales:
        kw["block_scales"] = True
    if bias:
        kw["bias"] = True
    for op in ops:
        op.warmup([M], K, **kw)
    _sync(device)
    dist.barrier()
    _sync(device)


def dist_all_gather_object(obj: Any) -> list[Any]:
    import torch.distributed as dist
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def dist_broadcast_object(obj: Any, src: int = 0) -> Any:
    import torch.distributed as dist
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


# --------------------------------------------------------------------------- main
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
                   help="element type of the activations, the weights and the ops (e4m3: a "
                        "bf16 block whose down projection runs on fp8 operands)")
    p.add_argument("--scales", choices=SCALE_MODES, default="row",
                   help="fp8 scales of the down projection (--dtype e4m3 only): row (h per "
                        "token, w_down per output channel) or block (h per token and "
                        "128-element k-group, w_down per 128 x 128 block; sm90)")
    p.add_argument("--bias", action="store_true",
                   help="the down projection has a bias b_down (H elements of the block's dtype, "
                        "bf16 with e4m3, from --seed): "
                        "y = down(...) + b_down; fused: bias=, baselines: rank 0's partial "
                        "takes it before the collective (torch.addmm), as vLLM's "
                        "RowParallelLinear")
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
    if a.tokens < 1:
        p.error("--tokens must be >= 1")
    if a.iters < 1:
        p.error("--iters must be >= 1")
    if a.warmup < 0:
        p.error("--warmup must be >= 0")
    return a


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    tr = args.torchrun
    say_rank = printing_rank(tr)

    def say(msg: str) -> None:
        if say_rank == 0:
            print(msg, flush=True)

    def cannot_run() -> int:
        # Only the printing rank fails: torchrun and mpiexec stop every worker once one exits
        # non-zero, which could kill the printing rank before it has said why.
        return EXIT_CANNOT_RUN if say_rank == 0 else 0

    try:
        import torch
    except ImportError as e:
        say(f"{PREFIX} torch is not installed ({e}); pip install -e . first")
        return cannot_run()

    world = launcher_world(tr)
    local_world = launcher_local_world(tr)
    cuda = torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
    cap, name = None, ""
    if cuda and count >= 2:
        idx = (_env_int(("LOCAL_RANK",), 0) if tr else launcher_rank(tr)) % count
        cap = tuple(torch.cuda.get_device_capability(idx))
        name = torch.cuda.get_device_name(idx)
    why = cannot_run_reason(cuda, count, world, cap, name, torchrun=tr,
                            torchrun_without_flag=(not tr and started_by_torchrun()),
                            local_world=local_world,
                            block_scales=args.dtype == "e4m3" and args.scales == "block")
    why = why or size_problem(args.hidden, args.inter, args.tokens, world,
                              K_ALIGN_FP8 if args.dtype == "e4m3" else K_ALIGN)
    if why:
        say(why)  # every rank sees the same host and launch, so every rank stops here alike
        return cannot_run()

    import torch.distributed as dist
    mpi_comm = None
    rank = launcher_rank(tr)
    try:
        if tr:
            local_rank = _env_int(("LOCAL_RANK",), 0)
            torch.cuda.set_device(local_rank)
            dev = torch.device("cuda", local_rank)
            dist.init_process_group("nccl", device_id=dev)
            rank, world = dist.get_rank(), dist.get_world_size()
        else:
            from mpi4py import MPI
            mpi_comm = MPI.COMM_WORLD
            rank, world = mpi_comm.Get_rank(), mpi_comm.Get_size()
            torch.cuda.set_device(rank % count)
            dev = torch.device("cuda", torch.cuda.current_device())
            port = mpi_comm.bcast(_free_port() if rank == 0 else None)
            dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}",
                                    rank=rank, world_size=world, device_id=dev)
        torch.set_float32_matmul_precision("highest")  # a float32 reference, not TF32

        from rsar_core import GemmRsAr
        comm = dist.group.WORLD if tr else mpi_comm
        dtype = block_dtype(args.dtype)
        fp8 = torch.float8_e4m3fn if args.dtype == "e4m3" else None
        op_ar = GemmRsAr(args.tokens, args.hidden, all_reduce=True, comm=comm, dtype=dtype,
                         input_dtype=fp8)
        op_rs = GemmRsAr(args.tokens, args.hidden, all_reduce=False, comm=comm, dtype=dtype,
                         input_dtype=fp8)
        gpus = sorted(set(dist_all_gather_object(torch.cuda.get_device_name(dev))))
        ctx = {"rank": rank, "world": world, "device": dev,
               "launcher": "torchrun" if tr else "mpirun", "gpu": f"{' / '.join(gpus)} x{world}",
               "op_ar": op_ar, "op_rs": op_rs, "clock": "CUDA events"}
        if rank == 0:
            sc = f" ({args.scales} scales)" if args.dtype == "e4m3" else ""
            sc += " + bias" if args.bias else ""
            print(f"{PREFIX} {world} ranks ({ctx['launcher']}), H={args.hidden} "
                  f"I={args.inter} T={args.tokens} {args.dtype}{sc}: checking, then timing ...",
                  flush=True)
        code, res = run(ctx, args)
        op_rs.close()
        op_ar.close()
    except Exception as e:
        print(f"{PREFIX} rank {rank} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        traceback.print_exc()
        sys.stderr.flush()
        if mpi_comm is not None:
            mpi_comm.Abort(EXIT_FAILED)  # a peer may wait in a collective: end the whole job
        return EXIT_FAILED  # torchrun stops the other workers when one fails

    if rank == 0 and res is not None:
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
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
