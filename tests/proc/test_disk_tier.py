"""The disk tier on one node (issue 14, docs/disk.md): pages written
through to the store come back byte-exact after the pool evicted them (a get
promotes them), exists counts them, a restart on the same disk_path serves
them again with no re-set, a damaged record is dropped and never served, and
with the tier off nothing changes."""
import os
import shutil
import tempfile
import time

import pytest

from conftest import RpcClient, free_ports, metrics_of
from test_p2p import page as oracle_page   # bytes derived from the key

POOL = "1mb"          # the smallest pool the settings allow
PAGE = 64 * 1024
NPAGES = 48           # three times what the pool holds


def page(key):
    return oracle_page(key, PAGE)


def disk_node(node_factory, path, *args, pool=POOL):
    n = node_factory("--pool-size", pool, "--disk-enabled", "true",
                     "--disk-path", str(path), "--disk-size", "16mb",
                     "--disk-region-size", "1mb", *args)
    n.wait_for("ready")
    return n


def wait_metric(node, name, at_least, timeout=20.0):
    deadline = time.time() + timeout
    while True:
        v = metrics_of(node).get(name, 0)
        if v >= at_least or time.time() > deadline:
            return v
        time.sleep(0.05)


def set_through(node, cl, keys):
    """Set keys a few at a time, each batch written through before the next
    (the pool holds 15 pages: a page evicted before its write is lost)."""
    for i in range(0, len(keys), 4):
        part = keys[i:i + 4]
        err, ok = cl.call("kv.set", [part, [page(k) for k in part]])
        assert err is None and ok == [True] * len(part)
        have = wait_metric(node, "peercache_disk_writes_total", i + len(part))
        assert have >= i + len(part), "written through"


def get_back(cl, key, tries=100):
    """A get of a page on disk misses once and promotes it; retry."""
    for _ in range(tries):
        err, got = cl.call("kv.get", [[key]])
        assert err is None
        if got[0] is not None:
            return got[0]
        time.sleep(0.02)
    return None


def filled_store(node_factory, store, prefix, count):
    """A store holding count pages (prefix/i), its node stopped."""
    n = disk_node(node_factory, store)
    keys = ["%s/%d" % (prefix, i) for i in range(count)]
    set_through(n, RpcClient(n.endpoint("rpc")), keys)
    assert n.stop() == 0
    return keys


def test_pages_spill_to_disk_and_come_back(node_factory, tmp_path):
    n = disk_node(node_factory, tmp_path / "store")
    cl = RpcClient(n.endpoint("rpc"))
    keys = ["spill/%d" % i for i in range(NPAGES)]
    set_through(n, cl, keys)
    m = metrics_of(n)
    assert m["peercache_disk_writes_total"] == NPAGES
    assert m["peercache_disk_write_bytes_total"] == NPAGES * PAGE
    assert m["peercache_disk_keys"] == NPAGES
    assert m["peercache_tier_kept_total"] > 0, "evicted pages were kept"
    assert m["peercache_pool_keys"] < NPAGES
    assert m["peercache_disk_capacity_bytes"] == 16 << 20
    assert m["peercache_disk_write_dropped_total"] == 0
    # exists counts every page (pool or disk) and warms the disk ones up.
    assert cl.call("kv.exists", [keys])[1] == NPAGES
    for k in keys:
        assert get_back(cl, k) == page(k), k
    m = metrics_of(n)
    assert m["peercache_disk_promotions_total"] > 0
    assert m["peercache_disk_promote_latency_seconds_count"] == \
        m["peercache_disk_promotions_total"]
    assert m["peercache_disk_bad_pages_total"] == 0
    # A removed page is gone from the disk too.
    assert cl.call("kv.delete", [[keys[0]]]) == (None, 1)
    assert not any(cl.call("kv.get", [[keys[0]]])[1])
    assert metrics_of(n)["peercache_disk_keys"] == NPAGES - 1
    assert n.stop() == 0


