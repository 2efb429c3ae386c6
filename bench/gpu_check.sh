#!/usr/bin/env bash
# The GPU check: run unattended on a machine with CUDA GPUs and a CUDA PyTorch 2.x. It builds
# lockstep against that PyTorch, then checks, one line each (PASS, FAIL or SKIP, name, detail):
#   gpus          the GPUs torch sees
#   configure     CMake against the CUDA LibTorch (the build's other dependencies from --deps)
#   build         everything but the Google Benchmark programs
#   cuda-built    LOCKSTEP_HAVE_CUDA and LOCKSTEP_HAVE_NCCL compiled in
#   doctor        lockstep doctor lists cuda:0 and the NCCL transport
#   cuda-tests    the CudaKernels, CudaPaths and CudaTraining suites (the CUDA kernels and the device
#                 paths against the CPU kernels, NCCL on one and two GPUs with a collective mismatch,
#                 every quantizer training on cuda:0 and resuming on the CPU), none skipped except what
#                 needs more GPUs than there are
#   python-cuda   the Python modules moved with .cuda() train as on the CPU (python/tests/cuda_check.py),
#                 when the build made the Python package
#   compare-cuda  lockstep's Python modules beside vector-quantize-pytorch's on cuda:0 at an image
#                 tokenizer's shapes: forward+backward time and peak memory (python/bench/compare_reference.py
#                 --device cuda --tokenizer; without --quick also compiled); needs vector_quantize_pytorch
#                 importable (a GPU machine without it: carry its wheels, docs/devices.md)
#   unit-suite    the rest of the unit tests on this machine (not the CLI or Python tests)
#   bench         lockstep bench quantizers on the CPU (all cores) and on cuda:0, side by side
#   train-cuda    the demo on cuda:0 beside the demo on the CPU: time and test PSNR
#   train-vs-torch the CLI trainer beside a plain PyTorch loop of the same architecture (the demo's), same
#                 Fashion-MNIST images and steps, on cuda:0: images/s of each (python/bench/trainer_vs_pytorch.py)
#   recipe-cuda   the recipe of docs/losses.md (bench/recipe_folder.sh, 2000 steps) on cuda:0: the
#                 held-out figures with MSE alone and with L1 + adversarial; needs a build that decodes
#                 images (OpenCV) and the example photos (--deps DIR/opencv-images)
#   nccl-train    (2+ GPUs) the demo on 2 ranks over NCCL (lockstep launch)
#   nccl-killed   (2+ GPUs) a rank SIGKILLed mid-run is named by the other, and the run resumes
#   nccl-stalled  (2+ GPUs) a rank stopped with SIGSTOP is reported and launch exits non-zero
#   python-nccl   (2+ GPUs) the Python modules over an NCCL-only process group under torchrun, rank 0
#                 previewing alone: ranks identical (python/tests/nccl_check.py)
#   checked-nccl  (2+ GPUs) lockstep.distributed over NCCL: what checking costs per collective and per DDP
#                 step, beside no check and TORCH_DISTRIBUTED_DEBUG=DETAIL (python/bench/checked_collectives.py)
#
#   bench/gpu_check.sh [--deps DIR] [--torch-root DIR] [--build DIR] [--out DIR] [--quick]
# --deps: what scripts/gpu-deps prepared on a Debian machine (headers, Fashion-MNIST) for a GPU
# machine without Debian's archive; --torch-root: torch's package directory (default: python3's
# torch); --out: where the logs are copied; --quick: no unit-suite and shorter benchmarks. Exit
# status 0 when no check failed.
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
deps="" torch_root="" build="$src/build-gpu" out="" quick=0
while (($#)); do
  case "$1" in
    --deps) deps=$(cd "$2" && pwd); shift 2 ;;
    --torch-root) torch_root=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
