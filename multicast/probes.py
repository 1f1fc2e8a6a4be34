"""Read-only probes of what the driver and devices offer, for diagnostics.

Every function returns a plain dict (JSON-ready) and never raises for a CUDA failure:
a query that failed leaves its field None and records the error name under
``errors[field]``. Only queries happen here; nothing is allocated or created
(the multicast granularity query is a property lookup, not an object).
"""
from __future__ import annotations

from typing import Any, Iterable

from .driver import Driver, default_driver
from .handles import KINDS, POSIX_FD, alloc_prop, mc_prop

__all__ = [
    "driver_version", "device_count", "device_attributes", "allocation_granularity",
    "multicast_granularity", "p2p_attributes", "p2p_matrix", "probe_all",
]

_DEVICE_ATTRIBUTES = {
    "multicast_supported": "CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED",
    "fabric_handle_supported": "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED",
    "posix_fd_handle_supported": "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED",
    "vmm_supported": "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED",
    "gpudirect_rdma_with_vmm": "CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED",
}

_P2P_ATTRIBUTES = {
    "access_supported": "CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED",
    "native_atomic_supported": "CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED",
    "performance_rank": "CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK",
}


class _Probe:
    """Collects values and error names for one result dict."""

    def __init__(self, drv: Driver | None, **fields: Any) -> None:
        self.drv = drv if drv is not None else default_driver()
        self.out: dict[str, Any] = dict(fields)
        self.errors: dict[str, str] = {}
        self.out["errors"] = self.errors

    def init(self) -> bool:
        ok, res = self._call("cuInit", 0)
        if not ok:
            self.errors["cuInit"] = res
        return ok

    def _call(self, name: str, *args: Any) -> tuple[bool, Any]:
        try:
            return self.drv.try_call(name, *args)
        except Exception as e:  # bad argument types, missing enums in old bindings
            return False, f"{type(e).__name__}: {e}"

    def query(self, key: str, name: str, *args: Any, convert: Any = int) -> Any:
        ok, res = self._call(name, *args)
        if not ok:
            self.errors[key] = res
            self.out[key] = None
            return None
        try:
            self.out[key] = convert(res)
        except Exception as e:
            self.errors[key] = f"{type(e).__name__}: {e}"
            self.out[key] = None
        return self.out[key]

    def enum(self, owner: str, member: str, key: str) -> Any:
        try:
            return getattr(getattr(self.drv.raw, owner), member)
        except AttributeError:
            self.errors[key] = f"{owner}.{member} not in these CUDA bindings"
            self.out[key] = None
            return None

    def fail_all(self, keys: Iterable[str], why: str) -> dict[str, Any]:
        for k in keys:
            self.out[k] = None
            self.errors.setdefault(k, why)
        return self.out


def _as_bool(v: Any) -> bool:
    return bool(int(v))


def _decode(v: Any) -> str:
    if isinstance(v, bytes):
        return v.split(b"\0", 1)[0].decode(errors="replace")
    return str(v)


def driver_version(drv: Driver | None = None) -> dict[str, Any]:
    """{"version": 13000, "text": "13.0", "errors": {}}"""
    p = _Probe(drv)
    v = p.query("version", "cuDriverGetVersion")
    p.out["text"] = None if v is None else f"{v // 1000}.{v % 1000 // 10}"
    return p.out


def device_count(drv: Driver | None = None) -> dict[str, Any]:
    p = _Probe(drv)
    if not p.init():
        return p.fail_all(["count"], p.errors["cuInit"])
    p.query("count", "cuDeviceGetCount")
    return p.out


