#!/usr/bin/python3
"""kv.set of large values, two (or more) peercached builds side by side:
what one call costs its reactor.

Starts one node per --node NAME=BINARY (2 reactor threads, loopback, with
reactor_stall_cpu_clock, pool faulted in before anything is measured),
then per round, in rotating order, one client connection per node (or
--conns of them at once) makes --calls kv.set calls of --values fresh
values of --size each. Per node and
round: the reactor stalls the node counted over those calls
(peercache_reactor_stalls_total, and the CPU-bound ones,
peercache_reactor_stalls_cpu_total), its longest loop iteration (the bound
of its peercache_reactor_iteration_hist_seconds bucket) and the median call
time seen by the client (which includes packing and sending the values from Python). The
first round of each node includes its first call, which warms the blocks
large input lands in (common/blocks.h). --health-too also runs pc-loadgen's
node.health on 2 more connections of the node during each round's calls
(from the first call's end, for --health-secs) and prints its p99 and its
slowest call per round: the latency of everything else while one client
stores large values. Stops
everything it started, by PID.

  bench/kvset_ab.py --node before=/tmp/before/build/server/peercached \\
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
import threading
import time

import msgpack

from p2p_ab import (health_end, health_start, load_delta, reactor_load, set_args, set_specs,
                    start_node, stop_all)


def call(sock, unpacker, msgid, method, params):
    sock.sendall(msgpack.packb([0, msgid, method, params], use_bin_type=True))
    while True:
        for msg in unpacker:
            return msg
        data = sock.recv(1 << 20)
        if not data:
            sys.exit("the node closed the connection")
        unpacker.feed(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    set_args(ap, "values per kv.set (default 8)")
    ap.add_argument("--calls", type=int, default=10, help="kv.set calls per round (default 10)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    ap.add_argument("--conns", type=int, default=1,
                    help="connections per node making the calls at once, each "
                         "--calls of them (default 1)")
    ap.add_argument("--health-too", action="store_true",
                    help="node.health p99 on 2 more connections during the calls (pc-loadgen)")
    ap.add_argument("--health-secs", type=float, default=1.5,
                    help="--health-too's measured window, s (default 1.5; within the calls)")
    build = os.environ.get("PEERCACHE_BUILD_DIR", "build")
    ap.add_argument("--loadgen", default=os.path.join(build, "bench", "pc-loadgen"))
    a = ap.parse_args()
    nodes = set_specs(ap, a)
    work = tempfile.mkdtemp(prefix="pc-kvset-ab-")
    procs = []

    try:
        ports = [start_node(work, procs, b, k, 1024, faulted=True)
                 for k, (_, b) in enumerate(nodes)]
        values = [os.urandom(a.size) for _ in range(a.values)]
        seq = 0
        res = {n: [] for n, _ in nodes}
        for r in range(a.rounds):
            order = list(range(len(nodes)))
            order = order[r % len(nodes):] + order[:r % len(nodes)]
            for k in order:
                name = nodes[k][0]
                rport, mport = ports[k]
                s0 = reactor_load(mport)
                socks = [socket.create_connection(("127.0.0.1", rport), timeout=60)
                         for _ in range(a.conns)]
                times = []
                lg = []
                failed = []
                seq += 1

                def client(c, sock, rnd=seq, name=name, rport=rport):
                    unpacker = msgpack.Unpacker(raw=False)
                    for i in range(a.calls):
                        if c == 0 and i == 1 and a.health_too:
                            lg.append(health_start(a.loadgen, rport, a.health_secs,
                                                   warmup=0.2))
                        keys = ["kvset-ab-%d-%d-%d-%d" % (rnd, c, i, j)
                                for j in range(a.values)]
                        t = time.monotonic()
                        msg = call(sock, unpacker, i + 1, "kv.set", [keys, values])
                        times.append((time.monotonic() - t) * 1000)
                        if msg[2] is not None or msg[3] != [True] * a.values:
                            failed.append("%s: kv.set failed: %r" % (name, msg[2]))
                            return

                threads = [threading.Thread(target=client, args=(c, sk))
                           for c, sk in enumerate(socks)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                for sk in socks:
                    sk.close()
                if failed:
                    sys.exit(failed[0])
                lg = lg[0] if lg else None
                d = load_delta(s0, reactor_load(mport))
                res[name].append((d[0], d[1], d[2], statistics.median(times),
                                  health_end(lg) if lg else None))
        mib = a.size * a.values / (1 << 20)
        print("kv.set of %d x %d KiB (%.0f MiB) per call, %d calls per round on each of "
              "%d connection(s), %d rounds"
              % (a.values, a.size // 1024, mib, a.calls, a.conns, a.rounds))
        for name, _ in nodes:
            print("  %-10s stalls per round %s; CPU-bound %s; longest loop iteration "
                  "<= ms %s; median call ms %s" % (
                      name, " ".join(str(x[0]) for x in res[name]),
                      " ".join(str(x[1]) for x in res[name]),
                      " ".join("%g" % (x[2] * 1000) for x in res[name]),
                      " ".join("%.0f" % x[3] for x in res[name])))
            if a.health_too:
                print("  %-10s node.health per round, p99 ms %s; slowest ms %s" % (
                    name, " ".join("%.2f" % x[4][0] for x in res[name]),
                    " ".join("%.2f" % x[4][1] for x in res[name])))
    finally:
        stop_all(work, procs)


if __name__ == "__main__":
    main()