logs="$build/gpu-check"
mkdir -p "$logs"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0 skipped=0
pass() { echo "PASS $1: $2"; ((++passed)); }
fail() { echo "FAIL $1: $2 (log: $logs/$1.log)"; ((++failed)); }
skip() { echo "SKIP $1: $2"; ((++skipped)); }
seconds() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", (b - a) / 1e9 }'; }
finish() {
  echo "gpu_check: $passed passed, $failed failed, $skipped skipped"
  [[ -n $out ]] && mkdir -p "$out" && cp "$logs"/*.log "$out"/ 2>/dev/null
  exit $((failed > 0))
}

data=/usr/share/datasets/fashion-mnist
[[ -n $deps && -d $deps/fashion-mnist ]] && data=$deps/fashion-mnist
if [[ -z $torch_root ]]; then
  torch_root=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null)
fi
echo "gpu_check: lockstep $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?'), torch at ${torch_root:-?}," \
     "data at $data, build in $build"

# --- gpus
# As torch counts them (CUDA_VISIBLE_DEVICES applies), else as the driver lists them.
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>"$logs/gpus.log" ||
       nvidia-smi -L 2>/dev/null | grep -c '^GPU')
nvidia-smi -L >> "$logs/gpus.log" 2>&1
if ((gpus > 0)); then
  pass gpus "$gpus visible: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | xargs)"
else
  fail gpus "torch sees no CUDA device"
fi

# --- configure and build
prefix=()
[[ -n $deps ]] && prefix=(-DCMAKE_PREFIX_PATH="$deps/root/usr")
if [[ ! -f $torch_root/share/cmake/Torch/TorchConfig.cmake ]]; then
  echo "no TorchConfig.cmake under '$torch_root'" > "$logs/configure.log"
  fail configure "no CUDA PyTorch found (give --torch-root)"
  finish
fi
if cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_TORCH_ROOT="$torch_root" \
     -DLOCKSTEP_BUILD_BENCH=OFF -DLOCKSTEP_FASHION_MNIST_DIR="$data" "${prefix[@]}" > "$logs/configure.log" 2>&1; then
  pass configure "LibTorch $(sed -n "s/^__version__ = '\(.*\)'$/\1/p" "$torch_root/version.py" 2>/dev/null)"
else
  fail configure "cmake failed: $(grep -m1 -A2 'CMake Error' "$logs/configure.log" | tr '\n' ' ' | cut -c1-200)"
  finish
fi
t0=$(date +%s%N)
if cmake --build "$build" -j "$(nproc)" > "$logs/build.log" 2>&1; then
  pass build "$(seconds "$t0" "$(date +%s%N)") s on $(nproc) cores"
else
  fail build "$(grep -m1 -E 'error|FAILED' "$logs/build.log" | cut -c1-200)"
  finish
fi
bin=$build/bin/lockstep
config_h=$build/include/lockstep/config_build.h
if grep -q '#define LOCKSTEP_HAVE_CUDA 1' "$config_h" && grep -q '#define LOCKSTEP_HAVE_NCCL 1' "$config_h"; then
  pass cuda-built "CUDA and NCCL paths compiled in"
else
  grep LOCKSTEP_HAVE "$config_h" > "$logs/cuda-built.log"
  fail cuda-built "$(grep -E 'HAVE_(CUDA|NCCL)' "$config_h" | xargs)"
fi
"$bin" doctor > "$logs/doctor.log" 2>&1
nccl_row=$(grep -m1 '^NCCL transport' "$logs/doctor.log" | xargs)
if grep -q 'cuda:0' "$logs/doctor.log" && [[ $nccl_row == *built* && $nccl_row != *unusable* ]]; then
  pass doctor "$(grep -m1 'cuda:0' "$logs/doctor.log" | xargs | cut -c1-100); $nccl_row"
else
  fail doctor "lockstep doctor: $(grep -m1 'CUDA devices' "$logs/doctor.log" | xargs); $nccl_row"
fi
((gpus > 0)) || { skip "cuda-tests bench train-cuda train-vs-torch nccl-*" "no GPU"; finish; }

# --- the CUDA unit tests
"$build/tests/lockstep_tests" --gtest_filter='CudaKernels.*:CudaPaths.*:CudaTraining.*' > "$logs/cuda-tests.log" 2>&1
rc=$?
ran=$(grep -c '^\[ RUN' "$logs/cuda-tests.log")
# gtest names a skipped test twice (as it runs, and in the summary): once each here.
skipped_tests=$(grep -E '^\[  SKIPPED \] [A-Za-z]' "$logs/cuda-tests.log" | sed 's/^\[  SKIPPED \] //;s/ (.*//' |
  sort -u | xargs)
