"""multicast.host_probes, the diagnostics' host-side probes: each answers a JSON-ready dict
and never raises for a failed query."""
from __future__ import annotations

import json

import pytest

from multicast import host_probes as hp

_LOCAL_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK",
               "SLURM_LOCALID", "LOCAL_RANK")


@pytest.mark.parametrize("env, want", [
    ({}, None),
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "3", "LOCAL_RANK": "1"}, 3),  # the MPI launcher first
    ({"MPI_LOCALRANKID": " 2 "}, 2),
    ({"SLURM_LOCALID": "x", "LOCAL_RANK": "5"}, 5),  # a malformed value is skipped
])
def test_local_rank(monkeypatch, env, want):
    for v in _LOCAL_VARS:
        monkeypatch.delenv(v, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert hp.local_rank() == want


def test_imex_channels(monkeypatch, tmp_path):
    monkeypatch.setattr(hp, "IMEX_CHANNEL_DIR", str(tmp_path / "missing"))
    assert hp.imex_channels() == {"dir": str(tmp_path / "missing"), "present": False,
                                  "channels": []}
    for name in ("channel1", "channel0"):
        (tmp_path / name).touch()
    monkeypatch.setattr(hp, "IMEX_CHANNEL_DIR", str(tmp_path))
    assert hp.imex_channels() == {"dir": str(tmp_path), "present": True,
                                  "channels": ["channel0", "channel1"]}


def test_host_info_and_nvrtc_are_json_ready(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    info = hp.host_info()
    assert info["cuda_visible_devices"] == "1,0" and info["pid"] > 0 and info["host"]
    assert (info["cuda_bindings"] is None) == ("cuda_bindings" in info["errors"])
    nv = hp.nvrtc_version()
    assert set(nv) == {"version", "error"} and (nv["version"] is None) != (nv["error"] is None)
    json.dumps([info, nv, hp.nvml_info(None)])  # whatever this host has, no exception