def test_restart_serves_disk_pages_again(node_factory, tmp_path):
    store = tmp_path / "store"
    keys = filled_store(node_factory, store, "warm", 32)
    ident = (store / "store.id").read_bytes()
    assert len(ident) == 16
    n = disk_node(node_factory, store)
    assert "store index rebuilt: 32 pages" in n.text(), n.text()
    n.wait_for("re-announced 32 pages")
    assert (store / "store.id").read_bytes() == ident, "a stable identity"
    cl = RpcClient(n.endpoint("rpc"))
    assert cl.call("kv.exists", [keys])[1] == len(keys)
    # exists warmed the first pages up (as many as a quarter of the pool
    # takes at once): a get right after finds them in memory.
    assert wait_metric(n, "peercache_disk_promotions_total", 1) >= 1
    got = cl.call("kv.get", [keys[:4]])[1]
    assert any(got) and all(g is None or g == page(k) for g, k in zip(got, keys))
    for k in keys:
        assert get_back(cl, k) == page(k), k
    assert metrics_of(n)["peercache_disk_promotions_total"] >= len(keys)
    assert n.stop() == 0


def test_a_burst_of_promotions_waits_for_read_slots(node_factory, tmp_path):
    """An exists of many disk pages at once: a reactor reads and copies at
    most DISK_PROMO_READS (16) of them at a time, the others wait for a
    slot in the order asked, and every one is promoted with its own bytes
    (before, each got a read and a buffer of its own at once)."""
    store = tmp_path / "store"
    keys = filled_store(node_factory, store, "burst", 48)
    # One reactor; a pool whose quarter (the promotions' budget) takes all.
    n = disk_node(node_factory, store, "--threads", "1", pool="16mb")
    n.wait_for("re-announced 48 pages")
    cl = RpcClient(n.endpoint("rpc"))
    assert cl.call("kv.exists", [keys])[1] == len(keys)
    # One call admits all 48 in one pass: 16 read, 32 wait.
    assert wait_metric(n, "peercache_disk_promotions_total", 48) == 48
    m = metrics_of(n)
    assert m["peercache_disk_promote_waits_total"] == 48 - 16
    assert m["peercache_disk_promote_errors_total"] == 0
    assert m["peercache_disk_ios_in_flight"] == 0
    got = cl.call("kv.get", [keys])[1]
    assert got == [page(k) for k in keys]
    assert n.stop() == 0


def anon_huge_kb(pid):
    with open("/proc/%d/smaps_rollup" % pid) as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


def test_promotions_read_into_huge_pages(node_factory, tmp_path):
    """A promotion's O_DIRECT read lands in a buffer of whole transparent
    huge pages (DISK_READ_HUGE), not in 4 KiB pages scattered over memory:
    on a virtio disk promotions ran 1.2-1.8x faster into those. The pool
    has its huge pages before the promotions (its prefault), so what grows
    during them is the read buffers'."""
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
        if "[never]" in f.read():
            pytest.skip("transparent huge pages are off on this kernel")
    store = tmp_path / "store"
    keys = filled_store(node_factory, store, "huge", 16)
    n = disk_node(node_factory, store, "--threads", "1", "--pool-prefault",
                  "true", pool="16mb")
    n.wait_for("re-announced 16 pages")
    n.wait_for("region faulted in")
    before = anon_huge_kb(n.proc.pid)
    cl = RpcClient(n.endpoint("rpc"))
    assert cl.call("kv.exists", [keys])[1] == len(keys)
    assert wait_metric(n, "peercache_disk_promotions_total", 16) == 16
    grown = anon_huge_kb(n.proc.pid) - before
    assert grown >= 2048, "no huge page for the reads: %d KiB" % grown
    assert cl.call("kv.get", [keys])[1] == [page(k) for k in keys]
    assert n.stop() == 0


