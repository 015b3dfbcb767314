#!/usr/bin/env bash
# README command 2: install what is missing, build, run the test suite (GPU tests skip
# themselves on machines without a GPU and say so).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cd "${BUILD_DIR:-build}"
# python/'s pytest suite must be part of the run (setup.sh made its venv), never silently absent.
if [[ "${OSCARKV_SKIP_PIP:-0}" != 1 ]] && ! ctest -N -R '^python_package_test$' | grep -q 'Total Tests: 1'; then
  echo "python_package_test is not registered (no venv with numpy and pytest?)" >&2
  exit 1
fi
exec ctest --output-on-failure -j "${OSCARKV_TEST_JOBS:-2}" --timeout 600 "$@"
