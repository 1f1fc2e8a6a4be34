#!/usr/bin/env bash
# Every GPU check, one log each, on a host with 2 GPUs:   tests/gpu/run_all.sh OUTDIR
# (RSAR_GPU_WORLD=4 or 8: the suites at that many ranks, on a host with as many GPUs; the demo
# stays at 2.)
# (On one GPU, RSAR_ALLOW_SHARED_GPU=1 lets the two ranks share it: functional only, ~4 ms a
# call; the demo refuses a one-GPU host.)
# Each step has a time limit so a hang costs minutes, not the whole session; the summary
# line of each step is printed at the end. RSAR_SKIP_FUSED=1 leaves out the fused suite (the
# longest step) when it ran on its own; RSAR_STEPS="fused partial ..." runs only the steps
# named (a device call has 10 minutes: split the list over calls, the cache kept between them).
# With RSAR_KERNEL_CACHE=DIR the kernels are compiled up front, in parallel: the default
# variants and every variant an earlier run logged in DIR/variants.jsonl (the suites force
# plans no default picks) or in tests/gpu/variants.jsonl; this run logs its own there. A second
# run, or a DIR filled on a CPU build machine from those logs (scripts/precompile.py
# --from-log tests/gpu/variants.jsonl), compiles nothing.
set -u
out=${1:-gpu-logs}
mkdir -p "$out"
export RSAR_TIMEOUT_S=${RSAR_TIMEOUT_S:-5} RSAR_GPU_REPORT=$out/report.json
W=${RSAR_GPU_WORLD:-2}
P="python3 -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning"
STEPS="fused partial fine_widths rows64 x_loads pingpong early_copy bias f16 fp8 embedding torch_op
symmetric hf tp_mpirun tp_bias tp_torchrun hf_generate demo"
for s in ${RSAR_STEPS:-}; do  # a misspelt step would skip silently
  [[ " ${STEPS//$'\n'/ } " == *" $s "* ]] || { echo "unknown step $s (${STEPS//$'\n'/ })" >&2; exit 2; }
done
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  [ -n "${RSAR_STEPS:-}" ] && [[ " $RSAR_STEPS " != *" $name "* ]] && [ "$name" != precompile ] && return
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - t0))s :: $(grep -E 'passed|failed|error|PASS|FAIL|speedup|rsar precompile' "$out/$name.log" | tail -1)"
}
if [ -n "${RSAR_KERNEL_CACHE:-}" ]; then
  export RSAR_VARIANT_LOG=${RSAR_VARIANT_LOG:-$RSAR_KERNEL_CACHE/variants.jsonl}
  arch=$(python3 -c "import torch; print('sm_%d%da' % torch.cuda.get_device_capability())")
  # tests/gpu/variants.jsonl: what these suites launched when it was recorded (world 2)
  logged=(--from-log tests/gpu/variants.jsonl)
  [ -s "$RSAR_VARIANT_LOG" ] && logged+=(--from-log "$RSAR_VARIANT_LOG")
  # --any-world: at 4 or 8 ranks the world-2 log's variants are built at that world
  run precompile 600 python3 scripts/precompile.py --arch "$arch" --world "$W" --any-world \
    --transports unicast --bias --out "$RSAR_KERNEL_CACHE" ${logged[@]+"${logged[@]}"}
fi
[ -z "${RSAR_SKIP_FUSED:-}" ] && run fused 420 mpirun -n "$W" $P tests/gpu/test_fused_gpu.py
run partial 300 mpirun -n "$W" $P tests/gpu/test_partial_tiles_gpu.py
run fine_widths 300 mpirun -n "$W" $P tests/gpu/test_fine_widths_gpu.py
run rows64 400 mpirun -n "$W" $P tests/gpu/test_rows64_gpu.py
run x_loads 240 mpirun -n "$W" $P tests/gpu/test_x_loads_gpu.py
run pingpong 300 mpirun -n "$W" $P tests/gpu/test_pingpong_gpu.py
run early_copy 90 mpirun -n "$W" $P tests/gpu/test_early_copy_gpu.py
run bias 240 mpirun -n "$W" $P tests/gpu/test_bias_gpu.py
run f16 300 mpirun -n "$W" $P tests/gpu/test_f16_gpu.py
run fp8 420 mpirun -n "$W" $P tests/gpu/test_fp8_gpu.py
run embedding 150 mpirun -n "$W" $P tests/gpu/test_embedding_gpu.py
run torch_op 120 mpirun -n "$W" $P tests/gpu/test_torch_op_gpu.py
run symmetric 60 mpirun -n "$W" $P tests/gpu/test_symmetric_gpu.py
# transformers models (tests/gpu/test_hf_gpu.py); first calls compile kernels and Inductor
run hf 420 mpirun -n "$W" $P tests/gpu/test_hf_gpu.py
run tp_mpirun 90 mpirun -n "$W" python3 scripts/tp_worker.py --json "$out/tp_mpirun.json"
run tp_bias 90 mpirun -n "$W" python3 scripts/tp_worker.py --bias --json "$out/tp_bias.json"
run tp_torchrun 90 torchrun --nproc-per-node "$W" scripts/tp_worker.py --torchrun
run hf_generate 300 torchrun --nproc-per-node "$W" scripts/hf_generate.py --model tiny-llama
run demo 60 mpirun -n 2 python3 scripts/demo.py
