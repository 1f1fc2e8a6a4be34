"""Worker: exchange real memfd descriptors across processes, and the ways it must refuse."""
from __future__ import annotations

import fcntl
import hashlib
import os
import socket
import time
from typing import Any

from _worker import PeerError, main, open_fds, peer_error

from multicast import fdpass
from multicast.bootstrap import Bootstrap, make_bootstrap
from multicast.fdpass import exchange_fds

SIZE = 1 << 16  # contents; receivers leave their marks past it
MARKS = 4096


def content(rank: int, nonce: bytes) -> bytes:
    block = hashlib.sha256(b"rsar-fd-%d-" % rank + nonce).digest()
    return block * (SIZE // len(block))


def make_memfd(rank: int, nonce: bytes) -> int:
    fd = os.memfd_create(f"rsar-test-{rank}", os.MFD_CLOEXEC)
    os.ftruncate(fd, SIZE + MARKS)
    os.pwrite(fd, content(rank, nonce), 0)
    return fd


def exchange(rounds: str = "1") -> dict[str, Any]:
    """Every rank shares a memfd with rank-specific contents; each receiver reads every
    peer's contents through the fd it got, writes a mark into it, and each owner then
    finds every peer's mark in its own memfd (same file, not a copy)."""
    bs = make_bootstrap(None)
    r, w = bs.rank, bs.world
    nonce = bs.broadcast(os.urandom(16) if r == 0 else None)
    mine = make_memfd(r, nonce)
    inode = os.fstat(mine).st_ino
    inodes = [int(x) for x in bs.allgather(str(inode).encode())]

    baseline = None
    res: dict[str, Any] = {"contents_ok": [], "same_file": [], "cloexec": [], "own_none": []}
    for i in range(int(rounds)):
        if i == 1:
            baseline = open_fds()  # after the first round: lazy imports have settled
        got = exchange_fds(bs, mine, timeout=20)
        res["own_none"].append(got[r] is None and len(got) == w)
        res["contents_ok"].append(
            [g is None or os.pread(g, SIZE, 0) == content(p, nonce) for p, g in enumerate(got)]
        )
        res["same_file"].append(
            [g is None or os.fstat(g).st_ino == inodes[p] for p, g in enumerate(got)]
        )
        res["cloexec"].append(
            all(g is None or fcntl.fcntl(g, fcntl.F_GETFD) & fcntl.FD_CLOEXEC for g in got)
        )
        res["distinct_new_fds"] = len({g for g in got if g is not None} | {mine}) == w
        if i == 0:
            for p, g in enumerate(got):
                if g is not None:
                    os.pwrite(g, b"mark-from-%04d" % r, SIZE + 16 * r)
        bs.barrier()
        if i == 0:
            res["marks_ok"] = all(
                os.pread(mine, 14, SIZE + 16 * p) == b"mark-from-%04d" % p
                for p in range(w)
                if p != r
            )
        for g in got:
            if g is not None:
                os.close(g)
    if baseline is not None:
        res["fd_leak"] = open_fds() - baseline
    os.close(mine)
    return res


def _failing_exchange(bs: Bootstrap, fd: int, timeout: float = 10) -> dict[str, Any]:
    before = open_fds()
    started = time.monotonic()
    try:
        got = exchange_fds(bs, fd, timeout=timeout)
        res: dict[str, Any] = {"error": None, "got": got}
    except PeerError as e:
        res = {"error": peer_error(e, started)}
    res["fd_leak"] = open_fds() - before
    # The job goes on: the bootstrap is still in step on every rank.
    res["after"] = bs.allgather(b"%d" % bs.rank) == [b"%d" % i for i in range(bs.world)]
    return res


def impostor(liar: str, what: str) -> dict[str, Any]:
    """Rank ``liar`` announces a pid (or uid) that is not its own."""
    bs = make_bootstrap(None)
    fd = make_memfd(bs.rank, b"")
    if bs.rank == int(liar):
        real_pid, real_uid = os.getpid(), os.getuid()
        if what == "pid":
            # A real process that is not the one holding the socket: the launcher.
            fdpass._identity = lambda: (os.getppid(), real_uid)
        else:
            fdpass._identity = lambda: (real_pid, real_uid + 1)
    res = _failing_exchange(bs, fd)
    os.close(fd)
    return res


def other_host(who: str) -> dict[str, Any]:
    """Rank ``who`` reports a different boot id, as a process on another host would."""
    bs = make_bootstrap(None)
    fd = make_memfd(bs.rank, b"")
    if bs.rank == int(who):
        fdpass.boot_id = lambda: "00000000-0000-0000-0000-000000000000"
    res = _failing_exchange(bs, fd)
    os.close(fd)
    return res


def bad_fd(who: str) -> dict[str, Any]:
    """Rank ``who`` passes a descriptor that is not open."""
    bs = make_bootstrap(None)
    fd = make_memfd(bs.rank, b"")
    if bs.rank == int(who):
        os.close(fd)
    res = _failing_exchange(bs, fd)
    if bs.rank != int(who):
        os.close(fd)
    return res


def stranger(victim: str) -> dict[str, Any]:
    """Another process on the host finds rank ``victim``'s socket name and connects
    first, offering its own memfd with a well-formed header claiming to be a peer. The
    victim must refuse it, and every rank must raise."""
    bs = make_bootstrap(None)
    fd = make_memfd(bs.rank, b"")
    v = int(victim)
    attacker = (v + 1) % bs.world
    res: dict[str, Any] = {}
    if bs.rank == attacker:
        real_send = fdpass._send_one

        def send_with_stranger(me, peer, ann, sfd, deadline):  # type: ignore[no-untyped-def]
            if peer == v:
                res["stranger_pid"] = _stranger_connects(ann.address(), me)
            return real_send(me, peer, ann, sfd, deadline)

        fdpass._send_one = send_with_stranger
    res.update(_failing_exchange(bs, fd))
    if "stranger_pid" in res:
        os.waitpid(res["stranger_pid"], 0)
    os.close(fd)
    return res


def silent(who: str) -> dict[str, Any]:
    """Rank ``who`` stalls past the 1 s transfer time limit before sending anything:
    its peers must give up waiting, and every rank raise, in bounded time."""
    bs = make_bootstrap(None)
    fd = make_memfd(bs.rank, b"")
    if bs.rank == int(who):
        real_send = fdpass._send_one

        def stalled_send(me, peer, ann, sfd, deadline):  # type: ignore[no-untyped-def]
            time.sleep(max(0.0, deadline - time.monotonic()) + 0.2)
            return real_send(me, peer, ann, sfd, deadline)

        fdpass._send_one = stalled_send
    res = _failing_exchange(bs, fd, timeout=1.0)
    os.close(fd)
    return res


def _stranger_connects(address: bytes, claim_rank: int) -> int:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the stranger: connect, send an fd, report, linger until refused
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(address)
            evil = os.memfd_create("stranger")
            os.write(evil, b"stranger's data")
            socket.send_fds(s, [fdpass._HEADER.pack(fdpass._MAGIC, claim_rank)], [evil])
            os.write(w, b"1")
            s.settimeout(10)
            s.recv(1)
        finally:
            os._exit(0)
    os.close(w)
    os.read(r, 1)  # the stranger's connection is queued before the real one
    os.close(r)
    return pid


if __name__ == "__main__":
    main(
        {
            "exchange": exchange,
            "impostor": impostor,
            "other_host": other_host,
            "bad_fd": bad_fd,
            "stranger": stranger,
            "silent": silent,
        }
    )
