"""Construction checks that need no GPU: one GPU per rank."""
from __future__ import annotations

import types

import pytest

from rsar_core import workspace as ws_mod
from rsar_core.validate import check_one_gpu_per_rank


def test_distinct_gpus_pass_and_unknown_ones_are_not_compared():
    check_one_gpu_per_rank(["h GPU-a", "h GPU-b", "h2 GPU-a"])
    check_one_gpu_per_rank(["", "", "h GPU-a"])
    check_one_gpu_per_rank([])


def test_two_ranks_on_one_gpu_are_named():
    with pytest.raises(ValueError, match=r"ranks 1 and 3 are on the same GPU \(h GPU-b\).*"
                                         r"one GPU per rank.*set_device.*RSAR_ALLOW_SHARED_GPU"):
        check_one_gpu_per_rank(["h GPU-a", "h GPU-b", "h GPU-c", "h GPU-b"])


def test_a_shared_gpu_can_be_allowed_for_functional_tests():
    assert check_one_gpu_per_rank(["h GPU-a", "h GPU-b"], allow_shared=True) is None
    why = check_one_gpu_per_rank(["h GPU-a", "h GPU-a"], allow_shared=True)
    assert "ranks 0 and 1 are on the same GPU" in why and "milliseconds" in why


class _Gather:
    """A bootstrap whose allgather answers as if the ranks sat on ``gpus``, rank 0 being this
    process and the others allowing a shared GPU where ``allow`` says so."""

    def __init__(self, gpus: list[str], allow: list[bool] | None = None) -> None:
        self.rank, self.world, self.gpus, self.calls = 0, len(gpus), gpus, 0
        self.allow = allow or [False] * len(gpus)

    def allgather(self, data: bytes) -> list[bytes]:
        self.calls += 1
        flag, gpu = data.decode().split("|", 1)
        assert gpu == self.gpus[0]
        return [data] + [f"{int(a)}|{g}".encode() for a, g in zip(self.allow[1:], self.gpus[1:])]


def _fake_cuda(monkeypatch, uuid):
    monkeypatch.setattr(ws_mod.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ws_mod.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(ws_mod.torch.cuda, "get_device_properties",
                        lambda d: types.SimpleNamespace(uuid=uuid))


def test_workspace_refuses_a_shared_gpu_before_allocating(monkeypatch):
    _fake_cuda(monkeypatch, "abc")
    me = f"{ws_mod.socket.gethostname()} GPU-abc"
    bs = _Gather([me, me])
    monkeypatch.setattr(ws_mod, "make_bootstrap", lambda comm: bs)

    def no_alloc(*a, **k):
        raise AssertionError("allocated before the check")
    monkeypatch.setattr(ws_mod, "SymmetricMemory", no_alloc)
    with pytest.raises(ValueError, match="ranks 0 and 1 are on the same GPU"):
        ws_mod.Workspace(256, 7168)
    assert bs.calls == 1
    # allowed here but not on rank 1: every rank still refuses (the same verdict everywhere)
    monkeypatch.setenv("RSAR_ALLOW_SHARED_GPU", "1")
    with pytest.raises(ValueError, match="ranks 0 and 1 are on the same GPU"):
        ws_mod.Workspace(256, 7168)
    bs.allow = [True, True]  # allowed on every rank: on to the allocation
    with pytest.raises(AssertionError, match="allocated before the check"):
        ws_mod.Workspace(256, 7168)


def test_gpu_identity_is_host_and_uuid_or_empty(monkeypatch):
    _fake_cuda(monkeypatch, "abc")
    dev = ws_mod.torch.device("cuda", 0)
    assert ws_mod._gpu_identity(dev) == f"{ws_mod.socket.gethostname()} GPU-abc"
    _fake_cuda(monkeypatch, None)
    assert ws_mod._gpu_identity(dev) == ""


def test_workspace_keeps_auto_on_unicast_until_the_multicast_kernels_are_validated(monkeypatch):
    _fake_cuda(monkeypatch, "abc")
    me = f"{ws_mod.socket.gethostname()} GPU-abc"
    monkeypatch.setattr(ws_mod, "make_bootstrap", lambda comm: _Gather([me, "other GPU-b"]))
    seen = {}

    def record(nbytes, bs, **kw):
        seen.update(kw)
        raise AssertionError("stop after the allocation call")
    monkeypatch.setattr(ws_mod, "SymmetricMemory", record)
    with pytest.raises(AssertionError, match="stop after"):
        ws_mod.Workspace(256, 7168)
    assert seen["auto_off"] == ws_mod.AUTO_UNICAST and "RSAR_MULTICAST=on" in seen["auto_off"]
