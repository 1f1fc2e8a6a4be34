"""benchmarks/host_path.py and launch_cost.py: without GPUs or a second rank they say so and
exit 2; host_path's timer measures what it is given and drains the GPU between loops."""
import pytest

from script_runs import load_script, run_script, torch_sees_gpu


@pytest.mark.skipif(torch_sees_gpu(), reason="this host has a CUDA GPU")
@pytest.mark.parametrize("script, args", [("host_path.py", ["--iters", "3"]),
                                          ("launch_cost.py", ["--M", "128"])])
def test_without_a_gpu_or_peer_it_says_so(script, args):
    r = run_script(script, *args, timeout=120, folder="benchmarks")
    assert r.returncode == 2 and "needs 2+ ranks" in r.stdout, r.stdout + r.stderr
    assert "Traceback" not in r.stderr


def test_per_call_us_is_the_median_loop_time_per_call(monkeypatch):
    mod = load_script("host_path.py", "host_path", folder="benchmarks")
    syncs = []
    clock = iter(range(0, 10**9, 10))  # every perf_counter reading 10 s after the last
    monkeypatch.setattr(mod.time, "perf_counter", lambda: next(clock))
    us = mod.per_call_us(lambda: None, iters=4, repeats=3, sync=lambda: syncs.append(1))
    assert us == 10 / 4 * 1e6  # two readings a loop, 10 s apart, over 4 calls
    assert len(syncs) == 4  # after the warm-up and after each loop
