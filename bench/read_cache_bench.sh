#!/usr/bin/env bash
# bench/read_cache_bench.sh — the directory read cache (directory_read_cache_ttl)
# on SGLang's read path: a reader node with the cache off against one with it
# on, side by side, for prefetch (batch_exists then batch_get_v1) and for a
# second read of the same pages. What it measures and how:
# bench/read_cache_bench.py (its docstring). This wrapper checks the knobs,
# builds what is missing and runs it with Debian's Python (torch).
#
# Environment (defaults in brackets):
#   PEERCACHE_BUILD_DIR  build tree [<repo>/build]; built with cmake only if
#                        peercached or libpeercache is missing
#   SIZES                page sizes, of 64k 256k 1m ["64k 256k"]
#   RUNS                 rounds per page size [5]
#   BATCH                pages per batch [32]
#   REP_MB               at least this many MiB per reader per round [128]
#   TTL                  the cache's directory_read_cache_ttl on node C [30s]
#   NODE_THREADS         peercached --threads [2]
#   RESULTS_DIR          where the JSON goes [$BUILD/bench-results]
#
# Only 127.0.0.1 is ever contacted; the nodes are stopped by PID on exit.
# shellcheck source-path=SCRIPTDIR source=lib.sh
set -euo pipefail

BENCH_NAME=read_cache_bench
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
SIZES=${SIZES:-"64k 256k"}
BATCH=${BATCH:-32}
REP_MB=${REP_MB:-128}
TTL=${TTL:-30s}
NODE_THREADS=${NODE_THREADS:-2}

need_count RUNS "$RUNS"
need_count BATCH "$BATCH"
need_count REP_MB "$REP_MB"
need_count NODE_THREADS "$NODE_THREADS"
need_torch

if [[ ! -x $BUILD/server/peercached || ! -e $BUILD/client/libpeercache.so.0 ]]; then
	bench_build "peercached or libpeercache missing"
fi

export PEERCACHE_BUILD_DIR=$BUILD SIZES RUNS BATCH REP_MB TTL NODE_THREADS RESULTS_DIR
exec "$PY" "$REPO/bench/read_cache_bench.py"
