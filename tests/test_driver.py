"""The checked driver wrapper and the diagnostics probes (CPU only)."""
from __future__ import annotations

import types

import pytest
from cuda.bindings import driver as real

from fake_driver import FakeDriver
from multicast import probes
from multicast.driver import Driver, default_driver
from multicast.errors import CudaDriverError, RsarError

R = real.CUresult


def module(**fns):
    return types.SimpleNamespace(**fns)


def test_results_without_status():
    d = Driver(module(cuNone=lambda: (R.CUDA_SUCCESS,),
                      cuOne=lambda x: (R.CUDA_SUCCESS, x + 1),
                      cuTwo=lambda: (R.CUDA_SUCCESS, 1, 2)))
    assert d.cuNone() is None
    assert d.cuOne(41) == 42
    assert d.cuTwo() == (1, 2)
    assert d.call("cuOne", 1) == 2


def test_failure_names_error_and_call():
    d = Driver(module(cuMemAlloc=lambda n: (R.CUDA_ERROR_OUT_OF_MEMORY, None)))
    with pytest.raises(CudaDriverError) as ei:
        d.cuMemAlloc(1 << 30)
    e = ei.value
    assert isinstance(e, RsarError) and isinstance(e, RuntimeError)
    assert e.call == "cuMemAlloc"
    assert e.code == int(R.CUDA_ERROR_OUT_OF_MEMORY)
    assert e.name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert "cuMemAlloc" in str(e) and "CUDA_ERROR_OUT_OF_MEMORY" in str(e)
    assert "0x40000000" in str(e)  # the arguments help find which call of many


def test_error_name_from_cuGetErrorName_when_available():
    d = Driver(module(cuX=lambda: (R.CUDA_ERROR_INVALID_VALUE,),
                      cuGetErrorName=lambda s: (R.CUDA_SUCCESS, b"FROM_DRIVER")))
    with pytest.raises(CudaDriverError, match="FROM_DRIVER"):
        d.cuX()


def test_error_name_fallbacks():
    # cuGetErrorName failing (e.g. no driver library) and a plain int status.
    def broken(_):
        raise RuntimeError("no driver")

    d = Driver(module(cuX=lambda: (2,), cuGetErrorName=broken))
    with pytest.raises(CudaDriverError) as ei:
        d.cuX()
    assert ei.value.name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert ei.value.code == 2
    d = Driver(module(cuY=lambda: (987654,)))
    with pytest.raises(CudaDriverError, match="CUresult\\(987654\\)"):
        d.cuY()


def test_try_call():
    d = Driver(module(cuOk=lambda: (R.CUDA_SUCCESS, 7),
                      cuBad=lambda: (R.CUDA_ERROR_NOT_SUPPORTED, None)))
    assert d.try_call("cuOk") == (True, 7)
    assert d.try_call("cuBad") == (False, "CUDA_ERROR_NOT_SUPPORTED")
    ok, why = d.try_call("cuNotThere")
    assert not ok and "cuNotThere" in why


def test_attribute_access():
    d = Driver(FakeDriver())
    assert d.raw.CUresult is real.CUresult  # types and enums through .raw
    with pytest.raises(AttributeError):
        d.notADriverFunction
    with pytest.raises(AttributeError):
        d.cuSomethingTheFakeLacks


def test_non_driver_exceptions_propagate():
    def bad(x):
        raise TypeError("wrong argument type")

    with pytest.raises(TypeError):
        Driver(module(cuZ=bad)).cuZ(1)


def test_real_bindings_are_checked():
    # On a machine without a GPU (CI) the driver library is missing; that must surface
    # as a CudaDriverError naming the call, not as the bindings' loader exception.
    d = Driver()
    assert d.raw is real
    try:
        d.cuInit(0)
    except CudaDriverError as e:
        assert e.call == "cuInit"
        assert e.name.startswith("CUDA_")
    assert default_driver() is default_driver()


def test_primary_context_retained_once():
    fake = FakeDriver()
    d = Driver(fake)
    a = d.primary_context(3)
    b = d.primary_context(3)
    assert int(a) == int(b)
    assert fake.names().count("cuDevicePrimaryCtxRetain") == 1
    assert fake.primary_refs[3] == 1


# ---- probes ---------------------------------------------------------------------------

def test_probes_report_values():
    d = Driver(FakeDriver(num_devices=2, fabric_supported=True))
    out = probes.probe_all(drv=d)
    assert out["driver"] == {"errors": {}, "version": 13000, "text": "13.0"}
    assert out["device_count"]["count"] == 2
    dev0 = out["devices"][0]
    assert dev0["errors"] == {}
    assert dev0["multicast_supported"] is True
    assert dev0["fabric_handle_supported"] is True
    assert dev0["posix_fd_handle_supported"] is True
    assert dev0["vmm_supported"] is True
    assert dev0["gpudirect_rdma_with_vmm"] is True
    assert dev0["compute_capability"] == "9.0"
    assert dev0["allocation_granularity"]["posix_fd"]["recommended"] == 2 << 20
    assert out["multicast_granularity"]["posix_fd"]["minimum"] == 2 << 20
    assert [(p["src"], p["dst"]) for p in out["p2p"]] == [(0, 1), (1, 0)]
    assert out["p2p"][0]["access_supported"] is True
    assert out["p2p"][0]["native_atomic_supported"] is True


def test_probes_record_errors_instead_of_raising():
    fake = FakeDriver(num_devices=2, multicast_supported=False)
    fake.inject("cuDeviceGetAttribute", code=R.CUDA_ERROR_INVALID_DEVICE, times=1)
    fake.inject("cuDeviceGetP2PAttribute", code=R.CUDA_ERROR_NOT_SUPPORTED, times=100)
    d = Driver(fake)
    attrs = probes.device_attributes(0, d)
    assert attrs["compute_capability"] is None
    assert attrs["errors"]["compute_capability"] == "CUDA_ERROR_INVALID_DEVICE"
    assert attrs["multicast_supported"] is False
    p2p = probes.p2p_attributes(0, 1, d)
    assert p2p["access_supported"] is None
    assert p2p["errors"]["access_supported"] == "CUDA_ERROR_NOT_SUPPORTED"
    mc = probes.multicast_granularity(2, drv=d)
    assert mc["minimum"] is None and mc["errors"]["minimum"] == "CUDA_ERROR_NOT_SUPPORTED"
    assert probes.allocation_granularity(0, "bogus", d)["errors"]["minimum"]
    # Probes never create anything.
    assert not any(n.startswith("cuMulticastCreate") or n == "cuMemCreate" for n in fake.names())


def test_probes_without_a_driver_library():
    out = probes.probe_all()  # the real bindings; no GPU on CI machines
    assert set(out) == {"driver", "device_count", "devices", "multicast_granularity", "p2p"}
    if out["device_count"]["count"] is None:
        assert out["device_count"]["errors"]["cuInit"].startswith("CUDA_")
        assert out["devices"] == [] and out["p2p"] == []
