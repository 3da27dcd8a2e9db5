#!/usr/bin/env bash
# bench/pcb_loopback.sh — peercache-bench on a 3-node loopback cluster, with
# redis and memcached driven in the same runs: the figures bench/README.md
# quotes for peercache-bench ("peercache-bench").
#
# Three peercached nodes name each other in --peers; `peercache-bench serve`
# publishes the working set through node 0; for each of RUNS rounds and each
# op of OPS, `peercache-bench drive` runs on node 1 or node 2 (alternating
# by round) over the session API with --vs redis and --vs memcached, so the
# three targets see the same ops, sizes and sweep one after the other. Each
# drive writes its four reports (console, JSON, Markdown, HTML) under
# $RESULTS_DIR/pcb-<timestamp>/; the summary (stdout, Markdown) gives per
# op, target and concurrency the median (min-max) of pages/s, GB/s and
# batch p99 over the rounds, and the paired ratios peercache/redis and
# peercache/memcached (round i over round i), min/median/max. Progress on
# stderr.
#
# Environment (defaults in brackets):
#   PEERCACHE_BUILD_DIR  build tree [<repo>/build]; built if a binary is missing
#   OPS                  ops to drive ["get exists set"]
#   CONC                 concurrencies [1,2,4,8]
#   RUNS                 rounds [3]
#   DURATION, WARMUP     measured and unmeasured seconds per level [3, 1]
#   PAGE_BYTES           page size, suffix k or m [256k]
#   PAGES                working set pages [512]
#   BATCH                pages per call [16]
#   POOL                 each node's --pool-size [1gb]
#   NODE_THREADS         peercached --threads [2]
#   VS                   baselines ["redis memcached"]; "" for none
#   PIN                  1: servers on CPU 1, clients on CPU 0 [0]
#   RESULTS_DIR          [$BUILD/bench-results]
#   PEERCACHED, PEERCACHE_BENCH  binaries to use instead of the build's
#
# Only 127.0.0.1 is ever contacted; every server is stopped by PID on exit.
set -euo pipefail

BENCH_NAME=pcb_loopback
RUNS=${RUNS:-3}
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
OPS=${OPS:-"get exists set"}
CONC=${CONC:-1,2,4,8}
PAGE_BYTES=${PAGE_BYTES:-256k}
PAGES=${PAGES:-512}
BATCH=${BATCH:-16}
POOL=${POOL:-1gb}
NODE_THREADS=${NODE_THREADS:-2}
VS=${VS-"redis memcached"}
NODE_BIN=${PEERCACHED:-$BUILD/server/peercached}
TOOL=${PEERCACHE_BENCH:-$BUILD/bench/tool/peercache-bench}

need_count RUNS "$RUNS"
for v in PAGES BATCH NODE_THREADS; do need_count "$v" "${!v}"; done
need_seconds DURATION WARMUP
[[ $CONC =~ ^[0-9]+(,[0-9]+)*$ ]] || die "CONC is a list like 1,2,4,8, got '$CONC'"
for op in $OPS; do
	[[ $op == get || $op == exists || $op == set || $op == mixed ]] ||
		die "OPS takes get, exists, set and mixed, got '$op'"
done
PAGE=$(size_bytes "$PAGE_BYTES" 64 $((64 << 20)))
for v in $VS; do
	[[ $v == redis || $v == memcached ]] || die "VS takes redis and memcached, got '$v'"
done
need_python

[[ " $VS " == *" redis "* ]] && bench_need_redis
[[ " $VS " == *" memcached "* ]] && bench_need_memcached
if [[ ! -x $NODE_BIN || ! -x $TOOL ]]; then
	bench_build "peercached or peercache-bench missing"
fi
[[ -x $NODE_BIN ]] || die "$NODE_BIN not found after building"
[[ -x $TOOL ]] || die "$TOOL not found after building"
bench_pin
bench_workdir
OUT=$RESULTS_DIR/pcb-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"

# ------------------------------------------------------------- servers ----

node_ready() { grep -qE '\] node [^ ]+ ready \(' "$1"; }

# cluster_up: three nodes on free ports naming each other (retried when a
# port was taken meanwhile); SOCK[0..2].
SOCK=()
cluster_up() {
	local attempt i ports peers pids
	for attempt in 1 2 3; do
		ports=("$(free_port)" "$(free_port)" "$(free_port)")
		peers="$HOST:${ports[0]},$HOST:${ports[1]},$HOST:${ports[2]}"
		pids=()
		for i in 0 1 2; do
			SOCK[i]=$WORK/node$i.sock
			SERVER_NAME="peercached $i"
			server_start "$WORK/node$i.out" "$WORK/node$i.err" \
				"${SERVER_CPU[@]}" "$NODE_BIN" --bind "$HOST" \
				--rpc-port "${ports[i]}" --peers "$peers" --data-port 0 \
				--meta-port 0 --metrics-port 0 --socket "${SOCK[i]}" \
				--threads "$NODE_THREADS" --pool-size "$POOL" --log-level info
			pids+=("$SERVER_PID")
		done
		local ok=1
		for i in 0 1 2; do
			poll_until "${pids[i]}" 150 node_ready "$WORK/node$i.err" || ok=0
		done
		((ok)) && { log "3 nodes up: $peers"; return 0; }
		if ! grep -q 'Address already in use' "$WORK"/node?.err; then
			server_log_tail "$WORK"/node?.err
			die "the nodes did not get ready"
		fi
		for i in 0 1 2; do server_stop "${pids[i]}"; done
		log "a port was taken (attempt $attempt); again"
	done
	die "could not start 3 nodes"
}

