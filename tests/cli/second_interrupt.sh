#!/usr/bin/env bash
# Ctrl-C twice (issue #37): the first asks the run to stop after the step under way, and says so; a
# second, 0.25 s or more later, ends the process at once, saying so, with exit status 130. The first
# is sent just after step 1 is logged, so that step 2 (long: ARGS give it many micro-batches) is under
# way when the second comes.
# With SECOND_AFTER=0 the second follows at once, as when one Ctrl-C reaches a rank from the terminal
# and from its launcher: that counts as one, and the run stops after step 2, saved.
#   [SECOND_AFTER=S] second_interrupt.sh LOCKSTEP ARGS...   (ARGS: a train command writing run/,
#   logging every step)
set -u
bin=$1
shift
"$bin" "$@" > train.log 2>&1 &
pid=$!
for _ in $(seq 1 3000); do
  [[ -s run/metrics.jsonl ]] && break
  kill -0 "$pid" 2> /dev/null || break
  sleep 0.01
done
kill -INT "$pid"
if [[ ${SECOND_AFTER:-0.4} == 0 ]]; then
  kill -INT "$pid"
else
  for _ in $(seq 1 500); do
    grep -q "stopping after the step under way" train.log && break
    sleep 0.01
  done
  sleep "${SECOND_AFTER:-0.4}"
  kill -INT "$pid"
fi
wait "$pid"
rc=$?
cat train.log
exit "$rc"
