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
# What it shares with echo_bench.sh (checks, bootstrap, server handling,
# summary helpers) is in bench/lib.sh.
set -euo pipefail

BENCH_NAME=rpc_bench
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CONNS=${CONNS:-"1 16 64"}
PIPELINES=${PIPELINES:-"1 16"}
NODE_THREADS=${NODE_THREADS:-1}
RPC_METHOD=${RPC_METHOD:-node.health}
RPC_PARAMS_HEX=${RPC_PARAMS_HEX:-90}
NODE_BIN=${PEERCACHED:-$BUILD/server/peercached}
SERVER_CMD=${PC_RPC_SERVER_CMD:-}
# What redis GET reads: a 16-byte value under "key". The raw GET request and
# its reply length follow from these; redis-benchmark is pointed at the same
# key (its own -t get would read "key:__rand_int__", a miss here).
GET_KEY=key
GET_VALUE=0123456789abcdef
# shellcheck disable=SC2016  # RESP, not shell: the $ are literal
GET_REQUEST='*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n'
GET_REPLY_BYTES=23  # "$16\r\n" + 16 bytes + "\r\n"

need_count RUNS "$RUNS"
need_counts CONNS
need_counts PIPELINES
for v in LOADGEN_THREADS NODE_THREADS; do need_count "$v" "${!v}"; done
need_seconds DURATION WARMUP
[[ $RPC_PARAMS_HEX =~ ^([0-9a-fA-F]{2})+$ ]] || die "RPC_PARAMS_HEX must be hex bytes, got '$RPC_PARAMS_HEX'"
need_python
(( ${#GET_VALUE} == 16 )) || die "GET_VALUE must be 16 bytes"

# ---------------------------------------------------------------- tools ----

bench_need_redis
STANDALONE_HINT="or build pc-loadgen alone: gcc -std=gnu11 -O2 -I$REPO $REPO/bench/loadgen.c $REPO/bench/lg_opts.c $REPO/bench/lg_proto.c $REPO/bench/lg_msgpack.c $REPO/bench/lg_hist.c -o /tmp/pc-loadgen -lpthread -lm, then PC_LOADGEN=/tmp/pc-loadgen"
# A pc-loadgen built before the msgpack-rpc mode existed cannot drive the node.
loadgen_ok() { [[ -x $LOADGEN_BIN ]] && "$LOADGEN_BIN" --help 2>/dev/null | grep -q msgpack-rpc; }
if ! loadgen_ok || { [[ -z $SERVER_CMD ]] && [[ ! -x $NODE_BIN ]]; }; then
	bench_build "pc-loadgen (with msgpack-rpc) or peercached missing" "$STANDALONE_HINT"
fi
loadgen_ok || die "$LOADGEN_BIN missing or without --mode msgpack-rpc ($STANDALONE_HINT)"
if [[ -z $SERVER_CMD ]]; then
	[[ -x $NODE_BIN ]] || die "$NODE_BIN not found after building"
fi
bench_pin

# ------------------------------------------------------------- servers ----

bench_workdir
SERVER_NAME="rpc server"
SERVER_GROUP=${SERVER_CMD:+group}

node_log_tail() { tail -n 15 "$WORK/node.err" "$WORK/node.out" >&2 2>/dev/null || true; }

# The node picks its own port (--rpc-port 0) and logs it at info level as
# "listening: rpc on 127.0.0.1:<port>". Both ways of starting it exec, so
# SERVER_PID is the server itself and the trap stops it by that PID. setsid
# execs too (the script's background jobs are no group leaders), making
# that PID the id of a fresh process group for a command's helpers.
if [[ -n $SERVER_CMD ]]; then
	command -v setsid >/dev/null || die "PC_RPC_SERVER_CMD needs setsid (util-linux)"
	NODE_DESC="PC_RPC_SERVER_CMD: $SERVER_CMD"
	server_start "$WORK/node.out" "$WORK/node.err" \
		"${SERVER_CPU[@]}" setsid bash -c "exec $SERVER_CMD"
else
	NODE_DESC="$NODE_BIN --threads $NODE_THREADS"
	server_start "$WORK/node.out" "$WORK/node.err" \
		"${SERVER_CPU[@]}" "$NODE_BIN" --bind "$HOST" --rpc-port 0 --data-port 0 \
		--meta-port 0 --metrics-port 0 --socket "" --threads "$NODE_THREADS" \
		--log-level info
fi
NODE_PORT=
node_port_read() {
	local addr
	addr=$(sed -nE 's/.*listening: rpc on ([^ ]+:[0-9]+).*/\1/p' \
		"$WORK/node.err" "$WORK/node.out" | head -n1) || true
	if [[ -n $addr ]]; then
		[[ ${addr%:*} == "$HOST" ]] || die "the RPC server listens on $addr, not on $HOST; refusing to send traffic there"
		NODE_PORT=${addr##*:}
		return 0
	fi
	if grep -q 'listening on nothing' "$WORK/node.err" "$WORK/node.out"; then
		node_log_tail
		die "$NODE_DESC logged 'listening on nothing': no RPC server in this build; set PC_RPC_SERVER_CMD to test against a stand-in"
	fi
	return 1
}
rc=0
poll_until "$SERVER_PID" 100 node_port_read || rc=$?
case $rc in
1)
	node_log_tail
	die "the RPC server logged no 'listening: rpc on $HOST:<port>' line within 10 s"
	;;
2)
	node_log_tail
	die "the RPC server exited before listening"
	;;
esac
log "rpc server pid $SERVER_PID on $HOST:$NODE_PORT ($NODE_DESC)"

redis_start
REDIS_VERSION=$(redis-server --version | sed -nE 's/.*v=([^ ]+).*/\1/p')
log "redis-server pid $REDIS_PID on $HOST:$REDIS_PORT ($REDIS_VERSION)"

rcli() { redis-cli -h "$HOST" -p "$REDIS_PORT" "$@"; }
[[ $(rcli SET "$GET_KEY" "$GET_VALUE") == OK ]] || die "redis SET $GET_KEY failed"
[[ $(rcli GET "$GET_KEY") == "$GET_VALUE" ]] || die "redis GET $GET_KEY does not return what was SET"
rcli CONFIG RESETSTAT >/dev/null  # so the hit/miss counts below are ours

# ---------------------------------------------------------------- runs ----

# run_loadgen target conns pipeline run
run_loadgen() {
	local target=$1 conns=$2 pl=$3 run=$4 port args
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
	if ! loadgen_json "$target" "$RUNDIR/$target-c$conns-p$pl-r$run.json" \
		"$port" "$conns" "$pl" "${args[@]}"; then
		[[ $target == node ]] && node_log_tail
		die "pc-loadgen against $target ($HOST:$port, $conns conns, pipeline $pl, run $run) failed"
	fi
}

# run_redis_benchmark test conns pipeline run requests
#   test ping: -t ping_inline, the same inline "PING\r\n" pc-loadgen sends;
#   test get: the custom command "GET key", the same key pc-loadgen reads.
run_redis_benchmark() {
	local test=$1 conns=$2 pl=$3 run=$4 n=$5 what
	local out=$RUNDIR/rb_$test-c$conns-p$pl-r$run.csv
	if [[ $test == ping ]]; then what=(-t ping_inline); else what=(GET "$GET_KEY"); fi
	redis_benchmark_csv "$out" -c "$conns" -P "$pl" -n "$n" -q --csv "${what[@]}" ||
		die "redis-benchmark $test ($conns conns, pipeline $pl, run $run) failed"
	# Row 2 of the CSV: "<test>","<rps>",...
	local rps
	rps=$(awk -F'","' 'NR == 2 { print $2 }' "$out")
	[[ $rps =~ ^[0-9.]+$ ]] || { cat "$out" >&2; die "no figure in redis-benchmark $test output"; }
	printf '%s\n' "$rps" >"$RUNDIR/rb_$test-c$conns-p$pl-r$run.rps"
	log "  redis-benchmark $test: $rps rps (-n $n)"
}

TARGETS=(node redis_ping redis_get)
runs_start
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
runs_end

# Every GET must have hit: a miss is a shorter reply, a different benchmark.
KEYSPACE_HITS=$(rcli INFO stats | sed -nE 's/^keyspace_hits:([0-9]+).*/\1/p')
KEYSPACE_MISSES=$(rcli INFO stats | sed -nE 's/^keyspace_misses:([0-9]+).*/\1/p')
[[ ${KEYSPACE_MISSES:-0} == 0 ]] || die "redis counted $KEYSPACE_MISSES GET misses; the GET figures are not for a 16-byte value"
kill -0 "$SERVER_PID" 2>/dev/null || { node_log_tail; die "the RPC server died during the runs"; }

# ------------------------------------------------------------- summary ----

results_prepare rpc
RB_PIPELINES=$PIPELINES RB_NODE_THREADS=$NODE_THREADS RB_NODE_DESC=$NODE_DESC \
RB_METHOD=$RPC_METHOD RB_PARAMS_HEX=$RPC_PARAMS_HEX RB_REDIS_VERSION=$REDIS_VERSION \
RB_GET_KEY=$GET_KEY RB_GET_REPLY_BYTES=$GET_REPLY_BYTES \
RB_KEYSPACE_HITS=${KEYSPACE_HITS:-0} RB_KEYSPACE_MISSES=${KEYSPACE_MISSES:-0} \
	bench_python <<'PYEOF'
pipelines = [int(p) for p in env["RB_PIPELINES"].split()]
LOADGEN = ("node", "redis_ping", "redis_get")
BENCH = ("ping", "get")

def bench(test, c, p, r):
    row = rb_rows(f"rb_{test}-c{c}-p{p}-r{r}.csv")[0]
    return {"test": row["test"], **rb_figures(row)}

summary, raw = [], []
for c in conns_list:
    for p in pipelines:
        lg = {t: [run_json(f"{t}-c{c}-p{p}-r{r}.json") for r in range(1, runs + 1)]
              for t in LOADGEN}
        rb = {t: [bench(t, c, p, r) for r in range(1, runs + 1)] for t in BENCH}
        raw.append({"conns": c, "pipeline": p, **lg,
                    **{f"redis_benchmark_{t}": v for t, v in rb.items()}})
        node = lg["node"]
        s = {"conns": c, "pipeline": p}
        for t in LOADGEN:
            s[t] = {k: med(lg[t], k) for k in ("ops_per_s", "p50_us", "p99_us")}
        s["node"]["reply_bytes_mean"] = med(node, "reply_bytes_mean")
        for t in BENCH:
            s[f"redis_benchmark_{t}"] = {k: med(rb[t], k) for k in ("rps", "p50_us", "p99_us")}
        # Paired with the node's run of the same round of the interleaved loop.
        s["ratio_node_over_redis_ping"] = paired(node, lg["redis_ping"], "ops_per_s")
        s["ratio_node_over_redis_get"] = paired(node, lg["redis_get"], "ops_per_s")
        s["ratio_node_over_redis_benchmark_ping"] = paired(node, rb["ping"], "rps")
        s["ratio_node_over_redis_benchmark_get"] = paired(node, rb["get"], "rps")
        summary.append(s)

write_json({
    **doc_head("rpc"),
    "params": {"conns": conns_list, "pipelines": pipelines, "runs": runs,
               "duration_s": duration, "warmup_s": float(env["BENCH_WARMUP"]),
               "loadgen_threads": int(env["BENCH_LOADGEN_THREADS"]),
               "node_threads": int(env["RB_NODE_THREADS"]),
               "pinned": env["BENCH_PIN"] == "1",
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
})

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
      f"{env['BENCH_LOADGEN_THREADS']} thread(s); load average "
      f"{loadavg_span()}.")
print(f"Results: {out_path}")
PYEOF
