"""May NVLink multicast be used? Decided from the environment, before any driver call.

``RSAR_MULTICAST=auto|on|off`` (default auto) is rsar's own switch. Site administrators
turn multicast off for every library at once with the variables that torch symmetric
memory, NCCL and NVSHMEM read; a site sets those for a reason (on some hosts creating a
multicast object can take the GPUs out of service), so any one of them forbids it here
too, and the decision names the variable that decided.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from .errors import MulticastPolicyError, RsarValueError

__all__ = ["PolicyDecision", "decide", "resolve", "MODES", "SITE_SWITCHES"]

MODES = ("auto", "on", "off")

_TRUE = {"1", "true", "yes", "y", "on"}
_FALSE = {"0", "false", "no", "n", "off"}

# (variable, the values that forbid multicast, how the documented off value reads)
SITE_SWITCHES: tuple[tuple[str, frozenset[str], str], ...] = (
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", frozenset(_TRUE), "1"),
    ("NCCL_NVLS_ENABLE", frozenset(_FALSE), "0"),
    ("NVSHMEM_DISABLE_NVLS", frozenset(_TRUE), "1"),
)


@dataclass(frozen=True)
class PolicyDecision:
    """What the environment asked for and whether multicast may be tried at all."""

    requested: str  # "auto" | "on" | "off"
    allowed: bool
    reason: str


def _site_forbids(env: Mapping[str, str]) -> list[str]:
    hits = []
    for var, forbidding, _ in SITE_SWITCHES:
        raw = env.get(var)
        if raw is not None and raw.strip().lower() in forbidding:
            hits.append(f"{var}={raw.strip()}")
    return hits


def decide(env: Mapping[str, str] | None = None, *, auto_off: str = "") -> PolicyDecision:
    """Read the policy from ``env`` (default os.environ). No driver call.

    ``auto_off``: why ``auto`` stays on unicast for this caller (a caller whose kernels
    should not take the multicast path unasked); empty, ``auto`` allows multicast. ``on`` and
    the site's switches are unaffected.

    Raises ValueError for an RSAR_MULTICAST value outside auto|on|off, and
    MulticastPolicyError for RSAR_MULTICAST=on where a site variable forbids multicast.
    """
    env = os.environ if env is None else env
    raw = env.get("RSAR_MULTICAST")
    requested = "auto" if raw is None or not raw.strip() else raw.strip().lower()
    if requested not in MODES:
        raise RsarValueError(f"RSAR_MULTICAST must be one of auto, on, off; got {raw!r}")
    forbidden_by = _site_forbids(env)
    if requested == "off":
        reason = "RSAR_MULTICAST=off"
        if forbidden_by:
            reason += f" (also {', '.join(forbidden_by)})"
        return PolicyDecision("off", False, reason)
    if forbidden_by:
        which = ", ".join(forbidden_by)
        if requested == "on":
            raise MulticastPolicyError(
                f"RSAR_MULTICAST=on, but {which} forbids NVLink multicast on this site; "
                "unset one of them"
            )
        return PolicyDecision("auto", False, f"{which} forbids multicast")
    if requested == "on":
        return PolicyDecision("on", True, "RSAR_MULTICAST=on")
    src = "RSAR_MULTICAST=auto" if raw is not None else "RSAR_MULTICAST unset (auto)"
    if auto_off:
        return PolicyDecision("auto", False, f"{src}: {auto_off}")
    return PolicyDecision("auto", True, f"{src}: multicast where every device supports it")


def resolve(decision: PolicyDecision, device_supports_multicast: bool,
            why_unsupported: str) -> tuple[bool, str]:
    """Combine the policy with what the devices can do: (use multicast, reason).

    Raises MulticastPolicyError when multicast was required (on) but is unavailable.
    """
    if not decision.allowed:
        return False, decision.reason
    if device_supports_multicast:
        return True, f"{decision.reason}; devices support multicast"
    if decision.requested == "on":
        raise MulticastPolicyError(
            f"RSAR_MULTICAST=on, but multicast is unavailable: {why_unsupported}"
        )
    return False, f"multicast unavailable: {why_unsupported}"
