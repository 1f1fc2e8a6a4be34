"""scripts/mc_diag.py without a GPU: the plain "no GPU" exit, and its report formatting
(table, JSON, exit status) from canned per-rank reports and from the recording fake driver."""
from __future__ import annotations

import contextlib
import copy
import json
import subprocess
import sys

import pytest

from fake_driver import FakeDriver
from mpirun import find_mpiexec, mpiexec_flags
from script_runs import REPO, load_script, plain_env
from multicast.driver import Driver

SCRIPT = REPO / "scripts" / "mc_diag.py"


mc_diag = load_script("mc_diag.py", "mc_diag")


def _plain_env(**extra: str) -> dict[str, str]:
    return plain_env(repo_on_path=True, **extra)


def _host_has_gpu() -> bool:
    from multicast import probes

    return mc_diag.no_gpu_reason(probes.device_count()) is None


needs_no_gpu = pytest.mark.skipif(_host_has_gpu(), reason="this host has a CUDA GPU")


# ---- the script on this (GPU-less) machine ---------------------------------------------

@needs_no_gpu
def test_no_gpu_plain_message_exit_code_and_json(tmp_path):
    out = tmp_path / "diag.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--json", str(out)], capture_output=True,
                       text=True, env=_plain_env(), timeout=120, cwd=str(REPO))
    assert p.returncode == mc_diag.EXIT_NO_GPU, p.stdout + p.stderr
    assert "no CUDA GPU" in p.stdout and "Traceback" not in p.stdout + p.stderr
    doc = json.loads(out.read_text())
    assert doc["exit_code"] == mc_diag.EXIT_NO_GPU and doc["world"] == 1
    assert doc["ranks"][0]["rank"] == 0 and doc["ranks"][0]["no_gpu"]


@needs_no_gpu
@pytest.mark.mpi
def test_no_gpu_under_mpiexec_two_ranks():
    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec")
    cmd = [mpiexec, *mpiexec_flags(mpiexec), "-n", "2", sys.executable, str(SCRIPT)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=_plain_env(), timeout=120,
                       cwd=str(REPO))
    assert p.returncode != 0
    # Rank 0 alone prints, naming both ranks.
    assert p.stdout.count("no CUDA GPU") == 2, p.stdout + p.stderr
    assert "(rank 0)" in p.stdout and "(rank 1)" in p.stdout
    assert "Traceback" not in p.stdout + p.stderr


def test_no_gpu_reason_words():
    assert "libcuda" in mc_diag.no_gpu_reason(
        {"errors": {"cuInit": "CUDA_DRIVER_NOT_FOUND"}, "count": None})
    assert "no device" in mc_diag.no_gpu_reason(
        {"errors": {"cuInit": "CUDA_ERROR_NO_DEVICE"}, "count": None})
    assert mc_diag.no_gpu_reason({"errors": {}, "count": 0}) == "0 CUDA devices visible"
    assert mc_diag.no_gpu_reason({"errors": {}, "count": 2}) is None


# ---- formatting from canned reports -----------------------------------------------------

def _gran(minimum: int, recommended: int) -> dict:
    return {"minimum": minimum, "recommended": recommended, "errors": {}}


