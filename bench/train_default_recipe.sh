#!/usr/bin/env bash
# The default recipe's claim, measured: `vitlens train --data fashion-mnist` with every flag at its
# default (the goal: >= 90.0 % test accuracy within 15 minutes of wall time on 2 cores). Prints the
# wall time of the whole command (data loading and the per-epoch evaluations included), the test
# accuracy after each epoch and at the end, the machine and its load before and after.
#
#   bench/train_default_recipe.sh BUILD_DIR [OUT_DIR] [-- extra vitlens train flags]
#
# OUT_DIR (default: a temporary folder, removed afterwards) keeps the run (checkpoint, log.jsonl) and
# run.txt with this report. The machine should be otherwise idle: the load average is printed so a
# reader can tell. When BUILD_DIR has bench/vitlens_bench, a short probe of the machine's speed runs
# before and after (FMA and 512^3 GEMM GFLOP/s, the card's 224 px forward on every core, about 15 s
# each): the same build's epochs have taken 30 s on this project's VM at one hour and 41 s at
# another, idle both times, and the probe tells such a phase from a change in vitlens.
set -euo pipefail

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 1 && $1 != -h && $1 != --help ]] || usage
BUILD=$1; shift
OUT=""
if [[ $# -gt 0 && $1 != -- ]]; then
  [[ $1 == -* ]] && { echo "train_default_recipe: give vitlens flags after '--' (got '$1')" >&2; exit 2; }
  OUT=$1; shift
fi
if [[ $# -gt 0 ]]; then
  [[ $1 == -- ]] || { echo "train_default_recipe: give vitlens flags after '--' (got '$1')" >&2; exit 2; }
  shift
fi
VITLENS=$BUILD/app/vitlens
[[ -x $VITLENS ]] || { echo "train_default_recipe: $VITLENS not found: build vitlens first" >&2; exit 2; }
if [[ -z $OUT ]]; then
  OUT=$(mktemp -d "${TMPDIR:-/tmp}/vitlens-default-recipe-XXXXXX")
  trap 'rm -rf "$OUT"' EXIT
elif [[ -e $OUT/last.safetensors || -e $OUT/log.jsonl ]]; then
  echo "train_default_recipe: $OUT already holds a run; give a new folder" >&2
  exit 2
fi
mkdir -p "$OUT"

report() { echo "$*" | tee -a "$OUT/run.txt"; }
# The machine's speed now: one line from vitlens_bench's JSON, or a note that there is no bench.
probe() {
  local bench=$BUILD/bench/vitlens_bench json
  if [[ ! -x $bench ]]; then
    echo "not run ($bench not built)"
    return
  fi
  if ! json=$("$bench" --size 224 --threads 0 --runs 5 --budget 10 --no-export --reference-max-tokens 0 --json 2>/dev/null); then
    echo "failed ($bench)"
    return
  fi
  python3 -c '
import json, sys
d = json.loads(sys.argv[1])
lim, fwd = d["limits"], d["sizes"][0]["forward_ms"]
print("FMA %.1f GFLOP/s a core, GEMM 512^3 %.1f GFLOP/s on %d threads, card forward at 224 px %.1f ms (median of %d)"
      % (lim["fma_gflops_per_core"], lim["gemm_512_gflops_all_threads"], d["threads"], fwd["median"], fwd["runs"]))
' "$json" 2>/dev/null || echo "unreadable ($bench printed no JSON the script knows)"
}
: > "$OUT/run.txt"
report "date (UTC):   $(date -u '+%Y-%m-%d %H:%M:%S')"
report "machine:      $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
report "cpu flags:    $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'avx2|fma|avx512f' | tr '\n' ' ')"
report "vitlens:      $("$VITLENS" --version 2>/dev/null || echo unknown), $VITLENS (source at $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown))"
report "command:      vitlens train --data fashion-mnist --out $OUT --quiet $*"
report "load before:  $(cut -d' ' -f1-3 /proc/loadavg)"
report "probe before: $(probe)"
start=$(date +%s.%N)
"$VITLENS" train --data fashion-mnist --out "$OUT" --quiet "$@" > "$OUT/stdout.txt"
end=$(date +%s.%N)
report "load after:   $(cut -d' ' -f1-3 /proc/loadavg)"
report "probe after:  $(probe)"
report "wall time:    $(python3 -c "s = $end - $start; print(f'{s:.1f} s ({int(s // 60)} min {s % 60:.0f} s)')")"
python3 - "$OUT/log.jsonl" <<'EOF' | tee -a "$OUT/run.txt"
import json, sys
evals = [r for r in map(json.loads, open(sys.argv[1])) if r.get("eval")]
for r in evals:
    print(f"epoch {r['epoch'] + 1:>2}: {r['eval']} accuracy {100 * r['accuracy']:.2f} % at {r['seconds']:.0f} s of training")
if evals:
    print(f"final:        {100 * evals[-1]['accuracy']:.2f} % {evals[-1]['eval']} accuracy")
EOF
