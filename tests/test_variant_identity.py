"""The redesign's guard: the default variant of each call in tests/ptx_identity.json is the
one recorded from the op before ``launch.resolve`` existed, and its PTX is byte-identical
(sm90 and sm100, RS / AR / the plain GEMM, bf16 / fp16 / fp8, block-wise scales, bias,
partial tiles, world 4, multicast). A kernel change that means to move PTX re-records it:
``python3 tests/test_variant_identity.py --write``. Re-recorded three times since: twice on
2026-12-05:
when the schedule's part rotation left the kernels (the round-order variants, 15 of the 24,
moved; the other 9 kept their PTX); and when x's box gained an atom of its own for the last
tile row (``Variant.x_rows``), two kernel parameters every sm90 variant takes (the 17 sm90
entries moved; their bodies, with the parameters renumbered, were identical to the old
ones on the 224-wide GEMM and the 256-wide RS on pairs); and on 2026-12-06 when the GEMM
alone took 4 mainloop stages at 224 / 256 wide and K <= 1024 (``default_stages``, PERF.md
(ao): the one entry it moves, 2048 x 7168 x 1024; the store warp's new slot hand-back sits
in a branch only rings shorter than the tile compile, so the other 27 kept their PTX); and
on 2026-12-06 again when ``choose_gemm_pingpong`` took that call below M=4096 to ping-pong
176 wide at 5 stages (PERF.md (aq): the variant the rule already ran from M=4096; no kernel
changed, the other 27 kept their PTX); and on 2026-12-07 when ``choose_gemm_l2_hint`` tagged
the plain GEMM's mainloop loads evict-last at K <= 1024, M >= 512 (PERF.md (ba): the entries
of that GEMM move; the other kernels kept their PTX)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from launch import Dtypes, Hardware, Shape, Variant, resolve_variant  # noqa: E402

TABLE = HERE / "ptx_identity.json"
RECORD = json.loads(TABLE.read_text())
CALLS = [e["call"] for e in RECORD["variants"]]


def default_variant(call: list) -> Variant:
    arch, world, transport, mode, M, N, K, dtype, in_dtype, block, bias = call
    return resolve_variant(Shape(M, N, K, mode, bool(bias)), Hardware(arch, 132, 132), world,
                           transport, Dtypes(dtype, in_dtype, bool(block)))


@pytest.mark.parametrize("entry", RECORD["variants"], ids=lambda e: " ".join(map(str, e["call"])))
def test_default_variant_unchanged(entry):
    # a field added since the record keeps its default there
    assert default_variant(entry["call"]) == Variant(**entry["variant"])


def test_the_table_spans_what_it_claims():
    vs = [Variant(**e["variant"]) for e in RECORD["variants"]]
    assert len(set(vs)) >= 20
    assert {v.arch for v in vs} >= {"sm_90a", "sm_100a"}
    assert {v.mode for v in vs} == {"rs", "ar", "gemm"}
    assert {v.dtype for v in vs} >= {"bf16", "f16"} and any(v.in_dtype for v in vs)
    assert any(v.bias for v in vs) and any(v.block_scales for v in vs)
    assert any(c[5] % 128 for c in CALLS)  # N=2880: partial tiles


@pytest.mark.skipif(version("nvidia-cutlass-dsl") != RECORD["cutlass_dsl"],
                    reason=f"PTX recorded with nvidia-cutlass-dsl {RECORD['cutlass_dsl']}")
def test_default_ptx_byte_identical(ptx_of):
    # distinct variants only: several calls share one kernel (N and M are launch arguments)
    want = {}
    for e in RECORD["variants"]:
        want.setdefault(Variant(**e["variant"]), e["ptx_sha256"])
    moved = [v.describe() for v, h in want.items()
             if hashlib.sha256(ptx_of(v).encode()).hexdigest() != h]
    assert not moved, f"PTX changed for {len(moved)} of {len(want)} variants: {moved}"


def _write() -> None:
    from launch.cache import compile_variant
    out = []
    for call in CALLS:
        v = default_variant(call)
        ptx = compile_variant(v, keep_ptx=True).artifacts.PTX
        out.append({"call": call, "variant": dataclasses.asdict(v),
                    "ptx_sha256": hashlib.sha256(ptx.encode()).hexdigest()})
    TABLE.write_text(json.dumps({"cutlass_dsl": version("nvidia-cutlass-dsl"),
                                 "variants": out}, indent=1) + "\n")


if __name__ == "__main__" and "--write" in sys.argv:
    _write()
