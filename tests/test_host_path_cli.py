"""scripts/host_path.py: without GPUs or a second rank it says so and exits 2; its timer
measures what it is given and drains the GPU between loops."""
from script_runs import load_script, run_script


def test_without_a_gpu_or_peer_it_says_so():
    r = run_script("host_path.py", "--iters", "3")
    assert r.returncode == 2 and "needs 2+ ranks" in r.stdout


def test_per_call_us_is_the_median_loop_time_per_call(monkeypatch):
    mod = load_script("host_path.py", "host_path")
    syncs = []
    clock = iter(range(0, 10**9, 10))  # every perf_counter reading 10 s after the last
    monkeypatch.setattr(mod.time, "perf_counter", lambda: next(clock))
    us = mod.per_call_us(lambda: None, iters=4, repeats=3, sync=lambda: syncs.append(1))
    assert us == 10 / 4 * 1e6  # two readings a loop, 10 s apart, over 4 calls
    assert len(syncs) == 4  # after the warm-up and after each loop
