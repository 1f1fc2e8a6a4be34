"""The recording fake driver with memory: allocations hold bytes, copies copy them, and
the check kernels of multicast.nvrtc_kernels are emulated (FakeKernels).

Used where the checks in multicast.peer_check must run end to end without a GPU.
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from fake_driver import OK, FakeDriver


class MemoryFake(FakeDriver):
    """FakeDriver whose allocations hold bytes: copies, memsets, events and streams."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.record_calls = False  # thousands of copies; the record is not needed here
        self.store: dict[int, bytearray] = {}

    def resolve(self, ptr: int, n: int) -> tuple[bytearray, int]:
        ptr = int(ptr)
        with self._lock:
            for va, (size, oid) in self.mappings.items():
                if va <= ptr and ptr + n <= va + size:
                    buf = self.store.setdefault(oid, bytearray(self.objects[oid].size))
                    return buf, ptr - va
            for va, buf in self.device_allocs.items():
                if va <= ptr and ptr + n <= va + len(buf):
                    return buf, ptr - va
        raise ValueError(f"fake: {n} bytes at {ptr:#x} are not mapped")

    def device_of(self, ptr: int) -> int | None:
        """The device whose allocation ``ptr`` points into."""
        with self._lock:
            for va, (size, oid) in self.mappings.items():
                if va <= int(ptr) < va + size:
                    return self.objects[oid].device
        return None

    def bound_buffers(self, mc_ptr: int, n: int) -> list[tuple[bytearray, int]]:
        """(bytes, offset) of every allocation bound to the multicast range at ``mc_ptr``
        (SymmetricMemory binds whole allocations at offset 0, so offsets carry over)."""
        ptr = int(mc_ptr)
        with self._lock:
            for va, (size, oid) in self.mappings.items():
                obj = self.objects[oid]
                if obj.kind == "mc" and va <= ptr and ptr + n <= va + size:
                    return [(self.store.setdefault(m, bytearray(self.objects[m].size)), ptr - va)
                            for _, m in sorted(obj.bindings.items())]
        raise ValueError(f"fake: {ptr:#x} is not a multicast mapping")

    def _mem(self, name: str, args: tuple) -> Any:
        return self._enter(name, args) or self._need_ctx()

    def cuMemcpyHtoD(self, dst, src, n):
        if err := self._mem("cuMemcpyHtoD", (dst, src, n)):
            return (err,)
        data = ctypes.string_at(src, n) if isinstance(src, int) else bytes(src)[:n]
        buf, off = self.resolve(dst, n)
        buf[off:off + n] = data
        return (OK,)

    def cuMemcpyDtoH(self, dst, src, n):
        if err := self._mem("cuMemcpyDtoH", (dst, src, n)):
            return (err,)
        buf, off = self.resolve(src, n)
        ctypes.memmove(dst, bytes(buf[off:off + n]), n)
        return (OK,)

    def cuMemcpyDtoDAsync(self, dst, src, n, stream):
        if err := self._mem("cuMemcpyDtoDAsync", (dst, src, n, stream)):
            return (err,)
        sbuf, soff = self.resolve(src, n)
        dbuf, doff = self.resolve(dst, n)
        dbuf[doff:doff + n] = sbuf[soff:soff + n]
        return (OK,)

    def cuMemsetD32(self, ptr, value, count):
        if err := self._mem("cuMemsetD32", (ptr, value, count)):
            return (err,)
        buf, off = self.resolve(ptr, 4 * count)
        buf[off:off + 4 * count] = int(value).to_bytes(4, "little") * count
        return (OK,)

    def cuStreamCreate(self, flags):
        return OK, 0x5000

    def cuStreamDestroy(self, stream):
        return (OK,)

    def cuEventCreate(self, flags):
        return OK, 0x6000

    def cuEventRecord(self, ev, stream):
        return (OK,)

    def cuEventSynchronize(self, ev):
        return (OK,)

    def cuEventDestroy(self, ev):
        return (OK,)

    def cuEventElapsedTime(self, a, b):
        return OK, 1.0


