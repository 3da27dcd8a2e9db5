"""Issue 11, item 6: membership changes at run time (cluster.set_peers and a
SIGHUP reload), ring epochs and membership events.

The main test grows a three-node cluster to four and shrinks it back while
clients write and read through every node, and checks every page it is
handed against a content oracle: a page names its key and version, must be
byte for byte the page of that key at that version, and the version must
have been written. A miss is fine (documented: keys whose owners all
changed are misses until written again); a wrong byte or an error is not.
The seed is printed; PEERCACHE_TEST_SEED replays a run.
"""
import hashlib
import os
import random
import signal
import threading
import time

from conftest import SANITIZED, RpcClient, free_ports, metrics_of

PAGE = 8 * 1024
PHASE_S = 3.0 if not SANITIZED else 5.0


def page_of(key, ver):
    head = ("%s|%d|" % (key, ver)).encode()
    seed = hashlib.sha256(head).digest()
    body = (seed * (PAGE // len(seed) + 1))[:PAGE - len(head)]
    return head + body


class Oracle:
    """The highest version issued per key (issued before the set is sent,
    so a reader can never see a version the oracle does not know)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ver = {}

    def next(self, key):
        with self.lock:
            self.ver[key] = self.ver.get(key, 0) + 1
            return self.ver[key]

    def check(self, key, page):
        try:
            k, v, _ = page.split(b"|", 2)
            v = int(v)
        except ValueError:
            return False
        with self.lock:
            top = self.ver.get(key, 0)
        return k.decode(errors="replace") == key and 1 <= v <= top and \
            page == page_of(key, v)


class Worker(threading.Thread):
    def __init__(self, addr, rng, keys, oracle, stop):
        super().__init__(daemon=True)
        self.addr, self.rng, self.keys = addr, rng, keys
        self.oracle, self.stop = oracle, stop
        self.stats = {"sets": 0, "hits": 0, "misses": 0, "wrong": 0,
                      "errors": 0}
        self.failures = []

    def run(self):
        c = RpcClient(self.addr, timeout=10.0)
        try:
            while not self.stop.is_set():
                batch = self.rng.sample(self.keys, 4)
                if self.rng.random() < 0.4:
                    pages = [page_of(k, self.oracle.next(k)) for k in batch]
                    err, res = c.call("kv.set", [batch, pages])
                    self.stats["sets"] += 1
                    if err is not None:
                        self.stats["errors"] += 1
                        self.failures.append(("kv.set", err))
                    continue
                err, res = c.call("kv.get", [batch])
                if err is not None:
                    self.stats["errors"] += 1
                    self.failures.append(("kv.get", err))
                    continue
                for k, v in zip(batch, res):
                    if v is None:
                        self.stats["misses"] += 1
                    elif self.oracle.check(k, v):
                        self.stats["hits"] += 1
                    else:
                        self.stats["wrong"] += 1
                        self.failures.append(("wrong", k, v[:40]))
        finally:
            c.close()


def call(node, method, params=()):
    c = RpcClient(node.endpoint("rpc"))
    try:
        return c.call(method, params)
    finally:
        c.close()


def set_peers(node, peers):
    return call(node, "cluster.set_peers", [peers])


def members(node):
    err, res = call(node, "cluster.members")
    assert err is None, err
    return sorted(m["id"] for m in res)


def test_three_four_three_under_load_no_wrong_bytes(cluster, node_factory):
    seed = int(os.environ.get("PEERCACHE_TEST_SEED", random.randrange(1 << 30)))
    print("seed", seed)
    rng = random.Random(seed)
    nodes = cluster(3, "--pool-size", "64mb")
    three = ["127.0.0.1:%d" % n.rpc_port() for n in nodes]
    for attempt in range(3):
        port = free_ports(1)[0]
        four = three + ["127.0.0.1:%d" % port]
        d = node_factory("--rpc-port", str(port), "--peers", ",".join(four),
                         "--pool-size", "64mb")
        try:
            d.wait_for("ready")
            break
        except AssertionError:
            if "Address already in use" not in d.text() or attempt == 2:
                raise
    keys = ["member-%d" % i for i in range(400)]
    oracle = Oracle()
    stop, stop_d = threading.Event(), threading.Event()
    workers = [Worker(three[i % 3], random.Random(rng.random()), keys, oracle,
                      stop) for i in range(6)]
    d_worker = Worker(four[3], random.Random(rng.random()), keys, oracle,
                      stop_d)
    for w in workers:
        w.start()
    try:
        time.sleep(PHASE_S)
        # 3 -> 4: every old member learns about the new one.
        for n in nodes:
            err, res = set_peers(n, four)
            assert err is None, err
            assert res["changed"] is True and res["epoch"] == 2, res
            assert res["joined"] == [four[3]] and res["left"] == [], res
            assert sorted(res["members"]) == sorted(four), res
        d_worker.start()
        time.sleep(PHASE_S)
        # 4 -> 3: the fourth node's clients stop, every member drops it,
        # then it shuts down.
        stop_d.set()
        d_worker.join(30)
        for n in nodes:
            err, res = set_peers(n, three)
            assert err is None, err
            assert res["epoch"] == 3 and res["left"] == [four[3]], res
        for n in nodes:
            assert members(n) == sorted(three)
        assert d.stop() == 0, d.text()
        time.sleep(PHASE_S)
    finally:
        stop.set()
        stop_d.set()
        for w in workers:
            w.join(30)
    every = workers + [d_worker]
    stats = {k: sum(w.stats[k] for w in every) for k in workers[0].stats}
    print("stats", stats)
    failures = [f for w in every for f in w.failures]
    assert stats["wrong"] == 0, (stats, failures[:5])
    assert stats["errors"] == 0, (stats, failures[:5])
    assert stats["hits"] > 100 and d_worker.stats["hits"] > 0, stats
    for n in nodes:
        text = n.text()
        assert "peer %s joined the ring (epoch 2)" % four[3] in text, text
        assert "peer %s left the ring (epoch 3)" % four[3] in text, text
        m = metrics_of(n)
        # Delivered on each of the node's two reactors.
        assert m['peercache_membership_events_total{event="join"}'] >= 2, m
        assert m['peercache_membership_events_total{event="leave"}'] >= 2, m
        assert m["peercache_ring_epoch"] == 3 and m["peercache_members"] == 3
        # Joining moved some owners: records went to the new ones.
        assert m["peercache_republish_walks_total"] == 2, m
        assert m["peercache_republish_records_total"] > 0, m
        assert m["peercache_republish_stored_total"] > 0, m
        assert "placement for epoch 3 done" in text, text
        assert n.proc.poll() is None, text
        assert n.stop() == 0, n.text()


def test_suspect_and_recover_events(cluster, node_factory):
    """A member that stops answering is announced suspect on every reactor,
    and recovered once it answers a probe again."""
    a, b = cluster(2, "--pool-size", "16mb", "--rpc-timeout", "500ms")
    peers = "127.0.0.1:%d,127.0.0.1:%d" % (a.rpc_port(), b.rpc_port())
    port_b = b.rpc_port()
    b.proc.kill()
    b.proc.wait()
    c = RpcClient(a.endpoint("rpc"))
    deadline = time.time() + 20
    while "peer 127.0.0.1:%d is suspect" % port_b not in a.text():
        assert time.time() < deadline, a.text()
        # Some of these keys are owned by b: the lookup finds it gone.
        c.call("kv.get", [["probe-%d" % i for i in range(32)]])
        time.sleep(0.1)
    c.close()
    b2 = node_factory("--rpc-port", str(port_b), "--peers", peers,
                      "--pool-size", "16mb")
    b2.wait_for("ready")
    a.wait_for("answers again", timeout=20)
    deadline = time.time() + 10
    while True:
        m = metrics_of(a)
        if m['peercache_membership_events_total{event="recover"}'] >= 2:
            break
        assert time.time() < deadline, m
        time.sleep(0.1)
    assert m['peercache_membership_events_total{event="suspect"}'] >= 2, m
    assert m["peercache_ring_epoch"] == 1, m
    assert a.stop() == 0, a.text()
    assert b2.stop() == 0, b2.text()


def test_departed_peer_is_skipped_until_it_joins_again(cluster):
    """Records of a node that left are misses at once (no read of a node
    that may be gone), even while it still runs; they are read again once
    it is a member again."""
    a, b = cluster(2, "--pool-size", "16mb")
    ids = ["127.0.0.1:%d" % n.rpc_port() for n in (a, b)]
    keys = ["left-%d" % i for i in range(16)]
    pages = [page_of(k, 1) for k in keys]
    err, res = call(b, "kv.set", [keys, pages])
    assert err is None and all(res), (err, res)
    err, res = call(a, "kv.get", [keys])
    assert err is None and res == pages
    before = metrics_of(a)["peercache_read_suspect_misses_total"]
    err, res = set_peers(a, [ids[0]])
    assert err is None and res["left"] == [ids[1]], res
    err, res = call(a, "kv.get", [keys])
    assert err is None and res == [None] * len(keys), res
    assert metrics_of(a)["peercache_read_suspect_misses_total"] >= \
        before + len(keys)
    err, res = set_peers(a, ids)
    assert err is None and res["joined"] == [ids[1]], res
    err, res = call(a, "kv.get", [keys])
    assert err is None and res == pages
    assert a.stop() == 0, a.text()
    assert b.stop() == 0, b.text()


def test_set_peers_validation(node_factory):
    n = node_factory("--pool-size", "16mb")
    n.wait_for("ready")
    self_id = "127.0.0.1:%d" % n.rpc_port()
    c = RpcClient(n.endpoint("rpc"))
    bad = [
        (["nohost"], "bad_params", "is not host:port"),
        (["127.0.0.1:0"], "bad_params", "is not host:port"),
        (["127.0.0.1:65536"], "bad_params", "is not host:port"),
        ([":4000"], "bad_params", "is not host:port"),
        (["127.0.0.1:4000x"], "bad_params", "is not host:port"),
        ([""], "bad_params", "empty"),
        (["h" * 300 + ":1"], "bad_params", "too long"),
        (["127.0.0.1:4000", "127.0.0.1:4000"], "bad_params", "listed twice"),
        ([7], "bad_params", "not a string"),
        (["127.0.0.1:%d" % (2000 + i) for i in range(1100)], "too_large",
         "at most"),
        # Longer lists than a reactor should build a ring for: SIGHUP.
        (["127.0.0.1:%d" % (2000 + i) for i in range(40)], "too_large",
         "send SIGHUP"),
    ]
    for peers, code, text in bad:
        err, res = c.call("cluster.set_peers", [peers])
        assert err is not None and err["code"] == code, (peers[:2], err)
        assert text in err["message"], (peers[:2], err)
    err, res = c.call("cluster.set_peers", [{"a": 1}])
    assert err is not None and err["code"] == "bad_params", err
    # Nothing of the above changed anything.
    err, res = c.call("cluster.set_peers", [[self_id]])
    assert err is None and res["changed"] is False and res["epoch"] == 1, res
    # The setting's syntax works too; this node in the list is fine.
    err, res = c.call("cluster.set_peers",
                      ["%s, 127.0.0.1:1" % self_id])
    assert err is None and res["changed"] is True, res
    assert res["epoch"] == 2 and res["joined"] == ["127.0.0.1:1"], res
    err, res = c.call("cluster.set_peers", [[]])
    assert err is None and res["left"] == ["127.0.0.1:1"], res
    assert res["members"] == [self_id] and res["epoch"] == 3, res
    c.close()
    assert n.stop() == 0, n.text()


def test_set_peers_needs_authentication(node_factory):
    n = node_factory("--pool-size", "16mb", "--cluster-secret", "membership")
    n.wait_for("ready")
    c = RpcClient(n.endpoint("rpc"))
    err, res = c.call("cluster.set_peers", [["127.0.0.1:1"]])
    assert err is not None and err["code"] == "unauthorized", err
    c.close()
    assert n.stop() == 0, n.text()


def test_sighup_reloads_peers(node_factory, tmp_path):
    conf = tmp_path / "node.conf"
    conf.write_text("peers = 127.0.0.1:1\n")
    n = node_factory("--config", str(conf), "--pool-size", "16mb")
    n.wait_for("ready")
    self_id = "127.0.0.1:%d" % n.rpc_port()
    assert members(n) == sorted([self_id, "127.0.0.1:1"])
    conf.write_text("peers = 127.0.0.1:2, 127.0.0.1:3\nlog_level = debug\n")
    n.proc.send_signal(signal.SIGHUP)
    n.wait_for("peer 127.0.0.1:1 left the ring (epoch 2)")
    n.wait_for("peer 127.0.0.1:3 joined the ring (epoch 2)")
    n.wait_for("log_level changed; it takes effect at the next restart")
    assert members(n) == sorted([self_id, "127.0.0.1:2", "127.0.0.1:3"])
    # A broken file changes nothing and says why.
    conf.write_text("peers = 127.0.0.1:2, nonsense\n")
    n.proc.send_signal(signal.SIGHUP)
    n.wait_for("reload: peers not changed")
    assert members(n) == sorted([self_id, "127.0.0.1:2", "127.0.0.1:3"])
    # The same list again: no new epoch.
    conf.write_text("peers = 127.0.0.1:3,127.0.0.1:2\n")
    n.proc.send_signal(signal.SIGHUP)
    n.wait_for("reload: peers unchanged (epoch 2)")
    assert metrics_of(n)["peercache_ring_epoch"] == 2
    assert n.stop() == 0, n.text()
