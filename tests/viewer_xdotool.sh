#!/bin/sh
# viewer_xdotool.sh VITLENS VIEWER_CHECK OUT IMAGE MODEL (ctest viewer_xdotool, under xvfb-run).
# The viewer runs as a user runs it (no script: the real X pointer and keyboard drive it, and it
# reads and saves its settings). It writes its widgets' rectangles (--dump-widgets); xdotool then
# taps arrow keys (12 ms presses, and presses released at once), clicks a radio button, a
# checkbox and the Export button where the dump says they are, and closes the window; finally
# `viewer_check xdotool` reads what the viewer wrote. Exit 77 (skipped) without xdotool.
set -eu
VITLENS=$1 CHECK=$2 OUT=$3 IMAGE=$4 MODEL=$5
command -v xdotool >/dev/null 2>&1 || { echo "skipped: xdotool not found (scripts/setup.sh installs it)"; exit 77; }
rm -rf "$OUT"
mkdir -p "$OUT"
export XDG_CONFIG_HOME="$OUT/config" VITLENS_EXPORT_DIR="$OUT/exports"

"$VITLENS" view "$IMAGE" --model "$MODEL" --dump-widgets "$OUT/widgets.json" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT
tries=0
until [ -s "$OUT/widgets.json" ]; do
  tries=$((tries + 1))
  if [ "$tries" -gt 600 ] || ! kill -0 "$pid" 2>/dev/null; then echo "FAIL  no widget list after 60 s"; exit 1; fi
  sleep 0.1
done
window=$(xdotool search --name '^vitlens' | head -n 1)
xdotool windowfocus "$window"

# Moves the pointer onto the middle of a widget of the dump ("WINDOW > SECTION > LABEL").
point_at() {
  xy=$("$CHECK" widget-centre "$OUT/widgets.json" "$1")
  # shellcheck disable=SC2086
  xdotool mousemove --window "$window" $xy
  sleep 0.2
}
click() {
  point_at "$1"
  xdotool click 1
  sleep 0.5
}

# Arrow keys over the heads (the query starts at the centre, patch (28, 28) of 56x56).
point_at "Heads > mean"
for n in 1 2 3; do
  xdotool keydown Right sleep 0.012 keyup Right
  sleep 0.3
done
for n in 1 2; do
  xdotool keydown Down keyup Down
  sleep 0.3
done

click "Controls > Display > log"
click "Controls > Display > patch grid"
click "Controls > Export and screenshot > Export"
# Done when the viewer has taken the export's result (it then remembers the folder).
tries=0
until grep -q '"export_folder": *"/' "$OUT/config/vitlens/settings.json" 2>/dev/null; do
  tries=$((tries + 1))
  if [ "$tries" -gt 300 ]; then break; fi
  sleep 0.1
done

# Close as the window manager would (the viewer saves its settings on the way out).
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
trap - EXIT
if [ "$status" -ne 0 ]; then echo "FAIL  the viewer exited with $status"; exit 1; fi
exec "$CHECK" xdotool "$OUT"
