#!/usr/bin/env bash
# bench/p2p_bench.sh — the p2p read path against memcached, redis and a plain
# socket, with one load generator (pc-p2p-bench) for all of them.
#
# "Two nodes on loopback, one serving, one reading": a peercached node serves;
# pc-p2p-bench is the reading node — it speaks the same wire a node does
# (dir.get over MessagePack-RPC to the key's directory owner, then READs on
# the data port, payloads received straight into its destination buffers).
# For each value size, on fresh servers holding the same working set, and for
# each reader thread count, RUNS rounds of (order rotating every round, so
# machine noise hits every target alike):
#   p2p           dir.get of the batch + one READ per page (batch of 32)
#   p2p_nolookup  the READs alone, records cached (the transport alone)
#   memcached     one multi-get of the 32 keys
#   redis         32 pipelined GETs
#   tcp           32 x value bytes from a plain socket sender (the ceiling)
# then, on a node and a redis holding DIR_KEYS 16-byte values: batched
# directory lookups (dir.get of 128 keys, DIR_PIPELINE calls in flight)
# against redis pipelined GET of the same batches, in keys/s.
# It prints markdown tables on stdout (GB/s, pages/s, batch latency, paired
# ratios with min/median/max, CPU seconds per GB moved of each server and
# of the reader, the issue's goals) and writes every run plus the
# summary to $BUILD/bench-results/p2p-<timestamp>.json. Progress on stderr.
#
# The machine is shared and noisy: trust the medians of paired ratios (run i
# of p2p over run i of the other target), not single absolute figures.
#
# Environment (defaults in brackets):
#   PEERCACHE_BUILD_DIR  build tree [<repo>/build]; built with cmake only if
#                        peercached or pc-p2p-bench is missing
#   SIZES                value sizes, suffix k or m ["64k 256k 1m 4m"]
#   THREADS              reader threads (one connection each) ["1 2 4 8"]
#   RUNS                 rounds per (size, threads) [3]
#   DURATION             measured seconds per run [3]
#   WARMUP               unmeasured seconds before each run [1]
#   BATCH                keys per batch [32]
#   WORKSET_MB           working set per size: keys = max(64, WORKSET_MB / size) [512]
#   NODE_THREADS         peercached --threads [2]
#   NODE_ARGS            more peercached arguments, e.g. "--pool-prefault false" []
#   MEMCACHED_THREADS    memcached -t [2]
#   DIR                  1: also the directory-lookup comparison, 0: skip [1]
#   DIR_THREADS          threads for it ["1 2"]
#   DIR_BATCH            keys per dir.get / per redis batch [128]
#   DIR_PIPELINE         calls (batches) in flight per thread [4]
#   DIR_KEYS             keys the directory and redis hold [65536]
#   PIN                  1: servers on CPU 1, clients on CPU 0 (taskset) [0]
#   RESULTS_DIR          where the JSON goes [$BUILD/bench-results]
#   PEERCACHED, PC_P2P_BENCH  use these binaries instead of the build's
#
# Only 127.0.0.1 is ever contacted. Servers are stopped by PID after each
# size and on exit. Checks, bootstrap, server handling and the summary's
# helpers come from bench/lib.sh.
set -euo pipefail

BENCH_NAME=p2p_bench
RUNS=${RUNS:-3}  # before lib.sh, whose defaults are for the other benches
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
SIZES=${SIZES:-"64k 256k 1m 4m"}
THREADS=${THREADS:-"1 2 4 8"}
BATCH=${BATCH:-32}
WORKSET_MB=${WORKSET_MB:-512}
NODE_THREADS=${NODE_THREADS:-2}
read -r -a NODE_EXTRA <<<"${NODE_ARGS:-}"
MEMCACHED_THREADS=${MEMCACHED_THREADS:-2}
DIR=${DIR:-1}
DIR_THREADS=${DIR_THREADS:-"1 2"}
DIR_BATCH=${DIR_BATCH:-128}
DIR_PIPELINE=${DIR_PIPELINE:-4}
DIR_KEYS=${DIR_KEYS:-65536}
DIR_VALUE_BYTES=16
NODE_BIN=${PEERCACHED:-$BUILD/server/peercached}
P2P_BIN=${PC_P2P_BENCH:-$BUILD/bench/pc-p2p-bench}
TARGETS=(p2p p2p_nolookup memcached redis tcp)
DIR_TARGETS=(dir redis)
CONNS=$THREADS  # what bench_python records as the connection counts

