#!/usr/bin/python3
"""p2p read path, two (or more) peercached builds side by side with memcached.

Starts one node per --node NAME=BINARY (2 reactor threads each, on
loopback, pool three times the working set) and a memcached (-t 2), stores
the same working set in each with pc-p2p-bench, then per reader count runs
ROUNDS rounds of one pc-p2p-bench run per target in rotating order
(memcached, then the nodes). Prints each run's GB/s and the paired ratios
(run i over run i), min / median / max: every node over memcached, and
every node over the first one. --no-lookup-too adds each node without its
per-batch dir.get (the reads alone) as a further target; --kvget-too each
node's kv.get of the batch (the pages are the node's own: staged, then sent
in the RPC reply), with the reactor stalls each node logged over its kv.get
runs (peercache_reactor_stalls_total; the CPU-bound ones with
reactor_stall_cpu_clock, which this bench turns on) and the longest loop
iteration (the bound of its peercache_reactor_iteration_hist_seconds
bucket); --health-too also
runs pc-loadgen's node.health on 2 more connections of the node during
each kv.get run, and prints its p99 (the latency of everything else while
one client moves large pages). --member-reader starts a second node of
each build and joins the two (cluster.set_peers: a two-node ring, where the
default two directory replicas put every record on both), and adds that
node's kv.get of the batch as NAME-member: the reader is a ring member, as
a node that serves SGLang is, so it looks keys up in its own replica and
reads the pages from the first node over the data port (the pages then go
to the client in the RPC reply, a hop the p2p target does not make).
Stops everything it started, by PID.

  bench/p2p_ab.py --node before=/tmp/old/build/server/peercached \\
                  --node after=build/server/peercached --size 64k --threads "1 2 4 8"
  bench/p2p_ab.py --node before=... --node after=... --size 4m --batch 8 --kvget-too \\
                  --health-too
  bench/p2p_ab.py --node before=... --node after=... --size 256k --threads 1 \\
                  --member-reader

Only 127.0.0.1 is contacted. A measurement: the exit status does not depend
on the figures (1 on a failed run, 2 on bad usage).
"""
import argparse
import json
import os
import re
import shlex
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


def set_args(ap, values_help):
    """--node, --size and --values of the benches that send one kv.set of
    large values (kvset_ab.py, frozen_owner.py)."""
    ap.add_argument("--node", action="append", required=True, metavar="NAME=BINARY",
                    help="a peercached build to measure (repeat)")
    ap.add_argument("--size", default="4m", type=size_bytes, help="value size (default 4m)")
    ap.add_argument("--values", type=int, default=8, help=values_help)


def set_specs(ap, a):
    """The builds of set_args' --node, once --size x --values fits a
    message (ap.error otherwise)."""
    if a.size * a.values > 60 << 20:
        ap.error("--size x --values must fit one 64 MiB message")
    return node_specs(ap, a.node)


def node_specs(ap, specs):
    """[(name, binary)] of the --node NAME=BINARY arguments (ap.error on a
    bad one). BINARY may carry peercached arguments after the path ("--node
    'off=build/server/peercached --reactor-idle-poll-us 0'"): start_node
    passes them after its own, so they win."""
    nodes = []
    for spec in specs:
        name, sep, binary = spec.partition("=")
        words = shlex.split(binary)
        if not sep or not name or not words or not os.access(words[0], os.X_OK):
            ap.error("--node NAME=BINARY [ARGS], an executable: %r" % spec)
        nodes.append((name, binary))
    return nodes


