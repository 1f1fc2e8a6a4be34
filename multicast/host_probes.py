"""Host-side probes the diagnostics (scripts/mc_diag.py) need beyond multicast.probes: host
and versions, SM count and PCI bus id, NVLink and fabric clique through NVML, IMEX channels.

Like multicast.probes, every function returns a JSON-ready dict and never raises for a
failed query: the field is None and ``errors[field]`` says why.
"""
from __future__ import annotations

import ctypes
import glob
import os
import platform
import socket
from typing import Any

from .driver import Driver

__all__ = ["host_info", "device_extras", "nvrtc_version", "nvml_info", "imex_channels",
           "local_rank"]

IMEX_CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"
# nvmlDeviceGetNvLinkVersion answers an enum, not the NVLink generation itself.
_NVLINK_VERSIONS = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0",
                    8: "6.0"}
_FABRIC_STATES = {0: "not supported", 1: "not started", 2: "in progress", 3: "completed"}
_MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS in current NVML; queries past a GPU's last link fail


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def local_rank() -> int | None:
    """This process's rank among the ranks of its host, as the MPI launchers export it."""
    for var in ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK",
                "SLURM_LOCALID", "LOCAL_RANK"):
        v = os.environ.get(var)
        if v is not None and v.strip().isdigit():
            return int(v)
    return None


def host_info() -> dict[str, Any]:
    out: dict[str, Any] = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "python": platform.python_version(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "errors": {},
    }
    try:
        import cuda.bindings

        out["cuda_bindings"] = cuda.bindings.__version__
    except Exception as e:
        out["cuda_bindings"] = None
        out["errors"]["cuda_bindings"] = _err(e)
    return out


def device_extras(device: int, drv: Driver) -> dict[str, Any]:
    """SM count, PCI bus id and memory size of one device (not in multicast.probes)."""
    out: dict[str, Any] = {"errors": {}}
    A = drv.raw.CUdevice_attribute
    ok, v = drv.try_call("cuDeviceGetAttribute", A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                         device)
    out["sm_count"] = int(v) if ok else None
    if not ok:
        out["errors"]["sm_count"] = v
    ok, v = drv.try_call("cuDeviceGetPCIBusId", 32, device)
    out["pci_bus_id"] = (v.split(b"\0", 1)[0].decode() if isinstance(v, bytes) else str(v)) \
        if ok else None
    if not ok:
        out["errors"]["pci_bus_id"] = v
    ok, v = drv.try_call("cuDeviceTotalMem", device)
    out["total_memory"] = int(v) if ok else None
    if not ok:
        out["errors"]["total_memory"] = v
    return out


def nvrtc_version() -> dict[str, Any]:
    """NVRTC's version, or why it cannot be loaded (the SM-path checks need it)."""
    try:
        from cuda.bindings import nvrtc

        status, major, minor = nvrtc.nvrtcVersion()
        if int(status) != 0:
            return {"version": None, "error": getattr(status, "name", str(status))}
        return {"version": f"{major}.{minor}", "error": None}
    except Exception as e:
        if any(c.__name__ == "DynamicLibNotFoundError" for c in type(e).__mro__):
            return {"version": None, "error": "libnvrtc not found"}
        return {"version": None, "error": _err(e).splitlines()[0][:160]}


