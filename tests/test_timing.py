"""rsar_core.timing on the host clock: the median of the timed calls after the warm-up ones,
and the slowest rank's numbers."""
from __future__ import annotations

import pytest
import torch

from rsar_core import timing


class ScriptedClock:
    """A clock whose calls take the given durations (seconds): each call to the function
    under test advances it by the next one."""

    def __init__(self, durations: list[float]) -> None:
        self.now, self.durations, self.calls = 0.0, list(durations), 0

    def __call__(self) -> float:
        return self.now

    def work(self) -> None:
        self.calls += 1
        self.now += self.durations.pop(0)


@pytest.mark.parametrize("warmup, durations, want_us", [
    (0, [3e-6, 1e-6, 8e-6], 3.0),    # the median, not the mean
    (2, [9.0, 9.0, 5e-6, 1e-6, 4e-6, 20e-6], 4.5),  # warm-up calls are not timed; even count
    (1, [1.0, 7e-6], 7.0),
])
def test_median_us_times_after_the_warmup(warmup, durations, want_us):
    clock = ScriptedClock(durations)
    got = timing.median_us(clock.work, len(durations) - warmup, warmup, torch.device("cpu"),
                           clock=clock)
    assert clock.calls == len(durations) and clock.durations == []
    assert got == pytest.approx(want_us, rel=1e-6)


def test_median_us_needs_a_call():
    with pytest.raises(ValueError, match="iters"):
        timing.median_us(lambda: None, 0, 0, torch.device("cpu"))


def test_slowest_rank_per_key():
    per_rank = [{"block": 10.0, "down": 4.0}, {"block": 12.0, "down": 3.0},
                {"block": 11.0, "down": 5.0}]
    assert timing.slowest(per_rank) == {"block": 12.0, "down": 5.0}
    with pytest.raises(ValueError):
        timing.slowest([])


def test_barrier_and_sync_without_a_process_group():
    timing.barrier(torch.device("cpu"))  # no torch.distributed: nothing to meet
    timing.sync("cpu")
