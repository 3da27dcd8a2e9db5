"""The registration kit: scripts/install-shim.sh installs the shim into a
temporary directory with Debian's Python alone, and a fresh interpreter that
sees only that directory imports it (with the libpeercache copied next to it)
and moves pages through a node; and SGLang's buffer_only host mode, where a
host slot is freed as soon as its set returns and reused at once, and the
existence query and the read sit on the TTFT path; and a host pool in two
shm allocations (SGLang's asymmetric K/V pool) shared as two regions."""
import json
import os
import subprocess
import sys

import pytest

import torch  # Debian's python3-torch (scripts/deps.sh test installs it)

from conftest import BUILD, ROOT  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("PEERCACHE_LIBRARY", os.path.join(BUILD, "client", "libpeercache.so.0"))

from fake_pools import AsymmetricMHAPool, MHAPool, MLAPool, indices  # noqa: E402
from peercache._hicache import HiCacheStorageConfig  # noqa: E402
from peercache.store import PeerCacheStore  # noqa: E402

INSTALL = os.path.join(ROOT, "scripts", "install-shim.sh")
LIB = os.path.join(BUILD, "client", "libpeercache.so.0")

# Run by a fresh interpreter whose path holds the install directory and the
# fake pools only: the package and the library must come from the install.
USE_INSTALLED = r"""
import importlib, importlib.metadata, json, os, sys
site, socket_path = sys.argv[1], sys.argv[2]
import peercache, peercache.client, peercache.store
from fake_pools import MHAPool, indices
from peercache._hicache import HiCacheStorageConfig
assert peercache.__file__.startswith(site + os.sep), peercache.__file__
cfg = HiCacheStorageConfig(model_name="kit/model")
cfg.extra_config = {"backend_name": "peercache", "module_path": "peercache.store",
                    "class_name": "PeerCacheStore", "interface_v1": 1,
                    "allocator": "shm", "socket": socket_path}
# As SGLang's StorageBackendFactory loads a dynamic backend:
cls = getattr(importlib.import_module("peercache.store"), "PeerCacheStore")
store = cls(cfg, {})
a, b = MHAPool("page_first", shm=True), MHAPool("page_first", shm=True)
store.register_mem_pool_host(a)
n = 8
for p in range(n):
    a.fill_page(p, 100 + p)
keys = ["k%063d" % i for i in range(n)]
set_ok = store.batch_set_v1(keys, indices(n, a.page_size))
exists = store.batch_exists(keys)
store.register_mem_pool_host(b)
get_ok = store.batch_get_v1(keys, indices(n, b.page_size))
same = all(a.page_bytes(p) == b.page_bytes(p) for p in range(n))
store.close()
print(json.dumps({"version": importlib.metadata.version("peercache"),
                  "lib": peercache.client.library()._name, "set": set_ok,
                  "exists": exists, "get": get_ok, "same": same,
                  "shared": store._region is not None}))
"""


def install(*args):
    return subprocess.run([INSTALL] + list(args), capture_output=True, text=True,
                          timeout=120)


