#!/usr/bin/env bash
# The README's first command: install what is missing, build, and open the vitlens viewer on the
# bundled demo image and hand-designed model. Without a display it says so and exports the demo
# image's heatmaps with the command line instead. Extra arguments go to `vitlens view`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
BUILD_DIR="${VITLENS_BUILD_DIR:-build}"
if [[ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ]] && "$BUILD_DIR/app/vitlens" view "$@"; then
  exit 0
fi
OUT="${VITLENS_OUT:-vitlens-out}"
echo "run: no usable display for the viewer; exporting the demo image's heatmaps with 'vitlens export' instead" >&2
mkdir -p "$OUT"
"$BUILD_DIR/app/vitlens" export assets/images/vitlens-demo.png --out "$OUT"
echo "Heatmaps of the demo image are in $OUT/ (open $OUT/vitlens-demo_montage.png)."