def test_a_damaged_record_is_dropped_never_served(node_factory, tmp_path):
    store = tmp_path / "store"
    keys = filled_store(node_factory, store, "bad", 8)
    # Flip one byte in the middle of one page's payload (found by content).
    path = store / "store.pcd"
    data = bytearray(path.read_bytes())
    victim = keys[3]
    at = data.find(page(victim)[:4096])
    assert at > 0
    data[at + 1000] ^= 0x40
    path.write_bytes(bytes(data))
    n = disk_node(node_factory, store)
    assert "store index rebuilt: 7 pages" in n.text(), n.text()
    assert "1 damaged record dropped" in n.text()
    cl = RpcClient(n.endpoint("rpc"))
    assert metrics_of(n)["peercache_disk_bad_pages_total"] == 1
    for k in keys:
        got = get_back(cl, k, tries=1 if k == victim else 100)
        assert got == (None if k == victim else page(k)), k
    assert cl.call("kv.get", [[victim]])[1] == [None]
    assert n.stop() == 0


def test_bad_settings_are_refused_at_start(node_factory, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")
    n = node_factory("--disk-enabled", "true", "--disk-path",
                     str(blocker / "sub"), "--disk-size", "16mb",
                     "--disk-region-size", "1mb")
    assert n.proc.wait(20) != 0
    assert "disk_path %s cannot be created" % (blocker / "sub") in n.text()
    n = node_factory("--disk-enabled", "true", "--disk-path",
                     str(tmp_path / "d"), "--disk-size", "1mb",
                     "--disk-region-size", "1mb")
    assert n.proc.wait(20) != 0
    assert "less than two regions" in n.text()
    # One node per disk_path.
    first = disk_node(node_factory, tmp_path / "shared")
    second = node_factory("--disk-enabled", "true", "--disk-path",
                          str(tmp_path / "shared"), "--disk-size", "16mb",
                          "--disk-region-size", "1mb")
    assert second.proc.wait(20) != 0
    assert "is in use by another process" in second.text()
    assert first.stop() == 0


def test_tier_off_by_default(node_factory, tmp_path):
    n = node_factory("--pool-size", POOL)
    n.wait_for("ready")
    cl = RpcClient(n.endpoint("rpc"))
    keys = ["off/%d" % i for i in range(NPAGES)]
    for i in range(0, NPAGES, 4):
        part = keys[i:i + 4]
        assert cl.call("kv.set", [part, [page(k) for k in part]])[1] == [True] * 4
    m = metrics_of(n)
    assert not any(name.startswith("peercache_disk_") for name in m), "no disk metrics"
    assert m["peercache_tier_kept_total"] == 0
    held = int(m["peercache_pool_keys"])
    assert held < NPAGES
    got = cl.call("kv.get", [keys])[1]
    assert sum(g is not None for g in got) == held, "evicted pages miss"
    assert all(g is None or g == page(k) for g, k in zip(got, keys))
    assert "/disk]" not in n.text(), "the disk module stays silent"
    assert n.stop() == 0


def test_a_store_on_tmpfs(node_factory, tmp_path):
    """tmpfs: O_DIRECT where the kernel takes it there (6.6+), else the
    buffered fallback, logged; the pages come back either way."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    path = tempfile.mkdtemp(prefix="pc-disk-", dir="/dev/shm")
    try:
        n = disk_node(node_factory, path)
        buffered = "does not take O_DIRECT" in n.text()
        assert ("buffered I/O" in n.text()) == buffered
        assert metrics_of(n)["peercache_disk_direct_io"] == (0 if buffered else 1)
        cl = RpcClient(n.endpoint("rpc"))
        keys = ["shm/%d" % i for i in range(24)]
        set_through(n, cl, keys)
        for k in keys:
            assert get_back(cl, k) == page(k), k
        assert n.stop() == 0
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_one_promotion_per_key(node_factory, tmp_path):
    n = disk_node(node_factory, tmp_path / "store")
    cl = RpcClient(n.endpoint("rpc"))
    keys = ["share/%d" % i for i in range(24)]
    set_through(n, cl, keys)
    assert metrics_of(n)["peercache_pool_keys"] < 24
    before = metrics_of(n)["peercache_disk_promotions_total"]
    # One get asking for the same evicted page four times: one promotion.
    err, got = cl.call("kv.get", [[keys[0]] * 4])
    assert err is None and got == [None] * 4
    assert get_back(cl, keys[0]) == page(keys[0])
    m = metrics_of(n)
    assert m["peercache_disk_promotions_total"] == before + 1
    assert m["peercache_tier_promotions_total"] == 1
    assert n.stop() == 0


def test_disk_eviction_takes_the_records_along(node_factory, tmp_path):
    # 4 regions of 1 MiB hold 14 pages each: 100 pages evict regions.
    n = node_factory("--pool-size", POOL, "--disk-enabled", "true",
                     "--disk-path", str(tmp_path / "store"), "--disk-size", "4mb",
                     "--disk-region-size", "1mb")
    n.wait_for("ready")
    cl = RpcClient(n.endpoint("rpc"))
    keys = ["evict/%d" % i for i in range(100)]
    set_through(n, cl, keys)
    m = metrics_of(n)
    assert m["peercache_disk_evicted_keys_total"] >= 40
    held = int(m["peercache_disk_keys"])
    assert held + m["peercache_disk_evicted_keys_total"] == 100
    # The store evicts its regions in the order its pages were written, and
    # the 4 pages of one kv.set may be written in any order (their copies
    # share the copier's passes): the pages kept are the newest but for the
    # order within the batch at the edge. Which ones they are, the records
    # say (a lookup only: kv.get and kv.exists promote).
    recs = cl.call("dir.get", [keys])[1]
    kept = [k for k, r in zip(keys, recs) if r is not None]
    assert len(kept) == held, "one record per page the store holds"
    assert set(keys[-(held - 3):]) <= set(kept) <= set(keys[-(held + 3):]), kept
    # The oldest pages left the pool and the disk: clean misses, no records.
    for k in keys[:20]:
        assert cl.call("kv.get", [[k]])[1] == [None]
        assert cl.call("kv.exists", [[k]])[1] == 0
    # The newest are all there, byte-exact.
    for k in kept:
        assert get_back(cl, k) == page(k), k
    assert metrics_of(n)["peercache_disk_bad_pages_total"] == 0
    assert n.stop() == 0


def test_a_full_queue_drops_writes_never_sets(node_factory, tmp_path):
    # Copy passes sized by bytes alone (slice_pass_max_us 0): the figure
    # below counts 512 KiB of the set a pass, which a slow build (ASan)
    # would otherwise cut short by time.
    n = disk_node(node_factory, tmp_path / "store", "--disk-queue-max", "1mb",
                  "--slice-pass-max-us", "0", pool="8mb")
    cl = RpcClient(n.endpoint("rpc"))
    keys = ["burst/%d" % i for i in range(64)]   # 4 MiB in one call
    err, ok = cl.call("kv.set", [keys, [page(k) for k in keys]])
    assert err is None and ok == [True] * 64, "every set succeeds"
    m = metrics_of(n)
    dropped = m["peercache_disk_write_dropped_total"]
    # The set's copies run in slices, 512 KiB (8 pages) a loop pass, and
    # the write-through's at most 64 KiB (one page) a pass: while the set
    # fills the 1 MiB queue eight pages a pass, at most one a pass leaves
    # it, over some 8 passes: 40 or more dropped, 32 with a margin
    # (2026-12-06: 46; all 64 at once, before the set was sliced, left 48
    # or more).
    assert dropped >= 64 - 16 - 16, "beyond 1 MiB queued, pages are not written"
    assert wait_metric(n, "peercache_disk_writes_total", 64 - dropped) == 64 - dropped
    assert "write-through queue full" in n.text()
    assert metrics_of(n)["peercache_disk_queue_bytes"] == 0
    got = cl.call("kv.get", [keys])[1]
    assert got == [page(k) for k in keys], "the pool has them all"
    assert n.stop() == 0


def start_pair(node_factory, tmp_path, b_args=(), a_args=()):
    """Two peers: a with a disk tier (16 MiB, 1 MiB regions) under
    tmp_path/a, b without (a_args, b_args: more of their settings); both
    ready (a port taken meanwhile is retried)."""
    for attempt in range(3):
        ports = free_ports(2)
        peers = ",".join("127.0.0.1:%d" % p for p in ports)
        a = node_factory("--rpc-port", str(ports[0]), "--peers", peers,
                         "--pool-size", POOL, "--disk-enabled", "true",
                         "--disk-path", str(tmp_path / "a"), "--disk-size", "16mb",
                         "--disk-region-size", "1mb", *a_args)
        b = node_factory("--rpc-port", str(ports[1]), "--peers", peers, *b_args)
        try:
            a.wait_for("ready")
            b.wait_for("ready")
            return a, b
        except AssertionError:
            if attempt == 2 or not any("Address already in use" in x.text() for x in (a, b)):
                raise
            for x in (a, b):
                x.proc.kill()
                x.proc.wait()
    raise AssertionError("unreachable")


def test_another_node_reads_resident_pages_only(node_factory, tmp_path):
    """A reader on another node asking for many pages at once gets the
    producer's resident pages and those of its disk pages the producer's
    promotion budget takes (test_disk_remote.py has the rest), never wrong
    bytes."""
    a, b = start_pair(node_factory, tmp_path)
    ca, cb = RpcClient(a.endpoint("rpc")), RpcClient(b.endpoint("rpc"))
    keys = ["remote/%d" % i for i in range(32)]
    set_through(a, ca, keys)
    got = cb.call("kv.get", [keys])[1]
    assert all(g is None or g == page(k) for g, k in zip(got, keys)), "never wrong"
    assert sum(g is not None for g in got) > 0
    for k in keys:   # the producer itself gets every page back
        assert get_back(ca, k) == page(k), k
    # A key both nodes set, B last: when A's pool evicts it, A's disk keeps
    # it but A does not replace B's readable record with its own
    # non-resident one.
    shared = "remote/shared"
    set_through(a, ca, [shared])
    assert cb.call("kv.set", [[shared], [page(shared)]])[1] == [True]
    more = ["remote/more/%d" % i for i in range(32)]
    for i in range(0, len(more), 4):
        ca.call("kv.set", [more[i:i + 4], [page(k) for k in more[i:i + 4]]])
    time.sleep(0.3)  # A's non-resident batches are sent meanwhile
    before = metrics_of(a)["peercache_tier_promotions_total"]
    assert ca.call("kv.get", [[shared]])[1] == [page(shared)], "B's record"
    assert metrics_of(a)["peercache_tier_promotions_total"] == before
    assert a.stop() == 0 and b.stop() == 0


def test_a_changed_layout_or_identity_is_an_empty_store(node_factory, tmp_path):
    store = tmp_path / "store"
    keys = filled_store(node_factory, store, "layout", 24)

    def restart(*args):
        n = node_factory("--pool-size", POOL, "--disk-enabled", "true",
                         "--disk-path", str(store), *args)
        n.wait_for("ready")
        return n, RpcClient(n.endpoint("rpc"))

    # Other region size: no region header matches; nothing is served.
    n, cl = restart("--disk-size", "16mb", "--disk-region-size", "2mb")
    assert "store index rebuilt: 0 pages" in n.text()
    assert cl.call("kv.exists", [keys])[1] == 0
    assert cl.call("kv.get", [keys])[1] == [None] * len(keys)
    assert n.stop() == 0
    # The same layout in a larger file: every page is back.
    n, cl = restart("--disk-size", "32mb", "--disk-region-size", "1mb")
    assert "store index rebuilt: 24 pages" in n.text()
    for k in keys:
        assert get_back(cl, k) == page(k), k
    assert n.stop() == 0
    # A new identity (store.id removed): the old records are not this
    # store's.
    (store / "store.id").unlink()
    n, cl = restart("--disk-size", "32mb", "--disk-region-size", "1mb")
    assert "new store identity" in n.text()
    assert "store index rebuilt: 0 pages" in n.text()
    assert cl.call("kv.get", [keys])[1] == [None] * len(keys)
    assert n.stop() == 0
