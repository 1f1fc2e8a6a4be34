"""Fill an rsar kernel cache ahead of deployment (no GPU needed), for one arch and world size.

    python3 scripts/precompile.py --arch sm_90a --world 2 --out /opt/rsar-kernels
    RSAR_KERNEL_CACHE=/opt/rsar-kernels mpirun -n 2 python3 my_worker.py

Every variant a default plan of that arch and world can pick is compiled (``variants``: the
tile widths, modes rs / ar / gemm, 1-CTA and 2x1-cluster plans, the peers-first order of
small M) for each transport. Compiles run in parallel processes.

A workload that forces plans or knobs launches variants no default plan picks. Run it once
with ``RSAR_VARIANT_LOG=FILE`` and add ``--from-log FILE``: the variants it launched on this
arch and world are compiled too.

    RSAR_VARIANT_LOG=/tmp/used.jsonl mpirun -n 2 python3 my_worker.py
    python3 scripts/precompile.py --arch sm_90a --world 2 --out DIR --from-log /tmp/used.jsonl

``--any-world`` takes a log recorded at another world size at ``--world`` (where that world
runs the variant), so the world-2 suites' log builds a 4- or 8-GPU host's cache.

Ops built with ``dtype=torch.float16`` launch fp16 variants: ``--dtypes bf16,f16`` builds both
(each doubles the work; bf16 only by default). ``e4m3`` builds the variants of fp8 ops
(``input_dtype=torch.float8_e4m3fn``, bf16 results) with one scale per operand or per row,
``e4m3-block`` those of their calls with block-wise scales (sm90: 128-wide plans).

Calls with ``bias=`` launch variants of their own: ``--bias`` builds the bias twin of every
fused (RS / AR) variant too (the plain GEMM takes no bias), doubling the fused work.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BLOCK = "e4m3-block"  # --dtypes name of fp8 calls with block-wise scales


def variants(arch: str, world: int, transports: list[str],
             sm_counts: tuple[int, ...] = (132,), dtypes: tuple[str, ...] = ("bf16",),
             bias: bool = False) -> list:
    """Every variant a default plan of this arch and world picks, over M up to 64 Ki, K from
    64 to 16 Ki and N from 128 to 10 Ki (the tile widths, tile-row counts and round counts
    the plan rules distinguish, and N that end on a partial tile; tests/test_precompile.py
    samples beyond them) (push-all AR
    plans where the transport runs them; programmatic dependent launch on sm90, the
    sub-tile-ahead loads of world-2 unicast reductions, AR's early result copies and
    one-sub-tile push windows, as
    ``GemmRsAr`` launches by default, with ``default_stages``), for GPUs of each of
    ``sm_counts`` SMs (plans depend on the SM count). The shapes walked cover every default
    plan at 132 SMs (tests/test_precompile.py); at other counts nearly every one (2 of 9000
    random shapes missed at 114 SMs): a variant missed compiles at its first launch and is
    stored in the cache then. Each of ``dtypes`` ("bf16", "f16", and "e4m3": fp8 operands
    with bf16 results) gets the same variants: an fp8 op of depth K runs the plan of
    depth K / 2 (``launch.plan.plan_depth``), so the depths walked serve it as they are.
    ``BLOCK`` ("e4m3-block"): the fp8 variants of block-wise scales, on the plans of
    ``launch.resolve.BLOCK_BN``-wide tiles (sm90 only; sm100 has no block-wise kernel). ``bias``: each
    fused variant's twin with ``bias=1`` as well (calls that pass ``bias=``). The plain
    GEMM's variants come with each box of x's last tile row (``Variant.x_rows``; not pairs
    along N nor ping-pong, which have no box): an M that ends a tile row after 1-64 rows
    picks one (any row count below the tile's with ``launch.rules.X_BOX_UNEVEN``)."""
    from dataclasses import astuple

    from launch.comm_warps import IN_DTYPES
    from launch.geometry import BLACKWELL
    from launch.resolve import Dtypes, Hardware, Shape, resolve_variant, x_boxes
    from launch.rules import X_BOX_UNEVEN, choose_x_box
    from launch.variant import has_x_box
    kinds = set()
    # every tile-row count up to 32 (the small-M rules step by tile rows), then powers of two
    Ms = sorted({2 ** i for i in range(17)} | {3 * 2 ** i for i in range(15)}
                | set(range(64, 4097, 64)) | {129, 1000})
    for M in Ms:
        for K in (64, 512, 1024, 2048, 4096, 8192, 9216, 13056, 16384):
            # the N no 128-wide tile divides take 160- / 192-wide and partial tiles too
            for N in (128, 384, 896, 1792, 2048, 3584, 4096, 5376, 7168, 8192, 8960, 10240,
                      192, 200, 800, 1000, 2480, 2880, 4040, 4768, 6000, 8632):
                if N % 128 and arch in BLACKWELL:
                    continue
                for mode in ("rs", "ar", "gemm"):
                    for tr in transports:
                        if mode == "gemm" and tr == "multicast":
                            continue
                        for sms in sm_counts:
                            for dt in dtypes:
                                if dt == BLOCK and arch in BLACKWELL:
                                    continue
                                if dt == BLOCK:
                                    d = Dtypes("bf16", "e4m3", block_scales=True)
                                else:
                                    d = Dtypes("bf16", dt) if dt in IN_DTYPES else Dtypes(dt)
                                kinds.add(resolve_variant(Shape(M, N, K, mode),
                                                          Hardware(arch, sms), world, tr, d))
    if choose_x_box("gemm", 1):
        # any M may end on a partial tile row: the box of each row count below the tile's
        kinds |= {replace(v, x_rows=r) for v in kinds if not v.x_rows
                  and has_x_box(v.mode, v.pair_n, v.in_dtype, v.pingpong, v.arch)
                  for r in x_boxes(v.bm, X_BOX_UNEVEN)}
    if bias:
        kinds |= {replace(v, bias=1) for v in kinds if v.mode != "gemm"}
    return sorted(kinds, key=astuple)


def with_logged(vs: list, logs: list[str], arch: str, world: int,
                any_world: bool = False) -> tuple[list, int]:
    """``vs`` followed by the variants recorded in ``logs`` (``launch.variant_log``) for this
    arch and world that ``vs`` lacks; and how many logged variants were left out (another
    arch or world). ``any_world``: a variant logged at another world size is taken at this
    one where that world runs it (a world-2 suite's log serves a 4- or 8-GPU host; push-all
    AR is a world-2 plan and is left out)."""
    if not logs:
        return vs, 0
    from launch.variant_log import read
    logged = read(logs)
    here = [v for v in logged if v.arch == arch and v.world == world]
    if any_world:
        moved = (replace(v, world=world) for v in logged if v.arch == arch and v.world != world)
        here += [v for v in moved if _compiles(v)]
    here = list(dict.fromkeys(here))
    have = set(vs)
    return vs + [v for v in here if v not in have], len(logged) - len(here)


def dtype_name(v) -> str:
    """The ``--dtypes`` name of variant ``v``'s element types."""
    if v.in_dtype:
        return BLOCK if v.block_scales else v.in_dtype
    return v.dtype


def _compiles(v) -> bool:
    """Whether the kernel takes ``v`` (its constructor checks the knobs against the world
    size, and raises ValueError before any compiling)."""
    from launch.cache import kernel_for
    try:
        kernel_for(v)
    except ValueError:
        return False
    return True


def cached(vs: list, out: Path) -> list:
    """The variants of ``vs`` that ``out`` already holds for the present kernel sources and
    CuTe DSL (entries are keyed by both, so a stale one is never among them)."""
    from launch.disk_cache import entry_path
    return [v for v in vs if entry_path(v, out).is_file()]


def build(vs: list, out: Path, jobs: int, spawn: bool = False) -> None:
    """Compile ``vs`` into the kernel cache ``out`` on ``jobs`` processes, a line each.
    ``spawn``: fresh worker processes, for a caller that has initialized CUDA (a forked
    child of such a process cannot use the driver)."""
    import multiprocessing
    ctx = multiprocessing.get_context("spawn") if spawn else None
    with ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=ctx) as pool:
        for name, dt in pool.map(_build, [(v, str(out)) for v in vs]):
            print(f"  {name}: {dt:.1f} s", flush=True)


