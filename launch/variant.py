"""``Variant``: every compile-time choice of one kernel, the only thing the kernel classes
take and what the compile cache is keyed by (with a hash of the kernel sources).

Shapes, pointers, rank and epoch are launch arguments, so one compiled variant serves every
call of every op whose calls resolve to it (``launch.resolve``).
"""
from __future__ import annotations

from dataclasses import dataclass

from .geometry import BLACKWELL

# sm90 choices a Variant may set (0: the kernel's default; the class docstring says what each does)
TUNING = ("epi_slots", "peers_first", "pair_n", "stages", "push_all", "pdl", "prefetch",
          "early_copy", "push_window", "flat", "sk", "split_row", "push_ctas", "lean_exit",
          "tma_store", "trace", "block_scales", "pingpong", "x_rows", "l2_hint", "tma_promo")


@dataclass(frozen=True)
class Variant:
    """One kernel: its arch, tile width, world, mode ("rs", "ar" or "gemm"), transport, and
    every choice compiled into it. The sm100 kernel takes only the first ones (through
    ``bias``); the sm90 kernel all of them.

    ``cta_group`` 2: 2x1 clusters whose CTAs compute the two tiles of a pair-tile
    (``launch.plan``) and share w's tile by TMA multicast, each loading half of it, which
    halves w's L2 traffic. ``epi_slots`` (0: default) is a tuning knob for benchmarks: the
    depth of the sub-tile ring (the tile order's band is a launch argument, in the
    schedule word). ``push`` "tma": partials leave for peers as bulk copies straight from the
    sub-tile ring (unpadded, swizzled 64-B rows: see ``CommWarps``), not thread stores;
    "tma_all": AR's reduced tiles too. ``peers_first``: the schedule of plans with
    ``peers_first`` (compiled in; launching such a plan on another variant would mix
    orders). ``pair_n`` (with ``cta_group`` 2): the cluster's two tiles are neighbours in
    one tile row and share x's tile by TMA multicast instead of w's (plans with
    ``pair_n``). ``stages`` (0: default): at least this many mainloop stages, the
    sub-tile ring then holding what smem has left (part of a tile for BN 224 / 256 at 4
    stages). ``push_all``: the push-all AR plan (``TilePlan.push_all``: every tile to
    every peer, every tile reduced here; AR, unicast, 1-CTA, bulk-copy pushes).
    ``pdl``: programmatic dependent launch: the launch may begin while the previous
    kernel of the stream finishes (its CTAs take SMs as that kernel's CTAs exit, set up
    their barriers, then wait in ``griddepcontrol.wait`` before touching global memory),
    and lets the next PDL launch do the same once every CTA of this one is running.
    ``prefetch``: reductions and AR's copy-out load one sub-tile ahead (``CommWarps``;
    world 2 over unicast, elsewhere it changes nothing).
    ``early_copy``: AR owner plans over unicast with the lag round copy each pushed tile's
    result into the output two rounds after the push, while later pushes are in flight,
    instead of copying every result after the last tile (``CommWarps``).
    ``push_window`` (bulk-copy pushes): at most this many of a CTA's sub-tile copy groups
    in flight after each push (0: a tile's copies all at once; ``CommWarps``).
    ``flat`` (with ``peers_first``, 1-CTA): the peers-first order as one flat sequence
    over every list (``launch.plan``, ``TilePlan.flat``).
    ``sk`` (1-CTA flat orders: the plain GEMM, ``flat``): the split-K tail (``launch.plan``,
    ``TilePlan.sk``): the last round's units cut into K pieces on idle lanes, the later pieces
    stored as fp32 in the workspace for the lane that finishes the unit.
    ``split_row`` (RS, 1-CTA round order): a tile row two owners share is split between
    their lists (``launch.plan``, ``TilePlan.split_row``).
    ``push_ctas`` (RS, unicast, bulk-copy pushes, the flat order): CTAs from the plan's
    ``chunk`` up only push; the others stage their peers' tiles locally
    (``launch.plan.push_plan``, ``launch.push_ctas``).
    ``lean_exit``: the exit without system fences or ``done`` stamps
    (``protocol.finish_launch``; an experiment until measured).
    ``tma_store`` (the plain GEMM with bulk-copy rows): each output sub-tile leaves the
    ring as one TMA tensor store issued by one communication warp, not as 16-B loads
    and stores of all 96 threads (``_store_role``).
    ``trace``: record event times (``launch.trace``).
    ``dtype``: the element type of x, w, the pushed partials and the output, "bf16" or
    "f16" (``comm_warps.DTYPES``); the MMA accumulates and reductions sum in fp32 both ways.
    ``in_dtype`` "e4m3" (``comm_warps.IN_DTYPES``): x and w are fp8 (128-element k-blocks,
    fp8 wgmma accumulating in fp32 at the tensor cores' own precision), and the epilogue
    multiplies each accumulator by x's row scale and w's column scale (launch arguments:
    two fp32 vectors, each read at stride 0 or 1 as ``scale_bits`` says) before rounding
    it to ``dtype``; "": x and w are ``dtype``.
    ``block_scales`` (fp8, BN 64 or 128): DeepSeek-style block-wise scales, x's one per
    row and 128-element k-group, w's one per 128 x 128 block: each k-block's products
    are accumulated apart and added to the tile's fp32 sums times their two scales
    (``_mma_role``), so nothing is left for the epilogue to scale.
    ``pingpong``: each MMA warp group computes whole tiles, the two taking the rounds by
    turns, so one's epilogue runs under the other's mainloop (``launch.pingpong``); a
    thread then holds BN accumulators: BN <= 192 on the GEMM alone with the TMA store
    (its first warp group needs few registers), BN <= 160 beside communication warps.
    ``bias`` (RS / AR): the exchange's sums add a bias of N elements (``CommWarps.bias``).
    ``bm`` 64 (the plain GEMM on 1-CTA tiles or 2x1 clusters along M, bf16 / fp16): 64-row tiles on one MMA warp
    group (256 threads), for small M where 128-row tiles leave SMs idle or rows empty.
    ``x_rows`` (the plain GEMM of bf16 / fp16 operands on 1-CTA tiles or 2x1 clusters along
    M; 0: the tile's rows):
    the last tile row's loads of x are boxes of this many rows (8, 16, 32 or 64, fewer than the
    tile's), for calls whose last tile row holds at most that many (M=1; M=129 on 128-row
    tiles), so the TMA does not fill a box of the tile's rows that holds one row. The tile's
    other rows of those stages are not written: their stale rows accumulate into output
    rows past M, which no store writes. Where the box is at most half a 128-row tile, the
    MMA warp group of the other half (and a pair's padding tile) issues no wgmma there.
    ``l2_hint`` (sm90; ``launch.rules.choose_gemm_l2_hint``): the mainloop's TMA loads of x
    and w carry the L2 cache policy ``launch.geometry.L2_HINTS[l2_hint]`` (eviction priority
    normal, first or last, made by ``createpolicy`` or CUTLASS's fixed policy words); at 0
    their ``.L2::cache_hint`` operand is the DSL's own, a policy value of 0.
    ``tma_promo`` (sm90; an experiment, no rule): the mainloop's loads of x and w use
    descriptors the driver encodes with the L2 promotion ``launch.geometry.TMA_PROMOS[n]``
    (``launch.tma_descs``); at 0 the DSL atoms' own.
    """

    arch: str
    bn: int
    world: int
    mode: str
    transport: str
    cta_group: int = 1  # 2: pair-tiles on 2x1 clusters (sm100 2-CTA MMA; sm90 w multicast)
    epi_slots: int = 0  # TUNING knobs
    push: str = "lsu"  # how partials reach peers: "lsu" (thread stores), "tma" (bulk copies),
    # "tma_all" (AR's reduced tiles as bulk copies too)
    peers_first: int = 0  # 1: the peers-first schedule (plans with peers_first)
    pair_n: int = 0  # 1: 2x1 clusters pairing tiles along N (plans with pair_n)
    stages: int = 0  # at least this many mainloop stages (the ring shrinks to fit)
    push_all: int = 0  # 1: the push-all AR plan (plans with push_all)
    pdl: int = 0  # 1: programmatic dependent launch (Sm90FusedKernel)
    prefetch: int = 0  # 1: reductions load one sub-tile ahead (Sm90FusedKernel)
    early_copy: int = 0  # 1: AR copies each pushed tile's result back early (Sm90FusedKernel)
    push_window: int = 0  # n > 0: at most n sub-tile push groups in flight (Sm90FusedKernel)
    flat: int = 0  # 1: the peers-first order as one flat sequence (plans with flat)
    sk: int = 0  # 1: the split-K tail (plans with sk)
    split_row: int = 0  # 1: RS lists split a shared tile row (plans with split_row)
    push_ctas: int = 0  # 1: CTAs past the plan's chunk only push (plans with push_ctas)
    lean_exit: int = 0  # 1: the exit without system fences (protocol.finish_launch)
    tma_store: int = 0  # 1: the plain GEMM stores its output by TMA (Sm90FusedKernel)
    trace: int = 0  # 1: record event times (launch.trace)
    block_scales: int = 0  # 1: fp8 block-wise scales, promoted per k-group (Sm90FusedKernel)
    pingpong: int = 0  # 1: whole tiles per MMA warp group, by turns (Sm90FusedKernel)
    dtype: str = "bf16"  # the output (and x, w): "bf16" or "f16" (launch.comm_warps.DTYPES)
    in_dtype: str = ""  # "e4m3": fp8 x and w, scaled (launch.comm_warps.IN_DTYPES); "": dtype
    bias: int = 0  # 1: the exchange's sums add a bias of N elements (RS / AR, CommWarps.bias)
    bm: int = 128  # rows of a tile: 128, or 64 (the plain GEMM on one MMA warp group)
    x_rows: int = 0  # n > 0: the last tile row loads boxes of n rows of x (Sm90FusedKernel)
    l2_hint: int = 0  # n > 0: the mainloop's loads evict as L2_HINTS[n] (Sm90FusedKernel)
    tma_promo: int = 0  # n > 0: the loads' descriptors promote as TMA_PROMOS[n] (tma_descs)

    def tuning(self) -> dict[str, int]:
        """The knobs set away from the kernel's defaults."""
        return {k: getattr(self, k) for k in TUNING if getattr(self, k)}

    def describe(self) -> str:
        cg = f" cta_group={self.cta_group}" if self.cta_group != 1 else ""
        tune = "".join(f" {k}={n}" for k, n in self.tuning().items())
        tune += f" push={self.push}" if self.push != "lsu" else ""
        tune += f" {self.dtype}" if self.dtype != "bf16" else ""
        tune += f" in={self.in_dtype}" if self.in_dtype else ""
        tune += " bias" if self.bias else ""
        tune += f" BM={self.bm}" if self.bm != 128 else ""
        return f"{self.arch} BN={self.bn} world={self.world} {self.mode} {self.transport}{cg}{tune}"


