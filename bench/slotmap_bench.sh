#!/usr/bin/env bash
# bench/slotmap_bench.sh — slotmap against p2p on the get path (issue 15,
# item 7): get latency at batch 1 (p50, p99) and throughput at batch 32,
# for each page size, on two paths a reader node serves:
#   session  session.get of known-size pages into a local client's memfd
#            region (the SGLang shim's batch_get_v1; bench/slotmap_session.py)
#   kvget    kv.get over TCP (pc-p2p-bench --target kvget, the p2p bench's
#            load generator), the pages in the reply.
#
# Two clusters run side by side, one per mode, each of two nodes on
# loopback: an owner A and a reader B. The working set is stored through A
# (kv.set, pc-p2p-bench --setup-only). The client asks B for the pages, and
# B gets each the way its mode does:
#   p2p      a dir.get to the key's directory owner (A or B itself, half
#            each on two nodes), then a READ of A's pool on the data port;
#   slotmap  session.get: one READ of the key's bucket in its owner's slot
#            region (slot_max_page_bytes = the page size, SLOT_WAYS ways);
#            kv.get, which does not know the length: slot.probe to the
#            owner first, then that READ (docs/slotmap.md "The paths").
#            Only keys that A owns are read (--held-by A: slot.probe), so
#            every get is a remote one, as every p2p get is.
# For each size, RUNS rounds of (batch 1 latency, batch 32 throughput) on
# both modes, the order of the modes swapping every round so that machine
# noise hits both alike. Prints markdown tables (min / median / max over the
# runs, and the paired ratios slotmap/p2p: run i over run i) on stdout and
# writes every run to $BUILD/bench-results/slotmap-<timestamp>.json.
# Progress on stderr. Both modes' nodes allow kv.get replies of a whole
# batch of 4 MiB pages (the limits of docs/protocol.md raised alike).
#
# Environment (defaults in brackets):
#   PEERCACHE_BUILD_DIR  build tree [<repo>/build]; built if peercached or
#                        pc-p2p-bench is missing
#   SIZES                page sizes, suffix k or m ["256k 4m"]
#   RUNS                 rounds per size [5]
#   DURATION             measured seconds per run [3]
#   WARMUP               unmeasured seconds before each run [1]
#   BATCH                keys per batch for the throughput runs [32]
#   THREADS              reader threads of the throughput runs [1]
#   WORKSET_MB           working set per size: keys = max(128, WORKSET_MB /
#                        size) [512]
#   NODE_THREADS         peercached --threads [2]
#   SLOT_WAYS            slotmap: slot_ways (one READ is this many slots) [4]
#   PATHS                the paths measured ["session kvget"]
#   PIN                  1: servers on CPU 1, clients on CPU 0 [0]
#   RESULTS_DIR          where the JSON goes [$BUILD/bench-results]
#
# Only 127.0.0.1 is contacted; the nodes are stopped by PID after each size
# and on exit (bench/lib.sh). Do not run it while others measure or build:
# the machine has two cores.
set -euo pipefail

BENCH_NAME=slotmap_bench
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
SIZES=${SIZES:-"256k 4m"}
BATCH=${BATCH:-32}
THREADS=${THREADS:-1}
WORKSET_MB=${WORKSET_MB:-512}
NODE_THREADS=${NODE_THREADS:-2}
SLOT_WAYS=${SLOT_WAYS:-4}
PATHS=${PATHS:-"session kvget"}
NODE_BIN=${PEERCACHED:-$BUILD/server/peercached}
P2P_BIN=${PC_P2P_BENCH:-$BUILD/bench/pc-p2p-bench}
MODES=(p2p slotmap)
CONNS=$THREADS  # what bench_python records as the connection counts