cluster_up
VS_ARGS=()
if [[ " $VS " == *" redis "* ]]; then
	# Bounded like the others: set runs write fresh keys.
	redis_start --maxmemory 2gb --maxmemory-policy allkeys-lru
	VS_ARGS+=(--vs "redis=$HOST:$REDIS_PORT")
	log "redis-server pid $REDIS_PID on $HOST:$REDIS_PORT (maxmemory 2gb, allkeys-lru)"
fi
if [[ " $VS " == *" memcached "* ]]; then
	memcached_start -m 2048 -t 2 -I "$(((PAGE >> 20) + 2))m"
	VS_ARGS+=(--vs "memcached=$HOST:$MEMCACHED_PORT")
	log "memcached pid $MEMCACHED_PID on $HOST:$MEMCACHED_PORT (-m 2048 -t 2)"
fi

SERVER_NAME="peercache-bench serve"
server_start "$WORK/serve.out" "$WORK/serve.err" "${CLIENT_CPU[@]}" "$TOOL" serve \
	--node "${SOCK[0]}" --page-bytes "$PAGE" --pages "$PAGES" --batch "$BATCH"
SERVE_PID=$SERVER_PID
serve_ready() { grep -q '^ready ' "$WORK/serve.out"; }
poll_until "$SERVE_PID" 600 serve_ready || {
	server_log_tail "$WORK/serve.err"
	die "serve did not get ready"
}
log "$(cat "$WORK/serve.out")"

# ---------------------------------------------------------------- runs ----

runs_start
for ((run = 1; run <= RUNS; run++)); do
	for op in $OPS; do
		sock=${SOCK[1 + (run % 2)]}
		log "round $run/$RUNS: $op on $(basename "$sock")"
		if ! "${CLIENT_CPU[@]}" "$TOOL" drive --node "$sock" --op "$op" \
			--batch "$BATCH" --concurrencies "$CONC" --duration "${DURATION}s" \
			--warmup "${WARMUP}s" "${VS_ARGS[@]}" --report "$OUT/$op-run$run" \
			>"$OUT/$op-run$run.txt"; then
			server_log_tail "$WORK"/node?.err
			die "drive $op (round $run) failed; its output: $OUT/$op-run$run.txt"
		fi
	done
done
runs_end

# ------------------------------------------------------------- summary ----

PCB_OUT=$OUT PCB_RUNS=$RUNS PCB_OPS=$OPS LOADAVG_START=$LOADAVG_START \
	LOADAVG_END=$LOADAVG_END "$PY" - <<'PYEOF'
import glob, json, os, statistics

out, runs, ops = os.environ["PCB_OUT"], int(os.environ["PCB_RUNS"]), os.environ["PCB_OPS"].split()

def spread(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    med = statistics.median(xs)
    return "%.3g (%.3g-%.3g)" % (med, min(xs), max(xs)) if len(xs) > 1 else "%.3g" % med

summary, first = {"runs": runs, "rows": []}, None
for op in ops:
    reps = [json.load(open(os.path.join(out, "%s-run%d.json" % (op, r)))) for r in range(1, runs + 1)]
    first = first or reps[0]
    targets = []
    for row in reps[0]["rows"]:
        if row["target"] not in targets:
            targets.append(row["target"])
    concs = sorted({row["concurrency"] for row in reps[0]["rows"]})
    def get(rep, t, c):
        return next((x for x in rep["rows"] if x["target"] == t and x["concurrency"] == c), None)
    print("\n### %s (page %d bytes, batch %d, %d rounds)\n" % (
        op, reps[0]["rows"][0]["page_bytes"], reps[0]["rows"][0]["batch"], runs))
    head = "| target | conc | pages/s | GB/s | batch p99 us | hit % |"
    base = [t for t in targets if t != "peercache"]
    for b in base:
        head += " peercache/%s pages/s |" % b
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for t in targets:
        for c in concs:
            rows = [get(r, t, c) for r in reps]
            line = "| %s | %d | %s | %s | %s | %s |" % (
                t, c, spread([x and x["pages_s"] for x in rows]),
                spread([x and x["gbps"] for x in rows]),
                spread([x and x["batch_lat"]["p99_us"] for x in rows]),
                spread([x and x["hit_rate"] * 100 for x in rows]))
            entry = {"op": op, "target": t, "concurrency": c,
                     "pages_s": [x and x["pages_s"] for x in rows],
                     "gbps": [x and x["gbps"] for x in rows],
                     "p99_us": [x and x["batch_lat"]["p99_us"] for x in rows]}
            for b in base:
                if t != "peercache":
                    line += " |"
                    continue
                ratios = []
                for r in reps:
                    mine, theirs = get(r, t, c), get(r, b, c)
                    if mine and theirs and theirs["pages_s"] > 0:
                        ratios.append(mine["pages_s"] / theirs["pages_s"])
                entry["ratio_vs_" + b] = ratios
                line += " %s |" % spread(ratios)
            summary["rows"].append(entry)
            print(line)
summary["host"] = first["host"] if first else {}
summary["version"] = first["version"] if first else ""
summary["loadavg"] = [os.environ.get("LOADAVG_START"), os.environ.get("LOADAVG_END")]
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
print("\nload average before/after: %s / %s" % tuple(summary["loadavg"]))
print("reports: %s" % out)
PYEOF
