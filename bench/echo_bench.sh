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
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${PEERCACHE_BUILD_DIR:-$REPO/build}
CONNS=${CONNS:-"1 64"}
RUNS=${RUNS:-5}
DURATION=${DURATION:-3}
WARMUP=${WARMUP:-1}
LOADGEN_THREADS=${LOADGEN_THREADS:-1}
PIPELINE=${PIPELINE:-1}
ECHO_THREADS=${ECHO_THREADS:-1}
PIN=${PIN:-0}
RESULTS_DIR=${RESULTS_DIR:-$BUILD/bench-results}
ECHO_BIN=${PC_ECHO_SERVER:-$BUILD/bench/pc-echo-server}
LOADGEN_BIN=${PC_LOADGEN:-$BUILD/bench/pc-loadgen}
# Debian's interpreter on purpose: the first python3 on PATH may be a pyenv
# shim with a different version and no guarantee it exists on CI.
PY=/usr/bin/python3
HOST=127.0.0.1

log() { printf 'echo_bench: %s\n' "$*" >&2; }
die() { printf 'echo_bench: error: %s\n' "$*" >&2; exit 1; }

# need_count NAME VALUE: a positive decimal integer, or stop here.
need_count() {
	if ! [[ $2 =~ ^[0-9]+$ ]] || ((10#$2 < 1)); then
		die "$1 must be a positive integer, got '$2'"
	fi
}
need_count RUNS "$RUNS"
for n in $CONNS; do need_count CONNS "$n"; done
[[ -n ${CONNS// /} ]] || die "CONNS is empty"
for v in LOADGEN_THREADS PIPELINE ECHO_THREADS; do need_count "$v" "${!v}"; done
for v in DURATION WARMUP; do
	[[ ${!v} =~ ^[0-9]+([.][0-9]+)?$ ]] || die "$v must be a number of seconds, got '${!v}'"
done
[[ -x $PY ]] || die "$PY not found (Debian package python3)"

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

if [[ ! -x $ECHO_BIN || ! -x $LOADGEN_BIN ]]; then
	log "pc-echo-server or pc-loadgen missing; building into $BUILD"
	cmake -S "$REPO" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >&2 || die "cmake configure failed"
	cmake --build "$BUILD" -j2 >&2 || die "build failed"
fi
[[ -x $ECHO_BIN ]] || die "$ECHO_BIN not found after building (is the pc-echo-server target in bench/CMakeLists.txt?)"
[[ -x $LOADGEN_BIN ]] || die "$LOADGEN_BIN not found after building (is the pc-loadgen target in bench/CMakeLists.txt?)"

SERVER_CPU=()
CLIENT_CPU=()
if [[ $PIN == 1 ]]; then
	command -v taskset >/dev/null || die "PIN=1 needs taskset (util-linux)"
	(($(nproc) >= 2)) || die "PIN=1 needs at least 2 CPUs"
	SERVER_CPU=(taskset -c 1)
	CLIENT_CPU=(taskset -c 0)
fi

# ------------------------------------------------------------- servers ----

WORK=$(mktemp -d /tmp/echo_bench.XXXXXX)
ECHO_PID=
REDIS_PID=

stop_pid() { # pid name: TERM, then KILL if it lingers past 5 s
	local pid=$1 name=$2 i
	[[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		log "$name (pid $pid) ignored SIGTERM; killing"
		kill -KILL "$pid" 2>/dev/null || true
	fi
	wait "$pid" 2>/dev/null || true
}
cleanup() {
	local rc=$?
	stop_pid "$ECHO_PID" pc-echo-server
	stop_pid "$REDIS_PID" redis-server
	rm -rf "$WORK"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Our server picks its own port (--port 0) and says which once it listens.
# stdbuf keeps that line from sitting in a stdio buffer when stdout is a file.
STDBUF=()
command -v stdbuf >/dev/null && STDBUF=(stdbuf -oL)
"${SERVER_CPU[@]}" "${STDBUF[@]}" "$ECHO_BIN" --port 0 --threads "$ECHO_THREADS" \
	>"$WORK/echo.out" 2>"$WORK/echo.err" &
ECHO_PID=$!
ECHO_PORT=
for ((i = 0; i < 100; i++)); do
	if ! kill -0 "$ECHO_PID" 2>/dev/null; then
		cat "$WORK/echo.err" >&2 || true
		die "pc-echo-server exited before listening"
	fi
	ECHO_PORT=$(sed -nE 's/^listening [^ ]*:([0-9]+).*/\1/p' "$WORK/echo.out" | head -n1)
	[[ -n $ECHO_PORT ]] && break
	sleep 0.1
done
[[ -n $ECHO_PORT ]] || die "pc-echo-server printed no 'listening <host>:<port>' line within 10 s"
log "pc-echo-server pid $ECHO_PID on $HOST:$ECHO_PORT (threads $ECHO_THREADS)"

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
log "redis-server pid $REDIS_PID on $HOST:$REDIS_PORT ($(redis-server --version | awk '{print $3}'))"

# ---------------------------------------------------------------- runs ----

RUNDIR=$WORK/runs
mkdir -p "$RUNDIR"

json_num() { # file field -> number
	sed -nE "s/.*\"$2\":([0-9.eE+-]+).*/\1/p" "$1"
}

# loadgen label port reply_bytes conns run
run_loadgen() {
	local label=$1 port=$2 reply=$3 conns=$4 run=$5
	local out=$RUNDIR/$label-c$conns-r$run.json err=$RUNDIR/$label-c$conns-r$run.err
	if ! "${CLIENT_CPU[@]}" "$LOADGEN_BIN" --host "$HOST" --port "$port" \
		--conns "$conns" --threads "$LOADGEN_THREADS" --pipeline "$PIPELINE" \
		--duration "$DURATION" --warmup "$WARMUP" --request 'PING\r\n' \
		--reply-bytes "$reply" --json >"$out" 2>"$err"; then
		cat "$err" >&2
		die "pc-loadgen against $label ($HOST:$port, $conns conns, run $run) failed"
	fi
	log "  $label: $(json_num "$out" ops_per_s) ops/s, p50 $(json_num "$out" p50_us) us, p99 $(json_num "$out" p99_us) us"
}

# redis-benchmark conns run requests
run_redis_benchmark() {
	local conns=$1 run=$2 n=$3
	local out=$RUNDIR/redis-benchmark-c$conns-r$run.csv
	# Its own limit: a hung server would otherwise hold it forever.
	local limit
	limit=$(awk -v d="$DURATION" 'BEGIN { printf "%d", d * 10 + 30 }')
	if ! timeout "$limit" "${CLIENT_CPU[@]}" redis-benchmark -h "$HOST" -p "$REDIS_PORT" \
		-c "$conns" -n "$n" -t ping_inline -q --csv >"$out" 2>"$RUNDIR/rb.err"; then
		cat "$RUNDIR/rb.err" "$out" >&2 || true
		die "redis-benchmark ($conns conns, run $run) failed"
	fi
	local rps
	rps=$(awk -F'","' '/^"PING_INLINE"/ { print $2 }' "$out")
	[[ -n $rps ]] || { cat "$out" >&2; die "no PING_INLINE row in redis-benchmark output"; }
	printf '%s\n' "$rps" >"$RUNDIR/redis-benchmark-c$conns-r$run.rps"
	log "  redis-benchmark: $rps rps (-n $n)"
}

START_TS=$(date -u +%Y%m%dT%H%M%SZ)
LOADAVG_START=$(cut -d' ' -f1-3 /proc/loadavg)
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
		n=$(awk -v r="$rb_rate" -v d="$DURATION" 'BEGIN {
			n = int(r * d); if (n < 10000) n = 10000; if (n > 20000000) n = 20000000; print n }')
		run_redis_benchmark "$conns" "$run" "$n"
		rb_rate=$(cat "$RUNDIR/redis-benchmark-c$conns-r$run.rps")
	done
done
LOADAVG_END=$(cut -d' ' -f1-3 /proc/loadavg)

# ------------------------------------------------------------- summary ----

mkdir -p "$RESULTS_DIR"
RESULT_JSON=$RESULTS_DIR/echo-$START_TS.json
GIT_REV=$(git -C "$REPO" describe --always --dirty 2>/dev/null || echo unknown)

# Values go to python through the environment, never pasted into its source.
EB_CONNS=$CONNS EB_RUNS=$RUNS EB_DURATION=$DURATION EB_WARMUP=$WARMUP \
EB_LOADGEN_THREADS=$LOADGEN_THREADS EB_PIPELINE=$PIPELINE \
EB_ECHO_THREADS=$ECHO_THREADS EB_PIN=$PIN EB_TS=$START_TS EB_GIT_REV=$GIT_REV \
EB_LOADAVG_START=$LOADAVG_START EB_LOADAVG_END=$LOADAVG_END \
	"$PY" - "$RUNDIR" "$RESULT_JSON" <<'PYEOF'
import csv, json, os, statistics, sys

rundir, out_path = sys.argv[1], sys.argv[2]
env = os.environ
conns_list = [int(c) for c in env["EB_CONNS"].split()]
runs = int(env["EB_RUNS"])
duration = float(env["EB_DURATION"])

def loadgen(label, c, r):
    with open(os.path.join(rundir, f"{label}-c{c}-r{r}.json")) as f:
        return json.loads(f.read())

def bench(c, r):
    with open(os.path.join(rundir, f"redis-benchmark-c{c}-r{r}.csv")) as f:
        rows = list(csv.DictReader(f))
    row = next(x for x in rows if x.get("test") == "PING_INLINE")
    out = {"rps": float(row["rps"])}
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
    e = [loadgen("echo", c, r) for r in range(1, runs + 1)]
    d = [loadgen("redis", c, r) for r in range(1, runs + 1)]
    b = [bench(c, r) for r in range(1, runs + 1)]
    raw.append({"conns": c, "echo": e, "redis": d, "redis_benchmark": b})
    summary.append({
        "conns": c,
        "echo": {k: med(e, k) for k in ("ops_per_s", "p50_us", "p99_us")},
        "redis": {k: med(d, k) for k in ("ops_per_s", "p50_us", "p99_us")},
        "redis_benchmark": {k: med(b, k) for k in ("rps", "p50_us", "p99_us")},
        # Paired: run i of one over run i of the other, neighbours in time.
        "ratio_echo_over_redis":
            spread([x["ops_per_s"] / y["ops_per_s"] for x, y in zip(e, d)]),
        "ratio_echo_over_redis_benchmark":
            spread([x["ops_per_s"] / y["rps"] for x, y in zip(e, b)]),
    })

doc = {
    "bench": "echo",
    "timestamp": env["EB_TS"],
    "git_rev": env["EB_GIT_REV"],
    "host": {"kernel": os.uname().release, "cpus": os.cpu_count(),
             "loadavg_start": env["EB_LOADAVG_START"],
             "loadavg_end": env["EB_LOADAVG_END"]},
    "params": {"conns": conns_list, "runs": runs, "duration_s": duration,
               "warmup_s": float(env["EB_WARMUP"]),
               "loadgen_threads": int(env["EB_LOADGEN_THREADS"]),
               "pipeline": int(env["EB_PIPELINE"]),
               "echo_threads": int(env["EB_ECHO_THREADS"]),
               "pinned": env["EB_PIN"] == "1",
               "request": "PING\\r\\n", "echo_reply_bytes": 6,
               "redis_reply_bytes": 7},
    "summary": summary,
    "runs": raw,
}
with open(out_path, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")

def f0(x): return "n/a" if x is None else f"{x:,.0f}"
def f1(x): return "n/a" if x is None else f"{x:.1f}"
def rr(s): return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"

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
      f"completed more round trips. pc-loadgen {env['EB_LOADGEN_THREADS']} "
      f"thread(s), pipeline {env['EB_PIPELINE']}; load average "
      f"{env['EB_LOADAVG_START'].split()[0]} -> {env['EB_LOADAVG_END'].split()[0]}.")
print(f"Results: {out_path}")
PYEOF
