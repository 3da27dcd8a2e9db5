#!/usr/bin/python3
"""bench/disk_restart.py — the disk tier's warm restart (issue 14,
docs/disk.md): how long a node takes to rebuild its store index at start,
and to re-announce the pages, for a store of STORE bytes.

Knobs from the environment (defaults in brackets): PEERCACHE_BUILD_DIR
[<repo>/build], DISK_PATH [a new directory under /var/tmp; the file system
decides O_DIRECT], STORE [1gb], REGION [64mb], PAGE [262144 bytes], POOL
[64mb], RUNS [3 restarts], SET_BATCH [16 pages per kv.set].

One node writes pages until the store's live bytes reach about 90 % of
STORE (kv.set in batches, each batch waited for until it is written
through), is stopped, then restarted RUNS times on the same disk_path. Per
restart: the rebuild's own figure (its log line "store index rebuilt: N
pages ... in S s"), the time from process start to "ready", and from start
to "re-announced N pages". Then one kv.get per page checks the bytes of a
sample (every 97th page; a first get promotes, so each is asked twice).
Prints min/median/max. Only 127.0.0.1 is contacted; the node is stopped by
PID.
"""
import hashlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "proc"))
from conftest import RpcClient, metrics_of, PEERCACHED  # noqa: E402


def page(key, n):
    """Bytes derived from the key (a repeated digest: cheap for GiBs)."""
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (n // len(seed) + 1))[:n]


def size(v):
    m = re.fullmatch(r"(\d+)(kb|mb|gb)?", v.lower())
    return int(m.group(1)) << {None: 0, "kb": 10, "mb": 20, "gb": 30}[m.group(2)]


STORE = os.environ.get("STORE", "1gb")
REGION = os.environ.get("REGION", "64mb")
PAGE = int(os.environ.get("PAGE", "262144"))
POOL = os.environ.get("POOL", "64mb")
RUNS = int(os.environ.get("RUNS", "3"))
BATCH = int(os.environ.get("SET_BATCH", "16"))


class Node:
    def __init__(self, path, log):
        self.log = log
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [PEERCACHED, "--rpc-port", "0", "--data-port", "0", "--meta-port", "0",
             "--metrics-port", "0", "--threads", "2", "--pool-prefault", "false",
             "--socket", "", "--pool-size", POOL, "--disk-enabled", "true",
             "--disk-path", path, "--disk-size", STORE, "--disk-region-size",
             REGION], stdout=open(log, "wb"), stderr=subprocess.STDOUT)

    def text(self):
        with open(self.log, "rb") as f:
            return f.read().decode(errors="replace")

    def wait_for(self, needle, timeout=600):
        while needle not in self.text():
            if self.proc.poll() is not None or time.monotonic() - self.t0 > timeout:
                raise SystemExit("node: no %r:\n%s" % (needle, self.text()[-3000:]))
            time.sleep(0.01)
        return time.monotonic() - self.t0

    def endpoint(self, name):
        return re.search(r"listening: %s on (\S+)" % name, self.text()).group(1)

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(60)


def summary(name, xs):
    print("| %s | %.3f | %.3f | %.3f |" % (name, min(xs), statistics.median(xs), max(xs)))


def main():
    path = os.environ.get("DISK_PATH") or tempfile.mkdtemp(prefix="pc-disk-", dir="/var/tmp")
    logs = tempfile.mkdtemp(prefix="pc-disk-logs-")
    try:
        n = Node(path, os.path.join(logs, "fill.log"))
        n.wait_for("ready")
        cl = RpcClient(n.endpoint("rpc"), timeout=60)
        target = size(STORE) * 9 // 10
        keys = []
        while len(keys) * PAGE < target:
            part = ["restart/%d" % (len(keys) + i) for i in range(BATCH)]
            err, ok = cl.call("kv.set", [part, [page(k, PAGE) for k in part]])
            assert err is None and all(ok), (err, ok)
            keys += part
            while metrics_of(n).get("peercache_disk_writes_total", 0) < len(keys):
                time.sleep(0.005)
        m = metrics_of(n)
        stored = int(m["peercache_disk_keys"])
        print("store %s, regions %s, %d pages of %d bytes written, %d held "
              "(%.2f GiB), direct I/O %d" % (STORE, REGION, len(keys), PAGE, stored,
                                             m["peercache_disk_bytes_used"] / 2**30,
                                             m["peercache_disk_direct_io"]),
              file=sys.stderr)
        assert n.stop() == 0
        rebuild, ready, announced = [], [], []
        for run in range(RUNS):
            n = Node(path, os.path.join(logs, "run%d.log" % run))
            ready.append(n.wait_for("ready"))
            announced.append(n.wait_for("re-announced"))
            got = re.search(r"store index rebuilt: (\d+) pages? .* in ([\d.]+) s", n.text())
            assert int(got.group(1)) == stored, n.text()
            rebuild.append(float(got.group(2)))
            if run == RUNS - 1:
                cl = RpcClient(n.endpoint("rpc"), timeout=60)
                held = set(keys[-stored:])
                for k in keys[::97]:
                    if k not in held:
                        continue
                    v = None
                    for _ in range(50):
                        v = cl.call("kv.get", [[k]])[1][0]
                        if v is not None:
                            break
                        time.sleep(0.01)
                    assert v == page(k, PAGE), k
            assert n.stop() == 0
        print("| seconds (%d restarts, %d pages) | min | median | max |" % (RUNS, stored))
        print("|---|---|---|---|")
        summary("index rebuild (log)", rebuild)
        summary("start to ready", ready)
        summary("start to re-announced", announced)
    finally:
        if not os.environ.get("DISK_PATH"):
            shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)


if __name__ == "__main__":
    main()
