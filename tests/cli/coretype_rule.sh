#!/usr/bin/env bash
# The OPENBLAS_CORETYPE rule on whatever CPU runs the test: lockstep re-executes itself with the
# recommended core type exactly when OpenBLAS's own choice differs from it, and otherwise leaves
# the variable unset. (Which case a CPU falls in depends on its model: tests must not assume one.)
#   coretype_rule.sh LOCKSTEP
set -uo pipefail
ls_bin=$1
unset OPENBLAS_CORETYPE LOCKSTEP_BLAS_REEXEC LOCKSTEP_NO_REEXEC

own=$(LOCKSTEP_NO_REEXEC=1 "$ls_bin" doctor --quick --threads 1) || { echo "doctor failed: $own"; exit 1; }
if ! grep -q "^BLAS vendor *OpenBLAS" <<<"$own"; then
  echo "ok: the BLAS is not OpenBLAS, nothing to choose"; exit 0
fi
chosen=$(sed -n 's/^BLAS core *\([A-Za-z0-9]*\).*/\1/p' <<<"$own")
wanted=$(sed -n 's/^BLAS core .*(recommended for this CPU: \([A-Za-z0-9]*\)).*/\1/p' <<<"$own")
[[ -n "$chosen" ]] || { echo "no BLAS core row:"; echo "$own"; exit 1; }
grep -q "^OPENBLAS_CORETYPE *unset" <<<"$own" || { echo "LOCKSTEP_NO_REEXEC=1 still set the variable:"; echo "$own"; exit 1; }

out=$("$ls_bin" doctor --quick --threads 1) || { echo "doctor failed: $out"; exit 1; }
if [[ -n "$wanted" && "${chosen,,}" != "${wanted,,}" ]]; then
  grep -q "^BLAS core *$wanted" <<<"$out" &&
    grep -q "^OPENBLAS_CORETYPE *$wanted (set by lockstep" <<<"$out" ||
    { echo "OpenBLAS chose $chosen, $wanted is recommended, but lockstep did not switch:"; echo "$out"; exit 1; }
  echo "ok: OpenBLAS chose $chosen on its own; lockstep re-executed with OPENBLAS_CORETYPE=$wanted"
else
  grep -q "^OPENBLAS_CORETYPE *unset" <<<"$out" && grep -q "^BLAS core *$chosen" <<<"$out" ||
    { echo "OpenBLAS's own choice $chosen is right, yet lockstep changed something:"; echo "$out"; exit 1; }
  echo "ok: OpenBLAS chose $chosen on its own, which suits this CPU; lockstep left it alone"
fi
