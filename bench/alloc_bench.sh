#!/usr/bin/env bash
# bench/alloc_bench.sh — heap allocations per 128-key kv.set / kv.get (local
# and remote hits); see bench/alloc_bench.py for the cases and the output.
#
# Environment: PEERCACHE_BUILD_DIR [build] (built here, RelWithDebInfo),
# RUNS [5], CALLS [20]. BASE_REV (optional): also measure that revision,
# exported with git archive into $BUILD/bench-base-<rev>/ and built there.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${PEERCACHE_BUILD_DIR:-$repo/build}
"$repo/scripts/build.sh" "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
if [ -n "${BASE_REV:-}" ]; then
  src=$build/bench-base-$BASE_REV/src
  base=$build/bench-base-$BASE_REV/build
  if [ ! -x "$base/server/peercached" ]; then
    rm -rf "$src" && mkdir -p "$src"
    git -C "$repo" archive "$BASE_REV" | tar -x -C "$src"
    # The counter library is this tree's: the base may predate it.
    cp "$repo/bench/alloc_count.c" "$src/bench/"
    grep -q pc-alloc-count "$src/bench/CMakeLists.txt" ||
      printf 'add_library(pc-alloc-count MODULE alloc_count.c)\nset_target_properties(pc-alloc-count PROPERTIES PREFIX "")\n' \
        >> "$src/bench/CMakeLists.txt"
    "$src/scripts/build.sh" "$base" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DPEERCACHE_BUILD_TESTS=OFF
  fi
  echo "alloc_bench: base $BASE_REV" >&2
  PEERCACHE_BUILD_DIR=$base /usr/bin/python3 "$repo/bench/alloc_bench.py"
fi
echo "alloc_bench: this tree" >&2
PEERCACHE_BUILD_DIR=$build exec /usr/bin/python3 "$repo/bench/alloc_bench.py"
