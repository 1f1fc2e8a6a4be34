"""A tensor-parallel transformer MLP block, y = down(SiLU(gate(x)) * up(x)) [+ b_down], its
float32 references, and four ways to run its row-parallel down projection and communication.

Weights come in full from a seed (the same on every rank that asks with the same seed) and each
rank keeps its shard: gate and up are column-parallel (I/world rows each, fused into one
(2*I/world, H) GEMM), down is row-parallel (the (H, I/world) column slice), so each rank's down
projection is a partial sum the ranks must reduce. The variants:

  fused_ar     GemmRsAr(all_reduce=True)(h, w_down_r)                       (T, H) on every rank
  fused_rs_ag  GemmRsAr(all_reduce=False)(h, w_down_r) -> (padded_T/world, H), then
               all_gather_into_tensor to (padded_T, H), sliced [:T] (sequence parallel)
  mm_ar        torch.mm, then all_reduce
  mm_rs_ag     torch.mm, then reduce_scatter and all_gather

Collectives run over torch.distributed's default group. Everything here is pure torch on any
device, so CPU tests run it on tiny sizes over gloo.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import reference
from .quantize import quantizers

VARIANTS = ("fused_ar", "mm_ar", "fused_rs_ag", "mm_rs_ag")
# the variants torch's (scaled) matmul computes: n/a where it refuses fp8 scales
BASELINES = ("mm_ar", "mm_rs_ag")
BIAS_STD = 0.5  # b_down's std: the block's outputs have a std of about 0.6

Variant = dict[str, Callable[..., torch.Tensor]]


# --------------------------------------------------------------------------- tensors
def make_input(seed: int, tokens: int, hidden: int, device: Any,
               dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """x: (T, H), the same on every rank (tensor parallelism replicates the block's input)."""
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1009 + 7)
    return torch.randn(tokens, hidden, generator=g, device=device).to(dtype)


def make_weights(seed: int, hidden: int, inter: int, device: Any,
                 dtype: torch.dtype = torch.bfloat16
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(W_gate, W_up, W_down) in full: (I, H) with std H^-1/2 and (H, I) with std I^-1/2, so
    activations stay of order one through the block."""
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1009 + 1)
    w_gate = (torch.randn(inter, hidden, generator=g, device=device) * hidden ** -0.5).to(dtype)
    w_up = (torch.randn(inter, hidden, generator=g, device=device) * hidden ** -0.5).to(dtype)
    w_down = (torch.randn(hidden, inter, generator=g, device=device) * inter ** -0.5).to(dtype)
    return w_gate, w_up, w_down


def make_bias(seed: int, hidden: int, device: Any,
              dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """b_down: (H,), contiguous, std BIAS_STD. Its own generator stream, so the weights and the
    input do not change with a bias; of the outputs' order, so a bias missing or added twice
    moves them by far more than a check's tolerance."""
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1009 + 3)
    return (torch.randn(hidden, generator=g, device=device) * BIAS_STD).to(dtype).contiguous()


