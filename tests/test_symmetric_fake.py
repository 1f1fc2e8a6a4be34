"""SymmetricMemory against the recording fake driver, N thread-ranks sharing one record.

Checks the setup and teardown order of DESIGN.md, the multicast sequence (every
AddDevice before any BindMem, rank 0 releasing last), and that a failure injected at
any step on one rank reaches every rank: all raise the same PeerError
(RSAR_MULTICAST=on) or all fall back to unicast (auto). Nothing may leak: driver
objects, address ranges, mappings, file descriptors.
"""
from __future__ import annotations

import os
import struct
import time

import pytest

from fake_driver import MiB, R, FakeDriver, mc_handle_arg
from multicast.agree import agree
from multicast.driver import Driver
from multicast.errors import CudaDriverError, HandleExchangeError, MulticastPolicyError, PeerError
from multicast.symmetric import SymmetricMemory
from thread_bootstrap import run_ranks, thread_fd_exchange

OFF = {"RSAR_MULTICAST": "off"}
AUTO: dict[str, str] = {}
ON = {"RSAR_MULTICAST": "on"}


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def make(bs, fake, env, nbytes=1000, **kw):
    kw.setdefault("device", bs.rank)
    kw.setdefault("fd_exchange", thread_fd_exchange)
    return SymmetricMemory(nbytes, bs, driver=Driver(fake), env=env, **kw)


def snapshot(m: SymmetricMemory, fake: FakeDriver) -> dict:
    return {
        "transport": m.transport, "handle_type": m.handle_type, "nbytes": m.nbytes,
        "local": m.local_ptr, "peers": list(m.peer_ptrs), "mc": m.multicast_ptr,
        "table": fake.read_device(m.peer_ptrs_dev, 8 * m.world) if m.peer_ptrs_dev else b"",
        "objects": [fake.object_at(p) for p in m.peer_ptrs],
        "reason": m.policy_reason, "policy": m.policy, "device": m.device,
    }


def alloc_close(fake, env, world, **kw):
    """Every rank allocates, snapshots, closes; returns per-rank snapshot or exception."""
    def fn(bs):
        m = make(bs, fake, env, **kw)
        try:
            return snapshot(m, fake)
        finally:
            m.close()

    return run_ranks(world, fn, fake=fake)


def assert_nothing_held(fake: FakeDriver) -> None:
    assert fake.live() == {"objects": 0, "handles": 0, "reservations": 0, "mappings": 0,
                           "device_allocs": 0, "mc_bindings": 0}


def tagged(fake: FakeDriver, rank: int) -> list[str]:
    """This rank's calls, multicast ones marked: 'cuMemMap[mc]', 'cuMemRelease[mc]'..."""
    out = []
    for c in fake.calls:
        if c.rank != rank:
            continue
        name = c.name
        if name in ("cuMemMap",) and fake.is_mc_handle(c.args[3]) \
                or name in ("cuMemRelease", "cuMulticastAddDevice", "cuMulticastBindMem",
                            "cuMulticastUnbind") and fake.is_mc_handle(c.args[0]) \
                or name in ("cuMemUnmap", "cuMemSetAccess") and fake.is_mc_ptr(c.args[0]):
            name += "[mc]"
        out.append(name)
    return out


def check_peer_view(snaps: list[dict]) -> None:
    """Every rank sees the same allocations, in rank order, and its table says so."""
    world = len(snaps)
    for r, s in enumerate(snaps):
        assert s["peers"][r] == s["local"]
        assert len(set(s["peers"])) == world
        assert s["objects"] == snaps[0]["objects"]
        assert s["table"] == struct.pack(f"<{world}Q", *s["peers"])


# ---- unicast ----------------------------------------------------------------------------

@pytest.mark.parametrize("world", [1, 2, 3])
def test_unicast_setup(world):
    fake = FakeDriver()
    fds = open_fds()
    snaps = alloc_close(fake, OFF, world, nbytes=3 * MiB + 1)
    for s in snaps:
        assert not isinstance(s, BaseException), s
        assert s["transport"] == "unicast" and s["mc"] == 0
        assert s["handle_type"] == "posix_fd"
        assert s["nbytes"] == 4 * MiB
        assert s["reason"] == "RSAR_MULTICAST=off"
    check_peer_view(snaps)
    assert not any(n.startswith("cuMulticast") for n in fake.names())
    assert_nothing_held(fake)
    assert open_fds() == fds


