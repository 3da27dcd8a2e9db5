#!/usr/bin/python3
"""bench/alloc_bench.py — heap allocations per kv call (issue 11, item 4).

Starts two nodes (A and B, peers of each other, one reactor each) of a build
with bench/alloc_count.c preloaded, and counts the allocations each node makes
for one call, averaged over CALLS calls, RUNS times (min / median / max):

  set          kv.set of 128 new 4 KiB pages on A (counted on A)
  get_local    kv.get of those 128 keys on A: local hits (counted on A)
  get_remote   kv.get of the same keys on B: remote hits (counted on B, the
               reader; A's share — directory owner and data server — is
               printed as get_remote_peer)
  set_evicting kv.set of 128 new 4 KiB pages on C, a single node whose 4 MiB
               pool is full: each set evicts about as many pages as it
               stores, and their records are unpublished

The count is the whole process's, everything a call makes: RPC framing,
reply buffers, directory round trips and transport reads included.
Environment: PEERCACHE_BUILD_DIR [build] (the build measured; needs
bench/pc-alloc-count.so, not a sanitized tree), RUNS [5], CALLS [20].
Only 127.0.0.1 is contacted; nodes are stopped by PID however it ends.
"""
import mmap
import os
import re
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import msgpack

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hardening_bench  # noqa: E402  (its Node's log and stop)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("PEERCACHE_BUILD_DIR", os.path.join(REPO, "build"))
RUNS = int(os.environ.get("RUNS", "5"))
CALLS = int(os.environ.get("CALLS", "20"))
KEYS = 128
PAGE = 4096


def free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class Node(hardening_bench.Node):
    # pylint: disable=super-init-not-called
    def __init__(self, port, peers, preload, pool="256mb"):
        self.dir = tempfile.mkdtemp(prefix="pc-ab-")
        self.count_path = os.path.join(self.dir, "allocs")
        self.logf = open(os.path.join(self.dir, "node.log"), "wb")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PEERCACHE_")}
        env["LD_PRELOAD"] = preload
        env["PC_ALLOC_COUNT_FILE"] = self.count_path
        self.proc = subprocess.Popen(
            [os.path.join(BUILD, "server", "peercached"), "--rpc-port", str(port),
             "--peers", peers, "--data-port", "0", "--metrics-port", "0",
             "--socket", "", "--threads", "1", "--pool-size", pool,
             "--pool-prefault", "false", "--log-level", "info"],
            stdout=self.logf, stderr=subprocess.STDOUT, env=env)
        self.port = port
        deadline = time.time() + 20
        while not re.search(r"node \S+ ready", self.text()):
            if time.time() > deadline or self.proc.poll() is not None:
                self.stop()
                raise SystemExit("node did not start:\n" + self.text())
            time.sleep(0.05)
        with open(self.count_path, "r+b") as f:
            self.map = mmap.mmap(f.fileno(), 4096)
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.unpacker = msgpack.Unpacker(raw=False)
        self.msgid = 0

    def allocs(self):
        return struct.unpack_from("<Q", self.map, 0)[0]

    def call(self, method, params):
        self.msgid += 1
        self.sock.sendall(msgpack.packb([0, self.msgid, method, params]))
        while True:
            for msg in self.unpacker:
                if msg[2] is not None:
                    raise SystemExit("%s failed: %r" % (method, msg[2]))
                return msg[3]
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed")
            self.unpacker.feed(data)


def per_call(nodes, fn):
    """Allocations per call on each node: (delta / CALLS, ...)."""
    before = [n.allocs() for n in nodes]
    for i in range(CALLS):
        fn(i)
    return [(n.allocs() - b) / CALLS for n, b in zip(nodes, before)]


def main():
    preload = os.path.join(BUILD, "bench", "pc-alloc-count.so")
    if not os.path.exists(preload):
        raise SystemExit("no %s: build the bench in a tree without sanitizers" % preload)
    ports = free_ports(3)
    peers = ",".join("127.0.0.1:%d" % p for p in ports[:2])
    nodes = []
    try:
        nodes = [Node(p, peers, preload) for p in ports[:2]]
        a, b = nodes
        c = Node(ports[2], "127.0.0.1:%d" % ports[2], preload, "4mb")
        nodes.append(c)
        val = os.urandom(PAGE)
        res = {"set": [], "get_local": [], "get_remote": [], "get_remote_peer": [],
               "set_evicting": []}
        for i in range(16):  # fill C's pool: 8 MiB of pages into 4 MiB
            c.call("kv.set", [["fill-%d-%d" % (i, k) for k in range(KEYS)], [val] * KEYS])
        for run in range(RUNS):
            keys = [["ab-%d-%d-%d" % (run, c, k) for k in range(KEYS)] for c in range(CALLS)]
            s = per_call([a], lambda i: a.call("kv.set", [keys[i], [val] * KEYS]))
            res["set"].append(s[0])
            for i in range(CALLS):  # warm: the first get of a key costs nothing extra
                assert all(v is not None for v in a.call("kv.get", [keys[i]]))
            g = per_call([a], lambda i: a.call("kv.get", [keys[i]]))
            res["get_local"].append(g[0])
            for i in range(CALLS):
                got = b.call("kv.get", [keys[i]])
                if any(v is None for v in got):
                    raise SystemExit("remote get missed %d pages" % sum(v is None for v in got))
            r = per_call([b, a], lambda i: b.call("kv.get", [keys[i]]))
            res["get_remote"].append(r[0])
            res["get_remote_peer"].append(r[1])
            e = per_call([c], lambda i: c.call("kv.set", [keys[i], [val] * KEYS]))
            res["set_evicting"].append(e[0])
        print("allocations per call (%d keys of %d bytes; %d runs of %d calls; "
              "min / median / max):" % (KEYS, PAGE, RUNS, CALLS))
        for case, v in res.items():
            print("  %-16s %8.1f %8.1f %8.1f" % (case, min(v), statistics.median(v), max(v)))
    finally:
        for n in nodes:
            n.stop()


if __name__ == "__main__":
    sys.exit(main())
