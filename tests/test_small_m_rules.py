"""The small-M defaults measured on 2x H200 (docs/PERF.md (i)): push-all AR at world 2, 64-wide
tiles for the plain GEMM of one tile row, programmatic dependent launch on sm90; and the
mainloop stages of plans with few tiles a lane (docs/PERF.md (t))."""
import pytest

import rsar_core.gemm_rsar as gemm_rsar
from launch.cache import CACHE
from launch.rules import auto_push_all, default_push, default_stages
from launch.variant import push_for
from launch.rules import choose_band, choose_flat, choose_gemm_width, choose_push_all, choose_sk
from launch.plan import make_plan
from op_stub import planning_op, retuned
from rsar_core.gemm_rsar import GemmRsAr


@pytest.mark.parametrize("M,K,want", [
    (1, 64, True), (128, 1024, True), (128, 9216, True), (129, 1024, False),
    (256, 1024, False), (256, 2048, False), (129, 4096, True), (256, 9216, True),
    (257, 9216, False), (512, 4096, False)])
def test_choose_push_all(M, K, want):
    assert choose_push_all(M, K) is want


@pytest.mark.parametrize("M,N,K,want", [
    (1, 7168, 4096, 64), (128, 8192, 1024, 64), (128, 384, 9216, 64), (129, 7168, 1024, None),
    (128, 8448, 1024, 64), (128, 8512, 1024, None), (128, 16384, 1024, None),
    (128, 7200, 1024, 64), (128, 8456, 1024, None),  # 113 / 133 tiles, the last one partial
    # two tile rows: at K <= 1024 where both rows of 64-wide tiles fit one round
    (256, 2880, 1024, 64), (129, 4096, 1024, 64), (256, 4224, 1024, 64),
    (256, 4225, 1024, None), (256, 2880, 2048, None), (256, 7168, 1024, None),
    (257, 2048, 1024, None)])
def test_choose_gemm_width(M, N, K, want):
    assert choose_gemm_width(M, N, K, 132) == want


def test_default_plans_follow_the_rules():
    p = make_plan(128, 7168, 1024, 2, 132, "ar", push_all=None)
    assert p.push_all and p.bn == 64 and p.grid == 112
    p = make_plan(256, 7168, 4096, 2, 132, "ar", push_all=None)
    assert p.push_all and p.tiles_m == 2
    # the owner plan where push-all loses or cannot run
    for M, K, world, mode, arch in [(256, 1024, 2, "ar", "sm_90a"), (512, 4096, 2, "ar", "sm_90a"),
                                    (128, 1024, 4, "ar", "sm_90a"), (128, 1024, 2, "rs", "sm_90a"),
                                    (128, 1024, 2, "ar", "sm_100a")]:
        assert not make_plan(M, 7168, K, world, 132, mode, arch=arch, push_all=None).push_all
    # any other forced knob keeps the owner plan; push_all=False (make_plan's default) too
    assert not make_plan(128, 7168, 1024, 2, 132, "ar", push_all=None, bn=128).push_all
    assert not make_plan(128, 7168, 1024, 2, 132, "ar", push_all=None, peers_first=True).push_all
    assert not make_plan(128, 7168, 1024, 2, 132, "ar").push_all
    g = make_plan(128, 7168, 1024, 2, 132, "gemm", bm=128)  # 128-row tiles asked for
    assert g.bn == 64 and g.cta_group == 1 and g.grid == 112
    g = make_plan(128, 7168, 1024, 2, 132, "gemm")  # choose_gemm_rows64_pairs
    assert (g.bm, g.bn, g.cta_group, g.grid) == (64, 112, 2, 128)
    assert make_plan(256, 7168, 1024, 2, 132, "gemm").bn != 64
    assert make_plan(128, 7168, 1024, 2, 132, "gemm", bn=128).bn == 128


def test_auto_push_all_only_where_a_kernel_runs_it():
    assert auto_push_all("ar", "unicast", "tma_all") is None
    assert auto_push_all("ar", "unicast", "tma") is None
    assert auto_push_all("ar", "unicast", "lsu") is False
    assert auto_push_all("ar", "multicast", "lsu") is False
    assert auto_push_all("rs", "unicast", "tma") is False


def _op(mode: str, transport: str = "unicast", arch: str = "sm_90a") -> GemmRsAr:
    """A GemmRsAr with the attributes planning reads and no device: its launch variants are
    what these tests look at."""
    return planning_op(mode, transport, arch)


@pytest.fixture
def variants(monkeypatch) -> list:
    seen: list = []
    monkeypatch.setattr(CACHE, "get", lambda v: seen.append(v) or (lambda *a: None))
    monkeypatch.setattr(gemm_rsar, "_pair_ctas", lambda index, sm_count: sm_count)
    monkeypatch.setattr(GemmRsAr, "pair_ctas", property(lambda self: self.sm_count))
    monkeypatch.setattr(GemmRsAr, "quad_ctas", property(lambda self: self.sm_count))
    return seen


