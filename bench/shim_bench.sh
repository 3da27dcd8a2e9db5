#!/usr/bin/env bash
# bench/shim_bench.sh — the SGLang shim (python/peercache) moving pages:
# batch_set_v1 / batch_get_v1 GB/s for 128-page batches, local and remote
# hits, side by side with single-thread memcpy of the same bytes and with the
# p2p bench's reader (pc-p2p-bench --target p2p) in the same run. What it
# measures and how: bench/shim_bench.py (its docstring). This wrapper checks
# the knobs, builds what is missing and runs it with Debian's Python (torch).
#
# Environment (defaults in brackets):
#   PEERCACHE_BUILD_DIR  build tree [<repo>/build]; built with cmake only if
#                        peercached, libpeercache or pc-p2p-bench is missing
#   SIZES                page sizes, 256k and/or 4m ["256k 4m"]
#   RUNS                 rounds per page size [5]
#   BATCH                pages per batch [128]
#   REP_MB               at least this many MiB per op per round [256]
#   DURATION             seconds of each p2p reader round [4]
#   NODE_THREADS         peercached --threads [2]
#   NODE_ARGS            more peercached arguments, for every node []
#   NODE_B_ARGS          more still for node B, the remote reader []
#   STALL_CPU            1: count node B's reactor callbacks over 1 ms of CPU [0]
#   RESULTS_DIR          where the JSON goes [$BUILD/bench-results]
#
# Only 127.0.0.1 is ever contacted; the nodes are stopped by PID on exit.
# shellcheck source-path=SCRIPTDIR source=lib.sh
set -euo pipefail

BENCH_NAME=shim_bench
DURATION=${DURATION:-4}  # before lib.sh, whose default (3) is for the other benches
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
SIZES=${SIZES:-"256k 4m"}
BATCH=${BATCH:-128}
REP_MB=${REP_MB:-256}
NODE_THREADS=${NODE_THREADS:-2}

need_count RUNS "$RUNS"
need_count BATCH "$BATCH"
need_count REP_MB "$REP_MB"
need_count NODE_THREADS "$NODE_THREADS"
need_seconds DURATION
need_torch

if [[ ! -x $BUILD/server/peercached || ! -e $BUILD/client/libpeercache.so.0 ||
	! -x $BUILD/bench/pc-p2p-bench ]]; then
	bench_build "peercached, libpeercache or pc-p2p-bench missing"
fi

export PEERCACHE_BUILD_DIR=$BUILD SIZES RUNS BATCH REP_MB NODE_THREADS DURATION RESULTS_DIR
export NODE_ARGS=${NODE_ARGS:-} NODE_B_ARGS=${NODE_B_ARGS:-} STALL_CPU=${STALL_CPU:-0}
exec "$PY" "$REPO/bench/shim_bench.py"
