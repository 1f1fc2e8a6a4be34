"""Hugging Face transformers (>= 5) models, tensor-parallel, their row-parallel layers on rsar.

    model = AutoModelForCausalLM.from_config(config)      # or from_pretrained, on every rank
    model.to("cuda", torch.bfloat16)
    tp = shard_model(model, comm=group)                    # group: a torch ProcessGroup
    out = model.generate(ids, max_new_tokens=32)           # unchanged
    tp.fused_calls, tp.unfused_calls                       # which path ran
    tp.close()                                             # collective, before the group goes

``shard_model`` reads the model's ``config.base_model_tp_plan`` (the same plan transformers'
own ``tp_plan="auto"`` applies) and shards the full model in place, on every rank alike:

- ``colwise`` nn.Linear (attention q/k/v, MLP gate/up): this rank's contiguous rows of the
  weight and bias, so the heads and intermediate features split by rank;
- ``rowwise`` nn.Linear (attention output, MLP down projection): replaced by an
  ``AutoRowParallelLinear`` over this rank's columns, all-reduce, the bias added once. On CUDA
  with a bf16 / fp16 model every such layer shares ONE ``Workspace`` and one ``GemmRsAr`` per
  output width (N): the fused op runs where ``can_run`` / ``should_run`` say so (``path``),
  torch.mm and the communicator's all-reduce elsewhere (CPU, fp32, M past ``max_M``);
- MoE experts (``moe_tp_experts`` over 3-D gate_up / down weights: Llama4's in every
  transformers 5 release, Qwen3-MoE's and Mixtral's up to 5.24, whose plans from 5.25 leave the
  experts whole on every rank and shard them only by expert parallelism): each expert's
  intermediate features split by rank, and the experts' summed output all-reduced by the
  communicator (unfused: the routed per-expert products are no single GEMM that rsar's op
  could fuse with the reduction);
- ``replicated_with_grad_allreduce`` (Qwen3's q/k norms): nothing to do. Embeddings and the
  LM head (the model class's own plan, outside the base plan) stay whole on every rank.

Any other style raises UnsupportedError naming it. Why rsar shards the plain model rather
than taking one that transformers sharded (docs/INTEGRATIONS.md): transformers' TP builds a
DeviceMesh, whose NCCL group refuses two ranks on one GPU, holds DTensor parameters, and
installs its own all-reduce on every rowwise module; rsar needs plain local shards and only a
group for its set-up exchanges (gloo does), so a model loaded normally on every rank is the
simpler and more general start.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import RsarTypeError, RsarValueError, UnsupportedError
from ..linear import PATHS, AutoRowParallelLinear, Collective

__all__ = ["shard_model", "RsarTensorParallel", "SUPPORTED_STYLES", "TINY_KINDS", "tiny_config",
           "GreedyComparison", "compare_greedy"]

log = logging.getLogger("rsar")

SUPPORTED_STYLES = ("colwise", "rowwise", "packed_colwise", "packed_rowwise",
                    "moe_tp_experts", "replicated_with_grad_allreduce")
_FUSED_DTYPES = (torch.bfloat16, torch.float16)


class RsarTensorParallel:
    """What ``shard_model`` did to a model: its rsar layers, the shared workspace and ops.

    ``layers``: module name -> AutoRowParallelLinear; ``experts``: names of the MoE experts
    modules whose output the communicator all-reduces; ``workspace`` / ``ops`` (N -> GemmRsAr):
    None / empty where no fused op was built (``why_unfused`` says why). ``close()`` is
    collective: every rank calls it, before the process group is destroyed.
    """

    def __init__(self, model: nn.Module, collective: Collective) -> None:
        self.model = model
        self.collective = collective
        self.world, self.rank = collective.world, collective.rank
        self.layers: dict[str, AutoRowParallelLinear] = {}
        self.experts: list[str] = []
        self.workspace: Any = None
        self.ops: dict[int, Any] = {}
        self.why_unfused = ""

    @property
    def fused_calls(self) -> int:
        return sum(layer.fused_calls for layer in self.layers.values())

    @property
    def unfused_calls(self) -> int:
        return sum(layer.unfused_calls for layer in self.layers.values())

    def reset_counters(self) -> None:
        for layer in self.layers.values():
            layer.fused_calls = layer.unfused_calls = 0

    def close(self) -> None:
        """Release the ops and the workspace (collective; idempotent). The model's rsar
        layers take the unfused path afterwards."""
        for layer in self.layers.values():
            layer._fusable, layer._why_not = False, "closed"
        for op in self.ops.values():
            op.close()
        self.ops.clear()
        if self.workspace is not None:
            self.workspace.close()
            self.workspace = None

    def __repr__(self) -> str:
        return (f"RsarTensorParallel(rank={self.rank}, world={self.world}, "
                f"rowwise={len(self.layers)}, experts={len(self.experts)}, "
                f"fused_ops={sorted(self.ops)}, comm={self.collective.backend})")


def _plan_of(model: nn.Module) -> tuple[nn.Module, dict[str, str]]:
    config = getattr(model, "config", None)
    plan = getattr(config, "base_model_tp_plan", None) if config is not None else None
    if not plan:
        raise RsarValueError(
            f"{type(model).__name__}: shard_model needs a transformers model whose config has a "
            f"base_model_tp_plan; {type(config).__name__ if config is not None else 'no config'}"
            " has none")
    return _base_of(model, plan), dict(plan)


def _base_of(model: nn.Module, plan: dict[str, str]) -> nn.Module:
    """The module the plan's names are relative to: the base model. ``model.base_model`` is
    not always it (Llama4ForCausalLM names its prefix "language_model" but holds the base as
    ``model``), so take the shallowest module that has every first name the plan uses."""
    heads = {key.split(".", 1)[0] for key in plan}
    for _, module in model.named_modules():
        if all(hasattr(module, h) for h in heads):
            return module
    raise RsarValueError(f"{type(model).__name__}: no submodule holds {sorted(heads)}, the "
                         "first names of its base_model_tp_plan")


def _match(plan: dict[str, str], name: str) -> str | None:
    for key, style in plan.items():
        if re.fullmatch(re.escape(key).replace(r"\*", r"\d+"), name):
            return style
    return None


def _split(t: torch.Tensor, dim: int, world: int, rank: int, what: str) -> torch.Tensor:
    size = t.shape[dim]
    if size % world:
        raise RsarValueError(f"{what}: dimension {dim} of size {size} does not split over "
                             f"{world} ranks")
    n = size // world
    return t.narrow(dim, rank * n, n).clone().contiguous()


def _split_packed(t: torch.Tensor, dim: int, world: int, rank: int, what: str,
                  parts: int = 2) -> torch.Tensor:
    """Packed weights ([gate; up] along ``dim``): this rank's share of each part, repacked."""
    if t.shape[dim] % parts:
        raise RsarValueError(f"{what}: dimension {dim} of size {t.shape[dim]} does not hold "
                             f"{parts} packed parts")
    return torch.cat([_split(p, dim, world, rank, what) for p in t.chunk(parts, dim)], dim)


