#!/usr/bin/env bash
# bench/local_bench.sh — local clients on every core (issue 11, item 7): two
# client processes moving 32 x 4 MiB batches over the Unix socket of a
# 2-reactor node while node.health is probed on TCP; this tree against a
# base revision, side by side. See bench/local_bench.py for what is measured.
#
# Environment: BASE_REV [0308345, the last commit before issue 11] — built
# once into $BUILD/bench-base-<rev>/ from a git worktree of this repository;
# or BASE_BUILD, an existing build tree. RUNS [3], DURATION [6], SHIMS [2],
# BATCH [32], PAGE_MB [4], PROBES [6], PEERCACHE_BUILD_DIR [build], WAIT_PREFAULT,
# AFTER_ARGS, BASE_ARGS, TOUCH_DST, STALL_DETAIL (see local_bench.py).
set -euo pipefail
BENCH_NAME=local_bench
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
"$REPO/scripts/build.sh" "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo
bench_base_build "${BASE_REV:-0308345}" -DPEERCACHE_BUILD_BENCH=OFF
export BASE_BUILD PEERCACHE_BUILD_DIR=$BUILD
export PEERCACHE_LIBRARY=${PEERCACHE_LIBRARY:-$BUILD/client/libpeercache.so.0}
exec /usr/bin/python3 "$REPO/bench/local_bench.py"
