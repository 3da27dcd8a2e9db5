#!/usr/bin/env bash
# bench/hardening_bench.sh — this tree against a base revision on the hot
# paths issue 10 touched (RPC round trips, kv.get, accepting connections);
# see bench/hardening_bench.py for the cases and the output.
#
# Environment: BASE_REV [aa514de, the last commit before issue 10] — built
# once into $BUILD/bench-base-<rev>/ from a git worktree of this repository
# (needs the repository's history); or BASE_BUILD, an existing build tree
# to compare with. RUNS [5], DURATION [3], ACCEPTS [2000],
# PEERCACHE_BUILD_DIR [build].
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${PEERCACHE_BUILD_DIR:-$repo/build}
"$repo/scripts/deps.sh" bench >/dev/null
"$repo/scripts/build.sh" "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
if [ -z "${BASE_BUILD:-}" ]; then
  rev=${BASE_REV:-aa514de}
  src=$build/bench-base-$rev/src
  BASE_BUILD=$build/bench-base-$rev/build
  if [ ! -x "$BASE_BUILD/server/peercached" ]; then
    echo "hardening_bench: building base revision $rev in $BASE_BUILD" >&2
    rm -rf "$src"
    git -C "$repo" worktree add --detach -f "$src" "$rev" >/dev/null 2>&1
    "$src/scripts/build.sh" "$BASE_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DPEERCACHE_BUILD_TESTS=OFF
    git -C "$repo" worktree remove --force "$src"
  fi
fi
export BASE_BUILD PEERCACHE_BUILD_DIR=$build
exec /usr/bin/python3 "$repo/bench/hardening_bench.py"