def _check_heads(config: Any, world: int) -> None:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for attr in ("num_attention_heads", "num_key_value_heads"):
        n = getattr(text, attr, None)
        if isinstance(n, int) and n % world:
            raise RsarValueError(f"{attr}={n} does not split over {world} ranks: every rank "
                                 "needs whole attention heads")


def _set(base: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(base.get_submodule(parent_name) if parent_name else base, child, module)


def _param(t: torch.Tensor, like: nn.Parameter) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=like.requires_grad)


def shard_model(model: nn.Module, comm: Any = None, *, max_M: int = 4096, path: str = "auto",
                fused: bool | None = None, timeout_s: float | None = None
                ) -> RsarTensorParallel:
    """Shard ``model`` (a full transformers model, the same weights on every rank) in place
    for this rank of ``comm`` and route its rowwise layers through rsar. Collective.

    ``comm``: a torch.distributed ProcessGroup (gloo is enough for the fused op's set-up,
    NCCL also serves the unfused path on GPU), an mpi4py communicator, or None (the default
    torch group when initialised, else MPI's world). ``max_M``: the most tokens one call of
    the fused op takes (batch x new tokens); longer calls (a long prefill) run unfused.
    ``path``: "auto", "fused" or "unfused" (``AutoRowParallelLinear``). ``fused``: None
    builds the shared workspace and ops where the model is on CUDA in bf16 / fp16; True
    requires them (UnsupportedError if they cannot be built); False builds none.
    """
    if path not in PATHS:
        raise RsarValueError(f"path must be one of {PATHS}, got {path!r}")
    if not isinstance(model, nn.Module):
        raise RsarTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if getattr(model, "_rsar_tp", None) is not None:
        raise RsarValueError("this model is sharded already (shard_model was called on it)")
    if getattr(model, "_device_mesh", None) is not None:
        raise RsarValueError("this model was sharded by transformers (tp_plan / device_mesh); "
                             "load it whole on every rank and let shard_model shard it")
    base, plan = _plan_of(model)
    for style in sorted(set(plan.values())):
        if style not in SUPPORTED_STYLES:
            keys = sorted(k for k, v in plan.items() if v == style)
            raise UnsupportedError(f"tp style {style!r} (for {keys}) is not supported by "
                                   f"rsar's sharding; supported: {SUPPORTED_STYLES}")
    coll = Collective(comm)
    world, rank = coll.world, coll.rank
    if world < 2:
        raise RsarValueError(f"shard_model needs >= 2 ranks, the communicator has {world}")
    _check_heads(model.config, world)
    tp = RsarTensorParallel(model, coll)

    rowwise: list[tuple[str, nn.Linear]] = []
    for name, module in list(base.named_modules()):
        style = _match(plan, name) if name else None
        if style is None:
            continue
        if style == "colwise":
            if not isinstance(module, nn.Linear):
                raise UnsupportedError(f"{name}: colwise is supported on nn.Linear only, got "
                                       f"{type(module).__name__}")
            module.weight = _param(_split(module.weight.data, 0, world, rank, name),
                                   module.weight)
            if module.bias is not None:
                module.bias = _param(_split(module.bias.data, 0, world, rank, name),
                                     module.bias)
            module.out_features = module.weight.shape[0]
        elif style == "packed_colwise" and isinstance(module, nn.Linear):
            module.weight = _param(_split_packed(module.weight.data, 0, world, rank, name),
                                   module.weight)
            if module.bias is not None:
                module.bias = _param(_split_packed(module.bias.data, 0, world, rank, name),
                                     module.bias)
            module.out_features = module.weight.shape[0]
        elif style == "rowwise":
            if not isinstance(module, nn.Linear):
                raise UnsupportedError(f"{name}: rowwise is supported on nn.Linear (and MoE "
                                       f"experts' weights) only, got {type(module).__name__}")
            if module.in_features % world:
                raise RsarValueError(f"{name}: in_features={module.in_features} does not split "
                                     f"over {world} ranks")
            rowwise.append((name, module))
        elif style == "moe_tp_experts":
            _shard_experts(base, name, module, plan, coll, tp)
        elif style.startswith("packed_"):
            raise UnsupportedError(f"{name}: {style} is supported on MoE experts' 3-D weights "
                                   f"(and packed_colwise on nn.Linear), got "
                                   f"{type(module).__name__}")
        # replicated_with_grad_allreduce: the replicated parameter stays as it is

    if not rowwise:
        raise RsarValueError(f"{type(model).__name__}: the tp plan names no rowwise nn.Linear")
    ops = _build_ops(tp, rowwise, max_M, path, fused, timeout_s)
    for name, lin in rowwise:
        w = _split(lin.weight.data, 1, world, rank, name)
        bias = None if lin.bias is None else lin.bias.data
        op = ops.get(lin.out_features)
        # the caller's communicator serves the unfused path, with or without an op
        layer = AutoRowParallelLinear(w, op=op, comm=coll.handle, all_reduce=True, bias=bias,
                                      path=path)
        _set(base, name, layer)
        tp.layers[name] = layer
    model._rsar_tp = tp
    log.debug("rsar shard_model rank %d/%d: %d rowwise layers, %d experts modules, ops %s%s",
              rank, world, len(tp.layers), len(tp.experts), sorted(tp.ops),
              f" (unfused only: {tp.why_unfused})" if tp.why_unfused else "")
    return tp


