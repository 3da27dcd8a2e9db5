#!/usr/bin/python3
"""scripts/check_sglang_backend.py — check the SGLang launch configuration of
docs/sglang.md against SGLang's own code: SGLang's storage-backend factory
builds the peercache backend from each documented extra-config, SGLang's
HiCacheStorage base class accepts it, and pages move through host pools
allocated by SGLang's own allocators ("allocator":"shm": shared with the
node; the default: staged).

Not part of CI: SGLang cannot be installed on the build machines. Run it by
hand against a checkout of github.com/sgl-project/sglang:

    SGLANG_SRC=/path/to/sglang scripts/check_sglang_backend.py

  SGLANG_SRC           the checkout: its root, or its python/ directory
  PEERCACHE_BUILD_DIR  the build with peercached and libpeercache [build];
                       the script starts one node on a temporary Unix socket
                       (no TCP port but loopback ones the kernel picks) and
                       stops it by PID

What is loaded from the checkout, as its own files (they need only torch and
the standard library):
  sglang.srt.mem_cache.storage.backend_factory   StorageBackendFactory
  sglang.srt.mem_cache.hicache_storage           HiCacheStorage, HiCacheStorageConfig,
                                                 PoolTransferResult (where it has it)
  sglang.srt.mem_cache.storage.mmap.mmap_allocator
                                                 alloc_shm and alloc_mmap: what
                                                 ShmHostTensorAllocator and the
                                                 default HostTensorAllocator call
The package __init__ files of sglang, sglang.srt, sglang.srt.mem_cache, ...
are not run (they import the whole server: CUDA kernels, tokenizers): empty
package entries pointing at the checkout's directories are put in
sys.modules first, so `import sglang.srt.mem_cache.hicache_storage` loads
that file and nothing above it. The host pools are the MHA pools of
tests/proc/fake_pools.py (SGLang's geometry and get_page_buffer_meta) on
buffers from SGLang's allocator functions: the pool classes themselves need
sgl_kernel and CUDA.

Each check prints one line, PASS / FAIL / SKIP; exit status 0 when nothing
failed.
"""
import importlib
import inspect
import json
import os
import re
import shlex
import sys
import tempfile
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("PEERCACHE_BUILD_DIR", os.path.join(ROOT, "build"))
DOCS = [os.path.join(ROOT, "docs", "sglang.md"), os.path.join(ROOT, "README.md")]
PACKAGES = ["sglang", "sglang.srt", "sglang.srt.mem_cache",
            "sglang.srt.mem_cache.storage", "sglang.srt.mem_cache.storage.mmap"]

failures = []


def report(ok, what, detail=""):
    word = {True: "PASS", False: "FAIL", None: "SKIP"}[ok]
    print("%s  %s%s" % (word, what, (": " + detail) if detail else ""), flush=True)
    if ok is False:
        failures.append(what)


def sglang_python_dir():
    src = os.environ.get("SGLANG_SRC")
    if not src:
        sys.exit("check_sglang_backend: set SGLANG_SRC to a checkout of sgl-project/sglang")
    for cand in (os.path.join(src, "python"), src):
        if os.path.isfile(os.path.join(cand, "sglang", "srt", "mem_cache",
                                       "hicache_storage.py")):
            return os.path.abspath(cand)
    sys.exit("check_sglang_backend: no python/sglang/srt/mem_cache/hicache_storage.py "
             "under %s" % src)


def mount_packages(pydir):
    """Empty package modules for the packages above the files we load."""
    for name in PACKAGES:
        path = os.path.join(pydir, *name.split("."))
        if not os.path.isdir(path):
            sys.exit("check_sglang_backend: %s is not in the checkout" % path)
        mod = types.ModuleType(name)
        mod.__path__ = [path]
        mod.__file__ = None
        sys.modules[name] = mod
    sys.path.insert(0, pydir)


def launch_lines():
    """The options of every SGLang launch line in the code blocks of
    docs/sglang.md and the README, as {option: value}."""
    text = "".join(open(d).read() for d in DOCS)
    out = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        cmd = block.replace("\\\n", " ")
        for line in cmd.splitlines():
            if "--hicache-storage-backend-extra-config" not in line:
                continue
            args = shlex.split(line)
            opt = {}
            for i, a in enumerate(args[:-1]):
                if a.startswith("--"):
                    opt[a] = args[i + 1]
            opt["_args"] = args
            out.append(opt)
    return out


def config(hs, extra, **over):
    """A HiCacheStorageConfig of this checkout, whatever fields it has."""
    cls = hs.HiCacheStorageConfig
    params = inspect.signature(cls).parameters
    values = {"tp_rank": 0, "tp_size": 1, "pp_rank": 0, "pp_size": 1,
              "attn_cp_rank": 0, "attn_cp_size": 1, "is_mla_model": False,
              "enable_storage_metrics": False, "is_page_first_layout": True,
              "model_name": "check/model", "extra_config": extra}
    values.update(over)
    return cls(**{k: v for k, v in values.items() if k in params})


