"""Remote promotion (issue 14, docs/disk.md "Remote promotion"): a get on
node B of a page that node A's pool evicted to A's disk asks A to promote
it (disk.promote) and reads it from the fresh location — a hit with the
right bytes; concurrent gets of one key cause one promotion on A; a dead
(killed or frozen) producer is a miss, never a hang; exists on B counts A's
disk pages and warms them up; a join moves the records of disk pages."""
import signal
import threading

import pytest

from conftest import (RpcClient, freeze, metrics_of, report, rpc_result,
                      start_joiner)
from conftest import free_ports
from test_disk_tier import POOL, page, set_through, start_pair, wait_metric

NKEYS = 32            # twice what A's 1 MiB pool holds: the first spill
# B waits for the promotions: a budget a loaded (or sanitized) host meets.
SLOW_OK = ("--request-deadline", "20s", "--rpc-timeout", "20s")


def spilled_pair(node_factory, tmp_path, prefix, b_args=SLOW_OK, a_args=()):
    """A holding NKEYS pages, the oldest on its disk only; B reads."""
    a, b = start_pair(node_factory, tmp_path, b_args, a_args)
    ca = RpcClient(a.endpoint("socket"))  # no secret needed there
    keys = ["%s/%d" % (prefix, i) for i in range(NKEYS)]
    set_through(a, ca, keys)
    m = metrics_of(a)
    assert m["peercache_tier_kept_total"] >= 8, "A's pool spilled to disk"
    return a, b, keys


def disk_only(node, keys):
    """The first of keys whose directory record on node says its page is on
    its producer's disk only. Which pages left the pool is not strictly the
    oldest (the pool evicts the cheapest run around one of its oldest
    entries), so tests that need a disk page ask the directory."""
    c = RpcClient(node.endpoint("socket"), timeout=30)
    recs = c.call("dir.get", [keys])[1]
    c.close()
    cold = [k for k, r in zip(keys, recs) if r is not None and r[6] is False]
    assert cold, "some of A's pages are on its disk only"
    return cold[0]


def test_a_get_on_another_node_promotes_and_hits(node_factory, tmp_path):
    a, b, keys = spilled_pair(node_factory, tmp_path, "rget")
    cb = RpcClient(b.endpoint("rpc"), timeout=60)
    before = metrics_of(a)["peercache_disk_promotions_total"]
    wrong = 0
    for k in keys:   # one key a call: each promotion fits A's budget
        err, got = cb.call("kv.get", [[k]])
        assert err is None
        wrong += got[0] is not None and got[0] != page(k)
        assert got[0] == page(k), k
    assert wrong == 0
    # A counts a promotion after its publish, which may end after the get
    # that asked for it (the answer goes first): wait for the count.
    promoted = wait_metric(a, "peercache_disk_promotions_total", before + 8) - before
    assert promoted >= 8, "A's disk pages came back through promotions"
    ma, mb = metrics_of(a), metrics_of(b)
    assert ma["peercache_disk_remote_promote_served_total"] >= promoted
    assert mb["peercache_tier_remote_promote_served_total"] >= promoted
    assert mb["peercache_read_failures_total"] == 0
    # A batch of disk pages: promotions beyond A's budget (a quarter of
    # its pool) miss, the others hit; nothing wrong either way.
    err, got = cb.call("kv.get", [keys])
    assert err is None and any(got)
    assert all(g is None or g == page(k) for g, k in zip(got, keys))
    assert a.stop() == 0 and b.stop() == 0


