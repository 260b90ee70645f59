#!/usr/bin/env bash
# The README's second command (CI runs it via .ci/run): install what is missing, then
#   1. the g++ Release build (build/ or $VITLENS_BUILD_DIR) and the whole ctest suite;
#   2. scripts/test-sanitize.sh: a clang 14 ASan + UBSan build (build-asan/) and the whole suite
#      under it, then each libFuzzer harness (tests/fuzz) for 30 s from the committed seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
BUILD_DIR="${VITLENS_BUILD_DIR:-build}"
echo "test: the whole suite, g++ Release ($BUILD_DIR)"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$(nproc)"
scripts/test-sanitize.sh
