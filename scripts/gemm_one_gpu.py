"""The plain GEMM kernel (the fused kernel with the communication compiled out) on one GPU,
against torch.mm: no communicator, no symmetric memory, no peer.

    python3 scripts/gemm_one_gpu.py --columns default,stages4,c1,c2 --json out.json

For a host with a single GPU, or a session with no 2-GPU machine: the GEMM half of the fused
op can be measured and tuned there. Every column is first checked against the float64
product of the same inputs (NaN-poisoned output), then timed in blocks (each queued behind
a GPU sleep that outlasts the host's launches, taken again where it did not; inputs rotated
past L2) in which torch.mm and the columns run call by call in turn, so every ratio's two
sides meet the same clocks; the median per column is reported, with the ratio torch.mm /
column, and the JSON's ``block_ratios`` give each block's; then checked again.
``--interleave blocks`` (the method before docs/PERF.md (as)) runs a column's calls
together, then the next column's.

Columns: ``default`` (the plan ``GemmRsAr.gemm_only`` runs), ``stagesN`` (that plan with at
least N mainloop stages; ``stages3``: the whole-tile ring, without ``default_stages``),
``c1`` / ``c2`` (1-CTA tiles / 2x1 clusters; ``c4``: 4x1 clusters along M sharing w's tile,
widths of 32s), ``bnW`` (tile width W), ``bm64`` (64-row tiles on one MMA warp group; 1-CTA,
or with ``c2`` / ``c4`` clusters along M sharing w), ``sk`` (the split-K
tail: a partial last round's tiles cut along K onto the idle SMs, the plain GEMM's one round
onto a grid widened to its pieces; 1-CTA; ``sk0``: never split), ``pn`` (2x1
clusters pairing neighbours along N, sharing x's tile), ``bandB`` (B unit
rows per band of the tile order; 0: row-major), ``ts`` / ``ts0`` (the output stored by TMA
tensor stores / by the communication threads), ``pp`` (ping-pong MMA warp groups, whole
tiles each, ``launch.pingpong``: up to 192 wide, so with ``bnW``), ``xb`` / ``xb0`` (the
last tile row's x loaded in boxes of its rows rounded up to 8 / 16 / 32 / 64,
``Variant.x_rows`` / never), ``l2n`` / ``l2f`` / ``l2l`` (the mainloop's loads evict from
L2 normal / first / last, ``Tuning.l2_hint``; ``l2cn`` / ``l2cf`` / ``l2cl``: by the fixed
policy words CUTLASS passes; ``l2o``: the DSL's operand of 0, not the rule's), ``tpn`` /
``tp64`` / ``tp128`` / ``tp256`` (x's and w's load descriptors encoded by the driver with L2
promotion none / 64 / 128 / 256 B, ``Tuning.tma_promo``; ``tpd``: the DSL's own), joined with
``+`` (``c1+bn256+stages4``, ``bn128+sk``, ``band4``).

``--dtype e4m3``: fp8 operands with fp32 scales (``--scales tensor``: one each, as
torch._scaled_mm runs on cuBLAS; ``row``: per row of x and of w; ``block``: DeepSeek-style
block-wise, x's per row and 128-element k-group, w's per 128 x 128 block) and bf16 results;
the ``mm`` column is then torch._scaled_mm with fast accumulation (block-wise: torch's
BlockWise1x128 x BlockWise128x128 scaled_mm, ``rsar_core.reference.scaled_mm``), and plans
are made at half the depth (``launch.plan.plan_depth``). Block-wise scales run 128-wide
tiles as the op does (a ``bn64`` column: 64-wide; other widths are skipped). Where torch's
anchor raises at a shape (a torch build or shape its block-wise scaled_mm does not take),
``mm`` is n/a there: None in the JSON row, with the reason in ``anchor_error``, and the
shape left out of the geomeans.

    python3 scripts/gemm_one_gpu.py --dtype e4m3 --scales block --columns default,c1,c2,bn64
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = [(M, N, K) for N in (7168, 8192) for K in (1024, 4096, 9216)
          for M in (128, 256, 512, 1024, 2048, 4096, 8192, 16384)]
L2_BYTES = 60 * 2**20
L2_PARTS = {"l2o": "", "l2n": "normal", "l2f": "first", "l2l": "last", "l2cn": "fixed_normal",
            "l2cf": "fixed_first", "l2cl": "fixed_last"}  # column part -> Tuning.l2_hint
PROMO_PARTS = {"tpd": "", "tpn": "none", "tp64": "64B", "tp128": "128B",
               "tp256": "256B"}  # column part -> Tuning.tma_promo


def column_knobs(name: str) -> dict:
    """The ``Tuning`` fields of a column name; ValueError if it names something else."""
    knobs: dict = {}
    for part in name.split("+"):
        if part == "default":
            continue
        if part in ("c1", "c2", "c4"):
            knobs["cta_group"] = int(part[1])
        elif part.startswith("bn") and part[2:].isdigit():
            knobs["bn"] = int(part[2:])
        elif part.startswith("bm") and part[2:].isdigit():
            knobs["bm"] = int(part[2:])
        elif part.startswith("stages") and part[6:].isdigit():
            knobs["stages"] = int(part[6:])
        elif part in ("sk", "sk0"):
            knobs["sk"] = part == "sk"
        elif part == "pn":
            knobs["pair_n"] = True
        elif part in ("pp", "pp0"):
            knobs["pingpong"] = part == "pp"
        elif part in ("xb", "xb0"):
            knobs["x_box"] = part == "xb"
        elif part in ("ts", "ts0"):
            knobs["tma_store"] = part == "ts"
        elif part.startswith("band") and part[4:].isdigit():
            knobs["band"] = int(part[4:])
        elif part in L2_PARTS:
            knobs["l2_hint"] = L2_PARTS[part]
        elif part in PROMO_PARTS:
            knobs["tma_promo"] = PROMO_PARTS[part]
        else:
            raise ValueError(f"unknown column part {part!r} in {name!r} (default, c1, c2, c4, bnW, "
                             f"bmR, stagesN, sk, sk0, pn, bandB, ts, ts0, pp, pp0, xb, xb0, "
                             f"{', '.join(L2_PARTS)}, {', '.join(PROMO_PARTS)}, joined with +)")
    return knobs


def column_plan(name: str, M: int, N: int, K: int, sm_count: int = 132,
                pair_ctas: int | None = None, dtype: str = "bf16",
                block: bool = False, quad_ctas: int | None = None) -> tuple:
    """(plan, variant) a column launches; ValueError where the plan cannot take its knobs
    (an unknown width, too many stages; a width that does not divide N ends each tile row
    on a partial tile). ``pair_ctas`` / ``quad_ctas``: CTAs resident at once
    as 2x1 / 4x1 clusters (as ``GemmRsAr.pair_ctas``; None: every SM); ``dtype``: the variant's
    element type ("bf16" / "f16"; "e4m3": fp8 operands, bf16 results); ``block``: fp8
    block-wise scales, on 128-wide tiles unless the column forces 64 (as
    ``GemmRsAr.plan``), ValueError for other widths."""
    from launch.cache import kernel_for
    from launch.comm_warps import IN_DTYPES
    from launch.resolve import Dtypes, Hardware, Shape, resolve
    from launch.tuning import Tuning
    in_dtype = dtype if dtype in IN_DTYPES else ""
    dtypes = Dtypes("bf16" if in_dtype else dtype, in_dtype, block)
    hw = Hardware("sm_90a", sm_count, pair_ctas, quad_ctas)
    plan, v = resolve(Shape(M, N, K, "gemm"), hw, 2, "unicast", dtypes,
                      Tuning(**column_knobs(name)))
    if v.stages or v.pingpong:  # the kernel refuses what it cannot run
        kernel_for(v)
    return plan, v


def input_sets(M: int, N: int, K: int, dev: Any, dtype: Any = None,
               scales: str = "") -> list:
    """Random (x, w) pairs (bf16 unless ``dtype``), enough that rotating through them leaves
    none in L2; fp8 ones with their fp32 (x_scale, w_scale), ``scales`` "tensor", "row" or
    "block" (``rsar_core.reference.rank_fp8_inputs``: block-wise, x's M-major as torch's
    block-wise scaled_mm takes them, so its anchor times no layout copy)."""
    import torch
    dtype = dtype or torch.bfloat16
    size = torch.empty((), dtype=dtype).element_size()
    nsets = max(2, min(8, math.ceil(3 * L2_BYTES / ((M * K + N * K) * size))))
    if dtype != torch.float8_e4m3fn:
        return [(torch.randn(M, K, device=dev).to(dtype),
                 (torch.randn(N, K, device=dev) / K ** 0.5).to(dtype)) for _ in range(nsets)]
    from rsar_core.reference import rank_fp8_inputs
    return [rank_fp8_inputs(i, 0, M, N, K, dev, per_row=scales == "row",
                            block=scales == "block", m_major=True) for i in range(nsets)]


def launcher(fn: Any, plan: Any, y: Any, ws: Any, err: Any, lay: Any, K: int,
             scale_bits: int | None = None) -> Any:
    """``run(x, w[, x_scale, w_scale])``: the plain-GEMM kernel ``fn`` on ``plan`` into ``y``
    at depth ``K`` (the call's; an fp8 plan's is half of it), on the current stream, with a
    workspace ``ws`` laid out by ``lay`` (its split-K slots) and no peers. ``scale_bits``:
    the scales' kernel bits (``rsar_core.validate.check_scales``; needed for block-wise
    ones); None: per-row or one each, as each call's scales' sizes say."""
    import torch

    def run(x: Any, w: Any, sx: Any = None, sw: Any = None) -> None:
        p = plan
        bits = (0 if sx is None else scale_bits if scale_bits is not None
                else int(sx.numel() > 1) | int(sw.numel() > 1) << 1)
        # the head as GemmRsAr._launch_prepared passes it; bias address 0: the plain GEMM
        # takes none
        fn(x.data_ptr(), w.data_ptr(), y.data_ptr(), 0 if sx is None else sx.data_ptr(),
           0 if sw is None else sw.data_ptr(), bits, 0, p.M, p.N, K, ws.data_ptr(), 0, 0,
           err.data_ptr(), 0, p.local_M, p.padded_M, p.chunk, p.rounds, p.sched_word,
           p.grid, 5_000_000_000, lay.arrive_off, lay.result_off, lay.recv_off,
           lay.recv_region_bytes, lay.part_off, lay.out_off,
           torch.cuda.current_stream(y.device).cuda_stream)
    return run


def check_columns(cols: dict, inputs: tuple, y: Any, ref: Any, err: Any,
                  where: str) -> dict[str, float]:
    """Relative error of each column against ``ref`` (float64) on ``inputs``, its output
    ``y`` poisoned with NaN first: what a column returns, where it returns a tensor (torch's
    block-wise anchor has no ``out=``), else ``y``. RuntimeError at the first column off by
    1e-2 or more, or that raised the kernel's error flag ``err``."""
    import torch
    errors = {}
    for name, fn in cols.items():
        y.fill_(float("nan"))
        got = fn(*inputs)
        got = y if got is None else got
        if y.is_cuda:
            torch.cuda.synchronize()
        errors[name] = ((got.double() - ref).norm() / ref.norm()).item()
        if not errors[name] < 1e-2 or err[0].item():
            raise RuntimeError(f"{name} at {where}: rel err {errors[name]:.2e}")
    return errors


