"""A kv.get reply sends large pages from the node's staging, without copying
them into the reply, and gives the staging and the reply budget back once
they have left, also to a client that goes away mid-reply.

The node copies a page it holds once into staging (in slices, on the
reactor); pages of 64 KiB and more then leave from there by reference
(rpc_reply_ref), smaller ones are copied into the reply.
peercache_copy_bytes_total{op="rpc_reply"} counts only the copied ones.
"""
import os
import socket
import struct
import time

from conftest import RpcClient, metric_settles as _wait_metric, metrics_of

MiB = 1 << 20
COPIED = 'peercache_copy_bytes_total{op="rpc_reply"}'


def test_large_pages_leave_without_a_copy(node_factory):
    n = node_factory("--pool-size", "256mb")
    n.wait_for("ready")
    c = RpcClient(n.endpoint("rpc"), timeout=60)
    big = [os.urandom(4 * MiB) for _ in range(6)]
    small = [os.urandom(4096) for _ in range(4)]
    bk = ["big-%d" % i for i in range(len(big))]
    sk = ["small-%d" % i for i in range(len(small))]
    assert c.call("kv.set", [bk, big]) == (None, [True] * len(big))
    assert c.call("kv.set", [sk, small]) == (None, [True] * len(small))
    m = metrics_of(n)
    m0 = m[COPIED]
    # The reply budget now: the chunk c's connection keeps for its output.
    r0 = m["peercache_rpc_reply_bytes"]
    # Several rounds: the second and later stage into warm blocks.
    for _ in range(4):
        assert c.call("kv.get", [bk]) == (None, big)
    assert metrics_of(n)[COPIED] == m0, "large pages were copied into replies"
    # Small pages are copied; in a mixed reply, only they; misses are nil.
    assert c.call("kv.get", [sk]) == (None, small)
    assert metrics_of(n)[COPIED] == m0 + 4 * 4096
    mixed = ["small-0", "big-1", "none", "big-2", "small-1"]
    assert c.call("kv.get", [mixed]) == (None, [small[0], big[1], None, big[2], small[1]])
    m = metrics_of(n)
    assert m[COPIED] == m0 + 6 * 4096
    assert m["peercache_kv_staged_bytes"] == 0
    assert _wait_metric(n, "peercache_rpc_reply_bytes", r0) == r0
    assert n.stop() == 0


def test_a_client_that_leaves_mid_reply(node_factory):
    n = node_factory("--pool-size", "256mb")
    n.wait_for("ready")
    addr = n.endpoint("rpc")
    c = RpcClient(addr, timeout=60)
    big = [os.urandom(4 * MiB) for _ in range(8)]
    keys = ["p-%d" % i for i in range(len(big))]
    assert c.call("kv.set", [keys, big]) == (None, [True] * len(big))
    r0 = metrics_of(n)["peercache_rpc_reply_bytes"]
    for _ in range(20):
        # 32 MiB asked for; the client reads a little or nothing and goes.
        raw = RpcClient(addr, timeout=60)
        raw.send("kv.get", [keys])
        time.sleep(0.01)
        # an abortive close (RST), as a killed client leaves
        raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        raw.close()
    # Once the calls the clients left behind have ended (their copies go
    # on in slices), everything was given back: the staging, the reply
    # budget ...
    assert _wait_metric(n, "peercache_kv_staged_bytes", 0, 60) == 0
    assert _wait_metric(n, "peercache_rpc_reply_bytes", r0) == r0
    # ... and the node serves the next client whole.
    assert c.call("kv.get", [keys]) == (None, big)
    assert n.proc.poll() is None
    assert n.stop() == 0
