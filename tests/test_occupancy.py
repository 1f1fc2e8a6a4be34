"""The cluster-occupancy probe: its PTX assembles, and it asks the driver the right question."""
from __future__ import annotations

import shutil
import subprocess

import pytest

pytest.importorskip("cuda.bindings.driver")

from cuda.bindings import driver as real  # noqa: E402

from launch.occupancy import PROBE, PROBE_PTX, max_active_clusters  # noqa: E402
from multicast.driver import Driver  # noqa: E402
from multicast.errors import CudaDriverError  # noqa: E402

OK = real.CUresult.CUDA_SUCCESS


class FakeOccupancy:
    """Just the calls the probe makes, with the bindings' own types and return shape."""

    def __init__(self, clusters: int = 66, fail: bool = False) -> None:
        self.calls: list[tuple] = []
        self.clusters, self.fail = clusters, fail
        self.loaded = 0

    def __getattr__(self, name):  # types and enums come from the real bindings
        return getattr(real, name)

    def cuGetErrorName(self, status):
        return OK, b"CUDA_ERROR_INVALID_VALUE"

    def cuGetErrorString(self, status):
        return OK, b"invalid argument"

    def cuModuleLoadData(self, image):
        self.calls.append(("load", image))
        self.loaded += 1
        return OK, real.CUmodule(1)

    def cuModuleUnload(self, module):
        self.loaded -= 1
        return (OK,)

    def cuModuleGetFunction(self, module, name):
        self.calls.append(("function", name))
        return OK, real.CUfunction(2)

    def cuDeviceGet(self, ordinal):
        return OK, real.CUdevice(ordinal)

    def cuDeviceGetAttribute(self, attrib, dev):
        assert attrib == real.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        return OK, 232448

    def cuFuncSetAttribute(self, fn, attrib, value):
        self.calls.append(("set", attrib, value))
        return (OK,)

    def cuOccupancyAvailableDynamicSMemPerBlock(self, fn, blocks, threads):
        return OK, 232448

    def cuOccupancyMaxActiveClusters(self, fn, config):
        attr = config.attrs[0]
        self.calls.append(("clusters", attr.value.clusterDim.x, config.gridDimX,
                           config.sharedMemBytes, config.numAttrs))
        if self.fail:
            return real.CUresult.CUDA_ERROR_INVALID_VALUE, 0
        return OK, self.clusters


def test_probe_asks_for_whole_sm_ctas_in_clusters_of_the_given_size():
    fake = FakeOccupancy(clusters=64)
    assert max_active_clusters(0, 2, Driver(fake)) == 64
    assert ("clusters", 2, 2, 232448, 1) in fake.calls
    assert ("set", real.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            232448) in fake.calls
    assert ("function", PROBE) in fake.calls and fake.loaded == 0


def test_probe_unloads_its_module_when_the_driver_refuses():
    fake = FakeOccupancy(fail=True)
    with pytest.raises(CudaDriverError):
        max_active_clusters(0, 2, Driver(fake))
    assert fake.loaded == 0
    with pytest.raises(ValueError):
        max_active_clusters(0, 33, Driver(fake))


def test_probe_ptx_is_one_empty_entry_the_assembler_accepts(tmp_path):
    assert PROBE_PTX.endswith(b"\0") and PROBE_PTX.count(b".entry " + PROBE) == 1
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        pytest.skip("no ptxas here")
    src = tmp_path / "probe.ptx"
    src.write_bytes(PROBE_PTX.rstrip(b"\0"))
    out = subprocess.run([ptxas, "-arch=sm_90", str(src), "-o", str(tmp_path / "probe.cubin")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
