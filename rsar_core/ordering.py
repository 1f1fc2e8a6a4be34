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

import torch


class LaunchOrder:
    _per_device: dict[int, "LaunchOrder"] = {}
    _lock = threading.Lock()

    def __init__(self) -> None:
        self._last: torch.cuda.Stream | None = None
        self.switches = 0

    @classmethod
    def for_device(cls, device: torch.device) -> "LaunchOrder":
        with cls._lock:
            return cls._per_device.setdefault(device.index, cls())

    def before_launch(self, stream: torch.cuda.Stream) -> None:
        if torch.cuda.is_current_stream_capturing():
            return
        last = self._last
        if last is not None and last.cuda_stream != stream.cuda_stream:
            ev = torch.cuda.Event()
            ev.record(last)
            stream.wait_event(ev)
            self.switches += 1
        self._last = stream
