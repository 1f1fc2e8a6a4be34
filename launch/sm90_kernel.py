"""Hopper (sm90a) fused GEMM + reduce-scatter / all-reduce, one persistent kernel.

Warp roles (384 threads, one CTA per SM, persistent over tiles):
- warp 0: TMA loads of x and w tiles into a multi-stage smem ring (mbarrier pipeline);
- warps 1-3 (96 threads): communication - they drain finished output sub-tiles from a
  second smem ring and move them (to peers, to the workspace, to the output), wait for
  peers' stamps and reduce, so the exchange of tile i overlaps the mainloop of tile i+1;
- warp groups 1-2: wgmma on 128 x BN tiles (64 rows each), then stmatrix of the fp32
  accumulators as bf16 (or fp16: ``dtype``) into the sub-tile ring (128 x 32 per slot;
  padded rows, or with bulk-copy pushes unpadded swizzled ones, see ``CommWarps``); fp8
  operands: the accumulators are first scaled by the tile's row and column scales, which
  the same threads copied into shared memory as the tile's mainloop started.
With ``cta_group`` 2 the grid runs as 2x1 clusters over pair-tiles (``launch.plan``): the two
CTAs compute vertically adjacent tiles and each TMA-loads half of w's tile for both.

Per tile on rank r (ownership and order: ``launch.plan``), the communication warps:
- rows a peer owns: push the bf16 partial into that owner's receive slot (unicast: thread
  stores, or one bulk copy per owner's row range), or write it to this rank's own partial
  buffer (multicast); after the tile, one thread fences at system scope and stamps the
  owner's arrival word [tile][r] with epoch+1;
- a tile only r owns: wait for every peer's stamp first, then per sub-tile add the peers'
  partials (local receive slots, or one ``multimem.ld_reduce``) to the own partial in
  fp32 and store bf16 to the output; AR also sends the reduced tile to every peer
  (unicast stores, or ``multimem.st``) and stamps their result words;
- a tile r shares with other owners (RS, local_M not a multiple of 128): own rows are
  parked in the workspace and reduced after the CTA's last tile, so no CTA waits while it
  still owes a peer data (that is what keeps the protocol deadlock-free);
- AR, after the last tile: copy the tiles other ranks reduced into the caller's output as
  their result stamps arrive.
The first CTA stamps ``started`` on every peer once the launch may touch global memory, and a
rank writes into a peer's workspace only after that peer's stamp shows it has started this
launch (so it finished the previous one); the last CTA to exit advances the epoch (device
memory, ``launch.protocol``). Mode ``gemm`` compiles the communication out (plain GEMM): one
communication warp stores each output sub-tile from the ring by TMA (``tma_store``).
"""
from __future__ import annotations

from collections import namedtuple
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
import cutlass.tensor_utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from . import layout, protocol, ptx, tma_descs, trace
from .comm_warps import BK_BYTES, CommWarps
from .fp8_scales import Fp8Scales
from .pingpong import PingPongMma
from .geometry import (BM, CTA_GROUPS, DEFAULT_MAX_STAGES, EPI_N, GEMM_ONLY_NS, L2_HINTS,
                       MAX_STAGES, QUAD, QUAD_CLASHES, TILE_MS, TILE_NS, TMA_PROMOS, X_ROWS,
                       quad_refusal)
from .split_k import SplitKPieces
from .sub_tile import COMM_THREADS as _COMM_THREADS
from .variant import Variant, has_x_box, pingpong_refusal

Int32 = cutlass.Int32
Int64 = cutlass.Int64
Float32 = cutlass.Float32

_ROW_LAYOUT = cutlass.tensor_utils.LayoutEnum.ROW_MAJOR


def _sw64_bytes() -> Any:
    """The TMA's 64-byte swizzle on byte addresses (16-B chunk bits 4-5 ^= bits 7-8):
    ``CommWarps``' chunk order for 64-byte rows. Built inside a trace (it needs its context)."""
    return cute.make_swizzle(2, 4, 3)


def x_box_views(gA: Any, sA: Any, x_rows: int, bm: int, bk: int, stages: int) -> tuple:
    """x's box of ``x_rows`` rows on the last tile row (``Variant.x_rows``, any whole 8-row
    atoms below the tile's, dividing it or not): the first ``x_rows`` rows of each of gA's
    (bm, bk) tiles and of each of sA's stages, as (gX, sX), indexed as gA and sA are. Built
    inside a trace."""
    gX = cute.make_tensor(gA.iterator, cute.make_layout(
        (x_rows, bk, gA.shape[2], gA.shape[3]), stride=gA.stride))
    sX = cute.composition(sA, cute.make_layout((x_rows, bk, stages), stride=(1, bm, bm * bk)))
    return gX, sX


def _tma_op(multicast: int) -> Any:
    """The TMA load of an operand tile shared by ``multicast`` CTAs (each loads its part for
    all of them), or loaded by one."""
    if multicast > 1:
        return cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp()
    return cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()


# what each role's per-unit helper takes, built once per launch and passed as one value
LoadCtx = namedtuple("LoadCtx", "ab_pipe tma_a tAgA tAsA tma_x tXgX tXsX tma_b tBgB tBsB "
                     "a_mask b_mask a_rest_bytes v_in_pair tiles_m tiles_n policy desc_a desc_x desc_b")
StoreCtx = namedtuple("StoreCtx", "tma_c sC_st gC_st epi_pipe tiles_n")
# scales: the fp8 block-scale accumulators, MMAs, rows and strides
MmaCtx = namedtuple("MmaCtx", "mtid lane v_in_pair num_tiles tiles_m tiles_n k_tiles rank chunk "
                    "tiled_mma ab_pipe epi_pipe ws cta timeout_ns err_addr M N sx_addr sw_addr "
                    "scale_bits sS_ptr tCrA tCrB tCcC acc num_k_blocks tiled_r2s tRS_rD "
                    "tRS_rD_out tRS_sC tRS_rAcc size_rD scales")


