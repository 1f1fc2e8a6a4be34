"""Exchange POSIX file descriptors between the ranks of one host.

CUDA's POSIX_FILE_DESCRIPTOR shareable handles are file descriptors: plain numbers that
mean nothing in another process, so they cannot travel over MPI. The kernel can copy
them from one process to another with SCM_RIGHTS over a Unix socket, which this module
does, with the bootstrap carrying what the sockets need:

1. every rank binds a listening socket in the abstract namespace (nothing on disk) under
   a random 128-bit name, and announces (name, pid, uid, boot id) over the bootstrap;
2. every rank checks that all peers share its boot id (same host, same boot);
3. every rank sends its fd to every peer from a thread while accepting the peers' fds
   on its own socket, so no ordering of ranks can deadlock.

Trust: abstract socket names cannot be guessed, but any local process can list them in
/proc/net/unix and connect. So each side checks the kernel's SO_PEERCRED for the other
end against the pid and uid that rank announced over the bootstrap: a sender only sends
to the process that announced the socket, and a receiver reads (and so installs) an fd
only from a connection whose credentials belong to the announced peer; any other
connection is closed unread, which makes the kernel drop the fd it carried. A stranger
can at worst make the exchange fail; it never gets an fd accepted or handed out.

Every step goes through ``agree``, so a failure anywhere raises the same PeerError on
every rank. Ranks must share one pid namespace (one container or none), since announced
pids are compared with the kernel's view of the peer.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import struct
import threading
import time
from dataclasses import dataclass

from .agree import agree
from .bootstrap import Bootstrap
from .errors import HandleExchangeError, RsarValueError

__all__ = ["boot_id", "exchange_fds"]

log = logging.getLogger("rsar.multicast")

_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
_NAME_PREFIX = b"\0rsar-fd-"
_TOKEN_BYTES = 16
_MAGIC = b"RSARFD01"
_HEADER = struct.Struct("!8sI")  # magic, sender rank
_PEERCRED = struct.Struct("iII")  # struct ucred: pid_t pid, uid_t uid, gid_t gid
_FD_SIZE = struct.calcsize("i")


def boot_id() -> str:
    """This host's boot id: equal for two processes iff they run on the same booted kernel."""
    try:
        with open(_BOOT_ID_PATH, encoding="ascii") as f:
            value = f.read().strip()
    except OSError as e:
        raise HandleExchangeError(f"cannot read {_BOOT_ID_PATH}: {e}") from e
    if not value:
        raise HandleExchangeError(f"{_BOOT_ID_PATH} is empty")
    return value


def _identity() -> tuple[int, int]:
    """(pid, uid) this process announces to its peers."""
    return os.getpid(), os.getuid()


@dataclass(frozen=True)
class _Announcement:
    token: str
    pid: int
    uid: int
    boot_id: str

    def address(self) -> bytes:
        return _NAME_PREFIX + self.token.encode("ascii")

    def encode(self) -> bytes:
        return json.dumps(
            {"token": self.token, "pid": self.pid, "uid": self.uid, "boot_id": self.boot_id}
        ).encode("ascii")

    @classmethod
    def decode(cls, rank: int, raw: bytes) -> "_Announcement":
        try:
            d = json.loads(raw.decode("ascii"))
            ann = cls(str(d["token"]), int(d["pid"]), int(d["uid"]), str(d["boot_id"]))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise HandleExchangeError(f"rank {rank} sent a malformed announcement: {e}") from e
        if len(ann.token) != 2 * _TOKEN_BYTES or not all(c in "0123456789abcdef" for c in ann.token):
            raise HandleExchangeError(f"rank {rank} announced a malformed socket name {ann.token!r}")
        if ann.pid <= 0:
            raise HandleExchangeError(f"rank {rank} announced pid {ann.pid}")
        return ann


def _peercred(sock: socket.socket) -> tuple[int, int]:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, _gid = _PEERCRED.unpack(raw)
    return pid, uid


