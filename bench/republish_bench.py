#!/usr/bin/python3
"""bench/republish_bench.py — incremental re-publication (issue 13, item 4):
how many directory records move when one node joins (N -> N+1) and leaves
again (N+1 -> N), against the consistent-hashing ideal, and how long until a
reader's lookups all hit again.

Run through bench/republish_bench.sh (which checks the knobs and builds what
is missing); the knobs come from the environment (defaults in brackets):
NODES [4], KEYS [20000], PAGE [4096 bytes], REPLICAS (directory_replicas)
[2], RUNS [3], POOL [128mb per node], SET_BATCH [256 keys per kv.set],
SWEEP_BATCH [500 keys per kv.exists], CHANGE_TIMEOUT [120 s].

Each run has two rounds, each on fresh nodes (static membership, `--peers`;
membership changes by cluster.set_peers on every member, not discovery, so
the change starts at a known instant and no heartbeat timing is measured):
  node 0 is the reader (produces nothing), nodes 1..N-1 are the producers
  (N=1: node 0 is both); KEYS pages of PAGE bytes are written with kv.set,
  key i by producer 1 + i % (N-1), one thread per producer.
  join:  node N starts with --peers naming all N+1, then cluster.set_peers
         with the N+1 list goes to nodes 0..N-1 (the change starts at the
         first call);
  leave: cluster.set_peers with the first N goes to nodes 0..N-1, then
         node N gets SIGINT (its exit is awaited after the measurement);
  leave (fresh), the second round: N+1 nodes from the start (node N
         produces nothing), the same pages written, then the same leave.
         Unlike the first leave, no owner holds a left-over record from
         an earlier join, so the new owners really lack the records.
After each change, the reader sweeps all KEYS with kv.exists (batches whose
prefix count falls short are counted key by key with kv.get) until one
whole sweep hits every key; "hit 100 %" is the time from the change to the
end of that sweep, so it is never below one sweep's duration (given too).
Then it waits for every member's "placement for epoch E done" log line
(republish walk finished), lets the metrics settle and reads them from every
node:
  moved     sum of peercache_republish_records_total deltas (records of
            producers' pages sent to owners that gained them)
  stored    sum of peercache_republish_stored_total deltas
  dir       sum of peercache_directory_records over the members (records
            held by all directory shards; the ideal is KEYS x R: one per
            owner per key, stale ones removed)
  removed   sum of peercache_directory_moved_away_total deltas (records
            of producers' pages removed from owners that lost them, a
            member_ttl after the move)
  removes   sum of peercache_directory_removes_total deltas (removals
            asked for, of any cause)
Finally one kv.get sweep checks every page's bytes (wrong = 0 expected).

The ideal (consistent hashing, each key owned by the R distinct successors
of its point on a ring of M members, vnodes smoothing the shares):
  join N -> N+1: the new node becomes an owner of a key with probability
    min(R, N+1)/(N+1), and it is then the only owner that lacks the record,
    so ideal moved = KEYS x min(R, N+1)/(N+1) (= K·R/(N+1) for R <= N);
    the owner it displaced (R <= N) should drop its record: ideal removed
    from old owners = KEYS x R/(N+1).
  leave N+1 -> N: the departed node owned min(R, N+1)/(N+1) of the keys;
    with R <= N each of those gains exactly one new owner (the next
    successor), ideal moved = KEYS x R/(N+1); with R > N nobody gains one
    (ideal 0). Its records leave with it.
A producer owns nothing special here: every producer re-publishes only its
own pages, so the sum over producers is what the cluster sends.

Prints a markdown table (min / median / max over RUNS) on stdout, progress
on stderr, everything to RESULTS_DIR/republish-<UTC timestamp>.json. Only
127.0.0.1 is contacted; every node is stopped by PID when a run ends (also on
failure).
"""
import datetime
import hashlib
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "tests", "proc"))
from conftest import BUILD, Node, RpcClient, free_ports, metrics_of  # noqa: E402
import bench_results  # noqa: E402  (this directory: the script's own)

