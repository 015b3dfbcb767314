#!/usr/bin/env bash
# Installs what is missing (Debian packages), configures and builds oscarkv in Release.
#   scripts/setup.sh            install + build into ./build
# Environment: BUILD_DIR (default build), OSCARKV_JOBS (default nproc), OSCARKV_SKIP_APT=1.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libabsl-dev libssl-dev libxxhash-dev nlohmann-json3-dev libyaml-cpp-dev libeigen3-dev
  libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libucx-dev ucx-utils librocksdb-dev libcpp-httplib-dev iproute2 python3
)

if [[ "${OSCARKV_SKIP_APT:-0}" != 1 ]]; then
  missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "==> installing ${#missing[@]} missing packages: ${missing[*]}"
    SUDO=""
    [[ $(id -u) -ne 0 ]] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    echo "==> all ${#PACKAGES[@]} packages present"
  fi
fi

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${OSCARKV_JOBS:-$(nproc)}
echo "==> configuring ${BUILD_DIR} (Release)"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${OSCARKV_CMAKE_ARGS:-}
echo "==> building with ${JOBS} jobs"
cmake --build "$BUILD_DIR" -j "$JOBS"
