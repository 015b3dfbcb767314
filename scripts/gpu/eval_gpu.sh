#!/usr/bin/env bash
# Issue 5 item 3 acceptance in one device call: the CudaAttention GPU test, then `oscarkv eval`
# on the CPU path and on the GPU path (--device cuda) over the same windows (16 windows, seed 1,
# every codec, the calibrated rotations), both tables, and per codec |GPU - CPU| of bpb and
# recall bpb against the 0.002 bound. Full logs and JSON go to $OUT.
#
#   here:   cmake -S . -B build-eng -G Ninja -DCMAKE_BUILD_TYPE=Release \
#             -DOSCARKV_MODULES="engine;calibrate;cli;transport" \
#             -DOSCARKV_ENGINE_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3
#           ninja -C build-eng -j2 oscarkv engine_cuda_attention_gpu_test
#           scripts/gpu/eval_gpu.sh pack /tmp/rot_final   # -> build-eng/carry (xz, ~10 MB)
#           scripts/gpu/eval_gpu.sh                        # dry run: no GPU -> fails clearly
#   device: run(command="scripts/gpu/eval_gpu.sh", carry=["build-eng/carry"])
# The reference model comes from <root>/shared/refmodel (the checkout's shared/ travels with the
# tree) or $OSCARKV_REFMODEL; `INCLUDE_MODEL=1 ... pack` puts it into the payload instead.
# Environment: WINDOWS (default 16), SEED (1), CODECS (all five), BUILD (build-eng).
# Portable binaries: the engine is built for x86-64-v3, not -march=native (the device's CPU is
# another one); the CPU and GPU tables come from the same binary in the same call.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
b=${BUILD:-$root/build-eng}
carry=$b/carry

