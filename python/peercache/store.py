"""PeerCacheStore: SGLang's HiCacheStorage backed by the local peercached.

Load it in SGLang with

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config
    '{"backend_name":"peercache","module_path":"peercache.store",
      "class_name":"PeerCacheStore","interface_v1":1,"allocator":"shm"}'

With "allocator":"shm" SGLang's host KV pool is a memfd; the shim hands that
descriptor to the node once, and after that only (key, offset, length)
triples cross the socket: a set is one copy by the node (pool -> its publish
pool), a get of a remote page lands in the host pool straight from the
network. Without a shared host pool the shim stages pages through a shared
buffer, one more local copy per page (logged once, counted in get_stats).

Contract (sglang-contract.md): every storage call returns a value of the
right type and never raises — a node that is down gives all-False / 0, and
the next call reconnects. Calls block until the bytes are consumed (set) or
landed (get). The C library releases the GIL for the whole transfer.
"""
import ctypes
import logging
import os
import threading
import time

from ._hicache import HiCacheStorage, StorageMetrics
from .client import Client, PeerCacheError

log = logging.getLogger("peercache")

DEFAULT_SOCKET = "/run/peercache/peercached.sock"

# Extra-config keys SGLang itself puts there, and ours.
_SGLANG_KEYS = {"backend_name", "module_path", "class_name", "interface_v1",
                "allocator", "tp_lcm_size", "prefetch_threshold",
                "prefetch_timeout_base", "prefetch_timeout_per_ki_token",
                "prefetch_timeout_max", "hicache_storage_pass_prefix_keys"}
_OUR_KEYS = {"socket", "prefix", "timeout_ms", "mode"}
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

_KV_POOL_NAMES = {"kv", "KV"}


def _pool_name(name):
    return str(getattr(name, "value", name))


