#!/usr/bin/env bash
# The README's two pictures, made by vitlens itself from its bundled demo
# image and designed model, the query on the bright square's left edge (pixel 122,40; patch row
# 10, column 30), where each head shows its job:
#   docs/images/montage.png       `vitlens export`'s montage: the image, each head, their mean
#   docs/images/viewer.png        the viewer's window (1440x900) on the same query, under xvfb-run
# Usage: scripts/make_readme_images.sh [BUILD_DIR]   (default build/; needs a build with the viewer)
set -euo pipefail
cd "$(dirname "$0")/.."
VITLENS="${1:-build}/app/vitlens"
[ -x "$VITLENS" ] || { echo "make_readme_images: no $VITLENS; build first (scripts/build.sh)" >&2; exit 1; }
command -v xvfb-run >/dev/null || { echo "make_readme_images: xvfb-run is missing (scripts/setup.sh installs it)" >&2; exit 1; }

IMAGE=assets/images/vitlens-demo.png
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

"$VITLENS" export "$IMAGE" --model designed --query 122,40 --out "$WORK/export" --quiet
cp "$WORK/export/vitlens-demo_montage.png" docs/images/montage.png

# The viewer with no saved settings (a fresh config folder), pinned on the same patch.
cat > "$WORK/screenshot.txt" <<SCRIPT
pin 10 30
screenshot $WORK/viewer.png
quit
SCRIPT
XDG_CONFIG_HOME="$WORK/config" xvfb-run -a -s "-screen 0 1440x900x24" \
  "$VITLENS" view "$IMAGE" --model designed --script "$WORK/screenshot.txt"
cp "$WORK/viewer.png" docs/images/viewer.png
ls -l docs/images/montage.png docs/images/viewer.png
