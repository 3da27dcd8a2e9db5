"""The SGLang shim's v2 interface (hybrid models) against real nodes, with
the sidecar stand-ins of fake_pools_v2.py: for every pool kind (Mamba with
per-page pointers and with flat uint8 pages only, the DSA indexer sharing
KV's indices, SWA, DeepSeek-V4's multi-buffer pools on a logical anchor,
the MTP draft pool) pages written through node A are found by
batch_exists_v2 on node B with the restorable stop points an independent
oracle computes, and read back byte-identical; TP=2 MLA ranks see identical
hits; an unsupported pool is a logged miss, once; the call order of the
contract; three threads in each of two processes."""
import logging
import multiprocessing
import os
import sys
import threading
import time

import pytest
import torch

from conftest import BUILD  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("PEERCACHE_LIBRARY", os.path.join(BUILD, "client", "libpeercache.so.0"))

from fake_pools import MHAPool, MLAPool  # noqa: E402
from fake_pools_v2 import LogicalAnchor, MambaPool, MultiBufferPool  # noqa: E402
from peercache._hicache import HiCacheStorageConfig, PoolTransfer  # noqa: E402
from peercache.store import PeerCacheStore  # noqa: E402

N = 12
ENDS = (4, 8, 12)  # node ends: where trailing pools hold their window


def shim(node, mla=False, tp_rank=0, tp_size=1, **extra):
    cfg = HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, is_mla_model=mla,
                               model_name="test/hybrid")
    cfg.extra_config = {"backend_name": "peercache", "interface_v1": 1,
                        "socket": node.endpoint("socket"), **extra}
    return PeerCacheStore(cfg, {})


def hashes(n, tag):
    return ["%s%063d" % (tag, i) for i in range(n)]


def slots(pages, page_size):
    return torch.cat([torch.arange(p * page_size, (p + 1) * page_size)
                      for p in pages]) if pages else torch.zeros(0, dtype=torch.int64)


class Spec:
    """One sidecar pool of a scenario."""

    def __init__(self, name, make, policy="all_pages", window=1, from_kv=False):
        self.name, self.make, self.policy = name, make, policy
        self.window, self.from_kv = window, from_kv

    def written(self):
        if self.policy == "all_pages":
            return list(range(N))
        return sorted({p for e in ENDS for p in range(e - self.window, e)})

    def transfer(self, keys_all, pages, pool):
        return PoolTransfer(name=self.name, keys=[keys_all[p] for p in pages],
                            host_indices=slots(pages, pool.page_size),
                            hit_policy=self.policy,
                            indices_from_pool="kv" if self.from_kv else None)


SCENARIOS = {
    "mamba": (lambda: MHAPool("page_first"), False,
              [Spec("mamba", lambda: MambaPool(), "trailing_pages", 1)]),
    "mamba-flat-conv-only": (lambda: MHAPool("page_first"), False,
                             [Spec("mamba", lambda: MambaPool("layer_first", temporal=(0,)),
                                   "trailing_pages", 1)]),
    "dsa-indexer": (lambda: MLAPool("page_first"), True,
                    [Spec("indexer", lambda: MultiBufferPool(16, buffers=((132, torch.uint8),)),
                          "all_pages", from_kv=True)]),
    "swa": (lambda: MHAPool("page_first"), False,
            [Spec("swa", lambda: MHAPool("page_first", layer_num=2, shm=False),
                  "trailing_pages", 2)]),
    "deepseek-v4": (lambda: LogicalAnchor(16), True,
                    [Spec("deepseek_v4_c4", lambda: MultiBufferPool(
                        4, buffers=((64, torch.uint8), (2, torch.float32)))),
                     Spec("deepseek_v4_c4_state", lambda: MultiBufferPool(
                         1, buffers=((48, torch.float32), (8, torch.bfloat16))),
                         "trailing_pages", 1)]),
    "mtp-draft": (lambda: MHAPool("page_first"), False,
                  [Spec("draft", lambda: MHAPool("page_first", layer_num=1, shm=False))]),
}


def oracle(specs, kv_pages):
    """Restorable stop points, computed directly from what was written."""
    out = []
    for p in range(1, kv_pages + 1):
        ok = True
        for s in specs:
            need = range(0, p) if s.policy == "all_pages" else range(p - min(s.window, p), p)
            ok = ok and set(need) <= set(s.written())
        if ok:
            out.append(p)
    return out


