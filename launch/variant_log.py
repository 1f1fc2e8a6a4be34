"""A record of the kernel variants a process launches, so a build machine can precompile
exactly what a workload used, forced plans included (``scripts/precompile.py --from-log``).

``RSAR_VARIANT_LOG=FILE`` turns it on: the first launch of each variant in a process appends
one JSON line to FILE. Lines are short single writes in append mode, so the ranks of a job
can share one file; duplicates are dropped when the log is read.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any, Iterable

log = logging.getLogger("rsar.launch")

ENV = "RSAR_VARIANT_LOG"


def record(v: Any) -> None:
    path = os.environ.get(ENV, "").strip()
    if not path:
        return
    line = json.dumps(dataclasses.asdict(v), sort_keys=True) + "\n"
    try:
        with open(path, "a") as f:
            f.write(line)
    except OSError as e:  # a log that cannot be written must not stop a launch
        log.warning("could not append to the variant log %s: %s", path, e)


def read(paths: Iterable[str | Path]) -> list:
    """The distinct variants in these logs, in first-seen order. A line that does not
    describe a variant raises ValueError naming the file and line."""
    from .variant import Variant
    fields = {f.name for f in dataclasses.fields(Variant)}
    seen: dict = {}
    for path in paths:
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                unknown = set(d) - fields
                if unknown:
                    raise ValueError(f"unknown fields {sorted(unknown)}")
                v = Variant(**d)
            except (ValueError, TypeError) as e:
                raise ValueError(f"{path}:{n}: not a kernel variant: {e}") from None
            seen.setdefault(v, None)
    return list(seen)
