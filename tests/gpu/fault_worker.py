"""One rank of the fault test: a loop of GemmRsAr calls over a torch.distributed (gloo)
process group, so the test can kill a rank without an MPI launcher tearing the job down.

    python fault_worker.py RANK WORLD INIT_FILE PROGRESS_FILE
Exit 17 after reporting an RsarTimeoutError, 0 if the loop ends normally.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from rsar_core import GemmRsAr, RsarTimeoutError  # noqa: E402
from rsar_core.reference import rank_inputs  # noqa: E402


def main() -> int:
    rank, world, init_file, progress = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dev = torch.device("cuda", rank % torch.cuda.device_count())  # one GPU: shared (opt-in)
    torch.cuda.set_device(dev)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    op = GemmRsAr(max_M=1024, N=384, comm=dist.group.WORLD, timeout_s=2.0)
    x, w = rank_inputs(1, rank, 1000, 384, 256, dev)
    t_fail = None
    try:
        for i in range(100000):
            op(x, w)
            torch.cuda.synchronize()
            op.check()
            with open(progress, "w") as f:
                f.write(str(i))
            t_fail = time.monotonic()
    except RsarTimeoutError as e:
        waited = time.monotonic() - (t_fail or time.monotonic())
        print(f"RsarTimeoutError after {waited:.2f} s: {e}", flush=True)
        os._exit(17)  # the peer is gone: no collective teardown is possible
    return 0


if __name__ == "__main__":
    sys.exit(main())