def attach(s, kv, sidecars):
    s.register_mem_pool_host(kv)
    s.register_mem_host_pool_v2(kv, "kv")  # the anchor: ignored
    for spec, pool in sidecars:
        s.register_mem_host_pool_v2(pool, spec.name)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_pool_kind_cross_node_byte_identical(cluster, scenario):
    make_kv, mla, specs = SCENARIOS[scenario]
    a, b = cluster(2, "--pool-size", "128mb")
    keys = hashes(N, scenario[:6])
    ka, kb = make_kv(), make_kv()
    ca = [(s, s.make()) for s in specs]
    cb = [(s, s.make()) for s in specs]
    sa, sb = shim(a, mla), shim(b, mla)
    attach(sa, ka, ca)
    attach(sb, kb, cb)
    logical = ka.kv_buffer is None
    for p in range(N):
        if not logical:
            ka.fill_page(p, 1000 + p)
        for i, (spec, pool) in enumerate(ca):
            pool.fill_page(p, 7 * p + i)
    # Backup: sidecars and KV in one v2 call (the shim orders them).
    kv_t = PoolTransfer(name="kv", keys=keys, host_indices=slots(range(N), ka.page_size))
    res = sa.batch_set_v2([s.transfer(keys, s.written(), p) for s, p in ca] + [kv_t])
    for spec, _ in ca:
        assert res[spec.name] == [True] * len(spec.written()), (spec.name, res)
    assert res["kv"] == [True] * N

    # Node B: restorable stop points match the oracle, with and without a
    # KV hole at page 9.
    for kv_pages, query in ((N, keys + ["z" * 64]), (9, keys[:9] + ["y" * 64] + keys[10:])):
        ts = [PoolTransfer(name=s.name, keys=query[:s.window], hit_policy=s.policy)
              for s in specs]
        r = sb.batch_exists_v2(query, ts)
        want = oracle(specs, kv_pages)
        assert r.restorable_prefix_pages == want, (kv_pages, r)
        assert r.kv_hit_pages == (want[-1] if want else 0)
        for s in specs:
            assert r.extra_pool_hit_pages[s.name] == oracle([s], kv_pages)[-1]
    # Read what the hit allows and compare every byte with node A's pools.
    final = oracle(specs, N)[-1]
    assert sb.batch_get_v1(keys[:final], slots(range(final), kb.page_size)) == [True] * final
    gets = []
    for spec, pool in cb:
        pages = list(range(final)) if spec.policy == "all_pages" else \
            list(range(final - spec.window, final))
        gets.append((spec, pool, pages))
    got = sb.batch_get_v2([s.transfer(keys, pages, pool) for s, pool, pages in gets])
    for (spec, pool, pages), (_, src) in zip(gets, ca):
        assert got[spec.name] == [True] * len(pages), (spec.name, got)
        for p in pages:
            assert pool.page_bytes(p) == src.page_bytes(p), (spec.name, p)
    if not logical:
        for p in range(final):
            assert kb.page_bytes(p) == ka.page_bytes(p), "KV page %d differs" % p
    for s in (sa, sb):
        s.close()
    for nd in (a, b):
        assert nd.stop() == 0


