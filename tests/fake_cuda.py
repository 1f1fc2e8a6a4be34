"""A stand-in for the parts of ``torch.cuda`` that the benchmarks' queued timing uses."""
from __future__ import annotations


class FakeCuda:
    """torch.cuda as the queued timing uses it: the gate event after the sleep reports a
    stream that ran dry on its first ``dry`` queries."""

    def __init__(self, dry: int):
        self.dry, self.sleeps, self.gates = dry, [], 0
        fake = self

        class Event:
            def __init__(self, enable_timing: bool = False):
                self.timing = enable_timing

            def record(self):
                pass

            def query(self):
                fake.gates += 1
                return fake.gates <= fake.dry

            def elapsed_time(self, other):
                return 0.01  # ms

        self.Event = Event

    def _sleep(self, cycles):
        self.sleeps.append(cycles)

    def synchronize(self):
        pass
