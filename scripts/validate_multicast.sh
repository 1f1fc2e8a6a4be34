#!/usr/bin/env bash
# Validate the NVLink multicast transport on a host whose site allows multicast.
#
# The multicast kernels (multimem.ld_reduce / multimem.st) have been compiled and PTX-checked
# in CI only: the machines rsar was built on forbid multicast. Until a run of this script has
# passed somewhere, RSAR_MULTICAST=auto keeps GemmRsAr on unicast (README, "Multicast policy").
#
# NEVER run it where the site has switched multicast off (TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
# NCCL_NVLS_ENABLE=0, NVSHMEM_DISABLE_NVLS=1 or RSAR_MULTICAST=off): on some hosts creating a
# multicast object can take the GPUs out of service. The script stops before any GPU work when
# one of them is set, and mc_diag.py must report multicast usable before anything creates the
# op's workspace.
#
#   scripts/validate_multicast.sh OUTDIR [extra pytest args]      (NP=4 for more ranks)
#
# Steps, logs in OUTDIR: mc_diag.py with RSAR_MULTICAST=on (its multicast check creates one
# object and reduces through it), the GPU suites on the multicast transport, the quick grid.
set -euo pipefail
out=${1:?usage: scripts/validate_multicast.sh OUTDIR [pytest args]}
shift
for v in TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 RSAR_MULTICAST=off; do
  name=${v%%=*}; off=${v#*=}
  if [ "${!name:-}" = "$off" ]; then
    echo "validate_multicast: $name=$off here: the site forbids multicast; stopping" >&2
    exit 2
  fi
done
mkdir -p "$out"
out=$(cd "$out" && pwd)  # the steps run from the repository root
cd "$(dirname "$0")/.."
NP="${NP:-2}"
PY="${PYTHON:-python3}"
# from here on the op must run multicast or fail
export RSAR_MULTICAST=on

echo "1/3 diagnostics (mc_diag.py, multicast check)"
if ! mpirun -n "$NP" "$PY" scripts/mc_diag.py --json "$out/mc_diag.json" > "$out/mc_diag.log" 2>&1; then
  echo "mc_diag.py failed: multicast is not usable here, see $out/mc_diag.log" >&2
  exit 1
fi
"$PY" - "$out/mc_diag.json" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1]))
pol = rep.get("policy", {})
if not pol.get("use_multicast"):
    raise SystemExit(f"mc_diag.py: multicast not used: {pol.get('decision')}")
print("   multicast:", pol.get("decision"))
PY

echo "2/3 GPU suites on the multicast transport"
mpirun -n "$NP" "$PY" -m pytest -q tests/gpu "$@" 2>&1 | tee "$out/tests.log" | tail -3

echo "3/3 quick grid (RS and AR against torch.mm + NCCL)"
mpirun -n "$NP" "$PY" scripts/bench.py --quick --json "$out/bench.json" --md "$out/bench.md" \
  > "$out/bench.log" 2>&1
tail -3 "$out/bench.log"