def test_unicast_setup_order():
    fake = FakeDriver()
    snaps = alloc_close(fake, OFF, 2)
    assert all(isinstance(s, dict) for s in snaps)
    for r in range(2):
        names = fake.names(r)
        order = ["cuMemCreate", "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess",
                 "cuMemsetD8", "cuMemExportToShareableHandle",
                 "cuMemImportFromShareableHandle", "cuMemAlloc", "cuMemcpyHtoD",
                 "cuCtxSynchronize"]
        pos = [names.index(n) for n in order]
        assert pos == sorted(pos), list(zip(order, pos))
    # Peers are imported only after every rank exported.
    last_export = fake.index("cuMemExportToShareableHandle", last=True)
    assert fake.index("cuMemImportFromShareableHandle") > last_export


def test_host_access_to_local_bytes_is_bounded_and_checked():
    """zero_local / read_local reach only this rank's allocation, through the checked driver,
    and refuse once the memory is closed."""
    fake = FakeDriver()

    def fn(bs):
        m = make(bs, fake, OFF, nbytes=2 * MiB)
        base = m.local_ptr
        try:
            m.zero_local(4096, 8192)
            got = m.read_local(4096, 64)
            for bad in ((-1, 8), (0, m.nbytes + 1), (m.nbytes - 4, 8)):
                with pytest.raises(ValueError, match="outside"):
                    m.read_local(*bad)
                with pytest.raises(ValueError, match="outside"):
                    m.zero_local(*bad)
        finally:
            m.close()
        with pytest.raises(RuntimeError, match="closed"):
            m.read_local(0, 8)
        return got, m.rank, base

    for r in run_ranks(2, fn, fake=fake):
        assert not isinstance(r, BaseException), r
        got, rank, base = r
        assert got == bytes(64)
        memsets = [c.args for c in fake.calls if c.rank == rank and c.name == "cuMemsetD8"]
        copies = [c.args for c in fake.calls if c.rank == rank and c.name == "cuMemcpyDtoH"]
        assert (int(memsets[-1][0]), memsets[-1][1], memsets[-1][2]) == (base + 4096, 0, 8192)
        assert len(copies) == 1 and (int(copies[0][1]), copies[0][2]) == (base + 4096, 64)
    assert_nothing_held(fake)


@pytest.mark.parametrize("site", [{"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"},
                                  {"NCCL_NVLS_ENABLE": "0"}, {"NVSHMEM_DISABLE_NVLS": "1"},
                                  {"RSAR_MULTICAST": "off"}])
def test_policy_off_never_creates_multicast(site):
    fake = FakeDriver()
    snaps = alloc_close(fake, site, 3)
    assert all(s["transport"] == "unicast" for s in snaps)
    assert all(next(iter(site)) in s["reason"] for s in snaps)
    assert fake.index("cuMulticastCreate") == -1
    assert not any(n.startswith("cuMulticast") for n in fake.names())


def test_site_switch_on_one_rank_only_turns_everyone_off():
    fake = FakeDriver()

    def fn(bs):
        env = {"NCCL_NVLS_ENABLE": "0"} if bs.rank == 2 else {}
        with make(bs, fake, env) as m:
            return m.transport, m.policy_reason

    res = run_ranks(3, fn, fake=fake)
    assert all(t == "unicast" and "NCCL_NVLS_ENABLE=0" in why for t, why in res)
    assert fake.index("cuMulticastCreate") == -1


def test_on_without_support_raises_everywhere_and_creates_nothing():
    fake = FakeDriver(multicast_supported=False)
    res = alloc_close(fake, ON, 2)
    assert all(isinstance(e, MulticastPolicyError) for e in res)
    assert len({str(e) for e in res}) == 1
    assert fake.index("cuMulticastCreate") == -1
    assert_nothing_held(fake)


def test_auto_without_support_is_unicast():
    fake = FakeDriver(multicast_supported=False)
    snaps = alloc_close(fake, AUTO, 2)
    assert all(s["transport"] == "unicast" and "unavailable" in s["reason"] for s in snaps)
    assert fake.index("cuMulticastCreate") == -1


# ---- handle kinds -------------------------------------------------------------------------

