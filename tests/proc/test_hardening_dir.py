"""Hardening (issue 10, finding 6): the directory shard stays bounded and
takes records only from their producer.

- junk producer names sent with dir.put cannot stop kv.set (the old node
  interned every name in a table of 4,096 that was never freed);
- records are bounded by directory_max_bytes, oldest evicted first;
- a connection publishes for one producer, and records name it; the
  latest put of a key wins (a stale record is a miss, never wrong bytes);
- a producer that restarted (new incarnation) loses its older records on
  the owners it announces itself to.
"""
import os
import tempfile
import time

from conftest import Node, RpcClient, metrics_of


def rec(node, data, addr=4096, gen=1, length=4096):
    return [node, data, addr, 7, length, gen, True]


def announce(node, data, inc):
    return [node, data, inc]


def kv_still_works(c, prefix, n=4, size=1024):
    keys = ["%s-%d" % (prefix, i) for i in range(n)]
    vals = [os.urandom(size) for _ in keys]
    assert c.call("kv.set", [keys, vals]) == (None, [True] * n)
    assert c.call("kv.get", [keys]) == (None, vals)


def one_node(node_factory, *args):
    n = node_factory("--pool-size", "16mb", *args)
    addr = n.endpoint("rpc")
    n.wait_for("ready")
    return n, addr


def test_junk_producer_names_do_not_stop_kv_set(node_factory):
    n, addr = one_node(node_factory)
    # 4,200 producers, each on its own connection (one producer per
    # connection), each with one record: more names than the old table had.
    # (Ports below the kernel's ephemeral range: never the node's own.)
    for i in range(4200):
        c = RpcClient(addr)
        p, d = "127.0.0.1:%d" % (1 + i), "127.0.0.1:%d" % (10001 + i)
        err, got = c.call("dir.put", [[["junk-%d" % i, rec(p, d)]],
                                      announce(p, d, 1000 + i)])
        assert err is None, err  # the old node stored 0 once its table was full
        c.close()
    kv_still_works(RpcClient(addr), "real", 8, 2048)
    assert n.stop() == 0


def test_directory_records_stay_within_directory_max_bytes(node_factory):
    limit = 1 << 20
    n, addr = one_node(node_factory, "--directory-max-bytes", str(limit))
    c = RpcClient(addr, timeout=30)
    p, d = "127.0.0.1:1", "127.0.0.1:2"
    sent = 0
    for b in range(20):
        batch = [["flood-%06d-%s" % (sent + i, "x" * 180), rec(p, d)]
                 for i in range(1000)]
        err, got = c.call("dir.put", [batch, announce(p, d, 1)])
        assert err is None and got == 1000, err
        sent += 1000
    m = metrics_of(n)
    assert m["peercache_directory_bytes"] <= limit
    assert 0 < m["peercache_directory_records"] < sent / 3
    assert m["peercache_directory_evictions_total"] >= sent - m["peercache_directory_records"]
    # The newest records are the ones kept; the node still works.
    err, got = c.call("dir.get", [["flood-%06d-%s" % (sent - 1, "x" * 180)]])
    assert err is None and got[0] is not None
    kv_still_works(c, "after")
    assert n.stop() == 0


def test_a_put_naming_another_producer_is_refused(node_factory):
    n, addr = one_node(node_factory)
    me, my_data = "127.0.0.1:21001", "127.0.0.1:21002"
    other, other_data = "127.0.0.1:22001", "127.0.0.1:22002"
    c = RpcClient(addr)
    # Records must name the announced producer.
    err, got = c.call("dir.put", [[["k1", rec(other, other_data)]],
                                  announce(me, my_data, 5)])
    assert got is None and err["code"] == "forbidden", err
    # The connection's first put binds it to one producer...
    assert c.call("dir.put", [[["k1", rec(me, my_data)]],
                              announce(me, my_data, 5)]) == (None, 1)
    # ... and a later put for another is refused, in either format.
    err, got = c.call("dir.put", [[["k2", rec(other, other_data)]],
                                  announce(other, other_data, 6)])
    assert got is None and err["code"] == "forbidden", err
    err, got = c.call("dir.put", [[["k2", rec(other, other_data)]]])
    assert got is None and err["code"] == "forbidden", err
    # The data endpoint is on the producer's host.
    c2 = RpcClient(addr)
    err, got = c2.call("dir.put", [[["k3", rec(other, "10.1.2.3:5")]],
                                   announce(other, "10.1.2.3:5", 6)])
    assert got is None and err["code"] == "forbidden", err
    # Local clients (the Unix socket) publish through kv.*, never dir.put.
    u = RpcClient(n.endpoint("socket"))
    err, got = u.call("dir.put", [[["k4", rec(other, other_data)]],
                                  announce(other, other_data, 6)])
    assert got is None and err["code"] == "forbidden", err
    # Nor may anyone publish for the node itself.
    err, got = RpcClient(addr).call("dir.put", [[["k5", rec(addr, my_data)]],
                                                announce(addr, my_data, 6)])
    assert got is None and err["code"] == "forbidden", err
    # Nothing of the refused calls was stored.
    err, got = c.call("dir.get", [["k1", "k2", "k3", "k4", "k5"]])
    assert err is None and got[0][0] == me and got[1:] == [None] * 4
    assert metrics_of(n)["peercache_directory_put_refused_total"] == 6
    assert n.stop() == 0