class Node:
    """One peercached on a temporary socket, stopped by PID."""

    def __init__(self):
        import subprocess
        import time
        self.dir = tempfile.mkdtemp(prefix="pc-check-sglang-")
        self.socket = os.path.join(self.dir, "node.sock")
        self.log = open(os.path.join(self.dir, "node.log"), "w+")
        binary = os.path.join(BUILD, "server", "peercached")
        self.proc = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--rpc-port", "0", "--data-port", "0",
             "--meta-port", "0", "--metrics-port", "0", "--pool-size", "128mb",
             "--socket", self.socket], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                self.log.seek(0)
                sys.exit("check_sglang_backend: peercached did not start:\n" +
                         self.log.read())
            time.sleep(0.05)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except Exception:
                self.proc.kill()
                self.proc.wait()


def real_allocators(mm):
    """SGLang's two host allocations as functions (dims, dtype) ->
    (tensor, allocator-like object): alloc_shm with the descriptor kept
    the way ShmHostTensorAllocator keeps it (fds, fd), and alloc_mmap (the
    default HostTensorAllocator: no descriptor)."""
    def shm(dims, dtype):
        tensor, fd, m = mm.alloc_shm(dims, dtype)
        alloc = types.SimpleNamespace(fds=[fd], mms=[m], fd=fd)
        return tensor, alloc

    def default(dims, dtype):
        import torch
        try:
            return mm.alloc_mmap(dims, dtype), types.SimpleNamespace()
        except AttributeError as e:  # alloc_mmap needs torch >= 2
            if not getattr(default, "said", False):
                default.said = True
                report(None, "SGLang's alloc_mmap", "unusable with torch %s (%s); "
                       "the default-allocator pool is a plain tensor (no descriptor "
                       "either)" % (torch.__version__, e))
            return torch.zeros(dims, dtype=dtype), types.SimpleNamespace()

    return {"shm": shm, "default": default}


def pool_on(alloc_fn, layout):
    """An MHA host pool of fake_pools' geometry on SGLang's allocation."""
    from fake_pools import MHAPool
    pool = MHAPool(layout, pages=16, shm=False)
    tensor, alloc = alloc_fn(tuple(pool.kv_buffer.shape), pool.dtype)
    pool.allocator, pool.kv_buffer = alloc, tensor
    pool.k_buffer, pool.v_buffer = tensor[0], tensor[1]
    return pool


def asymmetric_pool_on(mm, layout):
    """fake_pools' asymmetric MHA pool (K and V apart, as SGLang's
    AsymmetricMHATokenToKVPoolHost) on two alloc_shm allocations."""
    from fake_pools import AsymmetricMHAPool
    maps = []

    def alloc(shape, dtype):
        tensor, fd, m = mm.alloc_shm(shape, dtype)
        maps.append(m)
        return tensor, fd

    pool = AsymmetricMHAPool(layout, alloc=alloc)
    pool.allocator.mms = maps
    return pool


def check_moves(tag, extra, layout, node, allocs, hs, bf, store, mm=None):
    """Build the backend through SGLang's factory from one extra-config and
    move pages through a host pool of SGLang's matching allocator (with mm:
    an asymmetric K/V pool on two alloc_shm allocations)."""
    import torch
    # What the controller hands the factory: the JSON minus the keys
    # the tree cache and the controller pop, plus our socket.
    extra = {k: v for k, v in extra.items() if k != "tp_lcm_size"}
    extra["socket"] = node.socket
    try:
        backend_obj = bf.StorageBackendFactory.create_backend(
            "dynamic", config(hs, extra), None)
    except Exception as e:
        report(False, "%s: StorageBackendFactory.create_backend" % tag,
               "%s: %s" % (type(e).__name__, e))
        return
    report(isinstance(backend_obj, store.PeerCacheStore),
           "%s: StorageBackendFactory.create_backend('dynamic') built "
           "PeerCacheStore" % tag)
    shared = extra.get("allocator") == "shm"
    if mm is not None:
        pa, pb = asymmetric_pool_on(mm, layout), asymmetric_pool_on(mm, layout)
    else:
        pa = pool_on(allocs["shm" if shared else "default"], layout)
        pb = pool_on(allocs["shm" if shared else "default"], layout)
    backend_obj.register_mem_pool_host(pa)
    regions = len(backend_obj._regions)
    want = (2 if mm is not None else 1) if shared else 0
    report(regions == want, "%s: host pool %s" % (
        tag, ("shared with the node (%d alloc_shm memfd(s))" % want) if shared else
        "staged (default allocator: no descriptor)"), "%d region(s)" % regions)
    n = 8
    # Keys of this check only: every line writes its own pages.
    check_moves.calls = getattr(check_moves, "calls", 0) + 1
    keys = ["c%d-%d-%056d" % (check_moves.calls, os.getpid(), i) for i in range(n)]
    for p in range(n):
        pa.fill_page(p, 11 + p)
    idx = torch.arange(0, n * pa.page_size, dtype=torch.int64)
    set_ok = backend_obj.batch_set_v1(keys, idx, hs.HiCacheStorageExtraInfo())
    hits = backend_obj.batch_exists(keys, hs.HiCacheStorageExtraInfo())
    backend_obj.register_mem_pool_host(pb)
    get_ok = backend_obj.batch_get_v1(keys, idx, hs.HiCacheStorageExtraInfo())
    same = all(pa.page_bytes(p) == pb.page_bytes(p) for p in range(n))
    report(set_ok == [True] * n and hits == n and get_ok == [True] * n and same,
           "%s: batch_set_v1 / batch_exists / batch_get_v1 of %d pages, "
           "byte-identical" % (tag, n),
           "set %s exists %s get %s same %s" % (sum(set_ok), hits, sum(get_ok), same))
    if hasattr(hs, "PoolTransferResult"):
        r = backend_obj.batch_exists_v2(keys, [])
        report(type(r) is hs.PoolTransferResult and r.kv_hit_pages == n,
               "%s: batch_exists_v2 answers this checkout's PoolTransferResult" % tag,
               repr(r))
    else:
        report(None, "%s: batch_exists_v2" % tag, "no PoolTransferResult here")
    backend_obj.close()


