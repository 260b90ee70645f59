#!/usr/bin/env bash
# Configures and builds vitlens in Release into ./build (or $VITLENS_BUILD_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${VITLENS_BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DVITLENS_BUILD_VIEWER=ON >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
