"""Bootstrap collectives across real processes: mpi4py under mpiexec, torch gloo."""
from __future__ import annotations

import os

import pytest

from mpirun import run_mpi

def check_exercise(res: dict, rank: int, world: int) -> None:
    """What tests/mpi/bootstrap_worker.py's exercise() must have seen on one rank."""
    assert (res["rank_seen"], res["world_seen"]) == (rank, world)
    assert res["allgather_ok"] is True
    assert res["broadcast_ok"] == [True] * world
    # The last rank sleeps 0.4 s before the barrier; nobody may leave it before it arrives.
    assert res["barrier_held"] is True
    assert res["allgather_rejects_str"] and res["broadcast_rejects_bad_root"]
    assert res["agree_result"] == rank * 10 + 1
    assert res["all_true_all"] is True
    assert res["all_true_one_false"] is False


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.mpi
def test_mpi_bootstrap_collectives(n: int, tmp_path) -> None:
    results = run_mpi(n, "bootstrap_worker.py", "mpi_collectives", out_dir=tmp_path).ok_results()
    for rank, res in enumerate(results):
        check_exercise(res, rank, n)
        assert res["make_none_is_mpi"] and res["make_comm_is_mpi"]
        assert res["make_bootstrap_identity"] and res["make_rejects_object"]
        # Split by parity: rank numbering restarts inside each half.
        half = len(range(rank % 2, n, 2))
        check_exercise(res["sub"], rank // 2, half)


@pytest.mark.mpi
def test_torch_bootstrap_gloo(tmp_path) -> None:
    pytest.importorskip("torch.distributed")
    init = tmp_path / "init"
    # Loopback keeps gloo independent of how (or whether) the host name resolves.
    env = {"GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    run = run_mpi(2, "bootstrap_worker.py", "torch_gloo", str(init),
                  out_dir=tmp_path / "out", timeout=90, env=env)
    results = run.ok_results()
    for rank, res in enumerate(results):
        check_exercise(res, rank, 2)
        check_exercise(res["default_group"], rank, 2)
        assert res["make_group_is_torch"] is True
        assert res["mpi_not_loaded"] is True  # a torch job never initialises MPI
        assert res["fd_contents_ok"] == [True, True] and res["fd_own_slot_none"]
        err = res["agree_failure"]
        assert err is not None and err["step"] == "torch failing step"
        assert list(err["failures"]) == ["1"] and "ZeroDivisionError" in err["failures"]["1"]
        assert err["cause"] == ("ZeroDivisionError" if rank == 1 else None)
    # The group holding only global rank 1: its root 0 must map to global rank 1.
    assert "solo" not in results[0]
    check_exercise(results[1]["solo"], 0, 1)


def test_no_comm_under_torchrun_takes_torch_default_group(monkeypatch) -> None:
    """comm=None in a process MPI sees alone, with torch.distributed initialised over more
    ranks (a torchrun launch): the default torch group, not a one-rank MPI world."""
    import sys
    import types

    import torch
    import torch.distributed  # noqa: F401  (the real one loaded before it is replaced)

    from multicast.bootstrap import MpiBootstrap, TorchBootstrap, make_bootstrap
    fake = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True,
                                 get_world_size=lambda group=None: 2,
                                 get_rank=lambda group=None: 1)
    monkeypatch.setitem(sys.modules, "torch.distributed", fake)
    monkeypatch.setattr(torch, "distributed", fake)
    bs = make_bootstrap(None)
    assert isinstance(bs, TorchBootstrap) and (bs.rank, bs.world, bs.group) == (1, 2, None)
    fake.is_initialized = lambda: False  # no torch group: MPI's world, as before
    assert isinstance(make_bootstrap(None), MpiBootstrap)


def test_one_rank_is_refused_with_how_to_launch() -> None:
    from rsar_core import RsarValueError
    from rsar_core.validate import check_construction
    with pytest.raises(RsarValueError, match="mpirun -n N, or pass their torch.distributed"):
        check_construction(256, 7168, 1)
