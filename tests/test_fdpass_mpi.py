"""fd exchange over SCM_RIGHTS across real processes, and every refusal it must make."""
from __future__ import annotations

import os

import pytest

from mpirun import run_mpi

@pytest.mark.parametrize("n, rounds", [(2, 3), (3, 3), (4, 2), (8, 2)])
@pytest.mark.mpi
def test_exchange_memfds(n: int, rounds: int, tmp_path) -> None:
    results = run_mpi(n, "fdpass_worker.py", "exchange", str(rounds), out_dir=tmp_path).ok_results()
    everyone = [True] * n
    for res in results:
        assert res["own_none"] == [True] * rounds
        # Each peer's rank-specific contents, read through the received descriptor.
        assert res["contents_ok"] == [everyone] * rounds
        # The very file the peer created (same inode), not a copy ...
        assert res["same_file"] == [everyone] * rounds
        # ... so marks written by every peer show up in the owner's memfd.
        assert res["marks_ok"] is True
        assert res["cloexec"] == [True] * rounds
        assert res["distinct_new_fds"] is True
        # Repeated exchanges leave no descriptor behind.
        assert res["fd_leak"] == 0


def _errors(results: list[dict]) -> list[dict]:
    errs = []
    for res in results:
        assert res["error"] is not None, f"rank {res['rank']} did not raise: {res}"
        assert res["fd_leak"] == 0, res
        assert res["after"] is True, res  # bootstrap still in step after the failure
        errs.append(res["error"])
    # Every rank raised the same error: same step, same failed ranks, same messages.
    assert all(e["failures"] == errs[0]["failures"] and e["step"] == errs[0]["step"] for e in errs)
    return errs


@pytest.mark.parametrize("n, liar", [(2, 1), (3, 0), (3, 2)])
@pytest.mark.mpi
def test_wrong_announced_pid_is_refused_everywhere(n: int, liar: int, tmp_path) -> None:
    results = run_mpi(n, "fdpass_worker.py", "impostor", str(liar), "pid",
                      out_dir=tmp_path).ok_results()
    errs = _errors(results)
    assert errs[0]["step"] == "fd exchange: transfer"
    failures = errs[0]["failures"]
    # Every honest rank caught the liar, from both directions: it refused the liar's
    # connection and would not send its own fd to the liar's socket.
    for r in range(n):
        if r != liar:
            msg = failures[str(r)]
            assert "refused a connection from pid" in msg
            assert f"rank {liar}'s socket is held by pid" in msg and "fd not sent" in msg


@pytest.mark.mpi
def test_wrong_announced_uid_is_refused(tmp_path) -> None:
    results = run_mpi(2, "fdpass_worker.py", "impostor", "1", "uid", out_dir=tmp_path).ok_results()
    errs = _errors(results)
    assert "refused a connection" in errs[0]["failures"]["0"]
    assert f"uid {os.getuid()}" in errs[0]["failures"]["0"]


@pytest.mark.mpi
def test_peer_on_another_host_is_refused(tmp_path) -> None:
    results = run_mpi(3, "fdpass_worker.py", "other_host", "1", out_dir=tmp_path).ok_results()
    errs = _errors(results)
    assert errs[0]["step"] == "fd exchange: check peers"
    assert "rank 1 runs on another host" in errs[0]["failures"]["0"]
    assert "rank 1 runs on another host" in errs[0]["failures"]["2"]


@pytest.mark.mpi
def test_stranger_connection_is_refused(tmp_path) -> None:
    results = run_mpi(3, "fdpass_worker.py", "stranger", "1", out_dir=tmp_path).ok_results()
    errs = _errors(results)
    stranger_pid = results[2]["stranger_pid"]
    assert errs[0]["step"] == "fd exchange: transfer"
    assert f"refused a connection from pid {stranger_pid}" in errs[0]["failures"]["1"]


@pytest.mark.mpi
def test_silent_peer_times_out_everywhere(tmp_path) -> None:
    results = run_mpi(3, "fdpass_worker.py", "silent", "0", out_dir=tmp_path).ok_results()
    errs = _errors(results)
    assert errs[0]["step"] == "fd exchange: transfer"
    for r in (1, 2):
        assert "timed out after 1s waiting for fds from ranks [0]" in errs[0]["failures"][str(r)]
    assert "timed out" in errs[0]["failures"]["0"]
    # A 1 s limit, plus the stalled sends finishing: nowhere near a hang.
    assert all(e["elapsed"] < 6.0 for e in errs)


@pytest.mark.mpi
def test_bad_fd_fails_on_every_rank(tmp_path) -> None:
    results = run_mpi(3, "fdpass_worker.py", "bad_fd", "2", out_dir=tmp_path).ok_results()
    errs = _errors(results)
    assert errs[0]["step"] == "fd exchange: listen"
    assert list(errs[0]["failures"]) == ["2"]
    assert "not an open file descriptor" in errs[0]["failures"]["2"]
    assert [e["cause"] for e in errs] == [None, None, "HandleExchangeError"]


def test_in_process_checks() -> None:
    from multicast import fdpass
    from multicast.bootstrap import make_bootstrap
    from multicast.errors import HandleExchangeError, PeerError
    from thread_bootstrap import OneRank

    bs = OneRank()
    assert make_bootstrap(bs) is bs
    with pytest.raises(TypeError, match="mpi4py communicator"):
        make_bootstrap("COMM_WORLD")
    bid = fdpass.boot_id()
    assert len(bid) == 36 and bid.count("-") == 4
    r, w = os.pipe()
    try:
        assert fdpass.exchange_fds(bs, r) == [None]
        with pytest.raises(ValueError, match="timeout"):
            fdpass.exchange_fds(bs, r, timeout=0)
    finally:
        os.close(r)
        os.close(w)
    with pytest.raises(PeerError, match="not an open file descriptor"):
        fdpass.exchange_fds(bs, r)  # closed just above
    ann = fdpass._Announcement("ab" * 16, 1234, 0, bid)
    assert fdpass._Announcement.decode(0, ann.encode()) == ann
    assert ann.address().startswith(b"\0")  # abstract namespace: nothing on disk
    with pytest.raises(HandleExchangeError, match="malformed socket name"):
        fdpass._Announcement.decode(3, fdpass._Announcement("../x", 1, 0, bid).encode())
    with pytest.raises(HandleExchangeError, match="malformed announcement"):
        fdpass._Announcement.decode(3, b"{not json")
