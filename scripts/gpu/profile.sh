#!/usr/bin/env bash
# Profiles the INT2 decode kernel at one shape with Nsight Compute and dumps its SASS, for
# tuning. Device only; writes to $OUT.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
c=${CARRY:-$root/build-cuda/carry}
out=${OUT:-/tmp/oscarkv-gpu-out}
shape=${1:-32x32768}
export LD_LIBRARY_PATH=$c/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cuobjdump -sass "$c/kernel_bench" >"$out/kernel_bench.sass" 2>&1
ncu --clock-control none -k regex:DecodeKernel -s 3 -c 1 \
  --section SpeedOfLight --section WarpStateStats --section InstructionStats \
  --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats \
  "$c/kernel_bench" --shapes "$shape" --sdpa '' --samples 2 --int2-only >"$out/ncu.txt" 2>&1
grep -E "Duration|Throughput|Registers|Achieved Occupancy|Theoretical Occupancy|Stall|Issued|Eligible|Warp Cycles|Executed Ipc|No Eligible|Block Limit" "$out/ncu.txt" | head -60