class _NvmlApi:
    """The few NVML calls used, over pynvml (nvidia-ml-py) or, failing that, the NVML
    bindings in cuda-bindings; both raise on failure."""

    def __init__(self) -> None:
        try:
            import pynvml

            self.source, self._m = "pynvml", pynvml
        except ImportError:
            from cuda.bindings import nvml

            self.source, self._m = "cuda.bindings.nvml", nvml

    def init(self) -> None:
        (self._m.nvmlInit if self.source == "pynvml" else self._m.init_v2)()

    def shutdown(self) -> None:
        (self._m.nvmlShutdown if self.source == "pynvml" else self._m.shutdown)()

    def driver_version(self) -> str:
        if self.source == "pynvml":
            v = self._m.nvmlSystemGetDriverVersion()
        else:
            v = self._m.system_get_driver_version()
        return v.decode() if isinstance(v, bytes) else str(v)

    def handle(self, pci_bus_id: str) -> Any:
        if self.source == "pynvml":
            return self._m.nvmlDeviceGetHandleByPciBusId(pci_bus_id.encode())
        return self._m.device_get_handle_by_pci_bus_id_v2(pci_bus_id)

    def link_state(self, h: Any, link: int) -> int:
        if self.source == "pynvml":
            return int(self._m.nvmlDeviceGetNvLinkState(h, link))
        return int(self._m.device_get_nvlink_state(h, link))

    def link_version(self, h: Any, link: int) -> int:
        if self.source == "pynvml":
            return int(self._m.nvmlDeviceGetNvLinkVersion(h, link))
        return int(self._m.device_get_nvlink_version(h, link))

    def fabric(self, h: Any) -> dict[str, Any]:
        if self.source == "pynvml":
            info = self._m.c_nvmlGpuFabricInfo_t()
            self._m.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(info))
            uuid, clique, state, status = (bytes(info.clusterUuid), info.cliqueId, info.state,
                                           info.status)
        else:
            info = self._m.device_get_gpu_fabric_info_v(h)
            uuid, clique, state, status = (info.cluster_uuid, info.clique_id, info.state,
                                           info.status)
        uuid_b = bytes(uuid) if not isinstance(uuid, str) else uuid.encode()
        return {"clique_id": int(clique), "cluster_uuid": uuid_b.hex() if any(uuid_b) else None,
                "state": _FABRIC_STATES.get(int(state), str(int(state))), "status": int(status)}


def nvml_info(pci_bus_id: str | None) -> dict[str, Any]:
    """Driver version, NVLink links (count, active, versions) and the fabric clique of
    the GPU at ``pci_bus_id`` (CUDA ordinals and NVML indices differ; the bus id does not)."""
    out: dict[str, Any] = {"source": None, "driver_version": None, "nvlink": None,
                           "fabric": None, "errors": {}}
    try:
        api = _NvmlApi()
    except Exception as e:  # ImportError, or a bindings module that fails while loading
        out["errors"]["nvml"] = f"no NVML bindings (pip install nvidia-ml-py): {_err(e)}"
        return out
    out["source"] = api.source
    try:
        api.init()
    except Exception as e:
        out["errors"]["nvml"] = f"NVML init failed: {_err(e)}"
        return out
    try:
        try:
            out["driver_version"] = api.driver_version()
        except Exception as e:
            out["errors"]["driver_version"] = _err(e)
        if pci_bus_id is None:
            out["errors"]["nvlink"] = "no PCI bus id for this device"
            return out
        try:
            h = api.handle(pci_bus_id)
        except Exception as e:
            out["errors"]["nvlink"] = f"no NVML handle for {pci_bus_id}: {_err(e)}"
            return out
        links: list[dict[str, Any]] = []
        for link in range(_MAX_LINKS):
            try:
                state = api.link_state(h, link)
            except Exception as e:
                if link == 0:
                    out["errors"]["nvlink"] = _err(e)
                break  # past the last link of this GPU
            entry: dict[str, Any] = {"link": link, "active": state == 1}
            if state == 1:
                try:
                    raw = api.link_version(h, link)
                    entry["version"] = _NVLINK_VERSIONS.get(raw, f"NVML enum {raw}")
                except Exception as e:
                    entry["version"] = None
                    entry["error"] = _err(e)
            links.append(entry)
        if links:
            versions = sorted({str(e["version"]) for e in links if e.get("version")})
            out["nvlink"] = {"links": len(links), "active": sum(e["active"] for e in links),
                             "versions": versions}
        try:
            out["fabric"] = api.fabric(h)
        except Exception as e:
            out["errors"]["fabric"] = _err(e)
    finally:
        try:
            api.shutdown()
        except Exception:
            pass
    return out


def imex_channels() -> dict[str, Any]:
    """IMEX channel device files: fabric handles cannot be exported without one."""
    if not os.path.isdir(IMEX_CHANNEL_DIR):
        return {"dir": IMEX_CHANNEL_DIR, "present": False, "channels": []}
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(IMEX_CHANNEL_DIR, "*")))
    return {"dir": IMEX_CHANNEL_DIR, "present": True, "channels": names}
