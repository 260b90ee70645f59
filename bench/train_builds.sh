#!/usr/bin/env bash
# `vitlens train` images/s of two builds (say main's and a branch's), interleaved in one run, so a
# before/after is measured under the same machine state.
#
#   bench/train_builds.sh BUILD_A BUILD_B [--threads T] [--steps N] [--reps R]
#
# Each rep runs A then B with train_compare.sh's shape (depth 6, D 48, 4 heads, patch 4, MLP 2,
# batch 128, seed 0) for N steps (default 30) and prints the median of the images/s windows that
# log.jsonl records after step 10 (as train_compare.sh) and the load average after the run.
set -euo pipefail
usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 2 ]] || usage
A=$1 B=$2; shift 2
THREADS=1 STEPS=30 REPS=3
while [[ $# -gt 0 ]]; do
  case $1 in
    --threads) THREADS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "train_builds: unknown argument $1" >&2; exit 2 ;;
  esac
done
for n in "$THREADS" "$STEPS" "$REPS"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "train_builds: '$n' is not a positive integer" >&2; exit 2; }
done
((STEPS >= 20)) || { echo "train_builds: --steps must be >= 20 (vitlens logs every 10 steps)" >&2; exit 2; }
for b in "$A" "$B"; do
  [[ -x $b/app/vitlens ]] || { echo "train_builds: $b/app/vitlens not found: build it first" >&2; exit 2; }
done
RUN=$(mktemp -d "${TMPDIR:-/tmp}/vitlens-train-builds-XXXXXX")
trap 'rm -rf "$RUN"' EXIT
for ((rep = 1; rep <= REPS; rep++)); do
  for b in "$A" "$B"; do
    rm -rf "$RUN/out"
    "$b/app/vitlens" train --data fashion-mnist --out "$RUN/out" --depth 6 --embed-dim 48 --heads 4 --patch 4 \
      --mlp-ratio 2 --batch 128 --epochs 10 --no-augment --label-smoothing 0 --threads "$THREADS" --seed 0 \
      --stop-after "$STEPS" --quiet >/dev/null
    python3 - "$RUN/out/log.jsonl" "$b" "$rep" "$THREADS" <<'PY'
import json, statistics, sys
rates = [r["images_per_s"] for r in map(json.loads, open(sys.argv[1]))
         if "images_per_s" in r and r.get("step", 0) > 10 and r["images_per_s"] > 0]
load = open("/proc/loadavg").read().split()[0]
print(f"rep {sys.argv[3]}  threads {sys.argv[4]}  {sys.argv[2]}: {statistics.median(rates):.1f} images/s  (load {load})")
PY
  done
done
