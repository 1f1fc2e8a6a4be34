"""The tile plan and ownership rules, on the CPU, for world sizes 2..16."""
from __future__ import annotations

import itertools

import pytest

from launch.geometry import BM, FULL_NS, PARTIAL_NS, ceil_div, max_recv_slots, tile_widths
from launch.plan import make_plan

WORLDS = [2, 4, 8, 16]
# N no width of FULL_NS divides: sm90 plans end each tile row on a partial tile (2880: the
# hidden size of a model family; 1000: not even a multiple of 32)
PARTIAL_N = (2880, 1000)
MS = [1, 2, 7, 127, 128, 129, 200, 255, 1000, 1023, 2048, 4095, 8191, 8192]


def _plans(mode, Ns=(128, 384, 7168, *PARTIAL_N)):
    """Round-order plans (the small-M choice of the peers-first order has its own tests)."""
    for world, M, N in itertools.product(WORLDS, MS, Ns):
        yield make_plan(M, N, 1024, world, 132, mode, peers_first=False)


def test_plan_is_pure_and_bounded():
    a = make_plan(1000, 7168, 4096, 2, 132, "rs")
    assert a == make_plan(1000, 7168, 4096, 2, 132, "rs")
    for p in _plans("rs"):
        assert p.grid == p.world * p.chunk <= p.sm_count
        assert p.chunk <= max(p.list_len(o) for o in range(p.world))
        assert p.tiles_m * BM >= p.padded_M >= p.M
        assert p.padded_M % p.world == 0 and p.padded_M - p.M < p.world
        assert (p.tiles_n - 1) * p.bn < p.N <= p.tiles_n * p.bn
        assert p.N % p.bn == 0 or p.N % 128  # partial tiles only where no FULL_NS width fits


def test_bn_choice():
    rnd = dict(peers_first=False)
    assert make_plan(128, 7168, 1024, 2, 132, "rs", **rnd).bn == 128  # 28 tiles at BN=256: too few
    assert make_plan(8192, 7168, 1024, 2, 132, "rs").bn == 256
    assert make_plan(8192, 384, 1024, 2, 132, "rs").bn == 128  # 384 % 256 != 0
    # the last wave: 448 tiles of 256 give 26 of 66 lanes a fourth tile; 512 of 224 give all 4
    for mode in ("rs", "ar", "gemm"):
        assert make_plan(2048, 7168, 4096, 2, 132, mode).bn == 224
        assert make_plan(4096, 7168, 4096, 2, 132, mode).bn == 256  # 7 vs 8 tiles a lane
        assert make_plan(2048, 8192, 4096, 2, 132, mode).bn == 256  # 224 does not divide N
    # a forced width is kept; sm100 keeps its own rule
    assert make_plan(2048, 7168, 4096, 2, 132, "rs", bn=256).bn == 256
    assert make_plan(2048, 7168, 4096, 2, 132, "rs", arch="sm_100a").bn in (128, 256)


def test_bn_choice_is_the_cheapest_last_wave():
    """The width of least lane cost; the GEMM alone takes a width of FINE_NS only where it
    costs at most FINE_GAIN of that (ping-pong plans: test_gemm_pingpong_plans)."""
    from launch.geometry import FINE_NS
    from launch.rules import FINE_GAIN, lane_cost
    fine = 0
    for M, N, K, mode in itertools.product((300, 512, 1024, 2048, 3000, 8192), (7168, 8192, 1792),
                                           (1024, 4096), ("rs", "ar", "gemm")):
        p = make_plan(M, N, K, 2, 132, mode, pingpong=None)
        if p.bn == 64 or p.pingpong:
            continue  # choose_small_m's width, choose_gemm_pingpong's plans
        if p.bn in FINE_NS:
            assert mode == "gemm"
            fine += 1
            whole = make_plan(M, N, K, 2, 132, mode, bn=p.bn, cta_group=p.cta_group)
            others = [make_plan(M, N, K, 2, 132, mode, bn=b, cta_group=p.cta_group)
                      for b in (128, 224, 256) if N % b == 0]
            assert lane_cost(whole) == lane_cost(p) <= FINE_GAIN * min(map(lane_cost, others))
            continue
        others = [make_plan(M, N, K, 2, 132, mode, bn=b, cta_group=p.cta_group,
                            peers_first=p.peers_first) for b in (128, 224, 256) if N % b == 0]
        if mode != "gemm" and any(o.rounds - o.lag >= 2 for o in others):
            # fused: only widths that give every lane two tiles (pushes overlap the GEMM)
            assert p.rounds - p.lag >= 2
            others = [o for o in others if o.rounds - o.lag >= 2]
        assert lane_cost(p) == min(lane_cost(o) for o in others), (M, N, K, mode)
    assert fine  # 512 x 7168: 112 wide


def test_gemm_pingpong_plans():
    """``choose_gemm_pingpong``: the plain GEMM at K <= 1024 runs the ping-pong plan (2x1
    clusters, the width of least lane cost among PINGPONG_NS) from M=4096, and below it
    exactly where a lane has 3+ of its tiles and its lane cost, with a cooperative tile's
    epilogue hidden under all but a lane's last tile (PINGPONG_EPILOGUE), is below the plan
    the other rules chose; only where nothing else was forced and the caller lets the rule
    decide (``pingpong=None``)."""
    from launch.plan import _gemm_pingpong
    from launch.rules import PINGPONG_EPILOGUE, PINGPONG_MIN_ROUNDS, PINGPONG_NS, lane_cost
    chosen = set()
    for M, N in itertools.product((512, 1024, 1280, 1536, 2048, 2560, 3072, 4096, 4160, 6016,
                                   8192, 16384),
                                  (7168, 8192, 2880, 5120)):
        p = make_plan(M, N, 1024, 2, 132, "gemm", pingpong=None)
        coop = make_plan(M, N, 1024, 2, 132, "gemm")  # pingpong=False: the other rules
        assert not coop.pingpong
        pp = _gemm_pingpong(M, N, 1024, 2, 132, None)
        assert pp.pingpong and pp.cta_group == 2 and pp.bn in PINGPONG_NS
        assert lane_cost(pp) == min(lane_cost(make_plan(M, N, 1024, 2, 132, "gemm", bn=b,
                                                        cta_group=2)) for b in PINGPONG_NS)
        e = PINGPONG_EPILOGUE
        want = M >= 4096 or (pp.rounds >= PINGPONG_MIN_ROUNDS
                             and lane_cost(pp) * (1 + e / pp.rounds) <= lane_cost(coop) * (1 + e))
        assert p == (pp if want else coop), (M, N)
        if want:
            chosen.add((M, N))
        assert not make_plan(M, N, 1024, 2, 132, "gemm", pingpong=None, bn=256).pingpong
        assert not make_plan(M, N, 1024, 2, 132, "rs", pingpong=None).pingpong
        assert not make_plan(M, N, 2048, 2, 132, "gemm", pingpong=None).pingpong
    # the measured ones (docs/PERF.md (ai), (aq)): won at M 4096-16384 (N 5120 / 7168 /
    # 8192), from M=2048 at ratios <= 1.06 and at 2560 x 8192 (1.113, 7 tiles a lane);
    # lost at one or two tiles a lane and at 1536 x 7168 (1.109 at 4 tiles)
    assert {(M, N) for M in (4096, 8192, 16384) for N in (5120, 7168, 8192)} <= chosen
    assert {(2048, 7168), (2560, 7168), (3072, 7168), (1536, 8192), (2560, 8192),
            (3072, 8192), (1280, 7168), (2048, 5120)} <= chosen
    assert not chosen & {(512, 7168), (1024, 7168), (1024, 8192), (1536, 7168)}
    assert make_plan(16384, 7168, 1024, 2, 132, "gemm", pingpong=None).bn == 192


