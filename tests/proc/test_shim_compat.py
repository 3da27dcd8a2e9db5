"""The SGLang shim across SGLang releases and its lifecycle: detach while a
peer (or the local node) hangs returns within SGLang's 10 s join; idle and
windowed get_stats; the base class, pool types and StorageMetrics on every
import path (stand-in SGLang trees written here, shaped like 0.5.9, the
hybrid releases and the newest); one key rule under interface_v1 on and
off; kv_cache_dtype and dp fields in the config; extra-config keys honoured
or refused; Mooncake-style integer pointers; clear() with bounded key
tracking."""
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from conftest import BUILD, metrics_of  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("PEERCACHE_LIBRARY", os.path.join(BUILD, "client", "libpeercache.so.0"))

from fake_pools import MHAPool, indices  # noqa: E402
from fake_pools_v2 import FlatMHAPool, FlatMLAPool, MambaPool  # noqa: E402
from peercache._hicache import HiCacheStorageConfig, PoolTransfer, StorageMetrics  # noqa: E402
from peercache.store import PeerCacheStore  # noqa: E402

JOIN_S = 10.0  # SGLang joins each storage thread this long on detach


def shim(node, mla=False, cfg_extra=None, **extra):
    cfg = HiCacheStorageConfig(is_mla_model=mla, model_name="test/compat")
    for k, v in (cfg_extra or {}).items():
        setattr(cfg, k, v)
    cfg.extra_config = {"interface_v1": 1, "socket": node.endpoint("socket"), **extra}
    return PeerCacheStore(cfg, {})


def hashes(n, tag):
    return ["%s%063d" % (tag, i) for i in range(n)]


def _detach(s, calls):
    """SGLang's detach: its storage threads are inside calls; it joins
    each for 10 s, then calls close(). Returns (seconds, results)."""
    results = {}
    threads = [threading.Thread(target=lambda k=k, f=f: results.__setitem__(k, f()),
                                daemon=True) for k, f in calls.items()]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(0.2)
    for t in threads:
        t.join(JOIN_S)
        assert not t.is_alive(), "a storage call outlived SGLang's join"
    s.close()
    return time.monotonic() - t0, results


def _calls(s, keys, pool):
    idx = indices(len(keys), pool.page_size)
    mamba = [PoolTransfer(name="mamba", keys=keys[-1:], hit_policy="trailing_pages",
                          host_indices=torch.arange(1))]
    return {"get": lambda: s.batch_get_v1(keys, idx),
            "exists": lambda: s.batch_exists(keys),
            "exists_v2": lambda: s.batch_exists_v2(keys, mamba),
            "set": lambda: s.batch_set_v1(hashes(len(keys), "new"), idx),
            "get_v2": lambda: s.batch_get_v2(mamba)}


