#!/usr/bin/env bash
# The GPU runs of a performance session, each under a time limit, logs and results in OUTDIR:
#
#   scripts/gpu_runs.sh OUTDIR STEP...
#
#   cache   the kernels of the bf16 steps (sweep, grid, checks, gemm1, new): the default
#           variants with and without a bias and every variant tests/gpu/variants.jsonl logged,
#           built on this machine's cores into the ignored kcache/ (or RSAR_KERNEL_CACHE), which
#           later steps of this call use and the machine keeps between calls while it stays
#           warm (481 variants, ~3 min on 16 cores)
#   cache-all  the same for every dtype (fp16, fp8, block-wise fp8 too), before fp8 (713
#           variants, ~4.5 min)
#   sweep1, sweep2  (2 GPUs) the open decisions, timed in one run against their anchors: the
#           exit without system fences (rs_lean / ar_lean), push CTAs (rs_flat,
#           rs_pc8/16/24) and the GEMM alone's TMA store (gemm_ts0: the thread copy-out), in
#           two seeded column orders (bench.py --plan-sweep --shuffle); sweep: both
#   grid    (2 GPUs) the issue's grid, N 7168 / 8192: grid.json, grid.md, grid.png
#   checks  every GPU test suite (tests/gpu/run_all.sh OUTDIR/checks); on a one-GPU host
#           with RSAR_ALLOW_SHARED_GPU=1 (functional only)
#   gemm1   (1 GPU) the GEMM alone against cuBLAS on the grid's 48 shapes (gemm_one_gpu.py,
#           calls interleaved, three blocks)
#   grid-calls  (1 GPU) the same 48 shapes, five blocks: each block's ratio in the JSON
#           (block_ratios) and the log
#   grid-blocks  (1 GPU) the same in the method before (as) (--interleave blocks), five blocks
#   xloads  (1 GPU) the GEMM alone at M 1-64 (N 2880 / 5120 / 7168 / 8192, K 1024 / 4096 /
#           9216): the default plans against x's whole-tile box (xb0) and the one round cut
#           along K or not (sk, sk0); the kernels built first on every core
#   xloads-checks  (1 GPU) tests/gpu/test_x_loads_gpu.py (with RSAR_ALLOW_SHARED_GPU=1 on
#           one GPU), then ncu's L2-slice max / mean at M=1 and 64 with and without the box
#   small-m (1 GPU) the GEMM alone at two tile rows (M 129 / 160 / 192 / 256, N 2880 / 5120 /
#           7168 / 8192, K 1024 / 4096 / 9216): the default plans against the 1-CTA tiles
#           (c1, c1+bn112: the plans choose_gemm_pairs_full_round replaced at K=1024) and 64-row tiles
#           (bm64: a 64-row rule at M 129-192, +9..+18% at M=192 K=1024 in one run, (ai))
#   tails   (1 GPU) the GEMM alone where the last tile row is partial (M 129 / 160 / 192 / 200 /
#           300 / 520 / 1000 / 1100 / 3000, N 2880 / 5120 / 7168 / 8192, K 1024 / 4096 / 9216):
#           the default plans, with and without the last row's box of x (xb0), on 1-CTA tiles
#           (c1, c1+xb0) and on 2x1 clusters without and with the box (c2, c2+xb: the pairs'
#           box runs only where asked until this times it)
#   mid-m   (1 GPU) the GEMM alone at three to nine tile rows off the powers of two (M 300 /
#           520 / 640 / 1100, N 5120 / 7168 / 8192, K 4096 / 9216; 520 x 8192 x 4096 ran 0.45x
#           cuBLAS, 512 0.99x): the default plans with and without x's box (xb0), the
#           split-K tail on 1-CTA plans (c1+bnW+sk: the last round's units cut along K onto
#           its idle SMs, widths 256 / 224 / 176) and 256-wide tiles either way
#   mid-sweep  (1 GPU) the shapes a rule for the split-K tail and the pairs' box needs (M
#           264-2600, 20 values with last tile rows of 8-128 rows, N 2880 / 5120 / 7168 / 8192,
#           K 4096 / 9216): the default plans against the 1-CTA split-K tail at 256 / 224 wide
#           and against 2x1 clusters with the box (c2+xb)
#   mid-widths  (1 GPU) the same 160 shapes: the default plans against 1-CTA tiles at 256 /
#           224 / 192 / 160 wide (partial tiles at N's edge too), which the plan chooser
#           weighs against pairs only at widths dividing N (``_gemm_one_cta_if_cheaper``)
#   partial-width  (1 GPU) where ``choose_gemm_partial_width`` moves a plan (N=5120, M
#           1025-1152, K 4096 / 9216, and K=2048 at two M): the default plans against the
#           128-wide 1-CTA plans they replaced and 224 wide
#   stages  (1 GPU) four mainloop stages behind a ring shorter than the tile (PERF.md (ao)):
#           where the rule takes them (224 / 256 wide, K=1024, M 512-2048) against three
#           (stages3) and on 2x1 clusters (c2+stages4: half w's L2 bytes); from K=4096 (M
#           512-16384, where two runs disagreed) the default against stages4 and c1+stages4,
#           five interleaved blocks a shape
#   pp-stages  (1 GPU) the ping-pong rule's shapes (M 4096-16384, N 7168 / 8192, K=1024):
#           the default (176 / 192 wide, 5 stages behind a short ring since (ap)) against
#           both widths at the kernel's 4 (c2+bnW+pp) and at 5 (c2+bnW+pp+stages5)
#   pp-mid  (1 GPU) ping-pong where its rounds fill about as well as the cooperative plan's
#           (M 1536-3072, N 7168 / 8192, K 1024 / 4096 / 9216; at 2048 x 7168 it won in three
#           sessions by ~2%): the default plans against 2x1-cluster ping-pong 176 / 192 wide at
#           five stages, for a rule on the ratio of their lane costs
#   pp-rule  (1 GPU) every K=1024 shape of M 1280-8192, N 2880 / 5120 / 7168 / 8192 whose
#           plan ``choose_gemm_pingpong``'s lane-cost rule (aq) moved, and the two it left
#           cooperative at a ratio near its bound (1536 x 7168, 2560 x 8192): the default plans
#           against the cooperative plan (pp0) and 2x1-cluster ping-pong 192 wide at 5 stages
#   pp-coop  (1 GPU) shapes past M=4096 the rule (aq) moved back to the cooperative plan
#           (lane-cost ratio 1.12-1.19): the default against the ping-pong plans they ran
#           before (192 wide at 5 stages; 160 at 4992 x 5120)
#   rows64-pairs  (1 GPU) 64-row tiles on 2x1 clusters along M sharing w's tile (cuBLAS's form
#           at 128 x 7168: 64 x 112 tiles, 1x2 clusters, 9 stages) at M 64-256, N 2880 / 5120 /
#           7168 / 8192, K 1024 / 4096 / 9216: the default plans against bm64+c2 at 64 / 112 /
#           128 wide
#   rows64-rule  (1 GPU) ``choose_gemm_rows64_pairs``' plans (M 80 / 100 / 128, N 2880 / 5120
#           / 7168 / 8192, K 1024 / 4096 / 9216) against the 128-row plans they replaced
#           (bm128), five interleaved blocks a shape
#   pn-cublas  (1 GPU) cuBLAS's form at M 256 / 512 (Nsight Compute, PERF.md (aq): 128 x 112
#           tiles on 2x1 clusters along N sharing x, 7 stages) against the default (pairs
#           along M sharing w): pairs along N 112 / 128 wide at the kernel's stages and at 7,
#           and the default's pairs at 7 stages, both pairs at 7 stages with ping-pong warp
#           groups (M=512: two rounds of 112-wide pairs, one group's epilogue under the other's
#           mainloop), M 256 / 512, N 7168 / 8192, K 1024 / 4096 / 9216, five blocks a shape
#   one-round-widths  (1 GPU) one-round 1-CTA plans at N 2880 / 5120 (3072 too), K 4096 / 9216: the
#           default (``choose_gemm_one_round_width`` since (as): the width of fewest modelled
#           L2 reads) against every 1-CTA width 112-224, the narrowest that fits one round
#           (the plans before that rule: 112 / 160 at N=2880, 128 at 5120) among them
#   small-m-pairs  (1 GPU) the grid's memory-bound small M (128 / 256, N 7168 / 8192, K 4096
#           / 9216; 0.94-0.98x cuBLAS): the default plans (64 wide at M=128, every CTA
#           re-reading all of x from L2) against pairs along N sharing x's tile at the same
#           widths (pn+bn64, pn+bn112, pn+bn128) and 64-row tiles 64 wide (bm64+bn64)
#   narrow-stages  (1 GPU) the one-round pairs 112 / 128 wide at M 128 / 256 (N 7168 / 8192, K
#           1024 / 4096 / 9216; 6 stages fit beside their whole-tile ring): the default against
#           4-7 stages, calls interleaved, two seeded orders (pn-cublas (as) at 7: 256 x 7168 x
#           4096 / 9216 +2.2 / +3.7% in blocks; (ap): 4-8 within 0.3%)
#   mid-pp  (1 GPU) the grid's M 1024 / 2048 (N 7168 / 8192, K 4096 / 9216, and the K=1024
#           shapes below 0.97x) and M 4096-16384 at K 4096 / 9216 (ping-pong at 4 stages
#           there -6..+7% in (ai), before 5 stages and the short ring): the default against 4
#           stages, 2x1-cluster ping-pong 176 / 192 wide at 5 stages (176 at 6 too) and
#           1-CTA 224 wide at 4, calls interleaved, two seeded orders
#   pp-deep  (1 GPU) ping-pong at K >= 4096 on its own code (``choose_gemm_pingpong`` since
#           PERF.md (at): M 4096-16384 where its lane-cost model says so, 176 / 192 wide at 5
#           stages): the default against the cooperative plan (pp0) at M 4096 / 8192 / 16384,
#           N 2880 / 5120 / 7168 / 8192 / 14336 (off the grid the rule moves plans untimed), K
#           4096 / 9216, and 176 wide at 2048 x 7168 (below M=4096, won in three readings),
#           calls interleaved, two seeded orders
#   pp-deep-mid  (1 GPU) ping-pong 176 wide at K >= 4096 below M=4096 (the rule since PERF.md
#           (au)) against the cooperative plan (pp0) at 32 shapes it moves off the grid (M
#           1024-3968, N 3072-16384) and 2048 x 7168, calls interleaved, two seeded orders
#   k1024-sweep  (1 GPU) the K=1024 shapes still below 0.97x cuBLAS (256 / 512 / 1024 / 2048
#           rows, N 7168 / 8192) against every plan form the kernels take there: widths,
#           clusters, ping-pong, stages, the split-K tail, 64-row pairs, bands
#   k1024-band  (1 GPU) tiles walked in bands of 8 pair rows at K=1024 on the cooperative and
#           the ping-pong plans, M 2048-16384, N 7168 / 8192, two seeded orders
#   mid-split  (1 GPU) one round of 1-CTA tiles at M 520 / 640, N 2880 / 3072, K 4096 / 9216:
#           the default against 176 wide and 256 / 224-wide tiles cut along K in two
#   deep-split  (1 GPU) where (av) found 256-wide tiles cut along K in two +16% at N=3072,
#           K=9216 (M 520 / 640): M 264-640 x N 2560-4096 at K 9216, the default against
#           176 / 224 / 256-wide 1-CTA tiles cut along K (two seeded orders)
#   mid-deep-forms  (1 GPU) the weakest region (ay) measured, M 264-640 x N 2560-4096 at K
#           4096 / 9216 (0.66-0.87x cuBLAS at K=9216): the default against pairs along N
#           (sharing x: 11.3-12.3 bytes of L2 reads per kFLOP at 112-144 wide, where the
#           1-CTA 128 / 144-wide defaults at N 2880 / 3072 draw 14.8-15.6) and 2x1 clusters
#           along M 176 / 256 wide (9.6 / 7.8, fewer CTAs), two seeded orders
#   l2-split  (1 GPU) ncu metrics of ours and cuBLAS's kernels at the K=1024 shapes below
#           0.97x and 2048 x 7168 x 4096: L2 reads by source, requests, hit rate, writes, DRAM,
#           instructions (the metrics this ncu offers: ncu_metrics.txt)
#   lrc     (1 GPU) L2 requests the L2 request coalescer merged (ncu's lrc__ counters, with
#           time, tensor pipe and L2 reads), cuBLAS's beside ours, one ncu run per shape and
#           column: the ping-pong 176 plan row-major (the default at K=1024) and in bands of
#           2 / 4 / 8 pair rows at 2048 / 4096 x 7168 x 1024, row-major against the default
#           bands at 2048 x 7168 x 4096, the defaults at 512 x 7168 and 1024 x 8192 x 1024;
#           medians in lrc_table.txt (benchmarks/ncu_metrics_table.py). At the same plan
#           cuBLAS has twice as many requests merged as ours at K=1024 (PERF.md (av))
#   profile  (1 GPU) Nsight Compute's full set on the GEMM alone's default plan at 2048 x
#           7168 x 1024 and 512 x 7168 x 1024 (two of the grid's lowest): the SASS source
#           page summed by benchmarks/sass_stalls.py (the top 20 with the 8 instructions
#           before each) and the details page, all in one profile_*.tar.xz
#   profile-pn  (1 GPU) the same on pairs along N at cuBLAS's form (112 wide, 7 stages),
#           on pairs along M at 7 stages and on the default, at 512 x 7168 x 1024 and 256 x
#           7168 x 9216: where our pairs along N lose (0.78x cuBLAS at 6 stages where
#           cuBLAS runs that form)
#   pn-coupling  (1 GPU) why our pairs along N wait for their stages at K=1024 (PERF.md (az):
#           49.5% of the MMA warps' samples at 512 x 7168 x 1024, 7 stages): the same 112-wide
#           tiles in the same order as 1-CTA tiles (no x multicast, no pair coupling), as pairs
#           along N and as 2x1 clusters along M, M 256 / 512 x N 7168 / 8192, two seeded
#           orders; then Nsight on the 1-CTA form at 512 x 7168 x 1024 beside profile-pn's
#   l2-fixed  (1 GPU) the loads tagged with CUTLASS's fixed policy words (evict-normal / -last)
#            against the default (evict-last at K <= 1024, M >= 512) and no policy (l2o), then
#            other plan forms with evict-last at the K=1024 shapes below 0.97x, then the L2
#            counters (PERF.md (ba))
#   l2-offgrid  (1 GPU) issue 49's rows at N 2880 / 5120 (the grid's M and K) with the
#            default (evict-last at K <= 1024, M >= 512) against no policy (l2o), two orders
#   pn-bands  (1 GPU) cuBLAS's 112-wide form at M 256-1024, K=1024 with the tile order in
#            bands of 2 / 4 unit rows (column-major within a band: in a round, the CTAs
#            reading one column of w at once) against row-major (PERF.md (ba))
#   offgrid-forms  (1 GPU) every plan form the kernels take at the N 2880 / 5120 shapes
#            l2-offgrid found below 0.95x cuBLAS (PERF.md (bb)): small M (64-row tiles, narrow
#            widths, 2x1 clusters, pairs along N, split-K), mid M at N=5120 (every width on
#            1-CTA tiles and 2x1 clusters, ping-pong), large M at N=2880; two seeded orders
#   offgrid-rules  (1 GPU) the rules offgrid-forms found (PERF.md (bb)) against the plans they
#            replace, at shapes off the N 2880 / 5120 rows they were found at: 160 / 192 wide
#            where they divide N, 64-wide tiles at two tile rows and K=1024, 7 stages on
#            112-wide pairs at 3-4 tile rows; then the N 2880 / 5120 rows on the default
#   offgrid-check  (1 GPU) 160-wide ping-pong at K >= 4096 from M=4096 against the plans it
#            replaces off the rows it was found at (N 2560 / 2880, M 4096-10240), then the
#            48 shapes and the N 2880 / 5120 rows on the default, two seeded orders
#   rows    (1 GPU) issue 49's record: the 48 shapes and the N 2880 / 5120 rows on the default
#            plans, five interleaved blocks, two seeded orders (ROWS_SEEDS, default 83 84)
#   tma-promo  (1 GPU) x's and w's load descriptors encoded by the driver with L2 promotion
#            none / 128 / 256 B (tpn, tp128, tp256: ``Tuning.tma_promo``) against the default
#            (the DSL's own) at the K=1024 shapes below 0.97x and the weakest off the grid,
#            two seeded orders (PROMO_SEEDS, default 85 86)
#   cublas-plans  (1 GPU) the kernels torch.mm launches (tile, stages, cluster, grid; a split-K
#            reduction) at the shapes still below 0.97x cuBLAS (benchmarks/cublas_kernels.py)
#   small-m-cublas  (1 GPU) cuBLAS's forms at the small M still below 0.97x (PERF.md (bc):
#            64-row tiles 64-96 wide at 10-13 stages, clusters of 2-8): 64-row tiles 64 / 80 /
#            96 / 112 wide on 1-CTA tiles and 2x1 clusters at 10-13 stages (past the default
#            cap of 8; 80 / 96: ``GEMM_ONLY_NS``),
#            128-row tiles 96 wide (cuBLAS's 88 x 128 at 512 x 2880) and 80 wide at 8 stages,
#            1-CTA and in pairs along N (its 80 x 128 on 2 x 1 at 256 x 5120),
#            4x1 clusters along M sharing w (its four 64-row tile rows at 256 x 2880; c4),
#            and the 256-byte L2 promotion (tp256, +3-4% at 256 x 2880 x 9216 and 128 x 2880 x
#            4096 in (bc)), against the default, two seeded orders
#   small-m-rules  (1 GPU) the rules small-m-cublas found (PERF.md (bd)), off its shapes,
#            against the plans they replace: the 64-row plans (M <= 128) at their deep
#            stages (``rows64_deep``) against 8 (stages8; 10 / 13 beside them, K=1024 too),
#            the 80 / 96-wide pairs at K >= 4096 against the 112-wide ones (c2+bm64+bn112);
#            ``choose_gemm_quads`` at M 200 / 256, N 1536-3584 against the 128-row plans
#            (bm128: every other rule as before) and each 4x1 width; 96 / 128 wide on
#            128-row 4x1 clusters at M 448 / 512; two seeded orders
#   small-m-next  (1 GPU) what (bd) left below 0.97x at small M: 4x1 clusters and deep
#            64-row pairs at M 160-256 and K 1024 / 2048 (M=200 +3..+19% in (bd), mixed at
#            256), and cuBLAS-like forms at M 192-320, N 4608-6144 (256 x 5120 0.90-0.92x);
#            then (be)'s leads: 64-row pairs 80-112 wide deep at M 96 / 128, K <= 2048, N
#            4608-6144 (128 x 5120 x 1024 0.93x), 4x1 clusters 160 / 192 wide at M 200-256,
#            N 4608-5760; two seeded orders
#   small-m-bf  (1 GPU) PERF.md (bf)'s rules against the plans they replaced: 64-row pairs 80
#            / 96 wide at K <= 2048 (M 80-128, N 4352-5760); 128-row pairs 80 / 96 wide at one
#            pair row off (bf)'s A/B (M 192-256, N 4864-6144, K 1024-9216); two orders
#   small-m-h200  (1 GPU) what (bf) left below 0.97x at small M on an H200: 128-row tiles on 4x1
#            clusters 96 / 128 wide at three / four tile rows of N=2880 (one cluster a
#            column: 30 columns of 96 fill 30 clusters); 64-row pairs against the 4x1 clusters
#            at 224 / 256 x 2880, K >= 4096; the one-pair-row rule's 80 wide at the kernel's 7
#            stages against its 8; one round of 1-CTA tiles 96-192 wide cut along K (the
#            split-K pieces, never timed below M=264) at 256 / 512 x 2880 and 256 x 5120, K >=
#            4096; two orders
#   x-box-wide  (1 GPU; RSAR_ALLOW_SHARED_GPU=1 on one) x's boxes that divide no tile (48 /
#            80 / 96 / 112 rows, ``launch.rules.X_BOX_UNEVEN``, on since PERF.md (bh)):
#            the default (the next dividing box there) against x_box=True at M 40-2000 whose
#            last row holds 36-44 or 72-112 rows, N 2880 / 5120 / 7168, K 1024 / 9216, two
#            orders; then tests/gpu/test_x_loads_gpu.py's boxes (bitwise the whole box's)
#   quads128  (1 GPU) 128-row tiles on 4x1 clusters 64 / 96 / 128 wide (one cluster a tile
#            column, w's tile leaving L2 once a column) against the default at M 320-512, N
#            2304-3072, K 4096 / 9216 ((bh): 96 wide at three tile rows became
#            ``choose_gemm_quads128``); two orders
#   h200-grid  (1 GPU) the grid's shapes below 0.97x on an H200 ((bf): 128 / 256 / 512 x 7168
#            x 1024, 256 x 8192 x 1024 / 4096, and 128 x 8192 x 1024): the default against
#            5-7 stages, 2x1 clusters 224 wide, 64-row pairs 112 wide at 10 stages, L2
#            promotion of 256 B and ping-pong on the 112-wide pairs (k1024-sweep's forms,
#            which ran on an H100 only); two orders
#   small-m-fill  (1 GPU) PERF.md (be)'s A/Bs: the 4x1 clusters 96 / 128 wide at M 200-256,
#            K 1024-9216 (a round filling every cluster); 128-row pairs 80 / 96 / 112 / 128
#            wide at M 384-512, K 1024 / 2048; 4x1 clusters 160-256 wide at N 5120-8192;
#            two seeded orders (~2 min on an H100)
#   tma-desc  (1 GPU) which L2 promotion the DSL writes into our TMA descriptors, against the
#            driver's four encodings of x's load (benchmarks/tma_desc_probe.py, ~10 s)
#   l2-hint  (1 GPU) the mainloop's loads with an explicit L2 eviction priority
#           (``Tuning.l2_hint``, columns l2n / l2l: normal / last) against the default, whose
#           loads carry the DSL's cache-hint operand of 0: the 48 shapes, calls interleaved, two
#           seeded orders; then the L2 counters (lrc) of both at the K=1024 shapes below 0.97x
#   newpp, newbias  (2 GPUs) the thirty-fourth session's open timings: fused ping-pong at
#           128 / 160 wide against the cooperative kernel on the same 1-CTA plans (rs_pp128 /
#           rs_pp160 against rs_bn128 / rs_bn160, AR alike) where the GEMM dominates; a bias
#           (bench.py --bias: rank 0's torch.addmm + NCCL against bias=, and rsar_rs_b against
#           rsar_rs for its own cost), then the MLP block with a biased down projection;
#           new: both
#   fp8     (2 GPUs) fp8 operands: the fp8 suite, then the quick grid against torch._scaled_mm
#           + NCCL and symm_mem's fused_scaled_matmul_reduce_scatter, one scale per operand,
#           per-row and block-wise scales (bench.py --dtype e4m3), and the MLP block with an
#           fp8 down projection (tp_worker.py --dtype e4m3), after cache-all; fp8a: the suite
#           and one scale each, fp8b: the rest
#
# A device call may run 10 minutes. At their usual times (each step's limit is its worst
# case) these calls fit: `cache sweep1`, `sweep2 newpp`, `newbias`, `grid`, `checks`,
# `cache-all fp8a` (the fp8 suite, one scale each), `fp8b` (per-row and block-wise scales,
# the fp8 MLP block). A call killed at its limit still returns what its finished steps wrote.
#
# RSAR_BUILD_ONLY=1 (no GPU needed): each gemm_one_gpu.py step compiles its columns' kernels
# into RSAR_KERNEL_CACHE instead of timing them (`--build-only`), which is how a CPU machine
# builds the cache a device call carries (with `precompile.py --from-log
# tests/gpu/variants.jsonl` for the suites).
#
# RSAR_KERNEL_CACHE=DIR takes the kernels from DIR (scripts/precompile.py fills it on a CPU
# machine; a stale entry is never used, it is compiled again). A step that runs past its limit
# is killed and the next one starts, so a hang costs that step only.
set -u
G1="python3 scripts/gemm_one_gpu.py${RSAR_BUILD_ONLY:+ --build-only}"
out=${1:?usage: scripts/gpu_runs.sh OUTDIR STEP...}
shift
STEPS="cache cache-all sweep sweep1 sweep2 grid checks gemm1 grid-calls grid-blocks xloads xloads-checks small-m tails mid-m mid-sweep mid-widths partial-width stages pp-stages pp-mid pp-rule pp-coop rows64-pairs rows64-rule pn-cublas one-round-widths small-m-pairs narrow-stages mid-pp pp-deep pp-deep-mid k1024-sweep k1024-band mid-split deep-split mid-deep-forms l2-split lrc placement profile profile-pn pn-coupling l2-hint l2-fixed l2-offgrid pn-bands offgrid-forms offgrid-rules offgrid-check rows tma-promo cublas-plans small-m-cublas small-m-rules small-m-next small-m-bf small-m-h200 h200-grid x-box-wide quads128 small-m-fill tma-desc new newpp newbias fp8 fp8a fp8b"
[ $# -gt 0 ] || { echo "no STEP given (${STEPS// /, })" >&2; exit 2; }
mkdir -p "$out"
for s in "$@"; do  # every step checked before any runs
  case " $STEPS " in *" $s "*) ;; *) echo "unknown step $s (${STEPS// /, })" >&2; exit 2 ;; esac