def test_gemm_split_one_round_rule():
    """``choose_gemm_split``: the plain GEMM's 64-row round at M <= 64 cut along K (a grid of
    tiles x pieces): below 64 rows, where x loads in boxes of M rows, at K >= 8192 with 5+
    pieces; at M=64 (or with the box turned off) at K >= 4096 with 5+ pieces, or 2+ at
    M <= 16; never where the caller forced ``sk``, a width or the rows, nor at K=1024, nor
    where no SM is left (N=8192: 74 tiles)."""
    from launch.rules import choose_gemm_split
    split, split_unboxed = set(), set()
    for M, N, K in itertools.product((1, 16, 17, 48, 63, 64, 65), (2880, 5120, 7168, 8192),
                                     (1024, 4096, 9216)):
        p = make_plan(M, N, K, 2, 132, "gemm")
        if M > 64:  # choose_gemm_rows64_pairs' plans: never cut
            assert p.cta_group == 2 and not p.sk
            continue
        units = -(-N // 112)
        pieces = min(132 // units, 8)
        assert p.bm == 64 and p.bn == 112 and p.num_units == units
        for x_box, cut in ((True, split), (False, split_unboxed)):
            p = make_plan(M, N, K, 2, 132, "gemm", x_box=x_box)
            want = choose_gemm_split(M, K, pieces, x_box and M < 64)
            assert p.sk == (pieces if want else 0)
            assert p.grid == (units * pieces if want else units)
            if want:
                cut.add((M, N, K))
        assert not make_plan(M, N, K, 2, 132, "gemm", sk=False).sk
        assert not make_plan(M, N, K, 2, 132, "gemm", bm=64, bn=112).sk
        assert not make_plan(M, N, K, 2, 132, "gemm", band=0).sk
    assert {(M, 2880, 9216) for M in (1, 16, 48, 63, 64)} <= split
    assert (64, 2880, 4096) in split and (16, 2880, 4096) not in split
    assert not any(K == 1024 or N == 8192 or (M < 64 and (K, N) != (9216, 2880))
                   for M, N, K in split)
    assert (1, 2880, 4096) in split_unboxed and (16, 7168, 4096) in split_unboxed
    assert not any(K == 1024 or N == 8192 or (M > 16 and N != 2880)
                   for M, N, K in split_unboxed)


@pytest.mark.parametrize("mode", ["rs", "ar"])
def test_small_m_choice(mode):
    """sm90 fused plans at small M: 64-wide tiles peers-first for one tile row (and two at
    K <= 2048), the peers-first order up to M=1024 at K <= 1024 (RS: from three tile rows
    at K <= 4096 too; AR: at three tile rows at any K), else the round order."""
    def pick(M, K, **kw):  # choose_small_m's plans (the split-K tail rule off)
        p = make_plan(M, 7168, K, 2, 132, mode, sk=False, **kw)
        return p.bn, p.peers_first
    one_row_long_k = (64, False) if mode == "ar" else (64, True)  # AR: pairs along N
    assert pick(1, 4096) == one_row_long_k and pick(128, 9216) == one_row_long_k
    assert pick(128, 1024) == (64, True)
    for M, K in itertools.product((1, 100, 128), (4096, 9216)):
        p = make_plan(M, 7168, K, 2, 132, mode)
        assert p.pair_n == (mode == "ar") and p.cta_group == (2 if mode == "ar" else 1)
    # N with an odd count of 64-wide tiles (N=192): the 1-CTA peers-first plan instead
    p = make_plan(128, 192, 9216, 2, 132, mode)
    assert not p.pair_n and p.cta_group == 1 and (p.bn, p.peers_first) == (64, True)
    assert pick(256, 1024) == (64, True) and pick(256, 4096) == (128, False)
    assert pick(256, 2048) == (64, True) and pick(512, 1024) == (128, True)
    assert pick(1024, 1024)[1] and pick(2048, 1024) == (224, False)
    assert pick(512, 1024)[1] is True
    rs = mode == "rs"  # RS: peers-first from three to eight tile rows at K <= 4096
    for M, K in itertools.product((385, 512, 1000, 1024), (2048, 4096)):
        assert pick(M, K)[1] is rs, (M, K)
    # three tile rows: peers-first for both at K <= 4096, for AR at any K
    for M, K in itertools.product((257, 320, 384), (2048, 4096, 9216)):
        assert pick(M, K)[1] is (not rs or K <= 4096), (M, K)
    assert pick(256, 4096) == (128, False) and pick(256, 9216)[1] is False
    assert pick(1025, 4096)[1] is False
    assert pick(512, 9216)[1] is False and pick(1024, 4097)[1] is False
    # anything forced keeps the old defaults for the rest
    assert pick(128, 1024, bn=128) == (128, False)
    assert pick(128, 1024, peers_first=False) == (128, False)
    assert pick(128, 1024, lag=0)[1] is False
    assert not make_plan(128, 7168, 1024, 2, 132, "gemm").peers_first
    assert not make_plan(128, 7168, 1024, 2, 132, mode, arch="sm_100a").peers_first


@pytest.mark.parametrize("world", WORLDS)
def test_rs_every_row_has_one_owner_and_tiles_span_owners(world):
    spans = 0
    for M in MS:
        p = make_plan(M, 384, 64, world, 132, "rs")
        owners = [p.row_owner(r) for r in range(p.padded_M)]
        for r in range(world):
            assert owners.count(r) == p.local_M
        for t in range(p.num_tiles):
            tm = t // p.tiles_n
            rows = range(tm * BM, min(tm * BM + BM, p.padded_M))
            assert sorted({p.row_owner(g) for g in rows}) == p.tile_owners(t)
            spans += len(p.tile_owners(t)) > 1
    if world > 2:
        assert spans > 0  # the suite does exercise tiles shared by several owners


@pytest.mark.parametrize("mode", ["rs", "ar"])
@pytest.mark.parametrize("world", WORLDS)
def test_receive_slots_unique_and_in_bounds(mode, world):
    for N in (128, 7168, *PARTIAL_N):
        bound_M = 8192
        for M in MS:
            p = make_plan(M, N, 64, world, 132, mode)
            bound = max_recv_slots(bound_M, N, world, p.bn)
            for o in range(world):
                slots = [p.recv_slot(o, t) for t in range(p.num_tiles) if o in p.tile_owners(t)]
                assert len(slots) == len(set(slots)), "two tiles share a receive slot"
                assert all(0 <= s < bound for s in slots), (M, o, slots[:3], bound)
            for src, o in itertools.product(range(world), repeat=2):
                if src != o:
                    assert 0 <= p.src_index(src, o, world) < world - 1
            assert len({p.src_index(s, 0, world) for s in range(1, world)}) == world - 1


@pytest.mark.parametrize("world", WORLDS)
def test_ar_ownership_balanced(world):
    for p in _plans("ar"):
        if p.world != world:
            continue
        counts = [0] * world
        for t in range(p.num_tiles):
            counts[p.tile_owner(t)] += 1
            assert p.ar_start(p.tile_owner(t)) <= t
        assert max(counts) - min(counts) <= 1
        assert sum(counts) == p.num_tiles


def _rounds_by_tile(p, rank):
    out = {}
    for c in range(p.grid):
        for r in range(p.rounds):
            t = p.scheduled(rank, c, r)
            if t >= 0:
                assert t not in out, f"tile {t} scheduled twice on rank {rank}"
                out[t] = r
    return out


def _assert_no_wait_cycle(p):
    """Every own-tile wait depends only on peers' pushes of the same or an earlier round."""
    rounds = [_rounds_by_tile(p, r) for r in range(p.world)]
    for r in range(p.world):
        for t, rr in rounds[r].items():
            if p.tile_owners(t) != [r]:
                continue
            for q in range(p.world):
                if q != r:
                    assert rounds[q][t] + p.lag <= rr, (p, r, q, t)


@pytest.mark.parametrize("mode", ["rs", "ar", "gemm"])
def test_schedule_covers_every_tile_once(mode):
    for p in _plans(mode):
        assert p.grid <= p.sm_count
        for rank in range(p.world if mode != "gemm" else 1):
            assert sorted(_rounds_by_tile(p, rank)) == list(range(p.num_tiles))


@pytest.mark.parametrize("mode", ["rs", "ar"])
def test_schedule_cannot_deadlock(mode):
    """A rank waits on one of its own tiles only for peers' pushes of the same or an
    earlier round (strictly earlier with lag 1): no cycle of waits can form."""
    for p in _plans(mode, Ns=(128, 7168, *PARTIAL_N)):
        _assert_no_wait_cycle(p)


def test_schedule_spreads_pushes_over_rounds():
    p = make_plan(8192, 7168, 1024, 2, 132, "rs")
    assert p.lag == 1 and p.rounds > 3
    for rank in range(2):
        per_round = [sum(1 for c in range(p.grid)
                         if p.scheduled(rank, c, r) >= 0
                         and rank not in p.tile_owners(p.scheduled(rank, c, r)))
                     for r in range(p.rounds)]
        busy = per_round[:-1]
        assert max(busy) - min(busy) <= p.chunk // 2, per_round


@pytest.mark.parametrize("bn, N", [(None, 256), (64, 256), (None, 200), (192, 1000)])
def test_simulated_exchange_sums_exactly(bn, N):
    """Run the push / reduce data movement of the unicast protocol on integers."""
    import random
    rng = random.Random(5)
    for mode, world, M in [("rs", 2, 300), ("rs", 4, 1000), ("rs", 8, 129), ("ar", 4, 700),
                           ("ar", 8, 1), ("rs", 16, 2048)]:
        p = make_plan(M, N, 64, world, 20, mode, bn=bn)
        part = {(r, g): rng.randint(-9, 9) for r in range(world) for g in range(p.padded_M)}
        recv = {}
        for src in range(world):
            for t in range(p.num_tiles):
                tm = t // p.tiles_n
                for g in range(tm * BM, min(tm * BM + BM, p.padded_M if mode == "rs" else M)):
                    o = p.row_owner(g) if mode == "rs" else p.tile_owner(t)
                    if o != src:
                        key = (o, p.src_index(src, o, world), p.recv_slot(o, t), g % BM)
                        assert key not in recv
                        recv[key] = part[(src, g)]
        for o in range(world):
            for t in range(p.num_tiles):
                if o not in p.tile_owners(t):
                    continue
                tm = t // p.tiles_n
                for g in range(tm * BM, min(tm * BM + BM, p.padded_M if mode == "rs" else M)):
                    if mode == "rs" and p.row_owner(g) != o:
                        continue
                    total = part[(o, g)] + sum(
                        recv[(o, s, p.recv_slot(o, t), g % BM)] for s in range(world - 1))
                    assert total == sum(part[(r, g)] for r in range(world))


# ---------------------------------------------------------------- sm100: 2-CTA pair schedule
from launch.rules import choose_sm100  # noqa: E402


def _cluster_tiles(p, rank):
    """(unit, even CTA's tile, odd CTA's tile) of every cluster and round that has a unit;
    a cluster without one has both CTAs idle."""
    for c in range(0, p.grid, 2):
        for r in range(p.rounds):
            u = p.scheduled_unit(rank, c // 2, r)
            a, b = p.scheduled(rank, c, r), p.scheduled(rank, c + 1, r)
            if u < 0:
                assert a == b == -1
                continue
            yield u, a, b


def _pair_plans(mode, Ns=(128, 384, 7168)):
    for world, M, N in itertools.product(WORLDS, MS, Ns):
        yield make_plan(M, N, 1024, world, 148, mode, arch="sm_100a", bn=128, cta_group=2)


def test_sm100_choice():
    assert choose_sm100(128, 7168, 1024) == (128, 1)      # one tile row: nothing to pair
    assert choose_sm100(256, 7168, 1024) == (128, 2)      # even tile rows
    assert choose_sm100(1000, 7168, 1024) == (128, 2)     # 8 tile rows: even
    assert choose_sm100(300, 7168, 1024) == (128, 1)      # 3 tile rows, M < 1024
    assert choose_sm100(1100, 7168, 1024)[1] == 2         # M >= 1024
    assert choose_sm100(8192, 7168, 4096) == (256, 2)     # M*K >= 24 Mi
    assert choose_sm100(8192, 384, 4096) == (128, 2)      # 384 % 256 != 0
    p = make_plan(8192, 7168, 4096, 2, 148, "rs", arch="sm_100a")
    assert (p.bn, p.cta_group, p.cluster_mn) == (256, 2, (2, 1))
    assert make_plan(8192, 7168, 1024, 2, 132, "rs").cta_group == 1  # sm90 unchanged


@pytest.mark.parametrize("mode", ["rs", "ar", "gemm"])
def test_pair_schedule_covers_every_tile_once(mode):
    for p in _pair_plans(mode):
        assert p.grid % 2 == 0 and 0 < p.grid <= p.sm_count
        assert p.lag == 0
        for rank in range(p.world if mode != "gemm" else 1):
            assert sorted(_rounds_by_tile(p, rank)) == list(range(p.num_tiles))
            # the two CTAs of a cluster get the two vertically adjacent tiles of one pair
            for u, a, b in _cluster_tiles(p, rank):
                pm, tn = divmod(u, p.tiles_n)
                assert a == 2 * pm * p.tiles_n + tn
                assert b == (a + p.tiles_n if 2 * pm + 1 < p.tiles_m else -1)


@pytest.mark.parametrize("mode", ["rs", "ar"])
def test_pair_schedule_cannot_deadlock(mode):
    for p in _pair_plans(mode, Ns=(128, 7168)):
        _assert_no_wait_cycle(p)


def test_pair_unit_lists_partition_the_pairs():
    for mode in ("rs", "ar"):
        for p in _pair_plans(mode, Ns=(128, 384)):
            starts = [p.unit_list_start(o) for o in range(p.world + 1)]
            assert starts[0] == 0 and starts[-1] == p.num_units
            assert starts == sorted(starts)


def test_pair_plan_respects_resident_clusters():
    full = make_plan(8192, 7168, 4096, 2, 148, "rs", arch="sm_100a", cta_group=2)
    capped = make_plan(8192, 7168, 4096, 2, 148, "rs", arch="sm_100a", cta_group=2, pair_ctas=132)
    assert capped.grid <= 132 < full.grid
    assert capped.grid % 2 == 0


@pytest.mark.parametrize("band", [0, 1, 3, 4, 8, 64])
def test_band_swizzle_is_a_permutation(band):
    from launch.geometry import band_swizzle
    for tiles_m, tiles_n in [(1, 1), (5, 3), (64, 28), (7, 56), (13, 2)]:
        T = tiles_m * tiles_n
        order = [band_swizzle(i, tiles_m, tiles_n, band) for i in range(T)]
        assert sorted(order) == list(range(T))
        if 1 < band < tiles_m:
            # consecutive items walk down a band's rows before moving a column right
            assert order[1] == tiles_n


@pytest.mark.parametrize("lag", [0, 1])
def test_forced_lag_keeps_coverage_and_no_wait_cycle(lag):
    for world, M in itertools.product(WORLDS, (129, 1000, 4095, 8192)):
        for mode in ("rs", "ar"):
            p = make_plan(M, 7168, 1024, world, 132, mode, lag=lag)
            assert p.lag == lag and p.rounds == -(-max(p.list_len(o) for o in range(world)) // p.chunk) + lag
            for rank in range(world):
                assert sorted(_rounds_by_tile(p, rank)) == list(range(p.num_tiles))
            _assert_no_wait_cycle(p)
    with pytest.raises(ValueError, match="lag"):
        make_plan(1000, 7168, 1024, 2, 132, "rs", lag=2)


@pytest.mark.parametrize("mode", ["rs", "ar"])
def test_peers_first_covers_every_tile_and_waits_only_on_earlier_rounds(mode):
    for world, M in itertools.product(WORLDS, (1, 129, 300, 1000, 4095, 8192)):
        p = make_plan(M, 7168, 1024, world, 132, mode, peers_first=True)
        assert p.peers_first and p.lag == 0 and p.sched_word & 0xff == 0
        assert p.grid == p.chunk <= 132
        longest = max(p.list_len(o) for o in range(world))
        assert p.rounds == world * -(-longest // p.chunk)
        for rank in range(world):
            assert sorted(_rounds_by_tile(p, rank)) == list(range(p.num_tiles))
        # strictly earlier: a peer pushes an own tile in a round before its owner reduces it
        rounds = [_rounds_by_tile(p, r) for r in range(world)]
        for r in range(world):
            for t, rr in rounds[r].items():
                if p.tile_owners(t) == [r]:
                    assert all(rounds[q][t] < rr for q in range(world) if q != r), (p, r, t)
                    assert rr % world == world - 1
        # round 0: every lane that has work computes a tile of the next peer's list
        for rank in range(world):
            firsts = [t for t in (p.scheduled(rank, c, 0) for c in range(p.grid)) if t >= 0]
            assert len(firsts) == min(p.chunk, p.list_len((rank + 1) % world))
            assert all(p.tile_owners(t) != [rank] for t in firsts)


def test_peers_first_refuses_what_it_cannot_combine():
    with pytest.raises(ValueError, match="lag 0"):
        make_plan(1000, 7168, 1024, 2, 132, "ar", peers_first=True, lag=1)
    with pytest.raises(ValueError, match="needs pairs along N"):
        make_plan(1000, 7168, 1024, 2, 132, "rs", peers_first=True, cta_group=2)
    g = make_plan(1000, 7168, 1024, 2, 132, "gemm", peers_first=True)  # no exchange to order
    assert not g.peers_first and g == make_plan(1000, 7168, 1024, 2, 132, "gemm")


@pytest.mark.parametrize("mode", ["rs", "ar"])
@pytest.mark.parametrize("peers_first", [False, True])
def test_narrow_tiles_keep_coverage_and_no_wait_cycle(mode, peers_first):
    from launch.layout import WorkspaceLayout
    for world, M in itertools.product(WORLDS, (1, 129, 300, 1000, 4095)):
        p = make_plan(M, 7168, 1024, world, 132, mode, bn=64, peers_first=peers_first)
        assert p.bn == 64 and p.tiles_n == 112
        for rank in range(world):
            assert sorted(_rounds_by_tile(p, rank)) == list(range(p.num_tiles))
        _assert_no_wait_cycle(p)
        lay = WorkspaceLayout.build(4096, 7168, world)
        assert p.num_tiles <= lay.max_tiles
        slots = max(p.recv_slot(o, t) for t in range(p.num_tiles) for o in p.tile_owners(t))
        assert (slots + 1) * p.tile_bytes <= lay.recv_region_bytes


def test_tile_width_must_be_known_and_fit_n():
    with pytest.raises(ValueError, match="BN"):
        make_plan(256, 7168, 1024, 2, 132, "rs", bn=32)
    # sm90 takes a partial last tile column; sm100 only whole tiles
    assert make_plan(256, 384, 1024, 2, 132, "rs", bn=256).tiles_n == 2
    with pytest.raises(ValueError, match="multiple of 256"):
        make_plan(256, 384, 1024, 2, 132, "rs", bn=256, arch="sm_100a")
    with pytest.raises(ValueError, match="multiple of 8"):
        make_plan(256, 7172, 1024, 2, 132, "rs", bn=128)


@pytest.mark.parametrize("band", [0, 1, 3, 8, 64])
def test_list_swizzle_is_a_permutation_of_any_list(band):
    from launch.geometry import list_swizzle
    for length, tiles_n in [(0, 4), (1, 4), (5, 3), (17, 4), (56, 28), (1795, 28), (7, 56)]:
        order = [list_swizzle(i, length, tiles_n, band) for i in range(length)]
        assert sorted(order) == list(range(length))
        full = length // tiles_n * tiles_n
        assert order[full:] == list(range(full, length))  # the partial last row stays in order


def test_default_band_and_its_schedule_word():
    from launch.rules import BAND_TILE_ROWS
    p = make_plan(8192, 7168, 4096, 2, 132, "rs", cta_group=1)
    assert p.band == BAND_TILE_ROWS and p.sched_word == p.lag | (BAND_TILE_ROWS << 8)
    assert make_plan(8192, 7168, 4096, 2, 132, "rs", cta_group=2).band == BAND_TILE_ROWS // 2
    assert make_plan(8192, 7168, 1024, 2, 132, "rs").band == 0  # short K: all of it fits L2
    g = make_plan(8192, 7168, 4096, 2, 132, "gemm")  # the plain GEMM pairs tile rows
    assert g.cta_group == 2 and g.band == BAND_TILE_ROWS // 2
    assert make_plan(128, 7168, 4096, 2, 132, "gemm", bm=128).cta_group == 1  # one tile row
    assert make_plan(8192, 7168, 1024, 2, 132, "gemm").cta_group == 1
    assert make_plan(8192, 7168, 4096, 2, 132, "gemm", cta_group=1).cta_group == 1
    assert make_plan(8192, 7168, 4096, 2, 132, "gemm", band=0).sched_word == 0
    r = make_plan(4095, 7168, 1024, 4, 132, "ar", band=5, lag=1)
    assert r.sched_word == 1 | (5 << 8)
    for bad in (-1, 256, 2.0, "8"):
        with pytest.raises(ValueError, match="band"):
            make_plan(1000, 7168, 1024, 2, 132, "rs", band=bad)


@pytest.mark.parametrize("mode", ["rs", "ar", "gemm"])
@pytest.mark.parametrize("band", [0, 3, None])
def test_banded_orders_keep_coverage_and_no_wait_cycle(mode, band):
    """The band permutes positions inside each list: every schedule kind (round order with
    and without lag, peers-first, 2x1 pairs) still covers every tile once per
    rank, and an own tile still waits only on peers' same-or-earlier rounds."""
    kinds = [dict(), dict(lag=0), dict(peers_first=True),
             dict(cta_group=2, arch="sm_100a")]
    for world, M, N, kw in itertools.product((2, 3, 4), (1, 129, 1000, 4095, 8192),
                                             (384, 7168), kinds):
        if mode == "gemm" and kw.get("peers_first"):
            continue
        p = make_plan(M, N, 1024, world, 132, mode, band=band, **kw)
        for rank in range(world if mode != "gemm" else 1):
            assert sorted(_rounds_by_tile(p, rank)) == list(range(p.num_tiles)), (p, rank)
        if mode != "gemm":
            _assert_no_wait_cycle(p)
    # a banded order really differs from row-major where a list spans several rows
    a = make_plan(8192, 7168, 1024, 2, 132, "rs", band=0)
    b = make_plan(8192, 7168, 1024, 2, 132, "rs", band=16)
    assert [a.scheduled(0, c, 1) for c in range(a.grid)] != [b.scheduled(0, c, 1) for c in range(b.grid)]


@pytest.mark.parametrize("mode", ["rs", "ar"])
def test_pair_schedule_with_lag_where_no_pair_straddles_owners(mode):
    """2x1 clusters take the lag round only where every pair-tile has one owner; there the
    1-CTA argument holds: every tile once per rank, own tiles wait only on earlier rounds."""
    from launch.geometry import pairs_whole
    taken = 0
    for world, M, N in itertools.product((2, 3, 4), (512, 1000, 2048, 4096, 8192, 12288),
                                         (384, 7168)):
        p0 = make_plan(M, N, 1024, world, 132, mode, arch="sm_100a", cta_group=2)
        assert p0.lag == 0  # the default stays lag 0
        if not pairs_whole(p0):
            with pytest.raises(ValueError, match="straddle"):
                make_plan(M, N, 1024, world, 132, mode, arch="sm_100a", cta_group=2, lag=1)
            continue
        p = make_plan(M, N, 1024, world, 132, mode, arch="sm_100a", cta_group=2, lag=1)
        assert p.lag == 1 and p.rounds == p0.rounds + 1 and p.sched_word & 1
        for rank in range(world):
            assert sorted(_rounds_by_tile(p, rank)) == list(range(p.num_tiles))
            for t in range(p.num_tiles):  # pairs_whole: one owner per tile, its list's
                assert len(p.tile_owners(t)) == 1
        _assert_no_wait_cycle(p)
        taken += 1
    assert taken >= 10
    with pytest.raises(ValueError, match="lag"):
        make_plan(4096, 7168, 1024, 2, 132, mode, cta_group=2, lag=2)


def test_fused_plans_pair_tile_rows_with_the_lag_round_at_long_k():
    from launch.geometry import pairs_whole
    for mode in ("rs", "ar"):
        p = make_plan(8192, 7168, 9216, 2, 132, mode)
        assert (p.cta_group, p.lag, p.band) == (2, 1, 8) and pairs_whole(p)
        assert make_plan(8192, 7168, 1024, 2, 132, mode).cta_group == 1  # link-bound K
        # few tiles per lane: no lag round (2x1 clusters without it there)
        assert make_plan(1024, 7168, 9216, 2, 132, mode).lag == 0
        # the width is still the lane_cost pick among the widths the pairs allow
        assert make_plan(2048, 7168, 9216, 2, 132, "rs").bn == 224
    # AR at M=2048: the lag round measured 4% slower (PERF.md (e)), 2x1 without it 0-3% faster
    p = make_plan(2048, 7168, 9216, 2, 132, "ar")
    assert (p.cta_group, p.lag) == (2, 0)
    # local_M = 1500 is no multiple of 256: a pair would straddle two owners
    assert make_plan(3000, 7168, 9216, 2, 132, "rs").cta_group == 1
    # one chunk per list: the lag round would cost a whole round, the 1-CTA plan has none
    q = make_plan(4096, 384, 4096, 2, 132, "rs")
    assert q.cta_group == 1 and q.lag == 0
    # the occupancy limit of 2x1 clusters still applies
    r = make_plan(16384, 7168, 9216, 2, 132, "rs", pair_ctas=120)
    assert r.cta_group == 2 and r.grid <= 120
    # forcing lag 1 on pairs keeps only the widths whose pairs are whole, else says why
    with pytest.raises(ValueError, match="straddle"):
        make_plan(3000, 7168, 9216, 2, 132, "rs", cta_group=2, lag=1)


def _pair_n_plans(mode, Ns=(256, 7168), bns=(64, 128)):
    for world, M, N, bn in itertools.product(WORLDS, MS, Ns, bns):
        if (N // bn) % 2 == 0:
            yield make_plan(M, N, 4096, world, 132, mode, bn=bn, pair_n=True)


@pytest.mark.parametrize("mode", ["rs", "ar", "gemm"])
def test_pairs_along_n_cover_every_tile_once_two_neighbours_per_cluster(mode):
    n = 0
    for p in _pair_n_plans(mode):
        assert p.pair_n and p.cta_group == 2 and p.cluster_mn == (1, 2)
        assert p.grid % 2 == 0 and 0 < p.grid <= p.sm_count
        for rank in range(p.world if mode != "gemm" else 1):
            assert sorted(_rounds_by_tile(p, rank)) == list(range(p.num_tiles))
            for u, a, b in _cluster_tiles(p, rank):
                # one tile row, adjacent columns: the x tile both CTAs share
                assert (a, b) == (2 * u, 2 * u + 1) and a // p.tiles_n == b // p.tiles_n
        n += 1
    assert n > 50


@pytest.mark.parametrize("mode", ["rs", "ar"])
def test_pairs_along_n_cannot_deadlock_and_take_the_lag_round_where_whole(mode):
    from launch.geometry import pairs_whole
    lagged = 0
    for p in _pair_n_plans(mode):
        _assert_no_wait_cycle(p)
        if mode == "rs":
            assert pairs_whole(p)  # RS lists are whole tile rows: never a straddling pair
        if p.lag:
            assert pairs_whole(p) and p.rounds - p.lag >= 3
            lagged += 1
    assert lagged > 10


def test_pairs_along_n_refuse_what_they_cannot_combine():
    with pytest.raises(ValueError, match="even number of tile columns"):
        make_plan(1000, 384, 4096, 2, 132, "rs", bn=128, pair_n=True)
    for kw in ({"cta_group": 1}, {"arch": "sm_100a"}):
        with pytest.raises(ValueError, match="pairs along N"):
            make_plan(1000, 7168, 4096, 2, 132, "rs", pair_n=True, **kw)
    p = make_plan(1000, 7168, 4096, 2, 132, "rs", pair_n=True)
    assert p.pair_n and p.N % p.bn == 0 and p.tiles_n % 2 == 0
    assert not make_plan(1000, 7168, 4096, 2, 132, "rs").pair_n  # opt-in only


@pytest.mark.parametrize("mode", ["rs", "ar"])
def test_pairs_along_n_peers_first_fill_the_grid_and_wait_only_on_earlier_rounds(mode):
    """The peers-first order on pairs along N: every cluster is a lane of every round (one
    RS tile row holds every rank's rows, so the round order would leave half the grid idle),
    each tile once per rank, and an own tile reduced only after its peers' earlier round."""
    from launch.geometry import pairs_whole
    n = 0
    for world, M, N, bn in itertools.product(WORLDS, MS, (256, 7168, 8192), (64, 128)):
        if (N // bn) % 2:
            continue
        base = make_plan(M, N, 4096, world, 132, mode, bn=bn, pair_n=True)
        if not pairs_whole(base):
            with pytest.raises(ValueError, match="straddle"):
                make_plan(M, N, 4096, world, 132, mode, bn=bn, pair_n=True, peers_first=True)
            continue
        p = make_plan(M, N, 4096, world, 132, mode, bn=bn, pair_n=True, peers_first=True)
        assert p.pair_n and p.peers_first and p.lag == 0 and p.cta_group == 2
        assert p.grid == 2 * p.chunk <= p.sm_count
        assert p.chunk == min(p.sm_count // 2, p.longest_units)
        assert p.rounds == world * -(-p.longest_units // p.chunk)
        rounds = [_rounds_by_tile(p, r) for r in range(world)]
        for r in range(world):
            assert sorted(rounds[r]) == list(range(p.num_tiles))
            for u, a, b in _cluster_tiles(p, r):
                assert (a, b) == (2 * u, 2 * u + 1) and a // p.tiles_n == b // p.tiles_n
            for t, rr in rounds[r].items():
                if p.tile_owners(t) == [r]:
                    assert all(rounds[q][t] < rr for q in range(world) if q != r), (p, r, t)
        n += 1
    assert n > 100
    with pytest.raises(ValueError, match="lag 0"):
        make_plan(1000, 7168, 4096, 2, 132, mode, pair_n=True, peers_first=True, lag=1)


@pytest.mark.parametrize("mode", ["rs", "ar"])
def test_fused_cluster_choice(mode):
    """2x1 clusters: with the lag round at large M and long K (where it is whole and 3+
    rounds hide it), without it from 4 tile rows (AR from K=4096, RS at K > 4096) where no
    pair straddles two owners, 1-CTA elsewhere."""
    from launch.rules import choose_fused_cluster
    from launch.geometry import pairs_whole

    def kind(M, K, N=7168):
        p = make_plan(M, N, K, 2, 132, mode, pair_ctas=132)
        if p.cta_group == 2:
            assert pairs_whole(p)
            return 2, p.lag
        return 1, None
    assert kind(8192, 9216) == (2, 1) and kind(4096, 4096) == (2, 1)
    for M in (512, 1024, 1536):
        assert kind(M, 9216) == (2, 0) and kind(M, 9216, 8192) == (2, 0)
        assert kind(M, 4096) == ((2, 0) if mode == "ar" else (1, None))
    assert kind(2048, 9216) == ((2, 0) if mode == "ar" else (2, 1))
    for M in (640, 768):  # a pair would straddle two owners there: measured slower
        assert kind(M, 9216) == (1, None) and kind(M, 9216, 8192) == (1, None)
    for M in (256, 384, 512, 2048):
        assert kind(M, 1024)[0] == 1  # K=1024 stays 1-CTA below the lag-round range
    assert kind(256, 9216) == (1, None)
    assert choose_fused_cluster(2048, 4096, "ar") == 0
    assert choose_fused_cluster(2048, 4096, "rs") == 1
    assert choose_fused_cluster(512, 1024, "ar") is None


@pytest.mark.parametrize("mode", ["rs", "ar"])
def test_default_plans_cover_every_tile_and_cannot_deadlock(mode):
    """Whatever the sm90 heuristics pick (1-CTA, 2x1 clusters with or without lag, pairs
    along N, peers-first, any width), at every world size: each tile once per rank, the grid
    resident, and no cycle of waits."""
    kinds = set()
    for world, M, K, N in itertools.product(WORLDS, (1, 100, 128, 129, 256, 300, 512, 768,
                                                     1000, 1024, 2048, 4096),
                                            (1024, 4096, 9216), (384, 7168, 8192, 2880)):
        p = make_plan(M, N, K, world, 132, mode, pair_ctas=132)
        kinds.add((p.cta_group, p.lag, p.pair_n, p.peers_first, p.bn))
        assert p.grid <= p.sm_count and p.grid % p.cta_group == 0
        for rank in range(world):
            assert sorted(_rounds_by_tile(p, rank)) == list(range(p.num_tiles)), p
        _assert_no_wait_cycle(p)
    # every kind of plan the heuristics have is in this sweep
    assert {(cg, lag, pn) for cg, lag, pn, _, _ in kinds} >= (
        {(1, 0, False), (1, 1, False), (2, 0, False), (2, 1, False)}
        | ({(2, 0, True)} if mode == "ar" else set()))
    assert any(pf for _, _, _, pf, _ in kinds)


# ---------------------------------------------------------------- push-all AR
from launch.geometry import PUSH_ALL_MAX_M  # noqa: E402


def _push_all_plans():
    for M, K, N in itertools.product((1, 100, 128, 129, 256, 300, 512, 1000, 1024),
                                     (64, 1024, 9216), (384, 7168, 8192)):
        yield make_plan(M, N, K, 2, 132, "ar", push_all=True)
    for bn in (64, 128, 224, 256):
        yield make_plan(700, 7168, 1024, 2, 132, "ar", push_all=True, bn=bn)


def test_push_all_covers_every_tile_once_per_rank_in_the_flat_order():
    for p in _push_all_plans():
        assert p.push_all and p.mode == "ar" and p.cta_group == 1 and p.lag == 0
        assert p.grid <= p.sm_count and not p.peers_first
        for rank in range(p.world):
            assert sorted(_rounds_by_tile(p, rank)) == list(range(p.num_tiles)), p
            # every rank computes a tile in the same round as its peers (the flat order)
            assert _rounds_by_tile(p, rank) == _rounds_by_tile(p, 0)
        # every rank receives every tile: no tile is owned by one rank alone, so every
        # reduction waits until the CTA's last push (the RS shared-tile argument)
        assert all(p.tile_owners(t) == list(range(p.world)) for t in range(p.num_tiles))


def test_push_all_width_and_receive_slots():
    assert make_plan(128, 7168, 1024, 2, 132, "ar", push_all=True).bn == 64  # 112 tiles
    assert make_plan(512, 7168, 1024, 2, 132, "ar", push_all=True).bn != 64  # 448 would not fit
    for p in _push_all_plans():
        bound = max_recv_slots(max(p.M, 1024), p.N, p.world, p.bn)
        for o in range(p.world):
            slots = [p.recv_slot(o, t) for t in range(p.num_tiles)]
            assert slots == list(range(p.num_tiles)) and max(slots) < bound


def test_push_all_simulated_exchange_sums_exactly():
    import random
    rng = random.Random(11)
    for world, M in [(2, 300), (2, 129), (2, 1)]:
        p = make_plan(M, 128, 64, world, 20, "ar", push_all=True)
        part = {(r, g, c): rng.randint(-9, 9) for r in range(world) for g in range(M)
                for c in range(p.N)}
        recv = {}
        for src in range(world):
            for t in range(p.num_tiles):
                tm, tn = divmod(t, p.tiles_n)
                for o in range(world):
                    if o == src:
                        continue
                    for g in range(tm * BM, min(tm * BM + BM, M)):
                        for c in range(tn * p.bn, (tn + 1) * p.bn):
                            key = (o, p.src_index(src, o, world), p.recv_slot(o, t), g % BM, c % p.bn)
                            assert key not in recv
                            recv[key] = part[(src, g, c)]
        for o in range(world):
            for t in range(p.num_tiles):
                tm, tn = divmod(t, p.tiles_n)
                for g in range(tm * BM, min(tm * BM + BM, M)):
                    for c in range(tn * p.bn, (tn + 1) * p.bn):
                        total = part[(o, g, c)] + sum(
                            recv[(o, s, p.recv_slot(o, t), g % BM, c % p.bn)]
                            for s in range(world - 1))
                        assert total == sum(part[(r, g, c)] for r in range(world))


def test_push_all_refuses_what_it_cannot_combine():
    ok = dict(M=512, N=7168, K=1024, world=2, sm_count=132, mode="ar")
    for kw in (dict(mode="rs"), dict(mode="gemm"), dict(M=PUSH_ALL_MAX_M + 1),
               dict(arch="sm_100a"), dict(cta_group=2), dict(lag=1),
               dict(peers_first=True), dict(pair_n=True), dict(world=4)):
        args = dict(ok)
        args.update(kw)
        with pytest.raises(ValueError, match="push-all|pairs along N|world-2"):
            make_plan(args.pop("M"), args.pop("N"), args.pop("K"), args.pop("world"),
                      args.pop("sm_count"), args.pop("mode"), push_all=True, **args)
    # the workspace holds every tile's slot up to PUSH_ALL_MAX_M at any max_M
    assert max_recv_slots(8192, 7168, 2, 64) >= (PUSH_ALL_MAX_M // BM) * 112


def test_receive_regions_hold_push_all_slots():
    """Every slot a push-all plan (AR, world 2, M <= PUSH_ALL_MAX_M) can address lies inside
    the receive region, for any max_M from the call's M up."""
    from launch.layout import WorkspaceLayout
    for N, K in itertools.product((384, 7168, 8192), (64, 1024, 9216)):
        for M in (1, 129, 512, 1000, 1024):
            p = make_plan(M, N, K, 2, 132, "ar", push_all=True)
            for max_M in (M, 1024, 8192):
                assert p.num_tiles * p.tile_bytes <= WorkspaceLayout.build(max_M, N, 2).recv_region_bytes


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("cta_group", [1, 2])
def test_early_copies_cover_every_result_once_and_wait_on_earlier_rounds(world, cta_group):
    """AR with the lag round copies results back early (``CommWarps._copy_back_round``): the
    CTA that computed tile t in round r copies t's result in round r + 2 (or after its last
    round) when another rank owns t. Those copies take every tile other ranks own exactly
    once, and each waits on an owner that reduced t before round r + 2: the owner's round is
    r + lag = r + 1, whose waits are on pushes of round r, stamped before the copier gets
    to round r + 2."""
    for M, K in [(2048, 1024), (4096, 1024), (8191, 4096), (16384, 9216)]:
        p = make_plan(M, 7168, K, world, 132, "ar", cta_group=cta_group, lag=1)
        assert p.lag == 1
        rounds = [_rounds_by_tile(p, r) for r in range(world)]
        for rank in range(world):
            copied = []
            for c in range(p.grid):
                for r in range(p.rounds):
                    t = p.scheduled(rank, c, r)
                    if t >= 0 and p.tile_owner(t) != rank:
                        copied.append(t)
                        owner = p.tile_owner(t)
                        assert rounds[owner][t] == r + p.lag < r + 2
            assert sorted(copied) == [t for t in range(p.num_tiles) if p.tile_owner(t) != rank]


@pytest.mark.parametrize("mode", ["rs", "ar"])
@pytest.mark.parametrize("band", [0, None])
def test_flat_peers_first_covers_every_tile_and_waits_only_on_pushes(mode, band):
    """The flat peers-first order (``TilePlan.flat``): every rank computes every tile once in
    ceil(units / chunk) rounds, and an own tile's wait points at a peer's position no later
    than its own, inside the peer's run of peers' lists, where every unit is a push."""
    for world, M, N in itertools.product((2, 3, 4), (1, 129, 300, 576, 1000, 4095, 8192),
                                         (384, 7168)):
        p = make_plan(M, N, 4096, world, 132, mode, band=band, flat=True)
        assert p.flat and p.peers_first and p.cta_group == 1 and p.lag == 0
        assert p.grid == p.chunk <= 132 and p.rounds == -(-p.num_units // p.chunk)
        pos = []
        for rank in range(world):
            at = {}
            for r in range(p.rounds):
                for c in range(p.grid):
                    t = p.scheduled(rank, c, r)
                    if t >= 0:
                        assert t not in at, (p, rank, t)
                        at[t] = r * p.chunk + c
            assert sorted(at) == list(range(p.num_tiles)), (p, rank)
            pos.append(at)
        for r in range(world):
            own_from = p.num_units - p.list_len(r)  # where r's own list starts in its order
            for t, here in pos[r].items():
                if p.tile_owners(t) == [r]:
                    assert here >= own_from, (p, r, t)
                    for q in range(world):
                        if q != r:
                            peer_own_from = p.num_units - p.list_len(q)
                            assert pos[q][t] <= here and pos[q][t] < peer_own_from, (p, r, q, t)


def test_flat_peers_first_uses_fewer_rounds_where_lists_are_uneven():
    flat = make_plan(576, 7168, 4096, 2, 132, "rs", bn=128, flat=True)
    per_list = make_plan(576, 7168, 4096, 2, 132, "rs", bn=128, peers_first=True, cta_group=1)
    assert flat.rounds == 3 and per_list.rounds == 4
    even = make_plan(512, 7168, 4096, 2, 132, "rs", bn=128, flat=True)
    assert even.rounds == 2 and even.grid == 132


def test_flat_peers_first_refuses_what_it_cannot_combine():
    for kw in (dict(cta_group=2), dict(lag=1), dict(pair_n=True),
               dict(peers_first=False), dict(arch="sm_100a")):
        with pytest.raises(ValueError, match="flat"):
            make_plan(1000, 7168, 1024, 2, 132, "rs", flat=True, **kw)
    g = make_plan(1000, 7168, 1024, 2, 132, "gemm", flat=True)  # no exchange to order
    assert not g.flat and g == make_plan(1000, 7168, 1024, 2, 132, "gemm")
    a = make_plan(128, 7168, 1024, 2, 132, "ar", flat=True, push_all=None)
    assert a.flat and not a.push_all


@pytest.mark.parametrize("mode,kw", [("rs", {"flat": True}), ("ar", {"flat": True}),
                                     ("gemm", {})])
def test_split_k_tail_covers_every_unit_once(mode, kw):
    """``TilePlan.sk``: every tile finished once per rank; the last round's units cut into
    S pieces on S neighbouring lanes that cover K in order, the first piece the finishing
    one; the rounds before as in the plain plan; no partial round or too few k-tiles: the
    plain plan. The plain GEMM's one partial round of R units: a grid of R * S lanes."""
    widened = 0
    for M, N, K in [(576, 7168, 4096), (700, 8192, 9216), (1152, 7168, 2048), (300, 7168, 64),
                    (3000, 8192, 4160), (2048, 7168, 1024), (128, 7168, 4096), (200, 7168, 128),
                    (256, 7168, 9216), (1, 2880, 9216), (64, 5120, 1024), (40, 1000, 4096)]:
        for world, bm in ((2, None), (4, None), (2, 64)):
            if bm and mode != "gemm":
                continue
            p = make_plan(M, N, K, world, 132, mode, sk=True, bm=bm, **kw)
            plain = make_plan(M, N, K, world, 132, mode, bm=bm, **kw,
                              **({"cta_group": 1} if mode == "gemm" else {}))
            kt = -(-K // 64)
            one = mode == "gemm" and plain.rounds == 1 and plain.num_units < 132
            s = min(132 // plain.num_units, 8, kt) if one else 0
            if one and s >= 2:
                assert p.grid == p.chunk == plain.num_units * s and p.rounds == 1
                widened += 1
            f, r = divmod(p.num_units, p.chunk)
            if r == 0 or min(p.chunk // r, 8, kt) < 2:
                assert p == plain
                continue
            s = min(p.chunk // r, 8, kt)
            assert p.sk == s and p.rounds == plain.rounds == f + 1 and p.k_tiles == kt
            for rank in range(world):
                finished, pieces = [], {}
                for c in range(p.grid):
                    for rnd in range(p.rounds):
                        pos, lo, hi = p.segment(c, rnd)
                        if rnd < f:
                            assert (lo, hi) == (0, kt)
                            assert p.scheduled(rank, c, rnd) == plain.scheduled(rank, c, rnd)
                        if pos < 0:
                            continue
                        pieces.setdefault(p.scheduled_unit(rank, c, rnd), []).append((lo, hi, c))
                        t = p.scheduled(rank, c, rnd)
                        assert (t >= 0) == (lo == 0)
                        if t >= 0:
                            finished.append(t)
                assert sorted(finished) == list(range(p.num_tiles))
                for u, segs in pieces.items():
                    segs.sort()
                    assert [x[0] for x in segs] == [0] + [x[1] for x in segs[:-1]]
                    assert segs[-1][1] == kt and len(segs) in (1, s)
                    if len(segs) == s:
                        assert [x[2] for x in segs] == list(range(segs[0][2], segs[0][2] + s))
    assert (widened > 0) == (mode == "gemm")


def test_split_k_tail_refuses_orders_it_cannot_cut():
    with pytest.raises(ValueError, match="split-K"):
        make_plan(2048, 7168, 4096, 2, 132, "rs", sk=True)  # the round order
    with pytest.raises(ValueError, match="split-K"):
        make_plan(4096, 7168, 4096, 2, 132, "gemm", sk=True, cta_group=2)
    with pytest.raises(ValueError, match="split-K"):
        make_plan(576, 7168, 4096, 2, 132, "gemm", sk=True, arch="sm_100a")


def test_split_k_slots_fit_the_workspace():
    """Every lane that stores a split-K piece (``TilePlan.sk``) has its slot, at its width,
    inside the SK region (before ARRIVE), for any max_M from the call's M up."""
    from launch.layout import SK_SLOTS_OFF, WorkspaceLayout
    for N, K in itertools.product((384, 7168, 8192, *PARTIAL_N), (1024, 9216)):
        for M in (1, 129, 300, 576, 640, 1152, 3000):
            for mode, kw in (("rs", {"flat": True}), ("ar", {"flat": True}), ("gemm", {})):
                for bn, bm in itertools.product((None, 64, 112, 128, 160, 192, 256),
                                                (None, 64)):
                    if bm and mode != "gemm":
                        continue
                    p = make_plan(M, N, K, 2, 132, mode, sk=True, bn=bn, bm=bm, **kw)
                    if not p.sk:
                        continue
                    lanes = [c for c in range(p.grid) for r in range(p.rounds)
                             if p.segment(c, r)[1] > 0]
                    for max_M in (M, 8192):
                        lay = WorkspaceLayout.build(max_M, N, 2)
                        end = SK_SLOTS_OFF + (max(lanes) + 1) * p.bm * p.bn * 4
                        assert end <= lay.arrive_off, (M, N, K, mode, bn, bm, max_M)


# ---------------------------------------------------------------- RS lists at a shared tile row
def test_split_row_moves_only_shared_tiles_and_keeps_coverage():
    """``split_row``: where owners o-1 and o share a tile row, the RS 1-CTA round order can
    split that row's tiles between their lists; tiles only one rank owns stay in that rank's
    list, the boundary moves only inside the shared row, every tile is still scheduled once
    per rank and no wait closes a cycle."""
    seen = 0
    for world, M, N in itertools.product((2, 3, 4), (200, 1000, 1152, 2900, 4095),
                                         (384, 7168, 8192)):
        p = make_plan(M, N, 1024, world, 132, "rs", peers_first=False, cta_group=1,
                      split_row=True)
        q = make_plan(M, N, 1024, world, 132, "rs", peers_first=False, cta_group=1,
                      bn=p.bn, split_row=False)
        assert not q.split_row
        if not p.split_row:
            assert not p.can_split_row and p.bn == 128 or not any(
                o * p.local_M % BM for o in range(1, world))
            continue
        seen += 1
        for o in range(world):
            for t in range(p.list_start(o), p.list_start(o + 1)):
                owners = p.tile_owners(t)
                assert owners == [o] or len(owners) != 1, (p, o, t)
            assert q.list_start(o) - p.tiles_n <= p.list_start(o) <= q.list_start(o)
        assert max(p.list_len(o) for o in range(world)) <= max(q.list_len(o) for o in range(world))
        for rank in range(world):
            assert sorted(_rounds_by_tile(p, rank)) == list(range(p.num_tiles)), p
        _assert_no_wait_cycle(p)
    assert seen > 10


def test_split_row_only_where_the_lane_cost_drops_enough():
    """By default a shared row is split only where the lane cost drops to ``SPLIT_ROW_GAIN``
    or below: 1152 x 7168 (9 tile rows, row 4 shared) goes from 160 / 128 tiles of 224
    (3 chunks of 66 and the lag round) to 126 / 126 of 256 (2 chunks); 1664 x 7168 keeps
    whole rows (3 chunks either way; splitting there measured 5-8% slower), and so does
    2880 x 7168 (7 rounds -> 6, measured -5..+7%); the other orders never split."""
    p = make_plan(1152, 7168, 4096, 2, 132, "rs")
    assert (p.bn, p.cta_group, p.peers_first, p.flat, p.split_row) == (256, 1, False, False, True)
    assert [p.list_len(o) for o in range(2)] == [126, 126] and p.rounds == 2
    q = make_plan(1152, 7168, 4096, 2, 132, "rs", split_row=False)
    assert not q.split_row and (q.bn, q.rounds) == (224, 4) and q.list_start(1) == 5 * q.tiles_n
    for M, N in ((1664, 7168), (2880, 7168), (1152, 8192), (2176, 8192)):
        r = make_plan(M, N, 4096, 2, 132, "rs")
        assert not r.split_row, r
    for kw in ({"peers_first": True}, {"flat": True}):
        r = make_plan(1152, 7168, 4096, 2, 132, "rs", split_row=True, **kw)
        assert not r.split_row and r.list_start(1) == 5 * r.tiles_n
    assert not make_plan(1152, 7168, 4096, 2, 132, "ar", split_row=True).split_row
    assert not make_plan(1152, 7168, 4096, 2, 148, "rs", arch="sm_100a").split_row


# ---------------------------------------------------------------- a partial last tile column
def test_widths_stay_whole_where_a_measured_width_divides_n():
    """N a multiple of 128 keeps the widths the plan rules were measured with, every tile
    whole (but where the GEMM alone takes a width of FINE_NS, ``FINE_GAIN``, or the one
    round's width of fewest L2 reads, ``choose_gemm_one_round_width``); elsewhere sm90
    chooses among PARTIAL_NS, never wider than N (but 128), and sm100 has nothing to choose
    from."""
    from launch.geometry import FINE_NS
    from launch.rules import choose_gemm_one_round_width
    for N in (128, 384, 1792, 5376, 7168, 8192, 10240):
        assert tile_widths(N) == tuple(b for b in FULL_NS if N % b == 0) and 128 in tile_widths(N)
        for M, K, mode in itertools.product((128, 300, 1000, 4096), (1024, 9216),
                                            ("rs", "ar", "gemm")):
            p = make_plan(M, N, K, 2, 132, mode)
            if mode == "gemm" and (p.bn in FINE_NS
                                   or p.bn == choose_gemm_one_round_width(M, N, K, 132)):
                continue
            assert N % p.bn == 0 and p.tiles_n * p.bn == N, (M, N, K, mode, p.bn)
    assert tile_widths(2880) == PARTIAL_NS
    assert tile_widths(200) == (192, 160, 128)
    assert tile_widths(96) == (128,)
    assert tile_widths(2880, "sm_100a") == ()
    # 2880 = 15 x 192 = 18 x 160: the lane cost picks among whole and partial tiles alike
    p = make_plan(4096, 2880, 4096, 2, 132, "rs")
    assert p.bn in PARTIAL_NS and p.tiles_n == -(-2880 // p.bn)


def test_partial_widths_are_the_cheapest_last_wave():
    from launch.rules import lane_cost
    for M, N, mode in itertools.product((300, 576, 704, 2048, 8192), (2880, 1000, 3000),
                                        ("rs", "ar", "gemm")):
        p = make_plan(M, N, 4096, 2, 132, mode, cta_group=1, peers_first=False)
        others = [make_plan(M, N, 4096, 2, 132, mode, bn=b, cta_group=1, peers_first=False)
                  for b in tile_widths(N)]
        if mode != "gemm" and any(o.rounds - o.lag >= 2 for o in others):
            others = [o for o in others if o.rounds - o.lag >= 2]
        assert lane_cost(p) == min(lane_cost(o) for o in others), (M, N, mode)


def test_workspace_holds_every_tile_of_a_partial_column():
    """Tile-indexed buffers (AR's OUT, multicast partials) hold whole tiles, the partial
    last column's too, at every width a plan may take."""
    from launch.layout import WorkspaceLayout
    from launch.geometry import TILE_NS
    for N, max_M in itertools.product((1000, 2880, 7168, 200), (128, 1000, 4096)):
        for transport in ("unicast", "multicast"):
            lay = WorkspaceLayout.build(max_M, N, 2, transport)
            for bn in TILE_NS:
                p = make_plan(max_M, N, 1024, 2, 132, "ar", bn=bn, cta_group=1)
                assert lay.out_off + p.num_tiles * p.tile_bytes <= lay.total_bytes, (N, bn)
                assert p.num_tiles <= lay.max_tiles
                if transport == "multicast":
                    assert lay.part_off + p.num_tiles * p.tile_bytes <= lay.out_off


def test_clusters_are_one_two_or_four_ctas():
    """Clusters of 3 tile rows left main (tag experiments/2026-12-05); 4 came back for the
    plain GEMM only (tests/test_quad_clusters.py)."""
    for g in (0, 3, 5):
        for mode in ("rs", "gemm"):
            with pytest.raises(ValueError, match=r"one of \(1, 2, 4\)"):
                make_plan(512, 7168, 4096, 2, 132, mode, bn=256, cta_group=g)
    with pytest.raises(ValueError, match="4x1 clusters run the plain sm90 GEMM"):
        make_plan(512, 7168, 4096, 2, 132, "rs", bn=256, cta_group=4)
    assert make_plan(512, 7168, 4096, 2, 132, "gemm", bn=256, cta_group=4).cta_group == 4
