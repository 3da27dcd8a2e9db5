"""libpeercache through ctypes: a local client of the peercached node.

Every call blocks in C with the GIL released (ctypes.CDLL releases it), so
many Python threads can move pages at once. The library is found through
$PEERCACHE_LIBRARY, then a copy in the package directory (install-shim.sh
--with-lib), then the system's library path (libpeercache.so.0), then the
usual install and build locations.
"""
import contextlib
import ctypes
import ctypes.util
import errno
import os
import threading

_PATHS = (
    "/usr/local/lib/libpeercache.so.0",
    "/usr/lib/libpeercache.so.0",
    "/usr/local/lib/x86_64-linux-gnu/libpeercache.so.0",
)


class PeerCacheError(OSError):
    pass


class _Opts(ctypes.Structure):
    _fields_ = [("socket_path", ctypes.c_char_p), ("timeout_ms", ctypes.c_uint),
                ("max_idle", ctypes.c_uint)]


class Item(ctypes.Structure):
    """struct pcache_item: a page's key and its bytes in a region."""
    _fields_ = [("key", ctypes.c_char_p), ("keylen", ctypes.c_size_t),
                ("offset", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class Stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "calls", "errors", "pages_set", "pages_set_ok", "pages_get",
        "pages_get_ok", "bytes_set", "bytes_got", "registrations",
        "connections")]


_lib = None


def _find_library():
    env = os.environ.get("PEERCACHE_LIBRARY")
    candidates = [env] if env else []
    here = os.path.dirname(os.path.abspath(__file__))
    # A copy next to the package (scripts/install-shim.sh --with-lib).
    candidates.append(os.path.join(here, "libpeercache.so.0"))
    found = ctypes.util.find_library("peercache")
    if found:
        candidates.append(found)
    candidates += list(_PATHS)
    candidates.append(os.path.join(here, "..", "..", "build", "client", "libpeercache.so.0"))
    for path in candidates:
        if path and (os.path.exists(path) or "/" not in path):
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
    raise PeerCacheError(errno.ENOENT, "libpeercache not found: set PEERCACHE_LIBRARY "
                         "to its path (build/client/libpeercache.so.0)")


def library():
    """The loaded libpeercache, with argument types declared."""
    global _lib
    if _lib is not None:
        return _lib
    lib = _find_library()
    P = ctypes.c_void_p
    lib.pcache_open.argtypes = [ctypes.POINTER(_Opts), ctypes.POINTER(P)]
    lib.pcache_close.argtypes = [P]
    lib.pcache_last_error.restype = ctypes.c_char_p
    lib.pcache_region_add.argtypes = [P, ctypes.c_int, ctypes.c_uint64,
                                      ctypes.POINTER(ctypes.c_uint32)]
    lib.pcache_region_create.argtypes = [P, ctypes.c_uint64, ctypes.POINTER(ctypes.c_void_p),
                                         ctypes.POINTER(ctypes.c_uint32)]
    lib.pcache_region_remove.argtypes = [P, ctypes.c_uint32]
    for fn in (lib.pcache_set, lib.pcache_get):
        fn.argtypes = [P, ctypes.c_uint32, ctypes.POINTER(Item), ctypes.c_size_t,
                       ctypes.POINTER(ctypes.c_bool)]
    for fn in (lib.pcache_exists, lib.pcache_delete):
        fn.argtypes = [P, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t),
                       ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
    lib.pcache_info.argtypes = [P, ctypes.c_char_p, ctypes.c_size_t]
    lib.pcache_stats.argtypes = [P, ctypes.POINTER(Stats)]
    for fn in (lib.pcache_open, lib.pcache_region_add, lib.pcache_region_create,
               lib.pcache_region_remove, lib.pcache_set, lib.pcache_get,
               lib.pcache_exists, lib.pcache_delete, lib.pcache_info):
        fn.restype = ctypes.c_int
    _lib = lib
    return lib


def _check(ret, what):
    if ret < 0:
        detail = library().pcache_last_error().decode(errors="replace")
        raise PeerCacheError(-ret, "%s: %s%s" % (what, os.strerror(-ret),
                                                  " (%s)" % detail if detail else ""))
    return ret


