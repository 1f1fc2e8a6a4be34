"""What runs: one pure function from a call, the hardware and a ``Tuning`` to a plan and the
``Variant`` that launches it. No torch, no driver, no device: a test can print the variant of
any call on a CPU machine.

The default path, top to bottom:

    GemmRsAr(...)(x, w)                      rsar_core.gemm_rsar: validate, then
      resolve(shape, hw, world, transport,   this module: the plan (launch.plan applies the
              dtypes, tuning)                measured rules of launch.rules over the tile
        -> (TilePlan, Variant)               geometry of launch.geometry), then each kernel
                                             choice: the Tuning's where it set one, else
                                             its rule
      CACHE.get(variant)                     launch.cache: memory, disk, or compile
        -> kernel_for(variant)               launch.sm90_kernel / launch.sm100_kernel
      launcher.call_with(pointers, stream)   one launch on the current stream
"""
from __future__ import annotations

from dataclasses import dataclass

from multicast.errors import RsarValueError, UnsupportedError

from .geometry import (BLACKWELL, GEMM_ONLY_NS, L2_HINTS, MODES, QUAD, QUAD_CLASHES,
                       TMA_PROMOS, X_ROWS, TilePlan, ceil_div, plan_depth, quad_refusal)
from .plan import make_plan, push_plan
from .rules import (X_BOX_UNEVEN, auto_push_all, choose_gemm_l2_hint, choose_x_box,
                    default_early_copy, default_lean_exit, default_prefetch, default_push,
                    default_push_window, default_stages, default_tma_store)
from .tuning import Tuning
from .variant import Variant, has_x_box, pingpong_refusal, push_for

SM90 = "sm_90a"
# Block-wise fp8 scales: tiles of one 128 x 128 w block per column, where the MMA threads'
# registers hold the tile's sums and one k-group's products side by side
BLOCK_BN = 128
DTYPES = ("bf16", "f16")
IN_DTYPES = ("", "e4m3")


@dataclass(frozen=True)
class Shape:
    """One call: x (M, K) times w (N, K), ``mode`` "rs", "ar" or "gemm" (the plain GEMM),
    with or without a bias added to the reduced sum."""

    M: int
    N: int
    K: int
    mode: str
    bias: bool = False


@dataclass(frozen=True)
class Hardware:
    """The GPU a call runs on: its kernel arch ("sm_90a", "sm_100a", "sm_103a"), SM count
    and how many CTAs can be resident at once as 2x1 clusters and as 4x1 clusters (None:
    every SM; the GPC layout may hold fewer)."""

    arch: str
    sm_count: int
    pair_ctas: int | None = None
    quad_ctas: int | None = None


@dataclass(frozen=True)
class Dtypes:
    """``out``: x, w and the result ("bf16" / "f16"), or only the result where ``operands``
    is "e4m3" (scaled fp8 x and w); ``block_scales``: the fp8 scales are block-wise."""

    out: str = "bf16"
    operands: str = ""
    block_scales: bool = False


def resolve(shape: Shape, hw: Hardware, world: int, transport: str,
            dtypes: Dtypes = Dtypes(), tuning: Tuning = Tuning()) -> tuple[TilePlan, Variant]:
    """The plan and the kernel variant of ``shape``. Raises RsarValueError (or
    UnsupportedError, for what this arch has no kernel for) where ``tuning`` or the call
    asks for something no kernel can run; nothing has been compiled or launched then."""
    _check(shape, hw, dtypes, tuning)
    arch, t, mode = hw.arch, tuning, shape.mode
    sm90 = arch == SM90
    op_push = t.push or default_push(arch, transport, mode)
    push = push_for(op_push, mode) if sm90 else "lsu"
    x_box = choose_x_box(mode, shape.M) if t.x_box is None else t.x_box
    plan = _plan(shape, hw, world, transport, dtypes, t, op_push,
                 bool(x_box and sm90 and not dtypes.operands))
    trace = int(t.trace and sm90)
    tma_store = (default_tma_store(arch, push, plan.mode) if t.tma_store is None
                 else int(t.tma_store and plan.mode == "gemm" and push == "tma" and sm90))
    pingpong = bool(plan.pingpong if t.pingpong is None else t.pingpong)
    if pingpong:
        why = pingpong_refusal(plan.bn, plan.mode, bool(tma_store), bool(dtypes.operands),
                               bool(plan.sk), bool(trace), plan.push_ctas > 0)
        if why:
            raise RsarValueError(f"Tuning.pingpong: {why} (the plan of M={shape.M}; "
                                 f"Tuning.bn picks the width)")
    if t.push_window is None or push == "lsu" or plan.mode == "gemm":
        push_window = default_push_window(arch, transport, push, plan)
    else:
        push_window = int(t.push_window)
    if t.lean_exit is None:
        lean_exit = default_lean_exit(arch, transport, mode)
    else:
        lean_exit = int(t.lean_exit and mode != "gemm" and sm90)
    uneven = t.x_box is True or X_BOX_UNEVEN
    x_rows = x_rows_for(shape.M, plan, dtypes, arch, bool(pingpong),
                        uneven=uneven) if x_box else 0
    if t.epi_slots or not sm90:
        stages = 0
    else:
        # every dtype alike: fp16 moves bf16's bytes at bf16's MMA rate, and an fp8 call's
        # plan is bf16's of half its depth (the same k-blocks, bytes and MMA time each)
        stages = t.stages or default_stages(arch, transport, push, plan, tma_store,
                                            int(pingpong))
    l2_hint = t.l2_hint  # _check refused one set for a kernel other than sm90's
    if l2_hint is None:
        l2_hint = (choose_gemm_l2_hint(plan.mode, shape.M, shape.K, bool(dtypes.operands))
                   if sm90 else "")
    v = Variant(
        arch, plan.bn, world, plan.mode, transport, plan.cta_group,
        epi_slots=t.epi_slots, push=push,
        peers_first=int(plan.peers_first), pair_n=int(plan.pair_n), stages=stages,
        push_all=int(plan.push_all), pdl=int(t.pdl and sm90),
        prefetch=default_prefetch(arch, world, transport, mode) if t.prefetch else 0,
        early_copy=default_early_copy(arch, transport, plan) if t.early_copy else 0,
        push_window=push_window, flat=int(plan.flat), sk=int(plan.sk > 1),
        split_row=int(plan.split_row), push_ctas=int(plan.push_ctas > 0),
        lean_exit=lean_exit, tma_store=tma_store, trace=trace,
        block_scales=int(dtypes.block_scales), pingpong=int(pingpong),
        dtype=dtypes.out, in_dtype=dtypes.operands, bias=int(shape.bias), bm=plan.bm,
        x_rows=x_rows, l2_hint=L2_HINTS.index(l2_hint),
        tma_promo=TMA_PROMOS.index(t.tma_promo or ""))
    return plan, v


