#!/bin/sh
# viewer_xdotool.sh VITLENS VIEWER_CHECK OUT IMAGE MODEL (ctest viewer_xdotool, under xvfb-run).
# The viewer runs as a user runs it (no script: the real X pointer and keyboard drive it, and it
# reads and saves its settings). It writes its widgets' rectangles (--dump-widgets); xdotool then
# taps arrow keys (12 ms presses, and presses released at once), clicks a radio button, a
# checkbox and the Export button where the dump says they are; drags the softmax temperature and
# exports again (the command line shown and the files carry --temperature); clicks the
# 'received' mode (its one-line description shows); opens the Model menu, hovers its first entry
# (the description beside the menu covers no entry) and opens the 28 px Fashion-MNIST model (the
# Controls window and the status bar name the same size and tokens); closes the window; finally
# `viewer_check xdotool` reads what the viewer wrote. Every wait is for a state of the dump or
# a file, within a limit far above what it takes. Exit 77 (skipped) without xdotool.
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

# Polls (every 0.1 s, up to $1 s) until the command after it succeeds; fails naming $2 otherwise.
wait_until() {
  limit=$1
  deadline=$(($(date +%s) + limit))
  what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    kill -0 "$pid" 2>/dev/null || { echo "FAIL  the viewer exited while waiting for $what"; exit 1; }
    [ "$(date +%s)" -le "$deadline" ] || { echo "FAIL  waited $limit s for $what"; "$@"; exit 1; }
    sleep 0.1
  done
}
# Copies the dump as it is now (the viewer may rewrite it while a check reads it).
snapshot() { cp "$OUT/widgets.json" "$OUT/$1"; }

click "Controls > Display > log"
click "Controls > Display > patch grid"
click "Controls > Export and screenshot > Export"
# Done when the viewer has taken the export's result (it then remembers the folder).
wait_until 120 "the first export" grep -q '"export_folder": *"/' "$OUT/config/vitlens/settings.json"

# The softmax temperature: a CLI setting like the others, so the command line shown names it and
# the export writes no viewer-only notes. Drag the T slider to a quarter of its (log) track.
click "Controls > Softmax scale > temperature"
wait_until 60 "the temperature slider" "$CHECK" widget-centre "$OUT/widgets.json" "Controls > Softmax scale > T"
from=$("$CHECK" widget-point "$OUT/widgets.json" "Controls > Softmax scale > T" 0.5 0.5)
to=$("$CHECK" widget-point "$OUT/widgets.json" "Controls > Softmax scale > T" 0.25 0.5)
# shellcheck disable=SC2086
xdotool mousemove --window "$window" $from mousedown 1 sleep 0.2 mousemove --window "$window" $to sleep 0.2 mouseup 1
wait_until 60 "the shown command line to name --temperature" "$CHECK" text "$OUT/widgets.json" Controls "--temperature 0."
click "Controls > Export and screenshot > Export"
wait_until 120 "the second export (with the temperature)" grep -q '"temperature": 0\.' "$OUT/exports/vitlens-demo.json"

# Each map mode says what it shows.
click "Controls > Map > received"
wait_until 60 "the received mode's description" "$CHECK" text "$OUT/widgets.json" Controls "Received: how much attention"

# The Model menu: clicked like any menu, its descriptions beside it, its entries open models.
click "Model"
wait_until 60 "the Model menu's entries" "$CHECK" widget-centre "$OUT/widgets.json" "Model > fashion-mnist"
point_at "Model > designed"
wait_until 60 "the entry's description" grep -q '"kind": "tooltip"' "$OUT/widgets.json"
snapshot model_menu.json
"$CHECK" tooltip-clear "$OUT/model_menu.json" Model || exit 1
click "Model > fashion-mnist"
wait_until 120 "the Fashion-MNIST model on screen" "$CHECK" text "$OUT/widgets.json" "##status" "28x28 px"
snapshot fashion.json
"$CHECK" same-size "$OUT/fashion.json" || exit 1

# Close as the window manager would (the viewer saves its settings on the way out).
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
trap - EXIT
if [ "$status" -ne 0 ]; then echo "FAIL  the viewer exited with $status"; exit 1; fi
exec "$CHECK" xdotool "$OUT"
