"""Side-by-side timing of GemmRsAr against cuBLAS + NCCL and torch symm_mem, one run.

    mpirun -n 2 python3 scripts/bench.py --json out.json --md out.md --png out.png
    mpirun -n 2 python3 scripts/bench.py --quick          # the first-numbers grid

Per shape (x: (M, K) and w: (N, K) on every rank), in the same processes:
  mm        torch.mm (cuBLAS)                 nccl_rs / nccl_ar  NCCL on a ready (M, N)
  mm_rs     torch.mm + NCCL reduce-scatter     mm_ar     torch.mm + NCCL all-reduce
  torch_rs  torch.ops.symm_mem.fused_matmul_reduce_scatter (multicast off)
  rsar_rs / rsar_ar  GemmRsAr                  gemm_only the same kernel, communication compiled out
  bound     max(min(mm, gemm_only), bytes sent per rank / measured peer bandwidth)
Median of --iters timed calls (CUDA events) after warm-up, taken in --blocks blocks: each block
times every column once, in an order drawn afresh for each block, so no column always runs
right after another (the GPUs run at power-capped clocks that follow what ran before; one
block per column once left the fused RS at the grid's last shape 5-17% slower than anywhere
else). Inputs rotate over sets that together exceed L2 several times. The calls are queued behind a GPU sleep, so each event pair
times GPU work only; the host's cost per call is the separate *_host column. torch_rs (which
blocks the host inside each call) is timed back to back instead.

``--dtype e4m3``: fp8 operands with fp32 scales (``--scales tensor``: one each, cuBLAS's
form; ``row``: per row of x and of w; ``block``: DeepSeek-style block-wise, x's per row and
128-element k-group, w's per 128 x 128 block) and bf16 results. ``mm`` is then
torch._scaled_mm (fast accumulation, as the tensor cores accumulate fp8 in the fused
kernel; block-wise: torch's BlockWise1x128 x BlockWise128x128 scaled_mm, which promotes
each k-group as the kernel does), ``mm_rs`` / ``mm_ar`` it followed by NCCL, and
``torch_rs`` torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter (not for block-wise
scales, which it does not take: n/a there); every GemmRsAr column takes the scales with
the inputs. Where the anchor raises at a shape (a torch build or shape its block-wise
scaled_mm does not take), ``mm`` / ``mm_rs`` / ``mm_ar`` are n/a there and the reason is
printed and kept in the row's ``anchor_error``. The link bound counts the bf16 result's
bytes as before.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from launch.rules import BAND_TILE_ROWS  # noqa: E402  (the checkout's package)

GRID = dict(N=[7168, 8192], K=[1024, 4096, 9216],
            M=[128, 256, 512, 1024, 2048, 4096, 8192, 16384])
QUICK = dict(N=[7168], K=[1024, 4096], M=[512, 2048, 8192])
L2_BYTES = 60 * 2**20
# torch symm_mem's fused op blocks the host inside every call, so no queue can form behind a
# GPU sleep (its per-call events then include host time either way): it is timed back to
# back, as a serving loop calling it would see it, in one block (in blocks of 10 calls its
# median at M <= 1024 doubled: ~400 against ~200 us).
HOST_SYNCED = {"torch_rs"}
# the columns the fp8 anchor (``rsar_core.reference.scaled_mm``) computes: n/a at a shape
# where it raises
ANCHORED = ("mm", "mm_rs", "mm_ar")
# columns with no form for block-wise fp8 scales (symm_mem's fused scaled matmul takes one
# scale each or one per row)
NO_BLOCK_SCALES = ("torch_rs",)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="N=7168, K in {1024,4096}, M in {512,2048,8192}")
    p.add_argument("--N", type=int, nargs="*")
    p.add_argument("--K", type=int, nargs="*")
    p.add_argument("--M", type=int, nargs="*")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--blocks", type=int, default=5,
                   help="split the timed calls of each column into this many blocks, "
                        "interleaved across columns in a fresh order each (1: one block per column)")
    p.add_argument("--skip", default="", help="comma list of columns not to time")
    p.add_argument("--only", default="", help="comma list of the only columns to time")
    p.add_argument("--gemm-sweep", action="store_true",
                   help="also time the GEMM alone under the sm90 tuning knobs "
                        "(sub-tile ring depth x band swizzle), as gemm_b<band>_s<slots>")
    p.add_argument("--plan-sweep", action="store_true",
                   help="also time GEMM alone, RS and AR with the 1-CTA and the 2x1-cluster "
                        "plan forced, as gemm_c<n> / rs_c<n> / ar_c<n> (thread-store pushes; "
                        "with the op's own push: rs_c<n>p / ar_c<n>p), the 1-CTA plan "
                        "without lag (rs_c1l0 / ar_c1l0), in the round order at "
                        "the plan's width (rs_rnd / ar_rnd), "
                        "in the peers-first order (rs_pf / ar_pf; thread-store pushes: rs_pflsu / "
                        "ar_pflsu), with P CTAs that only push (rs_pc8 / rs_pc16 / rs_pc24; "
                        "rs_flat: the flat order without them), with the exit without system "
                        "fences (rs_lean / ar_lean), the GEMM alone with its output stored "
                        "by threads, not TMA (gemm_ts0), on ping-pong warp groups "
                        "(gemm_pp160 / gemm_pp192; 1-CTA 128- / 160-wide: rs_pp128 / ar_pp128, "
                        "rs_pp160 / ar_pp160, against rs_bnW / ar_bnW), with 1-CTA tiles of each width "
                        "(rs_bnW / ar_bnW / gemm_bnW, W 64-256; 160 / 192 leave a partial "
                        "tile at N's edge where they do not divide N) and 64-wide "
                        "peers-first (rs_pf64 / ar_pf64), on 2x1 clusters "
                        "pairing tiles along N (gemm_pn / rs_pn / ar_pn; 64-wide: *_pn64), those "
                        "peers-first (rs_pnpf / ar_pnpf, *_pnpf64), the default plans without "
                        "programmatic dependent launch (gemm_nopdl / rs_nopdl / ar_nopdl), the "
                        "default plans with reductions loading each sub-tile on its own (rs_nopre / "
                        "ar_nopre), pushes with a tile's copies all in flight or one sub-tile's "
                        "at a time (rs_w0 / ar_w0, rs_w1 / ar_w1); at "
                        "world 2, AR on the push-all plan (ar_all; 64-wide: ar_all64; M <= "
                        "1024) and on the owner plan (ar_owner)")
    p.add_argument("--lean-exit", action="store_true",
                   help="run every fused column with the exit without system fences "
                        "(Tuning.lean_exit; an experiment until measured)")
    p.add_argument("--stages-sweep", action="store_true",
                   help="also time GEMM alone, RS and AR on the default plan with at least 4 "
                        "mainloop stages (the sub-tile ring shrinks to fit: BN 224 / 256), as "
                        "gemm_st4 / rs_st4 / ar_st4, and with 3 (the whole-tile ring: the "
                        "default before launch.cache.default_stages) as *_st3")
    p.add_argument("--shuffle", type=int, default=None, metavar="SEED",
                   help="time each shape's columns in a seeded random order (the same on every "
                        "rank), to tell a column's own time from an effect of what ran before it")
    p.add_argument("--dtype", choices=["bf16", "f16", "e4m3"], default="bf16",
                   help="element type of every column's inputs and outputs (default bf16; "
                        "e4m3: fp8 inputs with fp32 scales, bf16 outputs)")
    p.add_argument("--scales", choices=["tensor", "row", "block"], default="tensor",
                   help="with --dtype e4m3: one scale per operand (default), one per row "
                        "of x and of w, or block-wise (x per row and 128-element k-group, w "
                        "per 128 x 128 block; torch_rs is n/a)")
    p.add_argument("--bias", action="store_true",
                   help="also time each path with a bias of N elements: rank 0's GEMM adding "
                        "it before NCCL (torch.addmm, or scaled_mm's bias; vLLM's "
                        "RowParallelLinear: mm_rs_b / mm_ar_b) against GemmRsAr with bias= "
                        "(rsar_rs_b / rsar_ar_b), as rs_b_speedup / ar_b_speedup")
    p.add_argument("--json", dest="json_path")
    p.add_argument("--md", dest="md_path")
    p.add_argument("--png", dest="png_path")
    return p.parse_args()


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        from mpi4py import MPI
        import torch
        import torch.distributed as dist
        self.torch, self.dist, self.comm = torch, dist, MPI.COMM_WORLD
        self.rank, self.world = self.comm.Get_rank(), self.comm.Get_size()
        torch.cuda.set_device(self.rank % torch.cuda.device_count())
        self.dev = torch.device("cuda", torch.cuda.current_device())
        port = self.comm.bcast(_free_port() if self.rank == 0 else None)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}",
                                rank=self.rank, world_size=self.world, device_id=self.dev)
        self.group = dist.group.WORLD
        self.args = args
        from rsar_core.validate import IN_DTYPES, torch_dtype
        self.fp8 = args.dtype in IN_DTYPES.values()
        # the result's type; fp8 operands come with bf16 results
        self.dtype = torch.bfloat16 if self.fp8 else torch_dtype(args.dtype)
        self.input_dtype = torch.float8_e4m3fn if self.fp8 else None
        self.skip = set(filter(None, args.skip.split(",")))
        self.retried = 0  # timed blocks taken again because the stream ran dry (samples)
        self.only = set(filter(None, args.only.split(",")))

    # ---------------------------------------------------------------- timing
    def rank_median(self, ms: list[float]) -> tuple[float, float]:
        """(median microseconds, interquartile range in % of it) of a column's calls, the
        slower rank's: ranks can differ by launch skew, and a step waits for the slower."""
        return max(self.comm.allgather(spread(ms)))

    def samples(self, fn, sets: list, iters: int, warmup: int, queued: bool = True,
                first: int = 0) -> list[float]:
        """Milliseconds of each of ``iters`` calls (inputs from set ``first`` on)."""
        torch = self.torch
        for i in range(warmup):
            fn(*sets[i % len(sets)])
        torch.cuda.synchronize()
        self.comm.Barrier()
        # Hold the stream while the host queues every call: each event pair then brackets
        # GPU work only, not a host launch gap (which would dominate at small M for every
        # column alike; host cost per call is reported separately as *_host). Where the
        # GPU ended the sleep before the host had queued the last call on any rank, the
        # stream may have run dry: the block is taken again, with twice the sleep, up to
        # three times (docs/PERF.md (x): one-GPU timings read 2.5-3.5x slow that way).
        for attempt in range(4 if queued else 1):
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
            gate = torch.cuda.Event()
            if queued:
                torch.cuda._sleep(self.sleep_cycles(iters) << attempt)
                gate.record()
            for i in range(iters):
                s = sets[(first + i) % len(sets)]
                starts[i].record()
                fn(*s)
                ends[i].record()
            dry = queued and gate.query()
            torch.cuda.synchronize()
            if not queued or attempt == 3 or not any(self.comm.allgather(dry)):
                break  # the same attempt on every rank, so they agree on the allgather
            self.retried += 1
            self.comm.Barrier()
        return [a.elapsed_time(b) for a, b in zip(starts, ends)]

    def input_sets(self, M: int, N: int, K: int) -> list[tuple]:
        """This rank's input sets of a shape: (x, w), or for fp8 (x, w, x_scale, w_scale);
        enough that rotating through them leaves none in L2."""
        from rsar_core.reference import rank_fp8_inputs, rank_inputs
        size = 1 if self.fp8 else 2
        nsets = max(2, min(8, math.ceil(3 * L2_BYTES / ((M * K + N * K) * size))))
        if self.fp8:
            return [rank_fp8_inputs(1000 + i, self.rank, M, N, K, self.dev,
                                    per_row=self.args.scales == "row",
                                    block=self.args.scales == "block", m_major=True)
                    for i in range(nsets)]
        return [rank_inputs(1000 + i, self.rank, M, N, K, self.dev, dtype=self.dtype)
                for i in range(nsets)]

    def sleep_cycles(self, iters: int) -> int:
        """GPU clock cycles that outlast the host enqueueing ``iters`` calls (~150 us each
        at most, NCCL included)."""
        return int(iters * 150e-6 * 2.0e9) + 2_000_000  # at up to 2 GHz

    def host_time(self, fn, sets: list, n: int = 100) -> float:
        """CPU microseconds per call: what a caller pays before the GPU sees the launch."""
        torch = self.torch
        torch.cuda.synchronize()
        self.comm.Barrier()
        t0 = time.perf_counter()
        for i in range(n):
            fn(*sets[i % len(sets)])
        dt = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
        return max(self.comm.allgather(dt))

    def peer_bandwidth(self) -> float:
        """GB/s of a 1 GiB copy from this GPU into the next rank's GPU (rank 0 measures)."""
        torch = self.torch
        gbps = 0.0
        if self.rank == 0 and torch.cuda.device_count() > 1:
            n = 2**30
            src = torch.empty(n, dtype=torch.uint8, device=self.dev)
            dst = torch.empty(n, dtype=torch.uint8, device=torch.device("cuda", 1))
            for _ in range(3):
                dst.copy_(src)
            torch.cuda.synchronize()
            t = []
            for _ in range(10):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                dst.copy_(src)
                b.record()
                b.synchronize()
                t.append(a.elapsed_time(b) / 1e3)
            gbps = n / statistics.median(t) / 1e9
            del src, dst
            torch.cuda.empty_cache()
        return self.comm.bcast(gbps)

    # ---------------------------------------------------------------- one shape
    def shape(self, M: int, N: int, K: int, ops: dict, bw: float) -> dict:
        torch, dist = self.torch, self.dist
        W = self.world
        Mp = -(-M // W) * W
        dt = self.dtype
        sets = self.input_sets(M, N, K)
        padded = [_pad_rows(s, Mp) for s in sets]
        full = torch.randn(Mp, N, device=self.dev).to(dt)
        rs_out = torch.empty(Mp // W, N, dtype=dt, device=self.dev)
        it, wu = self.args.iters, self.args.warmup
        if self.fp8:
            from rsar_core.reference import scaled_mm

            def product(*inputs):
                return scaled_mm(*inputs, dt)
        else:
            def product(x, w):
                return torch.mm(x, w.t())

        def mm_rs(*a):
            dist.reduce_scatter_tensor(rs_out, product(*a))

        def mm_ar(*a):
            dist.all_reduce(product(*a))

        group = self.group.group_name
        if self.fp8:
            def torch_rs(x, w, sx, sw):
                return torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter(
                    x, w.t(), sx, sw.reshape(1, -1) if sw.numel() > 1 else sw, "sum", 0, 0,
                    group, [Mp, N], None, None, dt, True)
        else:
            def torch_rs(x, w):
                return torch.ops.symm_mem.fused_matmul_reduce_scatter(x, w.t(), "sum", 0, group)

        cols = {
            "mm": (product, sets),
            "nccl_rs": (lambda *a: dist.reduce_scatter_tensor(rs_out, full), sets),
            "nccl_ar": (lambda *a: dist.all_reduce(full[:M]), sets),
            "mm_rs": (mm_rs, padded),
            "mm_ar": (mm_ar, sets),
            "torch_rs": (torch_rs, padded),
            "rsar_rs": (ops["rs"], sets),
            "rsar_ar": (ops["ar"], sets),
            "gemm_only": (ops["rs"].gemm_only, sets),
        }
        if self.args.bias:
            g = torch.Generator(device=self.dev)
            g.manual_seed(N)  # every rank the same bias
            bias = torch.randn(N, generator=g, device=self.dev).to(dt)
            if self.fp8:
                def product_b(*a):  # rank 0 adds it to its partial
                    return product(*a).add_(bias) if self.rank == 0 else product(*a)
            else:
                def product_b(x, w):  # vLLM's RowParallelLinear: rank 0's GEMM adds it
                    return torch.addmm(bias, x, w.t()) if self.rank == 0 else product(x, w)

            def mm_rs_b(*a):
                dist.reduce_scatter_tensor(rs_out, product_b(*a))

            def mm_ar_b(*a):
                dist.all_reduce(product_b(*a))

            cols["mm_rs_b"] = (mm_rs_b, padded)
            cols["mm_ar_b"] = (mm_ar_b, sets)
            cols["rsar_rs_b"] = (lambda *a: ops["rs"](*a, bias=bias), sets)
            cols["rsar_ar_b"] = (lambda *a: ops["ar"](*a, bias=bias), sets)
        anchor_why = None
        if self.fp8:
            # the anchor's columns where torch runs these scales at this shape (every rank
            # drops the same ones: the reason any rank met)
            from rsar_core.reference import call_refusal
            whys = self.comm.allgather(call_refusal(product, *sets[0]))
            anchor_why = next((w for w in whys if w), None)
            for name in na_columns(self.args.scales == "block", anchor_why):
                del cols[name]
            if anchor_why and self.rank == 0:
                print(f"  fp8 anchor n/a at M={M} N={N} K={K}: {anchor_why}", file=sys.stderr)
        if self.args.gemm_sweep:
            for band in (0, 8, 16, 32):
                for slots in (0, 2):
                    if band != BAND_TILE_ROWS or slots:
                        cols[f"gemm_b{band}_s{slots}"] = (
                            _with(ops["rs"], ops["rs"].gemm_only, band=band, epi_slots=slots),
                            sets)
        if self.args.plan_sweep:
            for cg in (1, 2):
                cols[f"gemm_c{cg}"] = (_forced(ops["rs"], cg, None, ops["rs"].gemm_only), sets)
                cols[f"rs_c{cg}"] = (_forced(ops["rs"], cg, None, ops["rs"]), sets)
                cols[f"ar_c{cg}"] = (_forced(ops["ar"], cg, None, ops["ar"]), sets)
                for m in ("rs", "ar"):  # the same with the op's own push (bulk copies)
                    cols[f"{m}_c{cg}p"] = (_forced(ops[m], cg, None, ops[m], push=None),
                                           sets)
            for band in (4, 8):  # 2x1 clusters walking bands of pair-tile rows (L2 reuse)
                cols[f"gemm_c2_b{band}"] = (_forced(
                    ops["rs"], 2, None, lambda *a, b=band: ops["rs"].gemm_only(*a, band=b),
                    push=None), sets)
            for m, fn in (("gemm", ops["rs"].gemm_only), ("rs", ops["rs"]), ("ar", ops["ar"])):
                for band in (0, 8, 32):  # the default plan in other tile orders (0: row-major)
                    cols[f"{m}_b{band}"] = (_with(ops[m if m != "gemm" else "rs"], fn,
                                                  band=band), sets)
            for m in ("rs", "ar"):  # 2x1 clusters with the lag round (pair-aligned owners only)
                cols[f"{m}_c2l1"] = (_forced(ops[m], 2, 1, ops[m], push=None), sets)
                cols[f"{m}_c2l0"] = (_forced(ops[m], 2, 0, ops[m], push=None), sets)
            cols["rs_c1l0"] = (_forced(ops["rs"], 1, 0, ops["rs"]), sets)
            cols["ar_c1l0"] = (_forced(ops["ar"], 1, 0, ops["ar"]), sets)
            for cg in (1, 2):
                cols[f"rs_c{cg}tma"] = (_forced(ops["rs"], cg, None, ops["rs"], push="tma"), sets)
                cols[f"ar_c{cg}tma"] = (_forced(ops["ar"], cg, None, ops["ar"], push="tma"), sets)
            cols["gemm_tma"] = (_forced(ops["rs"], 1, None, ops["rs"].gemm_only, push="tma"), sets)
            cols["ar_c1tmaall"] = (_forced(ops["ar"], 1, None, ops["ar"], push="tma_all"), sets)
            for m in ("rs", "ar"):
                # the round order at the width the plan picks (the default beyond small M)
                cols[f"{m}_rnd"] = (_forced(ops[m], None, None, ops[m], push=None,
                                            peers_first=False), sets)
                cols[f"{m}_pf"] = (_forced(ops[m], 1, None, ops[m], push=None,
                                           peers_first=True), sets)
                cols[f"{m}_pflsu"] = (_forced(ops[m], 1, None, ops[m], push="lsu",
                                              peers_first=True), sets)
                # the peers-first order as one flat sequence, forced on and off
                cols[f"{m}_pff"] = (_with(ops[m], ops[m], flat=True), sets)
                cols[f"{m}_nopff"] = (_with(ops[m], ops[m], flat=False), sets)
                # and with the split-K tail; the split-K rule off
                cols[f"{m}_sk"] = (_with(ops[m], ops[m], flat=True, sk=True), sets)
                cols[f"{m}_nosk"] = (_with(ops[m], ops[m], sk=False), sets)
            # RS round orders: a shared tile row split between two lists, forced on and off
            cols["rs_split"] = (_with(ops["rs"], ops["rs"], split_row=True), sets)
            cols["rs_rows"] = (_with(ops["rs"], ops["rs"], split_row=False), sets)
            # RS with P CTAs that only push (launch.plan.push_plan), and the flat order
            # they run on the other CTAs without them
            for P in (8, 16, 24):
                cols[f"rs_pc{P}"] = (_with(ops["rs"], ops["rs"], push_ctas=P), sets)
            cols["rs_flat"] = (_with(ops["rs"], ops["rs"], flat=True, sk=False),
                               sets)
            # the GEMM alone with its output stored by the communication threads, not by TMA
            cols["gemm_ts0"] = (_with(ops["rs"], ops["rs"].gemm_only, tma_store=False),
                                sets)
            # the GEMM alone on ping-pong warp groups, 160 / 192 wide (docs/PERF.md (af))
            for bn in (160, 192):
                cols[f"gemm_pp{bn}"] = (_with(ops["rs"], ops["rs"].gemm_only, bn=bn,
                                              pingpong=True), sets)
            # the exit without system fences or done stamps (launch.protocol.finish_launch)
            for m in ("rs", "ar"):
                cols[f"{m}_lean"] = (_with(ops[m], ops[m], lean_exit=True), sets)
            for m in ("rs", "ar"):
                cols[f"{m}_bn64"] = (_forced(ops[m], 1, None, ops[m], push=None, bn=64), sets)
                cols[f"{m}_pf64"] = (_forced(ops[m], 1, None, ops[m], push=None,
                                             peers_first=True, bn=64), sets)
                cols[f"{m}_pf128"] = (_forced(ops[m], 1, None, ops[m], push=None,
                                              peers_first=True, bn=128), sets)
                for bn in (128, 160, 192, 224, 256):
                    cols[f"{m}_bn{bn}"] = (_forced(ops[m], 1, None, ops[m], push=None,
                                                   bn=bn), sets)
                # ping-pong warp groups on the same 1-CTA plans (launch.pingpong)
                for bn in (128, 160):
                    cols[f"{m}_pp{bn}"] = (_forced(ops[m], 1, None, ops[m], push=None,
                                                   bn=bn, pingpong=True), sets)
            cols["gemm_sk"] = (_with(ops["rs"], ops["rs"].gemm_only, sk=True), sets)
            for bn in (128, 256):
                cols[f"gemm_sk{bn}"] = (_with(ops["rs"], ops["rs"].gemm_only, sk=True,
                                              bn=bn), sets)
            for bn in (64, 128, 160, 192, 224, 256):
                cols[f"gemm_bn{bn}"] = (_forced(ops["rs"], 1, None, ops["rs"].gemm_only,
                                                push=None, bn=bn), sets)
            for m, fn in (("gemm", ops["rs"].gemm_only), ("rs", ops["rs"]), ("ar", ops["ar"])):
                # pairs along N (2x1 clusters sharing x's tile), at the plan's width and 64 wide
                op = ops[m if m != "gemm" else "rs"]
                cols[f"{m}_pn"] = (_forced(op, None, None, fn, push=None, peers_first=None,
                                           pair_n=True), sets)
                cols[f"{m}_pn64"] = (_forced(op, None, None, fn, push=None, peers_first=None,
                                             bn=64, pair_n=True), sets)
                if m != "gemm":  # and peers-first (a plan where no pair straddles two owners)
                    cols[f"{m}_pnpf"] = (_forced(op, None, None, fn, push=None,
                                                 peers_first=True, pair_n=True), sets)
                    cols[f"{m}_pnpf64"] = (_forced(op, None, None, fn, push=None,
                                                   peers_first=True, bn=64, pair_n=True), sets)
            # AR copying each pushed tile's result back two rounds after the push (lag-round plans)
            cols["ar_early"] = (_with(ops["ar"], ops["ar"], early_copy=True), sets)
            # reductions loading every sub-tile on its own (the default loads one ahead)
            for m in ("rs", "ar"):
                cols[f"{m}_nopre"] = (_with(ops[m], ops[m], prefetch=False), sets)
            # a tile's push copies all in flight (w0) or one sub-tile's at a time (w1)
            for m in ("rs", "ar"):
                for on in (False, True):
                    cols[f"{m}_w{int(on)}"] = (_with(ops[m], ops[m], push_window=on), sets)
            # the default plans without programmatic dependent launch (on by default, sm90)
            for m, fn in (("gemm", ops["rs"].gemm_only), ("rs", ops["rs"]), ("ar", ops["ar"])):
                cols[f"{m}_nopdl"] = (_with(ops[m if m != "gemm" else "rs"], fn,
                                            pdl=False), sets)
        if self.args.plan_sweep and W == 2:
            from launch.geometry import PUSH_ALL_MAX_M
            if M <= PUSH_ALL_MAX_M:
                # push-all AR: every tile to the other rank, reduced on both; and the owner
                # plan where push-all is the default (``choose_push_all``)
                cols["ar_all"] = (_with(ops["ar"], ops["ar"], push_all=True), sets)
                cols["ar_owner"] = (_with(ops["ar"], ops["ar"], push_all=False), sets)
                cols["ar_all64"] = (_with(ops["ar"], ops["ar"], push_all=True,
                                          bn=64), sets)
        if self.args.stages_sweep:
            for m, fn in (("gemm", ops["rs"].gemm_only), ("rs", ops["rs"]), ("ar", ops["ar"])):
                for st in (3, 4):
                    cols[f"{m}_st{st}"] = (_with(ops[m if m != "gemm" else "rs"], fn,
                                                 stages=st), sets)
        names = [n for n in cols if n not in self.skip and (not self.only or n in self.only)]
        absent = sorted(self.only - set(cols))
        if absent and self.rank == 0:  # a misspelt name, a sweep flag left out, or M-bound
            print(f"  --only names no column at M={M} N={N} K={K}: {', '.join(absent)}",
                  file=sys.stderr)
        blocks = max(1, min(self.args.blocks, it))
        ms: dict[str, list[float]] = {n: [] for n in names}
        for b in range(blocks):
            per = it // blocks + (b < it % blocks)
            for name in column_order(names, self.args.shuffle, M, N, K, block=b):
                synced = name in HOST_SYNCED
                if name not in ms or (synced and b):
                    continue
                fn, s = cols[name]
                try:
                    # a host-synced op runs back to back, all its calls at once (see HOST_SYNCED)
                    ms[name] += self.samples(fn, s, it if synced else per, wu if b == 0 else 2,
                                             queued=not synced, first=len(ms[name]))
                except Exception as e:  # an anchor that cannot run here is reported, not fatal
                    del ms[name]
                    if self.rank == 0:
                        print(f"  {name} failed at M={M} N={N} K={K}: {type(e).__name__}: {e}",
                              file=sys.stderr)
        # every rank takes the same columns through rank_median's allgather, in one order
        stats = {name: self.rank_median(v) for name, v in ms.items()}
        t = {name: us for name, (us, _) in stats.items()}
        for name in ("rsar_rs", "mm_rs"):
            if name in t:
                t[name + "_host"] = self.host_time(cols[name][0], cols[name][1])
        for op in ops.values():
            op.check()
        gemm_best = min((v for k, v in t.items() if k in ("mm", "gemm_only")), default=0.0)
        rs_bytes = M * N * 2 * (W - 1) / W
        link_rs = rs_bytes / (bw * 1e9) * 1e6 if bw else 0.0
        row = dict(M=M, N=N, K=K, world=W, dtype=self.args.dtype, us=t, peer_gbps=bw,
                   bound_rs=max(gemm_best, link_rs), bound_ar=max(gemm_best, 2 * link_rs))
        if self.fp8:
            row["scales"] = self.args.scales
            if anchor_why:
                row["anchor_error"] = anchor_why
        row["ratios"] = _ratios(t, row)
        row["iqr_pct"] = {name: iqr for name, (_, iqr) in stats.items()}
        return row

    def run(self) -> list[dict]:
        from rsar_core import GemmRsAr, Tuning
        a = self.args
        grid = dict(QUICK if a.quick else GRID)
        for k in ("N", "K", "M"):
            if getattr(a, k):
                grid[k] = getattr(a, k)
        try:
            import warnings
            import torch.distributed._symmetric_memory as symm
            with warnings.catch_warnings():  # needed on older torch, a no-op on newer
                warnings.simplefilter("ignore", FutureWarning)
                symm.enable_symm_mem_for_group(self.group.group_name)
        except Exception as e:
            if self.rank == 0:
                print(f"torch symm_mem unavailable: {e}", file=sys.stderr)
        bw = self.peer_bandwidth()
        rows = []
        total = len(grid["N"]) * len(grid["K"]) * len(grid["M"])
        t0 = time.time()
        for N in grid["N"]:
            # --lean-exit: every fused column, forced ones too
            tuning = Tuning(lean_exit=True) if self.args.lean_exit else None
            ops = {m: GemmRsAr(max_M=max(grid["M"]), N=N, all_reduce=(m == "ar"), comm=self.comm,
                               dtype=self.dtype, input_dtype=self.input_dtype, tuning=tuning)
                   for m in ("rs", "ar")}
            if self.rank == 0:
                print(f"{ops['rs'].arch}: {ops['rs'].sm_count} SMs, {ops['rs'].pair_ctas} CTAs "
                      f"resident as 2x1 clusters", file=sys.stderr, flush=True)
            for K in grid["K"]:
                for M in grid["M"]:
                    rows.append(self.shape(M, N, K, ops, bw))
                    if self.rank == 0 and self.args.json_path:  # a cut-short sweep keeps its rows
                        Path(self.args.json_path).write_text(json.dumps(rows, indent=1))
                    if self.rank == 0:
                        r = rows[-1]["ratios"]
                        print(f"[{len(rows)}/{total} {time.time() - t0:.0f}s] M={M} N={N} K={K} "
                              f"rs x{r.get('rs_speedup', float('nan')):.2f} "
                              f"ar x{r.get('ar_speedup', float('nan')):.2f}",
                              file=sys.stderr, flush=True)
            for op in [*_RETUNED.values(), *ops.values()]:
                op.close()
            _RETUNED.clear()
        return rows


def _forced(op, cta_group: int | None, lag: int | None, fn,
            push: str | None = "lsu", peers_first: bool | None = False, bn: int | None = None,
            pair_n: bool = False, **more):
    """fn on op with its plan forced (1-CTA tiles or 2x1 clusters, pairs along M or N; the
    lag; the peers-first order; the tile width; how partials are pushed, None: the op's
    default; ``more`` Tuning fields, ``pingpong=True`` say)."""
    return _with(op, fn, cta_group=cta_group, lag=lag, push=push,
                 peers_first=peers_first, bn=bn, pair_n=pair_n, **more)


# Retuned ops by (op, Tuning fields): one per column and op, built when the column first is
# (construction is collective: every rank builds its columns in the same order)
_RETUNED: dict = {}


def _with(op, fn, **knobs):
    """fn (``op`` itself, or one of its methods such as ``gemm_only``) on ``op.retune(**knobs)``,
    ``knobs`` being ``Tuning`` fields; the retuned op shares op's workspace."""
    key = (op, tuple(sorted(knobs.items())))
    tuned = _RETUNED.get(key)
    if tuned is None:
        tuned = _RETUNED[key] = op.retune(**knobs)
    if fn is op:
        return tuned
    return getattr(tuned, fn.__name__)


def na_columns(block: bool, anchor_why: str | None) -> list[str]:
    """The columns an fp8 shape leaves out: those with no block-wise form (``block``), and
    the anchor's where it raised (``anchor_why``)."""
    return list(NO_BLOCK_SCALES if block else ()) + list(ANCHORED if anchor_why else ())


def _pad_rows(inputs: tuple, Mp: int) -> tuple:
    """An input set with x (and a per-row or block-wise x_scale) padded with zero rows to
    ``Mp``: what the unfused reduce-scatter and torch's fused op take (M a multiple of the
    world size)."""
    import torch
    x, w, *scales = inputs
    pad = Mp - x.shape[0]
    x = torch.nn.functional.pad(x, (0, 0, 0, pad))
    if scales and scales[0].numel() > 1:
        s0 = scales[0]
        scales[0] = torch.nn.functional.pad(s0, (0, 0, 0, pad), value=1.0)
        if s0.dim() == 2 and s0.shape[1] > 1 and s0.stride(0) == 1:
            # block-wise scales in torch's M-major layout keep it: no copy in the anchor
            scales[0] = scales[0].t().contiguous().t()
    return (x, w, *scales)


def spread(ms: list[float]) -> tuple[float, float]:
    """(median in microseconds, interquartile range in % of the median) of per-call ms."""
    med = statistics.median(ms)
    if len(ms) < 4:
        return med * 1e3, 0.0
    q1, _, q3 = statistics.quantiles(ms, n=4)
    return med * 1e3, round(100.0 * (q3 - q1) / med, 2) if med > 0 else 0.0


def column_order(names: list[str], seed: int | None, M: int, N: int, K: int, *,
                 block: int = 0) -> list[str]:
    """The order a shape's columns are timed in, in its block ``block``: the first block as
    listed, or (``--shuffle``) a permutation drawn from the seed and the shape; every later
    block a permutation of its own. Drawn from the seed, shape and block only, so every rank
    runs the collectives alike."""
    names = list(names)
    if seed is not None or block:
        random.Random(f"{seed}:{M}:{N}:{K}:{block}").shuffle(names)
    return names


def _ratios(t: dict, row: dict) -> dict:
    r = {}

    def ratio(name, a, b):
        if a in t and b in t and t[b] > 0:
            r[name] = t[a] / t[b]
    ratio("rs_speedup", "mm_rs", "rsar_rs")
    ratio("ar_speedup", "mm_ar", "rsar_ar")
    ratio("vs_torch_rs", "torch_rs", "rsar_rs")
    ratio("gemm_vs_cublas", "mm", "gemm_only")
    ratio("rs_b_speedup", "mm_rs_b", "rsar_rs_b")
    ratio("ar_b_speedup", "mm_ar_b", "rsar_ar_b")
    tuned = {k: v for k, v in t.items() if k.startswith("gemm_b")}
    if tuned and "mm" in t:
        best = min(tuned, key=tuned.get)
        r["best_tuned_vs_cublas"] = t["mm"] / tuned[best]
        r["best_tuned"] = best
    if "rsar_rs" in t and row["bound_rs"] > 0:  # no bound without a GEMM column or the link
        r["rs_over_bound"] = t["rsar_rs"] / row["bound_rs"]
    if "rsar_ar" in t and row["bound_ar"] > 0:
        r["ar_over_bound"] = t["rsar_ar"] / row["bound_ar"]
    return r


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


COLS = ["mm", "nccl_rs", "nccl_ar", "mm_rs", "mm_ar", "torch_rs", "gemm_only", "rsar_rs", "rsar_ar",
        "rsar_rs_host", "mm_rs_host"]
RATIOS = ["rs_speedup", "ar_speedup", "vs_torch_rs", "gemm_vs_cublas", "rs_over_bound", "ar_over_bound"]


def markdown(rows: list[dict]) -> str:
    head = "| M | N | K | " + " | ".join(COLS) + " | bound_rs | " + " | ".join(RATIOS) + " |"
    lines = [head, "|" + "---|" * (4 + len(COLS) + len(RATIOS))]
    for r in rows:
        cells = [str(r["M"]), str(r["N"]), str(r["K"])]
        cells += [f"{r['us'][c]:.1f}" if c in r["us"] else "-" for c in COLS]
        cells += [f"{r['bound_rs']:.1f}"]
        cells += [f"{r['ratios'][c]:.2f}" if c in r["ratios"] else "-" for c in RATIOS]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for c in RATIOS:
        lines.append(f"- geomean {c}: {geomean([r['ratios'].get(c) for r in rows]):.3f}")
    for c in ("rs_b_speedup", "ar_b_speedup"):  # --bias: each path with its bias added
        if any(c in r["ratios"] for r in rows):
            lines.append(f"- geomean {c} (with a bias): "
                         f"{geomean([r['ratios'].get(c) for r in rows]):.3f}")
    for r in rows:  # fp8 shapes torch's scaled_mm refused: its columns read "-"
        if r.get("anchor_error"):
            lines.append(f"- M={r['M']} N={r['N']} K={r['K']}: fp8 anchor n/a "
                         f"({r['anchor_error']})")
    iqr: dict[str, list[float]] = {}
    for r in rows:
        for c, v in r.get("iqr_pct", {}).items():
            iqr.setdefault(c, []).append(v)
    if iqr:  # the spread of calls within a column: how far apart two columns must be to count
        lines.append("- interquartile range of the calls, % of the median (median over shapes): "
                     + ", ".join(f"{c} {statistics.median(v):.1f}" for c, v in iqr.items()))
    seen = [k for r in rows for k in r["us"]]
    forced = [c for c in dict.fromkeys(seen) if c not in COLS and not c.startswith("gemm_b")
              and not c.endswith("_host")]
    forced = ["mm"] + forced if forced else []
    if forced:
        lines += ["", "Plan sweep (us): c1 / c2 1-CTA or 2x1-cluster plans, l0 no lag, "
                  "tma / tmaall bulk-copy pushes, pf peers-first, bn64 64-wide tiles, "
                  "b<n> bands of n unit rows (b0: row-major), rnd the round order, pn pairs "
                  "along N (pn64: 64-wide; pnpf: peers-first):", "",
                  "| M | N | K | " + " | ".join(forced) + " |", "|" + "---|" * (3 + len(forced))]
        for r in rows:
            cells = [str(r["M"]), str(r["N"]), str(r["K"])]
            cells += [f"{r['us'][c]:.1f}" if c in r["us"] else "-" for c in forced]
            lines.append("| " + " | ".join(cells) + " |")
    tuned = sorted({k for r in rows for k in r["us"] if k.startswith("gemm_b")})
    if tuned:
        lines += ["", "GEMM alone under the tuning knobs (us; b = band rows, s = ring slots, "
                  "0 = default):", "",
                  "| M | N | K | mm | gemm_only | " + " | ".join(tuned) + " | best vs cuBLAS |",
                  "|" + "---|" * (6 + len(tuned))]
        for r in rows:
            u = r["us"]
            cells = [str(r["M"]), str(r["N"]), str(r["K"])]
            cells += [f"{u[c]:.1f}" if c in u else "-" for c in ["mm", "gemm_only"] + tuned]
            best = r["ratios"].get("best_tuned_vs_cublas")
            cells.append(f"{best:.2f} ({r['ratios']['best_tuned']})" if best else "-")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, key, title in ((axes[0], "rs_speedup", "RS"), (axes[1], "ar_speedup", "AR")):
        for N in sorted({r["N"] for r in rows}):
            for K in sorted({r["K"] for r in rows}):
                pts = [(r["M"], r["ratios"][key]) for r in rows
                       if r["N"] == N and r["K"] == K and key in r["ratios"]]
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=f"N={N} K={K}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M")
        ax.set_title(f"GemmRsAr {title}: speedup over torch.mm + NCCL")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("speedup (x)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    args = parse()
    b = Bench(args)
    rows = b.run()
    if b.rank == 0:
        md = markdown(rows)
        print(md)
        if b.retried:
            print(f"{b.retried} timed blocks were taken again: the GPU had run out of queued "
                  "calls", file=sys.stderr)
        if args.json_path:
            Path(args.json_path).write_text(json.dumps(rows, indent=1))
        if args.md_path:
            Path(args.md_path).write_text(md)
        if args.png_path:
            plot(rows, args.png_path)
    b.dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
