#!/usr/bin/env bash
# lockstep launch when ranks misbehave or launch itself is told to stop. Every case ends with no
# process of the run left behind.
#   launch_faults.sh LOCKSTEP stall    a rank stopped with SIGSTOP: launch reports the stall, exits non-zero
#   launch_faults.sh LOCKSTEP chatty   rank 0 logs every step for thousands of steps while rank 1 prints
#                                      nothing: the run completes (launch never blocks on a silent rank)
#   launch_faults.sh LOCKSTEP sigterm  SIGTERM to launch reaches the ranks; launch exits 128 + 15
#   launch_faults.sh LOCKSTEP killed SIG  rank 1 ended by SIG (KILL, SEGV): launch exits 3, a lost rank
# LOCKSTEP_TRAIN_EXTRA: more train flags (bench/gpu_check.sh: --device cuda --data DIR).
set -uo pipefail
ls_bin=$1 mode=$2
tiny=(--threads 1 --set data.train_subset=64 --set data.test_subset=8 --set model.channels=[4,4])
read -r -a extra <<< "${LOCKSTEP_TRAIN_EXTRA:-}"
tiny+=("${extra[@]}")

fail() { echo "FAIL: $*"; echo "--- launch.log ---"; cat launch.log 2>/dev/null | tail -40; cleanup; exit 1; }

# The ranks launch started, found by their parent (launch) and read back from /proc.
rank_pids() { pgrep -P "$launch_pid" 2>/dev/null || true; }
rank_pid() {
  local pid
  for pid in $(rank_pids); do
    tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "RANK=$1" && { echo "$pid"; return; }
  done
}
all_pids=()
remember_ranks() {
  local pid
  for pid in $(rank_pids); do [[ " ${all_pids[*]} " == *" $pid "* ]] || all_pids+=("$pid"); done
}
cleanup() {
  kill -9 "$launch_pid" 2>/dev/null
  for pid in "${all_pids[@]}"; do kill -9 "$pid" 2>/dev/null; done
}
# Waits up to $2 seconds for a regex in launch.log.
wait_for_log() {
  local deadline=$((SECONDS + $2))
  while ((SECONDS < deadline)); do
    remember_ranks
    grep -qE "$1" launch.log 2>/dev/null && return 0
    kill -0 "$launch_pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
# Waits up to $1 seconds for launch to exit; sets rc.
wait_for_exit() {
  local deadline=$((SECONDS + $1))
  while ((SECONDS < deadline)); do
    remember_ranks
    if ! kill -0 "$launch_pid" 2>/dev/null; then wait "$launch_pid"; rc=$?; return 0; fi
    sleep 0.1
  done
  return 1
}
no_rank_left() {
  local pid
  sleep 0.2
  for pid in "${all_pids[@]}"; do
    if [[ -e /proc/$pid ]] && [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]]; then
      fail "rank process $pid is still there after launch exited"
    fi
  done
}

# Starts 2 training ranks under launch (grace $1 s, collective timeout $2 s) and sets r1 to rank 1's
# pid once training runs.
start_training() {
  "$ls_bin" launch -n 2 --grace "$1" -- train --run-dir run --steps 100000 --batch-size 8 "${tiny[@]}" \
    --set train.log_every=50 --collective-timeout "$2" > launch.log 2>&1 &
  launch_pid=$!
  wait_for_log "rank 0/2\] step" 120 || fail "training did not start"
  remember_ranks
  r1=$(rank_pid 1)
  [[ -n "$r1" ]] || fail "rank 1 not found among launch's children"
}

case "$mode" in
  stall)
    start_training 15 3  # grace enough for the woken rank to report under load
    kill -STOP "$r1"
    wait_for_exit 60 || fail "launch still running 60 s after rank 1 was stopped (collective timeout 3 s)"
    ((rc != 0)) || fail "launch exited 0 although rank 1 stalled"
    grep -qE "rank 0/2\] .*timed out after 3000 ms waiting for rank\(s\) 1" launch.log ||
      fail "rank 0's stall report naming rank 1 is not in launch's output"
    grep -q "rank 0 failed" launch.log || fail "launch did not say which rank failed"
    # The woken rank prints at most one line, that it was stopped: no LibTorch warnings or stack
    # frames. (Under load it may also end before it reports anything.)
    woken=$(grep -c "^\[rank 1/2\] " launch.log)
    ((woken <= 1)) || fail "rank 1 printed $woken lines after it was woken, not one"
    ((woken == 0)) || grep -qE "^\[rank 1/2\] lockstep: rank 1 of 2 stopped on request" launch.log ||
      fail "rank 1's line does not say it was stopped"
    no_rank_left
    echo "ok: stalled rank 1 reported, launch exited $rc, no rank left"
    ;;
  chatty)
    steps=3000
    "$ls_bin" launch -n 2 -- train --run-dir run --steps $steps --batch-size 2 "${tiny[@]}" \
      --set train.log_every=1 --set train.eval_every=0 --collective-timeout 60 > launch.log 2>&1 &
    launch_pid=$!
    wait_for_exit 240 || fail "not done within 240 s"
    ((rc == 0)) || fail "launch exited $rc"
    n=$(grep -c "^\[rank 0/2\] step" launch.log)
    ((n >= steps)) || fail "only $n of $steps step lines from rank 0 came through"
    grep -q "rank 1/2\] trained $steps steps" launch.log || fail "rank 1 did not finish"
    no_rank_left
    echo "ok: $n step lines from rank 0 while rank 1 was silent"
    ;;
  sigterm)
    "$ls_bin" launch -n 2 --grace 5 -- train --run-dir run --steps 100000 --batch-size 8 "${tiny[@]}" \
      --set train.log_every=50 > launch.log 2>&1 &
    launch_pid=$!
    wait_for_log "rank 0/2\] step" 120 || fail "training did not start"
    remember_ranks
    ((${#all_pids[@]} == 2)) || fail "expected 2 ranks, found ${#all_pids[@]}"
    kill -TERM "$launch_pid"
    wait_for_exit 30 || fail "launch still running 30 s after SIGTERM"
    ((rc == 143)) || fail "launch exited $rc after SIGTERM, expected 143"
    grep -q "passing it to the ranks" launch.log || fail "launch did not say it passed the signal on"
    no_rank_left
    echo "ok: SIGTERM passed to both ranks, launch exited $rc, no rank left"
    ;;
  killed)
    sig=$3
    # Under AddressSanitizer a SIGSEGV would become ASan's report and exit status 1: let it kill.
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}handle_segv=0"
    start_training 5 10
    kill "-$sig" "$r1"
    wait_for_exit 60 || fail "launch still running 60 s after rank 1 got SIG$sig"
    ((rc == 3)) || fail "launch exited $rc after rank 1 got SIG$sig, expected 3 (a lost rank)"
    grep -q "rank 1 of 2 failed with signal" launch.log || fail "launch did not say that rank 1 ended by a signal"
    no_rank_left
    echo "ok: rank 1 ended by SIG$sig, launch exited $rc, no rank left"
    ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
