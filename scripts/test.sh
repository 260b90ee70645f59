#!/usr/bin/env bash
# The README's second command: install what is missing, build, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
BUILD_DIR="${VITLENS_BUILD_DIR:-build}"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$(nproc)"
