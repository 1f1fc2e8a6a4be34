"""Tiny CUDA C kernels for checking symmetric memory, compiled at run time with NVRTC.

The checks in ``peer_check`` need the GPU's own load/store/atomic path through peer
pointers (what the fused kernel uses), which cuMemcpy alone does not exercise. NVRTC
ships with cuda-bindings' runtime libraries, so no toolkit or build step is needed:
the source below is compiled once per architecture and loaded into the current context.

Kernels:
- ``rsar_copy_u32(dst, src, n)``: grid-stride copy of n 32-bit words (plain loads/stores).
- ``rsar_add_sys_u32(counter, times)``: every thread adds 1 ``times`` times with a
  system-scope atomic (atomicAdd_system), as peers' atomics on one word must be.
- ``rsar_mc_ld_reduce_u32(dst, mc, n)`` / ``rsar_mc_st_u32(mc, base, n)`` (sm_90+):
  ``multimem.ld_reduce.add`` / ``multimem.st`` through a multicast address.
- ``rsar_copy_v4(dst, src, per_cta)``: CTA b copies its ``per_cta`` 16-byte words
  ``[b * per_cta, (b + 1) * per_cta)`` (a push when dst is a peer's, a pull when src is):
  the link rate a given number of SMs gets with thread stores or loads
  (``scripts/link_bw.py``).
- ``rsar_push_bulk(dst, per_cta)`` (sm_90+): the same from shared memory as 8 KB bulk
  copies (``cp.async.bulk``), up to 4 in flight per CTA, as the fused kernel pushes.
- ``rsar_push_tiles(dst, flags, per_cta, tile_bytes)`` (sm_90+): the same with the fused
  kernel's per-tile completion (wait, fence, flag release at the peer every tile).
"""
from __future__ import annotations

import ctypes
import functools
import logging
import threading
from typing import Any, Sequence

from .driver import Driver, default_driver
from .errors import CudaDriverError

__all__ = ["SOURCE", "compile_for", "KernelModule", "NVRTC_NOT_FOUND"]

log = logging.getLogger("rsar.multicast")

NVRTC_NOT_FOUND = "NVRTC_NOT_FOUND"

SOURCE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;

#define GRID_STRIDE(i, n)                                       \
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (u64)gridDim.x * blockDim.x)

extern "C" __global__ void rsar_copy_u32(u32* __restrict__ dst, const u32* __restrict__ src,
                                         u64 n) {
  GRID_STRIDE(i, n) dst[i] = src[i];
}

extern "C" __global__ void rsar_copy_v4(uint4* __restrict__ dst, const uint4* __restrict__ src,
                                        u64 per_cta) {
  const u64 base = (u64)blockIdx.x * per_cta;
  for (u64 i = threadIdx.x; i < per_cta; i += blockDim.x) dst[base + i] = src[base + i];
}

