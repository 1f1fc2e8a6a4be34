"""Tiny random-init transformers models from configs in code (nothing downloaded), for the
integration tests on CPU (tests/test_hf_transformers.py) and GPU (tests/gpu/test_hf_gpu.py).

Sizes keep every rowwise layer's per-rank K a multiple of 64 at 2 ranks (the fused op's K
alignment): attention 4 heads x 32 = 128 (64 a rank), MLP 256 (128 a rank), hidden 128.
"""
from __future__ import annotations

from typing import Any

import torch

KINDS = ("llama", "qwen3", "qwen3_moe")
VOCAB = 256


def tiny_config(kind: str) -> Any:
    common = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=32, max_position_embeddings=256, tie_word_embeddings=False,
                  # wider than the default 0.02: logits far enough apart that greedy
                  # decoding is decided by the model, not by bf16 rounding
                  initializer_range=0.1)
    if kind == "llama":
        from transformers import LlamaConfig
        # biases on: the rowwise bias must be added once, after the reduction
        return LlamaConfig(**common, attention_bias=True, mlp_bias=True)
    if kind == "qwen3":
        from transformers import Qwen3Config
        return Qwen3Config(**common)
    if kind == "qwen3_moe":
        from transformers import Qwen3MoeConfig
        # layer 0 routed (4 experts, top 2), layer 1 a dense MLP: both kinds of down proj
        return Qwen3MoeConfig(**common, num_experts=4, num_experts_per_tok=2,
                              moe_intermediate_size=128, decoder_sparse_step=1,
                              mlp_only_layers=[1], norm_topk_prob=True)
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def tiny_model(kind: str, seed: int = 0, dtype: torch.dtype = torch.float32,
               device: str = "cpu") -> Any:
    """The same weights on every rank for the same seed; eval mode."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    config = tiny_config(kind)
    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.to(device=device, dtype=dtype).eval()


def prompt(batch: int = 2, length: int = 12, seed: int = 1, device: str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=g).to(device)
