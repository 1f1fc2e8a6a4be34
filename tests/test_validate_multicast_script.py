"""scripts/validate_multicast.sh stops before any GPU work where the site forbids multicast."""
import subprocess

import pytest

from script_runs import REPO, plain_env

SCRIPT = REPO / "scripts" / "validate_multicast.sh"


def test_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


@pytest.mark.parametrize("switch", ["TORCH_SYMM_MEM_DISABLE_MULTICAST=1", "NCCL_NVLS_ENABLE=0",
                                    "NVSHMEM_DISABLE_NVLS=1", "RSAR_MULTICAST=off"])
def test_refuses_where_a_site_switch_forbids_multicast(switch, tmp_path):
    name, value = switch.split("=")
    # a stand-in mpirun that leaves a mark: reaching it would be the failure
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mpirun").write_text(f"#!/bin/sh\ntouch {tmp_path}/launched\n")
    (bin_dir / "mpirun").chmod(0o755)
    env = {k: v for k, v in plain_env().items()
           if k not in ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "NCCL_NVLS_ENABLE",
                        "NVSHMEM_DISABLE_NVLS", "RSAR_MULTICAST")}
    env[name] = value
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    r = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    assert f"{switch} here: the site forbids multicast" in r.stderr
    assert not (tmp_path / "launched").exists() and not (tmp_path / "out").exists()
