"""An in-process Bootstrap: N "ranks" as threads of one process.

Lets the collective setup code run against the recording fake driver without MPI.
Every collective is a numbered round: a rank's k-th call meets every other rank's
k-th call. A round that can never complete (a rank returned, or called a different
collective) fails fast with BootstrapError instead of hanging the test; that is how a
rank "waiting forever" shows up here.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable

from multicast.bootstrap import Bootstrap
from multicast.errors import BootstrapError


class ThreadGroup:
    """The state the thread ranks share."""

    def __init__(self, world: int, timeout: float = 20.0) -> None:
        self.world = world
        self.timeout = timeout
        self._cond = threading.Condition()
        self._rounds: dict[int, dict[int, tuple[str, Any]]] = {}
        self._reads: dict[int, int] = {}
        self._gone: set[int] = set()

    def exchange(self, rank: int, seq: int, kind: str, data: Any) -> list[Any]:
        with self._cond:
            rnd = self._rounds.setdefault(seq, {})
            rnd[rank] = (kind, data)
            self._cond.notify_all()

            def done_or_stuck() -> bool:
                return len(rnd) == self.world or any(r not in rnd for r in self._gone)

            if not self._cond.wait_for(done_or_stuck, self.timeout):
                raise BootstrapError(f"rank {rank}: {kind} #{seq} timed out; "
                                     f"arrived: {sorted(rnd)}")
            if len(rnd) != self.world:
                gone = sorted(r for r in self._gone if r not in rnd)
                raise BootstrapError(f"rank {rank}: {kind} #{seq} can never complete: "
                                     f"rank(s) {gone} left")
            kinds = {k for k, _ in rnd.values()}
            if len(kinds) != 1:
                raise BootstrapError(f"collective mismatch at #{seq}: "
                                     + ", ".join(f"rank {r}: {rnd[r][0]}" for r in sorted(rnd)))
            out = [rnd[r][1] for r in range(self.world)]
            self._reads[seq] = self._reads.get(seq, 0) + 1
            if self._reads[seq] == self.world:
                del self._rounds[seq], self._reads[seq]
            return out

    def leave(self, rank: int) -> None:
        with self._cond:
            self._gone.add(rank)
            self._cond.notify_all()


class OneRank(Bootstrap):
    """A world of one: the collectives return this rank's own data, for checks of the
    per-rank logic in this process."""

    rank, world = 0, 1

    def allgather(self, data: bytes) -> list[bytes]:
        return [bytes(data)]

    def broadcast(self, data: bytes | None, root: int = 0) -> bytes:
        return bytes(data)

    def barrier(self) -> None:
        pass

class ThreadBootstrap(Bootstrap):
    """One thread-rank's view of a ThreadGroup.

    ``on_barrier(rank)`` is called at each barrier so a recorder can log barriers
    among the driver calls.
    """

    def __init__(self, group: ThreadGroup, rank: int,
                 on_barrier: Callable[[int], None] | None = None) -> None:
        self.group = group
        self.rank = rank
        self.world = group.world
        self._seq = 0
        self._on_barrier = on_barrier

    def _round(self, kind: str, data: Any) -> list[Any]:
        seq = self._seq
        self._seq += 1
        return self.group.exchange(self.rank, seq, kind, data)

    def allgather(self, data: bytes) -> list[bytes]:
        return [bytes(x) for x in self._round("allgather", bytes(data))]

    def broadcast(self, data: bytes | None, root: int = 0) -> bytes:
        self._check_root(root)
        got = self._round(f"broadcast({root})", bytes(data) if self.rank == root else None)
        return got[root]

    def barrier(self) -> None:
        if self._on_barrier is not None:
            self._on_barrier(self.rank)
        self._round("barrier", None)


def thread_fd_exchange(bs: Bootstrap, fd: int) -> list[int | None]:
    """exchange_fds for thread ranks: one process, so duplicate the peers' fds.

    Keeps the contract of multicast.fdpass.exchange_fds: the result holds NEW
    descriptors owned by the caller (own slot None).
    """
    fds = [int(x) for x in bs.allgather(str(fd).encode())]
    out: list[int | None] = [None if r == bs.rank else os.dup(f) for r, f in enumerate(fds)]
    # Nobody may close the originals before every rank has duplicated them.
    bs.barrier()
    return out


def run_ranks(world: int, fn: Callable[[ThreadBootstrap], Any], *,
              fake: Any = None, timeout: float = 20.0) -> list[Any]:
    """Run fn(bs) on ``world`` thread-ranks; return each rank's result or exception."""
    group = ThreadGroup(world, timeout)
    results: list[Any] = [None] * world
    on_barrier = fake.record_barrier if fake is not None else None

    def body(rank: int) -> None:
        if fake is not None:
            fake.bind_thread(rank)
        try:
            results[rank] = fn(ThreadBootstrap(group, rank, on_barrier))
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            results[rank] = e
        finally:
            group.leave(rank)

    threads = [threading.Thread(target=body, args=(r,), name=f"rank{r}", daemon=True)
               for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout * 3)
        if t.is_alive():
            raise TimeoutError(f"{t.name} still running after {timeout * 3} s")
    return results
