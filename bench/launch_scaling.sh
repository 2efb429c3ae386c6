#!/bin/bash
# Do ranks on one machine share its cores well with default flags? Trains the demo's model on
# Fashion-MNIST once as one process and once as N ranks under `lockstep launch` (no --threads:
# each side takes the thread count lockstep chooses by default), and prints images/s of each
# (median of the logged windows after the first) and their ratio.
# Usage: bench/launch_scaling.sh BUILD_DIR [RANKS] [STEPS] [extra `lockstep train` flags...]
set -euo pipefail
build=${1:?usage: bench/launch_scaling.sh BUILD_DIR [RANKS] [STEPS] [train flags...]}
ranks=${2:-2}
steps=${3:-300}
shift $(( $# >= 3 ? 3 : $# ))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ls_bin="$build/bin/lockstep"
common=(--steps "$steps" --set train.log_every=25 --set train.eval_every=0 --set data.test_subset=64 "$@")

"$ls_bin" train --run-dir "$work/one" "${common[@]}" > "$work/one.log"
"$ls_bin" launch -n "$ranks" -- train --run-dir "$work/many" "${common[@]}" > "$work/many.log"
grep -m1 "intra-op threads" "$work/one.log" | sed 's/^/one process: /'
grep -m1 "intra-op threads" "$work/many.log" | sed "s/^/$ranks ranks: /"
python3 - "$work/one/metrics.jsonl" "$work/many/metrics.jsonl" "$ranks" <<'PY'
import json, statistics, sys
def speed(path):
    rates = [r["images_per_s"] for r in map(json.loads, open(path)) if r["kind"] == "train"][1:]
    return statistics.median(rates)
one, many, ranks = speed(sys.argv[1]), speed(sys.argv[2]), sys.argv[3]
print(f"one process: {one:.0f} images/s; {ranks} ranks: {many:.0f} images/s; ratio {many / one:.2f}x")
PY
