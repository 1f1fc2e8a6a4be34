"""N that no tile width divides: each tile row ends on a partial tile, whose columns past N
are computed on w's zero fill, travel in the workspace and are never stored.

mpirun -n 2 python -m pytest -q tests/gpu/test_partial_tiles_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from gpu_ops import get_op
from rsar_core.reference import rank_inputs, rel_error
from test_fused_gpu import TOL, check, check_gemm_only, knobs, op_push

# 2880: a model family's hidden size (15 x 192, 18 x 160: whole at those widths, partial at
# the others); 1000: not a multiple of 32, so the last sub-tile is partial too; 200: narrower
# than most tile widths
NS = [2880, 1000, 200]


def _gemm_ok(op, seed: int, M: int, K: int) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    check_gemm_only(op, *rank_inputs(seed, op.rank, M, op.N, K, dev))


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("K", [64, 1024, 4096])
@pytest.mark.parametrize("M", [1, 129, 300, 1000, 4096])
def test_default_plans(comm, M, N, K, ar):
    """The plans an op of such N runs by default (widths of ``launch.plan.PARTIAL_NS``, the
    small-M, split-K and push-all rules among them), and the GEMM alone's."""
    op = get_op(comm, N, ar)
    p = op.plan(M, K)
    assert (p.tiles_n - 1) * p.bn < N <= p.tiles_n * p.bn
    check(op, seed=M * 7 + K * 13 + N + int(ar), M=M, K=K)
    if not ar:
        _gemm_ok(op, M + K + N, M, K)


# name -> (Tuning fields, push: None the op's default)
FORCED = {
    "c1lsu": ({"cta_group": 1}, "lsu"),
    "c2lsu": ({"cta_group": 2}, "lsu"),
    "c1tma": ({"cta_group": 1}, "tma"),
    "c2tma": ({"cta_group": 2}, "tma"),
    "c1tmaall": ({"cta_group": 1}, "tma_all"),
    "pf160": ({"cta_group": 1, "peers_first": True, "bn": 160}, "tma_all"),
    "pflsu192": ({"cta_group": 1, "peers_first": True, "bn": 192}, "lsu"),
    "c1bn192": ({"cta_group": 1, "bn": 192}, "tma"),
    "c2bn160": ({"cta_group": 2, "bn": 160}, "tma"),
    "c1bn256": ({"cta_group": 1, "bn": 256}, "tma_all"),
    "c2bn224lsu": ({"cta_group": 2, "bn": 224}, "lsu"),
    "flatsk": ({"peers_first": True, "flat": True, "sk": True}, None),
    "pairn": ({"pair_n": True}, None),
    "pushall": ({"push_all": True}, None),
    "pushctas": ({"push_ctas": 8}, None),
}


@pytest.mark.parametrize("name", list(FORCED))
@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("N", [2880, 1000])
@pytest.mark.parametrize("K", [1024, 4096])
@pytest.mark.parametrize("M", [129, 1000, 4096])
def test_forced_plans(comm, M, N, K, ar, name):
    """Every order, cluster, width and push path with a partial last tile column."""
    force, push = FORCED[name]
    op = get_op(comm, N, ar)
    if name == "pushall" and (not ar or comm.Get_size() != 2 or M > 1024):
        pytest.skip("push-all plans are world-2 AR plans up to M=1024")
    if name == "pushctas" and (ar or op.transport != "unicast" or op_push(op) == "lsu"):
        pytest.skip("push CTAs are an RS plan over unicast with bulk-copy pushes")
    with knobs(op, push=push, **force) as tuned:
        p = tuned.plan(M, K)
        if "bn" in force:
            assert p.bn == force["bn"]
        check(tuned, seed=M * 5 + K * 11 + N + len(name), M=M, K=K)


@pytest.mark.parametrize("N", [2880, 1000])
def test_back_to_back_random_m(comm, N):
    """200 queued calls of random M, RS and AR, each checked afterwards: stamps, receive
    slots and the partial tiles' workspace columns reused across calls."""
    import random
    rng = random.Random(N)
    dev = torch.device("cuda", torch.cuda.current_device())
    ops = [get_op(comm, N, False), get_op(comm, N, True)]
    outs = []
    for step in range(200):
        op, M = ops[step % 2], rng.randint(1, 3000)
        x, w = rank_inputs(step + N, op.rank, M, N, 512, dev)
        outs.append((op, step, M, op(x, w)))
    torch.cuda.synchronize()
    from rsar_core.reference import reference_sum, rs_rows
    for op, step, M, y in outs:
        op.check()
        ref = reference_sum(step + N, op.world, M, N, 512, dev)
        if not op.all_reduce:
            ref = rs_rows(ref, op.rank, op.world)
        assert rel_error(y, ref) < TOL, (step, M)