def test_fabric_handles_when_every_rank_can_export():
    fake = FakeDriver(fabric_supported=True)
    fds = open_fds()
    snaps = alloc_close(fake, AUTO, 3)
    assert all(s["handle_type"] == "fabric" and s["transport"] == "multicast" for s in snaps)
    check_peer_view(snaps)
    T = fake.CUmemAllocationHandleType
    exports = [c for c in fake.calls if c.name == "cuMemExportToShareableHandle"]
    assert exports and all(c.args[1] == T.CU_MEM_HANDLE_TYPE_FABRIC for c in exports)
    assert_nothing_held(fake)
    assert open_fds() == fds


def test_fabric_export_refused_falls_back_to_posix():
    # Fabric reported supported but no IMEX channel: create works, export is refused.
    fake = FakeDriver(fabric_supported=True, fabric_export_ok=False)
    snaps = alloc_close(fake, OFF, 2)
    assert all(s["handle_type"] == "posix_fd" for s in snaps)
    check_peer_view(snaps)
    assert_nothing_held(fake)


def test_fabric_on_one_rank_only_means_posix_everywhere():
    fake = FakeDriver(fabric_supported=True)
    A = fake.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED
    fake.attribute_overrides[(1, A)] = 0
    snaps = alloc_close(fake, OFF, 3)
    assert all(s["handle_type"] == "posix_fd" for s in snaps)
    assert_nothing_held(fake)


def test_fabric_create_failing_on_one_rank_means_posix_everywhere():
    fake = FakeDriver(fabric_supported=True)
    fake.inject("cuMemCreate", rank=2, code=R.CUDA_ERROR_NOT_PERMITTED)
    snaps = alloc_close(fake, OFF, 3)
    assert all(s["handle_type"] == "posix_fd" for s in snaps)
    # The fabric allocations of ranks 0 and 1 were released again.
    assert fake.names(0).count("cuMemCreate") == 2
    assert_nothing_held(fake)


# ---- multicast ------------------------------------------------------------------------------

@pytest.mark.parametrize("world", [2, 3, 4])
def test_multicast_setup_order(world):
    fake = FakeDriver()
    fds = open_fds()
    snaps = alloc_close(fake, AUTO, world, nbytes=5 * MiB)
    for s in snaps:
        assert s["transport"] == "multicast" and s["mc"] != 0
        assert s["nbytes"] == 6 * MiB
    check_peer_view(snaps)
    assert len({s["mc"] for s in snaps}) == world  # each rank maps it at its own address

    creates = [c for c in fake.calls if c.name == "cuMulticastCreate"]
    assert [c.rank for c in creates] == [0]
    assert creates[0].args[0].numDevices == world
    assert creates[0].args[0].size == 6 * MiB
    # Every device joins before anyone binds: the last AddDevice precedes the first bind.
    adds = [c.rank for c in fake.calls if c.name == "cuMulticastAddDevice"]
    assert sorted(adds) == list(range(world))
    assert fake.index("cuMulticastAddDevice", last=True) < fake.index("cuMulticastBindMem")
    # Peers import only after rank 0 created and exported it.
    mc_export = fake.index("cuMemExportToShareableHandle", 0,
                           when=lambda c: fake.is_mc_handle(c.args[0]))
    assert fake.index("cuMulticastCreate") < mc_export
    for r in range(1, world):
        imports = [i for i, c in enumerate(fake.calls)
                   if c.rank == r and c.name == "cuMemImportFromShareableHandle"]
        assert imports[-1] > mc_export
    for r in range(world):
        seq = tagged(fake, r)
        order = ["cuMulticastAddDevice[mc]", "cuMulticastBindMem[mc]", "cuMemMap[mc]",
                 "cuMemSetAccess[mc]"]
        pos = [seq.index(n) for n in order]
        assert pos == sorted(pos), seq
        # Bound memory is this rank's own allocation, the whole of it.
        bind = next(c for c in fake.calls if c.rank == r and c.name == "cuMulticastBindMem")
        assert bind.args[1] == 0 and bind.args[3] == 0 and bind.args[4] == 6 * MiB
    assert_nothing_held(fake)
    assert open_fds() == fds


