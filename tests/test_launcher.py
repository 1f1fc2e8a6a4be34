"""rsar_core.launcher's readers of a launcher's environment (Open MPI, MPICH / Hydra, PMIx,
torchrun; malformed values; started by hand), and what needs no second process."""
from __future__ import annotations

import socket

import pytest

from rsar_core import launcher as L
from script_runs import torch_sees_gpu

OMPI = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
HYDRA = {"PMI_SIZE": "8", "PMI_RANK": "5", "MPI_LOCALNRANKS": "4", "MPI_LOCALRANKID": "1"}
PMIX = {"PMIX_SIZE": "2", "PMIX_RANK": "1"}
TORCHRUN = {"WORLD_SIZE": "6", "RANK": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "3",
            "TORCHELASTIC_RUN_ID": "job"}


@pytest.mark.parametrize("env, torchrun, world, rank, local_world, local_rank", [
    (OMPI, False, 4, 3, 2, 1),
    (HYDRA, False, 8, 5, 4, 1),
    (PMIX, False, 2, 1, 2, 1),       # no local variables: the world, and the global rank
    (TORCHRUN, True, 6, 4, 3, 1),
    ({"WORLD_SIZE": "2", "RANK": "1"}, True, 2, 1, 2, 0),
    ({}, False, 1, 0, 1, 0),         # started by hand
    ({}, True, 1, 0, 1, 0),
])
def test_world_rank_local(env, torchrun, world, rank, local_world, local_rank):
    assert L.world_size(torchrun, env) == world
    assert L.rank(torchrun, env) == rank
    assert L.local_world_size(torchrun, env) == local_world
    assert L.local_rank(torchrun, env) == local_rank


def test_the_other_launchers_variables_are_not_read():
    assert L.world_size(True, OMPI) == 1 and L.rank(True, OMPI) == 0
    assert L.world_size(False, TORCHRUN) == 1 and L.rank(False, TORCHRUN) == 0


def test_malformed_values_fall_through_to_the_next_name():
    env = {"OMPI_COMM_WORLD_SIZE": "two", "PMI_SIZE": "", "PMIX_SIZE": "3"}
    assert L.world_size(False, env) == 3
    assert L.env_int(("A", "B"), 7, {"A": "x", "B": "1.5"}) == 7


def test_started_by_torchrun_and_who_prints():
    assert L.started_by_torchrun(TORCHRUN)
    assert not L.started_by_torchrun({**TORCHRUN, **OMPI})  # mpirun inside a torchrun job
    assert not L.started_by_torchrun(OMPI) and not L.started_by_torchrun({"RANK": "1"})
    # torchrun without the worker being told: its RANK still picks the one that prints
    assert L.printing_rank(False, TORCHRUN) == 4
    assert L.printing_rank(False, OMPI) == 3 and L.printing_rank(True, {}) == 0


@pytest.mark.parametrize("env, torchrun, count, want", [
    (OMPI, False, 2, 1),        # rank 3 of an mpirun job on a 2-GPU host: GPU 3 % 2
    (HYDRA, False, 8, 5),
    (TORCHRUN, True, 8, 1),     # LOCAL_RANK
    ({}, False, 0, 0),          # no GPU: still an index, never a division by zero
])
def test_gpu_index(env, torchrun, count, want):
    assert L.gpu_index(torchrun, count, env) == want


def test_free_port_can_be_bound():
    port = L.free_port()
    assert 1024 <= port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_distributed_hands_gemmrsar_the_mpi_communicator():
    comm = object()
    d = L.Distributed(rank=1, world=2, device="cpu", mpi_comm=comm)
    assert d.comm is comm


@pytest.mark.skipif(torch_sees_gpu(), reason="this host has a CUDA GPU")
def test_rank_on_gpu_refuses_plainly_without_gpus(capsys):
    pytest.importorskip("mpi4py")
    assert L.rank_on_gpu("probe.py") is None
    assert capsys.readouterr().out.strip() == (
        "probe.py needs 2+ ranks under mpirun, each with a CUDA GPU")