def canned_report(rank: int, world: int = 2) -> dict:
    MiB = 1 << 20
    p2p = [{"src": a, "dst": b, "access_supported": True, "native_atomic_supported": True,
            "performance_rank": 0, "errors": {}} for a in range(2) for b in range(2) if a != b]
    return {
        "rank": rank, "world": world, "host": "gpu-host", "pid": 1000 + rank,
        "python": "3.12.3", "cuda_visible_devices": None, "cuda_bindings": "13.3.0",
        "errors": {}, "no_gpu": None, "device_count": 2, "device": rank,
        "versions": {"cuda_driver_api": "13.0", "cuda_bindings": "13.3.0",
                     "nvrtc": {"version": "13.0", "error": None}, "driver": "580.159.04"},
        "gpu": {"device": rank, "name": "NVIDIA H200", "compute_capability": "9.0",
                "multicast_supported": True, "fabric_handle_supported": True,
                "posix_fd_handle_supported": True, "vmm_supported": True,
                "gpudirect_rdma_with_vmm": True, "sm_count": 132,
                "pci_bus_id": f"0000:{0x18 + rank:02X}:00.0", "total_memory": 150754820096,
                "errors": {}},
        "p2p": p2p,
        "nvml": {"source": "pynvml", "driver_version": "580.159.04",
                 "nvlink": {"links": 18, "active": 18, "versions": ["4.0"]},
                 "fabric": {"clique_id": 0, "cluster_uuid": None, "state": "not supported",
                            "status": 0},
                 "errors": {}},
        "imex": {"dir": "/dev/nvidia-caps-imex-channels", "present": False, "channels": []},
        "granularity": {
            "allocation": {"fabric": _gran(2 * MiB, 2 * MiB), "posix_fd": _gran(2 * MiB, 2 * MiB)},
            "multicast": {"fabric": _gran(2 * MiB, 512 * MiB),
                          "posix_fd": _gran(2 * MiB, 512 * MiB)},
            "multicast_team": world},
        "policy": {"requested": "off", "allowed": False, "error": None,
                   "reason": "RSAR_MULTICAST=off (also NCCL_NVLS_ENABLE=0)",
                   "use_multicast": False,
                   "decision": "RSAR_MULTICAST=off (also NCCL_NVLS_ENABLE=0)"},
        "checks": [
            {"name": "policy", "status": "pass", "detail": "unicast: RSAR_MULTICAST=off"},
            {"name": "unicast symmetric memory", "status": "pass",
             "detail": "4 MiB on device 0, posix_fd handles"},
            {"name": "peer load/store", "status": "pass", "detail": "4 transfers of 1 MiB exact"},
            {"name": "peer atomics", "status": "pass", "detail": "counter 200000 == 200000"},
            {"name": "peer copy bandwidth", "status": "pass", "detail": "to rank 1: 370.2 GB/s",
             "value": 370.2, "unit": "GB/s"},
            {"name": "multicast ld_reduce/st", "status": "skip",
             "detail": "skipped: RSAR_MULTICAST=off"},
        ],
    }


def test_table_has_every_field_rank_ordered():
    reports = [canned_report(1), canned_report(0)]
    text = mc_diag.format_table(reports)
    assert text.index("== rank 0") < text.index("== rank 1")
    for field in ("host gpu-host", "NVIDIA H200", "compute capability 9.0", "132 SMs",
                  "PCI 0000:18:00.0", "driver 580.159.04", "CUDA (driver API) 13.0",
                  "cuda-bindings 13.3.0", "NVRTC 13.0", "multicast yes", "fabric handles yes",
                  "POSIX-fd handles yes", "VMM yes", "GPUDirect RDMA with VMM yes",
                  "18 of 18 links active", "version 4.0", "clique 0", "IMEX channels",
                  "2 MiB min / 512 MiB rec", "RSAR_MULTICAST=off", "PASS  peer atomics",
                  "370.2 GB/s", "SKIP  multicast ld_reduce/st"):
        assert field in text, field
    assert " A+" in text  # the P2P grid, once for the host
    assert "as rank 0 (same host, same matrix)" in text
    assert text.splitlines()[-1] == "summary: 10 passed, 0 failed, 2 skipped -> exit 0"


def test_table_and_exit_code_on_failed_check():
    bad = canned_report(1)
    bad["checks"][3] = {"name": "peer atomics", "status": "fail",
                        "detail": "counter 199999, expected 200000"}
    reports = [canned_report(0), bad]
    assert mc_diag.exit_code(reports) == mc_diag.EXIT_CHECK_FAILED
    text = mc_diag.format_table(reports)
    assert "FAIL  peer atomics" in text and "199999" in text
    assert text.endswith("-> exit 1")


def test_no_gpu_on_one_rank_wins():
    lost = {"rank": 1, "world": 2, "host": "other", "pid": 7, "no_gpu": "0 CUDA devices visible",
            "checks": []}
    reports = [canned_report(0), lost]
    assert mc_diag.exit_code(reports) == mc_diag.EXIT_NO_GPU
    assert mc_diag.no_gpu_message(reports) == (
        "mc_diag: no CUDA GPU on host other (rank 1): 0 CUDA devices visible")
    assert "GPU              none: 0 CUDA devices visible" in mc_diag.format_table(reports)


