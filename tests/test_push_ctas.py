"""RS plans with push CTAs (``launch.plan.push_plan``): the MMA CTAs run the flat peers-first
order on sm_count - P lanes and compute every tile once; the P push CTAs compute nothing;
the op launches the variant and refuses what the kernel cannot run."""
import pytest

import rsar_core.gemm_rsar as gemm_rsar
from launch.cache import CACHE
from launch.plan import make_plan, push_plan
from op_stub import planning_op, retuned


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("M,N,K", [(2048, 7168, 1024), (1000, 7168, 4096), (129, 384, 64),
                                   (4096, 8192, 9216)])
@pytest.mark.parametrize("P", [1, 8, 16])
def test_every_tile_once_on_the_mma_lanes(M, N, K, world, P):
    p = push_plan(M, N, K, world, 132, P)
    assert p.push_ctas == P and p.grid == p.chunk + P <= 132
    assert p.flat and p.peers_first and p.cta_group == 1 and not p.sk and p.mode == "rs"
    assert p.chunk == make_plan(M, N, K, world, 132 - P, "rs", flat=True, sk=False).chunk
    for rank in range(world):
        tiles = [t for c in range(p.grid) for t in p.cta_tiles(rank, c)]
        assert sorted(tiles) == list(range(p.num_tiles))
        assert all(not p.cta_tiles(rank, c) for c in range(p.chunk, p.grid))


def test_push_plan_refuses_bad_counts():
    for bad in (0, -1, 34, 2.0):
        with pytest.raises(ValueError, match="push_ctas"):
            push_plan(2048, 7168, 1024, 2, 132, bad)


def _op(transport="unicast"):
    return planning_op("rs", transport)


def test_op_launches_the_push_ctas_variant(monkeypatch):
    seen = []
    monkeypatch.setattr(CACHE, "get", lambda v: seen.append(v) or (lambda *a: None))
    monkeypatch.setattr(gemm_rsar.GemmRsAr, "pair_ctas", property(lambda self: self.sm_count))
    monkeypatch.setattr(gemm_rsar.GemmRsAr, "quad_ctas", property(lambda self: self.sm_count))
    op = retuned(_op(), push_ctas=16)
    plan, _ = op._plan_and_kernel(2048, 1024, "rs")
    assert plan.push_ctas == 16 and seen[-1].push_ctas == 1 and seen[-1].flat == 1
    plan, _ = op._plan_and_kernel(2048, 1024, "gemm")  # the GEMM alone is not touched
    assert plan.push_ctas == 0 and seen[-1].push_ctas == 0
    assert plan.pingpong and seen[-1].pingpong == 1  # nor refused its ping-pong rule
    plan, _ = _op()._plan_and_kernel(2048, 1024, "rs")
    assert plan.push_ctas == 0 and seen[-1].push_ctas == 0
    ar = retuned(planning_op("ar"), push_ctas=8)
    with pytest.raises(ValueError, match="RS plan"):
        ar.plan(2048, 1024)
    mc = retuned(_op("multicast"), push_ctas=8)
    with pytest.raises(ValueError, match="push CTAs"):
        mc.plan(2048, 1024)
