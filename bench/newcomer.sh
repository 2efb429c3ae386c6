#!/usr/bin/env bash
# A newcomer's `make demo`, timed phase by phase from a fresh clone with cold caches: the Debian
# packages (scripts/install-deps --system), the Python environment with PyPI's torch (a fresh
# download: its own XDG cache), configuring, building the CLI (ccache off) and the demo run itself.
# Prints one line per phase and the total; docs/performance.md keeps the figures.
#
#   bench/newcomer.sh [SOURCE] [SCRATCH]   SOURCE: a repository to clone (default: this one's)
#                                          SCRATCH: an empty directory to work in (default: mktemp)
#
# A machine that already holds the Debian packages measures the first phase as a check only.
set -euo pipefail
source_repo=${1:-$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)}
scratch=${2:-$(mktemp -d /tmp/lockstep-newcomer.XXXXXX)}
mkdir -p "$scratch"
export XDG_CACHE_HOME="$scratch/cache" CCACHE_DISABLE=1
unset LOCKSTEP_VENV

phases=()
timed() {
  local name=$1
  shift
  local start=$SECONDS
  "$@"
  phases+=("$(printf '%-28s %5d s' "$name" $((SECONDS - start)))")
}

timed "git clone" git clone -q "$source_repo" "$scratch/lockstep"
cd "$scratch/lockstep"
timed "Debian packages" scripts/install-deps --system
timed "Python env (torch download)" scripts/python-env
timed "configure" make -s configure
timed "build the CLI" cmake --build build --target lockstep_cli -- -j "$(nproc)"
timed "demo run" build/bin/lockstep train
echo
echo "newcomer, from a fresh clone of $(git rev-parse --short HEAD) in $scratch:"
printf '  %s\n' "${phases[@]}"
echo "  total: $SECONDS s"
