"""RSAR_VARIANT_LOG records the variants a process launches; precompile --from-log adds them."""
import importlib.util
from pathlib import Path

import pytest

from launch import variant_log
from launch.cache import KernelCache
from launch.variant import Variant

_spec = importlib.util.spec_from_file_location(
    "precompile", Path(__file__).resolve().parents[1] / "scripts" / "precompile.py")
precompile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(precompile)

FORCED = Variant("sm_90a", 128, 2, "rs", "unicast", 1, push="tma", peers_first=1, pdl=1,
                 prefetch=1, push_window=0)
OTHER = Variant("sm_90a", 224, 2, "ar", "unicast", 2, push="tma_all", pdl=1, early_copy=1)


def test_each_variant_is_logged_once_per_process(tmp_path, monkeypatch):
    log = tmp_path / "used.jsonl"
    monkeypatch.setenv(variant_log.ENV, str(log))
    cache = KernelCache(compile_fn=lambda v: object())
    for v in (FORCED, OTHER, FORCED, OTHER, FORCED):
        cache.get(v)
    assert len(log.read_text().splitlines()) == 2
    assert variant_log.read([log]) == [FORCED, OTHER]


def test_nothing_is_logged_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(variant_log.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    KernelCache(compile_fn=lambda v: object()).get(FORCED)
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_log_does_not_stop_a_launch(tmp_path, monkeypatch):
    monkeypatch.setenv(variant_log.ENV, str(tmp_path / "missing-dir" / "used.jsonl"))
    assert KernelCache(compile_fn=lambda v: "fn").get(FORCED) == "fn"


def test_logs_of_several_ranks_merge_without_duplicates(tmp_path, monkeypatch):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path, vs in ((a, (FORCED, OTHER)), (b, (OTHER, FORCED))):
        monkeypatch.setenv(variant_log.ENV, str(path))
        cache = KernelCache(compile_fn=lambda v: object())
        for v in vs:
            cache.get(v)
    assert variant_log.read([a, b]) == [FORCED, OTHER]


@pytest.mark.parametrize("line", ['{"arch": "sm_90a"}', '{"bogus": 1}', "not json",
                                  '{"arch": "sm_90a", "bn": 128, "world": 2, "mode": "rs", '
                                  '"transport": "unicast", "colour": "red"}'])
def test_a_line_that_is_not_a_variant_is_named(tmp_path, line):
    log = tmp_path / "used.jsonl"
    log.write_text(variant_log.json.dumps({"arch": "sm_90a", "bn": 64, "world": 2,
                                           "mode": "gemm", "transport": "unicast"})
                   + "\n\n" + line + "\n")
    with pytest.raises(ValueError, match=r"used\.jsonl:3: not a kernel variant"):
        variant_log.read([log])


def test_precompile_adds_logged_variants_of_its_arch_and_world(tmp_path, monkeypatch):
    log = tmp_path / "used.jsonl"
    monkeypatch.setenv(variant_log.ENV, str(log))
    cache = KernelCache(compile_fn=lambda v: object())
    defaults = precompile.variants("sm_90a", 2, ["unicast"])
    world4 = Variant("sm_90a", 128, 4, "rs", "unicast", push="tma")
    for v in (defaults[0], FORCED, world4):
        cache.get(v)
    assert FORCED not in defaults
    vs, skipped = precompile.with_logged(defaults, [str(log)], "sm_90a", 2)
    assert vs == defaults + [FORCED] and skipped == 1
    assert precompile.with_logged(defaults, [], "sm_90a", 2) == (defaults, 0)


def test_precompile_keeps_what_the_cache_holds(tmp_path):
    from launch.disk_cache import entry_name
    (tmp_path / f"{entry_name(FORCED)}.o").write_bytes(b"x")
    (tmp_path / "rsar_sm_90a_stale_0123456789abcdef.o").write_bytes(b"x")
    assert precompile.cached([FORCED, OTHER], tmp_path) == [FORCED]
    assert precompile.cached([FORCED, OTHER], tmp_path / "absent") == []


def test_the_gpu_suites_log_reads_as_world_2_sm90_variants():
    """tests/gpu/variants.jsonl (run_all.sh precompiles it) must keep up with ``Variant``: a
    field renamed or dropped makes it unreadable, and this fails until it is re-recorded."""
    path = Path(__file__).resolve().parent / "gpu" / "variants.jsonl"
    vs = variant_log.read([path])
    assert len(vs) > 100
    assert all(v.arch == "sm_90a" and v.world == 2 and v.transport == "unicast" for v in vs)
    # the forced plans the suites run beyond the defaults: more than precompile's own list
    assert len(set(vs) - set(precompile.variants("sm_90a", 2, ["unicast"]))) > 50
