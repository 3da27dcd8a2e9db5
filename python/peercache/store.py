"""PeerCacheStore: SGLang's HiCacheStorage backed by the local peercached.

Load it in SGLang with

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config
    '{"backend_name":"peercache","module_path":"peercache.store",
      "class_name":"PeerCacheStore","interface_v1":1,"allocator":"shm"}'

With "allocator":"shm" SGLang's host KV pool is a memfd (one per allocation:
K and V apart for the asymmetric MHA pool); the shim hands those
descriptors to the node once, and after that only (key, offset, length)
triples cross the socket: a set is one copy by the node (pool -> its publish
pool), a get of a remote page lands in the host pool straight from the
network. Without a shared host pool the shim stages pages through a shared
buffer, one more local copy per page (logged once, counted in stats()).
Sidecar pools of hybrid models (v2: Mamba, SWA, the DSA indexer, DeepSeek-V4,
MTP draft) are always staged.

Contract (docs/sglang.md, shared sglang-contract.md):
  - every storage call returns a value of the right type and never raises:
    a node that is down gives all-False / 0, and the next call reconnects;
  - no call blocks longer than about 2 x timeout_ms (default 4 s): SGLang
    joins its storage threads for 10 s on detach; what is not done by then
    is a miss;
  - calls block until the bytes are consumed (set) or landed (get); the C
    library releases the GIL for the whole transfer.

Keys. One rule for every method: a page with hash h is stored as the
objects "<namespace>/<h>/<j>", j < per, where the namespace names the
tenant prefix, model, kv_cache_dtype, pool, layout, dtype, page size, page
format and the ranks that shard it, and `per` is the number of objects of a
page: the pointers get_page_buffer_meta gives per page under interface_v1
(K and V, or one MLA buffer, or one per layer), 1 for the flat pages of the
generic path. exists/batch_exists/get/set/batch_get/batch_set/batch_*_v1
therefore always agree on which pages exist.
"""
import collections
import concurrent.futures
import ctypes
import logging
import os
import threading
import time

from . import _hicache
from ._hicache import HiCacheStorage, StorageMetrics, make_transfer_result
from .client import Client, PeerCacheError

log = logging.getLogger("peercache")

DEFAULT_SOCKET = "/run/peercache/peercached.sock"
DEFAULT_TIMEOUT_MS = 4000     # SGLang joins storage threads for 10 s
DEFAULT_MAX_TRACKED_KEYS = 1 << 18
SGLANG_JOIN_S = 10.0
_EXISTS_WINDOW = 64           # pages per exists call when probing holes
_PROBE_THREADS = 4            # parallel probes of one long existence query
_PROBE_MIN_PAGES = 128        # pages per probe segment, at least

# Extra-config keys SGLang itself puts there, and ours.
_SGLANG_KEYS = {"backend_name", "module_path", "class_name", "interface_v1",
                "allocator", "tp_lcm_size", "prefetch_threshold",
                "prefetch_timeout_base", "prefetch_timeout_per_ki_token",
                "prefetch_timeout_max", "hicache_storage_pass_prefix_keys"}
_OUR_KEYS = {"socket", "prefix", "timeout_ms", "mode", "kv_cache_dtype",
             "max_tracked_keys", "allow_unknown_keys"}
# Keys of the original PeerCache that mean nothing here: accepted, ignored.
_ORIGINAL_KEYS = {"discovery_addr", "role", "write_policy", "protocol",
                  "device_name", "device_names", "ib_port", "gid_index",
                  "max_channels_per_peer", "global_segment_size", "vnodes",
                  "directory_replicas", "directory_read_cache_ttl",
                  "local_hostname", "rdma_bind_host", "rdma_port",
                  "control_bind_host", "control_port", "meta_bind_host",
                  "disk_enabled", "disk_path", "disk_size", "metrics_enabled",
                  "metrics_bind_host", "metrics_port", "metrics_dashboard",
                  "node_id", "heartbeat_interval", "member_ttl", "max_masters",
                  "slot_max_page_bytes", "slot_ways", "slot_num_buckets"}

KV = "kv"
# Pools whose pages are sharded by TP rank even in a rank-replicated (MLA,
# DeepSeek-V4) model: their keys carry the rank and every rank writes them.
_ALWAYS_SHARDED = {"mamba"}


def _pool_name(name):
    return str(getattr(name, "value", name))


def _file_base(ptr, st):
    """The address of byte 0 of the file st (an os.stat_result) in this
    process, from the mapping of /proc/self/maps that holds ptr — or None
    when ptr is not in a mapping of that file."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 5:
                    continue
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if not lo <= ptr < hi:
                    continue
                major, minor = (int(x, 16) for x in parts[3].split(":"))
                if (int(parts[4]) != st.st_ino or
                        os.makedev(major, minor) != st.st_dev):
                    return None
                return lo - int(parts[2], 16)
    except OSError:
        return None
    return None


def _nbytes(t):
    return t.numel() * t.element_size()


class _Late(Exception):
    """The call's time budget is spent: the rest is a miss."""


class _Deadline:
    def __init__(self, seconds):
        self.end = time.monotonic() + seconds

    def remaining(self):
        return self.end - time.monotonic()

    def check(self):
        if self.remaining() <= 0:
            raise _Late("time budget spent")


class _RateLimitedLog:
    """One warning per 10 s per message kind: a down node must not flood;
    once() logs a kind a single time for the life of the backend."""

    def __init__(self):
        self._last = {}
        self._once = set()
        self._lock = threading.Lock()

    def warn(self, kind, msg, *args):
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(kind, -1e9) < 10:
                return
            self._last[kind] = now
        log.warning(msg, *args)

    def once(self, kind, level, msg, *args):
        with self._lock:
            if kind in self._once:
                return
            self._once.add(kind)
        log.log(level, msg, *args)


