"""AR copying each pushed tile's result back early (``early_copy``): the same bits as the
copy-out after the last tile, in every schedule order.

mpirun -n 2 python -m pytest -q tests/gpu/test_early_copy_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from rsar_core.reference import rank_inputs

from gpu_ops import get_op
from test_fused_gpu import check


PLANS = {
    "default": {},
    "c1_lag0": dict(force_cta_group=1, force_lag=0),
    "c1_lag1": dict(force_cta_group=1, force_lag=1),
    "c2_lag0": dict(force_cta_group=2, force_lag=0),
    "c2_lag1": dict(force_cta_group=2, force_lag=1),
    "pf": dict(force_cta_group=1, force_peers_first=True),
    "rot": dict(force_cta_group=1, force_rotate=True),
}


@pytest.mark.parametrize("plan", list(PLANS))
@pytest.mark.parametrize("N", [384, 7168])
@pytest.mark.parametrize("K", [64, 1024, 4096])
@pytest.mark.parametrize("M", [129, 1000, 2048, 4096, 8191])
def test_early_copy_matches_late_bitwise(comm, M, K, N, plan):
    op = get_op(comm, N, True)
    knobs = PLANS[plan]
    before = {k: getattr(op, k) for k in knobs}
    for k, v in knobs.items():
        setattr(op, k, v)
    try:
        try:
            op.plan(M, K)
        except ValueError:
            pytest.skip("no such plan at this shape")
        op.force_early_copy = True
        check(op, seed=M * 3 + K + N, M=M, K=K)
        dev = torch.device("cuda", torch.cuda.current_device())
        x, w = rank_inputs(M + 7 * K, op.rank, M, N, K, dev)
        early = op(x, w)
        op.force_early_copy = None
        late = op(x, w)
        torch.cuda.synchronize()
        op.check()
        assert torch.equal(early, late)
    finally:
        op.force_early_copy = None
        for k, v in before.items():
            setattr(op, k, v)
