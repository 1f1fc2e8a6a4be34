"""scripts/gpu_runs.sh refuses a missing or unknown step before running anything."""
import subprocess

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
    lists = re.findall(r"gemm_one_gpu\.py[^;]*?--columns ([\w,+\"$]+)", SCRIPT.read_text(),
                       flags=re.S)
    names = {c for lst in lists for c in lst.strip('"').split(",") if "$" not in c}
    assert {"default", "xb0", "c1+bn256", "c2+bn256", "c1+bn256+sk", "c2+xb"} <= names
    for name in names:
        mod.column_knobs(name)