def _items(keys, offsets, lengths):
    n = len(keys)
    arr = (Item * n)()
    for i, k in enumerate(keys):
        arr[i].key = k
        arr[i].keylen = len(k)
        arr[i].offset = offsets[i]
        arr[i].len = lengths[i]
    return arr


class Client:
    """One libpeercache client; safe to share between threads. close() never
    waits for calls in flight in other threads: the last of them closes the
    C client when it returns (so it is never freed under a call)."""

    def __init__(self, socket_path=None, timeout_ms=30000):
        lib = library()
        opts = _Opts(socket_path.encode() if socket_path else None, timeout_ms, 8)
        h = ctypes.c_void_p()
        _check(lib.pcache_open(ctypes.byref(opts), ctypes.byref(h)), "open")
        self._h = h
        self._lib = lib
        self._mu = threading.Lock()
        self._busy = 0
        self._closing = False

    @contextlib.contextmanager
    def _handle(self):
        with self._mu:
            if self._closing or not self._h:
                raise PeerCacheError(errno.EBADF, "client closed")
            self._busy += 1
        try:
            yield self._h
        finally:
            with self._mu:
                self._busy -= 1
                last = self._closing and self._busy == 0
            if last:
                self._release()

    def _release(self):
        h, self._h = self._h, None
        if h:
            self._lib.pcache_close(h)

    def close(self):
        with self._mu:
            if self._closing:
                return
            self._closing = True
            idle = self._busy == 0
        if idle:
            self._release()

    def region_add(self, fd, size):
        rid = ctypes.c_uint32()
        with self._handle() as h:
            _check(self._lib.pcache_region_add(h, fd, size, ctypes.byref(rid)), "region_add")
        return rid.value

    def region_create(self, size):
        """A new shared region: (region id, address)."""
        rid = ctypes.c_uint32()
        addr = ctypes.c_void_p()
        with self._handle() as h:
            _check(self._lib.pcache_region_create(h, size, ctypes.byref(addr),
                                                  ctypes.byref(rid)), "region_create")
        return rid.value, addr.value

    def region_remove(self, region):
        with self._handle() as h:
            _check(self._lib.pcache_region_remove(h, region), "region_remove")

    def _move(self, fn, region, keys, offsets, lengths):
        n = len(keys)
        if n == 0:
            return []
        ok = (ctypes.c_bool * n)()
        items = _items(keys, offsets, lengths)
        with self._handle() as h:
            _check(fn(h, region, items, n, ok), fn.__name__)
        return list(ok)

    def set(self, region, keys, offsets, lengths):
        """Store pages [offset, offset+len) of region; a bool per key."""
        return self._move(self._lib.pcache_set, region, keys, offsets, lengths)

    def get(self, region, keys, offsets, lengths):
        """Fetch pages into the region; a bool per key."""
        return self._move(self._lib.pcache_get, region, keys, offsets, lengths)

    def _keys(self, fn, keys):
        n = len(keys)
        if n == 0:
            return 0
        karr = (ctypes.c_char_p * n)(*keys)
        larr = (ctypes.c_size_t * n)(*[len(k) for k in keys])
        count = ctypes.c_size_t()
        with self._handle() as h:
            _check(fn(h, karr, larr, n, ctypes.byref(count)), fn.__name__)
        return count.value

    def exists(self, keys):
        """How many leading keys exist."""
        return self._keys(self._lib.pcache_exists, keys)

    def delete(self, keys):
        return self._keys(self._lib.pcache_delete, keys)

    def info(self):
        buf = ctypes.create_string_buffer(4096)
        with self._handle() as h:
            _check(self._lib.pcache_info(h, buf, len(buf)), "info")
        out = {}
        for line in buf.value.decode(errors="replace").splitlines():
            k, _, v = line.partition(": ")
            out[k] = v
        return out

    def stats(self):
        st = Stats()
        with self._handle() as h:
            self._lib.pcache_stats(h, ctypes.byref(st))
        return {name: getattr(st, name) for name, _ in Stats._fields_}