def call_schedule(columns: int, iters: int, nsets: int) -> list[tuple[int, int]]:
    """(column, input set) of each timed call of one block: ``iters`` rounds of every column
    in turn (one column: ``iters`` calls of it), each call on the set after its
    predecessor's so that no call finds the inputs of the call before it in L2 (the sets'
    rotation, ``input_sets``, leaves none there)."""
    return [(c, (i * columns + c) % nsets) for i in range(iters) for c in range(columns)]


def queued_calls(fns: list, sets: list, schedule: list[tuple[int, int]],
                 host_us: float = 50.0, tries: int = 4) -> tuple[list[list[float]], int]:
    """Microseconds of each call of ``schedule`` ((index into ``fns``, index into ``sets``)),
    per function, queued behind a GPU sleep so that each event pair brackets GPU work only;
    and how many times the block was taken again.

    The sleep lasts ``host_us`` per call. If the GPU ends it before the host has queued the
    last call, the stream ran dry and some pairs hold host launch gaps: the block is taken
    again with twice the sleep, up to ``tries`` blocks in all (the last one stands). On one
    H200 kernels of ~10 us read 23-36 us that way in the first second of a process and
    after the grid's heaviest shape (docs/PERF.md (x))."""
    import torch
    n = len(schedule)
    for attempt in range(tries):
        torch.cuda._sleep(int(n * host_us * 2**attempt * 2e3))  # cycles at up to 2 GHz
        gate = torch.cuda.Event()
        gate.record()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2 * n)]
        for i, (f, s) in enumerate(schedule):
            ev[2 * i].record()
            fns[f](*sets[s])
            ev[2 * i + 1].record()
        ran_dry = gate.query()
        torch.cuda.synchronize()
        if not ran_dry or attempt == tries - 1:
            break
    us: list[list[float]] = [[] for _ in fns]
    for i, (f, _) in enumerate(schedule):
        us[f].append(ev[2 * i].elapsed_time(ev[2 * i + 1]) * 1e3)
    return us, attempt


