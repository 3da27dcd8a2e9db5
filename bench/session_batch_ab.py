#!/usr/bin/python3
"""Large session moves of small pages, two (or more) peercached builds side
by side: the longest reactor callbacks a local client's batch causes, by
what they were.

Starts one node per --node NAME=BINARY (2 reactor threads, loopback, a
Unix socket, pool faulted in, --log-level debug and the stall threshold at
--threshold-us, so that every reactor callback longer than that is logged
with its tag), then per round and node, in rotating order: a local client
(libpeercache through python/peercache/client.py) session.sets --pages
fresh pages of --size bytes from one shared region and session.gets them
back, for --secs. Per node: moves per second per round, and over all its
rounds, per callback tag (the handler of a request, "copier slices",
"session.set step", ...): how many ran over the threshold and the longest.
With two or more nodes, each node's moves per second over the first's,
round i against round i, as min / median / max. Stops everything it
started, by PID.

  bench/session_batch_ab.py --node before=/tmp/before/build/server/peercached \\
                            --node after=build/server/peercached

Only the nodes' Unix sockets and 127.0.0.1 are used. A measurement: the
exit status does not depend on the figures (1 on a failed run, 2 on bad
usage).
"""
import argparse
import os
import re
import statistics
import sys
import tempfile
import time

from p2p_ab import node_specs, round_order, start_node, stop_all

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STALL = re.compile(r"\[r\d+/stall\] r\d+: (.*?) ran ([0-9.]+) ms")


def callbacks(log_path, start):
    """{tag: [ms, ...]} of the stall lines logged after byte offset start."""
    out = {}
    with open(log_path) as f:
        f.seek(start)
        for line in f:
            m = STALL.search(line)
            if m:
                tag = re.sub(r" on conn \d+", "", m.group(1))
                out.setdefault(tag, []).append(float(m.group(2)))
    return out


def main():
    build = os.environ.get("PEERCACHE_BUILD_DIR", os.path.join(ROOT, "build"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--node", action="append", required=True, metavar="NAME=BINARY",
                    help="a build to measure (repeat for each)")
    ap.add_argument("--pages", type=int, default=65536, help="pages per move (default 65536)")
    ap.add_argument("--size", type=int, default=64, help="page bytes (default 64)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    ap.add_argument("--secs", type=float, default=4.0, help="seconds per node and round")
    ap.add_argument("--threshold-us", type=int, default=300,
                    help="log callbacks longer than this (default 300)")
    ap.add_argument("--lib", default=os.path.join(build, "client", "libpeercache.so.0"),
                    help="libpeercache for the client")
    args = ap.parse_args()
    nodes = node_specs(ap, args.node)
    if args.pages < 1 or args.pages > 65536 or args.size < 1 or args.rounds < 1:
        ap.error("--pages 1..65536, --size and --rounds positive")
    os.environ.setdefault("PEERCACHE_LIBRARY", args.lib)
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from peercache.client import Client  # noqa: E402 (after the library path)

    work = tempfile.mkdtemp(prefix="pc-session-batch-")
    procs, socks, logs = [], [], []
    try:
        for k, (_, binary) in enumerate(nodes):
            sock = os.path.join(work, "node%d.sock" % k)
            start_node(work, procs, "%s --log-level debug --reactor-stall-threshold-us %d"
                       % (binary, args.threshold_us), k, 1024, faulted=True,
                       unix_socket=sock)
            socks.append(sock)
            logs.append(os.path.join(work, "node%d.log" % k))
        offs = [i * args.size for i in range(args.pages)]
        lens = [args.size] * args.pages
        rate = [[] for _ in nodes]
        seen = [{} for _ in nodes]
        for r in range(args.rounds):
            for k in round_order(len(nodes), r):
                c = Client(socks[k])
                rid, _ = c.region_create(args.pages * args.size)
                start = os.path.getsize(logs[k])
                t0, moves = time.time(), 0
                while time.time() - t0 < args.secs:
                    keys = [b"sb%d-%d-%d" % (r, moves, i) for i in range(args.pages)]
                    if not all(c.set(rid, keys, offs, lens)) or \
                       not all(c.get(rid, keys, offs, lens)):
                        sys.exit("%s: a move missed pages" % nodes[k][0])
                    moves += 2
                rate[k].append(moves / (time.time() - t0))
                c.region_remove(rid)
                c.close()
                time.sleep(0.5)  # the last lines of the round reach the log
                for tag, ms in callbacks(logs[k], start).items():
                    seen[k].setdefault(tag, []).extend(ms)
        print("session.set + session.get of %d pages x %d bytes, one local client, "
              "%.1f s per node and round, %d rounds; callbacks over %d us"
              % (args.pages, args.size, args.secs, args.rounds, args.threshold_us))
        for k, (name, _) in enumerate(nodes):
            print("  %-10s moves/s per round: %s" % (
                name, " ".join("%.1f" % x for x in rate[k])))
            for tag, ms in sorted(seen[k].items(), key=lambda kv: -max(kv[1])):
                print("  %-10s   %-28s %6d over, longest %.2f ms, over 1 ms %d" % (
                    name, tag, len(ms), max(ms), sum(1 for x in ms if x > 1.0)))
        for k in range(1, len(nodes)):
            ratio = [a / b for a, b in zip(rate[k], rate[0])]
            print("%s over %s, moves/s round by round: %.2f / %.2f / %.2f" % (
                nodes[k][0], nodes[0][0], min(ratio), statistics.median(ratio),
                max(ratio)))
    finally:
        if os.environ.get("KEEP_LOGS"):
            for k in range(len(logs)):
                os.replace(logs[k], os.path.join(os.environ["KEEP_LOGS"], "node%d.log" % k))
        stop_all(work, procs)


if __name__ == "__main__":
    main()
