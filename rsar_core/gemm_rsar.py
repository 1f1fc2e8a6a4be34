"""GemmRsAr: the public front door of the fused GEMM + reduce-scatter / all-reduce."""
from __future__ import annotations

import functools
import logging
import os
from typing import Any, Iterable

import torch

from launch import protocol
from launch.cache import CACHE
from launch.geometry import BLACKWELL, TilePlan, plan_depth
from launch.resolve import Dtypes, Hardware, Shape, resolve
from launch.tuning import Tuning
from multicast.bootstrap import make_bootstrap

from . import heuristics
from .errors import (ClosedError, RsarTimeoutError, RsarValueError, ShapeMismatchError,
                     UnsupportedError)
from .ordering import raw_stream
from .validate import (DTYPES, IN_DTYPES, agree_hardware, check_arch_width, check_bias,
                       check_call, check_construction, check_dtype, check_input_dtype, check_out,
                       check_scales, check_tuning, check_warmup, check_weight, weight_of,
                       SCALE_BLOCK)
from .workspace import Workspace

log = logging.getLogger("rsar")

KERNEL_ARCHS = ("sm_90a",) + BLACKWELL  # arches launch/ has a kernel for
DEFAULT_TIMEOUT_S = 5.0


def timeout_from_env() -> float:
    """``RSAR_TIMEOUT_S`` (seconds, default 5), read when an op is built, so a worker may set
    it after importing rsar."""
    raw = os.environ.get("RSAR_TIMEOUT_S", "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        return float(raw)
    except ValueError:
        raise RsarValueError(f"RSAR_TIMEOUT_S must be a number of seconds, got {raw!r}") from None


def kernel_arch_for(capability: tuple[int, int]) -> str | None:
    """The kernel target for a compute capability, or None when rsar has no kernel for it."""
    major, minor = capability
    if (major, minor) == (9, 0):
        return "sm_90a"
    if major == 10 and f"sm_10{minor}a" in BLACKWELL:
        return f"sm_10{minor}a"
    return None


class _NoBackward(torch.autograd.Function):
    """Marks a result computed outside autograd: backward raises instead of leaving the
    inputs' gradients silently empty (a row-parallel backward needs an all-gather)."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        raise UnsupportedError(
            "rsar's fused op has no backward (it is for inference): call it under "
            "torch.no_grad() / torch.inference_mode(), or detach x and w")


def inference_only(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                   bias: torch.Tensor | None = None) -> torch.Tensor:
    """``y``, or where autograd would record ``x`` / ``w`` / ``bias`` a view of it whose
    backward raises UnsupportedError (as a torch custom op without an autograd formula does)."""
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or (
            bias is not None and bias.requires_grad)):
        return _NoBackward.apply(y, x, w, bias)
    return y


def _pair_ctas(device_index: int, sm_count: int) -> int:
    """CTAs resident at once as 2x1 clusters at one CTA per SM: the GPC layout can fit
    fewer than the SM count, and every CTA of a persistent grid must be resident."""
    return _cluster_ctas(device_index, sm_count, 2)


@functools.lru_cache(maxsize=None)
def _cluster_ctas(device_index: int, sm_count: int, size: int) -> int:
    """CTAs resident at once as clusters of ``size`` along M (2, or 4 for ``Tuning(
    cta_group=4)``) at one CTA per SM."""
    try:
        from launch.occupancy import max_active_clusters
        return size * max_active_clusters(device_index, size)
    except Exception as e:
        log.warning("cluster occupancy probe failed (%s); asking the CuTe DSL (compiles a "
                    "kernel)", e)
    try:
        from cutlass.utils import HardwareInfo
        return size * HardwareInfo(device_index).get_max_active_clusters(size)
    except Exception as e:  # the 1-CTA plans are unaffected; be conservative
        log.warning("cluster occupancy query failed (%s): %dx1-cluster plans use half the "
                    "SMs", e, size)
        return sm_count // 2


def _arch_of(device: torch.device) -> str | None:
    """Arch-specific ("a") cubins run only on their own compute capability: sm_90a on 9.0
    (H100/H200), sm_100a on 10.0 (B200/GB200), sm_103a (the same sm100 source) on 10.3
    (B300/GB300)."""
    return kernel_arch_for(tuple(torch.cuda.get_device_capability(device)))


class GemmRsAr:
    """y = reduce_scatter(x @ w.T) or all_reduce(x @ w.T) over the ranks of ``comm``, one launch.

    ``comm``: an mpi4py communicator, a torch.distributed ProcessGroup, or None (MPI
    COMM_WORLD). Construction, calls and ``close()`` are collective: every rank makes the
    same calls with the same M and K, in the same order. The op runs on the current CUDA
    device and the current torch stream.

    ``dtype``: the element type of x, w and the result, torch.bfloat16 or torch.float16
    (the kernel accumulates and reduces in fp32 either way). ``input_dtype``
    torch.float8_e4m3fn: x and w are fp8 and each call takes their fp32 scales; the
    result stays ``dtype`` (see ``__call__``). ``timeout_s``: how long the
    kernel waits for a peer before the call fails with ``RsarTimeoutError`` (default:
    ``RSAR_TIMEOUT_S``, else 5 s). ``workspace``: a ``Workspace`` to share with other ops
    (its ``comm`` is then used; ops of either dtype can share one). ``tuning``: a
    ``Tuning`` overriding the measured rules (docs/TUNING.md; default: the rules decide),
    the same on every rank (checked here).
    """

    def __init__(self, max_M: int, N: int, all_reduce: bool = False, comm: Any = None, *,
                 dtype: torch.dtype = torch.bfloat16, input_dtype: torch.dtype | None = None,
                 timeout_s: float | None = None,
                 workspace: Workspace | None = None, tuning: Tuning | None = None) -> None:
        self._ws: Workspace | None = None
        self._on_close: list = []  # callables close() runs once (rsar_core.torch_op unregisters)
        self._owns_ws = workspace is None
        self._broken: RsarTimeoutError | None = None
        if workspace is not None:
            bs = workspace.bootstrap
        else:
            bs = make_bootstrap(comm)
        check_construction(max_M, N, bs.world)
        check_dtype(dtype)
        self.dtype = dtype
        self.input_dtype = input_dtype if check_input_dtype(input_dtype, dtype) else dtype
        self.tuning: Tuning = check_tuning(tuning, bs)
        if timeout_s is None:
            timeout_s = timeout_from_env()
        if not timeout_s > 0:
            raise RsarValueError(f"timeout_s must be > 0, got {timeout_s}")
        if not torch.cuda.is_available():
            raise UnsupportedError("GemmRsAr needs a CUDA device; none is visible")
        self.max_M, self.N, self.all_reduce = max_M, N, bool(all_reduce)
        self.rank, self.world = bs.rank, bs.world
        self.mode = "ar" if self.all_reduce else "rs"
        self.device = torch.device("cuda", torch.cuda.current_device())
        arch = _arch_of(self.device)
        sm_count = torch.cuda.get_device_properties(self.device).multi_processor_count
        torch.empty(1, device=self.device)  # the occupancy probe needs the device's context
        self.arch, self.sm_count, self._pairs = agree_hardware(
            bs, arch, sm_count, _pair_ctas(self.device.index, sm_count))
        check_arch_width(N, self.arch)
        self.timeout_ns = int(timeout_s * 1e9)
        if workspace is not None:
            why = "the workspace is closed" if workspace.closed else workspace.fits(
                max_M, N, self.world, self.device)
            if why:
                raise RsarValueError(f"cannot share this workspace: {why}")
            self._ws = workspace
        else:
            self._ws = Workspace(max_M, N, bs)
        self.transport = self._ws.transport
        self._timeout_s = timeout_s
        self._plans: dict[tuple, tuple[TilePlan, Any, tuple[int, ...]]] = {}
        log.debug("GemmRsAr rank %d/%d %s max_M=%d N=%d arch=%s transport=%s workspace=%s",
                  self.rank, self.world, self.mode, max_M, N, self.arch, self.transport,
                  "own" if self._owns_ws else "shared")

    @property
    def _in_name(self) -> str:
        """The kernels' name of the operand type: "" (x and w are ``dtype``) or "e4m3"."""
        return IN_DTYPES.get(self.input_dtype, "")

    @property
    def workspace(self) -> Workspace:
        """The symmetric workspace this op launches on (its own, or the one it shares);
        ``workspace.mem.policy_reason`` says why the op runs on ``transport``."""
        self._require_open()
        return self._ws

    # ------------------------------------------------------------------ queries
    def can_run(self, w: Any) -> bool:
        """Whether ``w`` (an (N, K) tensor or a module with ``.weight``) is usable here."""
        if self._ws is None or self._ws.closed or self.arch not in KERNEL_ARCHS:
            return False
        try:
            check_weight(weight_of(w), self.N, self.device, self.input_dtype)
        except (TypeError, ValueError):
            return False
        return True

    def should_run(self, x: torch.Tensor) -> bool:
        """Whether the fused op is expected to beat torch.mm + NCCL for this x."""
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            return False
        M, K = x.shape
        return 0 < M <= self.max_M and heuristics.fused_wins(
            self.mode, M, self.N, plan_depth(K, self._in_name), self.world)

    def retune(self, tuning: Tuning | None = None, **changes: Any) -> "GemmRsAr":
        """An op like this one on the same workspace, with ``tuning`` (default: this op's)
        changed by ``changes`` (``Tuning`` fields): how benchmarks compare plans and
        experiments. Collective, as construction is; closing it leaves the workspace open."""
        self._require_open()
        base = self.tuning if tuning is None else tuning
        return GemmRsAr(self.max_M, self.N, self.all_reduce, dtype=self.dtype,
                        input_dtype=None if self.input_dtype == self.dtype else self.input_dtype,
                        timeout_s=self._timeout_s, workspace=self._ws,
                        tuning=base.replace(**changes) if changes else base)

    @property
    def pair_ctas(self) -> int:
        """CTAs resident at once as 2x1 clusters, the least over the ranks (each rank's GPU
        queried once per process, agreed at construction)."""
        return self._pairs

    @property
    def quad_ctas(self) -> int:
        """CTAs resident at once as 4x1 clusters on this GPU (queried once per process)."""
        return _cluster_ctas(self.device.index, self.sm_count, 4)

    def _hardware(self) -> Hardware:
        # Plans that can pick 2x1 clusters need the occupancy query (once per process, ~ms)
        pairs = self.arch in BLACKWELL or self.tuning.cta_group != 1
        # and those that can pick 4x1 clusters (``choose_gemm_quads``, sm90), of 4x1 clusters
        quads = self.arch == "sm_90a" and self.tuning.cta_group in (None, 4)
        return Hardware(self.arch or "", self.sm_count, self.pair_ctas if pairs else None,
                        self.quad_ctas if quads else None)

    def _resolve(self, M: int, K: int, mode: str, block: bool = False,
                 bias: bool = False) -> tuple[TilePlan, Any]:
        return resolve(Shape(M, self.N, K, mode, bias), self._hardware(), self.world,
                       self.transport, Dtypes(DTYPES[self.dtype], self._in_name, block),
                       self.tuning)

    def plan(self, M: int, K: int, mode: str | None = None, *, block: bool = False) -> TilePlan:
        """The tile plan a call with this (M, K) runs (``mode``: default the op's own;
        ``block``: fp8 block-wise scales). For fp8 operands its ``K`` is
        ``launch.geometry.plan_depth``'s, half the call's."""
        return self._resolve(M, K, mode or self.mode, block)[0]

    def variant(self, M: int, K: int, mode: str | None = None, *, block: bool = False,
                bias: bool = False) -> Any:
        """The kernel variant (``launch.Variant``) a call with this (M, K) launches."""
        return self._resolve(M, K, mode or self.mode, block, bias)[1]

    # ------------------------------------------------------------------ the op
    def __call__(self, x: torch.Tensor, w: Any, x_scale: torch.Tensor | None = None,
                 w_scale: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
        """The fused op on this rank's ``x`` (M, K) and ``w`` (N, K) (or a module with
        ``.weight``), of the op's ``input_dtype``, on the current stream: RS returns this
        rank's (ceil(M / world), N) shard of sum_r x_r @ w_r.T (rows past M zero), AR all of
        it, (M, N), on every rank, of the op's ``dtype``. A fresh tensor, or ``out`` (that
        dtype, contiguous, shape, on this device, sharing no byte with the inputs) filled and
        returned. Collective: every rank calls with the same M and K. Bad input raises
        RsarValueError / RsarTypeError before any launch. Inference only: where autograd
        records x, w or bias, the result's backward raises UnsupportedError.

        fp8 ops (``input_dtype=torch.float8_e4m3fn``) need ``x_scale`` and ``w_scale``,
        float32 on this device: one value each, or one per row of x (M) / per row of w (N).
        Each rank's partial is then (x_scale * x) @ (w_scale * w).T, rounded to ``dtype``
        before the sum, as torch._scaled_mm followed by a collective computes it; the
        tensor cores accumulate fp8 products at their own precision (cuBLAS's fast
        accumulation). K is then a multiple of 128.

        Block-wise scales (DeepSeek-V3 style, sm90): ``x_scale`` (M, K / 128), one per row
        of x and 128-element k-group, row-major or M-major (stride (1, S), S >= M: torch's
        BlockWise1x128 layout); ``w_scale`` (ceil(N / 128), K / 128), one per 128 x 128
        block of w, row-major or column-major. Each k-group's products are then summed in
        fp32 times their two scales (as torch's BlockWise1x128 x BlockWise128x128 scaled_mm
        does), on tiles 128 wide (``Tuning.bn`` 64 or 128).

        ``bias``: (N,) of the op's ``dtype``, contiguous, 16-byte aligned, on this device;
        added once, in fp32, to the reduced sum before its rounding (as Megatron's
        RowParallelLinear and torch._scaled_mm(bias=) add it): sum_r x_r @ w_r.T + bias, RS
        rows past M still zero. Such calls run their own kernel variants
        (``warmup(..., bias=True)``), so every rank passes a bias or none at the same call,
        and the same values: a sum may be taken on any rank, with that rank's bias."""
        self._require_open()
        self._require_kernel()
        check_call(x, w, self.max_M, self.N, self.device, self.input_dtype)
        M, K = x.shape
        bits = check_scales(x_scale, w_scale, M, self.N, self.device, self._in_name, K)
        block = self._check_block(bits)
        if bias is not None:
            check_bias(bias, self.N, self.device, self.dtype)
        self.check()
        w = weight_of(w)
        prepared = self._prepare(M, K, self.mode, block=block, bias=bias is not None)
        rows = M if self.all_reduce else prepared[0].local_M
        if out is None:
            y = torch.empty((rows, self.N), dtype=self.dtype, device=self.device)
        else:
            check_out(out, (rows, self.N), self.device, x, w, self.dtype,
                      extra=(("x_scale", x_scale), ("w_scale", w_scale), ("bias", bias)))
            y = out
        self._launch_prepared(prepared, x, w, y, x_scale, w_scale, bits, bias)
        return inference_only(y, x, w, bias)

    def gemm_only(self, x: torch.Tensor, w: Any, x_scale: torch.Tensor | None = None,
                  w_scale: torch.Tensor | None = None) -> torch.Tensor:
        """x @ w.T (M, N) by the same kernel with the communication compiled out (fp8 ops:
        scaled, as ``__call__`` says).

        Not collective; for benchmarks that separate the GEMM from the exchange (its
        plan follows the op's ``tuning`` too: ``retune(epi_slots=..., band=...)``).
        """
        self._require_open()
        self._require_kernel()
        check_call(x, w, self.max_M, self.N, self.device, self.input_dtype)
        M, K = x.shape
        bits = check_scales(x_scale, w_scale, M, self.N, self.device, self._in_name, K)
        block = self._check_block(bits)
        w = weight_of(w)
        prepared = self._prepare(M, K, "gemm", block=block)
        y = torch.empty((M, self.N), dtype=self.dtype, device=self.device)
        self._launch_prepared(prepared, x, w, y, x_scale, w_scale, bits)
        return inference_only(y, x, w)

    def warmup(self, Ms: Iterable[int], K: int, *, block_scales: bool = False,
               bias: bool = False) -> None:
        """Plan the calls of these M at this K and compile their kernels (or load them from
        the kernel cache, ``RSAR_KERNEL_CACHE``), without launching anything: a serving
        stack calls it at start-up with its batch sizes, so that no request waits on a
        compile. Collective, like the calls it prepares (every rank, the same Ms and K);
        bad values raise RsarValueError before anything is compiled. ``block_scales``: the
        calls will pass block-wise fp8 scales; ``bias``: they will pass ``bias=`` (the
        kernels of either differ)."""
        self._require_open()
        self._require_kernel()
        Ms = check_warmup(Ms, K, self.max_M, self._in_name)
        block = self._check_block(SCALE_BLOCK if block_scales else 0)
        for M in Ms:
            self._prepare(M, K, self.mode, block=block, bias=bool(bias))

    def _check_block(self, bits: int) -> bool:
        """Whether a call's scale bits are block-wise (``launch.resolve`` checks that this op
        can run them)."""
        return bool(bits & SCALE_BLOCK)

    def _plan_and_kernel(self, M: int, K: int, mode: str, *, block: bool = False,
                         bias: bool = False) -> tuple[TilePlan, Any]:
        """The plan of a call and its compiled launcher (tests, scripts)."""
        return self._prepare(M, K, mode, block=block, bias=bias)[:2]

    def _prepare(self, M: int, K: int, mode: str, *, block: bool = False,
                 bias: bool = False) -> tuple[TilePlan, Any, tuple[int, ...]]:
        """(plan, launcher, the launch's fixed arguments) of a call, made once per shape: a
        call then looks it up, which keeps the host path short. ``bias``: the fused kernel
        that adds a bias to the reduced sum (the plain GEMM has none)."""
        key = (M, K, mode, block, bias)
        hit = self._plans.get(key)
        if hit is None:
            if len(self._plans) > 4096:
                self._plans.clear()
            plan, v = self._resolve(M, K, mode, block, bias)
            compiled_before = CACHE.compile_count
            try:
                fn = CACHE.get(v)
            except ValueError as e:  # a kernel refusing what the tuning combined
                if self.tuning.changed():
                    raise RsarValueError(f"{self.tuning.describe()}: {e}") from None
                raise
            if CACHE.compile_count != compiled_before and mode != "gemm":
                # Ranks compile the same variant at the same call; without this the first
                # to finish would spend its peers' compile time in the kernel's spin-waits,
                # and a compile slower than the time limit would look like a dead peer.
                self._ws.bootstrap.barrier()
            hit = self._plans[key] = (plan, fn, self._fixed_args(plan, K))
            log.debug("plan M=%d K=%d %s: BN=%d tiles=%d grid=%d; %s", M, K, mode, plan.bn,
                      plan.num_tiles, plan.grid, v.describe())
        return hit

    def _require_kernel(self) -> None:
        if self.arch not in KERNEL_ARCHS:
            raise UnsupportedError(
                f"no kernel for this GPU ({torch.cuda.get_device_name(self.device)}, compute "
                f"capability {torch.cuda.get_device_capability(self.device)}): rsar has kernels "
                f"for compute capability 9.0 (sm_90a: H100/H200), 10.0 (sm_100a: B200/GB200) "
                f"and 10.3 (sm_103a: B300/GB300); "
                f"check can_run() first")

    def _fixed_args(self, plan: TilePlan, K: int) -> tuple[int, ...]:
        """The launch arguments between the per-call ones (``HEAD_ARGS``: tensors and
        scales) and the stream: the same for every call of ``plan`` (at the call's ``K``)
        on this op."""
        mem, lay = self._ws.mem, self._ws.layout
        return (plan.M, plan.N, K, mem.local_ptr, mem.peer_ptrs_dev, mem.multicast_ptr,
                self._ws.err.data_ptr(), self.rank, plan.local_M, plan.padded_M, plan.chunk,
                plan.rounds, plan.sched_word, plan.grid, self.timeout_ns, lay.arrive_off,
                lay.result_off, lay.recv_off, lay.recv_region_bytes, lay.part_off, lay.out_off)

    def _launch_prepared(self, prepared: tuple[TilePlan, Any, tuple[int, ...]],
                         x: torch.Tensor, w: torch.Tensor, y: torch.Tensor,
                         x_scale: torch.Tensor | None = None, w_scale: torch.Tensor | None = None,
                         scale_bits: int = 0, bias: torch.Tensor | None = None) -> None:
        _, fn, fixed = prepared
        stream = raw_stream(self.device.index)
        self._ws.order.before_launch(stream, self.device)
        sx = x_scale.data_ptr() if x_scale is not None else 0
        sw = w_scale.data_ptr() if w_scale is not None else 0
        b = bias.data_ptr() if bias is not None else 0
        fn.call_with((x.data_ptr(), w.data_ptr(), y.data_ptr(), sx, sw, scale_bits, b), fixed,
                     stream)

    # ------------------------------------------------------------------ profiling
    def clear_trace(self) -> None:
        """Zero the event-time region; the next traced launch fills what it reaches."""
        from launch.layout import TRACE_BYTES, TRACE_OFF
        self._require_open()
        torch.cuda.synchronize(self.device)
        self._ws.mem.zero_local(TRACE_OFF, TRACE_BYTES)

    def read_trace(self, M: int, K: int, mode: str | None = None) -> dict[str, list[int | None]]:
        """Event times (ns from the first CTA's start, per CTA; ``launch.trace``) of the last
        launch, by an op with ``Tuning(trace=True)`` after ``clear_trace()``, of the (M, K) plan.
        Only sm90 kernels record events; elsewhere every event reads None."""
        from launch import trace
        from launch.layout import TRACE_BYTES, TRACE_OFF
        self._require_open()
        torch.cuda.synchronize(self.device)
        raw = self._ws.mem.read_local(TRACE_OFF, TRACE_BYTES)
        return trace.decode(raw, self.plan(M, K, mode).grid)

    # ------------------------------------------------------------------ errors, teardown
    def check(self) -> None:
        """Raise RsarTimeoutError if an earlier launch into this workspace timed out, or
        ShapeMismatchError if a peer started one with another M or K."""
        if self._broken is not None:
            raise self._broken
        if self._ws is None:
            return
        e = self._ws.err_np  # reading numpy is ~100x cheaper than indexing the tensor
        code = int(e[protocol.ERR_CODE])
        if code == protocol.ERR_TIMEOUT:
            self._broken = RsarTimeoutError(int(e[protocol.ERR_RANK]), int(e[protocol.ERR_TILE]),
                                            int(e[protocol.ERR_SRC]), int(e[protocol.ERR_EPOCH]),
                                            int(e[protocol.ERR_KIND]))
        elif code == protocol.ERR_SHAPE:
            self._broken = ShapeMismatchError(
                int(e[protocol.ERR_RANK]), protocol.decode_shape(int(e[protocol.ERR_KIND])),
                int(e[protocol.ERR_SRC]), protocol.decode_shape(int(e[protocol.ERR_TILE])),
                int(e[protocol.ERR_EPOCH]))
        if self._broken is not None:
            raise self._broken

    def _require_open(self) -> None:
        if self._ws is None:
            raise ClosedError("GemmRsAr is closed")
        if self._ws.closed:
            raise ClosedError("the workspace this GemmRsAr shared has been closed")

    def close(self) -> None:
        """Collective when the instance owns its workspace; idempotent."""
        ws, self._ws = self._ws, None
        if ws is not None and self._owns_ws:
            ws.close()
        hooks, self._on_close = self._on_close, []
        for cb in hooks:
            cb()

    def __enter__(self) -> "GemmRsAr":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
