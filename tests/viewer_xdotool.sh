#!/bin/sh
# viewer_xdotool.sh SCENARIO VITLENS VIEWER_CHECK OUT IMAGE MODEL [PHOTOS]
# (ctest viewer_xdotool and viewer_xdotool_train_mae, under xvfb-run; through real input.)
# The viewer runs as a user runs it (no script: the real X pointer and keyboard, xdotool, drive it,
# and it reads and saves its settings). It writes its widgets' rectangles (--dump-widgets; it
# rewrites the dump whenever its widgets change and settle) and xdotool acts where the dump says
# the widgets are. SCENARIO is what the user does:
#   view       the main view: taps arrow keys (12 ms presses, and presses released at once), clicks
#              a radio button, a checkbox and the Export button; drags the softmax temperature and
#              exports again (the command line shown and the files carry --temperature); clicks the
#              'received' mode (its one-line description shows); opens the Model menu, hovers its
#              first entry (the description beside the menu covers no entry) and opens the 28 px
#              Fashion-MNIST model (the Controls window and the status bar name the same size and
#              tokens); drags the Controls window's title bar to the top of the screen (it stays below
#              the menu bar, and File still opens); closes the window; finally `viewer_check xdotool`
#              reads what the viewer wrote.
#   small-screen  on an 800x600 screen (the ctest's xvfb-run) the window opens no larger than the
#              screen, whatever size the settings remember, so no window of the layout is past its
#              edge; closes the window.
#   train-mae  a masked-autoencoder run in the Train window: View > Train; types photos:OUT/photos
#              (five opencv-doc photos from PHOTOS, copied here) into the data field, a tiny recipe
#              into the recipe fields and the MAE fields (mask ratio, decoder); Start; Pause and Save
#              until a checkpoint shows steps; Resume; Stop; Save again; Save into a folder a running
#              `vitlens train` holds (refused in the window, nothing written); close. Then from the files:
#              both checkpoints' training records (viewer_check train-record: MAE, every typed
#              value, one finite loss per step run, more steps after Resume), `vitlens info` on the
#              encoder (the typed shape), the viewer's exit status. Also: the idle window says there
#              is no run yet, every field has its label before it, and the window's text fits at
#              1440x900.
# Every wait is for a state (a widget or text in the dump, a file), never for an amount of time;
# each has a limit far above what it takes on a loaded 2-core machine (a run's steps are waited for
# by count, so a slow machine takes longer but never fails for it).
# Exit 77 (skipped) without xdotool.
set -eu
SCENARIO=$1 VITLENS=$2 CHECK=$3 OUT=$4 IMAGE=$5 MODEL=$6 PHOTOS=${7:-}
case $SCENARIO in
  view | small-screen | train-mae) ;;
  *) echo "viewer_xdotool.sh: unknown scenario '$SCENARIO' (view, small-screen or train-mae)"; exit 2 ;;
esac
command -v xdotool >/dev/null 2>&1 || { echo "skipped: xdotool not found (scripts/setup.sh installs it)"; exit 77; }
DUMP=$OUT/widgets.json
start_time=$(date +%s)
pid=

# [SECTION] the viewer and the waits