need_count RUNS "$RUNS"
need_counts THREADS
need_counts DIR_THREADS
for v in BATCH WORKSET_MB NODE_THREADS MEMCACHED_THREADS DIR_BATCH DIR_PIPELINE DIR_KEYS; do
	need_count "$v" "${!v}"
done
need_seconds DURATION WARMUP
[[ $DIR == [01] ]] || die "DIR must be 0 or 1, got '$DIR'"
[[ -n ${SIZES// /} ]] || die "SIZES is empty"
SIZE_BYTES=()
for s in $SIZES; do SIZE_BYTES+=("$(size_bytes "$s" 16 $((64 << 20)))"); done
((DIR_KEYS >= DIR_BATCH)) || die "DIR_KEYS must be at least DIR_BATCH"
need_python

# ---------------------------------------------------------------- tools ----

bench_need_redis
bench_need_memcached
if [[ ! -x $P2P_BIN || ! -x $NODE_BIN ]]; then
	bench_build "pc-p2p-bench or peercached missing"
fi
[[ -x $P2P_BIN ]] || die "$P2P_BIN not found after building"
[[ -x $NODE_BIN ]] || die "$NODE_BIN not found after building"
bench_pin
bench_workdir

# ------------------------------------------------------------- servers ----

node_log_tail() { server_log_tail "$WORK/node.err" "$WORK/node.out"; }

# node_up POOL_MB: a fresh serving node with a pool of POOL_MB MiB; NODE_PID,
# NODE_PORT (its RPC port; the data port comes with the records).
node_up() {
	SERVER_NAME=peercached
	server_start "$WORK/node.out" "$WORK/node.err" \
		"${SERVER_CPU[@]}" "$NODE_BIN" --bind "$HOST" --rpc-port 0 --data-port 0 \
		--meta-port 0 --metrics-port 0 --socket "" --threads "$NODE_THREADS" \
		${NODE_EXTRA[@]+"${NODE_EXTRA[@]}"} \
		--pool-size "${1}mb" --log-level info
	NODE_PID=$SERVER_PID
	rpc_port_wait peercached "$WORK/node.out" "$WORK/node.err"
	NODE_PORT=$RPC_PORT
	log "peercached pid $NODE_PID on $HOST:$NODE_PORT (--threads $NODE_THREADS, pool $1 MiB)"
	# The pool is faulted in by a background thread once the node listens
	# (pool_prefault): a core zeroing pages for seconds. Nothing is
	# measured before it is done, or the first rounds of every target pay.
	case " ${NODE_EXTRA[*]-} " in *" --pool-prefault "*) return ;; esac
	local i said over='region faulted in|prefault stopped|prefault: not supported'
	for ((i = 0; i < 1200; i++)); do
		grep -qE "$over" "$WORK/node.out" "$WORK/node.err" && break
		kill -0 "$NODE_PID" 2>/dev/null || { node_log_tail; die "peercached died while its pool was faulted in"; }
		sleep 0.1
	done
	said=$(grep -hoE "($over).*" "$WORK/node.out" "$WORK/node.err" | head -n1)
	log "  ${said:-pool not faulted in after 120 s; measuring anyway}"
}

# tcp_sink_up: pc-p2p-bench --serve-tcp, the plain socket sender; SINK_PORT.
tcp_sink_up() {
	SERVER_NAME="tcp sink"
	server_start "$WORK/sink.out" "$WORK/sink.err" \
		"${SERVER_CPU[@]}" "$P2P_BIN" --serve-tcp --host "$HOST" --port 0
	SINK_PID=$SERVER_PID
	listen_port_wait tcp "the tcp sink" "$WORK/sink.out" "$WORK/sink.err"
	SINK_PORT=$LISTEN_PORT
}

# ---------------------------------------------------------------- runs ----

# client_run OUT ARG...: one pc-p2p-bench --json run with ARG..., its JSON
# into OUT, its stderr into OUT's .err; the client's exit status.
client_run() {
	local out=$1
	shift
	"${CLIENT_CPU[@]}" "$P2P_BIN" --host "$HOST" --json "$@" >"$out" 2>"${out%.json}.err"
}

# p2p_bench LABEL OUT ARG...: client_run; on failure shows the client's
# stderr and the node's log, and stops the bench.
p2p_bench() {
	local label=$1 out=$2
	shift 2
	if ! client_run "$out" "$@"; then
		cat "${out%.json}.err" >&2
		node_log_tail
		die "pc-p2p-bench $label failed"
	fi
}

# baseline_run LABEL OUT ARG...: the same for a baseline (memcached, redis,
# the tcp sink), whose failure is theirs, not the node's: the run is kept
# as {"failed": why} in OUT, the bench goes on (status 1), and the summary
# leaves the pairs with a failed run out (and says how many).
baseline_run() {
	local label=$1 out=$2
	shift 2
	client_run "$out" "$@" && return 0
	local why
	why=$(tail -c 300 "${out%.json}.err")
	log "WARNING: $label failed (a baseline; left out of the ratios): ${why//$'\n'/ }"
	"$PY" -c 'import json, sys; print(json.dumps({"failed": sys.argv[1]}))' "$why" >"$out"
	return 1
}

# target_args TARGET: the arguments that point pc-p2p-bench at TARGET.
target_args() {
	case $1 in
	p2p) echo "--target p2p --port $NODE_PORT --server-pid $NODE_PID" ;;
	p2p_nolookup) echo "--target p2p --port $NODE_PORT --no-lookup --server-pid $NODE_PID" ;;
	memcached) echo "--target memcached --port $MEMCACHED_PORT --server-pid $MEMCACHED_PID" ;;
	redis) echo "--target redis --port $REDIS_PORT --server-pid $REDIS_PID" ;;
	tcp) echo "--target tcp --port $SINK_PORT --server-pid $SINK_PID" ;;
	dir) echo "--target dir --port $NODE_PORT --server-pid $NODE_PID" ;;
	esac
}

