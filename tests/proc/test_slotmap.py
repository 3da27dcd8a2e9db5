"""slotmap mode end to end (issue 15, items 4 and 5; docs/slotmap.md).

- kv.set on one node, kv.get / exists / delete on every node of three,
  byte-identical; never-written keys are clean misses; a page longer than
  any class is a refused set, not a crash; an overwrite is seen by every
  reader; pages of several sizes round-trip; each get is one local or one
  remote slot read.
- (test_slotmap_shim.py: the SGLang shim, v1 and v2, on slotmap nodes.)
- The oracle hammer (slot_hammer.py): writers on two nodes and readers on
  all three on keys that share one bucket of four ways per owner (more
  keys than ways: evictions), every page checked: zero wrong pages.
- Its negative control: the same hammer with the payload checksum off on
  every node (PEERCACHE_TEST_SLOT_NOCHECK=1, test builds only) must hand a
  reader a wrong page — proof that the oracle can fail.
- The hammer while a fourth node joins and leaves: zero wrong pages.

Runs are bounded by counts of reads, with generous deadlines; the figures
go to the suite's report. A build that refuses mode=slotmap skips every
test, saying so. The seed is printed; PEERCACHE_TEST_SEED replays a run.
"""
import os
import random

import pytest

from conftest import BUILD, SANITIZED, RpcClient, free_ports, metrics_of, report
from slot_hammer import Hammer, owners, page as ham_page, pick_keys, slot_counters
from test_p2p import page   # bytes derived from the key

KIB = 1024
MIB = 1024 * KIB
SLOT = ("--mode", "slotmap")