def test_tp2_mla_ranks_see_identical_hits(cluster):
    (a,) = cluster(1, "--pool-size", "128mb")
    keys = hashes(N, "tp2")
    idx = Spec("indexer", lambda: MultiBufferPool(16, buffers=((132, torch.uint8),)),
               from_kv=True)
    mamba = Spec("mamba", lambda: MambaPool(), "trailing_pages", 1)
    ranks = []
    for r in range(2):
        s = shim(a, mla=True, tp_rank=r, tp_size=2)
        kv, ip, mp = MLAPool(), idx.make(), mamba.make()
        attach(s, kv, [(idx, ip), (mamba, mp)])
        for p in range(N):
            kv.fill_page(p, 50 + p)           # replicated: same bytes on every rank
            ip.fill_page(p, 90 + p)
            mp.fill_page(p, 1000 * (r + 1) + p)  # sharded: each rank its own
        ranks.append((s, kv, ip, mp))
    for s, kv, ip, mp in ranks:  # the controller's backup on every rank
        res = s.batch_set_v2([idx.transfer(keys, range(N), ip),
                              mamba.transfer(keys, mamba.written(), mp),
                              PoolTransfer(name="kv", keys=keys,
                                           host_indices=slots(range(N), kv.page_size))])
        assert all(all(v) for v in res.values()), res
    ts = [PoolTransfer(name="indexer", keys=keys[:1], hit_policy="all_pages"),
          PoolTransfer(name="mamba", keys=keys[:1], hit_policy="trailing_pages")]
    seen = [(s.batch_exists(keys), s.batch_exists_v2(keys, ts)) for s, *_ in ranks]
    assert seen[0][0] == seen[1][0] == N
    r0, r1 = seen[0][1], seen[1][1]
    assert r0.restorable_prefix_pages == r1.restorable_prefix_pages == list(ENDS)
    assert r0.kv_hit_pages == r1.kv_hit_pages == N
    assert r0.extra_pool_hit_pages == r1.extra_pool_hit_pages
    # Rank 1 reads fresh pools: the replicated pages are rank 0's, the
    # Mamba state its own.
    s1 = shim(a, mla=True, tp_rank=1, tp_size=2)
    kv, ip, mp = MLAPool(), idx.make(), mamba.make()
    attach(s1, kv, [(idx, ip), (mamba, mp)])
    assert s1.batch_get_v1(keys, slots(range(N), kv.page_size)) == [True] * N
    got = s1.batch_get_v2([idx.transfer(keys, range(N), ip),
                           mamba.transfer(keys, [N - 1], mp)])
    assert got == {"indexer": [True] * N, "mamba": [True]}
    src0, src1 = ranks[0], ranks[1]
    for p in range(N):
        assert kv.page_bytes(p) == src0[1].page_bytes(p)
        assert ip.page_bytes(p) == src0[2].page_bytes(p)
    assert mp.page_bytes(N - 1) == src1[3].page_bytes(N - 1) != src0[3].page_bytes(N - 1)
    for s, *_ in ranks + [(s1,)]:
        s.close()
    assert a.stop() == 0


def test_unsupported_pool_is_a_logged_miss_once(cluster, caplog):
    (a,) = cluster(1, "--pool-size", "64mb")
    s = shim(a)
    kv = MHAPool("page_first")
    s.register_mem_pool_host(kv)
    keys = hashes(4, "un")
    assert s.batch_set_v1(keys, slots(range(4), kv.page_size)) == [True] * 4
    with caplog.at_level(logging.WARNING, logger="peercache"):
        s.register_mem_host_pool_v2(object(), "mamba")  # nothing to address
        for _ in range(3):
            ts = [PoolTransfer(name="mamba", keys=keys[:1], hit_policy="trailing_pages",
                               host_indices=torch.arange(1)),
                  PoolTransfer(name="never_registered", keys=keys[:1],
                               host_indices=torch.arange(1))]
            r = s.batch_exists_v2(keys, ts)
            assert r.kv_hit_pages == 0 and r.restorable_prefix_pages == []
            assert s.batch_get_v2(ts) == {"mamba": [False], "never_registered": [False]}
            assert s.batch_set_v2(ts) == {"mamba": [False], "never_registered": [False]}
    text = caplog.text
    assert text.count("sidecar pool mamba is not supported") == 1, text
    assert text.count("never_registered was never registered") == 1, text
    # A malformed transfer is a miss, not an exception.
    bad = PoolTransfer(name="kv", keys=keys, host_indices=torch.arange(3))
    assert s.batch_get_v2([bad]) == {"kv": [False] * 4}
    assert s.batch_exists_v2(None, None).kv_hit_pages == 0
    s.close()
    assert a.stop() == 0


def test_call_order_sidecars_before_kv_and_after_a_complete_kv_read(cluster):
    (a,) = cluster(1, "--pool-size", "64mb")
    s = shim(a)
    kv, mp, ip = MHAPool("page_first"), MambaPool(), MultiBufferPool(16)
    mamba = Spec("mamba", None, "trailing_pages", 1)
    idx = Spec("indexer", None, from_kv=True)
    attach(s, kv, [(mamba, mp), (idx, ip)])
    keys = hashes(6, "ord")
    order = []
    real_io, real_set = s._sidecar_io, s._set_v1
    s._sidecar_io = lambda *a_: order.append("sidecars") or real_io(*a_)
    s._set_v1 = lambda *a_: order.append("kv") or real_set(*a_)
    s.batch_set_v2([PoolTransfer(name="kv", keys=keys, host_indices=slots(range(6), 16)),
                    mamba.transfer(keys, [5], mp), idx.transfer(keys, range(6), ip)])
    assert order == ["sidecars", "kv"]
    for p in range(6):
        mp.fill_page(p, 77)
    # KV incomplete (page 3 unknown): the indexer is clamped to the KV hit,
    # the Mamba state is not read at all.
    holed = keys[:3] + ["q" * 64] + keys[4:]
    got = s.batch_get_v2([PoolTransfer(name="kv", keys=holed, host_indices=slots(range(6), 16)),
                          mamba.transfer(keys, [5], mp), idx.transfer(holed, range(6), ip)])
    assert got["kv"] == [True] * 3 + [False] * 3
    assert got["indexer"] == [True] * 3 + [False] * 3
    assert got["mamba"] == [False]
    before = mp.page_bytes(5)
    got = s.batch_get_v2([PoolTransfer(name="kv", keys=holed, host_indices=slots(range(6), 16)),
                          mamba.transfer(keys, [5], mp)])
    assert mp.page_bytes(5) == before, "a non-KV sidecar was read after an incomplete KV read"
    s.close()
    assert a.stop() == 0


