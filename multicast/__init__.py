"""Symmetric memory by hand through the CUDA driver API, and NVLink multicast where policy allows.

Bottom layer of rsar: checked driver calls, the multicast policy, the bootstrap
(mpi4py or torch.distributed), handle exchange (fabric bytes or POSIX fds over
SCM_RIGHTS), SymmetricMemory, and the read-only probes the diagnostics use.
"""
from .errors import (
    BootstrapError, ClosedError, CudaDriverError, HandleExchangeError, MulticastPolicyError,
    PeerError, RsarError, RsarTypeError, RsarValueError, UnsupportedError,
)
from .policy import PolicyDecision, decide

__all__ = [
    "BootstrapError", "ClosedError", "CudaDriverError", "HandleExchangeError",
    "MulticastPolicyError", "PeerError", "RsarError", "RsarTypeError", "RsarValueError",
    "UnsupportedError", "PolicyDecision", "decide", "SymmetricMemory",
]


def __getattr__(name: str):
    # SymmetricMemory pulls in the driver bindings; import it only when asked for.
    if name == "SymmetricMemory":
        from .symmetric import SymmetricMemory
        return SymmetricMemory
    raise AttributeError(name)
