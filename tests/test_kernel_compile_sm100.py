"""Every sm100 kernel variant compiles for sm_100a on this (GPU-less) machine, and its PTX
carries the instructions the variant exists for. Compiling to a cubin runs ptxas, so a pass
also means ptxas accepted the PTX for sm_100a.

CI compiles the full matrix (RS/AR x BN {128, 256} x cta_group {1, 2} x {unicast, multicast},
world 2; plus world 4 and the communication-free GEMM); about 3 s per variant on one core.
``RSAR_FULL_COMPILE=1`` adds world 8 and 16 variants.
"""
from __future__ import annotations

import itertools
import os

import pytest

pytest.importorskip("cutlass")

from ptx_checks import assert_protocol_ptx  # noqa: E402
from launch.variant import Variant  # noqa: E402
from launch.cache import kernel_for  # noqa: E402

VARIANTS = [Variant("sm_100a", bn, 2, mode, tr, cg)
            for mode, bn, cg, tr in itertools.product(("rs", "ar"), (128, 256), (1, 2),
                                                      ("unicast", "multicast"))]
VARIANTS += [
    Variant("sm_100a", 128, 4, "rs", "unicast", 2),
    Variant("sm_100a", 256, 2, "gemm", "unicast", 1),
    Variant("sm_100a", 128, 2, "gemm", "unicast", 2),
]
if os.environ.get("RSAR_FULL_COMPILE") == "1":
    VARIANTS += [Variant("sm_100a", 128, w, mode, tr, cg)
                 for w, mode, tr, cg in itertools.product((8, 16), ("rs", "ar"),
                                                          ("unicast", "multicast"), (1, 2))]


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.describe().replace(" ", "-"))
def test_variant_ptx(ptx_of, v):
    ptx = ptx_of(v)
    assert ".target sm_100a" in ptx
    assert "tcgen05.mma" in ptx and "tcgen05.ld" in ptx and "tcgen05.alloc" in ptx
    assert "cp.async.bulk.tensor" in ptx
    assert "wgmma" not in ptx
    if v.cta_group == 2:
        assert "tcgen05.mma.cta_group::2" in ptx and "tcgen05.alloc.cta_group::2" in ptx
    else:
        assert "cta_group::2" not in ptx
    assert_protocol_ptx(ptx, v)


def test_sm100_kernel_shares_the_protocol_code():
    """The communication role is CommWarps' code, the very methods sm90 runs."""
    from launch.comm_warps import CommWarps
    from launch.sm90_kernel import Sm90FusedKernel
    k100 = kernel_for(Variant("sm_100a", 128, 2, "rs", "unicast", 2))
    k90 = kernel_for(Variant("sm_90a", 128, 2, "rs", "unicast"))
    assert isinstance(k100, CommWarps) and isinstance(k90, Sm90FusedKernel)
    for name in ("_comm_role", "_scheduled", "_push_sub", "_reduce_sub", "_deferred_reduce",
                 "_ar_copy_out"):
        assert getattr(type(k100), name) is getattr(CommWarps, name) is getattr(Sm90FusedKernel, name)
    assert k100.comm_bar.barrier_id != 0 and k90.cta_group == 1


def test_sm100_call_signature_matches_sm90():
    import inspect
    from launch.sm90_kernel import Sm90FusedKernel
    from launch.sm100_kernel import Sm100FusedKernel

    def params(cls):
        fn = inspect.unwrap(cls.__call__)
        return [(p.name, p.annotation) for p in inspect.signature(fn).parameters.values()]
    assert params(Sm100FusedKernel) == params(Sm90FusedKernel)


def test_variants_reject_what_their_kernel_lacks():
    with pytest.raises(ValueError, match="cta_group"):
        kernel_for(Variant("sm_90a", 128, 2, "rs", "unicast", 5))
    with pytest.raises(ValueError, match="cta_group must be one of"):
        kernel_for(Variant("sm_90a", 192, 2, "gemm", "unicast", 3))
    with pytest.raises(ValueError, match="cta_group must be 1 or 2"):
        kernel_for(Variant("sm_100a", 128, 2, "gemm", "unicast", 4))
    with pytest.raises(ValueError, match="push"):
        kernel_for(Variant("sm_90a", 128, 2, "rs", "unicast", push="nvlink"))
    with pytest.raises(ValueError, match="knobs"):
        kernel_for(Variant("sm_100a", 128, 2, "rs", "unicast", push="tma"))


def test_b300_target_compiles_from_the_same_source(ptx_of):
    """10.3 GPUs (B300/GB300) get the sm100 source compiled for sm_103a."""
    ptx = ptx_of(Variant("sm_103a", 128, 2, "rs", "unicast", 1))
    assert ".target sm_103a" in ptx and "tcgen05.mma" in ptx
