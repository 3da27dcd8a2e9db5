"""Metrics of slotmap mode (issue 15, item 6) and the mode metric of every
node: a slotmap node exports every peercache_slotmap_* series docs/slotmap.md
("Metrics") lists, with counts that follow known kv.set / kv.get calls across
two nodes, and none of the p2p pool's; peercache_mode_info names the mode on
both kinds of node."""
import os

from conftest import RpcClient, metrics_of

SLOTMAP = ("--mode", "slotmap", "--pool-size", "256mb")

# Every series of the slotmap module, as metrics_of names them (node label
# dropped). docs/slotmap.md "Metrics" lists the same.
SLOTMAP_SERIES = [
    'peercache_slotmap_reads_total{source="local_slot"}',
    'peercache_slotmap_reads_total{source="remote_slot"}',
    'peercache_slotmap_reads_total{source="miss"}',
    'peercache_slotmap_reads_total{source="rejected"}',
    'peercache_slotmap_writes_total{path="local"}',
    'peercache_slotmap_writes_total{path="remote"}',
    'peercache_slotmap_write_failures_total{reason="busy"}',
    'peercache_slotmap_write_failures_total{reason="too_large"}',
    'peercache_slotmap_write_failures_total{reason="remote"}',
    "peercache_slotmap_claims_total",
    "peercache_slotmap_claims_expired_total",
    "peercache_slotmap_layouts_fetched_total",
    "peercache_slotmap_region_bytes",
    "peercache_slotmap_slots",
    "peercache_slotmap_evictions_total",
    "peercache_slotmap_busy_refusals_total",
    "peercache_slotmap_local_read_retries_total",
]
# The read and copy series the slotmap module registers under kv's names.
SHARED_SERIES = [
    "peercache_read_requests_total", "peercache_read_hits_total",
    "peercache_read_misses_total", "peercache_read_local_hits_total",
    "peercache_read_remote_hits_total", "peercache_bytes_read_total",
    'peercache_copy_bytes_total{op="set"}', 'peercache_copy_bytes_total{op="get_local"}',
    'peercache_copy_bytes_total{op="get_remote"}',
    'peercache_op_latency_hist_seconds_count{op="read"}',
    'peercache_op_latency_hist_seconds_count{op="write"}',
]


def src(m, s):
    return m['peercache_slotmap_reads_total{source="%s"}' % s]


def set_on_a_get_on_b(cluster, prefix):
    """Two slotmap nodes; 64 pages of 4 KiB set through a's kv.set (each
    node owns some of them: all on one owner has a 2^-63 chance), read
    back through b's kv.get with one absent key after them. Returns the
    nodes, their RPC clients and the keys."""
    a, b = cluster(2, *SLOTMAP)
    ca, cb = RpcClient(a.endpoint("rpc")), RpcClient(b.endpoint("rpc"))
    keys = ["%s/%d" % (prefix, i) for i in range(64)]
    vals = [os.urandom(4096) for _ in keys]
    err, ok = ca.call("kv.set", [keys, vals])
    assert err is None and ok == [True] * len(keys)
    err, got = cb.call("kv.get", [keys + ["%s/absent" % prefix]])
    assert err is None and got == vals + [None]
    return a, b, ca, cb, keys


def test_slotmap_series_follow_a_set_and_a_get_across_two_nodes(cluster):
    a, b, ca, cb, keys = set_on_a_get_on_b(cluster, "sm-metrics")

    ma, mb = metrics_of(a), metrics_of(b)
    for m in (ma, mb):
        missing = [x for x in SLOTMAP_SERIES + SHARED_SERIES if x not in m]
        assert not missing, missing
        assert m['peercache_mode_info{mode="slotmap"}'] == 1
        assert not [x for x in m if x.startswith("peercache_pool_")]
        assert m["peercache_slotmap_region_bytes"] > 0
        assert 0 < m["peercache_slotmap_slots"]
    # The writer: every page went into its own region or its owner's.
    wl, wr = ma['peercache_slotmap_writes_total{path="local"}'], \
        ma['peercache_slotmap_writes_total{path="remote"}']
    assert wl + wr == len(keys) and wl > 0 and wr > 0, (wl, wr)
    assert sum(ma['peercache_slotmap_write_failures_total{reason="%s"}' % r]
               for r in ("busy", "too_large", "remote")) == 0
    # b claimed a way for each page a wrote into b's region.
    assert mb["peercache_slotmap_claims_total"] == wr
    # The reader: b's own slots are local, a's remote; the absent key a miss.
    assert src(mb, "local_slot") == wr and src(mb, "remote_slot") == wl
    assert src(mb, "miss") == 1 and src(mb, "rejected") == 0
    assert sum(src(mb, s) for s in ("local_slot", "remote_slot", "miss", "rejected")) \
        == mb["peercache_read_requests_total"] == len(keys) + 1
    assert mb["peercache_read_local_hits_total"] == src(mb, "local_slot")
    assert mb["peercache_read_remote_hits_total"] == src(mb, "remote_slot")
    assert mb["peercache_bytes_read_total"] == 4096 * len(keys)
    # b read a's buckets with a's layout (slot.layout).
    assert mb["peercache_slotmap_layouts_fetched_total"] >= 1
    ca.close()
    cb.close()
    for n in (a, b):
        assert n.stop() == 0


def test_mode_info_names_the_mode(node_factory):
    p = node_factory("--pool-size", "16mb")
    s = node_factory(*SLOTMAP)
    for n in (p, s):
        n.wait_for("ready")
    mp, ms = metrics_of(p), metrics_of(s)
    assert [x for x in mp if x.startswith("peercache_mode_info")] == \
        ['peercache_mode_info{mode="p2p"}']
    assert mp['peercache_mode_info{mode="p2p"}'] == 1
    assert [x for x in ms if x.startswith("peercache_mode_info")] == \
        ['peercache_mode_info{mode="slotmap"}']
    assert ms['peercache_mode_info{mode="slotmap"}'] == 1
    # A p2p node has its pool and none of slotmap's series.
    assert "peercache_pool_capacity_bytes" in mp
    assert not [x for x in mp if x.startswith("peercache_slotmap_")]
    for n in (p, s):
        assert n.stop() == 0
