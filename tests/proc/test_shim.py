"""The SGLang shim (python/peercache) against real nodes, through fake host
pools that mirror SGLang's (fake_pools.py): pages set through a shim on node
A are read byte-identical through a shim on node B, in every layout, with and
without a shared-memory host pool; leading-run semantics; concurrent threads
in two processes; a node that dies and comes back; MLA vs MHA keys; and the
copy budget, read from the node's counters."""
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

import torch  # Debian's python3-torch (scripts/deps.sh test installs it)

from conftest import BUILD, RpcClient, metrics_of  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("PEERCACHE_LIBRARY", os.path.join(BUILD, "client", "libpeercache.so.0"))

from fake_pools import MHAPool, MLAPool, indices  # noqa: E402
from peercache._hicache import HiCacheStorageConfig  # noqa: E402
from peercache.store import PeerCacheStore  # noqa: E402


def shim(node, mla=False, tp_rank=0, tp_size=1, **extra):
    cfg = HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, is_mla_model=mla,
                               model_name="test/model")
    cfg.extra_config = {"backend_name": "peercache", "module_path": "peercache.store",
                        "class_name": "PeerCacheStore", "interface_v1": 1,
                        "allocator": "shm", "socket": node.endpoint("socket"), **extra}
    return PeerCacheStore(cfg, {})


def hashes(n, tag="h"):
    return ["%s%063d" % (tag, i) for i in range(n)]


POOLS = [
    ("mha-page_first", lambda shm: MHAPool("page_first", shm=shm), False),
    ("mha-page_first_direct", lambda shm: MHAPool("page_first_direct", shm=shm), False),
    ("mha-layer_first", lambda shm: MHAPool("layer_first", shm=shm), False),
    ("mla-page_first", lambda shm: MLAPool("page_first", shm=shm), True),
    ("mla-layer_first", lambda shm: MLAPool("layer_first", shm=shm), True),
]


@pytest.mark.parametrize("shm", [True, False], ids=["memfd", "staging"])
@pytest.mark.parametrize("name,make,mla", POOLS, ids=[p[0] for p in POOLS])
def test_pages_cross_nodes_byte_identical(cluster, name, make, mla, shm):
    a, b = cluster(2, "--pool-size", "256mb")
    pa, pb = make(shm), make(shm)
    sa, sb = shim(a, mla), shim(b, mla)
    sa.register_mem_pool_host(pa)
    sb.register_mem_pool_host(pb)
    n = 40
    for p in range(n):
        pa.fill_page(p, p + 1)
    keys = hashes(n)
    idx = indices(n, pa.page_size)
    assert sa.batch_set_v1(keys, idx) == [True] * n
    assert sb.batch_exists(keys) == n
    assert sb.batch_get_v1(keys, idx) == [True] * n
    for p in range(n):
        assert pb.page_bytes(p) == pa.page_bytes(p), "page %d differs" % p
    # Setting again is idempotent.
    assert sa.batch_set_v1(keys[:5], indices(5, pa.page_size)) == [True] * 5
    for s in (sa, sb):
        s.close()
    for nd in (a, b):
        assert nd.stop() == 0


def test_leading_run_semantics_with_a_hole(cluster):
    (a,) = cluster(1, "--pool-size", "64mb")
    pool = MHAPool("page_first")
    s = shim(a)
    s.register_mem_pool_host(pool)
    keys = hashes(10)
    assert s.batch_set_v1(keys, indices(10, pool.page_size)) == [True] * 10
    holed = keys[:4] + ["x" * 64] + keys[4:]
    assert s.batch_exists(holed) == 4
    got = s.batch_get_v1(holed[:8], indices(8, pool.page_size))
    assert got == [True] * 4 + [False] * 4, "nothing after the first miss"
    assert s.batch_exists([]) == 0
    s.close()
    assert a.stop() == 0