done
out=$(cd "$out" && pwd)  # the steps run from the repository root
cd "$(dirname "$0")/.."
step() {  # name limit command...
  local name=$1 limit=$2 t0=$SECONDS; shift 2
  timeout -k 5 "$limit" "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - t0))s :: $(grep -E 'passed|failed|error|geomean|rsar' "$out/$name.log" | tail -1)"
}
gemm_step() {  # name limit args...: gemm_one_gpu.py, its kernels built on every core first
  # (into RSAR_KERNEL_CACHE, default kcache/, kept for later steps), rows in OUTDIR/name.json
  local name=$1 limit=$2; shift 2
  export RSAR_KERNEL_CACHE=${RSAR_KERNEL_CACHE:-$PWD/kcache}
  step "$name" "$limit" $G1 "$@" --build-jobs "$(nproc)" --json "$out/$name.json"
}
ab_groups() {  # prefix seed "COLUMN:SHAPES"...: each group's default against COLUMN on its
  # shapes (the plan a rule replaced), one gemm_step per group, rows in OUTDIR/prefix_COL_seed.json
  local prefix=$1 seed=$2 g col; shift 2
  for g in "$@"; do
    col=${g%%:*}
    gemm_step "${prefix}_${col//+/_}_$seed" 120 --shuffle "$seed" --blocks 5 \
      --columns "default,$col" --shapes "${g#*:}"
  done
}
shapes() {  # "M..." "N..." ["K..."] -> M,N,K;... over K (default 1024 / 4096 / 9216)
  local M N K r=""
  for N in $2; do for K in ${3:-1024 4096 9216}; do for M in $1; do r+="$M,$N,$K;"; done; done
  done
  echo "${r%;}"
}
# issue 49's rows at N 2880 / 5120: the grid's M and K
OFFGRID_ROWS=$(shapes "128 256 512 1024 2048 4096 8192 16384" "2880 5120" "1024 4096 9216")
record_rows() {  # seed [grid]: issue 49's record on the default plans, one seeded order: the
  # N 2880 / 5120 rows, after the 48 shapes where "grid" is given (OUTDIR/grid_SEED.json,
  # OUTDIR/offgrid_rows_SEED.json)
  [ "${2:-}" = grid ] && gemm_step "grid_$1" 200 --shuffle "$1" --blocks 5 --columns default
  gemm_step "offgrid_rows_$1" 200 --shuffle "$1" --blocks 5 --columns default \
    --shapes "$OFFGRID_ROWS"
}
lrc_runs() {  # SHAPE:COLUMN...: the L2 request coalescer's counters (LRC), one ncu run
  # each (ours and torch.mm's kernel), and their table in OUTDIR/lrc_table.txt
  export RSAR_KERNEL_CACHE=${RSAR_KERNEL_CACHE:-$PWD/kcache}
  local run shp col
  for run in "$@"; do
    shp=${run%%:*} col=${run#*:}
    step "lrc_${shp//,/_}_${col//+/_}" 120 ncu --clock-control none -k regex:'Sm90|nvjet' \
      --csv --metrics "${LRC_METRICS:-$LRC}" $G1 --columns "$col" --shapes "$shp" --iters 1 \
      --blocks 1 --build-jobs "$(nproc)"
  done
  python3 benchmarks/ncu_metrics_table.py "$out"/lrc_*.log > "$out/lrc_table.txt" 2>&1
  cat "$out/lrc_table.txt"
}
profile_runs() {  # SHAPE:COLUMN...: Nsight Compute's full set on one launch of each column's
  # kernel: the SASS source page summed by benchmarks/sass_stalls.py (profile_*.txt) and the
  # details page (L2 / DRAM / tensor-pipe counters), both tarred: a call returns 8 files
  command -v ncu > /dev/null || { echo "profile: no ncu on this machine" >&2; return; }
  local run shp col n
  for run in "$@"; do
    shp=${run%%:*} col=${run#*:}
    n=${shp//,/_}_${col//+/_}
    step "ncu_$n" 200 ncu --clock-control none -k regex:Sm90FusedKernel --launch-skip 1 \
      --launch-count 1 --set full --import-source yes -o "$out/rep_$n" -f \
      $G1 --columns "$col" --shapes "$shp" --iters 1 --blocks 1
    ncu -i "$out/rep_$n.ncu-rep" --page source --csv --print-source sass > "$out/src_$n.csv"
    ncu -i "$out/rep_$n.ncu-rep" --page details --csv > "$out/details_$n.csv"
    python3 benchmarks/sass_stalls.py "$out/src_$n.csv" --top 20 --context 8 \
      > "$out/profile_$n.txt" 2>&1
    rm -f "$out/rep_$n.ncu-rep"
  done
  (cd "$out" && tar cJf "profile_$(date +%s).tar.xz" src_*.csv details_*.csv profile_*.txt \
    && rm -f src_*.csv details_*.csv profile_*.txt)
}
# the M of three to twenty tile rows whose last row holds 8-128 rows (mid-sweep, mid-widths)
MID_MS="264 300 392 456 520 584 648 712 776 840 904 968 1032 1100 1160 1300 1540 1800 2100 2600"
L2_METRICS=gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sectors_op_read.sum,\
lts__t_sectors_op_read.max,lts__t_sectors_op_read.avg,lts__t_requests.max,lts__t_requests.avg
L2_SPLIT=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,\
lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,\
lts__t_requests_srcunit_tex_op_read.sum,lts__t_sector_op_read_hit_rate.pct,dram__bytes_read.sum,\
sm__inst_executed.sum,smsp__cycles_active.avg
LRC=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,\
lts__t_sectors_srcunit_tex_op_read.sum,lrc__request_sectors_op_read_coalescable.sum,\
lrc__request_sectors_op_read_coalescing_achieved_type_hardware.sum,\
lrc__request_sectors_op_read_coalescing_achieved_type_programmatic.sum,lrc__lts2lrc_sectors_op_read.sum
SWEEP=mm,gemm_only,gemm_ts0,mm_rs,mm_ar,rsar_rs,rsar_ar,rs_lean,ar_lean,rs_flat,rs_pc8,rs_pc16,rs_pc24
PINGPONG=mm,gemm_only,rsar_rs,rsar_ar,rs_bn128,rs_pp128,rs_bn160,rs_pp160,ar_bn128,ar_pp128,ar_bn160,ar_pp160
BIAS=mm_rs,rsar_rs,mm_rs_b,rsar_rs_b,mm_ar,rsar_ar,mm_ar_b,rsar_ar_b
for s in "$@"; do
  case $s in
    cache|cache-all)
      export RSAR_KERNEL_CACHE=${RSAR_KERNEL_CACHE:-$PWD/kcache}
      arch=$(python3 -c "import torch; print('sm_%d%da' % torch.cuda.get_device_capability())")
      dts=bf16; [ "$s" = cache-all ] && dts=bf16,f16,e4m3,e4m3-block
      step "$s" 420 python3 scripts/precompile.py --arch "$arch" --world 2 \
        --transports unicast --dtypes "$dts" --bias --out "$RSAR_KERNEL_CACHE" \
        --from-log tests/gpu/variants.jsonl ;;
    sweep|sweep1|sweep2)
      seeds="1 2"; [ "$s" != sweep ] && seeds=${s#sweep}
      for seed in $seeds; do
        step "sweep$seed" 240 mpirun -n 2 python3 scripts/bench.py --plan-sweep --only "$SWEEP" \
          --N 7168 --K 1024 4096 --M 256 1024 2048 4096 8192 --iters 30 --blocks 3 \
          --shuffle "$seed" --json "$out/sweep$seed.json" --md "$out/sweep$seed.md"
      done ;;
    grid)
      step grid 600 mpirun -n 2 python3 scripts/bench.py --N 7168 8192 \
        --json "$out/grid.json" --md "$out/grid.md" --png "$out/grid.png" ;;
    checks)
      bash tests/gpu/run_all.sh "$out/checks" | tee "$out/checks.summary" ;;
    gemm1)
      gemm_step gemm1 300 --columns default ;;
    grid-calls)
      gemm_step grid_calls 420 --columns default --blocks 5 ;;
    grid-blocks)
      gemm_step grid_blocks 420 --columns default --interleave blocks --blocks 5 ;;
    xloads)
      gemm_step xloads_small 480 \
        --columns default,xb0,sk,sk0 --shapes "$(shapes "1 8 16 32 64" \
        "2880 5120 7168 8192")" ;;
    xloads-checks)
      step xloads_tests 300 mpirun -n 2 python3 -m pytest -q -p no:cacheprovider \
        tests/gpu/test_x_loads_gpu.py
      # a slice's max far above the mean is a hot line; the box changes what the TMA fills
      if command -v ncu > /dev/null; then
        for mk in 1,sk0+xb0 1,sk0+xb 64,sk0; do
          step "xloads_ncu_${mk//[,+]/_}" 120 ncu --clock-control none -k regex:Sm90FusedKernel \
            --launch-skip 2 --launch-count 1 --csv --metrics "$L2_METRICS" \
            $G1 --columns "${mk#*,}" --shapes "${mk%,*},8192,9216" \
            --iters 1 --blocks 1
        done
      fi ;;
    small-m)
      gemm_step small_m 300 --columns default,c1,c1+bn112,bm64 \
        --shapes "$(shapes "129 160 192 256" "2880 5120 7168 8192")" --shuffle 3 ;;
    tails)
      gemm_step tails 420 --columns default,xb0,c1,c1+xb0,c2,c2+xb \
        --shapes "$(shapes "129 160 192 200 300 520 1000 1100 3000" "2880 5120 7168 8192")" \
        --shuffle 4 ;;
    mid-m)
      gemm_step mid_m 480 \
        --columns default,xb0,c1+bn256,c1+bn256+sk,c1+bn224+sk,c1+bn176+sk,c2+bn256 --shuffle 5 \
        --shapes "$(shapes "300 520 640 1100" "5120 7168 8192" "4096 9216")" ;;
    mid-sweep)
      gemm_step mid_sweep 540 \
        --columns default,c1+bn256+sk,c1+bn224+sk,c2+xb --shuffle 6 \
        --shapes "$(shapes "$MID_MS" "2880 5120 7168 8192" "4096 9216")" ;;
    mid-widths)
      gemm_step mid_widths 540 \
        --columns default,c1+bn256,c1+bn224,c1+bn192,c1+bn160 --shuffle 7 \
        --shapes "$(shapes "$MID_MS" "2880 5120 7168 8192" "4096 9216")" ;;
    partial-width)
      gemm_step partial_width 300 --columns default,c1+bn128,c1+bn224 --shuffle 8 \
        --shapes "$(shapes "1025 1032 1048 1064 1088 1100 1128 1152" 5120 "4096 9216");$(
          shapes "1032 1100" 5120 2048)" ;;
    stages)
      gemm_step stages 500 --columns default,stages3,stages4,c2+stages4,c1+stages4 \
        --shuffle 9 --blocks 5 --shapes "$(shapes "512 1024 2048" "7168 8192" 1024);$(
          shapes "512 1024 2048 4096 8192 16384" "7168 8192" "4096 9216")" ;;
    pp-stages)
      gemm_step pp_stages 300 \
        --columns default,c2+bn176+pp,c2+bn192+pp,c2+bn176+pp+stages5,c2+bn192+pp+stages5 \
        --shuffle 13 --blocks 5 --shapes "$(shapes "4096 8192 16384" "7168 8192" 1024)" ;;
    pp-mid)
      gemm_step pp_mid 420 \
        --columns default,c2+bn176+pp+stages5,c2+bn192+pp+stages5 \
        --shuffle 14 --shapes "$(shapes "1536 2048 2560 3072" "7168 8192")" ;;
    pp-rule)
      gemm_step pp_rule 420 --columns default,pp0,c2+bn192+pp+stages5 --shuffle 15 \
        --shapes "$(shapes "2816 3072 3584 5120" 2880 1024);$(shapes \
          "1536 1792 2048 2304 2560 2816 3072 3584 4096 8192" 5120 1024);$(shapes \
          "1280 1536 2048 2560 2816 3072" 7168 1024);$(shapes \
          "1280 1536 1792 2304 2560 2816 3072 3584 5120" 8192 1024)" ;;
    pp-coop)
      gemm_step pp_coop 300 --columns default,c2+bn192+pp+stages5,c2+bn160+pp --shuffle 16 \
        --shapes "6016,2880,1024;4992,5120,1024;5824,5120,1024;7552,5120,1024;4160,7168,1024;$(
          )5312,7168,1024;4224,8192,1024;4736,8192,1024" ;;
    rows64-pairs)
      gemm_step rows64_pairs 420 --columns default,bm64+c2+bn64,bm64+c2+bn112,bm64+c2+bn128 \
        --shuffle 17 --shapes "$(shapes "64 128 192 256" "2880 5120 7168 8192")" ;;
    rows64-rule)
      gemm_step rows64_rule 420 --columns default,bm128 --shuffle 18 --blocks 5 \
        --shapes "$(shapes "80 100 128" "2880 5120 7168 8192")" ;;
    pn-cublas)
      gemm_step pn_cublas 480 --columns default,pn+bn112,pn+bn112+stages7,$(
        )pn+bn128+stages7,c2+bn112+stages7,c2+bn112+pp+stages7,pn+bn112+pp+stages7 \
        --shuffle 19 --blocks 5 --shapes "$(shapes "256 512" "7168 8192")" ;;
    one-round-widths)
      gemm_step one_round_widths 300 \
        --columns default,c1+bn112,c1+bn128,c1+bn144,c1+bn160,c1+bn176,c1+bn192,c1+bn208,$(
        )c1+bn224 --shuffle 20 \
        --shapes "$(shapes "264 300 392 520 584 640 776 840 896" 2880 "4096 9216");$(
          shapes "264 300 320 384" 5120 "4096 9216");$(shapes "520 640" 3072 "4096 9216")" ;;
    small-m-pairs)
      gemm_step small_m_pairs 300 --columns default,pn+bn64,pn+bn112,pn+bn128,bm64+bn64 \
        --shuffle 10 --blocks 5 --shapes "$(shapes "128 256" "7168 8192" "4096 9216")" ;;
    narrow-stages)
      for seed in 22 23; do
        gemm_step "narrow_stages_$seed" 240 --columns default,stages4,stages5,stages6,stages7 \
          --shuffle $seed --blocks 5 --shapes "$(shapes "128 256" "7168 8192")"
      done ;;
    mid-pp)
      for seed in 24 25; do
        gemm_step "mid_pp_$seed" 300 --columns default,stages4,c2+bn176+pp+stages5,$(
          )c2+bn192+pp+stages5,c2+bn176+pp+stages6,c1+bn224+stages4 --shuffle $seed \
          --blocks 5 --shapes "$(shapes "1024 2048" "7168 8192" "4096 9216");$(
          )1024,8192,1024;2048,7168,1024;2048,8192,1024;$(
          shapes "4096 8192 16384" "7168 8192" "4096 9216")"
      done ;;
    pp-deep)
      for seed in 26 27; do
        gemm_step "pp_deep_$seed" 300 --columns default,pp0,c2+bn176+pp+stages5 \
          --shuffle $seed --blocks 5 --shapes "$(
          shapes "4096 8192 16384" "2880 5120 7168 8192 14336" "4096 9216");$(
          shapes 2048 7168 "4096 9216")"
      done ;;
    pp-deep-mid)
      # ping-pong 176 at K >= 4096 below M=4096 (the rule's own code) against the cooperative
      # plan, at shapes off the grid it moves untimed, and 2048 x 7168
      for seed in 28 29; do
        gemm_step "pp_deep_mid_$seed" 300 --columns default,pp0 --shuffle $seed --blocks 5 \
          --shapes "$(shapes "1920 2688 3968" 7168 "4096 9216");$(
          shapes "1664 2688 3456" 8192 "4096 9216");$(shapes "2688 3712" 5120 "4096 9216");$(
          shapes "1024 1920" 14336 "4096 9216");$(shapes "1664 3456" 16384 "4096 9216");$(
          shapes 3456 3072 "4096 9216");$(shapes "2176 3200" 6144 "4096 9216");$(
          shapes 2048 7168 "4096 9216")"
      done ;;
    k1024-sweep)
      # every plan form the kernels take at the K=1024 shapes still below 0.97x cuBLAS
      gemm_step k1024_256 200 --shuffle 30 --blocks 5 --shapes "256,7168,1024;256,8192,1024" \
        --columns default,stages5,stages6,stages7,pn+bn112+stages7,c2+bm64+bn224,$(
        )c2+bn112+pp,c2+bn112+pp+stages7,c2+bn128,c1+bn224,c1+bn224+sk
      gemm_step k1024_512 200 --shuffle 31 --blocks 5 --shapes "512,7168,1024;512,8192,1024" \
        --columns default,c2+bn224,c1+bn256+sk,c2+bm64+bn224,c1+bn192+pp,c1+bn112+pp,$(
        )c1+bn128+pp,c2+bn112+pp,c2+bn112+stages7,c1+bn176+pp
      gemm_step k1024_2048 200 --shuffle 32 --blocks 5 --shapes "2048,7168,1024;2048,8192,1024" \
        --columns default,c2+bn176+pp+stages4,c2+bn176+pp+band2,c2+bn176+pp+band4,$(
        )c2+bn176+pp+band8,c2+bn192+pp,c2+bn160+pp,c2+bn144+pp,c2+bn176,c1+bn176+pp
      gemm_step k1024_1024 200 --shuffle 33 --blocks 5 --shapes "1024,8192,1024;1024,7168,1024" \
        --columns default,c2+bn256,c1+bn256+sk,c2+bn128+pp,c2+bn208,c2+bn192+pp,$(
        )c1+bn256+band4,c1+bn224,c1+bn128+pp,c1+bn192+pp ;;
    k1024-band)
      # tiles walked in bands of 8 pair rows at K=1024 (row-major there since (d)), on the
      # cooperative and the ping-pong plans
      for seed in 34 35; do
        gemm_step "k1024_band_$seed" 300 --shuffle $seed --blocks 5 --columns $(
          )default,band8,c2+bn176+pp,c2+bn176+pp+band8,c2+bn192+pp,c2+bn192+pp+band8 \
          --shapes "$(shapes "2048 3072 4096 8192 16384" "7168 8192" 1024)"
      done ;;
    mid-split)
      # one round of 1-CTA tiles at 5 tile rows and N 2880 / 3072, where the best width is
      # 0.69-0.78x cuBLAS: 256 / 224-wide tiles cut along K in two (the split-K tail's pieces)
      for seed in 36 37; do
        gemm_step "mid_split_$seed" 200 --shuffle $seed --blocks 5 \
          --columns default,c1+bn176,c1+bn256+sk,c1+bn224+sk,c1+bn256 \
          --shapes "$(shapes "520 640" "2880 3072" "4096 9216")"
      done ;;
    mid-deep-forms)
      for seed in 63 64; do
        gemm_step "mid_deep_forms_$seed" 300 --shuffle $seed --blocks 5 \
          --columns default,pn+bn128,pn+bn144,pn+bn112,c2+bn176,c2+bn256 \
          --shapes "$(shapes "264 392 520 640" "2560 2880 3072 3584 4096" "4096 9216")"
      done ;;
    deep-split)
      for seed in 45 46; do
        gemm_step "deep_split_$seed" 300 --shuffle $seed --blocks 5 \
          --columns default,c1+bn176+sk,c1+bn224+sk,c1+bn256+sk \
          --shapes "$(shapes "264 392 520 640" "2560 2880 3072 3584 4096" 9216)"
      done ;;
    l2-split)
      # where the L2 reads of ours and cuBLAS's kernel at the K=1024 shapes come from (by
      # source unit, hit rate, writes), every launch of one gemm_one_gpu.py run
      ncu --query-metrics > "$out/ncu_metrics.txt" 2>&1
      step l2_split 240 ncu --clock-control none -k regex:'Sm90|nvjet|gemm|xmma|cutlass' --csv \
        --metrics "$L2_SPLIT" $G1 --columns default --iters 1 --blocks 1 \
        --shapes "2048,7168,1024;512,7168,1024;256,7168,1024;1024,8192,1024;2048,7168,4096" ;;
    placement)
      # benchmarks/sm_placement.cu, built here into .device (no nvcc on the GPU machine)
      step sm_placement 30 .device/sm_placement ;;
    lrc)
      lrc_runs 2048,7168,1024:default 2048,7168,1024:c2+bn176+pp+band2 \
        2048,7168,1024:c2+bn176+pp+band4 2048,7168,1024:c2+bn176+pp+band8 \
        4096,7168,1024:default 4096,7168,1024:c2+bn176+pp+band8 2048,7168,4096:default \
        2048,7168,4096:c2+bn176+pp+band0 512,7168,1024:default 1024,8192,1024:default ;;
    profile)
      profile_runs 2048,7168,1024:default 512,7168,1024:default ;;
    profile-pn)
      profile_runs 512,7168,1024:default 512,7168,1024:pn+bn112+stages7 \
        512,7168,1024:c2+bn112+stages7 256,7168,9216:default 256,7168,9216:pn+bn112+stages7 ;;
    pn-coupling)
      for seed in 65 66; do
        gemm_step "pn_coupling_$seed" 200 --shuffle $seed --blocks 5 \
          --columns default,c1+bn112+stages7,pn+bn112+stages7,c2+bn112+stages7 \
          --shapes "$(shapes "256 512" "7168 8192" 1024)"
      done
      profile_runs 512,7168,1024:c1+bn112+stages7 ;;
    l2-hint)
      for seed in 67 68; do
        gemm_step "l2_hint_$seed" 300 --shuffle $seed --blocks 5 --columns default,l2n,l2l
      done
      LRC_METRICS="$LRC,lts__t_sector_hit_rate.pct,dram__bytes_read.sum" lrc_runs \
        2048,7168,1024:default 2048,7168,1024:l2l 2048,7168,1024:l2n 512,7168,1024:default \
        512,7168,1024:l2l ;;
    l2-fixed)
      for seed in 69 70; do
        gemm_step "l2_fixed_$seed" 300 --shuffle $seed --blocks 5 --columns default,l2o,l2cn,l2cl
      done
      for seed in 71 72; do
        gemm_step "l2_forms_$seed" 200 --shuffle $seed --blocks 5 \
          --columns default,c2,c2+bn224,pn+bn112+stages7+l2l,c1+bn176+l2l,c1+bn256+l2l,c2+bn176+pp+l2l \
          --shapes "256,7168,1024;512,7168,1024;2048,7168,1024;1024,8192,1024;256,8192,1024"
      done
      LRC_METRICS="$LRC,lts__t_sector_hit_rate.pct,dram__bytes_read.sum" lrc_runs \
        2048,7168,1024:l2cn 2048,7168,1024:l2cl 512,7168,1024:l2cn 512,7168,1024:l2cl ;;
    l2-offgrid)
      for seed in 73 74; do
        gemm_step "l2_offgrid_$seed" 300 --shuffle $seed --blocks 5 --columns default,l2o \
          --shapes "$OFFGRID_ROWS"
      done ;;
    pn-bands)
      for seed in 75 76; do
        gemm_step "pn_bands_$seed" 200 --shuffle $seed --blocks 5 \
          --columns default,pn+bn112+stages7,pn+bn112+stages7+band2,pn+bn112+stages7+band4,c1+bn112+stages7+band4,c2+bn112+stages7+band2 \
          --shapes "256,7168,1024;512,7168,1024;512,8192,1024;1024,7168,1024"
      done ;;
    offgrid-forms)
      for seed in 77 78; do
        gemm_step "offgrid_small_$seed" 200 --shuffle $seed --blocks 5 \
          --columns default,c1+bn64,c2+bn64,pn+bn64,bm64+bn64,bm64+bn112,c2+bm64+bn64,c2+bm64+bn112,c1+bn128+sk,c1+bn192+sk,c1+bn256+sk,c1+bn112+stages7,c2+bn112+stages7,c1+bn144,c2+bn144,c1+bn160,c2+bn160,c1+bn64+stages8 \
          --shapes "$(shapes "128 256 512" 2880);$(shapes "128 256 512" 5120 "4096 9216");256,5120,1024"
        gemm_step "offgrid_mid_$seed" 200 --shuffle $seed --blocks 5 \
          --columns default,c1+bn160,c2+bn160,c1+bn192,c2+bn192,c1+bn208,c2+bn208,c1+bn224,c2+bn224,c1+bn256,c2+bn256,c2+bn128,c2+bn144+pp,c2+bn160+pp,c2+bn176+pp,c2+bn192+pp,c1+bn256+sk \
          --shapes "$(shapes "1024 2048" 5120)"
        gemm_step "offgrid_large_$seed" 200 --shuffle $seed --blocks 5 \
          --columns default,c2+bn144,c2+bn160,c2+bn192,c2+bn224,c2+bn144+pp,c2+bn160+pp,c2+bn192+pp \
          --shapes "$(shapes "4096 8192 16384" 2880 "4096 9216")"
      done ;;
    offgrid-rules)
      for seed in 79 80; do
        ab_groups offgrid_rules $seed \
          "c1+bn176:192,10240,1024;256,10240,1024;512,10240,1024;512,5120,1024;1024,2560,1024" \
          "c2+bn176:256,10240,4096;1024,5120,2048;1024,2560,9216;2048,2560,4096" \
          "c2+bn128:4096,2560,4096;2048,3072,4096;1024,6144,4096;1024,10240,4096" \
          "c1+bn128:2048,3072,1024;1024,6144,1024;640,9216,1024" \
          "c1+bn208:1024,3072,1024;512,6144,1024" \
          "c2+bn208:3072,3072,4096;1024,3072,9216;384,6144,4096;1536,6144,9216;1024,9216,4096" \
          "c1+bn112:$(shapes "192 256" "2048 2560 2880 3072 3584 4096" 1024)" \
          "c2+bn112+stages3:384,2880,4096;384,2880,9216;320,3072,9216;512,3072,4096;384,3584,4096;512,3584,9216;512,2560,9216"
        record_rows $seed
      done ;;
    offgrid-check)
      for seed in 81 82; do
        ab_groups offgrid_check $seed \
          "c2+bn256:8192,2880,4096;8192,2880,9216;6144,2560,4096;10240,2560,9216" \
          "c2+bn160:4096,2560,4096;4096,2560,9216" "c2+bn208:5120,2560,4096" \
          "c2+bn224:10240,2880,4096;10240,2880,9216"
        record_rows $seed grid
      done ;;
    rows)
      for seed in ${ROWS_SEEDS:-83 84}; do
        record_rows $seed grid
      done ;;
    tma-promo)
      for seed in ${PROMO_SEEDS:-85 86}; do
        gemm_step "tma_promo_$seed" 200 --shuffle $seed --blocks 5 \
          --columns default,tpn,tp128,tp256 \
          --shapes "256,7168,1024;512,7168,1024;2048,7168,1024;256,8192,1024;1024,8192,1024;4096,7168,1024;256,2880,9216;128,2880,4096;512,2880,9216;2048,7168,4096;256,7168,9216"
      done ;;
    cublas-plans)
      step cublas_plans 120 python3 benchmarks/cublas_kernels.py --json "$out/cublas_plans.json" \
        --shapes "$(shapes "128 256 512" 2880 "4096 9216");$(shapes "128 256" 5120 "4096 9216");$(
          )256,7168,1024;512,7168,1024;2048,7168,1024;256,8192,1024;256,7168,9216" ;;
    small-m-cublas)
      for seed in 87 88; do
        gemm_step "small_m_cublas_$seed" 200 --shuffle $seed --blocks 5 \
          --columns default,c1+bm64+bn64+stages13,c2+bm64+bn64+stages13,c1+bm64+bn112+stages10,c2+bm64+bn112+stages10,c1+bm64+bn96+stages10,c2+bm64+bn96+stages10,c2+bm64+bn80+stages11,c1+bn96,c2+bn96,pn+bn80+stages8,c1+bn80+stages8,c4+bm64+bn96+stages10,c4+bm64+bn64+stages13,c4+bm64+bn128,c4+bn96,c4+bn128,tp256,c2+bm64+bn64+stages13+tp256 \
          --shapes "$(shapes "128 256 512" 2880 "4096 9216");$(shapes "128 256" 5120 "4096 9216");128,7168,4096;256,7168,9216"
      done ;;
    small-m-rules)  # the rules' groups first, both orders each, 512 last
      for seed in ${SMALL_M_SEEDS:-89 90}; do
        gemm_step "small_m_deep_$seed" 200 --shuffle $seed --blocks 5 \
          --columns default,stages8,c2+bm64+bn112,stages10,stages13 \
          --shapes "$(shapes "32 64 96 128" "2048 2880 4096 5120 7168")"
      done
      for seed in ${SMALL_M_SEEDS:-89 90}; do
        gemm_step "small_m_quads_$seed" 200 --shuffle $seed --blocks 5 \
          --columns default,bm128,c4+bm64+bn64+stages13,c4+bm64+bn96+stages10,c4+bm64+bn128+stages9,c2+bm64+bn96+stages10 \
          --shapes "$(shapes "200 256" "1536 2048 2560 2880 3072 3584")"
      done
      for seed in ${SMALL_M_SEEDS:-89 90}; do
        gemm_step "small_m_quads512_$seed" 200 --shuffle $seed --blocks 5 \
          --columns default,c4+bn96,c4+bn96+stages7,c2+bn96,c4+bn128 \
          --shapes "$(shapes "448 512" "2560 2880 3072" "4096 9216")"
      done ;;
    small-m-next)  # what (bd) left below 0.97x at small M
      for seed in ${SMALL_M_SEEDS:-91 92}; do
        gemm_step "small_m_short_$seed" 200 --shuffle $seed --blocks 5 \
          --columns default,c4+bm64+bn64+stages13,c4+bm64+bn96+stages10,c4+bm64+bn128+stages9,c2+bm64+bn96+stages10,c2+bm64+bn64+stages13 \
          --shapes "$(shapes "160 200 224 256" "1536 2048 2880 3584" "1024 2048")"
      done
      for seed in ${SMALL_M_SEEDS:-91 92}; do
        gemm_step "small_m_5120_$seed" 200 --shuffle $seed --blocks 5 \
          --columns default,c2+bn96,c2+bn80+stages8,pn+bn80+stages8,c4+bm64+bn128+stages9,c2+bm64+bn80+stages11,c2+bm64+bn96+stages10 \
          --shapes "$(shapes "192 256 320" "4608 5120 6144")"
      done
      for seed in ${SMALL_M_SEEDS:-91 92}; do  # (be): 64-row pairs at K <= 2048 past 112 wide
        gemm_step "small_m_pairs_short_$seed" 150 --shuffle $seed --blocks 5 \
          --columns default,c2+bm64+bn80+stages11,c2+bm64+bn96+stages10,c2+bm64+bn112+stages10 \
          --shapes "$(shapes "96 128" "4608 5120 6144" "1024 2048")"
      done
      for seed in ${SMALL_M_SEEDS:-91 92}; do  # (be): 192-wide 4x1 clusters, +5..+11% once
        gemm_step "small_m_quads192_$seed" 150 --shuffle $seed --blocks 5 \
          --columns default,c4+bm64+bn192+stages6,c4+bm64+bn160+stages7 \
          --shapes "$(shapes "200 224 256" "4608 5120 5760" "1024 2048 4096")"
      done ;;
    small-m-bf)  # PERF.md (bf): the rules (bf) took, each against the plan it replaced
      for seed in ${SMALL_M_SEEDS:-97 98}; do
        gemm_step "bf_pairs64_$seed" 150 --shuffle $seed --blocks 5 \
          --columns default,c2+bm64+bn112 --shapes "$(shapes "80 112 128" "4352 5120 5760" "1024 2048")"
        gemm_step "bf_k1024_$seed" 150 --shuffle $seed --blocks 5 \
          --columns default,c1+bn112 --shapes "$(shapes "200 224" "4864 5120" 1024)"
        gemm_step "bf_k2048_$seed" 150 --shuffle $seed --blocks 5 \
          --columns default,c2+bn112 --shapes "$(shapes "192 224 256" "4864 5120 6144" 2048)"
        gemm_step "bf_deep_$seed" 150 --shuffle $seed --blocks 5 \
          --columns default,c2+bn112+stages7,c4+bm64+bn192+stages6 \
          --shapes "$(shapes "200 224" "4864 5760" "4096 9216")"
      done ;;
    small-m-h200)  # what (bf) left below 0.97x at small M on the H200
      for seed in ${SMALL_M_SEEDS:-101 102}; do
        gemm_step "h200_rows4_$seed" 150 --shuffle $seed --blocks 5 \
          --columns default,c4+bn96,c4+bn128,c2+bn80 --shapes "$(shapes "384 448 512" 2880 "1024 4096 9216")"
        gemm_step "h200_quads_$seed" 150 --shuffle $seed --blocks 5 \
          --columns default,c2+bm64+bn96+stages10,c4+bm64+bn128+stages9 \
          --shapes "$(shapes "224 256" 2880 "4096 9216")"
        gemm_step "h200_pairs80_$seed" 150 --shuffle $seed --blocks 5 \
          --columns default,c2+bn80,c2+bn96 --shapes "$(shapes "192 256" "4608 5120" "1024 2048")"
        gemm_step "h200_split_$seed" 150 --shuffle $seed --blocks 5 \
          --columns default,c1+bn96+sk,c1+bn144+sk,c1+bn160+sk,c1+bn192+sk \
          --shapes "$(shapes "256 512" 2880 "4096 9216");$(shapes 256 5120 "4096 9216")"
      done ;;
    x-box-wide)  # launch.rules.X_BOX_UNEVEN: its A/B (xb: x_box=True; every column checked
      # against float64 first), then the GPU test (bitwise the whole box's result)
      for seed in ${SMALL_M_SEEDS:-107 108}; do
        gemm_step "x_box_wide_$seed" 200 --shuffle $seed --blocks 5 --columns default,xb \
          --shapes "$(shapes "40 100 200 224 240 300 720 1000 1100 2000" "2880 5120 7168" "1024 9216")"
      done
      step x_box_wide_tests 300 mpirun -n 2 python3 -m pytest -q -p no:cacheprovider \
        tests/gpu/test_x_loads_gpu.py -k "on_pairs or test_gemm_only_x_box" ;;
    quads128)  # (bg)'s lead: 128-row tiles on 4x1 clusters at three / four tile rows, K >= 4096
      for seed in ${SMALL_M_SEEDS:-111 112}; do
        gemm_step "quads128_$seed" 200 --shuffle $seed --blocks 5 \
          --columns default,c4+bn64,c4+bn96,c4+bn128 \
          --shapes "$(shapes "320 384 448 512" "2304 2560 2880 3072" "4096 9216")"
      done ;;
    h200-grid)  # the grid's shapes below 0.97x on the H200 (bf): the forms k1024-sweep ran on an H100
      for seed in ${SMALL_M_SEEDS:-103 104}; do
        gemm_step "h200_grid_$seed" 200 --shuffle $seed --blocks 5 \
          --columns default,stages5,stages6,stages7,c2+bn224,c2+bm64+bn112+stages10,tp256,c2+bn112+pp \
          --shapes "128,7168,1024;128,8192,1024;256,7168,1024;256,8192,1024;256,8192,4096;512,7168,1024"
      done ;;
    small-m-fill)  # PERF.md (be)
      for seed in ${SMALL_M_SEEDS:-93 94}; do
        gemm_step "small_m_fill_wide_$seed" 170 --shuffle $seed --blocks 5 \
          --columns default,c4+bm64+bn160+stages7,c4+bm64+bn192+stages6,c4+bm64+bn224+stages5,c4+bm64+bn256+stages5 \
          --shapes "200,5120,1024;256,5120,1024;200,5120,4096;256,5120,4096;256,5120,9216;256,7168,1024;256,7168,4096;256,7168,9216;256,8192,1024;256,8192,4096"
        gemm_step "small_m_fill_wide128_$seed" 170 --shuffle $seed --blocks 5 \
          --columns default,c4+bn224,c4+bn256,c4+bn192 \
          --shapes "512,7168,1024;512,7168,4096;512,7168,9216;512,8192,1024;448,7168,1024"
        gemm_step "small_m_fill_quads_$seed" 170 --shuffle $seed --blocks 5 \
          --columns default,c4+bm64+bn96+stages10,c4+bm64+bn128+stages9 \
          --shapes "200,1536,1024;200,2048,1024;200,2880,1024;200,3072,1024;224,2560,1024;224,2880,1024;256,1536,1024;256,2048,1024;256,3072,1024;256,2880,2048;256,3072,2048;200,2880,2048;224,2880,4096;200,3072,4096;256,2048,4096;256,2880,9216;200,3072,9216;256,3072,9216"
        gemm_step "small_m_fill_rows4_$seed" 170 --shuffle $seed --blocks 5 \
          --columns default,c2+bn96,c2+bn80,c2+bn112,c2+bn128,bn96 \
          --shapes "$(shapes "384 448 512" "2048 2560 2880 3072 3584" "1024 2048")"
      done ;;
    tma-desc)
      step tma_desc 120 python3 benchmarks/tma_desc_probe.py${RSAR_BUILD_ONLY:+ --build-only} \
        --json "$out/tma_desc.json" ;;
    new|newpp|newbias)
      [ "$s" != newbias ] && step pingpong 300 mpirun -n 2 python3 scripts/bench.py --plan-sweep --only "$PINGPONG" \
        --N 7168 8192 --K 1024 4096 --M 4096 8192 16384 --iters 30 --blocks 3 \
        --json "$out/pingpong.json" --md "$out/pingpong.md"
      [ "$s" = newpp ] && continue
      step bias 300 mpirun -n 2 python3 scripts/bench.py --bias --only "$BIAS" \
        --N 7168 8192 --K 1024 4096 --M 128 512 2048 8192 --iters 30 --blocks 3 \
        --json "$out/bias.json" --md "$out/bias.md"
      step tp_bias 120 mpirun -n 2 python3 scripts/tp_worker.py --bias --json "$out/tp_bias.json" ;;
    fp8|fp8a|fp8b)
      scales="tensor row block"
      [ "$s" = fp8a ] && scales=tensor
      [ "$s" = fp8b ] && scales="row block"
      [ "$s" != fp8b ] && step fp8_tests 300 mpirun -n 2 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_gpu.py
      for sc in $scales; do
        step "fp8_$sc" 300 mpirun -n 2 python3 scripts/bench.py --dtype e4m3 --scales "$sc" \
          --N 7168 8192 --K 1024 4096 --M 256 1024 4096 16384 \
          --json "$out/fp8_$sc.json" --md "$out/fp8_$sc.md"
      done
      [ "$s" != fp8a ] && step fp8_tp 120 mpirun -n 2 python3 scripts/tp_worker.py --dtype e4m3 --json "$out/fp8_tp.json" ;;
  esac
done
