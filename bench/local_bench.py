#!/usr/bin/python3
"""bench/local_bench.py — local clients on every core (issue 11, item 7).

Run through bench/local_bench.sh (it builds the base tree). For each of RUNS
rounds, a node of the base tree and one of this tree (order alternating, so
noise hits both alike), each with 2 reactor threads, get the same load:

  load    SHIMS (2) client processes (python/peercache/client.py over
          libpeercache, what the SGLang shim calls) on the node's Unix
          socket, each setting BATCH (32) fresh pages of PAGE (4 MiB) from
          its shared-memory region and getting them back, for DURATION s
  probe   PROBES (6) TCP connections to the RPC port, node.health on each
          in turn, one at a time (~1 ms apart), round trip per connection

and reports, medians (min-max) over the runs:

  share   the busiest reactor's share of the reactor threads' CPU time
          (/proc/<pid>/task/*/stat of threads pc-r0, pc-r1): 100 % = all
          work on one core, 50 % = shared evenly
  health  node.health p50 and p99 over all probe replies, and the worst
          connection's p99 ("on every connection")
  >1ms    probe replies slower than 1 ms (what a stall looks like outside)
  stalls  reactor callbacks over 1 ms by the node's own detector
          (peercache_reactor_stalls_total; n/a in a tree without it);
          wall-clock, so a reactor thread the kernel preempted counts too;
          this tree runs with reactor_stall_cpu_clock=true, which counts
          the stalls that also took > 1 ms of the thread's CPU
          (peercache_reactor_stalls_cpu_total; in each tree that has
          reactor_stall_cpu_clock), and of the others those in which the
          reactor slept in the kernel, e.g. on the mmap lock
          (peercache_reactor_stalls_blocked_total, where the tree has
          it); "preempted" is the reactor
          threads' involuntary context switches
  load    the machine's load average over the run (others' work counts)
  GB/s    pages the clients set plus got, per second

Only 127.0.0.1 and Unix sockets in a temporary directory are used; nodes
and clients are stopped by PID however the script ends. Environment:
BASE_BUILD (a build tree of the base revision), PEERCACHE_BUILD_DIR
[build], RUNS [3], DURATION [6], SHIMS [2], BATCH [32], PAGE_MB [4],
PROBES [6], WAIT_PREFAULT [1; 0: load starts at ready, during the pool
prefault], AFTER_ARGS [unset; more peercached options for the "after"
node only — with BASE_BUILD set to the same tree this compares a setting
with its default side by side, e.g. "--reactor-nice -5" or
"--copy-slice-bytes 256kb"], BASE_ARGS [unset; the same for the "base"
node, e.g. "--session-prefault false" to compare with a default off], TOUCH_DST [0; 1:
the clients also write the half of their region their gets land in before
the load, as memory a client already uses], STALL_DETAIL [0; 1: nodes log
at debug level, where this tree's detector logs every stall with its CPU
time and page faults, and each run counts them by callback kind: stalls,
those over 1 ms of CPU, their page faults; a tree without those lines
gives only its rate-limited ones]. JSON of every run goes to
$BUILD/bench-results/local-<ts>.json.
"""
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import msgpack

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests", "proc"))
from conftest import metrics_of  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("PEERCACHE_BUILD_DIR", os.path.join(REPO, "build"))
BASE = os.environ.get("BASE_BUILD", "")
RUNS = int(os.environ.get("RUNS", "3"))
DURATION = float(os.environ.get("DURATION", "6"))
SHIMS = int(os.environ.get("SHIMS", "2"))
BATCH = int(os.environ.get("BATCH", "32"))
PAGE = int(float(os.environ.get("PAGE_MB", "4")) * (1 << 20))
PROBES = int(os.environ.get("PROBES", "6"))
WAIT_PREFAULT = os.environ.get("WAIT_PREFAULT", "1") != "0"
AFTER_ARGS = os.environ.get("AFTER_ARGS", "").split()
BASE_ARGS = os.environ.get("BASE_ARGS", "").split()
TOUCH_DST = os.environ.get("TOUCH_DST", "0") == "1"
STALL_DETAIL = os.environ.get("STALL_DETAIL", "0") == "1"
CLK = os.sysconf("SC_CLK_TCK")


