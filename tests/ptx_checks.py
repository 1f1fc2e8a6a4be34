"""PTX checks every kernel variant shares, whatever computed its tiles (wgmma or tcgen05)."""
from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest


def assert_protocol_ptx(ptx: str, v: Any) -> None:
    """The exchange protocol is in ``v``'s PTX exactly when the variant communicates: system-
    scope fences, relaxed stamps, acquire loads and timed waits; multimem loads-with-reduce (and, for AR
    only, multimem stores) on the multicast transport, no multimem on unicast."""
    if v.mode == "gemm":
        assert "ld.acquire.sys" not in ptx and "multimem" not in ptx
        return
    assert "ld.acquire.sys" in ptx and "%globaltimer" in ptx
    # stamps are relaxed stores after a system fence (a release pattern that fences once)
    assert "fence.acq_rel.sys" in ptx and "st.relaxed.sys" in ptx and "st.release.sys" not in ptx
    # the start stamp and the launch's shape travel in one 8-byte store and load
    assert "st.relaxed.sys.global.b64" in ptx and "ld.acquire.sys.global.b64" in ptx
    if v.transport == "multicast":
        assert "multimem.ld_reduce" in ptx
        if v.mode == "ar":
            assert "multimem.st" in ptx
        else:
            assert "multimem.st" not in ptx
    else:
        assert "multimem" not in ptx


def ptxas_log(ptx: str, tmp_path: Any, arch: str = "sm_90a") -> str:
    """ptxas -v's report on ``ptx`` (spills, registers, wgmma serialization notes such as
    C7514 / C7517 / C7520); skips the test where no ptxas is installed."""
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        pytest.skip("no ptxas here")
    src = tmp_path / "k.ptx"
    src.write_text(ptx)
    r = subprocess.run([ptxas, f"-arch={arch}", "-v", str(src), "-o", str(tmp_path / "k.cubin")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stderr
