#!/usr/bin/env bash
# Where the B=1 decode time goes (device only): the GPU tests, then an A/B of two kernel_bench
# binaries (BASE = the one the change is measured against, e.g. main's, and the new one) on the
# default, graph-replay and capture-decoder rows, alternating BASE NEW BASE NEW; then the new
# binary's per-CTA timeline (two consecutive launches), its plan-size sweep and option A/B at
# B=1 x 32K and 1 x 100K; then Nsight Compute on one B=1 launch of the INT2 kernel when ncu
# exists. Everything under timeout; logs packed into $OUT/logs.tar.gz, a short summary last.
#   here:   pack both binaries (and cuda_kernels_gpu_test) into one carry.tar.xz whose carry/
#           holds kernel_bench (new) and kernel_bench_base, see scripts/gpu/collect.sh
#   device: run(command="bash scripts/gpu/b1_breakdown.sh .devcarry/NAME/carry.tar.xz", carry=[...])
set -uo pipefail
payload=${1:?carry.tar.xz}
out=${OUT:-/tmp/oscarkv-b1-out}
log=$out/logs
mkdir -p "$log" /tmp/oscarkv-carry && tar xJf "$payload" -C /tmp/oscarkv-carry
c=/tmp/oscarkv-carry/carry
here=$(cd "$(dirname "$0")" && pwd)  # timeline_summary.py beside this script
export LD_LIBRARY_PATH=$c/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$log/nvidia_smi.txt" 2>&1
: >"$log/steps.txt"
step() {  # step NAME SECONDS CMD...
  local name=$1 secs=$2 t rc
  shift 2
  t=$(date +%s)
  timeout "$secs" "$@" >"$log/$name.txt" 2>"$log/$name.err"
  rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t )) s" >>"$log/steps.txt"
  return $rc
}
common=(--sdpa '' --gemm '' --extend '' --quant-rows NONE --prefill-tokens 0 --int2-only)
step gpu_test 45 "$c/cuda_kernels_gpu_test" --gtest_brief=1
# A/B of the binaries: default / graph replay / capture decoder (+ unrotate) rows.
for i in 1 2; do
  step "ab_base$i" 30 "$c/kernel_bench_base" "${common[@]}" --shapes 1x32768,1x100000,8x32768 --baseline-only \
    --rounds 2 --json
  step "ab_new$i" 30 "$c/kernel_bench" "${common[@]}" --shapes 1x32768,1x100000,8x32768 --baseline-only \
    --rounds 2 --json
done
# The new binary's timeline, plan sizes and launch options at B=1.
step timeline 70 "$c/kernel_bench" "${common[@]}" --shapes 1x32768,1x100000 --eager-only --no-capture-row \
  --rounds 3 --timeline "$log/timeline.csv" --target-ctas 0,wide104,wide112,wide128,wide136 \
  --ab "${AB:-early0,early2,evict_normal,l2pf2}" --json
for s in 1x32768 1x100000; do
  python3 "$here/timeline_summary.py" "$log/timeline.csv" "default/$s" 1980 >"$log/tl_default_$s.txt" 2>&1
done
if command -v ncu >/dev/null; then
  for s in 1x32768 1x100000; do
    step "ncu_$s" 40 ncu --clock-control none -k regex:DecodeInt2 -s 8 -c 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats \
      --section Occupancy --metrics dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum \
      "$c/kernel_bench" "${common[@]}" --shapes "$s" --baseline-only --eager-only --no-capture-row --samples 2
  done
else
  echo "no ncu" >"$log/ncu_none.txt"
fi
echo "== $(tail -1 "$log/nvidia_smi.txt"); total $(( $(date +%s) - T0 )) s"
cat "$log/steps.txt"
echo "== GPU tests: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\]' "$log/gpu_test.txt" | tr '\n' ' ')"
grep -E '^\[  FAILED' "$log/gpu_test.txt" | head -8
for f in ab_base1 ab_new1 ab_base2 ab_new2 timeline; do
  echo "== $f"
  grep -E '\[bench\]   INT2|decode B=' "$log/$f.err" | sed 's/max diff vs CPU (seq 0)/cpu/' | cut -c1-150
done
grep -h -E 'target|wide' "$log/timeline.txt" | head -20
for s in 1x32768 1x100000; do echo "== timeline default/$s"; cat "$log/tl_default_$s.txt"; done
for s in 1x32768 1x100000; do
  [ -f "$log/ncu_$s.txt" ] && { echo "== ncu $s"; grep -E 'Duration|DRAM|Memory Throughput|dram__|L2 Hit|Stall|Warp Cycles|Issued|Eligible|Achieved Occ|Registers' "$log/ncu_$s.txt" | head -40; }
done
tar czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$log"
