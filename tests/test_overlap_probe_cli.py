"""benchmarks/overlap_probe.py: bad arguments are refused before a GPU is touched, and the bytes
it pushes are those of a world-2 RS call."""
from script_runs import load_script, run_script


def _run(*args: str):
    return run_script("overlap_probe.py", *args, folder="benchmarks")


def _module():
    return load_script("overlap_probe.py", "overlap_probe", folder="benchmarks")


def test_bad_arguments_are_refused():
    r = _run("--shapes", "2048,7168")
    assert r.returncode == 2 and "M,N,K triples" in r.stderr
    r = _run("--push-ctas", "8,x")
    assert r.returncode == 2 and "--push-ctas" in r.stderr
    r = _run("--push-ctas", "67")
    assert r.returncode == 2 and "0..66" in r.stderr
    r = _run("--iters", "0")
    assert r.returncode == 2 and "--iters" in r.stderr
    r = _run("--fence-bytes", "100000")
    assert r.returncode == 2 and "--fence-bytes" in r.stderr


def test_push_bytes_are_an_rs_calls():
    mod = _module()
    # world 2: the peer's M/2 rows of N bf16 columns
    assert mod.push_bytes(2048, 7168) == 2048 * 7168
    assert mod.push_bytes(1, 128) == mod.BULK_BYTES  # whole bulk copies
    for total, ctas in [(2048 * 7168, 16), (4096 * 8192, 33), (mod.TILE_BYTES, 8)]:
        per = mod.per_cta_bytes(total, ctas)
        assert per % mod.TILE_BYTES == 0 and per * ctas >= total
        assert (per - mod.TILE_BYTES) * ctas < total
    assert mod.per_cta_bytes(2048 * 7168, 16, 4 * mod.TILE_BYTES) % (4 * mod.TILE_BYTES) == 0