def test_multicast_granularity_sets_the_size():
    fake = FakeDriver(mc_granularity=8 * MiB)
    snaps = alloc_close(fake, AUTO, 2, nbytes=1)
    assert all(s["nbytes"] == 8 * MiB and s["transport"] == "multicast" for s in snaps)
    snaps = alloc_close(FakeDriver(mc_granularity=8 * MiB), OFF, 2, nbytes=1)
    assert all(s["nbytes"] == 2 * MiB for s in snaps)


@pytest.mark.parametrize("world", [2, 3])
def test_teardown_order(world):
    fake = FakeDriver()
    assert all(isinstance(s, dict) for s in alloc_close(fake, AUTO, world))
    expect = ["cuCtxSynchronize", "<barrier>", "cuMemUnmap[mc]", "cuMulticastUnbind[mc]",
              "cuMemRelease[mc]", "cuMemFree", "cuMemUnmap", "cuMemRelease",
              "cuMemAddressFree"]
    close_from = {}
    for r in range(world):
        seq = tagged(fake, r)
        start = len(seq) - 1 - seq[::-1].index("cuCtxSynchronize")
        tail = seq[start:]
        close_from[r] = tail
        pos = [tail.index(n) for n in expect]
        assert pos == sorted(pos), tail
        # Peers and local: unmapped and released before any range is freed.
        assert max(i for i, n in enumerate(tail) if n in ("cuMemUnmap", "cuMemRelease")) \
            < min(i for i, n in enumerate(tail) if n == "cuMemAddressFree")
        assert tail.count("cuMemAddressFree") == world + 1  # peers, local, multicast
    # Rank 0 holds the creation reference until every other rank released its own.
    mc_releases = [(i, c.rank) for i, c in enumerate(fake.calls)
                   if c.name == "cuMemRelease" and fake.is_mc_handle(c.args[0])]
    assert len(mc_releases) == world
    assert mc_releases[-1][1] == 0
    first_barrier_after = [i for i, c in enumerate(fake.calls) if c.name == "<barrier>"]
    assert any(max(i for i, r in mc_releases[:-1]) < b < mc_releases[-1][0]
               for b in first_barrier_after)


def test_close_is_idempotent_and_a_context_manager():
    fake = FakeDriver()

    def fn(bs):
        with make(bs, fake, AUTO) as m:
            assert not m.closed
        assert m.closed and m.local_ptr == 0 and m.peer_ptrs == []
        n = len(fake.names(bs.rank))
        m.close()
        m.close()
        return len(fake.names(bs.rank)) - n

    assert run_ranks(2, fn, fake=fake) == [0, 0]
    assert_nothing_held(fake)


def test_single_rank():
    fake = FakeDriver()
    [s] = alloc_close(fake, AUTO, 1)
    assert s["transport"] == "unicast" and "single rank" in s["reason"]
    [s] = alloc_close(fake, ON, 1)
    assert s["transport"] == "multicast"
    assert_nothing_held(fake)


# ---- failures: every rank learns, all raise alike or all fall back ----------------------------

WORLD = 3


MC_STEPS = {
    "granularity": ("cuMulticastGetGranularity", 1, {}),
    "create": ("cuMulticastCreate", 0, {}),
    "export": ("cuMemExportToShareableHandle", 0, {"when": "mc0"}),
    # peer handles are imported first (WORLD - 1 of them), then the multicast handle
    "import": ("cuMemImportFromShareableHandle", 2, {"skip": WORLD - 1}),
    "add_device_root": ("cuMulticastAddDevice", 0, {}),
    "add_device_peer": ("cuMulticastAddDevice", 1, {}),
    "bind": ("cuMulticastBindMem", 2, {}),
    # address ranges: local, WORLD - 1 peers, then the multicast range
    "reserve": ("cuMemAddressReserve", 1, {"skip": WORLD}),
    "map": ("cuMemMap", 1, {"when": "mc3"}),
    "access": ("cuMemSetAccess", 0, {"when": "mcptr"}),
}


def inject_step(fake, step):
    name, rank, opts = MC_STEPS[step]
    opts = dict(opts)
    when = opts.pop("when", None)
    if when == "mc0":
        opts["when"] = mc_handle_arg(fake, 0)
    elif when == "mc3":
        opts["when"] = mc_handle_arg(fake, 3)
    elif when == "mcptr":
        opts["when"] = lambda args: fake.is_mc_ptr(args[0])
    fake.inject(name, rank=rank, code=R.CUDA_ERROR_ILLEGAL_STATE, **opts)
    return rank


