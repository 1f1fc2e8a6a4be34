"""The tile plan: a pure function of (M, N, K, world, SM count, mode).

The kernels mirror these formulas on the device (see ``sm90_kernel``); the CPU tests check
them here, so a change to one side without the other fails in CI.

Ownership
- RS: rows are padded to ``padded_M = ceil(M / world) * world``; rank r owns rows
  ``[r * local_M, (r + 1) * local_M)``. A 128-row tile may span two or more owners when
  ``local_M`` is not a multiple of 128; each row goes to its own owner.
- AR: tiles are numbered ``t = tm * tiles_n + tn``; rank r owns the contiguous block
  ``[start(r), start(r + 1))`` with ``start(r) = ceil(r * T / world)``, balanced at any M.
For scheduling, every tile belongs to one list L_o, a contiguous range ``[S(o), S(o+1))`` of
t: AR its owner's block; RS the tiles whose first row o owns.

Schedule (rounds)
The persistent grid is ``world * C`` CTAs, split into ``world`` parts of C lanes. In round
k, on rank r, part p < world-1 works on chunk k (C tiles) of L_(r+1+p) - tiles a peer owns,
whose partials it pushes - and the last part on chunk k-lag of r's own list. A peer handles
r's chunk k in round k, so an own tile is reduced ``lag`` rounds after its partials left
(lag 1 when there are several rounds, 0 when everything fits in one). Every round pushes
about the same number of bytes, so the link is busy for the whole GEMM rather than its first
half, and a wait on an own tile only ever depends on peers' work of the same or an earlier
round: no cycle of waits is possible.

Pairs (sm100, ``cta_group`` 2)
A 2-CTA tcgen05 MMA computes a 256 x BN pair-tile: tile rows 2*pm and 2*pm + 1 of one column
tn. The schedule above then runs over pair-tiles ``u = pm * tiles_n + tn`` (tile rows padded
to an even count; a tile row >= tiles_m is computed from TMA zero fill and never handed to the
communication warps) with clusters in place of CTAs: CTA c is lane c // 2 of the pair
schedule and takes the even (c even) or odd tile of its pair. Pair list L_o holds the pairs
whose even tile is in L_o, which keeps every list contiguous. A pair may hold tiles of two
owners, so its odd tile's owner computes it in the round its peers do, not ``lag`` rounds
later: the pair schedule therefore runs with lag 0, where every rank handles a tile in the
same round and a wait still only depends on peers' work of the same round. Where no pair
straddles two owners (``pairs_whole``: RS with local_M a multiple of 256, AR with owner
blocks on even tile rows) the lag round is allowed, with the 1-CTA schedule's argument;
``choose_fused_cluster`` picks it for long-K, large-M fused plans on sm90.

Pairs along N (``pair_n``; sm90 2x1 clusters; AR's choice at one tile row, ``choose_small_m``)
The two CTAs of a cluster compute tiles t = 2u and 2u + 1 of one tile row (``tiles_n``
even), sharing x's tile by TMA multicast instead of w's. Unit u = t // 2, so a unit never
leaves its tile row: an RS list (whole tile rows) holds whole pairs, and the lag round is
allowed as for 1-CTA tiles; an AR owner block that starts on an odd tile leaves one pair
straddling two owners, which is what the lag-0 argument above covers. Meant for small M with
long K, where every CTA of a 1-CTA plan re-reads x's whole tile row from L2. The peers-first
order below runs on them too (clusters as lanes) where no pair straddles two owners.

Bands (``band``)
Within each list, lanes take units in bands of ``band`` unit rows, down a band's rows before
moving one column right (``list_swizzle``), instead of row-major. The lanes of a round then
share fewer rows of x and columns of w, so more of their loads hit L2 (``choose_band``: at
K > 1024; on 2x H200 RS up to 13% faster at K=9216, docs/PERF.md (d)). The band permutes
positions inside a list only, so which round handles which position, and with it the wait
argument above, is unchanged.

Push-all AR (``push_all``; world 2, sm90 1-CTA unicast, M <= ``PUSH_ALL_MAX_M``; the
default at small M, ``choose_push_all``)
Each rank pushes its whole partial of every tile to the other and reduces every tile itself:
one exchange instead of AR's reduce-then-broadcast, so at small M one system fence, stamp
and poll per tile instead of two, and no copy-out of results. At world 2 it moves the same
bytes as the owner scheme (the partial of half the tiles out, the reduced other half back),
and both ranks compute the same sum bit for bit (fp32 a + b = b + a, the owner scheme's sum
too); at world w it would move w/2 times the bytes and sum in a rank-dependent order, so it
is a world-2 plan. Tiles are computed in the plain GEMM's flat order (unit
``rnd * chunk + lane``, banded as there); each tile's partial is pushed to every peer and
parked for the rank itself, and the reductions wait until the CTA's last tile is pushed, as
RS does for tiles it shares with other owners: no push ever waits, so no cycle of waits can
form. Every rank receives every tile, in receive slot t.

Flat peers-first (``flat``; 1-CTA, ``choose_flat``: five and six tile rows, K <= 4096)
The peers-first order without its per-list rounds: position p = round * chunk + lane of one
sequence, the peers' lists L_(r+1), ..., L_(r+world-1) and then r's own list, every list
in its band order, chunk = the SM count (or every unit). Where a list's length is not a
multiple of the chunk the per-list order idles lanes for a whole round; this one starts the
next list in the same round (rounds = ceil(units / chunk) instead of world * ceil(longest /
chunk)). A wait still only points backwards: rank r's own list comes after every other
list, so its unit at position p waits for a peer's push of that unit, which the peer has at
a position <= p among lists that precede its own: pushes, which never wait.

Split-K tail (``sk``; flat orders on 1-CTA tiles: the plain GEMM, flat peers-first)
Where the units do not fill whole rounds (U = F * G + R units on G lanes, 0 < R < G) the last
round leaves G - R lanes idle for a whole tile time, and off the grid's powers of two that is
up to half the call (M=576: 280 units, 132 lanes, three rounds for 2.1 rounds of work). With
``sk`` = S > 1 the first F rounds run as before and each of the last round's R units is cut
into S pieces of K on S neighbouring lanes (S = min(G // R, 8, K-tiles), ``sk_pieces``):
lane q * S + i computes k-tiles [i * KT // S, (i + 1) * KT // S) of unit F * G + q. Pieces
1..S-1 store their fp32 accumulators in this rank's workspace (``layout.SK_OFF``) and set a
flag; piece 0's lane adds them and goes on with the tile's epilogue and exchange as if it had
computed all of K. A stored piece waits for nothing, so the wait on it cannot close a cycle.
Every lane of the round starts at the same time, so the pieces of a k-slab are read together
as in the rounds before (a stream-K split over the last G + R units, each lane at its own k
offset, measured 15-45% slower here: x and w no longer shared in L2).

Split rows (``split_row``; RS, the 1-CTA round order at widths 224 and 256)
Where local_M is not a multiple of 128 a tile row holds rows of owners o-1 and o, and by
the rule above its tiles all go to L_(o-1): at 1152 x 7168 with 256-wide tiles the lists
hold 140 and 112 tiles, three chunks of 66 lanes where 126 each would fit two. With
``split_row`` S(o) moves inside that row, to the tile nearest ceil(o * T / world). Its
tiles are shared (``tile_owners``), so whichever list holds one, every rank parks its own
rows and reduces them after its last round; tiles only one rank owns stay in its list, so
the wait argument above is unchanged. Taken where it cuts the lane cost enough
(``SPLIT_ROW_GAIN``); where the chunk count stays it measured 2-8% slower.

Peers first (``peers_first``; 1-CTA, off by default)
Every lane works on every list in turn: round ``k * world + p`` takes chunk k of
L_(r+1+p) for p < world-1 and chunk k of r's own list for p = world-1, with chunk = all the
lanes. At small M, where one round of the schedule above computes, then pushes, then
reduces with nothing to overlap the push, this computes the tiles peers own first and pushes
them while the own tiles compute. A peer pushes r's chunk k in a round before r reduces it,
so a wait still depends only on peers' earlier work.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

BM = 128
BK = 64  # a bf16 / fp16 k-block; fp8's holds 128 elements in the same bytes (plan_depth)
EPI_N = 32
MODES = ("rs", "ar", "gemm")
# Tile widths a kernel may run: sm90 64 / 128 / 160 / 192 / 224 / 256 (64 from the small-M
# rules; 160 / 192 only where no width of ``FULL_NS`` divides N), sm100 128 / 256. Workspaces
# are sized for every one of them.
TILE_NS = (64, 128, 160, 192, 224, 256)
# The widths the plan rules were measured with (docs/PERF.md (a)-(r)): where one of them
# divides N, only those run, every tile whole. Elsewhere (N not a multiple of 128) sm90 plans
# take any width of ``PARTIAL_NS`` with a partial last tile column: its columns past N are
# computed on the TMA's zero fill of w and never stored (``CommWarps._chunk_geom``).
FULL_NS = (256, 224, 128)
PARTIAL_NS = (256, 224, 192, 160, 128)
# Output rows are 16-byte aligned (TMA, 16-B stores): N a multiple of 8
N_ALIGN = 8
# Tile rows a band spans by default (docs/PERF.md (d)); the schedule word holds up to 255 units
BAND_TILE_ROWS = 16
MAX_BAND = 255
# Split-K tails (module docstring): lanes whose pieces the workspace has slots for, and
# pieces per unit at most
SK_CTAS = 160
SK_MAX_PIECES = 8
# A shared RS tile row is split between two lists (``split_row``) only where the lane cost
# drops at least this much: 2x H200 (docs/PERF.md (r)), N=7168: M 1025-1152 (cost 0.74x:
# three rounds of 224-wide tiles -> two of 256) RS +1-3% at K <= 2048, +10% at 4096, +17%
# at 9216; M 2817-2944 (0.92x: seven rounds -> six) -5% at K=2048, +2-7% at 9216; where
# the round count stays, 2-8% slower.
SPLIT_ROW_GAIN = 0.8
# Push-all AR plans (module docstring) reduce every tile after the CTA's last push, a tail that
# grows with M; workspaces hold their receive slots up to this M
PUSH_ALL_MAX_M = 1024
# Blackwell targets one sm100 kernel source compiles for (B200/GB200: 10.0, B300/GB300: 10.3)
BLACKWELL = ("sm_100a", "sm_103a")


def plan_depth(K: int, in_dtype: str = "") -> int:
    """The depth K a plan is made for: the call's, or for fp8 operands (``in_dtype``) half of
    it. An fp8 k-block holds 128 elements in the bytes of 64 bf16 ones and the tensor cores
    run fp8 at twice bf16's rate, so an fp8 GEMM of depth K loads and computes like a bf16
    one of depth K / 2, with as many k-blocks: the same tiles, rounds and rules fit it."""
    return K // 2 if in_dtype else K


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def choose_sm100(M: int, N: int, K: int) -> tuple[int, int]:
    """(BN, cta_group) on sm100: 2-CTA MMA once M >= 1024 or the tile rows pair up evenly;
    BN=256 once the A operand is large enough (M*K >= 24 Mi) to be worth halving its reloads."""
    tiles_m = ceil_div(M, BM)
    cta_group = 2 if (M >= 1024 or tiles_m % 2 == 0) else 1
    bn = 256 if (M * K >= 24 * 1024 * 1024 and N % 256 == 0) else 128
    return bn, cta_group


# Time per output column of a tile width against BN=256 at the same tiles per SM (GEMM alone,
# 2x H200, docs/PERF.md (d)): narrower tiles reload x's tile for fewer columns.
# 160 / 192: the GEMM alone on one H200 at M 576-1088 (docs/PERF.md (y)), 1-CTA tiles.
TILE_COST = {256: 1.0, 224: 1.03, 192: 1.06, 160: 1.12, 128: 1.18}


def tile_widths(N: int, arch: str = "sm_90a") -> tuple[int, ...]:
    """The widths, widest first, a plan of nothing forced chooses from (``FULL_NS``,
    ``PARTIAL_NS``); none where an sm100 plan would need a partial tile."""
    whole = tuple(b for b in FULL_NS if N % b == 0)
    if whole or arch in BLACKWELL:
        return whole
    return tuple(b for b in PARTIAL_NS if b <= max(N, BM))  # no tile wider than N but 128


def padded_n(N: int) -> int:
    """Columns the widest tile row of any width covers: what a tile-indexed workspace
    buffer holds per row."""
    return max(ceil_div(N, b) * b for b in TILE_NS)


def lane_cost(plan: "TilePlan") -> float:
    """Modelled time of a plan: the most tiles one lane computes, times the tile's width and
    its ``TILE_COST``. The last wave is what a persistent grid waits for: at 2048 x 7168,
    224-wide tiles give every lane of the round order 4 tiles of 224 columns where 256-wide
    ones give some lanes 4 and most 3 (448 tiles over 2 x 66 lanes)."""
    return (plan.rounds - plan.lag) * plan.bn * TILE_COST.get(plan.bn, 1.5)


def choose_push_all(M: int, K: int) -> bool:
    """Whether a world-2 sm90 AR plan that nothing else was forced on pushes all (module
    docstring). Measured on 2x H200 (docs/PERF.md (i), N 7168 and 8192, against the owner
    plan ``choose_small_m`` picks): one tile row 5-8% faster at K 1024-9216 (one exchange,
    one system fence per tile instead of two); two tile rows 5-10% faster at K >= 4096 and
    a tie at K=1024; from M=512 on 2-15% slower (every tile is reduced after the CTA's last
    push, a tail that grows with M)."""
    return M <= BM or (M <= 2 * BM and K >= 4096)


def choose_gemm_width(M: int, N: int, sm_count: int) -> int | None:
    """64-wide tiles for the plain GEMM (mode "gemm") on sm90 where M is one tile row and
    they fit one wave, else None (the width of least ``lane_cost``): at M=128, N=7168 the
    128-wide tiles that model picks fill 56 of 132 SMs. Measured on 2x H200 (docs/PERF.md
    (i), N 7168 and 8192, K 1024-9216): 13-23% faster at M=128, 7-45% slower from M=256."""
    return 64 if M <= BM and ceil_div(N, 64) <= sm_count else None


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


@dataclass(frozen=True)
class TilePlan:
    M: int
    N: int
    K: int
    world: int
    sm_count: int
    mode: str
    bn: int
    tiles_m: int
    tiles_n: int
    num_tiles: int
    grid: int
    padded_M: int
    local_M: int
    chunk: int
    rounds: int
    lag: int
    cluster_mn: tuple[int, int] = (1, 1)
    cta_group: int = 1
    rotate: bool = False
    peers_first: bool = False
    band: int = 0
    pair_n: bool = False  # 2x1 clusters pair tiles along N (module docstring)
    push_all: bool = False  # AR: every rank pushes every tile to every peer (module docstring)
    flat: bool = False  # peers-first over one flat order of all lists (module docstring)
    sk: int = 0  # > 1: the last round's units cut into this many K pieces (module docstring)
    k_tiles: int = 0  # K // BK (the pieces' cuts)
    split_row: bool = False  # RS round order: a tile row two owners share split between lists
    push_ctas: int = 0  # RS flat peers-first: CTAs past ``chunk`` that only push (push_plan)

    @property
    def sched_word(self) -> int:
        """The schedule's launch argument: bit 0 the lag, bit 1 part rotation, bits 8-15
        the band (the peers-first order is compiled into its kernel variants)."""
        return self.lag | (int(self.rotate) << 1) | (self.band << 8)

    @property
    def longest_units(self) -> int:
        """Units of the longest list: every rank's schedule is laid out for it."""
        return max(self.unit_list_start(o + 1) - self.unit_list_start(o)
                   for o in range(self.world))

    @property
    def pairs_m(self) -> int:
        """Rows of schedule units: tile rows (1-CTA, pairs along N) or pair-tile rows."""
        return self.tiles_m if self.pair_n else ceil_div(self.tiles_m, self.cta_group)

    @property
    def units_n(self) -> int:
        """Schedule units per unit row: tiles, or pairs of tiles along N."""
        return self.tiles_n // 2 if self.pair_n else self.tiles_n

    @property
    def num_units(self) -> int:
        return self.pairs_m * self.units_n

    @property
    def tile_bytes(self) -> int:
        return BM * self.bn * 2

    # ---- ownership
    def row_owner(self, row: int) -> int:
        return row // self.local_M

    def ar_start(self, r: int) -> int:
        return (r * self.num_tiles + self.world - 1) // self.world

    def tile_owner(self, t: int) -> int:
        return t * self.world // self.num_tiles

    def tile_owners(self, t: int) -> list[int]:
        """Every rank that receives part of tile t (RS: by rows, AR: one owner, push-all
        AR: every rank)."""
        if self.push_all:
            return list(range(self.world))
        if self.mode == "ar":
            return [self.tile_owner(t)]
        if self.mode == "gemm":
            return []
        m0 = (t // self.tiles_n) * BM
        m1 = min(m0 + BM, self.padded_M)
        if m0 >= m1:
            return []
        return list(range(m0 // self.local_M, (m1 - 1) // self.local_M + 1))

    # ---- schedule and receive slots
    def list_start(self, o: int) -> int:
        """S(o): first tile of list L_o (S(world) = number of tiles)."""
        if self.mode == "ar":
            return self.ar_start(o)
        if self.mode == "rs":
            b = o * self.local_M  # owner o's first row
            after = min(ceil_div(b, BM), self.tiles_m) * self.tiles_n
            if self.split_row and b % BM and b < self.tiles_m * BM:
                # a tile row shared by owners o-1 and o: split between their lists
                return min(max(ceil_div(o * self.num_tiles, self.world),
                               (b // BM) * self.tiles_n), after)
            return after
        return 0 if o == 0 else self.num_tiles

    @property
    def can_split_row(self) -> bool:
        """Whether ``split_row`` would change this plan's lists: an RS 1-CTA round order at
        width 224 or 256 where two owners share a tile row (module docstring)."""
        return (self.mode == "rs" and self.cta_group == 1 and not self.peers_first
                and not self.flat and not self.push_all and self.bn >= 224
                and any(o * self.local_M % BM and o * self.local_M < self.tiles_m * BM
                        for o in range(1, self.world)))

    def list_len(self, o: int) -> int:
        return self.list_start(o + 1) - self.list_start(o)

    def unit_list_start(self, o: int) -> int:
        """First schedule unit of list L_o: a tile (1-CTA), or the first pair-tile whose
        even tile is at or after S(o) (2-CTA)."""
        s = self.list_start(o) if o < self.world else self.num_tiles
        if self.cta_group == 1:
            return s
        if self.pair_n:
            return ceil_div(s, 2)
        pm, rem = divmod(s, 2 * self.tiles_n)
        return pm * self.tiles_n + min(rem, self.tiles_n)

    def segment(self, lane: int, rnd: int) -> tuple[int, int, int]:
        """(position in the flat order, first k-tile, end k-tile) of what lane ``lane`` computes
        in round (segment) ``rnd``; position -1: idle. Whole units unless ``sk`` (module
        docstring; the kernels' ``TileSchedule._segment``)."""
        pos, kt = rnd * self.chunk + lane, self.k_tiles
        f = self.num_units // self.chunk
        if self.sk < 2 or rnd != f:
            return pos, 0, kt
        q, i = divmod(lane, self.sk)
        if q >= self.num_units - f * self.chunk:
            return -1, 0, 0
        return f * self.chunk + q, i * kt // self.sk, (i + 1) * kt // self.sk

    def finishes(self, lane: int, rnd: int) -> bool:
        """Whether that segment ends with the unit's epilogue (it starts at k = 0): a piece
        that starts later is stored for the lane that finishes the unit."""
        pos, lo, _ = self.segment(lane, rnd)
        return pos >= 0 and lo == 0

    def scheduled_unit(self, rank: int, lane: int, rnd: int) -> int:
        """The unit (tile, or pair-tile) lane ``lane`` (CTA, or cluster) works on, or -1."""
        if lane >= self.chunk and self.push_ctas:
            return -1  # a push CTA (``push_plan``)
        if self.sk > 1:
            pos = self.segment(lane, rnd)[0]
            rnd, lane = divmod(pos, self.chunk) if pos >= 0 else (self.rounds, 0)
        if self.mode == "gemm" or self.push_all:
            u = rnd * self.chunk + lane
            if u >= self.num_units:
                return -1
            return band_swizzle(u, self.pairs_m, self.units_n, self.band)
        part, j = divmod(lane, self.chunk)
        if self.rotate:
            part = (part + rnd) % self.world
        if self.peers_first and self.flat:
            pos = rnd * self.chunk + lane
            for q in range(self.world):  # L_(r+1), ..., L_(r+world-1), then L_r
                o = (rank + 1 + q) % self.world
                n = self.unit_list_start(o + 1) - self.unit_list_start(o)
                if pos < n:
                    return self._list_unit(o, pos)
                pos -= n
            return -1
        if self.peers_first:
            (rnd, part), j = divmod(rnd, self.world), lane
        if part < self.world - 1:
            o, k = (rank + 1 + part) % self.world, rnd
        else:
            o, k = rank, rnd - self.lag
        return self._list_unit(o, k * self.chunk + j) if k >= 0 else -1

    def _list_unit(self, o: int, idx: int) -> int:
        """The unit at position ``idx`` (>= 0) of list L_o in its band order, or -1 past
        the list's end (the kernels' ``CommWarps._list_unit``)."""
        start = self.unit_list_start(o)
        length = self.unit_list_start(o + 1) - start
        if idx >= length:
            return -1
        return start + list_swizzle(idx, length, self.units_n, self.band)

    def scheduled(self, rank: int, cta: int, rnd: int) -> int:
        """The tile CTA ``cta`` of ``rank`` finishes (computes, and hands to the exchange) in
        round ``rnd``, or -1 (idle, or a split-K piece stored for another lane)."""
        if self.cta_group == 1:
            if self.sk > 1 and not self.finishes(cta, rnd):
                return -1
            return self.scheduled_unit(rank, cta, rnd)
        g = self.cta_group
        u = self.scheduled_unit(rank, cta // g, rnd)
        if u < 0:
            return -1
        if self.pair_n:
            return 2 * u + cta % 2
        pm, tn = divmod(u, self.tiles_n)
        tm = g * pm + cta % g
        return tm * self.tiles_n + tn if tm < self.tiles_m else -1

    def round_of(self, rank: int, t: int) -> int:
        for c in range(self.grid):
            for r in range(self.rounds):
                if self.scheduled(rank, c, r) == t:
                    return r
        raise ValueError(f"tile {t} is not scheduled on rank {rank}")

    def cta_tiles(self, rank: int, cta: int) -> list[int]:
        tiles = (self.scheduled(rank, cta, r) for r in range(self.rounds))
        return [t for t in tiles if t >= 0]

    def recv_slot(self, owner: int, t: int) -> int:
        if self.push_all:
            return t
        if self.mode == "ar":
            return t - self.ar_start(owner)
        tm, tn = divmod(t, self.tiles_n)
        return (tm - (owner * self.local_M) // BM) * self.tiles_n + tn

    @staticmethod
    def src_index(src: int, owner: int, world: int) -> int:
        """Receive region of ``src`` on ``owner``: peers only, so world-1 regions."""
        return (src - owner - 1) % world


def band_swizzle(i: int, tiles_m: int, tiles_n: int, band: int) -> int:
    """Tile of the i-th work item when tiles are walked in bands of ``band`` tile rows,
    down the rows of a band before moving one tile column right (an L2-reuse order for the
    plain GEMM; ``band`` <= 0 keeps row-major). The kernels mirror this in CommWarps."""
    if band <= 0:
        return i
    per_band = band * tiles_n
    b, within = divmod(i, per_band)
    rows = min(band, tiles_m - b * band)
    tn, r = divmod(within, rows)
    return (b * band + r) * tiles_n + tn


def list_swizzle(i: int, length: int, tiles_n: int, band: int) -> int:
    """Position of the i-th work item in a list of ``length`` units: ``band_swizzle`` over
    the list's whole rows of ``tiles_n`` (counted from its first unit, which need not start
    a tile row), the partial last row in order. A permutation of range(length)."""
    rows = length // tiles_n
    return band_swizzle(i, rows, tiles_n, band) if i < rows * tiles_n else i


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


def make_plan(M: int, N: int, K: int, world: int, sm_count: int, mode: str, *,
              arch: str = "sm_90a", bn: int | None = None,
              cta_group: int | None = None, pair_ctas: int | None = None,
              lag: int | None = None, rotate: bool = False,
              peers_first: bool | None = None, band: int | None = None,
              pair_n: bool = False, push_all: bool | None = False,
              flat: bool | None = None, sk: bool | None = None,
              split_row: bool | None = None) -> TilePlan:
    """``arch`` picks the heuristic (sm90: the tile width of least ``lane_cost``, 1-CTA or
    2x1 clusters by ``choose_gemm_cluster`` (plain GEMM, unless ``_gemm_one_cta_if_cheaper``
    finds a cheaper 1-CTA plan) and ``choose_fused_cluster``, the
    small-M order by ``choose_small_m``; sm100: ``choose_sm100``);
    ``bn`` / ``cta_group`` override it (tests, experiments). ``pair_ctas``: how many CTAs
    can be resident at once as 2-CTA clusters (the GPC layout can fit fewer than the SM
    count); every CTA of the persistent grid must be resident, or waits could never end.
    ``lag`` overrides the 1-CTA schedule's lag (0 or 1; experiments). ``rotate``: lanes
    change part every round (1-CTA fused schedules), so every SM takes turns pushing.
    ``peers_first``: every lane computes peers' tiles, then its own (see the module
    docstring; 1-CTA fused schedules or pairs along N, lag 0, no rotation); None:
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
    wherever ``can_split_row``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if (sk is None and flat is None and peers_first is None and push_all is not True
            and _sm90_unforced(arch, bn, cta_group, lag, rotate, pair_n) and choose_sk(M, K, mode)):
        tail = make_plan(M, N, K, world, sm_count, mode, arch=arch, pair_ctas=pair_ctas,
                         band=band, flat=True, sk=True, split_row=split_row)
        if tail.sk:
            return tail
    if sk and mode == "gemm" and cta_group is None:
        cta_group = 1  # the split-K tail cuts 1-CTA units
    if flat is None:
        flat = (peers_first is None and push_all is not True
                and _sm90_unforced(arch, bn, cta_group, lag, rotate, pair_n)
                and choose_flat(M, K, mode))
    if flat:
        if mode == "gemm":
            flat = False  # no exchange to order
        elif (arch in BLACKWELL or cta_group not in (None, 1) or rotate or pair_n
              or lag not in (None, 0) or peers_first is False):
            raise ValueError("the flat peers-first order is a 1-CTA sm90 order, without "
                             "rotation or the lag round")
        else:
            peers_first, cta_group, push_all = True, 1, False
    if band is not None and not (isinstance(band, int) and 0 <= band <= MAX_BAND):
        raise ValueError(f"band must be an int in [0, {MAX_BAND}], got {band!r}")
    if push_all is None:
        push_all = (mode == "ar" and world == 2 and peers_first is None
                    and _sm90_unforced(arch, bn, cta_group, lag, rotate, pair_n)
                    and choose_push_all(M, K))
    if push_all:
        plan = _make_push_all_plan(M, N, K, world, sm_count, mode, arch=arch, bn=bn,
                                   cta_group=cta_group, lag=lag, rotate=rotate,
                                   peers_first=peers_first, pair_n=pair_n)
        return replace(plan, band=choose_band(K, 1) if band is None else band)
    if pair_n:
        if arch in BLACKWELL or cta_group == 1 or rotate:
            raise ValueError("pairs along N are sm90 2x1-cluster plans, without rotation")
        cta_group, peers_first = 2, bool(peers_first)
    plan = _make_plan(M, N, K, world, sm_count, mode, arch=arch, bn=bn, cta_group=cta_group,
                      pair_ctas=pair_ctas, lag=lag, rotate=rotate, peers_first=peers_first,
                      pair_n=pair_n, flat=flat, split_row=split_row)
    if (mode == "gemm" and plan.cta_group == 2 and not sk
            and _sm90_unforced(arch, bn, cta_group, lag, rotate, pair_n)):
        plan = _gemm_one_cta_if_cheaper(plan, pair_ctas)
    plan = replace(plan, band=choose_band(K, plan.cta_group) if band is None else band)
    return with_sk(plan, arch) if sk else plan


# A 1-CTA plain GEMM's time against a 2x1-cluster one of the same width and tiles per lane
# (the pair shares w's tile): 2-11% slower at K >= 4096 (docs/PERF.md (d)); 1.05 fits the
# one-GPU runs of docs/PERF.md (t).
ONE_CTA_COST = 1.05


def _gemm_one_cta_if_cheaper(pair: TilePlan, pair_ctas: int | None) -> TilePlan:
    """The plain GEMM's 1-CTA plan of least ``lane_cost`` (widths 256 / 224 / 128 / 64) where
    it beats the 2x1-cluster plan ``choose_gemm_cluster`` took by ``ONE_CTA_COST``; else
    ``pair``. Pairs take two tile rows: with an odd row count one row of pairs is half
    empty, and half as many lanes fill fewer SMs at few tiles. Measured on one H200
    (docs/PERF.md (t), K 2048-9216, two runs): 1152 x 7168 from 0.76x to 0.97-1.03x cuBLAS
    (3 rounds of 224-wide pairs against 2 of 256-wide 1-CTA tiles), 384 x 10240 0.66x ->
    0.94-0.99x, 256 x 4096 0.72-0.79x -> 0.86-0.90x (64-wide tiles on 128 SMs instead of
    128-wide pairs on 64); the grid's powers of two keep their plans."""
    best = None
    for b in (*tile_widths(pair.N), 64):
        try:
            p = _make_plan(pair.M, pair.N, pair.K, pair.world, pair.sm_count, "gemm",
                           arch="sm_90a", bn=b, cta_group=1, pair_ctas=pair_ctas, lag=None,
                           rotate=False, peers_first=False)
        except ValueError:
            continue
        if best is None or lane_cost(p) < lane_cost(best):
            best = p
    if best is not None and lane_cost(best) * ONE_CTA_COST < lane_cost(pair):
        return best
    return pair


def push_plan(M: int, N: int, K: int, world: int, sm_count: int, push_ctas: int, *,
              pair_ctas: int | None = None, bn: int | None = None,
              band: int | None = None) -> TilePlan:
    """An RS plan whose pushes leave from ``push_ctas`` CTAs of their own (sm90, unicast,
    bulk-copy pushes; an experiment, ``GemmRsAr.force_push_ctas``). The other sm_count -
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


def with_sk(plan: TilePlan, arch: str = "sm_90a") -> TilePlan:
    """``plan`` with the split-K tail (module docstring) where it has a partial last round
    to spread; unchanged elsewhere (whole rounds, one round, or an order it does not apply
    to). Raises ValueError for a plan that can never take it."""
    if arch in BLACKWELL or plan.cta_group != 1 or plan.push_all or not (
            plan.mode == "gemm" or (plan.peers_first and plan.flat)):
        raise ValueError("the split-K tail runs on sm90 1-CTA plans in a flat order (the "
                         "plain GEMM, flat peers-first)")
    kt = ceil_div(plan.K, BK)
    pieces = sk_pieces(plan.chunk, plan.num_units, kt)
    if pieces < 2 or plan.chunk > SK_CTAS:
        return plan
    return replace(plan, sk=pieces, k_tiles=kt)


def sk_pieces(lanes: int, units: int, k_tiles: int) -> int:
    """K pieces per unit of the last round (``TilePlan.sk``): as many as its idle lanes allow,
    at most ``SK_MAX_PIECES`` (the finishing lane adds the others' fp32 tiles one by one) and
    one k-tile each; 0 without a partial last round (the kernels' ``CommWarps._sk_pieces``)."""
    r = units % lanes
    return min(lanes // r, SK_MAX_PIECES, k_tiles) if r else 0


def _sm90_unforced(arch: str, bn: int | None, cta_group: int | None, lag: int | None,
                   rotate: bool, pair_n: bool) -> bool:
    """An sm90 plan whose shape no caller forced: the small-M and cluster rules decide it."""
    return (arch not in BLACKWELL and bn is None and cta_group is None and lag is None
            and not rotate and not pair_n)


def _make_plan(M: int, N: int, K: int, world: int, sm_count: int, mode: str, *, arch: str,
               bn: int | None, cta_group: int | None, pair_ctas: int | None, lag: int | None,
               rotate: bool, peers_first: bool | None, pair_n: bool = False,
               flat: bool = False, split_row: bool | None = None) -> TilePlan:
    # sm90 widths without a heuristic's pick (bn0 None) come from ``lane_cost`` below
    bn0, cg0 = choose_sm100(M, N, K) if arch in BLACKWELL else (None, 1)
    unforced = _sm90_unforced(arch, bn, cta_group, lag, rotate, pair_n)
    if unforced and mode == "gemm":
        bn0, cg0 = choose_gemm_width(M, N, sm_count), choose_gemm_cluster(M, K)
    if unforced and mode != "gemm" and peers_first is None:
        bn0, peers_first, along_n = choose_small_m(M, K, mode)
        if along_n and ceil_div(N, bn0) % 2 == 0:  # an even number of tile columns to pair
            return _make_plan(M, N, K, world, sm_count, mode, arch=arch, bn=bn0, cta_group=2,
                              pair_ctas=pair_ctas, lag=None, rotate=False, peers_first=False,
                              pair_n=True)
        if along_n:  # otherwise the 1-CTA plan of one tile row: same width, peers-first
            peers_first = True
        pair_lag = None if peers_first else choose_fused_cluster(M, K, mode)
        if pair_lag is not None:
            try:
                pair = _make_plan(M, N, K, world, sm_count, mode, arch=arch, bn=bn0,
                                  cta_group=2, pair_ctas=pair_ctas, lag=pair_lag, rotate=False,
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
                                          rotate=rotate, peers_first=peers_first,
                                          pair_n=pair_n, flat=flat, split_row=bool(split_row)))
            except ValueError as e:  # lag 1 on pairs: only the widths pairs_whole allows
                refused = e
        if not options:
            raise refused or ValueError(f"no tile width of {arch} fits N={N}")
        if split_row is None:
            splits = [_split_row(p, sm_count, lag) for p in options if p.can_split_row]
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
    bn = bn0 if bn is None else bn
    if bn not in TILE_NS:
        raise ValueError(f"BN must be one of {TILE_NS}, got {bn}")
    if N % N_ALIGN or (N % bn and arch in BLACKWELL):
        raise ValueError(f"N={N}: {arch} plans need N a multiple of "
                         f"{bn if arch in BLACKWELL else N_ALIGN} at BN={bn}")
    if cta_group not in (1, 2) and not (mode == "gemm" and cta_group in (3, 4)):
        raise ValueError(f"cta_group must be 1 or 2 (3 or 4: plain GEMM), got {cta_group}")
    if cta_group > 2 and (arch in BLACKWELL or bn % (8 * cta_group)):
        raise ValueError(f"clusters of {cta_group} along M are sm90 plain-GEMM plans that split "
                         f"w's tile into parts of 8-row multiples: BN={bn}, {arch}")
    if cta_group >= 2:
        if peers_first and not pair_n:
            raise ValueError("the peers-first order on 2x1 clusters needs pairs along N")
        slots = sm_count if pair_ctas is None else min(sm_count, pair_ctas)
        return _make_pair_plan(M, N, K, world, slots, mode, bn, lag, pair_n, peers_first,
                               cta_group)
    tiles_m = ceil_div(M, BM)
    tiles_n = ceil_div(N, bn)
    num_tiles = tiles_m * tiles_n
    padded_M = ceil_div(M, world) * world
    base = TilePlan(M=M, N=N, K=K, world=world, sm_count=sm_count, mode=mode, bn=bn,
                    tiles_m=tiles_m, tiles_n=tiles_n, num_tiles=num_tiles, grid=0,
                    padded_M=padded_M, local_M=padded_M // world, chunk=0, rounds=0, lag=0)
    if mode == "gemm":
        grid = min(num_tiles, sm_count)
        return replace(base, grid=grid, chunk=grid, rounds=ceil_div(num_tiles, grid))
    longest = base.longest_units
    if peers_first:
        if rotate or lag == 1:
            raise ValueError("peers_first runs with lag 0 and without rotation")
        if flat:
            chunk = max(1, min(sm_count, base.num_units))
            return replace(base, grid=chunk, chunk=chunk,
                           rounds=ceil_div(base.num_units, chunk), peers_first=True, flat=True)
        chunk = max(1, min(sm_count, longest))
        return replace(base, grid=chunk, chunk=chunk, rounds=world * ceil_div(longest, chunk),
                       peers_first=True)
    plan = _round_order(base, sm_count, lag, rotate)
    if split_row and arch not in BLACKWELL and plan.can_split_row:
        return _split_row(plan, sm_count, lag)
    return plan


def _split_row(plan: TilePlan, sm_count: int, lag: int | None) -> TilePlan:
    """A whole-row round-order ``plan`` with its shared tile row split (``split_row``)."""
    return _round_order(replace(plan, split_row=True), sm_count, lag, plan.rotate)


def _round_order(base: TilePlan, sm_count: int, lag: int | None, rotate: bool) -> TilePlan:
    """``base`` in the round order: the lanes of each part, the rounds and the lag."""
    longest = base.longest_units
    chunk = max(1, min(sm_count // base.world, longest))
    chunks = ceil_div(longest, chunk)
    if lag is None:
        # A round of slack pays for itself only when there are enough rounds to hide it.
        lag = 1 if chunks >= 3 else 0
    elif lag not in (0, 1):
        raise ValueError(f"lag must be 0 or 1, got {lag}")
    return replace(base, grid=base.world * chunk, chunk=chunk, rounds=chunks + lag, lag=lag,
                   rotate=rotate)


def _make_push_all_plan(M: int, N: int, K: int, world: int, sm_count: int, mode: str, *,
                        arch: str, bn: int | None, cta_group: int | None, lag: int | None,
                        rotate: bool, peers_first: bool | None, pair_n: bool) -> TilePlan:
    if (mode != "ar" or arch in BLACKWELL or cta_group not in (None, 1) or lag not in (None, 0)
            or rotate or peers_first or pair_n):
        raise ValueError("push-all plans are sm90 AR plans on 1-CTA tiles in the flat order "
                         "(no lag, rotation, peers-first order or pairs)")
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
                      pair_ctas=None, lag=None, rotate=False, peers_first=False)
    return replace(flat, mode="ar", push_all=True)


def pairs_whole(p: TilePlan) -> bool:
    """No pair-tile holds tiles of two owners: every list starts on an even tile row (RS:
    no tile row is shared either); with pairs along N, on an even tile."""
    if p.pair_n:
        return p.mode != "ar" or all(p.ar_start(o) % 2 == 0 for o in range(1, p.world))
    if p.mode == "rs":
        return p.local_M % (2 * BM) == 0
    return all(p.ar_start(o) % (2 * p.tiles_n) == 0 for o in range(1, p.world))


def _make_pair_plan(M: int, N: int, K: int, world: int, sm_count: int, mode: str,
                    bn: int, lag: int | None = None, pair_n: bool = False,
                    peers_first: bool = False, cta_group: int = 2) -> TilePlan:
    """2-CTA schedule: the round schedule over pair-tiles, one cluster (2 CTAs) per lane,
    lag 0 unless 1 is asked for where ``pairs_whole`` (see the module docstring); with pairs
    along N also the peers-first order, where ``pairs_whole``. ``cta_group`` 3 or 4 (the
    plain GEMM only, an experiment): clusters of that many tile rows sharing w's tile."""
    tiles_m = ceil_div(M, BM)
    tiles_n = ceil_div(N, bn)
    if pair_n and tiles_n % 2:
        raise ValueError(f"pairs along N need an even number of tile columns; N={N} has "
                         f"{tiles_n} of {bn}")
    padded_M = ceil_div(M, world) * world
    base = TilePlan(M=M, N=N, K=K, world=world, sm_count=sm_count, mode=mode, bn=bn,
                    tiles_m=tiles_m, tiles_n=tiles_n, num_tiles=tiles_m * tiles_n, grid=0,
                    padded_M=padded_M, local_M=padded_M // world, chunk=0, rounds=0, lag=0,
                    cluster_mn=(1, 2) if pair_n else (cta_group, 1), cta_group=cta_group,
                    pair_n=pair_n)
    clusters = max(1, sm_count // cta_group)
    if mode == "gemm":
        lanes = min(base.num_units, clusters)
        return replace(base, grid=cta_group * lanes, chunk=lanes,
                       rounds=ceil_div(base.num_units, lanes))
    longest = base.longest_units
    if peers_first:
        if lag == 1 or not pairs_whole(base):
            raise ValueError("the peers-first order on pairs along N runs with lag 0 and pairs "
                             "that never straddle two owners (AR: owner blocks on even tiles)")
        chunk = max(1, min(clusters, longest))
        return replace(base, grid=2 * chunk, chunk=chunk,
                       rounds=world * ceil_div(max(longest, 1), chunk), peers_first=True)
    chunk = max(1, min(clusters // world, longest))
    if lag is None and pair_n and pairs_whole(base):
        lag = 1 if ceil_div(longest, chunk) >= 3 else 0  # the 1-CTA schedule's rule
    lag = lag or 0
    if lag not in (0, 1):
        raise ValueError(f"lag must be 0 or 1, got {lag}")
    if lag and not pairs_whole(base):
        raise ValueError("lag 1 on 2x1 clusters needs pair-tiles that never straddle two owners "
                         "(RS: local_M a multiple of 256; AR: owner blocks on even tile rows; "
                         "pairs along N: on even tiles)")
    return replace(base, grid=2 * world * chunk, chunk=chunk,
                   rounds=ceil_div(max(longest, 1), chunk) + lag, lag=lag)


def max_recv_slots(max_M: int, N: int, world: int, bn: int) -> int:
    """Upper bound of the tiles one owner receives from one peer, over every M <= max_M."""
    tiles_n = ceil_div(N, bn)
    rs = (ceil_div(ceil_div(max_M, world), BM) + 1) * tiles_n
    ar = ceil_div(ceil_div(max_M, BM) * tiles_n, world)
    # push-all AR (world 2): every tile, in slot t
    push_all = ceil_div(min(max_M, PUSH_ALL_MAX_M), BM) * tiles_n if world == 2 else 0
    return max(rs, ar, push_all)
