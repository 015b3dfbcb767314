#!/usr/bin/env bash
# Profiles the INT2 decode kernel at one shape with Nsight Compute (speed of light, warp
# stall reasons, pipe utilization, hottest SASS), for tuning. Device only; writes to $OUT.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
c=${CARRY:-$root/build-cuda/carry}
out=${OUT:-/tmp/oscarkv-gpu-out}
shape=${1:-32x32768}
export LD_LIBRARY_PATH=$c/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ncu --clock-control none -k regex:DecodeInt2 -s 2 -c 1 \
  --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
  --section SchedulerStats --section SourceCounters --section Occupancy \
  --metrics smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_misc_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio,smsp__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active \
  "$c/kernel_bench" --shapes "$shape" --sdpa '' --samples 2 --int2-only >"$out/ncu.txt" 2>&1
grep -E "stalled|Duration|Throughput|Issued Warp|Eligible Warps|Active Warps|pipe|Pipe" "$out/ncu.txt" | head -60
