"""The check kernels compile with NVRTC (where libnvrtc is installed; no GPU needed), and a
missing NVRTC is a clear CudaDriverError rather than a loader traceback."""
from __future__ import annotations

import pytest

from multicast.errors import CudaDriverError
from multicast.nvrtc_kernels import NVRTC_NOT_FOUND, compile_for


def _nvrtc_missing() -> bool:
    try:
        compile_for(9, 0)
    except CudaDriverError as e:
        return e.name == NVRTC_NOT_FOUND
    return False


MISSING = _nvrtc_missing()


@pytest.mark.skipif(not MISSING, reason="libnvrtc is installed here")
def test_missing_nvrtc_is_named():
    with pytest.raises(CudaDriverError) as info:
        compile_for(9, 0)
    assert info.value.name == NVRTC_NOT_FOUND and "libnvrtc" in str(info.value)


@pytest.mark.skipif(MISSING, reason="libnvrtc is not installed")
@pytest.mark.parametrize("cc", [(8, 0), (9, 0), (10, 0)])
def test_kernels_compile(cc):
    image, kind = compile_for(*cc)
    assert kind in ("cubin", "ptx") and image
    for name in (b"rsar_copy_u32", b"rsar_add_sys_u32", b"rsar_copy_v4"):
        assert name in image
    assert (b"rsar_push_bulk" in image) == (cc >= (9, 0))
    # multimem exists from sm_90 on; older architectures leave those kernels out.
    assert (b"rsar_mc_st_u32" in image) == (cc >= (9, 0))
    assert (b"rsar_mc_ld_reduce_u32" in image) == (cc >= (9, 0))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100"])
def test_kernels_compile_with_nvcc(tmp_path, arch):
    """The same source through the toolkit's compiler, where there is one (NVRTC may not be)."""
    import shutil
    import subprocess
    from multicast.nvrtc_kernels import SOURCE
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc here")
    src = tmp_path / "k.cu"
    src.write_text(SOURCE)
    out = subprocess.run([nvcc, f"-arch={arch}", "-cubin", "-o", str(tmp_path / "k.cubin"),
                          str(src)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    image = (tmp_path / "k.cubin").read_bytes()
    assert b"rsar_copy_v4" in image
    assert (b"rsar_push_bulk" in image) == (arch != "sm_80")


def test_sm_bandwidth_split_moves_whole_bulk_copies():
    from multicast.peer_check import BULK_BYTES, sm_bw_split
    for nbytes in (1 << 20, 256 << 20, (256 << 20) + 12345):
        for ctas in (8, 33, 132):
            per = sm_bw_split(nbytes, ctas)
            assert per % BULK_BYTES == 0 and per * ctas <= max(nbytes, BULK_BYTES * ctas)
            assert per * ctas > nbytes - BULK_BYTES * ctas
