"""rsar_core.integrations.transformers on the CPU: tiny random-init Llama, Qwen3, Qwen3-MoE
and Llama4 models sharded over 2 gloo processes (unfused path) against the unsharded model.

Per model: logits of a batch of prompts within fp32 tolerance of the unsharded model's,
greedy generation (dynamic cache and static cache) equal to its tokens, every rowwise layer
an AutoRowParallelLinear that ran unfused, the shards the plan asks for. Qwen3-MoE runs twice:
with the installed release's plan (its experts whole on every rank from transformers 5.25)
and with the experts' entries of the 5.24 plan (experts sharded), so both cases are covered
whatever release CI installs.
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


CASES_MODELS = {  # case -> (tiny kind, add the 5.24 experts plan)
    "llama": ("llama", False), "qwen3": ("qwen3", False), "qwen3_moe": ("qwen3_moe", False),
    "qwen3_moe_tp": ("qwen3_moe", True), "llama4": ("llama4", False)}


def _case_models() -> dict[str, Any]:
    import torch.distributed as dist
    from hf_models import prompt, tiny_model
    from rsar_core.integrations.transformers import shard_model
    from rsar_core.linear import AutoRowParallelLinear
    torch.set_num_threads(1)
    out: dict[str, Any] = {}
    for case, (kind, experts_plan) in CASES_MODELS.items():
        ref = tiny_model(kind, experts_plan=experts_plan)
        model = copy.deepcopy(ref)
        plan_experts = sorted(k for k, v in model.config.base_model_tp_plan.items()
                              if v == "moe_tp_experts")
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
            plan_experts=plan_experts,
            all_rsar=all(isinstance(m, AutoRowParallelLinear) for m in tp.layers.values()),
            o_proj_type=type(attn.o_proj).__name__,
            q_out=attn.q_proj.out_features, k_out=attn.k_proj.out_features,
            o_in=attn.o_proj.in_features, ops=len(tp.ops), repr=repr(tp))
        if kind == "qwen3_moe":
            ex = model.model.layers[0].mlp.experts
            res["experts_shapes"] = [list(ex.gate_up_proj.shape), list(ex.down_proj.shape)]
        if kind == "llama4":
            ex = model.model.layers[0].feed_forward.experts
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
        out[case] = res
    return out


CASES = {"models": _case_models}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    from dist_workers import run_gloo
    return run_gloo(__file__, "models", tmp_path_factory.mktemp("hf"), timeout=180)


@pytest.mark.parametrize("case", list(CASES_MODELS))
def test_sharded_model_matches_unsharded(reports, case):
    for r, rep in enumerate(reports):
        res = rep[case]
        assert res["logit_err"] < LOGIT_TOL, (r, case, res["logit_err"])
        assert res["new_tokens"] == NEW_TOKENS
        assert res["same_tokens"], (r, case, "greedy tokens differ from the unsharded model's")
        assert res["same_tokens_static"], (r, case, "static-cache tokens differ")
        assert res["all_rsar"] and res["o_proj_type"] == "AutoRowParallelLinear"
        # 4 query heads, 2 kv heads of 32: half each per rank; o_proj's K halves with them
        assert (res["q_out"], res["k_out"], res["o_in"]) == (64, 32, 64), res
        assert res["fused"] == 0 and res["ops"] == 0 and "on cpu" in res["why"]
        # one forward: 2 layers x (o_proj + a dense or shared-expert down_proj)
        per_forward = 3 if CASES_MODELS[case][0] == "qwen3_moe" else 4
        assert res["counts_after_forward"] == [0, per_forward], res
        assert res["unfused"] > per_forward   # generate ran through them too
        assert "comm=gloo" in res["repr"]


def test_rowwise_layers(reports):
    llama = reports[0]["llama"]
    assert llama["rowwise"] == ["layers.0.mlp.down_proj", "layers.0.self_attn.o_proj",
                                "layers.1.mlp.down_proj", "layers.1.self_attn.o_proj"]
    assert llama["experts"] == [] and llama["o_bias"]
    assert "sharded already" in llama["twice"]
    # layer 0 routed: its dense-looking names are absent; layer 1's down_proj is rsar's
    for case in ("qwen3_moe", "qwen3_moe_tp"):
        assert reports[0][case]["rowwise"] == ["layers.0.self_attn.o_proj",
                                               "layers.1.mlp.down_proj",
                                               "layers.1.self_attn.o_proj"]
    # Llama4's routed layer 0 has a shared expert: its down projection is rowwise too
    assert reports[0]["llama4"]["rowwise"] == [
        "layers.0.feed_forward.shared_expert.down_proj", "layers.0.self_attn.o_proj",
        "layers.1.feed_forward.down_proj", "layers.1.self_attn.o_proj"]


def test_moe_experts_follow_the_plan(reports):
    """4 experts of 128 intermediate features: split to 64 a rank (all-reduced by the group)
    where the plan names the experts moe_tp_experts, else whole on every rank."""
    for rep in reports:
        llama4, qwen_tp, qwen = rep["llama4"], rep["qwen3_moe_tp"], rep["qwen3_moe"]
        assert llama4["plan_experts"] == ["layers.*.feed_forward.experts"]
        assert llama4["experts"] == ["layers.0.feed_forward.experts"]
        assert llama4["experts_shapes"] == [[4, 128, 128], [4, 64, 128]]   # (E, H, 2I), (E, I, H)
        assert qwen_tp["plan_experts"] == ["layers.*.mlp.experts"]
        assert qwen_tp["experts"] == ["layers.0.mlp.experts"]
        assert qwen_tp["experts_shapes"] == [[4, 128, 128], [4, 128, 64]]  # (E, 2I, H), (E, H, I)
        if qwen["plan_experts"]:        # transformers <= 5.24
            assert qwen["experts"] == ["layers.0.mlp.experts"]
            assert qwen["experts_shapes"] == qwen_tp["experts_shapes"]
        else:
            assert qwen["experts"] == []
            assert qwen["experts_shapes"] == [[4, 256, 128], [4, 128, 128]]


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


def test_compare_greedy_tells_a_model_from_another():
    from hf_models import prompt, tiny_model
    from rsar_core.integrations.transformers import compare_greedy
    ref = tiny_model("qwen3")
    same = compare_greedy(copy.deepcopy(ref), ref, prompt(), NEW_TOKENS)
    assert same.ok and same.free_agree == same.forced_agree == NEW_TOKENS
    other = compare_greedy(tiny_model("qwen3", seed=5), ref, prompt(), NEW_TOKENS)
    assert not other.ok and other.decisive_misses > 0 and "decisive misses" in str(other)


def test_hf_generate_without_cuda_says_so():
    import subprocess
    from pathlib import Path
    script = Path(__file__).resolve().parents[1] / "scripts" / "hf_generate.py"
    r = subprocess.run([sys.executable, str(script), "--model", "tiny-llama4"],
                       capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode != 0 and "needs CUDA GPUs" in r.stderr


if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
    from dist_workers import worker_main
    worker_main(CASES)