# Only the tests of two GPUs may skip, and only on a machine with one.
unexpected=0
for t in $skipped_tests; do [[ $t == *TwoGpus* && $gpus -lt 2 ]] || ((++unexpected)); done
if ((rc == 0 && ran > 0 && unexpected == 0)); then
  pass cuda-tests "$ran run${skipped_tests:+, skipped (too few GPUs): $skipped_tests}"
else
  fail cuda-tests "exit $rc; $(grep -E '^\[  FAILED  \] [A-Za-z]' "$logs/cuda-tests.log" | sed 's/^\[  FAILED  \] //' | xargs | cut -c1-200)"
fi

# --- the Python package on the GPU
if ! compgen -G "$build/python/lockstep/_C*.so" > /dev/null; then
  skip python-cuda "the build made no Python package (it needs Python's headers)"
elif PYTHONPATH="$build/python" python3 "$src/python/tests/cuda_check.py" > "$logs/python-cuda.log" 2>&1; then
  pass python-cuda "$(tail -1 "$logs/python-cuda.log")"
else
  fail python-cuda "$(grep -m2 -E '^FAIL|Error' "$logs/python-cuda.log" | xargs | cut -c1-200)"
fi

# --- beside the reference on the GPU
compare="$src/python/bench/compare_reference.py"
if [[ ! -d "$build/python/lockstep" ]]; then
  skip compare-cuda "the build made no Python package"
elif ! python3 -c 'import vector_quantize_pytorch' 2> /dev/null; then
  skip compare-cuda "vector_quantize_pytorch is not importable here (carry its wheels: docs/devices.md)"
else
  compare_time=$([[ $quick == 1 ]] && echo 0.2 || echo 1)
  PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" python3 "$compare" --device cuda:0 --tokenizer \
    --min-time "$compare_time" > "$logs/compare-cuda.log" 2>&1
  rc=$?
  if ((rc == 0 && quick == 0)); then
    PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" python3 "$compare" --device cuda:0 --tokenizer --compile \
      --min-time "$compare_time" >> "$logs/compare-cuda.log" 2>&1
    rc=$?
  fi
  if ((rc == 0)); then
    pass compare-cuda "lockstep beside vector-quantize-pytorch on cuda:0 (compare-cuda.log):"
    grep -E '^(torch|\|)' "$logs/compare-cuda.log" | sed 's/^/    /'
  else
    fail compare-cuda "exit $rc: $(grep -m2 -E 'Error|error' "$logs/compare-cuda.log" | xargs | cut -c1-200)"
  fi
fi

# --- the rest of the unit suite (the Python suite needs vector-quantize-pytorch, not installed there)
if ((quick)); then
  skip unit-suite "--quick"
elif ctest --test-dir "$build" -E '^(cli|python)\.' -j 8 --timeout 600 > "$logs/unit-suite.log" 2>&1; then
  pass unit-suite "$(grep -E 'tests passed' "$logs/unit-suite.log")"
else
  fail unit-suite "$(grep -E 'tests passed|tests failed' "$logs/unit-suite.log" | xargs)"
fi

