#!/usr/bin/env bash
# The README's first command: install what is missing, build, and run vitlens on the bundled
# demo image and hand-designed model. Extra arguments go to `vitlens export`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
BUILD_DIR="${VITLENS_BUILD_DIR:-build}"
OUT="${VITLENS_OUT:-vitlens-out}"
mkdir -p "$OUT"
"$BUILD_DIR/app/vitlens" export assets/images/vitlens-demo.png --out "$OUT" "$@"
echo "Heatmaps of the demo image are in $OUT/ (open $OUT/vitlens-demo_montage.png)."