if [ "${1:-}" = pack ]; then
  set -e
  rot=${2:?usage: eval_gpu.sh pack ROTATIONS_DIR}
  model=${OSCARKV_REFMODEL:-/work/shared/refmodel}
  stage=$(mktemp -d)
  mkdir -p "$stage/bin" "$stage/lib" "$stage/refmodel" "$stage/rot"
  for bin in cli/oscarkv engine/engine_cuda_attention_gpu_test; do
    cp "$b/$bin" "$stage/bin/" && strip "$stage/bin/$(basename "$bin")"
    ldd "$b/$bin" | awk '/=>/ {print $3}' |
      grep -vE 'libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux|libdl|libpthread|librt' |
      while read -r lib; do cp -Ln "$lib" "$stage/lib/" 2>/dev/null || true; done
  done
  if [ "${INCLUDE_MODEL:-0}" = 1 ]; then
    cp "$model"/config.json "$model"/*.safetensors "$model"/model.safetensors.index.json \
       "$model"/val.txt "$stage/refmodel/"
  fi
  cp "$rot"/rotations.json "$rot"/rotations.safetensors "$stage/rot/"
  rm -rf "$carry" && mkdir -p "$carry"
  tar -C "$stage" -cf - . | xz -T2 -6 >"$carry/payload.tar.xz"
  rm -rf "$stage"
  du -sh "$carry"
  exit 0
fi

out=${OUT:-/tmp/oscarkv-eval-gpu-out}
mkdir -p "$out"
work=$(mktemp -d)
t0=$(date +%s)
if [ ! -f "$carry/payload.tar.xz" ]; then
  echo "no $carry/payload.tar.xz: run 'scripts/gpu/eval_gpu.sh pack ROTATIONS_DIR' first" >&2
  exit 2
fi
xz -dc "$carry/payload.tar.xz" 2>/dev/null | tar -C "$work" -xf - ||
  python3 -c "import lzma,sys,tarfile; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" \
    "$carry/payload.tar.xz" "$work" || { echo "cannot unpack the payload" >&2; exit 2; }
export LD_LIBRARY_PATH=$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [ -f "$work/refmodel/config.json" ]; then
  export OSCARKV_REFMODEL=$work/refmodel
elif [ -z "${OSCARKV_REFMODEL:-}" ]; then
  for m in "$root/shared/refmodel" "$root/../shared/refmodel"; do
    [ -f "$m/config.json" ] && export OSCARKV_REFMODEL=$(cd "$m" && pwd) && break
  done
fi
model=${OSCARKV_REFMODEL:?no reference model: set OSCARKV_REFMODEL or pack with INCLUDE_MODEL=1}
export OSCARKV_SOURCE_DIR=$root
bin=$work/bin
echo "== $(nproc) CPU cores; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
echo "== unpacked in $(( $(date +%s) - t0 )) s"

# 1. CudaAttention vs MixedPrecisionAttention (skips, and says so, without a GPU).
timeout 90 "$bin/engine_cuda_attention_gpu_test" >"$out/gpu_test.log" 2>&1
test_rc=$?
echo "== gpu test rc=$test_rc ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$out/gpu_test.log" | tr '\n' ' ')"
grep -E 'no CUDA device|Failure|^\[  FAILED|^  (eval|naive)' "$out/gpu_test.log" | head -40
grep -E '^  refmodel sink 64 recent 256' "$out/gpu_test.log" | head -40

# 2. The same eval on both paths.
args=(eval --model "$model" --text "$model/val.txt" --rotations "$work/rot"
      --windows "${WINDOWS:-16}" --seed "${SEED:-1}" --json)
[ -n "${CODECS:-}" ] && args+=(--codecs "$CODECS")
rc=0
for dev in cpu cuda; do
  t1=$(date +%s)
  timeout 130 "$bin/oscarkv" "${args[@]}" --device "$dev" >"$out/eval_$dev.json" 2>"$out/eval_$dev.err"
  r=$?
  echo "== oscarkv eval --device $dev rc=$r ($(( $(date +%s) - t1 )) s)"
  if [ $r -ne 0 ]; then
    tail -3 "$out/eval_$dev.err"
    rc=1
  fi
done
echo "== command: oscarkv ${args[*]//$work\//} --device cpu|cuda  (rot = the calibrated artifact)"
python3 - "$out/eval_cpu.json" "$out/eval_cuda.json" <<'EOF' || rc=1
import json, math, sys
def load(p):
    try:
        return {r["codec"]: r for r in json.load(open(p))["rows"]}
    except Exception as e:
        print(f"no table in {p}: {e}")
        return None
cpu, gpu = load(sys.argv[1]), load(sys.argv[2])
for name, t in (("CPU (MixedPrecisionAttention)", cpu), ("GPU (CudaAttention)", gpu)):
    if t is None:
        continue
    print(f"\n{name}\n{'codec':<16} {'bpb':>8} {'gap':>9} {'recall_bpb':>11} {'recall_gap':>11}")
    for c, r in t.items():
        print(f"{c:<16} {r['bpb']:8.4f} {r['gap']:+9.4f} {r['recall_bpb']:11.4f} {r['recall_gap']:+11.4f}")
if cpu is None or gpu is None:
    print("\nFAIL: the GPU path did not produce a table (no GPU, or see eval_cuda.err)")
    sys.exit(1)
print(f"\n{'codec':<16} {'|d bpb|':>9} {'|d recall|':>11}  (bound 0.002)")
ok = True
for c in cpu:
    db, dr = abs(gpu[c]["bpb"] - cpu[c]["bpb"]), abs(gpu[c]["recall_bpb"] - cpu[c]["recall_bpb"])
    good = db <= 0.002 and dr <= 0.002
    ok &= good
    print(f"{c:<16} {db:9.5f} {dr:11.5f}  {'ok' if good else 'FAIL'}")
print("\nPASS: every codec within 0.002 bpb" if ok else "\nFAIL")
sys.exit(0 if ok else 1)
EOF
echo "== total $(( $(date +%s) - t0 )) s"
rm -rf "$work"
exit $(( test_rc || rc ))
