"""A kv.set that stored a page but could not publish its record (no owner
answered) says false; setting the key again once the owner is back must
publish the record (and say true only then): the page is findable from
other nodes. Before this was fixed, the second set said true (the page was
already in the pool) and the key stayed a miss everywhere else.
"""
import os
import signal
import time

from conftest import RpcClient, freeze


def call(node, method, params, timeout=30.0):
    c = RpcClient(node.endpoint("rpc"), timeout=timeout)
    try:
        err, res = c.call(method, params)
        assert err is None, (method, err)
        return res
    finally:
        c.close()


def test_a_set_again_publishes_what_an_unanswered_set_could_not(cluster):
    # one replica: a key owned by b has no other owner to fall back to
    a, b = cluster(2, "--pool-size", "64mb", "--directory-replicas", "1",
                   "--rpc-timeout", "500ms")
    # with b frozen, a's sets of the keys b owns find no owner: false;
    # the keys a owns itself are true
    keys = ["reset-%d" % i for i in range(40)]
    pages = [("%s|" % k).encode() * 500 for k in keys]
    freeze(b.proc.pid)
    try:
        ok = call(a, "kv.set", [keys, pages])
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    lost = [k for k, y in zip(keys, ok) if not y]
    lost_pages = [p for p, y in zip(pages, ok) if not y]
    print("%d of %d keys had no owner answering" % (len(lost), len(keys)))
    assert 0 < len(lost) < len(keys), ok
    assert call(b, "kv.get", [lost]) == [None] * len(lost)
    # b answers again; a takes it back as an owner after its next health
    # probe (it was suspect): until then a set may still say false
    deadline = time.time() + 30
    while call(a, "kv.set", [lost, lost_pages]) != [True] * len(lost):
        assert time.time() < deadline, "b never became an owner again"
        time.sleep(0.2)
    assert call(b, "kv.get", [lost]) == lost_pages
    assert call(b, "kv.get", [keys]) == pages
    assert a.stop() == 0 and b.stop() == 0