def run_failing(fake, env, world=WORLD, fd_exchange=thread_fd_exchange):
    """Returns per rank: (snapshot, live-while-held) or the exception raised."""
    def fn(bs):
        m = make(bs, fake, env, fd_exchange=fd_exchange)
        try:
            return snapshot(m, fake), fake.live_objects("mc")
        finally:
            m.close()

    return run_ranks(world, fn, fake=fake)


@pytest.mark.parametrize("step", sorted(MC_STEPS))
def test_multicast_failure_under_on_raises_everywhere(step):
    fake = FakeDriver()
    fds = open_fds()
    bad_rank = inject_step(fake, step)
    res = run_failing(fake, ON)
    assert all(isinstance(e, PeerError) for e in res), res
    assert len({(e.step, tuple(sorted(e.failures.items()))) for e in res}) == 1
    assert set(res[0].failures) == {bad_rank}
    assert "CUDA_ERROR_ILLEGAL_STATE" in str(res[0])
    assert isinstance(res[bad_rank].__cause__, CudaDriverError)
    assert_nothing_held(fake)
    assert open_fds() == fds


@pytest.mark.parametrize("step", sorted(MC_STEPS))
def test_multicast_failure_under_auto_falls_back_everywhere(step):
    fake = FakeDriver()
    fds = open_fds()
    inject_step(fake, step)
    res = run_failing(fake, AUTO)
    assert all(isinstance(r, tuple) for r in res), res
    for snap, live_mc in res:
        assert snap["transport"] == "unicast" and snap["mc"] == 0
        assert "multicast" in snap["reason"] and "CUDA_ERROR_ILLEGAL_STATE" in snap["reason"]
        assert live_mc == 0  # the half-built multicast object is gone
    check_peer_view([s for s, _ in res])
    assert_nothing_held(fake)
    assert open_fds() == fds


def failing_fd_exchange(nth: int, bad_rank: int):
    """thread_fd_exchange whose nth use fails on one rank, agreed like fdpass does."""
    uses: dict[int, int] = {}

    def exchange(bs, fd):
        uses[bs.rank] = uses.get(bs.rank, 0) + 1
        if uses[bs.rank] == nth:
            def step():
                if bs.rank == bad_rank:
                    raise HandleExchangeError("peer credentials did not match")
            agree(bs, "exchange fds", step)
        return thread_fd_exchange(bs, fd)

    return exchange


def test_multicast_fd_exchange_failure():
    fds = open_fds()
    fake = FakeDriver()
    res = run_failing(fake, AUTO, fd_exchange=failing_fd_exchange(2, 1))
    assert all(s["transport"] == "unicast" for s, _ in res)
    fake = FakeDriver()
    res = run_failing(fake, ON, fd_exchange=failing_fd_exchange(2, 1))
    assert all(isinstance(e, PeerError) and e.step == "exchange fds" for e in res)
    assert_nothing_held(fake)
    assert open_fds() == fds


def test_fabric_multicast_failure_falls_back():
    fake = FakeDriver(fabric_supported=True)
    fake.inject("cuMulticastBindMem", rank=1, code=R.CUDA_ERROR_SYSTEM_NOT_READY)
    res = run_failing(fake, AUTO)
    assert all(s["transport"] == "unicast" and s["handle_type"] == "fabric" for s, _ in res)
    assert_nothing_held(fake)


UNICAST_STEPS = [
    ("cuInit", 1, {}),
    ("cuMemGetAllocationGranularity", 2, {}),
    ("cuMemCreate", 1, {}),
    ("cuMemAddressReserve", 0, {}),
    ("cuMemMap", 2, {}),
    ("cuMemsetD8", 1, {}),
    ("cuMemExportToShareableHandle", 1, {}),
    ("cuMemImportFromShareableHandle", 0, {"skip": 1}),
    ("cuMemAddressReserve", 2, {"skip": 1}),
    ("cuMemSetAccess", 1, {"skip": 2}),
    ("cuMemAlloc", 0, {}),
    ("cuMemcpyHtoD", 2, {}),
    ("cuCtxSynchronize", 1, {}),
]


