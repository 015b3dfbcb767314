#!/usr/bin/env bash
# One device call: CPU-reference tests, GPU kernel tests, then the kernel benchmark (SDPA BF16
# baseline, oscarkv BF16 pages, OSCAR INT2 pages, copy bandwidth, quantize-on-write) -- all in
# this one process tree. Full logs go to $OUT; a short summary is printed last.
#   here:   ninja -C build-cuda -j2 cuda_kernels_gpu_test cuda_reference_test kernel_bench
#           scripts/gpu/collect.sh
#   device: run(command="scripts/gpu/run_all.sh", carry=["build-cuda/carry"])
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
c=${CARRY:-$root/build-cuda/carry}
out=${OUT:-/tmp/oscarkv-gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$c/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
shift_args=("$@")

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv \
  >"$out/nvidia_smi.txt" 2>&1

"$c/cuda_reference_test" --gtest_brief=1 >"$out/reference_test.log" 2>&1
ref_rc=$?
timeout 300 "$c/cuda_kernels_gpu_test" >"$out/gpu_test.log" 2>&1
gpu_rc=$?

timeout 420 "$c/kernel_bench" --sdpa "python3 $c/sdpa_baseline.py" \
  --csv "$out/kernel_bench.csv" --plot "$out/kernel_bench.svg" --json "${shift_args[@]}" \
  >"$out/kernel_bench.txt" 2>"$out/kernel_bench.err"
bench_rc=$?

echo "== $(head -2 "$out/nvidia_smi.txt" | tail -1)"
echo "== cpu reference tests rc=$ref_rc: $(grep -E '^\[  (PASSED|FAILED)' "$out/reference_test.log" | tr '\n' ' ')"
echo "== gpu tests rc=$gpu_rc: $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$out/gpu_test.log" | tr '\n' ' ')"
grep -E '^\[  FAILED|Failure|gpu .* ref ' "$out/gpu_test.log" | head -20
echo "== kernel bench rc=$bench_rc"
tail -5 "$out/kernel_bench.err"
cat "$out/kernel_bench.txt"
exit $(( ref_rc || gpu_rc || bench_rc ))