def _build_ops(tp: RsarTensorParallel, rowwise: list[tuple[str, nn.Linear]], max_M: int,
               path: str, fused: bool | None, timeout_s: float | None) -> dict[int, Any]:
    """One Workspace for every rowwise layer and one AR GemmRsAr per output width on it, or
    none (``tp.why_unfused``). The decision depends only on what every rank shares (the
    model's device type and dtype, the arguments), so all ranks build or none does."""
    w = rowwise[0][1].weight
    why = ""
    if fused is False:
        why = "fused=False"
    elif path == "unfused":
        why = 'path="unfused"'
    elif not w.is_cuda:
        why = f"the model is on {w.device.type}"
    elif w.dtype not in _FUSED_DTYPES:
        why = f"the model is {w.dtype} (the fused op takes bf16 / fp16)"
    elif not torch.cuda.is_available():
        why = "no CUDA device is visible"
    if why:
        if fused:
            raise UnsupportedError(f"fused=True but no fused op can be built: {why}")
        tp.why_unfused = why
        return {}
    from .. import GemmRsAr, Workspace
    Ns = sorted({lin.out_features for _, lin in rowwise})
    comm = tp.collective.handle
    tp.workspace = Workspace(max_M, max(Ns), comm)
    for N in Ns:
        tp.ops[N] = GemmRsAr(max_M, N, all_reduce=True, dtype=w.dtype, timeout_s=timeout_s,
                             workspace=tp.workspace)
    return tp.ops