def shard_weights(w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, rank: int,
                  world: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s shards, contiguous: gate / up rows (I/world, H), down columns
    (H, I/world)."""
    inter = w_gate.shape[0]
    if inter % world:
        raise ValueError(f"intermediate size {inter} is not divisible by world {world}")
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    s = inter // world
    lo, hi = rank * s, (rank + 1) * s
    return (w_gate[lo:hi].contiguous(), w_up[lo:hi].contiguous(),
            w_down[:, lo:hi].contiguous())


def fuse_gate_up(w_gate_r: torch.Tensor, w_up_r: torch.Tensor) -> torch.Tensor:
    """One (2*I/world, H) weight, so that gate and up are one GEMM (as serving stacks run
    them)."""
    return torch.cat([w_gate_r, w_up_r], dim=0).contiguous()


def mlp_hidden(x: torch.Tensor, w_gate_up: torch.Tensor) -> torch.Tensor:
    """h = SiLU(x @ W_gate_r.T) * (x @ W_up_r.T): (T, I/world), contiguous, x's dtype."""
    gate, up = torch.mm(x, w_gate_up.t()).chunk(2, dim=1)
    return F.silu(gate) * up


# --------------------------------------------------------------------------- references
def reference_block(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                    w_down: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The whole block in float32 from the full weights: (T, H), plus ``bias`` where given."""
    xf = x.float()
    h = F.silu(xf @ w_gate.float().T) * (xf @ w_up.float().T)
    y = h @ w_down.float().T
    return y if bias is None else y + bias.float()


def reference_block_fp8(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                        w_down: torch.Tensor, world: int, scales: str = "row",
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """The block with its down projection on fp8 operands, in float32: the sum over ranks of
    each rank's quantized h and w_down shard dequantized with their ``scales`` (h computed as
    each rank computes it, so it quantizes alike), plus ``bias`` once. A check against it
    measures the op and the exchange, not the quantization."""
    quant_h, quant_w = quantizers(scales)
    out = None
    for r in range(world):
        wg, wu, wd = shard_weights(w_gate, w_up, w_down, r, world)
        h8, sh = quant_h(mlp_hidden(x, fuse_gate_up(wg, wu)))
        w8, sw = quant_w(wd)
        part = reference.scaled_product(h8, w8, sh, sw).float()
        out = part if out is None else out + part
    return out if bias is None else out + bias.float()


def baseline_error(h8: torch.Tensor, w8: torch.Tensor, x_scale: torch.Tensor,
                   w_scale: torch.Tensor, out_dtype: torch.dtype) -> str | None:
    """None where the fp8 baselines' matmul (``reference.scaled_mm``) runs on these operands,
    else why not: torch's block-wise kernel refuses some shapes and builds."""
    return reference.call_refusal(reference.scaled_mm, h8, w8, x_scale, w_scale, out_dtype)


def padded_rows(tokens: int, world: int) -> int:
    """padded_T = ceil(T / world) * world: the rows the RS shards cover."""
    return -(-tokens // world) * world


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """||got - ref|| / ||ref|| in float32; inf where got holds a NaN or an inf."""
    err = float((got.float() - ref).norm() / ref.norm().clamp_min(1e-30))
    return err if math.isfinite(err) else float("inf")


def fingerprint(*tensors: torch.Tensor) -> list[float]:
    """float64 sums: equal on every rank exactly when the seeded tensors came out equal."""
    return [float(t.sum(dtype=torch.float64)) for t in tensors]


def check_every_rank(y: torch.Tensor, ref: torch.Tensor | None, shape: tuple[int, int],
                     dtype: torch.dtype, tol: float) -> dict[str, Any]:
    """Every rank's block output ``y`` against ``ref`` (the float32 reference, on rank 0):
    on rank 0 {"ok", "rel_err": one per rank, "rank_diff": the largest difference from rank
    0's output}, on the others {}. A ``y`` of the wrong shape or dtype is {"ok": False,
    "error"} on the rank that has it, without the exchange."""
    if tuple(y.shape) != tuple(shape) or y.dtype != dtype:
        return {"ok": False, "error": f"output {tuple(y.shape)} {y.dtype}, "
                                      f"expected {tuple(shape)} {dtype}"}
    world, T = dist.get_world_size(), y.shape[0]
    got = torch.empty(world * T, *y.shape[1:], dtype=y.dtype, device=y.device)
    dist.all_gather_into_tensor(got, y.contiguous())
    if dist.get_rank() != 0:
        return {}
    outs = got.split(T)
    errs = [rel_error(o, ref) for o in outs]
    diff = max((float((o.float() - outs[0].float()).abs().max()) for o in outs[1:]),
               default=0.0)
    return {"ok": all(e < tol for e in errs), "rel_err": errs,
            "rank_diff": diff if math.isfinite(diff) else float("inf")}


# --------------------------------------------------------------------------- variants
def _all_gather(out: torch.Tensor, inp: torch.Tensor) -> None:
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp)


def _reduce_scatter(out: torch.Tensor, inp: torch.Tensor) -> None:
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(out, inp)


def make_variants(x: torch.Tensor, w_gate_up: torch.Tensor, w_down_r: torch.Tensor,
                  op_ar: Any, op_rs: Any, world: int, w_scale: torch.Tensor | None = None,
                  scales: str = "row", bias: torch.Tensor | None = None
                  ) -> dict[str, Variant]:
    """name -> {"down": h -> (T, H), "block": () -> (T, H)} for the four ``VARIANTS``.

    ``down`` is the down projection plus its communication from a ready h; ``block`` is the
    whole block from x. ``op_ar`` / ``op_rs``: GemmRsAr (or a stand-in with its call). With
    ``w_scale`` (``w_down_r`` is fp8, scaled as ``scales`` says) every variant quantizes h
    first and multiplies fp8 operands: GemmRsAr with the scales, or
    ``reference.scaled_mm``. With ``bias`` (b_down, (H,) of the output dtype) the fused calls
    pass ``bias=`` (added once to the reduced sum) and the baselines add it to rank 0's
    partial before the collective, as vLLM's RowParallelLinear does (``torch.addmm``; fp8:
    an add to rank 0's scaled_mm output).
    """
    T, H = x.shape[0], w_down_r.shape[0]
    Tp = padded_rows(T, world)
    dev, dt = x.device, x.dtype
    bkw = {} if bias is None else {"bias": bias}
    first = bias is not None and dist.get_rank() == 0  # the rank whose partial takes the bias
    if w_scale is None:
        def fused(op: Any, h: torch.Tensor) -> torch.Tensor:
            return op(h, w_down_r, **bkw)

        def product(h: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
            if first:
                return torch.addmm(bias, h, w_down_r.t(), out=out)
            return torch.mm(h, w_down_r.t(), out=out)
    else:
        quant_h = quantizers(scales)[0]

        def fused(op: Any, h: torch.Tensor) -> torch.Tensor:
            h8, sh = quant_h(h)
            return op(h8, w_down_r, sh, w_scale, **bkw)

        def product(h: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
            h8, sh = quant_h(h)
            y = reference.scaled_mm(h8, w_down_r, sh, w_scale, dt, out=out)
            return y.add_(bias) if first else y

    def gathered(shard: torch.Tensor) -> torch.Tensor:
        full = torch.empty(Tp, H, dtype=dt, device=dev)
        _all_gather(full, shard)
        return full[:T]

    def mm_ar(h: torch.Tensor) -> torch.Tensor:
        y = product(h)
        dist.all_reduce(y)
        return y

    def mm_rs_ag(h: torch.Tensor) -> torch.Tensor:
        if Tp == T:  # no padding: the product itself (torch's block-wise one has no out=)
            part = product(h)
        else:
            part = torch.empty(Tp, H, dtype=dt, device=dev)
            product(h, out=part[:T])
            part[T:].zero_()
        shard = torch.empty(Tp // world, H, dtype=dt, device=dev)
        _reduce_scatter(shard, part)
        return gathered(shard)

    downs = {"fused_ar": lambda h: fused(op_ar, h), "mm_ar": mm_ar,
             "fused_rs_ag": lambda h: gathered(fused(op_rs, h)), "mm_rs_ag": mm_rs_ag}
    return {name: {"down": downs[name],
                   "block": (lambda d=downs[name]: d(mlp_hidden(x, w_gate_up)))}
            for name in VARIANTS}
