"""rsar::gemm_rsar on real GPUs: torch.compile, CUDA graphs, opcheck.

    mpirun -n 2 python3 -m pytest -q tests/gpu/test_torch_op_gpu.py

Every rank makes the same op calls in the same order (the op is collective); checks are
collected per rank and gathered before asserting, so a failed check never leaves the peer
waiting in a later call. The ops get a longer timeout than the default: the first call of
a compiled module compiles first, and the ranks need not finish compiling together.
"""
from __future__ import annotations

import pytest
import torch

from rsar_core import GemmRsAr
from rsar_core.reference import rank_inputs, reference_sum, rel_error, rs_rows
from rsar_core.torch_op import RowParallelLinear, unregister

MAX_M = 2048
N = 384
TOL = 1e-2
TIMEOUT_S = 30.0
_OPS: dict = {}


def get_op(comm, ar: bool) -> GemmRsAr:
    if ar not in _OPS:
        _OPS[ar] = GemmRsAr(max_M=MAX_M, N=N, all_reduce=ar, comm=comm, timeout_s=TIMEOUT_S)
    return _OPS[ar]


@pytest.fixture(scope="module", autouse=True)
def _setup_and_close():
    import torch._inductor.config as inductor_config
    torch._dynamo.reset()
    # Two tiny Triton kernels: compiling them in-process beats starting a worker pool.
    with inductor_config.patch(compile_threads=1):
        yield
    torch._dynamo.reset()
    for op in _OPS.values():
        unregister(op)
        op.close()
    _OPS.clear()


def _dev() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def _reference(op: GemmRsAr, seed: int, M: int, K: int) -> torch.Tensor:
    ref = reference_sum(seed, op.world, M, op.N, K, _dev())
    return ref if op.all_reduce else rs_rows(ref, op.rank, op.world)


def _gathered(comm, errors: list[str]) -> None:
    every = comm.allgather(errors)
    bad = [f"rank {r}: {e}" for r, errs in enumerate(every) for e in errs]
    assert not bad, "\n".join(bad)


class Block(torch.nn.Module):
    """Inductor kernels before and after the op: x * 2 -> op -> * 0.5 (both exact)."""

    def __init__(self, op: GemmRsAr, weight: torch.Tensor) -> None:
        super().__init__()
        self.proj = RowParallelLinear(op, weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x * 2).float() * 0.5


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
def test_opcheck(comm, ar):
    """torch.library.opcheck on the real kernel: fake vs real shapes/strides, schema."""
    op = get_op(comm, ar)
    layer = RowParallelLinear(op, torch.empty(N, 128, dtype=torch.bfloat16, device=_dev()))
    x, w = rank_inputs(5, op.rank, 77, N, 128, _dev())
    errors = []
    try:
        torch.library.opcheck(torch.ops.rsar.gemm_rsar.default, (x, w, layer.handle))
    except Exception as e:  # noqa: BLE001 - gathered, then raised on every rank
        errors.append(f"opcheck: {type(e).__name__}: {e}")
    torch.cuda.synchronize()
    op.check()
    _gathered(comm, errors)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
def test_compiled_matches_eager_and_reference(comm, ar):
    """torch.compile(fullgraph=True, dynamic=True): one graph for all M; bitwise equal to a
    direct GemmRsAr call, and within TOL of the float32 reference."""
    from torch._dynamo.testing import CompileCounterWithBackend
    op = get_op(comm, ar)
    dev = _dev()
    K = 256
    block = Block(op, torch.empty(N, K, dtype=torch.bfloat16, device=dev))
    cnt = CompileCounterWithBackend("inductor")
    compiled = torch.compile(block, backend=cnt, fullgraph=True, dynamic=True)
    errors = []
    for M in (77, 256, 1000, 129, MAX_M):
        seed = 4000 + M
        x, w = rank_inputs(seed, op.rank, M, N, K, dev)
        with torch.no_grad():
            block.proj.weight.copy_(w)
        got = compiled(x)
        eager = op(x * 2, w).float() * 0.5
        torch.cuda.synchronize()
        op.check()
        ref = _reference(op, seed, M, K)
        if got.shape != ref.shape:
            errors.append(f"M={M}: compiled shape {tuple(got.shape)} != {tuple(ref.shape)}")
            continue
        if not torch.equal(got, eager):
            errors.append(f"M={M}: compiled differs from eager by "
                          f"{(got - eager).abs().max().item():.3g}")
        err = rel_error(got, ref)
        if not err < TOL:
            errors.append(f"M={M}: rel error {err:.3g}")
    if cnt.frame_count != 1:
        errors.append(f"{cnt.frame_count} graphs compiled for 5 values of M (want 1)")
    _gathered(comm, errors)


