"""scripts/gpu_runs.sh refuses a missing or unknown step before running anything."""
import subprocess
import sys

import pytest

from script_runs import REPO, plain_env

SCRIPT = REPO / "scripts" / "gpu_runs.sh"


def _run(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env=plain_env(), cwd=cwd, timeout=30)


def test_steps_are_checked_and_the_out_dir_is_the_callers(tmp_path):
    r = _run(cwd=tmp_path)
    assert r.returncode != 0 and "usage" in r.stderr
    r = _run("out", cwd=tmp_path)
    assert r.returncode == 2 and "no STEP given" in r.stderr
    r = _run("out", "bogus", cwd=tmp_path)
    assert r.returncode == 2 and "unknown step bogus" in r.stderr
    assert (tmp_path / "out").is_dir()  # relative to where it was called, not the repo


def test_an_unknown_step_stops_the_steps_before_it(tmp_path):
    r = _run("out", "cache", "sweep1", "bogus", cwd=tmp_path)
    assert r.returncode == 2 and "unknown step bogus" in r.stderr
    assert list((tmp_path / "out").iterdir()) == []  # cache did not start


def test_stagger_shapes_are_what_gemm_one_gpu_takes():
    """The ``stagger`` step's shape lists (``shapes M... N...``) parse as --shapes: every M
    and N over K 1024 / 4096 / 9216."""
    text = SCRIPT.read_text()
    fn = text[text.index("shapes() {"):]
    fn = fn[:fn.index("\n}\n") + 3]
    r = subprocess.run(["bash", "-c", fn + 'shapes "1 64" "2880 8192"'], capture_output=True,
                       text=True, timeout=30)
    from script_runs import load_script
    a = load_script("gemm_one_gpu.py", "gemm_one_gpu").parse(["--shapes", r.stdout.strip()])
    assert sorted(a.shape_list) == sorted((M, N, K) for M in (1, 64) for N in (2880, 8192)
                                          for K in (1024, 4096, 9216))


def test_every_column_a_step_times_parses():
    """Each ``--columns`` list the steps pass to gemm_one_gpu.py names known knobs (a typo
    would cost a device call)."""
    import re
    from script_runs import load_script
    mod = load_script("gemm_one_gpu.py", "gemm_one_gpu")
    lists = re.findall(r"(?:\$G1|gemm_step \w+ \d+)[^;]*?--columns ([\w,+\"$]+)",
                       SCRIPT.read_text(), flags=re.S)
    names = {c for lst in lists for c in lst.strip('"').split(",") if "$" not in c}
    assert {"default", "xb0", "c1+bn256", "c2+bn256", "c1+bn256+sk", "c2+xb"} <= names
    for name in names:
        mod.column_knobs(name)


def test_build_only_fills_the_cache_without_a_gpu(tmp_path):
    """``RSAR_BUILD_ONLY=1``: a gemm_one_gpu.py step compiles its columns' kernels into
    RSAR_KERNEL_CACHE on this machine and times nothing (the cache a device call carries)."""
    pytest.importorskip("cutlass")
    from launch.disk_cache import entry_path
    from script_runs import load_script
    mod = load_script("gemm_one_gpu.py", "gemm_one_gpu")
    cache = tmp_path / "kc"
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gemm_one_gpu.py"), "--build-only",
         "--build-jobs", "1", "--columns", "default,c1", "--shapes", "64,2880,1024"],
        capture_output=True, text=True, timeout=600,
        env=plain_env(RSAR_KERNEL_CACHE=str(cache), CUTE_DSL_ARCH="sm_90a"))
    assert r.returncode == 0, r.stderr[-2000:]
    want = {mod.column_plan(c, 64, 2880, 1024, 132, pc)[1]
            for c in ("default", "c1") for pc in (None, 132)}
    assert all(entry_path(v, cache).is_file() for v in want)
    assert "us" not in r.stdout.split("--build-jobs")[0]  # nothing timed
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "gemm_one_gpu.py"),
                        "--build-only"], capture_output=True, text=True, timeout=60,
                       env=plain_env())
    assert r.returncode == 2 and "RSAR_KERNEL_CACHE" in r.stderr
