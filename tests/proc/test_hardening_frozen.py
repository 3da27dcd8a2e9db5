"""Issue 10, finding 7: one frozen peer must not stall the cluster.

Three nodes; pages published from all of them. Clients on the two healthy
nodes run kv.get / kv.set / kv.exists (keys whose pages or directory owners
include the frozen node, and keys that do not) while the third node is
SIGSTOPped for 20 s. Every call must return within request_deadline (1 s;
asserted with slack), calls not touching the frozen node stay fast,
throughput comes back soon after the node is marked suspect, no byte is
wrong, and after SIGCONT the node is probed back healthy and its pages are
hits again.

Before the fix a call touching the frozen node blocked for the directory
timeout plus the data timeout (5 s + 5 s) and nothing remembered the dead
peer, so every call waited again.
"""
import mmap
import os
import random
import signal
import socket
import threading
import time

import msgpack

from conftest import RpcClient, freeze, metrics_of
from test_p2p import page as oracle_page   # bytes derived from the key

PAGE = 2048
PER_NODE = 120          # pages each node publishes before the freeze
FREEZE_S = 20.0
WARM_S = 3.0
BUCKET_S = 0.25
LIMIT_S = 2.5           # request_deadline is 1 s; slack for a noisy host


def page(key):
    return oracle_page(key, PAGE)


class Session(RpcClient):
    """A local client of the Unix socket with one shared-memory region (as
    the SGLang shim uses it, without the library)."""

    def __init__(self, path, size):
        super().__init__(path, timeout=60)
        self.fd = os.memfd_create("frozen-test", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, size)
        self.mem = mmap.mmap(self.fd, size)
        self.msgid += 1
        socket.send_fds(self.sock, [msgpack.packb(
            [0, self.msgid, "session.register", [1, size]])], [self.fd])
        msg = self.recv()
        assert msg[2] is None, msg

    def close(self):
        super().close()
        self.mem.close()
        os.close(self.fd)


