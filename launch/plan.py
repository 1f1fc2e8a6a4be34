"""The tile plan: a pure function of (M, N, K, world, SM count, mode).

The kernels mirror these formulas on the device (see ``sm90_kernel``); the CPU tests check
them here, so a change to one side without the other fails in CI.

Ownership
- RS: rows are padded to ``padded_M = ceil(M / world) * world``; rank r owns rows
  ``[r * local_M, (r + 1) * local_M)``. A 128-row tile may span two or more owners when
  ``local_M`` is not a multiple of 128; each row goes to its own owner.
- AR: tiles are numbered ``t = tm * tiles_n + tn``; rank r owns the contiguous block
  ``[start(r), start(r + 1))`` with ``start(r) = ceil(r * T / world)``, so ownership stays
  balanced at any M, including a single tile row.

Order
Every rank walks the tiles in linear order rotated to begin at the next rank's block, so the
tiles it finishes first are ones a peer owns (their partials travel while later tiles
compute) and the tiles it owns come last, when the peers' partials have usually arrived.
"""
from __future__ import annotations

from dataclasses import dataclass

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

    # ---- order and receive slots
    def rotation(self, rank: int) -> int:
        nxt = (rank + 1) % self.world
        if self.mode == "ar":
            return self.ar_start(nxt) % self.num_tiles
        if self.mode == "rs":
            return ((nxt * self.local_M) // BM) * self.tiles_n % self.num_tiles
        return 0

    def tile_order(self, rank: int) -> list[int]:
        rot = self.rotation(rank)
        return [(i + rot) % self.num_tiles for i in range(self.num_tiles)]

    def cta_tiles(self, rank: int, cta: int) -> list[int]:
        order = self.tile_order(rank)
        return order[cta :: self.grid]

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
    return TilePlan(
        M=M, N=N, K=K, world=world, sm_count=sm_count, mode=mode, bn=bn,
        tiles_m=tiles_m, tiles_n=tiles_n, num_tiles=num_tiles,
        grid=min(num_tiles, sm_count), padded_M=padded_M, local_M=padded_M // world,
    )


def max_recv_slots(max_M: int, N: int, world: int, bn: int) -> int:
    """Upper bound of the tiles one owner receives from one peer, over every M <= max_M."""
    tiles_n = N // bn
    rs = (ceil_div(ceil_div(max_M, world), BM) + 1) * tiles_n
    ar = ceil_div(ceil_div(max_M, BM) * tiles_n, world)
    return max(rs, ar)
