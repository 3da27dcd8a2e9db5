#!/usr/bin/env bash
# bench/rpc_bench.sh — RPC round trip of our node, side by side with redis-server.
#
# One invocation starts a peercached node (or any MessagePack-RPC server given
# in PC_RPC_SERVER_CMD) and a private redis-server on loopback, then for each
# (connections, pipeline) pair runs, RUNS times and interleaved so machine
# noise hits every target alike:
#   pc-loadgen msgpack-rpc node.health []   -> node
#   pc-loadgen raw "PING\r\n" (7-byte reply) -> redis-server
#   pc-loadgen raw GET key (16-byte value)   -> redis-server
#   redis-benchmark -t ping_inline            -> redis-server (stock client)
#   redis-benchmark GET key                   -> redis-server (stock client)
# It prints markdown tables on stdout and writes every run plus the summary to
# $BUILD/bench-results/rpc-<timestamp>.json. Progress goes to stderr.
#
# The machine is shared and noisy: trust the medians and the paired ratios
# (run i of the node over run i of redis), not single absolute figures.
#
# Environment (defaults in brackets):
#   PEERCACHE_BUILD_DIR  build tree [<repo>/build]; built with cmake if needed
#   CONNS                connection counts ["1 16 64"]
#   PIPELINES            requests in flight per connection ["1 16"]
#   RUNS                 runs per target and (conns, pipeline) [5]
#   DURATION             measured seconds per loadgen run [3]
#   WARMUP               unmeasured seconds before each loadgen run [1]
#   LOADGEN_THREADS      pc-loadgen worker threads [1]
#   NODE_THREADS         peercached --threads [1]
#   RPC_METHOD           method called on the node [node.health]
#   RPC_PARAMS_HEX       its params, one msgpack array in hex [90, i.e. []]
#   PIN                  1: servers on CPU 1, clients on CPU 0 (taskset) [0]
#   RESULTS_DIR          where the JSON goes [$BUILD/bench-results]
#   PEERCACHED, PC_LOADGEN  use these binaries instead of the build's
#   PC_RPC_SERVER_CMD    run this command instead of peercached (testing
#                        against a stand-in); bash execs it in a session of
#                        its own, stopped as a group on exit. It must listen
#                        on 127.0.0.1, print a line containing
#                        "listening: rpc on 127.0.0.1:<port>" on stdout or
#                        stderr, and stop on SIGTERM
#
# Only 127.0.0.1 is ever contacted. Servers are stopped by PID on exit.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${PEERCACHE_BUILD_DIR:-$REPO/build}
CONNS=${CONNS:-"1 16 64"}
PIPELINES=${PIPELINES:-"1 16"}
RUNS=${RUNS:-5}
DURATION=${DURATION:-3}
WARMUP=${WARMUP:-1}
LOADGEN_THREADS=${LOADGEN_THREADS:-1}
NODE_THREADS=${NODE_THREADS:-1}
RPC_METHOD=${RPC_METHOD:-node.health}
RPC_PARAMS_HEX=${RPC_PARAMS_HEX:-90}
PIN=${PIN:-0}
RESULTS_DIR=${RESULTS_DIR:-$BUILD/bench-results}
NODE_BIN=${PEERCACHED:-$BUILD/server/peercached}
LOADGEN_BIN=${PC_LOADGEN:-$BUILD/bench/pc-loadgen}
SERVER_CMD=${PC_RPC_SERVER_CMD:-}
# Debian's interpreter on purpose: the first python3 on PATH may be a pyenv
# shim with a different version and no guarantee it exists on CI.
PY=/usr/bin/python3
HOST=127.0.0.1
# What redis GET reads: a 16-byte value under "key". The raw GET request and
# its reply length follow from these; redis-benchmark is pointed at the same
# key (its own -t get would read "key:__rand_int__", a miss here).
GET_KEY=key
GET_VALUE=0123456789abcdef
GET_REQUEST='*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n'
GET_REPLY_BYTES=23  # "$16\r\n" + 16 bytes + "\r\n"