def test_op_defaults_launch_pdl_and_push_all(variants):
    op = _op("ar")
    plan, _ = op._plan_and_kernel(128, 1024, "ar")
    assert plan.push_all and variants[-1].push_all == 1 and variants[-1].pdl == 1
    plan, _ = op._plan_and_kernel(1024, 1024, "ar")
    assert not plan.push_all and variants[-1].push_all == 0 and variants[-1].pdl == 1
    plan, _ = op._plan_and_kernel(128, 1024, "gemm")
    assert plan.bm == 64 and plan.cta_group == 2 and variants[-1].pdl == 1


def test_op_defaults_prefetch_where_reductions_run(variants):
    """Sub-tile-ahead loads: every fused world-2 unicast sm90 kernel, none elsewhere."""
    for mode in ("rs", "ar"):
        for M, K in ((128, 1024), (1024, 4096), (8192, 9216)):
            _op(mode)._plan_and_kernel(M, K, mode)
            assert variants[-1].prefetch == 1, (mode, M, K)
    _op("rs")._plan_and_kernel(1024, 1024, "gemm")
    assert variants[-1].prefetch == 0
    _op("ar", transport="multicast")._plan_and_kernel(1024, 1024, "ar")
    assert variants[-1].prefetch == 0
    _op("ar", arch="sm_100a")._plan_and_kernel(1024, 1024, "ar")
    assert variants[-1].prefetch == 0
    retuned(_op("rs"), prefetch=False)._plan_and_kernel(1024, 1024, "rs")
    assert variants[-1].prefetch == 0


def test_op_knobs_turn_the_defaults_off(variants):
    op = retuned(_op("ar"), push_all=False, pdl=False)
    plan, _ = op._plan_and_kernel(128, 1024, "ar")
    assert not plan.push_all and variants[-1].push_all == 0 and variants[-1].pdl == 0
    op = retuned(op, push_all=True)  # forced on where the rule would not pick it
    assert op._plan_and_kernel(1024, 1024, "ar")[0].push_all
    op = retuned(op, push_all=None, push="lsu")  # thread-store pushes: no push-all kernel
    assert not op._plan_and_kernel(128, 1024, "ar")[0].push_all


def test_op_push_all_never_for_rs_or_multicast(variants):
    assert not _op("rs")._plan_and_kernel(128, 1024, "rs")[0].push_all
    mc = _op("ar", transport="multicast")
    assert not mc._plan_and_kernel(128, 1024, "ar")[0].push_all
    assert variants[-1].pdl == 1
    sm100 = _op("ar", arch="sm_100a")
    assert not sm100._plan_and_kernel(128, 1024, "ar")[0].push_all
    assert variants[-1].pdl == 0


def test_op_push_window_rule(variants):
    """One sub-tile's pushes in flight at a time: AR owner plans and RS peers-first plans
    (sm90 unicast, bulk copies); RS's round plans, push-all AR, plain GEMMs, thread-store
    pushes, multicast and sm100 keep a tile's copies all in flight."""
    def window(mode: str, M: int, K: int, kernel_mode: str | None = None, **kw) -> int:
        op = _op(mode, **kw)
        op._plan_and_kernel(M, K, kernel_mode or mode)
        return variants[-1].push_window
    assert window("ar", 1024, 1024) == 1 and window("ar", 16384, 4096) == 1
    assert window("ar", 128, 1024) == 0  # push-all
    assert window("rs", 1024, 1024) == 1 and window("rs", 1024, 4096) == 1  # peers-first
    assert window("rs", 16384, 1024) == 0 and window("rs", 2048, 4096) == 0
    assert window("rs", 1024, 1024, "gemm") == 0
    assert window("ar", 1024, 1024, transport="multicast") == 0
    assert window("ar", 1024, 1024, arch="sm_100a") == 0
    retuned(_op("rs"), push_window=True)._plan_and_kernel(16384, 1024, "rs")
    assert variants[-1].push_window == 1
    retuned(_op("rs"), push_window=False)._plan_and_kernel(1024, 1024, "rs")
    assert variants[-1].push_window == 0
    retuned(_op("rs"), push="lsu", push_window=True)._plan_and_kernel(1024, 1024, "rs")
    assert variants[-1].push_window == 0


def test_op_flat_knob_launches_the_flat_variant(variants):
    op = retuned(_op("rs"), flat=True)
    plan, _ = op._plan_and_kernel(576, 4096, "rs")
    assert plan.flat and variants[-1].flat == 1 and variants[-1].peers_first == 1
    plan, _ = op._plan_and_kernel(576, 4096, "gemm")
    assert not plan.flat and variants[-1].flat == 0
    op = retuned(op, flat=False)  # forced off where the rule would take it
    plan, _ = op._plan_and_kernel(576, 4096, "rs")
    assert not plan.flat and variants[-1].flat == 0
    op = retuned(op, flat=None)  # the rule: five and six tile rows at K <= 4096
    plan, _ = op._plan_and_kernel(576, 4096, "rs")
    assert plan.flat and variants[-1].flat == 1
    plan, _ = op._plan_and_kernel(512, 4096, "rs")
    assert not plan.flat and variants[-1].flat == 0


@pytest.mark.parametrize("M,K,mode,want", [
    (513, 1024, "rs", True), (576, 2048, "rs", True), (704, 4096, "ar", True),
    (768, 4096, "rs", True), (512, 4096, "rs", False), (769, 2048, "rs", False),
    (640, 9216, "rs", False), (640, 4097, "ar", False), (640, 4096, "gemm", False)])
