"""The persistent grid's tile schedule on the device, mirrored from ``launch.plan``.

Which unit (tile, 2x1 pair-tile or split-K piece) lane ``lane`` of a rank computes in round
``rnd``, for every order the plans know: the round order with its lag round, peers-first,
the flat peers-first order, bands, pairs along N, split rows and the split-K tail. The MMA,
producer and communication roles of every kernel call the same functions, so they agree on
the order; ``launch.plan`` holds the formulas and the CPU tests that check them.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute

from .geometry import BM, SK_MAX_PIECES

Int32 = cutlass.Int32
Int64 = cutlass.Int64


class TileSchedule:
    """Mixin of the kernels (through ``CommWarps``): device methods of the schedule. Reads
    the kernel's ``mode, world, cta_group, peers_first, flat, sk, split_row, pair_n,
    push_all, push_ctas`` attributes."""

    @cute.jit
    def _list_start(self, o, num_tiles, tiles_m, tiles_n, local_M):
        s = Int32(0)
        if cutlass.const_expr(self.mode == "ar"):
            s = (o * num_tiles + Int32(self.world - 1)) // Int32(self.world)
        if cutlass.const_expr(self.mode == "rs"):
            b = o * local_M  # owner o's first row
            s = cutlass.min((b + Int32(self.bm - 1)) // Int32(self.bm), tiles_m) * tiles_n
            if cutlass.const_expr(self.split_row):
                # ``TilePlan.split_row``: a shared tile row split between the two lists
                if (b - (b // Int32(self.bm)) * Int32(self.bm) != Int32(0)) & (b < tiles_m * Int32(self.bm)):
                    even = (o * num_tiles + Int32(self.world - 1)) // Int32(self.world)
                    s = cutlass.min(cutlass.max(even, (b // Int32(self.bm)) * tiles_n), s)
        return s

    @cute.jit
    def _unit_list_start(self, o, num_tiles, tiles_m, tiles_n, local_M):
        """First schedule unit of list L_o (``TilePlan.unit_list_start``): the tile S(o), or
        with 2-CTA pairs the first pair-tile whose even tile is at or after S(o)."""
        s = self._list_start(o, num_tiles, tiles_m, tiles_n, local_M)
        if o == Int32(self.world):
            s = num_tiles
        if cutlass.const_expr(self.cta_group == 2 and self.pair_n):
            s = (s + Int32(1)) // Int32(2)
        elif cutlass.const_expr(self.cta_group == 2):
            pm = s // (Int32(2) * tiles_n)
            rem = s - pm * Int32(2) * tiles_n
            s = pm * tiles_n + cutlass.min(rem, tiles_n)
        return s

    @cute.jit
    def _sk_pieces(self, chunk, num_units, k_tiles):
        """``launch.plan.sk_pieces``: K pieces per unit of the last round (< 2: no split)."""
        r = num_units - (num_units // chunk) * chunk
        s = Int32(0)
        if r > Int32(0):
            s = cutlass.min(cutlass.min(chunk // r, Int32(SK_MAX_PIECES)), k_tiles)
        return s

    @cute.jit
    def _segment(self, lane, rnd, chunk, num_units, k_tiles):
        """(position in the flat order or -1, first k-tile, end k-tile) of lane ``lane`` in
        round ``rnd`` (``TilePlan.segment``): whole units unless ``sk``."""
        pos = rnd * chunk + lane
        lo = Int32(0)
        hi = k_tiles
        if cutlass.const_expr(self.sk):
            f = num_units // chunk
            s = self._sk_pieces(chunk, num_units, k_tiles)
            if (rnd == f) & (s > Int32(1)):
                q = lane // s
                i = lane - q * s
                pos = Int32(-1)
                if q < num_units - f * chunk:
                    pos = f * chunk + q
                lo = i * k_tiles // s
                hi = (i + Int32(1)) * k_tiles // s
        return pos, lo, hi

    @cute.jit
    def _scheduled_unit(self, rank, lane, rnd, chunk, lag, num_tiles, tiles_m, tiles_n, local_M,
                        k_tiles=None):
        """The unit (tile; pair-tile with 2-CTA MMA) lane ``lane`` (CTA; cluster) works on in
        round ``rnd``, or -1 (see ``TilePlan.scheduled_unit``; ``k_tiles``: the split-K
        tail's cuts, ``sk`` kernels only)."""
        if cutlass.const_expr(self.sk):
            pos, _, _ = self._segment(lane, rnd, chunk, num_tiles, k_tiles)
            rnd = pos // chunk
            lane = pos - rnd * chunk
            if pos < Int32(0):  # idle: a position past every unit
                rnd = num_tiles
                lane = Int32(0)
        units_m = tiles_m  # rows of units: tile rows, or pair-tile rows
        units_n = self._units_n(tiles_n)
        num_units = num_tiles
        if cutlass.const_expr(self.cta_group == 2 and self.pair_n):
            num_units = units_m * units_n
        elif cutlass.const_expr(self.cta_group >= 2):
            units_m = (tiles_m + Int32(self.cta_group - 1)) // Int32(self.cta_group)
            num_units = units_m * tiles_n
        t = Int32(-1)
        band = lag >> Int32(8)
        if cutlass.const_expr(self.mode == "gemm" or self.push_all):
            t = rnd * chunk + lane
            if t >= num_units:
                t = Int32(-1)
            if (band > Int32(0)) & (t >= Int32(0)):
                t = self._band_swizzle(t, units_m, units_n, band)
        else:
            # lag: TilePlan.sched_word (bit 0 the lag, bits 8-15 the band); the peers-first
            # order is compiled in (its variants only) so the default ones stay as they are
            chunk_no = rnd  # which chunk of its list a lane works on
            if cutlass.const_expr(self.flat):
                # one sequence: the peers' lists, then the own (``TilePlan.flat``)
                pos = rnd * chunk + lane
                for q in cutlass.range_constexpr(self.world):
                    o = (rank + Int32(1 + q)) % Int32(self.world)
                    n = (self._unit_list_start(o + Int32(1), num_tiles, tiles_m, tiles_n, local_M)
                         - self._unit_list_start(o, num_tiles, tiles_m, tiles_n, local_M))
                    if (t < Int32(0)) & (pos >= Int32(0)) & (pos < n):
                        t = self._list_unit(o, Int32(0), Int32(1), pos, band, num_tiles,
                                            tiles_m, tiles_n, local_M)
                    pos = pos - n
            elif cutlass.const_expr(self.peers_first):
                part = rnd % Int32(self.world)
                j = lane
                chunk_no = rnd // Int32(self.world)
            else:
                part = lane // chunk
                j = lane - part * chunk
            if cutlass.const_expr(not self.flat):
                o = rank
                k = chunk_no - (lag & Int32(1))
                if part < Int32(self.world - 1):
                    o = (rank + Int32(1) + part) % Int32(self.world)
                    k = chunk_no
                t = self._list_unit(o, k, chunk, j, band, num_tiles, tiles_m, tiles_n, local_M)
        if cutlass.const_expr(self.push_ctas):
            if lane >= chunk:
                t = Int32(-1)  # a push CTA computes nothing
        return t

    @cute.jit
    def _list_unit(self, o, k, step, j, band, num_tiles, tiles_m, tiles_n, local_M):
        """The unit at position ``k * step + j`` of list L_o in its band order, or -1 for a
        negative ``k`` or past the list's end."""
        start = self._unit_list_start(o, num_tiles, tiles_m, tiles_n, local_M)
        end = self._unit_list_start(o + Int32(1), num_tiles, tiles_m, tiles_n, local_M)
        idx = k * step + j
        length = end - start
        t = Int32(-1)
        units_n = self._units_n(tiles_n)
        if (k >= Int32(0)) & (idx < length):
            if band > Int32(0):  # launch.plan.list_swizzle
                rows = length // units_n
                if idx < rows * units_n:
                    idx = self._band_swizzle(idx, rows, units_n, band)
            t = start + idx
        return t

    @cute.jit
    def _units_n(self, tiles_n):
        """Schedule units per unit row (``TilePlan.units_n``): tiles, or pairs along N."""
        n = tiles_n
        if cutlass.const_expr(self.cta_group == 2 and self.pair_n):
            n = tiles_n // Int32(2)
        return n

    @cute.jit
    def _band_swizzle(self, i, rows, tiles_n, band):
        """launch.plan.band_swizzle: item i of a grid of ``rows`` x ``tiles_n`` units."""
        per_band = band * tiles_n
        b = i // per_band
        within = i - b * per_band
        r = cutlass.min(band, rows - b * band)
        tn = within // r
        return (b * band + (within - tn * r)) * tiles_n + tn

    @cute.jit
    def _scheduled(self, rank, cta, rnd, chunk, lag, num_tiles, tiles_m, tiles_n, local_M,
                   k_tiles=None):
        """The tile this CTA finishes in round ``rnd``, or -1 (see ``TilePlan.scheduled``).
        With 2-CTA pairs: the even / odd tile of the cluster's pair-tile; an odd tile row
        past the last one (zero-filled padding) is -1: computed, never communicated. A
        split-K piece stored for another lane (``sk``) is -1 too."""
        t = Int32(-1)
        if cutlass.const_expr(self.cta_group == 1):
            t = self._scheduled_unit(rank, cta, rnd, chunk, lag, num_tiles, tiles_m, tiles_n,
                                     local_M, k_tiles)
            if cutlass.const_expr(self.sk):
                _, lo, _ = self._segment(cta, rnd, chunk, num_tiles, k_tiles)
                if lo > Int32(0):
                    t = Int32(-1)
        else:
            g = Int32(self.cta_group)
            u = self._scheduled_unit(rank, cta // g, rnd, chunk, lag, num_tiles, tiles_m,
                                     tiles_n, local_M)
            if cutlass.const_expr(self.pair_n):
                if u >= Int32(0):
                    t = Int32(2) * u + (cta - (cta // Int32(2)) * Int32(2))
            elif u >= Int32(0):
                pm = u // tiles_n
                tn = u - pm * tiles_n
                tm = g * pm + (cta - (cta // g) * g)
                if tm < tiles_m:
                    t = tm * tiles_n + tn
        return t
