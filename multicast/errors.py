"""The error hierarchy shared by every rsar layer.

It lives in the bottom layer (``multicast``) so the memory code can raise the same
types the public API documents; ``rsar_core.errors`` re-exports it.
"""
from __future__ import annotations


class RsarError(Exception):
    """Base class of every error rsar raises on purpose."""


class RsarValueError(RsarError, ValueError):
    """A bad argument, shape or setting, refused before anything is allocated or launched."""


class RsarTypeError(RsarError, TypeError):
    """An argument of the wrong type, refused before anything is allocated or launched."""


class UnsupportedError(RsarError, RuntimeError):
    """This process cannot run the op: no CUDA device, or no kernel for the GPU's
    architecture (``GemmRsAr.can_run`` tells ahead)."""


class ClosedError(RsarError, RuntimeError):
    """The object was closed (or broken by a timeout) and cannot be used."""


class CudaDriverError(RsarError, RuntimeError):
    """A CUDA driver call returned something other than CUDA_SUCCESS."""

    def __init__(self, call: str, code: int, name: str, detail: str = "") -> None:
        self.call = call
        self.code = code
        self.name = name
        msg = f"{call} failed: {name} ({code})"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


class MulticastPolicyError(RsarError, RuntimeError):
    """Multicast was required (RSAR_MULTICAST=on) but is forbidden or unavailable."""


class PeerError(RsarError, RuntimeError):
    """A collective setup step failed on some rank; raised on every rank alike."""

    def __init__(self, step: str, failures: dict[int, str]) -> None:
        self.step = step
        self.failures = dict(failures)
        detail = "; ".join(f"rank {r}: {m}" for r, m in sorted(self.failures.items()))
        super().__init__(f"{step} failed on rank(s) {sorted(self.failures)}: {detail}")


class HandleExchangeError(RsarError, RuntimeError):
    """A shareable handle could not be exchanged or was refused (wrong host, wrong peer)."""


class BootstrapError(RsarError, RuntimeError):
    """The bootstrap communicator failed or timed out."""
