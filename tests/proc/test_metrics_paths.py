"""The read counters on every path (issue 12, item 7): page bytes read through
a local session (libpeercache, as the SGLang shim reads), through kv.get and
from another node are all in peercache_bytes_read_total, with the page
counters beside it. Loads libpeercache into this process, so it runs with the
shim tests (tests/CMakeLists.txt: ASan runtime preloaded in that tree)."""
import ctypes
import os
import sys

from conftest import BUILD, RpcClient, metrics_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("PEERCACHE_LIBRARY", os.path.join(BUILD, "client", "libpeercache.so.0"))

from peercache.client import Client  # noqa: E402


def region_with(client, pages):
    rid, addr = client.region_create(sum(len(p) for p in pages))
    offs, off = [], 0
    for p in pages:
        ctypes.memmove(addr + off, p, len(p))
        offs.append(off)
        off += len(p)
    return rid, addr, offs


def test_every_read_path_counts_bytes(cluster, tmp_path):
    a, b = cluster(2)
    pages = [os.urandom(65536), os.urandom(40000), os.urandom(4096)]
    keys = [b"rd-%d" % i for i in range(len(pages))]
    lens = [len(p) for p in pages]
    total = sum(lens)
    ca = Client(a.endpoint("socket"))
    cb = Client(b.endpoint("socket"))
    try:
        rid, _, offs = region_with(ca, pages)
        assert ca.set(rid, keys, offs, lens) == [True] * 3
        ma = metrics_of(a)
        assert ma["peercache_bytes_written_total"] == total
        assert ma["peercache_write_pages_total"] == 3
        assert ma.get("peercache_bytes_read_total", 0) == 0
        # Local session read on the producer.
        rid2, addr2, _ = region_with(ca, [bytes(total)])
        assert ca.get(rid2, keys, offs, lens) == [True] * 3
        assert ctypes.string_at(addr2, total) == b"".join(pages)
        ma = metrics_of(a)
        assert ma["peercache_bytes_read_total"] == total
        assert ma["peercache_read_local_hits_total"] == 3
        # kv.get over RPC, same node: counted once more.
        err, got = RpcClient(a.endpoint("rpc")).call("kv.get", [[k.decode() for k in keys]])
        assert err is None and got == pages
        assert metrics_of(a)["peercache_bytes_read_total"] == 2 * total
        # Remote session read on the other node (a miss adds nothing).
        rid3, addr3, _ = region_with(cb, [bytes(total + 4096)])
        assert cb.get(rid3, keys + [b"absent"], offs + [total], lens + [4096]) == [True] * 3 + [False]
        assert ctypes.string_at(addr3, total) == b"".join(pages)
        mb = metrics_of(b)
        assert mb["peercache_bytes_read_total"] == total
        assert mb["peercache_read_remote_hits_total"] == 3
        assert mb["peercache_read_misses_total"] == 1
    finally:
        ca.close()
        cb.close()
