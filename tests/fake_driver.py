"""A recording fake of the cuda.bindings.driver calls the multicast layer makes.

It behaves like the bindings (each call returns ``(CUresult, values...)``, real
CUresult/handle/pointer types) and keeps enough state to catch misuse the real
driver would punish: binding before every device joined the multicast team, mapping
into unreserved ranges, freeing ranges that are still mapped, importing a fabric
handle whose exporter already released it, using a context that is not current.

Shared by N thread-ranks: each thread binds itself to a rank (``bind_thread``) and
every call is recorded as ``Call(rank, name, args)`` in one list, in global order.
POSIX shareable handles are real ``os.memfd_create`` descriptors, so fd leaks show.

Types and enums come from the real ``cuda.bindings.driver`` (it imports without a GPU).
"""
from __future__ import annotations

import itertools
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from cuda.bindings import driver as real

R = real.CUresult
OK = R.CUDA_SUCCESS
MiB = 1 << 20


@dataclass
class Call:
    rank: int | None
    name: str
    args: tuple
    result: Any = None  # the CUresult returned


@dataclass
class _Object:
    """An allocation or a multicast object; handles reference it."""

    oid: int
    kind: str  # "mem" | "mc"
    size: int
    device: int | None
    handle_types: int
    refs: int = 0
    devices: set = field(default_factory=set)  # mc: devices added
    num_devices: int = 0  # mc: team size
    bindings: dict = field(default_factory=dict)  # mc: device -> mem object id


@dataclass
class _Injection:
    name: str
    rank: int | None
    code: Any
    when: Callable[[tuple], bool] | None
    times: int
    skip: int


