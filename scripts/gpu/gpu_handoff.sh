#!/usr/bin/env bash
# Same-node GPU->GPU prefill->decode handoff (issue 6 item 4) on the two-GPU device kind.
#
#   here (CPU):  cmake -S . -B build-nccl -G Ninja -DCMAKE_BUILD_TYPE=Release \
#                  -DOSCARKV_MODULES="transport;engine;calibrate;pd;cli" -DOSCARKV_ENGINE_NATIVE=OFF
#                ninja -C build-nccl -j2 oscarkv pd_gpu_handoff_gpu_test
#                BUILD=build-nccl scripts/gpu/gpu_handoff.sh pack
#   device:      run(command="scripts/gpu/gpu_handoff.sh", carry=["build-nccl/carry"],
#                    kind="nvidia-h200-x2")
# (The device gets a copy of the checkout `run` belongs to: build-nccl/carry must be there.)
#
# `pack` puts the stripped binaries, their non-system shared libraries (ldd; never libnccl --
# the device has its own) -- and the reference model unless the tree has shared/refmodel --
# into one xz tarball (OpenBLAS alone is 35 MB uncompressed). The run unpacks it, then: (1) the 32K-token
# Qwen3-8B-shaped request, INT2 vs BF16 pages, by CUDA IPC and NCCL beside cudaMemcpyPeerAsync
# (medians of --reps), (2) the real reference model's request handed over and continued on the
# decode GPU, compared with a single-process run, (3) the gpu-labelled test (peer death at each
# stage). Full logs go to $OUT; a short summary is printed last. Without two GPUs it says so and
# exits 3. Extra arguments go to the benchmark run (e.g. --reps 50).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
b=${BUILD:-$root/build-nccl}
[ -d "$b" ] || b=$root/$b

if [ "${1:-}" = pack ]; then
  set -e
  stage=$(mktemp -d)
  mkdir -p "$stage/p/lib"
  for bin in cli/oscarkv pd/pd_gpu_handoff_gpu_test; do
    [ -f "$b/$bin" ] || { echo "missing $b/$bin: build it first" >&2; exit 2; }
    cp "$b/$bin" "$stage/p/" && strip "$stage/p/$(basename $bin)"
    ldd "$b/$bin" | awk '/=>/ {print $3}' |
      grep -vE 'libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux|libdl|libpthread|librt|libnccl|libcuda\.' |
      while read -r lib; do cp -Ln "$lib" "$stage/p/lib/" 2>/dev/null || true; done
  done
  # The device's copy of the tree has shared/refmodel when the checkout has one; else pack it.
  model=${OSCARKV_REFMODEL:-/work/shared/refmodel}
  if [ ! -f "$root/shared/refmodel/config.json" ] && [ -f "$model/config.json" ]; then
    cp -r "$model" "$stage/p/refmodel" && chmod -R u+w "$stage/p/refmodel"
  fi
  rm -rf "$b/carry" && mkdir -p "$b/carry"
  tar -C "$stage" -cf - p | xz -T2 -6 >"$b/carry/payload.tar.xz"
  rm -rf "$stage"
  du -sh "$b/carry"
  exit 0
fi

out=${OUT:-/tmp/oscarkv-gpu-handoff-out}
mkdir -p "$out"
payload=${CARRY:-$b/carry}/payload.tar.xz
if [ ! -f "$payload" ]; then
  echo "no $payload: run 'scripts/gpu/gpu_handoff.sh pack' on the build machine first" >&2
  exit 2
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -lt 2 ]; then
  echo "gpu_handoff.sh: needs 2 GPUs, found ${gpus:-0} (use the nvidia-h200-x2 device kind); skipped" >&2
  exit 3
fi
p=/tmp/oscarkv-gpu-handoff-payload
rm -rf "$p" && mkdir -p "$p"
tar -C "$p" -xJf "$payload" 2>/dev/null ||
  python3 -c "import sys,tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$payload" "$p"
p=$p/p
nccl_lib=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null ||
  echo /opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib)
export LD_LIBRARY_PATH=$p/lib:$nccl_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
model=$p/refmodel
[ -f "$model/config.json" ] || model=$root/shared/refmodel
[ -f "$model/config.json" ] || model=$PWD/shared/refmodel
export NCCL_NVLS_ENABLE=0 OSCARKV_CLI=$p/oscarkv OSCARKV_REFMODEL=$model
t0=$(date +%s)
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv >"$out/nvidia_smi.txt" 2>&1
nvidia-smi topo -m >"$out/topo.txt" 2>&1
ls "$nccl_lib" >"$out/nccl_lib.txt" 2>&1

timeout 100 "$p/oscarkv" pd gpu-handoff --synthetic qwen3-8b --context 32768 --reps 30 --warmup 3 \
  --json "$@" >"$out/bench.txt" 2>"$out/bench.err"
bench_rc=$?
t1=$(date +%s)
timeout 60 "$p/oscarkv" pd gpu-handoff --model "$model" --prompt-bytes 1024 --tokens 32 \
  --reps 5 --warmup 1 --json >"$out/e2e.txt" 2>"$out/e2e.err"
e2e_rc=$?
t2=$(date +%s)
timeout 120 "$p/pd_gpu_handoff_gpu_test" >"$out/gpu_test.log" 2>&1
test_rc=$?
t3=$(date +%s)

echo "== $(sed -n 2p "$out/nvidia_smi.txt") x$gpus; NCCL from $nccl_lib"
echo "== bench rc=$bench_rc ($((t1 - t0)) s): oscarkv pd gpu-handoff --synthetic qwen3-8b --context 32768 --reps 30 --warmup 3 $*"
grep -v '^{' "$out/bench.txt"; tail -3 "$out/bench.err"
echo "== e2e rc=$e2e_rc ($((t2 - t1)) s): oscarkv pd gpu-handoff --model refmodel --prompt-bytes 1024 --tokens 32"
grep -v '^{' "$out/e2e.txt"; tail -3 "$out/e2e.err"
echo "== gpu test rc=$test_rc ($((t3 - t2)) s): $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\]' "$out/gpu_test.log" | tr '\n' ' ')"
grep -E '^\[  FAILED|Failure' "$out/gpu_test.log" | head -20
grep -E '^\[ +OK|^\[  FAILED' "$out/gpu_test.log" | head -12
grep '^{' "$out/bench.txt" | python3 -c "import json,sys; j=json.loads(sys.stdin.read()); print({k: v for k, v in j.items() if k.startswith('handoff')})" 2>/dev/null
exit $(( bench_rc || e2e_rc || test_rc ))
