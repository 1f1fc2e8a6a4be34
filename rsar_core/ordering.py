"""rsar kernels on one device run one at a time, in the order the program issued them.

Each launch spin-waits for peers while holding every SM it got. Two rsar kernels running
at once on one GPU could each hold SMs the other needs, and if the ranks started them in
different orders, both ranks would wait until the time limit. So before a launch on a
stream other than the previous rsar launch's, the new stream waits for everything queued on
that one so far (an event recorded at the switch: no cost while the stream stays the same).
Inside a CUDA graph capture the graph's own order applies and nothing is added.
"""
from __future__ import annotations

import threading
from typing import Callable

import torch


def _raw_stream_fn() -> Callable[[int], int]:
    # The handle alone, without building a Stream object (~0.3 us against ~3 on a slow
    # host, per call); the public path where this torch lacks it.
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


raw_stream: Callable[[int], int] = _raw_stream_fn()
"""The current stream's handle (``cudaStream_t`` as an int) on device ``index``."""


class LaunchOrder:
    _per_device: dict[int, "LaunchOrder"] = {}
    _lock = threading.Lock()

    def __init__(self) -> None:
        self._last: torch.cuda.Stream | None = None
        self._last_handle: int | None = None
        self.switches = 0

    @classmethod
    def for_device(cls, device: torch.device) -> "LaunchOrder":
        with cls._lock:
            return cls._per_device.setdefault(device.index, cls())

    def before_launch(self, stream: int, device: torch.device) -> None:
        """Order a launch on the stream whose handle is ``stream`` (the current one of
        ``device``) after every earlier rsar launch on this device."""
        if stream == self._last_handle or torch.cuda.is_current_stream_capturing():
            return
        current = torch.cuda.current_stream(device)
        last = self._last
        if last is not None:
            ev = torch.cuda.Event()
            ev.record(last)
            current.wait_event(ev)
            self.switches += 1
        self._last, self._last_handle = current, stream