extern "C" __global__ void rsar_add_sys_u32(u32* counter, u32 times) {
  for (u32 k = 0; k < times; ++k) atomicAdd_system(counter, 1u);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
extern "C" __global__ void rsar_mc_ld_reduce_u32(u32* __restrict__ dst, const u32* mc, u64 n) {
  GRID_STRIDE(i, n) {
    u32 v;
    asm volatile("multimem.ld_reduce.relaxed.sys.global.add.u32 %0, [%1];"
                 : "=r"(v) : "l"(mc + i) : "memory");
    dst[i] = v;
  }
}

#define RSAR_BULK 8192u
#define RSAR_BULK_SLOTS 4u
// One thread per CTA sends its per_cta bytes as 8 KB bulk copies from a shared-memory ring,
// up to RSAR_BULK_SLOTS in flight. tile_bytes > 0 adds the fused kernel's per-tile
// completion: after every tile_bytes, wait for the copies to land, fence, and release a flag
// word at the peer (one per CTA), which shows what that drain costs the link.
__device__ __forceinline__ void rsar_push_ring(char* dst, unsigned int* flags, u64 per_cta,
                                               u32 tile_bytes) {
  __shared__ __align__(128) unsigned char ring[RSAR_BULK_SLOTS * RSAR_BULK];
  for (u32 i = threadIdx.x; i < RSAR_BULK_SLOTS * RSAR_BULK; i += blockDim.x)
    ring[i] = (unsigned char)(i * 131u + blockIdx.x);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  if (threadIdx.x != 0) return;
  const u32 s = (u32)__cvta_generic_to_shared(ring);
  char* out = dst + (u64)blockIdx.x * per_cta;
  u32 slot = 0, stamp = 0;
  for (u64 off = 0; off + RSAR_BULK <= per_cta; off += RSAR_BULK) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                 :: "l"(out + off), "r"(s + slot * RSAR_BULK), "r"(RSAR_BULK) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 3;" ::: "memory");
    slot = (slot + 1u) % RSAR_BULK_SLOTS;
    if (tile_bytes != 0 && (off + RSAR_BULK) % tile_bytes == 0) {
      asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
      asm volatile("fence.proxy.async.global;" ::: "memory");
      asm volatile("fence.acq_rel.sys;" ::: "memory");
      asm volatile("st.release.sys.global.u32 [%0], %1;"
                   :: "l"(flags + blockIdx.x * 32u), "r"(++stamp) : "memory");
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

extern "C" __global__ void rsar_push_bulk(char* dst, u64 per_cta) {
  rsar_push_ring(dst, nullptr, per_cta, 0u);
}

extern "C" __global__ void rsar_push_tiles(char* dst, unsigned int* flags, u64 per_cta,
                                           u32 tile_bytes) {
  rsar_push_ring(dst, flags, per_cta, tile_bytes);
}

extern "C" __global__ void rsar_mc_st_u32(u32* mc, u32 base, u64 n) {
  GRID_STRIDE(i, n)
    asm volatile("multimem.st.relaxed.sys.global.b32 [%0], %1;"
                 :: "l"(mc + i), "r"(base ^ (u32)i) : "memory");
}
#endif
"""


def _nvrtc() -> Any:
    from cuda.bindings import nvrtc

    return nvrtc


def _check(nvrtc: Any, call: str, out: Any, prog: Any = None) -> Any:
    """Strip and check an nvrtcResult, attaching the compile log on failure."""
    status, values = out[0], out[1:]
    if int(status) != 0:
        detail = _program_log(nvrtc, prog) if prog is not None else ""
        name = getattr(status, "name", f"nvrtcResult({int(status)})")
        raise CudaDriverError(call, int(status), name, detail)
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _program_log(nvrtc: Any, prog: Any) -> str:
    try:
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        return buf.rstrip(b"\0 ").decode(errors="replace")
    except Exception as e:  # the log is a courtesy; never mask the real error
        return f"(no compile log: {e})"


def _missing_library(exc: BaseException) -> bool:
    return any(c.__name__ == "DynamicLibNotFoundError" for c in type(exc).__mro__)


@functools.lru_cache(maxsize=None)
def compile_for(major: int, minor: int) -> tuple[bytes, str]:
    """(image, kind) for compute capability major.minor: a cubin when this NVRTC knows
    the architecture, else PTX for the newest one it knows below it (the driver JITs it).

    Raises CudaDriverError (name NVRTC_NOT_FOUND when libnvrtc cannot be loaded).
    """
    cc = major * 10 + minor
    try:
        nvrtc = _nvrtc()
        archs = [int(a) for a in _check(nvrtc, "nvrtcGetSupportedArchs",
                                         nvrtc.nvrtcGetSupportedArchs())]
    except Exception as e:
        if _missing_library(e) or isinstance(e, ImportError):
            raise CudaDriverError("nvrtcGetSupportedArchs", -1, NVRTC_NOT_FOUND,
                                  "libnvrtc could not be loaded (it comes with the "
                                  "nvidia-cuda-nvrtc wheel or a CUDA toolkit)") from e
        raise
    if cc in archs:
        opts, kind = [f"--gpu-architecture=sm_{cc}".encode()], "cubin"
    else:
        below = [a for a in archs if a <= cc]
        if not below:
            raise CudaDriverError("nvrtcGetSupportedArchs", -1, "NVRTC_ARCH_UNSUPPORTED",
                                  f"sm_{cc} is older than every architecture this NVRTC knows")
        opts, kind = [f"--gpu-architecture=compute_{max(below)}".encode()], "ptx"
    opts.append(b"--std=c++17")
    prog = _check(nvrtc, "nvrtcCreateProgram",
                  nvrtc.nvrtcCreateProgram(SOURCE.encode(), b"rsar_check.cu", 0, [], []))
    try:
        _check(nvrtc, "nvrtcCompileProgram",
               nvrtc.nvrtcCompileProgram(prog, len(opts), opts), prog)
        if kind == "cubin":
            size = _check(nvrtc, "nvrtcGetCUBINSize", nvrtc.nvrtcGetCUBINSize(prog))
            image = b" " * size
            _check(nvrtc, "nvrtcGetCUBIN", nvrtc.nvrtcGetCUBIN(prog, image))
        else:
            size = _check(nvrtc, "nvrtcGetPTXSize", nvrtc.nvrtcGetPTXSize(prog))
            image = b" " * size
            _check(nvrtc, "nvrtcGetPTX", nvrtc.nvrtcGetPTX(prog, image))
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    log.debug("compiled check kernels for sm_%d as %s (%d bytes)", cc, kind, len(image))
    return image, kind


# (type tag, ctypes type) for kernel arguments: pointers as void*, counts as they are declared.
PTR = ctypes.c_void_p
U32 = ctypes.c_uint
U64 = ctypes.c_ulonglong


class KernelModule:
    """The check kernels loaded into the context current on this thread.

    Load and use it with the device's context current; ``unload()`` (or ``with``)
    gives the module back.
    """

    _lock = threading.Lock()

    def __init__(self, device: int, drv: Driver | None = None) -> None:
        self.drv = drv if drv is not None else default_driver()
        A = self.drv.raw.CUdevice_attribute
        major = int(self.drv.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                                  device))
        minor = int(self.drv.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                                  device))
        self.compute_capability = (major, minor)
        with self._lock:  # one compile per architecture even when threads race
            image, self.image_kind = compile_for(major, minor)
        self._module = self.drv.cuModuleLoadData(image)
        self._functions: dict[str, Any] = {}

    def has(self, name: str) -> bool:
        ok, _ = self.drv.try_call("cuModuleGetFunction", self._module, name.encode())
        return ok

    def launch(self, name: str, grid: int, block: int, args: Sequence[tuple[int, Any]],
               stream: Any = 0) -> None:
        """Launch ``name`` on a 1-D grid; ``args`` are (value, ctypes type) pairs."""
        fn = self._functions.get(name)
        if fn is None:
            fn = self._functions[name] = self.drv.cuModuleGetFunction(self._module, name.encode())
        values = tuple(v for v, _ in args)
        types = tuple(t for _, t in args)
        self.drv.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, (values, types), 0)

    def unload(self) -> None:
        if self._module is not None:
            module, self._module = self._module, None
            self._functions.clear()
            self.drv.cuModuleUnload(module)

    def __enter__(self) -> "KernelModule":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.unload()