class FakeDriver:
    """Module-like: ``Driver(FakeDriver(...))`` wraps it like the real bindings."""

    def __init__(self, num_devices: int = 8, *, multicast_supported: bool = True,
                 fabric_supported: bool = False, fabric_export_ok: bool = True,
                 posix_supported: bool = True, alloc_granularity: int = 2 * MiB,
                 mc_granularity: int = 2 * MiB, mc_granularity_recommended: int = 512 * MiB,
                 driver_version: int = 13000) -> None:
        self.num_devices = num_devices
        self.multicast_supported = multicast_supported
        self.fabric_supported = fabric_supported
        self.fabric_export_ok = fabric_export_ok
        self.posix_supported = posix_supported
        self.alloc_granularity = alloc_granularity
        self.mc_granularity = mc_granularity
        self.mc_granularity_recommended = mc_granularity_recommended
        self.driver_version = driver_version
        self.attribute_overrides: dict[tuple[int, Any], int] = {}
        self.p2p: dict[tuple[int, int, Any], int] = {}

        self.calls: list[Call] = []
        self.record_calls = True
        self._lock = threading.RLock()
        self._tls = threading.local()
        self._ids = itertools.count(1)
        self._injections: list[_Injection] = []

        self.objects: dict[int, _Object] = {}
        self.handles: dict[int, int] = {}  # handle -> object id
        self.reservations: dict[int, int] = {}  # va -> size
        self.mappings: dict[int, tuple[int, int]] = {}  # va -> (size, object id)
        self.access: dict[int, set] = {}  # mapped va -> devices with access
        self.device_allocs: dict[int, bytearray] = {}  # cuMemAlloc'd
        self.memfd_objects: dict[int, int] = {}  # memfd inode -> object id
        self.primary_refs: dict[int, int] = {}
        # Kinds ("mem" | "mc") of every handle and mapped address ever handed out, so a
        # test can classify calls in the record after the handle is gone.
        self.handle_kind: dict[int, str] = {}
        self.va_kind: dict[int, str] = {}
        self._next_va = 0x7F00_0000_0000

    # ---- test-side helpers ----------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        # Types and enums from the real bindings; driver functions must be faked here.
        if name.startswith("cu"):
            raise AttributeError(f"FakeDriver does not implement {name}")
        return getattr(real, name)

    def bind_thread(self, rank: int | None) -> None:
        """Attribute this thread's calls to ``rank``; it starts with no current context."""
        self._tls.rank = rank
        self._tls.ctx_stack = []

    def make_current(self, device: int) -> None:
        """Make a (primary-like) context of ``device`` current on this thread."""
        self._stack()[:] = [0xC000 + device]

    def record_barrier(self, rank: int) -> None:
        with self._lock:
            if self.record_calls:
                self.calls.append(Call(rank, "<barrier>", ()))

    def inject(self, name: str, *, rank: int | None = None,
               code: Any = R.CUDA_ERROR_UNKNOWN,
               when: Callable[[tuple], bool] | None = None, times: int = 1,
               skip: int = 0) -> None:
        """Make ``name`` fail with ``code`` on ``rank`` (any rank if None) ``times`` times,
        after letting ``skip`` matching calls through; ``when(args)`` narrows the match."""
        self._injections.append(_Injection(name, rank, code, when, times, skip))

    def names(self, rank: int | None = None, *, include_barriers: bool = False) -> list[str]:
        return [c.name for c in self.calls
                if (rank is None or c.rank == rank)
                and (include_barriers or c.name != "<barrier>")]

    def index(self, name: str, rank: int | None = None, *, last: bool = False,
              when: Callable[[Call], bool] | None = None) -> int:
        """Position of the first (or last) matching call in the global record; -1 if none."""
        hits = [i for i, c in enumerate(self.calls) if c.name == name
                and (rank is None or c.rank == rank) and (when is None or when(c))]
        if not hits:
            return -1
        return hits[-1] if last else hits[0]

    def is_mc_handle(self, h: Any) -> bool:
        with self._lock:
            return self.handle_kind.get(int(h)) == "mc"

    def is_mc_ptr(self, ptr: Any) -> bool:
        with self._lock:
            return self.va_kind.get(int(ptr)) == "mc"

    def object_at(self, ptr: Any) -> int | None:
        """Id of the object mapped at ``ptr`` (which allocation a pointer shows)."""
        with self._lock:
            m = self.mappings.get(int(ptr))
            return None if m is None else m[1]

    def live_objects(self, kind: str) -> int:
        with self._lock:
            return sum(1 for o in self.objects.values() if o.kind == kind and o.refs > 0)

    def live(self) -> dict[str, int]:
        """What is still held; all zero once everything was given back."""
        with self._lock:
            return {
                "objects": sum(1 for o in self.objects.values() if o.refs > 0),
                "handles": len(self.handles),
                "reservations": len(self.reservations),
                "mappings": len(self.mappings),
                "device_allocs": len(self.device_allocs),
                "mc_bindings": sum(len(o.bindings) for o in self.objects.values()),
            }

    def read_device(self, ptr: int, n: int) -> bytes:
        with self._lock:
            return bytes(self.device_allocs[int(ptr)][:n])

    # ---- machinery ------------------------------------------------------------------

    def _rank(self) -> int | None:
        return getattr(self._tls, "rank", None)

    def _stack(self) -> list[int]:
        if not hasattr(self._tls, "ctx_stack"):
            self._tls.ctx_stack = []
        return self._tls.ctx_stack

    def _current(self) -> int:
        s = self._stack()
        return s[-1] if s else 0

    def _enter(self, name: str, args: tuple) -> Any:
        """Record the call; return an injected error code or None."""
        with self._lock:
            call = Call(self._rank(), name, args)
            if self.record_calls:
                self.calls.append(call)
            for inj in self._injections:
                if inj.times > 0 and inj.name == name and \
                        (inj.rank is None or inj.rank == call.rank) and \
                        (inj.when is None or inj.when(args)):
                    if inj.skip > 0:
                        inj.skip -= 1
                        continue
                    inj.times -= 1
                    call.result = inj.code
                    return inj.code
            return None

    def _new_handle(self, oid: int) -> Any:
        h = next(self._ids)
        self.handles[h] = oid
        self.handle_kind[h] = self.objects[oid].kind
        self.objects[oid].refs += 1
        return real.CUmemGenericAllocationHandle(h)

    def _drop_ref(self, oid: int) -> None:
        obj = self.objects[oid]
        obj.refs -= 1
        if obj.refs == 0:
            for inode in [i for i, o in self.memfd_objects.items() if o == oid]:
                del self.memfd_objects[inode]

    def _obj(self, h: Any) -> _Object | None:
        oid = self.handles.get(int(h))
        return None if oid is None else self.objects[oid]

    def _need_ctx(self) -> Any:
        return None if self._current() else R.CUDA_ERROR_INVALID_CONTEXT

    def _mapping_at(self, ptr: int, size: int) -> int | None:
        for va, (sz, _) in self.mappings.items():
            if va <= ptr and ptr + size <= va + sz:
                return va
        return None

    # ---- init, devices, contexts ----------------------------------------------------

    def cuInit(self, flags):
        return (self._enter("cuInit", (flags,)) or OK,)

    def cuDriverGetVersion(self):
        return (self._enter("cuDriverGetVersion", ()) or OK, self.driver_version)

    def cuGetErrorName(self, status):
        # Not recorded: the wrapper calls it while building an error.
        return OK, R(int(status)).name.encode()

    def cuGetErrorString(self, status):
        return OK, f"fake {R(int(status)).name}".encode()

    def cuDeviceGetCount(self):
        return (self._enter("cuDeviceGetCount", ()) or OK, self.num_devices)

    def cuDeviceGet(self, ordinal):
        err = self._enter("cuDeviceGet", (ordinal,))
        if err:
            return err, None
        if not 0 <= int(ordinal) < self.num_devices:
            return R.CUDA_ERROR_INVALID_DEVICE, None
        return OK, real.CUdevice(int(ordinal))

    def cuDeviceGetName(self, length, dev):
        err = self._enter("cuDeviceGetName", (length, dev))
        return (err, None) if err else (OK, f"Fake GPU {int(dev)}".encode())

    def cuDeviceGetAttribute(self, attrib, dev):
        err = self._enter("cuDeviceGetAttribute", (attrib, dev))
        if err:
            return err, None
        if not 0 <= int(dev) < self.num_devices:
            return R.CUDA_ERROR_INVALID_DEVICE, None
        key = (int(dev), attrib)
        if key in self.attribute_overrides:
            return OK, self.attribute_overrides[key]
        A = real.CUdevice_attribute
        table = {
            A.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED: int(self.multicast_supported),
            A.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED: int(self.fabric_supported),
            A.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
                int(self.posix_supported),
            A.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: 1,
            A.CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: 1,
            A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: 9,
            A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: 0,
        }
        return OK, table.get(attrib, 0)

    def cuDeviceGetP2PAttribute(self, attrib, src, dst):
        err = self._enter("cuDeviceGetP2PAttribute", (attrib, src, dst))
        if err:
            return err, None
        if int(src) == int(dst) or not (0 <= int(src) < self.num_devices
                                        and 0 <= int(dst) < self.num_devices):
            return R.CUDA_ERROR_INVALID_DEVICE, None
        return OK, self.p2p.get((int(src), int(dst), attrib), 1)

    def cuDevicePrimaryCtxRetain(self, dev):
        err = self._enter("cuDevicePrimaryCtxRetain", (dev,))
        if err:
            return err, None
        with self._lock:
            self.primary_refs[int(dev)] = self.primary_refs.get(int(dev), 0) + 1
        return OK, real.CUcontext(0xC000 + int(dev))

    def cuDevicePrimaryCtxRelease(self, dev):
        err = self._enter("cuDevicePrimaryCtxRelease", (dev,))
        if err:
            return (err,)
        with self._lock:
            self.primary_refs[int(dev)] -= 1
        return (OK,)

    def cuCtxGetCurrent(self):
        err = self._enter("cuCtxGetCurrent", ())
        return (err, None) if err else (OK, real.CUcontext(self._current()))

    def cuCtxSetCurrent(self, ctx):
        err = self._enter("cuCtxSetCurrent", (ctx,))
        if err:
            return (err,)
        s = self._stack()
        if s:
            s[-1] = int(ctx)
        else:
            s.append(int(ctx))
        return (OK,)

    def cuCtxPushCurrent(self, ctx):
        err = self._enter("cuCtxPushCurrent", (ctx,))
        if err:
            return (err,)
        self._stack().append(int(ctx))
        return (OK,)

    def cuCtxPopCurrent(self):
        err = self._enter("cuCtxPopCurrent", ())
        if err:
            return err, None
        s = self._stack()
        if not s:
            return R.CUDA_ERROR_INVALID_CONTEXT, None
        return OK, real.CUcontext(s.pop())

    def cuCtxGetDevice(self):
        err = self._enter("cuCtxGetDevice", ()) or self._need_ctx()
        return (err, None) if err else (OK, real.CUdevice(self._current() - 0xC000))

    def cuCtxSynchronize(self):
        return (self._enter("cuCtxSynchronize", ()) or self._need_ctx() or OK,)

    # ---- virtual memory management --------------------------------------------------

    def cuMemGetAllocationGranularity(self, prop, option):
        err = self._enter("cuMemGetAllocationGranularity", (prop, option))
        return (err, None) if err else (OK, self.alloc_granularity)

    def cuMemCreate(self, size, prop, flags):
        err = self._enter("cuMemCreate", (size, prop, flags))
        if err:
            return err, None
        types = int(prop.requestedHandleTypes)
        fabric = int(real.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC)
        if size <= 0 or size % self.alloc_granularity:
            return R.CUDA_ERROR_INVALID_VALUE, None
        if not 0 <= prop.location.id < self.num_devices:
            return R.CUDA_ERROR_INVALID_DEVICE, None
        if types & fabric and not self.fabric_supported:
            return R.CUDA_ERROR_NOT_SUPPORTED, None
        with self._lock:
            oid = next(self._ids)
            self.objects[oid] = _Object(oid, "mem", size, prop.location.id, types)
            return OK, self._new_handle(oid)

    def cuMemRelease(self, handle):
        err = self._enter("cuMemRelease", (handle,))
        if err:
            return (err,)
        with self._lock:
            oid = self.handles.pop(int(handle), None)
            if oid is None:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            self._drop_ref(oid)
        return (OK,)

    def cuMemExportToShareableHandle(self, handle, handle_type, flags):
        err = self._enter("cuMemExportToShareableHandle", (handle, handle_type, flags))
        if err:
            return err, None
        with self._lock:
            obj = self._obj(handle)
            if obj is None or not obj.handle_types & int(handle_type):
                return R.CUDA_ERROR_INVALID_VALUE, None
            T = real.CUmemAllocationHandleType
            if handle_type == T.CU_MEM_HANDLE_TYPE_FABRIC:
                if not self.fabric_export_ok:
                    return R.CUDA_ERROR_NOT_PERMITTED, None
                fh = real.CUmemFabricHandle()
                fh.data = b"FAKEFABR" + obj.oid.to_bytes(8, "little") + bytes(48)
                return OK, fh
            fd = os.memfd_create(f"fake-cuda-{obj.kind}-{obj.oid}", os.MFD_CLOEXEC)
            self.memfd_objects[os.fstat(fd).st_ino] = obj.oid
            return OK, fd

    def cuMemImportFromShareableHandle(self, os_handle, handle_type):
        err = self._enter("cuMemImportFromShareableHandle", (os_handle, handle_type))
        if err:
            return err, None
        with self._lock:
            T = real.CUmemAllocationHandleType
            if handle_type == T.CU_MEM_HANDLE_TYPE_FABRIC:
                if not isinstance(os_handle, (bytes, bytearray, memoryview)):
                    # As the real bindings: osHandle must be a buffer (or an address).
                    raise TypeError(f"osHandle of type {type(os_handle)} has no buffer protocol")
                data = bytes(os_handle)
                if data[:8] != b"FAKEFABR":
                    return R.CUDA_ERROR_INVALID_VALUE, None
                oid = int.from_bytes(data[8:16], "little")
            else:
                try:
                    oid = self.memfd_objects.get(os.fstat(int(os_handle)).st_ino)
                except OSError:
                    return R.CUDA_ERROR_INVALID_VALUE, None
            obj = self.objects.get(oid) if oid is not None else None
            # A fabric handle names the object, it does not keep it alive: importing
            # after the exporter released it fails, as on real hardware.
            if obj is None or obj.refs == 0:
                return R.CUDA_ERROR_INVALID_VALUE, None
            return OK, self._new_handle(oid)

    def cuMemAddressReserve(self, size, alignment, addr, flags):
        err = self._enter("cuMemAddressReserve", (size, alignment, addr, flags))
        if err:
            return err, None
        with self._lock:
            align = max(int(alignment), self.alloc_granularity)
            va = (self._next_va + align - 1) // align * align
            self._next_va = va + size + self.alloc_granularity  # a guard gap
            self.reservations[va] = size
            return OK, real.CUdeviceptr(va)

    def cuMemAddressFree(self, ptr, size):
        err = self._enter("cuMemAddressFree", (ptr, size))
        if err:
            return (err,)
        with self._lock:
            ptr = int(ptr)
            if self.reservations.get(ptr) != size:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            if any(ptr <= va < ptr + size for va in self.mappings):
                return (R.CUDA_ERROR_INVALID_VALUE,)  # still mapped
            del self.reservations[ptr]
        return (OK,)

    def cuMemMap(self, ptr, size, offset, handle, flags):
        err = self._enter("cuMemMap", (ptr, size, offset, handle, flags))
        if err:
            return (err,)
        with self._lock:
            ptr = int(ptr)
            obj = self._obj(handle)
            inside = any(va <= ptr and ptr + size <= va + sz
                         for va, sz in self.reservations.items())
            if obj is None or not inside or offset + size > obj.size:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            if any(va < ptr + size and ptr < va + sz for va, (sz, _) in self.mappings.items()):
                return (R.CUDA_ERROR_INVALID_VALUE,)
            if obj.kind == "mc" and len(obj.devices) < obj.num_devices:
                return (R.CUDA_ERROR_INVALID_VALUE,)  # map only after every device joined
            self.mappings[ptr] = (size, obj.oid)
            self.va_kind[ptr] = obj.kind
            obj.refs += 1  # a mapping keeps the object alive
        return (OK,)

    def cuMemUnmap(self, ptr, size):
        err = self._enter("cuMemUnmap", (ptr, size))
        if err:
            return (err,)
        with self._lock:
            m = self.mappings.get(int(ptr))
            if m is None or m[0] != size:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            del self.mappings[int(ptr)]
            self.access.pop(int(ptr), None)
            self._drop_ref(m[1])
        return (OK,)

    def cuMemSetAccess(self, ptr, size, desc, count):
        err = self._enter("cuMemSetAccess", (ptr, size, desc, count))
        if err:
            return (err,)
        with self._lock:
            va = self._mapping_at(int(ptr), size)
            if va is None or len(desc) != count:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            self.access.setdefault(va, set()).update(d.location.id for d in desc)
        return (OK,)

    def cuMemsetD8(self, ptr, value, n):
        err = self._enter("cuMemsetD8", (ptr, value, n)) or self._need_ctx()
        if err:
            return (err,)
        with self._lock:
            if self._mapping_at(int(ptr), n) is None and int(ptr) not in self.device_allocs:
                return (R.CUDA_ERROR_INVALID_VALUE,)
        return (OK,)

    def cuMemAlloc(self, n):
        err = self._enter("cuMemAlloc", (n,)) or self._need_ctx()
        if err:
            return err, None
        with self._lock:
            va = self._next_va
            self._next_va += (n + 4095) // 4096 * 4096 + 4096
            self.device_allocs[va] = bytearray(n)
            return OK, real.CUdeviceptr(va)

    def cuMemFree(self, ptr):
        err = self._enter("cuMemFree", (ptr,)) or self._need_ctx()
        if err:
            return (err,)
        with self._lock:
            if self.device_allocs.pop(int(ptr), None) is None:
                return (R.CUDA_ERROR_INVALID_VALUE,)
        return (OK,)

    def cuMemcpyHtoD(self, dst, src, n):
        err = self._enter("cuMemcpyHtoD", (dst, src, n)) or self._need_ctx()
        if err:
            return (err,)
        with self._lock:
            buf = self.device_allocs.get(int(dst))
            if buf is None or n > len(buf):
                return (R.CUDA_ERROR_INVALID_VALUE,)
            buf[:n] = bytes(src)[:n]
        return (OK,)

    def cuMemcpyDtoH(self, dst, src, n):
        """Mapped memory holds no bytes here: a copy out of it reads zeros."""
        err = self._enter("cuMemcpyDtoH", (dst, src, n)) or self._need_ctx()
        if err:
            return (err,)
        with self._lock:
            if self._mapping_at(int(src), n) is None:
                return (R.CUDA_ERROR_INVALID_VALUE,)
        dst[:n] = bytes(n)
        return (OK,)

    # ---- multicast ------------------------------------------------------------------

    def cuMulticastGetGranularity(self, prop, option):
        err = self._enter("cuMulticastGetGranularity", (prop, option))
        if err:
            return err, None
        if not self.multicast_supported:
            return R.CUDA_ERROR_NOT_SUPPORTED, None
        rec = option == real.CUmulticastGranularity_flags.CU_MULTICAST_GRANULARITY_RECOMMENDED
        return OK, self.mc_granularity_recommended if rec else self.mc_granularity

    def cuMulticastCreate(self, prop):
        err = self._enter("cuMulticastCreate", (prop,))
        if err:
            return err, None
        if not self.multicast_supported:
            return R.CUDA_ERROR_NOT_SUPPORTED, None
        if prop.numDevices < 1 or prop.size <= 0 or prop.size % self.mc_granularity:
            return R.CUDA_ERROR_INVALID_VALUE, None
        with self._lock:
            oid = next(self._ids)
            self.objects[oid] = _Object(oid, "mc", prop.size, None, int(prop.handleTypes),
                                        num_devices=prop.numDevices)
            return OK, self._new_handle(oid)

    def cuMulticastAddDevice(self, mc, dev):
        err = self._enter("cuMulticastAddDevice", (mc, dev))
        if err:
            return (err,)
        with self._lock:
            obj = self._obj(mc)
            if obj is None or obj.kind != "mc" or int(dev) in obj.devices \
                    or len(obj.devices) >= obj.num_devices:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            obj.devices.add(int(dev))
        return (OK,)

    def cuMulticastBindMem(self, mc, mc_offset, mem, mem_offset, size, flags):
        err = self._enter("cuMulticastBindMem", (mc, mc_offset, mem, mem_offset, size, flags))
        if err:
            return (err,)
        with self._lock:
            obj, m = self._obj(mc), self._obj(mem)
            if obj is None or obj.kind != "mc" or m is None or m.kind != "mem":
                return (R.CUDA_ERROR_INVALID_VALUE,)
            if len(obj.devices) < obj.num_devices:
                return (R.CUDA_ERROR_INVALID_VALUE,)  # every device first, then bind
            if m.device not in obj.devices or m.device in obj.bindings:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            if mc_offset + size > obj.size or mem_offset + size > m.size \
                    or size % self.mc_granularity:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            obj.bindings[m.device] = m.oid
            m.refs += 1  # a binding keeps the memory alive
        return (OK,)

    def cuMulticastUnbind(self, mc, dev, mc_offset, size):
        err = self._enter("cuMulticastUnbind", (mc, dev, mc_offset, size))
        if err:
            return (err,)
        with self._lock:
            obj = self._obj(mc)
            if obj is None or int(dev) not in obj.bindings:
                return (R.CUDA_ERROR_INVALID_VALUE,)
            self._drop_ref(obj.bindings.pop(int(dev)))
        return (OK,)


def mc_handle_arg(fake: FakeDriver, position: int = 0) -> Callable[[tuple], bool]:
    """An injection filter: the call's argument at ``position`` is a multicast handle."""
    return lambda args: fake.is_mc_handle(args[position])


def mem_handle_arg(fake: FakeDriver, position: int = 0) -> Callable[[tuple], bool]:
    """An injection filter: the argument at ``position`` is a memory (not mc) handle."""
    return lambda args: not fake.is_mc_handle(args[position])
