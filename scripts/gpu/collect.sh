#!/usr/bin/env bash
# Gathers the device-run payload into build-cuda/carry: stripped binaries, the shared
# libraries they need (ldd, minus libc/libm/libstdc++/libgcc, which the device has), and the
# Python baseline. Run here (CPU machine) after building; pass the folder to `run` as carry.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
b=${BUILD:-$root/build-f}
out=$b/carry
rm -rf "$out" && mkdir -p "$out/lib"
# (bench/kernel_bench_base: an A/B partner binary put there by hand, e.g. main's kernel_bench)
for bin in kernels/cuda/cuda_kernels_gpu_test kernels/cuda/cuda_reference_test bench/kernel_bench bench/kernel_bench_base \
    bench/write_probe cli/oscarkv; do
  [ -f "$b/$bin" ] || continue
  cp "$b/$bin" "$out/" && strip "$out/$(basename $bin)"
  # (a binary may need none of them: grep then finds nothing, which is not an error)
  { ldd "$b/$bin" | awk '/=>/ {print $3}' | grep -vE 'libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux|libdl|libpthread|librt' || true; } |
    while read -r lib; do cp -Ln "$lib" "$out/lib/" 2>/dev/null || true; done
done
cp "$root/bench/sdpa_baseline.py" "$root/bench/gemm_baseline.py" "$out/" 2>/dev/null || true
# Packed copy for the device call (its 64 MiB tree limit counts the checkout's shared/ too).
tar cJf "$b/carry.tar.xz" -C "$b" carry
du -sh "$out" "$b/carry.tar.xz"
