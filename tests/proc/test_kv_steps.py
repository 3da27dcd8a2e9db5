"""kv.* calls of more than 4,096 keys go to the kv API in steps of 4,096
(modules/kv_rpc.c), each on a loop pass of its own, so that no reactor
callback does work for 65,536 keys at once; their params are read over
passes too, all before the first step.

What a client sees must not change: every value byte for byte in key
order, misses as nil wherever they fall against the steps' edges,
kv.exists counting leading keys across steps (and stopping at the first
step that found fewer than all of its own), kv.delete counting over every
step, a bad key or value anywhere failing the whole call before anything
is stored, a get whose pages only exceed the per-call cap together
refused as too_large with nothing left staged, and calls pipelined behind
a stepped one taken after it (a stepped set's pages are in the pool first). peercache_kv_rpc_steps_total
counts the steps.
"""
import os
import threading

from conftest import RpcClient, metrics_of
from test_hardening_session import Client as SessionClient

STEP = 4096
STEPS = "peercache_kv_rpc_steps_total"
TAKEN = "peercache_reactor_in_taken_total"


def steps(node):
    return metrics_of(node)[STEPS]


def started(node_factory, *args):
    """A node of args, ready, and a client on its RPC port."""
    n = node_factory(*args)
    n.wait_for("ready")
    return n, RpcClient(n.endpoint("rpc"), timeout=60)


def test_stepped_calls_answer_as_one(node_factory):
    n, c = started(node_factory, "--pool-size", "512mb", "--threads", "2")
    count = 5 * STEP - 480  # 5 steps, the last one short
    keys = ["st-%06d" % i for i in range(count)]
    vals = [os.urandom(1 + (i * 37) % 300) for i in range(count)]
    # Pages sent by reference from the staging between packed runs, on
    # both sides of a step's edge, and the first and last pages of steps.
    for i in (0, STEP - 1, STEP, STEP + 1, 3 * STEP + 7, count - 1):
        vals[i] = os.urandom(64 * 1024 + i % 3 * 70000)
    s0 = steps(n)
    assert c.call("kv.set", [keys, vals]) == (None, [True] * count)
    assert c.call("kv.get", [keys]) == (None, vals)
    assert steps(n) - s0 == 10

    # Misses at the steps' edges come back as nil in their places.
    ask = list(keys)
    holes = (0, STEP - 1, STEP, 2 * STEP + 5, count - 1)
    for i in holes:
        ask[i] = "missing-%d" % i
    want = [None if i in holes else v for i, v in enumerate(vals)]
    assert c.call("kv.get", [ask]) == (None, want)

    # Leading keys, across steps; a step that finds fewer than all of its
    # keys ends the call (no later step runs).
    for hole, ran in ((0, 1), (STEP - 1, 1), (STEP, 2), (STEP + 1, 2),
                      (4 * STEP, 5), (count - 1, 5)):
        ask = list(keys)
        ask[hole] = "missing"
        s0 = steps(n)
        assert c.call("kv.exists", [ask]) == (None, hole), hole
        assert steps(n) - s0 == ran, hole
    assert c.call("kv.exists", [keys]) == (None, count)

    # Deletes count over every step; what was deleted is gone, the rest
    # is still there.
    gone = 2 * STEP + 100
    assert c.call("kv.delete", [keys[:gone] + ["never-%d" % i for i in range(50)]]) == \
        (None, gone)
    assert c.call("kv.get", [keys]) == (None, [None] * gone + vals[gone:])
    assert c.call("kv.delete", [keys]) == (None, count - gone)
    m = metrics_of(n)
    assert m["peercache_kv_staged_bytes"] == 0
    assert n.stop() == 0


def test_a_bad_item_anywhere_fails_the_whole_call(node_factory):
    n, c = started(node_factory, "--pool-size", "256mb")
    count = 3 * STEP + 1
    keys = ["bad-%06d" % i for i in range(count)]
    vals = [b"v%d" % i for i in range(count)]
    s0 = steps(n)
    for params in ([keys[:-1] + [""], vals],          # the last key empty
                   [keys, vals[:-1] + ["text"]],      # the last value not bin
                   [keys, vals[:-1]],                 # a value short
                   [keys[:-1] + [7], vals]):
        err, got = c.call("kv.set", params)
        assert got is None and err["code"] == "bad_params", err
    err, got = c.call("kv.get", [keys[:-1] + ["x" * 513]])
    assert got is None and err["code"] == "bad_params", err
    assert steps(n) == s0  # refused before any step
    assert c.call("kv.exists", [[keys[0]]]) == (None, 0)  # nothing stored
    assert c.call("kv.set", [keys, vals]) == (None, [True] * count)
    assert c.call("kv.get", [keys]) == (None, vals)
    assert n.stop() == 0


