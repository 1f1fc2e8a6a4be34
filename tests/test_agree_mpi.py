"""Failure agreement: one rank's failure reaches every rank, which all raise in time."""
from __future__ import annotations

import pytest

from mpirun import run_mpi
from thread_bootstrap import OneRank

LIMIT_S = 5.0  # the failing step takes 0.5 s; agreement must add little to that


@pytest.mark.parametrize(
    "n, failing, timing",
    [(2, "1", "early"), (2, "0", "late"), (3, "1", "early"), (3, "2", "late"), (4, "0,3", "early")],
)
@pytest.mark.mpi
def test_every_rank_raises_the_same_peer_error(n: int, failing: str, timing: str, tmp_path) -> None:
    bad = {int(x) for x in failing.split(",")}
    run = run_mpi(n, "agree_worker.py", "fail", failing, timing, out_dir=tmp_path, timeout=30)
    results = run.ok_results()
    for r, res in enumerate(results):
        assert res["one"] == 2 * r  # steps before the failure returned fn's result
        err = res["error"]
        assert err is not None, f"rank {r} did not raise: {res}"
        assert err["step"] == "two"
        assert err["failures"] == {str(b): f"StepFailed: step two broke on rank {b}" for b in sorted(bad)}
        assert err["elapsed"] < LIMIT_S
        if r in bad:
            # The local exception is chained; nothing to undo where fn raised.
            assert err["cause"] == "StepFailed" and res["undone"] == []
        else:
            # Succeeded here, failed elsewhere: what fn acquired was handed to undo.
            assert err["cause"] is None and res["undone"] == [100 + r]
        assert res["three"] == 1000 + r  # the next step still lines up on every rank
        assert res["all_true_all"] is True and res["all_true_without_failing"] is False


def test_agree_in_process() -> None:
    from multicast.agree import agree, all_true
    from multicast.errors import PeerError

    bs = OneRank()
    assert agree(bs, "fine", lambda: 42) == 42
    with pytest.raises(PeerError) as info:
        agree(bs, "broken", lambda: 1 / 0)
    assert info.value.step == "broken"
    assert info.value.failures == {0: "ZeroDivisionError: division by zero"}
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert all_true(bs, True) is True and all_true(bs, False) is False


def test_launcher_missing_skips(monkeypatch, tmp_path) -> None:
    import mpirun

    monkeypatch.setenv("RSAR_MPIEXEC", str(tmp_path / "no-such-mpiexec"))
    assert mpirun.find_mpiexec() is None
    with pytest.raises(pytest.skip.Exception):
        mpirun.run_mpi(2, "agree_worker.py", "fail", "0", "early", out_dir=tmp_path)