def test_choose_flat(M, K, mode, want):
    assert choose_flat(M, K, mode) is want


def test_flat_rule_yields_to_forced_knobs():
    assert make_plan(640, 7168, 4096, 2, 132, "rs").flat
    assert make_plan(640, 7168, 4096, 2, 132, "ar", push_all=None).flat
    assert not make_plan(640, 7168, 4096, 2, 132, "ar", push_all=None).push_all
    assert not make_plan(640, 7168, 4096, 2, 132, "rs", arch="sm_100a").flat
    for kw in ({"bn": 224}, {"cta_group": 2}, {"lag": 1}, {"peers_first": True},
               {"peers_first": False}, {"flat": False}):
        p = make_plan(640, 7168, 4096, 2, 132, "rs", **kw)
        assert not p.flat, kw
    # forced on where the rule says no: the same order, at the width of least lane cost
    p = make_plan(1152, 7168, 9216, 2, 132, "rs", flat=True)
    assert p.flat and p.peers_first and p.rounds == 2


@pytest.mark.parametrize("M,K,mode,want", [
    (257, 4096, "rs", True), (1152, 9216, "ar", True), (640, 4096, "ar", True),
    (256, 4096, "rs", False), (1153, 9216, "rs", False), (640, 2048, "rs", False),
    (640, 9216, "gemm", False)])
def test_choose_sk(M, K, mode, want):
    assert choose_sk(M, K, mode) is want


def test_split_k_tail_rule_takes_the_flat_plan_only_where_it_splits():
    # 640 x 7168: 280 units, 16 in the last round -> 8 pieces each
    p = make_plan(640, 7168, 9216, 2, 132, "ar", push_all=None)
    assert p.flat and p.sk == 8 and not p.push_all
    assert make_plan(640, 7168, 9216, 2, 132, "rs").sk == 8
    # 704 x 7168: 72 units in the last round, no room for two pieces: the plan without it
    q = make_plan(704, 7168, 9216, 2, 132, "rs")
    assert not q.sk and q == make_plan(704, 7168, 9216, 2, 132, "rs", sk=False)
    # K=2048, forced knobs, sm100, the plain GEMM: never
    assert not make_plan(640, 7168, 2048, 2, 132, "rs").sk
    for kw in ({"bn": 128}, {"cta_group": 1}, {"lag": 1}, {"peers_first": True},
               {"flat": False}, {"sk": False}):
        assert not make_plan(640, 7168, 9216, 2, 132, "rs", **kw).sk, kw
    assert not make_plan(640, 7168, 9216, 2, 132, "rs", arch="sm_100a").sk
    assert not make_plan(640, 7168, 9216, 2, 132, "gemm").sk


def test_op_split_k_variant_is_the_precompiled_one(variants):
    """The op launches the split-K tail's kernel as one variant (``sk`` 1) whatever the plan's
    piece count, the variant ``scripts/precompile.py`` lists, so a precompiled cache serves it."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "precompile", Path(__file__).resolve().parents[1] / "scripts" / "precompile.py")
    precompile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(precompile)
    listed = set(precompile.variants("sm_90a", 2, ["unicast"]))
    for M, K, mode in [(640, 9216, "rs"), (640, 9216, "ar"), (576, 4096, "rs"), (320, 9216, "ar")]:
        op = _op(mode)
        plan, _ = op._plan_and_kernel(M, K, mode)
        assert plan.sk > 1 and variants[-1].sk == 1, (M, K, mode, plan.sk)
        assert variants[-1] in listed, variants[-1].describe()


def test_op_split_row_variant_is_the_precompiled_one(variants):
    """RS at M 1025-1152, N=7168 splits the shared tile row (``TilePlan.split_row``): the op
    launches the ``split_row`` variant that ``scripts/precompile.py`` lists; forced off, the
    whole-row variant of the old plan."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "precompile", Path(__file__).resolve().parents[1] / "scripts" / "precompile.py")
    precompile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(precompile)
    listed = set(precompile.variants("sm_90a", 2, ["unicast"]))
    op = _op("rs")
    for M, K in [(1088, 1024), (1152, 4096), (1152, 9216)]:
        plan, _ = op._plan_and_kernel(M, K, "rs")
        assert plan.split_row and variants[-1].split_row == 1 and variants[-1].bn == 256
        assert variants[-1] in listed, variants[-1].describe()
    plan, _ = retuned(op, split_row=False)._plan_and_kernel(1152, 4096, "rs")
    assert not plan.split_row and variants[-1].split_row == 0 and variants[-1].bn == 224


@pytest.mark.parametrize("M,N,K,mode,want", [
    (1024, 7168, 4096, "rs", 4), (1024, 7168, 9216, "ar", 4), (896, 7168, 2048, "rs", 4),
    (512, 7168, 4096, "gemm", 4), (1536, 7168, 4096, "gemm", 4), (512, 8192, 9216, "gemm", 4),
    # K=1024 ties; 4 tiles a lane lose (GEMM alone, M=2048); 256-wide plans with 2 tiles a lane
    (1024, 7168, 1024, "rs", 0), (2048, 7168, 4096, "gemm", 0), (1024, 8192, 4096, "rs", 0),
    (1024, 8192, 4096, "gemm", 0), (4096, 7168, 4096, "rs", 0),
    # a split shared row loses (RS 1152 x 7168); 128-wide plans keep 6 stages anyway
    (1152, 7168, 4096, "rs", 0), (512, 7168, 4096, "rs", 0)])
