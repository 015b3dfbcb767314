#!/usr/bin/env bash
# README command 2: install what is missing, build, run the test suite (GPU tests skip
# themselves on machines without a GPU and say so).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cd "${BUILD_DIR:-build}"
exec ctest --output-on-failure -j "${OSCARKV_TEST_JOBS:-2}" --timeout 600 "$@"
