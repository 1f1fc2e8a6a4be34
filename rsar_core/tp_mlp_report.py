"""The report of a tensor-parallel MLP block run (scripts/tp_worker.py): speedups from the
timings, and the readable lines printed from the result dict its ``--json`` writes.

Scripts that run the GPU checks pick the last line (``... checks passed`` / ``FAILED``), so
its wording is part of the contract.
"""
from __future__ import annotations

from typing import Any

from .tp_mlp import VARIANTS

PREFIX = "rsar tp_worker:"
LABELS = {
    "fused_ar": "fused AR (GemmRsAr)",
    "mm_ar": "torch.mm + NCCL all_reduce",
    "fused_rs_ag": "fused RS (GemmRsAr) + all_gather",
    "mm_rs_ag": "torch.mm + NCCL RS + all_gather",
}
# (name, fused variant, baseline variant)
PAIRS = (("AR", "fused_ar", "mm_ar"), ("RS+AG", "fused_rs_ag", "mm_rs_ag"))


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