@pytest.mark.parametrize("env", [OFF, AUTO], ids=["off", "auto"])
@pytest.mark.parametrize("name,rank,opts", UNICAST_STEPS,
                         ids=[f"{n}-r{r}-{o}" for n, r, o in UNICAST_STEPS])
def test_unicast_failure_raises_everywhere(name, rank, opts, env):
    fake = FakeDriver()
    fds = open_fds()
    fake.inject(name, rank=rank, code=R.CUDA_ERROR_OUT_OF_MEMORY, **opts)
    res = run_failing(fake, env)
    assert all(isinstance(e, PeerError) for e in res), res
    assert len({(e.step, str(e)) for e in res}) == 1
    assert set(res[0].failures) == {rank}
    assert name in str(res[0]) and "CUDA_ERROR_OUT_OF_MEMORY" in str(res[0])
    assert_nothing_held(fake)
    assert open_fds() == fds


def test_close_goes_on_after_an_error_and_keeps_peers_in_step():
    fake = FakeDriver()

    def fn(bs):
        m = make(bs, fake, AUTO)
        if bs.rank == 1:
            fake.inject("cuCtxSynchronize", rank=1, code=R.CUDA_ERROR_ILLEGAL_ADDRESS)
        m.close()
        return "closed"

    res = run_ranks(3, fn, fake=fake)
    assert res[0] == res[2] == "closed"
    assert isinstance(res[1], CudaDriverError) and res[1].name == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert_nothing_held(fake)


# ---- device and context -----------------------------------------------------------------------

def test_no_current_context_retains_and_sets_the_primary():
    fake = FakeDriver()

    def fn(bs):
        with make(bs, fake, OFF, device=None) as m:
            return m.device, int(fake.cuCtxGetCurrent()[1])

    [(dev, ctx)] = run_ranks(1, fn, fake=fake)
    assert dev == 0 and ctx == 0xC000  # device 0's primary context is current now
    assert fake.names().count("cuDevicePrimaryCtxRetain") == 1
    assert "cuCtxSetCurrent" in fake.names()


def test_current_context_picks_the_device():
    fake = FakeDriver()

    def fn(bs):
        fake.make_current(3 + bs.rank)
        with make(bs, fake, AUTO, device=None) as m:
            return m.device

    assert run_ranks(2, fn, fake=fake) == [3, 4]
    assert "cuDevicePrimaryCtxRetain" not in fake.names()
    assert "cuCtxPushCurrent" not in fake.names()


def test_explicit_device_leaves_the_callers_context_alone():
    fake = FakeDriver()

    def fn(bs):
        fake.make_current(7)
        m = make(bs, fake, OFF, device=bs.rank)
        during = int(fake.cuCtxGetCurrent()[1])
        m.close()
        return m.device, during, int(fake.cuCtxGetCurrent()[1])

    assert run_ranks(2, fn, fake=fake) == [(0, 0xC007, 0xC007), (1, 0xC007, 0xC007)]
    # Our calls ran in our device's context, pushed and popped around them.
    assert fake.names(0).count("cuCtxPushCurrent") == fake.names(0).count("cuCtxPopCurrent") >= 1
    memsets = [c for c in fake.calls if c.name == "cuMemsetD8"]
    assert memsets


def test_device_out_of_range():
    fake = FakeDriver(num_devices=2)
    res = run_ranks(2, lambda bs: make(bs, fake, OFF, device=bs.rank * 5), fake=fake)
    assert all(isinstance(e, PeerError) and set(e.failures) == {1} for e in res)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "8"])
def test_nbytes_must_be_positive_int(bad):
    with pytest.raises(ValueError, match="nbytes"):
        SymmetricMemory(bad, object(), driver=Driver(FakeDriver()))


# ---- no leaks over many cycles ------------------------------------------------------------------

@pytest.mark.parametrize("env,cycles", [(OFF, 1000), (AUTO, 300)], ids=["unicast", "multicast"])
def test_cycles_leak_nothing(env, cycles):
    fake = FakeDriver()
    fake.record_calls = False
    fds = open_fds()
    t0 = time.perf_counter()

    def fn(bs):
        for _ in range(cycles):
            with make(bs, fake, env, nbytes=4096) as m:
                assert m.transport == ("unicast" if env is OFF else "multicast")
        return "ok"

    assert run_ranks(2, fn, fake=fake, timeout=60) == ["ok", "ok"]
    assert_nothing_held(fake)
    assert open_fds() == fds
    assert time.perf_counter() - t0 < 20