def test_a_small_stepped_request_is_copied_and_still_right(node_factory):
    # 5,000 one-letter keys (~10 KB) arrive in one 16 KiB receive buffer:
    # the request is not kept (rpc_call_keep_request declines), so the
    # call copies its params before its first step. One reactor with 16
    # receive buffers, and another client writing requests of about the
    # same size all along: the buffer the call arrived in is soon reused
    # (and in the ASan build it is poisoned as soon as it went back, so a
    # step reading it is reported at once).
    n, c = started(node_factory, "--pool-size", "256mb", "--threads", "1",
                   "--reactor-buf-count", "16")
    letters = [chr(ord("a") + i) for i in range(26)]
    vals = [os.urandom(1 + i) for i in range(26)]
    assert c.call("kv.set", [letters, vals]) == (None, [True] * 26)
    count = STEP + 904
    ask = [letters[i % 26] if i % 7 else "Z" for i in range(count)]
    want = [vals[i % 26] if i % 7 else None for i in range(count)]
    t0 = metrics_of(n)[TAKEN]
    stop = threading.Event()

    def noise():
        other = RpcClient(n.endpoint("rpc"), timeout=60)
        junk = [["Q" * 200] * 40]  # ~8 KB of other keys
        while not stop.is_set():
            assert other.call("kv.exists", junk) == (None, 0)
        other.close()

    th = threading.Thread(target=noise)
    th.start()
    try:
        for _ in range(5):
            assert c.call("kv.get", [ask]) == (None, want)
            assert c.call("kv.exists", [[letters[i % 26] for i in range(count)]]) == \
                (None, count)
    finally:
        stop.set()
        th.join()
    assert c.call("kv.delete", [["b"] * count]) == (None, 1)
    assert metrics_of(n)[TAKEN] == t0  # copied, never kept
    assert n.stop() == 0


def test_calls_pipelined_behind_a_stepped_one_see_what_it_did(node_factory):
    n, c = started(node_factory, "--pool-size", "512mb", "--threads", "2")
    count = 4 * STEP
    keys = ["pl-%06d" % i for i in range(count)]
    vals = [os.urandom(100) for _ in range(count)]
    fresh = ["pl2-%06d" % i for i in range(count)]
    new = [os.urandom(100) for _ in range(count)]
    assert c.call("kv.set", [keys, vals]) == (None, [True] * count)
    ids = [c.send("kv.get", [keys]), c.send("kv.set", [fresh, new]),
           c.send("kv.get", [fresh[:3] + fresh[-3:]]), c.send("kv.delete", [keys]),
           c.send("kv.exists", [keys])]
    # A set answers once its records are published, so the calls behind
    # it may be answered first (as for any set whose request is kept):
    # they are taken once its pages are in the pool, and see them.
    by_id = {}
    for _ in ids:
        m = c.recv()
        by_id[m[1]] = m
    got = [by_id[i] for i in ids]
    assert [m[2] for m in got] == [None] * 5
    assert got[0][3] == vals
    assert got[1][3] == [True] * count
    assert got[2][3] == new[:3] + new[-3:]
    assert got[3][3] == count
    assert got[4][3] == 0
    assert c.call("kv.get", [fresh]) == (None, new)
    assert n.stop() == 0


def test_a_get_over_the_cap_only_in_sum_is_refused_whole(node_factory):
    # kv_staging_max 48 MiB caps one kv.get's pages at 48 MiB: two steps of
    # 32 MiB each fit alone, not together.
    n, c = started(node_factory, "--pool-size", "256mb", "--kv-staging-max", "48mb")
    count = 2 * STEP
    keys = ["cap-%06d" % i for i in range(count)]
    page = os.urandom(8192)
    for i in range(0, count, 1024):
        assert c.call("kv.set", [keys[i:i + 1024], [page] * 1024]) == (None, [True] * 1024)
    s0 = steps(n)
    err, got = c.call("kv.get", [keys])
    assert got is None and err["code"] == "too_large", err
    assert "kv_staging_max" in err["message"], err
    assert steps(n) - s0 == 2
    m = metrics_of(n)
    assert m['peercache_kv_refused_total{reason="too_large"}'] == 1
    assert m["peercache_kv_staged_bytes"] == 0
    assert c.call("kv.get", [keys[:STEP]]) == (None, [page] * STEP)
    assert metrics_of(n)["peercache_kv_staged_bytes"] == 0
    assert n.stop() == 0