log() { printf 'rpc_bench: %s\n' "$*" >&2; }
die() { printf 'rpc_bench: error: %s\n' "$*" >&2; exit 1; }

# need_count NAME VALUE: a positive decimal integer, or stop here.
need_count() {
	if ! [[ $2 =~ ^[0-9]+$ ]] || ((10#$2 < 1)); then
		die "$1 must be a positive integer, got '$2'"
	fi
}
need_count RUNS "$RUNS"
for n in $CONNS; do need_count CONNS "$n"; done
for n in $PIPELINES; do need_count PIPELINES "$n"; done
[[ -n ${CONNS// /} ]] || die "CONNS is empty"
[[ -n ${PIPELINES// /} ]] || die "PIPELINES is empty"
for v in LOADGEN_THREADS NODE_THREADS; do need_count "$v" "${!v}"; done
for v in DURATION WARMUP; do
	[[ ${!v} =~ ^[0-9]+([.][0-9]+)?$ ]] || die "$v must be a number of seconds, got '${!v}'"
done
[[ $RPC_PARAMS_HEX =~ ^([0-9a-fA-F]{2})+$ ]] || die "RPC_PARAMS_HEX must be hex bytes, got '$RPC_PARAMS_HEX'"
[[ -x $PY ]] || die "$PY not found (Debian package python3)"
(( ${#GET_VALUE} == 16 )) || die "GET_VALUE must be 16 bytes"

# ---------------------------------------------------------------- tools ----

need_pkgs=()
command -v redis-server >/dev/null || need_pkgs+=(redis-server)
command -v redis-benchmark >/dev/null || need_pkgs+=(redis-tools)
command -v redis-cli >/dev/null || need_pkgs+=(redis-tools)
if ((${#need_pkgs[@]})); then
	mapfile -t need_pkgs < <(printf '%s\n' "${need_pkgs[@]}" | sort -u)
	log "installing ${need_pkgs[*]}"
	((EUID == 0)) || die "need root to install ${need_pkgs[*]} (or install them yourself)"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need_pkgs[@]}" >&2
fi

STANDALONE_HINT="or build pc-loadgen alone: gcc -std=gnu11 -O2 -I$REPO $REPO/bench/loadgen.c -o /tmp/pc-loadgen -lpthread -lm, then PC_LOADGEN=/tmp/pc-loadgen"
# A pc-loadgen built before the msgpack-rpc mode existed cannot drive the node.
loadgen_ok() { [[ -x $LOADGEN_BIN ]] && "$LOADGEN_BIN" --help 2>/dev/null | grep -q msgpack-rpc; }
if ! loadgen_ok || { [[ -z $SERVER_CMD ]] && [[ ! -x $NODE_BIN ]]; }; then
	log "pc-loadgen (with msgpack-rpc) or peercached missing; building into $BUILD"
	cmake -S "$REPO" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >&2 || die "cmake configure failed ($STANDALONE_HINT)"
	cmake --build "$BUILD" -j2 >&2 || die "build failed ($STANDALONE_HINT)"
fi
loadgen_ok || die "$LOADGEN_BIN missing or without --mode msgpack-rpc ($STANDALONE_HINT)"
if [[ -z $SERVER_CMD ]]; then
	[[ -x $NODE_BIN ]] || die "$NODE_BIN not found after building"
fi

SERVER_CPU=()
CLIENT_CPU=()
if [[ $PIN == 1 ]]; then
	command -v taskset >/dev/null || die "PIN=1 needs taskset (util-linux)"
	(($(nproc) >= 2)) || die "PIN=1 needs at least 2 CPUs"
	SERVER_CPU=(taskset -c 1)
	CLIENT_CPU=(taskset -c 0)
fi

# ------------------------------------------------------------- servers ----

WORK=$(mktemp -d /tmp/rpc_bench.XXXXXX)
NODE_PID=
REDIS_PID=

# stop_pid pid name [group]: TERM, then KILL if it lingers past 5 s. With
# group, the signals go to the process group the pid leads (a server command
# that is a wrapper script must not leave its children behind).
stop_pid() {
	local pid=$1 name=$2 group=${3:-} i target
	[[ -n $pid ]] || return 0
	target=$pid
	[[ -n $group ]] && target=-$pid
	kill -0 -- "$target" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
	kill -TERM -- "$target" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do
		kill -0 -- "$target" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 -- "$target" 2>/dev/null; then
		log "$name (pid $pid${group:+ and its group}) ignored SIGTERM; killing"
		kill -KILL -- "$target" 2>/dev/null || true
	fi
	wait "$pid" 2>/dev/null || true
}
cleanup() {
	local rc=$?
	stop_pid "$NODE_PID" "rpc server" ${SERVER_CMD:+group}
	stop_pid "$REDIS_PID" redis-server
	rm -rf "$WORK"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

node_log_tail() { tail -n 15 "$WORK/node.err" "$WORK/node.out" >&2 2>/dev/null || true; }

# The node picks its own port (--rpc-port 0) and logs it at info level as
# "listening: rpc on 127.0.0.1:<port>". Both ways of starting it exec, so
# NODE_PID is the server itself and the trap stops it by that PID. setsid
# execs too (the script's background jobs are no group leaders), making
# that PID the id of a fresh process group for a command's helpers.
# The logs exist before the server opens them: the poll below may read them
# before the child has got as far as its redirections.
: >"$WORK/node.out"
: >"$WORK/node.err"
if [[ -n $SERVER_CMD ]]; then
	command -v setsid >/dev/null || die "PC_RPC_SERVER_CMD needs setsid (util-linux)"
	NODE_DESC="PC_RPC_SERVER_CMD: $SERVER_CMD"
	"${SERVER_CPU[@]}" setsid bash -c "exec $SERVER_CMD" >"$WORK/node.out" 2>"$WORK/node.err" &
else
	NODE_DESC="$NODE_BIN --threads $NODE_THREADS"
	"${SERVER_CPU[@]}" "$NODE_BIN" --bind "$HOST" --rpc-port 0 --data-port 0 \
		--meta-port 0 --metrics-port 0 --socket "" --threads "$NODE_THREADS" \
		--log-level info >"$WORK/node.out" 2>"$WORK/node.err" &
fi
NODE_PID=$!
NODE_PORT=
for ((i = 0; i < 100; i++)); do
	if ! kill -0 "$NODE_PID" 2>/dev/null; then
		node_log_tail
		die "the RPC server exited before listening"
	fi
	addr=$(sed -nE 's/.*listening: rpc on ([^ ]+:[0-9]+).*/\1/p' \
		"$WORK/node.err" "$WORK/node.out" | head -n1) || true
	if [[ -n $addr ]]; then
		[[ ${addr%:*} == "$HOST" ]] || die "the RPC server listens on $addr, not on $HOST; refusing to send traffic there"
		NODE_PORT=${addr##*:}
		break
	fi
	if grep -q 'listening on nothing' "$WORK/node.err" "$WORK/node.out"; then
		node_log_tail
		die "$NODE_DESC logged 'listening on nothing': no RPC server in this build; set PC_RPC_SERVER_CMD to test against a stand-in"
	fi
	sleep 0.1
done
[[ -n $NODE_PORT ]] || { node_log_tail; die "the RPC server logged no 'listening: rpc on $HOST:<port>' line within 10 s"; }
log "rpc server pid $NODE_PID on $HOST:$NODE_PORT ($NODE_DESC)"

# redis-server cannot take port 0, so ask the kernel for a free port and hand
# it over; another process may grab it in between, hence the retries.
free_port() {
	"$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
REDIS_PORT=
for attempt in 1 2 3; do
	port=$(free_port)
	"${SERVER_CPU[@]}" redis-server --save "" --appendonly no --bind "$HOST" \
		--port "$port" --daemonize no >"$WORK/redis.log" 2>&1 &
	REDIS_PID=$!
	for ((i = 0; i < 50; i++)); do
		kill -0 "$REDIS_PID" 2>/dev/null || break
		if [[ $(redis-cli -h "$HOST" -p "$port" ping 2>/dev/null) == PONG ]]; then
			REDIS_PORT=$port
			break
		fi
		sleep 0.1
	done
	[[ -n $REDIS_PORT ]] && break
	log "redis-server did not come up on port $port (attempt $attempt):"
	tail -n 5 "$WORK/redis.log" >&2 || true
	stop_pid "$REDIS_PID" redis-server
	REDIS_PID=
done
[[ -n $REDIS_PORT ]] || die "could not start redis-server"
REDIS_VERSION=$(redis-server --version | sed -nE 's/.*v=([^ ]+).*/\1/p')
log "redis-server pid $REDIS_PID on $HOST:$REDIS_PORT ($REDIS_VERSION)"

rcli() { redis-cli -h "$HOST" -p "$REDIS_PORT" "$@"; }
[[ $(rcli SET "$GET_KEY" "$GET_VALUE") == OK ]] || die "redis SET $GET_KEY failed"
[[ $(rcli GET "$GET_KEY") == "$GET_VALUE" ]] || die "redis GET $GET_KEY does not return what was SET"
rcli CONFIG RESETSTAT >/dev/null  # so the hit/miss counts below are ours

# ---------------------------------------------------------------- runs ----

RUNDIR=$WORK/runs
mkdir -p "$RUNDIR"

json_num() { # file field -> number
	sed -nE "s/.*\"$2\":([0-9.eE+-]+).*/\1/p" "$1"
}

# run_loadgen target conns pipeline run
run_loadgen() {
	local target=$1 conns=$2 pl=$3 run=$4 port args
	local out=$RUNDIR/$target-c$conns-p$pl-r$run.json
	local err=$RUNDIR/$target-c$conns-p$pl-r$run.err
	case $target in
	node)
		port=$NODE_PORT
		args=(--mode msgpack-rpc --method "$RPC_METHOD" --params-hex "$RPC_PARAMS_HEX") ;;
	redis_ping)
		port=$REDIS_PORT
		args=(--request 'PING\r\n' --reply-bytes 7) ;;
	redis_get)
		port=$REDIS_PORT
		args=(--request "$GET_REQUEST" --reply-bytes "$GET_REPLY_BYTES") ;;
	esac
	if ! "${CLIENT_CPU[@]}" "$LOADGEN_BIN" --host "$HOST" --port "$port" \
		--conns "$conns" --threads "$LOADGEN_THREADS" --pipeline "$pl" \
		--duration "$DURATION" --warmup "$WARMUP" "${args[@]}" --json \
		>"$out" 2>"$err"; then
		cat "$err" >&2
		[[ $target == node ]] && node_log_tail
		die "pc-loadgen against $target ($HOST:$port, $conns conns, pipeline $pl, run $run) failed"
	fi
	log "  $target: $(json_num "$out" ops_per_s) ops/s, p50 $(json_num "$out" p50_us) us, p99 $(json_num "$out" p99_us) us"
}

# run_redis_benchmark test conns pipeline run requests
#   test ping: -t ping_inline, the same inline "PING\r\n" pc-loadgen sends;
#   test get: the custom command "GET key", the same key pc-loadgen reads.
run_redis_benchmark() {
	local test=$1 conns=$2 pl=$3 run=$4 n=$5 what
	local out=$RUNDIR/rb_$test-c$conns-p$pl-r$run.csv
	if [[ $test == ping ]]; then what=(-t ping_inline); else what=(GET "$GET_KEY"); fi
	# Its own limit: a hung server would otherwise hold it forever.
	local limit
	limit=$(awk -v d="$DURATION" 'BEGIN { printf "%d", d * 10 + 30 }')
	if ! timeout "$limit" "${CLIENT_CPU[@]}" redis-benchmark -h "$HOST" -p "$REDIS_PORT" \
		-c "$conns" -P "$pl" -n "$n" -q --csv "${what[@]}" >"$out" 2>"$RUNDIR/rb.err"; then
		cat "$RUNDIR/rb.err" "$out" >&2 || true
		die "redis-benchmark $test ($conns conns, pipeline $pl, run $run) failed"
	fi
	# Row 2 of the CSV: "<test>","<rps>",...
	local rps
	rps=$(awk -F'","' 'NR == 2 { print $2 }' "$out")
	[[ $rps =~ ^[0-9.]+$ ]] || { cat "$out" >&2; die "no figure in redis-benchmark $test output"; }
	printf '%s\n' "$rps" >"$RUNDIR/rb_$test-c$conns-p$pl-r$run.rps"
	log "  redis-benchmark $test: $rps rps (-n $n)"
}

# requests_for rate: -n that makes redis-benchmark run about DURATION seconds
requests_for() {
	awk -v r="$1" -v d="$DURATION" 'BEGIN {
		n = int(r * d); if (n < 10000) n = 10000; if (n > 20000000) n = 20000000; print n }'
}

TARGETS=(node redis_ping redis_get)
START_TS=$(date -u +%Y%m%dT%H%M%SZ)
LOADAVG_START=$(cut -d' ' -f1-3 /proc/loadavg)
for conns in $CONNS; do
	for pl in $PIPELINES; do
		rb_rate_ping=
		rb_rate_get=
		for ((run = 1; run <= RUNS; run++)); do
			log "conns $conns, pipeline $pl, run $run of $RUNS"
			# Rotate who goes first so a drift within a round does
			# not always favour the same target.
			for ((k = 0; k < ${#TARGETS[@]}; k++)); do
				run_loadgen "${TARGETS[(k + run - 1) % ${#TARGETS[@]}]}" "$conns" "$pl" "$run"
			done
			# Size -n from redis-benchmark's own last rate, or at
			# first from pc-loadgen's rate for the same command.
			[[ -n $rb_rate_ping ]] || rb_rate_ping=$(json_num "$RUNDIR/redis_ping-c$conns-p$pl-r$run.json" ops_per_s)
			[[ -n $rb_rate_get ]] || rb_rate_get=$(json_num "$RUNDIR/redis_get-c$conns-p$pl-r$run.json" ops_per_s)
			run_redis_benchmark ping "$conns" "$pl" "$run" "$(requests_for "$rb_rate_ping")"
			run_redis_benchmark get "$conns" "$pl" "$run" "$(requests_for "$rb_rate_get")"
			rb_rate_ping=$(cat "$RUNDIR/rb_ping-c$conns-p$pl-r$run.rps")
			rb_rate_get=$(cat "$RUNDIR/rb_get-c$conns-p$pl-r$run.rps")
		done
	done
done
LOADAVG_END=$(cut -d' ' -f1-3 /proc/loadavg)

# Every GET must have hit: a miss is a shorter reply, a different benchmark.
KEYSPACE_HITS=$(rcli INFO stats | sed -nE 's/^keyspace_hits:([0-9]+).*/\1/p')
KEYSPACE_MISSES=$(rcli INFO stats | sed -nE 's/^keyspace_misses:([0-9]+).*/\1/p')
[[ ${KEYSPACE_MISSES:-0} == 0 ]] || die "redis counted $KEYSPACE_MISSES GET misses; the GET figures are not for a 16-byte value"
kill -0 "$NODE_PID" 2>/dev/null || { node_log_tail; die "the RPC server died during the runs"; }

# ------------------------------------------------------------- summary ----

mkdir -p "$RESULTS_DIR"
RESULT_JSON=$RESULTS_DIR/rpc-$START_TS.json
GIT_REV=$(git -C "$REPO" describe --always --dirty 2>/dev/null || echo unknown)

# Values go to python through the environment, never pasted into its source.
RB_CONNS=$CONNS RB_PIPELINES=$PIPELINES RB_RUNS=$RUNS RB_DURATION=$DURATION \
RB_WARMUP=$WARMUP RB_LOADGEN_THREADS=$LOADGEN_THREADS RB_NODE_THREADS=$NODE_THREADS \
RB_PIN=$PIN RB_TS=$START_TS RB_GIT_REV=$GIT_REV RB_NODE_DESC=$NODE_DESC \
RB_METHOD=$RPC_METHOD RB_PARAMS_HEX=$RPC_PARAMS_HEX RB_REDIS_VERSION=$REDIS_VERSION \
RB_GET_KEY=$GET_KEY RB_GET_REPLY_BYTES=$GET_REPLY_BYTES \
RB_KEYSPACE_HITS=${KEYSPACE_HITS:-0} RB_KEYSPACE_MISSES=${KEYSPACE_MISSES:-0} \
RB_LOADAVG_START=$LOADAVG_START RB_LOADAVG_END=$LOADAVG_END \
	"$PY" - "$RUNDIR" "$RESULT_JSON" <<'PYEOF'
import csv, json, os, statistics, sys

rundir, out_path = sys.argv[1], sys.argv[2]
env = os.environ
conns_list = [int(c) for c in env["RB_CONNS"].split()]
pipelines = [int(p) for p in env["RB_PIPELINES"].split()]
runs = int(env["RB_RUNS"])
duration = float(env["RB_DURATION"])
LOADGEN = ("node", "redis_ping", "redis_get")
BENCH = ("ping", "get")

def loadgen(target, c, p, r):
    with open(os.path.join(rundir, f"{target}-c{c}-p{p}-r{r}.json")) as f:
        return json.loads(f.read())

def bench(test, c, p, r):
    with open(os.path.join(rundir, f"rb_{test}-c{c}-p{p}-r{r}.csv")) as f:
        row = list(csv.DictReader(f))[0]
    out = {"test": row["test"], "rps": float(row["rps"])}
    for key in ("avg", "p50", "p95", "p99", "max"):
        col = f"{key}_latency_ms"
        if row.get(col):
            out[f"{key}_us"] = float(row[col]) * 1000.0
    return out

def spread(values):
    return {"min": min(values), "median": statistics.median(values),
            "max": max(values)}

def med(rs, k):
    vals = [x[k] for x in rs if k in x]
    return statistics.median(vals) if len(vals) == len(rs) else None

summary, raw = [], []
for c in conns_list:
    for p in pipelines:
        lg = {t: [loadgen(t, c, p, r) for r in range(1, runs + 1)] for t in LOADGEN}
        rb = {t: [bench(t, c, p, r) for r in range(1, runs + 1)] for t in BENCH}
        raw.append({"conns": c, "pipeline": p, **lg,
                    **{f"redis_benchmark_{t}": v for t, v in rb.items()}})
        node = lg["node"]
        # Paired: run i of the node over run i of the other, neighbours in
        # time (the same round of the interleaved loop).
        def ratio(others, key):
            return spread([x["ops_per_s"] / y[key] for x, y in zip(node, others)])
        s = {"conns": c, "pipeline": p}
        for t in LOADGEN:
            s[t] = {k: med(lg[t], k) for k in ("ops_per_s", "p50_us", "p99_us")}
        s["node"]["reply_bytes_mean"] = med(node, "reply_bytes_mean")
        for t in BENCH:
            s[f"redis_benchmark_{t}"] = {k: med(rb[t], k) for k in ("rps", "p50_us", "p99_us")}
        s["ratio_node_over_redis_ping"] = ratio(lg["redis_ping"], "ops_per_s")
        s["ratio_node_over_redis_get"] = ratio(lg["redis_get"], "ops_per_s")
        s["ratio_node_over_redis_benchmark_ping"] = ratio(rb["ping"], "rps")
        s["ratio_node_over_redis_benchmark_get"] = ratio(rb["get"], "rps")
        summary.append(s)

doc = {
    "bench": "rpc",
    "timestamp": env["RB_TS"],
    "git_rev": env["RB_GIT_REV"],
    "host": {"kernel": os.uname().release, "cpus": os.cpu_count(),
             "loadavg_start": env["RB_LOADAVG_START"],
             "loadavg_end": env["RB_LOADAVG_END"]},
    "params": {"conns": conns_list, "pipelines": pipelines, "runs": runs,
               "duration_s": duration, "warmup_s": float(env["RB_WARMUP"]),
               "loadgen_threads": int(env["RB_LOADGEN_THREADS"]),
               "node_threads": int(env["RB_NODE_THREADS"]),
               "pinned": env["RB_PIN"] == "1",
               "node": env["RB_NODE_DESC"], "method": env["RB_METHOD"],
               "params_hex": env["RB_PARAMS_HEX"],
               "redis_version": env["RB_REDIS_VERSION"],
               "redis_ping_request": "PING\\r\\n", "redis_ping_reply_bytes": 7,
               "redis_get_key": env["RB_GET_KEY"], "redis_get_value_bytes": 16,
               "redis_get_reply_bytes": int(env["RB_GET_REPLY_BYTES"]),
               "redis_benchmark": ["-t ping_inline", "GET " + env["RB_GET_KEY"]]},
    "redis_keyspace": {"hits": int(env["RB_KEYSPACE_HITS"]),
                       "misses": int(env["RB_KEYSPACE_MISSES"])},
    "summary": summary,
    "runs": raw,
}
with open(out_path, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")

def f0(x): return "n/a" if x is None else f"{x:,.0f}"
def f1(x): return "n/a" if x is None else f"{x:.1f}"
def rr(s): return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"
def lat(d): return f"{f1(d['p50_us'])} / {f1(d['p99_us'])}"

method = env["RB_METHOD"]
print(f"### RPC round trip: node `{method}` vs redis-server, median of "
      f"{runs} interleaved runs, {duration:g} s each\n")
print("Throughput (ops/s) and paired ratios, median (min-max):\n")
print("| conns | pipeline | node ops/s | redis PING | redis GET "
      "| node/PING | node/GET | redis-benchmark PING | redis-benchmark GET "
      "| node/rb PING | node/rb GET |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for s in summary:
    print(f"| {s['conns']} | {s['pipeline']} | {f0(s['node']['ops_per_s'])} "
          f"| {f0(s['redis_ping']['ops_per_s'])} | {f0(s['redis_get']['ops_per_s'])} "
          f"| {rr(s['ratio_node_over_redis_ping'])} | {rr(s['ratio_node_over_redis_get'])} "
          f"| {f0(s['redis_benchmark_ping']['rps'])} | {f0(s['redis_benchmark_get']['rps'])} "
          f"| {rr(s['ratio_node_over_redis_benchmark_ping'])} "
          f"| {rr(s['ratio_node_over_redis_benchmark_get'])} |")
print("\nLatency p50 / p99 (us), medians over the runs:\n")
print("| conns | pipeline | node | redis PING | redis GET "
      "| redis-benchmark PING | redis-benchmark GET |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for s in summary:
    print(f"| {s['conns']} | {s['pipeline']} | {lat(s['node'])} "
          f"| {lat(s['redis_ping'])} | {lat(s['redis_get'])} "
          f"| {lat(s['redis_benchmark_ping'])} | {lat(s['redis_benchmark_get'])} |")
print(f"\nnode: {env['RB_NODE_DESC']}; redis {env['RB_REDIS_VERSION']}. "
      f"Ratios are paired per run (run i of the node over run i of the "
      f"other target, median and min-max over {runs} pairs); above 1 means "
      f"the node completed more round trips. pc-loadgen "
      f"{env['RB_LOADGEN_THREADS']} thread(s); load average "
      f"{env['RB_LOADAVG_START'].split()[0]} -> {env['RB_LOADAVG_END'].split()[0]}.")
print(f"Results: {out_path}")
PYEOF
