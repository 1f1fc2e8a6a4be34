"""Greedy generation with a Hugging Face model, tensor-parallel on rsar, against transformers'
own TP: tokens/s of each.

    torchrun --nproc-per-node 2 scripts/hf_generate.py --model tiny-llama
    torchrun --nproc-per-node 2 scripts/hf_generate.py --model /path/to/checkpoint --batch 8
    RSAR_ALLOW_SHARED_GPU=1 torchrun --nproc-per-node 2 scripts/hf_generate.py  # one GPU

``--model``: tiny-llama, tiny-qwen3, tiny-qwen3-moe, tiny-llama4 (random init from a config
in code, nothing downloaded) or a local checkpoint directory. With a GPU per rank the group is NCCL
(CUDA) + gloo (CPU) and both TP implementations are timed; where the ranks share one GPU the
group is gloo (NCCL refuses two ranks on one device) and the run is functional only: rsar's
model generates and is checked against the unsharded one, its time is not a measurement,
and transformers' TP is not run.
"""
from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist

TINY = {"tiny-llama": "llama", "tiny-qwen3": "qwen3", "tiny-qwen3-moe": "qwen3_moe",
        "tiny-llama4": "llama4"}


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-llama",
                   help=f"{', '.join(TINY)} or a local checkpoint directory")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=3, help="timed generations of each kind")
    p.add_argument("--max-M", type=int, default=4096, help="the fused op's most tokens a call")
    p.add_argument("--path", choices=("auto", "fused", "unfused"), default="auto")
    p.add_argument("--static", action="store_true",
                   help="a static cache (transformers compiles the decoding step)")
    return p.parse_args()


def _load(name: str, device: torch.device, seed: int = 0) -> Any:
    from transformers import AutoModelForCausalLM
    from rsar_core.integrations.transformers import tiny_config
    torch.manual_seed(seed)
    if name in TINY:
        model = AutoModelForCausalLM.from_config(tiny_config(TINY[name]), dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16)
    return model.to(device=device, dtype=torch.bfloat16).eval()


def _timed(model: Any, ids: torch.Tensor, reps: int, kw: dict) -> tuple[torch.Tensor, float]:
    """The tokens of the last generation and the mean seconds of ``reps`` after a warm-up."""
    out = model.generate(ids, **kw)
    dist.barrier()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        out = model.generate(ids, **kw)
    torch.cuda.synchronize()
    dist.barrier()
    return out, (time.perf_counter() - t0) / reps


def main() -> None:
    a = _args()
    if not torch.cuda.is_available():
        raise SystemExit("hf_generate.py needs CUDA GPUs (the CPU path is covered by "
                         "tests/test_hf_transformers.py)")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    own_gpus = torch.cuda.device_count() >= world
    torch.cuda.set_device(local % torch.cuda.device_count())
    dist.init_process_group("cuda:nccl,cpu:gloo" if own_gpus else "gloo")
    rank = dist.get_rank()
    dev = torch.device("cuda", torch.cuda.current_device())
    from rsar_core.integrations.transformers import compare_greedy, shard_model

    ref = _load(a.model, dev)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, ref.config.vocab_size, (a.batch, a.prompt_len), generator=g).to(dev)
    kw: dict[str, Any] = dict(max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
                              do_sample=False)
    if a.static:
        kw["cache_implementation"] = "static"
    model = copy.deepcopy(ref)
    tp = shard_model(model, dist.group.WORLD, max_M=a.max_M, path=a.path)
    # checked before timing: greedy picks on the unsharded model's own prefix (near ties
    # aside, where TP rounding decides for any implementation; ``compare_greedy``)
    extra = {"cache_implementation": "static"} if a.static else {}
    check = compare_greedy(model, ref, ids, a.new_tokens, **extra)
    tp.reset_counters()
    got, secs = _timed(model, ids, a.reps, kw)
    tokens = a.batch * a.new_tokens
    lines = [f"model {a.model}, world {world}, batch {a.batch}, prompt {a.prompt_len}, "
             f"{a.new_tokens} new tokens, path={a.path}{', static cache' if a.static else ''}",
             f"rsar:            {tokens / secs:10.1f} tokens/s  ({secs * 1e3:.1f} ms a "
             f"generation; {tp.fused_calls} fused / {tp.unfused_calls} unfused layer calls)",
             f"against the unsharded model, {check}"]
    if own_gpus:
        from transformers import AutoModelForCausalLM
        with tempfile.TemporaryDirectory() as d:
            box = [d]
            dist.broadcast_object_list(box, src=0)
            where = box[0] if a.model in TINY else a.model
            if a.model in TINY and rank == 0:
                ref.save_pretrained(where)
            dist.barrier()
            hf = AutoModelForCausalLM.from_pretrained(where, tp_plan="auto",
                                                      dtype=torch.bfloat16).eval()
            dist.barrier()
        hf_got, hf_secs = _timed(hf, ids, a.reps, kw)
        hf_agree = int((hf_got[:, a.prompt_len:] == got[:, a.prompt_len:]).sum(dim=1).min())
        lines.append(f"transformers TP: {tokens / hf_secs:10.1f} tokens/s  ({hf_secs * 1e3:.1f} "
                     f"ms a generation; its tokens agree with rsar's on >= {hf_agree} of "
                     f"{a.new_tokens})")
        lines.append(f"rsar / transformers TP: {hf_secs / secs:.2f}x")
    else:
        lines.append("the ranks share one GPU: this run is functional only (the rsar time "
                     "is not a measurement; transformers' TP needs NCCL, which refuses two "
                     "ranks on one GPU, and was not run)")
    ok = check.ok and tp.fused_calls + tp.unfused_calls > 0
    lines.append(f"hf_generate {'PASS' if ok else 'FAIL'}: rsar's greedy picks "
                 + ("agree with" if ok else "differ from") + " the unsharded model's"
                 + (" (near ties aside)" if ok else ""))
    if rank == 0:
        print("\n".join(lines), flush=True)
    tp.close()
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
