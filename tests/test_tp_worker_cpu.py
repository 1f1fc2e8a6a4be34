"""scripts/tp_worker.py, once, on a CPU-only machine: its collective body ``run()`` on 2 CPU
processes (gloo, tests/tp_mlp_child.py) with a stand-in for GemmRsAr, --bias on 101 tokens
(an RS padding row). The pieces it runs are tested in test_tp_mlp, test_quantize,
test_launcher and test_timing; the GPU run is tests/gpu/run_all.sh's."""
from __future__ import annotations

import json
import subprocess
import sys

from script_runs import REPO, plain_env


def test_worker_checks_and_times_on_two_cpu_ranks(tmp_path):
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", str(REPO / "tests" / "tp_mlp_child.py"),
                        "worker", str(tmp_path)], capture_output=True, text=True, timeout=240,
                       env=plain_env(OMP_NUM_THREADS="1"), cwd=str(REPO),
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["code"] for r in ranks] == [0, 0]
    for r in ranks:
        # correctness once, then (warm-up + iters) for the block and for the down projection
        assert r["calls"] == r["bias_calls"] == [1 + 2 * 4] * 2, r
        # the kernels for (M=T, K=I/world), with the bias, compiled before the first call
        assert r["prepared"] == [[101, 128, "ar", "bias"], [101, 128, "rs", "bias"]], r
    out = json.loads((tmp_path / "worker.json").read_text())
    res, report = out["result"], out["report"]
    assert res["ok"] and res["weights_identical"] and res["config"]["padded_tokens"] == 102
    assert all(c["ok"] and max(c["rel_err"]) < 1e-2 for c in res["checks"].values())
    assert all(t["block"] > 0 and t["down"] > 0 for t in res["us"].values())
    assert len(res["checks"]) == len(res["us"]) == 4
    assert report[-1] == "rsar tp_worker: all 4 checks passed (rel err < 0.02)"
