"""A large kv.set is copied into the pool in slices, from where its request
arrived: the node keeps the request's bytes (rpc_call_keep_request) and
takes nothing more from that connection until the pages are in the pool;
the request's bytes go then too, while the records' publication may still
wait on an owner.

What a client sees must not change: every value stored byte for byte,
requests after the set on the same connection served after it (a get
pipelined behind a set sees the set's values), and a client that leaves
mid-set costs nothing once the set has ended.
"""
import os
import signal
import socket
import struct

import msgpack

from conftest import RpcClient, freeze, metric_settles, metrics_of

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


def test_a_set_waiting_on_a_frozen_owner_lets_its_client_go_on(cluster):
    """The records of a set wait on a frozen directory owner (up to the
    call's deadline, 5 s here), but its pages are in the pool: the request's
    32 MiB go back to the node's input budget, and the calls pipelined
    behind it are served meanwhile (a get of its keys finds them here)."""
    a, b = cluster(2, "--pool-size", "512mb", "--request-deadline", "5s",
                   "--rpc-timeout", "5s")
    c = RpcClient(a.endpoint("rpc"), timeout=60)
    b0 = metrics_of(a)["peercache_rpc_buffered_bytes"]
    vals = [os.urandom(4 * MiB) for _ in range(8)]
    keys = ["frozen-%d" % i for i in range(len(vals))]
    freeze(b.proc.pid)
    try:
        c.sock.sendall(b"".join([
            msgpack.packb([0, 1, "kv.set", [keys, vals]]),
            msgpack.packb([0, 2, "kv.get", [keys]]),
            msgpack.packb([0, 3, "node.health", []]),
        ]))
        got = {}
        while 3 not in got:
            m = c.recv()
            got[m[1]] = m
        assert 1 not in got, "the calls behind the set waited for its answer"
        assert got[2][2] is None and got[2][3] == vals, "a get behind the set"
        assert got[3][2] is None
        # The set's request is not held while it waits on b (a few KiB of
        # other connections' input come and go: the request is 32 MiB).
        assert metrics_of(a)["peercache_rpc_buffered_bytes"] < b0 + MiB
        m = c.recv()
        assert m[1] == 1 and m[2] is None and len(m[3]) == len(vals)
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    assert c.call("kv.get", [keys[:1]]) == (None, vals[:1])
    assert a.stop() == 0
    assert b.stop() == 0
