#!/usr/bin/env bash
# Two ranks started by hand with --rank/--world-size: rank 0 with --master-port 0 (any free port)
# says where its store listens, and rank 1 is started with that port. Prints rank 0's output, then
# rank 1's, and exits with rank 0's status.
#   two_ranks.sh "RANK1_EXTRA_ARGS" LOCKSTEP train ARGS...   (rank 1 gets ARGS then RANK1_EXTRA_ARGS;
#                                                         "-" for none)
set -uo pipefail
rank1_extra=$1 ls_bin=$2
[[ "$rank1_extra" == "-" ]] && rank1_extra=""
shift 2
"$ls_bin" "$@" --rank 0 --world-size 2 --master-port 0 > rank0.log 2>&1 &
r0=$!
port=""
for _ in $(seq 1 600); do
  port=$(sed -n 's/^rank 0: the store listens on .*:\([0-9]*\)$/\1/p' rank0.log | head -1)
  [[ -n "$port" ]] && break
  kill -0 $r0 2>/dev/null || break
  sleep 0.05
done
if [[ -z "$port" ]]; then
  echo "rank 0 did not say where its store listens:"; cat rank0.log; kill -9 $r0 2>/dev/null; exit 1
fi
# shellcheck disable=SC2086  # the extra arguments are words
"$ls_bin" "$@" $rank1_extra --rank 1 --world-size 2 --master-port "$port" > rank1.log 2>&1 &
r1=$!
wait $r0
rc0=$?
wait $r1
rc1=$?
echo "--- rank 0 (exit $rc0) ---"; cat rank0.log
echo "--- rank 1 (exit $rc1) ---"; cat rank1.log
exit $rc0
