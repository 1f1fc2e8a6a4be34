"""AR copying each pushed tile's result back early (``Tuning.early_copy``, on where the
rule takes it): the same bits as the copy-out after the last tile (``early_copy=False``), in
every schedule order.

mpirun -n 2 python -m pytest -q tests/gpu/test_early_copy_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from rsar_core.reference import rank_inputs

from gpu_ops import get_op
from test_fused_gpu import check, knobs


PLANS = {  # Tuning fields of each schedule order
    "default": {},
    "c1_lag0": dict(cta_group=1, lag=0),
    "c1_lag1": dict(cta_group=1, lag=1),
    "c2_lag0": dict(cta_group=2, lag=0),
    "c2_lag1": dict(cta_group=2, lag=1),
    "pf": dict(cta_group=1, peers_first=True),
}


@pytest.mark.parametrize("plan", list(PLANS))
@pytest.mark.parametrize("N", [384, 7168])
@pytest.mark.parametrize("K", [64, 1024, 4096])
@pytest.mark.parametrize("M", [129, 1000, 2048, 4096, 8191])
def test_early_copy_matches_late_bitwise(comm, M, K, N, plan):
    # the plan's op (early copies on where the rule takes them), and the same plan with
    # every result copied out after the last round, both on the module op's workspace
    with knobs(get_op(comm, N, True), **PLANS[plan]) as op, \
            knobs(op, early_copy=False) as late_op:
        try:
            op.plan(M, K)
        except ValueError:
            pytest.skip("no such plan at this shape")
        check(op, seed=M * 3 + K + N, M=M, K=K)
        dev = torch.device("cuda", torch.cuda.current_device())
        x, w = rank_inputs(M + 7 * K, op.rank, M, N, K, dev)
        early = op(x, w)
        late = late_op(x, w)
        torch.cuda.synchronize()
        op.check()
        assert torch.equal(early, late)