def build_columns(a: argparse.Namespace, sm_count: int, pair_ctas: int | None,
                  block: bool, quad_ctas: int | None = None) -> None:
    """Compile every (shape, column) kernel the kernel cache lacks, in parallel, before any
    timing (a sweep of new variants otherwise compiles them one at a time between shapes)."""
    from launch.disk_cache import cache_dir
    out = cache_dir()
    if out is None:
        print("--build-jobs: RSAR_KERNEL_CACHE is not set; compiling as each column runs",
              flush=True)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from precompile import build, cached
    vs: dict = {}
    for M, N, K in a.shape_list:
        for name in a.column_list:
            try:
                vs[column_plan(name, M, N, K, sm_count, pair_ctas, a.dtype, block,
                               quad_ctas)[1]] = None
            except ValueError:
                continue
    held = set(cached(list(vs), out))
    todo = [v for v in vs if v not in held]
    print(f"--build-jobs: {len(todo)} kernels to build, {len(held)} in {out}", flush=True)
    build(todo, out, a.build_jobs, spawn=True)


def build_only(a: argparse.Namespace) -> int:
    """``--build-only``: the kernels of an H100 / H200 run (132 SMs; the GPC layout may hold
    fewer 2x1 clusters than SMs, which some plans see), built on this machine."""
    from launch.disk_cache import cache_dir
    if cache_dir() is None:
        print("--build-only: set RSAR_KERNEL_CACHE to the folder to fill", file=sys.stderr)
        return 2
    a.build_jobs = a.build_jobs or os.cpu_count() or 1
    block = a.dtype == "e4m3" and a.scales == "block"
    for pair_ctas in (None, 132):
        build_columns(a, 132, pair_ctas, block)
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--columns", default="default", help="comma-separated (see above)")
    p.add_argument("--shapes", default=None, help="M,N,K;M,N,K;... (default: the issue's grid, "
                   "N 7168 / 8192, K 1024 / 4096 / 9216, M 128-16384)")
    p.add_argument("--iters", type=int, default=40, help="timed calls per column and block")
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--shuffle", type=int, default=None, metavar="SEED",
                   help="run the columns of each block in an order drawn from SEED (default: "
                        "as listed; a column listed first runs first in every block)")
    p.add_argument("--interleave", choices=["blocks", "calls"], default="calls",
                   help="calls (default): each block runs the columns call by call in turn, "
                        "so torch.mm and each column share the GPU's clock at every moment; "
                        "blocks: a column's --iters calls, then the next column's (the "
                        "48 shapes' block ratios spanned 1.6%% at the median shape against "
                        "0.7%% call by call, docs/PERF.md (as))")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--build-jobs", type=int, default=0, metavar="J",
                   help="first compile every column's kernel that RSAR_KERNEL_CACHE lacks on "
                        "J processes (default 0: each compiles at its first shape, one by one)")
    p.add_argument("--build-only", action="store_true",
                   help="compile every column's kernel RSAR_KERNEL_CACHE lacks on this machine "
                        "(no GPU: 132 SMs, 2x1 clusters on every SM or fewer) on --build-jobs "
                        "processes (default: every core), then exit; the cache a device call "
                        "carries")
    p.add_argument("--dtype", choices=["bf16", "f16", "e4m3"], default="bf16",
                   help="element type of x, w and the output, for both kernels (default "
                        "bf16; e4m3: fp8 operands, bf16 results, against torch._scaled_mm)")
    p.add_argument("--scales", choices=["tensor", "row", "block"], default="tensor",
                   help="with --dtype e4m3: one fp32 scale per operand (cuBLAS's form, the "
                        "default), one per row of x and of w, or block-wise (x per row and "
                        "128-element k-group, w per 128 x 128 block; 128-wide tiles, or a "
                        "bn64 column's 64; K a multiple of 128)")
    a = p.parse_args(argv)
    a.column_list = [c for c in a.columns.split(",") if c]
    for c in a.column_list:
        try:
            column_knobs(c)
        except ValueError as e:
            p.error(str(e))
    try:
        a.shape_list = SHAPES if a.shapes is None else [
            tuple(int(v) for v in s.split(",")) for s in a.shapes.split(";")]
    except ValueError:
        a.shape_list = [()]
    if any(len(s) != 3 or min(s) <= 0 for s in a.shape_list):
        p.error("--shapes takes M,N,K triples of positive ints, ';'-separated")
    if a.iters < 1 or a.blocks < 1:
        p.error("--iters and --blocks must be >= 1")
    if a.scales != "tensor" and a.dtype != "e4m3":
        p.error("--scales is for --dtype e4m3")
    if a.scales == "block" and any(s[2] % 128 for s in a.shape_list):
        p.error("--scales block takes K a multiple of 128 (one scale per 128-element k-group)")
    return a


