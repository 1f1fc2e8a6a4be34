"""Compiled-kernel cache: each variant compiles once per process.

A variant is (arch, BN, world, mode, transport, cta_group, dtype) and its tuning knobs; shapes,
pointers, rank and epoch are launch arguments, so one compiled function serves every call of
every instance.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from . import variant_log
from .plan import BLACKWELL, TilePlan

log = logging.getLogger("rsar.launch")

ARCHS = ("sm_90a", "sm_100a", "sm_103a")
# sm90 tuning knobs a Variant may set (0: the kernel's default), see Sm90FusedKernel
TUNING = ("epi_slots", "peers_first", "pair_n", "stages", "push_all", "pdl", "prefetch",
          "early_copy", "push_window", "flat", "sk", "split_row", "push_ctas", "lean_exit",
          "tma_store", "trace", "block_scales", "pingpong")


@dataclass(frozen=True)
class Variant:
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
        return f"{self.arch} BN={self.bn} world={self.world} {self.mode} {self.transport}{cg}{tune}"


# A thread holds the tile's BN fp32 accumulators and the epilogue's ~40 more registers: the
# GEMM alone with the TMA store gives its MMA threads 232 (its first warp group only issues
# copies), a fused kernel 200 (its communication threads keep 104) up to 128 wide, 216 at
# 160 (its communication threads 72: the CTA's pool is 384 x 168 registers, so 192-wide
# tiles would leave them 56, and spill 0.3-1.9 KB; docs/PERF.md (ag)).
PINGPONG_WIDEST = {"alone": 192, "fused": 160}


def pingpong_refusal(bn: int, mode: str, tma_store: bool, scaled: bool, sk: bool,
                     trace: bool, push_ctas: bool) -> str | None:
    """Why a kernel of these knobs cannot run ping-pong warp groups, or None if it can."""
    alone = mode == "gemm" and tma_store
    widest = PINGPONG_WIDEST["alone" if alone else "fused"]
    if bn > widest:
        where = "the GEMM alone with the TMA store" if alone else "beside communication warps"
        return (f"ping-pong warp groups hold a whole tile's accumulators per thread: tiles at "
                f"most {widest} wide ({where}), not {bn}")
    if scaled or sk or trace or push_ctas:
        return ("ping-pong warp groups run bf16 / fp16 operands without the split-K tail, "
                "traces or push CTAs")
    return None


def default_push(arch: str, transport: str, mode: str = "rs") -> str:
    """How partials reach peers by default: bulk copies on sm90 unicast (measured 8-13%
    faster RS than thread stores on 2x H200), and for AR its reduced tiles too (1-2% at
    link-bound shapes, docs/PERF.md); thread stores elsewhere."""
    if arch != "sm_90a" or transport != "unicast":
        return "lsu"
    return "tma_all" if mode == "ar" else "tma"


def auto_push_all(mode: str, transport: str, push: str) -> bool | None:
    """``make_plan``'s push_all for an op that forces nothing: None (the plan's choice,
    ``choose_push_all``) where a kernel can run push-all (AR over unicast with bulk-copy
    pushes), else False."""
    return None if mode == "ar" and transport == "unicast" and push != "lsu" else False


def default_prefetch(arch: str, world: int, transport: str, mode: str) -> int:
    """1 where a kernel's reductions load one sub-tile ahead by default (``CommWarps``
    ``prefetch``): sm90 fused kernels at world 2 over unicast (docs/PERF.md (j))."""
    return int(arch == "sm_90a" and world == 2 and transport == "unicast" and mode != "gemm")


def default_early_copy(arch: str, transport: str, plan: TilePlan) -> int:
    """1 where AR copies its results back during the rounds (``Sm90FusedKernel``
    ``early_copy``): sm90 owner plans over unicast with the lag round. Same run on 2x H200
    (docs/PERF.md (l), M 1024-16384): geomean 1.022x, 4-11% faster at K=1024 from M=4096,
    none slower beyond the noise."""
    return int(arch == "sm_90a" and transport == "unicast" and plan.mode == "ar"
               and not plan.push_all and plan.lag == 1)


def default_push_window(arch: str, transport: str, push: str, plan: TilePlan) -> int:
    """1 where a CTA keeps one sub-tile's bulk copies in flight at a time (``CommWarps``
    ``push_window``): sm90 unicast AR owner plans and RS peers-first plans. Same run on
    2x H200 (docs/PERF.md (n)): AR 1.6-2.3% faster at M 1024-4096, none slower; RS 7%
    faster at M=1024, K=1024 (peers-first), but 3-8% slower at K=1024 from M=2048
    (many rounds, link-bound), so RS's other plans keep all of a tile's copies in flight."""
    if arch != "sm_90a" or transport != "unicast" or push == "lsu":
        return 0
    if plan.mode == "ar":
        return int(not plan.push_all)
    return int(plan.mode == "rs" and plan.peers_first)


def default_stages(arch: str, transport: str, push: str, plan: TilePlan) -> int:
    """4 where a 224- or 256-wide sm90 plan gives each lane few tiles, else 0 (the kernel's
    3 mainloop stages with a whole-tile sub-tile ring). The ring's depth lets a lane's MMA
    warps start its next tile while the last one is pushed or stored; with at most two
    tiles per lane (three for the GEMM alone at 224 wide, one at 256) there is little next
    tile to start, and a fourth stage keeps more k-blocks in flight instead. Same runs on
    2x H200 (docs/PERF.md (t), two runs, N 7168 / 8192, K 1024-9216, M 384-1152), four
    stages against three: RS +1.3..+5.7% and AR +3.3..+3.8% on 224-wide two-round plans at
    K >= 2048 (M 896-1024); the GEMM alone +1.5..+7.0% at 224 wide (M 384-1152) and
    +1.1..+4.4% on 256-wide one-round plans (M 384-512). K=1024 ties (0.98-1.02), RS plans
    that split a shared row lose up to 7% (1152 x 7168), and from four tiles per lane
    the GEMM alone loses 1-6% (docs/PERF.md (s)). Bulk-copy pushes on unicast only, where
    it was measured."""
    if (arch != "sm_90a" or transport != "unicast" or push == "lsu" or plan.K < 2048
            or plan.split_row or plan.sk):
        return 0
    tiles = plan.rounds - plan.lag
    if plan.bn == 224 and tiles <= (3 if plan.mode == "gemm" else 2):
        return 4
    return 4 if plan.bn == 256 and tiles <= 1 else 0


def default_lean_exit(arch: str, transport: str, mode: str) -> int:
    """1 where fused kernels end without system fences or ``done`` stamps
    (``protocol.finish_launch``): nowhere yet. The start stamps make those fences
    unnecessary, and the lean exit passed the GPU suite on one shared GPU at world 2 and 4
    (docs/PERF.md (u)); it becomes the default once it is timed on two GPUs against the
    fenced exit (bench columns ``rs_lean`` / ``ar_lean``)."""
    return 0


def default_tma_store(arch: str, push: str, mode: str) -> int:
    """1 where the plain GEMM stores its output by TMA (``Sm90FusedKernel`` ``tma_store``):
    sm90 with bulk-copy rows in its ring. One H200, same run, the issue's 48 shapes
    (docs/PERF.md (v)): 1.018x the communication threads' 16-B stores on the geomean,
    1.033x at M <= 512 where a CTA's one tile ends the launch, 1.020x at M 1024-2048,
    1.001x from M=4096 (where the copy-out already ran under the next tile's mainloop)."""
    return int(arch == "sm_90a" and mode == "gemm" and push == "tma")


def default_plan(M: int, N: int, K: int, world: int, sm_count: int, mode: str, arch: str,
                 transport: str, bn: int | None = None) -> TilePlan:
    """The plan an op that forces nothing runs (``GemmRsAr.plan``, apart from the 2x1
    cluster occupancy query, which is left at every SM here); ``bn``: at that tile width
    (block-wise fp8 scales' plans)."""
    from .plan import make_plan
    return make_plan(M, N, K, world, sm_count, mode, arch=arch, bn=bn,
                     push_all=auto_push_all(mode, transport, default_push(arch, transport, mode)))


def default_variant(arch: str, world: int, transport: str, plan: TilePlan,
                    dtype: str = "bf16", in_dtype: str = "") -> Variant:
    """The variant an op that forces nothing launches for ``plan`` (``GemmRsAr``): the
    default push and every default tuning rule above. One definition for what precompiles,
    what the grid's plans pin and what the tests check the op against. The rules do not
    depend on ``dtype``: fp16 moves the bytes and runs the MMAs bf16 does; fp8 operands
    (``in_dtype``) are planned at half their depth (``launch.plan.plan_depth``)."""
    push = push_for(default_push(arch, transport, plan.mode), plan.mode)
    return Variant(arch, plan.bn, world, plan.mode, transport, plan.cta_group, push=push,
                   dtype=dtype, in_dtype=in_dtype,
                   peers_first=int(plan.peers_first), pair_n=int(plan.pair_n),
                   stages=default_stages(arch, transport, push, plan),
                   push_all=int(plan.push_all), pdl=int(arch == "sm_90a"),
                   prefetch=default_prefetch(arch, world, transport, plan.mode),
                   early_copy=default_early_copy(arch, transport, plan),
                   push_window=default_push_window(arch, transport, push, plan),
                   flat=int(plan.flat), sk=int(plan.sk > 1), split_row=int(plan.split_row),
                   push_ctas=int(plan.push_ctas > 0),
                   lean_exit=default_lean_exit(arch, transport, plan.mode),
                   tma_store=default_tma_store(arch, push, plan.mode))


def push_for(push: str, mode: str) -> str:
    """The push a ``mode`` kernel compiles with: "tma_all" differs from "tma" only in AR."""
    return "tma" if push == "tma_all" and mode != "ar" else push


def kernel_for(v: Variant) -> Any:
    if v.arch == "sm_90a":
        from .sm90_kernel import Sm90FusedKernel
        return Sm90FusedKernel(v.bn, v.world, v.mode, v.transport, v.cta_group, push=v.push,
                               dtype=v.dtype, in_dtype=v.in_dtype, bias=v.bias, **v.tuning())
    if v.arch in BLACKWELL:
        from .sm100_kernel import Sm100FusedKernel
        if v.tuning() or v.push != "lsu":
            raise ValueError("the sm100 kernel has no tuning knobs yet")
        return Sm100FusedKernel(v.bn, v.world, v.mode, v.transport, v.cta_group, v.dtype,
                                v.in_dtype, v.bias)
    raise NotImplementedError(f"no kernel for {v.arch} yet")


# Argument kinds of the compiled host function, in order (Sm90FusedKernel.__call__ and
# Sm100FusedKernel.__call__ take the same arguments): x, w, out, x's and w's scales, the
# scales' bits, the bias (``HEAD_ARGS`` of them, given per call), then the plan's fixed ones.
ARG_KINDS = (["i64"] * 5 + ["i32"] + ["i64"] + ["i32"] * 3 + ["i64"] * 4 + ["i32"] * 7 + ["i64"]
             + ["i64"] * 6 + ["stream"])
HEAD_ARGS = 7


def example_args() -> list:
    """Placeholder launch arguments: compilation only needs their types."""
    import cuda.bindings.driver as cuda
    import cutlass
    i64, i32 = cutlass.Int64, cutlass.Int32
    return ([i64(0)] * 5 + [i32(0)] + [i64(0)] + [i32(128), i32(128), i32(128)] + [i64(0)] * 4
            + [i32(0)] * 7 + [i64(0)] + [i64(0)] * 6 + [cuda.CUstream(0)])


def host_target() -> str:
    """The CuTe DSL host-target option naming this machine; exporting a compiled kernel to
    an object file needs an explicit triple."""
    import platform
    machine = platform.machine()
    if machine in ("aarch64", "arm64"):
        return "linux-aarch64"
    return "'llvm -mtriple=x86_64-unknown-linux-gnu'"


def compile_variant(v: Variant, *, keep_ptx: bool = False, exportable: bool = False) -> Any:
    import cutlass.cute as cute
    opts = f"--gpu-arch {v.arch}"
    if exportable:
        opts += f" --host-target {host_target()}"
    if keep_ptx:
        import tempfile
        opts += f" --keep-ptx --dump-dir {tempfile.mkdtemp(prefix='rsar-ptx-')}"
    t0 = time.perf_counter()
    compiled = cute.compile(kernel_for(v), *example_args(), options=opts)
    log.info("compiled %s in %.2f s", v.describe(), time.perf_counter() - t0)
    return compiled


def compile_fast(v: Variant) -> Any:
    """The variant's launcher: from the on-disk cache when enabled, else compiled here."""
    from . import disk_cache
    from .fast_call import FastCall
    directory = disk_cache.cache_dir()
    compiled = None
    if directory is not None:
        t0 = time.perf_counter()
        compiled = disk_cache.load(v, directory)
        if compiled is not None:
            log.info("loaded %s from %s in %.3f s", v.describe(), directory,
                     time.perf_counter() - t0)
    if compiled is None:
        compiled = compile_variant(v, exportable=directory is not None)
        if directory is not None:
            try:
                disk_cache.store(v, compiled, directory)
            except OSError as e:  # a read-only cache is still a cache
                log.warning("could not store %s in %s: %s", v.describe(), directory, e)
    return FastCall(compiled, ARG_KINDS)


class KernelCache:
    def __init__(self, compile_fn: Callable[[Variant], Any] = compile_fast) -> None:
        self._compile = compile_fn
        self._lock = threading.Lock()
        self._done: dict[Variant, Any] = {}
        self.compile_count = 0

    def get(self, v: Variant) -> Any:
        with self._lock:
            fn = self._done.get(v)
            if fn is None:
                fn = self._compile(v)
                self._done[v] = fn
                self.compile_count += 1
                variant_log.record(v)
            return fn


CACHE = KernelCache()
