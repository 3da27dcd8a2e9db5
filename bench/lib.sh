# shellcheck shell=bash disable=SC2034,SC2153  # variables shared with the sourcing script
# bench/lib.sh — what the bench scripts (echo_bench.sh, rpc_bench.sh,
# metrics_bench.sh, ...) share, and the base-revision build of the benches
# that compare with one (bench_base_build).
# Sourced, never run: set BENCH_NAME (the prefix of every message) and
# `set -euo pipefail` first, then `. bench/lib.sh`.
#
# Owns, for the sourcing script: the defaults of the knobs every bench has
# (PEERCACHE_BUILD_DIR, RUNS, DURATION, WARMUP, LOADGEN_THREADS, PIN,
# RESULTS_DIR, PC_LOADGEN); the scratch directory $WORK (runs in $RUNDIR),
# removed on exit; and the servers a bench starts, those under test (each
# started by server_start, the latest in SERVER_PID) and redis-server
# (REDIS_PID, started by redis_start), all stopped by PID when the script
# exits, however it exits. Single-threaded like any shell script; the
# servers run as its background jobs, so `wait` can reap them.
#
# Invariants: only 127.0.0.1 ($HOST) is ever contacted; every wait on a
# server is bounded (10 s for it to listen, 5 s for it to stop); a server's
# log files exist before the server starts, so a poll never reads a file the
# child has not created yet; values reach Python through the environment,
# never pasted into its source.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${PEERCACHE_BUILD_DIR:-$REPO/build}
RUNS=${RUNS:-5}
DURATION=${DURATION:-3}
WARMUP=${WARMUP:-1}
LOADGEN_THREADS=${LOADGEN_THREADS:-1}
PIN=${PIN:-0}
RESULTS_DIR=${RESULTS_DIR:-$BUILD/bench-results}
LOADGEN_BIN=${PC_LOADGEN:-$BUILD/bench/pc-loadgen}
# Debian's interpreter on purpose: the first python3 on PATH may be a pyenv
# shim with a different version and no guarantee it exists on CI.
PY=/usr/bin/python3
HOST=127.0.0.1

log() { printf '%s: %s\n' "$BENCH_NAME" "$*" >&2; }
die() { printf '%s: error: %s\n' "$BENCH_NAME" "$*" >&2; exit 1; }

# ----------------------------------------------------------- checks ----

# need_count NAME VALUE: a positive decimal integer, or stop here.
need_count() {
	if ! [[ $2 =~ ^[0-9]+$ ]] || ((10#$2 < 1)); then
		die "$1 must be a positive integer, got '$2'"
	fi
}

# need_counts NAME: the variable NAME is a non-empty list of positive integers.
need_counts() {
	local n
	for n in ${!1}; do need_count "$1" "$n"; done
	[[ -n ${!1// /} ]] || die "$1 is empty"
}

# need_seconds NAME...: each variable is a number of seconds.
need_seconds() {
	local v
	for v in "$@"; do
		[[ ${!v} =~ ^[0-9]+([.][0-9]+)?$ ]] || die "$v must be a number of seconds, got '${!v}'"
	done
}

need_python() { [[ -x $PY ]] || die "$PY not found (Debian package python3)"; }

# need_torch: Debian's Python with torch (the shim's benches).
need_torch() {
	need_python
	"$PY" -c 'import torch' 2>/dev/null ||
		die "torch is missing for $PY (Debian package python3-torch; scripts/deps.sh test installs it)"
}

# size_bytes SIZE LO HI: SIZE (a count with suffix k or m, binary units) in
# bytes, or stop here if it is not one or is outside LO..HI bytes. Messages
# name it as an entry of SIZES.
size_bytes() {
	[[ $1 =~ ^([0-9]+)([kKmM]?)$ ]] || die "SIZES: '$1' is not a size like 64k or 1m"
	local n=$((10#${BASH_REMATCH[1]}))
	case ${BASH_REMATCH[2]} in
	k | K) n=$((n << 10)) ;;
	m | M) n=$((n << 20)) ;;
	esac
	((n >= $2 && n <= $3)) || die "SIZES: '$1' is not within $2 .. $3 bytes"
	echo "$n"
}

# ------------------------------------------------------------ tools ----

# Installs redis-server, redis-benchmark and redis-cli with apt-get if any is
# missing (as root only).
bench_need_redis() {
	local need_pkgs=()
	command -v redis-server >/dev/null || need_pkgs+=(redis-server)
	command -v redis-benchmark >/dev/null || need_pkgs+=(redis-tools)
	command -v redis-cli >/dev/null || need_pkgs+=(redis-tools)
	((${#need_pkgs[@]})) || return 0
	mapfile -t need_pkgs < <(printf '%s\n' "${need_pkgs[@]}" | sort -u)
	log "installing ${need_pkgs[*]}"
	((EUID == 0)) || die "need root to install ${need_pkgs[*]} (or install them yourself)"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need_pkgs[@]}" >&2
}

# bench_build WHY [HINT]: configures and builds the project into $BUILD
# (Release), saying WHY first; a failure stops here, with HINT if given.
bench_build() {
	local hint=${2:+ ($2)}
	log "$1; building into $BUILD"
	cmake -S "$REPO" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >&2 || die "cmake configure failed$hint"
	cmake --build "$BUILD" -j2 >&2 || die "build failed$hint"
}

# bench_base_build REV [CMAKE_ARG...]: sets BASE_BUILD to a RelWithDebInfo
# build tree of revision REV of this repository, $BUILD/bench-base-REV/build,
# building it first if its peercached is missing: REV is checked out into a
# detached git worktree (needs the repository's history), built with
# PEERCACHE_BUILD_TESTS=OFF plus CMAKE_ARGs, and the worktree removed again.
# An existing BASE_BUILD is kept as it is. For the benches that compare this
# tree with a base revision (local_bench.sh, hardening_bench.sh).
bench_base_build() {
	local rev=$1
	shift
	[[ -n ${BASE_BUILD:-} ]] && return 0
	local src=$BUILD/bench-base-$rev/src
	BASE_BUILD=$BUILD/bench-base-$rev/build
	[[ -x $BASE_BUILD/server/peercached ]] && return 0
	log "building base revision $rev in $BASE_BUILD"
	rm -rf "$src"
	git -C "$REPO" worktree add --detach -f "$src" "$rev" >/dev/null 2>&1 ||
		die "cannot check out revision $rev (is the history there?)"
	"$src/scripts/build.sh" "$BASE_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
		-DPEERCACHE_BUILD_TESTS=OFF "$@" >&2 || {
		git -C "$REPO" worktree remove --force "$src"
		die "building revision $rev failed"
	}
	git -C "$REPO" worktree remove --force "$src"
}

# loadgen_has_rpc: pc-loadgen exists and has --mode msgpack-rpc (one built
# before that mode cannot drive a node).
loadgen_has_rpc() { [[ -x $LOADGEN_BIN ]] && "$LOADGEN_BIN" --help 2>/dev/null | grep -q msgpack-rpc; }

# How to build pc-loadgen without the rest of the tree, for error messages.
LOADGEN_STANDALONE_HINT="or build pc-loadgen alone: gcc -std=gnu11 -O2 -I$REPO $REPO/bench/loadgen.c $REPO/bench/lg_opts.c $REPO/bench/lg_proto.c $REPO/bench/lg_msgpack.c $REPO/bench/lg_hist.c -o /tmp/pc-loadgen -lpthread -lm, then PC_LOADGEN=/tmp/pc-loadgen"

# bench_need_rpc_tools [NODE_BIN]: pc-loadgen with --mode msgpack-rpc and, if
# given, the node binary NODE_BIN; builds the tree (bench_build) only if one
# of them is missing, and stops here if it still is.
bench_need_rpc_tools() {
	local node=${1:-}
	if ! loadgen_has_rpc || [[ -n $node && ! -x $node ]]; then
		bench_build "pc-loadgen (with msgpack-rpc) or peercached missing" "$LOADGEN_STANDALONE_HINT"
	fi
	loadgen_has_rpc || die "$LOADGEN_BIN missing or without --mode msgpack-rpc ($LOADGEN_STANDALONE_HINT)"
	[[ -z $node || -x $node ]] || die "$node not found after building"
}

# Sets SERVER_CPU and CLIENT_CPU, the prefixes that pin servers to CPU 1 and
# clients to CPU 0 when PIN=1 (empty otherwise).
bench_pin() {
	SERVER_CPU=()
	CLIENT_CPU=()
	[[ $PIN == 1 ]] || return 0
	command -v taskset >/dev/null || die "PIN=1 needs taskset (util-linux)"
	(($(nproc) >= 2)) || die "PIN=1 needs at least 2 CPUs"
	SERVER_CPU=(taskset -c 1)
	CLIENT_CPU=(taskset -c 0)
}

# ---------------------------------------------------------- servers ----

SERVER_PID=     # the server under test server_start started last
SERVER_NAME=server  # what messages call the next server started
SERVER_GROUP=   # non-empty: the next server leads a process group; stop all of it
# Every server server_start started, with SERVER_NAME and SERVER_GROUP as they
# were then: the exit trap stops them all, in the order they started.
SERVER_PIDS=()
SERVER_NAMES=()
SERVER_GROUPS=()
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

bench_cleanup() {
	local rc=$? i
	for i in "${!SERVER_PIDS[@]}"; do
		stop_pid "${SERVER_PIDS[i]}" "${SERVER_NAMES[i]}" ${SERVER_GROUPS[i]:+group}
	done
	stop_pid "$REDIS_PID" redis-server
	rm -rf "$WORK"
	exit "$rc"
}

# Creates $WORK and $RUNDIR and arms the exit trap that stops the servers.
bench_workdir() {
	WORK=$(mktemp -d "/tmp/$BENCH_NAME.XXXXXX")
	trap bench_cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	RUNDIR=$WORK/runs
	mkdir -p "$RUNDIR"
}

# server_start OUT ERR CMD...: runs CMD in the background, stdout into OUT
# and stderr into ERR, as a server under test (SERVER_PID, and stopped on
# exit as SERVER_NAME). CMD must exec the server, so that the PID is the
# server's. OUT and ERR are created before CMD starts: a poll may read them
# before the child has got as far as its redirections.
server_start() {
	local out=$1 err=$2
	shift 2
	: >"$out"
	: >"$err"
	"$@" >"$out" 2>"$err" &
	SERVER_PID=$!
	SERVER_PIDS+=("$SERVER_PID")
	SERVER_NAMES+=("$SERVER_NAME")
	SERVER_GROUPS+=("$SERVER_GROUP")
}

# server_log_tail FILE...: the last lines of a server's logs on stderr, to
# stand next to the error they explain.
server_log_tail() { tail -n 15 "$@" >&2 2>/dev/null || true; }

# poll_until PID TRIES PROBE...: runs PROBE every 0.1 s, at most TRIES times,
# until it succeeds (0). Returns 1 if it never did, 2 as soon as PID is gone.
poll_until() {
	local pid=$1 tries=$2 i
	shift 2
	for ((i = 0; i < tries; i++)); do
		kill -0 "$pid" 2>/dev/null || return 2
		"$@" && return 0
		sleep 0.1
	done
	return 1
}

# A peercached node (or a stand-in) started with --rpc-port 0 logs the port
# it got at info level as "listening: rpc on <host>:<port>", on stderr (a
# stand-in may use stdout). Other endpoints are logged the same way:
# "listening: metrics on <host>:<port>".

# node_listen_addr NAME OUT ERR: the address the node logging into OUT and ERR
# announced for endpoint NAME (rpc, metrics, ...), or nothing if not (yet).
node_listen_addr() {
	sed -nE "s/.*listening: $1 on ([^ ]+:[0-9]+).*/\1/p" "$3" "$2" | head -n1 || true
}

# rpc_port_read LABEL OUT ERR [HINT]: succeeds once the node has logged its RPC
# address, setting RPC_PORT. Stops here if that address is not $HOST (no
# traffic goes elsewhere) or if the node logged "listening on nothing" (a
# build without the RPC server; HINT, if given, says what to do).
rpc_port_read() {
	local addr
	addr=$(node_listen_addr rpc "$2" "$3")
	if [[ -n $addr ]]; then
		[[ ${addr%:*} == "$HOST" ]] || die "$1 listens on $addr, not on $HOST; refusing to send traffic there"
		RPC_PORT=${addr##*:}
		return 0
	fi
	if grep -q 'listening on nothing' "$3" "$2"; then
		server_log_tail "$3" "$2"
		die "$1 logged 'listening on nothing': no RPC server in this build${4:+; $4}"
	fi
	return 1
}

# rpc_port_wait LABEL OUT ERR [HINT]: waits up to 10 s for the server started
# last (SERVER_PID), logging into OUT and ERR, to log its RPC address on
# $HOST, and sets RPC_PORT; stops here with the server's last log lines if
# it exits first or logs no such line. LABEL names it in messages.
RPC_PORT=
rpc_port_wait() {
	local rc=0
	RPC_PORT=
	poll_until "$SERVER_PID" 100 rpc_port_read "$@" || rc=$?
	((rc == 0)) && return 0
	server_log_tail "$3" "$2"
	((rc == 2)) && die "$1 exited before listening"
	die "$1 logged no 'listening: rpc on $HOST:<port>' line within 10 s"
}

# redis-server cannot take port 0, so ask the kernel for a free port and hand
# it over; another process may grab it in between, hence the retries.
free_port() {
	"$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

redis_pong() { [[ $(redis-cli -h "$HOST" -p "$1" ping 2>/dev/null) == PONG ]]; }

# redis_start [ARG...]: starts a private redis-server on a free loopback
# port, no persistence, with ARG... (e.g. --maxmemory), and waits until it
# answers PING: sets REDIS_PID and REDIS_PORT, or stops here.
redis_start() {
	local attempt port
	REDIS_PORT=
	for attempt in 1 2 3; do
		port=$(free_port)
		"${SERVER_CPU[@]}" redis-server --save "" --appendonly no --bind "$HOST" \
			--port "$port" --daemonize no "$@" >"$WORK/redis.log" 2>&1 &
		REDIS_PID=$!
		if poll_until "$REDIS_PID" 50 redis_pong "$port"; then
			REDIS_PORT=$port
			return 0
		fi
		log "redis-server did not come up on port $port (attempt $attempt):"
		tail -n 5 "$WORK/redis.log" >&2 || true
		stop_pid "$REDIS_PID" redis-server
		REDIS_PID=
	done
	die "could not start redis-server"
}

# ------------------------------------------------------------- runs ----

json_num() { # file field -> number
	sed -nE "s/.*\"$2\":([0-9.eE+-]+).*/\1/p" "$1"
}

# loadgen_json LABEL OUT PORT CONNS PIPELINE ARG...: one pc-loadgen run against
# $HOST:PORT with the common knobs and ARG..., its JSON into OUT (which ends
# in .json) and its stderr next to it. Logs the figures; on failure shows
# the client's stderr and returns 1.
loadgen_json() {
	local label=$1 out=$2 port=$3 conns=$4 pl=$5
	local err=${out%.json}.err
	shift 5
	if ! "${CLIENT_CPU[@]}" "$LOADGEN_BIN" --host "$HOST" --port "$port" \
		--conns "$conns" --threads "$LOADGEN_THREADS" --pipeline "$pl" \
		--duration "$DURATION" --warmup "$WARMUP" "$@" --json \
		>"$out" 2>"$err"; then
		cat "$err" >&2
		return 1
	fi
	log "  $label: $(json_num "$out" ops_per_s) ops/s, p50 $(json_num "$out" p50_us) us, p99 $(json_num "$out" p99_us) us"
}

# redis_benchmark_csv OUT ARG...: redis-benchmark against our redis with
# ARG..., its CSV into OUT. On failure shows what it said and returns 1.
redis_benchmark_csv() {
	local out=$1 limit
	shift
	# Its own limit: a hung server would otherwise hold it forever.
	limit=$(awk -v d="$DURATION" 'BEGIN { printf "%d", d * 10 + 30 }')
	if ! timeout "$limit" "${CLIENT_CPU[@]}" redis-benchmark -h "$HOST" -p "$REDIS_PORT" \
		"$@" >"$out" 2>"$RUNDIR/rb.err"; then
		cat "$RUNDIR/rb.err" "$out" >&2 || true
		return 1
	fi
}

# requests_for rate: -n that makes redis-benchmark run about DURATION seconds
requests_for() {
	awk -v r="$1" -v d="$DURATION" 'BEGIN {
		n = int(r * d); if (n < 10000) n = 10000; if (n > 20000000) n = 20000000; print n }'
}

# Around the runs: the UTC timestamp that names the results, and the load
# average before and after, so a surprising figure can be checked against
# the conditions it was measured in.
runs_start() {
	START_TS=$(date -u +%Y%m%dT%H%M%SZ)
	LOADAVG_START=$(cut -d' ' -f1-3 /proc/loadavg)
}
runs_end() { LOADAVG_END=$(cut -d' ' -f1-3 /proc/loadavg); }

# ---------------------------------------------------------- summary ----

# results_prepare NAME: RESULT_JSON=$RESULTS_DIR/NAME-<START_TS>.json (the
# directory created) and GIT_REV, the revision the figures belong to.
results_prepare() {
	mkdir -p "$RESULTS_DIR"
	RESULT_JSON=$RESULTS_DIR/$1-$START_TS.json
	GIT_REV=$(git -C "$REPO" describe --always --dirty 2>/dev/null || echo unknown)
}

# bench_python: runs the Python program on stdin, after bench_python_lib,
# with sys.argv[1:] = RUNDIR RESULT_JSON. The common knobs reach it as
# BENCH_* variables; a script passes its own in the environment too.
bench_python() {
	{ bench_python_lib; cat; } |
		BENCH_CONNS=$CONNS BENCH_RUNS=$RUNS BENCH_DURATION=$DURATION \
		BENCH_WARMUP=$WARMUP BENCH_LOADGEN_THREADS=$LOADGEN_THREADS BENCH_PIN=$PIN \
		BENCH_TS=$START_TS BENCH_GIT_REV=$GIT_REV \
		BENCH_LOADAVG_START=$LOADAVG_START BENCH_LOADAVG_END=$LOADAVG_END \
		"$PY" - "$RUNDIR" "$RESULT_JSON"
}

# The Python every summary starts with: reading the runs, medians, paired
# ratios, the JSON document's common head, and number formats.
bench_python_lib() {
	cat <<'PYEOF'
import csv, json, os, statistics, sys

rundir, out_path = sys.argv[1], sys.argv[2]
env = os.environ
conns_list = [int(c) for c in env["BENCH_CONNS"].split()]
runs = int(env["BENCH_RUNS"])
duration = float(env["BENCH_DURATION"])

def run_json(name):
    """One pc-loadgen --json result from the run directory."""
    with open(os.path.join(rundir, name)) as f:
        return json.loads(f.read())

def rb_rows(name):
    """The rows of one redis-benchmark --csv output."""
    with open(os.path.join(rundir, name)) as f:
        return list(csv.DictReader(f))

def rb_figures(row):
    """rps and the latencies (in us) of one redis-benchmark CSV row."""
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

def paired(xs, ys, key):
    """Run i of xs (ops_per_s) over run i of ys (key): neighbours in time."""
    return spread([x["ops_per_s"] / y[key] for x, y in zip(xs, ys)])

def doc_head(bench):
    return {
        "bench": bench,
        "timestamp": env["BENCH_TS"],
        "git_rev": env["BENCH_GIT_REV"],
        "host": {"kernel": os.uname().release, "cpus": os.cpu_count(),
                 "loadavg_start": env["BENCH_LOADAVG_START"],
                 "loadavg_end": env["BENCH_LOADAVG_END"]},
    }

def params_head():
    """The knobs every bench records under "params"; a script adds its own."""
    return {"conns": conns_list, "runs": runs, "duration_s": duration,
            "warmup_s": float(env["BENCH_WARMUP"]),
            "loadgen_threads": int(env["BENCH_LOADGEN_THREADS"]),
            "pinned": env["BENCH_PIN"] == "1"}

def write_json(doc):
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")

def f0(x): return "n/a" if x is None else f"{x:,.0f}"
def f1(x): return "n/a" if x is None else f"{x:.1f}"
def rr(s): return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"

def loadavg_span():
    return (f"{env['BENCH_LOADAVG_START'].split()[0]} -> "
            f"{env['BENCH_LOADAVG_END'].split()[0]}")
PYEOF
}

# ------------------------------------------- more servers (p2p_bench) ----

# Installs memcached with apt-get if it is missing (as root only).
bench_need_memcached() {
	command -v memcached >/dev/null && return 0
	log "installing memcached"
	((EUID == 0)) || die "need root to install memcached (or install it yourself)"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends memcached >&2
}

# server_stop PID: stops a server server_start started, before the script
# exits (e.g. between rounds that need fresh servers), and forgets it, so
# the exit trap never signals a PID that may have been reused since.
server_stop() {
	local i
	for i in "${!SERVER_PIDS[@]}"; do
		[[ ${SERVER_PIDS[i]} == "$1" ]] || continue
		stop_pid "$1" "${SERVER_NAMES[i]}" ${SERVER_GROUPS[i]:+group}
		SERVER_PIDS[i]=
	done
}

# redis_stop: stops the redis-server redis_start started, and forgets it.
redis_stop() {
	stop_pid "$REDIS_PID" redis-server
	REDIS_PID=
}

# listen_port_wait NAME LABEL OUT ERR: like rpc_port_wait, for any endpoint a
# server logs as "listening: NAME on <host>:<port>": waits up to 10 s for
# the server started last (SERVER_PID) and sets LISTEN_PORT; stops here if
# it exits first, logs no such line, or names a host other than $HOST.
LISTEN_PORT=
listen_port_read() {
	local addr
	addr=$(node_listen_addr "$1" "$3" "$4")
	[[ -n $addr ]] || return 1
	[[ ${addr%:*} == "$HOST" ]] || die "$2 listens on $addr, not on $HOST; refusing to send traffic there"
	LISTEN_PORT=${addr##*:}
}
listen_port_wait() {
	local rc=0
	LISTEN_PORT=
	poll_until "$SERVER_PID" 100 listen_port_read "$@" || rc=$?
	((rc == 0)) && return 0
	server_log_tail "$4" "$3"
	((rc == 2)) && die "$2 exited before listening"
	die "$2 logged no 'listening: $1 on $HOST:<port>' line within 10 s"
}

# memcached_version_ok PORT: memcached on $HOST:PORT answers "version".
memcached_version_ok() {
	( exec 3<>"/dev/tcp/$HOST/$1" && printf 'version\r\n' >&3 &&
		IFS= read -r -t 2 line <&3 && [[ $line == VERSION* ]] ) 2>/dev/null
}

# memcached_start ARG...: a private memcached on a free loopback port (TCP
# only, no UDP) with ARG... (e.g. -m, -I, -t), started as a server under
# test (stopped on exit, or by server_stop) with its output in
# $WORK/memcached.{out,log}; waits until it answers. Sets MEMCACHED_PID and
# MEMCACHED_PORT, or stops here.
memcached_start() {
	local attempt port user=()
	MEMCACHED_PORT=
	((EUID == 0)) && user=(-u root) # memcached refuses root without -u
	for attempt in 1 2 3; do
		port=$(free_port)
		SERVER_NAME=memcached
		server_start "$WORK/memcached.out" "$WORK/memcached.log" \
			"${SERVER_CPU[@]}" memcached "${user[@]}" -l "$HOST" -p "$port" -U 0 "$@"
		MEMCACHED_PID=$SERVER_PID
		if poll_until "$MEMCACHED_PID" 50 memcached_version_ok "$port"; then
			MEMCACHED_PORT=$port
			return 0
		fi
		log "memcached did not come up on port $port (attempt $attempt):"
		tail -n 5 "$WORK/memcached.log" "$WORK/memcached.out" >&2 || true
		server_stop "$MEMCACHED_PID"
	done
	die "could not start memcached"
}
