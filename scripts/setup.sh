#!/usr/bin/env bash
# Installs what is missing (Debian packages), configures and builds oscarkv in Release.
#   scripts/setup.sh            install + build into ./build
# Environment: BUILD_DIR (default build), OSCARKV_JOBS (default nproc), OSCARKV_SKIP_APT=1,
# OSCARKV_SKIP_PIP=1 (no Python venv: python/'s tests are then not registered with ctest).
# The Python package's environment is ./.venv (git-ignored): numpy and pytest from PyPI, and
# `pip install ./python` with the built liboscarkv_c.so bundled into it.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libabsl-dev libssl-dev libxxhash-dev nlohmann-json3-dev libyaml-cpp-dev libeigen3-dev
  libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libucx-dev ucx-utils librocksdb-dev libcpp-httplib-dev iproute2 python3 python3-venv openssl
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

# The deployment check (deploy/chart_check.py, ctest deploy_chart_test): Helm's template engine
# (helm-python-sdk: the Helm Go SDK as a library; no helm binary is packaged for Debian or PyPI)
# and the Kubernetes API schemas (kubernetes-validate), from PyPI into $BUILD_DIR/deploy-venv.
# OSCARKV_SKIP_DEPLOY_TOOLS=1 skips it (the container image build does).
if [[ "${OSCARKV_SKIP_DEPLOY_TOOLS:-0}" != 1 ]]; then
  VENV="$BUILD_DIR/deploy-venv"
  if ! "$VENV/bin/python" -c "import helm_python, kubernetes_validate" 2>/dev/null; then
    echo "==> installing the deployment check tools into $VENV"
    mkdir -p "$BUILD_DIR"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check \
      helm-python-sdk==0.2.2 kubernetes-validate==1.37.0
  fi
fi

PY_VENV=$(realpath -m "${OSCARKV_PY_VENV:-.venv}")
if [[ "${OSCARKV_SKIP_PIP:-0}" != 1 ]]; then
  # Before configuring: ctest registers python/'s tests when this venv has numpy and pytest.
  [[ -x "$PY_VENV/bin/python" ]] || { echo "==> creating $PY_VENV"; python3 -m venv "$PY_VENV"; }
  echo "==> $PY_VENV: numpy, pytest"
  "$PY_VENV/bin/python" -m pip install -q --disable-pip-version-check numpy pytest
fi
echo "==> configuring ${BUILD_DIR} (Release)"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DOSCARKV_PYTHON="$PY_VENV/bin/python" ${OSCARKV_CMAKE_ARGS:-}
echo "==> building with ${JOBS} jobs"
cmake --build "$BUILD_DIR" -j "$JOBS"
if [[ "${OSCARKV_SKIP_PIP:-0}" != 1 ]]; then
  echo "==> pip install ./python into $PY_VENV (liboscarkv_c.so bundled)"
  OSCARKV_LIBRARY="$(realpath -m "$BUILD_DIR")/client/liboscarkv_c.so" \
    "$PY_VENV/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall \
    --no-deps ./python
  (cd / && "$PY_VENV/bin/python" -c \
    "import oscarkv; print('==> oscarkv', oscarkv.__version__, 'uses', oscarkv.library_path())")
fi
