"""Embedding and hardening on 2 GPUs: shared workspace, streams, leaks, a killed rank.

mpirun -n 2 python -m pytest -q tests/gpu/test_embedding_gpu.py
(the fault test starts its own two worker processes from rank 0.)
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from rsar_core import GemmRsAr, UnsupportedError, Workspace
from rsar_core.reference import rank_inputs, reference_sum, rel_error, rs_rows

DEV = lambda: torch.device("cuda", torch.cuda.current_device())  # noqa: E731


def _report(key: str, value) -> None:
    path = os.environ.get("RSAR_GPU_REPORT")
    if path and int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0"))) == 0:
        data = json.loads(Path(path).read_text()) if Path(path).exists() else {}
        data[key] = value
        Path(path).write_text(json.dumps(data, indent=1))


def _check(op: GemmRsAr, seed: int, M: int, K: int, y: torch.Tensor | None = None) -> None:
    x, w = rank_inputs(seed, op.rank, M, op.N, K, DEV())
    if y is None:
        y = op(x, w)
    torch.cuda.synchronize()
    op.check()
    ref = reference_sum(seed, op.world, M, op.N, K, DEV())
    if not op.all_reduce:
        ref = rs_rows(ref, op.rank, op.world)
    assert rel_error(y, ref) < 1e-2


def _free() -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def test_shared_workspace_rs_ar_and_two_N(comm):
    before = _free()
    sep = [GemmRsAr(4096, 7168, all_reduce=ar, comm=comm) for ar in (False, True)]
    separate = before - _free()
    for op in sep:
        op.close()
    before = _free()
    ws = Workspace(4096, 7168, comm)
    rs = GemmRsAr(4096, 7168, all_reduce=False, workspace=ws)
    ar = GemmRsAr(4096, 7168, all_reduce=True, workspace=ws)
    ar_small = GemmRsAr(2048, 4096, all_reduce=True, workspace=ws)
    shared = before - _free()
    _report("workspace_bytes", {"rs+ar separate": separate, "rs+ar(+1) shared": shared})
    assert shared < separate * 0.6
    for i in range(9):
        op = (rs, ar, ar_small)[i % 3]
        _check(op, seed=40 + i, M=(1000, 4096, 777)[i % 3], K=512)
    with pytest.raises(ValueError, match="workspace"):
        GemmRsAr(8192, 7168, workspace=ws)
    for op in (rs, ar, ar_small):
        op.close()
    assert not ws.closed  # frontends never close a workspace they were given
    ws.close()
    with pytest.raises(Exception):
        rs(*rank_inputs(1, 0, 128, 7168, 64, DEV()))


def test_backward_raises_where_autograd_records_the_inputs(comm):
    """A weight that is an nn.Parameter (requires_grad) outside no_grad: the result is right
    and its backward raises, instead of leaving the gradients silently empty."""
    with GemmRsAr(512, 384, all_reduce=True, comm=comm) as op:
        x, w = rank_inputs(61, op.rank, 300, op.N, 128, DEV())
        w = torch.nn.Parameter(w)
        y = op(x, w)
        assert y.requires_grad
        _check(op, seed=61, M=300, K=128, y=y.detach())
        with pytest.raises(UnsupportedError, match="no backward"):
            y.float().sum().backward()
        assert w.grad is None
        with torch.no_grad():
            y2 = op(x, w)
        assert not y2.requires_grad
        _check(op, seed=61, M=300, K=128, y=y2)  # the op is usable after the refusal


def test_two_instances_on_two_streams(comm):
    a = GemmRsAr(2048, 384, all_reduce=False, comm=comm)
    b = GemmRsAr(2048, 384, all_reduce=True, comm=comm)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    xa, wa = rank_inputs(5, a.rank, 2000, 384, 1024, DEV())
    xb, wb = rank_inputs(6, b.rank, 1500, 384, 1024, DEV())
    outs = []
    for _ in range(20):
        with torch.cuda.stream(s1):
            ya = a(xa, wa)
        with torch.cuda.stream(s2):
            yb = b(xb, wb)
        outs.append((ya, yb))
    torch.cuda.synchronize()
    for ya, yb in outs[-3:]:
        _check(a, 5, 2000, 1024, ya)
        _check(b, 6, 1500, 1024, yb)
    a.close()
    b.close()


def test_one_instance_from_two_streams(comm):
    op = GemmRsAr(2048, 384, comm=comm)
    order = op.workspace.order
    switches = order.switches
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    x, w = rank_inputs(8, op.rank, 1999, 384, 512, DEV())
    ys = []
    for i in range(30):
        with torch.cuda.stream(streams[i % 2]):
            ys.append(op(x, w))
    torch.cuda.synchronize()
    assert order.switches - switches >= 29
    for y in ys[-2:]:
        _check(op, 8, 1999, 512, y)
    op.close()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_create_close_cycles_do_not_leak(comm):
    GemmRsAr(128, 128, comm=comm).close()  # first use initialises caches
    fds, free = _open_fds(), _free()
    t0 = time.time()
    for _ in range(1000):
        op = GemmRsAr(128, 128, comm=comm)
        op.close()
    dt = time.time() - t0
    _report("create_close_1000", {"seconds": dt, "fd_delta": _open_fds() - fds,
                                  "free_bytes_delta": _free() - free})
    assert _open_fds() == fds
    assert abs(_free() - free) < 2 * 2**20


def _rank() -> int:
    for v in ("OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if v in os.environ:
            return int(os.environ[v])
    return 0


def test_killed_rank_is_reported_and_survivor_exits(comm):
    """kill -9 one rank mid-loop: the other raises RsarTimeoutError within the limit."""
    if _rank() != 0:
        comm.Barrier()
        return
    try:
        worker = Path(__file__).with_name("fault_worker.py")
        with tempfile.TemporaryDirectory() as d:
            init, prog = os.path.join(d, "init"), [os.path.join(d, f"p{r}") for r in range(2)]
            procs = [subprocess.Popen([sys.executable, str(worker), str(r), "2", init, prog[r]],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                     for r in range(2)]
            deadline = time.time() + 120
            while time.time() < deadline:
                done = [int(Path(p).read_text() or 0) if Path(p).exists() else -1 for p in prog]
                if min(done) >= 20 or any(pr.poll() is not None for pr in procs):
                    break
                time.sleep(0.1)
            assert all(pr.poll() is None for pr in procs), [pr.communicate()[0] for pr in procs]
            t_kill = time.time()
            os.kill(procs[1].pid, signal.SIGKILL)
            out, _ = procs[0].communicate(timeout=60)
            waited = time.time() - t_kill
            procs[1].wait()
            _report("fault", {"survivor_exit": procs[0].returncode, "seconds_to_exit": waited,
                              "message": out.strip().splitlines()[-1] if out.strip() else ""})
            assert procs[0].returncode == 17, out
            assert "timed out waiting for rank 1" in out
            assert waited < 2.0 * 3 + 10
    finally:
        comm.Barrier()


def test_out_buffer_and_warmup(comm):
    """``out=``: the result lands in the caller's (poisoned) buffer, a row range of a larger
    one too, on default and off-grid M; ``warmup`` compiles ahead, so the calls it prepared
    compile nothing; bad ``out`` raises before any launch and the op stays usable."""
    from launch.cache import CACHE
    ws = Workspace(2048, 7168, comm)
    ops = [GemmRsAr(2048, 7168, all_reduce=ar, workspace=ws) for ar in (False, True)]
    try:
        for op in ops:
            op.warmup([128, 1000, 2048], 4096)
            before = CACHE.compile_count
            for seed, M in enumerate((128, 1000, 2048)):
                rows = M if op.all_reduce else -(-M // op.world)
                big = torch.full((rows + 16, op.N), float("nan"), dtype=torch.bfloat16,
                                 device=DEV())
                out = big[8: 8 + rows]
                y = op(*rank_inputs(seed, op.rank, M, op.N, 4096, DEV()), out=out)
                assert y.data_ptr() == out.data_ptr()
                _check(op, seed, M, 4096, y)
                assert big[:8].isnan().all() and big[8 + rows:].isnan().all()
            assert CACHE.compile_count == before
            x, w = rank_inputs(9, op.rank, 256, op.N, 4096, DEV())
            with pytest.raises(ValueError, match="shape"):
                op(x, w, out=torch.empty(7, op.N, dtype=torch.bfloat16, device=DEV()))
            _check(op, 10, 256, 4096)
    finally:
        for op in ops:
            op.close()
        ws.close()
    _report("out_and_warmup", "ok")


def test_max_m_below_one_tile(comm):
    """A decode-only op (max_M < 128): the workspace holds one tile row; every M up to
    max_M is exact, and M past it is refused before any launch."""
    for ar in (False, True):
        with GemmRsAr(16, 7168, all_reduce=ar, comm=comm) as op:
            for seed, M in enumerate((1, 7, 16)):
                _check(op, 20 + seed, M, 1024)
            x, w = rank_inputs(30, op.rank, 17, op.N, 1024, DEV())
            with pytest.raises(ValueError, match="max_M=16"):
                op(x, w)
            _check(op, 31, 16, 1024)
    _report("max_m_below_one_tile", "ok")


def test_out_buffers_in_a_cuda_graph(comm):
    """``out=`` inside a captured graph: every replay writes the same caller buffers, RS and
    AR interleaved, with fresh inputs copied in before each replay."""
    ws = Workspace(1024, 7168, comm)
    ops = [GemmRsAr(1024, 7168, all_reduce=ar, workspace=ws) for ar in (False, True)]
    try:
        shapes = [(ops[0], 300, 1024), (ops[1], 1000, 512), (ops[0], 64, 4096)]
        xs, wts, outs = [], [], []
        for op, M, K in shapes:
            xs.append(torch.empty(M, K, dtype=torch.bfloat16, device=DEV()))
            wts.append(torch.empty(op.N, K, dtype=torch.bfloat16, device=DEV()))
            rows = M if op.all_reduce else -(-M // op.world)
            outs.append(torch.empty(rows, op.N, dtype=torch.bfloat16, device=DEV()))
        for op, M, K in shapes:
            op.warmup([M], K)
        torch.cuda.synchronize()
        comm.Barrier()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i, (op, M, K) in enumerate(shapes):
                op(xs[i], wts[i], out=outs[i])
        for rep in range(5):
            for i, (op, M, K) in enumerate(shapes):
                x, w = rank_inputs(700 + 3 * rep + i, op.rank, M, op.N, K, DEV())
                xs[i].copy_(x)
                wts[i].copy_(w)
                outs[i].fill_(float("nan"))
            g.replay()
            for i, (op, M, K) in enumerate(shapes):
                _check(op, 700 + 3 * rep + i, M, K, outs[i])
    finally:
        for op in ops:
            op.close()
        ws.close()
    _report("out_in_graph", "ok")
