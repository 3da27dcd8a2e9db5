"""Reads by tier and the disk tier's own figures (issue 14 item 6,
docs/disk.md "Metrics"): every page a get asks for is a DRAM local hit
(peercache_read_local_hits_total), a DRAM remote hit
(peercache_read_remote_hits_total), a disk hit (peercache_read_disk_hits_total:
on this node's disk, promoted for the next get while this one misses; or on
another node's disk, promoted by its producer and read) or a plain miss; the
dashboard's hit ratio by tier is built on that partition. Promoted bytes and
the store's I/O in flight are exported too."""
import time

from conftest import RpcClient, metrics_of
from test_disk_tier import (PAGE, disk_node, get_back, page, set_through,
                            start_pair, wait_metric)

READS = ("peercache_read_requests_total", "peercache_read_local_hits_total",
         "peercache_read_remote_hits_total", "peercache_read_disk_hits_total",
         "peercache_read_misses_total")


def reads(node):
    m = metrics_of(node)
    return {k: m[k] for k in READS}


def delta(after, before):
    return {k: after[k] - before[k] for k in READS}


def test_gets_counted_by_tier_on_one_node(node_factory, tmp_path):
    n = disk_node(node_factory, tmp_path / "store")
    cl = RpcClient(n.endpoint("rpc"))
    keys = ["tier/%d" % i for i in range(48)]
    set_through(n, cl, keys)
    m = metrics_of(n)
    assert m["peercache_read_disk_hits_total"] == 0
    assert m["peercache_disk_promote_bytes_total"] == 0
    # The newest pages are in the pool, the oldest only on disk.
    hot, cold = keys[-1], keys[0]
    assert cl.call("kv.exists", [[hot]])[1] == 1

    before = reads(n)
    assert cl.call("kv.get", [[hot]])[1] == [page(hot)]
    assert delta(reads(n), before) == {
        "peercache_read_requests_total": 1, "peercache_read_local_hits_total": 1,
        "peercache_read_remote_hits_total": 0, "peercache_read_disk_hits_total": 0,
        "peercache_read_misses_total": 0}

    # A page on disk: the get misses, counted as a disk hit, and promotes it.
    before = reads(n)
    promoted = metrics_of(n)["peercache_disk_promotions_total"]
    assert cl.call("kv.get", [[cold]])[1] == [None]
    assert delta(reads(n), before) == {
        "peercache_read_requests_total": 1, "peercache_read_local_hits_total": 0,
        "peercache_read_remote_hits_total": 0, "peercache_read_disk_hits_total": 1,
        "peercache_read_misses_total": 1}
    assert wait_metric(n, "peercache_disk_promotions_total", promoted + 1) == promoted + 1
    assert get_back(cl, cold) == page(cold)

    # A key nobody set: a plain miss, no disk hit.
    before = reads(n)
    assert cl.call("kv.get", [["tier/none"]])[1] == [None]
    assert delta(reads(n), before)["peercache_read_disk_hits_total"] == 0
    assert delta(reads(n), before)["peercache_read_misses_total"] == 1

    # Every cold page once more: each is local, or on disk (then promoted).
    for k in keys[:24]:
        assert get_back(cl, k) == page(k), k
    m = metrics_of(n)
    r = reads(n)
    assert r["peercache_read_disk_hits_total"] >= 2
    # The partition the dashboard draws: local + remote + disk + plain miss.
    assert r["peercache_read_misses_total"] >= r["peercache_read_disk_hits_total"]
    assert r["peercache_read_local_hits_total"] + r["peercache_read_remote_hits_total"] + \
        r["peercache_read_misses_total"] == r["peercache_read_requests_total"]
    # Promoted bytes: whole pages, one per promotion.
    assert m["peercache_disk_promote_bytes_total"] == \
        m["peercache_disk_promotions_total"] * PAGE
    # Nothing with the kernel once the node is idle.
    deadline = time.time() + 20
    while metrics_of(n)["peercache_disk_ios_in_flight"] != 0 and time.time() < deadline:
        time.sleep(0.05)
    assert metrics_of(n)["peercache_disk_ios_in_flight"] == 0
    assert n.stop() == 0


def test_another_nodes_disk_pages_are_disk_hits(node_factory, tmp_path):
    a, b = start_pair(node_factory, tmp_path)
    ca, cb = RpcClient(a.endpoint("rpc")), RpcClient(b.endpoint("rpc"))
    keys = ["tier2/%d" % i for i in range(32)]
    set_through(a, ca, keys)
    before = reads(b)
    got = cb.call("kv.get", [keys])[1]
    d = delta(reads(b), before)
    found = sum(g is not None for g in got)
    assert all(g is None or g == page(k) for g, k in zip(got, keys))
    # A's pool holds some pages (remote hits for B); A promotes some of its
    # disk pages for B's get (disk hits for B, read from A's pool after).
    assert d["peercache_read_remote_hits_total"] > 0
    assert d["peercache_read_disk_hits_total"] > 0
    assert d["peercache_read_remote_hits_total"] + \
        d["peercache_read_disk_hits_total"] == found
    assert d["peercache_read_local_hits_total"] == 0
    assert d["peercache_read_misses_total"] == len(keys) - found
    assert a.stop() == 0 and b.stop() == 0


def test_records_are_summed_with_and_without_pool_checksums(node_factory, tmp_path):
    """The write-through takes the pool's checksum of a page when it has
    one (page_checksums, the default) and sums the copy itself when not:
    either way every record promotes byte-exact, none is found damaged."""
    for on in ("true", "false"):
        n = disk_node(node_factory, tmp_path / ("store-" + on), "--page-checksums", on)
        cl = RpcClient(n.endpoint("rpc"))
        keys = ["sum-%s/%d" % (on, i) for i in range(32)]
        set_through(n, cl, keys)
        for k in keys:
            assert get_back(cl, k) == page(k), k
        m = metrics_of(n)
        assert m["peercache_disk_promotions_total"] > 0
        assert m["peercache_disk_bad_pages_total"] == 0
        assert m["peercache_disk_promote_errors_total"] == 0
        assert n.stop() == 0
