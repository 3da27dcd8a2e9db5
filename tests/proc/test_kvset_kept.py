"""A large kv.set is copied into the pool in slices, from where its request
arrived: the node keeps the request's bytes (rpc_call_keep_request) and
takes nothing more from that connection until the set has answered.

What a client sees must not change: every value stored byte for byte,
requests after the set on the same connection served after it (a get
pipelined behind a set sees the set's values), and a client that leaves
mid-set costs nothing once the set has ended.
"""
import os
import socket
import struct

import msgpack

from conftest import RpcClient, metric_settles, metrics_of

MiB = 1 << 20
TAKEN = "peercache_reactor_in_taken_total"


def test_pipelined_calls_behind_a_large_set_see_its_values(node_factory):
    n = node_factory("--pool-size", "512mb", "--threads", "2")
    n.wait_for("ready")
    c = RpcClient(n.endpoint("rpc"), timeout=60)
    t0 = metrics_of(n)[TAKEN]
    for rnd in range(3):
        vals = [os.urandom(4 * MiB) for _ in range(8)]
        keys = ["r%d-%d" % (rnd, i) for i in range(len(vals))]
        # The set, a get of the same keys and a health call, in one write.
        wire = b"".join([
            msgpack.packb([0, 1, "kv.set", [keys, vals]]),
            msgpack.packb([0, 2, "kv.get", [keys]]),
            msgpack.packb([0, 3, "node.health", []]),
        ])
        c.sock.sendall(wire)
        got = [c.recv() for _ in range(3)]
        assert [m[1] for m in got] == [1, 2, 3], "replies out of order"
        assert got[0][2] is None and got[0][3] == [True] * len(vals)
        assert got[1][2] is None and got[1][3] == vals, "a get behind the set"
        assert got[2][2] is None
    # Each set was worked on where it arrived.
    assert metrics_of(n)[TAKEN] >= t0 + 3
    # A small set arrives whole and is copied at once, as before.
    assert c.call("kv.set", [["small"], [b"x" * 100]]) == (None, [True])
    assert c.call("kv.get", [["small"]]) == (None, [b"x" * 100])
    assert n.stop() == 0


def test_a_client_that_leaves_mid_set(node_factory):
    n = node_factory("--pool-size", "512mb")
    n.wait_for("ready")
    addr = n.endpoint("rpc")
    c = RpcClient(addr, timeout=60)
    b0 = metrics_of(n)["peercache_rpc_buffered_bytes"]
    vals = {}
    for i in range(12):
        v = [os.urandom(4 * MiB) for _ in range(4)]
        k = ["gone-%d-%d" % (i, j) for j in range(len(v))]
        vals.update(zip(k, v))
        raw = RpcClient(addr, timeout=60)
        t0 = metrics_of(n)[TAKEN]
        raw.send("kv.set", [k, v])
        if i % 2 == 0:
            # Leave once the node has the whole request and works on it
            # (every other client: the others leave at once).
            metric_settles(n, TAKEN, t0 + 1)
        # an abortive close (RST), as a killed client leaves
        raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                            struct.pack("ii", 1, 0))
        raw.close()
    # Kept input is given back once each set has ended ...
    assert metric_settles(n, "peercache_rpc_buffered_bytes", b0, 30) == b0
    assert metric_settles(n, "peercache_kv_staged_bytes", 0, 30) == 0
    # ... and what was stored is whole: a set the node read in full stored
    # every value of it exactly; one cut short stored none.
    keys = sorted(vals)
    stored = 0
    for i in range(0, len(keys), 8):
        err, got = c.call("kv.get", [keys[i:i + 8]])
        assert err is None
        for k, g in zip(keys[i:i + 8], got):
            assert g is None or g == vals[k], "a value stored wrong: %s" % k
            stored += g is not None
    # Half the clients left only once the node had their set whole.
    assert stored >= 6 * 4
    assert n.proc.poll() is None
    assert n.stop() == 0
