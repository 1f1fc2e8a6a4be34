"""x's and w's load descriptors encoded by the driver with an L2 promotion
(``Variant.tma_promo``, sm90).

``make_tiled_tma_atom`` encodes its descriptor inline in the launch's host code and takes no
L2 promotion (``benchmarks/tma_desc_probe.py`` reads which one it writes); CUTLASS's C++
asks the driver for one. Here the same boxes (an atom's part of the tile: the tile's rows
over the CTAs it is multicast to, one 128-byte k-block) under the same 128-byte swizzle are
encoded by ``cuTensorMapEncodeTiled`` (the DSL's tensor-map API) with the promotion asked
for, passed as grid-constant kernel parameters, and named by each load's ``tma_desc_ptr``;
the atoms still partition the tiles and count the bytes. The driver call runs in the
launch's host code, every call, as the atoms' inline encoding does.
"""
from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass.experimental.cuda import tensor_map as tm
from cutlass.tensor_utils import TensorMapManager, TensorMapUpdateMode

from .geometry import TMA_PROMOS

_PROMOTION = {"none": tm.TensorMapL2Promotion.none, "64B": tm.TensorMapL2Promotion.l2_64b,
              "128B": tm.TensorMapL2Promotion.l2_128b, "256B": tm.TensorMapL2Promotion.l2_256b}
assert set(_PROMOTION) == set(TMA_PROMOS[1:])
# A kernel parameter of a descriptor is 64-byte aligned (CUtensorMap's alignment)
_PARAM_ALIGN = 64


def encode(elem: Any, addr: Any, rows: Any, K: Any, box_rows: int, bk: int,
           promo: str) -> Any:
    """The descriptor of a row-major [rows, K] operand at ``addr`` loaded in boxes of
    ``box_rows`` x ``bk`` (one 128-byte k-block) under the 128-byte swizzle, with the L2
    promotion ``promo`` (a name of ``TMA_PROMOS``). Traced inside the launch's host code."""
    if bk * elem.width // 8 != 128:
        raise ValueError(f"a k-block of {bk} {elem} is not the 128 bytes of the swizzle")
    return tm.create_tensor_map_tiled(
        addr, elem, [K, rows], [K * (elem.width // 8) // 16], [bk, box_rows],
        swizzle=tm.TensorMapSwizzle.s128b, l2_promotion=_PROMOTION[promo])


def desc_ptr(desc: Any) -> Any:
    """A descriptor parameter's generic address, typed as a TMA descriptor for
    ``cute.copy(..., tma_desc_ptr=)``. Traced inside the kernel."""
    p = desc.get_ptr()
    raw = cute.make_ptr(cutlass.Int64, p.toint(), cute.AddressSpace.generic,
                        assumed_align=_PARAM_ALIGN)
    return TensorMapManager(TensorMapUpdateMode.GMEM, _PARAM_ALIGN).get_tensormap_ptr(
        raw, cute.AddressSpace.generic)
