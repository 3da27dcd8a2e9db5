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
BENCH_NAME=hardening_bench
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
"$REPO/scripts/deps.sh" bench >/dev/null
"$REPO/scripts/build.sh" "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo
bench_base_build "${BASE_REV:-aa514de}"
export BASE_BUILD PEERCACHE_BUILD_DIR=$BUILD
exec /usr/bin/python3 "$REPO/bench/hardening_bench.py"
