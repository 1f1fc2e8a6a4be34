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
"""
from __future__ import annotations

from dataclasses import dataclass, replace

BM = 128
BK = 64
EPI_N = 32
MODES = ("rs", "ar", "gemm")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def choose_bn(M: int, N: int, sm_count: int) -> int:
    """BN=256 halves the B traffic per output; take it once it still fills every SM."""
    if N % 256 == 0 and ceil_div(M, BM) * (N // 256) >= sm_count:
        return 256
    return 128


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
        """Every rank that receives part of tile t (RS: by rows, AR: one owner)."""
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
            return min(ceil_div(o * self.local_M, BM), self.tiles_m) * self.tiles_n
        return 0 if o == 0 else self.num_tiles

    def list_len(self, o: int) -> int:
        return self.list_start(o + 1) - self.list_start(o)

    def scheduled(self, rank: int, cta: int, rnd: int) -> int:
        """The tile CTA ``cta`` of ``rank`` computes in round ``rnd``, or -1 (idle)."""
        if self.mode == "gemm":
            t = rnd * self.grid + cta
            return t if t < self.num_tiles else -1
        part, j = divmod(cta, self.chunk)
        if part < self.world - 1:
            o, k = (rank + 1 + part) % self.world, rnd
        else:
            o, k = rank, rnd - self.lag
        idx = k * self.chunk + j
        if k < 0 or idx >= self.list_len(o):
            return -1
        return self.list_start(o) + idx

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
        if self.mode == "ar":
            return t - self.ar_start(owner)
        tm, tn = divmod(t, self.tiles_n)
        return (tm - (owner * self.local_M) // BM) * self.tiles_n + tn

    @staticmethod
    def src_index(src: int, owner: int, world: int) -> int:
        """Receive region of ``src`` on ``owner``: peers only, so world-1 regions."""
        return (src - owner - 1) % world


def make_plan(M: int, N: int, K: int, world: int, sm_count: int, mode: str) -> TilePlan:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    bn = choose_bn(M, N, sm_count)
    tiles_m = ceil_div(M, BM)
    tiles_n = N // bn
    num_tiles = tiles_m * tiles_n
    padded_M = ceil_div(M, world) * world
    base = TilePlan(M=M, N=N, K=K, world=world, sm_count=sm_count, mode=mode, bn=bn,
                    tiles_m=tiles_m, tiles_n=tiles_n, num_tiles=num_tiles, grid=0,
                    padded_M=padded_M, local_M=padded_M // world, chunk=0, rounds=0, lag=0)
    if mode == "gemm":
        grid = min(num_tiles, sm_count)
        return replace(base, grid=grid, chunk=grid, rounds=ceil_div(num_tiles, grid))
    longest = max(base.list_len(o) for o in range(world))
    chunk = max(1, min(sm_count // world, longest))
    chunks = ceil_div(longest, chunk)
    # A round of slack pays for itself only when there are enough rounds to hide it.
    lag = 1 if chunks >= 3 else 0
    return replace(base, grid=world * chunk, chunk=chunk, rounds=chunks + lag, lag=lag)


def max_recv_slots(max_M: int, N: int, world: int, bn: int) -> int:
    """Upper bound of the tiles one owner receives from one peer, over every M <= max_M."""
    tiles_n = N // bn
    rs = (ceil_div(ceil_div(max_M, world), BM) + 1) * tiles_n
    ar = ceil_div(ceil_div(max_M, BM) * tiles_n, world)
    return max(rs, ar)
