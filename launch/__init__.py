"""Kernels and their launch: what runs (``resolve``), the compiled-kernel cache, the kernels.

    resolve(Shape, Hardware, world, transport, Dtypes, Tuning) -> (TilePlan, Variant)
    CACHE.get(Variant) -> launcher                    (kernel_for(Variant) -> kernel)

Layers, no cycles: ``geometry`` (tile arithmetic) <- ``rules`` (measured choices) <- ``plan``
(the rules applied) <- ``resolve`` (the plan and every kernel choice) ; ``variant`` <- the
kernels (``sm90_kernel``, ``sm100_kernel`` and their parts) <- ``cache``.
"""
from .cache import CACHE, compile_variant, kernel_for
from .geometry import TilePlan
from .resolve import Dtypes, Hardware, Shape, resolve, resolve_variant
from .tuning import Tuning
from .variant import Variant

__all__ = ["CACHE", "Dtypes", "Hardware", "Shape", "TilePlan", "Tuning", "Variant",
           "compile_variant", "kernel_for", "resolve", "resolve_variant"]
