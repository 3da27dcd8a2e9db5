"""The bad-input corpus replayed against every port of a running node (issue
18, item 3): tests/corpus/bad-input/<port>/*.bin (written by
tests/corpus/make_port_corpus.py: wrong types for every RPC method, huge
declared lengths and counts, truncations, bytes meant for another port,
junk) on the RPC port, the Unix socket, the data port and the metrics port,
plus floods and slow senders made at run time. Every case, on a fresh
connection half-closed after the write, is answered or closed within 1 s;
a well-behaved client on each port is served after every case; the node
never dies, keeps its memory within a bound, and is left with no client
connection open."""
import glob
import os
import random
import socket
import time

import pytest

from conftest import SANITIZED, RpcClient, metrics_of, report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "corpus", "bad-input")
PORTS = ("rpc", "unix", "data", "http")
DEADLINE = 1.0


def cases(port):
    return sorted(glob.glob(os.path.join(CORPUS, port, "*.bin")))


def connect(node, port, timeout):
    if port == "unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.connect(node.endpoint("socket"))
        return s
    name = {"rpc": "rpc", "data": "data", "http": "metrics"}[port]
    host, p = node.endpoint(name).rsplit(":", 1)
    return socket.create_connection((host, int(p)), timeout=timeout)


def replay(node, port, data):
    """'answered' (bytes came back, then the close or the deadline),
    'closed' (closed without a byte), or 'silent'."""
    s = connect(node, port, DEADLINE)
    got = 0
    try:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            return "closed"
        end = time.time() + DEADLINE
        while time.time() < end:
            s.settimeout(max(0.01, end - time.time()))
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except OSError:
                return "answered" if got else "closed"
            if not chunk:
                return "answered" if got else "closed"
            got += len(chunk)
        return "answered" if got else "silent"
    finally:
        s.close()


def well_behaved(node):
    """A client on each port that must be served: node.health over TCP and
    the Unix socket, /healthz over HTTP."""
    for addr in (node.endpoint("rpc"), node.endpoint("socket")):
        c = RpcClient(addr, timeout=5)
        err, res = c.call("node.health")
        c.close()
        assert err is None and res["status"] == "ok", (addr, err, res)
    host, p = node.endpoint("metrics").rsplit(":", 1)
    s = socket.create_connection((host, int(p)), timeout=5)
    s.sendall(b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert s.recv(64).startswith(b"HTTP/1.1 200"), "healthz"
    s.close()


def rss_mib(node):
    with open("/proc/%d/status" % node.proc.pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def client_connections(node):
    m = metrics_of(node)
    return sum(v for k, v in m.items()
               if k.startswith(("peercache_rpc_local_connections",
                                "peercache_rpc_tcp_connections")))


def test_corpus_has_at_least_200_cases_over_every_port():
    counts = {p: len(cases(p)) for p in PORTS}
    assert all(counts.values()), counts
    assert sum(counts.values()) >= 200, counts


@pytest.fixture
def node(node_factory):
    n = node_factory("--pool-size", "64mb", "--rpc-max-message-bytes", "4mb")
    n.wait_for("ready")
    return n


def test_every_case_is_answered_or_closed_and_the_node_serves(node):
    well_behaved(node)
    rss0 = rss_mib(node)
    outcomes, slow = {}, []
    for port in PORTS:
        for path in cases(port):
            with open(path, "rb") as f:
                data = f.read()
            t0 = time.time()
            out = replay(node, port, data)
            took = time.time() - t0
            name = "%s/%s" % (port, os.path.basename(path))
            assert node.proc.poll() is None, "the node died on " + name
            assert out != "silent", "%s: no answer and no close within %.1f s" % (
                name, DEADLINE)
            if took > DEADLINE + 0.5:
                slow.append((name, took))
            outcomes[out] = outcomes.get(out, 0) + 1
            well_behaved(node)
    assert not slow, slow
    grew = rss_mib(node) - rss0
    if not SANITIZED:
        assert grew < 64, "RSS grew %.1f MiB over the corpus" % grew
    deadline = time.time() + 10
    while client_connections(node) > 0 and time.time() < deadline:
        time.sleep(0.1)
    assert client_connections(node) == 0
    # no case changed what the node does: it is not draining, stores pages
    # and has its one member
    c = RpcClient(node.endpoint("rpc"))
    err, info = c.call("node.info")
    assert err is None and not info.get("draining"), (err, info)
    err, ok = c.call("kv.set", [["after-corpus"], [b"v" * 100]])
    assert err is None and ok == [True], (err, ok)
    err, got = c.call("kv.get", [["after-corpus"]])
    assert got == [b"v" * 100]
    c.close()
    report("bad-input corpus: %d cases over %s: %s; RSS %+.1f MiB" % (
        sum(outcomes.values()), "/".join(PORTS), outcomes, grew))


def test_floods_and_slow_senders_do_not_starve_others(node_factory):
    node = node_factory("--pool-size", "64mb", "--rpc-max-message-bytes", "1mb",
                        "--rpc-message-timeout", "2s")
    node.wait_for("ready")
    rng = random.Random(18)
    # floods: junk on each port as fast as the socket takes it, a new
    # connection whenever the node closes one, while a good client is served
    def flood_conn(port):
        s = connect(node, port, 5)
        s.setblocking(False)
        return s
    floods = [flood_conn(p) for p in PORTS]
    junk = bytes(rng.getrandbits(8) for _ in range(1 << 16))
    sent = [0] * len(floods)
    reconnects = [0] * len(floods)
    end = time.time() + 3
    while time.time() < end:
        for i, s in enumerate(floods):
            try:
                sent[i] += s.send(junk)
            except BlockingIOError:
                pass
            except OSError:
                s.close()
                floods[i] = flood_conn(PORTS[i])
                reconnects[i] += 1
        well_behaved(node)
    for s in floods:
        s.close()
    assert node.proc.poll() is None
    # slow senders: a request one byte at a time, 0.3 s apart, on the RPC
    # port and the Unix socket: closed by rpc_message_timeout (2 s here),
    # others served meanwhile
    slow = [connect(node, p, 5) for p in ("rpc", "unix")]
    msg = b"\x94\x00\x01\xa9node.info\x90"
    closed_after = []
    t0 = time.time()
    for i in range(len(msg) * 3):
        for s in slow:
            try:
                s.send(msg[i % len(msg):i % len(msg) + 1])
            except OSError:
                if s not in [c for c, _ in closed_after]:
                    closed_after.append((s, time.time() - t0))
        well_behaved(node)
        if len(closed_after) == len(slow):
            break
        time.sleep(0.3)
    for s in slow:
        s.close()
    assert len(closed_after) == len(slow), "a slow sender was never cut off"
    assert all(t < 10 for _, t in closed_after), closed_after
    assert node.proc.poll() is None
    report("floods: %s bytes in %s connections on %s; slow senders cut off "
           "after %s s" % (sent, [r + 1 for r in reconnects], "/".join(PORTS),
                           ["%.1f" % t for _, t in closed_after]))