def push_for(push: str, mode: str) -> str:
    """The push a ``mode`` kernel compiles with: "tma_all" differs from "tma" only in AR."""
    return "tma" if push == "tma_all" and mode != "ar" else push


# A thread holds the tile's BN fp32 accumulators and the epilogue's ~40 more registers: the
# GEMM alone with the TMA store gives its MMA threads 232 (its first warp group only issues
# copies), a fused kernel 200 (its communication threads keep 104) up to 128 wide, 216 at
# 160 (its communication threads 72: the CTA's pool is 384 x 168 registers, so 192-wide
# tiles would leave them 56, and spill 0.3-1.9 KB; docs/PERF.md (ag)).
PINGPONG_WIDEST = {"alone": 192, "fused": 160}


def has_x_box(mode: str, pair_n: bool, in_dtype: str, pingpong: bool, arch: str) -> bool:
    """Whether a kernel of these knobs can load x's last tile row in a box of its rows
    (``Variant.x_rows``): the sm90 plain GEMM of bf16 / fp16 operands on 1-CTA tiles or
    clusters along M (2x1, 4x1), in the cooperative form. Pairs along N share x's tile (both CTAs
    would need the same box), fp8 operands stage scales by the tile's rows, and ping-pong
    warp groups and sm100 kernels load x in a form of their own. The plan
    (``launch.resolve.x_rows_for``), the kernel cache (``scripts/precompile.py``) and the
    kernel's own check read it here."""
    return (mode == "gemm" and not pair_n and not in_dtype and not pingpong
            and arch not in BLACKWELL)


def pingpong_refusal(bn: int, mode: str, tma_store: bool, scaled: bool, sk: bool,
                     trace: bool, push_ctas: bool) -> str | None:
    """Why a kernel of these knobs cannot run ping-pong warp groups, or None if it can."""
    alone = mode == "gemm" and tma_store
    widest = PINGPONG_WIDEST["alone" if alone else "fused"]
    if bn > widest:
        where = "the GEMM alone with the TMA store" if alone else "beside communication warps"
        return (f"ping-pong warp groups hold a whole tile's accumulators per thread: tiles at "
                f"most {widest} wide ({where}), not {bn}")
    if bn == 144 and not alone:
        # ptxas serializes its wgmma (C7520) at the fused kernels' register split
        return "ping-pong warp groups beside communication warps do not run 144-wide tiles"
    if scaled or sk or trace or push_ctas:
        return ("ping-pong warp groups run bf16 / fp16 operands without the split-K tail, "
                "traces or push CTAs")
    return None