def test_default_stages(M, N, K, mode, want):
    push = default_push("sm_90a", "unicast", mode)
    p = make_plan(M, N, K, 2, 132, mode, push_all=auto_push_all(mode, "unicast", push))
    assert default_stages("sm_90a", "unicast", push_for(push, mode), p) == want, p


@pytest.mark.parametrize("M,N,K,want", [
    # the GEMM alone with TMA stores: 224 / 256 wide at K <= 1024, whatever a lane's tiles
    (2048, 7168, 1024, 4), (1024, 8192, 1024, 4), (512, 7168, 1024, 4), (16384, 8192, 1024, 4),
    # pairs of 112- / 128-wide tiles at two tile rows keep theirs
    (256, 7168, 1024, 0), (256, 8192, 1024, 0),
    # from K=2048 the fused rule's few tiles a lane (the runs disagreed there)
    (2048, 7168, 4096, 0), (8192, 8192, 9216, 0), (512, 7168, 4096, 4),
    # 128-wide plans keep their 6 stages
    (3000, 7168, 1024, 0)])
def test_default_stages_gemm_tma_store(M, N, K, want):
    p = make_plan(M, N, K, 2, 132, "gemm", bn=128 if M == 3000 else None)
    assert default_stages("sm_90a", "unicast", "tma", p, tma_store=1) == want, p
    if K <= 1024:  # the threads' copy-out keeps the whole-tile ring
        assert default_stages("sm_90a", "unicast", "tma", p, tma_store=0) == 0, p


def test_gemm_stages_rule_for_every_dtype():
    """``resolve`` gives the GEMM alone's short-ring rule to every dtype at the same plan:
    fp16 at 2048 x 7168 x 1024, fp8 at depth 2048 (the bf16 plan of depth 1024), and none to
    fp8 at depth 4096 (plan depth 2048). bf16 runs ping-pong there since (aq), at 5 stages
    (``choose_gemm_pingpong`` is bf16's alone)."""
    from launch.resolve import Dtypes, Hardware, Shape, resolve_variant
    hw = Hardware("sm_90a", 132, 132)
    got = {(name, K): resolve_variant(Shape(2048, 7168, K, "gemm"), hw, 2, "unicast", d).stages
           for name, K, d in (("bf16", 1024, Dtypes()), ("f16", 1024, Dtypes("f16")),
                              ("e4m3", 2048, Dtypes("bf16", "e4m3")),
                              ("e4m3", 4096, Dtypes("bf16", "e4m3")))}
    assert got == {("bf16", 1024): 5, ("f16", 1024): 4, ("e4m3", 2048): 4, ("e4m3", 4096): 0}


def test_pingpong_plans_take_five_stages():
    """The plain GEMM's ping-pong plans (``choose_gemm_pingpong``, K <= 1024) 176 / 192 wide
    run 5 mainloop stages behind the short ring, as does ping-pong forced on those plans
    (fp16 too: the fill rules are bf16's); ping-pong forced where five stages were not timed
    (K=4096, 128 wide, 1-CTA) keeps the kernel's 4."""
    from launch.resolve import Dtypes, Hardware, Shape, Tuning, resolve_variant
    hw = Hardware("sm_90a", 132, 132)

    def knobs(M, N, K, d=Dtypes(), **t):
        v = resolve_variant(Shape(M, N, K, "gemm"), hw, 2, "unicast", d, Tuning(**t))
        return v.pingpong, v.stages, v.bn

    for M in (4096, 8192, 16384):
        for N in (7168, 8192):
            pp, stages, bn = knobs(M, N, 1024)
            assert (pp, stages) == (1, 5) and bn in (176, 192), (M, N)
            assert knobs(M, N, 1024, Dtypes("f16"), pingpong=True, bn=bn,
                         cta_group=2) == (1, 5, bn)
    assert knobs(4096, 7168, 4096, pingpong=True, bn=192)[:2] == (1, 0)
    assert knobs(4096, 7168, 1024, pingpong=True, bn=128)[:2] == (1, 0)
    assert knobs(4096, 7168, 1024, pingpong=True, bn=192, cta_group=1)[:2] == (1, 0)
    assert knobs(4096, 7168, 1024, tma_store=False)[0] == 0
    assert knobs(2048, 7168, 1024)[:2] == (1, 5)  # ping-pong from 3 tiles a lane (aq)
    assert knobs(2048, 7168, 1024, Dtypes("f16"))[:2] == (0, 4)  # bf16's rule only
    assert knobs(1024, 7168, 1024)[:2] == (0, 4)  # 2 tiles a lane: 224 wide, 4


def test_default_stages_only_where_measured():
    p = make_plan(1024, 7168, 4096, 2, 132, "rs")
    assert default_stages("sm_90a", "unicast", "tma", p) == 4
    assert default_stages("sm_90a", "unicast", "lsu", p) == 0
    assert default_stages("sm_90a", "multicast", "tma", p) == 0
    assert default_stages("sm_100a", "unicast", "tma", p) == 0


