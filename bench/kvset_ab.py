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
stores large values. Per round it also prints the stalls in which a reactor
slept in the kernel (peercache_reactor_stalls_blocked_total) and the large
blocks the node unmapped off its loop
(peercache_reactor_blocks_unmapped_off_total); "-" for a build without
them. --register-too also has a local client (libpeercache,
python/peercache/client.py, on the node's Unix socket; a process of its
own, so that it never waits for this one's GIL) create and remove a
shared region of --register-mb in a loop over the same window, each first
used by a set of one 4 KiB page (when libpeercache registers it with the
node, which maps it on its offload thread) and then by a second one, and
prints the p50, p99 (with more than 100 of them; "-" otherwise) and
slowest of those creations with their first set, and of the second sets. Stops everything it started, by PID.

  bench/kvset_ab.py --node before=/tmp/before/build/server/peercached \\
                    --node after=build/server/peercached

Only 127.0.0.1 is contacted. A measurement: the exit status does not depend
on the figures (1 on a failed run, 2 on bad usage).
"""
import argparse
import multiprocessing as mp
import os
import queue
import socket
import statistics
import sys
import tempfile
import threading
import time

import msgpack

from p2p_ab import (call, health_end, health_start, load_delta, reactor_load, round_order,
                    set_args, set_specs, start_node, stop_all)


def quantiles(v):
    """(p50, p99 or None with 100 samples or fewer, slowest, count) of v."""
    v = sorted(v)
    return (v[len(v) // 2], v[len(v) * 99 // 100] if len(v) > 100 else None, v[-1], len(v))


def register_loop(path, mb, rnd, stop, out):
    """--register-too's local client, in a process of its own: until stop
    is set, create a region of mb MiB, time its first set of one 4 KiB page
    (when libpeercache registers it with the node), then a second set from
    the registered region, and remove it. Puts ([first set ms], [second set
    ms], None or what failed) on out."""
    firsts, seconds, step, cl = [], [], "opening a client", None
    try:
        from peercache.client import Client
        cl = Client(path)
        n = 0
        while not stop.is_set():
            t = time.monotonic()
            step = "region_create"
            rid, _ = cl.region_create(mb << 20)
            step = "the first set"
            ok = cl.set(rid, [b"kvset-ab-reg-%d-%d" % (rnd, n)], [0], [4096])
            t2 = time.monotonic()
            step = "the second set"
            ok2 = cl.set(rid, [b"kvset-ab-reg2-%d-%d" % (rnd, n)], [8192], [4096])
            t3 = time.monotonic()
            if ok != [True] or ok2 != [True]:
                raise RuntimeError("the node refused a page: %r %r" % (ok, ok2))
            firsts.append((t2 - t) * 1000)
            seconds.append((t3 - t2) * 1000)
            step = "region_remove"
            cl.region_remove(rid)
            n += 1
        step = None
    except Exception as e:  # a measurement: name the failure, stop the run
        step = "at %s: %s" % (step, e)
    finally:
        try:
            if cl:
                cl.close()
        finally:
            out.put((firsts, seconds, step))


def register_result(pr, res_q):
    """What register_loop's process pr put on res_q, once it has ended; one
    that died without a word (a crash in the library) is a failure."""
    got = None
    while got is None:
        try:
            got = res_q.get(timeout=1)
        except queue.Empty:
            if not pr.is_alive():
                got = ([], [], "with exit code %s" % pr.exitcode)
    pr.join()
    return got


def opt(v):
    """A count, or "-" for a metric the node's build does not have."""
    return "-" if v is None else str(v)


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
    ap.add_argument("--register-too", action="store_true",
                    help="a local client creating and removing a region in a loop during "
                         "the calls; the p50/p99/slowest creation with its first set, and of "
                         "a second set (libpeercache)")
    ap.add_argument("--register-mb", type=int, default=4,
                    help="--register-too's region size, MiB (default 4)")
    build = os.environ.get("PEERCACHE_BUILD_DIR", "build")
    ap.add_argument("--loadgen", default=os.path.join(build, "bench", "pc-loadgen"))
    a = ap.parse_args()
    if a.register_too and a.calls < 2:
        ap.error("--register-too runs from the end of the first call: --calls 2 or more")
    nodes = set_specs(ap, a)
    work = tempfile.mkdtemp(prefix="pc-kvset-ab-")
    procs = []

    try:
        socks_path = [os.path.join(work, "node%d.sock" % k) if a.register_too else ""
                      for k in range(len(nodes))]
        ports = [start_node(work, procs, b, k, 1024, faulted=True, unix_socket=socks_path[k])
                 for k, (_, b) in enumerate(nodes)]
        if a.register_too:
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                            "..", "python"))
            os.environ.setdefault("PEERCACHE_LIBRARY",
                                  os.path.join(build, "client", "libpeercache.so.0"))
        # register_loop's process starts afresh (not forked from a process
        # with threads) with this one's sys.path.
        ctx = mp.get_context("spawn")
        values = [os.urandom(a.size) for _ in range(a.values)]
        seq = 0
        res = {n: [] for n, _ in nodes}
        for r in range(a.rounds):
            for k in round_order(len(nodes), r):
                name = nodes[k][0]
                rport, mport = ports[k]
                s0 = reactor_load(mport)
                socks = [socket.create_connection(("127.0.0.1", rport), timeout=60)
                         for _ in range(a.conns)]
                times = []
                lg = []
                failed = []
                seq += 1
                stop_ev = ctx.Event()
                regs, seconds = [], []
                reg = []  # the local client's (process, queue), once started

                def client(c, sock, rnd=seq, name=name, rport=rport, path=socks_path[k]):
                    unpacker = msgpack.Unpacker(raw=False)
                    for i in range(a.calls):
                        if c == 0 and i == 1 and a.health_too:
                            lg.append(health_start(a.loadgen, rport, a.health_secs,
                                                   warmup=0.2))
                        if c == 0 and i == 1 and a.register_too:
                            # A process of its own: a thread here would wait
                            # for the GIL while the clients pack 32 MiB.
                            res_q = ctx.Queue()
                            pr = ctx.Process(target=register_loop,
                                             args=(path, a.register_mb, rnd, stop_ev, res_q))
                            pr.start()
                            reg.append((pr, res_q))
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
                stop_ev.set()
                for pr, res_q in reg:
                    got = register_result(pr, res_q)
                    if got[2]:
                        failed.append("%s: the local client failed %s" % (name, got[2]))
                    regs.extend(got[0])
                    seconds.extend(got[1])
                for sk in socks:
                    sk.close()
                if failed:
                    sys.exit(failed[0])
                lg = lg[0] if lg else None
                d = load_delta(s0, reactor_load(mport))
                if a.register_too and not regs:
                    sys.exit("%s: no region was created during the calls" % name)
                res[name].append((d[0], d[1], d[2], statistics.median(times),
                                  d[4],
                                  health_end(lg) if lg else None,
                                  quantiles(regs) + quantiles(seconds) if regs else None,
                                  d[3]))
        mib = a.size * a.values / (1 << 20)
        print("kv.set of %d x %d KiB (%.0f MiB) per call, %d calls per round on each of "
              "%d connection(s), %d rounds"
              % (a.values, a.size // 1024, mib, a.calls, a.conns, a.rounds))
        for name, _ in nodes:
            print("  %-10s stalls per round %s; CPU-bound %s; slept in the kernel %s; "
                  "blocks unmapped off the loop %s; "
                  "longest loop iteration <= ms %s; median call ms %s" % (
                      name, " ".join(str(x[0]) for x in res[name]),
                      " ".join(str(x[1]) for x in res[name]),
                      " ".join(opt(x[4]) for x in res[name]),
                      " ".join(opt(x[7]) for x in res[name]),
                      " ".join("%g" % (x[2] * 1000) for x in res[name]),
                      " ".join("%.0f" % x[3] for x in res[name])))
            if a.health_too:
                print("  %-10s node.health per round, p99 ms %s; slowest ms %s" % (
                    name, " ".join("%.2f" % x[5][0] for x in res[name]),
                    " ".join("%.2f" % x[5][1] for x in res[name])))
            if a.register_too:
                for what, o in (("region_create of %d MiB + first set" % a.register_mb, 0),
                                ("a set on a registered region", 4)):
                    print("  %-10s %s, per round (count): p50/p99/slowest ms %s" % (
                        name, what,
                        " ".join("%.2f/%s/%.2f (%d)" % (
                            x[6][o], "-" if x[6][o + 1] is None else "%.2f" % x[6][o + 1],
                            x[6][o + 2], x[6][o + 3]) for x in res[name])))
    finally:
        stop_all(work, procs)


if __name__ == "__main__":
    main()
