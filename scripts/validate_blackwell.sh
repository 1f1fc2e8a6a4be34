#!/usr/bin/env bash
# Validate the sm100 kernel on a Blackwell host (B200 / GB200, compute capability 10.0).
#
# The sm100 kernel (launch/sm100_kernel.py) has only been compiled and PTX-checked in CI;
# this is the first run on real hardware: the GPU test suite (correctness of RS / AR against
# torch, timeouts, teardown) and the quick benchmark grid, on 2 ranks.
#
# Multicast: RSAR_MULTICAST is left as the site sets it (default auto). NVLink multicast
# (multimem.ld_reduce / multimem.st) is available on B200 / GB200 NVLink domains and may be
# used where the site's policy allows; export RSAR_MULTICAST=off (or keep
# NCCL_NVLS_ENABLE=0 etc.) to test the unicast transport, RSAR_MULTICAST=on to insist on
# multicast. Run both where policy permits.
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
if cc != (10, 0):
    raise SystemExit("not a compute capability 10.0 (B200/GB200) device: sm_100a kernels will not load")
PY
echo "RSAR_MULTICAST=${RSAR_MULTICAST:-<unset: auto>}"

mpirun -n "$NP" "$PY" -m pytest -q tests/gpu "$@"
mpirun -n "$NP" "$PY" scripts/bench.py --quick
