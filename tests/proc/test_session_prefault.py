"""session_prefault: the pages of a client's region are faulted in on the
node's offload thread, 1 MiB chunk by chunk, before the first session.set or
session.get touches them, so that no reactor pays those page faults (in a
guest with shadow paging ~13 us a page, 1.6 ms a copy slice). Only chunks
that moves use are touched; a region no move uses stays untouched; a client
that cut its memory short before the first move fails its own request. A
get writes into its chunks, so it touches them by a write that changes no
byte (a page only read-faulted in costs a second hypervisor exit on its first
write); a set's chunks are only read.
"""
import os

from conftest import metrics_of
from test_hardening_session import Client, items_at, page_bytes

MIB = 1 << 20
BIG = 64 * MIB
PREFAULTED = "peercache_session_prefault_bytes_total"


def mapped_kb(node, tag="pc-test"):
    """Rss (KiB) of the node's mappings of the test's memfds."""
    total, inside = 0, False
    with open("/proc/%d/smaps" % node.proc.pid) as f:
        for line in f:
            first = line.split(" ", 1)[0]
            if "-" in first and ":" not in first:  # a mapping's header
                inside = ("memfd:" + tag) in line
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


def test_moves_fault_in_only_the_chunks_they_touch(node_factory):
    node = node_factory("--pool-size", "64mb")
    node.wait_for("ready")
    c = Client(node.endpoint("socket"), size=BIG)
    assert c.register() == {"sealed": False}
    assert mapped_kb(node) == 0  # registering touches nothing
    assert metrics_of(node)[PREFAULTED] == 0

    # four 256 KiB pages in chunk 0
    items = items_at([("warm-%d" % i, 256 << 10) for i in range(4)])
    for k, off, size in items:
        c.mem[off:off + size] = page_bytes(k, size)
    assert c.call("session.set", [c.rid, items]) == [True] * 4
    assert metrics_of(node)[PREFAULTED] == MIB

    # back into a place that spans chunks 31 and 32
    got = items_at([(k, s) for k, _, s in items], start=32 * MIB - 512 * 1024)
    assert c.call("session.get", [c.rid, got]) == [True] * 4
    for k, off, size in got:
        assert bytes(c.mem[off:off + size]) == page_bytes(k, size)
    assert metrics_of(node)[PREFAULTED] == 3 * MIB

    # warm chunks are not faulted in again
    assert c.call("session.get", [c.rid, got]) == [True] * 4
    assert c.call("session.set", [c.rid, items]) == [True] * 4
    assert metrics_of(node)[PREFAULTED] == 3 * MIB

    # the node mapped the three chunks' pages and nothing else of the
    # 64 MiB region
    kb = mapped_kb(node)
    assert 3 * 1024 <= kb <= 3 * 1024 + 64, kb
    c.close()


def test_a_get_warms_for_writing_a_chunk_a_set_only_read(node_factory):
    node = node_factory("--pool-size", "64mb")
    node.wait_for("ready")
    c = Client(node.endpoint("socket"), size=BIG)
    assert c.register() == {"sealed": False}
    # the client's own data fills chunk 0; two pages of it are published
    mine = os.urandom(MIB)
    c.mem[0:MIB] = mine
    items = [["rw-0", 0, 128 << 10], ["rw-1", 128 << 10, 128 << 10]]
    assert c.call("session.set", [c.rid, items]) == [True] * 2
    assert metrics_of(node)[PREFAULTED] == MIB  # read: the set's chunk

    # back into the same chunk: touched again, by a write this time
    got = [["rw-0", 512 << 10, 128 << 10], ["rw-1", 768 << 10, 128 << 10]]
    assert c.call("session.get", [c.rid, got]) == [True] * 2
    assert metrics_of(node)[PREFAULTED] == 2 * MIB
    for (_, src, size), (_, off, _) in zip(items, got):
        assert bytes(c.mem[off:off + size]) == mine[src:src + size]
    # ... which changed no byte of the client's besides the get's pages
    assert bytes(c.mem[0:512 << 10]) == mine[0:512 << 10]
    assert bytes(c.mem[640 << 10:768 << 10]) == mine[640 << 10:768 << 10]
    assert bytes(c.mem[896 << 10:MIB]) == mine[896 << 10:MIB]

    # warm for writing is warm for reading too: nothing more to do
    assert c.call("session.get", [c.rid, got]) == [True] * 2
    assert c.call("session.set", [c.rid, got]) == [True] * 2
    assert metrics_of(node)[PREFAULTED] == 2 * MIB
    c.close()


def test_off_moves_pages_without_faulting_in(node_factory):
    node = node_factory("--pool-size", "64mb", "--session-prefault", "false")
    node.wait_for("ready")
    c = Client(node.endpoint("socket"), size=BIG)
    assert c.register() == {"sealed": False}
    items = items_at([("cold-%d" % i, 96 << 10) for i in range(3)])
    for k, off, size in items:
        c.mem[off:off + size] = page_bytes(k, size)
    assert c.call("session.set", [c.rid, items]) == [True] * 3
    got = items_at([(k, s) for k, _, s in items], start=40 * MIB)
    assert c.call("session.get", [c.rid, got]) == [True] * 3
    for k, off, size in got:
        assert bytes(c.mem[off:off + size]) == page_bytes(k, size)
    assert metrics_of(node)[PREFAULTED] == 0
    c.close()


def test_memory_cut_short_before_the_first_move_fails_only_its_client(
        node_factory):
    node = node_factory("--pool-size", "64mb")
    node.wait_for("ready")
    sock = node.endpoint("socket")
    c = Client(sock, size=8 * MIB)
    assert c.register() == {"sealed": False}
    c.mem.release()
    os.ftruncate(c.fd, 4096)  # the node's mapping now ends after 4 KiB
    # faulting chunk 4 in raises SIGBUS in the node: its own request fails
    assert c.call("session.get", [c.rid, [["cut-a", 4 * MIB, 4096]]]) == \
        [False]
    assert c.call("session.set", [c.rid, [["cut-b", 5 * MIB, 4096]]]) == \
        [False]
    assert metrics_of(node)[PREFAULTED] == 0
    c.sock.close()
    os.close(c.fd)

    # the node is alive and serves another client
    d = Client(sock)
    assert d.register() == {"sealed": False}
    d.mem[0:4096] = page_bytes("after-cut", 4096)
    assert d.call("session.set", [d.rid, [["after-cut", 0, 4096]]]) == [True]
    assert d.call("session.get", [d.rid, [["after-cut", 8192, 4096]]]) == \
        [True]
    assert bytes(d.mem[8192:12288]) == page_bytes("after-cut", 4096)
    d.close()
