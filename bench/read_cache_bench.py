"""bench/read_cache_bench.py — the directory read cache
(directory_read_cache_ttl) on SGLang's read path, off against on.

Run through bench/read_cache_bench.sh (which checks the tools and builds what
is missing). Three peercached nodes on loopback name each other as peers
(so a key's directory owner is any of them): A produces, B reads with the
read cache off, C reads with it on (TTL seconds). A PeerCacheStore shim is
attached to each, with a shared-memory (memfd) MLA host pool of BATCH pages.
For each page size, RUNS rounds of:
  set       shim A batch_set_v1 of REPS batches of new keys
  then, batch by batch, B and C in turn (which first alternates each
  batch, so that the machine's load drifts over both alike):
  prefetch  batch_exists, then batch_get_v1 of the keys it reported — what
            SGLang's prefetch does with a storage backend
  re-read   batch_get_v1 of the same keys again (a prefix read twice)
GB/s is page bytes over the time of the op's batches. Ratios C/B are paired
per round: min/median/max. The last page of each batch is checked byte for
byte on both readers. C's cache counters (hits, misses, stale) are read per
round; B's must stay absent (its cache is off).

Prints a markdown table on stdout, progress on stderr, and every round plus
the summary to RESULTS_DIR/read-cache-<timestamp>.json. Only 127.0.0.1 is
contacted; every node is stopped by PID on exit.
"""
import ctypes
import os
import statistics
import sys
import time

from shim_bench_common import BUILD, Nodes, mla_shim, parse_sizes, save_results, timed  # paths first

import torch  # noqa: E402
from conftest import free_ports, metrics_of  # noqa: E402
from fake_pools import MLAPool, indices  # noqa: E402

# An MLA page_first page is page_size x layers x kv_cache_dim x 2 bytes.
GEOMETRY = {64 << 10: (4, 16, 512), 256 << 10: (16, 16, 512),
            1 << 20: (64, 16, 512)}

env = os.environ
SIZES = parse_sizes("read_cache_bench", env.get("SIZES", "64k 256k"), GEOMETRY)
RUNS = int(env.get("RUNS", "5"))
BATCH = int(env.get("BATCH", "32"))
REP_MB = int(env.get("REP_MB", "128"))
TTL = env.get("TTL", "30s")
NODE_THREADS = env.get("NODE_THREADS", "2")
RESULTS_DIR = env.get("RESULTS_DIR", os.path.join(BUILD, "bench-results"))
if RUNS < 1 or BATCH < 1 or BATCH > 1024 or REP_MB < 1:
    raise SystemExit("read_cache_bench: RUNS, BATCH (1..1024) and REP_MB must be positive")

NODES = Nodes("pc-read-cache-bench-", NODE_THREADS)
CACHE_KEYS = ("peercache_read_cache_hits_total", "peercache_read_cache_misses_total",
              "peercache_read_cache_stale_total")


def log(msg):
    print("read_cache_bench: " + msg, file=sys.stderr, flush=True)


def cache_counters(nd):
    m = metrics_of(nd)
    return {k: m.get(k) for k in CACHE_KEYS}


