"""Issue 13 item 5: the etcd discovery backend (docs/discovery.md).

Each test starts its own etcd (Debian's etcd-server, installed by
scripts/deps.sh test) on loopback with free ports and a temporary data dir,
and stops it by PID. The same join / kill -9 / SIGTERM checks as
test_discovery.py runs for the embedded backend, then: an etcd outage and
restart leaves the nodes their last member list and their reads and writes;
a node frozen past its lease is dropped and registers again when it wakes;
a wrong endpoint is a logged error, not a crash; bad settings are refused at
start. Timings are printed; deadlines are generous (CI is slow).
"""
import os
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest

from conftest import free_ports, freeze, metrics_of, report, run
from test_discovery import (CLI, call, ids, page, start_readers, view,
                            wait_until)

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


class Etcd:
    """One etcd member on 127.0.0.1 (client and peer ports free a moment
    ago), its data in a directory of the test's."""

    def __init__(self, datadir):
        self.datadir = datadir
        self.client, self.peer = free_ports(2)
        self.addr = "127.0.0.1:%d" % self.client
        self.proc = None
        self.start()

    def start(self):
        peer = "http://127.0.0.1:%d" % self.peer
        client = "http://" + self.addr
        self.log = open(os.path.join(self.datadir, "etcd.log"), "ab")
        self.proc = subprocess.Popen(
            [ETCD, "--name", "t", "--data-dir",
             os.path.join(self.datadir, "data"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", "t=" + peer],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.ready():
                return
            assert self.proc.poll() is None, "etcd exited: see " + self.datadir
            time.sleep(0.1)
        raise AssertionError("etcd did not answer on " + self.addr)

    def ready(self):
        """A range answered with a revision (a leader is elected)."""
        try:
            s = socket.create_connection(("127.0.0.1", self.client), 1)
        except OSError:
            return False
        body = b'{"key":"AA=="}'
        s.sendall(b"POST /v3/kv/range HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                  % (len(body), body))
        s.settimeout(2)
        data = b""
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        s.close()
        return b" 200 " in data.split(b"\r\n", 1)[0] and b"revision" in data

    def kill(self):
        self.proc.kill()
        self.proc.wait()
        self.log.close()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.log.close()


@pytest.fixture
def etcd(tmp_path):
    if not os.access(ETCD, os.X_OK):
        pytest.skip("no etcd binary (scripts/deps.sh test installs "
                    "etcd-server)")
    e = Etcd(str(tmp_path))
    yield e
    e.stop()


def start(node_factory, endpoints, *extra):
    n = node_factory("--discovery-backend", "etcd", "--etcd-endpoints",
                     endpoints, "--pool-size", "32mb", *extra)
    n.wait_for("ready", 30)
    return n


def addr_of(n):
    return n.endpoint("rpc")


def agree(nodes, want):
    """Every node's view is want, from etcd, at one revision."""
    vs = [view(x) for x in nodes]
    if any(ids(v) != want for v in vs):
        return False
    return len({v["epoch"] for v in vs}) == 1 and vs


def start_cluster(node_factory, etcd, n):
    nodes = [start(node_factory, etcd.addr) for _ in range(n)]
    want = sorted(addr_of(x) for x in nodes)
    vs = wait_until(lambda: agree(nodes, want), 10,
                    "every node to see all %d members at one revision" % n)
    return nodes, want, vs


def test_join_kill_and_leave(node_factory, etcd):
    nodes, want, vs = start_cluster(node_factory, etcd, 4)
    report("join: revision %s from %s" % (vs[0]["epoch"], vs[0]["from"]))
    assert vs[0]["backend"] == "etcd" and vs[0]["from"] == "etcd " + etcd.addr
    assert {m["role"] for m in vs[0]["members"]} == {"member"}
    a, victim, o, m = nodes
    err, res = call(m, "cluster.members")
    assert err is None and sorted(x["id"] for x in res) == want, (err, res)
    assert {x["state"] for x in res} == {"discovered"}, res
    out = subprocess.run([CLI, "--node", m.endpoint("socket"), "members"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "epoch %d from etcd %s, 4 members" % (
        vs[0]["epoch"], etcd.addr), lines
    assert len(lines) == 5 and sum(x.endswith(" self") for x in lines) == 1
    keys = ["etcd-%d" % i for i in range(64)]
    err, _ = call(m, "kv.set", [keys, [page(k) for k in keys]])
    assert err is None, err
    err, res = call(o, "kv.get", [keys])
    assert err is None and all(v == page(k) for k, v in zip(keys, res))

    # kill -9: the lease expires (TTL 2 s), every view drops the node;
    # reads meanwhile are hits or misses, never wrong bytes.
    readers_end = start_readers((m, o), keys)
    gone = addr_of(victim)
    t0 = time.time()
    victim.proc.kill()
    victim.proc.wait()
    left = [x for x in want if x != gone]
    wait_until(lambda: all(ids(view(x)) == left for x in (a, m, o)), 8,
               "the killed node to leave every view")
    report("kill -9 gone from every view after %.2f s" % (time.time() - t0))
    stats = readers_end()
    report("oracle: reads meanwhile %s" % (stats,))
    assert stats["wrong"] == 0 and stats["hit"] > 0
    assert "peer %s left the ring" % gone in a.text()

    # SIGTERM revokes the lease: gone at once, not after the TTL.
    other = addr_of(o)
    assert o.stop() == 0
    t0 = time.time()
    wait_until(lambda: all(other not in ids(view(x)) for x in (a, m)), 4,
               "the stopped node to leave")
    report("SIGTERM leave seen everywhere after %.2f s" % (time.time() - t0))
    assert "lease" in o.text() and "revoked" in o.text()
    # a new node joins the running cluster through the watch
    d = start(node_factory, etcd.addr)
    three = sorted([addr_of(a), addr_of(m), addr_of(d)])
    wait_until(lambda: agree([a, m, d], three), 10, "the new node to join")
    for x in (a, m, d):
        assert x.stop() == 0


def test_etcd_outage_keeps_the_view_and_the_data(node_factory, etcd):
    nodes, want, vs = start_cluster(node_factory, etcd, 3)
    a, b, c = nodes
    keys = ["outage-%d" % i for i in range(32)]
    err, _ = call(a, "kv.set", [keys, [page(k) for k in keys]])
    assert err is None, err
    etcd.kill()
    # The nodes notice (their keepalive fails), keep the last member list
    # and go on serving each other.
    for x in nodes:
        x.wait_for("failed: ", 10)
    t_end = time.time() + 3
    while time.time() < t_end:
        assert all(ids(view(x)) == want for x in nodes)
        err, res = call(c, "kv.get", [keys])
        assert err is None and all(v == page(k) for k, v in zip(keys, res))
        time.sleep(0.2)
    more = ["during-%d" % i for i in range(8)]
    err, _ = call(b, "kv.set", [more, [page(k) for k in more]])
    assert err is None, err
    err, res = call(a, "kv.get", [more])
    assert err is None and all(v == page(k) for k, v in zip(more, res))
    assert metrics_of(a)["peercache_discovery_etcd_errors_total"] > 0
    assert all(x.proc.poll() is None for x in nodes)
    # etcd comes back: every node reconnects and the watch works again.
    etcd.start()
    d = start(node_factory, etcd.addr)
    four = sorted(want + [addr_of(d)])
    wait_until(lambda: agree(nodes + [d], four), 15,
               "every node to follow etcd again after its restart")
    assert "answers again" in a.text()
    err, res = call(d, "kv.get", [keys])
    assert err is None and all(v in (None, page(k)) for k, v in zip(keys, res))
    for x in nodes + [d]:
        assert x.stop() == 0


def test_a_frozen_node_expires_and_registers_again(node_factory, etcd):
    nodes, want, _ = start_cluster(node_factory, etcd, 3)
    a, b, c = nodes
    frozen = addr_of(c)
    freeze(c.proc.pid)  # no keepalive: etcd expires its lease
    try:
        rest = [x for x in want if x != frozen]
        wait_until(lambda: all(ids(view(x)) == rest for x in (a, b)), 8,
                   "the frozen node's lease to expire")
    finally:
        os.kill(c.proc.pid, signal.SIGCONT)
    # Its next keepalive finds the lease gone: a new lease, the key again.
    c.wait_for("registering again", 10)
    wait_until(lambda: agree(nodes, want), 10,
               "the woken node to be back in every view")
    assert metrics_of(c)["peercache_discovery_etcd_lease_lost_total"] >= 1
    for x in nodes:
        assert x.stop() == 0


def test_a_wrong_endpoint_is_an_error_not_a_crash(node_factory, etcd):
    # Something that is not etcd: answers every connection with a page of
    # text. And a port where nothing listens.
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    junk = "127.0.0.1:%d" % srv.getsockname()[1]
    refused = "127.0.0.1:%d" % free_ports(1)[0]
    done = threading.Event()

    def serve():
        srv.settimeout(0.2)
        while not done.is_set():
            try:
                s, _ = srv.accept()
            except OSError:
                continue
            s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
            s.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    lone = start(node_factory, refused)
    lone.wait_for("etcd %s: lease grant failed" % refused, 10)
    v = view(lone)
    assert v["backend"] == "etcd" and v["from"] == "etcd (not reached yet)"
    assert v["members"] == []
    # Endpoints are tried in order: the junk one fails, the next is etcd.
    b = start(node_factory, "%s,%s" % (junk, etcd.addr))
    b.wait_for("is this etcd's client URL?", 10)
    wait_until(lambda: ids(view(b)) == [addr_of(b)], 10,
               "the node to register through the second endpoint")
    assert view(b)["from"] == "etcd " + etcd.addr
    # the lone node serves alone all along
    err, _ = call(lone, "kv.set", [["k"], [page("k")]])
    assert err is None, err
    assert lone.proc.poll() is None
    done.set()
    t.join(5)
    srv.close()
    assert lone.stop() == 0 and b.stop() == 0


@pytest.mark.parametrize("args,message", [
    (["--discovery-backend", "etcd"], "needs etcd_endpoints"),
    (["--discovery-backend", "etcd", "--etcd-endpoints", "127.0.0.1:2379",
      "--peers", "127.0.0.1:1"], "etcd and peers are both set"),
    (["--discovery-backend", "etcd", "--etcd-endpoints", "127.0.0.1:2379",
      "--discovery-addr", "127.0.0.1:2"], "leave it empty"),
    (["--discovery-backend", "zookeeper"], "zookeeper"),
    (["--etcd-endpoints", "127.0.0.1:2379"], "discovery_backend is embedded"),
])
def test_bad_settings_are_refused(args, message):
    r = run(*args, "--socket", "")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert message in r.stderr, r.stderr
