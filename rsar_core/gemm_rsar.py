"""GemmRsAr: the public front door of the fused GEMM + reduce-scatter / all-reduce."""
from __future__ import annotations

import logging
import os
from typing import Any

import torch

from launch.cache import CACHE, Variant
from launch.layout import WorkspaceLayout
from launch.plan import TilePlan, make_plan
from launch import protocol
from multicast.bootstrap import make_bootstrap
from multicast.symmetric import SymmetricMemory

from . import heuristics
from .errors import ClosedError, RsarTimeoutError
from .validate import check_call, check_construction, check_weight, weight_of

log = logging.getLogger("rsar")

DEFAULT_TIMEOUT_S = float(os.environ.get("RSAR_TIMEOUT_S", "5"))
_ARCH = {9: "sm_90a", 10: "sm_100a"}


def _arch_of(device: torch.device) -> str | None:
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) == (9, 0):
        return "sm_90a"
    if major == 10:
        return "sm_100a"
    return None


class GemmRsAr:
    """y = reduce_scatter(x @ w.T) or all_reduce(x @ w.T) over the ranks of ``comm``, one launch.

    ``comm``: an mpi4py communicator, a torch.distributed ProcessGroup, or None (MPI
    COMM_WORLD). Construction, calls and ``close()`` are collective: every rank makes the
    same calls with the same M and K, in the same order. The op runs on the current CUDA
    device and the current torch stream.
    """

    def __init__(self, max_M: int, N: int, all_reduce: bool = False, comm: Any = None, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._mem: SymmetricMemory | None = None
        self._broken: RsarTimeoutError | None = None
        bs = make_bootstrap(comm)
        check_construction(max_M, N, bs.world)
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if not torch.cuda.is_available():
            raise RuntimeError("GemmRsAr needs a CUDA device; none is visible")
        self.max_M, self.N, self.all_reduce = max_M, N, bool(all_reduce)
        self.rank, self.world = bs.rank, bs.world
        self.mode = "ar" if self.all_reduce else "rs"
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.arch = _arch_of(self.device)
        props = torch.cuda.get_device_properties(self.device)
        self.sm_count = props.multi_processor_count
        self.timeout_ns = int(timeout_s * 1e9)

        need = max(WorkspaceLayout.build(max_M, N, self.world, t).total_bytes
                   for t in ("unicast", "multicast"))  # the transport is known only after setup
        self._mem = SymmetricMemory(need, bs, device=self.device.index)
        self.transport = self._mem.transport
        self.layout = WorkspaceLayout.build(max_M, N, self.world, self.transport)
        # Host-mapped error record: the kernel reports a timed-out wait here and the host
        # reads it without synchronising the stream.
        self._err = torch.zeros(8, dtype=torch.int32, pin_memory=True)
        self._err_np = self._err.numpy()  # reading numpy is ~100x cheaper than tensor indexing
        self._plans: dict[tuple[int, int, str], tuple[TilePlan, Any]] = {}
        log.debug("GemmRsAr rank %d/%d %s max_M=%d N=%d arch=%s transport=%s handle=%s "
                  "policy=%s workspace=%d B", self.rank, self.world, self.mode, max_M, N,
                  self.arch, self.transport, self._mem.handle_type, self._mem.policy_reason,
                  self._mem.nbytes)

    # ------------------------------------------------------------------ queries
    def can_run(self, w: Any) -> bool:
        """Whether ``w`` (an (N, K) tensor or a module with ``.weight``) is usable here."""
        if self._mem is None or self.arch != "sm_90a":
            return False
        try:
            check_weight(weight_of(w), self.N, self.device)
        except (TypeError, ValueError):
            return False
        return True

    def should_run(self, x: torch.Tensor) -> bool:
        """Whether the fused op is expected to beat torch.mm + NCCL for this x."""
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            return False
        M, K = x.shape
        return 0 < M <= self.max_M and heuristics.fused_wins(self.mode, M, self.N, K, self.world)

    def plan(self, M: int, K: int) -> TilePlan:
        return make_plan(M, self.N, K, self.world, self.sm_count, self.mode)

    # ------------------------------------------------------------------ the op
    def __call__(self, x: torch.Tensor, w: Any) -> torch.Tensor:
        self._require_open()
        if self.arch != "sm_90a":
            raise RuntimeError(f"no kernel for this GPU ({torch.cuda.get_device_name(self.device)}, "
                               f"compute capability {torch.cuda.get_device_capability(self.device)})")
        check_call(x, w, self.max_M, self.N, self.device)
        self.check()
        w = weight_of(w)
        M, K = x.shape
        plan, fn = self._plan_and_kernel(M, K, self.mode)
        rows = M if self.all_reduce else plan.local_M
        y = torch.empty((rows, self.N), dtype=torch.bfloat16, device=self.device)
        self._launch(fn, x, w, y, plan)
        return y

    def gemm_only(self, x: torch.Tensor, w: Any) -> torch.Tensor:
        """x @ w.T (M, N) by the same kernel with the communication compiled out.

        Not collective; for benchmarks that separate the GEMM from the exchange.
        """
        self._require_open()
        check_call(x, w, self.max_M, self.N, self.device)
        w = weight_of(w)
        M, K = x.shape
        plan, fn = self._plan_and_kernel(M, K, "gemm")
        y = torch.empty((M, self.N), dtype=torch.bfloat16, device=self.device)
        self._launch(fn, x, w, y, plan)
        return y

    def _plan_and_kernel(self, M: int, K: int, mode: str) -> tuple[TilePlan, Any]:
        key = (M, K, mode)
        hit = self._plans.get(key)
        if hit is None:
            if len(self._plans) > 4096:
                self._plans.clear()
            plan = make_plan(M, self.N, K, self.world, self.sm_count, mode)
            fn = CACHE.get(Variant(self.arch, plan.bn, self.world, mode, self.transport))
            hit = self._plans[key] = (plan, fn)
            log.debug("plan M=%d K=%d %s: BN=%d tiles=%d grid=%d", M, K, mode, plan.bn,
                      plan.num_tiles, plan.grid)
        return hit

    def _launch(self, fn: Any, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor,
                plan: TilePlan) -> None:
        mem, lay = self._mem, self.layout
        stream = torch.cuda.current_stream(self.device).cuda_stream
        fn(x.data_ptr(), w.data_ptr(), y.data_ptr(), plan.M, plan.N, plan.K,
           mem.local_ptr, mem.peer_ptrs_dev, mem.multicast_ptr, self._err.data_ptr(),
           self.rank, plan.local_M, plan.padded_M, plan.chunk, plan.rounds, plan.lag, plan.grid,
           self.timeout_ns, lay.arrive_off, lay.result_off, lay.recv_off,
           lay.recv_region_bytes, lay.part_off, lay.out_off, stream)

    # ------------------------------------------------------------------ errors, teardown
    def check(self) -> None:
        """Raise RsarTimeoutError if an earlier launch reported a timed-out wait."""
        if self._broken is not None:
            raise self._broken
        e = self._err_np
        if int(e[protocol.ERR_CODE]) == protocol.ERR_TIMEOUT:
            self._broken = RsarTimeoutError(int(e[protocol.ERR_RANK]), int(e[protocol.ERR_TILE]),
                                            int(e[protocol.ERR_SRC]), int(e[protocol.ERR_EPOCH]),
                                            int(e[protocol.ERR_KIND]))
            raise self._broken

    def _require_open(self) -> None:
        if self._mem is None:
            raise ClosedError("GemmRsAr is closed")

    def close(self) -> None:
        mem, self._mem = self._mem, None
        if mem is not None:
            torch.cuda.synchronize(self.device)
            mem.close()

    def __enter__(self) -> "GemmRsAr":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Collective teardown cannot run from a finaliser; a forgotten close() leaks the
        # mapping until process exit rather than hanging a peer.
        pass