# A stall line of a node at log level debug (every stall, with CPU time and
# page faults, in trees whose detector logs them; reactor/stall.c).
STALL_RE = re.compile(r"\[r\d+/stall\] r\d+: (\w+ .*?)(?: on conn \d+)? ran ([\d.]+) ms"
                      r"(?:, ([\d.]+) ms of it on the CPU[^,]*, (\d+) page faults)?")


def stall_kinds(text):
    """{callback kind: [stalls, of them > 1 ms of CPU, their page faults]}
    from a node's debug log (STALL_DETAIL)."""
    out = {}
    for m in STALL_RE.finditer(text):
        k = out.setdefault(m.group(1), [0, 0, 0])
        k[0] += 1
        if m.group(3) and float(m.group(3)) > 1.0:
            k[1] += 1
            k[2] += int(m.group(4))
    return out


def log(msg):
    print("local_bench: " + msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------ client side

def shim_main(sock, ident, duration, out):
    """One client process: set BATCH fresh pages, get them back, repeat."""
    sys.path.insert(0, os.path.join(REPO, "python"))
    from peercache.client import Client
    c = Client(sock)
    rid, addr = c.region_create(2 * BATCH * PAGE)
    for i in range(BATCH):
        ctypes.memset(addr + i * PAGE, (ident * 31 + i) & 0xff, PAGE)
    if TOUCH_DST:  # the get half too, as memory a client already uses
        ctypes.memset(addr + BATCH * PAGE, 0, BATCH * PAGE)
    src = [i * PAGE for i in range(BATCH)]
    dst = [(BATCH + i) * PAGE for i in range(BATCH)]
    lens = [PAGE] * BATCH
    moved = fails = it = 0
    end = time.time() + duration
    while time.time() < end:
        keys = [b"lb-%d-%d-%d-%d" % (os.getpid(), ident, it, i) for i in range(BATCH)]
        ok = c.set(rid, keys, src, lens)
        ok2 = c.get(rid, keys, dst, lens)
        moved += (sum(ok) + sum(ok2)) * PAGE
        fails += ok.count(False) + ok2.count(False)
        it += 1
    c.close()
    with open(out, "w") as f:
        json.dump({"bytes": moved, "fails": fails, "batches": it}, f)


# -------------------------------------------------------------- the node

class Node:
    def __init__(self, build, name, extra=()):
        self.dir = tempfile.mkdtemp(prefix="pc-lb-")
        self.sock = os.path.join(self.dir, "pc.sock")
        self.logf = open(os.path.join(self.dir, "node.log"), "wb")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PEERCACHE_")}
        self.proc = subprocess.Popen(
            [os.path.join(build, "server", "peercached"), "--rpc-port", "0",
             "--data-port", "0", "--meta-port", "0", "--metrics-port", "0",
             "--socket", self.sock, "--threads", "2", "--pool-size", "1gb",
             "--log-level", "info"] + list(extra),
            stdout=self.logf, stderr=subprocess.STDOUT, env=env)
        self.name = name
        deadline = time.time() + 40
        while time.time() < deadline:
            t = self.text()
            m = re.search(r"listening: rpc on \S+:(\d+)", t)
            mm = re.search(r"listening: metrics on \S+:(\d+)", t)
            # Load starts once the pool is faulted in (the prefault thread
            # otherwise competes with the reactors for the two cores), or
            # with WAIT_PREFAULT=0 as soon as the node is ready, while the
            # prefault runs (what a user starting a node under load sees).
            if m and mm and "ready" in t and (not WAIT_PREFAULT or "faulted in" in t
                                              or time.time() > deadline - 5):
                self.port, self.mport = int(m.group(1)), int(mm.group(1))
                return
            time.sleep(0.05)
        text = self.text()
        self.stop()
        raise SystemExit("%s node did not start:\n%s" % (name, text))

    def text(self):
        with open(self.logf.name, "rb") as f:
            return f.read().decode(errors="replace")

    def reactor_cpu(self):
        """{thread name: CPU seconds} of the reactor threads, and
        {"preempted": involuntary context switches of them all}."""
        out = {"preempted": 0, "minflt": 0}
        tdir = "/proc/%d/task" % self.proc.pid
        for tid in os.listdir(tdir):
            try:
                with open(os.path.join(tdir, tid, "stat")) as f:
                    st = f.read()
            except OSError:
                continue
            name = st[st.index("(") + 1:st.rindex(")")]
            if re.fullmatch(r"pc-r\d+", name):
                fields = st[st.rindex(")") + 2:].split()
                out[name] = (int(fields[11]) + int(fields[12])) / CLK
                out["minflt"] += int(fields[7]) + int(fields[9])
                with open(os.path.join(tdir, tid, "status")) as f:
                    for line in f:
                        if line.startswith("nonvoluntary_ctxt_switches:"):
                            out["preempted"] += int(line.split()[1])
        return out

    def endpoint(self, name):
        return "127.0.0.1:%d" % {"metrics": self.mport, "rpc": self.port}[name]

    def metrics(self):
        return metrics_of(self)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()
        shutil.rmtree(self.dir, ignore_errors=True)  # its log, socket, shim results


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def probe(port, seconds):
    """node.health round trips (s) per connection, one call at a time."""
    conns = [socket.create_connection(("127.0.0.1", port), timeout=10)
             for _ in range(PROBES)]
    for c in conns:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    lat = [[] for _ in conns]
    up = msgpack.Unpacker(raw=False)
    msgid = 0
    end = time.time() + seconds
    while time.time() < end:
        for i, c in enumerate(conns):
            msgid += 1
            t0 = time.perf_counter()
            c.sendall(msgpack.packb([0, msgid, "node.health", []]))
            got = None
            while got is None:
                up.feed(c.recv(65536))
                for m in up:
                    got = m
            lat[i].append(time.perf_counter() - t0)
            time.sleep(0.001)
    for c in conns:
        c.close()
    return lat


def has_cpu_clock(build):
    out = subprocess.run([os.path.join(build, "server", "peercached"), "--help"],
                         capture_output=True, text=True, check=False)
    return "--reactor-stall-cpu-clock" in out.stdout + out.stderr


def one_run(build, name):
    # Callbacks are also timed in CPU time, to tell stalls a reactor worked
    # through from preemptions, in each tree that has that setting.
    extra = ["--reactor-stall-cpu-clock", "true"] if has_cpu_clock(build) else []
    extra += AFTER_ARGS if name == "after" else BASE_ARGS
    if STALL_DETAIL:
        extra += ["--log-level", "debug"]
    node = Node(build, name, extra)
    try:
        m0 = node.metrics()
        cpu0 = node.reactor_cpu()
        outs = [os.path.join(node.dir, "shim%d.json" % i) for i in range(SHIMS)]
        shims = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--shim",
                                   node.sock, str(i), str(DURATION), outs[i]])
                 for i in range(SHIMS)]
        try:
            time.sleep(0.5)  # let the clients connect and fill their regions
            lat = probe(node.port, DURATION - 1.0)
            for p in shims:
                p.wait(DURATION + 120)
        finally:
            for p in shims:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        cpu1 = node.reactor_cpu()
        m1 = node.metrics()
        res = [json.load(open(o)) for o in outs]
        preempted = cpu1.pop("preempted") - cpu0.pop("preempted")
        minflt = cpu1.pop("minflt") - cpu0.pop("minflt")
        busy = {k: cpu1.get(k, 0) - cpu0.get(k, 0) for k in cpu1}
        total = sum(busy.values()) or 1e-9
        flat = [x for l in lat for x in l]
        stall_keys = [k for k in m1 if k.startswith("peercache_reactor_stalls_total")]
        stalls = (sum(m1[k] - m0.get(k, 0) for k in stall_keys) if stall_keys else None)
        cpu_keys = [k for k in m1 if k.startswith("peercache_reactor_stalls_cpu_total")]
        stalls_cpu = (sum(m1[k] - m0.get(k, 0) for k in cpu_keys) if cpu_keys else None)
        blk_keys = [k for k in m1 if k.startswith("peercache_reactor_stalls_blocked_total")]
        stalls_blocked = (sum(m1[k] - m0.get(k, 0) for k in blk_keys) if blk_keys else None)
        maxcb = max((m1[k] for k in m1
                     if k.startswith("peercache_reactor_callback_max_seconds")),
                    default=None)
        local = {k: m1[k] for k in m1 if k.startswith("peercache_rpc_local_connections")}
        return {
            "tree": name,
            "share_max": max(busy.values()) / total,
            "reactor_cpu_s": busy,
            "p50_ms": pct(flat, 0.50) * 1e3,
            "p99_ms": pct(flat, 0.99) * 1e3,
            "worst_conn_p99_ms": max(pct(l, 0.99) for l in lat) * 1e3,
            "max_ms": max(flat) * 1e3,
            "slow_replies": sum(1 for x in flat if x > 1e-3),
            "replies": len(flat),
            "preempted": preempted,
            "reactor_faults": minflt,
            "stalls": stalls,
            "stalls_cpu": stalls_cpu,
            "stalls_blocked": stalls_blocked,
            "callback_max_ms": maxcb * 1e3 if maxcb is not None else None,
            "local_conns": local,
            "gbps": sum(r["bytes"] for r in res) / DURATION / 1e9,
            "fails": sum(r["fails"] for r in res),
            "load": os.getloadavg()[0],
            "stall_kinds": stall_kinds(node.text()) if STALL_DETAIL else None,
        }
    finally:
        node.stop()


