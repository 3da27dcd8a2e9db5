"""Issue 13 (slice): embedded discovery on the meta port (docs/discovery.md).

Nodes join through a head, every node follows the same member list (same
table epoch), a kill -9 is detected and the node removed from every view, a
SIGTERM deregisters at once, the head's death leaves the others serving each
other and a new node joins through a second seed, and a node with the wrong
cluster secret cannot register. Loopback only; timings are printed, and the
deadlines are generous (CI is slow), never a performance assertion.
"""
import hashlib
import os
import subprocess
import threading
import time

from conftest import BUILD, SANITIZED, RpcClient, free_ports, run

CLI = os.path.join(BUILD, "client", "peercache")

SLACK = 3 if SANITIZED else 1
SECRET = "discovery-test-secret"


def call(node, method, params=()):
    c = RpcClient(node.endpoint("socket"), timeout=10.0)
    try:
        return c.call(method, params)
    finally:
        c.close()


def start_readers(nodes, keys):
    """A thread per node reading keys[:16] (pages of page(k)) through its
    socket, counting hits, misses and wrong pages. Returns a function that
    stops them and gives the counts."""
    stop, stats = threading.Event(), {"hit": 0, "miss": 0, "wrong": 0}

    def reader(node):
        cl = RpcClient(node.endpoint("socket"), timeout=10.0)
        while not stop.is_set():
            err, res = cl.call("kv.get", [keys[:16]])
            assert err is None, err
            for k, v in zip(keys, res):
                stats["miss" if v is None else
                      "hit" if v == page(k) else "wrong"] += 1
        cl.close()

    threads = [threading.Thread(target=reader, args=(x,), daemon=True)
               for x in nodes]
    for t in threads:
        t.start()

    def end():
        stop.set()
        for t in threads:
            t.join(10)
        return stats

    return end


def view(node):
    err, res = call(node, "discovery.view")
    assert err is None, err
    return res


def ids(v):
    return sorted(m["id"] for m in v["members"])


def wait_until(fn, timeout, what):
    deadline = time.time() + timeout * SLACK
    while time.time() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def start(node_factory, rpc, meta, seeds, *extra):
    n = node_factory("--rpc-port", str(rpc), "--meta-port", str(meta),
                     "--discovery-addr",
                     ",".join("127.0.0.1:%d" % s for s in seeds),
                     "--cluster-secret", SECRET, "--pool-size", "32mb",
                     *extra)
    n.wait_for("ready", 30)
    return n


def start_cluster(node_factory, n, seeds_of=None):
    ports = free_ports(2 * n)
    rpc, meta = ports[:n], ports[n:]
    nodes = []
    for i in range(n):
        seeds = [meta[0]] if seeds_of is None else [meta[j] for j in seeds_of]
        nodes.append(start(node_factory, rpc[i], meta[i], seeds))
    want = sorted("127.0.0.1:%d" % p for p in rpc)
    wait_until(lambda: all(ids(view(x)) == want for x in nodes), 10,
               "every node to see all %d members" % n)
    return nodes, rpc, meta


def same_view(nodes, want):
    vs = [view(x) for x in nodes]
    if any(ids(v) != want for v in vs):
        return False
    return len({(v["epoch"], v["from"]) for v in vs}) == 1 and vs


