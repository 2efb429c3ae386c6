#!/usr/bin/env bash
# Runs every fuzz target built in BUILD_DIR for SECONDS each, starting from its committed corpus
# (tests/fuzz/corpus/TARGET; never modified: new inputs go to a scratch directory). A crash, a
# leak, a sanitizer report, a broken property or an input taking over 10 s fails the run; the
# input is saved as OUT_DIR/crash-TARGET-* (reproduce: BUILD_DIR/TARGET FILE).
#   tests/fuzz/run.sh BUILD_DIR [SECONDS (60)] [OUT_DIR (BUILD_DIR/findings)]
# FUZZ_SEED=N fixes libFuzzer's random seed, so a run explores the same inputs in the same order
# each time (CI uses it: its verdict then depends on the code, not on luck); unset or 0, a new seed
# each run (for exploring).
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR [SECONDS] [OUT_DIR]}
seconds=${2:-60}
out=${3:-$build/findings}
seed=${FUZZ_SEED:-0}
[[ "$seed" =~ ^[0-9]+$ ]] || { echo "fuzz: FUZZ_SEED=$seed: expected a non-negative integer"; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
failed=()
for corpus in "$here"/corpus/*/; do
  target=$(basename "$corpus")
  [[ -x "$build/$target" ]] || { echo "fuzz: $target is not built in $build"; exit 1; }
  scratch=$(mktemp -d)
  # -rss_limit_mb: 2 GiB, as libFuzzer's default, stated; OpenCV's decoders use the process's memory.
  if "$build/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -seed="$seed" -artifact_prefix="$out/crash-$target-" "$scratch" "$corpus" > "$out/$target.log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/$target.log")
    cov=$(grep -o 'cov: [0-9]*' "$out/$target.log" | tail -1)
    used=$(sed -n 's/^INFO: Seed: *//p' "$out/$target.log" | head -1)
    echo "fuzz: $target: ${runs:-?} inputs in ${seconds} s (seed ${used:-?}), ${cov:-cov: ?}, no failure"
  else
    echo "fuzz: $target FAILED (seed $(sed -n 's/^INFO: Seed: *//p' "$out/$target.log" | head -1)); its log: $out/$target.log"
    tail -30 "$out/$target.log"
    failed+=("$target")
  fi
  rm -rf "$scratch"
done
if ((${#failed[@]})); then
  echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]}"
  exit 1
fi
