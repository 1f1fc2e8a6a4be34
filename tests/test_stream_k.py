"""Stream-K (``Tuning.stream``, ``TilePlan.stream``): the plain sm90 GEMM's one partial round
spread along K over every lane. The plan's segments must cover every unit's k-tiles once, in
lane order from the lane that finishes it; every tile must be finished once; the kernel must
compile on 1-CTA tiles and 2x1 clusters without spills; and what cannot run is refused
before anything compiles."""
from __future__ import annotations

import pytest

from launch.geometry import stream_lane_of, stream_pieces, stream_span
from launch.resolve import Hardware, Shape, resolve
from launch.tuning import Tuning
from multicast.errors import RsarValueError

H100 = Hardware("sm_90a", 132, 132, 120)
H200_33 = Hardware("sm_90a", 132)


def _plan(M, N, K, hw=H100, **kw):
    return resolve(Shape(M, N, K, "gemm"), hw, 1, "unicast", tuning=Tuning(stream=True, **kw))


SHAPES = [(512, 2880, 9216, {}), (512, 2880, 4096, {}), (512, 2880, 9216, dict(cta_group=1)),
          (256, 2880, 4096, dict(cta_group=1, bm=64, bn=96)),
          (384, 2880, 1024, dict(cta_group=2, bn=128)), (300, 5120, 4096, dict(cta_group=1)),
          (200, 2880, 9216, dict(cta_group=2, bm=64, bn=96)), (512, 2888, 9216, {})]


@pytest.mark.parametrize("M,N,K,kw", SHAPES)
def test_segments_cover_every_unit_once(M, N, K, kw):
    p, v = _plan(M, N, K, **kw)
    assert p.stream and v.sk == 2 and p.rounds >= 2
    assert p.num_units < p.chunk <= 2 * p.num_units
    covered: dict[int, list] = {}
    for lane in range(p.chunk):
        g0, g1 = stream_span(lane, p.chunk, p.num_units, p.k_tiles)
        assert g1 > g0
        done = 0
        for rnd in range(p.rounds):
            u, lo, hi = p.segment(lane, rnd)
            if u < 0:
                continue
            assert 0 <= lo < hi <= p.k_tiles
            assert lo == 0 or rnd == 0  # only a lane's first segment is a stored piece
            covered.setdefault(u, []).append((lo, hi, lane))
            done += hi - lo
        assert done == g1 - g0  # the span, nothing more
    assert sorted(covered) == list(range(p.num_units))
    for u, segs in covered.items():
        segs.sort()
        assert segs[0][0] == 0 and segs[-1][1] == p.k_tiles
        assert all(a[1] == b[0] for a, b in zip(segs, segs[1:]))
        owner = segs[0][2]
        assert [s[2] for s in segs] == list(range(owner, owner + len(segs)))
        assert len(segs) == stream_pieces(u, p.chunk, p.num_units, p.k_tiles)
        assert owner == stream_lane_of(u * p.k_tiles, p.chunk, p.num_units, p.k_tiles)


@pytest.mark.parametrize("M,N,K,kw", SHAPES)
def test_every_tile_finished_once(M, N, K, kw):
    p, _ = _plan(M, N, K, **kw)
    done = [p.scheduled(0, c, r) for c in range(p.grid) for r in range(p.rounds)]
    real = [t for t in done if t >= 0]
    assert sorted(real) == list(range(p.num_tiles))
    # a lane's busy time is its span: within one k-tile of every other lane's
    spans = [stream_span(l, p.chunk, p.num_units, p.k_tiles) for l in range(p.chunk)]
    lengths = {g1 - g0 for g0, g1 in spans}
    assert max(lengths) - min(lengths) <= 1


def test_whole_lanes_on_every_cluster():
    p, _ = _plan(512, 2880, 9216)
    assert (p.cta_group, p.bn, p.chunk, p.grid) == (2, 96, 66, 132)  # 60 pair-tiles, 66 lanes
    p1, _ = _plan(512, 2880, 9216, cta_group=1, bn=96)
    assert (p1.chunk, p1.grid, p1.num_units) == (132, 132, 120)
    p33, _ = _plan(512, 2880, 9216, hw=H200_33, cta_group=2)
    assert p33.chunk == 66


@pytest.mark.parametrize("tuning,shape,why", [
    (dict(cta_group=1, bn=96), (100, 2880, 4096), "at least half the lanes"),  # 30 on 132
    (dict(), (4096, 7168, 4096), "at least half the lanes"),   # whole rounds
    (dict(cta_group=1), (512, 2880, 64), "k-tiles"),            # one k-tile
    (dict(cta_group=4, bm=64, bn=96), (256, 2880, 4096), "stream"),
    (dict(pair_n=True), (512, 2880, 4096), "stream"),
    (dict(sk=True), (512, 2880, 4096), "stream"),
    (dict(pingpong=True), (512, 2880, 4096), "stream"),
])
def test_refused_before_anything_compiles(tuning, shape, why):
    with pytest.raises(RsarValueError, match=why):
        _plan(*shape, **tuning)


def test_refused_fused_and_on_sm100():
    for mode in ("rs", "ar"):
        with pytest.raises(RsarValueError, match="stream"):
            resolve(Shape(512, 2880, 4096, mode), H100, 2, "unicast", tuning=Tuning(stream=True))
    with pytest.raises(RsarValueError, match="stream"):
        resolve(Shape(512, 2880, 4096, "gemm"), Hardware("sm_100a", 148), 1, "unicast",
                tuning=Tuning(stream=True))


def test_no_default_plan_takes_it():
    for M in (64, 128, 256, 384, 512, 1024, 4096):
        for N in (2880, 5120, 7168, 8192):
            for K in (1024, 4096, 9216):
                p, v = resolve(Shape(M, N, K, "gemm"), H100, 1, "unicast")
                assert not p.stream and v.sk != 2


def test_the_kernel_refuses_it_off_the_plain_gemm():
    pytest.importorskip("cutlass")
    from launch.sm90_kernel import Sm90FusedKernel
    from launch.variant import Variant
    for v in (Variant("sm_90a", 128, 2, "rs", "unicast", 1, sk=2),
              Variant("sm_90a", 128, 1, "gemm", "unicast", 2, pair_n=1, sk=2, push="tma",
                      tma_store=1)):
        with pytest.raises(ValueError, match="stream-K"):
            Sm90FusedKernel(v)


@pytest.mark.parametrize("M,N,K,kw", [(512, 2880, 9216, {}),
                                      (512, 2880, 9216, dict(cta_group=1)),
                                      (256, 2880, 4096, dict(cta_group=1, bm=64, bn=96))])
def test_its_kernels_compile(ptx_of, tmp_path, M, N, K, kw):
    pytest.importorskip("cutlass")
    from ptx_checks import ptxas_log
    _, v = _plan(M, N, K, **kw)
    ptx = ptx_of(v)
    assert f".m64n{v.bn}k16." in ptx
    log = ptxas_log(ptx, tmp_path)
    for code in ("C7514", "C7517", "C7520"):
        assert code not in log, log[-2000:]
    assert " 0 bytes spill stores" in log, log[-2000:]