def reps_for(size):
    """Batches per round: at least REP_MB MiB, at least 2."""
    return max(2, -(-(REP_MB << 20) // (BATCH * size)))


def spread(xs):
    return (statistics.median(xs), min(xs), max(xs))


def fmt(s):
    return "%.2f (%.2f-%.2f)" % s


def read_batch(st, batch, idx, size, ptr_src, ptr_dst):
    """prefetch, then re-read, of one batch by one reader: their seconds."""
    ctypes.memset(ptr_dst[BATCH - 1], 0, size)

    def prefetch():
        n = st.batch_exists(batch)
        return n, st.batch_get_v1(batch, idx) if n == BATCH else []
    t_pre, (n, ok) = timed(prefetch)
    if n != BATCH or ok != [True] * BATCH:
        raise SystemExit("read_cache_bench: prefetch found %d, read %d of %d"
                         % (n, sum(ok), BATCH))
    if ctypes.string_at(ptr_dst[BATCH - 1], size) != \
            ctypes.string_at(ptr_src[BATCH - 1], size):
        raise SystemExit("read_cache_bench: a page read is not byte-identical")
    t_again, ok = timed(lambda: st.batch_get_v1(batch, idx))
    if ok != [True] * BATCH:
        raise SystemExit("read_cache_bench: re-read missed %d pages" % ok.count(False))
    return t_pre, t_again


def bench_size(size, a, b, c):
    page_size, layers, dim = GEOMETRY[size]
    reps = reps_for(size)
    log("page %d KiB: %d pages per batch, %d batches per round" % (size >> 10, BATCH, reps))
    pools = [MLAPool("page_first", page_size=page_size, pages=BATCH, layer_num=layers,
                     kv_cache_dim=dim) for _ in range(3)]
    shims = [mla_shim(n) for n in (a, b, c)]
    for s, p in zip(shims, pools):
        p.kv_buffer.view(torch.uint8).view(-1)[::4096].fill_(1)  # touch
        s.register_mem_pool_host(p)
    idx = indices(BATCH, page_size)
    ptrs = [p.get_page_buffer_meta(idx)[0] for p in pools]
    rounds = []
    for run in range(RUNS):
        keys = [["rc%d-b%d-s%d-%058d" % (run, rep, size, i) for i in range(BATCH)]
                for rep in range(reps)]
        ctypes.memset(ptrs[0][BATCH - 1], run + 1, size)
        for batch in keys:
            ok = shims[0].batch_set_v1(batch, idx)
            if ok != [True] * BATCH:
                raise SystemExit("read_cache_bench: set stored %d of %d" % (sum(ok), BATCH))
        r = {"run": run + 1}
        c0 = cache_counters(c)
        # Batch by batch, each reader in turn (who goes first alternates),
        # so that the machine's load drifts over both alike.
        t = {1: [0.0, 0.0], 2: [0.0, 0.0]}
        for k, batch in enumerate(keys):
            for who in ((1, 2) if (run + k) % 2 == 0 else (2, 1)):
                pre, again = read_batch(shims[who], batch, idx, size, ptrs[0],
                                        ptrs[who])
                t[who][0] += pre
                t[who][1] += again
        moved = len(keys) * BATCH * size / 1e9
        for who, name in ((1, "off"), (2, "on")):
            r["prefetch_" + name] = moved / t[who][0]
            r["reread_" + name] = moved / t[who][1]
        c1 = cache_counters(c)
        r["cache"] = {k.replace("peercache_read_cache_", ""): c1[k] - c0[k]
                      for k in CACHE_KEYS}
        if any(v is not None for v in cache_counters(b).values()):
            raise SystemExit("read_cache_bench: node B has a read cache")
        log("  round %d: prefetch off %.2f on %.2f, re-read off %.2f on %.2f GB/s; "
            "C's cache %s" % (run + 1, r["prefetch_off"], r["prefetch_on"],
                              r["reread_off"], r["reread_on"], r["cache"]))
        rounds.append(r)
    return rounds


def main():
    ts = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    load0 = open("/proc/loadavg").read().split()[:3]
    ports = free_ports(3)
    peers = ",".join("127.0.0.1:%d" % p for p in ports)
    per_round = max(reps_for(s) * s * BATCH for s in SIZES)
    pool = "%dmb" % max(1024, 2 * per_round >> 20)
    a = NODES.start("a", "--rpc-port", str(ports[0]), "--peers", peers, "--pool-size", pool)
    b = NODES.start("b", "--rpc-port", str(ports[1]), "--peers", peers,
                    "--pool-size", "256mb")
    c = NODES.start("c", "--rpc-port", str(ports[2]), "--peers", peers,
                    "--pool-size", "256mb", "--directory-read-cache-ttl", TTL)
    results = {size: bench_size(size, a, b, c) for size in SIZES}
    load1 = open("/proc/loadavg").read().split()[:3]

    print("### Directory read cache off (node B) and on (node C, ttl %s), %d-page "
          "batches, %d rounds" % (TTL, BATCH, RUNS))
    print()
    print("| page | prefetch off GB/s | prefetch on GB/s | prefetch on/off "
          "| re-read off GB/s | re-read on GB/s | re-read on/off | C's cache per round "
          "(hits, misses, stale) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    summary = {}
    for size, rounds in results.items():
        med = {k: statistics.median(r[k] for r in rounds)
               for k in ("prefetch_off", "prefetch_on", "reread_off", "reread_on")}
        ratios = {
            "prefetch": spread([r["prefetch_on"] / r["prefetch_off"] for r in rounds]),
            "reread": spread([r["reread_on"] / r["reread_off"] for r in rounds]),
        }
        cache = {k: statistics.median(r["cache"][k] for r in rounds)
                 for k in ("hits_total", "misses_total", "stale_total")}
        summary[size] = {"median_gb_per_s": med, "ratios": ratios, "cache": cache}
        print("| %d KiB | %.2f | %.2f | %s | %.2f | %.2f | %s | %d, %d, %d |" % (
            size >> 10, med["prefetch_off"], med["prefetch_on"], fmt(ratios["prefetch"]),
            med["reread_off"], med["reread_on"], fmt(ratios["reread"]),
            cache["hits_total"], cache["misses_total"], cache["stale_total"]))
    print()
    print("Ratios are paired per round (round i of each reader), median (min-max). "
          "prefetch = batch_exists then batch_get_v1; re-read = batch_get_v1 of the "
          "same keys again. Nodes: peercached --threads %s, three peers; load "
          "average %s -> %s." % (NODE_THREADS, " ".join(load0), " ".join(load1)))
    save_results(RESULTS_DIR, {
        "bench": "read-cache", "ts": ts, "batch": BATCH, "runs": RUNS, "ttl": TTL,
        "node_threads": NODE_THREADS, "loadavg": [load0, load1],
        "rounds": {str(k): v for k, v in results.items()},
        "summary": {str(k): v for k, v in summary.items()}})


if __name__ == "__main__":
    try:
        main()
    finally:
        NODES.stop_all()