def _wait_stopped(pid):
    """SIGSTOP takes effect asynchronously: wait until every thread is."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        states = []
        for tid in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(s == "T" for s in states):
            return
        time.sleep(0.01)
    raise AssertionError("the node did not stop")


@pytest.mark.parametrize("hung", ["peer", "local-node"])
def test_detach_while_a_node_hangs_returns_within_the_join(cluster, hung):
    a, b = cluster(2, "--pool-size", "64mb")
    sa, sb = shim(a), shim(b)
    pa, pb = MHAPool(), MHAPool()
    sa.register_mem_pool_host(pa)
    sb.register_mem_pool_host(pb)
    for s, p in ((sa, MambaPool()), (sb, MambaPool())):
        s.register_mem_host_pool_v2(p, "mamba")
    keys = hashes(32, "hang")
    assert sa.batch_set_v1(keys, indices(32, pa.page_size)) == [True] * 32
    assert sa.batch_set_v2([PoolTransfer(name="mamba", keys=keys[-1:],
                                         host_indices=torch.arange(1))]) == {"mamba": [True]}
    victim, s, pool = (a, sb, pb) if hung == "peer" else (a, sa, pa)
    victim.proc.send_signal(signal.SIGSTOP)
    try:
        _wait_stopped(victim.proc.pid)
        took, res = _detach(s, _calls(s, keys, pool))
    finally:
        victim.proc.send_signal(signal.SIGCONT)
    print("detach with a hung %s: %.2f s" % (hung, took))
    assert took < JOIN_S
    # Misses of the right types, never an exception or None.
    assert isinstance(res["get"], list) and len(res["get"]) == 32
    assert isinstance(res["exists"], int)
    assert isinstance(res["set"], list) and len(res["set"]) == 32
    assert res["exists_v2"].kv_hit_pages in (0, 32)
    assert set(res["get_v2"]) == {"mamba"}
    if hung == "local-node":
        assert res["get"] == [False] * 32 and res["exists"] == 0
    (sb if s is sa else sa).close()
    for nd in (a, b):
        assert nd.stop() == 0


def test_close_while_a_call_is_in_flight(cluster):
    """close() must neither wait for nor free under a call still blocked
    on a hung node (detach after a join that gave up)."""
    (a,) = cluster(1, "--pool-size", "64mb")
    s = shim(a, timeout_ms=2000)
    pool = MHAPool()
    s.register_mem_pool_host(pool)
    keys = hashes(8, "cl")
    assert s.batch_set_v1(keys, indices(8, pool.page_size)) == [True] * 8
    a.proc.send_signal(signal.SIGSTOP)
    try:
        _wait_stopped(a.proc.pid)
        res = {}
        t = threading.Thread(target=lambda: res.__setitem__(
            "get", s.batch_get_v1(keys, indices(8, pool.page_size))))
        t.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        s.close()
        assert time.monotonic() - t0 < 1.0, "close() waited for a call in flight"
        t.join(JOIN_S)
        assert not t.is_alive() and res["get"] == [False] * 8
        assert s.batch_exists(keys) == 0  # closed: a miss, not a crash
    finally:
        a.proc.send_signal(signal.SIGCONT)
    assert a.stop() == 0


def test_idle_stats_are_empty_and_windowed(cluster):
    (a,) = cluster(1, "--pool-size", "64mb")
    s = shim(a)
    pool = MHAPool()
    s.register_mem_pool_host(pool)
    empty = StorageMetrics()
    for _ in range(2):
        st = s.get_stats()
        assert isinstance(st, StorageMetrics) and st == empty, st
    keys = hashes(8, "st")
    assert s.batch_set_v1(keys, indices(8, pool.page_size)) == [True] * 8
    st = s.get_stats()
    assert st.backup_pgs == [8] and st.prefetch_pgs == [] and st.backup_bandwidth[0] > 0
    assert s.batch_get_v1(keys, indices(8, pool.page_size)) == [True] * 8
    assert s.batch_get_v1(keys[:3], indices(3, pool.page_size)) == [True] * 3
    st = s.get_stats()
    assert st.prefetch_pgs == [11] and st.backup_pgs == [] and len(st.prefetch_bandwidth) == 1
    assert s.get_stats() == empty, "the window did not restart"
    s.close()
    assert a.stop() == 0


# ------------------------------------------- stand-in SGLang release trees

_CONFIG = """
@dataclass
class HiCacheStorageConfig:
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None
{dp}

@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


class HiCacheStorage(ABC):
    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        {v1}

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        {v1}

    @abstractmethod
    def get(self, key, target_location=None, target_sizes=None): ...
    @abstractmethod
    def batch_get(self, keys, target_locations=None, target_sizes=None): ...
    @abstractmethod
    def set(self, key, value=None, target_location=None, target_sizes=None): ...
    @abstractmethod
    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None): ...
    @abstractmethod
    def exists(self, key): ...

    def batch_exists(self, keys, extra_info=None):
        return 0
{v2base}
"""

_V2_TYPES = """
class PoolName(str, Enum):
    KV = "kv"
    MAMBA = "mamba"