def block_ratios(per_block: dict[str, list[float]]) -> dict[str, list[float]]:
    """torch.mm / column of each block's medians, per column: how far one block's reading
    strays from another's (the GPU's clock moves between blocks; with ``--interleave calls``
    both sides of each ratio ran under the same clocks). Empty without the anchor."""
    mm = per_block.get("mm")
    if not mm:
        return {}
    return {k: [round(m / c, 4) for m, c in zip(mm, v)] for k, v in per_block.items()
            if k != "mm"}


def geomeans(rows: list[dict]) -> dict[str, float]:
    """Geometric mean of torch.mm / column per column, over the shapes where the column ran
    (a plan that cannot run at a shape is skipped there) and torch's anchor did (None where
    it raised: block-wise scales at a shape torch's scaled_mm does not take)."""
    rows = [r for r in rows if r["us"].get("mm") is not None]
    names = list(dict.fromkeys(k for r in rows for k in r["us"] if k != "mm"))
    return {k: statistics.geometric_mean([r["us"]["mm"] / r["us"][k] for r in rows
                                          if k in r["us"]]) for k in names}


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.build_only:
        return build_only(a)
    import torch
    from launch.cache import CACHE
    from launch.layout import WorkspaceLayout
    from rsar_core.reference import call_refusal, scaled_mm
    from rsar_core.validate import IN_DTYPES, check_scales, torch_dtype
    fp8 = a.dtype in IN_DTYPES.values()
    block = fp8 and a.scales == "block"
    in_dtype = torch.float8_e4m3fn if fp8 else torch_dtype(a.dtype)
    dtype = torch.bfloat16 if fp8 else in_dtype
    dev = torch.device("cuda", torch.cuda.current_device())
    sm_count = torch.cuda.get_device_properties(dev).multi_processor_count
    lay = WorkspaceLayout.build(max(s[0] for s in a.shape_list), max(s[1] for s in a.shape_list), 2)
    ws = torch.zeros(lay.total_bytes, dtype=torch.uint8, device=dev)  # split-K slots only
    err = torch.zeros(8, dtype=torch.int32, device=dev)
    # after the first allocation: the occupancy probe loads a module into the current context
    from rsar_core.gemm_rsar import _cluster_ctas, _pair_ctas
    pair_ctas = _pair_ctas(dev.index, sm_count)
    quad_ctas = _cluster_ctas(dev.index, sm_count, 4)
    # the small-M rules' widths follow these (H100s of 132 SMs hold 30 or 32 4x1 clusters)
    print(f"{torch.cuda.get_device_name(dev)}: {sm_count} SMs, {pair_ctas // 2} 2x1 and "
          f"{quad_ctas // 4} 4x1 clusters resident", flush=True)
    if a.build_jobs:
        build_columns(a, sm_count, pair_ctas, block, quad_ctas)
    rows = []
    for M, N, K in a.shape_list:
        sets = input_sets(M, N, K, dev, in_dtype, a.scales)
        nsets = len(sets)
        y = torch.empty(M, N, dtype=dtype, device=dev)
        # torch's block-wise scaled_mm has no out=: it allocates (what the caching allocator
        # makes cheap) rather than copying into y
        y_mm = None if block else y
        cols: dict[str, Any] = {"mm": (lambda *a: scaled_mm(*a, y.dtype, out=y_mm)) if fp8 else
                                (lambda x, w: torch.mm(x, w.t(), out=y))}
        anchor_why = call_refusal(cols["mm"], *sets[0]) if fp8 else None
        if anchor_why:  # torch's scaled_mm does not take these scales here: mm is n/a
            del cols["mm"]
        # the kernel's scale bits, as the op derives them (the same for every set)
        bits = (check_scales(sets[0][2], sets[0][3], M, N, dev, a.dtype, K) if fp8
                else None)
        skipped = {}
        for name in a.column_list:
            try:
                plan, v = column_plan(name, M, N, K, sm_count, pair_ctas, a.dtype, block,
                                      quad_ctas)
            except ValueError as e:
                skipped[name] = str(e)
                continue
            cols[name] = launcher(CACHE.get(v), plan, y, ws, err, lay, K, bits)
        if fp8:
            from rsar_core.reference import scaled_product
            ref = scaled_product(*sets[0])
        else:
            ref = sets[0][0].double() @ sets[0][1].double().t()
        errors = check_columns(cols, sets[0], y, ref, err, f"{M}x{N}x{K}")
        times: dict[str, list[float]] = {k: [] for k in cols}
        retried = dict.fromkeys(cols, 0)
        order = list(cols.items())
        per_block: dict[str, list[float]] = {k: [] for k in cols}
        for b in range(a.blocks):
            if a.shuffle is not None:
                random.Random(a.shuffle * 1009 + b + M + N + K).shuffle(order)
            # blocks: each column's calls queued on their own; calls: all columns in turn
            for group in [order] if a.interleave == "calls" else [[c] for c in order]:
                fns = [fn for _, fn in group]
                for f, s in call_schedule(len(fns), 3, nsets):  # warm-up
                    fns[f](*sets[s])
                us_calls, again = queued_calls(fns, sets, call_schedule(len(fns), a.iters, nsets))
                for (name, _), got in zip(group, us_calls):
                    times[name] += got
                    per_block[name].append(statistics.median(got))
                    retried[name] += again
        # again after the timed calls: a kernel that keeps state across launches (the
        # epoch, the split-K tail's piece flags) must leave it as it found it
        check_columns(cols, sets[0], y, ref, err, f"{M}x{N}x{K} after timing")
        us = {k: statistics.median(v) for k, v in times.items()}
        if anchor_why:  # the anchor's entries first, as where it ran
            us, errors = {"mm": None, **us}, {"mm": None, **errors}
        row = {"M": M, "N": N, "K": K, "us": us, "rel_err": errors, "skipped": skipped,
               "retried": {k: n for k, n in retried.items() if n},
               "block_ratios": block_ratios(per_block), "interleave": a.interleave,
               "clusters": {"2x1": pair_ctas // 2, "4x1": quad_ctas // 4}}
        if anchor_why:
            row["anchor_error"] = anchor_why
        rows.append(row)
        spread = {k: f" [{min(r):.3f}..{max(r):.3f}]" for k, r in row["block_ratios"].items()
                  if len(r) > 1}
        print(f"{M} x {N} x {K}: " + "  ".join(
            (f"{k} n/a" if v is None else f"{k} {v:.1f} us")
            + (f" ({us['mm'] / v:.3f}){spread.get(k, '')}" if k != "mm" and us["mm"] is not None
               else "")
            for k, v in us.items())
            + (f"  [anchor: {anchor_why}]" if anchor_why else ""), flush=True)
    print("geomean torch.mm / column: " + ("  ".join(
        f"{k} {g:.3f}x" for k, g in geomeans(rows).items()) or "n/a"), flush=True)
    na = sum(r["us"]["mm"] is None for r in rows)
    if na:
        print(f"torch's anchor was n/a at {na} of {len(rows)} shapes (left out of the "
              f"geomeans; each row's anchor_error says why)", flush=True)
    again = sum(n for r in rows for n in r["retried"].values())
    if again:
        print(f"{again} blocks were taken again: the GPU had run out of queued calls",
              flush=True)
    if a.json is not None:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
