#!/bin/bash
# Does the training step ever wait for the image loader? Trains on OpenCV's example images (Debian
# package opencv-doc, fetched as the tests fetch them, each copied COPIES times under other names:
# mostly 640x480 photos) with the default buckets, model, global batch, workers and prefetch, and
# prints each epoch's wait for data from metrics.jsonl, beside the training speed.
# Usage: bench/folder_training.sh BUILD_DIR [COPIES] [extra `lockstep train` flags...]
set -euo pipefail
build=${1:?usage: bench/folder_training.sh BUILD_DIR [COPIES] [train flags...]}
copies=${2:-4}
shift $(( $# >= 2 ? 2 : 1 ))
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bash "$here/../tests/cli/fetch_opencv_images.sh" "$build/test-data/opencv-images"
mkdir "$work/images"
for c in $(seq 1 "$copies"); do
  for f in "$build"/test-data/opencv-images/*.{jpg,png}; do cp "$f" "$work/images/$c-$(basename "$f")"; done
done
"$build/bin/lockstep" train --data "$work/images" --run-dir "$work/run" --epochs 2 "$@" > "$work/train.log"
grep -m1 "^image folder" "$work/train.log"
python3 - "$work/run/metrics.jsonl" <<'PY'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
train = [r for r in records if r["kind"] == "train"]
first = train[0]
print(f"first logged window (step {first['step']}): waited {first['data_wait_s']:.3f} s")
for r in records:
    if r["kind"] == "epoch":
        print(f"epoch {int(r['epoch']) + 1}: ended at step {r['step']}, waited {r['data_wait_s']:.3f} s for data")
total = sum(r["data_wait_s"] for r in records if r["kind"] == "epoch")
elapsed = train[-1]["elapsed_s"]
print(f"in all: waited {total:.3f} s of {elapsed:.1f} s training ({100 * total / elapsed:.2f}%); "
      f"last window {train[-1]['images_per_s']:.1f} images/s")
PY