def test_concurrent_gets_share_one_promotion(node_factory, tmp_path):
    a, b, keys = spilled_pair(node_factory, tmp_path, "rshare")
    key = disk_only(b, keys)
    before = metrics_of(a)["peercache_disk_promotions_total"]
    clients = [RpcClient(b.endpoint("rpc"), timeout=60) for _ in range(8)]
    start = threading.Barrier(len(clients))
    got = [None] * len(clients)

    def get(i):
        start.wait()
        got[i] = clients[i].call("kv.get", [[key] * 2])

    threads = [threading.Thread(target=get, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [(None, [page(key)] * 2)] * len(clients)
    ma, mb = metrics_of(a), metrics_of(b)
    assert ma["peercache_disk_promotions_total"] == before + 1, "one promotion"
    # Asks of the key on one reactor share one request: each get asks
    # twice, so at most one request a get (with the gets concurrent,
    # usually one per reactor of B).
    asked = mb["peercache_tier_remote_promote_requests_total"]
    shared = mb["peercache_tier_remote_promote_shared_total"]
    report("%d concurrent gets of one disk page: %d disk.promote requests, "
           "%d asks shared, 1 promotion" % (len(clients), asked, shared))
    assert 1 <= asked <= len(clients)
    assert shared >= 1
    assert a.stop() == 0 and b.stop() == 0


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_a_dead_producer_is_a_miss_not_a_hang(node_factory, tmp_path, how):
    # One directory owner per key, so that B finds the records it owns
    # itself (A's death does not stop the lookup) and asks A to promote.
    # B's own deadline (1 s) and rpc_timeout: the call must come back.
    one = ("--directory-replicas", "1")
    a, b, keys = spilled_pair(node_factory, tmp_path, "rdead", b_args=one,
                              a_args=one)
    cb = RpcClient(b.endpoint("rpc"), timeout=30)
    # Disk pages whose record B holds: non-resident ([..., resident]).
    recs = cb.call("dir.get", [keys])[1]
    cold = [k for k, r in zip(keys, recs) if r is not None and r[6] is False]
    assert cold, "some of A's disk pages are recorded on B"
    if how == "killed":
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait()
    else:
        freeze(a.proc.pid)
    try:
        for k in cold:
            assert cb.call("kv.get", [[k]]) == (None, [None])
        mb = metrics_of(b)
        assert mb["peercache_tier_remote_promote_failed_total"] >= 1, \
            "the first get asked A and got no answer"
        assert mb["peercache_tier_remote_promote_served_total"] == 0
        # A is suspect now: exists does not count its pages.
        assert cb.call("kv.exists", [[cold[0]]]) == (None, 0)
    finally:
        if how == "frozen":
            a.proc.send_signal(signal.SIGCONT)
    assert b.stop() == 0
    if how == "frozen":
        assert a.stop() == 0


def test_exists_on_another_node_warms_pages_up(node_factory, tmp_path):
    a, b, keys = spilled_pair(node_factory, tmp_path, "rwarm")
    cb = RpcClient(b.endpoint("rpc"), timeout=60)
    cold = keys[:4]  # evicted from A's pool; four fit A's promotion budget
    before = metrics_of(a)["peercache_disk_promotions_total"]
    assert cb.call("kv.exists", [cold]) == (None, len(cold))
    assert wait_metric(a, "peercache_disk_promotions_total",
                       before + len(cold)) == before + len(cold)
    # The pages are in A's pool now: B reads them with no promotion.
    assert cb.call("kv.get", [cold]) == (None, [page(k) for k in cold])
    assert metrics_of(a)["peercache_disk_promotions_total"] == before + len(cold)
    assert a.stop() == 0 and b.stop() == 0


def test_a_join_moves_the_records_of_disk_pages(node_factory, tmp_path):
    """One directory owner per key: a key whose owner becomes the joiner C
    is found only if its record moved there — disk pages' (non-resident)
    records too."""
    one = ("--directory-replicas", "1")
    a, b, keys = spilled_pair(node_factory, tmp_path, "rjoin",
                              b_args=one + SLOW_OK, a_args=one)
    two = ["127.0.0.1:%d" % n.rpc_port() for n in (a, b)]
    c, three = start_joiner(node_factory, two, *(one + SLOW_OK))
    for n in (a, b):
        assert rpc_result(n, "cluster.set_peers", [three])["epoch"] == 2
    a.wait_for("placement for epoch 2 done", timeout=60)
    ma = metrics_of(a)
    assert ma["peercache_republish_nonresident_total"] >= 1, \
        "some disk pages' records had a new owner"
    cc = RpcClient(c.endpoint("rpc"), timeout=60)
    got = [cc.call("kv.get", [[k]])[1][0] for k in keys]
    assert [k for k, g in zip(keys, got) if g != page(k)] == []
    assert metrics_of(a)["peercache_disk_promotions_total"] >= 1
    assert a.stop() == 0 and b.stop() == 0 and c.stop() == 0


def test_with_a_cluster_secret_only_peers_may_promote(node_factory, tmp_path):
    """disk.promote is authenticated like the other peer RPCs: the nodes
    (which share the secret) promote for each other; a client without the
    secret is refused."""
    secret = ("--cluster-secret", "promote-me-if-you-can")
    a, b, keys = spilled_pair(node_factory, tmp_path, "rauth",
                              b_args=secret + SLOW_OK, a_args=secret)
    before = metrics_of(a)["peercache_disk_promotions_total"]
    stranger = RpcClient(a.endpoint("rpc"))
    err, _ = stranger.call("disk.promote", [[keys[0]]])
    assert err["code"] == "unauthorized", err
    assert metrics_of(a)["peercache_disk_promotions_total"] == before
    # B's get goes through B's authenticated client (over the Unix socket,
    # which needs no secret for the node's own user).
    key = disk_only(b, keys)
    cb = RpcClient(b.endpoint("socket"), timeout=60)
    assert cb.call("kv.get", [[key]]) == (None, [page(key)])
    # A answers the promote once the page is in its pool and counts the
    # promotion when its publish is done: a moment later, at most.
    assert wait_metric(a, "peercache_disk_promotions_total",
                       before + 1) == before + 1
    assert a.stop() == 0 and b.stop() == 0


def test_a_frozen_directory_owner_does_not_fail_a_promotion(node_factory,
                                                            tmp_path):
    """The producer answers disk.promote once the page is in its pool, not
    after its resident record reached every directory owner: with an owner
    C frozen, A's publish to C waits for A's rpc_timeout, but B's get still
    reads the promoted page (and does not report A suspect)."""
    for attempt in range(3):
        ports = free_ports(3)
        peers = ",".join("127.0.0.1:%d" % p for p in ports)
        a = node_factory("--rpc-port", str(ports[0]), "--peers", peers,
                         "--pool-size", POOL, "--disk-enabled", "true",
                         "--disk-path", str(tmp_path / "a"),
                         "--disk-size", "16mb", "--disk-region-size", "1mb",
                         "--rpc-timeout", "60s")
        b = node_factory("--rpc-port", str(ports[1]), "--peers", peers,
                         "--request-deadline", "5s", "--rpc-timeout", "60s")
        c = node_factory("--rpc-port", str(ports[2]), "--peers", peers)
        try:
            for n in (a, b, c):
                n.wait_for("ready")
            break
        except AssertionError:
            if attempt == 2 or not any("Address already in use" in x.text()
                                       for x in (a, b, c)):
                raise
            for x in (a, b, c):
                x.proc.kill()
                x.proc.wait()
    ca = RpcClient(a.endpoint("socket"))
    keys = ["rfrozen/%d" % i for i in range(NKEYS)]
    set_through(a, ca, keys)
    cb = RpcClient(b.endpoint("socket"), timeout=120)
    # Keys whose owners are B and C (two replicas of three nodes): B holds
    # their non-resident record, A none; A's publish goes to B and C.
    on_b = cb.call("dir.get", [keys])[1]
    on_a = ca.call("dir.get", [keys])[1]
    cold = [k for k, rb, ra in zip(keys, on_b, on_a)
            if rb is not None and rb[6] is False and ra is None]
    if not cold:
        pytest.skip("no disk page with owners B and C in this ring")
    freeze(c.proc.pid)
    try:
        err, got = cb.call("kv.get", [[cold[0]]])
        assert err is None
        assert got == [page(cold[0])], \
            "B read A's promoted page although C (an owner) is frozen"
        assert metrics_of(b)["peercache_tier_remote_promote_served_total"] \
            == 1
    finally:
        c.proc.send_signal(signal.SIGCONT)
    assert a.stop() == 0 and b.stop() == 0 and c.stop() == 0
