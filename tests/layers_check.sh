#!/usr/bin/env bash
# The library's layers include only downwards: each file of src/<layer>/ and include/lockstep/<layer>/
# may include the public or internal headers of its own layer and of those below it, as README's
# "Project layout" draws them. Prints each upward include (file:line) and exits 1 when there is one.
#   layers_check.sh SOURCE_DIR
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
declare -A below=(
  [core]=""
  [io]="core"
  [data]="io core"
  [quant]="core"
  [dist]="quant core"
  [model]="quant core"
  [train]="model dist quant data io core"
)
bad=0
for layer in "${!below[@]}"; do
  allowed=" $layer ${below[$layer]} "
  while IFS= read -r hit; do
    file=${hit%%:*} rest=${hit#*:} line=${rest%%:*}
    target=$(sed -E 's|.*#include "(lockstep/)?([a-z]+)/.*|\2|' <<< "$rest")
    [[ " core io data quant dist model train " == *" $target "* ]] || continue  # not a layer
    if [[ $allowed != *" $target "* ]]; then
      echo "layers: ${file#"$root"/}:$line: $layer includes $target, which is not below it: $(sed -E 's/^[0-9]+://' <<< "$rest")"
      bad=1
    fi
  done < <(grep -nHE '^#include "(lockstep/)?[a-z]+/' "$root/src/$layer" "$root/include/lockstep/$layer" -r 2> /dev/null)
done
((bad == 0)) && echo "layers: every include points down (${!below[*]})"
exit $bad
