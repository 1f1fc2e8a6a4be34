"""Worker: the Bootstrap collectives across real processes (mpi4py, and torch gloo)."""
from __future__ import annotations

import gc
import hashlib
import json
import os
import sys
import time
from typing import Any

from _worker import PeerError, main, peer_error

from multicast.agree import agree, all_true
from multicast.bootstrap import Bootstrap, MpiBootstrap, TorchBootstrap, make_bootstrap


def payload(rank: int, n: int) -> bytes:
    # Rank-specific, size varies by rank (0 bytes up to ~100 kB) so mixing up or
    # truncating entries shows.
    seed = hashlib.sha256(f"rank-{rank}".encode()).digest()
    return (seed * (n // 32 + 1))[:n]


def size_of(rank: int) -> int:
    return [0, 1, 4096, 100_003][rank % 4] + rank


def exercise(bs: Bootstrap) -> dict[str, Any]:
    """Collectives every Bootstrap must get right; returns checks for the test."""
    r, w = bs.rank, bs.world
    out: dict[str, Any] = {"rank_seen": r, "world_seen": w}

    gathered = bs.allgather(payload(r, size_of(r)))
    out["allgather_ok"] = gathered == [payload(i, size_of(i)) for i in range(w)]

    bcast_ok = []
    for root in range(w):
        got = bs.broadcast(payload(root, size_of(root) + 7) if r == root else None, root=root)
        bcast_ok.append(got == payload(root, size_of(root) + 7))
    out["broadcast_ok"] = bcast_ok

    # The barrier must hold everybody until the last rank arrives. CLOCK_MONOTONIC is one
    # clock for every process of the host, so arrival and release times compare across
    # ranks (a wait measured per rank would also shrink when a rank itself starts late).
    late = w - 1
    bs.barrier()
    if r == late:
        time.sleep(0.4)
    arrived = time.monotonic()
    bs.barrier()
    released = time.monotonic()
    times = [json.loads(t) for t in bs.allgather(json.dumps([arrived, released]).encode())]
    out["barrier_held"] = min(t[1] for t in times) >= max(t[0] for t in times)

    try:
        bs.allgather("not bytes")  # type: ignore[arg-type]
        out["allgather_rejects_str"] = False
    except TypeError:
        out["allgather_rejects_str"] = True
    try:
        bs.broadcast(b"x", root=w)
        out["broadcast_rejects_bad_root"] = False
    except ValueError:
        out["broadcast_rejects_bad_root"] = True

    out["agree_result"] = agree(bs, "bootstrap smoke", lambda: r * 10 + 1)
    out["all_true_all"] = all_true(bs, True)
    out["all_true_one_false"] = all_true(bs, r != late)
    return out


def mpi_collectives() -> dict[str, Any]:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    bs = make_bootstrap(None)
    res = exercise(bs)
    res["make_none_is_mpi"] = isinstance(bs, MpiBootstrap)
    res["make_comm_is_mpi"] = isinstance(make_bootstrap(world), MpiBootstrap)
    res["make_bootstrap_identity"] = make_bootstrap(bs) is bs
    try:
        make_bootstrap(object())
        res["make_rejects_object"] = False
    except TypeError:
        res["make_rejects_object"] = True
    # A sub-communicator: even and odd ranks, each numbered from 0 within its half.
    sub = world.Split(color=world.rank % 2, key=world.rank)
    sub_bs = make_bootstrap(sub)
    res["sub"] = exercise(sub_bs)
    sub.Free()
    return res


def _torch_rank() -> int:
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    raise RuntimeError("not launched by mpiexec: no PMI_RANK / OMPI_COMM_WORLD_RANK")


def torch_gloo(init_file: str) -> dict[str, Any]:
    import torch.distributed as dist

    from multicast.fdpass import exchange_fds

    rank = _torch_rank()
    world = int(os.environ["RSAR_TEST_WORLD"])
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world
    )
    bs = solo = None
    try:
        bs = make_bootstrap(dist.group.WORLD)
        res = exercise(bs)
        res["mpi_not_loaded"] = "mpi4py.MPI" not in sys.modules
        res["make_group_is_torch"] = isinstance(bs, TorchBootstrap)
        res["default_group"] = exercise(TorchBootstrap(None))
        # A group of the last rank alone: group rank 0 is global rank world-1, so the
        # broadcast root must be translated.
        solo = dist.new_group([world - 1])
        if rank == world - 1:
            res["solo"] = exercise(TorchBootstrap(solo))

        # fds travel over the same sockets whichever bootstrap carried the names.
        fd = os.memfd_create(f"rsar-torch-{rank}", os.MFD_CLOEXEC)
        os.write(fd, payload(rank, 64))
        got = exchange_fds(bs, fd, timeout=10)
        res["fd_contents_ok"] = [
            g is None or os.pread(g, 64, 0) == payload(i, 64) for i, g in enumerate(got)
        ]
        res["fd_own_slot_none"] = got[rank] is None
        for g in got:
            if g is not None:
                os.close(g)
        os.close(fd)

        def last_rank_fails() -> int:
            if rank == world - 1:
                raise ZeroDivisionError(f"rank {rank} divided by zero")
            return rank

        started = time.monotonic()
        try:
            agree(bs, "torch failing step", last_rank_fails)
            res["agree_failure"] = None
        except PeerError as e:
            res["agree_failure"] = peer_error(e, started)
        bs.barrier()
    finally:
        # Drop every reference to the groups first, so destroy_process_group frees them
        # here: a gloo group still referenced at interpreter exit is freed during shutdown,
        # where its worker threads abort the process ("terminate called without an active
        # exception", ~1 run in 7 under load).
        bs = solo = None
        gc.collect()
        dist.destroy_process_group()
    return res


if __name__ == "__main__":
    if sys.argv[1] == "torch_gloo":
        main({"torch_gloo": torch_gloo}, rank_of=_torch_rank)
    else:
        main({"mpi_collectives": mpi_collectives})
