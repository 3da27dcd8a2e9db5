"""The directory read cache (directory_read_cache_ttl) end to end on
loopback, over the TCP transport: a reader that learned records reads
those keys again without a directory lookup; a record whose page its
producer deleted since reads as a failure (the producer's data port finds
no live page there), is dropped, and the key is looked up again in the
same call; pages set again are found again."""
from conftest import RpcClient, metrics_of
from test_p2p import page


def lookups(node):
    return metrics_of(node)["peercache_directory_lookups_total"]


def test_cached_records_skip_lookups_and_stale_ones_are_looked_up_again(cluster):
    a, b = cluster(2, "--pool-size", "64mb", "--directory-read-cache-ttl", "60")
    ca, cb = RpcClient(a.endpoint("rpc")), RpcClient(b.endpoint("rpc"))
    keys = ["rc/page%d" % i for i in range(32)]
    vals = [page(k, 4096 + 61 * i) for i, k in enumerate(keys)]
    err, ok = ca.call("kv.set", [keys, vals])
    assert err is None and ok == [True] * len(keys)
    assert cb.call("kv.get", [keys])[1] == vals
    m = metrics_of(b)
    assert m["peercache_read_cache_misses_total"] >= len(keys)
    assert m["peercache_read_cache_entries"] == len(keys)
    # Again, and exists: from the cache, no lookup at all.
    before = lookups(b)
    assert cb.call("kv.get", [keys])[1] == vals
    assert cb.call("kv.exists", [keys])[1] == len(keys)
    assert lookups(b) == before, "a cached key was looked up"
    assert metrics_of(b)["peercache_read_cache_hits_total"] >= 2 * len(keys)
    # Deleted on their producer: the cached records no longer read; the
    # keys are looked up again in the same call and miss, never old bytes.
    assert ca.call("kv.delete", [keys[:8]])[1] == 8
    err, got = cb.call("kv.get", [keys])
    assert err is None
    assert got == [None] * 8 + vals[8:]
    m = metrics_of(b)
    assert m["peercache_read_cache_stale_total"] == 8
    assert m["peercache_read_failures_total"] == 0, "a looked-up-again key counts once"
    assert lookups(b) > before
    # Set again: found again (a fresh lookup, cached from then on).
    assert ca.call("kv.set", [keys[:8], vals[:8]])[1] == [True] * 8
    assert cb.call("kv.get", [keys])[1] == vals
    before = lookups(b)
    assert cb.call("kv.get", [keys])[1] == vals
    assert lookups(b) == before
    # The original's key name and unit (a bare number is seconds).
    assert cb.call("node.config", [])[1]["directory_read_cache_ttl"] == "1m"
    assert "directory read cache: up to 65536 records, each for 60000 ms" in b.text()
    for n in (a, b):
        assert n.stop() == 0


def test_off_by_default_every_read_is_looked_up(cluster):
    a, b = cluster(2, "--pool-size", "64mb")
    ca, cb = RpcClient(a.endpoint("rpc")), RpcClient(b.endpoint("rpc"))
    keys = ["nc/page%d" % i for i in range(8)]
    vals = [page(k, 4096) for k in keys]
    assert ca.call("kv.set", [keys, vals])[1] == [True] * 8
    assert cb.call("kv.get", [keys])[1] == vals
    before = lookups(b)
    assert cb.call("kv.get", [keys])[1] == vals
    assert lookups(b) > before
    assert "peercache_read_cache_hits_total" not in metrics_of(b)
    for n in (a, b):
        assert n.stop() == 0


def test_slotmap_mode_says_it_has_no_directory_to_skip(node_factory):
    n = node_factory("--mode", "slotmap", "--pool-size", "64mb",
                     "--directory-read-cache-ttl", "5")
    n.wait_for("ready")
    assert "directory_read_cache_ttl has no effect in this mode" in n.text()
    assert "peercache_read_cache_hits_total" not in metrics_of(n)
    assert n.stop() == 0