def pct(values, q):
    if not values:
        return 0.0
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def test_frozen_peer_is_skipped_within_the_deadline(cluster):
    # A pool far larger than what the load sets (~100k pages of 2 KiB at
    # most): every page set stays readable, evictions play no part here.
    a, b, f = cluster(3, "--pool-size", "512mb")
    live = (a, b)
    keys = {n: ["fz-%d-%d" % (i, j) for j in range(PER_NODE)]
            for i, n in enumerate((a, b, f))}
    # Set-up, not under test: on a heavily loaded host a call can run into
    # the 1 s request deadline, so a set or read that falls short is tried
    # again (sets are idempotent) before the measured run starts.
    for n in (a, b, f):
        c = RpcClient(n.endpoint("rpc"))
        ks = keys[n]
        for s in range(0, len(ks), 40):
            batch = ks[s:s + 40]
            for _ in range(3):
                err, ok = c.call("kv.set", [batch, [page(k) for k in batch]])
                if err is None and ok == [True] * len(batch):
                    break
            assert err is None and ok == [True] * len(batch), (err, ok)
        c.close()
    # Every page readable from both healthy nodes before the freeze.
    for n in live:
        c = RpcClient(n.endpoint("rpc"))
        allk = keys[a] + keys[b] + keys[f]
        for _ in range(3):
            err, got = c.call("kv.get", [allk])
            assert err is None
            # A miss may be tried again; wrong bytes never.
            assert all(g is None or g == page(k) for g, k in zip(got, allk))
            if all(g is not None for g in got):
                break
        assert err is None and all(g == page(k) for g, k in zip(got, allk))
        c.close()

    stop = threading.Event()
    lock = threading.Lock()
    calls = []      # (t_start, t_end, node index, kind)
    wrong = []
    errors = []
    set_failed = []
    new_keys = []   # published during the run, read back later

    def note(t0, t1, kind, k, res, got):
        """One call's outcome: res the reply, got the page bytes a get
        returned (None for a miss)."""
        with lock:
            calls.append((t0, t1, kind))
            if kind.endswith("set"):
                (new_keys if res == [True] else set_failed).append(k)
            elif got is not None and got != page(k):
                wrong.append(k)

    def client(node, other, seed):
        c = RpcClient(node.endpoint("rpc"), timeout=60)
        rnd = random.Random(seed)
        me = "c%d" % seed
        try:
            n = 0
            while not stop.is_set():
                r = rnd.random()
                if r < 0.25:
                    kind, k = "get_local", rnd.choice(keys[node])
                elif r < 0.5:
                    kind, k = "get_live", rnd.choice(keys[other])
                elif r < 0.7:
                    kind, k = "get_frozen", rnd.choice(keys[f])
                elif r < 0.85:
                    kind, k = "set", "new-%s-%d" % (me, n)
                    n += 1
                else:
                    kind, k = "exists", rnd.choice(keys[other] + keys[f])
                t0 = time.monotonic()
                if kind == "set":
                    err, res = c.call("kv.set", [[k], [page(k)]])
                elif kind == "exists":
                    err, res = c.call("kv.exists", [[k]])
                else:
                    err, res = c.call("kv.get", [[k]])
                t1 = time.monotonic()
                assert err is None, err
                note(t0, t1, kind, k, res,
                     res[0] if kind.startswith("get") else None)
        except Exception as e:  # surfaced by the main thread
            errors.append(e)
        finally:
            c.close()

    def shim(node, other, seed):
        """session.get / session.set through shared memory."""
        c = Session(node.endpoint("socket"), 64 * PAGE)
        rnd = random.Random(seed)
        try:
            n = 0
            while not stop.is_set():
                slot = rnd.randrange(64) * PAGE
                if rnd.random() < 0.3:
                    kind, k = "session_set", "shm-%d-%d" % (seed, n)
                    n += 1
                    c.mem[slot:slot + PAGE] = page(k)
                else:
                    kind = "session_get"
                    k = rnd.choice(keys[other] + keys[f] + keys[node])
                    c.mem[slot:slot + PAGE] = bytes(PAGE)
                t0 = time.monotonic()
                err, res = c.call(kind.replace("_", "."),
                                  [1, [[k, slot, PAGE]]])
                t1 = time.monotonic()
                assert err is None, err
                note(t0, t1, kind, k, res,
                     bytes(c.mem[slot:slot + PAGE])
                     if kind == "session_get" and res[0] else None)
        except Exception as e:
            errors.append(e)
        finally:
            c.close()

    suspect_at = []

    def monitor():
        while not stop.is_set():
            for n in live:
                try:
                    m = metrics_of(n)
                except OSError:
                    continue
                if m.get("peercache_peers_suspect", 0) >= 1 and not suspect_at:
                    suspect_at.append(time.monotonic())
            time.sleep(0.05)

    threads = [threading.Thread(target=client, args=(a, b, 1)),
               threading.Thread(target=client, args=(a, b, 2)),
               threading.Thread(target=client, args=(b, a, 3)),
               threading.Thread(target=client, args=(b, a, 4)),
               threading.Thread(target=shim, args=(a, b, 5)),
               threading.Thread(target=monitor)]
    for t in threads:
        t.start()
    frozen = False
    try:
        time.sleep(WARM_S)
        t_freeze = time.monotonic()
        freeze(f.proc.pid)
        frozen = True
        time.sleep(FREEZE_S / 2)
        c = RpcClient(a.endpoint("rpc"))
        members = c.call("cluster.members")[1]
        c.close()
        time.sleep(FREEZE_S / 2)
    finally:
        if frozen:
            os.kill(f.proc.pid, signal.SIGCONT)
    t_thaw = time.monotonic()
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join(90)
    assert not errors, errors[0]

    lat = [t1 - t0 for t0, t1, _ in calls]
    worst = max(lat)
    local = [t1 - t0 for t0, t1, k in calls
             if k == "get_local" and t_freeze <= t0 < t_thaw]
    worst_of = {}
    for t0, t1, k in calls:
        worst_of[k] = max(worst_of.get(k, 0.0), t1 - t0)
    # Throughput per 250 ms bucket, by completion time.
    nb = int((t_thaw - t_freeze + WARM_S) / BUCKET_S) + 1
    t_base = t_freeze - WARM_S
    buckets = [0] * nb
    for _, t1, _ in calls:
        i = int((t1 - t_base) / BUCKET_S)
        if 0 <= i < nb:
            buckets[i] += 1
    warm = buckets[2:int(WARM_S / BUCKET_S)]   # skip the ramp-up
    base_rate = sum(warm) / max(1, len(warm)) / BUCKET_S
    # The suspect mark as the healthy nodes' metrics showed it (the old
    # code has no such metric: count from the freeze then).
    mark = suspect_at[0] if suspect_at else t_freeze
    first_ok = None
    for i in range(int((mark - t_base) / BUCKET_S), nb):
        if buckets[i] / BUCKET_S >= 0.5 * base_rate:
            first_ok = t_base + i * BUCKET_S
            break
    after = buckets[int((mark + 1.5 - t_base) / BUCKET_S):
                    int((t_thaw - t_base) / BUCKET_S)]
    after_rate = sum(after) / max(1, len(after)) / BUCKET_S
    report = ("calls %d, max latency %.3f s, p99 %.4f s; local gets during "
              "the freeze p99 %.4f s; suspect %.2f s after SIGSTOP; "
              "throughput before %.0f/s, from mark+1.5 s %.0f/s, back to "
              "half %.2f s after the mark; per-bucket (calls/250 ms) around "
              "the freeze: %s" % (
                  len(calls), worst, pct(lat, 0.99), pct(local, 0.99),
                  mark - t_freeze, base_rate, after_rate,
                  (first_ok - mark) if first_ok is not None else -1,
                  buckets[int(WARM_S / BUCKET_S) - 2:
                          int(WARM_S / BUCKET_S) + 12]))
    report += "; max latency by kind: %s" % ", ".join(
        "%s %.3f s" % kv for kv in sorted(worst_of.items()))
    print(report)
    assert not wrong, "wrong bytes for %d pages, e.g. %s" % (len(wrong), wrong[:3])
    assert worst <= LIMIT_S, report
    assert not set_failed, "sets refused: %s" % set_failed[:5]
    assert suspect_at, "no node marked the frozen peer suspect"
    fid = "127.0.0.1:%d" % f.rpc_port()
    assert [m["state"] for m in members if m["id"] == fid] == ["suspect"], members
    assert after_rate >= 0.3 * base_rate, report
    assert first_ok is not None and first_ok - mark <= 1.5, report

    # After SIGCONT: probed back healthy, its pages are hits again.
    deadline = time.time() + 10
    back = False
    while time.time() < deadline and not back:
        ms = [metrics_of(n) for n in live]
        back = all(m.get("peercache_peers_suspect", 1) == 0 for m in ms)
        time.sleep(0.1)
    assert back, "the thawed node stayed suspect"
    for n in live:
        c = RpcClient(n.endpoint("rpc"))
        err, got = c.call("kv.get", [keys[f]])
        assert err is None
        assert all(g == page(k) for g, k in zip(got, keys[f])), \
            "the thawed node's pages are hits again"
        assert c.call("kv.exists", [keys[f]])[1] == len(keys[f])
        # Pages set during the freeze read back right from either node.
        sample = new_keys[::7]
        err, got = c.call("kv.get", [sample])
        bad = [(k, g is None) for g, k in zip(got, sample) if g != page(k)]
        assert err is None and not bad, (len(bad), len(sample), bad[:10])
        m = metrics_of(n)
        assert m["peercache_peer_suspect_transitions_total"] >= 1
        assert "peercache_request_deadline_exceeded_total" in m
        c.close()
    for n in live:
        assert "is suspect" in n.text() and "answers again" in n.text()
    for n in (a, b, f):
        assert n.stop() == 0