def test_mla_keys_are_shared_across_tp_ranks_mha_keys_are_not(cluster):
    (a,) = cluster(1, "--pool-size", "64mb")
    keys = hashes(8)
    # MLA: rank 0 writes, rank 1 reads the same pages; rank 1's set is a
    # no-op that reports success.
    r0, r1 = shim(a, mla=True, tp_rank=0, tp_size=2), shim(a, mla=True, tp_rank=1, tp_size=2)
    p0, p1 = MLAPool(), MLAPool()
    for p in range(8):
        p0.fill_page(p, 100 + p)
    r0.register_mem_pool_host(p0)
    r1.register_mem_pool_host(p1)
    idx = indices(8, p0.page_size)
    assert r1.batch_set_v1(keys, idx) == [True] * 8
    assert r1.batch_exists(keys) == 0, "rank 1 did not write"
    assert r0.batch_set_v1(keys, idx) == [True] * 8
    assert r1.batch_get_v1(keys, idx) == [True] * 8
    assert p1.page_bytes(3) == p0.page_bytes(3)
    # MHA: each TP rank has its own shard of heads: no sharing.
    m0, m1 = shim(a, tp_rank=0, tp_size=2), shim(a, tp_rank=1, tp_size=2)
    q0, q1 = MHAPool(), MHAPool()
    m0.register_mem_pool_host(q0)
    m1.register_mem_pool_host(q1)
    assert m0.batch_set_v1(keys, idx) == [True] * 8
    assert m1.batch_exists(keys) == 0
    assert m1.batch_get_v1(keys, idx) == [False] * 8
    for s in (r0, r1, m0, m1):
        s.close()
    assert a.stop() == 0


def test_prefix_isolates_tenants(cluster):
    (a,) = cluster(1, "--pool-size", "64mb")
    t1, t2 = shim(a, prefix="tenant1"), shim(a, prefix="tenant2")
    p1, p2 = MHAPool(), MHAPool()
    t1.register_mem_pool_host(p1)
    t2.register_mem_pool_host(p2)
    keys = hashes(4)
    assert t1.batch_set_v1(keys, indices(4, p1.page_size)) == [True] * 4
    assert t2.batch_exists(keys) == 0
    assert t1.batch_exists(keys) == 4
    t1.close()
    t2.close()
    assert a.stop() == 0


def test_copy_budget_from_the_node_counters(cluster):
    a, b = cluster(2, "--pool-size", "256mb")
    pa, pb = MHAPool("page_first"), MHAPool("page_first")
    sa, sb = shim(a), shim(b)
    sa.register_mem_pool_host(pa)
    sb.register_mem_pool_host(pb)
    n = 32
    keys = hashes(n, "c")
    idx = indices(n, pa.page_size)
    page_bytes = sum(pa.get_page_buffer_meta(idx)[1]) // n
    ma0, mb0 = metrics_of(a), metrics_of(b)
    assert sa.batch_set_v1(keys, idx) == [True] * n
    assert sb.batch_get_v1(keys, idx) == [True] * n
    ma1, mb1 = metrics_of(a), metrics_of(b)

    def delta(m1, m0, name):
        return m1.get(name, 0) - m0.get(name, 0)

    set_copied = delta(ma1, ma0, 'peercache_copy_bytes_total{op="set"}')
    get_copied = delta(mb1, mb0, 'peercache_copy_bytes_total{op="get_local"}')
    landed = delta(mb1, mb0, "peercache_bytes_landed_total")
    assert set_copied == n * page_bytes, "exactly one copy per set"
    assert get_copied == 0, "no node-side copy for remote gets"
    assert landed == n * page_bytes, "remote pages landed straight in the pool"
    assert sa.stats()["staged_bytes"] == 0 and sb.stats()["staged_bytes"] == 0
    for s in (sa, sb):
        s.close()
    for nd in (a, b):
        assert nd.stop() == 0