class FakeKernels:
    """KernelModule's interface, running the check kernels on the fake's bytes."""

    def __init__(self, fake: MemoryFake, corrupt_stores_of: int | None = None,
                 multimem: bool = True, reduce_skips_last: bool = False) -> None:
        self.fake = fake
        self.corrupt_stores_of = corrupt_stores_of  # a rank whose SM stores drop a word
        self.multimem = multimem  # whether the multicast kernels exist (sm_90+)
        self.reduce_skips_last = reduce_skips_last  # a ld_reduce that misses one rank
        self.image_kind = "fake"

    def unload(self) -> None:
        pass

    def has(self, name: str) -> bool:  # multimem and bulk copies: sm_90 and later
        return self.multimem or not name.startswith(("rsar_mc_", "rsar_push_"))

    def launch(self, name: str, grid: int, block: int, args: list, stream: Any = 0) -> None:
        vals = [v for v, _ in args]
        f = self.fake
        if name == "rsar_copy_u32":
            dst, src, n = vals
            sbuf, soff = f.resolve(src, 4 * n)
            data = bytearray(sbuf[soff:soff + 4 * n])
            rank = f._rank()
            if rank == self.corrupt_stores_of and f.device_of(dst) != rank:  # a peer store
                data[40:44] = b"\xde\xad\xbe\xef"
            dbuf, doff = f.resolve(dst, 4 * n)
            dbuf[doff:doff + 4 * n] = data
        elif name == "rsar_copy_v4":
            dst, src, per_cta = vals
            n = 16 * per_cta * grid
            sbuf, soff = f.resolve(src, n)
            dbuf, doff = f.resolve(dst, n)
            dbuf[doff:doff + n] = sbuf[soff:soff + n]
        elif name == "rsar_push_bulk" and self.multimem:
            dst, per_cta = vals
            dbuf, doff = f.resolve(dst, per_cta * grid)
            dbuf[doff:doff + per_cta * grid] = bytes(per_cta * grid)
        elif name == "rsar_push_tiles" and self.multimem:
            dst, flags, per_cta, tile_bytes = vals
            dbuf, doff = f.resolve(dst, per_cta * grid)
            dbuf[doff:doff + per_cta * grid] = bytes(per_cta * grid)
            fbuf, foff = f.resolve(flags, 128 * grid)
            for b in range(grid):  # each CTA's flag word holds its last stamp
                fbuf[foff + 128 * b:foff + 128 * b + 4] = (per_cta // tile_bytes).to_bytes(4, "little")
        elif name == "rsar_add_sys_u32":
            counter, times = vals
            with f._lock:
                buf, off = f.resolve(counter, 4)
                v = int.from_bytes(buf[off:off + 4], "little") + grid * block * times
                buf[off:off + 4] = (v & 0xFFFFFFFF).to_bytes(4, "little")
        elif name == "rsar_mc_ld_reduce_u32" and self.multimem:
            dst, mc, n = vals
            parts = f.bound_buffers(mc, 4 * n)
            if self.reduce_skips_last:
                parts = parts[:-1]
            total = np.zeros(n, dtype=np.uint64)
            for buf, off in parts:
                total += np.frombuffer(bytes(buf[off:off + 4 * n]), dtype=np.uint32)
            dbuf, doff = f.resolve(dst, 4 * n)
            dbuf[doff:doff + 4 * n] = (total & 0xFFFFFFFF).astype(np.uint32).tobytes()
        elif name == "rsar_mc_st_u32" and self.multimem:
            mc, base, n = vals
            words = (np.arange(n, dtype=np.uint32) ^ np.uint32(base)).tobytes()
            for buf, off in f.bound_buffers(mc, 4 * n):
                buf[off:off + 4 * n] = words
        else:
            raise AssertionError(f"unexpected kernel {name}")