def device_attributes(device: int, drv: Driver | None = None) -> dict[str, Any]:
    """Name, compute capability and the attributes symmetric memory depends on."""
    p = _Probe(drv, device=device)
    keys = ["name", "compute_capability", *_DEVICE_ATTRIBUTES]
    if not p.init():
        return p.fail_all(keys, p.errors["cuInit"])
    p.query("name", "cuDeviceGetName", 256, device, convert=_decode)
    A = "CUdevice_attribute"
    major = p.enum(A, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR", "compute_capability")
    minor = p.enum(A, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR", "compute_capability")
    if major is not None and minor is not None:
        mj = p.query("compute_capability", "cuDeviceGetAttribute", major, device)
        mn = p.query("compute_capability", "cuDeviceGetAttribute", minor, device)
        p.out["compute_capability"] = None if mj is None or mn is None else f"{mj}.{mn}"
    for key, member in _DEVICE_ATTRIBUTES.items():
        attr = p.enum(A, member, key)
        if attr is not None:
            p.query(key, "cuDeviceGetAttribute", attr, device, convert=_as_bool)
    return p.out


def allocation_granularity(device: int, kind: str = POSIX_FD,
                           drv: Driver | None = None) -> dict[str, Any]:
    """cuMemGetAllocationGranularity (minimum and recommended) for a pinned device
    allocation with the given handle kind ("posix_fd" | "fabric")."""
    p = _Probe(drv, device=device, handle_type=kind)
    if kind not in KINDS:
        return p.fail_all(["minimum", "recommended"], f"unknown handle kind {kind!r}")
    if not p.init():
        return p.fail_all(["minimum", "recommended"], p.errors["cuInit"])
    prop = alloc_prop(p.drv, device, kind)
    flags = p.drv.raw.CUmemAllocationGranularity_flags
    p.query("minimum", "cuMemGetAllocationGranularity", prop,
            flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
    p.query("recommended", "cuMemGetAllocationGranularity", prop,
            flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    return p.out


def multicast_granularity(num_devices: int, kind: str = POSIX_FD, size: int = 2 << 20,
                          drv: Driver | None = None) -> dict[str, Any]:
    """cuMulticastGetGranularity (minimum and recommended): a query, creates nothing."""
    p = _Probe(drv, num_devices=num_devices, handle_type=kind)
    if kind not in KINDS:
        return p.fail_all(["minimum", "recommended"], f"unknown handle kind {kind!r}")
    if not p.init():
        return p.fail_all(["minimum", "recommended"], p.errors["cuInit"])
    try:
        prop = mc_prop(p.drv, num_devices, size, kind)
        flags = p.drv.raw.CUmulticastGranularity_flags
    except AttributeError as e:
        return p.fail_all(["minimum", "recommended"], f"no multicast in these bindings: {e}")
    p.query("minimum", "cuMulticastGetGranularity", prop,
            flags.CU_MULTICAST_GRANULARITY_MINIMUM)
    p.query("recommended", "cuMulticastGetGranularity", prop,
            flags.CU_MULTICAST_GRANULARITY_RECOMMENDED)
    return p.out


def p2p_attributes(src: int, dst: int, drv: Driver | None = None) -> dict[str, Any]:
    """cuDeviceGetP2PAttribute from ``src`` to ``dst``: access, native atomics, rank."""
    p = _Probe(drv, src=src, dst=dst)
    if not p.init():
        return p.fail_all(_P2P_ATTRIBUTES, p.errors["cuInit"])
    for key, member in _P2P_ATTRIBUTES.items():
        attr = p.enum("CUdevice_P2PAttribute", member, key)
        if attr is not None:
            conv = int if key == "performance_rank" else _as_bool
            p.query(key, "cuDeviceGetP2PAttribute", attr, src, dst, convert=conv)
    return p.out


def p2p_matrix(devices: Iterable[int], drv: Driver | None = None) -> list[dict[str, Any]]:
    """p2p_attributes for every ordered pair of distinct devices."""
    devs = list(devices)
    return [p2p_attributes(a, b, drv) for a in devs for b in devs if a != b]


def probe_all(devices: Iterable[int] | None = None,
              drv: Driver | None = None) -> dict[str, Any]:
    """Everything above for the given devices (default: all visible ones)."""
    drv = drv if drv is not None else default_driver()
    out: dict[str, Any] = {"driver": driver_version(drv), "device_count": device_count(drv)}
    if devices is None:
        n = out["device_count"].get("count")
        devices = range(n or 0)
    devs = list(devices)
    out["devices"] = [
        {**device_attributes(d, drv),
         "allocation_granularity": {k: allocation_granularity(d, k, drv) for k in KINDS}}
        for d in devs
    ]
    out["multicast_granularity"] = (
        {k: multicast_granularity(len(devs), k, drv=drv) for k in KINDS} if devs else {})
    out["p2p"] = p2p_matrix(devs, drv)
    return out