def test_cuda_graph_replay(comm):
    """RS and AR layers called through the custom op inside one captured CUDA graph, replayed
    10 times with fresh inputs and weights copied in."""
    rs, ar = get_op(comm, False), get_op(comm, True)
    dev = _dev()
    cases = [(rs, 77, 128), (ar, 1000, 192), (rs, 256, 64)]
    layers = [RowParallelLinear(op, torch.empty(N, K, dtype=torch.bfloat16, device=dev))
              for op, _, K in cases]
    xs = [torch.empty(M, K, dtype=torch.bfloat16, device=dev) for _, M, K in cases]

    def fill(seed0: int) -> None:
        with torch.no_grad():
            for i, (op, M, K) in enumerate(cases):
                x, w = rank_inputs(seed0 + i, op.rank, M, N, K, dev)
                xs[i].copy_(x)
                layers[i].weight.copy_(w)

    fill(7000)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for layer, x in zip(layers, xs):  # warm-up (kernel compiles) outside the capture
            layer(x)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    comm.Barrier()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ys = [layer(x) for layer, x in zip(layers, xs)]
    errors = []
    for rep in range(10):
        seed0 = 8000 + rep * len(cases)
        fill(seed0)
        g.replay()
        torch.cuda.synchronize()
        rs.check()
        ar.check()
        for i, (op, M, K) in enumerate(cases):
            err = rel_error(ys[i], _reference(op, seed0 + i, M, K))
            if not err < TOL:
                errors.append(f"replay {rep} call {i}: rel error {err:.3g}")
    _gathered(comm, errors)


def test_compiled_reduce_overhead(comm):
    """torch.compile(mode="reduce-overhead"): Inductor's own CUDA graphs around the op."""
    from torch._dynamo.utils import counters
    op = get_op(comm, False)
    dev = _dev()
    M, K = 300, 128
    block = Block(op, torch.empty(N, K, dtype=torch.bfloat16, device=dev))
    compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True, dynamic=False)
    skips0 = counters["inductor"]["cudagraph_skips"]
    errors = []
    for step in range(6):  # warm-up, record, then replays
        seed = 9000 + step
        x, w = rank_inputs(seed, op.rank, M, N, K, dev)
        with torch.no_grad():
            block.proj.weight.copy_(w)
        got = compiled(x).clone()
        torch.cuda.synchronize()
        op.check()
        err = rel_error(got, _reference(op, seed, M, K))
        if not err < TOL:
            errors.append(f"step {step}: rel error {err:.3g}")
    if counters["inductor"]["cudagraph_skips"] != skips0:
        errors.append("Inductor skipped CUDA graphs for the block")
    _gathered(comm, errors)


@pytest.mark.parametrize("ar", [False, True], ids=["rs", "ar"])
def test_bias_layer_compiled_and_in_a_graph(comm, ar):
    """RowParallelLinear with a bias: opcheck with the bias argument, torch.compile
    (fullgraph, dynamic) bitwise equal to a direct call with bias=, within TOL of the
    float32 reference plus the bias, and a captured CUDA graph replayed with fresh inputs."""
    op = get_op(comm, ar)
    dev = _dev()
    K = 192
    g = torch.Generator(device=dev)
    g.manual_seed(77)
    bias = (torch.randn(N, generator=g, device=dev) * 2).to(torch.bfloat16)
    layer = RowParallelLinear(op, torch.empty(N, K, dtype=torch.bfloat16, device=dev), bias=bias)
    errors = []
    x, w = rank_inputs(9100, op.rank, 77, N, K, dev)
    try:
        torch.library.opcheck(torch.ops.rsar.gemm_rsar.default, (x, w, layer.handle, bias))
    except Exception as e:  # noqa: BLE001 - gathered, then raised on every rank
        errors.append(f"opcheck: {type(e).__name__}: {e}")
    compiled = torch.compile(layer, fullgraph=True, dynamic=True)
    for M in (77, 1000):
        seed = 9200 + M
        x, w = rank_inputs(seed, op.rank, M, N, K, dev)
        with torch.no_grad():
            layer.weight.copy_(w)
        got = compiled(x)
        direct = op(x, w, bias=bias)
        torch.cuda.synchronize()
        op.check()
        ref = reference_sum(seed, op.world, M, N, K, dev) + bias.float()
        ref = ref if ar else rs_rows(ref, op.rank, op.world)
        if not torch.equal(got, direct):
            errors.append(f"M={M}: compiled differs from the direct call")
        rows = M if ar else max(0, min(got.shape[0], M - op.rank * got.shape[0]))
        err = rel_error(got[:rows], ref[:rows])
        if not err < TOL:
            errors.append(f"M={M}: rel error {err:.3g}")
    M = 256
    xs = torch.empty(M, K, dtype=torch.bfloat16, device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        layer(xs.normal_())  # the variant compiles outside the capture
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    comm.Barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = layer(xs)
    for rep in range(3):
        seed = 9300 + rep
        x, w = rank_inputs(seed, op.rank, M, N, K, dev)
        with torch.no_grad():
            xs.copy_(x)
            layer.weight.copy_(w)
        graph.replay()
        torch.cuda.synchronize()
        op.check()
        ref = reference_sum(seed, op.world, M, N, K, dev) + bias.float()
        ref = ref if ar else rs_rows(ref, op.rank, op.world)
        err = rel_error(y, ref)
        if not err < TOL:
            errors.append(f"replay {rep}: rel error {err:.3g}")
    _gathered(comm, errors)