def _remaining(deadline: float, what: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise HandleExchangeError(f"timed out {what}")
    return left


def _check_fd(fd: int) -> None:
    if not isinstance(fd, int) or isinstance(fd, bool) or fd < 0:
        raise HandleExchangeError(f"expected a file descriptor (int >= 0), got {fd!r}")
    try:
        os.fstat(fd)
    except OSError as e:
        raise HandleExchangeError(f"fd {fd} is not an open file descriptor: {e}") from e


def _listen(world: int) -> tuple[socket.socket, _Announcement]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        token = secrets.token_hex(_TOKEN_BYTES)
        sock.bind(_NAME_PREFIX + token.encode("ascii"))
        # Every peer may connect before we accept anyone; room for all of them.
        sock.listen(max(world, 16))
        pid, uid = _identity()
        return sock, _Announcement(token, pid, uid, boot_id())
    except BaseException:
        sock.close()
        raise


def _check_peers(me: int, raw: list[bytes]) -> list[_Announcement]:
    peers = [_Announcement.decode(r, b) for r, b in enumerate(raw)]
    ours = peers[me].boot_id
    problems = [
        f"rank {r} runs on another host or boot (boot id {p.boot_id}, ours {ours})"
        for r, p in enumerate(peers)
        if p.boot_id != ours
    ]
    if len({p.token for p in peers}) != len(peers):
        problems.append("two ranks announced the same socket name")
    pids = [(p.pid, p.uid) for p in peers]
    if len(set(pids)) != len(pids):
        problems.append(f"two ranks announced the same process: {pids}")
    if problems:
        raise HandleExchangeError("; ".join(problems))
    return peers


def _send_one(me: int, peer: int, ann: _Announcement, fd: int, deadline: float) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as s:
        s.settimeout(_remaining(deadline, f"before connecting to rank {peer}"))
        try:
            s.connect(ann.address())
        except OSError as e:
            raise HandleExchangeError(f"cannot connect to rank {peer}'s socket: {e}") from e
        pid, uid = _peercred(s)
        if (pid, uid) != (ann.pid, ann.uid):
            raise HandleExchangeError(
                f"rank {peer}'s socket is held by pid {pid} uid {uid}, but rank {peer} "
                f"announced pid {ann.pid} uid {ann.uid}; fd not sent"
            )
        s.settimeout(_remaining(deadline, f"connected to rank {peer}"))
        header = _HEADER.pack(_MAGIC, me)
        try:
            sent = socket.send_fds(s, [header], [fd])
        except OSError as e:
            raise HandleExchangeError(f"sending fd to rank {peer} failed: {e}") from e
        if sent != len(header):
            raise HandleExchangeError(f"short send to rank {peer}: {sent} of {len(header)} bytes")


def _close_all(fds: list[int | None] | dict[int, int]) -> None:
    values = fds.values() if isinstance(fds, dict) else fds
    for fd in values:
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


def _receive_one(
    conn: socket.socket, me: int, peers: list[_Announcement], have: dict[int, int]
) -> tuple[int, int]:
    """Check who is on the other end of ``conn``, then take its fd: (rank, fd)."""
    pid, uid = _peercred(conn)
    by_pid = {p.pid: r for r, p in enumerate(peers) if r != me}
    rank = by_pid.get(pid)
    if rank is None or peers[rank].uid != uid:
        # Closing conn unread makes the kernel discard any fd in flight on it.
        announced = {r: (p.pid, p.uid) for r, p in enumerate(peers) if r != me}
        raise HandleExchangeError(
            f"refused a connection from pid {pid} uid {uid}: no peer announced that "
            f"process (announced (pid, uid) by rank: {announced})"
        )
    if rank in have:
        raise HandleExchangeError(f"rank {rank} connected twice")
    fds: list[int] = []
    try:
        msg, ancdata, flags, _ = conn.recvmsg(
            _HEADER.size, socket.CMSG_SPACE(4 * _FD_SIZE), socket.MSG_CMSG_CLOEXEC
        )
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(data) - len(data) % _FD_SIZE
                fds.extend(struct.unpack(f"{usable // _FD_SIZE}i", data[:usable]))
        while msg and len(msg) < _HEADER.size:  # a stream may split the header
            more = conn.recv(_HEADER.size - len(msg))
            if not more:
                break
            msg += more
        if flags & socket.MSG_CTRUNC:
            raise HandleExchangeError(f"rank {rank} sent more descriptors than expected")
        if len(msg) != _HEADER.size:
            raise HandleExchangeError(
                f"rank {rank} closed the connection after {len(msg)} of {_HEADER.size} bytes "
                "(did it refuse this rank's socket?)"
            )
        magic, sender = _HEADER.unpack(msg)
        if magic != _MAGIC or sender != rank:
            raise HandleExchangeError(
                f"rank {rank} (pid {pid}) sent header {magic!r} claiming rank {sender}"
            )
        if len(fds) != 1:
            raise HandleExchangeError(f"rank {rank} sent {len(fds)} descriptors, expected 1")
        os.fstat(fds[0])
        return rank, fds[0]
    except BaseException:
        _close_all(fds)
        raise


def _transfer(
    listener: socket.socket, me: int, peers: list[_Announcement], fd: int, timeout: float
) -> list[int | None]:
    world = len(peers)
    deadline = time.monotonic() + timeout
    send_errors: list[str] = []

    def send_all() -> None:
        # Start with the next rank so that not every rank queues on rank 0 first.
        for step in range(1, world):
            peer = (me + step) % world
            try:
                _send_one(me, peer, peers[peer], fd, deadline)
            except Exception as e:
                send_errors.append(f"sending to rank {peer}: {e}")

    sender = threading.Thread(target=send_all, name="rsar-fd-send", daemon=True)
    sender.start()
    have: dict[int, int] = {}
    errors: list[str] = []
    try:
        while len(have) < world - 1:
            missing = sorted(set(range(world)) - {me} - set(have))
            listener.settimeout(_remaining(deadline, f"waiting for fds from ranks {missing}"))
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                raise HandleExchangeError(
                    f"timed out after {timeout:g}s waiting for fds from ranks {missing}"
                ) from None
            with conn:
                conn.settimeout(_remaining(deadline, "receiving an fd"))
                rank, got = _receive_one(conn, me, peers, have)
            have[rank] = got
            log.debug("fd exchange: rank %d got fd %d from rank %d", me, got, rank)
    except (HandleExchangeError, OSError) as e:
        # Stop receiving at the first refusal, but still let the sends finish (peers
        # are waiting for them) and report both sides.
        errors.append(str(e) if isinstance(e, HandleExchangeError)
                      else f"receiving an fd: {type(e).__name__}: {e}")
    except BaseException:
        _close_all(have)
        sender.join(max(0.0, deadline - time.monotonic()) + 1.0)
        raise
    # The caller may close its fd as soon as we return: the sends must be finished.
    sender.join(max(0.0, deadline - time.monotonic()) + 1.0)
    if sender.is_alive():
        errors.append(f"timed out after {timeout:g}s sending fds")
    errors.extend(send_errors)
    if errors:
        _close_all(have)
        raise HandleExchangeError("; ".join(errors))
    return [None if r == me else have[r] for r in range(world)]


def exchange_fds(bs: Bootstrap, fd: int, timeout: float = 30.0) -> list[int | None]:
    """Send ``fd`` to every peer and receive each peer's fd.

    Collective. Returns a list indexed by rank: a new descriptor (owned by the caller,
    close-on-exec) for each peer, None for this rank. ``timeout`` bounds the socket
    transfer. Any failure on any rank raises PeerError on every rank, with no received
    descriptor left open.
    """
    if not isinstance(timeout, (int, float)) or not timeout > 0:
        raise RsarValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    me, world = bs.rank, bs.world
    if world == 1:
        agree(bs, "fd exchange: check fd", lambda: _check_fd(fd))
        return [None]

    def listen() -> tuple[socket.socket, _Announcement]:
        _check_fd(fd)
        return _listen(world)

    listener, mine = agree(bs, "fd exchange: listen", listen, undo=lambda r: r[0].close())
    try:
        raw = bs.allgather(mine.encode())
        peers = agree(bs, "fd exchange: check peers", lambda: _check_peers(me, raw))
        received = agree(
            bs,
            "fd exchange: transfer",
            lambda: _transfer(listener, me, peers, fd, float(timeout)),
            undo=_close_all,
        )
    finally:
        listener.close()
    log.debug("fd exchange: rank %d received fds %s", me, received)
    return received
