#!/usr/bin/python3
"""Large batches of small pages, two (or more) peercached builds side by
side: what a kv.* call of many keys costs its reactor, and everything else
on the node meanwhile.

Starts one node per --node NAME=BINARY (2 reactor threads, loopback, with
reactor_stall_cpu_clock, pool faulted in before anything is measured) and
stores --keys pages of --value-size bytes in it (kv.set of 8,192 at a
time). Then per round, in rotating order, for each node: one client
connection makes calls of --methods (each call all --keys keys, the
methods in turn) for --secs, while pc-loadgen's node.health runs on 2 more
connections of the node over the same window. Per node and round: the
median time of each method's calls (as the client sees it: packing and
unpacking in Python included), the reactor stalls counted over the window
(peercache_reactor_stalls_total) and the CPU-bound ones, the longest loop
iteration (the bound of its peercache_reactor_iteration_hist_seconds
bucket), and node.health's p99 and slowest call. With two or more nodes,
each node's figures over the first's, round i against round i, as
min / median / max. Stops everything it started, by PID.

  bench/batch_ab.py --node before=/tmp/before/build/server/peercached \\
                    --node after=build/server/peercached

Only 127.0.0.1 is contacted. A measurement: the exit status does not depend
on the figures (1 on a failed run, 2 on bad usage).
"""
import argparse
import os
import socket
import statistics
import sys
import tempfile
import time

import msgpack

from p2p_ab import (call, health_end, health_start, load_delta, node_specs, reactor_load,
                    round_order, start_node, stop_all)

METHODS = ("kv.exists", "kv.get", "kv.set")


def check(name, method, msg, n):
    """Exits unless msg is a full answer to method over n stored keys."""
    err, res = msg[2], msg[3]
    ok = err is None and (
        res == n if method == "kv.exists" else
        isinstance(res, list) and len(res) == n and
        (all(res) if method == "kv.set" else all(v is not None for v in res)))
    if not ok:
        sys.exit("%s: %s of %d keys: %r" % (name, method, n, err or str(res)[:200]))


