#!/usr/bin/python3
"""Discovery failure detection (issue 13): kill -9 a non-head node K times
and time until every other node's view (discovery.view) has dropped it, then
load the survivors and count late heartbeats and false removals.

Usage: bench/discovery_detect.py [--kills 10] [--nodes 4] [--load-s 10]
                                  [--backend embedded|etcd]
       (PEERCACHE_BUILD_DIR selects the build; default ./build; etcd: the
       etcd binary of Debian's etcd-server, started on loopback here)
Prints every detection time and min / median / max. Loopback only.
"""
import argparse
import datetime
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "tests", "proc"))
from conftest import Node, RpcClient, free_ports, metrics_of  # noqa: E402
from test_discovery_etcd import Etcd  # noqa: E402

ETCD = None  # the Etcd of --backend etcd


def view_ids(node):
    c = RpcClient(node.endpoint("socket"), timeout=5.0)
    try:
        err, res = c.call("discovery.view")
    finally:
        c.close()
    return None if err else sorted(m["id"] for m in res["members"])


def start(tmp, i, rpc, meta, head_meta):
    d = os.path.join(tmp, "n%d-%d" % (i, time.monotonic_ns()))
    os.makedirs(d)
    how = (["--discovery-backend", "etcd", "--etcd-endpoints", ETCD.addr]
           if ETCD else ["--meta-port", str(meta), "--discovery-addr",
                         "127.0.0.1:%d" % head_meta])
    n = Node(["--rpc-port", str(rpc)] + how + [
              "--data-port", "0", "--metrics-port", "0", "--threads", "2",
              "--pool-prefault", "false", "--pool-size", "32mb",
              "--socket", os.path.join(d, "s.sock")], tmpdir=d)
    n.wait_for("ready", 30)
    return n


def suspect_after(text, peer, t_kill):
    """Seconds from t_kill to the log line saying the cluster holds peer
    suspect (reads skip it from then on), or None."""
    m = re.search(r"(\S+) WARN  \[[^]]*\] peer %s is suspect \(discovery"
                  % re.escape(peer), text)
    if not m:
        return None
    t = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%fZ")
    return t.replace(tzinfo=datetime.timezone.utc).timestamp() - t_kill


def wait(pred, timeout=30):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pred():
            return time.time() - t0
        time.sleep(0.01)
    raise SystemExit("timed out")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--load-s", type=float, default=10.0)
    ap.add_argument("--backend", choices=("embedded", "etcd"),
                    default="embedded")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="pc-disc-bench-")
    global ETCD
    if a.backend == "etcd":
        ETCD = Etcd(tmp)
    ports = free_ports(2 * a.nodes)
    rpc, meta = ports[:a.nodes], ports[a.nodes:]
    nodes = [start(tmp, i, rpc[i], meta[i], meta[0]) for i in range(a.nodes)]
    ids = sorted("127.0.0.1:%d" % p for p in rpc)
    try:
        wait(lambda: all(view_ids(n) == ids for n in nodes))
        times, suspects = [], []
        for k in range(a.kills):
            victim = 1 + k % (a.nodes - 1)
            gone = "127.0.0.1:%d" % rpc[victim]
            # let a heartbeat phase settle at a random point
            time.sleep(0.5 + (k * 0.137) % 0.5)
            mark = len(nodes[0].text())
            t0 = time.time()
            nodes[victim].proc.kill()
            nodes[victim].proc.wait()
            others = [n for i, n in enumerate(nodes) if i != victim]
            wait(lambda: all(gone not in (view_ids(n) or [gone])
                             for n in others))
            times.append(time.time() - t0)
            sus = suspect_after(nodes[0].text()[mark:], gone, t0)
            if sus is not None:
                suspects.append(sus)
            print("kill %d (%s): %sremoved everywhere after %.2f s" % (
                k + 1, gone, "" if ETCD else "suspect on the head after %s "
                "s, " % ("%.2f" % sus if sus is not None else "?"),
                times[-1]), flush=True)
            nodes[victim] = start(tmp, victim, rpc[victim], meta[victim],
                                  meta[0])
            wait(lambda: all(view_ids(n) == ids for n in nodes))
        print("detection over %d kills: min %.2f / median %.2f / max %.2f s"
              % (len(times), min(times), statistics.median(times),
                 max(times)))
        if suspects:
            print("suspect (reads skip it) on the head: min %.2f / median "
                  "%.2f / max %.2f s" % (min(suspects),
                                         statistics.median(suspects),
                                         max(suspects)))
        # Load: every node serves kv.set/get from 4 client threads.
        stop = threading.Event()
        ops = [0]

        def load(node):
            c = RpcClient(node.endpoint("socket"), timeout=10.0)
            keys = ["load-%d" % i for i in range(32)]
            val = b"x" * 65536
            while not stop.is_set():
                c.call("kv.set", [keys, [val] * len(keys)])
                c.call("kv.get", [keys])
                ops[0] += 2
            c.close()
        threads = [threading.Thread(target=load, args=(n,), daemon=True)
                   for n in nodes for _ in range(4)]
        mark = len(nodes[0].text())
        late0 = metrics_of(nodes[0]).get(
            "peercache_discovery_late_heartbeats_total", 0)
        for t in threads:
            t.start()
        time.sleep(a.load_s)
        stop.set()
        for t in threads:
            t.join(10)
        head = nodes[0].text()[mark:]
        print("load %.0f s: %d kv calls; on the head meanwhile: %d "
              "suspect, %d removed, %d left its ring (all nodes alive: all "
              "should be 0)" %
              (a.load_s, ops[0], head.count(": suspect"),
               head.count(": removed"), head.count(" left the ring")))
        late = metrics_of(nodes[0]).get(
            "peercache_discovery_late_heartbeats_total", 0) - late0
        if not ETCD:  # with etcd there are no heartbeats to a head
            print("heartbeats that reached the head more than 2 intervals "
                  "after the previous one, during the load: %d" % late)
    finally:
        for n in nodes:
            if n.proc.poll() is None:
                n.proc.kill()
                n.proc.wait()
        if ETCD:
            ETCD.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
