#!/usr/bin/env bash
# Include arrows between choreo's top-level folders, computed from the #include "..." lines of the C++ and
# CUDA sources (.cc, .h, .cu, .cuh).
# A folder is cli, common, dsl, kernels, or runtime/<subfolder>; include/ is the public header.
# Prints one "from -> to (count)" line per pair of different folders, sorted; count = #include lines.
# Then "cycle: ..." lines (from tsort) if the folders include each other in a cycle, and exits 1.
# Usage: scripts/include_graph.sh [source root]   (default: the repository this script is in)
set -euo pipefail
root=${1:-"$(cd "$(dirname "$0")/.." && pwd)"}
cd "$root"
folder() {  # path -> folder name
  case "$1" in
    runtime/*/*) echo "$1" | cut -d/ -f1-2 ;;
    */*) echo "${1%%/*}" ;;
    *) echo "" ;;
  esac
}
arrows=$(for dir in cli common dsl kernels runtime include; do
  if [ -d "$dir" ]; then find "$dir" -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \); fi
done | sort | while read -r file; do
  from=$(folder "$file")
  sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file" | while read -r inc; do
    case "$inc" in choreo/*) inc="include/$inc" ;; esac
    to=$(folder "$inc")
    if [ -n "$to" ] && [ "$to" != "$from" ]; then echo "$from -> $to"; fi
  done
done | sort | uniq -c | awk '{ printf "%s %s %s (%d)\n", $2, $3, $4, $1 }')
echo "$arrows"
cycles=$(echo "$arrows" | awk '{ print $1, $3 }' | { tsort 2>&1 >/dev/null || true; } | sed -n 's/^tsort: -: input contains a loop:$/cycle:/p; s/^tsort: \([^-].*\)$/  \1/p')
if [ -n "$cycles" ]; then
  echo "$cycles"
  exit 1
fi
