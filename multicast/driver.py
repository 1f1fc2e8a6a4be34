"""A checked wrapper over the CUDA driver API (``cuda.bindings.driver``).

The bindings return every call's CUresult as the first element of a tuple and leave
checking to the caller; one forgotten check turns a failed allocation into a wild
pointer several calls later. ``Driver`` checks every call and strips the status:

    d = Driver()
    handle = d.cuMemCreate(size, prop, 0)      # raises CudaDriverError on failure

The wrapped module may be anything with the same function names (tests hand in a
recording fake); types and enums stay reachable through ``d.raw``.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from .errors import CudaDriverError, RsarTypeError

__all__ = ["Driver", "default_driver"]

log = logging.getLogger("rsar.multicast")

# Code reported when the driver library itself cannot be loaded: there is no CUresult
# for "no libcuda.so", and the bindings raise their own exception type instead.
DRIVER_NOT_FOUND_CODE = -1
DRIVER_NOT_FOUND_NAME = "CUDA_DRIVER_NOT_FOUND"


def _short(arg: Any) -> str:
    # Ints (sizes, pointers, devices) are what a reader of the error needs; struct
    # reprs span dozens of lines, so name their type only.
    if isinstance(arg, bool):
        return repr(arg)
    if isinstance(arg, int):
        return hex(arg) if arg > 0xFFFF else str(arg)
    name = getattr(arg, "name", None)
    if isinstance(name, str):
        return name
    try:
        return hex(int(arg))
    except Exception:
        return type(arg).__name__


def _is_missing_library(exc: BaseException) -> bool:
    # cuda.pathfinder raises DynamicLibNotFoundError when libcuda.so is absent
    # (a CPU-only machine); match by name so no import of pathfinder is needed.
    return any(c.__name__ == "DynamicLibNotFoundError" for c in type(exc).__mro__)


class Driver:
    """Every ``cu*`` attribute is the module's function, checked.

    A checked call returns the call's results without the CUresult: nothing -> None,
    one value -> that value, several -> a tuple.
    """

    def __init__(self, module: Any = None) -> None:
        if module is None:
            from cuda.bindings import driver as module
        self._mod = module
        self._lock = threading.Lock()
        self._primary: dict[int, Any] = {}

    @property
    def raw(self) -> Any:
        """The wrapped module, for its types and enums."""
        return self._mod

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if not name.startswith("cu"):
            raise AttributeError(name)
        fn = getattr(self._mod, name)

        def checked(*args: Any) -> Any:
            return self._invoke(name, fn, args)

        checked.__name__ = name
        return checked

    def call(self, name: str, *args: Any) -> Any:
        """``d.call("cuMemCreate", ...)`` is ``d.cuMemCreate(...)``."""
        return self._invoke(name, getattr(self._mod, name), args)

    def try_call(self, name: str, *args: Any) -> tuple[bool, Any]:
        """(True, result) or (False, error name); for probes where failure is an answer.

        A function this version of the bindings lacks counts as a failure too.
        """
        fn = getattr(self._mod, name, None)
        if fn is None:
            return False, f"{name} not in these CUDA bindings"
        try:
            return True, self._invoke(name, fn, args)
        except CudaDriverError as e:
            return False, e.name

    def error_name(self, status: Any) -> str:
        """CUDA_ERROR_... for a CUresult, without ever raising."""
        try:
            res, text = self._mod.cuGetErrorName(status)
            if int(res) == 0 and text:
                return text.decode() if isinstance(text, bytes) else str(text)
        except Exception:
            pass
        name = getattr(status, "name", None)
        if isinstance(name, str):
            return name
        try:
            enum = getattr(self._mod, "CUresult", None)
            if enum is None:
                from cuda.bindings.driver import CUresult as enum
            return enum(int(status)).name
        except Exception:
            return f"CUresult({int(status)})"

    def _error_string(self, status: Any) -> str:
        try:
            res, text = self._mod.cuGetErrorString(status)
            if int(res) == 0 and text:
                return text.decode() if isinstance(text, bytes) else str(text)
        except Exception:
            pass
        return ""

    def _invoke(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        try:
            out = fn(*args)
        except Exception as e:
            if _is_missing_library(e):
                raise CudaDriverError(name, DRIVER_NOT_FOUND_CODE, DRIVER_NOT_FOUND_NAME,
                                      str(e)) from e
            raise
        if not isinstance(out, tuple) or not out:
            raise RsarTypeError(f"{name} returned {out!r}; expected (CUresult, ...)")
        status, values = out[0], out[1:]
        code = int(status)
        if code != 0:
            err = self.error_name(status)
            detail = self._error_string(status)
            argtext = ", ".join(_short(a) for a in args)
            detail = f"{detail}; args ({argtext})" if detail else f"args ({argtext})"
            log.debug("%s -> %s (%d)", name, err, code)
            raise CudaDriverError(name, code, err, detail)
        if not values:
            return None
        if len(values) == 1:
            return values[0]
        return values

    def primary_context(self, device: int) -> Any:
        """The device's primary context, retained once for this Driver's lifetime.

        Like the CUDA runtime, keep the primary context for the life of the process:
        releasing it after every allocation would tear the context down and rebuild it
        each time (hundreds of milliseconds) when nothing else holds it.
        """
        with self._lock:
            ctx = self._primary.get(device)
            if ctx is None:
                ctx = self.cuDevicePrimaryCtxRetain(self.cuDeviceGet(device))
                self._primary[device] = ctx
            return ctx

    def __repr__(self) -> str:
        return f"Driver({getattr(self._mod, '__name__', type(self._mod).__name__)})"


_default: Driver | None = None
_default_lock = threading.Lock()


def default_driver() -> Driver:
    """The process-wide Driver over cuda.bindings.driver (created on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Driver()
        return _default
