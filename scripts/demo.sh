#!/usr/bin/env bash
# README command 1: install what is missing, build, run the main job with the default config.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec "${BUILD_DIR:-build}/cli/oscarkv" demo "$@"