def test_json_round_trip():
    reports = [canned_report(1), canned_report(0)]
    doc = json.loads(mc_diag.to_json(reports))
    assert doc["tool"] == "rsar mc_diag" and doc["world"] == 2 and doc["exit_code"] == 0
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    r0 = doc["ranks"][0]
    assert r0["gpu"]["sm_count"] == 132 and r0["nvml"]["nvlink"]["active"] == 18
    assert {c["name"]: c["status"] for c in r0["checks"]}["peer atomics"] == "pass"


def test_missing_nvml_and_probe_errors_read_plainly():
    rep = canned_report(0, world=1)
    rep["device_count"] = 1
    rep["nvml"] = {"source": None, "driver_version": None, "nvlink": None, "fabric": None,
                   "errors": {"nvml": "no NVML bindings (pip install nvidia-ml-py)"}}
    rep["granularity"]["multicast"]["fabric"] = {"minimum": None, "recommended": None,
                                                 "errors": {"minimum": "CUDA_ERROR_NOT_SUPPORTED"}}
    text = mc_diag.format_table([rep])
    assert "NVLink           unknown: no NVML bindings" in text
    assert "fabric n/a (CUDA_ERROR_NOT_SUPPORTED)" in text
    assert "one visible GPU" in text


# ---- policy resolution over the group ---------------------------------------------------

def _group(*policies: dict, supported: tuple[bool, ...] = (True, True)) -> list[dict]:
    out = []
    for r, pol in enumerate(policies):
        rep = canned_report(r, world=len(policies))
        rep["policy"] = dict(pol)
        rep["gpu"]["multicast_supported"] = supported[r]
        out.append(rep)
    return out


def _pol(env: dict) -> dict:
    return mc_diag.local_policy(env)


def test_policy_off_names_the_variable():
    group = _group(_pol({"NCCL_NVLS_ENABLE": "0"}), _pol({"NCCL_NVLS_ENABLE": "0"}))
    mc_diag.resolve_policy(group[0], group)
    assert group[0]["policy"]["use_multicast"] is False
    assert "NCCL_NVLS_ENABLE=0" in group[0]["policy"]["decision"]