def resolve_variant(shape: Shape, hw: Hardware, world: int, transport: str,
                    dtypes: Dtypes = Dtypes(), tuning: Tuning = Tuning()) -> Variant:
    """The kernel variant ``resolve`` picks for ``shape``."""
    return resolve(shape, hw, world, transport, dtypes, tuning)[1]


def _check(shape: Shape, hw: Hardware, dtypes: Dtypes, t: Tuning) -> None:
    """What the Tuning or the dtypes ask for that this call or arch cannot run."""
    if shape.mode not in MODES:
        raise RsarValueError(f"mode must be one of {MODES}, got {shape.mode!r}")
    if dtypes.out not in DTYPES or dtypes.operands not in IN_DTYPES:
        raise RsarValueError(f"dtypes must be out in {DTYPES}, operands in {IN_DTYPES}; got "
                             f"{dtypes}")
    if shape.bias and shape.mode == "gemm":
        raise RsarValueError("the plain GEMM (gemm_only) takes no bias")
    if dtypes.block_scales:
        if not dtypes.operands:
            raise RsarValueError("block-wise scales are for fp8 ops (input_dtype="
                                 "torch.float8_e4m3fn)")
        if hw.arch != SM90:
            raise UnsupportedError(f"block-wise fp8 scales run on sm90 (H100/H200) so far, "
                                   f"not {hw.arch}")
        if t.bn not in (None, 64, 128):
            raise RsarValueError(f"block-wise scales run on tiles 64 or 128 wide (a 128 x 128 "
                                 f"block of w per tile column), not Tuning.bn={t.bn}")
    if hw.arch != SM90:
        # kernel choices the sm100 kernel has no form of (plan choices go to its planner)
        sm90_only = sorted(k for k in ("epi_slots", "pingpong", "push", "stages", "x_box",
                                       "l2_hint", "tma_promo") if k in t.changed())
        if sm90_only:
            raise RsarValueError(f"{', '.join(f'Tuning.{k}' for k in sm90_only)}: sm90 "
                                 f"kernel choices; the {hw.arch} kernel has none")
    if t.bm not in (None, 128) and (shape.mode != "gemm" or dtypes.operands or t.pingpong):
        raise RsarValueError(f"Tuning.bm={t.bm}: 64-row tiles run the plain GEMM (gemm_only) "
                             f"of bf16 / fp16 operands without ping-pong; this call is "
                             f"{shape.mode}{' with fp8 operands' if dtypes.operands else ''}")
    if t.bn in GEMM_ONLY_NS and (shape.mode != "gemm" or hw.arch != SM90):
        raise RsarValueError(f"Tuning.bn={t.bn}: the plain sm90 GEMM (gemm_only) only; this "
                             f"call is {shape.mode} on {hw.arch}")
    if t.push_ctas and shape.mode == "ar":
        raise RsarValueError("Tuning.push_ctas: push CTAs are an RS plan; this op all-reduces")
    if t.cta_group == QUAD:
        why = quad_refusal(shape.mode, hw.arch, t.bn, dtypes.operands,
                           [f"Tuning.{k}" for k in QUAD_CLASHES if getattr(t, k)])
        if why:
            raise RsarValueError(f"Tuning.cta_group=4: {why}")


