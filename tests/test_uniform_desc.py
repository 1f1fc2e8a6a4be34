"""``Tuning.uniform_desc`` (an experiment): the mainloop's smem descriptors sliced at a warp
group's first thread, so ptxas keeps their arithmetic in uniform registers. Validated as a
bool, refused by the sm100 kernel, changing nothing but ``Variant.uniform_desc``; its
kernels compile with the default's wgmmas, none serialized, nothing spilled."""
from __future__ import annotations

import dataclasses
import re

import pytest

from launch import Dtypes, Hardware, Shape, Tuning, resolve
from rsar_core.errors import RsarValueError

H100 = Hardware("sm_90a", 132, 132)
CALLS = [  # the ping-pong GEMM alone, a cooperative one, a fused RS, an fp8 AR
    (Shape(2048, 7168, 1024, "gemm"), Dtypes()),
    (Shape(1024, 8192, 1024, "gemm"), Dtypes()),
    (Shape(2048, 7168, 1024, "rs"), Dtypes()),
    (Shape(1024, 7168, 4096, "ar"), Dtypes("bf16", "e4m3")),
]


def test_a_bool_only():
    with pytest.raises(RsarValueError, match=r"Tuning\.uniform_desc must be True or False"):
        Tuning(uniform_desc=1)
    assert Tuning(uniform_desc=True).changed() == {"uniform_desc": True}


@pytest.mark.parametrize("shape,dtypes", CALLS, ids=["pingpong", "cooperative", "rs", "fp8-ar"])
def test_it_changes_the_variant_only(shape, dtypes):
    plan, v = resolve(shape, H100, 2, "unicast", dtypes)
    plan_u, v_u = resolve(shape, H100, 2, "unicast", dtypes, Tuning(uniform_desc=True))
    assert plan_u == plan and not v.uniform_desc and v_u.uniform_desc == 1
    assert v_u == dataclasses.replace(v, uniform_desc=1)
    assert "uniform_desc=1" in v_u.describe()


def test_sm100_refuses_it():
    with pytest.raises(RsarValueError, match=r"Tuning\.uniform_desc.*sm_100a kernel has none"):
        resolve(Shape(1024, 7168, 1024, "rs"), Hardware("sm_100a", 148, 148), 2, "unicast",
                tuning=Tuning(uniform_desc=True))


@pytest.mark.parametrize("shape,dtypes", CALLS[:2] + CALLS[3:],
                         ids=["pingpong", "cooperative", "fp8-ar"])
def test_its_kernels_compile_like_the_default(ptx_of, shape, dtypes, tmp_path):
    pytest.importorskip("cutlass")
    from ptx_checks import ptxas_log
    _, v = resolve(shape, H100, 2, "unicast", dtypes)
    _, v_u = resolve(shape, H100, 2, "unicast", dtypes, Tuning(uniform_desc=True))
    ptx, ptx_u = ptx_of(v), ptx_of(v_u)
    mma = r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k\d+\S*"
    assert ptx_u != ptx and re.findall(mma, ptx_u) == re.findall(mma, ptx)
    regs = []
    for text in (ptx, ptx_u):
        log = ptxas_log(text, tmp_path)
        for code in ("C7514", "C7517", "C7520"):  # no wgmma serialized
            assert code not in log, log[-2000:]
        assert " 0 bytes spill stores" in log, log[-2000:]
        regs.append(int(re.search(r"Used (\d+) registers", log).group(1)))
    assert regs[1] <= regs[0]