# Local sessions: a move of more than 4,096 items reads them over loop
# passes (modules/session.c, move_read) from its kept request, or from a
# copy when the request came in one receive buffer, before its steps.

def session_items(count, base=0):
    """count pages of 1..300 bytes, one after the other from base:
    ([[key, offset, len], ...], {key: bytes})."""
    items, pages, off = [], {}, base
    for i in range(count):
        k, size = "ss-%06d" % i, 1 + (i * 53) % 300
        items.append([k, off, size])
        pages[k] = bytes((i + j) & 255 for j in range(size))
        off += size
    return items, pages


def test_large_session_moves_are_read_over_passes(node_factory):
    n, rpc = started(node_factory, "--pool-size", "512mb", "--threads", "2")
    c = SessionClient(n.endpoint("socket"), size=16 << 20, timeout=60)
    c.register()
    count = 5 * STEP - 11
    items, pages = session_items(count)
    for k, off, size in items:
        c.mem[off:off + size] = pages[k]
    assert c.call("session.set", [c.rid, items]) == [True] * count
    # Back into another part of the region, zeroed first.
    base = 8 << 20
    got = [[k, base + off, size] for k, off, size in items]
    c.mem[base:base + (8 << 20)] = bytes(8 << 20)
    assert c.call("session.get", [c.rid, got]) == [True] * count
    for k, off, size in got:
        assert bytes(c.mem[off:off + size]) == pages[k], k
    # A bad item at the very end: the whole move is refused, nothing of
    # it stored (the keys are new).
    bad, _ = session_items(count)
    bad = [["new-" + k, off, size] for k, off, size in bad]
    bad[-1][1] = 16 << 20  # outside the region
    msgid = c.send("session.set", [c.rid, bad])
    msg = c.recv()
    assert msg[1] == msgid and msg[3] is None, msg
    assert msg[2]["code"] == "bad_params" and "outside" in msg[2]["message"], msg
    assert rpc.call("kv.exists", [[bad[0][0]]]) == (None, 0)
    assert rpc.call("kv.exists", [[k for k, _, _ in items]]) == (None, count)
    m = metrics_of(n)
    assert m["peercache_session_moves"] == 0
    c.close()
    assert n.stop() == 0


def test_a_large_session_move_in_one_receive_is_copied(node_factory):
    # 64 KiB receive buffers hold a whole move of 4,200 short items: the
    # request is not kept, the move copies it before reading it over
    # passes, and another client's requests meanwhile reuse the buffer
    # (poisoned in the ASan build as soon as it went back). The request
    # (~29 KB) stays under the ~32 KiB a Unix socket moves in one skb, so
    # the node cannot wake up to half of it.
    n, rpc = started(node_factory, "--pool-size", "256mb", "--threads", "1",
                     "--reactor-buf-bytes", "64kb", "--reactor-buf-count", "16")
    c = SessionClient(n.endpoint("socket"), size=1 << 20, timeout=60)
    c.register()
    count = STEP + 104
    items = [["%x" % i, i % 100, 1] for i in range(count)]
    c.mem[0:100] = bytes(range(100))
    t0 = metrics_of(n)[TAKEN]
    stop = threading.Event()

    def noise():
        other = RpcClient(n.endpoint("rpc"), timeout=60)
        while not stop.is_set():
            assert other.call("kv.exists", [["Q" * 500] * 100]) == (None, 0)
        other.close()

    th = threading.Thread(target=noise)
    th.start()
    try:
        for _ in range(3):
            assert c.call("session.set", [c.rid, items]) == [True] * count
            assert c.call("session.get", [c.rid, items]) == [True] * count
    finally:
        stop.set()
        th.join()
    assert rpc.call("kv.get", [["%x" % i for i in (0, 99, 100, count - 1)]]) == \
        (None, [bytes([i % 100]) for i in (0, 99, 100, count - 1)])
    assert metrics_of(n)[TAKEN] == t0  # copied, never kept
    c.close()
    assert n.stop() == 0