def test_policy_one_forbidding_rank_decides_for_all():
    group = _group(_pol({}), _pol({"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}))
    mc_diag.resolve_policy(group[0], group)
    assert group[0]["policy"]["use_multicast"] is False
    assert group[0]["policy"]["decision"].startswith("rank 1: TORCH_SYMM_MEM_DISABLE_MULTICAST")


def test_policy_on_with_a_forbidding_peer_is_an_error():
    group = _group(_pol({"RSAR_MULTICAST": "on"}), _pol({"NVSHMEM_DISABLE_NVLS": "1"}))
    mc_diag.resolve_policy(group[0], group)
    assert group[0]["policy"]["use_multicast"] is False
    assert "NVSHMEM_DISABLE_NVLS=1" in group[0]["policy"]["error"]


def test_policy_auto_with_support_would_multicast():
    group = _group(_pol({"RSAR_MULTICAST": "auto"}), _pol({"RSAR_MULTICAST": "auto"}))
    mc_diag.resolve_policy(group[0], group)
    assert group[0]["policy"]["use_multicast"] is True


def test_policy_on_without_support_is_an_error():
    group = _group(_pol({"RSAR_MULTICAST": "on"}), _pol({"RSAR_MULTICAST": "on"}),
                   supported=(True, False))
    mc_diag.resolve_policy(group[0], group)
    pol = group[0]["policy"]
    assert pol["use_multicast"] is False and "rank 1 device 1" in pol["error"]


def test_policy_invalid_value_is_reported_not_raised():
    pol = _pol({"RSAR_MULTICAST": "maybe"})
    assert pol["error"] and "RSAR_MULTICAST" in pol["error"]


# ---- the probe and check flow against the recording fake driver --------------------------

def _fake_run(argv: list[str], **fake_kw) -> tuple[list[dict], FakeDriver]:
    fake = FakeDriver(2, **fake_kw)
    fake.bind_thread(0)
    args = mc_diag.parse_args(argv)
    return mc_diag.diagnose(mc_diag.LocalBootstrap(), Driver(fake), args), fake


def test_fake_driver_probe_only():
    reports, fake = _fake_run(["--no-checks", "--no-nvml"])
    (rep,) = reports
    assert rep["no_gpu"] is None and rep["device"] == 0 and rep["device_count"] == 2
    assert rep["gpu"]["compute_capability"] == "9.0" and rep["gpu"]["multicast_supported"]
    assert len(rep["p2p"]) == 2 and rep["p2p"][0]["access_supported"] is True
    assert rep["granularity"]["allocation"]["posix_fd"]["recommended"] == 2 << 20
    assert rep["policy"]["use_multicast"] is False  # one rank: nobody to multicast to
    assert rep["checks"] == []
    assert "cuMemCreate" not in fake.names() and "cuMulticastCreate" not in fake.names()
    assert mc_diag.exit_code(reports) == mc_diag.EXIT_OK


def test_fake_driver_failed_check_gives_exit_1_and_releases_everything():
    fake = FakeDriver(2)
    fake.bind_thread(0)
    # The peer-pointer table is the first host-to-device copy; fail the ones after it.
    fake.inject("cuMemcpyHtoD", skip=1, times=100)
    args = mc_diag.parse_args(["--no-nvml"])
    fake_reports = mc_diag.diagnose(mc_diag.LocalBootstrap(), Driver(fake), args)
    checks = {c["name"]: c for c in fake_reports[0]["checks"]}
    assert checks["unicast symmetric memory"]["status"] == "pass"
    assert checks["peer load/store"]["status"] == "fail"
    assert "cuMemcpyHtoD" in checks["peer load/store"]["detail"]
    assert checks["cross-rank checks"]["status"] == "skip"
    assert checks["multicast ld_reduce/st"]["status"] == "skip"
    assert mc_diag.exit_code(fake_reports) == mc_diag.EXIT_CHECK_FAILED
    assert "cuMulticastCreate" not in fake.names()
    assert all(v == 0 for v in fake.live().values()), fake.live()


def test_local_bootstrap_and_launcher_detection(monkeypatch):
    bs = mc_diag.LocalBootstrap()
    assert bs.allgather(b"x") == [b"x"] and bs.broadcast(b"y") == b"y" and bs.world == 1
    assert mc_diag.launched_by_mpi({"OMPI_COMM_WORLD_SIZE": "2"})
    assert mc_diag.launched_by_mpi({"PMI_SIZE": "2"})
    assert not mc_diag.launched_by_mpi({})
    tr = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert mc_diag.launched_by_torchrun(tr)
    assert not mc_diag.launched_by_torchrun({**tr, "MASTER_PORT": ""})
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3")
    assert mc_diag.choose_device(rank=7, count=2, explicit=None) == 1
    assert mc_diag.choose_device(rank=7, count=2, explicit=0) == 0
    with pytest.raises(ValueError):
        mc_diag.choose_device(rank=0, count=2, explicit=5)


def test_canned_report_is_not_mutated_by_formatting():
    rep = canned_report(0)
    before = copy.deepcopy(rep)
    mc_diag.format_table([rep])
    mc_diag.to_json([rep])
    assert rep == before


def test_two_ranks_end_to_end_over_the_memory_fake(monkeypatch):
    """The whole collective flow on two thread-ranks: probes, agreed policy, every check,
    the gathered table; the kernels and the fd exchange are the in-process stand-ins."""
    from memory_fake import FakeKernels, MemoryFake
    from multicast import peer_check, symmetric
    from thread_bootstrap import run_ranks, thread_fd_exchange

    fake = MemoryFake(2, fabric_supported=True, fabric_export_ok=False)
    fake.record_calls = True  # to show below that no multicast object was created
    kernels = FakeKernels(fake)
    monkeypatch.setattr(peer_check, "load_kernels", lambda bs, dev, drv=None: (kernels, ""))
    monkeypatch.setattr(symmetric, "default_fd_exchange", thread_fd_exchange)
    monkeypatch.setenv("RSAR_MULTICAST", "off")
    args = mc_diag.parse_args(["--no-nvml", "--bw-mib", "2", "--bw-iters", "2"])
    drv = Driver(fake)

    results = run_ranks(2, lambda bs: mc_diag.diagnose(bs, drv, args), fake=fake, timeout=60)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    assert results[0] == results[1]  # every rank holds every rank's report
    reports = results[0]
    assert [r["device"] for r in reports] == [0, 1]
    for rep in reports:
        checks = {c["name"]: c["status"] for c in rep["checks"]}
        assert checks == {
            "policy": "pass", "fabric handle export": "skip", "cluster occupancy": "skip",
            "unicast symmetric memory": "pass",
            "peer load/store": "pass", "peer atomics": "pass", "unicast close": "pass",
            "peer copy bandwidth": "pass", "SM-driven peer bandwidth": "pass",
            "multicast ld_reduce/st": "skip"}, rep["checks"]
        assert "RSAR_MULTICAST=off" in rep["policy"]["decision"]
    text = mc_diag.format_table(reports)
    assert "posix_fd handles" in text and "CUDA_ERROR_NOT_PERMITTED" in text
    assert text.splitlines()[-1] == "summary: 14 passed, 0 failed, 6 skipped -> exit 0"
    sm_bw = next(c for c in reports[0]["checks"] if c["name"] == "SM-driven peer bandwidth")
    gbps = sm_bw["data"]["gbps"]  # rank 0's figures, on every rank
    assert sorted(gbps) == ["pull_loads", "push_bulk", "push_stores", "push_tiles"]
    assert all(list(row) == ["8", "16", "33", "66", "99", "132"] for row in gbps.values())
    both = sm_bw["data"]["all_ranks_gbps"]  # every rank pushing at once, the slowest rank
    assert sorted(both) == ["push_bulk", "push_stores", "push_tiles"]
    assert all(list(row) == ["66", "132"] and min(row.values()) > 0 for row in both.values())
    assert "all ranks at once" in sm_bw["detail"]
    assert sm_bw == next(c for c in reports[1]["checks"] if c["name"] == sm_bw["name"])
    assert "cuMulticastCreate" not in fake.names()
    assert all(v == 0 for v in fake.live().values()), fake.live()


@needs_no_gpu
@pytest.mark.mpi
def test_no_gpu_under_torchrun_two_ranks():
    """torchrun instead of mpirun: the ranks still meet (torch.distributed over gloo) and
    rank 0 reports both."""
    env = _plain_env()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", str(SCRIPT)]  # standalone: the rendezvous takes a free local port
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180,
                       cwd=str(REPO))
    assert p.returncode != 0
    assert p.stdout.count("no CUDA GPU") == 2, p.stdout + p.stderr
    assert "(rank 0)" in p.stdout and "(rank 1)" in p.stdout
    assert "Traceback" not in p.stdout


def test_cluster_occupancy_is_reported_and_a_refused_probe_only_skips(monkeypatch):
    """The clusters the GEMM's cluster plans count, per GPU (H100s hold 30 or 32 of 4)."""
    from launch import occupancy
    from multicast import peer_check

    scopes = []
    monkeypatch.setattr(peer_check, "device_scope",
                        lambda drv, dev: contextlib.nullcontext(scopes.append(dev)))
    monkeypatch.setattr(occupancy, "max_active_clusters",
                        lambda dev, n, drv=None: {2: 66, 4: 30}[n])
    c = mc_diag.cluster_check(1, object())
    assert (c["status"], c["pairs"], c["quads"], scopes) == ("pass", 66, 30, [1])
    assert "66 2x1 and 30 4x1 clusters" in c["detail"]

    def refused(dev, n, drv=None):
        raise RuntimeError("cuModuleLoadData failed")
    monkeypatch.setattr(occupancy, "max_active_clusters", refused)
    c = mc_diag.cluster_check(0, object())
    assert c["status"] == "skip" and "cuModuleLoadData failed" in c["detail"]
    assert mc_diag.exit_code([{"checks": [c]}]) == mc_diag.EXIT_OK
