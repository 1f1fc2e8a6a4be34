"""Failure agreement: a setup step succeeds on every rank or fails on every rank.

Symmetric-memory setup is a chain of collective steps. If one rank failed a step and
simply raised, its peers would walk into the next collective and wait for it forever.
Instead every step runs through ``agree``: each rank runs its part, then all ranks
exchange (ok, message) over the bootstrap, and if any rank failed every rank raises the
same PeerError naming each failed rank and why.

``agree`` only guarantees progress if each rank's part finishes; steps that wait on
peers (sockets, polling) carry their own time limits.
"""
from __future__ import annotations

import logging
from typing import Callable, TypeVar

from .bootstrap import Bootstrap
from .errors import BootstrapError, PeerError

__all__ = ["agree", "all_true"]

log = logging.getLogger("rsar.multicast")

T = TypeVar("T")

_OK = b"\x01"
_FAILED = b"\x00"
# Keep failure messages bounded: they travel to every rank and into every exception.
_MAX_MESSAGE = 2000


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if len(text) > _MAX_MESSAGE:
        text = text[: _MAX_MESSAGE - 3] + "..."
    return text


def agree(
    bs: Bootstrap,
    step: str,
    fn: Callable[[], T],
    undo: Callable[[T], object] | None = None,
) -> T:
    """Run ``fn()`` on every rank; return its result only if it succeeded on all ranks.

    If ``fn`` raised on any rank, every rank raises ``PeerError(step, {rank: message})``;
    on the ranks where it failed, the local exception is the PeerError's ``__cause__``.
    ``undo(result)``, if given, runs on the ranks where ``fn`` succeeded but a peer
    failed, so a step that acquired something (a socket, an allocation) gives it back
    before the error propagates; an error inside ``undo`` is logged, not raised.
    """
    local: Exception | None = None
    result: T | None = None
    try:
        result = fn()
    except Exception as e:
        local = e
        log.debug("step %r failed on rank %d: %s", step, bs.rank, _describe(e))
    payload = _OK if local is None else _FAILED + _describe(local).encode("utf-8", "replace")
    try:
        votes = bs.allgather(payload)
    except BootstrapError as e:
        raise BootstrapError(f"agreeing on step {step!r}: {e}") from (local or e)
    failures: dict[int, str] = {}
    for r, vote in enumerate(votes):
        if vote[:1] == _OK and len(vote) == 1:
            continue
        if vote[:1] == _FAILED:
            failures[r] = vote[1:].decode("utf-8", "replace")
        else:
            failures[r] = f"malformed agreement vote {vote[:32]!r}"
    if failures:
        if local is None and undo is not None:
            try:
                undo(result)  # type: ignore[arg-type]
            except Exception as e:
                log.debug("undo after failed step %r raised on rank %d: %s",
                          step, bs.rank, _describe(e))
        raise PeerError(step, failures) from local
    return result  # type: ignore[return-value]


def all_true(bs: Bootstrap, flag: bool) -> bool:
    """Logical AND of ``flag`` across all ranks (the same answer on every rank)."""
    votes = bs.allgather(_OK if flag else _FAILED)
    return all(v == _OK for v in votes)
