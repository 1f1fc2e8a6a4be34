"""The planner: which plan a call runs, the measured rules (``launch.rules``) applied over
the tile geometry (``launch.geometry``) wherever the caller forced nothing.

``make_plan`` takes every plan-shape override ``launch.tuning.Tuning`` carries; each left at
None hands its choice to a rule. ``launch.resolve`` is the one caller on the op's path.
"""
from __future__ import annotations

from dataclasses import replace

from .geometry import (BLACKWELL, BM, FINE_NS, MAX_BAND, MODES, PARTIAL_NS, PUSH_ALL_MAX_M,
                       QUAD, TILE_MS, TilePlan, ceil_div, pairs_whole, split_row_plan,
                       tile_plan, tile_widths, with_sk)
from .rules import (FINE_GAIN, ONE_CTA_COST, PAIRS96_BN, PINGPONG_NS, ROWS64_BN,
                    SPLIT_ROW_GAIN,
                    choose_band, choose_flat, choose_fused_cluster, choose_gemm_cluster,
                    choose_gemm_dividing_widths, choose_gemm_one_round_width,
                    choose_gemm_pairs_full_round, choose_gemm_partial_width,
                    choose_gemm_tail_one_cta,
                    choose_gemm_pairs96, choose_gemm_pairs_short, choose_gemm_pingpong,
                    choose_gemm_quads, choose_gemm_quads128,
                    choose_gemm_rows64, choose_gemm_rows64_pairs,
                    choose_gemm_split,
                    choose_gemm_width,
                    choose_push_all, choose_sk, choose_sm100, choose_small_m, lane_cost)


