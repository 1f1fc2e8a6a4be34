"""Every sm90 kernel variant compiles for sm_90a on this (GPU-less) machine, and its PTX
carries the instructions the variant exists for."""
from __future__ import annotations

import pytest

pytest.importorskip("cutlass")

from ptx_checks import assert_protocol_ptx  # noqa: E402
from launch.cache import KernelCache  # noqa: E402
from launch.variant import Variant  # noqa: E402

VARIANTS = [
    Variant("sm_90a", 256, 2, "rs", "unicast"),
    Variant("sm_90a", 128, 2, "ar", "unicast"),
    Variant("sm_90a", 128, 4, "rs", "multicast"),
    Variant("sm_90a", 256, 2, "ar", "multicast"),
    Variant("sm_90a", 256, 2, "gemm", "unicast"),
    Variant("sm_90a", 256, 2, "gemm", "unicast", epi_slots=4),  # tuning knob
    # 2x1 clusters sharing w's tile by TMA multicast
    Variant("sm_90a", 256, 2, "rs", "unicast", 2),
    Variant("sm_90a", 128, 4, "ar", "unicast", 2),
    Variant("sm_90a", 256, 2, "gemm", "unicast", 2),
    # partials pushed as bulk copies from a swizzled sub-tile ring
    Variant("sm_90a", 256, 2, "rs", "unicast", push="tma"),
    Variant("sm_90a", 128, 4, "ar", "unicast", 2, push="tma"),
    Variant("sm_90a", 256, 2, "gemm", "unicast", push="tma"),
    Variant("sm_90a", 256, 2, "ar", "unicast", push="tma_all"),
    # 64-wide tiles (small M: twice the tiles to spread over the SMs)
    Variant("sm_90a", 64, 2, "rs", "unicast", push="tma"),
    Variant("sm_90a", 64, 4, "ar", "unicast", push="tma_all"),
    Variant("sm_90a", 64, 2, "gemm", "unicast"),
    # 224-wide tiles (N=7168 = 32 x 224: the last wave of M 1024-2048 fills every lane)
    Variant("sm_90a", 224, 2, "rs", "unicast", push="tma"),
    Variant("sm_90a", 224, 2, "gemm", "unicast", 2, push="tma"),
    # the peers-first schedule (compiled in), and 2x1 clusters walking bands of pair rows
    Variant("sm_90a", 64, 2, "rs", "unicast", push="tma", peers_first=1),
    Variant("sm_90a", 128, 4, "ar", "unicast", push="tma_all", peers_first=1),
    Variant("sm_90a", 256, 2, "gemm", "unicast", 2, push="tma"),
    # 2x1 clusters pairing tiles along N (x's tile multicast instead of w's)
    Variant("sm_90a", 64, 2, "gemm", "unicast", 2, push="tma", pair_n=1),
    Variant("sm_90a", 64, 2, "rs", "unicast", 2, push="tma", pair_n=1),
    Variant("sm_90a", 64, 2, "rs", "unicast", 2, push="tma", peers_first=1, pair_n=1),
    Variant("sm_90a", 128, 4, "ar", "unicast", 2, push="tma_all", pair_n=1),
    # 4 mainloop stages, the sub-tile ring holding part of the tile (6 of 7 / 4 of 8 slots)
    Variant("sm_90a", 224, 2, "rs", "unicast", 2, push="tma", stages=4),
    Variant("sm_90a", 256, 2, "ar", "unicast", push="tma_all", stages=4),
    # push-all AR: every tile to every peer, every tile reduced on every rank (the 64-wide
    # one as launched by default at one tile row, with PDL)
    Variant("sm_90a", 64, 2, "ar", "unicast", push="tma_all", push_all=1, pdl=1),
    Variant("sm_90a", 224, 2, "ar", "unicast", push="tma_all", push_all=1),
    # programmatic dependent launch
    Variant("sm_90a", 64, 2, "rs", "unicast", push="tma", peers_first=1, pdl=1),
    Variant("sm_90a", 224, 2, "gemm", "unicast", 2, push="tma", pdl=1),
    # reductions and AR's copy-out loading one sub-tile ahead, as world-2 unicast kernels
    # launch by default
    Variant("sm_90a", 224, 2, "rs", "unicast", push="tma", pdl=1, prefetch=1),
    Variant("sm_90a", 256, 2, "ar", "unicast", 2, push="tma_all", pdl=1, prefetch=1),
    Variant("sm_90a", 224, 2, "ar", "unicast", push="lsu", peers_first=1, pdl=1, prefetch=1),
    # AR copying each pushed tile's result back two rounds after the push (lag-round plans)
    Variant("sm_90a", 224, 2, "ar", "unicast", push="tma_all", pdl=1, prefetch=1, early_copy=1),
    Variant("sm_90a", 256, 2, "ar", "unicast", 2, push="tma_all", pdl=1, prefetch=1,
            early_copy=1),
    Variant("sm_90a", 128, 4, "ar", "unicast", push="lsu", peers_first=1, early_copy=1),
    # RS's round order with a shared tile row split between the two lists
    Variant("sm_90a", 256, 2, "rs", "unicast", push="tma", pdl=1, prefetch=1, split_row=1),
    # AR's default at one tile row over NVLink multicast, with PDL as launched by default
    # (compiled only: multicast is off here)
    Variant("sm_90a", 64, 2, "ar", "multicast", 2, pair_n=1, pdl=1),
    # the flat peers-first order AR takes at five and six tile rows, over NVLink multicast
    Variant("sm_90a", 128, 2, "ar", "multicast", peers_first=1, flat=1, pdl=1),
    # 160- / 192-wide tiles (N no 128-multiple width divides: a partial last tile column),
    # over both transports, on 2x1 clusters (80 / 96 rows of w a CTA) and 1-CTA
    Variant("sm_90a", 192, 2, "rs", "unicast", 2, push="tma", pdl=1, prefetch=1),
    Variant("sm_90a", 160, 2, "ar", "unicast", push="tma_all", pdl=1, prefetch=1),
    Variant("sm_90a", 192, 4, "rs", "multicast", pdl=1),
    Variant("sm_90a", 160, 2, "ar", "multicast", 2, pdl=1),
    Variant("sm_90a", 160, 2, "gemm", "unicast", push="tma", pdl=1, sk=1, tma_store=1),
]


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.describe().replace(" ", "-"))
def test_variant_ptx(ptx_of, v):
    ptx = ptx_of(v)
    assert ".target sm_90a" in ptx
    assert "wgmma.mma_async" in ptx
    assert f".m64n{v.bn}k16." in ptx  # one wgmma spans the tile's width
    assert "cp.async.bulk.tensor" in ptx
    # w's (pairs along N: x's) tile is multicast to both CTAs of a 2x1 cluster, and only then
    assert ("multicast::cluster" in ptx) == (v.cta_group == 2)
    assert ("cp.async.bulk.global.shared" in ptx) == (v.push != "lsu" and v.mode != "gemm")
    assert_protocol_ptx(ptx, v)


