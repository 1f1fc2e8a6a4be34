"""Tiny random-init transformers models (``rsar_core.integrations.transformers.tiny_config``,
nothing downloaded), for the integration tests on CPU (tests/test_hf_transformers.py) and
GPU (tests/gpu/test_hf_gpu.py)."""
from __future__ import annotations

from typing import Any

import torch

from rsar_core.integrations.transformers import TINY_KINDS as KINDS, tiny_config

VOCAB = 256
__all__ = ["KINDS", "VOCAB", "tiny_model", "prompt", "QWEN3_MOE_EXPERTS_PLAN", "fp32_head"]

# The experts' entries of Qwen3-MoE's base_model_tp_plan in transformers 5.0-5.24 (5.25 moved
# the experts to base_model_ep_plan only): set on a model to shard its experts by TP anyway.
QWEN3_MOE_EXPERTS_PLAN = {
    "layers.*.mlp.experts.gate_up_proj": "packed_colwise",
    "layers.*.mlp.experts.down_proj": "rowwise",
    "layers.*.mlp.experts": "moe_tp_experts",
}


def tiny_model(kind: str, seed: int = 0, dtype: torch.dtype = torch.float32,
               device: str = "cpu", experts_plan: bool = False) -> Any:
    """The same weights on every rank for the same seed; eval mode. ``experts_plan``
    (qwen3_moe): add QWEN3_MOE_EXPERTS_PLAN to the model's tp plan."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    config = tiny_config(kind, vocab_size=VOCAB)
    if experts_plan:
        config.base_model_tp_plan = {**config.base_model_tp_plan, **QWEN3_MOE_EXPERTS_PLAN}
    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.to(device=device, dtype=dtype).eval()


def prompt(batch: int = 2, length: int = 12, seed: int = 1, device: str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=g).to(device)


class _Fp32Head(torch.nn.Module):
    def __init__(self, head: torch.nn.Linear) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(head.weight.detach().float(), requires_grad=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(h.float(), self.weight)


def fp32_head(model: Any) -> Any:
    """``model`` with its LM head in fp32: bf16 logits of 4-8 sit on a 1/32 grid, where the
    top two of 256 tie exactly in a few steps of 32, and a tie's winner is rounding's pick."""
    model.lm_head = _Fp32Head(model.lm_head)
    return model
