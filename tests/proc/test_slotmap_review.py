"""slotmap mode (issue 15): cases a review of modules/slotmap*.c found.

A claimed way committed with a hash that is not its bytes — what a writer
whose stale WRITE landed in someone else's claim, or a writer that never
wrote, leaves behind — must never be served as the key's page: not by a
peer's one-sided read (checked against the header's checksum), not by the
owner's own reads, and not counted by exists either (the owner hashes the
payload at commit and refuses a commit its bytes do not prove)."""
import ctypes
import os
import time

from conftest import RpcClient, metrics_of

SLOTMAP = ("--mode", "slotmap", "--pool-size", "256mb")

_xxh = ctypes.CDLL("libxxhash.so.0")
_xxh.XXH3_64bits.restype = ctypes.c_uint64
_xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def page_sum(data):
    """The node's page checksum (pc_page_sum: XXH3-64) of data."""
    return _xxh.XXH3_64bits(data, len(data))


def claim_commit_unwritten(c, key, length, bogus_hash):
    """slot.claim a way for key and commit it without writing its payload,
    with bogus_hash as the writer's hash: the commit is refused."""
    err, res = c.call("slot.claim", [[key], [length]])
    assert err is None, err
    data, wkey, ways = res
    assert isinstance(ways[0], list), ways
    addr, seq = ways[0]
    err, ok = c.call("slot.commit", [[[addr, seq, bogus_hash]]])
    assert err is None and ok == [False], (err, ok)


def test_owner_never_serves_a_page_its_hash_does_not_prove(cluster):
    (a,) = cluster(1, *SLOTMAP)
    c = RpcClient(a.endpoint("rpc"))
    # A fresh way: its payload is zeros, the commit's hash is not theirs.
    claim_commit_unwritten(c, "review/unwritten", 8192, 12345)
    err, got = c.call("kv.get", [["review/unwritten"]])
    assert err is None
    assert got == [None], "the owner served bytes no writer hashed"
    # The same over a page the key had: the old bytes stay in the way, the
    # new header's length and hash do not describe them.
    old = os.urandom(8192)
    err, ok = c.call("kv.set", [["review/old"], [old]])
    assert err is None and ok == [True]
    claim_commit_unwritten(c, "review/old", 4096, 999)
    err, got = c.call("kv.get", [["review/old"]])
    assert err is None
    assert got == [None], "the owner served a page its checksum rejects"
    # exists and slot.probe (what a peer's exists asks) count neither.
    for k in ("review/unwritten", "review/old"):
        err, n = c.call("kv.exists", [[k]])
        assert err is None and n == 0, (k, n)
        err, lens = c.call("slot.probe", [[k], 0])
        assert err is None and lens == [0], (k, lens)
    m = metrics_of(a)
    assert m["peercache_slotmap_commits_refused_total"] == 2
    c.close()


def test_a_commit_is_published_only_over_the_bytes_it_names(cluster):
    """A claimed way whose payload is the writer's bytes is published;
    the same claim committed with another hash is not."""
    (a,) = cluster(1, *SLOTMAP)
    c = RpcClient(a.endpoint("rpc"))
    zeros = bytes(4096)  # a fresh way's payload
    err, res = c.call("slot.claim", [["review/z1", "review/z2"], [4096, 4096]])
    assert err is None, err
    (w1, w2) = res[2]
    err, ok = c.call("slot.commit", [[w1 + [page_sum(zeros)],
                                      w2 + [page_sum(zeros) ^ 1]]])
    assert err is None and ok == [True, False], ok
    err, got = c.call("kv.get", [["review/z1", "review/z2"]])
    assert err is None and got == [zeros, None], got
    err, n = c.call("kv.exists", [["review/z1"]])
    assert err is None and n == 1
    err, n = c.call("kv.exists", [["review/z2"]])
    assert err is None and n == 0
    assert metrics_of(a)["peercache_slotmap_commits_refused_total"] == 1
    c.close()