# --- the quantizer benchmarks, CPU and GPU side by side
min_time=$([[ $quick == 1 ]] && echo 0.2 || echo 1)
"$bin" bench quantizers --threads "$(nproc)" --min-time "$min_time" > "$logs/bench-cpu.log" 2>&1
rc_cpu=$?
"$bin" bench quantizers --device cuda:0 --min-time "$min_time" > "$logs/bench.log" 2>&1
rc_gpu=$?
if ((rc_cpu == 0 && rc_gpu == 0)); then
  pass bench "median ms per case, CPU ($(nproc) threads) and cuda:0 ($logs/bench-cpu.log, bench.log):"
  # Rows are 'case (13 chars) shape (31 chars) median-ms ...'; matched on the first 44 characters.
  # Cases the CPU has no row for (the GPU's own, kernel beside torch-op path) print with "-".
  awk 'NR == FNR { if (length($0) > 44) cpu[substr($0, 1, 44)] = substr($0, 45); next }
       length($0) > 44 && (substr($0, 1, 44) in cpu) && $0 !~ /^(case|rate:)/ {
         split(cpu[substr($0, 1, 44)], c, " "); split(substr($0, 45), g, " ")
         printf "    %-44s cpu %10s ms  gpu %10s ms  %7.1fx\n", substr($0, 1, 44), c[1], g[1], c[1] / (g[1] > 0 ? g[1] : 1) }
       length($0) > 44 && !(substr($0, 1, 44) in cpu) && $0 ~ /^[a-z]/ && $0 !~ /^(case|rate:|lockstep|limits)/ {
         split(substr($0, 45), g, " "); printf "    %-44s cpu %10s    gpu %10s ms  %s\n", substr($0, 1, 44), "-", g[1], substr($0, 45) }
       /limits measured/ { print "    gpu " $0 }' "$logs/bench-cpu.log" "$logs/bench.log"
  grep 'limits measured' "$logs/bench-cpu.log" | sed 's/^/    cpu /'
else
  fail bench "cpu exit $rc_cpu, gpu exit $rc_gpu: $(tail -1 "$logs/bench.log")"
fi

# --- the demo on the GPU and on the CPU
demo() {  # demo NAME DEVICE [launch args...]: trains the demo, sets secs and psnr
  local name=$1 device=$2
  shift 2
  local t0
  t0=$(date +%s%N)
  "$bin" "$@" train --run-dir "$work/$name" --data "$data" --device "$device" > "$logs/$name.log" 2>&1
  local rc=$?
  secs=$(seconds "$t0" "$(date +%s%N)")
  psnr=$(python3 -c "import json; print(round(json.load(open('$work/$name/summary.json'))['test']['psnr_db'], 2))" 2>/dev/null)
  return $rc
}
if demo train-cuda cuda:0; then
  gpu_secs=$secs gpu_psnr=$psnr
  demo train-cpu cpu
  pass train-cuda "demo on cuda:0 ${gpu_secs} s, test PSNR ${gpu_psnr} dB; on the CPU ($(nproc) cores) ${secs} s, ${psnr} dB"
else
  fail train-cuda "$(grep -m1 'error' "$logs/train-cuda.log" | cut -c1-200)"
fi

# --- the CLI trainer beside research-style PyTorch code of the same architecture, same data and steps
steps_vs=$((quick ? 300 : 1000))
if PYTHONPATH="$build/python" python3 "$src/python/bench/trainer_vs_pytorch.py" --lockstep "$bin" --data "$data" \
    --device cuda:0 --steps "$steps_vs" > "$logs/train-vs-torch.log" 2>&1; then
  pass train-vs-torch "$steps_vs steps on cuda:0, images/s: $(grep -E '^\| (lockstep|PyTorch)|^ratio' \
    "$logs/train-vs-torch.log" | cut -d'|' -f2,3 | xargs | cut -c1-300)"
else
  fail train-vs-torch "$(tail -1 "$logs/train-vs-torch.log" | cut -c1-200)"
fi

# --- the recipe of docs/losses.md on the GPU
images=""
[[ -n $deps && -d $deps/opencv-images ]] && images=$deps/opencv-images
if ! "$bin" doctor 2>/dev/null | grep -q "decoded with OpenCV"; then
  skip recipe-cuda "this build cannot decode images (no OpenCV)"
elif [[ -z $images ]]; then
  skip recipe-cuda "no example photos (scripts/gpu-deps copies them to DIR/opencv-images)"
