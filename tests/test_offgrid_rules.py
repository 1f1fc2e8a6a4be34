"""The GEMM alone's rules for N off the issue's grid (docs/PERF.md (bb)): 160 / 192 wide where
they divide N, 64-wide tiles at two tile rows and K <= 1024, 160-wide ping-pong at K >= 4096
from M=4096. Each moves only the plain sm90 GEMM; the fused op's plans keep theirs."""
import pytest

from launch.geometry import tile_widths
from launch.resolve import Hardware, Shape, resolve
from launch.rules import choose_gemm_dividing_widths

HW = Hardware("sm_90a", 132)


def _plan(M, N, K, mode="gemm"):
    return resolve(Shape(M, N, K, mode), HW, 2, "unicast")


@pytest.mark.parametrize("N,want", [(5120, (160,)), (2880, (160, 192)), (3072, (192,)),
                                    (7168, ()), (8192, ()), (2560, (160,)), (4096, ())])
def test_dividing_widths(N, want):
    """None at the grid's N (7168, 8192): tests/grid_plans.json shows no grid plan moved."""
    assert choose_gemm_dividing_widths(N) == want


@pytest.mark.parametrize("M,N,K,bn,cta_group", [
    (1024, 5120, 1024, 160, 1), (512, 5120, 4096, 160, 2), (2048, 5120, 4096, 160, 2),
    (1024, 3072, 1024, 192, 1), (1024, 6144, 4096, 192, 2), (192, 10240, 4096, 160, 2),
    # the rows choose_gemm_tail_one_cta re-plans keep the widths of before
    (192, 10240, 1024, 176, 1)])
def test_gemm_takes_a_dividing_width(M, N, K, bn, cta_group):
    p, v = _plan(M, N, K)
    assert (p.bn, p.cta_group) == (bn, cta_group)
    assert not v.pingpong
    # the fused op's widths stay those measured on two GPUs: the planner's own (where one of
    # FULL_NS divides N, only those), or the small-M rules' 64
    for mode in ("rs", "ar"):
        assert _plan(M, N, K, mode)[0].bn in (*tile_widths(N), 64)


@pytest.mark.parametrize("M,N,want", [(256, 3584, 64), (192, 4096, 64), (160, 2048, 64),
                                      (256, 4352, 112), (256, 5120, 80), (256, 7168, 112),
                                      (384, 2880, 96)])
def test_two_tile_rows_at_short_k_run_64_wide(M, N, want):
    """Where both rows of 64-wide tiles fit one round (N <= 4224); at N 4352 / 5120 they would
    not, and there as from three tile rows the other rules decide (80 / 96-wide pairs at 256 x
    5120 and 384 x 2880: ``choose_gemm_pairs_short``). (At M 193-256 and N <= 2880 (3072 on an H100 holding 32) the 4x1
    clusters go first: ``choose_gemm_quads``, tests/test_small_m_deep.py.)"""
    p, _ = _plan(M, N, 1024)
    assert p.bn == want
    if want == 64:
        assert (p.cta_group, p.rounds) == (1, 1)
    assert _plan(M, N, 2048)[0].bn != 64 or N <= 4224


@pytest.mark.parametrize("M,N,K,bn,stages", [
    (8192, 2880, 4096, 160, 0), (8192, 2880, 9216, 160, 0),  # 160 wide at the kernel's own 4
    (4096, 2880, 4096, 192, 5), (16384, 2880, 9216, 192, 5)])  # 192 still cheaper there
def test_pingpong_160_wide_at_long_k(M, N, K, bn, stages):
    p, v = _plan(M, N, K)
    assert (v.pingpong, p.bn, p.cta_group, v.stages) == (1, bn, 2, stages)
    # not below M=4096 (176 only there) nor between K=1024 and 4096
    assert _plan(2048, N, K)[0].bn != 160 or not _plan(2048, N, K)[1].pingpong
    assert not (_plan(M, N, 2048)[1].pingpong and _plan(M, N, 2048)[0].bn == 160)