def test_a_refused_get_reads_no_page_after_the_refusal(cluster):
    """kv.h: the first refusal of a get ends its staging — nothing more is
    looked up or read. A small own page after one over the call's cap was
    still copied (and counted as a hit of a call answered with an
    error)."""
    (a,) = cluster(1, *SLOTMAP, "--kv-staging-max", "1mb")
    c = RpcClient(a.endpoint("rpc"))
    big, small = os.urandom(2 << 20), os.urandom(4096)
    err, ok = c.call("kv.set", [["review/big", "review/small"], [big, small]])
    assert err is None and ok == [True, True]
    err, got = c.call("kv.get", [["review/big", "review/small"]])
    assert err is not None and "kv_staging_max" in err["message"], err
    m = metrics_of(a)
    assert m["peercache_read_hits_total"] == 0, "read after the refusal"
    assert m["peercache_read_misses_total"] == 2
    err, got = c.call("kv.get", [["review/small"]])
    assert err is None and got == [small]
    c.close()


def wait_metric(node, name, want, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        v = metrics_of(node)[name]
        if v >= want or time.monotonic() > deadline:
            return v
        time.sleep(0.05)


def test_claims_expire_and_commits_after_them_fail(cluster):
    """The claims table: claims committed, given back and left to expire,
    in any order; the sweep empties only the ones left, a commit after
    its claim expired is refused, and the ways serve new claims."""
    (a,) = cluster(1, *SLOTMAP, "--rpc-timeout", "200ms")
    c = RpcClient(a.endpoint("rpc"))
    keys = ["review/claim/%d" % i for i in range(6)]
    err, res = c.call("slot.claim", [keys, [4096] * len(keys)])
    assert err is None, err
    ways = res[2]
    assert all(isinstance(w, list) for w in ways), ways
    # commit the 2nd (a fresh way: its payload is zeros), give the 5th
    # back, leave the rest to the sweep
    err, ok = c.call("slot.commit", [[ways[1] + [page_sum(bytes(4096))],
                                      ways[4] + [None]]])
    assert err is None and ok == [True, False], ok
    assert wait_metric(a, "peercache_slotmap_claims_expired_total", 4) == 4
    err, ok = c.call("slot.commit", [[w + [1] for w in ways]])
    assert err is None and ok == [False] * len(ways), ok
    assert metrics_of(a)["peercache_slotmap_claims_expired_total"] == 4
    # the ways are free again: new claims, committed at once
    err, res = c.call("slot.claim", [keys, [4096] * len(keys)])
    assert err is None and all(isinstance(w, list) for w in res[2]), res
    err, ok = c.call("slot.commit", [[w + [None] for w in res[2]]])
    assert err is None and ok == [False] * len(keys), ok
    c.close()


def test_a_page_too_large_for_its_owner_counts_as_too_large(cluster):
    """peercache_slotmap_write_failures_total: a page over the largest
    class set through a node that does not own its key is too_large (the
    owner cannot claim it), not remote."""
    a, b = cluster(2, *SLOTMAP)
    c = RpcClient(a.endpoint("rpc"), timeout=30.0)
    key = None
    for i in range(64):  # a key b owns: its small set goes the remote path
        k = "review/big/%d" % i
        before = metrics_of(a)['peercache_slotmap_writes_total{path="remote"}']
        err, ok = c.call("kv.set", [[k], [b"x" * 4096]])
        assert err is None and ok == [True]
        if metrics_of(a)['peercache_slotmap_writes_total{path="remote"}'] > before:
            key = k
            break
    assert key is not None
    err, ok = c.call("kv.set", [[key], [os.urandom(9 << 20)]])  # over 8 MiB
    assert err is None and ok == [False]
    m = metrics_of(a)
    assert m['peercache_slotmap_write_failures_total{reason="too_large"}'] == 1
    assert m['peercache_slotmap_write_failures_total{reason="remote"}'] == 0
    c.close()
