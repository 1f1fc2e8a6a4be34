"""Tile geometry: the arithmetic of a plan once its shape is chosen (tiles, owners, lists,
lanes, rounds), with no measured rule in it (those are ``launch.rules``; ``launch.plan``
applies them).

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
The plain GEMM's single round of R < G units (small M: 26 tiles of 64 x 112 at N=2880) has
no lanes of its own to cut onto, so ``with_sk`` widens its grid to R * S lanes, S = min(G // R,
8, K-tiles): the same cut with F = 0, every SM streaming its share of w.

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
# Tile rows: 128, or 64 for the plain sm90 GEMM (one MMA warp group; 1-CTA tiles or 2x1
# clusters along M, the pair's two 64-row tiles sharing w's tile)
TILE_MS = (64, 128)
# Rows of x's box per k-block on a last tile row of at most that many rows, fewer than the
# tile's (``Variant.x_rows``): whole 8-row atoms of the 128-byte swizzle, from 16 in steps of
# 16 (48, 80, 96 and 112 divide no tile: ``launch.rules.X_BOX_UNEVEN``)
X_ROWS = (8, 16, 32, 48, 64, 80, 96, 112)
BK = 64  # a bf16 / fp16 k-block; fp8's holds 128 elements in the same bytes (plan_depth)
EPI_N = 32
MODES = ("rs", "ar", "gemm")
# Tile widths a kernel may run: sm90 64 to 256 (64 from the small-M rules; 160 / 192 only
# where no width of ``FULL_NS`` divides N; the ``FINE_NS`` widths where ``launch.rules``
# measured them to end a partial last wave), sm100 ``SM100_NS``. Workspaces are sized for
# every one of them.
TILE_NS = (64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 256)
# Widths only the plain sm90 GEMM takes: cuBLAS's at small M off the grid (PERF.md (bc):
# 64 x 80 / 96 tiles at N 2880 / 5120), on 64-row tiles by the small-M rules of (bd); the
# fused op refuses them (no fused suite has run them)
GEMM_ONLY_NS = (80, 96)
# CTAs per cluster along M: 1-CTA tiles, 2x1 clusters (pairs), and 4x1 clusters whose four
# CTAs share w's tile, each loading a quarter (cuBLAS's four tile rows at M <= 256 off the
# grid, PERF.md (bc)); 4: the plain sm90 GEMM only (``choose_gemm_quads``,
# ``choose_gemm_quads128``, or forced), BN a multiple of 32 (a quarter of w's tile in whole
# 8-row swizzle atoms)
CTA_GROUPS = (1, 2, 4)
QUAD = 4
# Widths 16 past a multiple of 32 (issue "fill every SM"): their tiles go to the
# communication warps in 16-column sub-tiles (``Sm90FusedKernel.epi_n``); sm90 only
FINE_NS = (112, 144, 176, 208)
SM100_NS = (128, 256)
# The widths the plan rules were measured with (docs/PERF.md (a)-(r)): where one of them
# divides N, only those run, every tile whole. Elsewhere (N not a multiple of 128) sm90 plans
# take any width of ``PARTIAL_NS`` with a partial last tile column: its columns past N are
# computed on the TMA's zero fill of w and never stored (``CommWarps._chunk_geom``).
FULL_NS = (256, 224, 128)
PARTIAL_NS = (256, 224, 192, 160, 128)
# Output rows are 16-byte aligned (TMA, 16-B stores): N a multiple of 8
N_ALIGN = 8
# The schedule word holds a band of up to 255 units
MAX_BAND = 255
# Tuning.l2_hint / Variant.l2_hint (its index here): the eviction priority the mainloop's TMA
# loads give L2 ("": no policy of ours, the DSL's operand of 0; launch.ptx.l2_policy). The plain
# names are made by ``createpolicy``; the ``fixed_`` ones are the fixed policy words CUTLASS's
# C++ TMA loads pass (L2_POLICY_WORDS). In PERF.md (ba) a createpolicy evict-normal policy
# stopped the L2 request coalescer merging any of our loads; CUTLASS's words changed nothing
L2_HINTS = ("", "normal", "first", "last", "fixed_normal", "fixed_first", "fixed_last")
L2_POLICY_WORDS = {"fixed_normal": 0x1000000000000000, "fixed_first": 0x12F0000000000000,
                   "fixed_last": 0x14F0000000000000}
# Mainloop stages: what a kernel takes where they fit unless a forced ``stages`` asks for more
# (every measured plan ran at most 8), and the most a forced one may ask for (cuBLAS runs
# 10-13 on 64-row tiles 64-96 wide at small M off the grid, PERF.md (bc))
DEFAULT_MAX_STAGES = 8
MAX_STAGES = 16
# Tuning.tma_promo / Variant.tma_promo (its index here): the L2 promotion of the mainloop's
# TMA descriptors ("": the DSL atoms' own inline encoding; else the driver's encoding with
# that promotion, launch.tma_descs). An experiment: no rule takes it
TMA_PROMOS = ("", "none", "64B", "128B", "256B")
# Split-K tails (module docstring): lanes whose pieces the workspace has slots for, and
# pieces per unit at most
SK_CTAS = 160
SK_MAX_PIECES = 8
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
    peers_first: bool = False
    band: int = 0
    pair_n: bool = False  # 2x1 clusters pair tiles along N (module docstring)
    push_all: bool = False  # AR: every rank pushes every tile to every peer (module docstring)
    flat: bool = False  # peers-first over one flat order of all lists (module docstring)
    sk: int = 0  # > 1: the last round's units cut into this many K pieces (module docstring)
    k_tiles: int = 0  # K // BK (the pieces' cuts)
    split_row: bool = False  # RS round order: a tile row two owners share split between lists
    push_ctas: int = 0  # RS flat peers-first: CTAs past ``chunk`` that only push (push_plan)
    pingpong: bool = False  # plain GEMM: planned for ping-pong MMA warp groups (the rule's)
    bm: int = BM  # rows of a tile (64: the plain sm90 GEMM; 1-CTA or pairs along M)

    @property
    def sched_word(self) -> int:
        """The schedule's launch argument: bit 0 the lag, bits 8-15 the band (the
        peers-first order is compiled into its kernel variants)."""
        return self.lag | (self.band << 8)

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


def with_sk(plan: TilePlan, arch: str = "sm_90a") -> TilePlan:
    """``plan`` with the split-K tail (module docstring) where it has a partial last round
    to spread (the plain GEMM's one partial round too, on a grid widened to its pieces);
    unchanged elsewhere (whole rounds, a fused plan's one round, or too few K-tiles).
    Raises ValueError for a plan that can never take it."""
    if arch in BLACKWELL or plan.cta_group != 1 or plan.push_all or not (
            plan.mode == "gemm" or (plan.peers_first and plan.flat)):
        raise ValueError("the split-K tail runs on sm90 1-CTA plans in a flat order (the "
                         "plain GEMM, flat peers-first)")
    kt = ceil_div(plan.K, BK)
    if plan.mode == "gemm" and plan.num_units < min(plan.sm_count, SK_CTAS):
        # one partial round: the grid grows to the lanes its pieces take (module docstring)
        lanes = plan.num_units * sk_pieces(plan.sm_count, plan.num_units, kt)
        if lanes > plan.num_units:
            plan = replace(plan, grid=lanes, chunk=lanes, rounds=1)
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


def pairs_whole(p: TilePlan) -> bool:
    """No pair-tile holds tiles of two owners: every list starts on an even tile row (RS:
    no tile row is shared either); with pairs along N, on an even tile."""
    if p.pair_n:
        return p.mode != "ar" or all(p.ar_start(o) % 2 == 0 for o in range(1, p.world))
    if p.mode == "rs":
        return p.local_M % (2 * BM) == 0
    return all(p.ar_start(o) % (2 * p.tiles_n) == 0 for o in range(1, p.world))


# The knobs 4x1 clusters do not combine with (nothing measured or checked them together)
QUAD_CLASHES = ("sk", "pingpong", "pair_n")


def quad_refusal(mode: str, arch: str, bn: int | None, operands: str,
                 clashes: list[str]) -> str | None:
    """Why a call or kernel cannot run on 4x1 clusters (``cta_group`` 4), or None if it can:
    they are the plain sm90 GEMM of bf16 / fp16 operands along M, w's tile split four ways
    in whole 8-row atoms. ``clashes``: the names of the knobs of ``QUAD_CLASHES`` it sets.
    The resolver (before anything compiles), the planner (``tile_plan``) and the kernel's own
    check read it here."""
    if mode != "gemm" or arch != "sm_90a":
        return (f"4x1 clusters run the plain sm90 GEMM (gemm_only) only; this call is {mode} "
                f"on {arch}")
    if operands:
        return "4x1 clusters run bf16 / fp16 operands"
    if bn is not None and bn % (8 * QUAD):
        return f"BN={bn}: w's tile splits four ways on widths that are multiples of 32"
    if clashes:
        return f"not with {', '.join(clashes)}"
    return None


def tile_plan(M: int, N: int, K: int, world: int, sm_count: int, mode: str, *, arch: str,
              bn: int, cta_group: int, pair_ctas: int | None, lag: int | None,
              peers_first: bool, pair_n: bool = False, flat: bool = False,
              split_row: bool = False, bm: int = BM) -> TilePlan:
    """The plan of a chosen shape (width ``bn``, ``cta_group``, order): its tiles, lists,
    lanes and rounds (the module docstring); ValueError where the shape cannot run.
    ``pair_ctas``: CTAs resident at once as 2x1 clusters (None: every SM). ``bm`` 64:
    64-row tiles, the plain sm90 GEMM on 1-CTA tiles or 2x1 clusters along M."""
    if bn not in TILE_NS:
        raise ValueError(f"BN must be one of {TILE_NS}, got {bn}")
    if bm not in TILE_MS:
        raise ValueError(f"BM must be one of {TILE_MS}, got {bm}")
    if bm != BM and (mode != "gemm" or pair_n or arch in BLACKWELL):
        raise ValueError("64-row tiles run the plain sm90 GEMM (gemm_only) on 1-CTA tiles or "
                         "clusters along M")
    if arch in BLACKWELL and bn not in SM100_NS:
        raise ValueError(f"{arch} kernels run tiles {' or '.join(map(str, SM100_NS))} wide, "
                         f"not {bn}")
    if N % N_ALIGN or (N % bn and arch in BLACKWELL):
        raise ValueError(f"N={N}: {arch} plans need N a multiple of "
                         f"{bn if arch in BLACKWELL else N_ALIGN} at BN={bn}")
    if cta_group not in CTA_GROUPS:
        raise ValueError(f"cta_group must be one of {CTA_GROUPS}, got {cta_group}")
    if cta_group == QUAD:
        why = quad_refusal(mode, arch, bn, "", ["pair_n"] if pair_n else [])
        if why:
            raise ValueError(why)
    if cta_group >= 2:
        if peers_first and not pair_n:
            raise ValueError("the peers-first order on 2x1 clusters needs pairs along N")
        slots = sm_count if pair_ctas is None else min(sm_count, pair_ctas)
        return pair_plan(M, N, K, world, slots, mode, bn, lag, pair_n, peers_first, bm,
                         cta_group)
    tiles_m = ceil_div(M, bm)
    tiles_n = ceil_div(N, bn)
    num_tiles = tiles_m * tiles_n
    padded_M = ceil_div(M, world) * world
    base = TilePlan(M=M, N=N, K=K, world=world, sm_count=sm_count, mode=mode, bn=bn,
                    tiles_m=tiles_m, tiles_n=tiles_n, num_tiles=num_tiles, grid=0,
                    padded_M=padded_M, local_M=padded_M // world, chunk=0, rounds=0, lag=0,
                    bm=bm)
    if mode == "gemm":
        grid = min(num_tiles, sm_count)
        return replace(base, grid=grid, chunk=grid, rounds=ceil_div(num_tiles, grid))
    longest = base.longest_units
    if peers_first:
        if lag == 1:
            raise ValueError("peers_first runs with lag 0")
        if flat:
            chunk = max(1, min(sm_count, base.num_units))
            return replace(base, grid=chunk, chunk=chunk,
                           rounds=ceil_div(base.num_units, chunk), peers_first=True, flat=True)
        chunk = max(1, min(sm_count, longest))
        return replace(base, grid=chunk, chunk=chunk, rounds=world * ceil_div(longest, chunk),
                       peers_first=True)
    plan = round_order(base, sm_count, lag)
    if split_row and arch not in BLACKWELL and plan.can_split_row:
        return split_row_plan(plan, sm_count, lag)
    return plan


def split_row_plan(plan: TilePlan, sm_count: int, lag: int | None) -> TilePlan:
    """A whole-row round-order ``plan`` with its shared tile row split (``split_row``)."""
    return round_order(replace(plan, split_row=True), sm_count, lag)


def round_order(base: TilePlan, sm_count: int, lag: int | None) -> TilePlan:
    """``base`` in the round order: the lanes of each part, the rounds and the lag."""
    longest = base.longest_units
    chunk = max(1, min(sm_count // base.world, longest))
    chunks = ceil_div(longest, chunk)
    if lag is None:
        # A round of slack pays for itself only when there are enough rounds to hide it.
        lag = 1 if chunks >= 3 else 0
    elif lag not in (0, 1):
        raise ValueError(f"lag must be 0 or 1, got {lag}")
    return replace(base, grid=base.world * chunk, chunk=chunk, rounds=chunks + lag, lag=lag)


def pair_plan(M: int, N: int, K: int, world: int, sm_count: int, mode: str,
              bn: int, lag: int | None = None, pair_n: bool = False,
              peers_first: bool = False, bm: int = BM, cta_group: int = 2) -> TilePlan:
    """2-CTA schedule: the round schedule over pair-tiles, one cluster (2 CTAs) per lane,
    lag 0 unless 1 is asked for where ``pairs_whole`` (see the module docstring); with pairs
    along N also the peers-first order, where ``pairs_whole``. ``bm`` 64: the plain GEMM's
    pairs of 64-row tiles along M. ``cta_group`` 4 (the plain GEMM): clusters of four tile
    rows, one lane each; ``sm_count`` is then the CTAs resident as 4x1 clusters."""
    tiles_m = ceil_div(M, bm)
    tiles_n = ceil_div(N, bn)
    if pair_n and tiles_n % 2:
        raise ValueError(f"pairs along N need an even number of tile columns; N={N} has "
                         f"{tiles_n} of {bn}")
    padded_M = ceil_div(M, world) * world
    base = TilePlan(M=M, N=N, K=K, world=world, sm_count=sm_count, mode=mode, bn=bn,
                    tiles_m=tiles_m, tiles_n=tiles_n, num_tiles=tiles_m * tiles_n, grid=0,
                    padded_M=padded_M, local_M=padded_M // world, chunk=0, rounds=0, lag=0,
                    cluster_mn=(1, 2) if pair_n else (cta_group, 1), cta_group=cta_group,
                    pair_n=pair_n, bm=bm)
    clusters = max(1, sm_count // cta_group)
    if mode == "gemm":
        lanes = min(base.num_units, clusters)
        return replace(base, grid=cta_group * lanes, chunk=lanes,
                       rounds=ceil_div(base.num_units, lanes))
    if cta_group != 2:
        raise ValueError(f"clusters of {cta_group} run the plain GEMM only")
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