def test_cache_compiles_each_variant_once():
    calls = []
    cache = KernelCache(lambda v: calls.append(v) or object())
    v = VARIANTS[0]
    a = cache.get(v)
    assert cache.get(v) is a and cache.get(Variant(*[getattr(v, f) for f in ("arch", "bn", "world", "mode", "transport")])) is a
    cache.get(VARIANTS[1])
    assert calls == [v, VARIANTS[1]] and cache.compile_count == 2


def test_tma_all_sends_ar_results_as_bulk_copies(ptx_of):
    """AR with push="tma_all" adds bulk copies (one per peer and reduced sub-tile, which the
    compiler may emit in more than one code path)."""
    bulk = "cp.async.bulk.global.shared"
    partials = ptx_of(Variant("sm_90a", 256, 2, "ar", "unicast", push="tma")).count(bulk)
    both = ptx_of(Variant("sm_90a", 256, 2, "ar", "unicast", push="tma_all")).count(bulk)
    assert partials >= 8 and both >= partials + 8


def test_default_push_per_arch_transport_and_mode():
    from launch.rules import default_push
    from launch.variant import push_for
    assert default_push("sm_90a", "unicast", "rs") == "tma"
    assert default_push("sm_90a", "unicast", "ar") == "tma_all"
    assert default_push("sm_90a", "multicast", "ar") == "lsu"
    assert default_push("sm_100a", "unicast", "ar") == "lsu"
    # an AR op's gemm_only / an RS call must not compile a second, identical kernel
    assert push_for("tma_all", "gemm") == "tma" and push_for("tma_all", "rs") == "tma"
    assert push_for("tma_all", "ar") == "tma_all" and push_for("lsu", "ar") == "lsu"


@pytest.mark.parametrize("bn", [64, 128, 160, 192, 256])
def test_wgmma_width_follows_the_tile(ptx_of, bn):
    ptx = ptx_of(Variant("sm_90a", bn, 2, "rs", "unicast", push="tma"))
    assert f"wgmma.mma_async.sync.aligned.m64n{bn}k16" in ptx


