#!/usr/bin/env bash
# bench/hostpool_bench.sh — the SGLang shim with the host KV pool on SGLang's
# "allocator":"shm" (shared with the node: direct) vs the default allocator
# (staged through a shared buffer: one more copy per page), GB/s and
# per-batch latency; and the TTFT path of buffer_only host mode (existence
# query and read of a prefix), p50/p99 latency. What it measures and how:
# bench/hostpool_bench.py (its docstring). This wrapper checks the knobs,
# builds what is missing and runs it with Debian's Python (torch).
#
# Environment (defaults in brackets):
#   PEERCACHE_BUILD_DIR  build tree [<repo>/build]; built with cmake only if
#                        peercached or libpeercache is missing
#   SIZES                page sizes (K+V), of 256k 1m 4m ["256k"]
#   RUNS                 rounds of the allocator comparison [5]
#   BATCH                pages per batch [128, SGLang's STORAGE_BATCH_SIZE]
#   REP_MB               at least this many MiB per op per round [128]
#   ITER                 calls per TTFT-path measurement [200]
#   TTFT_PAGES           pages of the TTFT-path prefix [16]
#   NODE_THREADS         peercached --threads [2]
#   RESULTS_DIR          where the JSON goes [$BUILD/bench-results]
#
# Only 127.0.0.1 is ever contacted; the nodes are stopped by PID on exit.
# shellcheck source-path=SCRIPTDIR source=lib.sh
set -euo pipefail

BENCH_NAME=hostpool_bench
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
SIZES=${SIZES:-256k}
BATCH=${BATCH:-128}
REP_MB=${REP_MB:-128}
ITER=${ITER:-200}
TTFT_PAGES=${TTFT_PAGES:-16}
NODE_THREADS=${NODE_THREADS:-2}

need_count RUNS "$RUNS"
need_count BATCH "$BATCH"
need_count REP_MB "$REP_MB"
need_count ITER "$ITER"
need_count TTFT_PAGES "$TTFT_PAGES"
need_count NODE_THREADS "$NODE_THREADS"
need_torch

if [[ ! -x $BUILD/server/peercached || ! -e $BUILD/client/libpeercache.so.0 ]]; then
	bench_build "peercached or libpeercache missing"
fi

export PEERCACHE_BUILD_DIR=$BUILD SIZES RUNS BATCH REP_MB ITER TTFT_PAGES NODE_THREADS RESULTS_DIR
exec "$PY" "$REPO/bench/hostpool_bench.py"
