#!/usr/bin/env bash
# The second half of scripts/test.sh: everything built with clang 14 under AddressSanitizer and
# UndefinedBehaviorSanitizer (VITLENS_SANITIZE=ON; any UB aborts) plus the libFuzzer harnesses
# (VITLENS_FUZZ=ON) into build-asan/ (or $VITLENS_ASAN_BUILD_DIR); the whole ctest suite runs
# under the sanitizers, then each fuzzer for $VITLENS_FUZZ_SECONDS seconds (default 30) from the
# committed seeds. Fails on a test failure, a sanitizer report or a fuzzer crash (the input that
# crashed is saved as build-asan/fuzz-run/<target>/crash-*). Assumes scripts/setup.sh has run.
set -euo pipefail
cd "$(dirname "$0")/.."
ASAN_DIR="${VITLENS_ASAN_BUILD_DIR:-build-asan}"
FUZZ_SECONDS="${VITLENS_FUZZ_SECONDS:-30}"

cmake -S . -B "$ASAN_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-14 \
      -DVITLENS_SANITIZE=ON -DVITLENS_FUZZ=ON -DVITLENS_BUILD_VIEWER=ON >/dev/null
cmake --build "$ASAN_DIR" -j"$(nproc)"

# Leaks are checked at every exit; the only suppressions are for the OpenGL driver, GLFW and X11
# (tests/sanitizers/lsan.supp says why). Nothing in vitlens is suppressed. The preloaded library
# keeps unloaded libraries mapped so every leak report can name its library.
export LD_PRELOAD="$(cd "$ASAN_DIR" && pwd)/libvitlens_keep_loaded.so"
# intercept_tls_get_addr=0: LSan 14 misreads the dynamic TLS blocks of dlopen'ed libraries (Mesa's
# GL driver in the viewer runs) on Debian 12's glibc and its leak check at exit then crashes in
# ScanRangeForPointers ("Tracer caught signal 11"; google/sanitizers#1322). Seen on
# viewer_rollout_run in about half of the runs, never after this option (6 of 6). Static TLS and
# every heap, stack and global root are still scanned.
export ASAN_OPTIONS="check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1:intercept_tls_get_addr=0"
export UBSAN_OPTIONS="print_stacktrace=1"
export LSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0"
echo "test-sanitize: the whole suite under ASan + UBSan ($ASAN_DIR)"
ctest --test-dir "$ASAN_DIR" --output-on-failure -j"$(nproc)"

# OpenCV allocates a whole image from its header before decoding it (a 300-byte JPEG can claim
# 65535 x 16383 pixels); the fuzzers' images are capped at 4 megapixels (OpenCV refuses larger,
# vitlens reports that in one line) so each run stays fast and within libFuzzer's memory limit.
export OPENCV_IO_MAX_IMAGE_PIXELS=4194304
for target in model image script checkpoint idx folder; do
  work="$ASAN_DIR/fuzz-run/$target"
  rm -rf "$work"
  mkdir -p "$work/corpus"
  echo "test-sanitize: fuzz_$target for ${FUZZ_SECONDS}s from tests/fuzz/corpus/$target"
  # New inputs go to the scratch corpus (first folder); the committed seeds are only read.
  "$ASAN_DIR/tests/fuzz/fuzz_$target" -max_total_time="$FUZZ_SECONDS" -artifact_prefix="$work/" \
      -print_final_stats=1 "$work/corpus" "tests/fuzz/corpus/$target" 2>"$work/log" ||
    { tail -n 60 "$work/log" >&2; echo "test-sanitize: fuzz_$target failed; the input is in $work/" >&2; exit 1; }
  grep -E "^(stat::number_of_executed_units|Done )" "$work/log" || true
done
echo "test-sanitize: all passed"