class _RateLimitedLog:
    """One warning per 10 s per message kind: a down node must not flood."""

    def __init__(self):
        self._last = {}
        self._lock = threading.Lock()

    def warn(self, kind, msg, *args):
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(kind, 0) < 10:
                return
            self._last[kind] = now
        log.warning(msg, *args)


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
        self.is_mla = bool(getattr(cfg, "is_mla_model", False))
        self.model = str(getattr(cfg, "model_name", None) or "model")
        self.socket = extra.get("socket") or os.environ.get("PEERCACHE_SOCKET") or DEFAULT_SOCKET
        self.prefix = str(extra.get("prefix", "") or "")
        self.timeout_ms = int(extra.get("timeout_ms", 30000))
        self.interface_v1 = bool(extra.get("interface_v1", False))
        ignored = sorted(k for k in extra if k in _ORIGINAL_KEYS)
        unknown = sorted(k for k in extra
                         if k not in _SGLANG_KEYS | _OUR_KEYS | _ORIGINAL_KEYS)
        if ignored or unknown:
            log.info("peercache: ignoring extra-config keys %s", ", ".join(ignored + unknown))
        self._rl = _RateLimitedLog()
        self._lock = threading.Lock()
        self._client = None
        self._closed = False
        self.mem_pool_host = None
        self._pool = None
        self._ns = None
        self._region = None     # the host pool as a shared region
        self._base = 0          # its address in this process
        self._staging = None    # (region, address, size) when not shared
        self._staging_lock = threading.Lock()
        self._staging_logged = False
        self._written = set()   # component keys this instance stored
        self._stats = {"pages_set": 0, "pages_got": 0, "bytes_set": 0,
                       "bytes_got": 0, "staged_bytes": 0, "errors": 0}
        self._last_stats = (time.monotonic(), dict(self._stats))
        self.registered_pools = {}

    # ----------------------------------------------------------- plumbing

    def _conn(self):
        with self._lock:
            if self._closed:
                raise PeerCacheError(9, "closed")
            if self._client is None:
                self._client = Client(self.socket, self.timeout_ms)
            return self._client

    def _count(self, **kw):
        with self._lock:
            for k, v in kw.items():
                self._stats[k] += v

    def _namespace(self, host):
        layout = str(getattr(host, "layout", "layer_first"))
        dtype = str(getattr(host, "dtype", "unknown")).replace("torch.", "")
        page = int(getattr(host, "page_size", 0) or 0)
        parts = [self.prefix] if self.prefix else []
        parts += [self.model.replace("/", "-"), layout, dtype, "p%d" % page]
        if not self.is_mla:  # MHA pages are per TP shard; MLA is replicated
            parts.append("tp%d-%d" % (self.tp_rank, self.tp_size))
        parts.append("pp%d-%d" % (self.pp_rank, self.pp_size))
        if self.cp_size > 1:
            parts.append("cp%d-%d" % (self.cp_rank, self.cp_size))
        return "/".join(parts)

    # ------------------------------------------------------- registration

    def register_mem_pool_host(self, mem_pool_host):
        host = mem_pool_host
        if hasattr(host, "anchor_entry"):  # HostPoolGroup facade
            host = host.anchor_entry.host_pool
        try:
            super().register_mem_pool_host(mem_pool_host)
        except Exception:
            self.mem_pool_host = mem_pool_host
        self._pool = host
        self._ns = self._namespace(host)
        kv = getattr(host, "kv_buffer", None)
        if kv is None:
            log.info("peercache: host pool has no kv_buffer (logical anchor): "
                     "KV pages are not stored by this backend")
            return
        allocator = getattr(host, "allocator", None)
        fds = list(getattr(allocator, "fds", None) or [])
        fd = getattr(allocator, "fd", None)
        if fd is None and fds:
            fd = fds[0]
        if fd is not None and len(fds) <= 1:
            try:
                size = os.fstat(fd).st_size
                base = int(getattr(allocator, "base_ptr", 0) or kv.data_ptr())
                nbytes = kv.numel() * kv.element_size()
                if kv.data_ptr() < base or kv.data_ptr() + nbytes > base + size:
                    raise ValueError("kv_buffer lies outside the shared file")
                self._region = self._conn().region_add(fd, size)
                self._base = base
                log.info("peercache: host pool shared with the node (%d bytes, "
                         "layout %s): pages move without extra copies", size,
                         getattr(host, "layout", "?"))
                return
            except Exception as e:  # fall back to staging, loudly
                self._rl.warn("share", "peercache: cannot share the host pool "
                              "(%s); staging pages instead", e)
        self._log_staging()

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        name = _pool_name(host_pool_name)
        self.registered_pools[name] = host_pool
        if name in _KV_POOL_NAMES:
            if self._pool is None:  # v2-only registration creates the pool
                self.register_mem_pool_host(host_pool)
            return

    def _log_staging(self):
        if not self._staging_logged:
            self._staging_logged = True
            log.warning("peercache: the host pool is not shared memory (use "
                        "\"allocator\":\"shm\"); each page costs one more "
                        "local copy through a staging buffer")

    def _staging_area(self, size):
        """A shared staging region of at least size bytes (lock held)."""
        if self._staging is None or self._staging[2] < size:
            cl = self._conn()
            if self._staging is not None:
                cl.region_remove(self._staging[0])
                self._staging = None
            size = max(size, 1 << 20)
            rid, addr = cl.region_create(size)
            self._staging = (rid, addr, size)
        return self._staging

    # -------------------------------------------------------- component keys

    def _ckeys(self, keys, per):
        """Component keys: per pointers (K, V, layers...) of each page."""
        return [("%s/%s/%d" % (self._ns, k, j)).encode()
                for k in keys for j in range(per)]

    def _components(self, keys, host_indices):
        """Component keys, pointers and sizes of the pages (v1 path)."""
        ptrs, sizes = self._pool.get_page_buffer_meta(host_indices)
        ptrs, sizes = list(ptrs), list(sizes)
        if not keys or len(ptrs) % len(keys):
            raise ValueError("%d pointers for %d keys" % (len(ptrs), len(keys)))
        per = len(ptrs) // len(keys)
        return self._ckeys(keys, per), ptrs, sizes, per

    def _move(self, set_, ckeys, ptrs, sizes):
        """Move component pages; a bool per component."""
        if self._region is not None:
            cl = self._conn()
            offsets = [p - self._base for p in ptrs]
            fn = cl.set if set_ else cl.get
            return fn(self._region, ckeys, offsets, sizes)
        return self._staged(set_, ckeys, ptrs, sizes)

    def _staged(self, set_, ckeys, ptrs, sizes):
        """Move pages at ptrs (not in shared memory) through the staging
        region: one more local copy each; a bool per key."""
        cl = self._conn()
        with self._staging_lock:  # one staged batch at a time
            total = sum(sizes)
            rid, addr, _ = self._staging_area(total)
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

    @staticmethod
    def _pages(ok, per):
        return [all(ok[i * per:(i + 1) * per]) for i in range(len(ok) // per)]

    # ---------------------------------------------------------------- v1

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        n = len(keys)
        try:
            if self._pool is None or getattr(self._pool, "kv_buffer", None) is None:
                return [self._pool is not None] * n
            if self.is_mla and self.tp_rank != 0:
                return [True] * n  # replicated pages: rank 0 writes them
            ckeys, ptrs, sizes, per = self._components(keys, host_indices)
            ok = self._pages(self._move(True, ckeys, ptrs, sizes), per)
            with self._lock:
                for i, good in enumerate(ok):
                    if good:
                        self._written.update(ckeys[i * per:(i + 1) * per])
            self._count(pages_set=sum(ok),
                        bytes_set=sum(s for i, s in enumerate(sizes) if ok[i // per]))
            return ok
        except Exception as e:
            self._failed("set", e)
            return [False] * n

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        n = len(keys)
        try:
            if self._pool is None or getattr(self._pool, "kv_buffer", None) is None:
                return [False] * n
            ckeys, ptrs, sizes, per = self._components(keys, host_indices)
            ok = self._pages(self._move(False, ckeys, ptrs, sizes), per)
            # Leading-run semantics: nothing after the first miss counts.
            run = next((i for i, good in enumerate(ok) if not good), n)
            ok = [True] * run + [False] * (n - run)
            self._count(pages_got=run, bytes_got=sum(sizes[:run * per]))
            return ok
        except Exception as e:
            self._failed("get", e)
            return [False] * n

    def batch_exists(self, keys, extra_info=None):
        try:
            if not keys:
                return 0
            if self.interface_v1 and self._pool is not None and self._ns:
                per = self._per_page()
                return self._conn().exists(self._ckeys(keys, per)) // per
            return self._conn().exists([self._generic_key(k) for k in keys])
        except Exception as e:
            self._failed("exists", e)
            return 0

    def _per_page(self):
        """Pointers per page of the registered pool (probe with one page)."""
        per = getattr(self, "_per", None)
        if per is None:
            page = int(getattr(self._pool, "page_size", 1) or 1)
            probe = self._probe_indices(page)
            ptrs, _ = self._pool.get_page_buffer_meta(probe)
            per = self._per = max(1, len(list(ptrs)))
        return per

    @staticmethod
    def _probe_indices(page):
        try:
            import torch
            return torch.arange(page, dtype=torch.int64)
        except Exception:  # pragma: no cover
            import numpy
            return numpy.arange(page, dtype=numpy.int64)

    # ----------------------------------------------- generic (legacy) path

    def _generic_key(self, key):
        if self._ns:
            ns = self._ns
        else:  # no host pool registered: the model is the namespace
            ns = "%s%s" % (self.prefix + "/" if self.prefix else "", self.model)
        return ("%s/g/%s" % (ns, key)).encode()

    @staticmethod
    def _buffer(value):
        """(address, nbytes) of a tensor, numpy array or bytes-like."""
        if hasattr(value, "data_ptr"):
            return value.data_ptr(), value.numel() * value.element_size()
        if hasattr(value, "__array_interface__"):
            return value.__array_interface__["data"][0], value.nbytes
        buf = bytes(value)
        keep = ctypes.create_string_buffer(buf, len(buf))
        return ctypes.addressof(keep), len(buf), keep

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        try:
            items = values if values is not None else target_locations
            if items is None or len(items) != len(keys):
                return False
            bufs = [self._buffer(v) for v in items]  # keeps bytes copies alive
            sizes = [b[1] for b in bufs]
            ckeys = [self._generic_key(k) for k in keys]
            ok = self._staged(True, ckeys, [b[0] for b in bufs], sizes)
            self._count(pages_set=sum(ok))
            with self._lock:
                self._written.update(k for k, good in zip(ckeys, ok) if good)
            return all(ok)
        except Exception as e:
            self._failed("set", e)
            return False

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return self.batch_set([key], [value if value is not None else target_location])

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        n = len(keys)
        try:
            if target_locations is None or len(target_locations) != n:
                return [None] * n
            bufs = [self._buffer(t) for t in target_locations]
            sizes = [b[1] for b in bufs]
            ckeys = [self._generic_key(k) for k in keys]
            ok = self._staged(False, ckeys, [b[0] for b in bufs], sizes)
            self._count(pages_got=sum(ok))
            return [t if good else None for t, good in zip(target_locations, ok)]
        except Exception as e:
            self._failed("get", e)
            return [None] * n

    def get(self, key, target_location=None, target_sizes=None):
        return self.batch_get([key], [target_location])[0]

    def exists(self, key):
        try:
            return self._conn().exists([self._generic_key(key)]) == 1
        except Exception as e:
            self._failed("exists", e)
            return False

    # ------------------------------------------------------ housekeeping

    def clear(self):
        try:
            with self._lock:
                keys = list(self._written)
                self._written.clear()
            cl = self._conn()
            for i in range(0, len(keys), 4096):
                cl.delete(keys[i:i + 4096])
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
        if client is not None:
            client.close()

    def get_stats(self):
        """Pages and bandwidth since the previous call (per interval)."""
        with self._lock:
            now = time.monotonic()
            then, old = self._last_stats
            cur = dict(self._stats)
            self._last_stats = (now, cur)
        dt = max(now - then, 1e-9)
        got = cur["pages_got"] - old["pages_got"]
        put = cur["pages_set"] - old["pages_set"]
        try:
            return StorageMetrics(
                prefetch_pgs=[got], backup_pgs=[put],
                prefetch_bandwidth=[(cur["bytes_got"] - old["bytes_got"]) / dt / 1e9],
                backup_bandwidth=[(cur["bytes_set"] - old["bytes_set"]) / dt / 1e9])
        except Exception:
            return None

    def stats(self):
        """Cumulative counters of this instance (tests, operators)."""
        with self._lock:
            return dict(self._stats)

    def _failed(self, op, e):
        self._count(errors=1)
        self._rl.warn(op, "peercache: %s failed (%s); returning a miss", op, e)

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass
