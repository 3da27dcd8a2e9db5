#!/usr/bin/python3
"""bench/discovery_scale.py — embedded discovery at scale (issue 13, item 7):
N real peercached processes on 127.0.0.1, discovery on, node 0 the head,
cluster_secret set; per N, how long until every node follows one membership
after the start, after a kill -9 and after a join, what membership traffic
costs per node and per master, and what the directory and the ring look like
with N owners.

Run through bench/discovery_scale.sh (checks the knobs and the machine's
limits, builds what is missing); the knobs come from the environment
(defaults in brackets): SIZES ["3 10 30 100"], RUNS [3] (rounds per size,
each on fresh nodes), RUNS_LARGE [1] (rounds for sizes >= 50), POOL [16mb],
KEYS [20000] values of VALUE [512] bytes (at most
KEYS_PER_NODE [2000] per node, so no pool evicts: a value takes at least a
4 KiB pool page), STAGGER_MS [50] between starts,
RATE_S [10] seconds of traffic measured, CONVERGE_TIMEOUT [180] seconds.

Every node: --threads 1, --pool-size POOL without prefault, distinct
rpc/meta ports, --discovery-addr <head meta> (the head's own meta address
on node 0, so it is its own head), --cluster-secret, default
heartbeat_interval (500 ms), member_ttl (2 s), max_masters (3),
directory_replicas (2).

One round, for one N:
  start     the N nodes are spawned STAGGER_MS apart; "converged" is the
            first poll in which every node's discovery.view (its unix
            socket) lists the N expected ids with one table epoch from one
            master. Times from the first spawn and from the last.
  traffic   1 s after that, every node's peercache_discovery_sent_bytes_total
            and _received_bytes_total are read, again RATE_S later: bytes/s
            per node (sent + received), by role in the view (head, the other
            masters, plain members), and the CPU time of each node's
            discovery thread (/proc, % of one core) over the same window.
            The discovery thread's reactor carries nothing else, so this is
            all of membership: heartbeats, member list pulls and their
            answers, handshakes, TCP payload only.
  keys      min(KEYS, N x KEYS_PER_NODE) values written with kv.set, key i
            on node i % N (none is evicted: a pool's records would go); then the
            directory: records per node (peercache_directory_records),
            bytes per record (growth of peercache_directory_bytes summed
            over the nodes / growth of the records), and the ring load:
            max / mean of the records per node (each record is on the
            directory_replicas owners of its key; K·R/N per node ideally;
            with few records per node the max includes sampling noise of
            about 3/sqrt(K·R/N)).
  kill      a plain member (the last node) gets SIGKILL; converged when every
            other node's view lists the N-1 others, one epoch, one master.
  join      a new node is spawned; converged when every node (N again)
            lists all of them with one epoch, one master. Timed from the
            spawn (includes the process start, ~0.1-0.3 s).
The convergence times have the resolution of one polling pass over every
node (given as poll_s; about 1-3 ms per node).

Prints a markdown table (median (min-max) over the rounds) on stdout,
progress on stderr, everything to RESULTS_DIR/discovery-scale-<UTC>.json.
Only 127.0.0.1 is contacted; every node is stopped by PID (SIGKILL: a
SIGTERM would make hundreds of nodes deregister at once, which is not what
is measured) when its round ends, also on failure.
"""
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "tests", "proc"))
from conftest import BUILD, Node, RpcClient, free_ports, metrics_of  # noqa: E402
import bench_results  # noqa: E402  (this directory: the script's own)

ENV = os.environ
SIZES = [int(x) for x in ENV.get("SIZES", "3 10 30 100").split()]
RUNS = int(ENV.get("RUNS", "3"))
RUNS_LARGE = int(ENV.get("RUNS_LARGE", "1"))
POOL = ENV.get("POOL", "16mb")
KEYS = int(ENV.get("KEYS", "20000"))
VALUE = int(ENV.get("VALUE", "512"))
KEYS_PER_NODE = int(ENV.get("KEYS_PER_NODE", "2000"))
STAGGER_MS = float(ENV.get("STAGGER_MS", "50"))
RATE_S = float(ENV.get("RATE_S", "10"))
CONVERGE_TIMEOUT = float(ENV.get("CONVERGE_TIMEOUT", "180"))
RESULTS_DIR = ENV.get("RESULTS_DIR", os.path.join(BUILD, "bench-results"))
SECRET = "discovery-scale-bench"
SET_BATCH = 500
M_SENT = "peercache_discovery_sent_bytes_total"
M_RECV = "peercache_discovery_received_bytes_total"
M_RECORDS = "peercache_directory_records"
M_DIRBYTES = "peercache_directory_bytes"


def log(msg):
    print("discovery_scale: " + msg, file=sys.stderr, flush=True)


def addr(port):
    return "127.0.0.1:%d" % port


def spawn(tmp, i, rpc, meta, head_meta):
    d = tempfile.mkdtemp(prefix="n%d-" % i, dir=tmp)
    return Node(["--rpc-port", str(rpc), "--meta-port", str(meta),
                 "--discovery-addr", addr(head_meta),
                 "--cluster-secret", SECRET,
                 "--data-port", "0", "--metrics-port", "0", "--threads", "1",
                 "--pool-size", POOL, "--pool-prefault", "false",
                 "--socket", os.path.join(d, "s.sock")], tmpdir=d)


def view(node):
    """The node's discovery.view, or None (not up yet, or an error)."""
    try:
        c = RpcClient(os.path.join(node.tmpdir, "s.sock"), timeout=5.0)
    except OSError:
        return None
    try:
        err, res = c.call("discovery.view")
    except (OSError, ConnectionError):
        return None
    finally:
        c.close()
    return None if err else res


def converged(nodes, want):
    """One pass: (all agree, views). Agree: every node lists exactly want,
    with one table epoch from one master."""
    vs = []
    for n in nodes:
        v = view(n)
        if v is None or sorted(m["id"] for m in v["members"]) != want:
            return False, None
        vs.append(v)
    return len({(v["epoch"], v["from"]) for v in vs}) == 1, vs


def wait_converged(nodes, want, t0, what):
    passes, last = 0, time.time()
    while time.time() - t0 < CONVERGE_TIMEOUT:
        for n in nodes:
            if n.proc.poll() is not None:
                raise SystemExit("a node exited during %s:\n%s" % (
                    what, n.text()[-3000:]))
        p0 = time.time()
        ok, vs = converged(nodes, want)
        passes += 1
        last = time.time() - p0
        if ok:
            return time.time() - t0, last, vs
        time.sleep(0.02)
    raise SystemExit("%s: no convergence within %.0f s" % (
        what, CONVERGE_TIMEOUT))


def rss_mb(nodes):
    return [n.rss_kb() / 1024.0 for n in nodes if n.proc.poll() is None]


def disc_cpu_s(node):
    """CPU seconds the node's discovery thread ("pc-discovery") used."""
    ticks = os.sysconf("SC_CLK_TCK")
    task = "/proc/%d/task" % node.proc.pid
    for tid in os.listdir(task):
        try:
            with open("%s/%s/stat" % (task, tid)) as f:
                st = f.read()
        except OSError:
            continue
        if st[st.index("(") + 1:st.rindex(")")] == "pc-discovery":
            f = st[st.rindex(")") + 2:].split()
            return (int(f[11]) + int(f[12])) / ticks  # utime + stime
    return 0.0


def traffic(nodes, roles):
    """Bytes/s and discovery-thread CPU per node over RATE_S, by role."""
    def sample():
        out = []
        for n in nodes:
            m = metrics_of(n)
            out.append((time.time(), m[M_SENT] + m[M_RECV], m[M_SENT],
                        m[M_RECV], disc_cpu_s(n)))
        return out
    s0 = sample()
    time.sleep(RATE_S)
    s1 = sample()
    by = {"head": [], "master": [], "member": []}
    for i, (a, b) in enumerate(zip(s0, s1)):
        dt = b[0] - a[0]
        by[roles[i]].append({"total": (b[1] - a[1]) / dt,
                             "sent": (b[2] - a[2]) / dt,
                             "received": (b[3] - a[3]) / dt,
                             "cpu_pct": 100.0 * (b[4] - a[4]) / dt})
    return by


def write_keys(nodes):
    val = b"s" * VALUE
    total = min(KEYS, KEYS_PER_NODE * len(nodes))
    for start in range(0, total, SET_BATCH):
        for ni, n in enumerate(nodes):
            keys = ["sc-%07d" % i for i in range(start, min(total, start + SET_BATCH))
                    if i % len(nodes) == ni]
            if not keys:
                continue
            c = RpcClient(os.path.join(n.tmpdir, "s.sock"), timeout=60.0)
            try:
                err, res = c.call("kv.set", [keys, [val] * len(keys)])
            finally:
                c.close()
            if err:
                raise SystemExit("kv.set on node %d: %r" % (ni, err))


def directory(nodes):
    before = [metrics_of(n) for n in nodes]
    write_keys(nodes)
    # publishes finish asynchronously: wait until the record count settles
    last, stable = None, 0
    while stable < 3:
        time.sleep(0.3)
        after = [metrics_of(n) for n in nodes]
        tot = sum(m[M_RECORDS] for m in after)
        stable = stable + 1 if tot == last else 0
        last = tot
    rec = [a[M_RECORDS] - b[M_RECORDS] for a, b in zip(after, before)]
    byt = sum(a[M_DIRBYTES] - b[M_DIRBYTES] for a, b in zip(after, before))
    mean = statistics.mean(rec)
    return {"records": sum(rec), "records_per_node_mean": mean,
            "records_per_node_max": max(rec),
            "records_per_node_min": min(rec),
            "ring_max_over_mean": max(rec) / mean if mean else None,
            "ring_min_over_mean": min(rec) / mean if mean else None,
            "dir_bytes_per_record": byt / sum(rec) if sum(rec) else None}


def one_round(n, run):
    tmp = tempfile.mkdtemp(prefix="pc-scale-%d-" % n)
    ports = free_ports(2 * (n + 1))
    rpc, meta = ports[:n + 1], ports[n + 1:]
    nodes = []
    out = {"nodes": n, "run": run}
    try:
        log("N=%d run %d: starting %d nodes %.0f ms apart" % (
            n, run, n, STAGGER_MS))
        t0 = time.time()
        for i in range(n):
            nodes.append(spawn(tmp, i, rpc[i], meta[i], meta[0]))
            time.sleep(STAGGER_MS / 1000.0)
        t_last = time.time()
        want = sorted(addr(p) for p in rpc[:n])
        t, poll, vs = wait_converged(nodes, want, t0, "start")
        out["start_s"] = t
        out["start_after_last_spawn_s"] = t - (t_last - t0)
        out["poll_s"] = poll
        out["epoch_after_start"] = vs[0]["epoch"]
        log("N=%d: converged %.2f s after the first spawn (%.2f after the "
            "last), epoch %d" % (n, t, out["start_after_last_spawn_s"],
                                vs[0]["epoch"]))
        role = {m["id"]: m["role"] for m in vs[0]["members"]}
        roles = [role[addr(rpc[i])] for i in range(n)]
        out["masters"] = sum(r != "member" for r in roles)
        time.sleep(1.0)
        tr = traffic(nodes, roles)
        for r, rows in tr.items():
            if rows:
                out["bps_%s" % r] = statistics.median(x["total"] for x in rows)
                out["bps_%s_max" % r] = max(x["total"] for x in rows)
                out["cpu_%s" % r] = statistics.median(x["cpu_pct"]
                                                      for x in rows)
        out["bps_all_median"] = statistics.median(
            x["total"] for rows in tr.values() for x in rows)
        out["traffic"] = tr
        rss = rss_mb(nodes)
        out["rss_mb_median"] = statistics.median(rss)
        out["rss_mb_max"] = max(rss)
        log("N=%d: bytes/s head %.0f, masters %s, members %s (median)" % (
            n, out.get("bps_head", 0), "%.0f" % out["bps_master"]
            if "bps_master" in out else "-", "%.0f" % out["bps_member"]
            if "bps_member" in out else "-"))
        out["keys"] = min(KEYS, KEYS_PER_NODE * n)
        out.update(directory(nodes))
        log("N=%d: %d records, %.1f B/record, ring max/mean %.2f" % (
            n, out["records"], out["dir_bytes_per_record"] or 0,
            out["ring_max_over_mean"] or 0))
        if n >= 2:
            victim = nodes[n - 1]
            t0 = time.time()
            victim.proc.kill()
            victim.proc.wait()
            t, _, vs = wait_converged(nodes[:n - 1], sorted(
                addr(p) for p in rpc[:n - 1]), t0, "kill")
            out["kill_s"] = t
            log("N=%d: kill -9 of a member dropped everywhere after %.2f s"
                % (n, t))
            t0 = time.time()
            nodes.append(spawn(tmp, n, rpc[n], meta[n], meta[0]))
            live = nodes[:n - 1] + [nodes[n]]
            want2 = sorted(addr(p) for p in rpc[:n - 1] + [rpc[n]])
            t, _, vs = wait_converged(live, want2, t0, "join")
            out["join_s"] = t
            log("N=%d: a new node seen everywhere %.2f s after its spawn"
                % (n, t))
    finally:
        for nd in nodes:
            if nd.proc.poll() is None:
                nd.proc.kill()
                nd.proc.wait()
            nd.log.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


