"""p2p mode end to end on loopback: a page set on one node is read
byte-identical on the others; misses; local reads stay off the network;
eviction turns into clean misses; a directory replica answers when the
primary is gone; the data port refuses what is not published."""
import hashlib
import os
import random
import socket
import struct
import threading
import time

import pytest

from conftest import RpcClient, metrics_of


def page(key, size):
    """The content oracle: page bytes are derived from the key alone."""
    seed = hashlib.sha256(key.encode()).digest()
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(seed + counter.to_bytes(8, "little")).digest()
        counter += 1
    return bytes(out[:size])


def test_set_on_a_read_on_b_and_c(cluster):
    a, b, c = cluster(3, "--pool-size", "64mb")
    ca, cb, cc = (RpcClient(n.endpoint("rpc")) for n in (a, b, c))
    keys = ["model/layer%d/page%d" % (i % 7, i) for i in range(64)]
    vals = [page(k, 1000 + 977 * i) for i, k in enumerate(keys)]
    err, ok = ca.call("kv.set", [keys, vals])
    assert err is None and ok == [True] * len(keys)
    for cl in (cb, cc):
        err, got = cl.call("kv.get", [keys])
        assert err is None
        assert all(g == v for g, v in zip(got, vals)), "byte-identical pages"
    # Setting again is idempotent.
    assert ca.call("kv.set", [keys[:3], vals[:3]])[1] == [True] * 3
    # Unknown keys are clean misses, in place.
    err, got = cb.call("kv.get", [["nope-1", keys[5], "nope-2"]])
    assert got == [None, vals[5], None]
    assert cc.call("kv.exists", [keys])[1] == len(keys)
    assert cc.call("kv.exists", [keys[:10] + ["hole"] + keys[10:]])[1] == 10
    mb = metrics_of(b)
    assert mb["peercache_read_remote_hits_total"] >= len(keys) + 1
    assert mb["peercache_transport_read_bytes_total"] > sum(map(len, vals))
    for n in (a, b, c):
        assert n.stop() == 0


def test_local_read_moves_no_bytes_over_the_network(cluster):
    a, b, c = cluster(3, "--pool-size", "64mb")
    ca = RpcClient(a.endpoint("rpc"))
    keys = ["local-%d" % i for i in range(32)]
    vals = [page(k, 65536) for k in keys]
    assert ca.call("kv.set", [keys, vals])[1] == [True] * 32
    before = metrics_of(a)
    err, got = ca.call("kv.get", [keys])
    assert got == vals
    after = metrics_of(a)
    assert after["peercache_read_local_hits_total"] - before["peercache_read_local_hits_total"] == 32
    assert after["peercache_transport_reads_total"] == before["peercache_transport_reads_total"]
    assert after["peercache_directory_lookups_total"] == before["peercache_directory_lookups_total"]
    for n in (a, b, c):
        assert n.stop() == 0


def test_eviction_turns_into_clean_misses(cluster):
    a, b, c = cluster(3, "--pool-size", "8mb")
    ca, cb = RpcClient(a.endpoint("rpc")), RpcClient(b.endpoint("rpc"))
    keys = ["ev-%d" % i for i in range(64)]
    vals = [page(k, 512 * 1024) for k in keys]  # 32 MiB into an 8 MiB pool
    for i in range(0, 64, 8):
        err, ok = ca.call("kv.set", [keys[i:i + 8], vals[i:i + 8]])
        assert err is None and all(ok)
    time.sleep(0.3)  # evictions withdraw their records asynchronously
    err, got = cb.call("kv.get", [keys])
    hits = [k for k, g, v in zip(keys, got, vals) if g is not None]
    assert all(g is None or g == v for g, v in zip(got, vals)), "never wrong bytes"
    assert 0 < len(hits) < 32, "the newest pages survive, the old ones are gone"
    assert got[-1] == vals[-1]
    ma = metrics_of(a)
    assert ma["peercache_evictions_total"] > 0
    # Old pages' records were withdrawn: exists agrees with get.
    assert cb.call("kv.exists", [keys[:4]])[1] == 0
    for n in (a, b, c):
        assert n.stop() == 0


def test_replica_answers_when_the_primary_is_stopped(cluster):
    nodes = cluster(3, "--pool-size", "64mb", "--directory-replicas", "2")
    clients = [RpcClient(n.endpoint("rpc")) for n in nodes]
    ids = [n.endpoint("rpc") for n in nodes]
    keys = ["rep-%d" % i for i in range(200)]
    vals = [page(k, 4096) for k in keys]
    # Producer: node 0. Stop node 1 afterwards and read from node 2: the
    # keys whose primary directory owner was node 1 must still be found.
    assert clients[0].call("kv.set", [keys, vals])[1] == [True] * 200
    assert nodes[1].stop() == 0
    err, got = clients[2].call("kv.get", [keys])
    assert err is None
    assert got == vals, "%d of 200 found" % sum(g is not None for g in got)
    m = metrics_of(nodes[2])
    assert m["peercache_directory_fallbacks_total"] > 0
    for n in (nodes[0], nodes[2]):
        assert n.stop() == 0
    del ids


def test_replica_answers_when_the_primary_lost_the_record(cluster):
    # A primary that answers "not found" (restarted, empty) is not the end:
    # the lookup goes on to the next replica.
    nodes = cluster(3, "--pool-size", "64mb")
    c0, c2 = RpcClient(nodes[0].endpoint("rpc")), RpcClient(nodes[2].endpoint("rpc"))
    keys = ["lost-%d" % i for i in range(100)]
    vals = [page(k, 2048) for k in keys]
    assert c0.call("kv.set", [keys, vals])[1] == [True] * 100
    # Empty node 1's shard: delete its records directly (conditional on
    # nothing), as a restarted owner would have lost them.
    c1 = RpcClient(nodes[1].endpoint("rpc"))
    err, existed = c1.call("dir.del", [[[k, None, 0] for k in keys]])
    assert err is None and any(existed)
    err, got = c2.call("kv.get", [keys])
    assert got == vals
    for n in nodes:
        assert n.stop() == 0


