"""multicast.peer_check on thread-ranks over the fake driver with memory (memory_fake).

This checks what a GPU run cannot tell apart from a bug in the check itself: the buffer
layout, who writes where, what each rank expects, and that the collective steps line up
across ranks.
"""
from __future__ import annotations

from typing import Any

import pytest

from fake_driver import R
from memory_fake import FakeKernels, MemoryFake
from multicast import peer_check as pc
from multicast.driver import Driver
from multicast.symmetric import SymmetricMemory
from thread_bootstrap import run_ranks, thread_fd_exchange

OFF = {"RSAR_MULTICAST": "off"}


def _alloc(bs, drv: Driver, nbytes: int) -> SymmetricMemory:
    return SymmetricMemory(nbytes, bs, driver=drv, env=OFF, device=bs.rank,
                           fd_exchange=thread_fd_exchange)


def _run(world: int, fn, fake: MemoryFake) -> list[Any]:
    res = run_ranks(world, fn, fake=fake, timeout=60)
    for r in res:
        if isinstance(r, BaseException):
            raise r
    return res


@pytest.mark.parametrize("world", [1, 2, 3])
def test_all_checks_pass_on_a_faithful_machine(world):
    fake = MemoryFake(world)
    drv = Driver(fake)
    kernels = FakeKernels(fake)

    def fn(bs):
        with _alloc(bs, drv, pc.region_bytes(bs.world)) as sm:
            pat = pc.pattern_check(sm, bs, kernels, drv)
            atom = pc.atomic_check(sm, bs, kernels, drv, blocks=100, threads=1000)
            mc = pc.multicast_check(sm, bs, kernels, drv)
        with _alloc(bs, drv, 4 << 20) as big:
            bw = pc.bandwidth_check(big, bs, 2 << 20, iters=3, drv=drv)
        return pat, atom, mc, bw

    for rank, (pat, atom, mc, bw) in enumerate(_run(world, fn, fake)):
        assert pat.ok, pat.detail
        # own pattern, and per peer: copy-engine read, SM read, and the peer's SM stores
        assert len(pat.data["mismatches"]) == 1 + 3 * (world - 1)
        assert atom.ok and atom.data["got"] == world * 100_000, atom.detail
        assert mc.ok is None and "unicast" in mc.detail
        if world == 1:
            assert bw.ok is None
            continue
        assert bw.ok, bw.detail
        assert set(bw.data["one_way_gbps"]) == {str(p) for p in range(world) if p != rank}
        # 2 MiB x 3 copies in the fake's 1 ms
        want = 3 * (2 << 20) / 1e-3 / 1e9
        assert all(g == pytest.approx(want) for g in bw.data["one_way_gbps"].values())
        assert bw.value == pytest.approx(round(want, 2))
    assert all(v == 0 for v in fake.live().values()), fake.live()


def test_a_peer_store_that_goes_wrong_is_reported_by_its_target():
    fake = MemoryFake(2)
    drv = Driver(fake)
    kernels = FakeKernels(fake, corrupt_stores_of=1)

    def fn(bs):
        with _alloc(bs, drv, pc.region_bytes(bs.world)) as sm:
            return pc.pattern_check(sm, bs, kernels, drv)

    r0, r1 = _run(2, fn, fake)
    assert r1.ok, r1.detail
    assert not r0.ok and r0.status == "fail"
    assert r0.data["mismatches"]["written by rank 1 (SM stores)"] == 1
    assert "word 10" in r0.detail and "0xefbeadde" in r0.detail


def test_without_kernels_copy_engine_reads_still_run_and_atomics_skip():
    fake = MemoryFake(2)
    drv = Driver(fake)

    def fn(bs):
        with _alloc(bs, drv, pc.region_bytes(bs.world)) as sm:
            return pc.pattern_check(sm, bs, None, drv), pc.atomic_check(sm, bs, None, drv)

    for rank, (pat, atom) in enumerate(_run(2, fn, fake)):
        assert pat.ok, pat.detail
        assert list(pat.data["mismatches"]) == [
            "local round trip", f"read rank {1 - rank} (copy engine)"]
        assert "SM loads/stores not checked" in pat.detail
        assert atom.ok is None and atom.status == "skip"


def test_a_cuda_error_on_one_rank_fails_the_check_on_every_rank():
    fake = MemoryFake(2)
    drv = Driver(fake)
    kernels = FakeKernels(fake)
    fake.inject("cuMemcpyDtoH", rank=1, code=R.CUDA_ERROR_ILLEGAL_ADDRESS, times=1)

    def fn(bs):
        with _alloc(bs, drv, pc.region_bytes(bs.world)) as sm:
            try:
                pc.pattern_check(sm, bs, kernels, drv)
            except Exception as e:  # noqa: BLE001 - the same error is expected everywhere
                return e
        return None

    errs = run_ranks(2, fn, fake=fake, timeout=60)
    assert all(type(e).__name__ == "PeerError" for e in errs), errs
    assert all(e.failures.keys() == {1} and "ILLEGAL_ADDRESS" in e.failures[1] for e in errs)


def _multicast_run(kernels_kw: dict) -> list[Any]:
    # The fake's multicast object, never the real one: the library creates it here
    # because the fake claims support and the environment asks for auto.
    fake = MemoryFake(2, mc_granularity=2 << 20, mc_granularity_recommended=2 << 20)
    drv = Driver(fake)
    kernels = FakeKernels(fake, **kernels_kw)

    def fn(bs):
        with SymmetricMemory(pc.region_bytes(bs.world), bs, driver=drv,
                             env={"RSAR_MULTICAST": "auto"}, device=bs.rank,
                             fd_exchange=thread_fd_exchange) as sm:
            assert sm.transport == "multicast" and sm.multicast_ptr
            return pc.multicast_check(sm, bs, kernels, drv)

    out = _run(2, fn, fake)
    assert all(v == 0 for v in fake.live().values()), fake.live()
    return out


def test_multicast_check_passes_on_a_faithful_fake():
    for r in _multicast_run({}):
        assert r.ok, r.detail
        assert r.data == {"reduce": 0, "store": 0}


def test_multicast_check_catches_a_reduction_missing_a_rank():
    for r in _multicast_run({"reduce_skips_last": True}):
        assert r.ok is False and "reduce" in r.detail and "want 0x00000003" in r.detail


def test_multicast_check_skips_without_multimem_kernels():
    for r in _multicast_run({"multimem": False}):
        assert r.ok is None and "multimem kernels unavailable" in r.detail


def test_buffer_too_small_is_refused():
    fake = MemoryFake(1)
    drv = Driver(fake)

    def fn(bs):
        with _alloc(bs, drv, 2 << 20) as sm:
            with pytest.raises(ValueError, match="at least"):
                pc.pattern_check(sm, bs, None, drv)
        return True

    assert _run(1, fn, fake) == [True]


def test_pattern_differs_by_writer_and_position():
    a, b = pc.pattern(0, 1024), pc.pattern(1, 1024)
    assert (a != b).all()
    assert len(set(a.tolist())) == 1024
