"""kv.get staging nobody wrote yet is faulted in off the reactor.

A kv.get's pages go into staging blocks of the reactor's own; when its warm
blocks have none to fit (a fresh node, or more staging than they keep), the
block is a new mapping, and the reactor used to fault its pages in as they
landed: 128 faults per 512 KiB copy slice, 1.5-2 ms each in a VM. Such a
block is now faulted in on the offload thread first, for pages copied from
this node's pool and for pages read from another node alike; the bytes a
get returns are the same (peercache_kv_staging_faulted_in_bytes_total
counts what was faulted in).
"""
import os

from conftest import RpcClient, metrics_of

MiB = 1 << 20
STAGED = "peercache_kv_staging_faulted_in_bytes_total"


def test_fresh_staging_is_faulted_in_off_the_reactor(cluster):
    a, b = cluster(2, "--pool-size", "256mb")
    ca = RpcClient(a.endpoint("rpc"), timeout=60)
    cb = RpcClient(b.endpoint("rpc"), timeout=60)
    keys = ["staged-%d" % i for i in range(8)]
    vals = [os.urandom(2 * MiB) for _ in keys]
    assert ca.call("kv.set", [keys, vals]) == (None, [True] * 8)
    assert metrics_of(a)[STAGED] == 0 and metrics_of(b)[STAGED] == 0
    # b reads a's pages into fresh staging (the remote path) ...
    assert cb.call("kv.get", [keys]) == (None, vals)
    assert metrics_of(b)[STAGED] >= 16 * MiB
    # ... and a copies its own into fresh staging (the local path).
    assert ca.call("kv.get", [keys]) == (None, vals)
    assert metrics_of(a)[STAGED] >= 16 * MiB
    # Again, on warm or fresh blocks: the same bytes.
    assert cb.call("kv.get", [keys[::-1]]) == (None, vals[::-1])
    assert ca.call("kv.get", [keys[:3]]) == (None, vals[:3])
    for nd in (a, b):
        assert nd.stop() == 0
