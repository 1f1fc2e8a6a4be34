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
    for name in (b"rsar_copy_u32", b"rsar_add_sys_u32"):
        assert name in image
    # multimem exists from sm_90 on; older architectures leave those kernels out.
    assert (b"rsar_mc_st_u32" in image) == (cc >= (9, 0))
    assert (b"rsar_mc_ld_reduce_u32" in image) == (cc >= (9, 0))