def main():
    pydir = sglang_python_dir()
    mount_packages(pydir)
    sys.path.insert(0, os.path.join(ROOT, "tests", "proc"))
    sys.path.insert(0, os.path.join(ROOT, "python"))
    os.environ.setdefault("PEERCACHE_LIBRARY",
                          os.path.join(BUILD, "client", "libpeercache.so.0"))
    print("SGLang checkout: %s" % pydir)

    hs = importlib.import_module("sglang.srt.mem_cache.hicache_storage")
    bf = importlib.import_module("sglang.srt.mem_cache.storage.backend_factory")
    mm = importlib.import_module("sglang.srt.mem_cache.storage.mmap.mmap_allocator")
    from peercache import _hicache
    import peercache.store as store
    report(_hicache.HiCacheStorage is hs.HiCacheStorage,
           "the shim's base class is this checkout's HiCacheStorage")
    report(issubclass(store.PeerCacheStore, hs.HiCacheStorage),
           "issubclass(PeerCacheStore, HiCacheStorage) (the factory's check)")
    base_methods = sorted(n for n, v in vars(hs.HiCacheStorage).items()
                          if callable(v) and not n.startswith("_"))
    inherited = [n for n in base_methods
                 if getattr(store.PeerCacheStore, n) is getattr(hs.HiCacheStorage, n)]
    report(not inherited, "every HiCacheStorage method is the shim's own",
           "inherited: %s" % ", ".join(inherited) if inherited else
           "%d methods" % len(base_methods))

    lines = launch_lines()
    report(bool(lines), "launch lines found in docs/sglang.md and README.md",
           "%d" % len(lines))
    node = Node()
    allocs = real_allocators(mm)
    staged_done = False
    try:
        for opt in lines:
            layout = opt.get("--hicache-mem-layout", "layer_first")
            io = opt.get("--hicache-io-backend", "kernel")
            mode = opt.get("--hicache-host-memory-mode", "cache")
            raw = opt["--hicache-storage-backend-extra-config"]
            tag = "%s/%s/%s" % (layout, io, mode)
            try:
                extra = json.loads(raw)
            except ValueError as e:
                report(False, "%s: extra-config is JSON" % tag, str(e))
                continue
            report(opt.get("--hicache-storage-backend") == "dynamic",
                   "%s: --hicache-storage-backend dynamic" % tag)
            report("--enable-hierarchical-cache" in opt["_args"],
                   "%s: --enable-hierarchical-cache" % tag)
            if mode == "buffer_only":
                # SGLang refuses buffer_only with write_back.
                report(opt.get("--hicache-write-policy", "write_through") != "write_back",
                       "%s: a write-through policy" % tag)
            if layout == "page_first_direct":
                report(io == "direct", "%s: page_first_direct with "
                       "--hicache-io-backend direct" % tag)
            if layout == "page_first":
                report(io == "kernel", "%s: page_first with the kernel io backend" % tag)
            check_moves(tag, extra, layout, node, allocs, hs, bf, store)
            if extra.get("allocator") == "shm" and not staged_done:
                # The same line without the key: SGLang's default allocator.
                staged_done = True
                plain = {k: v for k, v in extra.items() if k != "allocator"}
                check_moves(tag + " without \"allocator\"", plain, layout, node,
                            allocs, hs, bf, store)
                check_moves(tag + ", asymmetric K/V pool", extra, layout, node,
                            allocs, hs, bf, store, mm=mm)
    finally:
        node.stop()
    print("%d check(s) failed" % len(failures) if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
