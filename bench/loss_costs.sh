#!/bin/bash
# What each loss and training-practice setting costs per step: trains the demo's model on
# Fashion-MNIST for STEPS steps with each setting in turn and prints the training speed from
# metrics.jsonl. LPIPS runs on random weights in the LPIPS-VGG layout (the cost is the network's,
# not the weights'), written by tests/cli/make_lpips_weights.py.
# Usage: bench/loss_costs.sh BUILD_DIR [STEPS] [extra `lockstep train` flags...]
set -euo pipefail
build=${1:?usage: bench/loss_costs.sh BUILD_DIR [STEPS] [train flags...]}
steps=${2:-40}
shift $(( $# >= 2 ? 2 : 1 ))
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 "$here/../tests/cli/make_lpips_weights.py" "$work/lpips.safetensors"
settings=("baseline (MSE)|"
          "L1 instead of MSE|--set loss.l2=0 --set loss.l1=1"
          "LPIPS (perceptual 1)|--set loss.perceptual=1 --set loss.lpips_weights=$work/lpips.safetensors"
          "adversarial (adaptive, LeCam)|--set loss.adversarial=0.1 --set loss.lecam=0.001"
          "weight average (EMA)|--set train.ema_decay=0.999"
          "4 micro-batches|--set train.grad_accum=4"
          "bfloat16 autocast|--set train.precision=bfloat16")
printf "%-32s %12s %10s\n" setting "images/s" "vs base"
base=""
for entry in "${settings[@]}"; do
  name=${entry%%|*}
  read -r -a flags <<< "${entry#*|}"
  run="$work/run$RANDOM"
  "$build/bin/lockstep" train --run-dir "$run" --steps "$steps" --set train.log_every="$steps" \
    --set train.checkpoint_every=0 --set data.test_subset=500 "${flags[@]}" "$@" > "$run.log"
  speed=$(python3 -c "import json,sys; print([json.loads(l) for l in open('$run/metrics.jsonl') if '\"train\"' in l][-1]['images_per_s'])")
  [[ -z $base ]] && base=$speed
  printf "%-32s %12.0f %9.2fx\n" "$name" "$speed" "$(python3 -c "print($base / $speed)")"
done