@pytest.mark.parametrize("bn,push,slots", [(224, "tma", 6), (256, "tma", 4), (256, "tma_all", 4),
                                           (128, "tma", 4), (224, "lsu", 4)])
def test_stages_knob_shrinks_the_ring_to_fit(bn, push, slots):
    from launch.sm90_kernel import Sm90FusedKernel
    k = Sm90FusedKernel(Variant("sm_90a", bn, 2, "rs", "unicast", push=push, stages=4))
    assert k.ab_stage >= 4 and k.epi_slots == slots
    assert Sm90FusedKernel(Variant("sm_90a", bn, 2, "rs", "unicast", push=push)).ab_stage >= 3
    # a partial ring hands slots back per sub-tile (a tile's copies cannot all be in flight)
    assert k.defer_release == (push != "lsu" and slots >= bn // 32)


@pytest.mark.parametrize("cta_group,bn,stages", [(1, 64, 13), (2, 112, 10)])
def test_forced_stages_past_the_default_cap(ptx_of, tmp_path, cta_group, bn, stages):
    """A forced ``stages`` past ``DEFAULT_MAX_STAGES`` (cuBLAS's depth on 64-row tiles at
    small M, PERF.md (bc)) gets them, the ring at its 2 slots; unforced the same tiles keep 8.
    Compiled: the kernel's wgmmas unserialized, nothing spilled."""
    import re
    from launch.geometry import DEFAULT_MAX_STAGES
    from launch.sm90_kernel import Sm90FusedKernel
    from ptx_checks import ptxas_log
    v = Variant("sm_90a", bn, 2, "gemm", "unicast", cta_group, tma_store=1, pdl=1, push="tma",
                bm=64, stages=stages)
    k = Sm90FusedKernel(v)
    assert (k.ab_stage, k.epi_slots) == (stages, 2)
    assert Sm90FusedKernel(Variant("sm_90a", bn, 2, "gemm", "unicast", cta_group, tma_store=1,
                                   push="tma", bm=64)).ab_stage == DEFAULT_MAX_STAGES
    ptx = ptx_of(v)
    assert len(re.findall(r"mbarrier\.init\.shared", ptx)) >= 2 * stages
    log = ptxas_log(ptx, tmp_path)
    for code in ("C7514", "C7517", "C7520"):
        assert code not in log, log[-2000:]
    assert " 0 bytes spill stores" in log, log[-2000:]


def test_stages_knob_rejects_what_cannot_fit():
    from launch.sm90_kernel import Sm90FusedKernel
    with pytest.raises(ValueError, match="stages"):
        Sm90FusedKernel(Variant("sm_90a", 256, 2, "rs", "unicast", push="tma", stages=5))
    with pytest.raises(ValueError, match="stages must be"):
        Sm90FusedKernel(Variant("sm_90a", 128, 2, "rs", "unicast", stages=17))
    with pytest.raises(ValueError, match="not both"):
        Sm90FusedKernel(Variant("sm_90a", 128, 2, "rs", "unicast", epi_slots=2, stages=4))


def test_push_all_ar_has_no_results_round(ptx_of):
    """Push-all AR sends partials only: no reduced tiles to peers' OUT, no RESULT waits."""
    plain = ptx_of(Variant("sm_90a", 64, 2, "ar", "unicast", push="tma_all"))
    pa = ptx_of(Variant("sm_90a", 64, 2, "ar", "unicast", push="tma_all", push_all=1))
    # the owner scheme waits on result stamps in its copy-out; push-all has no copy-out, so
    # fewer timed waits (each inlines a %globaltimer read)
    assert pa.count("%globaltimer") < plain.count("%globaltimer")
    assert pa.count("cp.async.bulk.global.shared") >= 2  # to the peer, and parked


def test_push_all_refuses_what_it_cannot_combine():
    from launch.sm90_kernel import Sm90FusedKernel
    for kw in (dict(mode="rs"), dict(transport="multicast"), dict(cta_group=2),
               dict(push="lsu"), dict(peers_first=1), dict(world=4)):
        args = dict(mode="ar", transport="unicast", cta_group=1, push="tma_all", world=2)
        args.update(kw)
        with pytest.raises(ValueError, match="push-all"):
            Sm90FusedKernel(Variant("sm_90a", 64, args.pop("world"), args.pop("mode"),
                                    args.pop("transport"), args.pop("cta_group"), push_all=1,
                                    **args))


def test_prefetch_moves_loads_and_adds_none(ptx_of):
    """Loading a sub-tile ahead reorders a reduction's global loads: the kernel issues no
    more of them than without it (fewer: the direct reduction is compiled twice, the
    straight-line copy for whole sub-tiles loading the peer's chunks itself when not
    prefetching)."""
    for mode, push in (("rs", "tma"), ("ar", "tma_all")):
        plain = ptx_of(Variant("sm_90a", 224, 2, mode, "unicast", push=push, pdl=1))
        ahead = ptx_of(Variant("sm_90a", 224, 2, mode, "unicast", push=push, pdl=1, prefetch=1))
        assert plain != ahead
        assert 0 < ahead.count("ld.global.cg.v4") <= plain.count("ld.global.cg.v4")


def test_pdl_waits_before_any_global_access(ptx_of):
    """A PDL variant waits for the previous grid before its first global load or store."""
    import re
    for v in (Variant("sm_90a", 64, 2, "rs", "unicast", push="tma", peers_first=1, pdl=1),
              Variant("sm_90a", 224, 2, "gemm", "unicast", 2, push="tma", pdl=1),
              Variant("sm_90a", 64, 2, "ar", "unicast", push="tma_all", push_all=1, pdl=1),
              Variant("sm_90a", 64, 2, "ar", "multicast", 2, pair_n=1, pdl=1)):
        ptx = ptx_of(v)
        body = ptx[ptx.index(".entry"):]
        wait = body.index("griddepcontrol.wait")
        first_global = min(m.start() for m in re.finditer(
            r"\b(ld|st|atom|red)\.[a-z.:0-9]*global|cp\.async\.bulk\.tensor", body))
        assert wait < first_global
        assert "griddepcontrol.launch_dependents" in body
    plain = ptx_of(Variant("sm_90a", 64, 2, "rs", "unicast", push="tma", peers_first=1))
    assert "griddepcontrol" not in plain



def test_push_window_waits_for_completion_per_sub_tile(ptx_of):
    """A one-group push window turns the per-sub-tile wait for the copies' reads into a wait
    for their completion (``cp.async.bulk.wait_group 0``, not ``.read``), on RS and AR."""
    for mode, push, pf in (("rs", "tma", 1), ("ar", "tma_all", 0)):
        plain = ptx_of(Variant("sm_90a", 224, 2, mode, "unicast", push=push, peers_first=pf,
                               pdl=1, prefetch=1))
        windowed = ptx_of(Variant("sm_90a", 224, 2, mode, "unicast", push=push,
                                  peers_first=pf, pdl=1, prefetch=1, push_window=1))
        full = "cp.async.bulk.wait_group 0;"
        assert windowed.count(full) > plain.count(full)


def test_push_window_needs_bulk_copy_pushes():
    from launch.sm90_kernel import Sm90FusedKernel
    for kw in (dict(push="lsu", push_window=1), dict(push="tma", push_window=-1)):
        with pytest.raises(ValueError, match="push_window"):
            Sm90FusedKernel(Variant("sm_90a", 224, 2, "rs", "unicast", **kw))


def test_wider_push_window_still_waits_for_reads_before_a_slot_is_reused(ptx_of):
    """With a ring smaller than a tile (4 stages at BN=224) slots are released per sub-tile:
    a window of two must still wait for the copies' reads of the slot before that."""
    ptx = ptx_of(Variant("sm_90a", 224, 2, "rs", "unicast", push="tma", stages=4,
                         push_window=2))
    assert "cp.async.bulk.wait_group 1;" in ptx
    assert "cp.async.bulk.wait_group.read 0;" in ptx


def test_flat_peers_first_variant_compiles(ptx_of):
    """The flat peers-first order (``TilePlan.flat``) is a compiled-in schedule: its variant
    builds for sm_90a and carries the protocol's instructions; it refuses other shapes."""
    from launch.cache import kernel_for
    v = Variant("sm_90a", 128, 2, "rs", "unicast", push="tma", peers_first=1, flat=1, pdl=1,
                prefetch=1, push_window=1)
    assert_protocol_ptx(ptx_of(v), v)
    assert "flat=1" in v.describe()
    with pytest.raises(ValueError, match="flat"):
        kernel_for(Variant("sm_90a", 128, 2, "rs", "unicast", push="tma", flat=1))


def test_push_ctas_variant_stages_locally_and_pushes_from_its_own_ctas(ptx_of):
    """Push CTAs (``launch.plan.push_plan``): the MMA CTAs stamp staged tiles at GPU scope
    (a gpu fence, no extra system fence), the push CTAs copy them with 16-B L2 loads and
    stores and stamp owners after a system fence; it refuses what it cannot run."""
    from launch.cache import kernel_for
    base = dict(push="tma", peers_first=1, flat=1, pdl=1, prefetch=1, push_window=1)
    v = Variant("sm_90a", 256, 2, "rs", "unicast", **base, push_ctas=1)
    ptx = ptx_of(v)
    assert_protocol_ptx(ptx, v)
    plain = ptx_of(Variant("sm_90a", 256, 2, "rs", "unicast", **base))
    assert "fence.acq_rel.gpu" in ptx
    assert ptx.count("ld.global.cg.v4") > plain.count("ld.global.cg.v4")
    assert "push_ctas=1" in v.describe()
    for bad in (Variant("sm_90a", 256, 2, "ar", "unicast", push="tma_all", peers_first=1,
                        flat=1, push_ctas=1),
                Variant("sm_90a", 256, 2, "rs", "unicast", push="tma", push_ctas=1),
                Variant("sm_90a", 256, 2, "rs", "unicast", push="lsu", peers_first=1, flat=1,
                        push_ctas=1)):
        with pytest.raises(ValueError, match="push CTAs"):
            kernel_for(bad)


def test_lean_exit_drops_the_exit_fences_and_done_stamps(ptx_of):
    """The lean exit (``lean_exit``) drops the per-CTA and the last CTA's system fence and
    the ``done`` stamps (one store per peer slot), and nothing else; the GEMM alone has no
    protocol either way."""
    import re
    for mode, push in (("rs", "tma"), ("ar", "tma_all")):
        counts = []
        for lean in (0, 1):
            ptx = ptx_of(Variant("sm_90a", 128, 2, mode, "unicast", push=push, pdl=1,
                                 prefetch=1, lean_exit=lean))
            counts.append([len(re.findall(k, ptx)) for k in
                           (r"fence\.acq_rel\.sys", r"st\.relaxed\.sys", r"ld\.acquire\.sys")])
        (f0, s0, a0), (f1, s1, a1) = counts
        assert (f0 - f1, s0 - s1, a0 - a1) == (2, 2, 0), counts


@pytest.mark.parametrize("v", [
    Variant("sm_90a", 128, 2, "gemm", "unicast", push="tma", pdl=1),
    Variant("sm_90a", 256, 2, "gemm", "unicast", 2, push="tma", pdl=1),
    Variant("sm_90a", 224, 2, "gemm", "unicast", 2, push="tma", pdl=1, stages=4),
    Variant("sm_90a", 64, 2, "gemm", "unicast", 2, push="tma", pair_n=1, pdl=1),
    Variant("sm_90a", 256, 2, "gemm", "unicast", push="tma", pdl=1, sk=1),
], ids=lambda v: v.describe().replace(" ", "-"))
def test_tma_store_is_one_tensor_store_per_sub_tile(ptx_of, v):
    """``tma_store``: the plain GEMM's 16-B global stores of the output give way to one TMA
    tensor store per 128 x 32 sub-tile (the compiler may emit the unrolled sub-tile loop in
    more than one code path, so a multiple of the tile's sub-tiles), from the same ring."""
    from dataclasses import replace
    store = "cp.async.bulk.tensor.2d.global.shared::cta"
    threads = ptx_of(v)
    tma = ptx_of(replace(v, tma_store=1))
    assert store not in threads and "st.global.v4.b32" in threads
    n = tma.count(store)
    assert n and n % (v.bn // 32) == 0, n
    assert "st.global.v4.b32" not in tma
    assert "cp.async.bulk.wait_group.read" in tma


def test_tma_store_is_the_plain_gemms_with_bulk_copy_rows():
    from launch.cache import kernel_for
    for bad in (Variant("sm_90a", 128, 2, "rs", "unicast", push="tma", tma_store=1),
                Variant("sm_90a", 128, 2, "gemm", "unicast", push="lsu", tma_store=1)):
        with pytest.raises(ValueError, match="TMA stores"):
            kernel_for(bad)


def test_clusters_are_one_two_or_four_ctas():
    """Clusters of 3 tile rows left main (tag experiments/2026-12-05); 4 runs the plain GEMM
    only, widths of 32s (tests/test_quad_clusters.py)."""
    from launch.cache import kernel_for
    for g in (3, 5):
        with pytest.raises(ValueError, match="cta_group must be one of"):
            kernel_for(Variant("sm_90a", 192, 2, "gemm", "unicast", g, push="tma"))
    with pytest.raises(ValueError, match="4x1 clusters run the plain GEMM"):
        kernel_for(Variant("sm_90a", 192, 2, "rs", "unicast", 4, push="tma"))
