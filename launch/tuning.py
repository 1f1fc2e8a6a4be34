"""``Tuning``: what a person may ask of the kernels, as one frozen value.

Every field left at its default lets the measured rules (``launch.rules``) decide; a field
set away from it overrides one rule or turns on one experiment, for every call of the op
built with it. ``GemmRsAr(..., tuning=Tuning(bn=192))`` builds such an op;
``op.retune(bn=192)`` returns one that shares ``op``'s workspace (benchmarks). The fields,
what they accept and the measurement behind each default are listed in docs/TUNING.md.

A value is validated once, when it is made: a bad one raises ``RsarValueError`` naming the
field and what it accepts. Whether a valid value fits a given call (a tile width N cannot
take, push CTAs on an all-reduce) is checked by ``launch.resolve`` before any launch.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from multicast.errors import RsarValueError

from .geometry import CTA_GROUPS, L2_HINTS, MAX_BAND, MAX_STAGES, TILE_MS, TILE_NS, TMA_PROMOS

PUSHES = ("lsu", "tma", "tma_all")
# Mainloop stages a forced ``stages`` may ask for (the kernel checks that its ring still fits);
# sub-tile ring depths a forced ``epi_slots`` may ask for (0: a whole tile)
STAGES = tuple(range(3, MAX_STAGES + 1))
EPI_SLOTS = tuple(range(0, 17))

# field -> (what it accepts, for the error message)
_ACCEPTS = {
    "bn": f"None or a tile width of {TILE_NS}",
    "bm": f"None or a tile row count of {TILE_MS}",
    "cta_group": "None, 1 (1-CTA tiles), 2 (2x1 clusters) or 4 (the plain GEMM's 4x1 "
                 "clusters along M, an experiment)",
    "lag": "None, 0 or 1",
    "band": f"None or an int in [0, {MAX_BAND}] (0: row-major)",
    "peers_first": "None, True or False",
    "pair_n": "True or False",
    "push_all": "None, True or False",
    "flat": "None, True or False",
    "sk": "None, True or False",
    "split_row": "None, True or False",
    "push": f"None or one of {PUSHES}",
    "stages": f"None or one of {STAGES}",
    "epi_slots": f"one of {EPI_SLOTS} (0: the kernel's)",
    "pdl": "True or False",
    "prefetch": "True or False",
    "early_copy": "True or False",
    "push_window": "None, True or False",
    "tma_store": "None, True or False",
    "push_ctas": "an int >= 0 (0: off; at most a quarter of the SMs)",
    "lean_exit": "None, True or False",
    "pingpong": "None, True or False",
    "x_box": "None, True or False",
    "l2_hint": f"None or one of {L2_HINTS}",
    "tma_promo": f"None or one of {TMA_PROMOS}",
    "trace": "True or False",
}


@dataclass(frozen=True)
class Tuning:
    """Overrides of the measured rules and the experiments still open (docs/TUNING.md).

    Plan shape (``launch.plan``; None: the rules decide):
    ``bn`` tile width; ``cta_group`` 1-CTA tiles or 2x1 clusters sharing w's tile (4: the
    plain sm90 GEMM's 4x1 clusters along M, bf16 / fp16, BN a multiple of 32); ``lag``
    the round order's lag round; ``band`` unit rows per band of the tile order;
    ``peers_first`` peers' tiles before the own ones; ``pair_n`` 2x1 clusters pairing tiles
    along N; ``push_all`` the world-2 push-all AR plan; ``flat`` the flat peers-first order;
    ``sk`` the split-K tail; ``split_row`` RS lists splitting a shared tile row.

    Kernel (sm90): ``push`` how partials reach peers ("lsu" thread stores, "tma" bulk
    copies, "tma_all" AR's reduced tiles as bulk copies too); ``stages`` at least this many
    mainloop stages; ``epi_slots`` the sub-tile ring depth; ``pdl`` programmatic dependent
    launch; ``prefetch`` reductions loading a sub-tile ahead; ``early_copy`` AR copying
    results back during the rounds; ``push_window`` one sub-tile's copies in flight;
    ``tma_store`` the plain GEMM's TMA store. ``pdl``, ``prefetch`` and ``early_copy`` are
    on where the rules take them; False turns them off.

    ``bn`` takes 112 / 144 / 176 / 208 on sm90 only (16-column sub-tiles). ``bm`` 64:
    64-row tiles on one MMA warp group, for the plain sm90 GEMM (``gemm_only``) of bf16 /
    fp16 operands on 1-CTA tiles or (``cta_group`` 2 / 4) clusters along M; the fused op
    refuses it.
    ``pingpong``: ping-pong MMA warp groups; None: the bf16 GEMM alone takes them where
    ``launch.rules.choose_gemm_pingpong`` does (one GPU measures it), the fused op never.

    Experiments, off by default until two GPUs time them: ``push_ctas`` CTAs that only
    push (RS); ``lean_exit`` the exit without system fences; ``pingpong=True`` on the fused
    op. ``trace`` records per-CTA event times (``GemmRsAr.read_trace``).

    ``x_box``: a plain GEMM call whose last tile row holds fewer rows than the tile loads
    that row of x in boxes of those rows rounded up to 8, 16 or a multiple of 16 up to 112
    (``Variant.x_rows``; bf16 / fp16 on 1-CTA tiles and clusters along M; never
    ping-pong), not boxes of the tile's rows that the TMA fills with zeros; None:
    ``launch.rules.choose_x_box`` decides (the box wherever a kernel has it; boxes dividing
    no tile, 48 / 80 / 96 / 112, while ``launch.rules.X_BOX_UNEVEN`` is on, as it is); False:
    whole boxes.

    ``l2_hint``: the eviction priority the mainloop's TMA loads of x and w give L2
    (``Variant.l2_hint``, sm90): "normal", "first" or "last" by a ``createpolicy`` policy,
    "fixed_normal" / "fixed_first" / "fixed_last" by CUTLASS's fixed policy words; "" the
    DSL's own operand (0); None: ``launch.rules.choose_gemm_l2_hint`` decides (evict-last
    for the plain GEMM at K <= 1024, M >= 512; "" elsewhere).

    ``tma_promo``: the L2 promotion of the mainloop's TMA descriptors of x and w
    (``Variant.tma_promo``, sm90): "none", "64B", "128B" or "256B", encoded by the driver
    (``launch.tma_descs``); "" or None the DSL's own descriptors. An experiment.
    """

    bn: int | None = None
    bm: int | None = None
    cta_group: int | None = None
    lag: int | None = None
    band: int | None = None
    peers_first: bool | None = None
    pair_n: bool = False
    push_all: bool | None = None
    flat: bool | None = None
    sk: bool | None = None
    split_row: bool | None = None
    push: str | None = None
    stages: int | None = None
    epi_slots: int = 0
    pdl: bool = True
    prefetch: bool = True
    early_copy: bool = True
    push_window: bool | None = None
    tma_store: bool | None = None
    push_ctas: int = 0
    lean_exit: bool | None = None
    pingpong: bool | None = None
    x_box: bool | None = None
    l2_hint: str | None = None
    tma_promo: str | None = None
    trace: bool = False

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not _valid(f.name, value):
                raise RsarValueError(f"Tuning.{f.name} must be {_ACCEPTS[f.name]}, got "
                                     f"{value!r}")

    def changed(self) -> dict[str, Any]:
        """The fields set away from their defaults."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default}

    def replace(self, **changes: Any) -> "Tuning":
        """A copy with ``changes``; an unknown field raises RsarValueError."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise RsarValueError(f"Tuning has no field {', '.join(sorted(unknown))}; its "
                                 f"fields are {', '.join(_ACCEPTS)}")
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """``Tuning(bn=192, ...)`` of the changed fields only: the same text on every rank
        for the same value (what ranks compare to agree on it)."""
        return "Tuning(" + ", ".join(f"{k}={v!r}" for k, v in sorted(self.changed().items())) + ")"


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _valid(name: str, v: Any) -> bool:
    if name in ("pair_n", "pdl", "prefetch", "early_copy", "trace"):
        return _is_bool(v)
    if name in ("peers_first", "push_all", "flat", "sk", "split_row", "push_window",
                "tma_store", "lean_exit", "pingpong", "x_box"):
        return v is None or _is_bool(v)
    if name == "bn":
        return v is None or (_is_int(v) and v in TILE_NS)
    if name == "bm":
        return v is None or (_is_int(v) and v in TILE_MS)
    if name == "cta_group":
        return v is None or (_is_int(v) and v in CTA_GROUPS)
    if name == "lag":
        return v is None or (_is_int(v) and v in (0, 1))
    if name == "band":
        return v is None or (_is_int(v) and 0 <= v <= MAX_BAND)
    if name == "push":
        return v is None or v in PUSHES
    if name == "l2_hint":
        return v is None or (isinstance(v, str) and v in L2_HINTS)
    if name == "tma_promo":
        return v is None or (isinstance(v, str) and v in TMA_PROMOS)
    if name == "stages":
        return v is None or (_is_int(v) and v in STAGES)
    if name == "epi_slots":
        return _is_int(v) and v in EPI_SLOTS
    if name == "push_ctas":
        return _is_int(v) and v >= 0
    raise AssertionError(f"no validation for Tuning.{name}")