def _data_addr(node):
    host, port = node.endpoint("data").rsplit(":", 1)
    return host, int(port)


def test_a_record_here_that_does_not_read_is_asked_of_the_other_owner(cluster):
    # Two nodes, two directory replicas: each holds every record and looks
    # keys up in its own replica, without a round trip. Node b's replica
    # is then given records that do not read (another generation, as when
    # b missed a publish): b's reads of them fail, and b asks the other
    # owner. Every get is the page, none a miss.
    a, b = cluster(2, "--pool-size", "64mb")
    ca, cb = RpcClient(a.endpoint("rpc")), RpcClient(b.endpoint("rpc"))
    keys = ["near-%d" % i for i in range(48)]
    vals = [page(k, 3000) for k in keys]
    assert ca.call("kv.set", [keys, vals])[1] == [True] * len(keys)
    err, got = cb.call("kv.get", [keys])
    assert err is None and got == vals
    before = metrics_of(b)
    assert before["peercache_directory_own_replica_hits_total"] > 0, \
        "b found the keys a owns first in its own replica"
    assert before["peercache_read_own_replica_stale_total"] == 0
    # b's replica: records of another generation, from a producer that is
    # not a member (a live member's key would keep its record).
    err, recs = ca.call("dir.get", [keys])
    assert err is None and all(recs)
    # (b may lack a record whose publish it did not answer in time.)
    assert cb.call("dir.del", [[[k, None, 0] for k in keys]])[0] is None
    # Half of them: a's page at that place, another generation (the page
    # that comes is not the record's); the other half: a producer whose
    # data port refuses (a transport failure, counted as a failed read).
    data = recs[0][1]
    half = len(keys) // 2
    for fake, ep, part in (("127.0.0.1:1", data, range(half)),
                           ("127.0.0.1:2", "127.0.0.1:1", range(half, len(keys)))):
        wrong = [[keys[i], [fake, ep, recs[i][2], recs[i][3], recs[i][4],
                            recs[i][5] + 1000, True]] for i in part]
        err, stored = RpcClient(b.endpoint("rpc")).call("dir.put", [wrong, [fake, ep, 1]])
        assert err is None and stored == len(wrong)
    err, got = cb.call("kv.get", [keys])
    assert err is None
    assert got == vals, "%d of %d read" % (sum(g is not None for g in got),
                                           len(keys))
    after = metrics_of(b)
    assert after["peercache_read_own_replica_stale_total"] == half
    assert (after["peercache_read_failures_total"] -
            before["peercache_read_failures_total"]) == len(keys) - half
    for n in (a, b):
        assert n.stop() == 0


def test_data_port_refuses_unpublished_memory(cluster):
    a, b, c = cluster(3, "--pool-size", "16mb")
    ca = RpcClient(a.endpoint("rpc"))
    keys = ["sec-%d" % i for i in range(16)]
    vals = [page(k, 8192) for k in keys]
    assert ca.call("kv.set", [keys, vals])[1] == [True] * 16
    # Learn one record: where the page lives and its rkey.
    recs = []
    for n in (a, b, c):
        err, got = RpcClient(n.endpoint("rpc")).call("dir.get", [keys])
        recs += [r for r in got if r]
    assert recs
    node, data, addr, rkey, length, gen, resident = recs[0]
    s = socket.create_connection(_data_addr(a), timeout=10)
    rnd = random.Random(7)
    total, pending, leaked, refused = 100000, 0, 0, 0

    def bad_request(i):
        kind = i % 5
        if kind == 0:   # wrong rkey, valid address
            return (rkey ^ rnd.randrange(1, 1 << 32)) & 0xffffffff, addr, 64 + length
        if kind == 1:   # outside the region
            return rkey, rnd.choice([0, 4096, addr - (1 << 40), addr + (1 << 40), (1 << 64) - 4096]), 4096
        if kind == 2:   # inside, but not at an entry's start
            return rkey, addr + rnd.randrange(1, 4096), 64
        if kind == 3:   # longer than the entry
            return rkey, addr, 64 + length + rnd.randrange(1, 1 << 20)
        return rkey, addr + rnd.randrange(1, 1 << 16) * 4096 + rnd.randrange(1, 4096), 128

    buf = b""
    batch = []
    for i in range(total):
        rk, ad, ln = bad_request(i)
        batch.append(struct.pack("<IHHIIQQ", 0x31444350, 1, 0, rk, ln, ad & (2**64 - 1), i))
        if len(batch) == 1000:
            s.sendall(b"".join(batch))
            pending += len(batch)
            batch = []
            while pending:
                while len(buf) < 24:
                    chunk = s.recv(1 << 16)
                    assert chunk, "the node closed the data connection"
                    buf += chunk
                magic, status, rid, ln = struct.unpack("<IiQQ", buf[:24])
                buf = buf[24:]
                assert magic == 0x31524350
                if status == 0:
                    leaked += ln
                else:
                    refused += 1
                    assert ln == 0
                pending -= 1
    s.close()
    assert leaked == 0, "bytes served for requests that were not published"
    assert refused == total
    m = metrics_of(a)
    assert m["peercache_transport_refused_total"] >= total
    # And a proper read of the record still works.
    cb = RpcClient(b.endpoint("rpc"))
    assert cb.call("kv.get", [[keys[0]]])[1][0] == vals[0]
    for n in (a, b, c):
        assert n.stop() == 0