def test_op_launches_the_stages_rule_and_its_knob(variants):
    """The op launches ``default_stages``'s variant, which ``scripts/precompile.py`` lists;
    ``Tuning.stages`` overrides it (3: the whole-tile ring of the rule's absence), and a forced
    ring depth leaves the stages to the kernel."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "precompile", Path(__file__).resolve().parents[1] / "scripts" / "precompile.py")
    precompile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(precompile)
    listed = set(precompile.variants("sm_90a", 2, ["unicast"]))
    for mode in ("rs", "ar"):
        op = _op(mode)
        op._plan_and_kernel(1024, 4096, mode)
        assert variants[-1].stages == 4 and variants[-1] in listed, variants[-1].describe()
        op._plan_and_kernel(1024, 4096, "gemm")
        assert variants[-1].stages == 4 and variants[-1] in listed, variants[-1].describe()
        op._plan_and_kernel(4096, 4096, mode)
        assert variants[-1].stages == 0
        retuned(op, stages=3)._plan_and_kernel(1024, 4096, mode)
        assert variants[-1].stages == 3
        retuned(op, stages=3, epi_slots=2)._plan_and_kernel(1024, 4096, "gemm")
        assert variants[-1].stages == 0 and variants[-1].epi_slots == 2


@pytest.mark.parametrize("M,N,K,bn,cta_group", [
    # odd tile rows: pairs leave a half-empty row, 1-CTA tiles take fewer rounds
    (1152, 7168, 4096, 256, 1), (384, 10240, 9216, 256, 1), (2944, 7168, 2048, 256, 1),
    # few tiles: 64-wide tiles on 128 SMs instead of 128-wide pairs on 64
    (256, 4096, 2048, 64, 1), (512, 2048, 9216, 64, 1), (384, 5120, 2048, 128, 1),
    # the grid's powers of two keep their pairs (112 wide: FINE_GAIN, docs/PERF.md (ai))
    (256, 7168, 4096, 112, 2), (2048, 7168, 9216, 224, 2), (4096, 8192, 4096, 256, 2),
    (16384, 7168, 9216, 256, 2), (640, 2048, 4096, 112, 2)])
def test_gemm_takes_one_cta_tiles_where_pairs_cost_more(M, N, K, bn, cta_group):
    p = make_plan(M, N, K, 2, 132, "gemm")
    assert (p.bn, p.cta_group) == (bn, cta_group), p
    if cta_group == 1:
        assert p.band == choose_band(K, 1)


def test_gemm_one_cta_choice_yields_to_forced_knobs():
    assert make_plan(1152, 7168, 4096, 2, 132, "gemm", cta_group=2).cta_group == 2
    assert make_plan(1152, 7168, 4096, 2, 132, "gemm", bn=224).bn == 224
    # fused plans are not touched (they have their own cluster rule)
    assert make_plan(2048, 7168, 4096, 2, 132, "rs").cta_group == 2


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("transport", ["unicast", "multicast"])
def test_an_op_that_forces_nothing_launches_default_variant(variants, arch, transport):
    """``launch.resolve`` of an untuned call (what precompile.py lists and
    tests/grid_plans.json pins) is what the op launches."""
    from launch.resolve import Hardware, Shape, resolve
    for mode in ("rs", "ar"):
        op = _op(mode, transport, arch)
        for M in (1, 128, 200, 576, 1024, 1152, 4096, 16384):
            for K in (1024, 2048, 4096, 9216):
                for m in (mode, "gemm") if transport == "unicast" else (mode,):
                    plan, _ = op._plan_and_kernel(M, K, m)
                    want = resolve(Shape(M, 7168, K, m), Hardware(arch, 132), 2, transport)
                    assert (plan, variants[-1]) == want, (M, K, m)


def test_lean_exit_knob(variants):
    """``Tuning.lean_exit``: None follows ``default_lean_exit`` (off until timed), True turns
    it on for fused sm90 kernels only, never for the GEMM alone or sm100."""
    from launch.rules import default_lean_exit
    op = _op("rs")
    op._plan_and_kernel(1024, 1024, "rs")
    assert variants[-1].lean_exit == default_lean_exit("sm_90a", "unicast", "rs") == 0
    op = retuned(op, lean_exit=True)
    for mode, want in (("rs", 1), ("gemm", 0)):
        op._plan_and_kernel(1024, 1024, mode)
        assert variants[-1].lean_exit == want, mode
    retuned(_op("ar", arch="sm_100a"), lean_exit=True)._plan_and_kernel(1024, 1024, "ar")
    assert variants[-1].lean_exit == 0


def test_pingpong_knob(variants):
    """``Tuning.pingpong``: None leaves it to ``choose_gemm_pingpong`` (the GEMM alone at
    K <= 1024 with 3+ tiles a lane, at K >= 4096 where its model says so (176 wide below
    M=4096), never between; never fused), False turns it off; forced, it reaches the variant
    where the plan's width fits (192 on the GEMM alone, 160 fused), turns the split-K tail
    off in the plan, and is refused before any launch elsewhere, the op still usable after."""
    from rsar_core.errors import RsarValueError
    op = _op("rs")
    for M, K, mode, want in ((4096, 1024, "gemm", 1), (4096, 9216, "gemm", 1),
                             (4096, 2048, "gemm", 0), (2048, 9216, "gemm", 1),
                             (1536, 9216, "gemm", 0),
                             (2048, 1024, "gemm", 1), (1024, 1024, "gemm", 0),
                             (4096, 1024, "rs", 0), (4096, 9216, "rs", 0)):
        plan, _ = op._plan_and_kernel(M, K, mode)
        assert variants[-1].pingpong == want == plan.pingpong, (M, K, mode)
        if want:
            assert plan.cta_group == 2 and plan.bn <= 192
    retuned(op, pingpong=False)._plan_and_kernel(4096, 1024, "gemm")
    assert variants[-1].pingpong == 0
    retuned(op, tma_store=False)._plan_and_kernel(4096, 1024, "gemm")
    assert variants[-1].pingpong == 0 and variants[-1].tma_store == 0
    op = retuned(op, pingpong=True, bn=192)
    for M in (300, 4096):
        plan, _ = op._plan_and_kernel(M, 9216, "gemm")
        assert variants[-1].pingpong == 1 and variants[-1].bn == 192 and not plan.sk
    with pytest.raises(RsarValueError, match="at most 160"):
        op._plan_and_kernel(4096, 1024, "rs")
    retuned(op, bn=128)._plan_and_kernel(4096, 1024, "rs")
    assert variants[-1].pingpong == 1
    with pytest.raises(RsarValueError, match="at most 192"):
        retuned(op, bn=256)._plan_and_kernel(4096, 1024, "gemm")
    retuned(op, pingpong=False)._plan_and_kernel(4096, 1024, "gemm")
    assert variants[-1].pingpong == 0
    with pytest.raises(RsarValueError, match="sm90"):
        retuned(_op("ar", arch="sm_100a"), pingpong=True)._plan_and_kernel(1024, 1024, "ar")


@pytest.mark.parametrize("M,N,K,want", [
    (256, 7168, 1024, True), (200, 7168, 1024, True), (256, 8192, 1024, True),
    (240, 8192, 512, True),
    (256, 4352, 1024, False), (256, 2880, 1024, False),  # rounds filling 78 / 52 SMs
    (128, 7168, 1024, False), (257, 7168, 1024, False), (512, 8192, 1024, False)])
def test_gemm_pairs_two_tile_rows_at_short_k(M, N, K, want):
    """``choose_gemm_pairs_full_round``: the bf16 GEMM alone at K <= 1024 pairs its two tile
    rows on 2x1 clusters at the width the other rules chose, where that round keeps 90% of
    the SMs busy; fp16, forced knobs and the fused ops keep their plans."""
    from launch import Dtypes, Hardware, Shape, Tuning, resolve
    from launch.rules import choose_gemm_pairs_full_round
    hw = Hardware("sm_90a", 132)
    plan, _ = resolve(Shape(M, N, K, "gemm"), hw, 2, "unicast")
    assert choose_gemm_pairs_full_round(M, K, 2 * -(-N // plan.bn), 132) is want
    if want:
        # the measured plans: the 1-CTA rules' width (FINE_GAIN's 112 at N=7168), paired
        assert (plan.cta_group, plan.tiles_m, plan.band) == (2, 2, 0)
        assert plan.bn == {7168: 112, 8192: 128}[N]
        # measured on bf16 only; a forced cta_group wins
        assert resolve(Shape(M, N, K, "gemm"), hw, 2, "unicast", Dtypes("f16"))[0].cta_group == 1
        assert resolve(Shape(M, N, K, "gemm"), hw, 2, "unicast",
                       tuning=Tuning(cta_group=1))[0].cta_group == 1
    elif K <= 1024 and M > 128:  # 1-CTA tiles, or 4x1 clusters (choose_gemm_quads)
        assert plan.cta_group == 1 or (plan.cta_group, plan.bm, plan.bn) == (4, 64, 96)
    elif K <= 1024:  # one tile row: 64-row tiles paired (choose_gemm_rows64_pairs)
        assert (plan.bm, plan.cta_group) == (64, 2)
    for mode in ("rs", "ar"):
        assert resolve(Shape(M, N, K, mode), hw, 2, "unicast")[0] == \
            make_plan(M, N, K, 2, 132, mode, push_all=None)


@pytest.mark.parametrize("N", [2880, 5120, 7168, 8192])
@pytest.mark.parametrize("K", [1024, 4096, 9216])
@pytest.mark.parametrize("M", [129, 160, 192, 193, 200, 256])
def test_gemm_tail_row_one_cta(M, N, K):
    """``choose_gemm_tail_one_cta``: where the bf16 GEMM alone at K <= 1024 would pair two
    tile rows whose last holds 64 rows or fewer, it runs the 1-CTA plan a forced cta_group=1
    gets; at longer K the pairs stay. Either way x's box is on that row; with the box off, in
    fp16 (unmeasured), from 65 rows in the last row and in the fused ops, the plans stay."""
    from launch import Dtypes, Hardware, Shape, Tuning, resolve
    from launch.resolve import x_boxes
    from launch.rules import X_BOX_UNEVEN, choose_gemm_tail_one_cta, pairs_one_row
    hw = Hardware("sm_90a", 132)
    plan, v = resolve(Shape(M, N, K, "gemm"), hw, 2, "unicast")
    unboxed, _ = resolve(Shape(M, N, K, "gemm"), hw, 2, "unicast", tuning=Tuning(x_box=False))
    one_cta, _ = resolve(Shape(M, N, K, "gemm"), hw, 2, "unicast", tuning=Tuning(cta_group=1))
    moved = unboxed.cta_group == 2 and choose_gemm_tail_one_cta(M, K)
    assert choose_gemm_tail_one_cta(M, K) is (M <= 192 and K <= 1024)
    if plan.cta_group == 4:  # choose_gemm_quads (tests/test_small_m_deep.py) goes first
        assert M > 192 and K != 2048 and plan.bm == 64
        return
    # x's box of the last tile row's M - 128 rows (those dividing no tile: X_BOX_UNEVEN)
    box = next((r for r in x_boxes(128, X_BOX_UNEVEN) if M - 128 <= r), 0)
    if pairs_one_row(plan):  # and choose_gemm_pairs_short's one pair row (PERF.md (bf))
        assert M >= 192 and N >= 4608 and plan.bn in (80, 96)
        assert v.x_rows == box
        return
    if moved:
        assert plan == one_cta
    else:
        assert plan == unboxed
    if not plan.pingpong:  # ping-pong warp groups load whole boxes
        assert v.x_rows == box
    f16, _ = resolve(Shape(M, N, K, "gemm"), hw, 2, "unicast", Dtypes("f16"))
    assert f16 == resolve(Shape(M, N, K, "gemm"), hw, 2, "unicast", Dtypes("f16"),
                          Tuning(x_box=False))[0]
    assert resolve(Shape(M, N, K, "rs"), hw, 2, "unicast")[0] == \
        make_plan(M, N, K, 2, 132, "rs", push_all=None)


@pytest.mark.parametrize("K", [1024, 4096, 9216])
@pytest.mark.parametrize("M", [1024, 1025, 1100, 1152, 1153])
def test_gemm_partial_width(M, K):
    """``choose_gemm_partial_width``: the bf16 GEMM alone's 1-CTA plan at K > 1024 takes a
    width that leaves a partial tile at N's edge where its lane cost is 5% lower (N=5120, M
    1025-1152: 192 wide over two rounds, not 128 wide over three); not at K=1024, not in
    fp16, not where a Tuning forces the width, and pair plans keep theirs."""
    from launch import Dtypes, Hardware, Shape, Tuning, resolve
    from launch.rules import FINE_GAIN, choose_gemm_partial_width, lane_cost
    hw = Hardware("sm_90a", 132)
    plan, _ = resolve(Shape(M, 5120, K, "gemm"), hw, 2, "unicast")
    moved = 1024 < M <= 1152 and K > 1024
    assert choose_gemm_partial_width(K) is (K > 1024)
    if moved:
        assert (plan.cta_group, plan.bn, plan.rounds) == (1, 192, 2)
        whole, _ = resolve(Shape(M, 5120, K, "gemm"), hw, 2, "unicast", tuning=Tuning(bn=128))
        assert lane_cost(plan) <= FINE_GAIN * lane_cost(whole)
    else:
        assert 5120 % plan.bn == 0 or plan.bn in (112, 144, 176, 208)
    f16, _ = resolve(Shape(M, 5120, K, "gemm"), hw, 2, "unicast", Dtypes("f16"))
    assert 5120 % f16.bn == 0
    forced, _ = resolve(Shape(M, 5120, K, "gemm"), hw, 2, "unicast",
                        tuning=Tuning(cta_group=1, bn=128))
    assert forced.bn == 128


@pytest.mark.parametrize("K", [1024, 4096, 9216])
@pytest.mark.parametrize("M,N,want", [
    (264, 2880, None), (392, 2880, None),  # 2x1 clusters: the rule leaves them
    (520, 2880, 144), (640, 2880, 144), (776, 2880, 192), (896, 2880, 192),
    (264, 5120, 160), (384, 5120, 160), (1024, 2880, None), (256, 5120, None),
    # 160 (a 32-column tile at N's edge) lost to the 128 it replaced: no width dividing 3072
    # reads less than 128, which the other rules chose
    (520, 3072, 128), (640, 3072, 128)])
def test_gemm_one_round_width(monkeypatch, M, N, K, want):
    """``choose_gemm_one_round_width``: the bf16 GEMM alone's one-round 1-CTA plan at 3-7 tile
    rows and K >= 4096 takes the width dividing N of fewest modelled L2 reads (the picks
    timed in docs/PERF.md (as), (at)); at K=1024, on pairs, outside those rows, in fp16 and
    where a Tuning forces the width the plan is the one the other rules make."""
    import launch.plan
    from launch import Dtypes, Hardware, Shape, Tuning, resolve
    from launch.geometry import BM, ceil_div
    from launch.rules import ROUND_L2_TILES, choose_gemm_one_round_width
    hw = Hardware("sm_90a", 132)
    shape = Shape(M, N, K, "gemm")
    forcing = Tuning(cta_group=1, bn=128)
    plan, f16, forced = (resolve(shape, hw, 2, "unicast", d, t)[0] for d, t in (
        (Dtypes(), Tuning()), (Dtypes("f16"), Tuning()), (Dtypes(), forcing)))
    monkeypatch.setattr(launch.plan, "choose_gemm_one_round_width", lambda *a: None)
    plan0, f16_0, forced0 = (resolve(shape, hw, 2, "unicast", d, t)[0] for d, t in (
        (Dtypes(), Tuning()), (Dtypes("f16"), Tuning()), (Dtypes(), forcing)))
    assert f16 == f16_0 and forced == forced0 and forced.bn == 128
    if K >= 4096 and want == plan0.bn:
        assert choose_gemm_one_round_width(M, N, K, 132) == want and plan == plan0
    elif K >= 4096 and want:
        assert choose_gemm_one_round_width(M, N, K, 132) == want
        assert (plan.bn, plan.cta_group, plan.rounds) == (want, 1, 1) != (plan0.bn, 1, 1)
        assert (plan0.cta_group, plan0.rounds) == (1, 1)
        rows = ceil_div(M, BM)  # no width of the timed range that fits one round reads less
        reads = lambda b: (BM + b) * max(rows * ceil_div(N, b), ROUND_L2_TILES)
        assert all(reads(b) >= reads(want) for b in range(112, 225, 16)
                   if N % b == 0 and rows * ceil_div(N, b) <= 132)
    else:
        assert plan == plan0
        if K < 4096:
            assert choose_gemm_one_round_width(M, N, K, 132) is None


@pytest.mark.parametrize("M,N,K,want", [
    # moved (PERF.md (at), lane-cost ratio 1.043-1.071, 10-42 tiles a lane)
    (4096, 7168, 4096, 176), (8192, 7168, 9216, 176), (16384, 7168, 4096, 192),
    (8192, 8192, 4096, 192), (16384, 8192, 9216, 192),
    # below M=4096 176 wide only (PERF.md (au)): 2048 x 7168 moves
    (2048, 7168, 4096, 176), (2048, 7168, 9216, 176), (1024, 14336, 4096, 176),
    # cooperative: ratio 1.093 at 11 tiles (lost there); below M=4096 the model's 192-wide
    # plans (3072 x 7168, 1536 x 8192) and ratios above the bound (1536 x 7168, 2048 x
    # 8192); K between 1024 and 4096
    (4096, 8192, 4096, None), (4096, 8192, 9216, None), (3072, 7168, 9216, None),
    (1536, 8192, 4096, None), (1536, 7168, 4096, None), (2048, 8192, 9216, None),
    (2048, 7168, 2048, None), (8192, 7168, 2048, None)])
def test_gemm_pingpong_at_long_k(M, N, K, want):
    """``choose_gemm_pingpong`` at K >= 4096: ping-pong 176 / 192 wide on 2x1 clusters at 5
    stages from M=4096, 176 wide below it, where the model at ``PINGPONG_EPILOGUE_DEEP``
    says so; bf16's rule only (fp16 keeps the cooperative plan)."""
    from launch.resolve import Dtypes, Hardware, Shape, resolve_variant
    hw = Hardware("sm_90a", 132, 132)
    v = resolve_variant(Shape(M, N, K, "gemm"), hw, 2, "unicast")
    if want is None:
        assert not v.pingpong, v
    else:
        assert (v.pingpong, v.bn, v.cta_group, v.stages) == (1, want, 2, 5), v
    assert not resolve_variant(Shape(M, N, K, "gemm"), hw, 2, "unicast", Dtypes("f16")).pingpong


