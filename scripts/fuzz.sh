#!/usr/bin/env bash
# Runs a libFuzzer target for longer than the few seconds its unit test gives it (CI builds with
# gcc and runs each entry point over seeds and mutations: service_local_frame_fuzz_test,
# service_fuzz_test). Needs clang and libclang-rt-dev (Debian: apt-get install clang
# libclang-rt-14-dev); builds the service libraries instrumented (-fsanitize=fuzzer-no-link,
# address, undefined) into $FUZZ_BUILD_DIR (default build-fuzz), then runs the target.
#   scripts/fuzz.sh local_frame [seconds=60] [libFuzzer flags...]   # the local socket's framing
#   scripts/fuzz.sh request     [seconds=60] [libFuzzer flags...]   # PageCache request validation
# The corpus grows in $FUZZ_BUILD_DIR/corpus/<target>/; a crashing input is written to
# $FUZZ_BUILD_DIR/crash-<target>-* and the script exits non-zero. Replay one with
#   $FUZZ_BUILD_DIR/service/service_<target>_fuzzer <file>
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: scripts/fuzz.sh local_frame|request [seconds] [libFuzzer flags...]}
seconds=${2:-60}
shift $(( $# >= 2 ? 2 : 1 ))
case "$target" in
  local_frame) bin=service_local_frame_fuzzer ;;
  request) bin=service_request_fuzzer ;;
  *) echo "unknown fuzz target '$target' (local_frame, request)" >&2; exit 2 ;;
esac
command -v clang++ >/dev/null || { echo "clang++ not found (apt-get install clang libclang-rt-14-dev)" >&2; exit 2; }
dir=${FUZZ_BUILD_DIR:-build-fuzz}
san="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DOSCARKV_ENABLE_CUDA=OFF \
  -DOSCARKV_BUILD_BENCHMARKS=OFF -DCMAKE_C_FLAGS="$san" -DCMAKE_CXX_FLAGS="$san" >/dev/null
cmake --build "$dir" -j "${OSCARKV_JOBS:-$(nproc)}" --target "$bin"
mkdir -p "$dir/corpus/$target"
# -rss_limit_mb: the in-process daemon's pool and the sanitizers' shadow memory.
exec "$dir/service/$bin" "$dir/corpus/$target" -max_total_time="$seconds" -rss_limit_mb=4096 \
  -artifact_prefix="$dir/crash-$target-" -print_final_stats=1 "$@"