elif LOCKSTEP_RECIPE_IMAGES=$images bash "$src/bench/recipe_folder.sh" "$build" 2000 "$logs/recipe" --device cuda:0 \
    > "$logs/recipe-cuda.log" 2>&1; then
  pass recipe-cuda "$(grep -E '^(mse|gan):|^test' "$logs/recipe-cuda.log" | xargs | cut -c1-400)"
else
  fail recipe-cuda "$(grep -m1 'error' "$logs/recipe-cuda.log" | cut -c1-200)"
fi

# --- several ranks over NCCL, and the failure modes
if ((gpus < 2)); then
  skip "nccl-train nccl-killed nccl-stalled python-nccl checked-nccl" "need 2 GPUs, $gpus visible (the 2-rank NCCL mismatch test in cuda-tests skipped too)"
  finish
fi
t0=$(date +%s%N)
if "$bin" launch -n 2 -- train --run-dir "$work/nccl-train" --data "$data" --device cuda > "$logs/nccl-train.log" 2>&1; then
  psnr=$(python3 -c "import json; print(round(json.load(open('$work/nccl-train/summary.json'))['test']['psnr_db'], 2))" 2>/dev/null)
  pass nccl-train "demo on 2 ranks (cuda:0, cuda:1) $(seconds "$t0" "$(date +%s%N)") s, test PSNR $psnr dB"
else
  fail nccl-train "$(grep -m1 'error' "$logs/nccl-train.log" | cut -c1-200)"
fi
# The CLI's fault scenarios (tests/cli/fault_scenarios.py) on NCCL: their train flags from LOCKSTEP_TRAIN_EXTRA.
extra="--device cuda --data $data"
if LOCKSTEP_TRAIN_EXTRA="$extra" LOCKSTEP_COMPARE_TOL=1e-2 python3 "$src/tests/cli/scenarios.py" \
    kill_a_rank_then_resume --lockstep "$bin" --workdir "$work/killed" > "$logs/nccl-killed.log" 2>&1; then
  pass nccl-killed "$(grep -m1 'named rank 1' "$logs/nccl-killed.log")"
else
  fail nccl-killed "$(grep -m1 'FAILED' "$logs/nccl-killed.log" | cut -c1-200)"
fi
if LOCKSTEP_TRAIN_EXTRA="$extra" python3 "$src/tests/cli/scenarios.py" \
    launch_reports_a_stalled_rank --lockstep "$bin" --workdir "$work/stalled" > "$logs/nccl-stalled.log" 2>&1; then
  pass nccl-stalled "$(grep -m1 '^ok: stalled' "$logs/nccl-stalled.log")"
else
  fail nccl-stalled "$(grep -m1 'FAILED' "$logs/nccl-stalled.log" | cut -c1-200)"
fi
if [[ ! -d "$build/python/lockstep" ]]; then
  skip python-nccl "the build made no Python package"
elif PYTHONPATH="$build/python" python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
    "$src/python/tests/nccl_check.py" > "$logs/python-nccl.log" 2>&1; then
  pass python-nccl "$(grep -c '^PASS' "$logs/python-nccl.log") module checks passed on each rank"
else
  fail python-nccl "$(grep -m2 -E '^FAIL|Error' "$logs/python-nccl.log" | xargs | cut -c1-200)"
fi
if [[ ! -d "$build/python/lockstep" ]]; then
  skip checked-nccl "the build made no Python package"
elif PYTHONPATH="$build/python" python3 "$src/python/bench/checked_collectives.py" --cuda --repeats 3 \
    > "$logs/checked-nccl.log" 2>&1; then
  pass checked-nccl "$(grep -E '^(all_reduce 4 B|DDP step)' "$logs/checked-nccl.log" | xargs | cut -c1-200)"
else
  fail checked-nccl "$(grep -m2 -E 'Error|failed' "$logs/checked-nccl.log" | xargs | cut -c1-200)"
fi
finish
