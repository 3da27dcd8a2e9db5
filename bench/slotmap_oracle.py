#!/usr/bin/python3
"""bench/slotmap_oracle.py — the slotmap content-oracle hammer at bench size
(issue 15, item 5): at least 10^7 checked reads, outside CI.

The same hammer as tests/proc/test_slotmap.py (tests/proc/slot_hammer.py):
three slotmap nodes, each with ONE bucket of 4 ways (slot_num_buckets 1), so
every key a node owns shares that bucket; KEYS_PER_OWNER keys per owner (more
than the ways: writes evict); writer processes on two nodes, one reader
process per node reading every key per kv.get; every page checked against
its (key, version) oracle. Prints progress on stderr and, at the end, one
line: reads, hits, misses, wrong, and the nodes' slotmap counters (local and
remote slot reads, misses, rejected snapshots, local and remote writes).
Exits 1 on any wrong page (NOCHECK=0) or when none was seen (NOCHECK=1).

Environment (defaults in brackets):
  PEERCACHE_BUILD_DIR  build tree with server/peercached [<repo>/build]
  READS                checked reads to reach [10000000]
  PAGE_KB              largest page, KiB; pages are PAGE_KB/2..PAGE_KB [64]
  KEYS_PER_OWNER       keys each node owns [6]
  WAYS                 slot_ways [4]
  WRITERS              writer processes per writing node (nodes 0 and 1) [2]
  NODE_THREADS         peercached --threads [2]
  NOCHECK              1: the negative control (PEERCACHE_TEST_SLOT_NOCHECK=1
                       on every node, a test build); runs until the first
                       wrong page or READS [0]
  WHOLE                1: readers read whole buckets, as over a one-sided
                       transport (PEERCACHE_TEST_SLOT_WHOLE_READS=1, a test
                       build); by default the owners narrow each read to
                       the key's way. Torn snapshots are far more frequent
                       with whole buckets: use it with NOCHECK [0]
  SEED                 the run's seed [random, printed]
Only 127.0.0.1 is contacted; the nodes are stopped by PID however it ends.
"""
import os
import random
import shutil
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "proc"))
os.environ.setdefault("PEERCACHE_BUILD_DIR", os.path.join(REPO, "build"))

from conftest import Node, free_ports  # noqa: E402
from slot_hammer import Hammer, pick_keys, slot_counters  # noqa: E402

READS = int(os.environ.get("READS", "10000000"))
PAGE = int(os.environ.get("PAGE_KB", "64")) * 1024
PER_OWNER = int(os.environ.get("KEYS_PER_OWNER", "6"))
WAYS = int(os.environ.get("WAYS", "4"))
WRITERS = int(os.environ.get("WRITERS", "2"))
THREADS = os.environ.get("NODE_THREADS", "2")
NOCHECK = os.environ.get("NOCHECK", "0") == "1"
WHOLE = os.environ.get("WHOLE", "0") == "1"
SEED = int(os.environ.get("SEED", random.randrange(1 << 30)))
READ_BATCH = int(os.environ.get("READ_BATCH", "0")) or None


def log(msg):
    print("slotmap_oracle: " + msg, file=sys.stderr, flush=True)


def main():
    log("seed %d, %d reads, pages %d..%d B, %d keys per owner, %d ways%s%s"
        % (SEED, READS, PAGE // 2, PAGE, PER_OWNER, WAYS,
           ", whole-bucket reads" if WHOLE else "",
           ", checksum OFF (negative control)" if NOCHECK else ""))
    work = tempfile.mkdtemp(prefix="pc-slot-oracle-")
    env = {}
    if NOCHECK:
        env["PEERCACHE_TEST_SLOT_NOCHECK"] = "1"
    if WHOLE:
        env["PEERCACHE_TEST_SLOT_WHOLE_READS"] = "1"
    env = env or None
    ports = free_ports(3)
    peers = ",".join("127.0.0.1:%d" % p for p in ports)
    nodes = []
    try:
        for i, p in enumerate(ports):
            d = os.path.join(work, "n%d" % i)
            os.mkdir(d)
            nodes.append(Node(["--rpc-port", str(p), "--peers", peers,
                               "--data-port", "0", "--meta-port", "0",
                               "--metrics-port", "0", "--socket", "",
                               "--threads", THREADS, "--pool-prefault", "false",
                               "--mode", "slotmap", "--slot-num-buckets", "1",
                               "--slot-ways", str(WAYS),
                               "--slot-max-page-bytes", "%dkb" % (PAGE // 1024),
                               "--pool-size", "%dmb" % max(16, 2 * WAYS * PAGE >> 20)],
                              env=env, tmpdir=d))
        for n in nodes:
            n.wait_for("ready", timeout=60)
        keys = pick_keys(nodes, PER_OWNER, PAGE)
        h = Hammer(keys, PAGE, SEED, read_batch=READ_BATCH)

        for i in (0, 1):
            for _ in range(WRITERS):
                h.start("writer", nodes[i])
        for n in nodes:
            h.start("reader", n)
        t0 = last = time.time()
        try:
            while True:
                t = h.wait(lambda t: t["reads"] >= READS or (NOCHECK and t["wrong"]), 10)
                now = time.time()
                if t["reads"] >= READS or t["wrong"] or t["errors"] or \
                        any(not w[2].is_alive() for w in h.workers):
                    break
                if now - last >= 30:
                    last = now
                    log("%.0f s: reads %d hits %d misses %d wrong %d (%.0f reads/s)"
                        % (now - t0, t["reads"], t["hits"], t["misses"], t["wrong"],
                           t["reads"] / (now - t0)))
        finally:
            t = h.stop()
        secs = time.time() - t0
        m = slot_counters(nodes)
        print("slotmap oracle%s: %.0f s, reads %d hits %d misses %d wrong %d errors %d | "
              "sets %d refused %d | node reads local %d remote %d miss %d rejected %d, "
              "writes local %d remote %d | seed %d"
              % (" (checksum off)" if NOCHECK else "", secs, t["reads"], t["hits"],
                 t["misses"], t["wrong"], t["errors"], t["sets"], t["refused"],
                 m["local_slot"], m["remote_slot"], m["miss"], m["rejected"],
                 m["write_local"], m["write_remote"], SEED))
        if h.examples:
            print("notes: %s" % h.examples[:5])
        for n in nodes:
            if n.stop() != 0:
                log("a node exited badly:\n" + n.text()[-3000:])
                return 1
        if t["errors"]:
            return 1
        if NOCHECK:
            return 0 if t["wrong"] else 1
        return 1 if t["wrong"] or t["reads"] < READS else 0
    finally:
        for n in nodes:
            if n.proc.poll() is None:
                n.proc.kill()
                n.proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
