#!/usr/bin/python3
"""p2p read path, two (or more) peercached builds side by side with memcached.

Starts one node per --node NAME=BINARY (2 reactor threads each, on
loopback, pool three times the working set) and a memcached (-t 2), stores
the same working set in each with pc-p2p-bench, then per reader count runs
ROUNDS rounds of one pc-p2p-bench run per target in rotating order
(memcached, then the nodes). Prints each run's GB/s and the paired ratios
(run i over run i), min / median / max: every node over memcached, and
every node over the first one. --no-lookup-too adds each node without its
per-batch dir.get (the reads alone) as a further target. Stops everything
it started, by PID.

  bench/p2p_ab.py --node before=/tmp/old/build/server/peercached \\
                  --node after=build/server/peercached --size 64k --threads "1 2 4 8"

Only 127.0.0.1 is contacted. A measurement: the exit status does not depend
on the figures (1 on a failed run, 2 on bad usage).
"""
import argparse
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def size_bytes(s):
    m = re.fullmatch(r"(\d+)([km]?)", s)
    if not m:
        raise argparse.ArgumentTypeError("a size such as 64k or 1m: %r" % s)
    return int(m.group(1)) * {"": 1, "k": 1024, "m": 1 << 20}[m.group(2)]


def main():
    build = os.environ.get("PEERCACHE_BUILD_DIR", os.path.join(ROOT, "build"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--node", action="append", required=True, metavar="NAME=BINARY",
                    help="a peercached build to measure (repeat; the first is the base)")
    ap.add_argument("--size", default="64k", help="value size (default 64k)")
    ap.add_argument("--threads", default="2", help='reader counts (default "2")')
    ap.add_argument("--rounds", type=int, default=6, help="rounds per reader count (default 6)")
    ap.add_argument("--duration", default="2", help="seconds per run (default 2)")
    ap.add_argument("--no-lookup-too", action="store_true",
                    help="also run each node with --no-lookup (records cached: the reads alone, "
                         "as a get after exists runs), as NAME-nolookup")
    ap.add_argument("--client", default=os.path.join(build, "bench", "pc-p2p-bench"))
    a = ap.parse_args()
    nodes = []
    for spec in a.node:
        name, sep, binary = spec.partition("=")
        if not sep or not name or not os.access(binary, os.X_OK):
            ap.error("--node NAME=BINARY, an executable: %r" % spec)
        nodes.append((name, binary))
    nbytes = size_bytes(a.size)
    keys = max(64, 512 * 1048576 // nbytes)
    common = ["--value-bytes", a.size, "--keys", str(keys), "--batch", "32"]
    work = tempfile.mkdtemp(prefix="pc-p2p-ab-")
    procs = []

    def start_node(binary, k):
        log = open(os.path.join(work, "node%d.log" % k), "w+")
        pool = keys * (nbytes + 4096) * 3 // 1048576 + 256
        p = subprocess.Popen([binary, "--bind", "127.0.0.1", "--rpc-port", "0", "--data-port", "0",
                              "--meta-port", "0", "--metrics-port", "0", "--socket", "",
                              "--threads", "2", "--pool-size", "%dmb" % pool, "--log-level", "info"],
                             stdout=log, stderr=subprocess.STDOUT)
        procs.append(p)
        for _ in range(400):
            log.seek(0)
            m = re.search(r"listening: rpc on 127\.0\.0\.1:(\d+)", log.read())
            if m:
                return int(m.group(1))
            if p.poll() is not None:
                break
            time.sleep(0.05)
        log.seek(0)
        sys.exit("%s did not start:\n%s" % (binary, log.read()[-2000:]))

    def run(args):
        out = subprocess.run([a.client, "--host", "127.0.0.1", "--json"] + args + common,
                             capture_output=True, text=True)
        if out.returncode:
            sys.exit("pc-p2p-bench %s failed: %s" % (" ".join(args), out.stderr[-800:]))
        return json.loads(out.stdout) if out.stdout.strip() else None

    try:
        ports = [start_node(b, k) for k, (_, b) in enumerate(nodes)]
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        mport = s.getsockname()[1]
        s.close()
        user = ["-u", "root"] if os.geteuid() == 0 else []
        procs.append(subprocess.Popen(["memcached"] + user + [
            "-l", "127.0.0.1", "-p", str(mport), "-U", "0", "-I", "8m",
            "-m", str(keys * nbytes // 1048576 * 2 + 64), "-t", "2"]))
        time.sleep(0.5)
        targets = [("memcached", ["--target", "memcached", "--port", str(mport)])]
        targets += [(n, ["--target", "p2p", "--port", str(p)]) for (n, _), p in zip(nodes, ports)]
        for _, t in list(targets):
            run(t + ["--setup-only"])
        if a.no_lookup_too:
            targets += [(n + "-nolookup", ["--target", "p2p", "--port", str(p), "--no-lookup"])
                        for (n, _), p in zip(nodes, ports)]
        base = nodes[0][0]
        for t in a.threads.split():
            gbs = {n: [] for n, _ in targets}
            for r in range(a.rounds):
                order = targets[r % len(targets):] + targets[:r % len(targets)]
                for n, args in order:
                    j = run(args + ["--no-setup", "--threads", t, "--duration", a.duration,
                                    "--warmup", "1"])
                    gbs[n].append(j["gb_per_s"])
            print("size %s, %s reader(s), %d rounds of %s s" % (a.size, t, a.rounds, a.duration))
            for n, _ in targets:
                print("  %-12s GB/s %s" % (n, " ".join("%.2f" % x for x in gbs[n])))
            for n, _ in targets[1:]:
                for other in ["memcached"] + ([base] if n != base else []):
                    rs = [x / y for x, y in zip(gbs[n], gbs[other])]
                    print("  %s / %s: %.2f / %.2f / %.2f" % (
                        n, other, min(rs), statistics.median(rs), max(rs)))
            sys.stdout.flush()
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in os.listdir(work):
            os.unlink(os.path.join(work, f))
        os.rmdir(work)


if __name__ == "__main__":
    main()