def _arange(n, start=0):
    try:
        import torch
        return torch.arange(start, start + n, dtype=torch.int64)
    except Exception:  # pragma: no cover
        import numpy
        return numpy.arange(start, start + n, dtype=numpy.int64)


class _Sidecar:
    """A v2 pool other than KV: how its pages are addressed and named.

    "meta": the pool gives per-page pointers (get_page_buffer_meta), each
    page is `per` objects (Mamba: temporal, then conv_0..n). "flat": the pool
    only copies whole pages (get_data_page / set_from_flat_data_page), each
    page is one object, bounced through a tensor of the page's own dtype
    (Mamba pages are uint8-packed)."""

    def __init__(self, name, pool):
        self.name, self.pool = name, pool
        self.page = int(getattr(pool, "page_size", 1) or 1)
        self.mode, self.per, self.error = None, 0, None
        try:
            ptrs, sizes = pool.get_page_buffer_meta(_arange(self.page))
            self.per, self.mode = len(list(ptrs)), "meta"
            if self.per == 0:
                raise ValueError("no buffers")
        except Exception as e:
            self.mode = None
            if callable(getattr(pool, "get_data_page", None)) and \
                    callable(getattr(pool, "set_from_flat_data_page", None)):
                self.mode, self.per = "flat", 1
            else:
                self.error = "no page pointers (%s) and no flat pages" % e

    @property
    def supported(self):
        return self.mode is not None

    def buffers(self):
        """(address, nbytes) of every host buffer of the pool."""
        kv = getattr(self.pool, "kv_buffer", None)
        bufs = kv if isinstance(kv, (list, tuple)) else [kv]
        return [(b.data_ptr(), _nbytes(b)) for b in bufs if hasattr(b, "data_ptr")]


