"""rsar_core.integrations.transformers on the CPU: tiny random-init Llama, Qwen3 and
Qwen3-MoE models sharded over 2 gloo processes (unfused path) against the unsharded model.

Per model: logits of a batch of prompts within fp32 tolerance of the unsharded model's,
greedy generation (dynamic cache and static cache) equal to its tokens, every rowwise layer
an AutoRowParallelLinear that ran unfused, the shards the plan asks for.
"""
from __future__ import annotations

import copy
import sys
from typing import Any

import pytest
import torch

pytest.importorskip("transformers", minversion="5")

from rsar_core.errors import RsarValueError, UnsupportedError  # noqa: E402

LOGIT_TOL = 1e-4       # relative to the largest logit; fp32 sums in another order
NEW_TOKENS = 8


def _case_models() -> dict[str, Any]:
    import torch.distributed as dist
    from hf_models import KINDS, prompt, tiny_model
    from rsar_core.integrations.transformers import shard_model
    from rsar_core.linear import AutoRowParallelLinear
    torch.set_num_threads(1)
    out: dict[str, Any] = {}
    for kind in KINDS:
        ref = tiny_model(kind)
        model = copy.deepcopy(ref)
        tp = shard_model(model, dist.group.WORLD)
        ids = prompt()
        with torch.no_grad():
            want = ref(ids).logits
            got = model(ids).logits
        res: dict[str, Any] = {"logit_err": float((got - want).abs().max()
                                                  / want.abs().max())}
        counts_after_forward = (tp.fused_calls, tp.unfused_calls)
        gen_ref = ref.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
        gen = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
        gen_static = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                                    cache_implementation="static")
        attn = model.model.layers[0].self_attn
        res.update(
            same_tokens=bool(torch.equal(gen, gen_ref)),
            same_tokens_static=bool(torch.equal(gen_static, gen_ref)),
            new_tokens=int(gen.shape[1] - ids.shape[1]),
            counts_after_forward=list(counts_after_forward),
            fused=tp.fused_calls, unfused=tp.unfused_calls,
            rowwise=sorted(tp.layers), experts=tp.experts, why=tp.why_unfused,
            all_rsar=all(isinstance(m, AutoRowParallelLinear) for m in tp.layers.values()),
            o_proj_type=type(attn.o_proj).__name__,
            q_out=attn.q_proj.out_features, k_out=attn.k_proj.out_features,
            o_in=attn.o_proj.in_features, ops=len(tp.ops), repr=repr(tp))
        if kind == "qwen3_moe":
            ex = model.model.layers[0].mlp.experts
            res["experts_shapes"] = [list(ex.gate_up_proj.shape), list(ex.down_proj.shape)]
        if kind == "llama":
            # the bias of a rowwise layer stays whole (added once, after the sum)
            res["o_bias"] = bool(torch.equal(model.model.layers[1].self_attn.o_proj.bias,
                                             ref.model.layers[1].self_attn.o_proj.bias))
            try:
                shard_model(model, dist.group.WORLD)
                res["twice"] = "no error"
            except RsarValueError as e:
                res["twice"] = str(e)
        tp.close()
        out[kind] = res
    return out


CASES = {"models": _case_models}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    from dist_workers import run_gloo
    return run_gloo(__file__, "models", tmp_path_factory.mktemp("hf"), timeout=180)


@pytest.mark.parametrize("kind", ["llama", "qwen3", "qwen3_moe"])
def test_sharded_model_matches_unsharded(reports, kind):
    for r, rep in enumerate(reports):
        res = rep[kind]
        assert res["logit_err"] < LOGIT_TOL, (r, kind, res["logit_err"])
        assert res["new_tokens"] == NEW_TOKENS
        assert res["same_tokens"], (r, kind, "greedy tokens differ from the unsharded model's")
        assert res["same_tokens_static"], (r, kind, "static-cache tokens differ")
        assert res["all_rsar"] and res["o_proj_type"] == "AutoRowParallelLinear"
        # 4 query heads, 2 kv heads of 32: half each per rank; o_proj's K halves with them
        assert (res["q_out"], res["k_out"], res["o_in"]) == (64, 32, 64), res
        assert res["fused"] == 0 and res["ops"] == 0 and "on cpu" in res["why"]
        # one forward: 2 layers x (o_proj + dense down_proj where the MLP is dense)
        per_forward = {"llama": 4, "qwen3": 4, "qwen3_moe": 3}[kind]
        assert res["counts_after_forward"] == [0, per_forward], res
        assert res["unfused"] > per_forward   # generate ran through them too
        assert "comm=gloo" in res["repr"]


def test_rowwise_layers_and_experts(reports):
    llama, moe = reports[0]["llama"], reports[0]["qwen3_moe"]
    assert llama["rowwise"] == ["layers.0.mlp.down_proj", "layers.0.self_attn.o_proj",
                                "layers.1.mlp.down_proj", "layers.1.self_attn.o_proj"]
    assert llama["experts"] == [] and llama["o_bias"]
    assert "sharded already" in llama["twice"]
    # layer 0 routed: its experts are sharded (128 intermediate features -> 64 a rank) and
    # all-reduced by the group; layer 1's dense down_proj is an rsar layer
    assert moe["rowwise"] == ["layers.0.self_attn.o_proj", "layers.1.mlp.down_proj",
                              "layers.1.self_attn.o_proj"]
    assert moe["experts"] == ["layers.0.mlp.experts"]
    assert moe["experts_shapes"] == [[4, 128, 128], [4, 128, 64]]


# ------------------------------------------------------------------ one process: bad input
def test_model_without_plan_is_refused():
    from rsar_core.integrations.transformers import shard_model
    with pytest.raises(RsarValueError, match="base_model_tp_plan; .* has none"):
        shard_model(torch.nn.Linear(4, 4), object())


def test_unknown_style_is_refused(monkeypatch):
    from hf_models import tiny_model
    from rsar_core.integrations.transformers import shard_model
    model = tiny_model("llama")
    plan = dict(model.config.base_model_tp_plan)
    plan["embed_tokens"] = "embedding_rowwise"
    model.config.base_model_tp_plan = plan
    with pytest.raises(UnsupportedError, match="'embedding_rowwise' .*embed_tokens.* not "
                                               "supported by rsar's sharding"):
        shard_model(model, object())


def test_bad_path_is_refused():
    from rsar_core.integrations.transformers import shard_model
    with pytest.raises(RsarValueError, match="path must be one of"):
        shard_model(torch.nn.Linear(4, 4), None, path="sometimes")


if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
    from dist_workers import worker_main
    worker_main(CASES)
