"""session.register maps a client's region on the node's offload thread
(reactor/offload.c) and replies when the mapping is done; unmapping is
offloaded too. Clients that close while their register is still being
mapped, that leave with regions registered, or that unregister them, must
leave no mapping behind in the node (read from /proc/PID/maps), and the
node keeps serving.
"""
import random
import time

from conftest import metrics_of
from test_hardening_session import Client, items_at, page_bytes

BIG = 64 << 20  # the region of each client (a sparse memfd)


def node_mappings(node, tag):
    with open("/proc/%d/maps" % node.proc.pid) as f:
        return sum(1 for line in f if "memfd:" + tag in line)


def test_regions_never_outlive_their_clients(node_factory):
    rng = random.Random(7)
    node = node_factory("--pool-size", "64mb")
    node.wait_for("ready")
    sock = node.endpoint("socket")
    # register and close at once: the mapping may still be under way
    for i in range(30):
        c = Client(sock, size=BIG)
        c.send("session.register", [1, BIG], [c.fd])
        c.close(reset=rng.random() < 0.5)
    # leave with regions registered, or unregister them first
    for i in range(20):
        c = Client(sock, size=BIG)
        c.register()
        if i % 2:
            assert c.call("session.unregister", [1]) is True
        c.close()
    deadline = time.time() + 30
    while time.time() < deadline:
        m = metrics_of(node)
        if m["peercache_session_regions"] == 0 and \
                node_mappings(node, "pc-test") == 0:
            break
        time.sleep(0.1)
    m = metrics_of(node)
    assert m["peercache_session_regions"] == 0, m
    assert m["peercache_session_region_bytes"] == 0, m
    assert node_mappings(node, "pc-test") == 0
    # the node still serves a client end to end
    c = Client(sock)
    assert c.register() == {"sealed": False}
    items = items_at([("offload-%d" % i, 4096) for i in range(4)])
    for k, off, size in items:
        c.mem[off:off + size] = page_bytes(k, size)
    assert c.call("session.set", [c.rid, items]) == [True] * 4
    got = items_at([(k, s) for k, _, s in items], start=1 << 20)
    assert c.call("session.get", [c.rid, got]) == [True] * 4
    for (k, off, size) in got:
        assert bytes(c.mem[off:off + size]) == page_bytes(k, size)
    c.close()
    assert node.proc.poll() is None
    assert node.stop() == 0, node.text()