def _v2_worker(sock, tag, seconds, out):
    sys.path.insert(0, os.path.join(ROOT, "python"))
    s = None
    counts = {"exists": 0, "get": 0, "set": 0, "errors": 0}
    try:
        cfg = HiCacheStorageConfig(model_name="test/hybrid")
        cfg.extra_config = {"interface_v1": 1, "socket": sock}
        s = PeerCacheStore(cfg, {})
        kv, mp, ip = MHAPool("page_first", pages=32), MambaPool(size=32), MultiBufferPool(16, 32)
        mamba = Spec("mamba", None, "trailing_pages", 1)
        idx = Spec("indexer", None, from_kv=True)
        attach(s, kv, [(mamba, mp), (idx, ip)])
        keys = hashes(32, tag)
        stop = time.time() + seconds

        def loop(kind):
            i = 0
            while time.time() < stop:
                i += 1
                n = 1 + i % 32
                try:
                    ts = [PoolTransfer(name="kv", keys=keys[:n],
                                       host_indices=slots(range(n), 16)),
                          mamba.transfer(keys, [n - 1], mp),
                          idx.transfer(keys, range(n), ip)]
                    if kind == "exists":
                        r = s.batch_exists_v2(keys[:n], ts[1:])
                        assert 0 <= r.kv_hit_pages <= n
                    else:
                        r = (s.batch_set_v2 if kind == "set" else s.batch_get_v2)(ts)
                        assert sorted(r) == ["indexer", "kv", "mamba"], r
                        assert len(r["kv"]) == n and len(r["mamba"]) == 1
                        if kind == "set":
                            assert all(all(v) for v in r.values()), r
                    counts[kind] += 1
                except Exception as e:  # counted: the test fails on any
                    counts["errors"] += 1
                    print("worker error:", repr(e))

        ts = [threading.Thread(target=loop, args=(k,)) for k in ("exists", "get", "set")]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        if s is not None:
            s.close()
        out.put(counts)


def test_v2_three_threads_in_two_processes(cluster):
    (a,) = cluster(1, "--pool-size", "128mb")
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_v2_worker, args=(a.endpoint("socket"), "w%d" % i, 3, out))
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


def test_long_sparse_trailing_query_matches_the_oracle(cluster):
    """A long query (probed in parallel segments) over a sparse trailing
    pool and a window of 2: every legal stop point, no other."""
    (a,) = cluster(1, "--pool-size", "128mb")
    n = 600
    s = shim(a)
    kv = MHAPool("page_first", page_size=4, pages=n, layer_num=1, head_num=1, head_dim=8)
    mp = MambaPool(size=n, layers=1, temporal=(2,), conv=((2,),))
    spec = Spec("mamba", None, "trailing_pages", 2)
    attach(s, kv, [(spec, mp)])
    keys = hashes(n, "long")
    states = sorted({p for e in range(7, n + 1, 7) for p in (e - 2, e - 1)} | {100, 333})
    for at in range(0, n, 128):
        part = list(range(at, min(at + 128, n)))
        assert s.batch_set_v1([keys[p] for p in part], slots(part, 4)) == [True] * len(part)
    assert s.batch_set_v2([spec.transfer(keys, states, mp)]) == {"mamba": [True] * len(states)}
    r = s.batch_exists_v2(keys, [PoolTransfer(name="mamba", keys=keys[:2],
                                              hit_policy="trailing_pages")])
    have = set(states)
    want = [p for p in range(1, n + 1) if {p - min(2, p), p - 1} <= have]
    assert r.restorable_prefix_pages == want and r.kv_hit_pages == want[-1]
    s.close()
    assert a.stop() == 0
