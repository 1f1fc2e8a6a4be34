"""rsar: fused GEMM + reduce-scatter / all-reduce over NVLink, one kernel launch."""
from .errors import ClosedError, RsarError, RsarTimeoutError
from .gemm_rsar import GemmRsAr
from .workspace import Workspace

__all__ = ["GemmRsAr", "Workspace", "RsarError", "RsarTimeoutError", "ClosedError"]
