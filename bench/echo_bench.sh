#!/usr/bin/env bash
# bench/echo_bench.sh — reactor echo round trip, side by side with redis-server.
#
# One invocation starts our echo server (pc-echo-server) and a private
# redis-server on loopback, then for each connection count runs, RUNS times and
# interleaved so machine noise hits both alike:
#   pc-loadgen -> pc-echo-server   ("PING\r\n" in, 6 bytes back)
#   pc-loadgen -> redis-server     ("PING\r\n" in, "+PONG\r\n" back)
#   redis-benchmark ping_inline -> redis-server   (the stock client's figure)
# It prints a markdown table on stdout and writes every run plus the summary
# to $BUILD/bench-results/echo-<timestamp>.json. Progress goes to stderr.
#
# The machine is shared and noisy: trust the medians and the paired ratios
# (run i of echo over run i of redis), not single absolute figures.
#
# Environment (defaults in brackets):
#   PEERCACHE_BUILD_DIR  build tree [<repo>/build]; built with cmake if needed
#   CONNS                connection counts ["1 64"]
#   RUNS                 runs per target and connection count [5]
#   DURATION             measured seconds per loadgen run [3]
#   WARMUP               unmeasured seconds before each loadgen run [1]
#   LOADGEN_THREADS      pc-loadgen worker threads [1]
#   PIPELINE             requests in flight per connection [1]
#   ECHO_THREADS         pc-echo-server --threads [1]
#   PIN                  1: servers on CPU 1, clients on CPU 0 (taskset) [0]
#   RESULTS_DIR          where the JSON goes [$BUILD/bench-results]
#   PC_ECHO_SERVER, PC_LOADGEN  use these binaries instead of the build's
#
# Only 127.0.0.1 is ever contacted. Servers are stopped by PID on exit.
# What it shares with rpc_bench.sh (checks, bootstrap, server handling,
# summary helpers) is in bench/lib.sh.
set -euo pipefail

BENCH_NAME=echo_bench
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CONNS=${CONNS:-"1 64"}
PIPELINE=${PIPELINE:-1}
ECHO_THREADS=${ECHO_THREADS:-1}
ECHO_BIN=${PC_ECHO_SERVER:-$BUILD/bench/pc-echo-server}

need_count RUNS "$RUNS"
need_counts CONNS
for v in LOADGEN_THREADS PIPELINE ECHO_THREADS; do need_count "$v" "${!v}"; done
need_seconds DURATION WARMUP
need_python

# ---------------------------------------------------------------- tools ----

bench_need_redis
if [[ ! -x $ECHO_BIN || ! -x $LOADGEN_BIN ]]; then
	bench_build "pc-echo-server or pc-loadgen missing"
fi
[[ -x $ECHO_BIN ]] || die "$ECHO_BIN not found after building (is the pc-echo-server target in bench/CMakeLists.txt?)"
[[ -x $LOADGEN_BIN ]] || die "$LOADGEN_BIN not found after building (is the pc-loadgen target in bench/CMakeLists.txt?)"
bench_pin

# ------------------------------------------------------------- servers ----

bench_workdir
SERVER_NAME=pc-echo-server

# Our server picks its own port (--port 0) and says which once it listens.
# stdbuf keeps that line from sitting in a stdio buffer when stdout is a file.
STDBUF=()
command -v stdbuf >/dev/null && STDBUF=(stdbuf -oL)
server_start "$WORK/echo.out" "$WORK/echo.err" \
	"${SERVER_CPU[@]}" "${STDBUF[@]}" "$ECHO_BIN" --port 0 --threads "$ECHO_THREADS"
ECHO_PORT=
echo_port_read() {
	ECHO_PORT=$(sed -nE 's/^listening [^ ]*:([0-9]+).*/\1/p' "$WORK/echo.out" | head -n1)
	[[ -n $ECHO_PORT ]]
}
rc=0
poll_until "$SERVER_PID" 100 echo_port_read || rc=$?
case $rc in
1) die "pc-echo-server printed no 'listening <host>:<port>' line within 10 s" ;;
2)
	cat "$WORK/echo.err" >&2 || true
	die "pc-echo-server exited before listening"
	;;
esac
log "pc-echo-server pid $SERVER_PID on $HOST:$ECHO_PORT (threads $ECHO_THREADS)"

redis_start
log "redis-server pid $REDIS_PID on $HOST:$REDIS_PORT ($(redis-server --version | awk '{print $3}'))"

# ---------------------------------------------------------------- runs ----

# run_loadgen label port reply_bytes conns run
run_loadgen() {
	local label=$1 port=$2 reply=$3 conns=$4 run=$5
	loadgen_json "$label" "$RUNDIR/$label-c$conns-r$run.json" "$port" "$conns" \
		"$PIPELINE" --request 'PING\r\n' --reply-bytes "$reply" ||
		die "pc-loadgen against $label ($HOST:$port, $conns conns, run $run) failed"
}

# run_redis_benchmark conns run requests
run_redis_benchmark() {
	local conns=$1 run=$2 n=$3
	local out=$RUNDIR/redis-benchmark-c$conns-r$run.csv
	redis_benchmark_csv "$out" -c "$conns" -n "$n" -t ping_inline -q --csv ||
		die "redis-benchmark ($conns conns, run $run) failed"
	local rps
	rps=$(awk -F'","' '/^"PING_INLINE"/ { print $2 }' "$out")
	[[ -n $rps ]] || { cat "$out" >&2; die "no PING_INLINE row in redis-benchmark output"; }
	printf '%s\n' "$rps" >"$RUNDIR/redis-benchmark-c$conns-r$run.rps"
	log "  redis-benchmark: $rps rps (-n $n)"
}

runs_start
for conns in $CONNS; do
	rb_rate=
	for ((run = 1; run <= RUNS; run++)); do
		log "conns $conns, run $run of $RUNS"
		# Alternate who goes first so a drift within a pair does not always
		# favour the same side.
		if ((run % 2)); then
			run_loadgen echo "$ECHO_PORT" 6 "$conns" "$run"
			run_loadgen redis "$REDIS_PORT" 7 "$conns" "$run"
		else
			run_loadgen redis "$REDIS_PORT" 7 "$conns" "$run"
			run_loadgen echo "$ECHO_PORT" 6 "$conns" "$run"
		fi
		# Size -n so redis-benchmark runs about DURATION seconds: from its
		# own last rate, or at first from pc-loadgen's rate against redis.
		[[ -n $rb_rate ]] || rb_rate=$(json_num "$RUNDIR/redis-c$conns-r$run.json" ops_per_s)
		run_redis_benchmark "$conns" "$run" "$(requests_for "$rb_rate")"
		rb_rate=$(cat "$RUNDIR/redis-benchmark-c$conns-r$run.rps")
	done
done
runs_end

# ------------------------------------------------------------- summary ----

results_prepare echo
EB_PIPELINE=$PIPELINE EB_ECHO_THREADS=$ECHO_THREADS bench_python <<'PYEOF'
def bench(c, r):
    rows = rb_rows(f"redis-benchmark-c{c}-r{r}.csv")
    return rb_figures(next(x for x in rows if x.get("test") == "PING_INLINE"))

summary, raw = [], []
for c in conns_list:
    e = [run_json(f"echo-c{c}-r{r}.json") for r in range(1, runs + 1)]
    d = [run_json(f"redis-c{c}-r{r}.json") for r in range(1, runs + 1)]
    b = [bench(c, r) for r in range(1, runs + 1)]
    raw.append({"conns": c, "echo": e, "redis": d, "redis_benchmark": b})
    summary.append({
        "conns": c,
        "echo": {k: med(e, k) for k in ("ops_per_s", "p50_us", "p99_us")},
        "redis": {k: med(d, k) for k in ("ops_per_s", "p50_us", "p99_us")},
        "redis_benchmark": {k: med(b, k) for k in ("rps", "p50_us", "p99_us")},
        "ratio_echo_over_redis": paired(e, d, "ops_per_s"),
        "ratio_echo_over_redis_benchmark": paired(e, b, "rps"),
    })

write_json({
    **doc_head("echo"),
    "params": {"conns": conns_list, "runs": runs, "duration_s": duration,
               "warmup_s": float(env["BENCH_WARMUP"]),
               "loadgen_threads": int(env["BENCH_LOADGEN_THREADS"]),
               "pipeline": int(env["EB_PIPELINE"]),
               "echo_threads": int(env["EB_ECHO_THREADS"]),
               "pinned": env["BENCH_PIN"] == "1",
               "request": "PING\\r\\n", "echo_reply_bytes": 6,
               "redis_reply_bytes": 7},
    "summary": summary,
    "runs": raw,
})

print(f"### Echo round trip: pc-echo-server vs redis-server (PING), "
      f"median of {runs} interleaved runs, {duration:g} s each\n")
print("| conns | echo ops/s | redis ops/s | echo/redis (min-max) "
      "| redis-benchmark rps | echo/redis-benchmark (min-max) "
      "| echo p50/p99 us | redis p50/p99 us | redis-benchmark p50/p99 us |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for s in summary:
    e, d, b = s["echo"], s["redis"], s["redis_benchmark"]
    print(f"| {s['conns']} | {f0(e['ops_per_s'])} | {f0(d['ops_per_s'])} "
          f"| {rr(s['ratio_echo_over_redis'])} | {f0(b['rps'])} "
          f"| {rr(s['ratio_echo_over_redis_benchmark'])} "
          f"| {f1(e['p50_us'])} / {f1(e['p99_us'])} "
          f"| {f1(d['p50_us'])} / {f1(d['p99_us'])} "
          f"| {f1(b['p50_us'])} / {f1(b['p99_us'])} |")
print(f"\nRatios are paired per run (run i of echo over run i of redis, "
      f"median and min-max over {runs} pairs); above 1 means our echo server "
      f"completed more round trips. pc-loadgen {env['BENCH_LOADGEN_THREADS']} "
      f"thread(s), pipeline {env['EB_PIPELINE']}; load average "
      f"{loadavg_span()}.")
print(f"Results: {out_path}")
PYEOF