ENV = os.environ
NODES = int(ENV.get("NODES", "4"))
KEYS = int(ENV.get("KEYS", "20000"))
PAGE = int(ENV.get("PAGE", "4096"))
REPLICAS = int(ENV.get("REPLICAS", "2"))
RUNS = int(ENV.get("RUNS", "3"))
POOL = ENV.get("POOL", "128mb")
SET_BATCH = int(ENV.get("SET_BATCH", "256"))
SWEEP_BATCH = int(ENV.get("SWEEP_BATCH", "500"))
CHANGE_TIMEOUT = float(ENV.get("CHANGE_TIMEOUT", "120"))
RESULTS_DIR = ENV.get("RESULTS_DIR", os.path.join(BUILD, "bench-results"))

M_MOVED = "peercache_republish_records_total"
M_STORED = "peercache_republish_stored_total"
M_WALKS = "peercache_republish_walks_total"
M_DIR = "peercache_directory_records"
M_REMOVES = "peercache_directory_removes_total"
M_MOVED_OUT = "peercache_directory_moved_away_total"
M_FALLBACKS = "peercache_directory_fallbacks_total"


def log(msg):
    print("republish_bench: " + msg, file=sys.stderr, flush=True)


def key_of(i):
    return "rp-%06d" % i


def page_of(i):
    seed = hashlib.blake2b(key_of(i).encode(), digest_size=16).digest()
    return (seed * (PAGE // len(seed) + 1))[:PAGE]


def addr(port):
    return "127.0.0.1:%d" % port


def start_node(tmp, i, port, peers):
    d = tempfile.mkdtemp(prefix="n%d-" % i, dir=tmp)
    n = Node(["--rpc-port", str(port), "--peers", ",".join(peers),
              "--data-port", "0", "--meta-port", "0", "--metrics-port", "0",
              "--threads", "2", "--pool-prefault", "false",
              "--pool-size", POOL, "--directory-replicas", str(REPLICAS),
              "--socket", os.path.join(d, "s.sock")], tmpdir=d)
    n.wait_for("ready", 30)
    return n


def call(node, method, params, timeout=30.0):
    c = RpcClient(node.endpoint("socket"), timeout=timeout)
    try:
        return c.call(method, params)
    finally:
        c.close()


def set_peers(nodes, peers):
    for n in nodes:
        err, res = call(n, "cluster.set_peers", [peers])
        if err is not None or not res["changed"]:
            raise SystemExit("cluster.set_peers: %r %r" % (err, res))
    return res["epoch"]


def write_all(producers):
    fails = []

    def produce(pi, node):
        c = RpcClient(node.endpoint("socket"), timeout=30.0)
        mine = [i for i in range(KEYS) if i % len(producers) == pi]
        for b in range(0, len(mine), SET_BATCH):
            idx = mine[b:b + SET_BATCH]
            err, res = c.call("kv.set", [[key_of(i) for i in idx],
                                         [page_of(i) for i in idx]])
            if err is not None or not all(res):
                fails.append((err, None if err else res.count(False)))
        c.close()
    ts = [threading.Thread(target=produce, args=(pi, n))
          for pi, n in enumerate(producers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if fails:
        raise SystemExit("kv.set failed: %r" % fails[:5])


def sweep(client):
    """kv.exists over every key; short batches counted with kv.get. Returns
    the keys that hit."""
    hits = 0
    for b in range(0, KEYS, SWEEP_BATCH):
        keys = [key_of(i) for i in range(b, min(KEYS, b + SWEEP_BATCH))]
        err, n = client.call("kv.exists", [keys])
        if err is None and n == len(keys):
            hits += n
            continue
        err, pages = client.call("kv.get", [keys])
        if err is None:
            hits += sum(p is not None for p in pages)
    return hits


def verify(client):
    """kv.get of every key: (hits, wrong pages)."""
    hits = wrong = 0
    for b in range(0, KEYS, 128):
        idx = list(range(b, min(KEYS, b + 128)))
        err, pages = client.call("kv.get", [[key_of(i) for i in idx]])
        if err is not None:
            continue
        for i, p in zip(idx, pages):
            if p is not None:
                hits += 1
                wrong += p != page_of(i)
    return hits, wrong


def totals(nodes):
    ms = [metrics_of(n) for n in nodes]
    return {k: sum(m.get(k, 0) for m in ms)
            for k in (M_MOVED, M_STORED, M_WALKS, M_DIR, M_REMOVES,
                      M_MOVED_OUT)}


def until(pred, what, timeout):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pred():
            return
        time.sleep(0.05)
    raise SystemExit("timed out after %.0f s waiting for %s" % (timeout, what))


def settle(nodes):
    """Wait until the summed republish and directory counters stop moving
    for 2.5 s (in-flight publishes land, and the removals at displaced
    owners that wait member_ttl, 2 s by default)."""
    last, same = None, 0
    t0 = time.time()
    while time.time() - t0 < 60:
        cur = totals(nodes)
        same = same + 1 if cur == last else 0
        if same >= 25:
            return cur
        last = cur
        time.sleep(0.1)
    return last


def change(name, members, walkers, reader, do_change, epoch_after,
           ideal_moved, ideal_removed):
    """members: (before, after) the change; walkers: the nodes whose ring
    changes (they got cluster.set_peers) and so walk their pools."""
    before = settle(members[0])
    # the directory records the nodes left after the change hold before it
    # (a joining node holds none yet)
    before_kept = totals(members[1])[M_DIR]
    rd = metrics_of(reader)
    c = RpcClient(reader.endpoint("socket"), timeout=30.0)
    t0 = time.time()
    do_change()
    t_set = time.time() - t0
    sweeps = []
    while True:
        s0 = time.time()
        h = sweep(c)
        sweeps.append({"end_s": time.time() - t0, "hits": h,
                       "dur_s": time.time() - s0})
        if h == KEYS:
            break
        if time.time() - t0 > CHANGE_TIMEOUT:
            c.close()
            raise SystemExit("%s: lookups never hit 100 %% again within "
                             "%.0f s (last sweep %d/%d)" %
                             (name, CHANGE_TIMEOUT, h, KEYS))
    t_hit = sweeps[-1]["end_s"]
    needle = "placement for epoch %d done" % epoch_after
    try:
        until(lambda: all(needle in n.text() for n in walkers),
              "'%s' on every member" % needle, CHANGE_TIMEOUT)
    except SystemExit:
        for n in walkers:
            log("node log %s:\n%s" % (n.log_path, "\n".join(
                n.text().splitlines()[-15:])))
        raise
    t_walk = time.time() - t0  # an upper bound: polled after the sweeps
    walk_at = []
    for n in walkers:
        m = re.search(r"(\S+) \S+ +\[[^]]*\] %s" % re.escape(needle),
                      n.text())
        if m:
            t = datetime.datetime.strptime(m.group(1),
                                           "%Y-%m-%dT%H:%M:%S.%fZ")
            walk_at.append(t.replace(tzinfo=datetime.timezone.utc)
                           .timestamp() - t0)
    after = settle(members[1])
    ra = metrics_of(reader)
    vh, wrong = verify(c)
    c.close()
    moved = after[M_MOVED] - before[M_MOVED]
    stored = after[M_STORED] - before[M_STORED]
    removed = after.get(M_MOVED_OUT, 0) - before.get(M_MOVED_OUT, 0)
    r = {
        "change": name,
        "set_peers_s": t_set,
        "moved": moved,
        "ideal_moved": ideal_moved,
        "moved_over_ideal": moved / ideal_moved if ideal_moved else None,
        "stored": stored,
        # stored records that added nothing: the owner already held one
        # (the members' records grew by stored - removed otherwise)
        "already_held": stored - (after[M_DIR] - before_kept + removed),
        "removed": removed,
        "walks": after[M_WALKS] - before[M_WALKS],
        "dir_records_before": before[M_DIR],
        "dir_records_after": after[M_DIR],
        "dir_records_ideal": KEYS * min(REPLICAS, len(members[1])),
        "stale_records": after[M_DIR] - KEYS * min(REPLICAS, len(members[1])),
        "removes": after[M_REMOVES] - before[M_REMOVES],
        "ideal_removed": ideal_removed,
        "reader_fallbacks": ra.get(M_FALLBACKS, 0) - rd.get(M_FALLBACKS, 0),
        "first_sweep_hits": sweeps[0]["hits"],
        "first_sweep_end_s": sweeps[0]["end_s"],
        "sweep_hits": [s["hits"] for s in sweeps],
        "sweep_end_s": [s["end_s"] for s in sweeps],
        "min_sweep_hits": min(s["hits"] for s in sweeps),
        "sweeps": len(sweeps),
        "sweep_s": sweeps[-1]["dur_s"],
        "hit100_s": t_hit,
        "walks_done_s": max(walk_at) if len(walk_at) == len(walkers)
        else t_walk,
        "verify_hits": vh,
        "wrong": wrong,
    }
    log("  %s: moved %d (ideal %.0f, x%.2f), stored %d, directory records "
        "%d -> %d (ideal %d), removes %d; first sweep %d/%d, hit 100 %% "
        "after %.2f s (%d sweeps), walks done after %.2f s; verify %d hits, "
        "%d wrong" % (name, moved, ideal_moved, r["moved_over_ideal"] or 0,
                      r["stored"], before[M_DIR], after[M_DIR],
                      r["dir_records_ideal"], r["removes"],
                      r["first_sweep_hits"], KEYS, t_hit, len(sweeps),
                      r["walks_done_s"], vh, wrong))
    return r


def cluster(tmp, ports, members, nodes):
    """Starts a node per port of ports (each with --peers members) into
    nodes; writes every page from the producers (nodes 1..; N=1: node 0)
    and checks the reader (node 0) hits all of them."""
    for i, port in enumerate(ports):
        nodes.append(start_node(tmp, i, port, members))
    producers = nodes[1:NODES] if NODES > 1 else nodes[:1]
    t0 = time.time()
    write_all(producers)
    log("%d pages of %d bytes written by %d producer(s) in %.1f s" %
        (KEYS, PAGE, len(producers), time.time() - t0))
    c = RpcClient(nodes[0].endpoint("socket"), timeout=30.0)
    base_hits = sweep(c)
    c.close()
    if base_hits != KEYS:
        raise SystemExit("before any change only %d/%d keys hit"
                         % (base_hits, KEYS))


def stop_all(nodes, tmp):
    for n in nodes:
        if n.proc.poll() is None:
            n.proc.kill()
            n.proc.wait()
    shutil.rmtree(tmp, ignore_errors=True)


def leave_of(nodes, old, small):
    """The change that drops node N: set_peers on the others, then SIGINT
    to it (its exit is awaited after the measurement)."""
    def leave():
        set_peers(old, small)
        nodes[NODES].proc.send_signal(signal.SIGINT)
    return leave


def one_run(run):
    """join then leave on one cluster, and a leave on a fresh cluster of
    N+1 (no stale records from an earlier join)."""
    n1 = NODES + 1
    ideal_leave = KEYS * REPLICAS / n1 if REPLICAS <= NODES else 0
    out = []
    for fresh in (False, True):
        tmp = tempfile.mkdtemp(prefix="pc-republish-")
        nodes = []
        try:
            ports = free_ports(n1)
            small = [addr(p) for p in ports[:NODES]]
            big = [addr(p) for p in ports]
            log("run %d, %s" % (run, "fresh cluster of N+1 for a leave"
                                if fresh else "N nodes for a join and leave"))
            cluster(tmp, ports if fresh else ports[:NODES],
                    big if fresh else small, nodes)
            reader, old = nodes[0], nodes[:NODES]
            epoch = 2
            if not fresh:
                joined = start_node(tmp, NODES, ports[NODES], big)
                nodes.append(joined)
                join = change("join", (old, nodes), old, reader,
                              lambda: set_peers(old, big), 2,
                              KEYS * min(REPLICAS, n1) / n1, ideal_leave)
                join["new_node_dir_records"] = metrics_of(joined).get(
                    M_DIR, 0)
                out.append(join)
                epoch = 3
            lv = change("leave (fresh)" if fresh else "leave",
                        (nodes, old), old, reader,
                        leave_of(nodes, old, small), epoch, ideal_leave,
                        None)
            if nodes[NODES].stop() != 0:
                raise SystemExit("the departed node exited with status %r"
                                 % nodes[NODES].proc.returncode)
            out.append(lv)
        finally:
            stop_all(nodes, tmp)
    return out


CHANGES = ("join", "leave", "leave (fresh)")
FIELDS = [  # (key, label, format)
    ("moved", "records re-published (sum over nodes)", "%.0f"),
    ("ideal_moved", "ideal", "%.0f"),
    ("moved_over_ideal", "re-published / ideal", "%.2f"),
    ("stored", "of those stored by an owner", "%.0f"),
    ("already_held", "  of those, to an owner that already held it",
     "%.0f"),
    ("removed", "records removed from displaced owners "
     "(directory_moved_away_total)", "%.0f"),
    ("ideal_removed", "  ideal: displaced owners' records", "%.0f"),
    ("removes", "records removed in all (directory_removes_total)", "%.0f"),
    ("dir_records_after", "directory records held after (sum)", "%.0f"),
    ("dir_records_ideal", "  ideal K x R", "%.0f"),
    ("stale_records", "  excess (stale records left)", "%.0f"),
    ("first_sweep_hits", "hits in the first sweep", "%.0f"),
    ("first_sweep_end_s", "  s from the change to its end", "%.3f"),
    ("min_sweep_hits", "fewest hits in a sweep", "%.0f"),
    ("reader_fallbacks", "reader lookups an owner answered not found "
     "(directory_fallbacks_total)", "%.0f"),
    ("set_peers_s", "s to apply the change (set_peers on every node)",
     "%.3f"),
    ("hit100_s", "s until a full sweep hits 100 %", "%.3f"),
    ("sweep_s", "  s per sweep (the last)", "%.3f"),
    ("walks_done_s", "s until every walk is done", "%.3f"),
    ("wrong", "wrong pages (final kv.get sweep)", "%.0f"),
]


def main():
    if NODES < 1 or KEYS < 1 or RUNS < 1 or REPLICAS < 1:
        raise SystemExit("NODES, KEYS, RUNS and REPLICAS must be >= 1")
    ts = bench_results.stamp()
    load0 = bench_results.loadavg()
    results = []
    for run in range(1, RUNS + 1):
        results.append(one_run(run))
    load1 = bench_results.loadavg()
    summary = {name: bench_results.spread([r[ci] for r in results],
                                          [k for k, _, _ in FIELDS])
               for ci, name in enumerate(CHANGES)}
    out = bench_results.write(
        RESULTS_DIR, "republish", "republish", ts, (load0, load1),
        {"nodes": NODES, "keys": KEYS, "page": PAGE, "replicas": REPLICAS,
         "runs": RUNS, "pool": POOL,
         "membership": "static, cluster.set_peers"},
        runs=results, summary=summary)
    print("Re-publication, N=%d -> %d -> %d, K=%d pages of %d B, R=%d, "
          "%d runs, membership by cluster.set_peers; load average %s -> %s"
          % (NODES, NODES + 1, NODES, KEYS, PAGE, REPLICAS, RUNS, load0[0],
             load1[0]))
    print()
    print("| median (min-max) | " + " | ".join(CHANGES) + " |")
    print("|---" * (len(CHANGES) + 1) + "|")
    for k, label, fmt in FIELDS:
        cells = []
        for name in CHANGES:
            s = summary[name].get(k)
            cells.append("n/a" if s is None else "%s (%s-%s)" % (
                fmt % s["median"], fmt % s["min"], fmt % s["max"]))
        print("| %s | %s |" % (label, " | ".join(cells)))
    print()
    print("JSON: " + out)


if __name__ == "__main__":
    main()
