"""What a launch reports in its error record becomes the right exception on the host: a
timed-out wait, or a peer that started the launch with another M or K (the start stamps'
shape words, compared in the kernel)."""
from __future__ import annotations

import types

import numpy as np
import pytest

pytest.importorskip("cutlass")

from launch import protocol  # noqa: E402
from op_stub import planning_op  # noqa: E402
from rsar_core import RsarError, RsarTimeoutError, ShapeMismatchError  # noqa: E402


def _word(M: int, K: int) -> int:
    """The shape word as ``protocol.shape_word`` packs it (M high, K / 64 low)."""
    return ((M % (1 << protocol.SHAPE_M_BITS)) << protocol.SHAPE_K_BITS) | (
        (K // 64) % (1 << protocol.SHAPE_K_BITS))


def _op_with_record(**fields: int):
    op = planning_op("rs", N=384)
    err = np.zeros(8, dtype=np.int32)
    for name, value in fields.items():
        err[getattr(protocol, name)] = np.int64(value).astype(np.int32)
    op._ws, op._broken = types.SimpleNamespace(err_np=err), None
    return op


@pytest.mark.parametrize("M,K", [(1, 64), (1000, 4096), (16384, 9216), ((1 << 20) - 1, 262080)])
def test_shape_words_decode_to_m_and_k(M, K):
    assert protocol.decode_shape(_word(M, K)) == (M, K)
    # as the host reads it back from the int32 record
    assert protocol.decode_shape(int(np.int64(_word(M, K)).astype(np.int32))) == (M, K)


def test_fields_wrap_beyond_their_widths():
    assert protocol.decode_shape(_word(1 << 20, 64)) == (0, 64)
    assert protocol.decode_shape(_word(5, 64 << protocol.SHAPE_K_BITS)) == (5, 0)


def test_a_peer_with_another_shape_is_named_and_the_op_stays_broken():
    op = _op_with_record(ERR_CODE=protocol.ERR_SHAPE, ERR_RANK=0, ERR_SRC=1, ERR_EPOCH=7,
                         ERR_KIND=_word(1000, 4096), ERR_TILE=_word(1010, 4096))
    with pytest.raises(ShapeMismatchError) as ei:
        op.check()
    e = ei.value
    assert isinstance(e, RsarError) and isinstance(e, RuntimeError)
    assert (e.rank, e.shape, e.src, e.src_shape, e.epoch) == (0, (1000, 4096), 1,
                                                               (1010, 4096), 7)
    assert ("rank 0 started launch 7 with M=1000, K=4096 but rank 1 with M=1010, K=4096"
            in str(e))
    op._ws.err_np[:] = 0  # the record is not read again: the op stays broken
    with pytest.raises(ShapeMismatchError) as again:
        op.check()
    assert again.value is e


def test_a_timeout_is_still_a_timeout():
    op = _op_with_record(ERR_CODE=protocol.ERR_TIMEOUT, ERR_RANK=1, ERR_SRC=0, ERR_EPOCH=3,
                         ERR_TILE=-1, ERR_KIND=protocol.KIND_STARTED)
    with pytest.raises(RsarTimeoutError, match=r"rank 0 \(start of this launch, launch 3\)"):
        op.check()


def test_a_clean_record_raises_nothing():
    _op_with_record().check()
