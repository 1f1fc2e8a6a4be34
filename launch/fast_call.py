"""Low-overhead calls of a compiled CuTe DSL host function whose arguments are all scalars.

The DSL's generic call path adapts every Python argument to ctypes on each call, which
costs tens of microseconds for our ~20 scalar arguments: more than a small fused GEMM
takes on the GPU. All our arguments are Int32/Int64 values or the stream handle, so we
keep one ctypes cell per argument, pack their addresses once in the layout the compiled
entry point expects, and on each call only store the new values and call the entry
point. If the DSL's executor ever lacks what this relies on, we fall back to the
generic path (correct, only slower).
"""
from __future__ import annotations

import ctypes
import logging
from typing import Any, Sequence

log = logging.getLogger("rsar.launch")

_CTYPE = {"i32": ctypes.c_int32, "i64": ctypes.c_int64, "stream": ctypes.c_void_p}


class FastCall:
    def __init__(self, compiled: Any, kinds: Sequence[str]) -> None:
        self._compiled = compiled
        self._kinds = tuple(kinds)
        self._cells = [_CTYPE[k]() for k in self._kinds]
        self._consts: tuple | None = None  # what ``call_with`` last stored in the middle cells
        self._fast = False
        try:
            self._setup()
            self._fast = True
        except Exception as e:  # pragma: no cover - depends on the DSL's internals
            log.debug("fast call path unavailable (%s); using the generic one", e)

    def _setup(self) -> None:
        c = self._compiled
        if getattr(c, "total_added_arguments", 0):
            raise RuntimeError("compiled function takes extra workspace arguments")
        # Creates the per-device executor the generic path would create on first call.
        c.run_compiled_program  # noqa: B018  (attribute must exist)
        with c._executor_lock:
            if c._default_executor is None:
                import weakref
                c._default_executor = weakref.proxy(c).to(None)
        ex = c._default_executor
        ptrs = [ctypes.c_void_p(ctypes.addressof(cell)) for cell in self._cells]
        shared = ex._get_invoke_packed_args_func(ptrs)
        # Own copy: the executor reuses its packed buffer for generic calls.
        self._packed = (ctypes.c_void_p * len(shared))(*shared)
        self._capi = ex.capi_func
        self._has_result = bool(getattr(ex, "_has_cuda_result", False))
        self._result = getattr(ex, "cuda_result", None)

    @property
    def fast(self) -> bool:
        return self._fast

    def __call__(self, *values: int) -> None:
        if not self._fast:
            import cuda.bindings.driver as cuda
            import cutlass
            conv = {"i32": cutlass.Int32, "i64": cutlass.Int64, "stream": cuda.CUstream}
            self._compiled(*(conv[k](v) for k, v in zip(self._kinds, values)))
            return
        self._consts = None
        for cell, v in zip(self._cells, values):
            cell.value = v
        self._invoke()

    def call_with(self, head: tuple[int, ...], consts: tuple[int, ...], stream: int) -> None:
        """``self(*head, *consts, stream)``. While a caller passes the same ``consts`` object
        call after call (a plan's fixed arguments), only ``head``'s cells and the stream's
        are stored again."""
        if not self._fast:
            self(*head, *consts, stream)
            return
        cells = self._cells
        if consts is not self._consts:
            if len(head) + len(consts) + 1 != len(cells):
                raise ValueError(f"{len(cells)} arguments expected, got "
                                 f"{len(head)} + {len(consts)} + the stream")
            for cell, v in zip(cells[len(head):-1], consts):
                cell.value = v
            self._consts = consts  # held, so its id cannot be reused by another tuple
        for cell, v in zip(cells, head):
            cell.value = v
        cells[-1].value = stream
        self._invoke()

    def _invoke(self) -> None:
        self._capi(self._packed)
        if self._has_result and self._result is not None and self._result.value != 0:
            raise RuntimeError(f"kernel launch failed: CUDA error {self._result.value}")
