#!/usr/bin/env bash
# The command-line reference is the program's own --help, pasted between the lines
# <!-- cli-reference:begin --> and <!-- cli-reference:end --> of README.md (the top-level help) and
# of docs/cli.md (every command's), so it cannot drift:
#   scripts/update_readme_cli.sh [VITLENS]           rewrite those parts from VITLENS's --help
#   scripts/update_readme_cli.sh --check [VITLENS]   exit 1 (with a diff) when either file differs
# VITLENS defaults to build/app/vitlens. The ctest readme_cli_reference runs --check.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CHECK=0
if [ "${1:-}" = "--check" ]; then CHECK=1; shift; fi
VITLENS="${1:-$ROOT/build/app/vitlens}"
BEGIN='<!-- cli-reference:begin -->'
END='<!-- cli-reference:end -->'
[ -x "$VITLENS" ] || { echo "update_readme_cli: no $VITLENS; build first (scripts/build.sh)" >&2; exit 1; }

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
STATUS=0

# update FILE COMMAND...: the block between the markers of FILE becomes each COMMAND's --help
# ("" is the top-level help); with --check, FILE is compared instead of rewritten.
update() {
  local file="$1" name
  shift
  name="$(basename "$file")"
  grep -qxF "$BEGIN" "$file" && grep -qxF "$END" "$file" ||
    { echo "update_readme_cli: $file lacks the lines $BEGIN and $END" >&2; exit 1; }
  {
    echo "$BEGIN"
    for command in "$@"; do
      echo
      echo '```text'
      echo "\$ vitlens ${command:+$command }--help"
      # shellcheck disable=SC2086  # no command: the top-level help
      "$VITLENS" $command --help
      echo '```'
    done
    echo
    echo "$END"
  } >"$WORK/reference.md"
  awk -v begin="$BEGIN" -v end="$END" -v ref="$WORK/reference.md" '
    $0 == begin { while ((getline line < ref) > 0) print line; skip = 1; next }
    $0 == end   { skip = 0; next }
    !skip       { print }' "$file" >"$WORK/$name"
  if [ "$CHECK" = 1 ]; then
    if diff -u "$file" "$WORK/$name"; then
      echo "update_readme_cli: $file matches --help"
    else
      echo "update_readme_cli: $file differs from $VITLENS --help (above); run scripts/update_readme_cli.sh" >&2
      STATUS=1
    fi
  elif ! cmp -s "$file" "$WORK/$name"; then
    cat "$WORK/$name" >"$file"
    echo "update_readme_cli: $file rewritten from $VITLENS --help"
  fi
}

update "$ROOT/README.md" ""
update "$ROOT/docs/cli.md" "" export view info models train
exit "$STATUS"