need_count RUNS "$RUNS"
for v in BATCH THREADS WORKSET_MB NODE_THREADS SLOT_WAYS; do need_count "$v" "${!v}"; done
need_seconds DURATION WARMUP
[[ -n ${SIZES// /} ]] || die "SIZES is empty"
SIZE_BYTES=()
for s in $SIZES; do SIZE_BYTES+=("$(size_bytes "$s" 4096 $((64 << 20)))"); done
for p in $PATHS; do [[ $p == session || $p == kvget ]] || die "PATHS: '$p' is not session or kvget"; done
[[ -n ${PATHS// /} ]] || die "PATHS is empty"
need_python
if [[ ! -x $P2P_BIN || ! -x $NODE_BIN ]]; then
	bench_build "pc-p2p-bench or peercached missing"
fi
"$P2P_BIN" --help | grep -q kvget || die "$P2P_BIN has no kvget target: rebuild it"
bench_pin
bench_workdir

# ------------------------------------------------------------- servers ----

# cluster_up MODE SIZE KEYS: an owner and a reader node of MODE for KEYS
# pages of SIZE bytes; sets OWNER_<MODE> and READER_<MODE> (RPC ports) and
# PIDS_<MODE>.
cluster_up() {
	local mode=$1 size=$2 keys=$3 pool i port pa pb
	local -a extra=()
	pa=$(free_port)
	pb=$(free_port)
	while [[ $pb == "$pa" ]]; do pb=$(free_port); done
	if [[ $mode == slotmap ]]; then
		# About 4 slots per key of the whole set: some buckets
		# overflow anyway (keys land at random); those keys are left
		# out by --held-by.
		pool=$(((keys * (size + 4096) * 4 >> 20) + 64))
		extra=(--mode slotmap --slot-max-page-bytes "$size" --slot-ways "$SLOT_WAYS")
	else
		pool=$(((keys * (size + 4096) * 3 >> 20) + 256))
	fi
	local -a pids=()
	for i in 0 1; do
		port=$pa
		((i)) && port=$pb
		SERVER_NAME="peercached $mode $i"
		server_start "$WORK/$mode$i.out" "$WORK/$mode$i.err" \
			"${SERVER_CPU[@]}" "$NODE_BIN" --bind "$HOST" --rpc-port "$port" \
			--peers "$HOST:$pa,$HOST:$pb" --data-port 0 --meta-port 0 \
			--metrics-port 0 --socket "$WORK/$mode$i.sock" --threads "$NODE_THREADS" \
			--pool-size "${pool}mb" --pool-prefault false --log-level info \
			--rpc-max-message-bytes 512mb --conn-out-max 1gb \
			--rpc-max-reply-bytes 4gb --kv-staging-max 2gb "${extra[@]}"
		pids+=("$SERVER_PID")
		rpc_port_wait "peercached $mode $i" "$WORK/$mode$i.out" "$WORK/$mode$i.err"
	done
	printf -v "OWNER_$mode" %s "$pa"
	printf -v "READER_$mode" %s "$pb"
	printf -v "PIDS_$mode" %s "${pids[*]}"
	log "$mode: owner 127.0.0.1:$pa, reader 127.0.0.1:$pb, pool $pool MiB"
}

cluster_down() {
	local -n started=PIDS_$1
	local p
	for p in $started; do
		kill -0 "$p" 2>/dev/null || { server_log_tail "$WORK/$1"*.err; die "a $1 node died during the runs"; }
		server_stop "$p"
	done
}

# ---------------------------------------------------------------- runs ----

# bench_run LABEL OUT CMD...: one run of CMD (pc-p2p-bench --json or
# slotmap_session.py), its JSON into OUT. A failed setup stops the bench; a failed measured run (a miss, a
# timeout: the mode could not serve that load) is recorded in OUT as
# {"failed": message} and shown in the tables, so one mode's failure does
# not hide the rest.
bench_run() {
	local label=$1 out=$2
	local err=${out%.json}.err
	shift 2
	if ! "${CLIENT_CPU[@]}" "$@" >"$out" 2>"$err"; then
		cat "$err" >&2
		[[ $label == setup* ]] && { server_log_tail "$WORK"/*.err; die "$label failed"; }
		log "$label FAILED; recorded, going on"
		FAILED_MSG=$(tail -n 1 "$err") "$PY" -c 'import json, os; print(json.dumps({"failed": os.environ["FAILED_MSG"]}))' >"$out"
	fi
}

# read_cmd MODE PATH: the client that reads MODE's pages through its
# reader on PATH, and which keys.
read_cmd() {
	local -n reader=READER_$1 owner=OWNER_$1
	if [[ $2 == kvget ]]; then
		echo "$P2P_BIN --host $HOST --json --target kvget --port $reader --no-setup --timeout 20"
	else
		echo "$PY $REPO/bench/slotmap_session.py --socket $WORK/${1}1.sock"
	fi
	[[ $1 == slotmap ]] && echo "--held-by $owner"
	return 0
}

n_runs=$((${#SIZE_BYTES[@]} * RUNS * 2 * ${#MODES[@]} * $(wc -w <<<"$PATHS")))
log "$n_runs runs of $DURATION s (+ $WARMUP s warm-up), plus setup: about $(awk -v n="$n_runs" -v d="$DURATION" -v w="$WARMUP" 'BEGIN { printf "%d", n * (d + w + 0.5) / 60 + 1 }') min"

runs_start
KEYS_OF=()
for n in "${SIZE_BYTES[@]}"; do
	keys=$((WORKSET_MB * 1048576 / n))
	((keys < 128)) && keys=128
	((keys < 4 * BATCH)) && keys=$((4 * BATCH))
	KEYS_OF+=("$keys")
	log "page size $n B: $keys keys, fresh clusters"
	common=(--value-bytes "$n" --keys "$keys")
	for m in "${MODES[@]}"; do
		cluster_up "$m" "$n" "$keys"
		owner=OWNER_$m
		bench_run "setup $m" "$RUNDIR/setup-$m-s$n.json" "$P2P_BIN" --host "$HOST" \
			--json --target kvget --port "${!owner}" --setup-only "${common[@]}"
	done
	for ((run = 1; run <= RUNS; run++)); do
		for ((k = 0; k < ${#MODES[@]}; k++)); do
			m=${MODES[(k + run - 1) % ${#MODES[@]}]}
			for path in $PATHS; do
				for shape in lat thr; do
					args=(--batch 1)
					[[ $shape == thr ]] && args=(--batch "$BATCH")
					[[ $path == kvget ]] && args+=(--threads "$THREADS")
					out=$RUNDIR/$m-s$n-$path-$shape-r$run.json
					# shellcheck disable=SC2046  # read_cmd is words on purpose
					bench_run "$m $path $shape, run $run" "$out" $(read_cmd "$m" "$path") \
						"${common[@]}" "${args[@]}" --duration "$DURATION" \
						--warmup "$WARMUP"
					grep -q '"failed"' "$out" ||
						log "  size $n run $run $m $path $shape: $(json_num "$out" gb_per_s) GB/s, p50 $(json_num "$out" p50_us) us, p99 $(json_num "$out" p99_us) us"
				done
			done
		done
	done
	for m in "${MODES[@]}"; do cluster_down "$m"; done
done
runs_end

# ------------------------------------------------------------- summary ----

results_prepare slotmap
SB_SIZES="${SIZE_BYTES[*]}" SB_KEYS="${KEYS_OF[*]}" SB_BATCH=$BATCH SB_THREADS=$THREADS \
SB_NODE_THREADS=$NODE_THREADS SB_WORKSET_MB=$WORKSET_MB SB_WAYS=$SLOT_WAYS SB_PATHS=$PATHS \
	bench_python <<'PYEOF'
sizes = [int(x) for x in env["SB_SIZES"].split()]
keys_of = dict(zip(sizes, (int(x) for x in env["SB_KEYS"].split())))
paths = env["SB_PATHS"].split()
MODES = ("p2p", "slotmap")
SHAPES = ("lat", "thr")
WHAT = {"session": "session.get (the shim's path, known sizes) through a reader node",
        "kvget": "kv.get (unknown sizes) through a reader node"}
summary, raw = [], []

def size_name(n):
    return f"{n >> 20}m" if n % (1 << 20) == 0 else f"{n >> 10}k"

def sp(rs, k):
    """min/median/max of field k over the runs that did not fail."""
    vals = [x[k] for x in rs if "failed" not in x]
    return spread(vals) if vals else None

def pair(a, b, k):
    """Run i over run i, both measured."""
    vals = [x[k] / y[k] for x, y in zip(a, b) if "failed" not in x and "failed" not in y]
    return spread(vals) if vals else None

for path in paths:
    for n in sizes:
        rs = {m: {sh: [run_json(f"{m}-s{n}-{path}-{sh}-r{r}.json") for r in range(1, runs + 1)]
                  for sh in SHAPES} for m in MODES}
        raw.append({"path": path, "value_bytes": n, **rs})
        s = {"path": path, "value_bytes": n, "keys": keys_of[n]}
        for m in MODES:
            s[m] = {"p50_us": sp(rs[m]["lat"], "p50_us"), "p99_us": sp(rs[m]["lat"], "p99_us"),
                    "gb_per_s": sp(rs[m]["thr"], "gb_per_s"),
                    "batch_p50_us": sp(rs[m]["thr"], "p50_us"),
                    "failed": {sh: [x["failed"] for x in rs[m][sh] if "failed" in x]
                               for sh in SHAPES}}
        s["ratio"] = {"p50": pair(rs["slotmap"]["lat"], rs["p2p"]["lat"], "p50_us"),
                      "p99": pair(rs["slotmap"]["lat"], rs["p2p"]["lat"], "p99_us"),
                      "gb_per_s": pair(rs["slotmap"]["thr"], rs["p2p"]["thr"], "gb_per_s")}
        summary.append(s)

goals = [{"goal": "slotmap p50 <= 0.6 x p2p p50 at batch 1", "path": s["path"],
          "value_bytes": s["value_bytes"], "ratio": s["ratio"]["p50"],
          "met": s["ratio"]["p50"] is not None and s["ratio"]["p50"]["median"] <= 0.6}
         for s in summary]
write_json({**doc_head("slotmap"),
            "params": {**params_head(), "sizes": sizes, "paths": paths,
                       "keys": {str(k): v for k, v in keys_of.items()},
                       "batch": int(env["SB_BATCH"]), "threads": int(env["SB_THREADS"]),
                       "node_threads": int(env["SB_NODE_THREADS"]),
                       "workset_mb": int(env["SB_WORKSET_MB"]),
                       "slot_ways": int(env["SB_WAYS"]),
                       "setup": "two nodes per mode: pages stored through the owner, "
                                "read through the reader"},
            "summary": summary, "goals": goals, "runs": raw})

def mmm(x, f=f1): return "n/a" if x is None else f"{f(x['min'])} / {f(x['median'])} / {f(x['max'])}"
def rn(x): return "n/a" if x is None else rr(x)
def med_of(x): return None if x is None else x["median"]
def g2(x): return f"{x:.2f}"
print(f"### slotmap vs p2p: {runs} interleaved runs of {duration:g} s each "
      f"(min / median / max)")
for path in paths:
    rows = [s for s in summary if s["path"] == path]
    print(f"\n#### {WHAT[path]}\n")
    print("Batch 1, one client: latency per get (us)\n")
    print("| size | p2p p50 | slotmap p50 | slotmap/p2p p50 | p2p p99 | slotmap p99 | slotmap/p2p p99 |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for s in rows:
        print(f"| {size_name(s['value_bytes'])} | {mmm(s['p2p']['p50_us'])} | {mmm(s['slotmap']['p50_us'])} "
              f"| {rn(s['ratio']['p50'])} | {mmm(s['p2p']['p99_us'])} | {mmm(s['slotmap']['p99_us'])} "
              f"| {rn(s['ratio']['p99'])} |")
    clients = env["SB_THREADS"] if path == "kvget" else "1"
    print(f"\nBatch {env['SB_BATCH']}, {clients} client(s): throughput (GB/s of pages)\n")
    print("| size | p2p | slotmap | slotmap/p2p | p2p batch p50 us | slotmap batch p50 us |")
    print("|---:|---:|---:|---:|---:|---:|")
    for s in rows:
        print(f"| {size_name(s['value_bytes'])} | {mmm(s['p2p']['gb_per_s'], g2)} "
              f"| {mmm(s['slotmap']['gb_per_s'], g2)} | {rn(s['ratio']['gb_per_s'])} "
              f"| {f0(med_of(s['p2p']['batch_p50_us']))} | {f0(med_of(s['slotmap']['batch_p50_us']))} |")
fails = [(s["path"], size_name(s["value_bytes"]), m, sh, msg) for s in summary for m in MODES
         for sh, msgs in s[m]["failed"].items() for msg in msgs]
if fails:
    print(f"\nFailed runs ({len(fails)}; left out of the figures above):\n")
    for path, size, m, sh, msg in fails:
        print(f"- {path} {size} {m} {'batch 1' if sh == 'lat' else 'batch ' + env['SB_BATCH']}: {msg}")
print("\nGoal (median paired ratio):\n")
for g in goals:
    print(f"- {g['goal']}, {g['path']}, {size_name(g['value_bytes'])}: {rn(g['ratio'])}: "
          f"{'met' if g['met'] else 'NOT met'}")
print(f"\nnode: --threads {env['SB_NODE_THREADS']}; slotmap: {env['SB_WAYS']} ways, "
      f"slot_max_page_bytes = the page size; load average {loadavg_span()}.")
print(f"Results: {out_path}")
PYEOF