def page(key, n=4096):
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (n // len(seed) + 1))[:n]


def test_join_kill_and_leave(node_factory):
    nodes, rpc, meta = start_cluster(node_factory, 4)
    a = nodes[0]
    want = sorted("127.0.0.1:%d" % p for p in rpc)
    vs = wait_until(lambda: same_view(nodes, want), 10,
                    "one epoch and source on every node")
    print("epoch", vs[0]["epoch"], "from", vs[0]["from"])
    roles = {m["id"]: m["role"] for m in vs[0]["members"]}
    assert roles["127.0.0.1:%d" % rpc[0]] == "head"
    assert sorted(roles.values()).count("master") == 2  # max_masters 3
    # The ring follows the view; the operator's view names roles.
    err, res = call(nodes[3], "cluster.members")
    assert err is None and sorted(x["id"] for x in res) == want, (err, res)
    assert {x["state"] for x in res} == {"discovered"}, res
    out = subprocess.run([CLI, "--node", nodes[3].endpoint("socket"),
                          "members"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("epoch %d from " % vs[0]["epoch"]), lines
    assert "4 members" in lines[0] and len(lines) == 5, lines
    assert sum(" head alive " in x for x in lines) == 1, lines
    assert sum(x.endswith(" self") for x in lines) == 1, lines
    by_id = dict(zip(["127.0.0.1:%d" % p for p in rpc], nodes))
    gone = sorted(i for i, r in roles.items() if r == "master")[0]
    member = [i for i, r in roles.items() if r == "member"][0]
    other = [i for i in want if roles[i] == "master" and i != gone][0]
    victim, m, o = by_id[gone], by_id[member], by_id[other]
    # A value written on one node is read on another.
    keys = ["disc-%d" % i for i in range(64)]
    err, res = call(m, "kv.set", [keys, [page(k) for k in keys]])
    assert err is None, err
    err, res = call(o, "kv.get", [keys])
    assert err is None, err
    assert all(v == page(k) for k, v in zip(keys, res))

    # Reads go on while a master dies: a miss or the right bytes, never
    # wrong; the member it leaves behind is promoted in its place.
    readers_end = start_readers((m, o), keys)
    t0 = time.time()
    victim.proc.kill()
    victim.proc.wait()
    left = [x for x in want if x != gone]
    wait_until(lambda: all(ids(view(x)) == left for x in (a, m, o)), 8,
               "the killed node to leave every view")
    detect = time.time() - t0
    print("kill -9 detected on every node after %.2f s" % detect)
    assert "member %s silent" % gone in a.text()
    # suspect first (reads skip it), removed after member_ttl
    assert "peer %s is suspect (discovery: no heartbeat" % gone in a.text()
    for x in left:  # no false removal while the readers load m and o
        assert "member %s silent" % x not in a.text()
    stats = readers_end()
    print("reads meanwhile", stats)
    assert stats["wrong"] == 0 and stats["hit"] > 0
    wait_until(lambda: {x["id"]: x["role"] for x in view(m)["members"]}
               .get(member) == "master", 4, "the member to be promoted")

    # A voluntary leave is announced: removed by deregister, not silence.
    assert o.stop() == 0
    t0 = time.time()
    wait_until(lambda: all(other not in ids(view(x)) for x in (a, m)), 4,
               "the stopped node to leave")
    print("SIGTERM leave seen everywhere after %.2f s" % (time.time() - t0))
    assert "member %s left" % other in a.text()
    assert "member %s silent" % other not in a.text()
    for x in (a, m):
        assert x.stop() == 0


def test_head_down_others_serve_and_a_node_joins_via_second_seed(
        node_factory):
    nodes, rpc, meta = start_cluster(node_factory, 3)
    a, b, c = nodes  # masters: a (head), b, c
    a.proc.kill()
    a.proc.wait()
    rest = sorted("127.0.0.1:%d" % p for p in rpc[1:])
    vs = wait_until(lambda: same_view([b, c], rest), 10,
                    "b and c to agree without the head")
    # the next master by meta address follows the head
    assert vs[0]["from"] == min("127.0.0.1:%d" % m for m in meta[1:])
    keys = ["after-head-%d" % i for i in range(16)]
    err, _ = call(b, "kv.set", [keys, [page(k) for k in keys]])
    assert err is None, err
    err, res = call(c, "kv.get", [keys])
    assert err is None and all(v == page(k) for k, v in zip(keys, res))
    # A new node whose first seed is the dead head joins through b.
    port_d, meta_d = free_ports(2)
    d = start(node_factory, port_d, meta_d, [meta[0], meta[1]])
    four = sorted(rest + ["127.0.0.1:%d" % port_d])
    wait_until(lambda: all(ids(view(x)) == four for x in (b, c, d)), 10,
               "the new node to join through the second seed")
    # The head comes back: once warm, everyone follows it again.
    a = start(node_factory, rpc[0], meta[0], [meta[0]])
    five = sorted(four + ["127.0.0.1:%d" % rpc[0]])
    head = "127.0.0.1:%d" % meta[0]

    def follow_head():
        vs = same_view([a, b, c, d], five)
        return vs and vs[0]["from"] == head

    wait_until(follow_head, 10, "every node to follow the restarted head")
    for x in (a, b, c, d):
        assert x.stop() == 0


def test_wrong_secret_cannot_register(node_factory):
    m_head, r_head, r_bad, m_bad = free_ports(4)
    head = start(node_factory, r_head, m_head, [m_head])
    bad = node_factory("--rpc-port", str(r_bad), "--meta-port", str(m_bad),
                       "--discovery-addr", "127.0.0.1:%d" % m_head,
                       "--cluster-secret", "not-the-secret",
                       "--pool-size", "32mb")
    bad.wait_for("ready", 30)
    bad.wait_for("check cluster_secret", 10 * SLACK)
    assert ids(view(head)) == ["127.0.0.1:%d" % r_head]
    # Nor can a client that skips the handshake.
    cl = RpcClient("127.0.0.1:%d" % m_head)
    err, _ = cl.call("discovery.register",
                     ["127.0.0.1:1", "127.0.0.1:2", False])
    cl.close()
    assert err is not None and err["code"] == "unauthorized", err
    assert ids(view(head)) == ["127.0.0.1:%d" % r_head]
    assert bad.stop() == 0 and head.stop() == 0


def test_peers_and_discovery_are_exclusive():
    r = run("--peers", "127.0.0.1:1", "--discovery-addr", "127.0.0.1:2",
            "--socket", "")
    assert r.returncode == 2
    assert "peers and discovery_addr are both set" in r.stderr