def start_node(work, procs, binary, k, pool_mb, faulted=False, unix_socket=""):
    """A peercached of binary (2 reactor threads, loopback, every port its
    own, reactor_stall_cpu_clock; a Unix socket only when unix_socket names
    one), added to procs, its log in work: its (rpc port, metrics port) once
    it listens (faulted: and its pool is faulted in)."""
    log = open(os.path.join(work, "node%d.log" % k), "w+")
    words = shlex.split(binary)
    p = subprocess.Popen([words[0], "--bind", "127.0.0.1", "--rpc-port", "0", "--data-port", "0",
                          "--meta-port", "0", "--metrics-port", "0", "--socket", unix_socket,
                          "--threads", "2", "--pool-size", "%dmb" % pool_mb,
                          "--log-level", "info", "--reactor-stall-cpu-clock", "true"]
                         + words[1:],
                         stdout=log, stderr=subprocess.STDOUT)
    procs.append(p)
    for _ in range(1200):
        log.seek(0)
        text = log.read()
        m = re.search(r"listening: rpc on 127\.0\.0\.1:(\d+)", text)
        mm = re.search(r"listening: metrics on 127\.0\.0\.1:(\d+)", text)
        if m and mm and (not faulted or "--pool-prefault" in words
                         or re.search(r"region faulted in|prefault stopped|"
                                      r"prefault: not supported", text)):
            return int(m.group(1)), int(mm.group(1))
        if p.poll() is not None:
            break
        time.sleep(0.05)
    log.seek(0)
    sys.exit("%s did not start:\n%s" % (binary, log.read()[-2000:]))


def stop_all(work, procs):
    """Stops procs by PID (SIGTERM, then SIGKILL after 15 s) and removes
    work."""
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


