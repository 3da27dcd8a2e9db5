#!/usr/bin/env bash
# bench/disk_bench.sh — the disk tier against fio on the same file system,
# in the same run: write-through and promotion GB/s vs fio's sequential
# write and read (io_uring, O_DIRECT, the page size as block size, the
# tier's own queue depth), and set p50/p99 with the tier on vs off. What it
# measures and how: bench/disk_bench.py (its docstring). This wrapper checks
# the knobs, installs fio if missing (as root), builds what is missing and
# runs it with Debian's Python.
#
# Environment (defaults in brackets):
#   PEERCACHE_BUILD_DIR  build tree [<repo>/build]; built with cmake only if
#                        peercached or libpeercache is missing
#   DISK_PATH            directory for fio's file and the store; its file
#                        system must take O_DIRECT [a new one under /var/tmp]
#   RUNS                 rounds, each with every figure [3]
#   PAGE                 page size = fio's block size, bytes [262144]
#   VOLUME               bytes written (and read) per phase [1gb]
#   THREADS              peercached --threads [2]
#   CLIENTS              local clients setting pages [2]
#   SET_BATCH            pages per set [16]
#   PROMOTE_WINDOW       pages per kv.exists while promoting [32]
#   PROMOTE_DEPTH        pages asked and not yet seen promoted, at most [512]
#   PROMOTE_SCRAPE_MS    metrics scrape gap while promoting, ms [10]
#   LAT_SETS             one-page sets per latency measurement [5000]
#   LAT_POOL             pool of the latency nodes [256mb]
#   LAT_FIO              1: one more latency run, tier off with fio writing
#                        beside it as many bytes/s as the tier wrote in the
#                        tier-on run (what the disk's own work costs) [0]
#   NODE_ARGS            more peercached options for every node []
#   RESULTS_DIR          where the JSON goes [$BUILD/bench-results]
#
# Only 127.0.0.1 and Unix sockets in temporary directories are used; the
# nodes are stopped by PID on exit.
# shellcheck source-path=SCRIPTDIR source=lib.sh
set -euo pipefail

BENCH_NAME=disk_bench
RUNS=${RUNS:-3}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PAGE=${PAGE:-262144}
VOLUME=${VOLUME:-1gb}
THREADS=${THREADS:-2}
CLIENTS=${CLIENTS:-2}
SET_BATCH=${SET_BATCH:-16}
PROMOTE_WINDOW=${PROMOTE_WINDOW:-32}
PROMOTE_DEPTH=${PROMOTE_DEPTH:-512}
PROMOTE_SCRAPE_MS=${PROMOTE_SCRAPE_MS:-10}
LAT_SETS=${LAT_SETS:-5000}
LAT_POOL=${LAT_POOL:-256mb}
LAT_FIO=${LAT_FIO:-0}
NODE_ARGS=${NODE_ARGS:-}
DISK_PATH=${DISK_PATH:-}

need_count RUNS "$RUNS"
need_count PAGE "$PAGE"
((PAGE % 4096 == 0)) || die "PAGE must be a multiple of 4096 (O_DIRECT), got $PAGE"
need_count THREADS "$THREADS"
need_count CLIENTS "$CLIENTS"
need_count SET_BATCH "$SET_BATCH"
need_count PROMOTE_WINDOW "$PROMOTE_WINDOW"
need_count PROMOTE_DEPTH "$PROMOTE_DEPTH"
need_count PROMOTE_SCRAPE_MS "$PROMOTE_SCRAPE_MS"
((PROMOTE_DEPTH >= PROMOTE_WINDOW)) || die "PROMOTE_DEPTH must be at least PROMOTE_WINDOW"
need_count LAT_SETS "$LAT_SETS"
[[ $LAT_FIO == 0 || $LAT_FIO == 1 ]] || die "LAT_FIO must be 0 or 1, got $LAT_FIO"
need_python
if ! command -v fio >/dev/null; then
	log "installing fio"
	((EUID == 0)) || die "need root to install fio (Debian package fio; scripts/deps.sh bench)"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends fio >&2
fi
if [[ ! -x $BUILD/server/peercached || ! -e $BUILD/client/libpeercache.so.0 ]]; then
	bench_build "peercached or libpeercache missing"
fi

export PEERCACHE_BUILD_DIR=$BUILD RUNS PAGE VOLUME THREADS CLIENTS SET_BATCH \
	PROMOTE_WINDOW PROMOTE_DEPTH PROMOTE_SCRAPE_MS LAT_SETS LAT_POOL LAT_FIO NODE_ARGS DISK_PATH RESULTS_DIR
exec "$PY" "$REPO/bench/disk_bench.py"
