#!/usr/bin/env bash
# The library's layers include only downwards: each file of src/<layer>/ and include/lockstep/<layer>/
# may include the public or internal headers of its own layer and of those below it. The table is
# src/CMakeLists.txt's LOCKSTEP_BELOW_<layer> lists (the one place it is written); README's "Project
# layout" arrows are checked against it. Prints each upward include (file:line) or arrow the table
# does not allow, and exits 1 when there is one.
#   layers_check.sh SOURCE_DIR
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
declare -A below=()
# The unindented definitions (the Python-only build narrows some inside an if(), indented).
while read -r layer rest; do
  below[$layer]=${rest//\"/}
done < <(sed -nE 's/^set\(LOCKSTEP_BELOW_([a-z]+) ?(.*)\)$/\1 \2/p' "$root/src/CMakeLists.txt")
layers=$(sed -nE 's/^set\(LOCKSTEP_LAYERS (.*)\)$/\1/p' "$root/src/CMakeLists.txt" | head -1)
if [[ -z $layers ]]; then
  echo "layers: no LOCKSTEP_LAYERS list found in $root/src/CMakeLists.txt"
  exit 1
fi
for layer in $layers; do
  [[ -v below[$layer] ]] || { echo "layers: src/CMakeLists.txt has no one-line LOCKSTEP_BELOW_$layer"; exit 1; }
done
bad=0
# README: "Dependencies point one way: `apps -> train -> {model, dist, data}`, `model -> quant`, ...":
# every arrow from a layer must point to a layer below it.
arrows=$(grep -o 'Dependencies point one way:.*' "$root/README.md" | head -1)
arrows+=$(grep -A2 'Dependencies point one way:' "$root/README.md" | tail -n +2 | tr '\n' ' ')
while read -r chain; do
  IFS='>' read -ra steps <<< "${chain//->/>}"
  for ((i = 0; i + 1 < ${#steps[@]}; i++)); do
    from=$(tr -d ' {}`' <<< "${steps[i]}") to=$(tr -d ' {}`' <<< "${steps[i + 1]}")
    [[ -v below[$from] ]] || continue  # apps, or not a layer
    for target in ${to//,/ }; do
      if [[ " ${below[$from]} " != *" $target "* ]]; then
        echo "layers: README.md says $from -> $target, which src/CMakeLists.txt's table does not allow"
        bad=1
      fi
    done
  done
done < <(grep -oE '`[a-z]+ -> [^`]*`' <<< "$arrows" | tr -d '`')
if [[ $(grep -oE '`[a-z]+ -> [^`]*`' <<< "$arrows" | wc -l) -eq 0 ]]; then
  echo "layers: README.md's 'Dependencies point one way:' arrows were not found"
  bad=1
fi
for layer in "${!below[@]}"; do
  allowed=" $layer ${below[$layer]} "
  while IFS= read -r hit; do
    file=${hit%%:*} rest=${hit#*:} line=${rest%%:*}
    target=$(sed -E 's|.*#include "(lockstep/)?([a-z]+)/.*|\2|' <<< "$rest")
    [[ " $layers " == *" $target "* ]] || continue  # not a layer
    if [[ $allowed != *" $target "* ]]; then
      echo "layers: ${file#"$root"/}:$line: $layer includes $target, which is not below it: $(sed -E 's/^[0-9]+://' <<< "$rest")"
      bad=1
    fi
  done < <(grep -nHE '^#include "(lockstep/)?[a-z]+/' "$root/src/$layer" "$root/include/lockstep/$layer" -r 2> /dev/null)
done
((bad == 0)) && echo "layers: every include points down (${!below[*]})"
exit $bad