def test_request_deadline_is_configurable_and_counted(cluster):
    # One directory owner per key: the first call touching the frozen node
    # always runs into the deadline (its lookup or its read waits for it).
    a, b, f = cluster(3, "--pool-size", "64mb", "--request-deadline", "200ms",
                      "--directory-replicas", "1")
    fk = ["short-%d" % i for i in range(16)]
    cf, ca = RpcClient(f.endpoint("rpc")), RpcClient(a.endpoint("rpc"))
    assert cf.call("kv.set", [fk, [page(k) for k in fk]])[1] == [True] * 16
    assert ca.call("kv.get", [fk])[1] == [page(k) for k in fk]
    freeze(f.proc.pid)
    try:
        t0 = time.monotonic()
        err, got = ca.call("kv.get", [fk[:1]])
        first = time.monotonic() - t0
        assert err is None and got == [None]
        m = metrics_of(a)
        assert m["peercache_request_deadline_exceeded_total"] == 1
        assert m["peercache_peers_suspect"] == 1
        # Skipped now: misses without waiting, for get and exists alike.
        worst = 0.0
        for k in fk[1:]:
            t0 = time.monotonic()
            assert ca.call("kv.get", [[k]])[1] == [None]
            assert ca.call("kv.exists", [[k]])[1] == 0
            worst = max(worst, time.monotonic() - t0)
        m = metrics_of(a)
        assert m["peercache_request_deadline_exceeded_total"] == 1, m
        print("first call %.3f s (request_deadline 200 ms), then at most "
              "%.3f s" % (first, worst))
        # 200 ms, not the default 1 s (slack for a loaded host).
        assert first < 0.9 and worst < 0.9
    finally:
        os.kill(f.proc.pid, signal.SIGCONT)
    deadline = time.time() + 10
    while time.time() < deadline and metrics_of(a)["peercache_peers_suspect"]:
        time.sleep(0.05)
    assert ca.call("kv.get", [fk])[1] == [page(k) for k in fk]
    assert metrics_of(a)["peercache_peer_probes_total"] >= 1
    for n in (a, b, f):
        assert n.stop() == 0