@pytest.mark.parametrize("M,N,K,want", [
    (256, 7168, 4096, 7), (256, 7168, 9216, 7), (200, 7168, 4096, 7),
    # K=1024 tied; 64-row pairs at M=128; 128-wide pairs have no room; 224-wide plans
    (256, 7168, 1024, 0), (128, 7168, 4096, 0), (256, 8192, 4096, 0), (512, 7168, 4096, 4),
    # three and four tile rows (docs/PERF.md (bb)); five rows take a 1-CTA plan; four rows
    # where 96-wide pairs fit one round take those (choose_gemm_pairs96, (bd)); three rows
    # where 96-wide 4x1 clusters fill a round take those (choose_gemm_quads128, (bh))
    (512, 3584, 4096, 7), (384, 3584, 9216, 7), (320, 3584, 9216, 7), (640, 2880, 4096, 0),
    (512, 2880, 4096, 0)])
def test_narrow_pairs_take_seven_stages(M, N, K, want):
    """``default_stages`` gives the one round of 112-wide pairs at 2-4 tile rows and K >= 4096
    7 mainloop stages (``narrow_pairs_deep``), which the kernel fits beside a 3-slot ring;
    ``Tuning.stages`` still overrides it, and the fused op's plans keep theirs."""
    from launch.resolve import Hardware, Shape, Tuning, resolve_variant
    from launch.sm90_kernel import Sm90FusedKernel
    hw = Hardware("sm_90a", 132, 132)
    v = resolve_variant(Shape(M, N, K, "gemm"), hw, 2, "unicast")
    assert v.stages == want, v
    if want == 7:
        k = Sm90FusedKernel(v)
        assert (k.ab_stage, k.epi_slots) == (7, 3)
        assert resolve_variant(Shape(M, N, K, "gemm"), hw, 2, "unicast",
                               tuning=Tuning(stages=6)).stages == 6
        for mode in ("rs", "ar"):
            assert resolve_variant(Shape(M, N, K, mode), hw, 2, "unicast").stages != 7
