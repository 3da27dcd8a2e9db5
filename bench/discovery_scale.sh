#!/usr/bin/env bash
# bench/discovery_scale.sh — embedded discovery with N real nodes on
# loopback (issue 13, item 7): per N (3, 10, 30, 100 by default), the time
# until every node follows one membership after the start, after a kill -9
# and after a join; membership bytes/s per node by role (head, masters,
# members); directory bytes per record; ring load max/mean. What it measures
# and how: bench/discovery_scale.py (its docstring). This wrapper checks the
# knobs and the machine (open files, memory), builds what is missing and runs
# it with Debian's Python. Not in CI (100 nodes); CI runs
# tests/proc/test_discovery_scale.py (10 nodes).
#
# Environment (defaults in brackets):
#   PEERCACHE_BUILD_DIR  build tree [<repo>/build]; built with cmake only if
#                        peercached is missing
#   SIZES                node counts, one round set each ["3 10 30 100"]
#   RUNS                 rounds per size, each on fresh nodes [3]
#   RUNS_LARGE           rounds for sizes >= 50 [1]
#   POOL                 pool_size of every node [16mb] (no prefault)
#   KEYS                 values written for the directory and ring figures [20000]
#   VALUE                bytes per value [512]
#   KEYS_PER_NODE        at most this many keys per node (no eviction) [2000]
#   STAGGER_MS           pause between two node starts [50]
#   RATE_S               seconds of membership traffic measured [10]
#   CONVERGE_TIMEOUT     seconds a convergence may take [180]
#   RESULTS_DIR          where the JSON goes [$BUILD/bench-results]
#
# Only 127.0.0.1 is ever contacted; every node is stopped by PID when its
# round ends. Each node runs one reactor thread (plus its discovery thread):
# 100 nodes take ~600 MiB and a fraction of one core when idle.
# shellcheck source-path=SCRIPTDIR source=lib.sh
set -euo pipefail

BENCH_NAME=discovery_scale
RUNS=${RUNS:-3} # before lib.sh, whose default is 5
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
SIZES=${SIZES:-3 10 30 100}
RUNS_LARGE=${RUNS_LARGE:-1}
POOL=${POOL:-16mb}
KEYS=${KEYS:-20000}
VALUE=${VALUE:-512}
KEYS_PER_NODE=${KEYS_PER_NODE:-2000}
STAGGER_MS=${STAGGER_MS:-50}
RATE_S=${RATE_S:-10}
CONVERGE_TIMEOUT=${CONVERGE_TIMEOUT:-180}

need_counts SIZES
need_count RUNS "$RUNS"
need_count RUNS_LARGE "$RUNS_LARGE"
need_count KEYS "$KEYS"
need_count VALUE "$VALUE"
need_count KEYS_PER_NODE "$KEYS_PER_NODE"
need_seconds STAGGER_MS RATE_S CONVERGE_TIMEOUT
need_python
"$PY" -c 'import msgpack' 2>/dev/null ||
	die "msgpack is missing for $PY (Debian package python3-msgpack; scripts/deps.sh test installs it)"

max=0
for n in $SIZES; do ((10#$n > max)) && max=$((10#$n)); done
nofile=$(ulimit -n)
if [[ $nofile != unlimited ]] && ((nofile < 4 * max + 64)); then
	ulimit -n $((4 * max + 64)) 2>/dev/null ||
		die "ulimit -n is $nofile, too low for $max nodes (raise it to $((4 * max + 64)))"
fi

[[ -x $BUILD/server/peercached ]] || bench_build "peercached missing"

export PEERCACHE_BUILD_DIR=$BUILD SIZES RUNS RUNS_LARGE POOL KEYS VALUE KEYS_PER_NODE STAGGER_MS RATE_S CONVERGE_TIMEOUT RESULTS_DIR
exec "$PY" "$REPO/bench/discovery_scale.py"
