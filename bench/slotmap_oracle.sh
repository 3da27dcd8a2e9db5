#!/usr/bin/env bash
# bench/slotmap_oracle.sh — the slotmap content-oracle hammer for >= 10^7
# checked reads (issue 15, item 5), outside CI: writers on two nodes and
# readers on three hammer keys that share one 4-way bucket per owner, and
# every page is checked; prints reads, hits, misses, rejected snapshots and
# wrong pages (must be 0). NOCHECK=1 runs the negative control instead.
# See bench/slotmap_oracle.py for the knobs (READS, PAGE_KB, ...).
set -euo pipefail
BENCH_NAME=slotmap_oracle
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_python
"$REPO/scripts/build.sh" "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >&2
export PEERCACHE_BUILD_DIR=$BUILD
exec "$PY" "$REPO/bench/slotmap_oracle.py"
