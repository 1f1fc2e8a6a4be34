"""The fused op on real GPUs: correctness of RS and AR, determinism, graphs, bad input.

mpirun -n 2 python -m pytest -q tests/gpu/test_fused_gpu.py
"""
from __future__ import annotations

import contextlib
import random

import pytest
import torch

from rsar_core import GemmRsAr, RsarTimeoutError, ShapeMismatchError
from rsar_core.reference import rank_inputs, reference_sum, rel_error, rs_rows

from gpu_ops import MAX_M, get_op
from launch.rules import default_push, default_stages
from launch.geometry import sk_pieces

TOL = 1e-2


def poisoned_call(op: GemmRsAr, x: torch.Tensor, w: torch.Tensor,
                  *scales: torch.Tensor) -> torch.Tensor:
    """Hand the op's output allocation a block full of NaN, so unwritten rows show
    (``scales``: an fp8 op's x_scale and w_scale).

    A call that compiles or plans first may take other blocks from the caching allocator on
    the way and be handed a different one for its output (seen once in 1761 tests); the
    second call, with its plan and kernel cached, allocates its output first."""
    rows = x.shape[0] if op.all_reduce else op.plan(x.shape[0], x.shape[1]).local_M
    for _ in range(2):
        bait = torch.full((rows, op.N), float("nan"), dtype=op.dtype, device=x.device)
        ptr = bait.data_ptr()
        del bait
        y = op(x, w, *scales)
        if y.data_ptr() == ptr:
            return y
    raise AssertionError("allocator did not reuse the poisoned block")


@contextlib.contextmanager
def knobs(op: GemmRsAr, **fields):
    """``op.retune(**fields)`` (``Tuning`` fields) for the block, closed after it (its
    workspace, ``op``'s, stays open); the block calls the op this yields, not ``op``. Where
    the fields leave ``op``'s tuning as it is, ``op`` itself. Collective, as construction is:
    every rank enters it with the same fields."""
    if op.tuning.replace(**fields) == op.tuning:
        yield op
        return
    tuned = op.retune(**fields)
    try:
        yield tuned
    finally:
        tuned.close()


def op_push(op: GemmRsAr) -> str:
    """How ``op``'s partials leave: its tuning's ``push``, else the rule's for its arch,
    transport and mode."""
    return op.tuning.push or default_push(op.arch or "", op.transport, op.mode)


def check(op: GemmRsAr, seed: int, M: int, K: int) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    x, w = rank_inputs(seed, op.rank, M, op.N, K, dev, dtype=op.dtype)
    y = poisoned_call(op, x, w)
    check_result(op, y, reference_sum(seed, op.world, M, op.N, K, dev, dtype=op.dtype), M, K)


def check_result(op: GemmRsAr, y: torch.Tensor, ref: torch.Tensor, M: int, K: int) -> None:
    """``y`` of a call against the full (M, N) sum ``ref``: this rank's rows for RS, zero
    padding rows past M, no NaN of the poisoned output left, within TOL."""
    torch.cuda.synchronize()
    op.check()
    assert y.dtype == op.dtype
    if not op.all_reduce:
        ref = rs_rows(ref, op.rank, op.world)
    assert y.shape == ref.shape
    assert not torch.isnan(y).any(), f"unwritten rows (M={M} K={K})"
    err = rel_error(y, ref)
    assert err < TOL, f"rel error {err:.3g} (M={M} N={op.N} K={K} ar={op.all_reduce})"
    if not op.all_reduce:
        padded_from = M - op.rank * y.shape[0]
        if 0 <= padded_from < y.shape[0]:
            assert (y[padded_from:] == 0).all(), "padding rows must be zero"


MS = [1, 127, 128, 129, 1000, 4096, 8191, MAX_M]
NS = [128, 384, 7168]
KS = [64, 192, 1024, 4096, 9216]


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("K", KS)
@pytest.mark.parametrize("M", MS)
def test_correct(comm, M, N, K, ar):
    check(get_op(comm, N, ar), seed=M * 7 + K * 13 + N, M=M, K=K)


@pytest.mark.parametrize("cta_group,push,peers_first,bn", [
    (1, "lsu", False, None), (2, "lsu", False, None),
    (1, "tma", False, None), (2, "tma", False, None),
    (1, "tma_all", False, None), (1, "tma_all", True, None),
    (1, "lsu", True, None), (1, "tma_all", True, 64), (1, "lsu", False, 64),
    (1, "tma_all", False, 224), (2, "lsu", False, 224), (1, "tma", True, 224)],
    ids=["c1", "c2", "c1tma", "c2tma", "c1tmaall", "c1pf", "c1pflsu", "c1pf64", "c1bn64",
         "c1bn224", "c2bn224lsu", "c1pf224"])
@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("N", [384, 7168])
@pytest.mark.parametrize("K", [64, 1024, 4096])
@pytest.mark.parametrize("M", [1, 127, 129, 300, 1000, 4096, 8191])
def test_correct_forced_plan(comm, M, N, K, ar, cta_group, push, peers_first, bn):
    """Every plan and push path on every shape class (odd tile rows leave a padding tile in
    2x1 clusters; the peers-first order; bulk-copy pushes of owners' row ranges), whichever
    one the defaults pick."""
    if bn is not None and N % bn:
        pytest.skip(f"{bn}-wide tiles do not divide N={N}")
    with knobs(get_op(comm, N, ar), cta_group=cta_group, push=push, peers_first=peers_first,
               bn=bn) as op:
        p = op.plan(M, K)
        assert p.cta_group == cta_group
        assert p.peers_first == peers_first and (bn is None or p.bn == bn)
        check(op, seed=M * 5 + K * 11 + N + cta_group, M=M, K=K)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("K", [1024, 4096])