# ---- the calls the fake saw also marshal through the real bindings ----------------------------

def _driver_library_missing() -> bool:
    try:
        Driver().cuDriverGetVersion()
    except CudaDriverError as e:
        return e.name == "CUDA_DRIVER_NOT_FOUND"
    return False


@pytest.mark.skipif(not _driver_library_missing(),
                    reason="replays bogus handles; only where no driver library can run them")
def test_recorded_calls_marshal_with_the_real_bindings():
    """Argument types the fake accepts must be ones the real bindings accept too.

    Without libcuda the bindings convert every argument and only then fail to load the
    library, so a replay that ends in CUDA_DRIVER_NOT_FOUND proves the call's shape.
    """
    from multicast import probes

    fake = FakeDriver(fabric_supported=True)
    alloc_close(fake, AUTO, 2)
    alloc_close(fake, OFF, 2)  # posix fds
    fake2 = FakeDriver(fabric_supported=True, fabric_export_ok=False)
    alloc_close(fake2, AUTO, 2)
    probes.probe_all(drv=Driver(fake))
    real = Driver()
    seen = set()
    for c in fake.calls + fake2.calls:
        # Never hand a multicast creation to the real driver, library or not.
        if c.name == "<barrier>" or c.name == "cuMulticastCreate":
            continue
        key = (c.name, tuple(type(a).__name__ for a in c.args))
        if key in seen:
            continue
        seen.add(key)
        with pytest.raises(CudaDriverError) as ei:
            real.call(c.name, *c.args)
        assert ei.value.name == "CUDA_DRIVER_NOT_FOUND", key
    names = {k[0] for k in seen}
    assert {"cuMemCreate", "cuMemMap", "cuMemImportFromShareableHandle", "cuMulticastBindMem",
            "cuMemcpyHtoD", "cuMulticastGetGranularity", "cuDeviceGetP2PAttribute"} <= names


@pytest.mark.parametrize("env", [OFF, AUTO], ids=["unicast", "multicast"])
def test_with_the_socket_fd_exchange(env):
    """The real SCM_RIGHTS exchange (multicast.fdpass) between thread-ranks of one process.

    fdpass may refuse peers that announce the same process (as thread-ranks do); then
    the refusal must reach every rank alike and leave nothing behind. Either way the
    default exchange is wired in and its contract (new fds, closed by us) holds.
    """
    fake = FakeDriver()
    fds = open_fds()
    res = alloc_close(fake, env, 3, fd_exchange=None)
    if all(isinstance(s, dict) for s in res):
        assert all(s["transport"] == ("unicast" if env is OFF else "multicast") for s in res)
        check_peer_view(res)
    else:
        assert all(isinstance(e, PeerError) for e in res), res
        steps = {e.step for e in res}
        assert len(steps) == 1 and steps.pop().startswith("fd exchange")
    assert_nothing_held(fake)
    assert open_fds() == fds


def test_process_environment_outranks_env_mapping(monkeypatch):
    """A caller's env mapping cannot switch multicast on where the process env forbids it."""
    from multicast.errors import MulticastPolicyError
    from multicast.multicast_setup import setup_multicast
    from multicast.policy import decide
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    allowed = decide({"RSAR_MULTICAST": "on"})
    assert allowed.allowed
    with pytest.raises(MulticastPolicyError, match="NCCL_NVLS_ENABLE"):
        setup_multicast(None, None, decision=allowed, device=0, size=0, granularity=0,
                        local_handle=None, kind="posix_fd", fd_exchange=None)


def test_auto_off_allocates_unicast_without_touching_multicast_and_on_still_opts_in():
    fake = FakeDriver()
    snaps = alloc_close(fake, AUTO, 2, auto_off="kernels not validated")
    assert all(s["transport"] == "unicast" and s["mc"] == 0 for s in snaps)
    assert all("kernels not validated" in s["reason"] for s in snaps)
    assert not any(n.startswith("cuMulticast") for n in fake.names())
    assert_nothing_held(fake)
    fake = FakeDriver()
    snaps = alloc_close(fake, ON, 2, auto_off="kernels not validated")
    assert all(s["transport"] == "multicast" for s in snaps)
