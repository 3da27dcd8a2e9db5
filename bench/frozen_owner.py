#!/usr/bin/python3
"""A large kv.set whose directory owner is frozen: when do the calls behind
it on the same connection get their answer? Two (or more) builds side by
side.

Per --node NAME=BINARY and per run: two fresh nodes of that build that name
each other in --peers (2 reactor threads, loopback), each with its pool
faulted in; the second is frozen (SIGSTOP) and a client of the first sends
one kv.set of --values fresh values of --size each and a node.health in one
write. Every record of the set also goes to the frozen node, so the set
answers only once that publication gave up (request_deadline, 1 s by
default, and a node marked suspect is skipped from then on: hence fresh
nodes each run). Prints per build the milliseconds from the write to the
node.health reply and to the set's reply, and how long the write itself
took (the node reading 32 MiB). Stops everything it started, by
PID (the frozen node is thawed first).

  bench/frozen_owner.py --node before=/tmp/old/build/server/peercached \\
                        --node after=build/server/peercached --runs 3

Only 127.0.0.1 is contacted. A measurement: the exit status does not depend
on the figures (1 on a failed run, 2 on bad usage).
"""
import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import msgpack

from p2p_ab import set_args, set_specs, stop_all


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def start_pair(work, procs, binary, pool_mb):
    """Two nodes of binary that name each other: their rpc ports once both
    listen with their pools faulted in."""
    ports = free_ports(2)
    peers = ",".join("127.0.0.1:%d" % p for p in ports)
    logs = []
    for p in ports:
        log = open(os.path.join(work, "node-%d.log" % p), "w+")
        procs.append(subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--rpc-port", str(p), "--data-port", "0",
             "--meta-port", "0", "--metrics-port", "0", "--socket", "", "--threads", "2",
             "--peers", peers, "--pool-size", "%dmb" % pool_mb, "--log-level", "info"],
            stdout=log, stderr=subprocess.STDOUT))
        logs.append(log)
    for _ in range(1200):
        ready = 0
        for log in logs:
            log.seek(0)
            text = log.read()
            ready += bool(re.search(r"listening: rpc on", text)) and "region faulted in" in text
        if ready == 2:
            return ports
        if any(p.poll() is not None for p in procs[-2:]):
            break
        time.sleep(0.05)
    logs[0].seek(0)
    sys.exit("%s did not start:\n%s" % (binary, logs[0].read()[-2000:]))


def one_run(binary, a):
    work = tempfile.mkdtemp(prefix="pc-frozen-")
    procs = []
    try:
        ports = start_pair(work, procs, binary, a.pool_mb)
        frozen = procs[1]
        sock = socket.create_connection(("127.0.0.1", ports[0]), timeout=60)
        values = [os.urandom(a.size) for _ in range(a.values)]
        keys = ["frozen-owner-%d" % i for i in range(a.values)]
        frozen.send_signal(signal.SIGSTOP)
        try:
            time.sleep(0.2)
            unpacker = msgpack.Unpacker(raw=False)
            wire = (msgpack.packb([0, 1, "kv.set", [keys, values]], use_bin_type=True) +
                    msgpack.packb([0, 2, "node.health", []]))
            t0 = time.monotonic()
            sock.sendall(wire)
            at = {0: (time.monotonic() - t0) * 1000}
            while len(at) < 3:
                data = sock.recv(1 << 20)
                if not data:
                    sys.exit("the node closed the connection")
                unpacker.feed(data)
                for msg in unpacker:
                    if msg[2] is not None:
                        sys.exit("call %d failed: %r" % (msg[1], msg[2]))
                    at[msg[1]] = (time.monotonic() - t0) * 1000
        finally:
            frozen.send_signal(signal.SIGCONT)
        sock.close()
        return at[2], at[1], at[0]
    finally:
        stop_all(work, procs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    set_args(ap, "values in the set (default 8)")
    ap.add_argument("--runs", type=int, default=3, help="runs per build (default 3)")
    ap.add_argument("--pool-mb", type=int, default=512, help="each node's pool (default 512)")
    a = ap.parse_args()
    nodes = set_specs(ap, a)
    print("kv.set of %d x %d KiB and a node.health in one write, the set's other owner frozen"
          % (a.values, a.size // 1024))
    res = {name: [] for name, _ in nodes}
    for r in range(a.runs):
        for name, binary in nodes[r % len(nodes):] + nodes[:r % len(nodes)]:
            res[name].append(one_run(binary, a))
    for name, _ in nodes:
        print("  %-10s node.health answered after ms %s; the set after ms %s "
              "(the write took ms %s)" % (
                  name, " ".join("%.0f" % x[0] for x in res[name]),
                  " ".join("%.0f" % x[1] for x in res[name]),
                  " ".join("%.0f" % x[2] for x in res[name])))


if __name__ == "__main__":
    main()
