#!/usr/bin/env bash
# One device call: CPU-reference tests, GPU kernel tests (both decode kernels, every range mode,
# CUDA-graph capture and replay), then the kernel benchmark (SDPA BF16 baseline, oscarkv BF16
# pages, OSCAR INT2 pages with the default launch beside its alternatives, copy bandwidth,
# extend rows, quantize-on-write and its prefill-step share), then write_probe (what bounds the
# write) -- all in this one process tree.
# Full logs, CSV, SVG plot and JSON go to $OUT; a short summary is printed last. Fits one
# 10-minute call: the GPU tests take seconds, the bench is capped at 400 s.
#   here:   cmake -S . -B build-f -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSCARKV_MODULES=bench
#           ninja -C build-f -j2 cuda_kernels_gpu_test cuda_reference_test kernel_bench
#           BUILD=build-f scripts/gpu/collect.sh
#   device: run(command="CARRY=build-f/carry.tar.xz scripts/gpu/run_all.sh",
#               carry=["build-f/carry.tar.xz"])   (or the folder itself, if the tree allows)
# Extra arguments go to kernel_bench (e.g. --shapes 32x32768 --samples 50).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
c=${CARRY:-$root/build-f/carry}
# A packed payload (collect.sh writes carry.tar.xz beside the folder; the device's tree limit
# counts shared/ too) is unpacked to /tmp first.
if [[ "$c" == *.tar.xz && -f "$c" ]]; then
  mkdir -p /tmp/oscarkv-carry && tar xJf "$c" -C /tmp/oscarkv-carry && c=/tmp/oscarkv-carry/carry
fi
[ -d "$c" ] || c=$root/build-cuda/carry
out=${OUT:-/tmp/oscarkv-gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$c/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
shift_args=("$@")
t0=$(date +%s)

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv \
  >"$out/nvidia_smi.txt" 2>&1

"$c/cuda_reference_test" --gtest_brief=1 >"$out/reference_test.log" 2>&1
ref_rc=$?
timeout 120 "$c/cuda_kernels_gpu_test" >"$out/gpu_test.log" 2>&1
gpu_rc=$?
t1=$(date +%s)

timeout ${BENCH_TIMEOUT:-400} "$c/kernel_bench" --sdpa "python3 $c/sdpa_baseline.py" --gemm "python3 $c/gemm_baseline.py" \
  --csv "$out/kernel_bench.csv" --plot "$out/kernel_bench.svg" --json "${shift_args[@]}" \
  >"$out/kernel_bench.txt" 2>"$out/kernel_bench.err"
bench_rc=$?
sed -n '/^{/,$p' "$out/kernel_bench.txt" >"$out/kernel_bench.json"
t2=$(date +%s)
# What bounds the write (pipes, per-tile code beside the wgmmas, the walk's memory ceiling).
probe_rc=0
if [ -x "$c/write_probe" ] && [ -z "${SKIP_PROBE:-}" ]; then
  timeout 60 "$c/write_probe" >"$out/write_probe.txt" 2>&1
  probe_rc=$?
fi

echo "== $(head -2 "$out/nvidia_smi.txt" | tail -1)"
echo "== cpu reference tests rc=$ref_rc: $(grep -E '^\[  (PASSED|FAILED)' "$out/reference_test.log" | tr '\n' ' ')"
echo "== gpu tests rc=$gpu_rc ($((t1 - t0)) s): $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$out/gpu_test.log" | tr '\n' ' ')"
grep -E '^\[  FAILED|Failure|gpu .* ref |\[ graph \]' "$out/gpu_test.log" | head -30
echo "== kernel bench rc=$bench_rc ($((t2 - t1)) s)"
tail -5 "$out/kernel_bench.err"
sed -n '1,/^{/p' "$out/kernel_bench.txt" | grep -v '^{'
grep -E '"(int2_vs_sdpa_b32_32k|int2_vs_sdpa_b1_100k|int2_vs_sdpa_b1_32k|bf16pages_vs_sdpa_b32_32k|int2_vs_sdpa_[a-z0-9]+_graph|bf16pages_vs_sdpa_b32_32k_graph|int2_bw_fraction_b32|quant_bw_fraction|int2_best_variant_b32_32k|int2_best_variant_b1_100k|int2_default_vs_fastest_worst|int2_default_check_ok|quant_prefill_step_us|quant_share_of_attention_projections|quant_share_of_attention_projections_sdpa|quant_share_of_layer|extend_vs_best_sdpa_32k_512|extend_vs_sdpa_flash_32k_512|extend_tflops_32k_512)"' \
  "$out/kernel_bench.json"
if [ -f "$out/write_probe.txt" ]; then
  echo "== write probe rc=$probe_rc"
  cat "$out/write_probe.txt"
fi
exit $(( ref_rc || gpu_rc || bench_rc || probe_rc ))
