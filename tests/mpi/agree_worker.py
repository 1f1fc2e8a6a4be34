"""Worker: failure agreement across processes (one rank fails, every rank raises)."""
from __future__ import annotations

import time
from typing import Any

from _worker import PeerError, main, peer_error

from multicast.agree import agree, all_true
from multicast.bootstrap import make_bootstrap


class StepFailed(RuntimeError):
    pass


def fail(failing: str, timing: str) -> dict[str, Any]:
    """Steps 'one' and 'three' succeed everywhere; in step 'two' the ranks listed in
    ``failing`` (comma separated) raise. ``timing`` 'early': they fail at once while the
    others are still busy; 'late': the others wait in the agreement while they work."""
    bs = make_bootstrap(None)
    r = bs.rank
    bad = {int(x) for x in failing.split(",")}
    res: dict[str, Any] = {"one": agree(bs, "one", lambda: r * 2)}
    undone: list[int] = []

    def two() -> int:
        if (r in bad) == (timing == "late"):
            time.sleep(0.5)
        if r in bad:
            raise StepFailed(f"step two broke on rank {r}")
        return 100 + r

    started = time.monotonic()
    try:
        res["two"] = agree(bs, "two", two, undo=undone.append)
        res["error"] = None
    except PeerError as e:
        res["error"] = peer_error(e, started)
        res["cause_message"] = str(e.__cause__) if e.__cause__ is not None else None
    res["undone"] = undone
    # Everybody raised at the same step, so the next step still lines up.
    res["three"] = agree(bs, "three", lambda: r + 1000)
    res["all_true_all"] = all_true(bs, True)
    res["all_true_without_failing"] = all_true(bs, r not in bad)
    return res


if __name__ == "__main__":
    main({"fail": fail})
