"""The multicast policy: environment matrix, resolve(), and the group-wide decision."""
from __future__ import annotations

import pytest

from fake_driver import FakeDriver
from multicast.driver import Driver
from multicast.errors import MulticastPolicyError
from multicast.multicast_setup import agree_policy
from multicast.policy import PolicyDecision, decide, resolve
from thread_bootstrap import run_ranks

SITE = {
    "none": {},
    "torch_off": {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"},
    "nccl_off": {"NCCL_NVLS_ENABLE": "0"},
    "nvshmem_off": {"NVSHMEM_DISABLE_NVLS": "1"},
    "all_off": {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0",
                "NVSHMEM_DISABLE_NVLS": "1"},
    # Values that do not forbid anything.
    "harmless": {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "0", "NCCL_NVLS_ENABLE": "1",
                 "NVSHMEM_DISABLE_NVLS": "0"},
}
FORBIDS = {"torch_off": "TORCH_SYMM_MEM_DISABLE_MULTICAST=1", "nccl_off": "NCCL_NVLS_ENABLE=0",
           "nvshmem_off": "NVSHMEM_DISABLE_NVLS=1", "all_off": "TORCH_SYMM_MEM_DISABLE_MULTICAST=1"}
MODES = {None: "auto", "": "auto", "auto": "auto", "AUTO": "auto", "on": "on", " On ": "on",
         "off": "off", "OFF": "off"}


@pytest.mark.parametrize("site", sorted(SITE))
@pytest.mark.parametrize("mode", list(MODES), ids=repr)
def test_policy_matrix(mode, site):
    env = dict(SITE[site])
    if mode is not None:
        env["RSAR_MULTICAST"] = mode
    requested = MODES[mode]
    forbidden = site in FORBIDS
    if requested == "on" and forbidden:
        with pytest.raises(MulticastPolicyError) as ei:
            decide(env)
        assert "RSAR_MULTICAST=on" in str(ei.value)
        assert FORBIDS[site] in str(ei.value)
        return
    d = decide(env)
    assert isinstance(d, PolicyDecision)
    assert d.requested == requested
    assert d.allowed == (requested != "off" and not forbidden)
    if requested == "off":
        assert "RSAR_MULTICAST=off" in d.reason
    elif forbidden:
        assert FORBIDS[site] in d.reason  # the variable that decided is named
    else:
        assert "RSAR_MULTICAST" in d.reason


@pytest.mark.parametrize("bad", ["maybe", "1", "true", "enabled"])
def test_invalid_mode_names_the_variable(bad):
    with pytest.raises(ValueError, match="RSAR_MULTICAST") as ei:
        decide({"RSAR_MULTICAST": bad})
    assert repr(bad) in str(ei.value)


def test_default_reads_os_environ(monkeypatch):
    monkeypatch.delenv("RSAR_MULTICAST", raising=False)
    for var in ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS"):
        monkeypatch.delenv(var, raising=False)
    assert decide().allowed
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    d = decide()
    assert not d.allowed and "NCCL_NVLS_ENABLE=0" in d.reason
    monkeypatch.setenv("RSAR_MULTICAST", "on")
    with pytest.raises(MulticastPolicyError):
        decide()


def test_decision_is_frozen():
    d = decide({})
    with pytest.raises(Exception):
        d.allowed = False  # type: ignore[misc]


def test_resolve():
    auto, on, off = decide({}), decide({"RSAR_MULTICAST": "on"}), decide({"RSAR_MULTICAST": "off"})
    use, why = resolve(auto, True, "")
    assert use and auto.reason in why
    use, why = resolve(auto, False, "device 1 lacks it")
    assert not use and "device 1 lacks it" in why
    assert resolve(on, True, "")[0] is True
    with pytest.raises(MulticastPolicyError, match="device 1 lacks it"):
        resolve(on, False, "device 1 lacks it")
    # off never asks the device and never raises
    assert resolve(off, True, "") == (False, off.reason)
    assert resolve(off, False, "x") == (False, off.reason)


# ---- the group's decision: every rank decides alike -----------------------------------

def group_policy(envs, fake=None, world=None):
    fake = fake or FakeDriver()
    world = world or len(envs)

    def fn(bs):
        fake.make_current(bs.rank)
        return agree_policy(bs, Driver(fake), bs.rank, envs[bs.rank])

    return run_ranks(world, fn, fake=fake)


def test_group_all_auto_supported():
    res = group_policy([{}, {}, {}])
    assert all(r[1] is True for r in res)
    assert len({r[0] for r in res}) == 1


def test_group_one_rank_forbids_turns_all_off():
    res = group_policy([{}, {"NVSHMEM_DISABLE_NVLS": "1"}, {}])
    for r, (decision, use, reason) in enumerate(res):
        assert use is False and not decision.allowed
        assert "NVSHMEM_DISABLE_NVLS=1" in reason
        if r != 1:
            assert "rank 1" in reason


def test_group_on_against_a_forbidding_rank_raises_everywhere():
    res = group_policy([{"RSAR_MULTICAST": "on"}, {"RSAR_MULTICAST": "off"}])
    assert all(isinstance(r, MulticastPolicyError) for r in res)
    assert len({str(r) for r in res}) == 1


def test_group_site_forbids_on_raises_everywhere():
    res = group_policy([{}, {"RSAR_MULTICAST": "on", "NCCL_NVLS_ENABLE": "0"}])
    assert all(isinstance(r, MulticastPolicyError) for r in res)
    assert all("NCCL_NVLS_ENABLE=0" in str(r) for r in res)


def test_group_invalid_value_raises_valueerror_everywhere():
    res = group_policy([{}, {"RSAR_MULTICAST": "sometimes"}, {}])
    assert all(isinstance(r, ValueError) for r in res)
    assert all("rank 1" in str(r) and "sometimes" in str(r) for r in res)


def test_group_unsupported_device():
    fake = FakeDriver()
    A = fake.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED
    fake.attribute_overrides[(2, A)] = 0
    res = group_policy([{}, {}, {}], fake)
    assert all(r[1] is False and "device 2" in r[2] for r in res)
    fake = FakeDriver()
    fake.attribute_overrides[(2, A)] = 0
    res = group_policy([{"RSAR_MULTICAST": "on"}] * 3, fake)
    assert all(isinstance(r, MulticastPolicyError) and "device 2" in str(r) for r in res)


def test_group_off_does_not_query_the_device():
    fake = FakeDriver()
    group_policy([{"RSAR_MULTICAST": "off"}] * 2, fake)
    assert "cuDeviceGetAttribute" not in fake.names()


def test_single_rank_auto_is_unicast():
    decision, use, reason = group_policy([{}])[0]
    assert use is False and "single rank" in reason
    assert group_policy([{"RSAR_MULTICAST": "on"}])[0][1] is True


def test_auto_off_keeps_auto_on_unicast_and_leaves_on_and_site_switches_alone():
    why = "the caller's kernels are not validated"
    d = decide({}, auto_off=why)
    assert (d.requested, d.allowed) == ("auto", False)
    assert d.reason == f"RSAR_MULTICAST unset (auto): {why}"
    assert decide({"RSAR_MULTICAST": "auto"}, auto_off=why).reason.startswith("RSAR_MULTICAST=auto")
    # an explicit on still opts in; a site switch still names itself, not the caller's reason
    assert decide({"RSAR_MULTICAST": "on"}, auto_off=why).allowed
    site = decide({"NCCL_NVLS_ENABLE": "0"}, auto_off=why)
    assert not site.allowed and "NCCL_NVLS_ENABLE=0" in site.reason and why not in site.reason
    assert decide({"RSAR_MULTICAST": "off"}, auto_off=why).reason == "RSAR_MULTICAST=off"