def make_plan(M: int, N: int, K: int, world: int, sm_count: int, mode: str, *,
              arch: str = "sm_90a", bn: int | None = None,
              cta_group: int | None = None, pair_ctas: int | None = None,
              lag: int | None = None,
              peers_first: bool | None = None, band: int | None = None,
              pair_n: bool = False, push_all: bool | None = False,
              flat: bool | None = None, sk: bool | None = None,
              split_row: bool | None = None, pingpong: bool | None = False,
              bm: int | None = None, fine: bool = True, x_box: bool = True,
              quad_ctas: int | None = None) -> TilePlan:
    """``arch`` picks the heuristic (sm90: the tile width of least ``lane_cost``, 1-CTA or
    2x1 clusters by ``choose_gemm_cluster`` (plain GEMM, unless ``_gemm_one_cta_if_cheaper``
    finds a cheaper 1-CTA plan) and ``choose_fused_cluster``, the
    small-M order by ``choose_small_m``; sm100: ``choose_sm100``);
    ``bn`` / ``cta_group`` override it (tests, experiments). ``pair_ctas``: how many CTAs
    can be resident at once as 2-CTA clusters (the GPC layout can fit fewer than the SM
    count); every CTA of the persistent grid must be resident, or waits could never end.
    ``lag`` overrides the 1-CTA schedule's lag (0 or 1; experiments).
    ``peers_first``: every lane computes peers' tiles, then its own (see the module
    docstring; 1-CTA fused schedules or pairs along N, lag 0); None:
    ``choose_small_m`` decides for sm90 plans nothing else was forced on. ``band``: unit
    rows per band of the order inside each list (0: row-major; None: ``choose_band``).
    ``pair_n``: 2x1 clusters that pair tiles along N and share x's tile (module docstring;
    sm90; False leaves it to ``choose_small_m``). ``push_all``: the push-all AR plan
    (module docstring; ``bn`` None: 64-wide tiles where they fit one wave, else the plain
    GEMM's width); None: ``choose_push_all`` decides for world-2 sm90 AR plans nothing else
    was forced on (the caller passes None only where the transport can run it: unicast,
    bulk-copy pushes). ``split_row``: RS round orders split a tile row two owners share
    between their lists (module docstring); None: where the width choice's lane cost drops
    to ``SPLIT_ROW_GAIN`` of the best whole-row plan's or below, False: never, True:
    wherever ``can_split_row``. ``pingpong`` None: the plain GEMM nothing else was forced
    on runs ping-pong warp groups where ``choose_gemm_pingpong`` says so (``_gemm_pingpong``;
    the plan's ``pingpong`` tells the resolver); False: the other rules. ``bm`` 64: 64-row
    tiles (the plain sm90 GEMM on 1-CTA tiles, or on 2x1 clusters along M where
    ``cta_group`` is 2; ``launch.geometry.TILE_MS``), the width of least ``lane_cost``
    unless ``bn`` is given; 128: 128-row tiles; None: 64-row ones where
    ``choose_gemm_rows64`` (1-CTA) or ``choose_gemm_rows64_pairs`` (2x1 clusters) says so
    for a plain GEMM nothing else was forced on.
    ``fine``: the plain GEMM may take a width of ``FINE_NS`` (or of
    ``choose_gemm_dividing_widths``) by ``FINE_GAIN``. ``x_box``: the
    kernel will load x in boxes of M rows where M is below the tile's (``choose_x_box``),
    which ``choose_gemm_split`` weighs. ``quad_ctas``: CTAs resident at once as 4x1 clusters
    (None: every SM), for ``choose_gemm_quads``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    rows64_rule = (mode == "gemm" and bm is None and not sk
                   and _sm90_unforced(arch, bn, cta_group, lag, pair_n)
                   and choose_gemm_rows64(M, N, sm_count))
    if rows64_rule:
        bm, bn = TILE_MS[0], ROWS64_BN
    elif mode == "gemm" and bm is None and not sk and _sm90_unforced(arch, bn, cta_group, lag,
                                                                    pair_n):
        pairs = _clusters(sm_count, pair_ctas, 2)
        pair_bn = choose_gemm_rows64_pairs(M, N, pairs)
        quads = _clusters(sm_count, quad_ctas, QUAD)
        quad_bn = choose_gemm_quads(M, N, K, quads)
        quad128_bn = fine and choose_gemm_quads128(M, N, K, quads)
        short_bn = fine and choose_gemm_pairs_short(M, N, K, pairs)
        if pair_bn:
            bm, bn, cta_group = TILE_MS[0], pair_bn, 2
        elif quad_bn:
            bm, bn, cta_group = TILE_MS[0], quad_bn, QUAD
        elif quad128_bn:
            bn, cta_group = quad128_bn, QUAD  # 128-row tiles, as below
        elif short_bn:
            bn, cta_group = short_bn, 2  # 128-row tiles: the plan below, nothing else moves it
    if cta_group == QUAD:
        pair_ctas = quad_ctas  # the plan's clusters are 4x1: their occupancy bounds the grid
    if bm not in (None, BM):
        if (mode != "gemm" or arch in BLACKWELL or pair_n
                or (cta_group not in (None, 1) and sk)):
            raise ValueError("64-row tiles run the plain sm90 GEMM (gemm_only) on 1-CTA tiles "
                             "or clusters along M (without the split-K tail)")
        g = cta_group or 1
        plan = _make_plan(M, N, K, world, sm_count, mode, arch=arch, bn=bn, cta_group=g,
                          pair_ctas=pair_ctas, lag=None, peers_first=False, bm=bm)
        plan = replace(plan, band=choose_band(K, g) if band is None else band)
        if rows64_rule and sk is None and band is None:
            split = with_sk(plan, arch)
            boxed = x_box and M < plan.bm
            return split if choose_gemm_split(M, K, split.sk, boxed) else plan
        return with_sk(plan, arch) if sk else plan
    if (mode == "gemm" and pingpong is None and sk is None and band is None
            and _sm90_unforced(arch, bn, cta_group, lag, pair_n)):
        pp = _gemm_pingpong(M, N, K, world, sm_count, pair_ctas)
        if pp is not None and choose_gemm_pingpong(M, K, pp, make_plan(
                M, N, K, world, sm_count, mode, arch=arch, pair_ctas=pair_ctas,
                push_all=push_all, flat=flat, split_row=split_row, bm=bm, fine=fine,
                x_box=x_box)):
            return pp
    if (sk is None and flat is None and peers_first is None and push_all is not True
            and _sm90_unforced(arch, bn, cta_group, lag, pair_n) and choose_sk(M, K, mode)):
        tail = make_plan(M, N, K, world, sm_count, mode, arch=arch, pair_ctas=pair_ctas,
                         band=band, flat=True, sk=True, split_row=split_row)
        if tail.sk:
            return tail
    if sk and mode == "gemm" and cta_group is None:
        cta_group = 1  # the split-K tail cuts 1-CTA units
    if flat is None:
        flat = (peers_first is None and push_all is not True
                and _sm90_unforced(arch, bn, cta_group, lag, pair_n)
                and choose_flat(M, K, mode))
    if flat:
        if mode == "gemm":
            flat = False  # no exchange to order
        elif (arch in BLACKWELL or cta_group not in (None, 1) or pair_n
              or lag not in (None, 0) or peers_first is False):
            raise ValueError("the flat peers-first order is a 1-CTA sm90 order, without "
                             "the lag round")
        else:
            peers_first, cta_group, push_all = True, 1, False
    if band is not None and not (isinstance(band, int) and 0 <= band <= MAX_BAND):
        raise ValueError(f"band must be an int in [0, {MAX_BAND}], got {band!r}")
    if push_all is None:
        push_all = (mode == "ar" and world == 2 and peers_first is None
                    and _sm90_unforced(arch, bn, cta_group, lag, pair_n)
                    and choose_push_all(M, K))
    if push_all:
        plan = _make_push_all_plan(M, N, K, world, sm_count, mode, arch=arch, bn=bn,
                                   cta_group=cta_group, lag=lag,
                                   peers_first=peers_first, pair_n=pair_n)
        return replace(plan, band=choose_band(K, 1) if band is None else band)
    if pair_n:
        if arch in BLACKWELL or cta_group == 1:
            raise ValueError("pairs along N are sm90 2x1-cluster plans")
        cta_group, peers_first = 2, bool(peers_first)
    plan = _make_plan(M, N, K, world, sm_count, mode, arch=arch, bn=bn, cta_group=cta_group,
                      pair_ctas=pair_ctas, lag=lag, peers_first=peers_first,
                      pair_n=pair_n, flat=flat, split_row=split_row)
    if (mode == "gemm" and plan.cta_group == 2 and not sk
            and _sm90_unforced(arch, bn, cta_group, lag, pair_n)):
        plan = _gemm_one_cta_if_cheaper(plan, pair_ctas)
    if (mode == "gemm" and fine and not sk and plan.bn != 64
            and _sm90_unforced(arch, bn, cta_group, lag, pair_n)):
        # a width 16 past a multiple of 32, or 160 / 192 dividing N, that ends a partial
        # last wave (docs/PERF.md (ai), (bb)); not the 160 / 192 ones at the rows
        # ``choose_gemm_tail_one_cta`` re-plans (192 x 10240 x 1024: 160-wide pairs there
        # became 256-wide 1-CTA tiles, 13% slower than the 176-wide ones kept, (bb))
        dividing = () if choose_gemm_tail_one_cta(M, K) else choose_gemm_dividing_widths(N)
        plan = _gemm_cheaper_at(plan, FINE_NS + dividing, pair_ctas)
        if plan.cta_group == 1 and choose_gemm_pairs_full_round(M, K, plan.num_tiles, sm_count):
            # the same width paired; the 1-CTA plan where the pairs cannot all be resident
            plan = _cheapest_gemm(M, N, K, world, sm_count, (plan.bn,), 2, pair_ctas) or plan
        if plan.cta_group == 1 and choose_gemm_partial_width(K):
            plan = _gemm_cheaper_at(plan, PARTIAL_NS, pair_ctas)
        if plan.cta_group == 1 and plan.rounds == 1:
            width = choose_gemm_one_round_width(M, N, K, sm_count)
            if width and width != plan.bn:
                plan = _cheapest_gemm(M, N, K, world, sm_count, (width,), 1, pair_ctas) or plan
        if choose_gemm_pairs96(plan, _clusters(sm_count, pair_ctas, 2)):
            plan = _cheapest_gemm(M, N, K, world, sm_count, (PAIRS96_BN,), 2, pair_ctas) or plan
    if (mode == "gemm" and fine and x_box and plan.cta_group == 2 and not sk
            and _sm90_unforced(arch, bn, cta_group, lag, pair_n)
            and choose_gemm_tail_one_cta(M, K)):
        # the 1-CTA plan a caller forcing cta_group=1 gets: its kernel boxes the last row
        plan = _make_plan(M, N, K, world, sm_count, mode, arch=arch, bn=None, cta_group=1,
                          pair_ctas=pair_ctas, lag=lag, peers_first=peers_first,
                          flat=flat, split_row=split_row)
    plan = replace(plan, band=choose_band(K, plan.cta_group) if band is None else band)
    return with_sk(plan, arch) if sk else plan


def _gemm_one_cta_if_cheaper(pair: TilePlan, pair_ctas: int | None) -> TilePlan:
    """The plain GEMM's 1-CTA plan of least ``lane_cost`` (widths 256 / 224 / 128 / 64) where
    it beats the 2x1-cluster plan ``choose_gemm_cluster`` took by ``ONE_CTA_COST``; else
    ``pair``. Pairs take two tile rows: with an odd row count one row of pairs is half
    empty, and half as many lanes fill fewer SMs at few tiles. Measured on one H200
    (docs/PERF.md (t), K 2048-9216, two runs): 1152 x 7168 from 0.76x to 0.97-1.03x cuBLAS
    (3 rounds of 224-wide pairs against 2 of 256-wide 1-CTA tiles), 384 x 10240 0.66x ->
    0.94-0.99x, 256 x 4096 0.72-0.79x -> 0.86-0.90x (64-wide tiles on 128 SMs instead of
    128-wide pairs on 64); the grid's powers of two keep their plans."""
    best = _cheapest_gemm(pair.M, pair.N, pair.K, pair.world, pair.sm_count,
                          (*tile_widths(pair.N), 64), 1, pair_ctas)
    if best is not None and lane_cost(best) * ONE_CTA_COST < lane_cost(pair):
        return best
    return pair


def _gemm_cheaper_at(plan: TilePlan, widths: tuple, pair_ctas: int | None) -> TilePlan:
    """The plain GEMM's plan of least ``lane_cost`` among ``widths`` on ``plan``'s cluster
    kind where it costs at most ``FINE_GAIN`` of ``plan``'s; else ``plan``."""
    best = _cheapest_gemm(plan.M, plan.N, plan.K, plan.world, plan.sm_count, widths,
                          plan.cta_group, pair_ctas)
    if best is not None and lane_cost(best) <= FINE_GAIN * lane_cost(plan):
        return best
    return plan


def _gemm_pingpong(M: int, N: int, K: int, world: int, sm_count: int,
                   pair_ctas: int | None) -> TilePlan | None:
    """The plain GEMM on 2x1 clusters for ping-pong warp groups: the width of least
    ``lane_cost`` among ``PINGPONG_NS`` (``choose_gemm_pingpong``), or None where no pair
    plan fits."""
    best = _cheapest_gemm(M, N, K, world, sm_count, PINGPONG_NS, 2, pair_ctas)
    if best is None:
        return None
    return replace(best, band=choose_band(K, 2), pingpong=True)


def _cheapest_gemm(M: int, N: int, K: int, world: int, sm_count: int, widths: tuple,
                   cta_group: int, pair_ctas: int | None) -> TilePlan | None:
    """The plain sm90 GEMM's plan of least ``lane_cost`` among ``widths`` (no wider than N
    but 128; the first of equal cost) on ``cta_group``, or None where none can run."""
    plans = []
    for b in widths:
        if b > max(N, BM):
            continue
        try:
            plans.append(_make_plan(M, N, K, world, sm_count, "gemm", arch="sm_90a", bn=b,
                                    cta_group=cta_group, pair_ctas=pair_ctas, lag=None,
                                    peers_first=False))
        except ValueError:
            continue
    return min(plans, key=lane_cost, default=None)


def push_plan(M: int, N: int, K: int, world: int, sm_count: int, push_ctas: int, *,
              pair_ctas: int | None = None, bn: int | None = None,
              band: int | None = None) -> TilePlan:
    """An RS plan whose pushes leave from ``push_ctas`` CTAs of their own (sm90, unicast,
    bulk-copy pushes; an experiment, ````Tuning.push_ctas``). The other sm_count -
    push_ctas CTAs run the flat peers-first order (``TilePlan.flat``): they stage each tile a
    peer owns in this rank's OUT region (unused by RS) and stamp it at GPU scope, with no
    system fence. The push CTAs walk the same order, copy each staged tile to its owner's
    receive slot, fence and stamp the owner. So the MMA SMs never hold their TMA unit for a
    link round trip, and the link's pace is the push CTAs'. Owners do not change."""
    if not isinstance(push_ctas, int) or not 0 < push_ctas <= sm_count // 4:
        raise ValueError(f"push_ctas must be an int in [1, {sm_count // 4}], got {push_ctas!r}")
    plan = make_plan(M, N, K, world, sm_count - push_ctas, "rs", bn=bn, pair_ctas=pair_ctas,
                     band=band, flat=True, sk=False, split_row=False)
    return replace(plan, grid=plan.grid + push_ctas, push_ctas=push_ctas)


def _clusters(sm_count: int, ctas: int | None, size: int) -> int:
    """Clusters of ``size`` resident at once, where ``ctas`` CTAs can be resident as such
    clusters (None: every SM)."""
    return (sm_count if ctas is None else min(sm_count, ctas)) // size


def _sm90_unforced(arch: str, bn: int | None, cta_group: int | None, lag: int | None,
                   pair_n: bool) -> bool:
    """An sm90 plan whose shape no caller forced: the small-M and cluster rules decide it."""
    return (arch not in BLACKWELL and bn is None and cta_group is None and lag is None
            and not pair_n)


def _make_plan(M: int, N: int, K: int, world: int, sm_count: int, mode: str, *, arch: str,
               bn: int | None, cta_group: int | None, pair_ctas: int | None, lag: int | None,
               peers_first: bool | None, pair_n: bool = False,
               flat: bool = False, split_row: bool | None = None, bm: int = BM) -> TilePlan:
    # sm90 widths without a heuristic's pick (bn0 None) come from ``lane_cost`` below
    bn0, cg0 = choose_sm100(M, N, K) if arch in BLACKWELL else (None, 1)
    unforced = _sm90_unforced(arch, bn, cta_group, lag, pair_n)
    if unforced and mode == "gemm":
        bn0, cg0 = choose_gemm_width(M, N, K, sm_count), choose_gemm_cluster(M, K)
    if unforced and mode != "gemm" and peers_first is None:
        bn0, peers_first, along_n = choose_small_m(M, K, mode)
        if along_n and ceil_div(N, bn0) % 2 == 0:  # an even number of tile columns to pair
            return _make_plan(M, N, K, world, sm_count, mode, arch=arch, bn=bn0, cta_group=2,
                              pair_ctas=pair_ctas, lag=None, peers_first=False,
                              pair_n=True)
        if along_n:  # otherwise the 1-CTA plan of one tile row: same width, peers-first
            peers_first = True
        pair_lag = None if peers_first else choose_fused_cluster(M, K, mode)
        if pair_lag is not None:
            try:
                pair = _make_plan(M, N, K, world, sm_count, mode, arch=arch, bn=bn0,
                                  cta_group=2, pair_ctas=pair_ctas, lag=pair_lag,
                                  peers_first=False)
            except ValueError:  # some pair-tile straddles two owners: the 1-CTA plan
                pair = None
            # lag 1: the 1-CTA schedule's rule, a round of slack only where 3+ rounds hide
            # it; lag 0: only where no pair straddles two owners (``choose_fused_cluster``)
            if pair is not None and (pair.rounds - pair.lag >= 3 if pair.lag
                                     else pairs_whole(pair)):
                return pair
    peers_first = bool(peers_first)
    cta_group = cg0 if cta_group is None else cta_group
    if bn is None and bn0 is None:
        # sm90: the tile width whose last wave costs least (``lane_cost``), widest on a tie
        options, splits, refused = [], [], None
        for b in tile_widths(N, arch):
            try:
                options.append(_make_plan(M, N, K, world, sm_count, mode, arch=arch, bn=b,
                                          cta_group=cta_group, pair_ctas=pair_ctas, lag=lag,
                                          peers_first=peers_first,
                                          pair_n=pair_n, flat=flat, split_row=bool(split_row),
                                          bm=bm))
            except ValueError as e:  # lag 1 on pairs: only the widths pairs_whole allows
                refused = e
        if not options:
            raise refused or ValueError(f"no tile width of {arch} fits N={N}")
        if split_row is None:
            splits = [split_row_plan(p, sm_count, lag) for p in options if p.can_split_row]
        if mode != "gemm":
            # A lane with a single tile pushes it only after its whole GEMM, with nothing
            # left to overlap: where some width gives every lane two tiles, take it (M=512,
            # N=7168, K=4096: 128-wide AR 14% faster than 224-wide; RS at K=9216 the other
            # way by 7%: a rule of thumb, docs/PERF.md (d)).
            options = [p for p in options if p.rounds - p.lag >= 2] or options
            splits = [p for p in splits if p.rounds - p.lag >= 2]
        best = min(options, key=lane_cost)
        split = min(splits, key=lane_cost, default=None)
        if split is not None and lane_cost(split) <= SPLIT_ROW_GAIN * lane_cost(best):
            return split
        return best
    return tile_plan(M, N, K, world, sm_count, mode, arch=arch,
                     bn=bn0 if bn is None else bn, cta_group=cta_group, pair_ctas=pair_ctas,
                     lag=lag, peers_first=peers_first, pair_n=pair_n, flat=flat,
                     split_row=bool(split_row), bm=bm)


def _make_push_all_plan(M: int, N: int, K: int, world: int, sm_count: int, mode: str, *,
                        arch: str, bn: int | None, cta_group: int | None, lag: int | None,
                        peers_first: bool | None, pair_n: bool) -> TilePlan:
    if (mode != "ar" or arch in BLACKWELL or cta_group not in (None, 1) or lag not in (None, 0)
            or peers_first or pair_n):
        raise ValueError("push-all plans are sm90 AR plans on 1-CTA tiles in the flat order "
                         "(no lag, peers-first order or pairs)")
    if world != 2:
        raise ValueError(f"push-all plans are world-2 plans (identical sums on both ranks, "
                         f"the owner scheme's bytes); got world {world}")
    if M > PUSH_ALL_MAX_M:
        raise ValueError(f"push-all plans reduce every tile at the end of the launch; they "
                         f"run up to M={PUSH_ALL_MAX_M}, got M={M}")
    if bn is None:
        fits = ceil_div(M, BM) * ceil_div(N, 64) <= sm_count
        bn = 64 if fits else None
    flat = _make_plan(M, N, K, world, sm_count, "gemm", arch=arch, bn=bn, cta_group=1,
                      pair_ctas=None, lag=None, peers_first=False)
    return replace(flat, mode="ar", push_all=True)
