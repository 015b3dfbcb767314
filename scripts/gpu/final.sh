#!/usr/bin/env bash
# The session's last device call for the kernels: CPU reference tests, every GPU kernel test, the
# decode rows of `kernel_bench` with cold L2 (the default: every side cycles over K/V copies
# reading >= 4x the L2) and with --warm-l2 (one copy re-read), then the 32K+512 extend and plain
# prefill rows; full logs under $OUT, a short table last. Every step under `timeout`; expected
# wall time on an H200 ~150 s (GPU tests ~17 s, each decode run ~40-60 s, extend ~30 s; from
# bench/results logs), caps sum to 235 s.
#   here:   cmake --build build -j2 --target cuda_reference_test cuda_kernels_gpu_test kernel_bench
#           BUILD=$PWD/build scripts/gpu/collect.sh      # -> build/carry.tar.xz, ~14 MB
#           (collect.sh also packs build/cli/oscarkv when it exists, with its gRPC/RocksDB/UCX
#           libraries: 210 MB, over the 64 MiB carry; use a build dir without it, or move it aside)
#           mkdir -p /work/main/.devcarry/final && cp build/carry.tar.xz /work/main/.devcarry/final/
#   device: run(command="bash scripts/gpu/final.sh .devcarry/final/carry.tar.xz",
#               carry=[".devcarry/final"], timeout_s=300)
# Extra arguments go to both decode runs of kernel_bench.
set -uo pipefail
payload=${1:?carry.tar.xz}
shift
out=${OUT:-/tmp/oscarkv-final-out}
mkdir -p "$out" /tmp/oscarkv-carry && tar xJf "$payload" -C /tmp/oscarkv-carry
c=/tmp/oscarkv-carry/carry
export LD_LIBRARY_PATH=$c/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$out/nvidia_smi.txt" 2>&1
step() {  # step NAME SECONDS CMD...: runs CMD under timeout, stdout/stderr to $out/NAME.{txt,err}
  local name=$1 secs=$2 t
  shift 2
  t=$(date +%s)
  timeout "$secs" "$@" >"$out/$name.txt" 2>"$out/$name.err"
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t )) s" >>"$out/steps.txt"
  return $rc
}
: >"$out/steps.txt"
step reference_test 20 "$c/cuda_reference_test" --gtest_brief=1
ref_rc=$?
step gpu_test 45 "$c/cuda_kernels_gpu_test" --gtest_brief=1
gpu_rc=$?
dec=(--sdpa "python3 $c/sdpa_baseline.py" --gemm '' --extend '' --quant-rows NONE --prefill-tokens 0
     --rounds 3 --json)
step decode_cold 70 "$c/kernel_bench" "${dec[@]}" "$@"
cold_rc=$?
# (the warm run: the default launch and its graph / capture-decoder rows only)
step decode_warm 50 "$c/kernel_bench" "${dec[@]}" --warm-l2 --baseline-only "$@"
warm_rc=$?
step extend 50 "$c/kernel_bench" --extend-only --extend 1x32768x512,4x0x8192 --samples 10 \
  --sdpa "python3 $c/sdpa_baseline.py" --json
ext_rc=$?

echo "== $(tail -1 "$out/nvidia_smi.txt"); total $(( $(date +%s) - T0 )) s"
cat "$out/steps.txt"
echo "== reference tests: $(grep -E '^\[  (PASSED|FAILED) +\]' "$out/reference_test.txt" | tr '\n' ' ')"
echo "== GPU tests: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\]' "$out/gpu_test.txt" | tr '\n' ' ')"
grep -E '^\[  FAILED' "$out/gpu_test.txt" | head -8
grep -h MISMATCH "$out/decode_cold.err" "$out/decode_warm.err" | head -8
for f in decode_cold decode_warm extend; do tail -2 "$out/$f.err" | sed "s/^/[$f] /"; done
python3 - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
def report(name):
    try:
        text = open(f"{out}/{name}.txt").read()
        return json.JSONDecoder().raw_decode(text[text.index("\n{") + 1:])[0]
    except Exception as e:  # noqa: BLE001 - a step that failed: say so, keep the rest
        print(f"({name}: no JSON: {type(e).__name__})")
        return None
cold, warm, ext = report("decode_cold"), report("decode_warm"), report("extend")
if cold:
    print("decode, one layer, us (cold L2 = K/V copies >= 4x the %.0f MB L2; warm = one copy re-read)"
          % (cold.get("l2_bytes", 0) / 1e6))
    print("%-3s %-6s | %8s %8s %6s | %8s %8s | %8s %8s | %9s %9s | %8s %8s" % (
        "B", "L", "SDPAcold", "INT2cold", "xSDPA", "SDPAwarm", "INT2warm", "INT2grph", "warmgrph",
        "capt.cold", "+unrot", "captwarm", "+unrot"))
    wrows = {(d["B"], d["L"]): d for d in (warm or {}).get("decode", [])}
    for d in cold.get("decode", []):
        w = wrows.get((d["B"], d["L"]), {})
        ratio = d["sdpa_us"] / d["int2_us"] if d["int2_us"] else 0
        print("%-3d %-6d | %8.1f %8.1f %5.2fx | %8.1f %8.1f | %8.1f %8.1f | %9.1f %9.1f | %8.1f %8.1f" % (
            d["B"], d["L"], d["sdpa_us"], d["int2_us"], ratio, w.get("sdpa_us", 0), w.get("int2_us", 0),
            d["int2_graph_us"], w.get("int2_graph_us", 0), d.get("int2_capture_us", 0),
            d.get("int2_capture_unrotate_us", 0), w.get("int2_capture_us", 0),
            w.get("int2_capture_unrotate_us", 0)))
    for d in cold.get("decode", []):
        w = wrows.get((d["B"], d["L"]), {})
        print("  BF16 pages B=%d L=%d: bench %.1f us, torch op's launch (capture decoder, unrotated) %.1f us; "
              "warm %.1f / %.1f" % (d["B"], d["L"], d["bf16_pages_us"], d.get("bf16_pages_capture_unrotate_us", 0),
                                    w.get("bf16_pages_us", 0), w.get("bf16_pages_capture_unrotate_us", 0)))
    for k in ("int2_vs_sdpa_b1_100k", "int2_vs_sdpa_b32_32k", "int2_vs_sdpa_b1_100k_graph",
              "int2_vs_sdpa_b32_32k_graph", "int2_default_vs_fastest_worst", "int2_default_check_ok"):
        print("  cold %s = %s" % (k, cold.get(k)))
if ext:
    print("extend, one layer: B prefix new | oscarkv us | best SDPA us | x best SDPA")
    for e in ext.get("extend", []):
        us, best = e.get("us", 0), e.get("sdpa_best_us", 0)
        print("  %-3d %-6d %-5d | %9.1f | %9.1f | %5.2fx" % (e["B"], e["prefix"], e["new_tokens"], us, best,
                                                          best / us if us else 0))
    for k in ("extend_vs_best_sdpa_32k_512", "extend_vs_sdpa_flash_32k_512", "extend_tflops_32k_512"):
        print("  %s = %s" % (k, ext.get(k)))
EOF
exit $(( ref_rc || gpu_rc || cold_rc || warm_rc || ext_rc ))
