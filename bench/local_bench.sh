#!/usr/bin/env bash
# bench/local_bench.sh — local clients on every core (issue 11, item 7): two
# client processes moving 32 x 4 MiB batches over the Unix socket of a
# 2-reactor node while node.health is probed on TCP; this tree against a
# base revision, side by side. See bench/local_bench.py for what is measured.
#
# Environment: BASE_REV [0308345, the last commit before issue 11] — built
# once into $BUILD/bench-base-<rev>/ from a git worktree of this repository;
# or BASE_BUILD, an existing build tree. RUNS [3], DURATION [6], SHIMS [2],
# BATCH [32], PAGE_MB [4], PROBES [6], PEERCACHE_BUILD_DIR [build].
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${PEERCACHE_BUILD_DIR:-$repo/build}
"$repo/scripts/build.sh" "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
if [ -z "${BASE_BUILD:-}" ]; then
  rev=${BASE_REV:-0308345}
  src=$build/bench-base-$rev/src
  BASE_BUILD=$build/bench-base-$rev/build
  if [ ! -x "$BASE_BUILD/server/peercached" ]; then
    echo "local_bench: building base revision $rev in $BASE_BUILD" >&2
    rm -rf "$src"
    git -C "$repo" worktree add --detach -f "$src" "$rev" >/dev/null 2>&1
    "$src/scripts/build.sh" "$BASE_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DPEERCACHE_BUILD_TESTS=OFF -DPEERCACHE_BUILD_BENCH=OFF
    git -C "$repo" worktree remove --force "$src"
  fi
fi
export BASE_BUILD PEERCACHE_BUILD_DIR=$build
export PEERCACHE_LIBRARY=${PEERCACHE_LIBRARY:-$build/client/libpeercache.so.0}
exec /usr/bin/python3 "$repo/bench/local_bench.py"
