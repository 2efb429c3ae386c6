#!/bin/bash
# The recipe of docs/losses.md: a VQGAN-class tokenizer trained on OpenCV's example photos (Debian
# package opencv-doc, fetched as the tests fetch them) at 128x128, twice over the same steps, data,
# schedule and weight average: with the mean squared error alone, and with L1 plus the adversarial
# loss (plus LPIPS when a weights file is given). Prints each run's held-out figures and copies its
# reconstruction grid to OUT_DIR.
# Usage: bench/recipe_folder.sh BUILD_DIR STEPS OUT_DIR [--lpips FILE] [extra `lockstep train` flags...]
# LOCKSTEP_RECIPE_IMAGES names a folder of the images to use instead (a GPU machine without apt).
set -euo pipefail
build=${1:?usage: bench/recipe_folder.sh BUILD_DIR STEPS OUT_DIR [--lpips FILE] [train flags...]}
steps=${2:?steps}
out=${3:?output directory}
shift 3
lpips=()
if [[ ${1:-} == --lpips ]]; then
  lpips=(--set "loss.lpips_weights=$2" --set loss.perceptual=1)
  shift 2
fi
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
images=${LOCKSTEP_RECIPE_IMAGES:-$build/test-data/opencv-images}
[[ -n ${LOCKSTEP_RECIPE_IMAGES:-} ]] || bash "$here/../tests/cli/fetch_opencv_images.sh" "$images"
common=(--data "$images" --set data.dataset=folder --set data.buckets=128x128
        --set data.eval_images=8 --set data.random_flip=true --set data.random_zoom=1.5
        --batch-size 8 --steps "$steps" --lr 4e-4 --set train.warmup_steps=$((steps / 20))
        --set train.lr_decay=cosine --set train.ema_decay=0.99 --set train.log_every=$((steps / 10))
        --set train.checkpoint_every=0 --set eval.grid_images=8
        --set model.architecture=vqgan --set model.channels=[32,64,128] --set model.res_blocks=1
        --set model.attention_levels=[2] --set model.norm_groups=32)
gan=(--set loss.l2=0 --set loss.l1=1 --set loss.adversarial=0.1 --set loss.gan_start_step=$((steps / 3))
     --set loss.lecam=0.001 --set loss.disc_channels=32 --set loss.disc_layers=3)
for name in mse gan; do
  extra=()
  [[ $name == gan ]] && extra=("${gan[@]}" "${lpips[@]}")
  start=$(date +%s)
  "$build/bin/lockstep" train --run-dir "$work/$name" "${common[@]}" "${extra[@]}" "$@" > "$work/$name.log"
  echo "$name: trained $steps steps in $(( $(date +%s) - start )) s"
  grep -E "^test" "$work/$name.log" || true
  cp "$work/$name/reconstructions.png" "$out/recipe-$name.png"
  cp "$work/$name/summary.json" "$out/recipe-$name.json"
  # The weight average's grid: lockstep eval --ema on the held-out images.
  "$build/bin/lockstep" eval "$work/$name" --ema --grid "$out/recipe-$name-ema.png" | grep -E "^mse" | sed 's/^/weight average, lockstep eval --ema: /'
done