def _shard_experts(base: nn.Module, name: str, experts: nn.Module, plan: dict[str, str],
                   coll: Collective, tp: RsarTensorParallel) -> None:
    """A ``moe_tp_experts`` module: its 3-D weights split along the intermediate features,
    its output all-reduced. A 3-D weight's plan style names the dimension as transformers
    does: colwise splits dim -2, rowwise dim -1, ``packed_*`` each packed part alike. So
    Qwen3-MoE's (E, 2I, H) packed_colwise gate_up and (E, H, I) rowwise down, and Llama4's
    (E, H, 2I) packed_rowwise gate_up and (E, I, H) colwise down, both split I."""
    world, rank = coll.world, coll.rank
    split = 0
    for pname, p in list(experts.named_parameters(recurse=False)):
        style = _match(plan, f"{name}.{pname}")
        if style is None:
            continue
        what = f"{name}.{pname}"
        if style not in ("colwise", "rowwise", "packed_colwise", "packed_rowwise"):
            raise UnsupportedError(f"{what}: tp style {style!r} inside moe_tp_experts")
        if p.dim() == 3:
            dim = -2 if style.endswith("colwise") else -1
            split += 1
        elif style.endswith("rowwise"):
            # a down bias, (E, H): part of every rank's partial, so keep 1 / world of it each
            setattr(experts, pname, _param(p.data / world, p))
            continue
        else:   # a gate/up bias, (E, 2I): split like its weight's output features
            dim = -1
        dim %= p.dim()
        if style.startswith("packed_"):
            t = _split_packed(p.data, dim, world, rank, what)
        else:
            t = _split(p.data, dim, world, rank, what)
        setattr(experts, pname, _param(t, p))
    if split < 2:
        raise UnsupportedError(f"{name}: moe_tp_experts needs its gate/up and down weights in "
                               f"the plan; {split} 3-D weight(s) of it are named")
    for attr in ("intermediate_dim", "intermediate_size", "expert_dim"):
        v = getattr(experts, attr, None)
        if isinstance(v, int) and v % world == 0:
            setattr(experts, attr, v // world)

    def _all_reduce(module: nn.Module, args: Any, out: Any) -> Any:
        if isinstance(out, torch.Tensor):
            return coll.all_reduce(out.contiguous())
        raise UnsupportedError(f"{name}: experts returned {type(out).__name__}; the all-reduce "
                               "of their output takes one tensor")

    experts.register_forward_hook(_all_reduce)
    tp.experts.append(name)


# ---------------------------------------------------------------- checking a sharded model
@dataclass(frozen=True)
class GreedyComparison:
    """Greedy decoding of a (sharded) model against a reference, per ``compare_greedy``.

    ``free_agree``: the fewest generated positions, over the batch, where the two models'
    own greedy generations hold the same token. One near-tie that rounding breaks the other
    way sends the rest of a sequence down another path, so this is exact only between models
    that round alike. ``forced_agree``: the fewest positions where the model's greedy pick,
    given the reference's generated prefix, is the reference's token (a broken tie costs one
    position). ``near_ties``: the most positions in a sequence where the reference's top-2
    logits lie within ``tie``; ``decisive_misses``: forced picks that differ where they do
    not, over the batch. ``ok``: no decisive miss."""

    new_tokens: int
    free_agree: int
    forced_agree: int
    near_ties: int
    decisive_misses: int
    tie: float

    @property
    def ok(self) -> bool:
        return self.decisive_misses == 0

    def __str__(self) -> str:
        return (f"greedy: {self.free_agree} of {self.new_tokens} free-running, "
                f"{self.forced_agree} on the reference's prefix ({self.near_ties} near ties "
                f"within {self.tie:.3g}, {self.decisive_misses} decisive misses)")


def compare_greedy(model: nn.Module, reference: nn.Module, ids: torch.Tensor,
                   new_tokens: int = 32, tie_rel: float = 0.02,
                   **generate_kw: Any) -> GreedyComparison:
    """Generate ``new_tokens`` greedily with both models from ``ids`` and compare
    (``GreedyComparison``). A near tie is a reference top-2 margin within ``tie_rel`` of the
    reference's largest logit: tensor parallelism rounds each rank's partial sum, so where
    a random-init model's top two logits sit closer than that, which one wins is rounding's
    choice, for any TP implementation. Collective where ``model`` is sharded."""
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
              **generate_kw)
    p = ids.shape[1]
    with torch.no_grad():
        want = reference.generate(ids, **kw)
        got = model.generate(ids, **kw)
        ref_logits = reference(want).logits[:, p - 1:-1].float()
        picks = model(want).logits[:, p - 1:-1].argmax(-1)
    target = want[:, p:]
    top2 = ref_logits.topk(2, dim=-1).values
    tie = tie_rel * float(ref_logits.abs().max())
    tied = (top2[..., 0] - top2[..., 1]) <= tie
    same = picks == target
    return GreedyComparison(new_tokens=new_tokens,
                            free_agree=int((got[:, p:] == target).sum(dim=1).min()),
                            forced_agree=int(same.sum(dim=1).min()),
                            near_ties=int(tied.sum(dim=1).max()),
                            decisive_misses=int((~same & ~tied).sum()), tie=tie)


