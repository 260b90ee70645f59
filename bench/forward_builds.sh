#!/usr/bin/env bash
# vitlens_bench's forward time of two builds (say main's and a branch's) on one model file,
# interleaved in one run, so a before/after is measured under the same machine state.
#
#   bench/forward_builds.sh BUILD_A BUILD_B MODEL [--size S] [--threads T] [--runs N] [--rounds R]
#
# Each of R rounds (default 5) runs BUILD_A/bench/vitlens_bench, then BUILD_B's, with
# `--model MODEL --size S --threads T --runs N --no-export --no-limits` (defaults: 224 px, 1 thread,
# 11 runs), and prints both medians and their ratio A / B (above 1: B is faster), and the same for
# the attention alone (multi_head_attention of one layer); then the median of the rounds' ratios
# and their range, and the ratio of each build's fastest round and of their lower quartiles. On a
# shared VM one round can be 30 % off: read the median. The fastest rounds and the lower quartiles
# leave out the rounds a slow spell of the machine hit (spells of seconds on an AMD Zen 3 VM:
# bench/results/2026-12-07-fused-column-sums-zen3.md); a difference of a few per cent can still
# change sign between runs there.
set -euo pipefail
usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit 2; }
[[ $# -ge 3 ]] || usage
A=$1 B=$2 MODEL=$3; shift 3
SIZE=224 THREADS=1 RUNS=11 ROUNDS=5
while [[ $# -gt 0 ]]; do
  case $1 in
    --size) SIZE=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "forward_builds: unknown argument $1" >&2; exit 2 ;;
  esac
done
for n in "$SIZE" "$THREADS" "$RUNS" "$ROUNDS"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "forward_builds: '$n' is not a positive integer" >&2; exit 2; }
done
for b in "$A" "$B"; do
  [[ -x $b/bench/vitlens_bench ]] || { echo "forward_builds: $b/bench/vitlens_bench not found: build it first" >&2; exit 2; }
done
[[ -r $MODEL ]] || { echo "forward_builds: cannot read the model $MODEL" >&2; exit 2; }
RATIOS=() ATTENTION_RATIOS=() A_MS=() B_MS=() A_ATTENTION=() B_ATTENTION=()
for ((round = 1; round <= ROUNDS; round++)); do
  ms=() attention=()
  for b in "$A" "$B"; do
    out=$("$b/bench/vitlens_bench" --json --model "$MODEL" --size "$SIZE" --threads "$THREADS" --runs "$RUNS" \
      --no-export --no-limits --reference-max-tokens 0)
    read -r forward_ms attention_ms < <(python3 -c 'import json, sys
size = json.load(sys.stdin)["sizes"][0]
print(size["forward_ms"]["median"], size["attention_ms"]["median"])' <<<"$out")
    ms+=("$forward_ms") attention+=("$attention_ms")
  done
  ratio=$(python3 -c "print(f'{${ms[0]} / ${ms[1]}:.3f}')")
  attention_ratio=$(python3 -c "print(f'{${attention[0]} / ${attention[1]}:.3f}')")
  RATIOS+=("$ratio") ATTENTION_RATIOS+=("$attention_ratio")
  A_MS+=("${ms[0]}") B_MS+=("${ms[1]}") A_ATTENTION+=("${attention[0]}") B_ATTENTION+=("${attention[1]}")
  echo "round $round  threads $THREADS  A $A: ${ms[0]} ms  B $B: ${ms[1]} ms  A/B $ratio" \
    "  attention A ${attention[0]} ms  B ${attention[1]} ms  A/B $attention_ratio  (load $(cut -d' ' -f1 /proc/loadavg))"
done
python3 - "${#RATIOS[@]}" "${RATIOS[@]}" "${ATTENTION_RATIOS[@]}" "${A_MS[@]}" "${B_MS[@]}" \
  "${A_ATTENTION[@]}" "${B_ATTENTION[@]}" <<'PY'
import statistics, sys
n = int(sys.argv[1])
column = lambda i: [float(x) for x in sys.argv[2 + i * n:2 + (i + 1) * n]]
lower_quartile = lambda v: statistics.quantiles(v, n=4, method="inclusive")[0] if len(v) > 1 else v[0]
for what, r, a, b in (("forward", column(0), column(2), column(3)), ("attention", column(1), column(4), column(5))):
    print(f"{what}: median A/B {statistics.median(r):.2f} over {len(r)} rounds (range {min(r):.2f} to {max(r):.2f});"
          f" fastest rounds A {min(a):g} ms, B {min(b):g} ms, A/B {min(a) / min(b):.3f};"
          f" lower quartiles A {lower_quartile(a):.2f} ms, B {lower_quartile(b):.2f} ms,"
          f" A/B {lower_quartile(a) / lower_quartile(b):.3f}")
PY