FIELDS = [  # (key, label, format)
    ("start_s", "converge after start, s from the first spawn", "%.2f"),
    ("start_after_last_spawn_s", "  s from the last spawn", "%.2f"),
    ("kill_s", "converge after kill -9 of a member, s", "%.2f"),
    ("join_s", "converge after a join, s from its spawn", "%.2f"),
    ("poll_s", "  one polling pass over every node, s", "%.3f"),
    ("bps_head", "membership bytes/s, head", "%.0f"),
    ("bps_master", "membership bytes/s, other masters (median)", "%.0f"),
    ("bps_member", "membership bytes/s, plain member (median)", "%.0f"),
    ("bps_member_max", "  plain member, max", "%.0f"),
    ("keys", "keys written (K)", "%.0f"),
    ("cpu_head", "discovery thread CPU %, head", "%.1f"),
    ("cpu_master", "  other masters (median)", "%.1f"),
    ("cpu_member", "  plain member (median)", "%.1f"),
    ("dir_bytes_per_record", "directory bytes per record", "%.1f"),
    ("records_per_node_mean", "directory records per node, mean", "%.0f"),
    ("ring_max_over_mean", "ring load max / mean (records per node)",
     "%.2f"),
    ("ring_min_over_mean", "ring load min / mean", "%.2f"),
    ("rss_mb_median", "node RSS MiB (median)", "%.1f"),
]


def check_limits():
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    biggest = max(SIZES)
    with open("/proc/meminfo") as f:
        mem = {ln.split(":")[0]: int(ln.split()[1]) for ln in f}
    avail_mb = mem.get("MemAvailable", 0) / 1024.0
    log("limits: %d fds (soft), %.0f MiB available, %d cpus; largest N=%d"
        % (soft, avail_mb, os.cpu_count(), biggest))
    # the head holds a connection per member; this process a few per node
    if soft < 4 * biggest + 64:
        raise SystemExit("ulimit -n %d is too low for %d nodes" % (
            soft, biggest))
    if avail_mb < biggest * 40:
        raise SystemExit("%.0f MiB available: too little for %d nodes "
                         "(~40 MiB each with slack)" % (avail_mb, biggest))


def main():
    if not SIZES or min(SIZES) < 2 or RUNS < 1 or KEYS < 1:
        raise SystemExit("SIZES must be >= 2; RUNS, KEYS >= 1")
    check_limits()
    ts = bench_results.stamp()
    load0 = bench_results.loadavg()
    rounds = []
    for n in SIZES:
        for run in range(1, (RUNS_LARGE if n >= 50 else RUNS) + 1):
            rounds.append(one_round(n, run))
    load1 = bench_results.loadavg()
    summary = {}
    for n in SIZES:
        rows = [r for r in rounds if r["nodes"] == n]
        summary[n] = bench_results.spread(rows, [k for k, _, _ in FIELDS])
        summary[n]["runs"] = len(rows)
    out = bench_results.write(
        RESULTS_DIR, "discovery_scale", "discovery-scale", ts, (load0, load1),
        {"sizes": SIZES, "runs": RUNS, "runs_large": RUNS_LARGE,
         "pool": POOL, "keys": KEYS, "value": VALUE,
         "keys_per_node": KEYS_PER_NODE, "stagger_ms": STAGGER_MS,
         "rate_s": RATE_S, "threads": 1, "heartbeat_interval_ms": 500,
         "member_ttl_ms": 2000, "directory_replicas": 2},
        rounds=rounds, summary=summary)
    print("Discovery at scale, loopback, %d cpus, K=min(%d, N x %d) keys, "
          "R=2; load average %s -> %s" % (os.cpu_count(), KEYS, KEYS_PER_NODE,
                                          load0[0], load1[0]))
    print()
    print("| median (min-max) | " + " | ".join(
        "N=%d (%d run%s)" % (n, summary[n]["runs"],
                             "" if summary[n]["runs"] == 1 else "s")
        for n in SIZES) + " |")
    print("|---" * (len(SIZES) + 1) + "|")
    for k, label, fmt in FIELDS:
        cells = []
        for n in SIZES:
            s = summary[n].get(k)
            if s is None:
                cells.append("n/a")
            elif s["min"] == s["max"]:
                cells.append(fmt % s["median"])
            else:
                cells.append("%s (%s-%s)" % (fmt % s["median"],
                                             fmt % s["min"], fmt % s["max"]))
        print("| %s | %s |" % (label, " | ".join(cells)))
    print()
    print("JSON: " + out)


if __name__ == "__main__":
    main()