def ratios(vals):
    """(min, median, max) of vals."""
    return min(vals), statistics.median(vals), max(vals)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--node", action="append", required=True, metavar="NAME=BINARY",
                    help="a peercached build to measure (repeat)")
    ap.add_argument("--keys", type=int, default=65536, help="keys per call (default 65536)")
    ap.add_argument("--value-size", type=int, default=64, help="page bytes (default 64)")
    ap.add_argument("--methods", default="kv.exists,kv.get",
                    help="comma-separated, of %s (default kv.exists,kv.get)" % ",".join(METHODS))
    ap.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    ap.add_argument("--via", choices=("unix", "tcp"), default="unix",
                    help="the calling client's connection: the node's Unix socket, as "
                         "SGLang's shim, or TCP (default unix; node.health is on TCP)")
    ap.add_argument("--secs", type=float, default=2.0,
                    help="seconds of calls per node and round (default 2)")
    build = os.environ.get("PEERCACHE_BUILD_DIR", "build")
    ap.add_argument("--loadgen", default=os.path.join(build, "bench", "pc-loadgen"))
    a = ap.parse_args()
    methods = a.methods.split(",")
    if any(m not in METHODS for m in methods):
        ap.error("--methods: of %s" % ",".join(METHODS))
    if not 1 <= a.keys <= 65536 or not 1 <= a.value_size <= 1 << 20:
        ap.error("--keys 1..65536, --value-size 1..1048576")
    if a.keys * a.value_size > 48 << 20:
        ap.error("--keys x --value-size must fit one 64 MiB message")
    if not os.access(a.loadgen, os.X_OK):
        ap.error("no pc-loadgen at %s (build the tree, or --loadgen)" % a.loadgen)
    nodes = node_specs(ap, a.node)
    work = tempfile.mkdtemp(prefix="pc-batch-ab-")
    procs = []
    keys = ["batch-ab-%07d" % i for i in range(a.keys)]
    value = os.urandom(a.value_size)
    try:
        pool_mb = max(256, 4 * a.keys * (a.value_size + 4096) >> 20)
        paths = [os.path.join(work, "node%d.sock" % k) for k in range(len(nodes))]
        ports = [start_node(work, procs, b, k, pool_mb, faulted=True, unix_socket=paths[k])
                 for k, (_, b) in enumerate(nodes)]

        def connect(k):
            if a.via == "tcp":
                return socket.create_connection(("127.0.0.1", ports[k][0]), timeout=60)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(60)
            s.connect(paths[k])
            return s

        for k, (name, _) in enumerate(nodes):
            with connect(k) as s:
                u = msgpack.Unpacker(raw=False, max_buffer_size=1 << 30)
                for off in range(0, a.keys, 8192):
                    ks = keys[off:off + 8192]
                    check(name, "kv.set", call(s, u, off + 1, "kv.set",
                                               [ks, [value] * len(ks)]), len(ks))
        res = {n: [] for n, _ in nodes}
        for r in range(a.rounds):
            for k in round_order(len(nodes), r):
                name = nodes[k][0]
                rport, mport = ports[k]
                s = connect(k)
                u = msgpack.Unpacker(raw=False, max_buffer_size=1 << 30)
                params = {"kv.exists": [keys], "kv.get": [keys],
                          "kv.set": [keys, [value] * a.keys]}
                times = {m: [] for m in methods}
                check(name, methods[0], call(s, u, 1, methods[0], params[methods[0]]), a.keys)
                s0 = reactor_load(mport)
                lg = health_start(a.loadgen, rport, a.secs, warmup=0)
                end = time.monotonic() + a.secs
                i = 1
                while time.monotonic() < end or not all(times.values()):
                    m = methods[i % len(methods)]
                    i += 1
                    t = time.monotonic()
                    msg = call(s, u, i, m, params[m])
                    times[m].append((time.monotonic() - t) * 1000)
                    check(name, m, msg, a.keys)
                health = health_end(lg)
                d = load_delta(s0, reactor_load(mport))
                s.close()
                res[name].append({"ms": {m: statistics.median(v) for m, v in times.items()},
                                  "calls": sum(len(v) for v in times.values()),
                                  "stalls": d[0], "cpu": d[1], "longest": d[2],
                                  "health": health})
        print("%s of %d keys x %d bytes, one %s connection, %.1f s per node and round, "
              "%d rounds; node.health on 2 more connections meanwhile"
              % ("/".join(methods), a.keys, a.value_size, a.via, a.secs, a.rounds))
        for name, _ in nodes:
            rows = res[name]
            for m in methods:
                print("  %-10s %s median ms per round: %s" % (
                    name, m, " ".join("%.1f" % x["ms"][m] for x in rows)))
            print("  %-10s calls per round %s; stalls per call %s; CPU-bound per call %s; "
                  "longest loop iteration <= ms %s" % (
                      name, " ".join(str(x["calls"]) for x in rows),
                      " ".join("%.1f" % (x["stalls"] / x["calls"]) for x in rows),
                      " ".join("%.1f" % (x["cpu"] / x["calls"]) for x in rows),
                      " ".join("%g" % (x["longest"] * 1000) for x in rows)))
            print("  %-10s node.health p99 ms %s; slowest ms %s" % (
                name, " ".join("%.2f" % x["health"][0] for x in rows),
                " ".join("%.2f" % x["health"][1] for x in rows)))
        base = nodes[0][0]
        for name, _ in nodes[1:]:
            pairs = list(zip(res[base], res[name]))
            print("%s over %s, round by round (min / median / max):" % (name, base))
            for m in methods:
                print("  %s call time %.2f / %.2f / %.2f" % (
                    (m,) + ratios([y["ms"][m] / x["ms"][m] for x, y in pairs])))
            print("  node.health p99 %.2f / %.2f / %.2f" % ratios(
                [y["health"][0] / x["health"][0] for x, y in pairs]))
            print("  stalls per call %.2f / %.2f / %.2f" % ratios(
                [(y["stalls"] / y["calls"]) / max(x["stalls"] / x["calls"], 1e-9)
                 for x, y in pairs]))
    finally:
        stop_all(work, procs)


if __name__ == "__main__":
    main()
