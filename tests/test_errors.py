"""What a timed-out kernel wait tells the user."""
import pytest

from rsar_core import RsarTimeoutError


def test_timeout_message_names_the_peer_and_what_it_never_sent():
    tile = str(RsarTimeoutError(rank=0, tile=7, src=1, epoch=89, kind=1))
    assert "rank 0 timed out waiting for rank 1 (partial tile, tile 7, launch 89)" in tile
    start = RsarTimeoutError(rank=1, tile=-1, src=0, epoch=3, kind=3)
    assert "rank 1 timed out waiting for rank 0 (start of this launch, launch 3)" in str(start)
    assert (start.rank, start.src, start.tile, start.kind) == (1, 0, -1, 3)
    assert "kind 9" in str(RsarTimeoutError(rank=0, tile=0, src=1, epoch=0, kind=9))


def test_every_refusal_of_the_public_api_is_an_rsar_error(monkeypatch):
    """Bad arguments and settings keep their builtin type (ValueError, TypeError) and are
    RsarError too, so one ``except RsarError`` catches whatever rsar refuses."""
    import rsar_core
    from multicast.policy import decide
    from rsar_core import gemm_rsar, validate
    for exc, call in [
            (rsar_core.RsarValueError, lambda: validate.check_construction(0, 7168, 2)),
            (rsar_core.RsarTypeError, lambda: validate.check_construction(1.5, 7168, 2)),
            (rsar_core.RsarValueError, lambda: decide({"RSAR_MULTICAST": "maybe"}))]:
        with pytest.raises(exc) as e:
            call()
        assert isinstance(e.value, rsar_core.RsarError)
    assert issubclass(rsar_core.RsarValueError, ValueError)
    assert issubclass(rsar_core.RsarTypeError, TypeError)
    assert issubclass(rsar_core.UnsupportedError, RuntimeError)
    monkeypatch.setenv("RSAR_TIMEOUT_S", "5s")
    with pytest.raises(rsar_core.RsarValueError, match="RSAR_TIMEOUT_S must be a number"):
        gemm_rsar.timeout_from_env()
    monkeypatch.setenv("RSAR_TIMEOUT_S", "0.5")
    assert gemm_rsar.timeout_from_env() == 0.5
    monkeypatch.delenv("RSAR_TIMEOUT_S")
    assert gemm_rsar.timeout_from_env() == gemm_rsar.DEFAULT_TIMEOUT_S


def test_n_needs_16_byte_rows_and_blackwell_whole_tiles():
    """sm90 runs any N of 16-byte rows (a partial last tile column where no tile width
    divides it); the sm100 kernel runs whole tiles only, so it refuses N off 128 by name."""
    import rsar_core
    from rsar_core import validate
    for N in (8, 200, 1000, 2880, 7168):
        validate.check_construction(256, N, 2)
    for N in (0, 4, 2884, -128):
        with pytest.raises(rsar_core.RsarValueError, match="multiple of 8"):
            validate.check_construction(256, N, 2)
    validate.check_arch_width(2880, "sm_90a")
    validate.check_arch_width(7168, "sm_100a")
    with pytest.raises(rsar_core.UnsupportedError, match="sm_100a kernel needs N a multiple of 128"):
        validate.check_arch_width(2880, "sm_100a")