class Sm90FusedKernel(CommWarps, PingPongMma, Fp8Scales, SplitKPieces):
    """One compiled ``Variant``; everything else is a launch argument."""

    def __init__(self, v: Variant) -> None:
        """The kernel of ``v`` (``launch.variant.Variant`` documents each choice); ValueError
        where the choices cannot run together."""
        bn, world, mode, transport, cta_group = v.bn, v.world, v.mode, v.transport, v.cta_group
        epi_slots, push, stages, trace = v.epi_slots, v.push, v.stages, v.trace
        peers_first, pair_n, push_all, pdl = v.peers_first, v.pair_n, v.push_all, v.pdl
        prefetch, early_copy, push_window, flat = v.prefetch, v.early_copy, v.push_window, v.flat
        sk, split_row, push_ctas, lean_exit = v.sk, v.split_row, v.push_ctas, v.lean_exit
        tma_store, block_scales, pingpong = v.tma_store, v.block_scales, v.pingpong
        dtype, in_dtype, bias = v.dtype, v.in_dtype, v.bias
        self._use_dtype(dtype, in_dtype)
        self._use_bias(bias, mode)
        self.block_scales = bool(block_scales)
        if self.block_scales and (not self.scaled or bn not in (64, 128)):
            raise ValueError(f"block-wise scales are for fp8 operands on tiles 64 or 128 wide "
                             f"(a 128 x 128 block of w per tile column), got in_dtype="
                             f"{in_dtype!r}, BN={bn}")
        # per-row / per-tensor scales: applied in the epilogue, from shared memory
        self.row_scales = self.scaled and not self.block_scales
        if bn not in TILE_NS:
            raise ValueError(f"BN must be one of {TILE_NS}, got {bn}")
        if mode not in ("rs", "ar", "gemm"):
            raise ValueError(f"mode must be rs, ar or gemm, got {mode!r}")
        if bn in GEMM_ONLY_NS and mode != "gemm":
            raise ValueError(f"BN={bn} runs the plain GEMM (gemm_only) only")
        if transport not in ("unicast", "multicast"):
            raise ValueError(f"transport must be unicast or multicast, got {transport!r}")
        if cta_group not in CTA_GROUPS:
            raise ValueError(f"cta_group must be one of {CTA_GROUPS}, got {cta_group}")
        if cta_group == QUAD:
            why = quad_refusal(mode, v.arch, bn, in_dtype,
                               [k for k in QUAD_CLASHES if getattr(v, k)])
            if why:
                raise ValueError(f"4x1 clusters run the plain GEMM of bf16 / fp16 operands "
                                 f"along M: {why}; got {v.describe()}")
        if push not in ("lsu", "tma", "tma_all"):
            raise ValueError(f"push must be lsu, tma or tma_all, got {push!r}")
        self.tma_push = push in ("tma", "tma_all")
        self.bulk_results = push == "tma_all"
        self.peers_first = bool(peers_first)
        self.flat = bool(flat)
        if self.flat and (not self.peers_first or cta_group != 1):
            raise ValueError("the flat order is the peers-first order's, on 1-CTA tiles")
        self.sk = bool(sk)
        self.split_row = bool(split_row)
        self.push_ctas = bool(push_ctas)
        self.lean_exit = bool(lean_exit)
        self.tma_store = bool(tma_store)
        if self.tma_store and (mode != "gemm" or push != "tma"):
            raise ValueError("TMA stores are the plain GEMM's, from the bulk-copy ring (push tma)")
        if self.push_ctas and (mode != "rs" or transport != "unicast" or not self.tma_push
                               or not self.flat or self.sk):
            raise ValueError("push CTAs run RS over unicast with bulk-copy pushes, in the flat "
                             "order without the split-K tail")
        if self.split_row and (mode != "rs" or cta_group != 1 or self.peers_first):
            raise ValueError("split rows are an RS 1-CTA round order's")
        if self.sk and (cta_group != 1 or push_all or not (mode == "gemm" or self.flat)):
            raise ValueError("the split-K tail runs on 1-CTA tiles in a flat order (the plain "
                             "GEMM, or flat peers-first)")
        self.pingpong = bool(pingpong)
        if self.pingpong:
            why = pingpong_refusal(bn, mode, bool(tma_store), self.scaled, bool(sk),
                                   bool(trace), bool(push_ctas))
            if why:
                raise ValueError(why)
        self.pair_n = bool(pair_n)
        self.push_all = bool(push_all)
        self.pdl = bool(pdl)
        self.prefetch = bool(prefetch)
        self.early_copy = bool(early_copy)
        if push_window < 0 or (push_window and not self.tma_push):
            raise ValueError(f"push_window {push_window}: a count of bulk-copy groups, for "
                             "push tma or tma_all")
        self.push_window = int(push_window)
        if self.push_all and (mode != "ar" or transport != "unicast" or cta_group != 1
                              or not self.tma_push or self.peers_first or world != 2):
            raise ValueError("push-all is a world-2 AR plan over unicast on 1-CTA tiles with "
                             "bulk-copy pushes, in the flat order")
        if self.pair_n and cta_group != 2:
            raise ValueError("pairs along N are 2x1-cluster plans")
        if self.peers_first and cta_group == 2 and not self.pair_n:
            raise ValueError("the peers-first order on 2x1 clusters needs pairs along N")
        # CTAs each operand's tile is multicast to: w's on 2x1 clusters, x's with pairs along N
        self.mc_a = 2 if self.pair_n else 1
        self.mc_b = 1 if self.pair_n else cta_group
        self.trace = bool(trace)
        self.bn, self.world, self.mode, self.transport = bn, world, mode, transport
        self.cta_group = cta_group
        self.multicast = transport == "multicast"
        self.comm = mode != "gemm"
        self.bm = v.bm
        if self.bm not in TILE_MS:
            raise ValueError(f"BM must be one of {TILE_MS}, got {self.bm}")
        if self.bm != BM and (mode != "gemm" or self.pair_n or self.pingpong or self.scaled):
            raise ValueError("64-row tiles run the plain GEMM of bf16 / fp16 operands on 1-CTA "
                             "tiles or 2x1 clusters along M, without ping-pong or pairs along N")
        self.x_rows = v.x_rows or self.bm
        if v.x_rows and (v.x_rows not in X_ROWS or v.x_rows >= self.bm or not has_x_box(
                mode, v.pair_n, in_dtype, self.pingpong, v.arch)):
            raise ValueError(f"x_rows {v.x_rows}: boxes of {X_ROWS} rows, fewer than the "
                             f"tile's {self.bm}, for the plain GEMM of bf16 / fp16 operands on "
                             f"1-CTA tiles or 2x1 clusters along M, without ping-pong")
        if not 0 <= v.l2_hint < len(L2_HINTS):
            raise ValueError(f"l2_hint must index {L2_HINTS}, got {v.l2_hint}")
        self.l2_hint = v.l2_hint
        if not 0 <= v.tma_promo < len(TMA_PROMOS):
            raise ValueError(f"tma_promo must index {TMA_PROMOS}, got {v.tma_promo}")
        self.tma_promo = v.tma_promo
        # 64-row tiles: one MMA warp group computes the whole tile
        self.num_mma_wg = self.bm // 64
        self.threads = 128 * (1 + self.num_mma_wg)
        self.num_mma_threads = 128 * self.num_mma_wg
        self.producer_regs = 104  # 128 x 104 + 256 x 200 = 384 x 168: what the CTA holds at launch
        self.mma_regs = 200
        # Block-wise scales on the GEMM alone with the TMA store: no thread of the first warp
        # group holds more than a few registers, so the MMA threads take 232 and keep two
        # k-groups' products (``_mma_role``); the fused kernels' communication threads need
        # their 104 (at 72 / 216 both sides spill).
        self.block_pairs = self.block_scales and mode == "gemm" and self.tma_store
        if self.block_pairs or (self.pingpong and mode == "gemm" and self.tma_store):
            self.producer_regs, self.mma_regs = 40, 232
        elif self.pingpong and bn > 128:
            # 160 accumulators a thread beside the communication warps (``PINGPONG_WIDEST``)
            self.producer_regs, self.mma_regs = 72, 216
        # threads that consume each mainloop stage and fill each ring slot
        self.stage_threads = 128 if self.pingpong else self.num_mma_threads
        # widths 16 past a multiple of 32 (``FINE_NS``) hand their tiles over in 16-column
        # sub-tiles; every other width keeps the 32-column ring it was measured with
        self.epi_n = EPI_N if bn % EPI_N == 0 else 16
        self.num_sub = bn // self.epi_n
        # The ring holds a whole tile, so the MMA warps hand a tile over and start the next
        # one while the communication warps still push it: with a 2-slot ring (BN=256, one
        # more mainloop stage) they waited on the link's bursts at every tile end, and RS /
        # AR at 8192 x 7168 x 4096 took 10% / 15% longer (docs/PERF.md). Costs BN=256 its
        # fourth mainloop stage (3 remain, as for BN=224); BN=128 keeps 6 (5 with padded
        # thread-store rows), BN=64 8.
        self.tile_bytes = self.bm * bn * 2
        # fp8: a tile's row and column scales, staged in shared memory (``_stage_scales``),
        # take the 1 KiB kept spare first
        spare = max(1024, 4 * (self.bm + bn)) if self.row_scales else 1024
        smem = cutlass.memory.get_smem_capacity_in_bytes("sm_90")
        ab_bytes = (self.bm + bn) * BK_BYTES  # one k-block of x's and w's tiles
        slot_bytes = self.bm * self.epi_pitch * 2
        self.epi_slots = epi_slots or self.num_sub
        if stages:
            if epi_slots:
                raise ValueError("give the ring depth or the mainloop stages, not both")
            if not 3 <= stages <= MAX_STAGES:
                raise ValueError(f"stages must be 3..{MAX_STAGES}, got {stages}")
            fit = (smem - 1024 - spare - stages * ab_bytes) // slot_bytes
            if fit < 2:
                raise ValueError(f"{stages} mainloop stages at BN={bn} leave {fit} ring slots; "
                                 f"at least 2 are needed")
            self.epi_slots = min(self.num_sub, fit)
        epi_bytes = slot_bytes * self.epi_slots
        # 1 KiB of mbarriers ahead of the 1 KiB-aligned buffers, then the spare; past
        # DEFAULT_MAX_STAGES only where a forced ``stages`` asks
        self.ab_stage = min(max(DEFAULT_MAX_STAGES, stages),
                            (smem - 1024 - spare - epi_bytes) // ab_bytes)
        if self.ab_stage < 3:
            raise ValueError(f"{self.epi_slots} ring slots leave {self.ab_stage} mainloop stages "
                             f"at BN={bn}; at least 3 are needed")
        self.comm_bar = pipeline.NamedBarrier(barrier_id=2, num_threads=_COMM_THREADS)
        self.mma_bar = pipeline.NamedBarrier(barrier_id=3, num_threads=self.num_mma_threads)
        # push CTAs: their communication and MMA threads copy staged tiles together
        self.push_threads = _COMM_THREADS + self.num_mma_threads
        self.push_bar = pipeline.NamedBarrier(barrier_id=4, num_threads=self.push_threads)

    # ------------------------------------------------------------------ host side
    def _layouts(self) -> None:
        row = _ROW_LAYOUT
        ab, bk = self.ab_elem, self.bk
        self.tiled_mma = self._make_mma()
        atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(row, ab, bk), ab)
        self.a_smem_staged = cute.tile_to_shape(atom, (self.bm, bk, self.ab_stage), order=(0, 1, 2))
        self.b_smem_staged = cute.tile_to_shape(atom, (self.bn, bk, self.ab_stage), order=(0, 1, 2))
        # x's tail box: the stage's first x_rows rows (the atom is 8 rows, stacked along M
        # first, so these rows are laid out as in the whole tile's stage)
        self.a_box = cute.tile_to_shape(atom, (self.x_rows, bk), order=(0, 1))

    def _make_mma(self) -> Any:
        """Two warp groups of ``m64 x BN`` wgmmas on the tile, fp32 accumulators."""
        row = _ROW_LAYOUT
        return sm90_utils.make_trivial_tiled_mma(
            self.ab_elem, self.ab_elem, row.sm90_mma_major_mode(), row.sm90_mma_major_mode(),
            Float32, (self.num_mma_wg, 1, 1), tiler_mn=(64, self.bn))

    def _slot_layout(self, slots: int = 0) -> Any:
        """The sub-tile ring's layout, (BM, EPI_N[, slots]): padded rows, or with bulk-copy
        rows the element-index form of ``CommWarps``' chunk swizzle (bits 3-4 ^= bits 6-7)."""
        outer = self._slot_outer(slots)
        if not self.swizzled:
            return outer
        if self.epi_n != EPI_N:
            return cute.make_composed_layout(cute.make_swizzle(1, 3, 3), 0, outer)
        return cute.make_composed_layout(cute.make_swizzle(2, 3, 3), 0, outer)

    def _sw_bytes(self) -> Any:
        return _sw64_bytes() if self.epi_n == EPI_N else cute.make_swizzle(1, 4, 3)

    def _slot_outer(self, slots: int = 0) -> Any:
        shape, stride = (self.bm, self.epi_n), (self.epi_pitch, 1)
        if slots:
            shape, stride = (*shape, slots), (*stride, self.bm * self.epi_pitch)
        return cute.make_layout(shape, stride=stride)

    def _shared_storage(self) -> Any:
        """The kernel's shared memory: mbarriers, the mainloop stages, the sub-tile ring and
        (fp8) a tile's scales."""
        fields = {
            "ab_mbar": cute.struct.MemRange[Int64, self.ab_stage * 2],
            "epi_mbar": cute.struct.MemRange[Int64, self.epi_slots * 2],
            "sA": cute.struct.Align[
                cute.struct.MemRange[self.ab_elem, cute.cosize(self.a_smem_staged)], 1024],
            "sB": cute.struct.Align[
                cute.struct.MemRange[self.ab_elem, cute.cosize(self.b_smem_staged)], 1024],
            "sC": cute.struct.Align[
                cute.struct.MemRange[self.elem, self.bm * self.epi_pitch * self.epi_slots], 1024],
        }
        if self.row_scales:
            fields["sS"] = cute.struct.Align[cute.struct.MemRange[Float32, self.bm + self.bn], 16]
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))

    @cute.jit
    def __call__(
        self,
        x_addr: Int64, w_addr: Int64, out_addr: Int64,
        sx_addr: Int64, sw_addr: Int64, scale_bits: Int32, bias_addr: Int64,
        M: Int32, N: Int32, K: Int32,
        ws: Int64, peer_tab: Int64, mc_base: Int64, err_addr: Int64,
        rank: Int32, local_M: Int32, padded_M: Int32, chunk: Int32, rounds: Int32, lag: Int32,
        grid: Int32, timeout_ns: Int64,
        arrive_off: Int64, result_off: Int64, recv_off: Int64, region_bytes: Int64,
        part_off: Int64, out_off: Int64,
        stream: cuda.CUstream,
    ):
        self._layouts()
        K = cute.assume(K, divby=self.bk)
        N = cute.assume(N, divby=8)  # plan.N_ALIGN: rows of 16 bytes
        a_ptr = cute.make_ptr(self.ab_elem, x_addr, cute.AddressSpace.gmem, assumed_align=16)
        b_ptr = cute.make_ptr(self.ab_elem, w_addr, cute.AddressSpace.gmem, assumed_align=16)
        mA = cute.make_tensor(a_ptr, cute.make_layout((M, K), stride=(K, 1)))
        mB = cute.make_tensor(b_ptr, cute.make_layout((N, K), stride=(K, 1)))
        tma_a, tma_tA = cute.nvgpu.cpasync.make_tiled_tma_atom(
            _tma_op(self.mc_a), mA, cute.slice_(self.a_smem_staged, (None, None, 0)),
            (self.bm, self.bk), num_multicast=self.mc_a)
        tma_x, tma_tX = tma_a, tma_tA  # the tail box's atom where the variant has one
        if cutlass.const_expr(self.x_rows != self.bm):
            tma_x, tma_tX = cute.nvgpu.cpasync.make_tiled_tma_atom(
                _tma_op(1), mA, self.a_box, (self.x_rows, self.bk))
        tma_b, tma_tB = cute.nvgpu.cpasync.make_tiled_tma_atom(
            _tma_op(self.mc_b), mB, cute.slice_(self.b_smem_staged, (None, None, 0)),
            (self.bn, self.bk), num_multicast=self.mc_b)
        # unused arguments in the other variants: the kernel's parameter list is fixed
        tma_c, tma_tC = tma_a, tma_tA
        if cutlass.const_expr(self.tma_store):
            c_ptr = cute.make_ptr(self.elem, out_addr, cute.AddressSpace.gmem, assumed_align=16)
            mC = cute.make_tensor(c_ptr, cute.make_layout((M, N), stride=(N, 1)))
            tma_c, tma_tC = cute.nvgpu.cpasync.make_tiled_tma_atom(
                cute.nvgpu.cpasync.CopyBulkTensorTileS2GOp(), mC,
                cute.make_composed_layout(self._sw_bytes(), 0, self._slot_outer()), (self.bm, self.epi_n))

        self.shared_storage = self._shared_storage()
        args = (tma_a, tma_tA, tma_x, tma_tX, tma_b, tma_tB, tma_c, tma_tC, self.tiled_mma,
                self.a_smem_staged, self.b_smem_staged, out_addr, sx_addr, sw_addr, scale_bits,
                bias_addr, M, N, K, ws, peer_tab, mc_base, err_addr, rank, local_M, padded_M,
                chunk, rounds, lag, timeout_ns, arrive_off, result_off, recv_off, region_bytes,
                part_off, out_off)
        cfg = dict(grid=[grid, 1, 1], block=[self.threads, 1, 1], cluster=(self.cta_group, 1, 1),
                   min_blocks_per_mp=1, use_pdl=self.pdl, stream=stream)
        if cutlass.const_expr(self.tma_promo):
            # the driver's descriptors of the atoms' boxes, with the promotion (launch.tma_descs)
            promo = TMA_PROMOS[self.tma_promo]
            d_a = tma_descs.encode(self.ab_elem, x_addr, M, K, self.bm // self.mc_a, self.bk,
                                   promo)
            d_x = d_a
            if cutlass.const_expr(self.x_rows != self.bm):
                d_x = tma_descs.encode(self.ab_elem, x_addr, M, K, self.x_rows, self.bk, promo)
            d_b = tma_descs.encode(self.ab_elem, w_addr, N, K, self.bn // self.mc_b, self.bk,
                                   promo)
            self.kernel_promo(d_a, d_x, d_b, *args).launch(**cfg)
        else:
            self.kernel(*args).launch(**cfg)

    # ------------------------------------------------------------------ device side
    # Two entries around one body: the DSL reads a kernel's parameters from its signature, and
    # only ``kernel_promo``'s launches pay for encoding the descriptors it takes
    @cute.kernel
    def kernel(
        self,
        tma_a: cute.CopyAtom, mA: cute.Tensor, tma_x: cute.CopyAtom, mX: cute.Tensor,
        tma_b: cute.CopyAtom, mB: cute.Tensor,
        tma_c: cute.CopyAtom, mC: cute.Tensor, tiled_mma: cute.TiledMma,
        a_smem_staged: cute.ComposedLayout, b_smem_staged: cute.ComposedLayout,
        out_addr: Int64, sx_addr: Int64, sw_addr: Int64, scale_bits: Int32, bias_addr: Int64,
        M: Int32, N: Int32, K: Int32,
        ws: Int64, peer_tab: Int64, mc_base: Int64, err_addr: Int64,
        rank: Int32, local_M: Int32, padded_M: Int32, chunk: Int32, rounds: Int32, lag: Int32,
        timeout_ns: Int64, arrive_off: Int64, result_off: Int64, recv_off: Int64, region_bytes: Int64,
        part_off: Int64, out_off: Int64,
    ):
        """The kernel whose loads use the atoms' own descriptors."""
        self._body((None, None, None), tma_a, mA, tma_x, mX, tma_b, mB, tma_c, mC, tiled_mma,
                   a_smem_staged, b_smem_staged, out_addr, sx_addr, sw_addr, scale_bits,
                   bias_addr, M, N, K, ws, peer_tab, mc_base, err_addr, rank, local_M,
                   padded_M, chunk, rounds, lag, timeout_ns, arrive_off, result_off, recv_off,
                   region_bytes, part_off, out_off)

    @cute.kernel
    def kernel_promo(
        self,
        desc_a: cutlass.GridConstant[tma_descs.tm.TensorMap],
        desc_x: cutlass.GridConstant[tma_descs.tm.TensorMap],
        desc_b: cutlass.GridConstant[tma_descs.tm.TensorMap],
        tma_a: cute.CopyAtom, mA: cute.Tensor, tma_x: cute.CopyAtom, mX: cute.Tensor,
        tma_b: cute.CopyAtom, mB: cute.Tensor,
        tma_c: cute.CopyAtom, mC: cute.Tensor, tiled_mma: cute.TiledMma,
        a_smem_staged: cute.ComposedLayout, b_smem_staged: cute.ComposedLayout,
        out_addr: Int64, sx_addr: Int64, sw_addr: Int64, scale_bits: Int32, bias_addr: Int64,
        M: Int32, N: Int32, K: Int32,
        ws: Int64, peer_tab: Int64, mc_base: Int64, err_addr: Int64,
        rank: Int32, local_M: Int32, padded_M: Int32, chunk: Int32, rounds: Int32, lag: Int32,
        timeout_ns: Int64, arrive_off: Int64, result_off: Int64, recv_off: Int64, region_bytes: Int64,
        part_off: Int64, out_off: Int64,
    ):
        """The kernel whose loads of x and w use the driver's descriptors
        (``Variant.tma_promo``), kernel parameters as the atoms' are."""
        self._body((desc_a, desc_x, desc_b), tma_a, mA, tma_x, mX, tma_b, mB, tma_c, mC,
                   tiled_mma, a_smem_staged, b_smem_staged, out_addr, sx_addr, sw_addr,
                   scale_bits, bias_addr, M, N, K, ws, peer_tab, mc_base, err_addr, rank,
                   local_M, padded_M, chunk, rounds, lag, timeout_ns, arrive_off, result_off,
                   recv_off, region_bytes, part_off, out_off)

    @cute.jit
    def _body(
        self,
        descs: tuple,
        tma_a: cute.CopyAtom, mA: cute.Tensor, tma_x: cute.CopyAtom, mX: cute.Tensor,
        tma_b: cute.CopyAtom, mB: cute.Tensor,
        tma_c: cute.CopyAtom, mC: cute.Tensor, tiled_mma: cute.TiledMma,
        a_smem_staged: cute.ComposedLayout, b_smem_staged: cute.ComposedLayout,
        out_addr: Int64, sx_addr: Int64, sw_addr: Int64, scale_bits: Int32, bias_addr: Int64,
        M: Int32, N: Int32, K: Int32,
        ws: Int64, peer_tab: Int64, mc_base: Int64, err_addr: Int64,
        rank: Int32, local_M: Int32, padded_M: Int32, chunk: Int32, rounds: Int32, lag: Int32,
        timeout_ns: Int64, arrive_off: Int64, result_off: Int64, recv_off: Int64, region_bytes: Int64,
        part_off: Int64, out_off: Int64,
    ):
        self._bias_at(bias_addr, M)
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        cta, _, _ = cute.arch.block_idx()
        num_ctas, _, _ = cute.arch.grid_dim()
        desc_a = desc_x = desc_b = None  # the atoms' own descriptors
        if cutlass.const_expr(self.tma_promo):
            desc_a, desc_x, desc_b = (tma_descs.desc_ptr(d) for d in descs)
        if warp_idx == 0:
            if cutlass.const_expr(self.tma_promo):
                ptx.prefetch_tensormap(desc_a.toint())
                ptx.prefetch_tensormap(desc_b.toint())
                if cutlass.const_expr(self.x_rows != self.bm):
                    ptx.prefetch_tensormap(desc_x.toint())
            else:
                cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
                cute.nvgpu.cpasync.prefetch_descriptor(tma_b)
                if cutlass.const_expr(self.x_rows != self.bm):
                    cute.nvgpu.cpasync.prefetch_descriptor(tma_x)
            if cutlass.const_expr(self.tma_store):
                cute.nvgpu.cpasync.prefetch_descriptor(tma_c)
        # cta_group 2: the cluster is one lane of the pair schedule; CTA v of it takes tile
        # row 2 * pm + v of the pair-tile and loads rows [v * BN/2, (v+1) * BN/2) of w's tile
        # for both CTAs (pairs along N: tile 2u + v, and half of x's tile)
        lane = cta // Int32(self.cta_group)
        v_in_pair = cta - lane * Int32(self.cta_group)
        cta_layout = cute.make_layout((self.cta_group, 1, 1))
        pair_mask = 0
        if cutlass.const_expr(self.cta_group >= 2):
            pair_mask = cute.make_layout_image_mask(cta_layout, (v_in_pair, 0, 0), mode=0)
        a_mask = pair_mask if self.mc_a > 1 else 0
        b_mask = pair_mask if self.mc_b > 1 else 0

        tiles_m = (M + Int32(self.bm - 1)) // Int32(self.bm)
        tiles_n = (N + Int32(self.bn - 1)) // Int32(self.bn)
        num_tiles = tiles_m * tiles_n
        shape = protocol.shape_word(M, K)  # the start stamp's: every rank launches the same

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        a_stage = cute.slice_(a_smem_staged, (None, None, 0))
        b_stage = cute.slice_(b_smem_staged, (None, None, 0))
        a_tail_bytes = cute.size_in_bytes(self.ab_elem, a_stage) * self.x_rows // self.bm
        a_rest_bytes = cute.size_in_bytes(self.ab_elem, a_stage) - a_tail_bytes
        ab_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.ab_mbar.data_ptr(),
            num_stages=self.ab_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, self.stage_threads // 32 * self.cta_group),
            # a stage of the tail row's tiles; the other rows' add the rest of x's tile
            tx_count=(a_tail_bytes + cute.size_in_bytes(self.ab_elem, b_stage)),
            cta_layout_vmnk=cute.make_layout((1, self.cta_group, 1, 1)),
            defer_sync=True,
        )
        epi_pipe = pipeline.PipelineAsync.create(
            barrier_storage=storage.epi_mbar.data_ptr(),
            num_stages=self.epi_slots,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.stage_threads),
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, 32 if self.tma_store else _COMM_THREADS),
            defer_sync=True,
        )
        pipeline_init_arrive(cluster_shape_mn=(self.cta_group, 1), is_relaxed=True)

        sA = storage.sA.get_tensor(a_smem_staged.outer, swizzle=a_smem_staged.inner)
        sB = storage.sB.get_tensor(b_smem_staged.outer, swizzle=b_smem_staged.inner)
        sC_ptr = storage.sC.data_ptr()
        sS_ptr = sC_ptr  # unused unless scaled per row / tensor
        if cutlass.const_expr(self.row_scales):
            sS_ptr = storage.sS.data_ptr()
        sC = cute.make_tensor(sC_ptr, self._slot_layout(self.epi_slots))

        gA = cute.local_tile(mA, (self.bm, self.bk), (None, None))
        tAsA, tAgA = cute.nvgpu.cpasync.tma_partition(
            tma_a, v_in_pair if self.mc_a > 1 else 0, cute.make_layout(self.mc_a),
            cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
        # the last tile row, of M - (tiles_m - 1) * bm <= x_rows rows (``launch.resolve.
        # x_rows_for``), loads a box of x_rows: the TMA fills a box's rows beyond x with zeros
        # slowly, and the rows of the stage it leaves stale only feed output rows past M. Both
        # atoms were made on x's one (M, K) tensor, so mX's coordinates are mA's: gX views the
        # first x_rows rows of gA's tiles
        tXsX, tXgX = tAsA, tAgA
        if cutlass.const_expr(self.x_rows != self.bm):
            gX, sX = x_box_views(gA, sA, self.x_rows, self.bm, self.bk, self.ab_stage)
            tXsX, tXgX = cute.nvgpu.cpasync.tma_partition(
                tma_x, 0, cute.make_layout(1),
                cute.group_modes(sX, 0, 2), cute.group_modes(gX, 0, 2))
        gB = cute.local_tile(mB, (self.bn, self.bk), (None, None))
        tBsB, tBgB = cute.nvgpu.cpasync.tma_partition(
            tma_b, 0 if self.pair_n else v_in_pair, cute.make_layout(self.mc_b),
            cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
        k_tiles = cute.size(gA, mode=[3])

        wg_idx = cute.arch.make_warp_uniform(tidx // 128)
        pipeline_init_wait(cluster_shape_mn=(self.cta_group, 1))
        if cutlass.const_expr(self.pdl):
            # Everything above touched shared memory and parameters only. The previous
            # kernel wrote x, w, the epoch and the stamps, and may still read memory that y
            # reuses: nothing global before it has finished. The next PDL launch may start
            # once every CTA of this grid runs (so it can never take an SM this grid needs);
            # its own wait keeps it off global memory until this launch has finished.
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()

        if wg_idx == 0:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.ab_stage)
                policy = None  # the DSL's own cache-hint operand
                if cutlass.const_expr(self.l2_hint):
                    policy = ptx.l2_policy(L2_HINTS[self.l2_hint])
                loads = LoadCtx(ab_pipe, tma_a, tAgA, tAsA, tma_x, tXgX, tXsX, tma_b, tBgB,
                                tBsB, a_mask, b_mask, a_rest_bytes, v_in_pair, tiles_m, tiles_n,
                                policy, desc_a, desc_x, desc_b)
                for rnd in range(rounds):
                    u = self._scheduled_unit(rank, lane, rnd, chunk, lag, num_tiles,
                                             tiles_m, tiles_n, local_M, k_tiles)
                    _, k_lo, k_hi = self._segment(lane, rnd, chunk, num_tiles, k_tiles)
                    if u >= Int32(0):
                        prod = self._load_unit(loads, u, k_lo, k_hi, prod)
                ab_pipe.producer_tail(prod)
            else:
                comm_args = (tidx - 32, cta, num_ctas, num_tiles, tiles_m, tiles_n, epi_pipe,
                             sC_ptr, out_addr, M, N, shape, ws, peer_tab, mc_base, err_addr, rank,
                             local_M, padded_M, chunk, rounds, lag, timeout_ns, arrive_off,
                             result_off, recv_off, region_bytes, part_off, out_off, k_tiles)
                push_args = (cta, num_ctas, num_tiles, tiles_m, tiles_n, shape, ws, peer_tab,
                             err_addr, rank, local_M, padded_M, chunk, rounds, lag, timeout_ns,
                             arrive_off, recv_off, region_bytes, out_off)
                if cutlass.const_expr(self.push_ctas):
                    if cta >= chunk:
                        self._push_role(tidx - 32, *push_args)
                    else:
                        self._comm_role(*comm_args)
                elif cutlass.const_expr(self.tma_store):
                    if warp_idx == 1:
                        # the ring as the TMA sees it: the same swizzle, on byte addresses
                        sC_tma = cute.make_tensor(
                            cute.recast_ptr(sC_ptr, self._sw_bytes(), dtype=self.elem),
                            self._slot_outer(self.epi_slots))
                        self._store_role(cta, num_tiles, tiles_m, tiles_n, k_tiles, rank,
                                         local_M, chunk, rounds, lag, epi_pipe, sC_tma, tma_c,
                                         mC)
                else:
                    self._comm_role(*comm_args)
        else:
            cute.arch.setmaxregister_increase(self.mma_regs)
            mma_args = (tidx - 128, lane, v_in_pair, num_tiles, tiles_m, tiles_n, k_tiles,
                        rank, local_M, chunk, rounds, lag, tiled_mma, sA, sB, sC, ab_pipe,
                        epi_pipe, ws, cta, timeout_ns, err_addr, M, N, sx_addr, sw_addr,
                        scale_bits, sS_ptr)
            if cutlass.const_expr(self.push_ctas):
                if cta >= chunk:  # a push CTA's MMA threads copy with its communication ones
                    self._push_role(tidx - 128 + Int32(_COMM_THREADS), cta, num_ctas,
                                    num_tiles, tiles_m, tiles_n, shape, ws, peer_tab, err_addr,
                                    rank, local_M, padded_M, chunk, rounds, lag, timeout_ns,
                                    arrive_off, recv_off, region_bytes, out_off)
                else:
                    self._mma_role(*mma_args)
            elif cutlass.const_expr(self.pingpong):
                self._pingpong_role(tidx - 128, lane, v_in_pair, num_tiles, tiles_m, tiles_n,
                                    k_tiles, rank, local_M, chunk, rounds, lag, tiled_mma, sA,
                                    sB, sC, ab_pipe, epi_pipe)
            else:
                self._mma_role(*mma_args)

        if cutlass.const_expr(self.comm):
            cute.arch.barrier()
            self._mark(ws, cta, trace.EXIT_BARRIER, tidx == 0)
            if tidx == 0:
                epoch = ptx.ld_relaxed_gpu(ws + Int64(layout.CTRL_EPOCH))
                protocol.finish_launch(ws, peer_tab, epoch, num_ctas, self.world, rank,
                                       self.lean_exit)
            self._mark(ws, cta, trace.EXIT, tidx == 0)

    @cute.jit
    def _load_unit(self, loads, u, k_lo, k_hi, prod):
        """The producer warp: k-tiles [k_lo, k_hi) of unit ``u``'s x and w tiles into the
        mainloop stages. Returns the pipeline state."""
        (ab_pipe, tma_a, tAgA, tAsA, tma_x, tXgX, tXsX, tma_b, tBgB, tBsB, a_mask, b_mask,
         a_rest_bytes, v_in_pair, tiles_m, tiles_n, policy, desc_a, desc_x, desc_b) = loads
        tm, tn, _ = self._unit_tile(u, v_in_pair, tiles_m, tiles_n)
        tAgA_t = tAgA[(None, tm, None)]
        tail = tm == tiles_m - Int32(1)
        tXgX_t = tXgX[(None, tm, None)]
        tBgB_t = tBgB[(None, tn, None)]
        prod.reset_count()
        n_k = k_hi - k_lo
        for _k in range(n_k):
            ab_pipe.producer_acquire(prod)
            kt = k_lo + prod.count
            if cutlass.const_expr(self.x_rows == self.bm):
                cute.copy(tma_a, tAgA_t[(None, kt)], tAsA[(None, prod.index)],
                          tma_bar_ptr=ab_pipe.producer_get_barrier(prod), mcast_mask=a_mask,
                          cache_policy=policy, tma_desc_ptr=desc_a)
            else:
                if tail:
                    cute.copy(tma_x, tXgX_t[(None, kt)], tXsX[(None, prod.index)],
                              tma_bar_ptr=ab_pipe.producer_get_barrier(prod),
                              cache_policy=policy, tma_desc_ptr=desc_x)
                else:
                    with cute.arch.elect_one():
                        cute.arch.mbarrier_expect_tx(
                            ab_pipe.producer_get_barrier(prod), a_rest_bytes)
                    cute.copy(tma_a, tAgA_t[(None, kt)], tAsA[(None, prod.index)],
                              tma_bar_ptr=ab_pipe.producer_get_barrier(prod),
                              mcast_mask=a_mask, cache_policy=policy, tma_desc_ptr=desc_a)
            cute.copy(tma_b, tBgB_t[(None, kt)], tBsB[(None, prod.index)],
                      tma_bar_ptr=ab_pipe.producer_get_barrier(prod), mcast_mask=b_mask,
                      cache_policy=policy, tma_desc_ptr=desc_b)
            ab_pipe.producer_commit(prod)
            prod.advance()
        return prod

    # ------------------------------------------------------------------ MMA warp groups
    @cute.jit
    def _unit_tile(self, u, v_in_pair, tiles_m, tiles_n):
        """(tile row, tile column, real) CTA ``v_in_pair`` of a lane computes for unit u. The
        odd tile row past the last one (a padding tile: not real, never handed to the
        communication warps) reloads the last row: any data will do, and it stays inside x."""
        tm = u // tiles_n
        tn = u - tm * tiles_n
        real = True
        if cutlass.const_expr(self.pair_n):
            t = Int32(2) * u + v_in_pair
            tm = t // tiles_n
            tn = t - tm * tiles_n
        elif cutlass.const_expr(self.cta_group >= 2):
            tm = Int32(self.cta_group) * tm + v_in_pair
            real = tm < tiles_m
            tm = cutlass.min(tm, tiles_m - Int32(1))
        return tm, tn, real

    @cute.jit
    def _store_role(self, cta, num_tiles, tiles_m, tiles_n, k_tiles, rank, local_M, chunk,
                    rounds, lag, epi_pipe, sC, tma_c: cute.CopyAtom, mC: cute.Tensor):
        """``tma_store``, one communication warp: each finished sub-tile to the output as one
        TMA tensor store (rows past M clipped by the TMA unit). Slots go back to the MMA
        warps once the stores have read them: the oldest whenever the warp holds the whole
        ring, all at each tile's end (the wait then runs under the next tile's mainloop), so
        no slot is held while the warp waits for a sub-tile the MMA warps have not written."""
        gC = cute.local_tile(mC, (self.bm, self.epi_n), (None, None))
        sC_st, gC_st = cute.nvgpu.cpasync.tma_partition(
            tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), cute.group_modes(gC, 0, 2))
        epi_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.epi_slots)
        rel_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.epi_slots)
        st = StoreCtx(tma_c, sC_st, gC_st, epi_pipe, tiles_n)
        for rnd in range(rounds):
            t = self._scheduled(rank, cta, rnd, chunk, lag, num_tiles, tiles_m, tiles_n,
                                local_M, k_tiles)
            if t >= Int32(0):
                epi_state, rel_state = self._store_tile(st, t, epi_state, rel_state)

    @cute.jit
    def _store_tile(self, st, t, epi_state, rel_state):
        """The store warp: tile ``t``'s sub-tiles from the ring to the output. Returns the
        ring states (taken, released)."""
        tma_c, sC_st, gC_st, epi_pipe, tiles_n = st
        tm = t // tiles_n
        tn = t - tm * tiles_n
        held = 0  # slots taken since the last release (known at compile time)
        for e in cutlass.range_constexpr(self.num_sub):
            epi_pipe.consumer_wait(epi_state)
            cute.copy(tma_c, sC_st[(None, epi_state.index)],
                      gC_st[(None, tm, tn * Int32(self.num_sub) + Int32(e))])
            cute.arch.cp_async_bulk_commit_group()
            epi_state.advance()
            held += 1
            if cutlass.const_expr(e == self.num_sub - 1):
                cute.arch.cp_async_bulk_wait_group(0, read=True)
                for _s in cutlass.range_constexpr(held):
                    epi_pipe.consumer_release(rel_state)
                    rel_state.advance()
                held = 0
            elif cutlass.const_expr(held == self.epi_slots):
                # a ring shorter than the tile (more mainloop stages): the oldest slot goes
                # back as soon as its store has read it, so the MMA warps wait for one
                # store, not for the whole ring's
                cute.arch.cp_async_bulk_wait_group(self.epi_slots - 1, read=True)
                epi_pipe.consumer_release(rel_state)
                rel_state.advance()
                held -= 1
        return epi_state, rel_state

    @cute.jit
    def _mma_role(self, mtid, lane, v_in_pair, num_tiles, tiles_m, tiles_n, k_tiles, rank,
                  local_M, chunk, rounds, lag, tiled_mma: cute.TiledMma, sA, sB, sC, ab_pipe,
                  epi_pipe, ws, cta, timeout_ns, err_addr, M, N, sx_addr, sw_addr, scale_bits,
                  sS_ptr):
        thr_mma = tiled_mma.get_slice(mtid)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        tCcC = thr_mma.partition_C(cute.make_identity_tensor((self.bm, self.bn)))  # (row, col)s
        acc = cute.make_rmem_tensor(tCcC.shape, Float32)
        num_k_blocks = cute.size(tCrA, mode=[2])

        tiled_r2s, tRS_rD, tRS_rD_out = self._ring_copy(tiled_mma, sC)
        tRS_sC = tiled_r2s.get_slice(mtid).partition_D(sC)
        tRS_rAcc = tiled_r2s.retile(acc)
        size_rD = cute.size(tRS_rD)

        read_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stage)
        rel_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stage)
        epi_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.epi_slots)
        tiles_done = Int32(0)  # trace: tiles this CTA has finished
        # block-wise fp8 scales: one k-group's products (two k-groups' with ``block_pairs``),
        # and two MMAs fixed once (the first wgmma of a k-group overwrites its products, the
        # rest add to them), so no loop body changes an MMA's state
        acc_k = acc
        acc_k2 = acc
        mma_z = tiled_mma
        mma_a = tiled_mma
        brow0 = Int32(0)
        brow1 = Int32(0)
        xs_row = Int64(0)
        xs_k = Int64(0)
        ws_blk = Int64(0)
        ws_k = Int64(0)
        if cutlass.const_expr(self.block_scales):
            acc_k = cute.make_rmem_tensor(tCcC.shape, Float32)
            if cutlass.const_expr(self.block_pairs):
                acc_k2 = cute.make_rmem_tensor(tCcC.shape, Float32)
            mma_z = self._make_mma()
            mma_z.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
            mma_a = self._make_mma()
            mma_a.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
            brow0, _ = tCcC[0]  # this thread's two rows of the tile
            brow1, _ = tCcC[2]
            xs_row, xs_k, ws_blk, ws_k = self._block_strides(scale_bits, N, k_tiles)
        c = MmaCtx(mtid, lane, v_in_pair, num_tiles, tiles_m, tiles_n, k_tiles, rank, chunk,
                   tiled_mma, ab_pipe, epi_pipe, ws, cta, timeout_ns, err_addr, M, N, sx_addr,
                   sw_addr, scale_bits, sS_ptr, tCrA, tCrB, tCcC, acc, num_k_blocks, tiled_r2s,
                   tRS_rD, tRS_rD_out, tRS_sC, tRS_rAcc, size_rD,
                   (acc_k, acc_k2, mma_z, mma_a, brow0, brow1, xs_row, xs_k, ws_blk, ws_k))
        for rnd in range(rounds):
            u = self._scheduled_unit(rank, lane, rnd, chunk, lag, num_tiles, tiles_m,
                                     tiles_n, local_M, k_tiles)
            _, k_lo, k_hi = self._segment(lane, rnd, chunk, num_tiles, k_tiles)
            if u >= Int32(0):
                read_state, rel_state, epi_state, tiles_done = self._mma_unit(
                    c, u, k_lo, k_hi, read_state, rel_state, epi_state, tiles_done)

    @cute.jit
    def _mma_unit(self, c, u, k_lo, k_hi, read_state, rel_state, epi_state, tiles_done):
        """The MMA warp groups on unit ``u``: k-tiles [k_lo, k_hi) into the accumulators,
        then (a finished, real tile) its sub-tiles into the ring. Returns the states and
        the trace's tile count."""
        (mtid, lane, v_in_pair, num_tiles, tiles_m, tiles_n, k_tiles, rank, chunk, tiled_mma,
         ab_pipe, epi_pipe, ws, cta, timeout_ns, err_addr, M, N, sx_addr, sw_addr, scale_bits,
         sS_ptr, tCrA, tCrB, tCcC, acc, num_k_blocks, tiled_r2s, tRS_rD, tRS_rD_out, tRS_sC,
         tRS_rAcc, size_rD, scales) = c
        acc_k, acc_k2, mma_z, mma_a, brow0, brow1, xs_row, xs_k, ws_blk, ws_k = scales

        first = (mtid == 0) & (tiles_done == Int32(0))
        tm, tn, real = self._unit_tile(u, v_in_pair, tiles_m, tiles_n)
        if cutlass.const_expr(self.row_scales):
            self._stage_scales(mtid, tm, tn, M, N, sx_addr, sw_addr, scale_bits,
                               sS_ptr)
        read_state.reset_count()
        rel_state.reset_count()
        if cutlass.const_expr(self.block_scales):
            # Each k-group's products are accumulated apart and added to the fp32 sums
            # times x's row scales and w's block scale. A scale register is reloaded
            # (two k-groups ahead) only after its last read: a move of a fresh load
            # would wait for it with the tensor pipes idle (docs/PERF.md (ae)).
            row0 = cutlass.min(tm * Int32(self.bm) + brow0, M - Int32(1))
            row1 = cutlass.min(tm * Int32(self.bm) + brow1, M - Int32(1))
            xa0 = sx_addr + Int64(row0) * xs_row
            xa1 = sx_addr + Int64(row1) * xs_row
            wa = sw_addr + Int64(tn * Int32(self.bn) // Int32(128)) * ws_blk
            sc = (xa0, xa1, wa, xs_k, ws_k)
            last = k_hi - Int32(1)
            n_k = k_hi - k_lo
            a0, a1, aw = self._group_scales(sc, k_lo)
            b0, b1, bw = self._group_scales(sc, cutlass.min(k_lo + Int32(1), last))
            acc.fill(0.0)
            if cutlass.const_expr(self.trace):
                # the event is the first stage's arrival (waited for again at issue)
                ab_pipe.consumer_wait(read_state)
            self._mark(ws, cta, trace.MMA_FIRST_K, first)
            mm = (ab_pipe, mma_z, mma_a, tCrA, tCrB, num_k_blocks)
            if cutlass.const_expr(not self.block_pairs):
                # one product set, two k-groups a trip, written out: each reads and
                # reloads its own scale registers (state advances stay in the loop body,
                # where the DSL carries them)
                for kp in range(n_k // Int32(2)):
                    g = k_lo + Int32(2) * kp
                    self._issue_group(mm, read_state, acc_k)
                    read_state.advance()
                    self._retire_group(ab_pipe, rel_state, 0)
                    rel_state.advance()
                    self._promote(acc, acc_k, a0 * aw, a1 * aw)
                    a0, a1, aw = self._group_scales(sc, cutlass.min(g + Int32(2), last))
                    self._issue_group(mm, read_state, acc_k)
                    read_state.advance()
                    self._retire_group(ab_pipe, rel_state, 0)
                    rel_state.advance()
                    self._promote(acc, acc_k, b0 * bw, b1 * bw)
                    b0, b1, bw = self._group_scales(sc, cutlass.min(g + Int32(3), last))
            else:
                # two product sets: two k-groups issued at once, the first's adds run
                # under the second's wgmma (none is left in flight across the loop
                # edge: there ptxas would serialize every wgmma, C7514)
                for kp in range(n_k // Int32(2)):
                    g = k_lo + Int32(2) * kp
                    self._issue_group(mm, read_state, acc_k)
                    read_state.advance()
                    self._issue_group(mm, read_state, acc_k2)
                    read_state.advance()
                    self._retire_group(ab_pipe, rel_state, 1)
                    rel_state.advance()
                    self._promote(acc, acc_k, a0 * aw, a1 * aw)
                    a0, a1, aw = self._group_scales(sc, cutlass.min(g + Int32(2), last))
                    self._retire_group(ab_pipe, rel_state, 0)
                    rel_state.advance()
                    self._promote(acc, acc_k2, b0 * bw, b1 * bw)
                    b0, b1, bw = self._group_scales(sc, cutlass.min(g + Int32(3), last))
            for _t in range(n_k % Int32(2)):  # an odd count's last k-group
                self._issue_group(mm, read_state, acc_k)
                read_state.advance()
                self._retire_group(ab_pipe, rel_state, 0)
                rel_state.advance()
                self._promote(acc, acc_k, a0 * aw, a1 * aw)
        elif self._idle_half(tm, tiles_m, mtid, real):
            # every row of this warp group's half lies past x (or the tile is a
            # pair's padding): its products would only be dropped, so it frees the
            # tensor pipes (the stages still need its release)
            for _k in range(k_hi - k_lo):
                ab_pipe.consumer_wait(read_state)
                ab_pipe.consumer_release(rel_state)
                rel_state.advance()
                read_state.advance()
        else:
            # the first k-block overwrites the accumulators: no zero-fill pass
            tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
            cute.nvgpu.warpgroup.fence()
            ab_pipe.consumer_wait(read_state)
            self._mark(ws, cta, trace.MMA_FIRST_K, first)
            for kb in cutlass.range_constexpr(num_k_blocks):
                cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, read_state.index)],
                          tCrB[(None, None, kb, read_state.index)], acc)
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
            cute.nvgpu.warpgroup.commit_group()
            read_state.advance()
            for _k in range(1, k_hi - k_lo):
                ab_pipe.consumer_wait(read_state)
                for kb in cutlass.range_constexpr(num_k_blocks):
                    cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, read_state.index)],
                              tCrB[(None, None, kb, read_state.index)], acc)
                cute.nvgpu.warpgroup.commit_group()
                cute.nvgpu.warpgroup.wait_group(1)
                ab_pipe.consumer_release(rel_state)
                rel_state.advance()
                read_state.advance()
            cute.nvgpu.warpgroup.wait_group(0)
            ab_pipe.consumer_release(rel_state)
            rel_state.advance()
        self._mark(ws, cta, trace.MMA_ACC_DONE, first)

        finish = True
        if cutlass.const_expr(self.sk):
            # a later piece is stored for its unit's first lane and has no epilogue
            finish = k_lo == Int32(0)
            if k_lo > Int32(0):
                self._sk_store(mtid, acc, lane, ws)
            elif k_hi < k_tiles:
                pieces = self._sk_pieces(chunk, num_tiles, k_tiles)
                self._sk_add(mtid, acc, lane, pieces, u, rank, ws, timeout_ns,
                             err_addr)
        if cutlass.const_expr(self.row_scales):
            # every thread's copies landed, then the tile's scales are visible to all
            cute.arch.cp_async_wait_group(0)
            self.mma_bar.arrive_and_wait()
        if real & finish:
            if cutlass.const_expr(self.row_scales):
                self._apply_scales(acc, tCcC, sS_ptr)
                # every thread has read them before the next unit stages its own
                self.mma_bar.arrive_and_wait()
            for e in cutlass.range_constexpr(self.num_sub):
                for v in cutlass.range_constexpr(size_rD):
                    tRS_rD[v] = tRS_rAcc[e * size_rD + v]
                tRS_rD_out.store(tRS_rD.load().to(self.elem))
                epi_pipe.producer_acquire(epi_state)
                cute.copy(tiled_r2s, tRS_rD_out, tRS_sC[(None, None, None, epi_state.index)])
                if cutlass.const_expr(self.tma_push):
                    # the slot is read by bulk copies (async proxy)
                    cute.arch.fence_proxy("async.shared", space="cta")
                epi_pipe.producer_commit(epi_state)
                epi_state.advance()
            self._mark(ws, cta, trace.MMA_LAST_DONE, mtid == 0)
        if cutlass.const_expr(self.trace):
            tiles_done = tiles_done + Int32(1)
        return read_state, rel_state, epi_state, tiles_done


    @cute.jit
    def _idle_half(self, tm, tiles_m, mtid, real):
        """Whether MMA warp group ``mtid // 128`` has nothing to compute on a variant whose
        x box (``x_rows``) is at most half the tile (the plain GEMM's 128-row tiles): on
        the last tile row the second group's rows all lie past x, and a pair's padding tile
        (not ``real``, which reloads that row) is dropped whole. Always False where no
        variant can have it."""
        idle = False
        if cutlass.const_expr(2 * self.x_rows <= self.bm and self.bm == 2 * TILE_MS[0]):
            wg = cute.arch.make_warp_uniform(mtid // Int32(128))
            idle = (tm == tiles_m - Int32(1)) & (wg == Int32(1))
            if cutlass.const_expr(self.cta_group >= 2):
                idle = idle | (real == False)  # noqa: E712 (a padding tile's tm is the last row)
        return idle

    def _ring_copy(self, tiled_mma, sC) -> tuple:
        """The accumulators' way into the sub-tile ring: the stmatrix tiled copy of
        ``tiled_mma``'s fragments, and one sub-tile's fp32 and output-type staging registers.
        Emitted at trace time."""
        r2s_atom = sm90_utils.sm90_get_smem_store_op(_ROW_LAYOUT, elem_ty_d=self.elem,
                                                     elem_ty_acc=Float32)
        stm_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), self.elem)
        tiled_r2s = cute.make_tiled_copy_S(r2s_atom,
                                           cute.make_tiled_copy_C_atom(stm_atom, tiled_mma))
        rD_shape = cute.shape(tiled_r2s.get_slice(0).partition_S(sC))
        return (tiled_r2s, cute.make_rmem_tensor(rD_shape[:3], Float32),
                cute.make_rmem_tensor(rD_shape[:3], self.elem))