class Regime:
    """A hammer's geometry: one bucket of 4 ways per node (every key a node
    owns shares it), pages of page/2..page bytes, `reads` checked reads (a
    read = one key of a kv.get), read_batch keys per kv.get."""

    def __init__(self, name, page, reads, read_batch=None):
        self.name, self.page, self.reads = name, page, reads
        self.read_batch = read_batch
        self.args = ("--slot-num-buckets", "1", "--slot-ways", "4",
                     "--slot-max-page-bytes", "%dkb" % (page // KIB),
                     "--pool-size", "%dmb" % max(16, 8 * page // MIB))


# Many reads of small pages: the claims, evictions and deletes of a
# contended bucket, fast. A READ of a 256 KiB bucket fits the socket
# buffers and is copied at once, so a write almost never overlaps it: the
# negative control found no torn page in 3 x 10^5 reads of 64 KiB or of
# 1 MiB pages.
SMALL = Regime("64 KiB pages", 64 * KIB, 4_000 if SANITIZED else 40_000)
# Fewer reads of large pages: a bucket of 4 x 4 MiB is more than the
# socket buffers hold (4 MiB here), so the owner sends it over
# milliseconds while writers rewrite its slots: torn and foreign snapshots
# happen. With the checksum off, the first wrong page came after 96 to
# 2,052 reads (11 runs, about 900 on average); with it on, none may.
LARGE = Regime("4 MiB pages", 4 * MIB, 300 if SANITIZED else 1_200, read_batch=6)
NOCHECK_READS_CAP = 8_000
HAM_PER_OWNER = 6   # keys per owner: > 4 ways, so writes evict
DEADLINE_S = 300


def seed():
    s = int(os.environ.get("PEERCACHE_TEST_SEED", random.randrange(1 << 30)))
    print("seed", s)
    return s


def slot_nodes(node_factory, n, *args, envs=None, peers_extra=0):
    """n slotmap nodes naming each other (plus peers_extra free ports for
    nodes that join later) in --peers: (nodes, member ids). Skips the test
    when the build refuses mode=slotmap."""
    for attempt in range(3):
        ports = free_ports(n + peers_extra)
        ids = ["127.0.0.1:%d" % p for p in ports]
        nodes = [node_factory("--rpc-port", str(p), "--peers", ",".join(ids[:n]),
                              *SLOT, *args, env=(envs or {}).get(i))
                 for i, p in enumerate(ports[:n])]
        try:
            for nd in nodes:
                nd.wait_for("ready", timeout=60)
            return nodes, ids
        except AssertionError:
            texts = [nd.text() for nd in nodes]
            for nd in nodes:
                if nd.proc.poll() is None:
                    nd.proc.kill()
                    nd.proc.wait()
            refused = [line for t in texts for line in t.splitlines()
                       if "slotmap" in line and "not supported" in line]
            if refused:
                report("skipped: this build refuses mode=slotmap (%s)" % refused[0].strip())
                pytest.skip("this build refuses mode=slotmap: %s" % refused[0].strip())
            if not any("Address already in use" in t for t in texts) or attempt == 2:
                raise
    raise AssertionError("unreachable")


def call(node, method, params):
    c = RpcClient(node.endpoint("rpc"), timeout=30.0)
    try:
        return c.call(method, params)
    finally:
        c.close()


def ok(node, method, params):
    err, res = call(node, method, params)
    assert err is None, (method, err)
    return res


# ------------------------------------------------------------ kv.* ----

# Two size classes: pages up to 16 KiB in slots of 16 KiB, larger ones up
# to 256 KiB in slots of 256 KiB (a get reads a bucket of 4 slots of its
# page's class).
CLASSES = ("--slot-classes", "16kb:4:30%,256kb:4:70%")


def test_kv_on_three_nodes_byte_identical(node_factory):
    nodes, _ = slot_nodes(node_factory, 3, "--pool-size", "128mb", *CLASSES)
    a, b, c = nodes
    sizes = (1000, 16 * KIB, 256 * KIB, 100 * KIB + 7)
    keys = ["slot/layer%d/page%d" % (i % 5, i) for i in range(32)]
    vals = [page(k, sizes[i % len(sizes)]) for i, k in enumerate(keys)]
    assert ok(a, "kv.set", [keys, vals]) == [True] * len(keys)
    before = slot_counters(nodes)
    for n in nodes:
        assert ok(n, "kv.get", [keys]) == vals, "byte-identical pages"
    after = slot_counters(nodes)
    # Each key is local on its owner and one remote slot read elsewhere.
    assert after["local_slot"] - before["local_slot"] == len(keys), (before, after)
    assert after["remote_slot"] - before["remote_slot"] == 2 * len(keys), (before, after)
    assert after["write_local"] + after["write_remote"] >= len(keys), after
    assert after["write_remote"] > 0, "some keys of a are owned elsewhere"
    for n in nodes:
        assert ok(n, "kv.exists", [keys]) == len(keys)
        assert ok(n, "kv.exists", [keys[:10] + ["hole"] + keys[10:]]) == 10
        # Never-written keys are clean misses, in place.
        assert ok(n, "kv.get", [["nope-1", keys[5], "nope-2"]]) == [None, vals[5], None]
        assert ok(n, "kv.exists", [["nope-1"]]) == 0

    # A page no class holds is a refused set; the others of the batch land.
    big = page("big", 256 * KIB + 1)
    assert ok(b, "kv.set", [["fits-1", "big", "fits-2"],
                            [vals[0], big, vals[1]]]) == [True, False, True]
    for n in nodes:
        assert ok(n, "kv.get", [["big", "fits-1", "fits-2"]]) == [None, vals[0], vals[1]]

    # Overwrite through another node, at another length: every reader sees
    # the new page.
    k = keys[3]
    v2 = page(k + "#2", 16 * KIB + 3)
    assert ok(c, "kv.set", [[k], [v2]]) == [True]
    for n in nodes:
        assert ok(n, "kv.get", [[k]]) == [v2]
    # Delete through the third node: gone everywhere; deleting again or a
    # never-written key deletes nothing.
    gone = keys[:8]
    assert ok(c, "kv.delete", [gone]) == len(gone)
    assert ok(b, "kv.delete", [gone + ["nope-3"]]) == 0
    for n in nodes:
        assert ok(n, "kv.get", [gone]) == [None] * len(gone)
        assert ok(n, "kv.exists", [gone]) == 0
        assert ok(n, "kv.get", [keys[8:]]) == vals[8:]
    m = slot_counters(nodes)
    assert m["miss"] > 0 and m["rejected"] == 0, m
    for n in nodes:
        assert n.proc.poll() is None, n.text()
        assert n.stop() == 0, n.text()


# ---------------------------------------------------------- hammer ----

def hammer_nodes(node_factory, rg, n=3, env=None, peers_extra=0):
    return slot_nodes(node_factory, n, *rg.args, envs={i: env for i in range(n)},
                      peers_extra=peers_extra)


def run_hammer(rg, nodes, keys, rng, done, writers=(0, 1), per_node=2):
    """per_node writers on each node of writers and one reader on every
    node until done(totals); returns (hammer, totals)."""
    h = Hammer(keys, rg.page, rng.random(), read_batch=rg.read_batch)
    for i in writers:
        for _ in range(per_node):
            h.start("writer", nodes[i])
    for n in nodes:
        h.start("reader", n)
    try:
        h.wait(done, DEADLINE_S)
    finally:
        t = h.stop()
    return h, t


def summary(name, t, m):
    line = ("%s: reads %d hits %d misses %d wrong %d | sets %d refused %d | "
            "node reads local %d remote %d miss %d rejected %d, writes local %d remote %d"
            % (name, t["reads"], t["hits"], t["misses"], t["wrong"], t["sets"],
               t["refused"], m["local_slot"], m["remote_slot"], m["miss"],
               m["rejected"], m["write_local"], m["write_remote"]))
    report(line)
    return line


WHOLE = {"PEERCACHE_TEST_SLOT_WHOLE_READS": "1"}


def narrowed_reads(nodes):
    """Bucket reads the owners answered with the key's way only."""
    return sum(metrics_of(n).get("peercache_transport_reads_narrowed_total", 0)
               for n in nodes)


@pytest.mark.parametrize("rg,whole", [(SMALL, False), (LARGE, False), (LARGE, True)],
                         ids=["small", "large", "large-whole-buckets"])
def test_oracle_hammer_zero_wrong_pages(node_factory, rg, whole):
    """Over TCP an owner answers a bucket read with the key's way only (a
    narrowed read); whole-bucket reads (what a one-sided transport does)
    are checked too, through a test setting of fault-injection builds."""
    if whole and not fault_injection_built():
        pytest.skip("built without PEERCACHE_FAULT_INJECTION")
    rng = random.Random(seed())
    nodes, _ = hammer_nodes(node_factory, rg, env=WHOLE if whole else None)
    keys = pick_keys(nodes, HAM_PER_OWNER, rg.page)
    h, t = run_hammer(rg, nodes, keys, rng, lambda t: t["reads"] >= rg.reads)
    m = slot_counters(nodes)
    line = summary("hammer, " + rg.name + (", whole buckets" if whole else ""),
                   t, m)
    narrowed = narrowed_reads(nodes)
    if whole:
        assert narrowed == 0, line
    else:
        assert narrowed >= m["remote_slot"] > 0, (narrowed, line)
    assert t["errors"] == 0, (line, h.examples)
    assert t["wrong"] == 0, (line, h.examples)
    assert t["reads"] >= rg.reads, line
    assert t["hits"] > 0 and t["sets"] > 0, line
    # Contention happened: more keys than ways per owner (evictions make
    # misses), writes through non-owners, and snapshots of a key's slot
    # that failed validation (torn or changed under the READ).
    assert t["misses"] > 0 and m["write_remote"] > 0, line
    assert m["rejected"] > 0, line
    for n in nodes:
        assert n.proc.poll() is None, n.text()
        assert n.stop() == 0, n.text()


def fault_injection_built():
    try:
        with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
            return "PEERCACHE_FAULT_INJECTION:BOOL=ON" in f.read()
    except OSError:
        return False


def test_negative_control_catches_wrong_pages(node_factory):
    """With the checksum off, torn or foreign snapshots get through and the
    oracle sees them: the hammer can fail. Whole-bucket reads: a narrowed
    read sends one committed way and finishes sooner, so torn snapshots of
    it are too rare to meet in CI time (its own negative control is the
    unit test slot_hammer::without_the_checksum_torn_selections_get_through)."""
    if not fault_injection_built():
        report("skipped: this build has no fault injection "
               "(PEERCACHE_FAULT_INJECTION off)")
        pytest.skip("built without PEERCACHE_FAULT_INJECTION")
    if SANITIZED:
        # Measured: 2,022 reads (211 hits) in 75 s and no torn page; the
        # normal tree finds one after ~900 reads (~300 hits) on average.
        report("skipped in the sanitizer tree: its nodes copy too slowly for "
               "the negative control to meet a torn page in CI time (it runs "
               "in the normal tree)")
        pytest.skip("the sanitizer tree is too slow for the negative control")
    rng = random.Random(seed())
    nodes, _ = hammer_nodes(node_factory, LARGE,
                            env={"PEERCACHE_TEST_SLOT_NOCHECK": "1", **WHOLE})
    for n in nodes:
        assert "PEERCACHE_TEST_SLOT_NOCHECK: readers skip" in n.text(), n.text()
    keys = pick_keys(nodes, HAM_PER_OWNER, LARGE.page)
    h, t = run_hammer(LARGE, nodes, keys, rng,
                      lambda t: t["wrong"] > 0 or t["reads"] >= NOCHECK_READS_CAP)
    m = slot_counters(nodes)
    line = summary("negative control (checksum off), " + LARGE.name, t, m)
    assert t["errors"] == 0, (line, h.examples)
    assert t["wrong"] >= 1, "the oracle never failed with the checksum off: " + line
    print("first wrong pages:", h.examples)
    for n in nodes:
        assert n.proc.poll() is None, n.text()
        assert n.stop() == 0, n.text()


def test_hammer_while_a_fourth_node_joins_and_leaves(node_factory):
    rng = random.Random(seed())
    nodes, ids = hammer_nodes(node_factory, SMALL, peers_extra=1)
    three, four = ids[:3], ids
    keys = pick_keys(nodes, HAM_PER_OWNER, SMALL.page)
    d = node_factory("--rpc-port", ids[3].rsplit(":", 1)[1], "--peers", ",".join(four),
                     *SLOT, *SMALL.args)
    d.wait_for("ready", timeout=60)
    h = Hammer(keys, SMALL.page, rng.random())
    for i in (0, 1):
        for _ in range(2):
            h.start("writer", nodes[i])
    for n in nodes:
        h.start("reader", n)
    phase = SMALL.reads // 3
    d_workers = []
    try:
        def more(n):
            goal = h.totals()["reads"] + n
            t = h.wait(lambda t: t["reads"] >= goal, DEADLINE_S)
            assert t["errors"] == 0 and t["reads"] >= goal, (t, h.examples)

        more(phase)
        # 3 -> 4: every member learns about d; d writes and reads too.
        for n in nodes:
            res = ok(n, "cluster.set_peers", [four])
            assert res["joined"] == [four[3]], res
        d_workers = [h.start("writer", d), h.start("reader", d)]
        more(phase)
        # 4 -> 3: d's clients stop, every member drops d, d shuts down.
        h.stop(d_workers)
        for n in nodes:
            res = ok(n, "cluster.set_peers", [three])
            assert res["left"] == [four[3]], res
        assert d.stop() == 0, d.text()
        more(phase)
    finally:
        t = h.stop()
    m = slot_counters(nodes)
    line = summary("hammer with a join and a leave", t, m)
    assert t["errors"] == 0, (line, h.examples)
    assert t["wrong"] == 0, (line, h.examples)
    assert t["hits"] > 0, line
    assert h.totals(d_workers)["hits"] > 0, "d read pages while it was a member"
    for n in nodes:
        assert "left the ring" in n.text(), n.text()
        assert n.proc.poll() is None, n.text()
        assert n.stop() == 0, n.text()


def test_owners_are_found_by_local_writes(node_factory):
    """The hammer's key picker itself: every key has exactly one owner, and
    a get on the owner is a local slot read."""
    nodes, _ = slot_nodes(node_factory, 3, "--pool-size", "64mb",
                          "--slot-max-page-bytes", "64kb")
    names = [(i, "own-%d" % i) for i in range(1, 13)]
    found = owners(nodes, names, SMALL.page)
    for kid, name in names:
        o = nodes[found[name]]
        before = metrics_of(o)['peercache_slotmap_reads_total{source="local_slot"}']
        assert ok(o, "kv.get", [[name]]) == [ham_page(kid, 1, SMALL.page)]
        after = metrics_of(o)['peercache_slotmap_reads_total{source="local_slot"}']
        assert after == before + 1, name
    for n in nodes:
        assert n.stop() == 0, n.text()
