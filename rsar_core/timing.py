"""Timing a collective call the way a tensor-parallel step feels it: the median of many calls
on each rank, then the slowest rank (a step waits for the last rank to finish)."""
from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any, Callable


def sync(device: Any) -> None:
    """Wait for ``device``'s work (nothing to wait for off a GPU)."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch
        torch.cuda.synchronize(device)


def barrier(device: Any) -> None:
    """Meet every rank with no work of ours in flight before or after, so that the next
    timed call starts together on all ranks (a no-op without torch.distributed)."""
    import torch.distributed as dist
    sync(device)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    sync(device)


def median_us(fn: Callable[[], Any], iters: int, warmup: int, device: Any,
              clock: Callable[[], float] = time.perf_counter) -> float:
    """Median microseconds of one ``fn()`` on this rank, after ``warmup`` calls and a
    barrier: CUDA events on the current stream for a GPU ``device`` (one pair a call,
    read after the last), else ``clock`` (seconds) around each call."""
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    for _ in range(warmup):
        fn()
    barrier(device)
    if getattr(device, "type", "cpu") == "cuda":
        import torch
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for s, e in zip(starts, ends):
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize(device)
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e3
    us = []
    for _ in range(iters):
        t0 = clock()
        fn()
        us.append((clock() - t0) * 1e6)
    return statistics.median(us)


def slowest(per_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each key's largest value over the ranks' timings (every rank has the same keys)."""
    if not per_rank:
        raise ValueError("no timings")
    return {k: max(m[k] for m in per_rank) for k in per_rank[0]}
