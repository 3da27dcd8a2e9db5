#!/usr/bin/env bash
# scripts/build.sh — configure (once) and build one build tree.
#
# Usage: scripts/build.sh DIR [cmake -D options...]
# Re-running only rebuilds what changed. Warnings are errors here.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$1; shift
if [ ! -f "$dir/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$dir" -DPEERCACHE_WERROR=ON "$@" >/dev/null
fi
cmake --build "$dir" -j"$(nproc)" -- --no-print-directory >/dev/null
