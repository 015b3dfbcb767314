#!/usr/bin/env bash
# One device call for the extend (chunked-prefill) kernels: the extend GPU tests, the other GPU
# kernel tests, then `kernel_bench --extend-only` (oscarkv beside SDPA cuDNN / flash /
# memory-efficient on dense BF16 K/V); full logs under $OUT, a short table last.
#   here:   BUILD=build-f scripts/gpu/collect.sh   (after building the three targets)
#   device: run(command="bash scripts/gpu/extend_run.sh build-f/carry.tar.xz", carry=[...])
# Extra arguments go to kernel_bench.
set -uo pipefail
payload=${1:?carry.tar.xz}
shift
out=${OUT:-/tmp/oscarkv-extend-out}
mkdir -p "$out" /tmp/oscarkv-carry && tar xJf "$payload" -C /tmp/oscarkv-carry
c=/tmp/oscarkv-carry/carry
export LD_LIBRARY_PATH=$c/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$out/nvidia_smi.txt" 2>&1
if command -v cuobjdump >/dev/null; then
  cuobjdump --dump-sass "$c/cuda_kernels_gpu_test" 2>/dev/null | awk '/Function :/ {f=$3} /HGMMA/ {n[f]++} END {for (k in n) print n[k], k}' \
    | grep -i extend >"$out/sass_hgmma.txt"
fi
timeout 200 "$c/cuda_kernels_gpu_test" --gtest_filter='Extend*' >"$out/extend_gpu_test.log" 2>&1
ext_rc=$?
timeout 120 "$c/cuda_kernels_gpu_test" --gtest_filter='-Extend*' --gtest_brief=1 >"$out/other_gpu_test.log" 2>&1
oth_rc=$?
t1=$(date +%s)
timeout 240 "$c/kernel_bench" --extend-only --sdpa "python3 $c/sdpa_baseline.py" --json "$@" \
  >"$out/extend_bench.txt" 2>"$out/extend_bench.err"
bench_rc=$?
t2=$(date +%s)
echo "== $(tail -1 "$out/nvidia_smi.txt")"
echo "== HGMMA per extend kernel: $(tr '\n' ' ' <"$out/sass_hgmma.txt" 2>/dev/null | cut -c1-300)"
echo "== extend gpu tests rc=$ext_rc ($((t1 - t0)) s incl. others): $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\]' "$out/extend_gpu_test.log" | tr '\n' ' ')"
grep -E '^\[  FAILED|Failure|gpu .* ref |max abs|error' "$out/extend_gpu_test.log" | head -24
echo "== other gpu tests rc=$oth_rc: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\]' "$out/other_gpu_test.log" | tr '\n' ' ')"
grep -E '^\[  FAILED' "$out/other_gpu_test.log" | head -8
echo "== extend bench rc=$bench_rc ($((t2 - t1)) s)"
tail -4 "$out/extend_bench.err"
sed -n '1,/^{/p' "$out/extend_bench.txt" | grep -v '^{'
grep -E '"extend_(vs_best_sdpa|vs_sdpa_flash|tflops)_32k_512"' "$out/extend_bench.txt"
exit $(( ext_rc || oth_rc || bench_rc ))