def test_a_restarted_producers_records_go_when_it_reannounces(node_factory):
    n, addr = one_node(node_factory)
    p, d = "127.0.0.1:23001", "127.0.0.1:23002"
    old = ["old-%d" % i for i in range(100)]
    c = RpcClient(addr)
    assert c.call("dir.put", [[[k, rec(p, d)] for k in old],
                              announce(p, d, 111)]) == (None, 100)
    # Another producer's records stay.
    q, e = "127.0.0.1:24001", "127.0.0.1:24002"
    assert RpcClient(addr).call("dir.put", [[["theirs", rec(q, e)]],
                                            announce(q, e, 7)]) == (None, 1)
    # The same incarnation on a new connection is no restart.
    assert RpcClient(addr).call("dir.put", [[["again", rec(p, d)]],
                                            announce(p, d, 111)]) == (None, 1)
    assert metrics_of(n)["peercache_directory_records"] == 102
    # Restarted: a new incarnation announces itself (no records needed).
    c2 = RpcClient(addr)
    assert c2.call("dir.put", [[], announce(p, d, 222)]) == (None, 0)
    err, got = c2.call("dir.get", [old + ["again", "theirs"]])
    assert err is None and got == [None] * 101 + [rec(q, e)]
    m = metrics_of(n)
    assert m["peercache_directory_records"] == 1
    assert m["peercache_directory_stale_dropped_total"] == 101
    assert n.stop() == 0


def test_a_restarted_node_is_dropped_from_its_owners(cluster):
    # Real nodes: b's records on a go when b, restarted, publishes again.
    a, b = cluster(2, "--pool-size", "16mb")
    keys = ["b-%d" % i for i in range(50)]
    cb = RpcClient(b.endpoint("rpc"))
    assert cb.call("kv.set", [keys, [os.urandom(512) for _ in keys]]) == (None, [True] * 50)
    assert metrics_of(a)["peercache_directory_records"] == 50
    args = b.proc.args[1:]
    assert b.stop() == 0
    b2 = None
    for _ in range(50):  # the port may linger for a moment
        b2_try = Node(args, tmpdir=tempfile.mkdtemp(dir=os.path.dirname(b.tmpdir)))
        try:
            b2_try.wait_for("ready")
            b2 = b2_try
            break
        except AssertionError:
            if b2_try.proc.poll() is None:
                b2_try.proc.kill()
                b2_try.proc.wait()
            time.sleep(0.2)
    assert b2 is not None
    try:
        cb2 = RpcClient(b2.endpoint("rpc"))
        assert cb2.call("kv.set", [["fresh"], [b"y" * 512]]) == (None, [True])
        m = metrics_of(a)
        assert m["peercache_directory_records"] == 1
        assert m["peercache_directory_stale_dropped_total"] == 50
        err, got = RpcClient(a.endpoint("rpc")).call("kv.get", [keys[:3] + ["fresh"]])
        assert err is None and got == [None, None, None, b"y" * 512]
        assert b2.stop() == 0
    finally:
        if b2 and b2.proc.poll() is None:
            b2.proc.kill()
            b2.proc.wait()
    assert a.stop() == 0


def test_the_latest_put_wins_and_a_wrong_record_is_a_miss(cluster):
    """Review: keeping a live producer's record against later puts turned a
    record left behind by a lost delete into a permanent miss. The latest
    put wins; a record pointing at bytes that are not the page is a
    validated miss, never those bytes."""
    a, b = cluster(2, "--pool-size", "16mb")
    ca, cb = RpcClient(a.endpoint("rpc")), RpcClient(b.endpoint("rpc"))
    val = os.urandom(4096)
    assert ca.call("kv.set", [["k"], [val]]) == (None, [True])
    err, (orig,) = ca.call("dir.get", [["k"]])
    assert err is None and orig[0] == a.endpoint("rpc")
    # Another producer publishes the same key to both owners with a record
    # pointing nowhere useful: readers on b get a clean miss.
    p, d = "127.0.0.1:3", "127.0.0.1:4"
    for owner in (a, b):
        other = RpcClient(owner.endpoint("rpc"))
        assert other.call("dir.put", [[["k", rec(p, d, length=4096)]],
                                      announce(p, d, 9)]) == (None, 1)
        other.close()
    assert cb.call("dir.get", [["k"]]) == (None, [rec(p, d, length=4096)])
    assert cb.call("kv.get", [["k"]]) == (None, [None])
    # a publishes again: its record is back and readers get its bytes.
    assert ca.call("kv.delete", [["k"]])[0] is None
    assert ca.call("kv.set", [["k"], [val]]) == (None, [True])
    assert cb.call("kv.get", [["k"]]) == (None, [val])
    for n in (a, b):
        assert n.stop() == 0