def reactor_load(mport):
    """What the node's reactors counted so far: [stalls, CPU-bound stalls,
    {le: loop iterations at most le seconds}, large blocks unmapped on the
    offload thread, stalls in which the reactor slept in the kernel] (all
    reactors together)."""
    with socket.create_connection(("127.0.0.1", mport), timeout=5) as c:
        c.sendall(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            b = c.recv(1 << 16)
            if not b:
                break
            data += b
    out = [0, 0, {}, None, None]
    for line in data.decode().splitlines():
        for i, name in ((0, "peercache_reactor_stalls_total{"),
                        (1, "peercache_reactor_stalls_cpu_total{"),
                        (3, "peercache_reactor_blocks_unmapped_off_total{"),
                        (4, "peercache_reactor_stalls_blocked_total{")):
            if line.startswith(name):
                out[i] = (out[i] or 0) + int(float(line.rsplit(" ", 1)[1]))
        m = re.match(r'peercache_reactor_iteration_hist_seconds_bucket\{.*le="([^"]+)"\} (\S+)', line)
        if m:
            le = float(m.group(1))
            out[2][le] = out[2].get(le, 0) + int(float(m.group(2)))
    return out


def load_delta(a, b):
    """b - a of reactor_load: [stalls, CPU-bound, longest iteration's
    bucket bound in seconds (inf: over the last finite one), blocks
    unmapped off the loop, stalls that slept (None: a build without the
    metric)]."""
    grew = [le for le in b[2] if b[2][le] - a[2].get(le, 0) !=
            b[2].get(float("inf"), 0) - a[2].get(float("inf"), 0)]
    longest = min((le for le in b[2] if le not in grew), default=float("inf"))
    def diff(i):
        return None if a[i] is None or b[i] is None else b[i] - a[i]
    return [b[0] - a[0], b[1] - a[1], longest, diff(3), diff(4)]


def health_start(loadgen, port, duration, warmup="1"):
    """pc-loadgen's node.health on 2 connections of the node at port, for
    duration seconds after warmup, in the background (health_p99 ends it)."""
    return subprocess.Popen(
        [loadgen, "--port", str(port), "--mode", "msgpack-rpc", "--method", "node.health",
         "--conns", "2", "--duration", str(duration), "--warmup", str(warmup), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def health_end(lg):
    """The p99 and the slowest call in ms of a health_start run, once it
    has ended."""
    out, err = lg.communicate(timeout=60)
    if lg.returncode:
        sys.exit("pc-loadgen node.health failed: %s" % err[-800:])
    j = json.loads(out)
    return j["p99_us"] / 1000, j["max_us"] / 1000


def rpc_call(port, method, params):
    """One MessagePack-RPC call to the node at 127.0.0.1:port: its
    result (exits on an error)."""
    import msgpack  # Debian's python3-msgpack; only this option needs it
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(msgpack.packb([0, 1, method, params]))
        unpacker = msgpack.Unpacker(raw=False)
        while True:
            data = c.recv(1 << 16)
            if not data:
                sys.exit("%s on port %d: connection closed" % (method, port))
            unpacker.feed(data)
            for msg in unpacker:
                if msg[2] is not None:
                    sys.exit("%s on port %d: %r" % (method, port, msg[2]))
                return msg[3]


def call(sock, unpacker, msgid, method, params):
    """One MessagePack-RPC call on an open connection (unpacker: its
    msgpack.Unpacker): the response message (exits when the node closes
    the connection)."""
    import msgpack  # Debian's python3-msgpack
    sock.sendall(msgpack.packb([0, msgid, method, params], use_bin_type=True))
    while True:
        for msg in unpacker:
            return msg
        data = sock.recv(1 << 20)
        if not data:
            sys.exit("the node closed the connection")
        unpacker.feed(data)


def round_order(n, r):
    """The order of n nodes in round r: rotated by one each round, so that
    machine noise hits every build alike."""
    return [(r + k) % n for k in range(n)]


def join(ports):
    """Make the nodes at ports (RPC) the members of one ring."""
    ids = ["127.0.0.1:%d" % p for p in ports]
    for p in ports:
        got = rpc_call(p, "cluster.set_peers", [ids])
        if sorted(got["members"]) != sorted(ids):
            sys.exit("cluster.set_peers on %d: members %r" % (p, got["members"]))


def main():
    build = os.environ.get("PEERCACHE_BUILD_DIR", os.path.join(ROOT, "build"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--node", action="append", required=True, metavar="NAME=BINARY",
                    help="a peercached build to measure (repeat; the first is the base); "
                         "arguments for it may follow the path, in the same word")
    ap.add_argument("--size", default="64k", help="value size (default 64k)")
    ap.add_argument("--threads", default="2", help='reader counts (default "2")')
    ap.add_argument("--rounds", type=int, default=6, help="rounds per reader count (default 6)")
    ap.add_argument("--duration", default="2", help="seconds per run (default 2)")
    ap.add_argument("--no-lookup-too", action="store_true",
                    help="also run each node with --no-lookup (records cached: the reads alone, "
                         "as a get after exists runs), as NAME-nolookup")
    ap.add_argument("--batch", type=int, default=32, help="keys per batch (default 32)")
    ap.add_argument("--kvget-too", action="store_true",
                    help="also run each node's kv.get of the batch, as NAME-kvget, and count "
                         "its reactor stalls over those runs")
    ap.add_argument("--health-too", action="store_true",
                    help="with --kvget-too: node.health p99 on 2 more connections during "
                         "each kv.get run (pc-loadgen)")
    ap.add_argument("--member-reader", action="store_true",
                    help="also start a second node of each build in one ring with the first "
                         "and run kv.get of the batch on it, as NAME-member (pages read "
                         "from the first node)")
    ap.add_argument("--client", default=os.path.join(build, "bench", "pc-p2p-bench"))
    ap.add_argument("--loadgen", default=os.path.join(build, "bench", "pc-loadgen"))
    a = ap.parse_args()
    nodes = node_specs(ap, a.node)
    nbytes = size_bytes(a.size)
    keys = max(64, 512 * 1048576 // nbytes, a.batch)
    common = ["--value-bytes", a.size, "--keys", str(keys), "--batch", str(a.batch)]
    work = tempfile.mkdtemp(prefix="pc-p2p-ab-")
    procs = []

    def run(args):
        out = subprocess.run([a.client, "--host", "127.0.0.1", "--json"] + args + common,
                             capture_output=True, text=True)
        if out.returncode:
            sys.exit("pc-p2p-bench %s failed: %s" % (" ".join(args), out.stderr[-800:]))
        return json.loads(out.stdout) if out.stdout.strip() else None

    try:
        pool = keys * (nbytes + 4096) * 3 // 1048576 + 256
        # faulted: the pool's background prefault (a core zeroing pages
        # for seconds) is over before anything is measured
        started = [start_node(work, procs, b, k, pool, faulted=True)
                   for k, (_, b) in enumerate(nodes)]
        ports = [p for p, _ in started]
        mports = {n: mp for (n, _), (_, mp) in zip(nodes, started)}
        readers = []
        if a.member_reader:  # before the working set is stored: records on both
            readers = [start_node(work, procs, b, len(nodes) + k, pool, faulted=True)[0]
                       for k, (_, b) in enumerate(nodes)]
            for p, q in zip(ports, readers):
                join([p, q])
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
        if a.kvget_too:
            targets += [(n + "-kvget", ["--target", "kvget", "--port", str(p)])
                        for (n, _), p in zip(nodes, ports)]
        if a.member_reader:
            targets += [(n + "-member", ["--target", "kvget", "--port", str(q)])
                        for (n, _), q in zip(nodes, readers)]
        if a.no_lookup_too:
            targets += [(n + "-nolookup", ["--target", "p2p", "--port", str(p), "--no-lookup"])
                        for (n, _), p in zip(nodes, ports)]
        base = nodes[0][0]
        for t in a.threads.split():
            gbs = {n: [] for n, _ in targets}
            stalled = {n: [0, 0, []] for n, _ in targets}
            health = {n: [] for n, _ in targets}
            for r in range(a.rounds):
                order = targets[r % len(targets):] + targets[:r % len(targets)]
                for n, args in order:
                    node = n[:-len("-kvget")] if n.endswith("-kvget") else None
                    s0 = reactor_load(mports[node]) if node else None
                    lg = None
                    if node and a.health_too:
                        port = ports[[x for x, _ in nodes].index(node)]
                        lg = health_start(a.loadgen, port, a.duration)
                    j = run(args + ["--no-setup", "--threads", t, "--duration", a.duration,
                                    "--warmup", "1"])
                    if lg:
                        health[n].append(health_end(lg)[0])
                    gbs[n].append(j["gb_per_s"])
                    if node:
                        d = load_delta(s0, reactor_load(mports[node]))
                        stalled[n][0] += d[0]
                        stalled[n][1] += d[1]
                        stalled[n][2].append(d[2])
            print("size %s, %s reader(s), %d rounds of %s s" % (a.size, t, a.rounds, a.duration))
            for n, _ in targets:
                print("  %-12s GB/s %s" % (n, " ".join("%.2f" % x for x in gbs[n])))
            for n, _ in targets:
                if n.endswith("-kvget"):
                    print("  %-12s reactor stalls over its runs (warm-up included): %d, "
                          "%d of them CPU-bound; longest loop iteration per run <= ms %s"
                          % (n, stalled[n][0], stalled[n][1],
                             " ".join("%g" % (x * 1000) for x in stalled[n][2])))
                    if health[n]:
                        h = health[n]
                        print("  %-12s node.health p99 meanwhile, ms: %.2f / %.2f / %.2f" % (
                            n, min(h), statistics.median(h), max(h)))
            for n, _ in targets[1:]:
                # each over memcached, and over the first node's same kind
                suffix = next((x for x in ("-nolookup", "-kvget", "-member")
                               if n.endswith(x)), "")
                first = base + suffix
                for other in ["memcached"] + ([first] if n != first else []):
                    rs = [x / y for x, y in zip(gbs[n], gbs[other])]
                    print("  %s / %s: %.2f / %.2f / %.2f" % (
                        n, other, min(rs), statistics.median(rs), max(rs)))
            sys.stdout.flush()
    finally:
        stop_all(work, procs)


if __name__ == "__main__":
    main()
