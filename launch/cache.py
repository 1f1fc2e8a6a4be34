"""Compiled kernels: ``kernel_for(Variant)`` -> the kernel object, compiled once per process.

The cache is keyed by the ``Variant`` and the hash of the kernel sources
(``disk_cache.source_hash``): in memory, then on disk (``RSAR_KERNEL_CACHE``), then compiled.
A variant compiled from other sources is never loaded.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from . import disk_cache, variant_log
from .geometry import BLACKWELL
from .variant import Variant

log = logging.getLogger("rsar.launch")


def kernel_for(v: Variant) -> Any:
    """The kernel object of ``v`` (not compiled); ValueError where its kernel cannot run it."""
    if v.arch == "sm_90a":
        from .sm90_kernel import Sm90FusedKernel
        return Sm90FusedKernel(v)
    if v.arch in BLACKWELL:
        from .sm100_kernel import Sm100FusedKernel
        return Sm100FusedKernel(v)
    raise NotImplementedError(f"no kernel for {v.arch} yet")


# Argument kinds of the compiled host function, in order (Sm90FusedKernel.__call__ and
# Sm100FusedKernel.__call__ take the same arguments): x, w, out, x's and w's scales, the
# scales' bits, the bias (``HEAD_ARGS`` of them, given per call), then the plan's fixed ones.
ARG_KINDS = (["i64"] * 5 + ["i32"] + ["i64"] + ["i32"] * 3 + ["i64"] * 4 + ["i32"] * 7 + ["i64"]
             + ["i64"] * 6 + ["stream"])
HEAD_ARGS = 7


def example_args() -> list:
    """Placeholder launch arguments: compilation only needs their types."""
    import cuda.bindings.driver as cuda
    import cutlass
    i64, i32 = cutlass.Int64, cutlass.Int32
    return ([i64(0)] * 5 + [i32(0)] + [i64(0)] + [i32(128), i32(128), i32(128)] + [i64(0)] * 4
            + [i32(0)] * 7 + [i64(0)] + [i64(0)] * 6 + [cuda.CUstream(0)])


def host_target() -> str:
    """The CuTe DSL host-target option naming this machine; exporting a compiled kernel to
    an object file needs an explicit triple."""
    import platform
    machine = platform.machine()
    if machine in ("aarch64", "arm64"):
        return "linux-aarch64"
    return "'llvm -mtriple=x86_64-unknown-linux-gnu'"


def compile_variant(v: Variant, *, keep_ptx: bool = False, exportable: bool = False) -> Any:
    import cutlass.cute as cute
    opts = f"--gpu-arch {v.arch}"
    if exportable:
        opts += f" --host-target {host_target()}"
    if keep_ptx:
        import tempfile
        opts += f" --keep-ptx --dump-dir {tempfile.mkdtemp(prefix='rsar-ptx-')}"
    t0 = time.perf_counter()
    compiled = cute.compile(kernel_for(v), *example_args(), options=opts)
    log.info("compiled %s in %.2f s", v.describe(), time.perf_counter() - t0)
    return compiled


def compile_fast(v: Variant) -> Any:
    """The variant's launcher: from the on-disk cache when enabled, else compiled here."""
    from .fast_call import FastCall
    directory = disk_cache.cache_dir()
    compiled = None
    if directory is not None:
        t0 = time.perf_counter()
        compiled = disk_cache.load(v, directory)
        if compiled is not None:
            log.info("loaded %s from %s in %.3f s", v.describe(), directory,
                     time.perf_counter() - t0)
    if compiled is None:
        compiled = compile_variant(v, exportable=directory is not None)
        if directory is not None:
            try:
                disk_cache.store(v, compiled, directory)
            except OSError as e:  # a read-only cache is still a cache
                log.warning("could not store %s in %s: %s", v.describe(), directory, e)
    return FastCall(compiled, ARG_KINDS)


class KernelCache:
    """Compiled launchers by (``Variant``, kernel source hash); thread-safe."""

    def __init__(self, compile_fn: Callable[[Variant], Any] = compile_fast) -> None:
        self._compile = compile_fn
        self._lock = threading.Lock()
        self._done: dict[tuple[Variant, str], Any] = {}
        self.compile_count = 0

    def get(self, v: Variant) -> Any:
        key = (v, disk_cache.source_hash())
        with self._lock:
            fn = self._done.get(key)
            if fn is None:
                fn = self._compile(v)
                self._done[key] = fn
                self.compile_count += 1
                variant_log.record(v)
            return fn


CACHE = KernelCache()