@pytest.mark.parametrize("M", [512, 2048, 4096])
def test_pairs_with_lag_round(comm, M, K, ar):
    """2x1 clusters with the lag round, where no pair-tile straddles two owners (at world 4
    and 8, M=512 leaves each owner 128 or 64 rows: the plan refuses, before any launch)."""
    with knobs(get_op(comm, 7168, ar), cta_group=2, lag=1) as op:
        if (M // op.world) % 256:
            with pytest.raises(ValueError, match="straddle"):
                op.plan(M, K)
            return
        p = op.plan(M, K)
        assert p.cta_group == 2 and p.lag == 1
        check(op, seed=M * 3 + K * 17 + int(ar), M=M, K=K)


@pytest.mark.parametrize("pf", [False, True], ids=["rnd", "pf"])
@pytest.mark.parametrize("bn", [None, 64])
@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("K", [1024, 9216])
@pytest.mark.parametrize("M", [1, 129, 1000, 4096])
def test_pairs_along_n(comm, M, K, ar, bn, pf):
    """2x1 clusters whose two tiles are neighbours in one tile row, sharing x's tile, in the
    round order and peers-first."""
    with knobs(get_op(comm, 7168, ar), pair_n=True, bn=bn, peers_first=pf) as op:
        p = op.plan(M, K)
        assert p.pair_n and p.cta_group == 2 and (bn is None or p.bn == bn)
        assert p.peers_first == pf
        check(op, seed=M * 7 + K * 3 + int(ar) + (bn or 0) + 11 * pf, M=M, K=K)


@pytest.mark.parametrize("cta_group", [1, 2])
@pytest.mark.parametrize("bn", [224, 256])
@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("K", [1024, 4096])
@pytest.mark.parametrize("M", [129, 1000, 4096, 8191])
def test_four_stages_partial_ring(comm, M, K, ar, bn, cta_group):
    """4 mainloop stages with a sub-tile ring that holds part of a tile (slots come back per
    sub-tile, so the MMA warps wait for the first pushes before the tile's last sub-tiles)."""
    with knobs(get_op(comm, 7168, ar), stages=4, bn=bn, cta_group=cta_group) as op:
        assert op.plan(M, K).bn == bn
        check(op, seed=M * 3 + K + bn + int(ar) + 7 * cta_group, M=M, K=K)
        dev = torch.device("cuda", torch.cuda.current_device())
        x, w = rank_inputs(M + bn, op.rank, M, op.N, K, dev)
        assert rel_error(op.gemm_only(x, w), x.double() @ w.double().t()) < TOL


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("K", [2048, 9216])
@pytest.mark.parametrize("M", [832, 1000, 1024, 1152])
def test_default_four_stage_plans(comm, M, K, ar):
    """The plans ``default_stages`` gives 4 mainloop stages (224 wide with two tiles a lane
    at N=7168; the GEMM alone also at three): correct against the float64 reference, and
    bit for bit what the whole-tile ring's 3 stages compute (the k-blocks' order is the
    same)."""
    op = get_op(comm, 7168, ar)
    push = op.variant(M, K).push  # the op's push as its kernel compiles it (push_for)
    if comm.Get_size() == 2 and op.transport == "unicast" and M in (1000, 1024):
        assert default_stages(op.arch, op.transport, push, op.plan(M, K)) == 4
    check(op, seed=M * 5 + K + int(ar), M=M, K=K)
    dev = torch.device("cuda", torch.cuda.current_device())
    x, w = rank_inputs(M + K, op.rank, M, op.N, K, dev)
    y4, g4 = op(x, w), op.gemm_only(x, w)
    with knobs(op, stages=3) as three:
        y3, g3 = three(x, w), three.gemm_only(x, w)
    torch.cuda.synchronize()
    op.check()
    assert torch.equal(y4, y3) and torch.equal(g4, g3)
    assert rel_error(g4, x.double() @ w.double().t()) < TOL


@pytest.mark.parametrize("K", [2048, 9216])
@pytest.mark.parametrize("M", [320, 512])
def test_gemm_only_four_stages_at_one_round(comm, M, K):
    """The GEMM alone on 256-wide one-round plans (N=8192) runs 4 mainloop stages by
    default: correct against the float64 reference."""
    op = get_op(comm, 8192, False)
    dev = torch.device("cuda", torch.cuda.current_device())
    x, w = rank_inputs(M * 3 + K, op.rank, M, op.N, K, dev)
    assert rel_error(op.gemm_only(x, w), x.double() @ w.double().t()) < TOL


@pytest.mark.parametrize("K", [2048, 9216])
@pytest.mark.parametrize("M,N", [(1152, 7168), (2944, 7168), (1152, 10240), (256, 2048),
                                 (512, 2048), (384, 5120)])
def test_gemm_only_one_cta_plans(comm, M, N, K):
    """The GEMM alone on the 1-CTA plans it takes where 2x1 clusters would cost more (odd
    tile rows, few tiles): 256-, 128- and 64-wide tiles, against the float64 reference."""
    op = get_op(comm, N, False, max_M=4096)
    assert op.plan(M, K, "gemm").cta_group == 1
    dev = torch.device("cuda", torch.cuda.current_device())
    x, w = rank_inputs(M * 7 + N + K, op.rank, M, op.N, K, dev)
    assert rel_error(op.gemm_only(x, w), x.double() @ w.double().t()) < TOL


@pytest.mark.parametrize("N", [7168, 8192])
@pytest.mark.parametrize("M,K", [(200, 1024), (240, 512), (256, 1024)])
def test_gemm_only_pairs_at_short_k(comm, M, N, K):
    """``choose_gemm_pairs_full_round``: two tile rows at K <= 1024 on 2x1 clusters (the
    second row partial at M 200 / 240: 65+ rows, no box; at M 129-192
    ``choose_gemm_tail_one_cta`` takes 1-CTA tiles), against float64."""
    op = get_op(comm, N, False)
    assert op.plan(M, K, "gemm").cta_group == 2
    dev = torch.device("cuda", torch.cuda.current_device())
    x, w = rank_inputs(M * 11 + N + K, op.rank, M, op.N, K, dev)
    check_gemm_only(op, x, w)


def _push_ctas_op(comm, N: int):
    op = get_op(comm, N, False)
    if op.transport != "unicast" or op_push(op) == "lsu" or op.arch != "sm_90a":
        pytest.skip("push CTAs are an sm90 RS plan over unicast with bulk-copy pushes")
    return op


@pytest.mark.parametrize("P", [8, 16])
@pytest.mark.parametrize("K", [64, 1024, 4096])
@pytest.mark.parametrize("M", [1, 129, 1000, 2048, 4096])
def test_push_ctas_correct(comm, M, K, P):
    """RS with P push CTAs (``launch.plan.push_plan``): staged tiles reach their owners,
    shared tile rows included, against the float64 reference."""
    with knobs(_push_ctas_op(comm, 7168), push_ctas=P) as op:
        assert op.plan(M, K).push_ctas == P
        check(op, seed=M * 11 + K + P, M=M, K=K)


def test_push_ctas_back_to_back_bitwise(comm):
    """100 queued RS calls of random M, each run with 16 push CTAs and then without: the same
    bits (every tile's sum is taken in the same order), stamps and staging reused across
    calls."""
    op = _push_ctas_op(comm, 384)
    dev = torch.device("cuda", torch.cuda.current_device())
    rng = random.Random(5)
    outs = []
    with knobs(op, push_ctas=16) as pushing:  # on op's workspace: stamps, staging shared
        for step in range(100):
            M = rng.randint(1, 2048)
            x, w = rank_inputs(900 + step, op.rank, M, op.N, 512, dev)
            a = pushing(x, w)
            outs.append((step, M, a, op(x, w)))
        torch.cuda.synchronize()
        pushing.check()
        op.check()
    for step, M, a, b in outs:
        assert torch.equal(a, b), f"step {step} M={M}: push CTAs and the default differ"


def _same_on_every_rank(comm, y: torch.Tensor) -> bool:
    mine = y.view(torch.int16).cpu().numpy().tobytes()
    return all(other == mine for other in comm.allgather(mine))


def _check_same_on_every_rank(comm, op: GemmRsAr, seed: int, M: int, K: int) -> tuple:
    """``check`` at this shape, then AR's result on these inputs again: the same on every rank
    bit for bit. Returns this rank's (x, w)."""
    check(op, seed=seed, M=M, K=K)
    dev = torch.device("cuda", torch.cuda.current_device())
    x, w = rank_inputs(seed, op.rank, M, op.N, K, dev)
    y = op(x, w)
    torch.cuda.synchronize()
    assert _same_on_every_rank(comm, y)
    return x, w


@pytest.mark.parametrize("bn", [None, 64, 128])
@pytest.mark.parametrize("N", [384, 7168])
@pytest.mark.parametrize("K", [64, 1024, 4096])
@pytest.mark.parametrize("M", [1, 127, 129, 300, 1000])
def test_push_all_ar(comm, M, N, K, bn):
    """Push-all AR (every tile to the other rank, every tile reduced on both): correct, and
    the two ranks' results identical bit for bit, as the owner scheme's are."""
    if comm.Get_size() != 2:
        pytest.skip("push-all plans are world-2 plans")
    with knobs(get_op(comm, N, True), push_all=True, bn=bn) as op:
        p = op.plan(M, K)
        assert p.push_all and (bn is None or p.bn == bn)
        _check_same_on_every_rank(comm, op, M * 7 + K * 3 + N + (bn or 0), M, K)


@pytest.mark.parametrize("M,K", [(1, 1024), (128, 1024), (128, 9216), (200, 4096), (256, 1024),
                                 (256, 2048)])
def test_default_small_m_plans(comm, M, K):
    """The small-M defaults (``choose_push_all``, ``choose_gemm_width``): push-all AR where
    the rule picks it at world 2 over unicast; for the GEMM alone 64-row tiles 112 wide at M
    <= 64 (``choose_gemm_rows64``), 1-CTA, and at 64 < M <= 128 on 2x1 clusters along M
    (``choose_gemm_rows64_pairs``: at N=7168 the narrowest width whose tile columns fit one
    round is 112), 128-row tiles above; correct, and AR's result the same on both ranks bit
    for bit."""
    op = get_op(comm, 7168, True)
    push_all = comm.Get_size() == 2 and op.transport == "unicast" and (
        M <= 128 or (M <= 256 and K >= 4096))
    assert op.plan(M, K).push_all == push_all
    g = op.plan(M, K, "gemm")
    if M <= 128:
        assert (g.bm, g.bn, g.cta_group) == (64, 112, 1 if M <= 64 else 2)
    else:
        assert g.bm == 128
    x, w = _check_same_on_every_rank(comm, op, M * 13 + K, M, K)
    assert rel_error(op.gemm_only(x, w), x.double() @ w.double().t()) < TOL


def _mixed_pairs(op, knob: str, steps: int, max_M: int, K: int, seed: int, p_on: float,
                 p_pair: float) -> list:
    """``steps`` queued calls of random M on ``op`` retuned with the bool ``Tuning`` field
    ``knob`` True with probability ``p_on``, else False (both ops on ``op``'s workspace,
    ``op`` itself for the value its tuning has); now and then the same inputs again with the
    knob flipped. Returns (step, M, first output, second output) for those pairs, after a
    sync and ``check()``."""
    dev = torch.device("cuda", torch.cuda.current_device())
    rng = random.Random(seed)
    pairs = []
    with knobs(op, **{knob: False}) as off, knobs(op, **{knob: True}) as on:
        by_value = {False: off, True: on}
        for step in range(steps):
            M = rng.randint(1, max_M)
            x, w = rank_inputs(seed * 10 + step, op.rank, M, op.N, K, dev)
            value = rng.random() < p_on
            y = by_value[value](x, w)
            if rng.random() < p_pair:
                pairs.append((step, M, y, by_value[not value](x, w)))
        torch.cuda.synchronize()
        off.check()
        on.check()
    assert pairs
    return pairs


def test_push_all_and_owner_plans_back_to_back_bitwise(comm):
    """300 queued AR calls of random M <= 1024, push-all and owner plans mixed (their
    stamps and slots reused across kinds): on the same 64-wide tiles push-all equals the
    owner plan bit for bit."""
    if comm.Get_size() != 2:
        pytest.skip("push-all plans are world-2 plans")
    with knobs(get_op(comm, 384, True), bn=64) as op:
        pairs = _mixed_pairs(op, "push_all", 300, 1024, 256, 77, 0.5, 0.1)
    for step, M, a, b in pairs:
        assert torch.equal(a, b), f"step {step} M={M}: push-all and the owner plan differ"


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("K", [64, 1024, 4096])
@pytest.mark.parametrize("M", [1, 129, 1000, 4096])
def test_without_pdl_correct(comm, M, K, ar):
    """Launches without programmatic dependent launch (``Tuning(pdl=False)``; every other
    test runs the default, PDL on sm90): the fused op and the GEMM alone, correct."""
    with knobs(get_op(comm, 7168, ar), pdl=False) as op:
        check(op, seed=M * 11 + K + int(ar), M=M, K=K)
        dev = torch.device("cuda", torch.cuda.current_device())
        x, w = rank_inputs(M + K, op.rank, M, op.N, K, dev)
        assert rel_error(op.gemm_only(x, w), x.double() @ w.double().t()) < TOL


@pytest.mark.parametrize("order", ["default", "pf", "pflsu"])
@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("K", [64, 4096])
@pytest.mark.parametrize("M", [1, 129, 1000, 4096])
def test_prefetch_correct(comm, M, K, ar, order):
    """Reductions and AR's copy-out loading one sub-tile ahead (``Tuning.prefetch``, on by
    default), on the default plan and on 1-CTA peers-first plans with bulk-copy or
    thread-store pushes."""
    fields = {} if order == "default" else dict(
        cta_group=1, peers_first=True, push="lsu" if order == "pflsu" else None)
    with knobs(get_op(comm, 7168, ar), prefetch=True, **fields) as op:
        check(op, seed=M * 13 + K + int(ar), M=M, K=K)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
def test_prefetch_back_to_back_bitwise(comm, ar):
    """300 queued calls of random M, with and without the sub-tile-ahead loads mixed: the
    same inputs give the same result bit for bit (the loads move, the sums do not)."""
    op = get_op(comm, 7168, ar)
    pairs = _mixed_pairs(op, "prefetch", 300, MAX_M, 256, 77 + int(ar), 0.5, 0.1)
    for step, M, a, b in pairs:
        assert torch.equal(a, b), f"step {step} M={M}: prefetching and plain reductions differ"
    check(op, seed=8, M=1000, K=128)


@pytest.mark.parametrize("on", [False, True], ids=["w0", "w1"])
@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("K", [64, 1024])
@pytest.mark.parametrize("M", [1, 129, 1000, 4096])
def test_push_window_correct(comm, M, K, ar, on):
    """Pushes with one sub-tile's copies in flight at a time, or a tile's all at once
    (``Tuning.push_window``), on the default plans of either rule."""
    with knobs(get_op(comm, 7168, ar), push_window=on) as op:
        check(op, seed=M * 17 + K + int(ar) + 2 * int(on), M=M, K=K)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
def test_push_window_back_to_back_bitwise(comm, ar):
    """300 queued calls of random M, the push window on and off mixed: the copies wait
    differently, the sums do not change, so the same inputs give the same bits."""
    op = get_op(comm, 7168, ar)
    pairs = _mixed_pairs(op, "push_window", 300, MAX_M, 256, 91 + int(ar), 0.5, 0.1)
    for step, M, a, b in pairs:
        assert torch.equal(a, b), f"step {step} M={M}: push windows 0 and 1 differ"
    check(op, seed=9, M=1000, K=128)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
def test_pdl_back_to_back_bitwise(comm, ar):
    """500 queued calls of random M, PDL and plain launches mixed, each PDL launch next to
    the kernel before it (its epoch, stamps and y's memory): a PDL call equals the plain
    call on the same inputs bit for bit, and a call after them is still correct."""
    op = get_op(comm, 384, ar)
    pairs = _mixed_pairs(op, "pdl", 500, MAX_M, 128, 99 + int(ar), 0.7, 0.05)
    for step, M, a, b in pairs:
        assert torch.equal(a, b), f"step {step} M={M}: PDL and plain launches differ"
    check(op, seed=7, M=1000, K=128)


@pytest.mark.parametrize("M", [1, 129, 1000])
def test_gemm_only_64_wide(comm, M):
    """The plain GEMM on 64-wide 1-CTA tiles (twice the CTAs of 128-wide ones at small M)."""
    op = get_op(comm, 7168, False)
    dev = torch.device("cuda", torch.cuda.current_device())
    x, w = rank_inputs(M + 64, op.rank, M, op.N, 4096, dev)
    with knobs(op, bn=64, cta_group=1) as narrow:
        y = narrow.gemm_only(x, w)
    assert rel_error(y, x.double() @ w.double().t()) < TOL


@pytest.mark.parametrize("bn", [None, 64])
@pytest.mark.parametrize("M", [1, 129, 1000, 4096])
def test_gemm_only_pairs_along_n(comm, M, bn):
    op = get_op(comm, 7168, False)
    dev = torch.device("cuda", torch.cuda.current_device())
    x, w = rank_inputs(M + 5, op.rank, M, op.N, 4096, dev)
    with knobs(op, pair_n=True, bn=bn) as paired:
        y = paired.gemm_only(x, w)
    assert rel_error(y, x.double() @ w.double().t()) < TOL


@pytest.mark.parametrize("band", [None, 0, 4])
@pytest.mark.parametrize("push", ["lsu", "tma"])
@pytest.mark.parametrize("cta_group", [1, 2])
@pytest.mark.parametrize("M", [1, 129, 1000, 4096])
def test_gemm_only_forced_plan(comm, M, cta_group, push, band):
    """Every tile once, in every unit order (row-major, bands of 4 tile or pair-tile rows,
    the plan's default band)."""
    op = get_op(comm, 7168, False)
    dev = torch.device("cuda", torch.cuda.current_device())
    x, w = rank_inputs(M, op.rank, M, op.N, 1024, dev)
    with knobs(op, cta_group=cta_group, push=push, band=band) as forced:
        y = forced.gemm_only(x, w)
    ref = (x.double() @ w.double().t())
    assert rel_error(y, ref) < TOL


@pytest.mark.parametrize("N", [7168, 8192])
@pytest.mark.parametrize("M,K,force", [
    (1, 1024, {}), (129, 1024, {}), (256, 1024, {}), (1000, 4096, {}), (2048, 1024, {}),
    (3000, 9216, {}), (512, 4096, {"stages": 4}), (1000, 1024, {"cta_group": 1}),
    (1000, 1024, {"cta_group": 2}), (200, 2048, {"pair_n": True}),
    (640, 9216, {"sk": True}), (3000, 2048, {"sk": True, "bn": 128}),
    (777, 1024, {"bn": 64}),
    # rings shorter than the tile (more stages): the oldest slot back after its store read
    (2048, 1024, {"stages": 4, "cta_group": 1}), (2048, 4096, {"stages": 4}),
    (1300, 1024, {"bn": 176, "stages": 5, "cta_group": 1}),
    (1000, 4096, {"bn": 192, "stages": 5, "cta_group": 1}),
    (3000, 1024, {"bn": 144, "stages": 6, "cta_group": 1})])
def test_gemm_only_tma_store(comm, M, N, K, force):
    """The plain GEMM's output by TMA tensor stores (``Tuning.tma_store``): against the
    float64 product, over a freed NaN block (rows past M are the TMA's to clip), and bitwise
    equal to the communication threads' stores of the same accumulators."""
    op = get_op(comm, N, False)
    dev = torch.device("cuda", torch.cuda.current_device())
    with knobs(op, tma_store=True, **force) as tma, knobs(op, tma_store=False, **force) as plain:
        for i in range(2):
            x, w = rank_inputs(M + K + N + i, op.rank, M, op.N, K, dev)
            check_gemm_only_bitwise(tma, plain, x, w)


def check_gemm_only(op: GemmRsAr, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``op.gemm_only`` into a freed NaN block of the output's size (the caching allocator
    hands it to y, so nothing is left unwritten), against the float64 product; y."""
    poison = torch.full((x.shape[0], op.N), float("nan"), dtype=op.dtype, device=x.device)
    del poison
    y = op.gemm_only(x, w)
    torch.cuda.synchronize()
    assert not torch.isnan(y).any()
    assert rel_error(y, x.double() @ w.double().t()) < TOL
    return y


def check_gemm_only_bitwise(op: GemmRsAr, baseline: GemmRsAr, x: torch.Tensor,
                            w: torch.Tensor) -> None:
    """``check_gemm_only`` of ``op`` (an op retuned to what is tested), and bitwise equal to
    ``baseline.gemm_only`` (the same plan without it)."""
    y = check_gemm_only(op, x, w)
    y0 = baseline.gemm_only(x, w)
    torch.cuda.synchronize()
    assert torch.equal(y, y0)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("order", ["default", "round", "pf", "pf64", "rowmajor", "band3",
                                   "pn64", "pnpf64"])
def test_back_to_back_random_M_bitwise(comm, order, ar):
    """2000 queued calls of random M (plans of every kind, one after another, no host sync
    between them); now and then a recomputation must match bitwise."""
    if ar and order != "default":
        pytest.skip("the forced orders run RS only")
    peers_first, bn, band = {
        "default": (None, None, None), "round": (False, None, None), "pf": (True, None, None),
        "pf64": (True, 64, None), "rowmajor": (None, None, 0), "band3": (None, None, 3),
        "pn64": (None, 64, None), "pnpf64": (True, 64, None)}[order]
    pair_n = order.startswith("pn")  # pairs along N (384 = 6 tiles of 64)
    with knobs(get_op(comm, 384, ar), peers_first=peers_first, bn=bn, band=band,
               pair_n=pair_n) as op:
        checks = random_m_calls(op, 2000, 256, seed=1234, low=1, p_check=0.01)
    assert checks > 5


def random_m_calls(op: GemmRsAr, steps: int, K: int, *, seed: int, low: int,
                   p_check: float) -> int:
    """Queue ``steps`` calls of random M in [low, MAX_M] (the same M on every rank: the op is
    collective), no host sync between them; with probability ``p_check`` a call is recomputed
    and must match bitwise. Returns the number of recomputations."""
    dev = torch.device("cuda", torch.cuda.current_device())
    rng = random.Random(seed)
    checks = 0
    recent: list = []
    try:
        for step in range(steps):
            M = rng.randint(low, MAX_M)
            p = op.plan(M, K)
            recent = (recent + [(step, M, p.bn, p.peers_first, p.grid, p.rounds)])[-6:]
            x, w = rank_inputs(step, op.rank, M, op.N, K, dev)
            y = op(x, w)
            if rng.random() < p_check:
                again = op(x.clone(), w.clone())
                torch.cuda.synchronize()
                assert torch.equal(y, again), f"step {step} M={M}: recomputation differs"
                checks += 1
        torch.cuda.synchronize()
        op.check()
    except RsarTimeoutError as e:
        raise AssertionError(f"{e}; last calls (step, M, bn, peers_first, grid, rounds): "
                             f"{recent}") from e
    return checks


def test_cluster_occupancy_probe_matches_cute(comm):
    """The PTX probe behind 2x1-cluster plans answers as the CuTe DSL's own query does."""
    from cutlass.utils import HardwareInfo
    from launch.occupancy import max_active_clusters
    dev = torch.cuda.current_device()
    torch.zeros(1, device="cuda")  # the context the probe loads into
    for size in (1, 2):
        assert max_active_clusters(dev, size) == HardwareInfo(dev).get_max_active_clusters(size)


@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
def test_cuda_graph_replay(comm, pdl):
    """Three calls captured in a CUDA graph, replayed 200 times on fresh inputs (with PDL:
    the launches captured with programmatic dependencies)."""
    op = get_op(comm, 384, True)
    dev = torch.device("cuda", torch.cuda.current_device())
    shapes = [(256, 128), (77, 192), (1000, 64)]
    xs = [torch.empty(M, K, dtype=torch.bfloat16, device=dev) for M, K in shapes]
    ws = [torch.empty(op.N, K, dtype=torch.bfloat16, device=dev) for _, K in shapes]
    for i, (M, K) in enumerate(shapes):
        x, w = rank_inputs(999, op.rank, M, op.N, K, dev)
        xs[i].copy_(x)
        ws[i].copy_(w)
    # PDL is on by default (sm90): ``op`` itself then, else an op retuned without it, kept
    # open while the graph replays its launches
    with knobs(op, pdl=pdl) as captured:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for i in range(3):  # warm-up compiles outside the capture
                captured(xs[i], ws[i])
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        comm.Barrier()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            ys = [captured(xs[i], ws[i]) for i in range(3)]
        for rep in range(200):
            for i, (M, K) in enumerate(shapes):
                x, w = rank_inputs(rep * 3 + i, op.rank, M, op.N, K, dev)
                xs[i].copy_(x)
                ws[i].copy_(w)
            g.replay()
            torch.cuda.synchronize()
            captured.check()
            for i, (M, K) in enumerate(shapes):
                ref = reference_sum(rep * 3 + i, op.world, M, op.N, K, dev)
                err = rel_error(ys[i], ref)
                assert err < TOL, f"replay {rep} call {i}: rel error {err:.3g}"


def test_rs_and_ar_interleaved(comm):
    rs = get_op(comm, 7168, False)
    ar = get_op(comm, 7168, True)
    for i in range(6):
        check(rs if i % 2 == 0 else ar, seed=500 + i, M=[300, 2048, 129][i % 3], K=512)


BAD = [
    ("fp16 x", lambda x, w: (x.half(), w), TypeError),
    ("fp32 w", lambda x, w: (x, w.float()), TypeError),
    ("3-D x", lambda x, w: (x.unsqueeze(0), w), ValueError),
    ("K % 64", lambda x, w: (x[:, :96].contiguous(), w[:, :96].contiguous()), ValueError),
    ("K mismatch", lambda x, w: (x, w[:, :64].contiguous()), ValueError),
    ("wrong N", lambda x, w: (x, w[:128].contiguous()), ValueError),
    ("M > max_M", lambda x, w: (torch.zeros(MAX_M + 1, x.shape[1], dtype=x.dtype, device=x.device), w), ValueError),
    ("M = 0", lambda x, w: (x[:0], w), ValueError),
    ("non-contiguous x", lambda x, w: (x.t(), w), ValueError),
    ("cpu x", lambda x, w: (x.cpu(), w), ValueError),
    ("list x", lambda x, w: (x.tolist(), w), TypeError),
    ("odd offset", lambda x, w: (torch.cat([x.view(-1), x.view(-1)])[1:1 + x.numel()].view(x.shape), w),
     ValueError),
]


@pytest.mark.parametrize("name,mutate,exc", BAD, ids=[b[0] for b in BAD])
def test_bad_input_then_valid(comm, name, mutate, exc):
    op = get_op(comm, 384, False)
    dev = torch.device("cuda", torch.cuda.current_device())
    x, w = rank_inputs(7, op.rank, 64, op.N, 128, dev)
    bx, bw = mutate(x, w)
    with pytest.raises(exc):
        op(bx, bw)
    check(op, seed=11, M=200, K=128)


def test_can_run(comm):
    op = get_op(comm, 384, False)
    dev = torch.device("cuda", torch.cuda.current_device())
    w = torch.randn(384, 128, device=dev).to(torch.bfloat16)
    assert op.can_run(w)
    assert op.can_run(torch.nn.Linear(128, 384, bias=False).to(dev, torch.bfloat16))
    assert not op.can_run(w.float())
    assert not op.can_run(w.t())
    assert not op.can_run(w.cpu())
    assert not op.can_run(w[:, :96].contiguous())
    assert not op.can_run(w[:128].contiguous())


def test_timeout_names_rank_and_tile(comm):
    """Rank 1 never calls: rank 0's first wait, for rank 1's start of the launch, expires
    and it reports rank 1 as missing."""
    op = GemmRsAr(max_M=256, N=128, all_reduce=False, comm=comm, timeout_s=0.5)
    dev = torch.device("cuda", torch.cuda.current_device())
    try:
        if op.rank == 0:
            x, w = rank_inputs(3, 0, 256, 128, 64, dev)
            op(x, w)
            torch.cuda.synchronize()
            with pytest.raises(RsarTimeoutError) as ei:
                op.check()
            assert ei.value.rank == 0 and ei.value.src == 1
            assert ei.value.kind == 3 and ei.value.tile == -1
            assert "rank 1 (start of this launch, launch 0)" in str(ei.value)
        comm.Barrier()
    finally:
        op.close()


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("shapes", [((1000, 512), (1010, 512)), ((300, 1024), (300, 960))],
                         ids=["M", "K"])
def test_ranks_calling_with_other_shapes_are_named(comm, ar, shapes):
    """Rank 1 calls with another M (same tile rows, so the plans alone do not differ) or
    another K: both ranks name the two shapes (a shape error, not a timeout: the start
    stamps tell it), and the op then stays broken."""
    op = GemmRsAr(max_M=1024, N=384, all_reduce=ar, comm=comm, timeout_s=5.0)
    dev = torch.device("cuda", torch.cuda.current_device())
    try:
        mine, theirs = shapes[op.rank], shapes[1 - op.rank]
        x, w = rank_inputs(5, op.rank, mine[0], op.N, mine[1], dev)
        op(x, w)
        torch.cuda.synchronize()
        with pytest.raises(ShapeMismatchError) as ei:  # not a timeout: found at the start
            op.check()
        e = ei.value
        assert (e.rank, e.src, e.shape, e.src_shape) == (op.rank, 1 - op.rank, mine, theirs)
        assert f"M={mine[0]}, K={mine[1]} but rank {1 - op.rank} with M={theirs[0]}" in str(e)
        with pytest.raises(ShapeMismatchError):
            op(x, w)
        comm.Barrier()
    finally:
        op.close()


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("M", [128, 1000, 4096])
def test_traced_launch_is_correct_and_its_events_in_order(comm, M, ar):
    """A trace variant computes the same result, and each CTA's events follow the protocol:
    start, first k-tile, accumulators, ring, stamps, exit."""
    from launch import trace
    with knobs(get_op(comm, 7168, ar), trace=True) as op:
        check(op, 900 + M, M, 1024)
        op.clear_trace()
        comm.Barrier()
        check(op, 901 + M, M, 1024)
        ev = op.read_trace(M, 1024)
        plan = op.plan(M, 1024)
    chains = (["start", "peers_done", "first_sub", "first_tile_sent", "first_fenced",
               "first_stamped", "exit_barrier", "exit"],     # communication warps
              ["mma_first_k", "mma_acc_done", "first_sub"])  # MMA warps, then the hand-over
    worked = [c for c, t in enumerate(ev["mma_acc_done"]) if t is not None]
    assert worked, "no CTA recorded a tile"
    for c in worked:
        # an RS tile only this rank owns goes straight to the output: no stamp, so no fence
        first = plan.cta_tiles(op.rank, c)[0]
        fences = ar or plan.tile_owners(first) != [op.rank]
        assert (ev["first_fenced"][c] is not None) == fences, (c, first, ev["first_fenced"][c])
        for order in chains:
            order = [name for name in order if fences or name != "first_fenced"]
            times = [ev[name][c] for name in order]
            assert None not in times, f"CTA {c}: an event is missing: {dict(zip(order, times))}"
            assert times == sorted(times), f"CTA {c}: out of order: {dict(zip(order, times))}"
    for c in worked:  # bulk-copy pushes: the copies complete between the hand-over and the fence
        landed = ev["first_landed"][c]
        assert landed is None or ev["first_tile_sent"][c] <= landed <= ev["first_fenced"][c]
    assert len(ev["start"]) == plan.grid and trace.NAMES[trace.EXIT] == "exit"
    for c in worked:  # one time per tile the CTA communicated, in order, from the first stamp
        n = min(len(plan.cta_tiles(op.rank, c)), trace.TILE_SLOTS)
        done = [ev[f"tile_done_{i}"][c] for i in range(trace.TILE_SLOTS)]
        assert None not in done[:n] and all(d is None for d in done[n:]), (c, n, done)
        assert done[:n] == sorted(done[:n]), (c, done)
        assert n == 0 or done[0] >= ev["first_stamped"][c], (c, done)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("K", [64, 4096])
@pytest.mark.parametrize("M", [1, 129, 300, 576, 1000, 2000])
def test_flat_peers_first_correct(comm, M, K, ar):
    """The peers-first order as one flat sequence over every list (``Tuning.flat``): fresh
    inputs, NaN-poisoned output, against the float64 reference."""
    with knobs(get_op(comm, 7168, ar), flat=True) as op:
        check(op, seed=M * 17 + K + int(ar), M=M, K=K)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("N", [7168, 8192])
@pytest.mark.parametrize("M,K", [(513, 1024), (576, 4096), (640, 2048), (703, 4096),
                                 (768, 1024)])
def test_flat_peers_first_by_default(comm, M, N, K, ar):
    """Five and six tile rows at K <= 4096 take the flat peers-first order by default
    (``launch.plan.choose_flat``), at whatever width its lane cost picks per N."""
    op = get_op(comm, N, ar)
    assert op.plan(M, K).flat
    check(op, seed=M * 31 + K + N + int(ar), M=M, K=K)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("N", [7168, 8192])
@pytest.mark.parametrize("M,K", [(300, 4096), (576, 4096), (576, 9216), (700, 1024),
                                 (1152, 2048), (1000, 64), (2000, 4160)])
def test_split_k_tail_correct(comm, M, N, K, ar):
    """The flat order with the split-K tail (``Tuning.sk``): pieces of the last round's
    units stored and added across lanes; fresh inputs, NaN-poisoned output, float64
    reference; then the plain plan on the untuned op, on the same workspace, is still right
    (flags cleared for the next launch)."""
    op = get_op(comm, N, ar)
    with knobs(op, flat=True, sk=True) as split:
        plan = split.plan(M, K)
        pieces = sk_pieces(plan.chunk, plan.num_units, -(-K // 64))
        assert plan.sk == (pieces if pieces >= 2 else 0)
        for i in range(3):
            check(split, seed=M * 7 + K + N + int(ar) + i, M=M, K=K)
    check(op, seed=M + K, M=M, K=K)


@pytest.mark.parametrize("M,K,bn", [(576, 4096, None), (576, 4096, 128), (576, 4096, 256),
                                    (640, 9216, None), (704, 9216, 256), (3000, 2048, 128),
                                    (3000, 2048, 256), (300, 1024, 128), (1000, 4096, 128)])
def test_split_k_tail_gemm_only(comm, M, K, bn):
    """gemm_only with the split-K tail against the float64 product of the same inputs."""
    with knobs(get_op(comm, 7168, False), sk=True, bn=bn) as op:
        assert op.plan(M, K, "gemm").sk
        dev = torch.device("cuda", torch.cuda.current_device())
        for i in range(2):
            x, w = rank_inputs(M + K + i, op.rank, M, op.N, K, dev)
            y = op.gemm_only(x, w)
            ref = x.double() @ w.double().t()
            err = ((y.double() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, err


@pytest.mark.parametrize("N", [7168, 2880, 1000])
@pytest.mark.parametrize("M,K,bm,bn", [(1, 9216, 64, 112), (40, 4096, 64, 256), (64, 1024, 64, 112),
                                       (63, 192, 64, 112), (128, 4096, None, 256),
                                       (256, 9216, None, 256), (200, 2048, None, 256)])
def test_split_k_one_round_gemm_only(comm, M, N, K, bm, bn):
    """The plain GEMM's one partial round cut along K onto a grid widened to its pieces
    (``launch.geometry.with_sk``), 64- and 128-row tiles: three fresh inputs against float64 on
    a NaN-poisoned output; then the unsplit default on the same workspace (flags cleared)."""
    op = get_op(comm, N, False)
    with knobs(op, sk=True, bm=bm, bn=bn) as split:
        p = split.plan(M, K, "gemm")
        assert p.rounds == 1 and p.sk >= 2 and p.grid == p.num_units * p.sk, p
        for i in range(3):
            x, w = rank_inputs(M * 5 + K + N + i, op.rank, M, N, K,
                               torch.device("cuda", torch.cuda.current_device()))
            check_gemm_only(split, x, w)
    check_gemm_only(op, x, w)


@pytest.mark.parametrize("split", [True, False], ids=["split-row", "whole-rows"])
@pytest.mark.parametrize("N", [7168, 8192])
@pytest.mark.parametrize("M,K", [(1088, 1024), (1152, 4096), (1152, 9216), (1400, 2048),
                                 (2900, 4096), (3000, 1024)])
def test_rs_lists_split_a_shared_row(comm, M, N, K, split):
    """RS round orders whose owners share a tile row: that row split between the two lists
    (``Tuning.split_row``) or kept whole; fresh inputs, NaN-poisoned output, float64
    reference, three calls."""
    with knobs(get_op(comm, N, False), split_row=split, cta_group=1, peers_first=False) as op:
        plan = op.plan(M, K)
        assert plan.split_row == (split and plan.bn >= 224), plan
        for i in range(3):
            check(op, seed=M * 3 + K + N + i, M=M, K=K)


def test_rs_split_rows_random_M_bitwise(comm):
    """300 queued RS calls of random M at N=7168 in the 1-CTA round order with shared rows
    split between lists wherever M leaves one, now and then recomputed bitwise."""
    with knobs(get_op(comm, 7168, False), cta_group=1, peers_first=False,
               split_row=True) as op:
        checks = random_m_calls(op, 300, 512, seed=99, low=129, p_check=0.05)
    assert checks > 3


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
@pytest.mark.parametrize("K", [64, 1024, 4096])
@pytest.mark.parametrize("M", [1, 129, 1000, 4096])
def test_lean_exit_correct(comm, M, K, ar):
    """The exit without system fences (``Tuning.lean_exit``): peers learn a launch is over
    from the next one's start stamp, against the float64 reference."""
    with knobs(get_op(comm, 7168, ar), lean_exit=True) as op:
        check(op, seed=M * 13 + K + int(ar), M=M, K=K)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
def test_lean_exit_random_M_bitwise(comm, ar):
    """2000 queued lean-exit calls of random M, no host sync between them (every stamp word
    rewritten launch after launch with no fence at exit): recomputations match bitwise."""
    with knobs(get_op(comm, 384, ar), lean_exit=True) as op:
        assert random_m_calls(op, 2000, 256, seed=4321, low=1, p_check=0.01) > 5


def test_lean_and_fenced_exits_interleaved(comm):
    """Launches with either exit, queued in a random mix on each op's workspace (both exits
    share the start protocol), RS and AR ops alternating: each result equals the fenced
    one."""
    rs, ar = get_op(comm, 384, False), get_op(comm, 384, True)
    dev = torch.device("cuda", torch.cuda.current_device())
    rng = random.Random(77)
    outs = []
    with contextlib.ExitStack() as stack:
        # each op retuned to either exit, on its workspace; the op itself runs its default
        exits = {op: {lean: stack.enter_context(knobs(op, lean_exit=lean))
                      for lean in (False, True)} for op in (rs, ar)}
        for step in range(150):
            op = (rs, ar)[step % 2]
            M = rng.randint(1, 2048)
            x, w = rank_inputs(700 + step, op.rank, M, op.N, 256, dev)
            a = exits[op][rng.random() < 0.5](x, w)
            outs.append((step, M, a, op(x, w)))
        torch.cuda.synchronize()
        rs.check()
        ar.check()
    for step, M, a, b in outs:
        assert torch.equal(a, b), f"step {step} M={M}: lean and fenced exits differ"