class PeerCacheStore(HiCacheStorage):
    """The peercache storage backend (see the module docstring)."""

    def __init__(self, storage_config=None, kwargs=None):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        if isinstance(kwargs, dict):
            extra.update(kwargs)
        cfg = storage_config
        self.tp_rank = int(getattr(cfg, "tp_rank", 0) or 0)
        self.tp_size = int(getattr(cfg, "tp_size", 1) or 1)
        self.pp_rank = int(getattr(cfg, "pp_rank", 0) or 0)
        self.pp_size = int(getattr(cfg, "pp_size", 1) or 1)
        self.cp_rank = int(getattr(cfg, "attn_cp_rank", 0) or 0)
        self.cp_size = int(getattr(cfg, "attn_cp_size", 1) or 1)
        # Attention-DP ranks (0.5.18+) hold the same shards: they share pages.
        self.dp_rank = int(getattr(cfg, "dp_rank", 0) or 0)
        self.dp_size = int(getattr(cfg, "dp_size", 1) or 1)
        self.is_mla = bool(getattr(cfg, "is_mla_model", False))
        self.model = str(getattr(cfg, "model_name", None) or "model")
        self.identity = getattr(cfg, "model_identity_hash", None)
        self._configure(extra, getattr(cfg, "kv_cache_dtype", None))
        self._rl = _RateLimitedLog()
        self._lock = threading.Lock()
        self._client = None
        self._closed = False
        self.mem_pool_host = None
        self._pool = None
        self._ns = None         # the KV namespace of every method
        self._ns_v1 = None      # the KV namespace of batch_*_v1
        self._logical = False   # anchor without kv_buffer (DeepSeek-V4)
        self._region = None     # the host pool's (first) shared region
        self._regions = []      # (region id, address here, size) per buffer
        self._staging = {}      # op -> (region, address, size)
        self._staging_locks = {"set": threading.Lock(), "get": threading.Lock()}
        self._staging_logged = False
        self._written = collections.OrderedDict()  # bounded, see clear()
        self._untracked = 0
        self._stats = {"pages_set": 0, "pages_got": 0, "bytes_set": 0,
                       "bytes_got": 0, "staged_bytes": 0, "errors": 0}
        self._window = {"get": [0, 0, 0, 0.0], "set": [0, 0, 0, 0.0]}
        self._sidecars = {}
        self._probes = None     # thread pool of long existence queries
        self.registered_pools = {}

    def _configure(self, extra, cfg_dtype):
        """Every extra-config key is honoured, or refused with a clear error.
        Keys of the original PeerCache are accepted without effect (logged
        once); an unknown key is refused — a misspelt "timeout_ms" must not
        silently leave the default in place — unless allow_unknown_keys is
        true, which turns the refusal into a warning (for keys of a newer
        SGLang that this shim does not know yet)."""
        def int_key(name, default, lo, hi):
            v = extra.get(name, default)
            try:
                v = int(v)
            except (TypeError, ValueError):
                v = None
            if v is None or not lo <= v <= hi:
                raise ValueError("peercache: extra-config %s=%r: an integer in "
                                 "[%d, %d] is needed" % (name, extra.get(name), lo, hi))
            return v

        for name in ("socket", "prefix", "kv_cache_dtype"):
            if name in extra and not isinstance(extra[name], str):
                raise ValueError("peercache: extra-config %s must be a string, "
                                 "not %r" % (name, extra[name]))
        mode = extra.get("mode", "p2p")
        if mode not in ("p2p", "slotmap"):
            raise ValueError("peercache: extra-config mode=%r: \"p2p\" or "
                             "\"slotmap\" is needed" % (mode,))
        self.socket = extra.get("socket") or os.environ.get("PEERCACHE_SOCKET") or DEFAULT_SOCKET
        self.prefix = extra.get("prefix", "") or ""
        self.timeout_ms = int_key("timeout_ms", DEFAULT_TIMEOUT_MS, 10, 600000)
        if "mode" in extra:
            self._check_node_mode(mode)
        self.max_tracked_keys = int_key("max_tracked_keys", DEFAULT_MAX_TRACKED_KEYS,
                                        0, 1 << 26)
        self.interface_v1 = bool(extra.get("interface_v1", False))
        self.kv_cache_dtype = extra.get("kv_cache_dtype") or cfg_dtype
        if 2 * self.timeout_ms >= SGLANG_JOIN_S * 1000:
            log.warning("peercache: timeout_ms=%d: a call may block up to %.1f s, "
                        "longer than SGLang's %d s join on detach",
                        self.timeout_ms, 2 * self.timeout_ms / 1000, SGLANG_JOIN_S)
        allow_unknown = extra.get("allow_unknown_keys", False)
        if not isinstance(allow_unknown, bool):
            raise ValueError("peercache: extra-config allow_unknown_keys must be "
                             "true or false, not %r" % (allow_unknown,))
        ignored = sorted(k for k in extra if k in _ORIGINAL_KEYS)
        unknown = sorted(k for k in extra
                         if k not in _SGLANG_KEYS | _OUR_KEYS | _ORIGINAL_KEYS)
        if unknown and not allow_unknown:
            raise ValueError(
                "peercache: unknown extra-config key%s %s; this backend knows "
                "%s (and SGLang's own: %s). Fix the spelling, remove the key, "
                "or set \"allow_unknown_keys\": true to accept it with a warning"
                % ("s" if len(unknown) > 1 else "", ", ".join(unknown),
                   ", ".join(sorted(_OUR_KEYS)), ", ".join(sorted(_SGLANG_KEYS))))
        if unknown:
            log.warning("peercache: ignoring unknown extra-config keys %s "
                        "(allow_unknown_keys is true)", ", ".join(unknown))
        if ignored:
            log.info("peercache: ignoring extra-config keys %s (keys of the "
                     "original PeerCache without effect here)", ", ".join(ignored))

    def _check_node_mode(self, mode):
        """The placement mode is the node's (peercached --mode); a shim that
        names one checks the node runs it, so a misconfigured pair fails at
        start, not with misses."""
        try:
            c = Client(self.socket, self.timeout_ms)
            try:
                node_mode = c.info().get("mode", "p2p")
            finally:
                c.close()
        except PeerCacheError as e:
            raise ValueError("peercache: extra-config mode=%r cannot be checked: "
                             "no node answers on %s (%s)" % (mode, self.socket, e))
        if node_mode != mode:
            raise ValueError("peercache: extra-config mode=%r, but the node on %s "
                             "runs mode %r; set the key to %r or remove it (the "
                             "node's mode applies)" % (mode, self.socket, node_mode,
                                                       node_mode))

    # ----------------------------------------------------------- plumbing

    def _conn(self):
        with self._lock:
            if self._closed:
                raise PeerCacheError(9, "closed")
            if self._client is None:
                self._client = Client(self.socket, self.timeout_ms)
            return self._client

    def _deadline(self):
        return _Deadline(self.timeout_ms / 1000.0)

    def _count(self, **kw):
        with self._lock:
            for k, v in kw.items():
                self._stats[k] += v

    def _record(self, op, pages, nbytes, seconds):
        """One transfer call, for stats() and the get_stats() window."""
        with self._lock:
            w = self._window[op]
            w[0] += 1
            w[1] += pages
            w[2] += nbytes
            w[3] += seconds
            if op == "get":
                self._stats["pages_got"] += pages
                self._stats["bytes_got"] += nbytes
            else:
                self._stats["pages_set"] += pages
                self._stats["bytes_set"] += nbytes

    def _base_ns(self):
        parts = [self.prefix] if self.prefix else []
        parts.append(self.model.replace("/", "-"))
        if self.kv_cache_dtype:
            parts.append("kvdt-%s" % self.kv_cache_dtype)
        if self.identity:
            parts.append("id-%s" % self.identity)
        return parts

    def _namespace(self, host, pool=KV, fmt="v1"):
        """The namespace of one pool's pages (see the module docstring)."""
        layout = str(getattr(host, "layout", "layer_first"))
        dtype = str(getattr(host, "dtype", "unknown")).replace("torch.", "")
        page = int(getattr(host, "page_size", 0) or 0)
        parts = self._base_ns()
        if pool != KV:
            parts.append(pool)
        parts += [layout, dtype, "p%d" % page]
        if fmt != "v1":
            parts.append(fmt)
        if not self.is_mla or pool in _ALWAYS_SHARDED:
            parts.append("tp%d-%d" % (self.tp_rank, self.tp_size))
        parts.append("pp%d-%d" % (self.pp_rank, self.pp_size))
        if self.cp_size > 1:
            parts.append("cp%d-%d" % (self.cp_rank, self.cp_size))
        return "/".join(parts)

    @staticmethod
    def _keys(ns, hashes, per):
        """The object keys of pages: per objects each (the one key rule)."""
        return [("%s/%s/%d" % (ns, h, j)).encode() for h in hashes for j in range(per)]

    def _writer(self, pool=KV):
        """Whether this rank writes the pool's pages: replicated pages (MLA,
        DeepSeek-V4) are written by TP rank 0 only."""
        return not self.is_mla or self.tp_rank == 0 or pool in _ALWAYS_SHARDED

    def _track(self, keys):
        cap = self.max_tracked_keys
        with self._lock:
            for k in keys:
                self._written[k] = None
                self._written.move_to_end(k)
            while len(self._written) > cap:
                self._written.popitem(last=False)
                self._untracked += 1

    # ------------------------------------------------------- registration

    def register_mem_pool_host(self, mem_pool_host):
        host = mem_pool_host
        if hasattr(host, "anchor_entry"):  # HostPoolGroup facade
            host = host.anchor_entry.host_pool
        if host is self._pool and self._ns is not None:
            return  # already registered (v2 anchor first, then v1)
        try:
            super().register_mem_pool_host(mem_pool_host)
        except Exception:
            self.mem_pool_host = mem_pool_host
        self._pool = host
        self._per = None
        kv = getattr(host, "kv_buffer", None)
        self._logical = kv is None
        self._ns_v1 = self._namespace(host, KV, "v1")
        if self._logical:
            self._ns = self._namespace(host, KV, "marker")
            log.info("peercache: host pool has no kv_buffer (logical anchor): "
                     "KV reads and writes are no-ops, a marker per page gates "
                     "the sidecar pools")
            return
        self._ns = self._ns_v1 if self.interface_v1 else self._namespace(host, KV, "flat")
        self._drop_regions()  # a new pool: nothing of the old one stays shared
        if self._share(host, kv):
            return
        self._log_staging()

    def _drop_regions(self):
        """Give the node back the regions of an earlier host pool."""
        old, self._regions, self._region = self._regions, [], None
        for rid, _, _ in old:
            try:
                self._conn().region_remove(rid)
            except Exception as e:  # the node may be gone: nothing to free
                self._rl.warn("unshare", "peercache: cannot give region %s "
                              "back to the node (%s)", rid, e)

    def _share(self, host, kv):
        """Hand the host pool's shared-memory descriptors to the node: one
        region per allocation, matched in order with the pool's buffers
        (SGLang's ShmHostTensorAllocator keeps one memfd per allocate():
        one for an MHA or MLA pool, K and V apart for the asymmetric MHA
        pool). False (staging) when there is nothing to share or the
        descriptors do not cover the buffers."""
        allocator = getattr(host, "allocator", None)
        fds = list(getattr(allocator, "fds", None) or [])
        fd = getattr(allocator, "fd", None)
        if not fds and fd is not None:
            fds = [fd]
        bufs = list(kv) if isinstance(kv, (list, tuple)) else [kv]
        if not fds:
            return False
        added = []
        try:
            if len(fds) != len(bufs):
                raise ValueError("%d shared allocation(s) for %d buffer(s)"
                                 % (len(fds), len(bufs)))
            regions = []
            for i, (f, buf) in enumerate(zip(fds, bufs)):
                st = os.fstat(f)
                size = st.st_size
                # Where byte 0 of the shared file is in this process: from
                # the mapping that holds the buffer, so a buffer that does
                # not start the file still gets the node's offsets right.
                base = _file_base(buf.data_ptr(), st)
                if base is None:
                    raise ValueError("buffer %d is not mapped from its shared "
                                     "file" % i)
                if buf.data_ptr() + _nbytes(buf) > base + size:
                    raise ValueError("buffer %d lies outside its shared file" % i)
                regions.append((f, base, size))
            cl = self._conn()
            for f, base, size in regions:
                added.append((cl.region_add(f, size), base, size))
            self._regions = added
            self._region = added[0][0]
            log.info("peercache: host pool shared with the node (%d bytes in %d "
                     "region(s), layout %s): pages move without extra copies",
                     sum(r[2] for r in added), len(added),
                     getattr(host, "layout", "?"))
            return True
        except Exception as e:  # fall back to staging, loudly
            for rid, _, _ in added:
                try:
                    self._conn().region_remove(rid)
                except Exception:
                    pass
            self._rl.warn("share", "peercache: cannot share the host pool "
                          "(%s); staging pages instead", e)
            return False

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        """Called once per pool of the HostPoolGroup, the KV anchor included
        (which is the pool of register_mem_pool_host). Never raises: a pool
        the shim cannot address is logged once and is a miss."""
        name = _pool_name(host_pool_name)
        try:
            self.registered_pools[host_pool_name] = host_pool
            if name == KV:
                if self._pool is None:  # v2-only registration creates the pool
                    self.register_mem_pool_host(host_pool)
                return
            sc = _Sidecar(name, host_pool)
            if sc.supported:
                sc.ns = self._namespace(host_pool, name, "v1" if sc.mode == "meta" else "flat")
                log.info("peercache: sidecar pool %s registered (%s, %d object(s) "
                         "per page, staged)", name, sc.mode, sc.per)
            else:
                self._rl.once("pool:" + name, logging.WARNING,
                              "peercache: sidecar pool %s is not supported (%s): its "
                              "pages are misses", name, sc.error)
            self._sidecars[name] = sc
        except Exception as e:
            self._rl.once("pool:" + name, logging.WARNING,
                          "peercache: sidecar pool %s is not supported (%s): its "
                          "pages are misses", name, e)

    def _log_staging(self):
        if not self._staging_logged:
            self._staging_logged = True
            log.warning("peercache: the host pool is not shared memory (use "
                        "\"allocator\":\"shm\"); each page costs one more "
                        "local copy through a staging buffer")

    def _staging_area(self, op, size):
        """A shared staging region of at least size bytes (op's lock held)."""
        cur = self._staging.get(op)
        if cur is None or cur[2] < size:
            cl = self._conn()
            if cur is not None:
                self._staging.pop(op)
                cl.region_remove(cur[0])
            size = max(size, 1 << 20)
            rid, addr = cl.region_create(size)
            cur = self._staging[op] = (rid, addr, size)
        return cur

    # ------------------------------------------------------------- moves

    def _kv_components(self, keys, host_indices):
        """Object keys, pointers and sizes of KV pages (v1 path)."""
        ptrs, sizes = self._pool.get_page_buffer_meta(host_indices)
        ptrs, sizes = list(ptrs), list(sizes)
        if not keys or len(ptrs) % len(keys):
            raise ValueError("%d pointers for %d keys" % (len(ptrs), len(keys)))
        per = len(ptrs) // len(keys)
        return self._keys(self._ns_v1, keys, per), ptrs, sizes, per

    def _region_of(self, p, s):
        """Index in _regions of the shared region holding [p, p + s), or None."""
        for i, (_, base, size) in enumerate(self._regions):
            if base <= p and p + s <= base + size:
                return i
        return None

    def _move(self, set_, ckeys, ptrs, sizes, deadline):
        """Move objects; a bool per object. Objects in the shared host pool
        go by offset, one node call per region they lie in (K and V of an
        asymmetric pool: two); any other batch is staged whole."""
        deadline.check()
        where = [self._region_of(p, s) for p, s in zip(ptrs, sizes)]
        if not where or None in where:
            return self._staged(set_, ckeys, ptrs, sizes, deadline)
        cl = self._conn()
        fn = cl.set if set_ else cl.get
        ok = [False] * len(ckeys)
        for n, r in enumerate(sorted(set(where))):
            if n:
                deadline.check()
            pos = [i for i, w in enumerate(where) if w == r]
            rid, base = self._regions[r][0], self._regions[r][1]
            got = fn(rid, [ckeys[i] for i in pos], [ptrs[i] - base for i in pos],
                     [sizes[i] for i in pos])
            for i, g in zip(pos, got):
                ok[i] = g
        return ok

    def _staged(self, set_, ckeys, ptrs, sizes, deadline):
        """Move objects at ptrs (not in shared memory) through the staging
        region of the op: one more local copy each; a bool per object."""
        if not ckeys:
            return []
        op = "set" if set_ else "get"
        lock = self._staging_locks[op]
        if not lock.acquire(timeout=max(deadline.remaining(), 0.001)):
            raise _Late("staging area busy")
        try:
            cl = self._conn()
            total = sum(sizes)
            rid, addr, _ = self._staging_area(op, total)
            offsets, off = [], 0
            for s in sizes:
                offsets.append(off)
                off += s
            if set_:
                for p, o, s in zip(ptrs, offsets, sizes):
                    ctypes.memmove(addr + o, p, s)
                ok = cl.set(rid, ckeys, offsets, sizes)
            else:
                ok = cl.get(rid, ckeys, offsets, sizes)
                for p, o, s, good in zip(ptrs, offsets, sizes, ok):
                    if good:
                        ctypes.memmove(p, addr + o, s)
            self._count(staged_bytes=total)
            return ok
        finally:
            lock.release()

    @staticmethod
    def _pages(ok, per):
        return [all(ok[i * per:(i + 1) * per]) for i in range(len(ok) // per)]

    @staticmethod
    def _leading(ok):
        run = next((i for i, good in enumerate(ok) if not good), len(ok))
        return [True] * run + [False] * (len(ok) - run)

    def _exists_count(self, ckeys, deadline):
        deadline.check()
        return self._conn().exists(ckeys) if ckeys else 0

    def _presence(self, ns, hashes, per, deadline):
        """Which pages have all their objects: a leading-run query per hole
        (windowed), so a sparse pool costs about one call per missing page;
        long ranges are probed in up to _PROBE_THREADS segments at once.
        Pages the time budget did not reach count as missing."""
        n = len(hashes)
        present = [False] * n
        ckeys = self._keys(ns, hashes, per)
        parts = max(1, min(_PROBE_THREADS, n // _PROBE_MIN_PAGES))
        bounds = [(n * k // parts, n * (k + 1) // parts) for k in range(parts)]

        def probe(lo, hi):
            i = lo
            while i < hi:
                end = min(i + _EXISTS_WINDOW, hi)
                run = self._exists_count(ckeys[i * per:end * per], deadline) // per
                for p in range(i, i + run):
                    present[p] = True
                i += run if run == end - i else run + 1

        try:
            if parts == 1:
                probe(0, n)
            else:
                for f in [self._probe_pool().submit(probe, lo, hi) for lo, hi in bounds]:
                    f.result()
        except _Late:
            self._rl.warn("presence", "peercache: existence query cut short by "
                          "the %d ms budget: the rest counts as missing", self.timeout_ms)
        return present

    def _probe_pool(self):
        with self._lock:
            if self._probes is None:
                self._probes = concurrent.futures.ThreadPoolExecutor(
                    _PROBE_THREADS, thread_name_prefix="peercache-probe")
            return self._probes

    # ---------------------------------------------------------------- v1

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        return self._set_v1(keys, host_indices, self._deadline())

    def _set_v1(self, keys, host_indices, deadline):
        n = len(keys)
        try:
            if self._pool is None:
                return [False] * n
            if not self._writer():
                return [True] * n  # replicated pages: rank 0 writes them
            if self._logical:
                return self._set_markers(keys, deadline)
            t0 = time.monotonic()
            ckeys, ptrs, sizes, per = self._kv_components(keys, host_indices)
            ok = self._pages(self._move(True, ckeys, ptrs, sizes, deadline), per)
            self._track(k for i, k in enumerate(ckeys) if ok[i // per])
            self._record("set", sum(ok),
                         sum(s for i, s in enumerate(sizes) if ok[i // per]),
                         time.monotonic() - t0)
            return ok
        except Exception as e:
            self._failed("set", e)
            return [False] * n

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        return self._get_v1(keys, host_indices, self._deadline())

    def _get_v1(self, keys, host_indices, deadline):
        n = len(keys)
        try:
            if self._pool is None:
                return [False] * n
            if self._logical:
                return [True] * n  # nothing to read; the markers gated exists
            t0 = time.monotonic()
            ckeys, ptrs, sizes, per = self._kv_components(keys, host_indices)
            ok = self._leading(self._pages(self._move(False, ckeys, ptrs, sizes,
                                                      deadline), per))
            run = sum(ok)
            self._record("get", run, sum(sizes[:run * per]), time.monotonic() - t0)
            return ok
        except Exception as e:
            self._failed("get", e)
            return [False] * n

    def _set_markers(self, keys, deadline):
        """Logical anchor: a tiny marker object per page, so existence can
        still gate the sidecars (written before it, per the call order)."""
        mark = ctypes.create_string_buffer(b"peercache-marker", 16)
        ckeys = self._keys(self._ns, keys, 1)
        ok = self._staged(True, ckeys, [ctypes.addressof(mark)] * len(ckeys),
                          [16] * len(ckeys), deadline)
        self._track(k for k, good in zip(ckeys, ok) if good)
        return list(ok)

    def _kv_per(self):
        """Objects per KV page in the key space of every method."""
        if self._pool is None or self._logical or not self.interface_v1:
            return 1
        if self._per is None:
            page = int(getattr(self._pool, "page_size", 1) or 1)
            ptrs, _ = self._pool.get_page_buffer_meta(_arange(page))
            self._per = max(1, len(list(ptrs)))
        return self._per

    def _kv_ns(self):
        if self._ns:
            return self._ns
        # no host pool registered: the model is the namespace
        return "/".join(self._base_ns() + ["nopool"])

    def batch_exists(self, keys, extra_info=None):
        return self._exists(keys, self._deadline())

    def _exists(self, keys, deadline):
        try:
            if not keys:
                return 0
            per = self._kv_per()
            return self._exists_count(self._keys(self._kv_ns(), keys, per),
                                      deadline) // per
        except Exception as e:
            self._failed("exists", e)
            return 0

    def exists(self, key):
        return self.batch_exists([key]) == 1

    # ---------------------------------------------------------------- v2

    def _sidecar_of(self, transfer):
        name = _pool_name(transfer.name)
        sc = self._sidecars.get(name)
        if sc is None:
            self._rl.once("unregistered:" + name, logging.WARNING,
                          "peercache: pool %s was never registered: its pages "
                          "are misses", name)
            return None
        return sc if sc.supported else None

    def _gather(self, set_, sc, transfer, hold):
        """Object keys, pointers and sizes of a transfer's pages, and what
        to do once a get landed (flat pools). Raises on a malformed one."""
        keys = list(transfer.keys or [])
        idx = transfer.host_indices
        count = len(idx) if idx is not None else 0
        if count != len(keys) * sc.page:
            raise ValueError("pool %s: %d host indices for %d pages of %d slots"
                             % (sc.name, count, len(keys), sc.page))
        if sc.mode == "meta":
            ptrs, sizes = sc.pool.get_page_buffer_meta(idx)
            ptrs, sizes = list(ptrs), list(sizes)
            if len(ptrs) != len(keys) * sc.per:
                raise ValueError("pool %s: %d pointers for %d pages"
                                 % (sc.name, len(ptrs), len(keys)))
            return self._keys(sc.ns, keys, sc.per), ptrs, sizes, None
        ptrs, sizes, after = [], [], []
        for i in range(len(keys)):
            slot = int(idx[i * sc.page])
            if set_:
                t = sc.pool.get_data_page(slot, flat=True).contiguous()
            else:
                dummy = getattr(sc.pool, "get_dummy_flat_data_page", None)
                # the page's own dtype (Mamba: uint8), not host_pool.dtype
                t = dummy() if callable(dummy) else \
                    sc.pool.get_data_page(slot, flat=True).clone()
                after.append((slot, t))
            hold.append(t)
            ptrs.append(t.data_ptr())
            sizes.append(_nbytes(t))
        return self._keys(sc.ns, keys, 1), ptrs, sizes, after

    def _sidecar_io(self, set_, transfers, deadline):
        """Move the pages of several sidecar transfers in one staged call;
        {transfer.name: [bool per page]}."""
        out, plan, hold = {}, [], []
        ckeys, ptrs, sizes = [], [], []
        for t in transfers:
            n = len(t.keys or [])
            out[t.name] = [False] * n
            sc = self._sidecar_of(t)
            if sc is None or n == 0:
                continue
            if set_ and not self._writer(sc.name):
                out[t.name] = [True] * n  # replicated: rank 0 writes
                continue
            try:
                k, p, s, after = self._gather(set_, sc, t, hold)
            except Exception as e:
                self._rl.warn("gather:" + sc.name, "peercache: %s of pool %s refused "
                              "(%s): a miss", "set" if set_ else "get", sc.name, e)
                continue
            plan.append((t.name, sc, len(ckeys), n, after, s))
            ckeys += k
            ptrs += p
            sizes += s
        if not plan:
            return out
        t0 = time.monotonic()
        ok = self._staged(set_, ckeys, ptrs, sizes, deadline)
        pages = nbytes = 0
        for name, sc, start, n, after, s in plan:
            res = self._pages(ok[start:start + n * sc.per], sc.per)
            if not set_:
                res = self._leading(res)
                for (slot, t), good in zip(after or [], res):
                    if good:
                        sc.pool.set_from_flat_data_page(slot, t)
            else:
                self._track(k for i, k in enumerate(ckeys[start:start + n * sc.per])
                            if res[i // sc.per])
            out[name] = res
            pages += sum(res)
            nbytes += sum(sz for i, sz in enumerate(s) if res[i // sc.per])
        self._record("set" if set_ else "get", pages, nbytes, time.monotonic() - t0)
        return out

    @staticmethod
    def _split(transfers):
        kv, derived, others = None, [], []
        for t in transfers or []:
            if _pool_name(t.name) == KV:
                kv = t
            elif _pool_name(getattr(t, "indices_from_pool", None)) == KV:
                derived.append(t)
            else:
                others.append(t)
        return kv, derived, others

    def batch_set_v2(self, transfers, extra_info=None):
        """Sidecar pages first, then (if the call carries it) KV: a KV page
        never exists in storage without the sidecars written before it."""
        out = {}
        try:
            kv, derived, others = self._split(transfers)
            deadline = self._deadline()
            out = {t.name: [False] * len(t.keys or []) for t in transfers or []}
            out.update(self._sidecar_io(True, derived + others, deadline))
            if kv is not None:
                out[kv.name] = self._set_v1(kv.keys or [], kv.host_indices, deadline)
            return out
        except Exception as e:
            self._failed("set", e)
            return {t.name: [False] * len(t.keys or []) for t in transfers or []}

    def batch_get_v2(self, transfers, extra_info=None):
        """KV first (if the call carries it) with the KV-derived sidecars
        (indices shared with KV, e.g. the DSA indexer) clamped to the KV
        hits; the other sidecars only after a complete KV read."""
        try:
            kv, derived, others = self._split(transfers)
            out = {t.name: [False] * len(t.keys or []) for t in transfers or []}
            kv_ok, deadline = None, self._deadline()
            if kv is not None:
                kv_ok = self._get_v1(kv.keys or [], kv.host_indices, deadline)
                out[kv.name] = kv_ok
                if not all(kv_ok):
                    others = []  # SGLang reads them only after a complete KV read
            out.update(self._sidecar_io(False, derived + others, deadline))
            if kv_ok is not None:
                for t in derived:
                    out[t.name] = self._leading([a and b for a, b in zip(out[t.name], kv_ok)])
            return out
        except Exception as e:
            self._failed("get", e)
            return {t.name: [False] * len(t.keys or []) for t in transfers or []}

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        """The usable prefix is the greatest page count every pool can
        restore: the intersection of each pool's legal stop points (an
        all_pages pool: every page up to the stop; a trailing_pages pool: the
        last len(keys) pages before the stop). restorable_prefix_pages lists
        them all, so SGLang can intersect them across ranks."""
        try:
            deadline = self._deadline()
            kv_pages = self._exists(keys, deadline)
            hits = {_hicache.PoolName.KV: kv_pages} if kv_pages else {}
            restorable = list(range(1, kv_pages + 1))
            for t in pool_transfers or []:
                if _pool_name(t.name) == KV:
                    continue
                sc = self._sidecar_of(t)
                if sc is None:
                    restorable = []
                    break
                if not restorable:
                    break
                policy = _pool_name(getattr(t, "hit_policy", "all_pages"))
                present = self._presence(sc.ns, keys[:kv_pages], sc.per, deadline)
                if policy == "trailing_pages":
                    window = max(1, len(t.keys or []))
                    legal, run = [], 0
                    for p in range(1, kv_pages + 1):
                        run = run + 1 if present[p - 1] else 0
                        if run >= min(window, p):
                            legal.append(p)
                else:
                    boundary = next((i for i, good in enumerate(present) if not good),
                                    kv_pages)
                    legal = list(range(1, boundary + 1))
                if legal:
                    hits[t.name] = legal[-1]
                keep = set(legal)
                restorable = [p for p in restorable if p in keep]
            final = restorable[-1] if restorable else 0
            return make_transfer_result(final, hits, restorable)
        except Exception as e:
            self._failed("exists", e)
            return make_transfer_result(0, {}, [])

    # ----------------------------------------------- generic (legacy) path

    @staticmethod
    def _buffer(value):
        """(address, nbytes[, keepalive]) of a tensor, numpy array or bytes."""
        if hasattr(value, "data_ptr"):
            return value.data_ptr(), _nbytes(value)
        if hasattr(value, "__array_interface__"):
            return value.__array_interface__["data"][0], value.nbytes
        buf = bytes(value)
        keep = ctypes.create_string_buffer(buf, len(buf))
        return ctypes.addressof(keep), len(buf), keep

    def _flat_parts(self):
        """(offset, size) in a flat page of each object of a KV page, in
        object order (get_page_buffer_meta's). A flat page is K then V, each
        [layer]...; layer_first MHA objects come K0, V0, K1, V1, ..."""
        page = int(getattr(self._pool, "page_size", 1) or 1)
        _, sizes = self._pool.get_page_buffer_meta(_arange(page))
        sizes = list(sizes)
        per = len(sizes)
        if str(getattr(self._pool, "layout", "")) == "layer_first" and not self.is_mla \
                and per % 2 == 0 and len(set(sizes)) == 1:
            layers = per // 2
            return [(((j % 2) * layers + j // 2) * sizes[0], sizes[0]) for j in range(per)]
        parts, off = [], 0
        for s in sizes:
            parts.append((off, s))
            off += s
        return parts

    def _flat_objects(self, keys, addrs, lens):
        """Object keys, pointers and sizes of flat pages at addrs; None for
        a page whose size is not the pool's page size."""
        per = self._kv_per()
        if self._pool is None or self._logical or not self.interface_v1:
            return self._keys(self._kv_ns(), keys, 1), list(addrs), list(lens)
        parts = self._flat_parts()
        page_bytes = sum(s for _, s in parts)
        ckeys, ptrs, sizes = self._keys(self._kv_ns(), keys, per), [], []
        for a, n in zip(addrs, lens):
            if n != page_bytes:
                raise ValueError("a value of %d bytes is not a page (%d bytes) of "
                                 "the registered pool" % (n, page_bytes))
            for off, s in parts:
                ptrs.append(a + off)
                sizes.append(s)
        return ckeys, ptrs, sizes

    def _pointer_call(self, keys, locations, target_sizes):
        """Mooncake-style integer pointers: (ptrs, sizes, per) when they
        name pages of the registered host pools, else a loud refusal."""
        if target_sizes is None or len(target_sizes) != len(locations):
            raise ValueError("integer target_locations need target_sizes of the "
                             "same length")
        per = self._kv_per()
        if len(locations) != len(keys) * per:
            raise ValueError("%d pointers for %d keys: a page is %d object(s) here"
                             % (len(locations), len(keys), per))
        ptrs, sizes = [int(p) for p in locations], [int(s) for s in target_sizes]
        ranges = []
        kv = getattr(self._pool, "kv_buffer", None) if self._pool is not None else None
        for buf in (kv if isinstance(kv, (list, tuple)) else [kv]):
            if buf is not None:
                ranges.append((buf.data_ptr(), _nbytes(buf)))
        for sc in self._sidecars.values():
            ranges += sc.buffers()
        for p, s in zip(ptrs, sizes):
            if not any(lo <= p and p + s <= lo + n for lo, n in ranges):
                raise ValueError("pointer 0x%x (+%d) is outside the registered host "
                                 "pool memory" % (p, s))
        return ptrs, sizes, per

    def _refuse(self, op, e):
        self._count(errors=1)
        self._rl.once("refuse:%s:%s" % (op, e), logging.ERROR,
                      "peercache: %s refused: %s", op, e)

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        if not keys:
            return True
        t0 = time.monotonic()
        try:
            items = values if values is not None else target_locations
            if items is None or len(items) == 0:
                raise ValueError("no values")
            if isinstance(items, (list, tuple)) and all(isinstance(v, int) for v in items):
                ptrs, sizes, per = self._pointer_call(keys, items, target_sizes)
                ckeys = self._keys(self._kv_ns(), keys, per)
            else:
                if len(items) != len(keys):
                    raise ValueError("%d values for %d keys" % (len(items), len(keys)))
                bufs = [self._buffer(v) for v in items]  # keeps bytes copies alive
                ckeys, ptrs, sizes = self._flat_objects(keys, [b[0] for b in bufs],
                                                        [b[1] for b in bufs])
        except Exception as e:
            self._refuse("batch_set", e)
            return False
        try:
            per = len(ckeys) // len(keys)
            ok = self._pages(self._move(True, ckeys, ptrs, sizes, self._deadline()), per)
            self._track(k for i, k in enumerate(ckeys) if ok[i // per])
            self._record("set", sum(ok),
                         sum(s for i, s in enumerate(sizes) if ok[i // per]),
                         time.monotonic() - t0)
            return all(ok)
        except Exception as e:
            self._failed("set", e)
            return False

    def set(self, key, value=None, target_location=None, target_sizes=None):
        if value is None and isinstance(target_location, int):
            return self.batch_set([key], None, [target_location],
                                  None if target_sizes is None else [target_sizes])
        return self.batch_set([key], [value if value is not None else target_location])

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """Tensors: the list of filled targets, None from the first miss on.
        Integer pointers (Mooncake style): how many leading pages landed."""
        n = len(keys)
        pointers = isinstance(target_locations, (list, tuple)) and len(target_locations) > 0 \
            and all(isinstance(t, int) for t in target_locations)
        t0 = time.monotonic()
        try:
            if target_locations is None:
                raise ValueError("no target locations")
            if pointers:
                ptrs, sizes, per = self._pointer_call(keys, target_locations, target_sizes)
                ckeys = self._keys(self._kv_ns(), keys, per)
            else:
                if len(target_locations) != n:
                    raise ValueError("%d targets for %d keys" % (len(target_locations), n))
                bufs = [self._buffer(t) for t in target_locations]
                ckeys, ptrs, sizes = self._flat_objects(keys, [b[0] for b in bufs],
                                                        [b[1] for b in bufs])
        except Exception as e:
            self._refuse("batch_get", e)
            return 0 if pointers else [None] * n
        try:
            per = len(ckeys) // max(n, 1)
            ok = self._leading(self._pages(self._move(False, ckeys, ptrs, sizes,
                                                      self._deadline()), per))
            run = sum(ok)
            self._record("get", run, sum(sizes[:run * per]), time.monotonic() - t0)
            if pointers:
                return run
            return [t if good else None for t, good in zip(target_locations, ok)]
        except Exception as e:
            self._failed("get", e)
            return 0 if pointers else [None] * n

    def get(self, key, target_location=None, target_sizes=None):
        if isinstance(target_location, int):
            got = self.batch_get([key], [target_location],
                                 None if target_sizes is None else [target_sizes])
            return target_location if got == 1 else None
        if target_location is None:
            return None
        return self.batch_get([key], [target_location])[0]

    # ------------------------------------------------------ housekeeping

    def clear(self):
        """Delete the pages this backend instance stored, everywhere in the
        cluster (their records and this node's copies). Pages other
        processes or nodes stored stay until the pools evict them, as do
        pages of this instance beyond the last max_tracked_keys objects it
        wrote (the shim's memory stays bounded; logged). Returns True when
        every tracked page is gone."""
        try:
            with self._lock:
                keys = list(self._written)
                untracked, self._untracked = self._untracked, 0
            cl = self._conn()
            for i in range(0, len(keys), 4096):
                cl.delete(keys[i:i + 4096])
            with self._lock:
                for k in keys:
                    self._written.pop(k, None)
            if untracked:
                log.warning("peercache: clear: %d older objects were no longer "
                            "tracked (max_tracked_keys=%d); they stay until evicted",
                            untracked, self.max_tracked_keys)
            return True
        except Exception as e:
            self._failed("clear", e)
            return False

    def close(self):
        with self._lock:
            if self._closed:
                return
            self._closed = True
            client, self._client = self._client, None
            probes, self._probes = self._probes, None
        if probes is not None:
            probes.shutdown(wait=False)
        if client is not None:
            client.close()

    def get_stats(self):
        """SGLang's StorageMetrics for the interval since the previous call:
        one entry per direction that saw calls (pages, and GB/s over the
        time spent in those calls); empty lists when idle."""
        with self._lock:
            win = self._window
            self._window = {"get": [0, 0, 0, 0.0], "set": [0, 0, 0, 0.0]}

        def entries(w):
            if not w[0]:
                return [], []
            return [w[1]], [w[2] / w[3] / 1e9 if w[3] > 0 else 0.0]

        try:
            pg, pb = entries(win["get"])
            bg, bb = entries(win["set"])
            return StorageMetrics(prefetch_pgs=pg, backup_pgs=bg,
                                  prefetch_bandwidth=pb, backup_bandwidth=bb)
        except Exception:
            return None

    def stats(self):
        """Cumulative counters of this instance (tests, operators)."""
        with self._lock:
            out = dict(self._stats)
            out["tracked_keys"] = len(self._written)
            return out

    def _failed(self, op, e):
        self._count(errors=1)
        self._rl.warn(op, "peercache: %s failed (%s); returning a miss", op, e)

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass
