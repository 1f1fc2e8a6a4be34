"""The measured rules: every choice rsar makes for a call nobody tuned, with its condition
and the docs/PERF.md section that measured it (2x H200 unless it says one H200).

Each rule below is a small pure function; ``launch.plan`` applies the plan rules where the
caller's ``Tuning`` left a plan field at None, ``launch.resolve`` the kernel rules. A rule
changes here and only here, with its measurement; tests/grid_plans.json shows which grid
shapes it moved.

| rule | condition | choice | PERF.md |
|---|---|---|---|
| ``lane_cost`` / ``TILE_COST`` | sm90, nothing forced | the width whose last wave costs least | (d), (y), (ai) |
| ``FINE_GAIN`` | sm90 plain GEMM (bf16), a 112-208 width 5% cheaper | that width (16-column sub-tiles) | (ai) |
| ``choose_gemm_one_round_width`` | sm90 plain GEMM (bf16), a one-round 1-CTA plan, 3-7 tile rows, K >= 4096 | the width dividing N of fewest modelled L2 reads, 112-224 | (an), (as), (at) |
| ``choose_gemm_dividing_widths`` | sm90 plain GEMM (bf16), 160 / 192 dividing N (beside a width of ``FULL_NS``), 5% cheaper | that width | (bb) |
| ``choose_gemm_partial_width`` | sm90 plain GEMM (bf16), 1-CTA, K > 1024, a width not dividing N 5% cheaper | that width (a partial tile at N's edge) | (an) |
| ``choose_gemm_pingpong`` / ``PINGPONG_EPILOGUE`` | sm90 plain GEMM (bf16), K <= 1024: M >= 4096, or 3+ tiles a lane and a modelled time below the cooperative plan's (its hidden epilogues against its extra rounds); K >= 4096: that model at ``PINGPONG_EPILOGUE_DEEP``, 160 / 176 / 192 wide from M=4096, 176 below | 2x1 clusters, ping-pong, widths <= 192 | (ai), (aq), (at), (au), (bb) |
| ``choose_gemm_rows64`` | sm90 plain GEMM (bf16), M <= 64 | 64-row tiles, 112 wide | (ai) |
| ``choose_gemm_rows64_pairs`` | sm90 plain GEMM (bf16), 64 < M <= 128 | 64-row tiles on 2x1 clusters along M, the narrowest of 64 / 80 / 96 / 112 / 128 filling one round | (aq), (bd), (bf) |
| ``choose_gemm_quads`` | sm90 plain GEMM (bf16), M 193-256, N <= 3584, K >= 2048 (96 wide: K <= 1024 too) | 64-row tiles on 4x1 clusters along M, the narrowest of 96 / 128 filling one round | (bd), (be) |
| ``choose_gemm_quads128`` | sm90 plain GEMM (bf16), M 320-384, K >= 4096, 96-wide columns filling 90-100% of a round of 4x1 clusters | 128-row tiles on 4x1 clusters along M, 96 wide | (bh) |
| ``choose_gemm_pairs_short`` | sm90 plain GEMM (bf16), M 257-512, N >= 2048, K <= 2048; M 192-256, N >= 4608 (``pairs_one_row``) | 2x1 clusters, the narrowest of 80 / 96 filling one round | (be), (bf) |
| ``choose_gemm_pairs96`` | sm90 plain GEMM (bf16), one round of 112-wide pairs at four tile rows, K >= 4096 | 96-wide pairs where they fill one round | (bd) |
| ``choose_gemm_split`` | those 64-row tiles, K >= 8192 and 5+ pieces (M < 64, x boxed); K >= 4096, 5+ pieces or M <= 16 (M=64) | one round cut along K onto idle SMs | (aj), (al) |
| ``choose_small_m`` | fused, M <= 1024 | 64-wide peers-first / pairs along N / peers-first | (c), (g), (m), (o), (p) |
| ``choose_push_all`` | AR, world 2, unicast, M <= 128 or M <= 256 with K >= 4096 | push-all plan | (i) |
| ``choose_gemm_width`` | plain GEMM, one tile row fitting a wave; two at K <= 1024 | 64-wide tiles | (i), (bb) |
| ``choose_flat`` | fused, M 513-768, K <= 4096 | flat peers-first | (q) |
| ``choose_sk`` | fused, M 257-1152, K >= 4096 | flat peers-first with the split-K tail | (q) |
| ``SPLIT_ROW_GAIN`` | RS round order, lane cost <= 0.8x | split the shared tile row | (r) |
| ``choose_band`` | K > 1024 | bands of 16 tile rows | (d) |
| ``choose_gemm_cluster`` / ``ONE_CTA_COST`` | plain GEMM, K > 1024, M > 128 | 2x1 clusters unless 1-CTA is 5% cheaper | (d), (t) |
| ``choose_gemm_tail_one_cta`` | plain GEMM (bf16), M 129-192, K <= 1024, x boxed, where pairs were chosen | 1-CTA tiles | (al), (an) |
| ``choose_gemm_pairs_full_round`` | plain GEMM (bf16), K <= 1024, two tile rows, a round filling 90% of the SMs | 2x1 clusters at the same width | (ak) |
| ``choose_fused_cluster`` | fused, K > 1024 and M >= 2048 (RS) / 4096 (AR); or 4+ tile rows at long K | 2x1 clusters, lag 1 / lag 0 | (e), (g) |
| ``choose_sm100`` | sm100 | 2-CTA MMA from M=1024, 256 wide from M*K = 24 Mi | (SM100.md) |
| ``default_push`` | sm90 unicast | bulk-copy pushes (AR: results too) | (c) |
| ``default_prefetch`` | sm90 fused, world 2, unicast | reductions load a sub-tile ahead | (j) |
| ``default_early_copy`` | sm90 AR owner plans with the lag round | results copied back during the rounds | (l) |
| ``default_push_window`` | sm90 AR owner plans, RS peers-first | one sub-tile's copies in flight | (n) |
| ``default_stages`` | sm90, K >= 2048, 224 / 256 wide, few tiles a lane; the plain GEMM with TMA stores at 224 / 256 wide, plan depth K <= 1024; that GEMM with ping-pong warp groups on 2x1 clusters 176 / 192 wide, K <= 1024 or >= 4096; its one round of 112-wide pairs at two to four tile rows, K >= 4096; its 64-row plans 64 wide, on 4x1 clusters and 80 / 96-wide pairs; its 80-wide 128-row pairs at one pair row (``pairs_one_row``) | 4 mainloop stages; 5 for ping-pong; 7 for those pairs; 13 / 11 / 10 / 9 for the 64-row plans (``rows64_deep``); 8 | (s), (t), (ao), (ap), (at), (bb), (bd), (bf) |
| ``default_tma_store`` | sm90 plain GEMM with bulk-copy rows | TMA stores | (v) |
| ``default_lean_exit`` | nowhere yet (an experiment, docs/TUNING.md) | the fenced exit | (u) |
| ``choose_x_box`` | plain GEMM, bf16 / fp16, 1-CTA or clusters along M, a last tile row of fewer rows than the tile | that row's x in boxes of its rows (8 / 16 / 32 / 48 / 64 / 80 / 96 / 112: ``X_BOX_UNEVEN``) | (al), (an), (bg), (bh) |
| ``choose_gemm_l2_hint`` | sm90 plain GEMM (bf16 / fp16), K <= 1024, M >= 512 | the mainloop's loads evict from L2 last | (ba) |
| PDL (``launch.resolve``) | sm90 | programmatic dependent launch | (i) |
"""
from __future__ import annotations

from .geometry import BM, QUAD, TILE_MS, TilePlan, ceil_div

# Tile rows a band spans by default (docs/PERF.md (d)); the schedule word holds up to 255 units
BAND_TILE_ROWS = 16
# A shared RS tile row is split between two lists (``split_row``) only where the lane cost
# drops at least this much: 2x H200 (docs/PERF.md (r)), N=7168: M 1025-1152 (cost 0.74x:
# three rounds of 224-wide tiles -> two of 256) RS +1-3% at K <= 2048, +10% at 4096, +17%
# at 9216; M 2817-2944 (0.92x: seven rounds -> six) -5% at K=2048, +2-7% at 9216; where
# the round count stays, 2-8% slower.
SPLIT_ROW_GAIN = 0.8
# Time per output column of a tile width against BN=256 at the same tiles per SM (GEMM alone,
# 2x H200, docs/PERF.md (d)): narrower tiles reload x's tile for fewer columns.
# 160 / 192: the GEMM alone on one H200 at M 576-1088 (docs/PERF.md (y)), 1-CTA tiles.
# 208 / 176 / 144 / 112 (16-column sub-tiles): the GEMM alone on one H100, every width on
# 1-CTA tiles and 2x1 clusters over the 48-shape grid (docs/PERF.md (ai),
# ``benchmarks/width_costs.py``): per column against 256 wide, 2x1 clusters 1.03 / 1.04 /
# 1.05 / 1.16, 1-CTA tiles (L2-bound at long K) 1.07 / 1.16 / 1.24 / 1.43; set between the
# two and in line with the widths above.
TILE_COST = {256: 1.0, 224: 1.03, 208: 1.045, 192: 1.06, 176: 1.09, 160: 1.12, 144: 1.15,
             128: 1.18, 112: 1.25}
# The plain GEMM (bf16: ``launch.resolve._fill_rules``) takes a width of
# ``launch.geometry.FINE_NS`` only where its lane cost is at most this fraction of the plan
# the other rules chose (same cluster kind). One H100
# (docs/PERF.md (ai)): that changed 16 of 96 shapes (N 7168 / 8192 / 2880 / 5120) and sped
# up all 16, 1-28% (512 x 5120 x 4096: 256-wide tiles on 80 of 132 SMs -> 176-wide on
# 120, 0.735x -> 0.936x cuBLAS); at 0.9 only the six N=5120 shapes moved.
FINE_GAIN = 0.95
# Widths ping-pong warp groups run on the GEMM alone (``launch.variant.PINGPONG_WIDEST``)
PINGPONG_NS = (112, 128, 144, 160, 176, 192)
# A 1-CTA plain GEMM's time against a 2x1-cluster one of the same width and tiles per lane
# (the pair shares w's tile): 2-11% slower at K >= 4096 (docs/PERF.md (d)); 1.05 fits the
# one-GPU runs of docs/PERF.md (t).
ONE_CTA_COST = 1.05


def lane_cost(plan: TilePlan) -> float:
    """Modelled time of a plan: the most tiles one lane computes, times the tile's width and
    its ``TILE_COST``. The last wave is what a persistent grid waits for: at 2048 x 7168,
    224-wide tiles give every lane of the round order 4 tiles of 224 columns where 256-wide
    ones give some lanes 4 and most 3 (448 tiles over 2 x 66 lanes)."""
    return (plan.rounds - plan.lag) * plan.bn * TILE_COST.get(plan.bn, 1.5)


def choose_sm100(M: int, N: int, K: int) -> tuple[int, int]:
    """(BN, cta_group) on sm100: 2-CTA MMA once M >= 1024 or the tile rows pair up evenly;
    BN=256 once the A operand is large enough (M*K >= 24 Mi) to be worth halving its reloads."""
    tiles_m = ceil_div(M, BM)
    cta_group = 2 if (M >= 1024 or tiles_m % 2 == 0) else 1
    bn = 256 if (M * K >= 24 * 1024 * 1024 and N % 256 == 0) else 128
    return bn, cta_group


def choose_push_all(M: int, K: int) -> bool:
    """Whether a world-2 sm90 AR plan that nothing else was forced on pushes all (module
    docstring). Measured on 2x H200 (docs/PERF.md (i), N 7168 and 8192, against the owner
    plan ``choose_small_m`` picks): one tile row 5-8% faster at K 1024-9216 (one exchange,
    one system fence per tile instead of two); two tile rows 5-10% faster at K >= 4096 and
    a tie at K=1024; from M=512 on 2-15% slower (every tile is reduced after the CTA's last
    push, a tail that grows with M)."""
    return M <= BM or (M <= 2 * BM and K >= 4096)


def choose_gemm_width(M: int, N: int, K: int, sm_count: int) -> int | None:
    """64-wide tiles for the plain GEMM (mode "gemm") on sm90 where M is one tile row and
    they fit one wave, or two tile rows at K <= 1024 and they fit one wave; else None (the
    width of least ``lane_cost``): at M=128, N=7168 the 128-wide tiles that model picks fill
    56 of 132 SMs. Measured on 2x H200 (docs/PERF.md (i), N 7168 and 8192, K 1024-9216):
    13-23% faster at M=128, 7-45% slower from M=256 (where they take two rounds there).
    At 256 x 2880 x 1024 the model's 112-wide 1-CTA tiles fill 52 SMs, 64-wide ones 90:
    +15.5 / +14.0% (one H100, same-run A/B, two seeded orders, docs/PERF.md (bb); at K >=
    4096 ``_gemm_one_cta_if_cheaper`` already takes them there); against those 112-wide
    tiles at M 192 / 256 x N 2048-4096 (12 shapes, ``offgrid-rules``) +11..+20%."""
    rows = ceil_div(M, BM)
    fits = rows * ceil_div(N, 64) <= sm_count
    return 64 if fits and (rows == 1 or (rows == 2 and K <= 1024)) else None


def choose_small_m(M: int, K: int, mode: str) -> tuple[int | None, bool, bool]:
    """(BN or None for the width of least ``lane_cost``, peers-first, pairs along N) of a
    fused sm90 plan at small M, where one round of tiles leaves nothing to overlap the pushes
    with. Measured on 2x H200 (docs/PERF.md (c) and (g), N 7168 and 8192, against the round
    order at the then default width): one tile row (M <= 128) runs 64-wide tiles
    peers-first, RS 8-22% and AR 5-15% faster (128-wide tiles leave half the SMs idle
    there), except AR at K > 1024, where 64-wide pairs along N in the round order (x's tile
    multicast to both CTAs of a cluster) are 8-20% faster than the 1-CTA plans they replace
    (64-wide peers-first at K=4096, the round order at K=9216; at K=1024 they tie); at
    K <= 1024 two tile rows run 64-wide peers-first too (5-11%), and up to M=1024 the
    peers-first order at the usual width gains -2..+11% (RS at M=1024 is a wash). With
    longer K beyond one tile row the orders tie (+-1%), so the round order stays. RS gains
    nothing from pairs along N (in either order it ties the 1-CTA plan). At K=2048 two tile
    rows gain from the 64-wide peers-first plan too: RS 6.4-6.6%, AR 7.4-8.8% over the
    round order (docs/PERF.md (m), N 7168 and 8192). With the push window (one sub-tile's
    copies in flight, so the own tiles' mainloop no longer queues behind a tile of copies)
    RS's peers-first order also wins from four to eight tile rows at K <= 4096: +1.5-3.3% at
    M=1024 with K 2048 and 4096, +0.6-2.8% at 512 x 2048, a tie at 512 x 4096, in two runs
    at N 7168 and 8192 (docs/PERF.md (o)); at K=9216 it loses 3-9%. AR's does not (its
    result round follows): 5-7% slower there except at 512 x 2048. At three tile rows
    (M 257-384) both orders' peers-first wins where the round order leaves a whole tile row
    to one rank's lanes: RS +1.7-9.2% at K <= 4096 (one shape -2%), AR +2-11.5% at K 2048-9216
    (one shape -0.3%), two runs at M 320 / 384, N 7168 / 8192 (docs/PERF.md (p)); RS at
    K=9216 is split (M=384 +2-5%, M=320 -1..-4%), so it keeps the round order there."""
    if M <= BM and mode == "ar" and K > 1024:
        return 64, False, True
    if M <= BM:
        return 64, True, False
    if K <= 2048 and M <= 2 * BM:
        return 64, True, False
    if K <= 1024 and M <= 8 * BM:
        return None, True, False
    if mode == "rs" and K <= 4096 and 2 * BM < M <= 8 * BM:
        return None, True, False
    if mode == "ar" and 2 * BM < M <= 3 * BM:
        return None, True, False
    return None, False, False


def choose_sk(M: int, K: int, mode: str) -> bool:
    """Whether a fused sm90 plan nothing else was forced on runs the flat peers-first order
    with the split-K tail, where that plan has a partial last round to split (module
    docstring). Measured on 2x H200 (docs/PERF.md (q), two runs, N 7168 and 8192, M 320-1152
    off the grid's powers of two): at K >= 4096 it beats the plans it replaces (the round
    order with its lag round at K=9216, flat or per-list peers-first at K=4096) at every
    shape but two within 2.4%: RS up to +12%, AR up to +20% (640 x 7168 x 9216: AR from
    0.88x to 1.05x of torch.mm + NCCL). At K=2048 the pieces' loads and merge cost more than
    the idle lanes they fill (-4..-16%). From three to nine tile rows, where it was measured."""
    return mode in ("rs", "ar") and K >= 4096 and 2 * BM < M <= 9 * BM


def choose_flat(M: int, K: int, mode: str) -> bool:
    """Whether a fused sm90 plan nothing else was forced on runs the flat peers-first order
    (module docstring). Measured on 2x H200 (docs/PERF.md (q), two runs, N 7168 and 8192,
    against the plans of ``choose_small_m``): at five and six tile rows (M 513-768) with
    K <= 4096 the per-list order leaves most lanes idle in each list's last round, or the
    lane cost picks 224/256-wide tiles on 96 CTAs; one flat sequence of 128-wide tiles on
    every SM runs RS +3..+29% (K=2048: 576-704 rows go from 0.79-0.98x of torch.mm + NCCL
    to 0.97-1.13x) and AR +3..+8%. At four tile rows and below the lists are even (a
    2-4% loss), at K=9216 the round order's lag round wins (RS -3..-8%), and from nine tile
    rows the two orders split by shape (-8..+18%)."""
    return mode in ("rs", "ar") and K <= 4096 and 4 * BM < M <= 6 * BM


def choose_band(K: int, cta_group: int) -> int:
    """Unit rows per band: ``BAND_TILE_ROWS`` tile rows (16 rows of 1-CTA tiles, 8 rows of
    pair-tiles) once K > 1024; row-major below. Measured on 2x H200 (docs/PERF.md (d)): at
    K=9216 the bands make RS 1-13% and the GEMM alone 1-11% faster (rows of x and columns of
    w no longer fit L2 together); at K=1024 everything fits L2 and row-major was 1-3% faster."""
    if K <= 1024:
        return 0
    return max(1, BAND_TILE_ROWS // cta_group)


def choose_gemm_cluster(M: int, K: int) -> int:
    """cta_group of the plain GEMM (mode "gemm") on sm90: 2x1 clusters sharing w's tile, in
    bands of 8 pair rows, once K > 1024 and there are two tile rows to pair. Measured 2-11%
    faster than 1-CTA tiles at K >= 4096, M >= 512 on H200; slower at M=128 (one tile row)
    and mixed at K=1024 (docs/PERF.md (d)). ``make_plan`` still takes the 1-CTA plan where
    the pairs' lane cost is higher (``_gemm_one_cta_if_cheaper``)."""
    return 2 if K > 1024 and M > BM else 1


# The share of the SMs a 1-CTA round must fill for ``choose_gemm_pairs_full_round``
PAIRS_FILL = 0.9


def choose_gemm_pairs_full_round(M: int, K: int, tiles: int, sm_count: int) -> bool:
    """Whether the plain sm90 GEMM (bf16, nothing forced) at K <= 1024 (where
    ``choose_gemm_cluster`` keeps 1-CTA tiles) pairs its two tile rows on 2x1 clusters at the
    width the other rules chose, sharing w's tile: where the one round of 1-CTA tiles keeps
    at least ``PAIRS_FILL`` of the SMs busy, halving what each SM reads of w pays. One H100,
    M=256, every comparison of the two at one width in three runs (docs/PERF.md (ak)):
    N=7168 (128 tiles) +4.9% / +4.1% at 112 wide, +6.5% at 128, a tie at 144; N=8192 (128
    tiles) +6.4% at 128, +3.7% at 144; N 2880 / 5120 (52 / 92 tiles) -0.8% to -1.7% at
    every width."""
    return K <= 1024 and BM < M <= 2 * BM and tiles >= PAIRS_FILL * sm_count


def choose_gemm_tail_one_cta(M: int, K: int) -> bool:
    """Whether the plain sm90 GEMM (bf16, nothing forced) whose two tile rows would be paired
    on 2x1 clusters takes the 1-CTA plan instead where its last tile row holds 64 rows or
    fewer (M 129-192), at K <= 1024. Both kernels load that row's x in a box of its rows
    (``choose_x_box``). One H200 (docs/PERF.md (an), M 129 / 160 / 192, against the boxed
    pair plans in the same run): at K=1024 the 1-CTA plan won at N 5120 / 7168 (+2% to +8%)
    and at 129 x 8192 (+4%), and lost at 160 / 192 x 8192 (-5%). From K=4096 the pairs tied
    at N 5120 / 7168 (-2% to +2%) and won at N 8192 (+7% to +15%), so there they keep their
    plan. The rule came in (docs/PERF.md (al)) when only the 1-CTA kernel had the box:
    +5% to +51% against unboxed pairs. With 3+ tile rows (M 300, 520) the 1-CTA plans won and
    lost by turns (-13% to +21%): no rule there. A last row of 65-127 rows has no box
    (M 200: pairs ahead)."""
    return BM < M <= BM + 64 and K <= 1024


# Widths the plain GEMM's planner otherwise takes only where no width of ``FULL_NS`` divides N
DIVIDING_NS = (160, 192)


def choose_gemm_dividing_widths(N: int) -> tuple[int, ...]:
    """The widths of ``DIVIDING_NS`` dividing N that the plain sm90 GEMM (bf16, nothing
    forced) may take beside the ``FULL_NS`` ones that do, where ``lane_cost`` finds one
    ``FINE_GAIN`` cheaper (as the ``FINE_NS`` widths): at N=5120 a 256- or 128-wide plan
    leaves a partial last round that 32 tile columns of 160 end (1024 rows: two rounds of
    240 176-wide 1-CTA tiles, a partial column at N's edge, -> two of 256 160-wide ones).

    One H100, same-run A/B against the default, calls interleaved, two seeded orders
    (docs/PERF.md (bb), ``gpu_runs.sh OUT offgrid-forms``): N=5120, 2x1 clusters 160 wide
    at 512 x 4096 / 9216 +9.3 / +9.2% and +9.2 / +8.3% (0.94x -> 1.02x cuBLAS), 1024 x 4096
    +11.0 / +10.5%, 1024 x 9216 +9.0 / +7.6%, 2048 x 4096 +11.6 / +10.8% (0.89x -> 0.99x),
    2048 x 9216 +1.1 / +3.1%; 1-CTA 160 wide at 1024 x 1024 +14.9 / +12.2% (0.92x ->
    1.05x). Off those rows, against the plans it replaced (``offgrid-rules``, two orders):
    faster at all 22 shapes timed, N 2560 / 3072 / 6144 / 9216 / 10240 and 5120 at other M
    and K, +3..+14% (2048 x 3072 x 4096 +12%, 1024 x 6144 x 1024 +12%). Not at the rows
    ``choose_gemm_tail_one_cta`` re-plans (``launch.plan``). No grid plan moves: 160 and
    192 divide neither 7168 nor 8192."""
    return tuple(b for b in DIVIDING_NS if N % b == 0)


def choose_gemm_partial_width(K: int) -> bool:
    """Whether the plain sm90 GEMM's 1-CTA plan (bf16, nothing forced) may also take a width
    of ``PARTIAL_NS`` that does not divide N (a partial tile at N's edge) where its
    ``lane_cost`` is at most ``FINE_GAIN`` of the plan's: at K > 1024. Over N 2880 / 3584 /
    4096 / 5120 / 6144 / 7168 / 8192 and M up to 17000 at K 2048 / 4096 / 9216 that moves
    only N=5120 at M 1025-1152 (nine tile rows: 128 wide over three rounds -> 192 wide over
    two). One H100 (docs/PERF.md (an), ``gpu_runs.sh OUT mid-widths``, against the default
    plans in the same run): 1032 / 1100 x 5120 x 4096 +14% / +21%, x 9216 +15% / +21%
    (1100 x 5120 x 9216: 0.70x -> 0.85x cuBLAS). At K=1024 it would move 576 of those
    points, none of them timed."""
    return K > 1024


# A round of at least this many tiles is taken to keep L2's bandwidth busy: below it the SMs'
# own reads are the limit, above it L2's (``choose_gemm_one_round_width``)
ROUND_L2_TILES = 100
ONE_ROUND_NS = (112, 128, 144, 160, 176, 192, 208, 224)


def choose_gemm_one_round_width(M: int, N: int, K: int, sm_count: int) -> int | None:
    """The width for the plain sm90 GEMM's one-round 1-CTA plan (bf16, nothing forced) at 3-7
    tile rows and K >= 4096, or None where that rule does not apply. Such a round is bound by
    the reads of x's and w's tiles from L2, (BM + BN) x K a tile: with fewer than
    ``ROUND_L2_TILES`` tiles each SM's own reads set the pace (a wider tile costs more), with
    more L2's bandwidth over all of them does (more, narrower tiles read x again). So the
    width of least ``(BM + BN) x max(tiles, ROUND_L2_TILES)`` among ``ONE_ROUND_NS`` that
    divide N and whose tiles fit one round, where ``lane_cost`` counts columns and took the
    narrowest that fits.

    One H100, every 1-CTA width 144-224 against the default at N 2880 / 5120, M 264-896, K
    4096 / 9216. Fitted on the first run (docs/PERF.md (an): its picks +8.5% over the
    default on 14 shapes); judged on a second (docs/PERF.md (as), 20 shapes, three blocks):
    +10.3% geomean, +3.1..+22.3%, one tie (264 x 5120 x 9216, -0.6%); the floor at 90 or
    110 tiles gave +4.8% / +5.1%. Where the default plan is 2x1 clusters (M 264-392 x 2880)
    the 1-CTA widths lost 16-24% and the rule does not apply; no grid plan (N 7168 / 8192)
    is a one-round 1-CTA plan at K >= 4096. A third run on the rule's own code (PERF.md (at),
    calls interleaved): its widths beat the ones it replaced at all 20 moved shapes of N 2880
    / 5120 (+4.6..+17.7%), but at N=3072 (M 520 / 640) its 160 (a 32-column tile at N's
    edge) lost to the 128 it replaced at three of four shapes (-5..-8%): the widths are
    those dividing N, as every width that won was."""
    rows = ceil_div(M, BM)
    if K < 4096 or not 3 <= rows <= 7:
        return None
    fits = [((BM + b) * max(rows * ceil_div(N, b), ROUND_L2_TILES), b) for b in ONE_ROUND_NS
            if N % b == 0 and rows * ceil_div(N, b) <= sm_count]
    return min(fits)[1] if fits else None


def choose_gemm_pingpong(M: int, K: int, pingpong: TilePlan, cooperative: TilePlan) -> bool:
    """Whether the plain sm90 GEMM (bf16, nothing forced) runs ``pingpong`` (2x1 clusters,
    ping-pong MMA warp groups, the width of least ``lane_cost`` among ``PINGPONG_NS``) in
    place of ``cooperative``, the plan the other rules chose: at K <= 1024, from M=4096
    always, and below it where a lane has at least ``PINGPONG_MIN_ROUNDS`` tiles and the
    ping-pong plan's modelled time is the lower; at K >= 4096 by that model with its own
    share, 160 / 176 / 192 wide from M=4096 and 176 below (the last three paragraphs).

    Each warp group computes whole tiles by turns, so one tile's epilogue runs under the
    other group's mainloop; ping-pong's tiles are at most 192 wide, so it wins where the
    hidden epilogues outweigh the rounds its narrower tiles add. The model: a cooperative
    tile costs its lane cost plus ``PINGPONG_EPILOGUE`` of it (the two warp groups convert,
    store and hand the tile over while the tensor pipes idle; (v) measured that and the
    step to the next tile at 11% of a 224-wide tile at K=1024); in ping-pong only a lane's
    last epilogue shows: over r tiles a lane, ``lane_cost(pp) * (1 + e / r) <=
    lane_cost(coop) * (1 + e)``. e = 0.14 puts the bound between 1536 x 7168 (ratio 1.109
    at 4 tiles: lost) and 2560 x 8192 (1.113 at 7: won). From M=4096 the model is not
    enough: ping-pong won there at ratios up to 1.15 (many tiles a lane, against 1-CTA
    cooperative plans), so (ai)'s measured bound stands. At K=4096 the epilogue is 4% of a
    tile and the runs disagree: no rule there.

    Same-run A/B against the cooperative plans, K=1024 (docs/PERF.md (ai), (aq)):
    - M 4096-16384, N 7168 / 8192 (one H100): +2.3..+15% at all six shapes; M 4160-7552
      off the grid, N 2880-8192 (ratio 1.12-1.19, one H100): ping-pong faster at six of
      eight (+0.2..+12%), 1.6% slower at 4224 x 8192;
    - below M=4096, every shape of M 1280-3584 the model moves (24, N 2880 / 5120 / 7168 /
      8192): faster in both runs (one H200: +1.9..+30%, geomean +9.1%; one H100:
      +1.9..+38%, +12.0%), and 1536 x 7168, which it keeps cooperative, faster cooperative
      in three runs (+1..+5%);
    - M 512-1024 (one or two tiles a lane, ratio 1.12-1.21): -5..-35%.

    At K >= 4096 (plan depth), from M=4096, the same model with ``PINGPONG_EPILOGUE_DEEP``
    where the ping-pong plan is 176 or 192 wide (the widths timed there, at 5 stages:
    ``default_stages``). One H100, same-run A/B against the cooperative plans, calls
    interleaved, two seeded column orders (docs/PERF.md (at)), N 7168 / 8192, K 4096 / 9216:
    the ten shapes it moves (ratio 1.043-1.071, 10-42 tiles a lane) faster in both orders,
    +1.0..+4.9% (8192 x 8192 x 4096 +3.6 / +3.6%; 16384 x 7168 x 9216 +2.0 / +1.0% at 192
    wide); 4096 x 8192 (ratio 1.093 at 11 tiles: kept cooperative) -0.9..-2.2%. e = 0.09 puts
    the bound between those two ratios. Below M=4096 the model takes only 176-wide plans
    (``PINGPONG_DEEP_MID_N``): 2048 x 7168 x 4096 / 9216 (ratio 1.039, 5 tiles a lane) ran
    faster at 176 wide in five readings, +0.4..+2.9% (one H100, docs/PERF.md (as), (at),
    (au)), and 32 shapes it moves off the grid (M 1024-3968, N 3072-16384) in both orders,
    +0.7..+9.2% (au), while the 192-wide plans it picks at M 1536-3072 were mixed in (as)
    (2560 / 3072 x 7168: +3.0 / -2.4%; 3072 x 8192 x 9216: -5.6%). Between K=1024 and 4096
    nothing was timed.

    160 wide from M=4096 at K >= 4096 (``PINGPONG_DEEP_NS``; at the kernel's own 4 stages):
    at 8192 x 2880 the model's cooperative plan is 256 wide, its last tile column 64 of 256
    columns, and 160-wide ping-pong tiles divide N. One H100, same-run A/B, two seeded orders
    (docs/PERF.md (bb)): 8192 x 2880 x 4096 +8.8 / +4.3%, x 9216 +7.4 / +7.0% (0.94x ->
    1.01x cuBLAS); 160-wide cooperative tiles +4.7..+6.5%, 144-wide ping-pong -0.6..+6.7%.
    Against the plans it replaced at nine shapes of N 2560 / 2880, M 4096-10240
    (``offgrid-check``): +1.6..+12% at seven, 4096 x 2560 (160-wide cooperative before)
    -0.8..+0.6%."""
    def modelled_faster(e: float) -> bool:
        # over r tiles a lane only the last epilogue shows: cost(pp) (1 + e / r) against
        # cost(coop) (1 + e)
        tiles = pingpong.rounds - pingpong.lag
        return tiles >= PINGPONG_MIN_ROUNDS and (
            lane_cost(pingpong) * (1 + e / tiles) <= lane_cost(cooperative) * (1 + e))

    if K > 1024:
        widths = PINGPONG_DEEP_NS if M >= 4096 else (PINGPONG_DEEP_MID_N,)
        return K >= 4096 and pingpong.bn in widths and modelled_faster(PINGPONG_EPILOGUE_DEEP)
    return M >= 4096 or modelled_faster(PINGPONG_EPILOGUE)


# ``choose_gemm_pingpong`` below M=4096: a cooperative tile's epilogue as a share of its
# lane cost at K <= 1024, and the tiles a lane needs (fewer were not measured to win)
PINGPONG_EPILOGUE = 0.14
PINGPONG_MIN_ROUNDS = 3
# ``choose_gemm_pingpong`` at K >= 4096: the model's share there (docs/PERF.md (at), (au))
PINGPONG_EPILOGUE_DEEP = 0.09
# The ping-pong widths timed at 5 mainloop stages (K <= 1024 (ap), K >= 4096 (at)):
# ``default_stages`` gives them 5
PINGPONG_FIVE_STAGE_NS = (176, 192)
# ``choose_gemm_pingpong``'s widths at K >= 4096 from M=4096 (160 at 4 stages, (bb))
PINGPONG_DEEP_NS = (160, *PINGPONG_FIVE_STAGE_NS)
# ``choose_gemm_pingpong`` at K >= 4096 below M=4096: the one width measured to win there
PINGPONG_DEEP_MID_N = 176


# The width of the plain GEMM's 64-row tiles at M <= 64 (``choose_gemm_rows64``)
ROWS64_BN = 112


def choose_gemm_rows64(M: int, N: int, sm_count: int) -> bool:
    """Whether the plain sm90 GEMM (bf16, nothing forced) runs 64-row tiles
    ``ROWS64_BN`` wide: at M <= 64, where a 128-row tile computes at least half empty rows.
    One H100 (docs/PERF.md (ai)): at M=64 faster than the default 64-wide 128-row tiles at
    all 12 shapes (N 7168 / 8192 / 2880 / 5120, K 1024-9216), +4% to +53% (64 x 5120 x 9216:
    0.66x -> 1.00x cuBLAS; 64 x 7168 x 4096: 0.78x -> 1.01x). At M=192 / 320 (an odd count
    of 64-row halves) they won with some widths and lost with others (-30%): no rule."""
    return M <= 64 and N >= ROWS64_BN and ceil_div(N, ROWS64_BN) <= sm_count


def narrowest_one_round(widths: tuple[int, ...], N: int, clusters: int,
                        cluster_rows: int = 1) -> int | None:
    """The first of ``widths`` (narrowest first) whose tile columns, ``cluster_rows`` clusters
    each, fit one round of ``clusters``: the small-M rules' arithmetic (the narrowest width
    keeps the most SMs on w's stream, one round leaves none idle at its end)."""
    return next((b for b in widths if cluster_rows * ceil_div(N, b) <= clusters), None)


# The widths 64-row tiles on 2x1 clusters were timed at (``choose_gemm_rows64_pairs``); 80 /
# 96 run deep (``rows64_deep``)
ROWS64_PAIR_NS = (64, 80, 96, 112, 128)


def choose_gemm_rows64_pairs(M: int, N: int, clusters: int) -> int | None:
    """The width at which the plain sm90 GEMM (bf16, nothing forced) runs 64-row tiles on 2x1
    clusters along M, or None (the other rules): at 64 < M <= 128, the narrowest of
    ``ROWS64_PAIR_NS`` whose tile columns fit one round of ``clusters``. The pair's two
    64-row tiles share w's tile (each CTA loads half of it for both), so a 128-row unit of
    x runs on two SMs where a 128-row tile ran on one: twice the SMs pull w at the same
    bytes, and the narrowest width keeps the most of them busy. cuBLAS's form at 128 x 7168
    (``nvjet ... 112x64 ... 1x2``: 64 x 112 tiles on 1x2 clusters, Nsight Compute,
    docs/PERF.md (aq)).

    One H100, against the default 64-wide 128-row 1-CTA plans (docs/PERF.md (aq)), M=128:
    N=2880 (64 wide) +9 / +16 / +17% at K 1024 / 4096 / 9216 (0.81x -> 0.95x cuBLAS at
    9216); N=5120 (112) -1 / +3 / +6%; N=7168 (112) and 8192 (128) +0..+1%. A second run,
    five interleaved blocks, against the 128-row plans at M 80 / 100 / 128 (36 shapes):
    M=128 +4.8% (-0.3..+19%), M 80 / 100 +20% (+6..+50%). At M 192 / 256
    (four 64-row tiles) they lost at most shapes (-10..-45%); at M=64 (a padding tile in
    every pair) they tied or won at N 2880 / 5120 against ``choose_gemm_rows64``'s 1-CTA
    plans: no rule there yet.

    80 / 96 wide, which run 11 / 10 stages (``rows64_deep``), come before 112. One H100,
    same-run A/B against the 112-wide pairs at 8 stages (docs/PERF.md (bd), two seeded
    orders): 128 x 5120 x 4096 / 9216 80 wide at 11 stages +3.9 / +4.0% and +6.0 / +6.3% (96
    wide at 10: +2.6..+4.5%). One H200 at K 1024 / 2048 (PERF.md (bf), M 96 / 128, N 4608 /
    5120 / 6144, two orders), against the 112-wide pairs then the default there: 80 wide
    +10..+12% at N 4608 / 5120 (128 x 5120 x 1024 0.89x -> 0.99x cuBLAS), -10..-16% at N=6144
    (two rounds); 96 wide +4..+8% at all 12. So the widths do not depend on K."""
    if not TILE_MS[0] < M <= BM:
        return None
    return narrowest_one_round(ROWS64_PAIR_NS, N, clusters)


# The widths 64-row tiles on 4x1 clusters run at (``choose_gemm_quads``): w's tile splits
# four ways in whole 8-row atoms; at K <= ``QUAD_SHORT_K`` only 96 (128 lost at 256 x 3072
# there); K 1025-2047 not timed
QUAD_NS = (96, 128)
QUAD_MIN_K = 2048
QUAD_SHORT_K = 1024
QUAD_MAX_N = 3584  # the widest N timed; 128 wide filling 32 clusters (N 3969-4096) was not


def choose_gemm_quads(M: int, N: int, K: int, clusters: int) -> int | None:
    """The width at which the plain sm90 GEMM (bf16, nothing forced) runs 64-row tiles on 4x1
    clusters along M (``cta_group`` 4), or None (the other rules): at four tile rows of 64 (M
    193-256), N <= ``QUAD_MAX_N`` and K >= 2048, the narrowest of ``QUAD_NS`` whose tile columns
    fit one round of ``clusters`` 4x1 clusters (96 wide to N=2880 on an H100 holding 30, N=3072
    on one holding 32; 128 beyond); at K <= 1024, 96 wide on the same terms. The four CTAs of a
    tile column share w's tile (each loads a quarter for all four), so w, the operand these
    memory-bound shapes stream, leaves L2 once per column instead of once per tile row, and
    64-row tiles put four SMs on it where a 128-row tile put two. cuBLAS's form at 256 x 2880
    (``nvjet ... 96x64 ... 2x4``: 64 x 96 tiles on clusters of four along M, docs/PERF.md (bc)).
    ``clusters`` is the GPU's (the occupancy query): H100s of 132 SMs hold 30 or 32 (their GPCs
    differ), which moves the width at N 2881-3072.

    One H100 holding 32, same-run A/B against the default (docs/PERF.md (bd), two seeded
    orders, five blocks): 256 x 2880 x 4096 +13 / +15% (96 wide), x 9216 +22 / +23% (0.80x
    -> 0.98x cuBLAS), 128 wide +7 / +13%. At 256 x 5120 / 7168 (two rounds of them) they
    lost, as did 64 wide at 256 x 2880 (two rounds). ``small-m-rules`` (M 200 / 256, N
    1536-3584, K 4096 / 9216, against the 128-row plans): +5..+92% at all 24; 64 wide in one
    round (N <= 2048) lost to 96 there by 0-35%; at N=3072 (96 wide filling all 32) 128 wide
    was +2..+4% faster. At K=1024, 96 wide: N 1536-2880 +11..+19% at M=200, +1..+8% at
    M=256, N=3072 -3..-13%. One H100 holding 30 (PERF.md (be), two orders): 96 wide filling
    all 30 (N=2880) against 128 wide +3..+8% at M 200-256, K 2048-9216 (and +13..+47%
    against the 128-row plans at M 200 / 224, K 1024-4096); 96 wide in two rounds (N=3072)
    -18..-31%. K=2048: 96 wide +8% at 256 x 2880, +45% at 200 x 2880; 128 wide +4% at 256
    x 3072. So a round may fill every cluster: the 2-4% at 32 of 32 is given up for the
    3-8% at 30 of 30."""
    if not 3 * TILE_MS[0] < M <= 4 * TILE_MS[0] or N > QUAD_MAX_N:
        return None
    widths = QUAD_NS if K >= QUAD_MIN_K else QUAD_NS[:1] if K <= QUAD_SHORT_K else ()
    return narrowest_one_round(widths, N, clusters)


# 128-row tiles on 4x1 clusters (``choose_gemm_quads128``): their width, the rows timed (three
# tile rows, the last at least half full), the shallowest K timed, and the share of the
# clusters a round must fill (96 wide: 27 columns of 30 at N=2560 won, 24 at N=2304 did not)
QUAD128_BN = 96
QUAD128_M = (320, 384)
QUAD128_MIN_K = 4096
QUAD128_FILL = 0.9


def choose_gemm_quads128(M: int, N: int, K: int, clusters: int) -> int | None:
    """The width at which the plain sm90 GEMM (bf16, nothing forced) runs 128-row tiles on
    4x1 clusters along M (``cta_group`` 4), or None (the other rules): at three tile rows
    (M 320-384), K >= 4096, ``QUAD128_BN`` wide where its tile columns fill one round of
    ``clusters`` 4x1 clusters to ``QUAD128_FILL`` or more (N 2560-2880 on a GPU holding 30).
    A cluster is one tile column: its CTAs split w's tile four ways (the fourth a padding tile
    reloading the last row), so w, which these shapes stream from DRAM, is read once a column
    by 120 SMs, where the 1-CTA 64-wide and 112-wide pair plans they replace read it with
    108-120 SMs in 1-CTA tiles or with 104 in pairs.

    One H100 holding 30 (docs/PERF.md (bh), ``gpu_runs.sh quads128``, two seeded orders, five
    blocks, against the default): N 2560 / 2880 x K 4096 / 9216 at M 320 / 384 +3.9..+20.9% at
    all 8 (384 x 2560 x 9216 0.69x -> 0.83x cuBLAS, 384 x 2880 x 4096 0.83x -> 0.90x); N=2304
    (24 columns: 80% of a round) -9.0% at 320 x 4096, +1..+13% at the other three; N=3072 (32
    columns: two rounds) -33..-41% at all four; at four tile rows (M 448 / 512) -3..+3% against
    the 96-wide pairs (PERF.md (bg): the same on another H100). 64 and 128 wide lost
    everywhere (-25% / -13%)."""
    lo, hi = QUAD128_M
    if not lo <= M <= hi or K < QUAD128_MIN_K:
        return None
    columns = ceil_div(N, QUAD128_BN)
    return QUAD128_BN if QUAD128_FILL * clusters <= columns <= clusters else None


# The pair widths ``choose_gemm_pairs_short`` takes, narrowest first, and the deepest K timed
PAIRS_SHORT_NS = (80, 96)
PAIRS_SHORT_MAX_K = 2048
PAIRS_SHORT_MIN_N = 2048  # the narrowest N timed (narrower ones keep the cost model's widths)
# One pair row (two 128-row tile rows of which the last holds 64 or more, M 192-256): from this
# N, at every K, and the mainloop stages at each width (0: the kernel's own); one H200, PERF.md
# (bf); M 129-191 (a shorter last row, 1-CTA at K <= 1024) and N < 4608 were not timed
PAIRS_ONE_ROW_MIN_M = 192
PAIRS_ONE_ROW_MIN_N = 4608
PAIRS_ONE_ROW_STAGES = {80: 8, 96: 0}


def choose_gemm_pairs_short(M: int, N: int, K: int, clusters: int) -> int | None:
    """The width at which the plain sm90 GEMM (bf16, nothing forced) runs 128-row tiles on 2x1
    clusters along M at three or four tile rows (M 257-512), K <= 2048 and N >=
    ``PAIRS_SHORT_MIN_N``, or None: the narrowest of ``PAIRS_SHORT_NS`` whose pairs fit one
    round of ``clusters``. Where the cost model picked 112-wide 1-CTA tiles (K=1024) or 64-wide
    ones (K=2048, N <= 2560), narrower pairs put more SMs on w's stream and load each w tile
    once for two tile rows; cuBLAS runs 88 x 128 tiles at 512 x 2880 (docs/PERF.md (bc)).

    One H100 (PERF.md (be), same-run A/B against the default, two seeded orders, five
    blocks; M 384 / 448 / 512 x N 2048 / 2560 / 2880 / 3072 / 3584 x K 1024 / 2048): 80 wide
    at N 2048 / 2560 +6..+15% at 11 of 12 shapes (384 x 2048 x 2048 -4 / -5%: its 64-wide 1-CTA
    plan); 96 wide at N 2880 / 3072 +4..+9% at all 12 (512 x 2880 x 1024 0.92x -> 0.99x
    cuBLAS); at N=3584 neither fits (112-wide pairs ran as the default, -1..+1%). 80 wide
    where its pairs need two rounds (N=2880) -13..-25%. K >= 4096 at four tile rows:
    ``choose_gemm_pairs96``.

    At one pair row (M ``PAIRS_ONE_ROW_MIN_M``-256) from N = ``PAIRS_ONE_ROW_MIN_N`` at every
    K, at ``PAIRS_ONE_ROW_STAGES``, where the default ran 112-wide pairs or 1-CTA tiles (46 of
    66 pairs busy at N=5120): one H200 (PERF.md (bf), same-run A/B against the default, two
    seeded orders, five blocks; M 192 / 256, N 4608 / 5120 / 6144, K 1024 / 4096 / 9216): 80
    wide at 8 stages +8..+24% at all 12 shapes of N 4608 / 5120 (256 x 5120 x 1024 0.93x ->
    1.01x cuBLAS, x 9216 0.92x -> 1.09x); 96 wide +2..+10% at all 6 of N=6144 (80 wide there:
    two rounds, -18..-29%). 64-row tiles on 4x1 clusters 192 wide at M 200-256, N 4608-5760
    gained less (+0..+17%, +2..+4% at 256 x 5120)."""
    if PAIRS_ONE_ROW_MIN_M <= M <= 2 * BM and N >= PAIRS_ONE_ROW_MIN_N:
        return narrowest_one_round(PAIRS_SHORT_NS, N, clusters)
    if not 2 * BM < M <= 4 * BM or K > PAIRS_SHORT_MAX_K or N < PAIRS_SHORT_MIN_N:
        return None
    return narrowest_one_round(PAIRS_SHORT_NS, N, clusters, ceil_div(ceil_div(M, BM), 2))


def pairs_one_row(plan: TilePlan) -> bool:
    """Whether the plain sm90 GEMM's plan is ``choose_gemm_pairs_short``'s at one pair row:
    128-row tiles 80 / 96 wide on 2x1 clusters along M, M ``PAIRS_ONE_ROW_MIN_M``-256, N >=
    ``PAIRS_ONE_ROW_MIN_N`` (``default_stages`` gives it ``PAIRS_ONE_ROW_STAGES``: a
    memory-bound round of two tile rows runs on its loads in flight; 80 wide was timed at 8,
    the most that leave the ring 2 slots, PERF.md (bf))."""
    return (plan.mode == "gemm" and plan.cta_group == 2 and not plan.pair_n and plan.bm == BM
            and plan.bn in PAIRS_ONE_ROW_STAGES and PAIRS_ONE_ROW_MIN_M <= plan.M <= 2 * BM
            and plan.N >= PAIRS_ONE_ROW_MIN_N)


def choose_gemm_split(M: int, K: int, pieces: int, boxed: bool = True) -> bool:
    """Whether the plain GEMM's one round of 64-row tiles (``choose_gemm_rows64``) is cut along
    K onto a grid widened to ``pieces`` lanes a tile (``launch.geometry.with_sk``): there a
    round of ``ceil(N / 112)`` tiles leaves most SMs idle while each tile streams its share of
    w. ``boxed``: x loads in boxes of M rows (``choose_x_box``; M < 64).

    With the box (one H100, docs/PERF.md (al), M 1-32, N 2880 / 5120 / 7168, K 4096 / 9216,
    cut against uncut in the same run): uncut won at K=4096 everywhere (+8% to +14%: 1 x 5120
    x 4096 0.83x -> 0.95x cuBLAS) and at K=9216 with 2 pieces (+5% to +7%); with 5 pieces
    (N=2880) at K=9216 the cut tied at M <= 16 and won at M=32 (+5%). K 4097-9215 is unmeasured.
    Without it (docs/PERF.md (aj), against the unsplit tiles): at N=2880 K >= 4096 it won at
    every M (+13% to +36% at K=9216); with 2 pieces +3% to +24% at M <= 16, mixed at M=32
    and -1% to -10% from M=48; at K=1024 it lost everywhere (-15% to -40%): the merge
    outweighs the k-blocks it spreads. The box is what the cut was making up for: a 64-row box
    of one row slows every k-block, and the cut spread those k-blocks over idle SMs."""
    if boxed:
        return K >= 8192 and pieces >= 5
    return K >= 4096 and pieces >= 2 and (pieces >= 5 or M <= 16)


def choose_x_box(mode: str, M: int) -> bool:
    """Whether a call whose last tile row holds fewer rows than the tile loads that row's x
    in boxes of those rows rounded up to one of ``launch.geometry.X_ROWS``
    (``launch.resolve.x_rows_for``; those dividing no tile where ``X_BOX_UNEVEN``) rather
    than the tile's rows: the plain GEMM, wherever a kernel has the box (bf16 / fp16
    operands on 1-CTA tiles and on 2x1 / 4x1 clusters along M). The TMA fills a box's rows
    beyond x with zeros at a cost, not for free. Against the same plans with whole boxes:
    - 1-CTA, one H100 (docs/PERF.md (al), M 1-64, N 2880 / 5120 / 7168 / 8192, K 1024 / 4096 /
      9216): geomean 0.904x -> 0.935x cuBLAS, up to +20% (1 x 8192 x 9216: 0.81x -> 0.98x); a
      tie at M=64 (the box is the tile). With the uncut plans ``choose_gemm_split`` then
      picks: 0.955x. Where the box is at most half a 128-row tile, the other half's MMA warp
      group idles (docs/PERF.md (am): the split-K tail's last round at M 300 / 520 +5..+23%);
    - 2x1 clusters, one H200 (docs/PERF.md (an), M 129-3000 with a last row of 8-64 rows, N
      2880-8192, K 1024-9216): geomean +11.8% over 72 shapes, +4.2% over 68 more; up to +71%
      (129 x 8192 x 9216) on 128-wide pairs at N 5120-8192 and K >= 4096, whose w tile is
      no larger than x's; at N=2880, K=1024 and 224 / 256 wide a tie (-4% to +5%)."""
    return mode == "gemm"


# Whether the rule's box (``choose_x_box``) also takes the boxes that divide no tile (48 / 80 /
# 96 / 112 rows: a last tile row of 33-48 or 65-112 rows; ``launch.resolve.x_rows_for``), in
# place of the next dividing box (64, or the tile's 128), which the TMA fills with up to 63 zero
# rows. One H100 (docs/PERF.md (bh), ``gpu_runs.sh x-box-wide``: M 40-2000 whose last row
# holds 36-44 or 72-112 rows, N 2880 / 5120 / 7168, K 1024 / 9216, two seeded orders, five
# blocks, against the dividing boxes): geomean +3.6%, faster at 37 of 60 shapes in both
# orders, up to +39% (200 x 5120 x 9216: 0.76x -> 1.06x cuBLAS; 224 x 5120 x 9216 +23%, 200 x
# 7168 x 9216 +23%, 100 x 2880 x 9216 +20%), slower in both at 9, by 0.9% at most. Correct
# there: tests/gpu/test_x_loads_gpu.py (the boxes bitwise the whole box's, 278 + 291 passed)
# and the partial-tile and 64-row suites with it on.
X_BOX_UNEVEN = True

# The mainloop loads' L2 eviction priority where ``choose_gemm_l2_hint`` applies
# (``launch.geometry.L2_HINTS``)
GEMM_L2_HINT = "last"


def choose_gemm_l2_hint(mode: str, M: int, K: int, fp8: bool) -> str:
    """The L2 eviction priority the mainloop's TMA loads of x and w carry
    (``Variant.l2_hint``; "": the DSL's own policy operand of 0): ``GEMM_L2_HINT`` for the
    plain sm90 GEMM of bf16 / fp16 operands at K <= 1024 and M >= 512. One H100
    (docs/PERF.md (ba), 48 shapes, two orders, against the default in the same run): at
    K=1024 and M 512-16384 +0.2..+4.6% at every shape in both (N 7168 / 8192; most at M
    1024-4096: 2048 x 7168 x 1024 0.926x -> 0.951x cuBLAS); at M 128 / 256 -1.7..+1.5%, at
    K 4096 / 9216 -1.7..+0.6% (geomean 0.999x). A reading, not measured: at K=1024 each
    tile's output is written after 16 k-blocks, so the stores of M x N results compete with
    the reads of x and w for L2, and loads marked evict-last keep the operands other CTAs
    still read. fp8 operands (half the bytes a k-block) were not timed with it."""
    if mode == "gemm" and not fp8 and K <= 1024 and M >= 512:
        return GEMM_L2_HINT
    return ""


def choose_fused_cluster(M: int, K: int, mode: str) -> int | None:
    """The lag of a fused sm90 plan on 2x1 clusters, or None for 1-CTA tiles (``_make_plan``
    takes the pair plan only where it is allowed: lag 1 where ``pairs_whole`` and 3+ rounds
    hide the slack, lag 0 only where ``pairs_whole`` too). The pair-tile halves the loads of
    w per output tile, which pays once the mainloop dominates. Measured on 2x H200 against
    the 1-CTA plan in the same run, N 7168 / 8192:
    - lag 1 (docs/PERF.md (e), K 2048-9216, M 2048-16384): RS 0-9% faster (one shape 3%
      slower), geomean 4.3%; AR from M=4096 -3..+7%, geomean 1.5%;
    - lag 0 from 4 tile rows up to the lag-1 range (docs/PERF.md (g)): AR at K >= 4096 0-6%
      faster at M 512, 1024, 1536 and 2048 (4-5% slower at K=1024); RS at K=9216 5% at
      M=512 and 1-3% at M=1536 (a tie at 1024; at K=4096 ties). Where a pair would straddle
      two owners (M 640 and 768 here) the 2x1 plan lost up to 12% (RS) and 9% (AR), hence
      ``pairs_whole``."""
    if K > 1024 and M >= (2048 if mode == "rs" else 4096):
        return 1
    if M > 3 * BM and K > (1024 if mode == "ar" else 4096):
        return 0
    return None


def default_push(arch: str, transport: str, mode: str = "rs") -> str:
    """How partials reach peers by default: bulk copies on sm90 unicast (measured 8-13%
    faster RS than thread stores on 2x H200), and for AR its reduced tiles too (1-2% at
    link-bound shapes, docs/PERF.md); thread stores elsewhere."""
    if arch != "sm_90a" or transport != "unicast":
        return "lsu"
    return "tma_all" if mode == "ar" else "tma"


def auto_push_all(mode: str, transport: str, push: str) -> bool | None:
    """``make_plan``'s push_all for an op that forces nothing: None (the plan's choice,
    ``choose_push_all``) where a kernel can run push-all (AR over unicast with bulk-copy
    pushes), else False."""
    return None if mode == "ar" and transport == "unicast" and push != "lsu" else False


def default_prefetch(arch: str, world: int, transport: str, mode: str) -> int:
    """1 where a kernel's reductions load one sub-tile ahead by default (``CommWarps``
    ``prefetch``): sm90 fused kernels at world 2 over unicast (docs/PERF.md (j))."""
    return int(arch == "sm_90a" and world == 2 and transport == "unicast" and mode != "gemm")


def default_early_copy(arch: str, transport: str, plan: TilePlan) -> int:
    """1 where AR copies its results back during the rounds (``Sm90FusedKernel``
    ``early_copy``): sm90 owner plans over unicast with the lag round. Same run on 2x H200
    (docs/PERF.md (l), M 1024-16384): geomean 1.022x, 4-11% faster at K=1024 from M=4096,
    none slower beyond the noise."""
    return int(arch == "sm_90a" and transport == "unicast" and plan.mode == "ar"
               and not plan.push_all and plan.lag == 1)


def default_push_window(arch: str, transport: str, push: str, plan: TilePlan) -> int:
    """1 where a CTA keeps one sub-tile's bulk copies in flight at a time (``CommWarps``
    ``push_window``): sm90 unicast AR owner plans and RS peers-first plans. Same run on
    2x H200 (docs/PERF.md (n)): AR 1.6-2.3% faster at M 1024-4096, none slower; RS 7%
    faster at M=1024, K=1024 (peers-first), but 3-8% slower at K=1024 from M=2048
    (many rounds, link-bound), so RS's other plans keep all of a tile's copies in flight."""
    if arch != "sm_90a" or transport != "unicast" or push == "lsu":
        return 0
    if plan.mode == "ar":
        return int(not plan.push_all)
    return int(plan.mode == "rs" and plan.peers_first)


# The mainloop stages of the GEMM alone's one round of 112-wide pairs along M at two tile
# rows and K >= 4096 (``narrow_pairs_deep``)
NARROW_PAIR_STAGES = 7


def narrow_pairs_deep(plan: TilePlan) -> bool:
    """Whether the plain sm90 GEMM's plan is one round of 112-wide 128-row tiles paired along
    M (2x1 clusters sharing w's tile) over two to four tile rows (M 129-512) at a plan depth K >=
    4096, where ``default_stages`` gives it ``NARROW_PAIR_STAGES`` mainloop stages: the
    kernel's own 6 fit beside the whole-tile ring, a seventh leaves the ring 3 of the tile's
    7 16-column slots (the store warp hands them back slot by slot). Each CTA streams all of
    its x rows and half of w's tile from L2 with nothing to overlap but the next k-block, so a
    deeper queue of loads is what such a memory-bound round runs on.

    One H100, same-run A/B against the default's 6 at M=256 (docs/PERF.md (at), calls
    interleaved, two seeded column orders, five blocks each): 256 x 7168 x 4096 +1.9 / +2.1%,
    256 x 7168 x 9216 +4.2 / +3.9%; in blocks a session earlier (PERF.md (as), ``pn-cublas``)
    +2.2 / +3.7%. At K=1024 +0.5 / -0.3% (left at 6); 4-6 stages -0.6..+1.3% at every M=256
    shape. M=128 (64-row pairs, ``choose_gemm_rows64_pairs``) at 7: -1.3..+2.0%, no rule;
    128-wide pairs (256 x 8192) leave no room for a seventh stage. Timed at N=7168 (the
    grid's 112-wide pairs); M 129-255 run the same plan with fewer rows in the last tile row.
    Four tile rows (two pair rows, N <= 3696 to fit one round), same-run A/B against
    ``c2+bn112`` at 6 (docs/PERF.md (bb), two orders): 512 x 2880 x 4096 +4.0 / +3.5%,
    x 9216 +6.0 / +5.6%; three tile rows run the same pair rows, one of them half empty.
    Off those shapes (``offgrid-rules``, M 320-512, N 2560-3584): -0.5..+5.7% at 7 shapes."""
    return (plan.mode == "gemm" and plan.cta_group == 2 and not plan.pair_n
            and plan.bn == 112 and plan.bm == 128 and 2 <= plan.tiles_m <= 4
            and plan.rounds == 1 and plan.K >= 4096)


# The most mainloop stages a 64-row tile of each width holds beside a 2-slot sub-tile ring
# (``Sm90FusedKernel``'s shared-memory budget; tests/test_small_m_deep.py checks them)
ROWS64_FIT_STAGES = {64: 13, 80: 12, 96: 10, 112: 10, 128: 9}
# What ``rows64_deep`` gives the widths it was timed at (80: at 11, one short of the fit;
# 128: on 4x1 clusters only)
ROWS64_DEEP_STAGES = {64: 13, 80: 11, 96: 10, 128: 9}
ROWS64_DEEP_MIN_K = 4096
ROWS64_DEEP_ANY_K = (64,)  # the widths timed deep at K=1024 too
ROWS64_PAIR_DEEP_ANY_K = (80, 96)  # and on 2x1 clusters (one H200, PERF.md (bf))


def rows64_deep(plan: TilePlan) -> bool:
    """Whether the plain sm90 GEMM's plan of 64-row tiles (``choose_gemm_rows64``,
    ``choose_gemm_rows64_pairs``, ``choose_gemm_quads``) runs ``ROWS64_DEEP_STAGES``: 64 wide
    and 4x1 clusters at any K, 80 / 96 on 2x1 clusters at any K (one H200, PERF.md (bf), at
    K 1024 / 2048 in ``choose_gemm_rows64_pairs``'s A/B), on 1-CTA tiles at a plan depth K >=
    4096. A 64-row tile's k-block is small (64 x 64 tiles: 16 KiB, so the kernel's 8 stages
    keep 128 KiB in flight where a 128-row tile's keep 190), and these memory-bound rounds
    run on the loads in flight. cuBLAS runs 64-row tiles at 10-13 stages at these shapes
    (docs/PERF.md (bc)).

    One H100, same-run A/B (docs/PERF.md (bd), two seeded orders, five blocks): 128 x 2880
    x 4096 / 9216 at 13 stages (64 wide, 2x1 clusters) +11 / +12% and +16 / +16%; 64 x 80
    pairs at 11 (``choose_gemm_rows64_pairs`` at K >= 4096) and 64 x 96 tiles on 4x1
    clusters at 10 were timed so. 112 wide at 10 (the M=128 plans at N 5120 / 7168): -0.7
    .. +3.0%, no rule. Off those shapes (``small-m-rules``, against 8 stages, two orders):
    the pairs at M 96 / 128, N 2048-4096 +7..+22% at K 4096 / 9216 (every shape), and 64
    wide at K=1024 +2.1..+6.0% (six shapes); the 4x1 clusters 128 wide (N=3584) at 9 +1..+5%.
    2x1 clusters 128 wide (the grid's 128 x 8192) were not timed deeper."""
    if plan.mode != "gemm" or plan.bm != TILE_MS[0] or plan.sk:
        return False
    if plan.bn in ROWS64_DEEP_ANY_K or (plan.cta_group == QUAD and plan.bn in ROWS64_DEEP_STAGES):
        return True
    if plan.cta_group == 2 and plan.bn in ROWS64_PAIR_DEEP_ANY_K:
        return True
    # 128 wide only on 4x1 clusters (above): 2x1 pairs that wide were not timed deeper
    return plan.bn in ROWS64_DEEP_STAGES and plan.K >= ROWS64_DEEP_MIN_K and plan.bn != 128


PAIRS96_BN = 96


def choose_gemm_pairs96(plan: TilePlan, clusters: int) -> bool:
    """Whether the plain sm90 GEMM's one round of 112-wide pairs (``narrow_pairs_deep``) at
    four 128-row tile rows (M 385-512) runs 96 wide instead, where 96-wide pairs still fit
    one round of ``clusters``: at 512 x 2880 cuBLAS runs 88 x 128 tiles on 132 SMs (PERF.md
    (bc)), more SMs on w than our 112-wide pairs' 104.

    One H100, same-run A/B against the default (112-wide pairs at 7 stages; docs/PERF.md
    (bd), ``small-m-rules``, two seeded orders, five blocks): M 448 / 512, N 2560 / 2880 /
    3072, K 4096 / 9216: +4..+10% at all 12 shapes in both (512 x 2880 x 9216 +5 / +5%,
    448 x 2560 x 4096 +10 / +9%). At three tile rows not timed."""
    return (narrow_pairs_deep(plan) and plan.tiles_m == 4
            and plan.tiles_m // 2 * ceil_div(plan.N, PAIRS96_BN) <= clusters)


def default_stages(arch: str, transport: str, push: str, plan: TilePlan,
                   tma_store: int = 0, pingpong: int = 0) -> int:
    """4 where a 224- or 256-wide sm90 plan gives each lane few tiles, or where the GEMM
    alone stores by TMA (``tma_store``) at those widths and a plan depth K <= 1024 (timed on
    bf16; fp16 moves the same bytes at the same MMA rate, and an fp8 call plans as bf16 at
    half its depth); 5 where that GEMM runs ping-pong warp groups (``pingpong``) on 2x1
    clusters 176 or 192 wide at K <= 1024 or K >= 4096 (``choose_gemm_pingpong``'s plans;
    at K >= 4096 the rule's gains were timed at 5, docs/PERF.md (at)); 7 on its one round of
    112-wide pairs at two to four tile rows and K >= 4096 (``narrow_pairs_deep``);
    ``ROWS64_DEEP_STAGES`` on its 64-row plans (``rows64_deep``, docs/PERF.md (bd)); else 0
    (the kernel's own: as many stages as fit beside a whole-tile sub-tile ring, 3 at 224 /
    256 wide, 6 at 112 / 128; 4 for ping-pong).

    Ping-pong at five stages: the ring then holds less than a tile, which the store warp's
    slot-by-slot hand-back (below) makes cheap, and the two warp groups' mainloops get a fifth
    k-block in flight. One H100, two runs, same-run A/B at the width the plan chose
    (docs/PERF.md (ap)): all six shapes of ``choose_gemm_pingpong`` (M 4096-16384, N 7168 /
    8192, K=1024) faster in both, +0.5..+3.5% and +1.7..+4.1% (16384 x 7168 x 1024 1.14x ->
    1.19x cuBLAS in the second); a third run tied (-0.8..+0.7%, within that run's 2% spread
    of one kernel under two names). Ping-pong forced elsewhere (1-CTA, other widths, K
    between 1024 and 4096) was not timed at five stages and keeps four.

    The fused op: the ring's depth lets a lane's MMA warps start its next tile while the
    last one is pushed; with at most two tiles per lane there is little next tile to start,
    and a fourth stage keeps more k-blocks in flight instead. Same runs on 2x H200
    (docs/PERF.md (t), two runs, N 7168 / 8192, K 1024-9216, M 384-1152), four stages
    against three: RS +1.3..+5.7% and AR +3.3..+3.8% on 224-wide two-round plans at K >=
    2048 (M 896-1024); K=1024 ties (0.98-1.02), RS plans that split a shared row lose up to
    7% (1152 x 7168) (docs/PERF.md (s)). Bulk-copy pushes on unicast only, where it was
    measured.

    The GEMM alone with TMA stores at K <= 1024: a mainloop starved of k-blocks at three
    stages (Nsight Compute at 2048 x 7168 x 1024: the MMA warps' samples sit mostly in the
    stage waits, the tile's 16 k-blocks too few to run ahead), and since the store warp hands
    the ring's oldest slot back once its store has read it (not the whole ring at once), a
    ring one slot (224) or four slots (256) short of the tile costs the epilogue little.
    One H100, two runs, same-run A/B against three stages (docs/PERF.md (ao)): 1-CTA plans
    at M 512-2048 +1.0..+4.9% in both (1024 x 7168 x 1024 1.011x -> 1.061x cuBLAS, 2048 x
    7168 x 1024 0.892x -> 0.928x), M=256 +2.0 / -2.4%. From K=4096 the runs disagree
    (2x1 clusters, M >= 2048: +1.3..+2.5% in one, -8.6..+2.8% in the other, -1.3..-6.2% at
    M >= 4096), so there the rule above stands; under the whole-ring hand-back four stages
    lost 1-6% from four tiles a lane ((s))."""
    if arch != "sm_90a" or transport != "unicast" or push == "lsu" or plan.sk:
        return 0
    if tma_store and not pingpong and narrow_pairs_deep(plan):
        return NARROW_PAIR_STAGES
    if tma_store and not pingpong and rows64_deep(plan):
        return ROWS64_DEEP_STAGES[plan.bn]
    if tma_store and not pingpong and pairs_one_row(plan):
        return PAIRS_ONE_ROW_STAGES[plan.bn]
    if tma_store and plan.mode == "gemm" and pingpong and (plan.K <= 1024 or plan.K >= 4096):
        return 5 if plan.cta_group == 2 and plan.bn in PINGPONG_FIVE_STAGE_NS else 0
    if tma_store and plan.mode == "gemm" and plan.K <= 1024:
        if plan.bn in (224, 256):
            return 4
    if plan.K < 2048 or plan.split_row:
        return 0
    tiles = plan.rounds - plan.lag
    if plan.bn == 224 and tiles <= (3 if plan.mode == "gemm" else 2):
        return 4
    return 4 if plan.bn == 256 and tiles <= 1 else 0


def default_lean_exit(arch: str, transport: str, mode: str) -> int:
    """1 where fused kernels end without system fences or ``done`` stamps
    (``protocol.finish_launch``): nowhere yet. The start stamps make those fences
    unnecessary, and the lean exit passed the GPU suite on one shared GPU at world 2 and 4
    (docs/PERF.md (u)); it becomes the default once it is timed on two GPUs against the
    fenced exit (bench columns ``rs_lean`` / ``ar_lean``)."""
    return 0


def default_tma_store(arch: str, push: str, mode: str) -> int:
    """1 where the plain GEMM stores its output by TMA (``Sm90FusedKernel`` ``tma_store``):
    sm90 with bulk-copy rows in its ring. One H200, same run, the issue's 48 shapes
    (docs/PERF.md (v)): 1.018x the communication threads' 16-B stores on the geomean,
    1.033x at M <= 512 where a CTA's one tile ends the launch, 1.020x at M 1024-2048,
    1.001x from M=4096 (where the copy-out already ran under the next tile's mainloop)."""
    return int(arch == "sm_90a" and mode == "gemm" and push == "tma")
