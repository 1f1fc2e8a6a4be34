"""On-disk cache of compiled kernels, so a new worker's first call does not compile.

``RSAR_KERNEL_CACHE=DIR`` turns it on: a variant is looked up as an object file in DIR
before compiling, and stored there after compiling. A deployment fills DIR ahead of time,
on any machine with the CuTe DSL (no GPU needed), for a named arch:

    python3 scripts/precompile.py --arch sm_90a --world 2 --out DIR

Entries are keyed by the variant, the CuTe DSL version and a hash of the kernel sources in
``launch/`` (every module but the host-side ``HOST_ONLY``), so a changed kernel or toolchain never loads a stale binary. Files are
written to a temporary name and renamed, so concurrent workers filling one directory
never read half a file; a broken or foreign entry is ignored (and recompiled), not fatal.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

log = logging.getLogger("rsar.launch")

ENV = "RSAR_KERNEL_CACHE"
# short, distinct name tags of the tuning knobs (peers_first and pair_n share an initial)
_TAGS = {"epi_slots": "e", "peers_first": "pf", "pair_n": "pn", "stages": "st", "push_all": "pa",
         "pdl": "pdl", "trace": "tr", "block_scales": "bs", "pingpong": "pp",
         "x_rows": "xr"}


def cache_dir() -> Path | None:
    d = os.environ.get(ENV, "").strip()
    return Path(d) if d and d.lower() != "off" else None


# Host-side modules of launch/: no kernel reads them, so editing one (a rule, the planner)
# keeps the cache; every other module, a new one included, is hashed as kernel source.
HOST_ONLY = frozenset({"__init__.py", "cache.py", "disk_cache.py", "fast_call.py",
                       "occupancy.py", "plan.py", "resolve.py", "rules.py", "tuning.py",
                       "variant_log.py"})


@lru_cache(maxsize=1)
def source_hash() -> str:
    """A hash of the kernel sources in launch/ and the CuTe DSL version."""
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for f in sorted(here.glob("*.py")):
        if f.name in HOST_ONLY:
            continue
        h.update(f.name.encode())
        h.update(f.read_bytes())
    try:
        from importlib.metadata import version
        h.update(version("nvidia-cutlass-dsl").encode())
    except Exception:  # running from an unpacked bundle without metadata
        import cutlass
        h.update(str(getattr(cutlass, "__version__", "")).encode())
    return h.hexdigest()[:16]


def entry_name(v: Any) -> str:
    """Object-file stem and symbol prefix of a variant (letters, digits, underscores)."""
    tune = "".join(f"_{_TAGS.get(k, k)}{n}" for k, n in v.tuning().items())
    push = getattr(v, "push", "lsu")
    tune += f"_{push}" if push != "lsu" else ""
    dtype = getattr(v, "dtype", "bf16")
    tune += f"_{dtype}" if dtype != "bf16" else ""
    in_dtype = getattr(v, "in_dtype", "")
    tune += f"_in{in_dtype}" if in_dtype else ""
    tune += "_bias" if getattr(v, "bias", 0) else ""
    bm = getattr(v, "bm", 128)
    tune += f"_bm{bm}" if bm != 128 else ""
    return (f"rsar_{v.arch}_bn{v.bn}_w{v.world}_{v.mode}_{v.transport}_cg{v.cta_group}{tune}"
            f"_{source_hash()}")


def entry_path(v: Any, directory: Path) -> Path:
    """Where ``directory`` holds ``v`` compiled from the present sources and CuTe DSL."""
    return directory / f"{entry_name(v)}.o"


def load(v: Any, directory: Path) -> Any | None:
    """The compiled function of ``v`` from ``directory``, or None if absent or unusable."""
    name = entry_name(v)
    path = entry_path(v, directory)
    if not path.is_file():
        return None
    try:
        import cutlass.cute as cute
        module = cute.runtime.load_module(str(path))
        fn = getattr(module, name)
        fn._rsar_module = module  # the engine must outlive the function
        return fn
    except Exception as e:
        log.warning("ignoring unusable kernel cache entry %s: %s", path, e)
        return None


def store(v: Any, compiled: Any, directory: Path) -> Path:
    """Write ``compiled`` (compiled with ``exportable=True``) for ``v`` into ``directory``
    atomically; returns the file."""
    directory.mkdir(parents=True, exist_ok=True)
    name = entry_name(v)
    blob = compiled.dump_to_object(name)
    final = entry_path(v, directory)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".o")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, final)
    except BaseException:
        os.unlink(tmp)
        raise
    return final
