"""The on-disk kernel cache: precompiled on this GPU-less machine, loaded back, launchable."""
from __future__ import annotations

import pytest

pytest.importorskip("cutlass")

from launch import disk_cache  # noqa: E402
from launch.cache import ARG_KINDS, compile_fast, compile_variant  # noqa: E402
from launch.variant import Variant  # noqa: E402
from launch.fast_call import FastCall  # noqa: E402

V = Variant("sm_90a", 128, 2, "gemm", "unicast")


def test_store_then_load_gives_a_fast_launcher(tmp_path):
    path = disk_cache.store(V, compile_variant(V, exportable=True), tmp_path)
    assert path.name == disk_cache.entry_name(V) + ".o" and path.stat().st_size > 1000
    assert oct(path.stat().st_mode & 0o777) == "0o600"  # nothing world-readable
    fn = disk_cache.load(V, tmp_path)
    assert fn is not None and callable(fn)
    FastCall(fn, ARG_KINDS)  # the fast path itself needs a GPU to bind; this must not raise
    assert disk_cache.load(Variant("sm_90a", 256, 2, "gemm", "unicast"), tmp_path) is None


def test_broken_entry_is_ignored_and_replaced(tmp_path, monkeypatch):
    (tmp_path / (disk_cache.entry_name(V) + ".o")).write_bytes(b"not an object file")
    assert disk_cache.load(V, tmp_path) is None
    monkeypatch.setenv(disk_cache.ENV, str(tmp_path))
    assert isinstance(compile_fast(V), FastCall)  # compiles, then overwrites the broken entry
    assert disk_cache.load(V, tmp_path) is not None


def test_cache_is_off_unless_asked(monkeypatch):
    monkeypatch.delenv(disk_cache.ENV, raising=False)
    assert disk_cache.cache_dir() is None
    monkeypatch.setenv(disk_cache.ENV, "off")
    assert disk_cache.cache_dir() is None


def test_entry_names_change_with_the_kernel_source():
    name = disk_cache.entry_name(V)
    assert name.endswith(disk_cache.source_hash()) and name.replace("_", "").isalnum()


def test_entry_names_tell_every_tuning_knob_apart():
    import dataclasses
    from launch.variant import TUNING
    base = Variant("sm_90a", 64, 2, "rs", "unicast", 2)
    names = {disk_cache.entry_name(dataclasses.replace(base, **{k: 1})) for k in TUNING}
    assert len(names) == len(TUNING) and disk_cache.entry_name(base) not in names


def test_entry_names_tell_every_field_apart():
    """Every Variant field, changed from its default, changes the entry's name: two variants
    never share an object file (64-row tiles once did, loading the 128-row kernel's file)."""
    import dataclasses
    base = Variant("sm_90a", 128, 2, "gemm", "unicast")
    other = {"arch": "sm_100a", "bn": 256, "world": 4, "mode": "rs", "transport": "multicast",
             "cta_group": 2, "push": "tma", "dtype": "f16", "in_dtype": "e4m3", "bm": 64}
    names = {disk_cache.entry_name(base)}
    for f in dataclasses.fields(Variant):
        value = other.get(f.name, 1 if isinstance(f.default, int) else None)
        assert value is not None, f"no other value for {f.name}: add one here"
        names.add(disk_cache.entry_name(dataclasses.replace(base, **{f.name: value})))
    assert len(names) == 1 + len(dataclasses.fields(Variant))
