#!/usr/bin/env bash
# Training throughput of `vitlens train` against the PyTorch peer (bench/train_pytorch.py) on the
# same recipe, one after the other in the same run, and their ratio.
#
#   bench/train_compare.sh BUILD_DIR [--python PY] [--threads T] [--batch B] [--steps N] [--depth L]
#                          [--rounds R]
#
# vitlens: `BUILD_DIR/app/vitlens train --data fashion-mnist --stop-after N` into a temporary run
# folder; its log.jsonl records images/s over windows of >= 5 steps every 10 steps; the median of
# those windows after the first 10 steps is taken. PyTorch: `train_pytorch.py --bench` (median
# over N per-step timings after 3 untimed steps). Both include batch assembly and augmentation.
# Each of R rounds (default 3) runs vitlens, then PyTorch, and the medians over the rounds are
# compared: on a virtual machine one run of either can be 30 % off. The machine should be idle.
# A separate OpenBLAS under PyTorch (Debian's 1.13) runs one thread (train_pytorch.py --blas-threads:
# with its default of one per core it spun against PyTorch's own threads, and used both cores in a
# 1-thread run).
set -euo pipefail

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 1 && $1 != -h && $1 != --help ]] || usage
BUILD=$1; shift
PY=/work/venv/bin/python
THREADS=2 BATCH=128 STEPS=40 DEPTH=6 ROUNDS=3
while [[ $# -gt 0 ]]; do
  case $1 in
    --python) PY=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --depth) DEPTH=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "train_compare: unknown argument $1" >&2; exit 2 ;;
  esac
done
for n in "$THREADS" "$BATCH" "$STEPS" "$DEPTH" "$ROUNDS"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "train_compare: '$n' is not a positive integer" >&2; exit 2; }
done
((STEPS >= 20)) || { echo "train_compare: --steps must be >= 20 (vitlens logs every 10 steps)" >&2; exit 2; }
VITLENS=$BUILD/app/vitlens
[[ -x $VITLENS ]] || { echo "train_compare: $VITLENS not found: build vitlens first" >&2; exit 2; }
"$VITLENS" train --help >/dev/null 2>&1 || { echo "train_compare: $VITLENS has no 'train' command" >&2; exit 2; }
command -v "$PY" >/dev/null || { echo "train_compare: python '$PY' not found" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)

RUN=$(mktemp -d "${TMPDIR:-/tmp}/vitlens-train-compare-XXXXXX")
trap 'rm -rf "$RUN"' EXIT

# Explicit, so both sides do the same work whatever the defaults: no augmentation, no smoothing.
RECIPE=(--depth "$DEPTH" --embed-dim 48 --heads 4 --patch 4 --mlp-ratio 2 --batch "$BATCH" --epochs 10 --no-augment
        --label-smoothing 0 --threads "$THREADS" --seed 0)

V_RATES=() P_RATES=()
for ((round = 1; round <= ROUNDS; round++)); do
  echo "round $round/$ROUNDS: vitlens train, $STEPS steps, batch $BATCH, $THREADS threads, depth $DEPTH ..." >&2
  rm -rf "$RUN/vitlens"
  "$VITLENS" train --data fashion-mnist --out "$RUN/vitlens" "${RECIPE[@]}" --stop-after "$STEPS" --quiet >/dev/null
  V_RATES+=("$("$PY" - "$RUN/vitlens/log.jsonl" <<'EOF'
import json, statistics, sys
rates = [r["images_per_s"] for r in map(json.loads, open(sys.argv[1]))
         if "images_per_s" in r and r.get("step", 0) > 10 and r["images_per_s"] > 0]
if not rates:
    sys.exit("train_compare: no images/s in the vitlens log")
print(f"{statistics.median(rates):.1f}")
EOF
)")
  echo "round $round/$ROUNDS: PyTorch ($PY), $STEPS timed steps ..." >&2
  P_JSON=$("$PY" "$HERE/train_pytorch.py" "${RECIPE[@]}" --bench --steps "$STEPS" 2>"$RUN/pytorch.err" | tail -n 1) ||
    { echo "train_compare: the PyTorch run failed:" >&2; tail -n 5 "$RUN/pytorch.err" >&2; exit 1; }
  read -r P_RATE P_VERSION P_THREADS < <("$PY" -c '
import json, sys
r = json.loads(sys.argv[1])
print("%.1f %s %s" % (r["images_per_s"], r["torch"], r["threads"]))' "$P_JSON")
  P_RATES+=("$P_RATE")
done

"$PY" - "$P_VERSION" "$P_THREADS" "$BATCH" "$THREADS" "$DEPTH" "${V_RATES[*]}" "${P_RATES[*]}" <<'EOF'
import statistics, sys
version, p_threads, batch, threads, depth = sys.argv[1:6]
v = [float(x) for x in sys.argv[6].split()]
p = [float(x) for x in sys.argv[7].split()]
fmt = lambda xs: ", ".join(f"{x:.0f}" for x in xs)
print(f"{'trainer':<30} {'median img/s':>12}   rounds")
print(f"{'vitlens train':<30} {statistics.median(v):>12.1f}   {fmt(v)}")
print(f"{'PyTorch ' + version + ' (' + p_threads + ' thr)':<30} {statistics.median(p):>12.1f}   {fmt(p)}")
print(f"vitlens / PyTorch: {statistics.median(v) / statistics.median(p):.2f}x  (medians of {len(v)} rounds; "
      f"batch {batch}, {threads} threads, depth {depth}, D 48, 4 heads, patch 4, mlp 2)")
EOF