# On failure the screen as it was helps to see why (when xwd, from x11-apps, is installed).
fail() {
  echo "FAIL  $1 (after $(($(date +%s) - start_time)) s)"
  if command -v xwd >/dev/null 2>&1 && xwd -root -silent >"$OUT/failure.xwd" 2>/dev/null; then
    echo "      the screen: $OUT/failure.xwd"
  fi
  exit 1
}
# Polls (every 0.1 s, up to $1 s of wall-clock time) until the command after it succeeds; fails
# naming $2 if the time runs out (showing what the command says then) or the viewer has gone.
wait_until() {
  limit=$1
  deadline=$(($(date +%s) + limit))
  what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    kill -0 "$pid" 2>/dev/null || fail "the viewer exited while waiting for $what"
    [ "$(date +%s)" -le "$deadline" ] || { "$@" || true; fail "waited $limit s for $what"; }
    sleep 0.1
  done
}
# Polls like wait_until but returns non-zero when the time runs out.
poll_until() {
  poll_deadline=$(($(date +%s) + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    kill -0 "$pid" 2>/dev/null || fail "the viewer exited while typing"
    [ "$(date +%s)" -le "$poll_deadline" ] || return 1
    sleep 0.1
  done
}
# Starts the viewer on IMAGE and MODEL and focuses its window once it has written its widget list.
start_viewer() {
  "$VITLENS" view "$IMAGE" --model "$MODEL" --dump-widgets "$DUMP" &
  pid=$!
  trap 'kill "$pid" 2>/dev/null || true' EXIT
  wait_until 90 "the first widget list" test -s "$DUMP"
  window=$(xdotool search --name '^vitlens' | head -n 1)
  xdotool windowfocus "$window"
}
# Closes as the window manager would (the viewer saves its settings on the way out); it exits cleanly.
close_viewer() {
  kill -TERM "$pid"
  status=0
  wait "$pid" || status=$?
  trap - EXIT
  [ "$status" -eq 0 ] || fail "the viewer exited with $status"
}

# [SECTION] pointer and keyboard

# Waits until the dump lists the widget ("WINDOW > SECTION > LABEL"; with --enabled: taking input),
# then moves the pointer onto its middle.
point_at() {
  echo "$(($(date +%s) - start_time)) s: point at $*"
  wait_until 60 "'$1' in the widget list" "$CHECK" widget-centre "$DUMP" "$@"
  xy=$("$CHECK" widget-centre "$DUMP" "$@")
  # shellcheck disable=SC2086
  xdotool mousemove --window "$window" $xy
  sleep 0.2
}
click() {
  point_at "$@"
  xdotool click 1
  sleep 0.5
}
# Clicks a field, selects what it holds (ctrl+a), types TEXT and presses Return, as a user would;
# then waits until the dump shows the field holding SHOWN (TEXT as the field formats it; default
# TEXT). Each key of ctrl+a is held a moment and the select-all gets frames of its own before the
# characters arrive. On a loaded machine a frame can outlast those pauses, and Dear ImGui 1.86 drops
# keys that arrive in the frame of the click that activates the field: as a user would, it types
# again (up to 3 times) when the field does not show the text within 15 s.
type_into() {
  for attempt in 1 2 3; do
    type_once "$@"
    poll_until 15 field_shows "$1" "${3:-$2}" && return 0
    echo "$(($(date +%s) - start_time)) s: '$1' does not show '${3:-$2}' after attempt $attempt"
  done
  fail "'$1' did not show '${3:-$2}' after 3 attempts"
}
type_once() {
  click "$1"
  xdotool keydown ctrl
  sleep 0.2
  xdotool keydown a
  sleep 0.2
  xdotool keyup a
  sleep 0.1
  xdotool keyup ctrl
  sleep 0.3
  xdotool type --delay 30 "$2"
  sleep 0.3
  xdotool key Return
  sleep 0.3
}
# Ctrl+clicks a slider (Dear ImGui's text entry on it), selects what it holds, types TEXT and
# presses Return; then waits until the Controls window shows SHOWN (up to 3 attempts, as type_into).
type_into_slider() {
  for attempt in 1 2 3; do
    point_at "$1"
    xdotool keydown ctrl
    sleep 0.2
    xdotool click 1
    sleep 0.3
    xdotool keyup ctrl
    sleep 0.3
    xdotool key ctrl+a
    sleep 0.3
    printf '%s' "$2" | xdotool type --delay 30 --file -  # TEXT may start with '-'
    sleep 0.3
    xdotool key Return
    sleep 0.3
    poll_until 15 "$CHECK" text "$DUMP" Controls "$3" && return 0
    echo "$(($(date +%s) - start_time)) s: Controls does not show '$3' after attempt $attempt"
  done
  fail "Controls did not show '$3' after typing '$2' into '$1' 3 times"
}
field_shows() {
  [ "$("$CHECK" widget-value "$DUMP" "$1")" = "$2" ]
}
# Copies the dump as it is now to OUT/NAME (the viewer may rewrite it while a check reads it).
snapshot() { cp "$DUMP" "$OUT/$1"; }

# [SECTION] the main view

view_scenario() {
  export VITLENS_EXPORT_DIR="$OUT/exports"
  start_viewer
  # Arrow keys over the heads (the query starts at the centre, patch (28, 28) of 56x56).
  point_at "Heads > mean"
  for _ in 1 2 3; do
    xdotool keydown Right sleep 0.012 keyup Right
    sleep 0.3
  done
  for _ in 1 2; do
    xdotool keydown Down keyup Down
    sleep 0.3
  done

  click "Controls > Display > log"
  click "Controls > Display > patch grid"
  click "Controls > Export and screenshot > Export"
  # Done when the viewer has taken the export's result (it then remembers the folder).
  wait_until 120 "the first export" grep -q '"export_folder": *"/' "$OUT/config/vitlens/settings.json"

  # The softmax temperature: a CLI setting like the others, so the command line shown names it and
  # the export writes no viewer-only notes. Drag the T slider to a quarter of its (log) track.
  click "Controls > Softmax scale > temperature"
  wait_until 60 "the temperature slider" "$CHECK" widget-centre "$DUMP" "Controls > Softmax scale > T"
  from=$("$CHECK" widget-point "$DUMP" "Controls > Softmax scale > T" 0.5 0.5)
  to=$("$CHECK" widget-point "$DUMP" "Controls > Softmax scale > T" 0.25 0.5)
  # shellcheck disable=SC2086
  xdotool mousemove --window "$window" $from mousedown 1 sleep 0.2 mousemove --window "$window" $to sleep 0.2 mouseup 1
  wait_until 60 "the shown command line to name --temperature" "$CHECK" text "$DUMP" Controls "--temperature 0."
  click "Controls > Export and screenshot > Export"
  wait_until 120 "the second export (with the temperature)" grep -q '"temperature": 0\.' "$OUT/exports/vitlens-demo.json"

  # A value typed into a slider stays in its range: the threshold's mass typed as 0 is its least,
  # 0.05 (an uncaught refusal of 0 ended the viewer), the temperature typed as -1 its least, 0.1
  # (the maps of temperature 1 were drawn under a command line saying -1).
  click "Controls > Display > threshold"
  type_into_slider "Controls > Display > ##mass" 0 "--threshold 0.05"
  type_into_slider "Controls > Softmax scale > T" -1 "--temperature 0.1 "
  click "Controls > Display > threshold"

  # Each map mode says what it shows.
  click "Controls > Map > received"
  wait_until 60 "the received mode's description" "$CHECK" text "$DUMP" Controls "Received: how much attention"

  # The Model menu: clicked like any menu, its descriptions beside it, its entries open models.
  click "Model"
  wait_until 60 "the Model menu's entries" "$CHECK" widget-centre "$DUMP" "Model > fashion-mnist"
  point_at "Model > designed"
  wait_until 60 "the entry's description" grep -q '"kind": "tooltip"' "$DUMP"
  snapshot model_menu.json
  "$CHECK" tooltip-clear "$OUT/model_menu.json" Model || exit 1
  click "Model > fashion-mnist"
  wait_until 120 "the Fashion-MNIST model on screen" "$CHECK" text "$DUMP" "##status" "28x28 px"
  snapshot fashion.json
  "$CHECK" same-size "$OUT/fashion.json" || exit 1

  # A window's title bar dragged up to the top of the screen stays below the menu bar (over it, it
  # hid File and View > Reset layout); the File menu still opens.
  from=$("$CHECK" window-point "$DUMP" Controls 0.5 -1)
  to=$("$CHECK" window-point "$DUMP" Controls 0.5 0)
  # shellcheck disable=SC2086
  xdotool mousemove --window "$window" $from mousedown 1 sleep 0.2 mousemove --window "$window" ${to% *} 1 \
    sleep 0.2 mousemove --window "$window" ${to% *} 0 sleep 0.2 mouseup 1
  sleep 1
  click "File"
  wait_until 60 "the File menu's entries" "$CHECK" widget-centre "$DUMP" "File > Open image..."
  "$CHECK" below-menu "$DUMP" Controls || exit 1
  xdotool key Escape

  close_viewer
  exec "$CHECK" xdotool "$OUT"
}

# [SECTION] a small screen

small_screen_scenario() {
  mkdir -p "$OUT/config/vitlens"
  echo '{"window_w": 1440, "window_h": 900}' >"$OUT/config/vitlens/settings.json"
  start_viewer
  "$CHECK" json "$DUMP" /display/0=800 /display/1=600 || fail "the window is not the screen's 800x600"
  close_viewer
}

# [SECTION] the Train window: an MAE run

# Saves to FILE with the Save button (the path typed into the field beside it) and waits for it.
save_to() {
  rm -f "$1"
  type_into "Train > ##train_save_path" "$1"
  click "Train > Save" --enabled
  wait_until 60 "the Save button to write $1" "$CHECK" train-step "$1"
}
# A `vitlens train` running in OUT/busy (a tiny Fashion-MNIST run, far longer than the test) holds
# that folder: the Save button into it is refused with one line in the window, and writes nothing.
save_into_busy_folder() {
  "$VITLENS" train --data fashion-mnist --limit 64 --depth 1 --embed-dim 8 --heads 2 --patch 7 --batch 16 \
    --threads 1 --epochs 1000 -q --out "$OUT/busy" 2>"$OUT/busy.err" &
  busy_pid=$!
  trap 'kill "$pid" "$busy_pid" 2>/dev/null || true' EXIT
  wait_until 120 "the run in $OUT/busy to save its first epoch" test -s "$OUT/busy/last.safetensors"
  type_into "Train > ##train_save_path" "$OUT/busy/mine.safetensors"
  click "Train > Save" --enabled
  wait_until 60 "the refused Save's line in the Train window" \
    "$CHECK" text "$DUMP" Train "another vitlens process is training or saving in this folder"
  [ ! -e "$OUT/busy/mine.safetensors" ] || fail "the refused Save wrote $OUT/busy/mine.safetensors"
  kill -INT "$busy_pid"
  wait "$busy_pid" || true
  trap 'kill "$pid" 2>/dev/null || true' EXIT
  echo "ok    the Save into a folder a vitlens train holds is refused in the window, nothing written"
}
# The step the Train window shows (its status line: "running: step N of M, ...").
shown_step() { "$CHECK" text-number "$DUMP" Train "step "; }
step_at_least() { step=$(shown_step) && [ "$step" -ge "$1" ]; }

train_mae_scenario() {
  mkdir -p "$OUT/photos"
  for photo in baboon.jpg fruits.jpg building.jpg home.jpg butterfly.jpg; do
    cp "$PHOTOS/$photo" "$OUT/photos/" || { echo "FAIL  cannot copy $PHOTOS/$photo (scripts/setup.sh installs opencv-doc)"; exit 1; }
  done
  # What is typed (the fields show lr and mask ratio as 0.00400 and 0.60): MAE on photos, a run far
  # longer than the test, which stops it. The data's limit of 4 photos leaves 4 of the 5 for
  # training and validation.
  MASK_RATIO=0.6 DECODER_DIM=24 DECODER_DEPTH=2 DECODER_HEADS=3 CROPS=8 IMG=16 PATCH=4
  LIMIT=4 EPOCHS=5000 BATCH=8 DEPTH=1 DIM=16 HEADS=2 LR=0.004 PROBE=5
  start_viewer

  click "View"
  click "View > Train"
  wait_until 60 "the idle Train window" "$CHECK" text "$DUMP" Train "No run yet"
  type_into "Train > data (fashion-mnist, folder, photos[:DIR])" "photos:$OUT/photos"
  # The MAE fields appear once the data names photos.
  wait_until 60 "the MAE fields" "$CHECK" widget-centre "$DUMP" "Train > mask ratio"
  snapshot train_fields.json
  "$CHECK" labels-before "$OUT/train_fields.json" Train || fail "a Train field has its label after it"
  "$CHECK" layout "$OUT/train_fields.json" 1440 900 --only Train || fail "the Train window cuts off its contents"
  type_into "Train > limit" $LIMIT
  type_into "Train > epochs" $EPOCHS
  type_into "Train > batch" $BATCH
  type_into "Train > depth" $DEPTH
  type_into "Train > dim" $DIM
  type_into "Train > heads" $HEADS
  type_into "Train > patch" $PATCH
  type_into "Train > lr" $LR 0.00400
  type_into "Train > probe every" $PROBE
  type_into "Train > mask ratio" $MASK_RATIO 0.60
  type_into "Train > crops/photo" $CROPS
  type_into "Train > img size" $IMG
  type_into "Train > decoder dim" $DECODER_DIM
  type_into "Train > decoder depth" $DECODER_DEPTH
  type_into "Train > decoder heads" $DECODER_HEADS
  click "Train > Start"

  # Running once Pause takes input; pause once the window shows 4 steps, and save.
  wait_until 60 "the Pause button (running)" "$CHECK" widget-centre "$DUMP" "Train > Pause" --enabled
  wait_until 240 "4 steps in the Train window" step_at_least 4
  click "Train > Pause" --enabled
  wait_until 60 "the Resume button (paused)" "$CHECK" widget-centre "$DUMP" "Train > Resume"
  save_to "$OUT/paused.safetensors"
  paused_step=$("$CHECK" train-step "$OUT/paused.safetensors")
  [ "$paused_step" -ge 4 ] || fail "paused after 4 steps shown, the checkpoint says step $paused_step"
  echo "paused and saved at step $paused_step"
  click "Train > Resume"
  wait_until 60 "the Pause button (running again)" "$CHECK" widget-centre "$DUMP" "Train > Pause" --enabled
  # Let the resumed run take steps: wait until the window shows more than the paused checkpoint.
  wait_until 240 "a step after $paused_step" step_at_least $((paused_step + 1))
  click "Train > Stop" --enabled
  # Stopped: the Start button is back (it reads Restart while a run is loading, running or paused).
  wait_until 60 "the Start button (stopped)" "$CHECK" widget-centre "$DUMP" "Train > Start"
  save_to "$OUT/stopped.safetensors"
  stopped_step=$("$CHECK" train-step "$OUT/stopped.safetensors")
  echo "stopped and saved at step $stopped_step"
  save_into_busy_folder
  close_viewer
  check_train_mae
}

# What the MAE run left: a clash-free dump, a step after Resume, both checkpoints' records, the
# encoder's shape as `vitlens info` reads it.
check_train_mae() {
  failures=0
  grep -q '"clashes": \[\]' "$DUMP" || { echo "FAIL  widgets share IDs: $(grep -A3 '"clashes"' "$DUMP")"; failures=1; }
  if [ "$stopped_step" -gt "$paused_step" ]; then
    echo "ok    the run went on after Resume: step $paused_step -> $stopped_step"
  else
    echo "FAIL  no step after Resume: paused at $paused_step, stopped at $stopped_step"
    failures=1
  fi
  for saved in paused stopped; do
    "$CHECK" train-record "$OUT/$saved.safetensors" /objective=mae "/data=photos:$OUT/photos" /limit=$LIMIT \
      /img_size=$IMG /crops_per_photo=$CROPS /mae/mask_ratio=$MASK_RATIO /mae/decoder_dim=$DECODER_DIM \
      /mae/decoder_depth=$DECODER_DEPTH /mae/decoder_heads=$DECODER_HEADS /recipe/epochs=$EPOCHS /recipe/batch=$BATCH \
      /recipe/lr=$LR || failures=1
  done
  info=$("$VITLENS" info --model "$OUT/stopped.safetensors") || { echo "FAIL  vitlens info on the saved encoder"; failures=1; }
  for line in "model: *vitlens-mae" "patch size: *$PATCH " "embed dim: *$DIM\$" "heads: *$HEADS of" "depth: *$DEPTH\$" \
              "image size: *${IMG}x$IMG" "classifier: *none"; do
    if printf '%s\n' "$info" | grep -q "^$line"; then
      echo "ok    vitlens info: $line"
    else
      echo "FAIL  vitlens info has no '$line':"
      printf '%s\n' "$info"
      failures=1
    fi
  done
  exit $failures
}

rm -rf "$OUT"
mkdir -p "$OUT"
export XDG_CONFIG_HOME="$OUT/config"
case $SCENARIO in
  view) view_scenario ;;
  small-screen) small_screen_scenario ;;
  train-mae) train_mae_scenario ;;
esac
