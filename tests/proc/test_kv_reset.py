"""A page whose record is gone from its owner (the owner restarted and lost
its directory shard, or never got the record: the set reached no owner and
said false) is published again by the next kv.set of its key, which says
true only then: other nodes find the page again. Before this was fixed, a
set of a key already in the producer's pool said true without publishing,
and the key stayed a miss everywhere else.
"""
import time

from conftest import rpc_result


def test_a_set_again_publishes_a_record_its_owner_lost(cluster,
                                                       node_factory):
    # one replica: a key owned by b has no other owner to fall back to
    args = ("--pool-size", "64mb", "--directory-replicas", "1",
            "--rpc-timeout", "2s")
    a, b = cluster(2, *args)
    peers = "127.0.0.1:%d,127.0.0.1:%d" % (a.rpc_port(), b.rpc_port())
    keys = ["reset-%d" % i for i in range(40)]
    pages = [("%s|" % k).encode() * 500 for k in keys]
    assert rpc_result(a, "kv.set", [keys, pages]) == [True] * len(keys)
    assert rpc_result(b, "kv.get", [keys]) == pages
    # b restarts: its directory shard (the records of the keys it owns)
    # is gone; a still holds every page
    port = b.rpc_port()
    assert b.stop() == 0
    b = node_factory("--rpc-port", str(port), "--peers", peers, *args)
    b.wait_for("ready")
    got = rpc_result(b, "kv.get", [keys])
    lost = [k for k, v in zip(keys, got) if v is None]
    lost_pages = [p for p, v in zip(pages, got) if v is None]
    print("%d of %d records were lost with b's restart" % (len(lost),
                                                           len(keys)))
    assert 0 < len(lost) < len(keys), got
    # a set of them again publishes their records (a may still count b as
    # suspect for a moment after the restart: then the set says false)
    deadline = time.time() + 30
    while rpc_result(a, "kv.set", [lost, lost_pages]) != [True] * len(lost):
        assert time.time() < deadline, "b never took the records"
        time.sleep(0.2)
    assert rpc_result(b, "kv.get", [lost]) == lost_pages
    assert rpc_result(b, "kv.get", [keys]) == pages
    assert a.stop() == 0 and b.stop() == 0