def _worker(sock, role, keys, seconds, out):
    """One process: exists, get and set threads against its own pool."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from fake_pools import MHAPool as Pool, indices as idx_of
    from peercache._hicache import HiCacheStorageConfig as Cfg
    from peercache.store import PeerCacheStore as Store
    cfg = Cfg(model_name="test/model")
    cfg.extra_config = {"interface_v1": 1, "socket": sock}
    s = Store(cfg, {})
    pool = Pool("page_first", pages=128)
    for p in range(128):
        pool.fill_page(p, p)
    s.register_mem_pool_host(pool)
    stop = time.time() + seconds
    counts = {"exists": 0, "get": 0, "set": 0, "errors": 0}

    def loop(kind):
        while time.time() < stop:
            try:
                if kind == "set":
                    r = s.batch_set_v1(keys, idx_of(len(keys), pool.page_size))
                    assert isinstance(r, list) and len(r) == len(keys)
                elif kind == "get":
                    r = s.batch_get_v1(keys, idx_of(len(keys), pool.page_size))
                    assert isinstance(r, list) and len(r) == len(keys)
                else:
                    r = s.batch_exists(keys)
                    assert isinstance(r, int)
                counts[kind] += 1
            except Exception:
                counts["errors"] += 1

    ts = [threading.Thread(target=loop, args=(k,)) for k in ("exists", "get", "set")]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    s.close()
    out.put(counts)


def test_three_threads_in_two_processes(cluster):
    (a,) = cluster(1, "--pool-size", "128mb")
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(a.endpoint("socket"), i,
                                                hashes(32, "p%d" % i), 4, out))
             for i in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    for r in results:
        assert r["errors"] == 0, r
        assert min(r["exists"], r["get"], r["set"]) > 0, r
    assert a.stop() == 0


def _busy_client(sock, ready):
    """A process that shares its pool and keeps the node busy until killed."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from fake_pools import MHAPool as Pool, indices as idx_of
    from peercache._hicache import HiCacheStorageConfig as Cfg
    from peercache.store import PeerCacheStore as Store
    cfg = Cfg(model_name="test/model")
    cfg.extra_config = {"interface_v1": 1, "socket": sock}
    s = Store(cfg, {})
    pool = Pool("page_first", pages=64)
    s.register_mem_pool_host(pool)
    keys = hashes(64, "busy")
    s.batch_set_v1(keys, idx_of(64, pool.page_size))
    ready.set()
    while True:
        s.batch_get_v1(keys, idx_of(64, pool.page_size))


def test_a_client_killed_mid_call_leaves_nothing_behind(cluster):
    (a,) = cluster(1, "--pool-size", "128mb")
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=_busy_client, args=(a.endpoint("socket"), ready))
    p.start()
    assert ready.wait(30)
    m = metrics_of(a)
    assert m.get("peercache_session_regions", 0) >= 1, "the pool was not shared"
    time.sleep(0.2)
    p.kill()
    p.join(10)
    deadline = time.time() + 10
    while time.time() < deadline:
        m = metrics_of(a)
        if m.get("peercache_session_regions", 0) == 0:
            break
        time.sleep(0.05)
    assert m.get("peercache_session_regions", 0) == 0, "a mapping outlived its client"
    assert m.get("peercache_session_region_bytes", 0) == 0
    # The node still serves others.
    s = shim(a)
    pool = MHAPool()
    s.register_mem_pool_host(pool)
    assert s.batch_exists(hashes(64, "busy")) == 64
    s.close()
    assert a.stop() == 0


def test_node_killed_and_restarted_mid_run(node_factory, tmp_path):
    sock = str(tmp_path / "restart.sock")
    a = node_factory("--socket", sock, "--pool-size", "64mb")
    s = shim(a)
    pool = MHAPool()
    s.register_mem_pool_host(pool)
    keys = hashes(8)
    idx = indices(8, pool.page_size)
    assert s.batch_set_v1(keys, idx) == [True] * 8
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait()
    # Down: misses and zeros, never an exception or None.
    assert s.batch_set_v1(keys, idx) == [False] * 8
    assert s.batch_get_v1(keys, idx) == [False] * 8
    assert s.batch_exists(keys) == 0
    assert s.exists("k") is False
    assert s.get("k", torch.zeros(16)) is None
    assert s.set("k", torch.zeros(16)) is False
    b = node_factory("--socket", sock, "--pool-size", "64mb")
    b.wait_for("ready")
    # Back: the shim reconnects and re-registers its memory by itself.
    assert s.batch_set_v1(keys, idx) == [True] * 8
    assert s.batch_get_v1(keys, idx) == [True] * 8
    s.close()
    s.close()  # idempotent
    assert b.stop() == 0