def test_install_into_a_tempdir_then_import_and_move_pages(node_factory, tmp_path):
    site = str(tmp_path / "site")
    r = install("--target", site, "--python", "/usr/bin/python3", "--with-lib", LIB)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == site
    files = sorted(os.listdir(os.path.join(site, "peercache")))
    assert "store.py" in files and "libpeercache.so.0" in files and "__pycache__" in files
    record = open(os.path.join(site, "peercache-0.1.0.dist-info", "RECORD")).read()
    assert "peercache/store.py,sha256=" in record
    # Installing again replaces the copy; the source tree stays clean.
    r = install("--target", site, "--with-lib", LIB)
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(os.path.join(ROOT, "python", "build"))

    node = node_factory("--pool-size", "64mb")
    node.wait_for("ready")
    # This process's environment (the sanitizer tree's LD_PRELOAD and
    # ASAN_OPTIONS included) minus every PEERCACHE_* setting: the library
    # must be found next to the installed package.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERCACHE_")}
    env.update(PYTHONPATH=site + os.pathsep + os.path.dirname(__file__),
               PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run(["/usr/bin/python3", "-s", "-c", USE_INSTALLED,
                        site, node.endpoint("socket")],
                       capture_output=True, text=True, cwd=str(tmp_path), env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["version"] == "0.1.0"
    assert out["lib"] == os.path.join(site, "peercache", "libpeercache.so.0")
    assert out["set"] == [True] * 8 and out["exists"] == 8 and out["get"] == [True] * 8
    assert out["same"] and out["shared"]
    assert node.stop() == 0


def test_install_user_site(tmp_path):
    """--user: the interpreter's user site of $HOME, importable without
    PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERCACHE_")}
    env["HOME"] = str(tmp_path)
    r = subprocess.run([INSTALL, "--user"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(str(tmp_path) + os.sep)
    r = subprocess.run(["/usr/bin/python3", "-c",
                        "import peercache, importlib.metadata as m; "
                        "print(peercache.__file__, m.version('peercache'))"],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path),
                       timeout=60)
    assert r.returncode == 0, r.stderr
    path, version = r.stdout.split()
    assert path.startswith(str(tmp_path) + os.sep) and version == "0.1.0"


def test_install_refuses_bad_arguments(tmp_path):
    r = install("--target")
    assert r.returncode != 0 and "--target needs" in r.stderr
    r = install("--bogus")
    assert r.returncode != 0 and "unknown argument" in r.stderr
    r = install("--target", str(tmp_path / "x"), "--with-lib", str(tmp_path / "nope.so"))
    assert r.returncode != 0 and "no library" in r.stderr
    assert not os.path.exists(str(tmp_path / "x" / "peercache"))


def shim(node, mla=False):
    cfg = HiCacheStorageConfig(is_mla_model=mla, model_name="kit/model")
    cfg.extra_config = {"interface_v1": 1, "allocator": "shm",
                        "socket": node.endpoint("socket")}
    return PeerCacheStore(cfg, {})


@pytest.mark.parametrize("shm", [True, False], ids=["memfd", "staging"])
@pytest.mark.parametrize("layout", ["page_first", "page_first_direct"])
def test_buffer_only_slots_reused_right_after_set(cluster, layout, shm):
    """buffer_only: the host pool is a staging buffer. A set's slots are freed
    when it returns and refilled by the next request at once; later the
    existence query and the read (the TTFT path) bring the pages back into
    whatever slots are free, on this node and from the other one."""
    a, b = cluster(2, "--pool-size", "128mb")
    pa, pb = MHAPool(layout, pages=8, shm=shm), MHAPool(layout, pages=8, shm=shm)
    sa, sb = shim(a), shim(b)
    sa.register_mem_pool_host(pa)
    sb.register_mem_pool_host(pb)
    want = {}
    rounds, per = 4, 6  # 24 pages through 8 slots
    for r in range(rounds):
        keys = ["r%d-%060d" % (r, i) for i in range(per)]
        for p in range(per):
            pa.fill_page(p, 1000 * r + p)
            want[keys[p]] = pa.page_bytes(p)
        assert sa.batch_set_v1(keys, indices(per, pa.page_size)) == [True] * per
        # Freed and refilled by the next request before anything reads them.
        for p in range(per):
            pa.fill_page(p, 999999 - p)
    all_keys = list(want)
    for s, pool in ((sa, pa), (sb, pb)):
        assert s.batch_exists(all_keys) == len(all_keys)
        for r in range(rounds):
            keys = all_keys[r * per:(r + 1) * per]
            # Into slots 2..7: not where the pages were written from.
            idx = torch.arange(2 * pool.page_size, (2 + per) * pool.page_size,
                               dtype=torch.int64)
            assert s.batch_get_v1(keys, idx) == [True] * per
            for i, k in enumerate(keys):
                assert pool.page_bytes(i + 2) == want[k], "%s differs" % k
    # A prefix the node never saw: the query stops at the first missing page.
    assert sb.batch_exists(all_keys[:3] + ["missing%057d" % 0] + all_keys[3:]) == 3
    for s in (sa, sb):
        s.close()
    for nd in (a, b):
        assert nd.stop() == 0


def test_buffer_only_mla_rank1_reads_what_rank0_wrote(cluster):
    """buffer_only with MLA at TP 2: rank 0 writes, rank 1's set is a no-op
    that says True, and both ranks' existence queries and reads agree (the
    controller takes the MIN across ranks)."""
    (a,) = cluster(1, "--pool-size", "64mb")
    cfgs = []
    for rank in (0, 1):
        cfg = HiCacheStorageConfig(tp_rank=rank, tp_size=2, is_mla_model=True,
                                   model_name="kit/model")
        cfg.extra_config = {"interface_v1": 1, "allocator": "shm",
                            "socket": a.endpoint("socket")}
        cfgs.append(cfg)
    s0, s1 = PeerCacheStore(cfgs[0], {}), PeerCacheStore(cfgs[1], {})
    p0, p1 = MLAPool("page_first", pages=8, shm=True), MLAPool("page_first", pages=8, shm=True)
    s0.register_mem_pool_host(p0)
    s1.register_mem_pool_host(p1)
    n = 5
    keys = ["m%063d" % i for i in range(n)]
    for p in range(n):
        p0.fill_page(p, 7 + p)
    want = [p0.page_bytes(p) for p in range(n)]
    assert s1.batch_set_v1(keys, indices(n, p1.page_size)) == [True] * n
    assert s0.batch_set_v1(keys, indices(n, p0.page_size)) == [True] * n
    for p in range(n):
        p0.fill_page(p, 5000 + p)
    assert s0.batch_exists(keys) == s1.batch_exists(keys) == n
    for s, pool in ((s0, p0), (s1, p1)):
        assert s.batch_get_v1(keys, indices(n, pool.page_size)) == [True] * n
        assert [pool.page_bytes(p) for p in range(n)] == want
    s0.close()
    s1.close()
    assert a.stop() == 0


@pytest.mark.parametrize("shm", [True, False], ids=["memfd", "staging"])
@pytest.mark.parametrize("layout", ["page_first", "page_first_direct"])
def test_asymmetric_pool_shared_as_two_regions(cluster, layout, shm):
    """K and V in two memfds are shared as two regions (no staged byte);
    without descriptors the same pool is staged; pages cross nodes
    byte-identical either way."""
    a, b = cluster(2, "--pool-size", "64mb")
    pa, pb = AsymmetricMHAPool(layout, shm=shm), AsymmetricMHAPool(layout, shm=shm)
    sa, sb = shim(a), shim(b)
    sa.register_mem_pool_host(pa)
    sb.register_mem_pool_host(pb)
    assert len(sa._regions) == (2 if shm else 0)
    n = 6
    keys = ["asym-%s-%053d" % (layout, i) for i in range(n)]
    for p in range(n):
        pa.fill_page(p, 300 + p)
    assert sa.batch_set_v1(keys, indices(n, pa.page_size)) == [True] * n
    assert sb.batch_exists(keys) == n
    assert sb.batch_get_v1(keys, indices(n, pb.page_size)) == [True] * n
    for p in range(n):
        assert pb.page_bytes(p) == pa.page_bytes(p), "page %d differs" % p
    staged = sa.stats()["staged_bytes"] + sb.stats()["staged_bytes"]
    assert (staged == 0) if shm else (staged > 0)
    for s in (sa, sb):
        s.close()
    for nd in (a, b):
        assert nd.stop() == 0
