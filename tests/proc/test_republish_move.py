"""Issue 13, item 4: a membership change moves directory records, it does
not copy them. After a join, the owners a key gained get its record, the
owner it lost (still a member) drops this producer's record of it once a
grace (member_ttl) has passed, and nothing is re-sent for owners that did
not change: the records held by all directory shards are exactly K x R
again. Changes that come while a move is
still walking (3 -> 4 -> 3 -> 4 in a row) leave every key findable.
"""
import hashlib
import time

from conftest import metrics_of, rpc_result, start_joiner

PAGE = 2048
KEYS = 1200
R = 2


def page_of(key):
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (PAGE // len(seed) + 1))[:PAGE]


def total(nodes, name):
    return sum(metrics_of(n).get(name, 0) for n in nodes)


def walks_done(nodes, epoch):
    return all("placement for epoch %d done" % epoch in n.text()
               for n in nodes)


def wait_for(pred, what, timeout=60.0):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError("timed out waiting for " + what)


def start_fourth(node_factory, three):
    return start_joiner(node_factory, three, "--pool-size", "64mb")


def write_and_check(nodes, keys):
    """Writes the keys through nodes[1] and nodes[2] (the producers)."""
    half = len(keys) // 2
    for node, part in ((nodes[1], keys[:half]), (nodes[2], keys[half:])):
        for i in range(0, len(part), 200):
            b = part[i:i + 200]
            res = rpc_result(node, "kv.set", [b, [page_of(k) for k in b]])
            assert all(res), res


def read_all(reader, keys):
    """(hits, wrong) of a kv.get sweep of every key through reader."""
    hits = wrong = 0
    for i in range(0, len(keys), 200):
        b = keys[i:i + 200]
        for k, v in zip(b, rpc_result(reader, "kv.get", [b])):
            if v is None:
                continue
            if v == page_of(k):
                hits += 1
            else:
                wrong += 1
    return hits, wrong


def test_join_moves_records_and_drops_them_at_displaced_owners(
        cluster, node_factory):
    nodes = cluster(3, "--pool-size", "64mb")
    three = ["127.0.0.1:%d" % n.rpc_port() for n in nodes]
    keys = ["mv-%05d" % i for i in range(KEYS)]
    write_and_check(nodes, keys)
    wait_for(lambda: total(nodes, "peercache_directory_records") ==
             KEYS * R, "K x R records before the change")
    d, four = start_fourth(node_factory, three)
    for n in nodes:
        assert rpc_result(n, "cluster.set_peers", [four])["epoch"] == 2
    everyone = nodes + [d]
    wait_for(lambda: walks_done(nodes, 2), "the walks for epoch 2")
    sent = total(nodes, "peercache_republish_records_total")
    # the displaced owners drop their copies after the grace
    wait_for(lambda: total(everyone, "peercache_directory_records") ==
             KEYS * R, "K x R records after the grace")
    removed = total(nodes, "peercache_directory_moved_away_total")
    held = total(everyone, "peercache_directory_records")
    print("join: %d records sent, %d removed from displaced owners, "
          "%d held (K x R = %d), new node holds %d" %
          (sent, removed, held, KEYS * R,
           metrics_of(d)["peercache_directory_records"]))
    # The new node owns about R/4 of the keys' records; each one it gained
    # was sent once, and its displaced owner dropped its copy.
    assert 0 < sent < KEYS, sent
    assert removed == sent, (removed, sent)
    assert metrics_of(d)["peercache_directory_records"] == sent
    assert held == KEYS * R, held
    hits, wrong = read_all(nodes[0], keys)
    assert (hits, wrong) == (KEYS, 0)
    # 4 -> 3: the records the leaving node held are sent to the next
    # owners; nothing is removed (nobody else lost a key).
    for n in nodes:
        assert rpc_result(n, "cluster.set_peers", [three])["epoch"] == 3
    assert d.stop() == 0, d.text()
    wait_for(lambda: walks_done(nodes, 3), "the walks for epoch 3")
    assert total(nodes, "peercache_directory_moved_away_total") == removed
    held = total(nodes, "peercache_directory_records")
    assert held == KEYS * R, held
    assert read_all(nodes[0], keys) == (KEYS, 0)


def test_changes_during_a_walk_leave_every_key_findable(cluster,
                                                        node_factory):
    nodes = cluster(3, "--pool-size", "64mb")
    three = ["127.0.0.1:%d" % n.rpc_port() for n in nodes]
    keys = ["mw-%05d" % i for i in range(KEYS)]
    write_and_check(nodes, keys)
    d, four = start_fourth(node_factory, three)
    # seven changes in a row: each interrupts the walk of the one before
    # (a walk takes several 64-record steps), and more than four in a row
    # fold the oldest rings
    lists = [four, three] * 3 + [four]
    for epoch, members in enumerate(lists, start=2):
        for n in nodes:
            assert rpc_result(n, "cluster.set_peers", [members])["epoch"] == epoch
    last = 1 + len(lists)
    wait_for(lambda: walks_done(nodes, last), "the last walk")
    everyone = nodes + [d]
    held = total(everyone, "peercache_directory_records")
    print("after %d changes: %d records held (K x R = %d), %d sent, "
          "%d removed" % (len(lists), held, KEYS * R,
                          total(nodes, "peercache_republish_records_total"),
                          total(nodes,
                                "peercache_directory_moved_away_total")))
    # every key is findable through every node; stale records may remain
    # where a folded ring's owners were not asked
    assert held >= KEYS * R, held
    for reader in everyone:
        assert read_all(reader, keys) == (KEYS, 0), reader.rpc_port()
