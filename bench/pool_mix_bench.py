#!/usr/bin/python3
"""A large page into a pool full of small ones, for one or more peercached
builds: how long the reactor callbacks of it ran, by what they were.

Per --node NAME=BINARY, one after the other: a node with a --pool-mb pool
faulted in before the fill (1 reactor thread, loopback, a Unix socket,
--log-level debug and the stall
threshold at --threshold-us, so every callback longer than that is logged
with its tag). One client fills the pool with --small-count pages of
--small-bytes (kv.set, 32,768 a call; once the pool is full each page
evicts one), then kv.sets one page of --big-mb MiB, which must evict
thousands of small ones to find room. Prints per node: whether the large
page was stored, how long its kv.set took as the client saw it, and per
callback tag the callbacks over the threshold, over 1 ms, and the longest
— during the fill and during the large set. Stops every node it started,
by PID.

  bench/pool_mix_bench.py --node before=/tmp/before/build/server/peercached \\
                          --node after=build/server/peercached

Only the nodes' Unix sockets and 127.0.0.1 are used. A measurement: the
exit status does not depend on the figures (1 on a failed run, 2 on bad
usage).
"""
import argparse
import os
import socket
import sys
import tempfile
import time

import msgpack

from p2p_ab import call, node_specs, start_node, stop_all
from session_batch_ab import callbacks


def rpc(sock, unpacker, msgid, method, params):
    msg = call(sock, unpacker, msgid, method, params)
    if msg[2] is not None:
        sys.exit("%s: %r" % (method, msg[2]))
    return msg[3]


def report(name, phase, seen):
    for tag, ms in sorted(seen.items(), key=lambda kv: -max(kv[1])):
        print("  %-10s %-5s %-30s %6d over, over 1 ms %5d, longest %8.2f ms" % (
            name, phase, tag, len(ms), sum(1 for x in ms if x > 1.0), max(ms)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--node", action="append", required=True, metavar="NAME=BINARY",
                    help="a build to measure (repeat for each)")
    ap.add_argument("--pool-mb", type=int, default=32, help="pool MiB (default 32)")
    ap.add_argument("--small-count", type=int, default=262144,
                    help="small pages stored first (default 262144)")
    ap.add_argument("--small-bytes", type=int, default=64, help="their bytes (default 64)")
    ap.add_argument("--big-mb", type=int, default=24, help="the large page, MiB (default 24)")
    ap.add_argument("--threshold-us", type=int, default=300,
                    help="log callbacks longer than this (default 300)")
    args = ap.parse_args()
    nodes = node_specs(ap, args.node)
    if args.big_mb >= args.pool_mb or args.small_count < 1 or args.small_bytes < 1:
        ap.error("--big-mb below --pool-mb; --small-count and --small-bytes positive")
    print("a %d MiB page into a %d MiB pool after %d pages of %d bytes; callbacks "
          "over %d us" % (args.big_mb, args.pool_mb, args.small_count, args.small_bytes,
                          args.threshold_us))
    for k, (name, binary) in enumerate(nodes):
        work = tempfile.mkdtemp(prefix="pc-pool-mix-")
        procs = []
        try:
            path = os.path.join(work, "node.sock")
            # The pool faulted in first, as a node does in the background:
            # otherwise every 512th page's reserve pays a 2 MiB huge-page
            # fault (4-8 ms in this VM), which is not what this measures.
            start_node(work, procs, "%s --threads 1 --log-level debug "
                       "--reactor-stall-threshold-us %d" % (binary, args.threshold_us),
                       0, args.pool_mb, faulted=True, unix_socket=path)
            log = os.path.join(work, "node0.log")
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            u = msgpack.Unpacker(raw=False)
            mid = 0
            start = os.path.getsize(log)
            value = b"s" * args.small_bytes
            for i in range(0, args.small_count, 32768):
                keys = ["mix-%08d" % j for j in range(i, min(args.small_count, i + 32768))]
                mid += 1
                rpc(s, u, mid, "kv.set", [keys, [value] * len(keys)])
            time.sleep(0.3)
            fill = callbacks(log, start)
            start = os.path.getsize(log)
            mid += 1
            t0 = time.monotonic()
            stored = rpc(s, u, mid, "kv.set", [["mix-big"], [os.urandom(args.big_mb << 20)]])
            took = (time.monotonic() - t0) * 1000
            time.sleep(0.3)
            big = callbacks(log, start)
            s.close()
            print("  %-10s large page stored: %s, its kv.set %.1f ms" % (name, stored[0], took))
            report(name, "fill", fill)
            report(name, "large", big)
        finally:
            if os.environ.get("KEEP_LOGS"):  # a directory for the node logs
                os.replace(os.path.join(work, "node0.log"),
                           os.path.join(os.environ["KEEP_LOGS"], "%s.log" % name))
            stop_all(work, procs)


if __name__ == "__main__":
    main()