# measure NAME TARGETS_VAR THREADS_LIST ARG...: RUNS rounds per thread count,
# the targets of array TARGETS_VAR in an order rotating every round; run
# files $RUNDIR/NAME-<target>-t<threads>-r<run>.json.
measure() {
	local name=$1 tv=$2 tlist=$3 t run k tgt out
	shift 3
	local -n tg=$tv
	for t in $tlist; do
		for ((run = 1; run <= RUNS; run++)); do
			log "$name, $t thread(s), run $run of $RUNS"
			for ((k = 0; k < ${#tg[@]}; k++)); do
				tgt=${tg[(k + run - 1) % ${#tg[@]}]}
				out=$RUNDIR/$name-$tgt-t$t-r$run.json
				local run_fn=p2p_bench
				[[ $tgt == p2p* || $tgt == dir ]] || run_fn=baseline_run
				# shellcheck disable=SC2046  # target_args is words on purpose
				$run_fn "$name $tgt, $t threads, run $run" "$out" \
					$(target_args "$tgt") --no-setup --threads "$t" \
					--duration "$DURATION" --warmup "$WARMUP" "$@" || continue
				log "  $tgt: $(json_num "$out" gb_per_s) GB/s, $(json_num "$out" items_per_s) items/s, p50 $(json_num "$out" p50_us) us, p99 $(json_num "$out" p99_us) us"
			done
		done
	done
}

# setup_target TARGET ARG...: stores the working set on TARGET, once.
setup_target() {
	local out=$RUNDIR/setup-$1.json
	# shellcheck disable=SC2046
	p2p_bench "setup $1" "$out" $(target_args "$1") --setup-only "${@:2}"
	log "  stored on $1 in $(json_num "$out" setup_s) s"
}

n_threads=$(wc -w <<<"$THREADS")
n_runs=$((${#SIZE_BYTES[@]} * n_threads * RUNS * ${#TARGETS[@]}))
((DIR)) && n_runs=$((n_runs + $(wc -w <<<"$DIR_THREADS") * RUNS * ${#DIR_TARGETS[@]}))
log "$n_runs runs of $DURATION s (+ $WARMUP s warm-up), plus setup: about $(awk -v n="$n_runs" -v d="$DURATION" -v w="$WARMUP" 'BEGIN { printf "%d", n * (d + w + 0.3) / 60 + 1 }') min"

runs_start
REDIS_VERSION=$(redis-server --version | sed -nE 's/.*v=([^ ]+).*/\1/p')
MEMCACHED_VERSION=$(memcached -V | awk '{ print $2 }')
KEYS_OF=()
for i in "${!SIZE_BYTES[@]}"; do
	n=${SIZE_BYTES[i]}
	keys=$((WORKSET_MB * 1048576 / n))
	((keys < 64)) && keys=64
	((keys < BATCH)) && keys=$BATCH
	KEYS_OF+=("$keys")
	set_mb=$((keys * n / 1048576 + 1))
	log "value size $n B: $keys keys ($set_mb MiB), fresh servers"
	# Pool: entries are 4 KiB aligned with a 64-byte header, and each pool
	# stripe holds 1/S of it while keys spread unevenly over stripes, so 3x
	# the working set: nothing may be evicted (mapped lazily, so the slack
	# costs no memory).
	node_up $((keys * (n + 4096) * 3 / 1048576 + 256))
	redis_start
	memcached_start -I 8m -m $((set_mb * 2 + 64)) -t "$MEMCACHED_THREADS"
	tcp_sink_up
	common=(--value-bytes "$n" --keys "$keys" --batch "$BATCH")
	for tgt in p2p memcached redis; do setup_target "$tgt" "${common[@]}"; done
	measure "s$n" TARGETS "$THREADS" "${common[@]}"
	kill -0 "$NODE_PID" 2>/dev/null || { node_log_tail; die "peercached died during the runs"; }
	server_stop "$NODE_PID"
	server_stop "$MEMCACHED_PID"
	server_stop "$SINK_PID"
	redis_stop
done

if ((DIR)); then
	log "directory lookups: $DIR_KEYS keys, dir.get of $DIR_BATCH vs redis GET x $DIR_BATCH, $DIR_PIPELINE in flight"
	node_up 512
	redis_start
	common=(--value-bytes "$DIR_VALUE_BYTES" --keys "$DIR_KEYS" --batch "$DIR_BATCH"
		--pipeline "$DIR_PIPELINE" --prefix pcd)
	setup_target p2p "${common[@]}"
	setup_target redis "${common[@]}"
	measure dir DIR_TARGETS "$DIR_THREADS" "${common[@]}"
	kill -0 "$NODE_PID" 2>/dev/null || { node_log_tail; die "peercached died during the runs"; }
	server_stop "$NODE_PID"
	redis_stop
fi
runs_end

# ------------------------------------------------------------- summary ----

results_prepare p2p
PB_SIZES="${SIZE_BYTES[*]}" PB_KEYS="${KEYS_OF[*]}" PB_THREADS=$THREADS PB_BATCH=$BATCH \
PB_DIR=$DIR PB_DIR_THREADS=$DIR_THREADS PB_DIR_BATCH=$DIR_BATCH \
PB_DIR_PIPELINE=$DIR_PIPELINE PB_DIR_KEYS=$DIR_KEYS PB_WORKSET_MB=$WORKSET_MB \
PB_NODE_THREADS=$NODE_THREADS PB_MEMCACHED_THREADS=$MEMCACHED_THREADS \
PB_REDIS_VERSION=$REDIS_VERSION PB_MEMCACHED_VERSION=$MEMCACHED_VERSION \
PB_NODE_DESC="$NODE_BIN --threads $NODE_THREADS${NODE_ARGS:+ $NODE_ARGS}" \
	bench_python <<'PYEOF'
sizes = [int(x) for x in env["PB_SIZES"].split()]
keys_of = dict(zip(sizes, (int(x) for x in env["PB_KEYS"].split())))
threads = [int(x) for x in env["PB_THREADS"].split()]
dir_on = env["PB_DIR"] == "1"
dir_threads = [int(x) for x in env["PB_DIR_THREADS"].split()] if dir_on else []
TARGETS = ("p2p", "p2p_nolookup", "memcached", "redis", "tcp")
RATIOS = (("p2p", "memcached"), ("p2p", "redis"), ("p2p", "tcp"),
          ("p2p_nolookup", "memcached"))
FIELDS = ("gb_per_s", "items_per_s", "p50_us", "p99_us")

def ratio(xs, ys):
    """Run i of xs over run i of ys (items/s): neighbours in time. Pairs
    with a failed run (a baseline's: {"failed": why}) are left out; None
    when no pair is left."""
    r = [x["items_per_s"] / y["items_per_s"] for x, y in zip(xs, ys)
         if "failed" not in x and "failed" not in y]
    return spread(r) if r else None

failed_runs = []

def medians(runs, fields, what):
    """Medians of `fields` over the runs that did not fail (None when all
    did); failed runs are counted in the result and listed in failed_runs
    under `what`."""
    ok = [x for x in runs if "failed" not in x]
    m = {k: med(ok, k) if ok else None for k in fields}
    if len(ok) < len(runs):
        why = next(x["failed"] for x in runs if "failed" in x)
        m["failed_runs"] = len(runs) - len(ok)
        failed_runs.append(f"{what}: {len(runs) - len(ok)} of {len(runs)} ({why[-120:]})")
    return m

CPU_FIELDS = ("server_cpu_s_per_gb", "client_cpu_s_per_gb")

def cpu_medians(runs):
    """Medians of the CPU seconds per GB moved (server: --server-pid; None
    where it could not be read), over the runs that have them."""
    out = {}
    for k in CPU_FIELDS:
        vals = [x[k] for x in runs if "failed" not in x and x.get(k) is not None]
        out[k] = statistics.median(vals) if vals else None
    return out

def cpu_ratio(xs, ys):
    """Run i of xs over run i of ys, server CPU per GB."""
    k = "server_cpu_s_per_gb"
    r = [x[k] / y[k] for x, y in zip(xs, ys) if "failed" not in x and
         "failed" not in y and x.get(k) and y.get(k)]
    return spread(r) if r else None

def size_name(n):
    return f"{n >> 20}m" if n % (1 << 20) == 0 else f"{n >> 10}k" if n % 1024 == 0 else str(n)

summary, raw = [], []
for n in sizes:
    for t in threads:
        rs = {g: [run_json(f"s{n}-{g}-t{t}-r{r}.json") for r in range(1, runs + 1)]
              for g in TARGETS}
        raw.append({"value_bytes": n, "threads": t, **rs})
        s = {"value_bytes": n, "threads": t, "keys": keys_of[n]}
        for g in TARGETS:
            s[g] = medians(rs[g], FIELDS, f"{g} at {size_name(n)}, {t} thread(s)")
            s[g].update(cpu_medians(rs[g]))
        s["cpu_ratio_p2p_over_memcached"] = cpu_ratio(rs["p2p"], rs["memcached"])
        for a, b in RATIOS:
            s[f"ratio_{a}_over_{b}"] = ratio(rs[a], rs[b])
        summary.append(s)

dir_summary = []
for t in dir_threads:
    rs = {g: [run_json(f"dir-{g}-t{t}-r{r}.json") for r in range(1, runs + 1)]
          for g in ("dir", "redis")}
    raw.append({"dir": True, "threads": t, **rs})
    d = {"threads": t}
    for g in ("dir", "redis"):
        d[g] = medians(rs[g], ("items_per_s", "p50_us", "p99_us"),
                       f"{g} (lookups), {t} thread(s)")
    d["ratio_dir_over_redis"] = ratio(rs["dir"], rs["redis"])
    dir_summary.append(d)

# The issues' goals, judged on the median paired ratio: p2p at least
# memcached at every size and reader count, at least 2x redis at 1 MiB.
GOALS = [("p2p/memcached", "ratio_p2p_over_memcached", 1.0, None),
         ("p2p/redis", "ratio_p2p_over_redis", 2.0, 1 << 20)]
goals = []
for label, key, want, only in GOALS:
    for s in summary:
        if only is None or s["value_bytes"] == only:
            goals.append({"goal": f"{label} at {size_name(s['value_bytes'])}",
                          "threads": s["threads"], "min_ratio": want,
                          "ratio": s[key],
                          "met": s[key]["median"] >= want if s[key] else None})
for d in dir_summary:
    r = d["ratio_dir_over_redis"]
    goals.append({"goal": "dir.get/redis GET keys/s", "threads": d["threads"],
                  "min_ratio": 2.0, "ratio": r,
                  "met": r["median"] >= 2.0 if r else None})

write_json({
    **doc_head("p2p"),
    "params": {"sizes": sizes, "keys": {str(k): v for k, v in keys_of.items()},
               "threads": threads, "batch": int(env["PB_BATCH"]), "runs": runs,
               "duration_s": duration, "warmup_s": float(env["BENCH_WARMUP"]),
               "workset_mb": int(env["PB_WORKSET_MB"]),
               "pinned": env["BENCH_PIN"] == "1", "node": env["PB_NODE_DESC"],
               "memcached_threads": int(env["PB_MEMCACHED_THREADS"]),
               "redis_version": env["PB_REDIS_VERSION"],
               "memcached_version": env["PB_MEMCACHED_VERSION"],
               "dir": {"threads": dir_threads, "batch": int(env["PB_DIR_BATCH"]),
                       "pipeline": int(env["PB_DIR_PIPELINE"]),
                       "keys": int(env["PB_DIR_KEYS"])} if dir_on else None,
               "units": "gb_per_s: 1e9 bytes of payload per second; items: pages "
                        "(values) or, for dir, keys"},
    "summary": summary, "dir_summary": dir_summary, "goals": goals, "runs": raw,
    "failed_baseline_runs": failed_runs,
})

def f2(x): return "n/a" if x is None else f"{x:.2f}"
def rr_(s): return "n/a (a baseline failed)" if s is None else rr(s)
def row(s, cells): print(f"| {size_name(s['value_bytes'])} | {s['threads']} | " + " | ".join(cells) + " |")
head = "| size | threads | p2p | p2p no lookup | memcached | redis | tcp |"
rule = "|---:|---:|---:|---:|---:|---:|---:|"
print(f"### p2p read path vs memcached, redis and raw TCP: batches of "
      f"{env['PB_BATCH']}, median of {runs} interleaved runs, {duration:g} s each\n")
print("Throughput, GB/s of payload (1 GB = 1e9 bytes):\n")
print(head); print(rule)
for s in summary: row(s, [f2(s[g]["gb_per_s"]) for g in TARGETS])
print("\nPages per second:\n")
print(head); print(rule)
for s in summary: row(s, [f0(s[g]["items_per_s"]) for g in TARGETS])
print("\nLatency per batch, p50 / p99 (us):\n")
print(head); print(rule)
for s in summary: row(s, [f"{f0(s[g]['p50_us'])} / {f0(s[g]['p99_us'])}" for g in TARGETS])
print("\nPaired ratios (run i over run i), median (min-max):\n")
print("| size | threads | p2p/memcached | p2p/redis | p2p/tcp | p2p no lookup/memcached |")
print("|---:|---:|---:|---:|---:|---:|")
for s in summary: row(s, [rr_(s[f"ratio_{a}_over_{b}"]) for a, b in RATIOS])
def f3(x): return "n/a" if x is None else f"{x:.3f}"
print("\nCPU seconds per GB moved in the measured window (user + system, all "
      "threads), medians, as server / reader (pc-p2p-bench); the last column "
      "is the node's over memcached's, run i over run i:\n")
print("| size | threads | p2p | p2p no lookup | memcached | redis | tcp | node/memcached |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
for s in summary:
    row(s, [f"{f3(s[g]['server_cpu_s_per_gb'])} / {f3(s[g]['client_cpu_s_per_gb'])}"
            for g in TARGETS] + [rr_(s["cpu_ratio_p2p_over_memcached"])])
if dir_summary:
    print(f"\nDirectory lookups: dir.get of {env['PB_DIR_BATCH']} keys vs redis "
          f"GET x {env['PB_DIR_BATCH']} (16-byte values), {env['PB_DIR_PIPELINE']} "
          f"batches in flight per thread, {env['PB_DIR_KEYS']} keys:\n")
    print("| threads | dir.get keys/s | redis GET keys/s | dir/redis | dir p50 / p99 us | redis p50 / p99 us |")
    print("|---:|---:|---:|---:|---:|---:|")
    for d in dir_summary:
        print(f"| {d['threads']} | {f0(d['dir']['items_per_s'])} | {f0(d['redis']['items_per_s'])} "
              f"| {rr_(d['ratio_dir_over_redis'])} "
              f"| {f0(d['dir']['p50_us'])} / {f0(d['dir']['p99_us'])} "
              f"| {f0(d['redis']['p50_us'])} / {f0(d['redis']['p99_us'])} |")
print("\nGoals (median paired ratio):\n")
if (1 << 20) not in sizes:
    print("- p2p/redis >= 2 at 1 MiB: not measured (1m not in SIZES)")
if not dir_on:
    print("- dir.get/redis GET keys/s >= 2: not measured (DIR=0)")
for g in goals:
    verdict = {True: "met", False: "NOT met", None: "not measured"}[g["met"]]
    print(f"- {g['goal']}, {g['threads']} thread(s): {rr_(g['ratio'])}, "
          f"goal >= {g['min_ratio']:g}: {verdict}")
if failed_runs:
    print("\nBaseline runs that failed (left out of the medians and ratios):\n")
    for f in failed_runs:
        print(f"- {f}")
print(f"\nnode: {env['PB_NODE_DESC']}; memcached {env['PB_MEMCACHED_VERSION']} "
      f"-t {env['PB_MEMCACHED_THREADS']}; redis {env['PB_REDIS_VERSION']}. "
      f"Load average {loadavg_span()}.")
print(f"Results: {out_path}")
PYEOF
