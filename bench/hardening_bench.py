#!/usr/bin/python3
"""bench/hardening_bench.py — what issue 10's hardening costs on the hot paths.

Runs a node of this tree and a node of a base tree (a build of an earlier
revision, BASE_BUILD) side by side, interleaved run by run so that machine
noise hits both alike, and prints this tree over the base as ratios
(min / median / max over RUNS paired runs):

  health   pc-loadgen node.health, 16 connections x 16 in flight (the RPC
           path: connection classes, deadlines, budgets)
  kvget    pc-loadgen kv.get of one local 4 KiB page, 16 x 4 (plus kv.get's
           staging and reply reservation)
  accept   connect, one node.health, close, from one thread (the accept
           path: per-host table, the loopback owner lookup through
           sock_diag, timers)

Only 127.0.0.1 is contacted; nodes are stopped by PID however the script
ends. Environment: BASE_BUILD (required: a build tree with
server/peercached), PEERCACHE_BUILD_DIR [build], RUNS [5], DURATION [3],
ACCEPTS [2000]. bench/hardening_bench.sh builds the base tree for you.
JSON of every run goes to $BUILD/bench-results/hardening-<timestamp>.json.
"""
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import msgpack

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("PEERCACHE_BUILD_DIR", os.path.join(REPO, "build"))
BASE = os.environ.get("BASE_BUILD", "")
RUNS = int(os.environ.get("RUNS", "5"))
DURATION = float(os.environ.get("DURATION", "3"))
ACCEPTS = int(os.environ.get("ACCEPTS", "2000"))
LOADGEN = os.path.join(BUILD, "bench", "pc-loadgen")


def log(msg):
    print("hardening_bench: " + msg, file=sys.stderr, flush=True)


class Node:
    def __init__(self, build, name):
        self.dir = tempfile.mkdtemp(prefix="pc-hb-")
        self.logf = open(os.path.join(self.dir, "node.log"), "wb")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PEERCACHE_")}
        self.proc = subprocess.Popen(
            [os.path.join(build, "server", "peercached"), "--rpc-port", "0",
             "--data-port", "0", "--metrics-port", "0",
             "--socket", "", "--threads", "1", "--pool-size", "256mb",
             "--log-level", "info"],
            stdout=self.logf, stderr=subprocess.STDOUT, env=env)
        self.name = name
        deadline = time.time() + 10
        while time.time() < deadline:
            m = re.search(r"listening: rpc on \S+:(\d+)", self.text())
            if m:
                self.port = int(m.group(1))
                return
            time.sleep(0.05)
        self.stop()
        raise SystemExit("%s node did not start:\n%s" % (name, self.text()))

    def text(self):
        with open(self.logf.name, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def call(sock, unpacker, method, params):
    sock.sendall(msgpack.packb([0, 1, method, params]))
    while True:
        for msg in unpacker:
            return msg
        data = sock.recv(1 << 20)
        if not data:
            raise ConnectionError("closed")
        unpacker.feed(data)


def loadgen(port, method, params, conns, pipeline):
    cmd = [LOADGEN, "--port", str(port), "--mode", "msgpack-rpc", "--method",
           method, "--params-hex", msgpack.packb(params).hex(), "--conns",
           str(conns), "--pipeline", str(pipeline), "--duration", str(DURATION),
           "--warmup", "1", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=DURATION + 60)
    if out.returncode != 0:
        raise SystemExit("pc-loadgen failed: %s" % out.stderr)
    return json.loads(out.stdout)


def accepts(port):
    t0 = time.perf_counter()
    for _ in range(ACCEPTS):
        s = socket.create_connection(("127.0.0.1", port))
        call(s, msgpack.Unpacker(raw=False), "node.health", [])
        s.close()
    dt = time.perf_counter() - t0
    return {"accepts_per_s": ACCEPTS / dt, "us_per_accept": dt / ACCEPTS * 1e6}


def main():
    if not BASE or not os.path.exists(os.path.join(BASE, "server", "peercached")):
        raise SystemExit("set BASE_BUILD to a build tree of the base revision "
                         "(bench/hardening_bench.sh makes one)")
    nodes = {}
    try:
        nodes["new"] = Node(BUILD, "new")
        nodes["base"] = Node(BASE, "base")
        page = os.urandom(4096)
        for n in nodes.values():
            s = socket.create_connection(("127.0.0.1", n.port))
            r = call(s, msgpack.Unpacker(raw=False), "kv.set", [["hb-page"], [page]])
            assert r[2] is None and r[3] == [True], r
            s.close()
        cases = {
            "health": lambda p: loadgen(p, "node.health", [], 16, 16),
            "kvget": lambda p: loadgen(p, "kv.get", [["hb-page"]], 16, 4),
            "accept": accepts,
        }
        results = {c: {"new": [], "base": []} for c in cases}
        for run in range(RUNS):
            for case, fn in cases.items():
                order = ["new", "base"] if run % 2 == 0 else ["base", "new"]
                for who in order:
                    res = fn(nodes[who].port)
                    results[case][who].append(res)
                log("run %d/%d %s done" % (run + 1, RUNS, case))
    finally:
        for n in nodes.values():
            n.stop()

    def metric(case, r):
        return r["accepts_per_s"] if case == "accept" else r["ops_per_s"]

    print("| case | new (median) | base (median) | new/base min | median | max |")
    print("|---|---|---|---|---|---|")
    summary = {}
    for case in cases:
        new = [metric(case, r) for r in results[case]["new"]]
        base = [metric(case, r) for r in results[case]["base"]]
        ratios = sorted(a / b for a, b in zip(new, base))
        summary[case] = {"new_median": statistics.median(new),
                         "base_median": statistics.median(base),
                         "ratio_min": ratios[0],
                         "ratio_median": statistics.median(ratios),
                         "ratio_max": ratios[-1]}
        unit = "accepts/s" if case == "accept" else "calls/s"
        print("| %s | %.0f %s | %.0f %s | %.2f | %.2f | %.2f |" % (
            case, summary[case]["new_median"], unit, summary[case]["base_median"],
            unit, ratios[0], statistics.median(ratios), ratios[-1]))
    for case in ("health", "kvget"):
        p99n = statistics.median(r["p99_us"] for r in results[case]["new"])
        p99b = statistics.median(r["p99_us"] for r in results[case]["base"])
        print("\n%s p99: new %.0f us, base %.0f us (medians)" % (case, p99n, p99b))
    out_dir = os.path.join(BUILD, "bench-results")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "hardening-%d.json" % int(time.time()))
    with open(path, "w") as f:
        json.dump({"runs": results, "summary": summary, "runs_per_case": RUNS,
                   "duration_s": DURATION, "accepts": ACCEPTS,
                   "loadavg": open("/proc/loadavg").read().split()[:3]}, f, indent=1)
    log("results in %s" % path)


if __name__ == "__main__":
    main()
