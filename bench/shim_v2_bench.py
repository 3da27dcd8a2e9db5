"""bench/shim_v2_bench.py — the SGLang shim's v2 existence query, timed.

Run: /usr/bin/python3 bench/shim_v2_bench.py (PEERCACHE_BUILD_DIR, default
build/). One peercached node on a private Unix socket; a PeerCacheStore with
an MHA page_first KV pool, a DSA-indexer-like pool (all_pages, indices of
KV) and a Mamba pool (trailing_pages, one state per node end). PAGES pages
are backed up with a Mamba state every NODE pages (node ends); then, RUNS
times, batch_exists_v2 over all PAGES keys (the hybrid controller's one
unchunked query on the prefetch thread): the all_pages pool costs one
leading-run query, the sparse trailing pool about one per missing state.
Prints min/median/max milliseconds. Only the local socket is used; the node
is stopped by PID on exit.
"""
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "proc"))
sys.path.insert(0, os.path.join(REPO, "python"))
BUILD = os.environ.get("PEERCACHE_BUILD_DIR", os.path.join(REPO, "build"))
os.environ.setdefault("PEERCACHE_LIBRARY", os.path.join(BUILD, "client", "libpeercache.so.0"))

import torch  # noqa: E402
from conftest import Node  # noqa: E402
from fake_pools import MHAPool  # noqa: E402
from fake_pools_v2 import MambaPool, MultiBufferPool  # noqa: E402
from peercache._hicache import HiCacheStorageConfig, PoolTransfer  # noqa: E402
from peercache.store import PeerCacheStore  # noqa: E402

PAGES = int(os.environ.get("PAGES", "1024"))
NODE = int(os.environ.get("NODE", "16"))
RUNS = int(os.environ.get("RUNS", "20"))


def main():
    work = tempfile.mkdtemp(prefix="pc-shim-v2-bench-")
    sock = os.path.join(work, "node.sock")
    node = Node(["--rpc-port", "0", "--data-port", "0", "--meta-port", "0",
                 "--metrics-port", "0", "--threads", "2", "--pool-prefault", "false",
                 "--pool-size", "512mb", "--socket", sock], tmpdir=work)
    try:
        node.wait_for("ready")
        cfg = HiCacheStorageConfig(model_name="bench/hybrid")
        cfg.extra_config = {"interface_v1": 1, "socket": sock}
        s = PeerCacheStore(cfg, {})
        kv = MHAPool("page_first", page_size=16, pages=PAGES, layer_num=2, head_num=1,
                     head_dim=64)
        ip = MultiBufferPool(16, PAGES, buffers=((132, torch.uint8),))
        mp = MambaPool(size=PAGES)
        s.register_mem_pool_host(kv)
        s.register_mem_host_pool_v2(ip, "indexer")
        s.register_mem_host_pool_v2(mp, "mamba")
        keys = ["b%063d" % i for i in range(PAGES)]
        ends = list(range(NODE - 1, PAGES, NODE))
        for at in range(0, PAGES, 128):
            part = keys[at:at + 128]
            idx = torch.arange(at * 16, (at + len(part)) * 16)
            mine = [e for e in ends if at <= e < at + 128]
            r = s.batch_set_v2([
                PoolTransfer(name="indexer", keys=part, host_indices=idx,
                             indices_from_pool="kv"),
                PoolTransfer(name="mamba", keys=[keys[e] for e in mine],
                             host_indices=torch.tensor(mine, dtype=torch.int64)),
                PoolTransfer(name="kv", keys=part, host_indices=idx)])
            assert all(all(v) for v in r.values()), r
        ts = [PoolTransfer(name="indexer", keys=keys[:1], hit_policy="all_pages"),
              PoolTransfer(name="mamba", keys=keys[:1], hit_policy="trailing_pages")]
        times = []
        for _ in range(RUNS):
            t0 = time.perf_counter()
            r = s.batch_exists_v2(keys, ts)
            times.append((time.perf_counter() - t0) * 1000)
            assert r.kv_hit_pages == ends[-1] + 1, r.kv_hit_pages
        print("batch_exists_v2: %d pages, a Mamba state every %d: "
              "min %.2f / median %.2f / max %.2f ms (%d runs)"
              % (PAGES, NODE, min(times), statistics.median(times), max(times), RUNS))
        s.close()
    finally:
        node.stop()


if __name__ == "__main__":
    main()