def _build(args: tuple) -> tuple[str, float]:
    v, out = args
    from launch import disk_cache
    from launch.cache import compile_variant
    t0 = time.perf_counter()
    disk_cache.store(v, compile_variant(v, exportable=True), Path(out))
    return v.describe(), time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", required=True, choices=["sm_90a", "sm_100a", "sm_103a"])
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--transports", default="unicast,multicast")
    p.add_argument("--sm-count", type=int, nargs="+", default=[132], metavar="N",
                   help="SM counts of the GPUs to build for (default 132: H100 / H200 SXM; "
                        "114: H100 PCIe, 148: B200); plans depend on it")
    p.add_argument("--dtypes", default="bf16",
                   help="element types to build for, comma-separated: bf16, f16 "
                        "(GemmRsAr's dtype torch.bfloat16 / torch.float16), e4m3 (fp8 "
                        "operands, bf16 results: input_dtype=torch.float8_e4m3fn), "
                        "e4m3-block (fp8 calls with block-wise scales); default bf16")
    p.add_argument("--bias", action="store_true",
                   help="also build the bias variant of every fused (RS / AR) one, for calls "
                        "with bias= (the plain GEMM takes none)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--from-log", action="append", default=[], metavar="FILE",
                   help="also compile the variants of this arch and world recorded in FILE "
                        "(RSAR_VARIANT_LOG); may be repeated")
    p.add_argument("--logged-only", action="store_true",
                   help="build only the --from-log variants of --dtypes (with a bias only "
                        "with --bias), not every default plan's: the suites' kernels in a "
                        "cache small enough to carry to a device")
    p.add_argument("--any-world", action="store_true",
                   help="take --from-log variants logged at another world size at --world, "
                        "where that world runs them (a world-2 log for a 4- or 8-GPU host)")
    p.add_argument("--force", action="store_true",
                   help="rebuild variants the cache already holds (for these kernel sources "
                        "and CuTe DSL version)")
    a = p.parse_args()
    if min(a.sm_count) < 1:
        p.error("--sm-count must be positive")
    from launch.comm_warps import DTYPES, IN_DTYPES
    dtypes = tuple(d.strip() for d in a.dtypes.split(",") if d.strip())
    names = (*DTYPES, *IN_DTYPES, BLOCK)
    if not dtypes or set(dtypes) - set(names):
        p.error(f"--dtypes takes a comma-separated list of {', '.join(names)}; got {a.dtypes!r}")
    if a.logged_only and not a.from_log:
        p.error("--logged-only needs --from-log")
    base = [] if a.logged_only else variants(a.arch, a.world, a.transports.split(","),
                                             tuple(a.sm_count), dtypes, a.bias)
    vs, skipped = with_logged(base,
                              a.from_log, a.arch, a.world, a.any_world)
    if a.logged_only:
        vs = [v for v in vs if dtype_name(v) in dtypes and (a.bias or not v.bias)]
    if skipped:
        print(f"  {skipped} logged variants are for another arch or world: skipped", flush=True)
    held = set() if a.force else set(cached(vs, Path(a.out)))
    if held:
        print(f"  {len(held)} variants already in {a.out}: kept", flush=True)
    todo = [v for v in vs if v not in held]
    t0 = time.perf_counter()
    build(todo, Path(a.out), a.jobs)
    print(f"rsar precompile: {len(todo)} variants built for {a.arch}, world {a.world}, "
          f"{len(held)} kept, into {a.out} "
          f"in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