def test_generic_path_and_housekeeping(cluster):
    (a,) = cluster(1, "--pool-size", "64mb")
    s = shim(a, interface_v1=0)
    s.register_mem_pool_host(MHAPool())
    v = torch.arange(1024, dtype=torch.float32)
    assert s.set("g1", v) is True
    assert s.batch_set(["g2", "g3"], [v * 2, v * 3]) is True
    assert s.exists("g1") and s.batch_exists(["g1", "g2", "nope", "g3"]) == 2
    out = torch.zeros(1024, dtype=torch.float32)
    assert s.get("g2", out) is out and torch.equal(out, v * 2)
    outs = s.batch_get(["g3", "nope"], [torch.zeros(1024), torch.zeros(1024)])
    assert torch.equal(outs[0], v * 3) and outs[1] is None
    st = s.get_stats()
    assert st is not None and st.backup_pgs[0] >= 3
    assert s.clear() is True
    assert s.batch_exists(["g1", "g2"]) == 0
    s.close()
    assert a.stop() == 0


def test_unknown_original_keys_are_accepted_and_logged(cluster, caplog):
    # Issue 12 item 3: an unknown key is refused with a clear error (it was
    # accepted with a log line before); the original's keys stay accepted.
    (a,) = cluster(1, "--pool-size", "64mb")
    with caplog.at_level("INFO", logger="peercache"):
        s = shim(a, discovery_addr="10.0.0.1:31998", protocol="rdma")
    assert "ignoring extra-config keys" in caplog.text
    assert "discovery_addr" in caplog.text
    s.close()
    with pytest.raises(ValueError, match="weird_key.*allow_unknown_keys"):
        shim(a, weird_key=1)
    with pytest.raises(ValueError, match="allow_unknown_keys"):
        shim(a, weird_key=1, allow_unknown_keys="yes")
    caplog.clear()
    with caplog.at_level("INFO", logger="peercache"):
        s = shim(a, weird_key=1, allow_unknown_keys=True)
    assert "unknown extra-config keys weird_key" in caplog.text
    s.close()
    assert a.stop() == 0


def test_v2_registration_tolerates_the_kv_anchor(cluster):
    (a,) = cluster(1, "--pool-size", "64mb")
    s = shim(a)
    pool = MHAPool()
    s.register_mem_host_pool_v2(pool, "kv")  # v2-only registration
    keys = hashes(2)
    assert s.batch_set_v1(keys, indices(2, pool.page_size)) == [True, True]
    s.register_mem_pool_host(pool)
    s.register_mem_host_pool_v2(pool, "kv")  # the anchor again: ignored
    s.register_mem_host_pool_v2(object(), "mamba")
    assert s.batch_exists(keys) == 2
    s.close()
    assert a.stop() == 0


def test_pip_install_offline(tmp_path):
    pip = subprocess.run(["/usr/bin/python3", "-m", "pip", "--version"], capture_output=True)
    assert pip.returncode == 0, "pip for /usr/bin/python3 (Debian's python3-pip) is missing"
    target = tmp_path / "site"
    src = tmp_path / "src"  # pip builds in place: keep the checkout clean
    shutil.copytree(os.path.join(ROOT, "python"), src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    r = subprocess.run(["/usr/bin/python3", "-m", "pip", "install", "--no-index",
                        "--no-deps", "--target", str(target), str(src)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(["/usr/bin/python3", "-c",
                        "import peercache.store as s; print(s.PeerCacheStore.__name__)"],
                       capture_output=True, text=True, env={"PYTHONPATH": str(target)})
    assert r.stdout.strip() == "PeerCacheStore", r.stderr
