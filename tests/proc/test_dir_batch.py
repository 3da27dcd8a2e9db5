"""Batched dir.get (issue 11, item 9).

dir.get walks its keys in prefetching stages and encodes each record
straight from the shard, and the RPC layer sends a reply in staged writes.
A batch of records and misses, in an order that crosses the stages and
many reply stages, must come back exactly: the right record for every
key, nil for every miss, in the order asked, and in MessagePack's smallest
forms (the bytes re-encode to themselves, as msgpack-c's packer made them
before), also while another connection replaces records of the same keys.
"""
import socket
import threading

import msgpack

from conftest import RpcClient


def page(key, n):
    return (key.encode() * (n // len(key) + 1))[:n]


def raw_call(addr, msgid, method, params):
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(msgpack.packb([0, msgid, method, params]))
    unp, raw = msgpack.Unpacker(raw=False), b""
    try:
        while True:
            data = s.recv(1 << 16)
            assert data, "closed by the node"
            raw += data
            unp.feed(data)
            for msg in unp:
                return raw, msg
    finally:
        s.close()


def test_dir_get_batch_records_misses_and_encoding(node_factory):
    node = node_factory("--threads", "2", "--pool-size", "64mb")
    rpc = node.endpoint("rpc")
    c = RpcClient(rpc)
    # Sizes on both sides of one-byte and two-byte lengths and generations.
    keys = ["db-%d-%s" % (i, "x" * (i % 40)) for i in range(300)]
    sizes = [1 + (i * 977) % 70000 for i in range(300)]
    for i in range(0, 300, 50):
        err, ok = c.call("kv.set", [keys[i:i + 50],
                                    [page(k, n) for k, n in zip(keys[i:i + 50], sizes[i:i + 50])]])
        assert err is None and ok == [True] * 50, (err, ok)
    ask, want = [], []
    for i, k in enumerate(keys):
        ask.append(k)
        want.append(sizes[i])
        if i % 3 == 0:
            ask.append("missing-%d" % i)
            want.append(None)
    raw, msg = raw_call(rpc, 7, "dir.get", [ask])
    assert msg[0] == 1 and msg[1] == 7 and msg[2] is None, msg[:3]
    got = msg[3]
    assert len(got) == len(ask)
    data = node.endpoint("data")
    for k, w, r in zip(ask, want, got):
        if w is None:
            assert r is None, k
            continue
        assert r is not None, k
        node_id, data_ep, addr, rkey, length, gen, resident = r
        assert data_ep == data and length == w and gen > 0 and resident is True, (k, r)
    assert msgpack.packb(msg) == raw  # smallest forms, as before

    # The same batch while another connection sets the keys again.
    stop = threading.Event()
    errors = []

    def writer():
        w = RpcClient(rpc)
        n = 0
        while not stop.is_set() and n < 200:
            i = (n * 7) % 300
            err, ok = w.call("kv.set", [[keys[i]], [page(keys[i], sizes[i])]])
            if err is not None or ok != [True]:
                errors.append((err, ok))
            n += 1
        w.close()

    t = threading.Thread(target=writer)
    t.start()
    try:
        for m in range(20):
            raw, msg = raw_call(rpc, 100 + m, "dir.get", [ask])
            assert msg[2] is None and len(msg[3]) == len(ask)
            for k, w, r in zip(ask, want, msg[3]):
                assert (r is None) == (w is None), k
                if r is not None:
                    assert r[4] == w, (k, r)
            assert msgpack.packb(msg) == raw
    finally:
        stop.set()
        t.join()
    assert not errors, errors[:3]
    c.close()
    assert node.stop() == 0