def x_boxes(bm: int, uneven: bool) -> tuple[int, ...]:
    """The boxes of ``X_ROWS`` a tile of ``bm`` rows may load x's last tile row in: fewer rows
    than the tile's, and (unless ``uneven``) dividing it."""
    return tuple(r for r in X_ROWS if r < bm and (uneven or bm % r == 0))


def x_rows_for(M: int, plan: TilePlan, dtypes: Dtypes, arch: str = "sm_90a",
               pingpong: bool = False, *, uneven: bool) -> int:
    """Rows of x's box on the last tile row of a call of ``M`` rows on ``plan``
    (``Variant.x_rows``): the fewest of ``X_ROWS`` that hold that row's
    ``M - (tiles_m - 1) * bm`` rows where that is fewer than the tile's, on a kernel that has
    the box (``has_x_box``: not ping-pong warp groups, not sm100); else 0, the tile's rows.
    ``uneven``: boxes that divide no tile (48 / 80 / 96 / 112 rows) may be taken (the
    caller's ``Tuning.x_box`` or ``launch.rules.X_BOX_UNEVEN``: no default here to differ)."""
    if M < 1 or not has_x_box(plan.mode, plan.pair_n, dtypes.operands, pingpong, arch):
        return 0
    tail = M - (ceil_div(M, plan.bm) - 1) * plan.bm
    return next((r for r in x_boxes(plan.bm, uneven) if tail <= r), 0)


def _fill_rules(shape: Shape, dtypes: Dtypes) -> bool:
    """Whether the plain GEMM's rules of docs/PERF.md (ai) (``FINE_GAIN``,
    ``choose_gemm_pingpong``, ``choose_gemm_rows64``) may decide: bf16 operands, where they
    were measured and their kernels checked on a GPU; fp16 and fp8 calls keep the plans
    before them until a GPU run checks theirs."""
    return shape.mode == "gemm" and dtypes.out == "bf16" and not dtypes.operands


def _pingpong_free(shape: Shape, dtypes: Dtypes, t: Tuning, op_push: str) -> bool:
    """Whether ``choose_gemm_pingpong`` may decide: ``_fill_rules``, bulk-copy rows (the TMA
    store), and a Tuning that leaves ping-pong, the TMA store and the kernel's form to the
    rules."""
    return (_fill_rules(shape, dtypes) and t.pingpong is None and t.tma_store is not False
            and t.bm is None and push_for(op_push, "gemm") == "tma" and not t.trace
            and not t.epi_slots and t.stages is None)


def _rows64_free(shape: Shape, dtypes: Dtypes, t: Tuning) -> bool:
    """Whether ``choose_gemm_rows64`` may decide: ``_fill_rules``, without ping-pong or a
    trace."""
    return _fill_rules(shape, dtypes) and not t.pingpong and not t.trace


def _plan(shape: Shape, hw: Hardware, world: int, transport: str, dtypes: Dtypes, t: Tuning,
          op_push: str, x_box: bool) -> TilePlan:
    M, N, mode, arch = shape.M, shape.N, shape.mode, hw.arch
    K = plan_depth(shape.K, dtypes.operands)
    bn = t.bn or (BLOCK_BN if dtypes.block_scales else None)
    # Plans that can pick 2x1 clusters need the occupancy of 2x1 clusters (4x1: make_plan
    # takes quad_ctas for them)
    pair_ctas = hw.pair_ctas if arch in BLACKWELL or t.cta_group != 1 else None
    try:
        if t.push_ctas and mode == "rs":
            if arch != SM90 or transport != "unicast" or op_push == "lsu":
                raise RsarValueError("Tuning.push_ctas: push CTAs are an sm90 RS plan over "
                                     "unicast with bulk-copy pushes")
            return push_plan(M, N, K, world, hw.sm_count, t.push_ctas, bn=bn, band=t.band)
        if mode == "ar" and t.push_all is not None:
            push_all = t.push_all
        else:
            push_all = auto_push_all(mode, transport, push_for(op_push, mode))
        sm90 = arch == SM90
        pp_rule = sm90 and _pingpong_free(shape, dtypes, t, op_push)
        return make_plan(M, N, K, world, hw.sm_count, mode, arch=arch, bn=bn,
                         pair_ctas=pair_ctas, cta_group=t.cta_group, lag=t.lag,
                         peers_first=t.peers_first, band=t.band,
                         pair_n=t.pair_n, push_all=push_all,
                         flat=t.flat if sm90 else False,
                         sk=t.sk if sm90 and not t.pingpong else False,
                         split_row=t.split_row if sm90 else False,
                         pingpong=None if pp_rule else False,
                         fine=_fill_rules(shape, dtypes),
                         bm=t.bm if t.bm or _rows64_free(shape, dtypes, t) else 128,
                         x_box=x_box, quad_ctas=hw.quad_ctas)
    except RsarValueError:
        raise
    except ValueError as e:
        raise RsarValueError(f"{t.describe()} cannot plan {M} x {N} x {shape.K} {mode}: "
                             f"{e}") from None
