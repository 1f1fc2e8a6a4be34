#!/usr/bin/env bash
# Validate the sm100 kernel on a Blackwell host (B200 / GB200, compute capability 10.0; B300 /
# GB300, 10.3, run the same source built for sm_103a).
#
# The sm100 kernel (launch/sm100_kernel.py) has only been compiled and PTX-checked in CI;
# this is the first run on real hardware: the GPU test suite (correctness of RS / AR against
# torch, timeouts, teardown) and the quick benchmark grid, on 2 ranks.
#
# Multicast: RSAR_MULTICAST is left as the site sets it. Unset or auto, the op runs unicast
# (its multicast kernels have not been validated on a GPU yet); RSAR_MULTICAST=on runs the
# multicast transport (multimem.ld_reduce / multimem.st) where the devices and the site's
# policy allow it. Run both where policy permits.
#
# Usage: scripts/validate_blackwell.sh [extra pytest args]   (NP=4 for more ranks)
set -euo pipefail
cd "$(dirname "$0")/.."
NP="${NP:-2}"
PY="${PYTHON:-python3}"

"$PY" - <<'PY'
import torch
cc = torch.cuda.get_device_capability()
print(f"device: {torch.cuda.get_device_name()} cc={cc} count={torch.cuda.device_count()}")
if cc not in ((10, 0), (10, 3)):
    raise SystemExit(f"compute capability {cc} is not 10.0 (B200/GB200) or 10.3 (B300/GB300): "
                     "no sm100 kernel loads here")
PY
echo "RSAR_MULTICAST=${RSAR_MULTICAST:-<unset: auto>}"

mpirun -n "$NP" "$PY" -m pytest -q tests/gpu "$@"
mpirun -n "$NP" "$PY" scripts/bench.py --quick