class PoolHitPolicy(str, Enum):
    ALL_PAGES = "all_pages"
    TRAILING_PAGES = "trailing_pages"

@dataclass
class PoolTransfer:
    name: PoolName
    host_indices: Optional[object] = None
    device_indices: Optional[object] = None
    keys: Optional[List[str]] = None
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
    nodes_to_load: Optional[list] = None
    indices_from_pool: Optional[PoolName] = None

@dataclass
class PoolTransferResult:
    kv_hit_pages: int
    extra_pool_hit_pages: dict
{restorable}
"""

_V2_BASE = """
    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        self.registered_pools = getattr(self, "registered_pools", {})
        self.registered_pools[host_pool_name] = host_pool

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        raise NotImplementedError()

    def batch_get_v2(self, transfers, extra_info=None):
        raise NotImplementedError()

    def batch_set_v2(self, transfers, extra_info=None):
        raise NotImplementedError()
"""

_METRICS = """
from dataclasses import dataclass, field
from typing import List

@dataclass
class StorageMetrics:
    prefetch_pgs: List[int] = field(default_factory=list)
    backup_pgs: List[int] = field(default_factory=list)
    prefetch_bandwidth: List[float] = field(default_factory=list)
    backup_bandwidth: List[float] = field(default_factory=list)

def log_storage_metrics(storage_metrics):
    if storage_metrics is None:
        return
    assert isinstance(storage_metrics, StorageMetrics)
"""

_HEAD = ("from abc import ABC, abstractmethod\nfrom dataclasses import dataclass\n"
         "from enum import Enum\nfrom typing import List, Optional\n")

# release shape -> (metrics module, v2 types where, restorable field, dp fields)
RELEASES = {
    "0.5.9-like": ("sglang.srt.metrics.collector", None, False, False),
    "hybrid-v2": ("sglang.srt.observability.metrics_collector", "hicache_storage",
                  False, True),
    "newest": ("sglang.srt.observability.metrics_collector", "pool_transfer", True, True),
}


def _write_release(root, shape):
    metrics, v2_in, restorable, dp = RELEASES[shape]
    mc = os.path.join(root, "sglang", "srt", "mem_cache")
    os.makedirs(mc)
    for d in ("sglang", "sglang/srt", "sglang/srt/mem_cache"):
        open(os.path.join(root, d, "__init__.py"), "w").close()
    mpath = os.path.join(root, *metrics.split(".")[:-1])
    os.makedirs(mpath, exist_ok=True)
    open(os.path.join(mpath, "__init__.py"), "w").close()
    with open(os.path.join(root, *metrics.split(".")) + ".py", "w") as f:
        f.write(_METRICS)
    types = _V2_TYPES.format(restorable="    restorable_prefix_pages: Optional[List[int]]"
                             " = None" if restorable else "")
    body = _HEAD
    if v2_in == "pool_transfer":
        with open(os.path.join(mc, "pool_transfer.py"), "w") as f:
            f.write(_HEAD + types)
        body += "from sglang.srt.mem_cache.pool_transfer import *  # noqa\n"
    elif v2_in:
        body += types
    body += _CONFIG.format(
        dp="    dp_rank: int = 0\n    dp_size: int = 1" if dp else "",
        v1="raise NotImplementedError()" if v2_in else "pass",
        v2base=_V2_BASE if v2_in else "")
    with open(os.path.join(mc, "hicache_storage.py"), "w") as f:
        f.write(body)


_CHECK = """
import importlib, sys
from sglang.srt.mem_cache import hicache_storage as hs
import peercache._hicache as h
import peercache.store as st
metrics_mod, v2_in, restorable = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
assert h.SGLANG and h.HiCacheStorage is hs.HiCacheStorage
assert issubclass(st.PeerCacheStore, hs.HiCacheStorage)  # the factory's check
assert h.METRICS_FROM == metrics_mod, h.METRICS_FROM
mm = importlib.import_module(metrics_mod)
assert h.StorageMetrics is mm.StorageMetrics
cfg = hs.HiCacheStorageConfig(0, 1, 0, 1, 0, 1, False, True, True, "m",
                              extra_config={"interface_v1": 1, "timeout_ms": 300,
                                            "socket": "/nonexistent/peercache.sock"})