def summary(rows, key):
    xs = [r[key] for r in rows if r[key] is not None]
    if not xs:
        return "n/a"
    return "%.2f (%.2f-%.2f)" % (statistics.median(xs), min(xs), max(xs))


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "--shim":
        shim_main(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
        return
    trees = [("after", BUILD)]
    if BASE:
        trees.insert(0, ("before", BASE))
    runs = {n: [] for n, _ in trees}
    for k in range(RUNS):
        order = trees if k % 2 == 0 else trees[::-1]
        for name, build in order:
            log("run %d/%d: %s" % (k + 1, RUNS, name))
            r = one_run(build, name)
            log(json.dumps(r))
            runs[name].append(r)
    cols = [("share_max", "busiest reactor's share of reactor CPU"),
            ("p50_ms", "node.health p50 (ms)"),
            ("p99_ms", "node.health p99 (ms)"),
            ("worst_conn_p99_ms", "worst connection's p99 (ms)"),
            ("max_ms", "slowest reply (ms)"),
            ("slow_replies", "probe replies > 1 ms"),
            ("stalls", "stalls > 1 ms (detector, wall clock)"),
            ("stalls_cpu", "of them > 1 ms of reactor CPU (not preempted)"),
            ("stalls_blocked", "of the rest, slept in the kernel (a lock)"),
            ("preempted", "reactor threads preempted (involuntary switches)"),
            ("reactor_faults", "page faults of the reactor threads"),
            ("callback_max_ms", "longest callback (ms)"),
            ("gbps", "client set+get GB/s"),
            ("fails", "failed pages"),
            ("load", "machine load average (1 min)")]
    print("| %d x %d x %.0f MiB, %d clients, 2 reactors | %s |" % (
        RUNS, BATCH, PAGE / (1 << 20), SHIMS, " | ".join(n for n, _ in trees)))
    print("|---|%s" % ("---|" * len(trees)))
    for key, label in cols:
        print("| %s | %s |" % (label, " | ".join(summary(runs[n], key) for n, _ in trees)))
    if STALL_DETAIL:
        for n, _ in trees:
            tot = {}
            for r in runs[n]:
                for k, v in (r["stall_kinds"] or {}).items():
                    t = tot.setdefault(k, [0, 0, 0])
                    for i in range(3):
                        t[i] += v[i]
            print("\n%s, over %d runs: callback | stalls | > 1 ms of CPU | "
                  "their page faults" % (n, len(runs[n])))
            for k, v in sorted(tot.items(), key=lambda kv: -kv[1][1]):
                print("  %s | %d | %d | %d" % (k, v[0], v[1], v[2]))
    out = os.path.join(BUILD, "bench-results")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "local-%s.json" % time.strftime("%Y%m%d-%H%M%S"))
    with open(path, "w") as f:
        json.dump(runs, f, indent=1)
    log("results in " + path)


if __name__ == "__main__":
    main()
