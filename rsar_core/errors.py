"""Errors of the public API (the hierarchy lives in ``multicast.errors``)."""
from __future__ import annotations

from multicast.errors import (  # noqa: F401  (re-exported)
    BootstrapError, ClosedError, CudaDriverError, HandleExchangeError, MulticastPolicyError,
    PeerError, RsarError, RsarTypeError, RsarValueError, UnsupportedError,
)


class RsarTimeoutError(RsarError, RuntimeError):
    """A spin-wait in the kernel ran past its limit: a peer never started the launch or
    never delivered a tile.

    The instance is unusable afterwards (ranks may disagree about the epoch); close it
    and build a new one on every rank.
    """

    KINDS = {1: "partial tile", 2: "reduced tile", 3: "start of this launch",
             4: "split-K piece from a neighbouring CTA"}

    def __init__(self, rank: int, tile: int, src: int, epoch: int, kind: int) -> None:
        self.rank, self.tile, self.src, self.epoch, self.kind = rank, tile, src, epoch, kind
        what = self.KINDS.get(kind, f"kind {kind}")
        where = f", tile {tile}" if tile >= 0 else ""
        super().__init__(
            f"rank {rank} timed out waiting for rank {src} ({what}{where}, launch {epoch}): "
            "the peer never arrived - is it alive and calling the op with the same M and K?"
        )


class ShapeMismatchError(RsarError, RuntimeError):
    """Two ranks started the same launch with different shapes (M or K): every rank must make
    the same calls with the same M and K. The kernel finds it in the start stamps and gives
    the launch up, so that call's result is wrong; the next call (or ``check()``) raises
    this. The instance is unusable afterwards, as after a timeout: close it and build a new
    one on every rank. M and K are as the kernel saw them (modulo 2**20 and 2**18)."""

    def __init__(self, rank: int, shape: tuple[int, int], src: int,
                 src_shape: tuple[int, int], epoch: int) -> None:
        self.rank, self.shape, self.src, self.src_shape, self.epoch = (
            rank, shape, src, src_shape, epoch)
        super().__init__(
            f"rank {rank} started launch {epoch} with M={shape[0]}, K={shape[1]} but rank "
            f"{src} with M={src_shape[0]}, K={src_shape[1]}: every rank must call the op with "
            "the same M and K. That call's result is wrong and the op is unusable: close it "
            "and build a new one on every rank"
        )