s = st.PeerCacheStore(cfg, {})
m = s.get_stats()
mm.log_storage_metrics(m)  # SGLang's isinstance assertion
assert m.prefetch_pgs == [] and m.backup_bandwidth == []
for name in ("batch_get_v1", "batch_set_v1", "batch_exists", "batch_exists_v2",
             "batch_get_v2", "batch_set_v2", "get", "set", "batch_get", "batch_set",
             "exists", "clear", "close", "get_stats", "register_mem_pool_host",
             "register_mem_host_pool_v2"):
    assert getattr(st.PeerCacheStore, name) is not getattr(hs.HiCacheStorage, name, None), name
# No node at the socket: misses of the right types.
assert s.batch_get_v1(["a"], None) == [False] and s.batch_exists(["a"]) == 0
r = s.batch_exists_v2(["a"], [h.PoolTransfer(name="mamba", keys=["a"])])
if v2_in != "none":
    assert type(r) is hs.PoolTransferResult, type(r)
assert r.kv_hit_pages == 0
assert hasattr(r, "restorable_prefix_pages") == (restorable or v2_in == "none")
assert s.batch_set_v2([h.PoolTransfer(name="mamba", keys=["a"])]) == {"mamba": [False]}
s.close()
print("ok")
"""


@pytest.mark.parametrize("shape", list(RELEASES))
def test_every_release_shape_imports_and_metrics(tmp_path, shape):
    _write_release(str(tmp_path), shape)
    metrics, v2_in, restorable, _ = RELEASES[shape]
    env = dict(os.environ, PYTHONPATH="%s:%s" % (tmp_path, os.path.join(ROOT, "python")))
    r = subprocess.run([sys.executable, "-c", _CHECK, metrics, v2_in or "none",
                        "1" if restorable else "0"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


# ------------------------------------------------------------ config keys

def test_extra_config_keys_honoured_or_refused(cluster, caplog):
    (a,) = cluster(1, "--pool-size", "64mb")
    for bad in ({"mode": "slotmap"}, {"timeout_ms": "soon"}, {"timeout_ms": 0},
                {"prefix": 7}, {"max_tracked_keys": -1}):
        with pytest.raises(ValueError) as e:
            shim(a, **bad)
        assert list(bad)[0] in str(e.value)
    shim(a, mode="p2p").close()
    with caplog.at_level(logging.WARNING, logger="peercache"):
        shim(a, timeout_ms=30000).close()
    assert "longer than SGLang's 10 s join" in caplog.text
    # kv_cache_dtype (extra-config or, in newer releases, the config): two
    # dtypes of one model never share a page; attention-DP ranks do.
    pool = MHAPool(dtype=torch.uint8)
    e4 = shim(a, kv_cache_dtype="fp8_e4m3")
    e5 = shim(a, cfg_extra={"kv_cache_dtype": "fp8_e5m2"})
    e4b = shim(a, cfg_extra={"kv_cache_dtype": "fp8_e4m3", "dp_rank": 1, "dp_size": 2})
    for s in (e4, e5, e4b):
        s.register_mem_pool_host(pool)
    keys = hashes(4, "dt")
    assert e4.batch_set_v1(keys, indices(4, pool.page_size)) == [True] * 4
    assert e5.batch_exists(keys) == 0 and e4b.batch_exists(keys) == 4
    for s in (e4, e5, e4b):
        s.close()
    assert a.stop() == 0


# ---------------------------------------------------------------- key rule

LAYOUTS = [("mha-page_first", lambda: FlatMHAPool("page_first"), False),
           ("mha-layer_first", lambda: FlatMHAPool("layer_first"), False),
           ("mha-page_first_direct", lambda: FlatMHAPool("page_first_direct"), False),
           ("mla-page_first", lambda: FlatMLAPool("page_first"), True),
           ("mla-layer_first", lambda: FlatMLAPool("layer_first"), True)]


@pytest.mark.parametrize("name,make,mla", LAYOUTS, ids=[x[0] for x in LAYOUTS])
def test_one_key_rule_for_every_method(cluster, name, make, mla):
    (a,) = cluster(1, "--pool-size", "64mb")
    src, dst = make(), make()
    for p in range(6):
        src.fill_page(p, 300 + p)
    s = shim(a, mla)
    s.register_mem_pool_host(src)
    keys = hashes(6, "kr")
    ps = src.page_size
    assert s.batch_set_v1(keys[:3], indices(3, ps)) == [True] * 3
    # v1-written pages: exists, batch_exists and the flat get agree.
    assert all(s.exists(k) for k in keys[:3]) and not s.exists(keys[3])
    assert s.batch_exists(keys) == 3
    for p in range(3):
        out = src.get_dummy_flat_data_page()
        assert s.get(keys[p], out) is out
        assert out.numpy().tobytes() == src.flat_bytes(p), "flat page %d differs" % p
    # Flat-written pages: read back through v1 into another pool.
    flats = [src.get_data_page((3 + i) * ps) for i in range(3)]
    assert s.batch_set(keys[3:], flats) is True
    assert s.batch_exists(keys) == 6
    assert s.set(keys[0], torch.zeros(3)) is False, "a value that is not a page"
    s2 = shim(a, mla)
    s2.register_mem_pool_host(dst)
    assert s2.batch_get_v1(keys, indices(6, ps)) == [True] * 6
    for p in range(6):
        assert dst.page_bytes(p) == src.page_bytes(p), "page %d differs" % p
    # interface_v1 off: flat pages only, in their own key space.
    g = shim(a, mla, interface_v1=0)
    g.register_mem_pool_host(dst)
    assert g.batch_exists(keys) == 0
    assert g.set("flat0", flats[0]) is True
    assert g.exists("flat0") and g.batch_exists(["flat0"]) == 1 and not s.exists("flat0")
    for x in (s, s2, g):
        x.close()
    assert a.stop() == 0


def test_integer_pointers_in_the_pool_or_refused(cluster, caplog):
    a, b = cluster(2, "--pool-size", "64mb")
    pa, pb = MHAPool("page_first", shm=False), MHAPool("page_first", shm=True)
    sa, sb = shim(a), shim(b)
    sa.register_mem_pool_host(pa)
    sb.register_mem_pool_host(pb)
    for p in range(4):
        pa.fill_page(p, 40 + p)
    keys = hashes(4, "ptr")
    ptrs, sizes = pa.get_page_buffer_meta(indices(4, pa.page_size))
    assert sa.batch_set(keys, target_locations=ptrs, target_sizes=sizes) is True
    assert sb.batch_exists(keys) == 4 and sb.exists(keys[2])
    ptrs_b, sizes_b = pb.get_page_buffer_meta(indices(4, pb.page_size))
    assert sb.batch_get(keys, target_locations=ptrs_b, target_sizes=sizes_b) == 4
    for p in range(4):
        assert pb.page_bytes(p) == pa.page_bytes(p)
    stray = torch.zeros(sizes[0] // 2, dtype=torch.float16)
    with caplog.at_level(logging.ERROR, logger="peercache"):
        assert sa.batch_set(keys[:1], target_locations=[stray.data_ptr(), ptrs[1]],
                            target_sizes=sizes[:2]) is False
        assert sb.batch_get(keys[:1], target_locations=[stray.data_ptr(), ptrs_b[1]],
                            target_sizes=sizes[:2]) == 0
        assert sa.batch_set(keys[:1], target_locations=ptrs[:1], target_sizes=sizes[:1]) is False
    assert "outside the registered host pool memory" in caplog.text
    assert "a page is 2 object(s) here" in caplog.text
    for s in (sa, sb):
        s.close()
    for nd in (a, b):
        assert nd.stop() == 0


def test_clear_with_bounded_tracking(cluster, caplog):
    (a,) = cluster(1, "--pool-size", "64mb")
    s = shim(a, max_tracked_keys=10)
    pool, mp = MHAPool(), MambaPool()
    s.register_mem_pool_host(pool)
    s.register_mem_host_pool_v2(mp, "mamba")
    keys = hashes(8, "clr")
    assert s.batch_set_v1(keys, indices(8, pool.page_size)) == [True] * 8
    assert s.stats()["tracked_keys"] == 10, "the written-key set is bounded"
    t = [PoolTransfer(name="mamba", keys=keys[-1:], host_indices=torch.arange(1),
                      hit_policy="trailing_pages")]
    assert s.batch_set_v2(t) == {"mamba": [True]}
    with caplog.at_level(logging.WARNING, logger="peercache"):
        assert s.clear() is True
    assert "no longer tracked" in caplog.text
    # The most recent objects are gone (sidecar included), older ones stay.
    assert s.batch_exists(keys[:3]) == 3
    assert not any(s.exists(k) for k in keys[4:])
    assert s.batch_get_v2(t) == {"mamba": [False]}
    assert s.stats()["tracked_keys"] == 0
    s.close()
    assert a.stop() == 0


# ------------------------------------------------------- shared host pools

class _OffsetShm:
    """A shm allocator whose buffer starts 64 KiB into its memfd (a pool
    carved from a larger shared file)."""

    def __init__(self, pool):
        import mmap
        self.lead = 64 << 10
        nbytes = pool.kv_buffer.numel() * pool.kv_buffer.element_size()
        self.fd = os.memfd_create("offset_pool", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.lead + nbytes)
        self.fds = [self.fd]
        self.mm = mmap.mmap(self.fd, self.lead + nbytes, mmap.MAP_SHARED,
                            mmap.PROT_READ | mmap.PROT_WRITE)
        shape = tuple(pool.kv_buffer.shape)
        buf = torch.frombuffer(self.mm, dtype=pool.dtype, offset=self.lead,
                               count=pool.kv_buffer.numel()).view(shape)
        pool.allocator, pool.kv_buffer = self, buf
        pool.k_buffer, pool.v_buffer = buf[0], buf[1]


def test_a_buffer_inside_its_shared_file_moves_the_right_bytes(cluster):
    """The shim took each buffer's address as byte 0 of its memfd: a buffer
    further into the file would have had the node read and write the wrong
    bytes. The region base now comes from the mapping (/proc/self/maps)."""
    a, b = cluster(2, "--pool-size", "128mb")
    pa = MHAPool("page_first", shm=False)
    _OffsetShm(pa)
    pb = MHAPool("page_first", shm=True)
    sa, sb = shim(a), shim(b)
    sa.register_mem_pool_host(pa)
    sb.register_mem_pool_host(pb)
    assert len(sa._regions) == 1, "shared, not staged"
    n = 16
    for p in range(n):
        pa.fill_page(p, 100 + p)
    keys = hashes(n, "off")
    assert sa.batch_set_v1(keys, indices(n, pa.page_size)) == [True] * n
    assert sb.batch_get_v1(keys, indices(n, pb.page_size)) == [True] * n
    for p in range(n):
        assert pb.page_bytes(p) == pa.page_bytes(p), "page %d differs" % p
    # Registering another pool gives the first one's region back.
    assert metrics_of(a)["peercache_session_regions"] == 1
    sa.register_mem_pool_host(MHAPool("page_first", shm=True))
    assert len(sa._regions) == 1
    assert metrics_of(a)["peercache_session_regions"] == 1
    for s in (sa, sb):
        s.close()
    for nd in (a, b):
        assert nd.stop() == 0
