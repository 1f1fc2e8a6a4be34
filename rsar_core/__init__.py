"""rsar: fused GEMM + reduce-scatter / all-reduce over NVLink, one kernel launch."""
from .errors import (
    ClosedError, RsarError, RsarTimeoutError, RsarTypeError, RsarValueError,
    ShapeMismatchError, UnsupportedError,
)
from launch.tuning import Tuning

from .gemm_rsar import GemmRsAr, kernel_arch_for
from .linear import AutoRowParallelLinear
from .workspace import Workspace

__all__ = ["GemmRsAr", "Workspace", "Tuning", "AutoRowParallelLinear", "kernel_arch_for", "RsarError", "RsarTimeoutError",
           "ShapeMismatchError", "ClosedError", "RsarValueError", "RsarTypeError",
           "UnsupportedError"]