# ---------------------------------------------------------------- tiny models for examples
TINY_KINDS = ("llama", "qwen3", "qwen3_moe", "llama4")


def tiny_config(kind: str, vocab_size: int = 256, **overrides: Any) -> Any:
    """A small random-init config of ``kind`` (nothing is downloaded), for the example and
    the tests: hidden 128, 2 layers, 4 query / 2 kv heads of 32, MLP 256, so that at 2 ranks
    every rowwise layer's K (64 attention, 128 MLP) fits the fused op's K alignment (64).
    Llama has biases on (the rowwise bias must be added once); Qwen3-MoE routes layer 0
    (4 experts, top 2, 128 features each) and keeps layer 1 dense; Llama4 (text) routes layer 0
    (4 experts, top 1, 128 features, a shared expert whose down projection is rowwise) and
    keeps layer 1 dense."""
    common: dict[str, Any] = dict(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=512, tie_word_embeddings=False,
        # wider than the default 0.02: logits far enough apart that greedy decoding is
        # decided by the model, not by bf16 rounding
        initializer_range=0.1)
    if kind == "llama":
        from transformers import LlamaConfig
        return LlamaConfig(**{**common, "attention_bias": True, "mlp_bias": True, **overrides})
    if kind == "qwen3":
        from transformers import Qwen3Config
        return Qwen3Config(**{**common, **overrides})
    if kind == "qwen3_moe":
        from transformers import Qwen3MoeConfig
        return Qwen3MoeConfig(**{**common, "num_experts": 4, "num_experts_per_tok": 2,
                                 "moe_intermediate_size": 128, "decoder_sparse_step": 1,
                                 "mlp_only_layers": [1], "norm_topk_prob": True, **overrides})
    if kind == "llama4":
        from transformers import Llama4TextConfig
        return Llama4TextConfig(**{**common, "intermediate_size": 128,
                                   "intermediate_size_mlp": 256, "num_local_experts": 4,
                                   "num_experts_per_tok": 1, "moe_layers": [0],
                                   "attention_chunk_size": 512, **overrides})
    raise RsarValueError(f"kind must be one of {TINY_KINDS}, got {kind!r}")
