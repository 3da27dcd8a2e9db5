#!/usr/bin/env bash
# bench/republish_bench.sh — incremental re-publication after a membership
# change (issue 13, item 4): N nodes, K pages written by the producers, then
# one node joins (N -> N+1) and leaves again (N+1 -> N) through
# cluster.set_peers; per change, the records re-published (summed from the
# nodes' metrics) against the consistent-hashing ideal K·R/(N+1), the stale
# records left on displaced owners, and the time until a reader's sweep of
# all K keys hits 100 % again. What it measures and how:
# bench/republish_bench.py (its docstring). This wrapper checks the knobs,
# builds what is missing and runs it with Debian's Python.
#
# Environment (defaults in brackets):
#   PEERCACHE_BUILD_DIR  build tree [<repo>/build]; built with cmake only if
#                        peercached is missing
#   NODES                nodes before the join [4]
#   KEYS                 pages written (K) [20000]
#   PAGE                 bytes per page [4096]
#   REPLICAS             directory_replicas (R) of every node [2]
#   RUNS                 rounds, each on fresh nodes [3]
#   POOL                 pool_size of every node [128mb]
#   CHANGE_TIMEOUT       seconds a change may take to converge [120]
#   RESULTS_DIR          where the JSON goes [$BUILD/bench-results]
#
# Only 127.0.0.1 is ever contacted; the nodes are stopped by PID when each
# round ends.
# shellcheck source-path=SCRIPTDIR source=lib.sh
set -euo pipefail

BENCH_NAME=republish_bench
RUNS=${RUNS:-3} # before lib.sh, whose default is 5
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
NODES=${NODES:-4}
KEYS=${KEYS:-20000}
PAGE=${PAGE:-4096}
REPLICAS=${REPLICAS:-2}
POOL=${POOL:-128mb}
CHANGE_TIMEOUT=${CHANGE_TIMEOUT:-120}

need_count NODES "$NODES"
need_count KEYS "$KEYS"
need_count PAGE "$PAGE"
need_count REPLICAS "$REPLICAS"
need_count RUNS "$RUNS"
need_seconds CHANGE_TIMEOUT
need_python
"$PY" -c 'import msgpack' 2>/dev/null ||
	die "msgpack is missing for $PY (Debian package python3-msgpack; scripts/deps.sh test installs it)"

[[ -x $BUILD/server/peercached ]] || bench_build "peercached missing"

export PEERCACHE_BUILD_DIR=$BUILD NODES KEYS PAGE REPLICAS RUNS POOL CHANGE_TIMEOUT RESULTS_DIR
exec "$PY" "$REPO/bench/republish_bench.py"
