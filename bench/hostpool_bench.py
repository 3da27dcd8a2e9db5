"""bench/hostpool_bench.py — what the host pool's allocator costs the shim,
and the shim's latency on SGLang's TTFT path (buffer_only host mode).

Run through bench/hostpool_bench.sh (which checks the tools and builds what
is missing). Two peercached nodes A and B on loopback name each other as
peers; PeerCacheStore shims with MHA page_first host pools (K and V objects
per page, SGLang's geometry) are attached to each.

Part 1, "allocator": the same moves through a pool on SGLang's "shm"
allocator (a memfd the shim shares with the node: direct) and through a pool
on the default allocator (no descriptor: the shim stages every page through
a shared buffer, one more memcpy per page). For each of RUNS rounds, both
kinds in turn (the order swaps every round): REPS batches of BATCH pages of
  set         batch_set_v1 of new keys through shim A
  local get   batch_get_v1 of them through shim A (A's own pages)
  remote get  batch_get_v1 of them through shim B (pages read from A)
One round before them is not counted (first touch of the nodes' pools and
of the staging buffers). Per round: GB/s of each op; over all batches: per-batch latency min /
median / max; the staged/direct ratio paired per round, min / median / max.

Part 2, "ttft": with buffer_only host memory SGLang keeps nothing in the
host pool, so every reuse is an existence query then a read of the prefix,
both before the prefill can start. ITER times each, on shm pools:
  exists hit    batch_exists of a stored TTFT_PAGES-page prefix (A, and B)
  exists miss   batch_exists of a prefix whose first page is not stored
  get           batch_get_v1 of the TTFT_PAGES pages (A local, B remote)
after 5 uncounted calls, reported as p50 / p99 / max latency. B's reads are checked to be remote
(bytes landed in B's pool, from its counters).

Prints markdown tables on stdout; progress on stderr; every sample summary to
RESULTS_DIR/hostpool-<timestamp>.json. Only 127.0.0.1 is contacted; every
node is stopped by PID on exit.
"""
import os
import statistics
import sys
import time

from shim_bench_common import BUILD, Nodes, parse_sizes, save_results, timed  # paths first

env = os.environ

import torch  # noqa: E402
from conftest import free_ports, metrics_of  # noqa: E402
from fake_pools import MHAPool  # noqa: E402
from peercache._hicache import HiCacheStorageConfig  # noqa: E402
from peercache.store import PeerCacheStore  # noqa: E402

# Page bytes (K + V) -> (tokens per page, layers, heads, head dim), fp16.
GEOMETRY = {256 << 10: (32, 16, 2, 64), 1 << 20: (64, 16, 4, 64),
            4 << 20: (64, 32, 8, 64)}


def log(msg):
    print("hostpool_bench: " + msg, file=sys.stderr, flush=True)


SIZES = parse_sizes("hostpool_bench", env.get("SIZES", "256k"), GEOMETRY)
RUNS = int(env.get("RUNS", "5"))
BATCH = int(env.get("BATCH", "128"))
REP_MB = int(env.get("REP_MB", "128"))
ITER = int(env.get("ITER", "200"))
TTFT_PAGES = int(env.get("TTFT_PAGES", "16"))
NODE_THREADS = env.get("NODE_THREADS", "2")
WARM = 5  # uncounted calls before each TTFT-path measurement
RESULTS_DIR = env.get("RESULTS_DIR", os.path.join(BUILD, "bench-results"))
if RUNS < 1 or not 1 <= BATCH <= 1024 or REP_MB < 1 or ITER < 10 or \
        not 1 <= TTFT_PAGES <= BATCH:
    raise SystemExit("hostpool_bench: RUNS >= 1, BATCH in 1..1024, REP_MB >= 1, "
                     "ITER >= 10 and TTFT_PAGES in 1..BATCH are needed")

NODES = Nodes("pc-hostpool-bench-", NODE_THREADS)
node = NODES.start


def shim(nd, pool):
    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, is_mla_model=False,
                               model_name="bench/hostpool")
    cfg.extra_config = {"backend_name": "peercache", "module_path": "peercache.store",
                        "class_name": "PeerCacheStore", "interface_v1": 1,
                        "allocator": "shm", "socket": nd.endpoint("socket")}
    s = PeerCacheStore(cfg, {})
    s.register_mem_pool_host(pool)
    return s


def make_pool(size, shm):
    page, layers, heads, dim = GEOMETRY[size]
    p = MHAPool("page_first", page_size=page, pages=BATCH, layer_num=layers,
                head_num=heads, head_dim=dim, shm=shm)
    p.kv_buffer.view(torch.uint8).view(-1)[::4096].fill_(1)  # touch every page
    return p


def slots(pages, page_size):
    return torch.arange(0, pages * page_size, dtype=torch.int64)


def landed(nd):
    return metrics_of(nd).get("peercache_bytes_landed_total", 0)


def spread(vals):
    return {"min": min(vals), "median": statistics.median(vals), "max": max(vals)}


def pct(vals, q):
    s = sorted(vals)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def reps_for(size):
    return max(2, -(-(REP_MB << 20) // (BATCH * size)))


def one_kind(tag, run, size, sa, sb, pa, pb, reps, out):
    """REPS batches of set, local get, remote get through one pool kind."""
    idx = slots(BATCH, pa.page_size)
    keys = [["%s-r%d-b%d-s%d-%055d" % (tag, run, rep, size, i) for i in range(BATCH)]
            for rep in range(reps)]
    pa.fill_page(BATCH - 1, run + 1)
    want = pa.page_bytes(BATCH - 1)
    pb.kv_buffer.view(torch.uint8).view(-1).zero_()
    for op, s in (("set", sa), ("local_get", sa), ("remote_get", sb)):
        total = 0.0
        for rep in range(reps):
            fn = s.batch_set_v1 if op == "set" else s.batch_get_v1
            t, ok = timed(lambda: fn(keys[rep], idx))
            if ok != [True] * BATCH:
                raise SystemExit("hostpool_bench: %s %s: %d of %d pages"
                                 % (tag, op, sum(ok), BATCH))
            total += t
            out[op]["batch_s"].append(t)
        out[op]["gbps"].append(reps * BATCH * size / total / 1e9)
    if pb.page_bytes(BATCH - 1) != want:
        raise SystemExit("hostpool_bench: %s: a remote page is not byte-identical" % tag)


def allocator_part(size, a, b):
    reps = reps_for(size)
    log("allocator, page %d KiB: %d pages per batch, %d batches per op per round"
        % (size >> 10, BATCH, reps))
    kinds = {}
    for tag, shm in (("direct", True), ("staged", False)):
        pa, pb = make_pool(size, shm), make_pool(size, shm)
        sa, sb = shim(a, pa), shim(b, pb)
        if (sa._region is not None) != shm or (sb._region is not None) != shm:
            raise SystemExit("hostpool_bench: the %s pool was %sshared" % (
                tag, "not " if shm else ""))
        kinds[tag] = (sa, sb, pa, pb)
    res = {tag: {op: {"gbps": [], "batch_s": []}
                 for op in ("set", "local_get", "remote_get")} for tag in kinds}
    # A round not counted: the nodes' pools and the staging buffers are
    # touched for the first time here.
    for tag in kinds:
        scratch = {op: {"gbps": [], "batch_s": []} for op in res[tag]}
        one_kind(tag + "-warm", 0, size, *kinds[tag], reps, scratch)
    for run in range(RUNS):
        order = ["direct", "staged"] if run % 2 == 0 else ["staged", "direct"]
        for tag in order:
            sa, sb, pa, pb = kinds[tag]
            one_kind(tag, run, size, sa, sb, pa, pb, reps, res[tag])
        log("  round %d: " % (run + 1) + "; ".join(
            "%s set %.2f / local get %.2f / remote get %.2f GB/s" % (
                tag, res[tag]["set"]["gbps"][-1], res[tag]["local_get"]["gbps"][-1],
                res[tag]["remote_get"]["gbps"][-1]) for tag in ("direct", "staged")))
    staged_bytes = kinds["staged"][0].stats().get("staged_bytes", 0)
    for sa, sb, _, _ in kinds.values():
        sa.close()
        sb.close()
    summary = {}
    for op in ("set", "local_get", "remote_get"):
        d, s = res["direct"][op], res["staged"][op]
        summary[op] = {
            "direct_gbps": spread(d["gbps"]), "staged_gbps": spread(s["gbps"]),
            "direct_batch_ms": spread([t * 1e3 for t in d["batch_s"]]),
            "staged_batch_ms": spread([t * 1e3 for t in s["batch_s"]]),
            "staged_over_direct_time": spread(
                [dg / sg for dg, sg in zip(d["gbps"], s["gbps"])]),
        }
    return {"reps": reps, "rounds": res, "summary": summary,
            "staged_bytes_shim_a": staged_bytes}


def ttft_part(size, a, b):
    log("ttft, page %d KiB: %d-page prefix, %d iterations per op"
        % (size >> 10, TTFT_PAGES, ITER))
    pa, pb = make_pool(size, True), make_pool(size, True)
    sa, sb = shim(a, pa), shim(b, pb)
    n = TTFT_PAGES
    idx = slots(n, pa.page_size)
    keys = ["ttft-s%d-%058d" % (size, i) for i in range(n)]
    for p in range(n):
        pa.fill_page(p, 42 + p)
    if sa.batch_set_v1(keys, idx) != [True] * n:
        raise SystemExit("hostpool_bench: ttft set failed")
    missing = ["ttft-miss-%054d" % 0] + keys[1:]
    lat = {}

    def sample(name, fn, want):
        vals = []
        for _ in range(WARM):  # not counted
            fn()
        for _ in range(ITER):
            t, r = timed(fn)
            if r != want:
                raise SystemExit("hostpool_bench: %s gave %r" % (name, r))
            vals.append(t * 1e3)
        lat[name] = vals

    sample("exists_hit_local", lambda: sa.batch_exists(keys), n)
    sample("exists_hit_remote", lambda: sb.batch_exists(keys), n)
    sample("exists_miss_local", lambda: sa.batch_exists(missing), 0)
    sample("exists_miss_remote", lambda: sb.batch_exists(missing), 0)
    sample("get_local", lambda: sa.batch_get_v1(keys, idx), [True] * n)
    l0 = landed(b)
    sample("get_remote", lambda: sb.batch_get_v1(keys, idx), [True] * n)
    landed_per_page = (landed(b) - l0) / ((WARM + ITER) * n * size)
    if any(pa.page_bytes(p) != pb.page_bytes(p) for p in range(n)):
        raise SystemExit("hostpool_bench: a ttft page read remotely differs")
    sa.close()
    sb.close()
    return {"pages": n, "iterations": ITER, "remote_landed_per_page": landed_per_page,
            "ms": {k: {"p50": pct(v, 0.5), "p99": pct(v, 0.99), "max": max(v)}
                   for k, v in lat.items()}}


def main():
    ts = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    load0 = open("/proc/loadavg").read().split()[:3]
    results = {}
    for size in SIZES:
        # Fresh nodes per page size: a pool full of one size's pages is not
        # what the next size should start from. A holds both kinds of a
        # round's sets twice over (earlier rounds' pages are evicted).
        pa_port, pb_port = free_ports(2)
        peers = "127.0.0.1:%d,127.0.0.1:%d" % (pa_port, pb_port)
        pool = "%dmb" % max(1024, 4 * reps_for(size) * size * BATCH >> 20)
        a = node("a%d" % size, "--rpc-port", str(pa_port), "--peers", peers,
                 "--pool-size", pool)
        b = node("b%d" % size, "--rpc-port", str(pb_port), "--peers", peers,
                 "--pool-size", "256mb")
        results[size] = {"allocator": allocator_part(size, a, b),
                         "ttft": ttft_part(size, a, b)}
        for nd in (a, b):
            if nd.stop() != 0:
                raise SystemExit("hostpool_bench: a node exited with an error")
    load1 = open("/proc/loadavg").read().split()[:3]

    def f3(d, k="median"):
        return "%.2f (%.2f-%.2f)" % (d[k], d["min"], d["max"])

    print("### Host pool on \"allocator\":\"shm\" (direct) vs the default allocator "
          "(staged), MHA page_first, %d-page batches, %d rounds" % (BATCH, RUNS))
    print()
    print("| page | op | direct GB/s | staged GB/s | staged/direct time | direct ms/batch "
          "| staged ms/batch |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for size, r in results.items():
        for op, s in r["allocator"]["summary"].items():
            print("| %d KiB | %s | %s | %s | %s | %s | %s |" % (
                size >> 10, op.replace("_", " "), f3(s["direct_gbps"]),
                f3(s["staged_gbps"]), f3(s["staged_over_direct_time"]),
                f3(s["direct_batch_ms"]), f3(s["staged_batch_ms"])))
    print()
    print("GB/s: per round, median (min-max) over rounds; ms/batch: over every "
          "batch of every round; staged/direct time: paired per round.")
    print()
    print("### TTFT path (buffer_only host mode): shim latency in ms, %d-page "
          "prefix, %d calls each" % (TTFT_PAGES, ITER))
    print()
    print("| page | call | p50 | p99 | max |")
    print("|---:|---|---:|---:|---:|")
    for size, r in results.items():
        for k, v in r["ttft"]["ms"].items():
            print("| %d KiB | %s | %.3f | %.3f | %.3f |" % (
                size >> 10, k.replace("_", " "), v["p50"], v["p99"], v["max"]))
    print()
    print("Remote gets landed %s page(s) per page read in B's pool (1.00: every "
          "byte came from A). Nodes: peercached --threads %s; load average %s -> %s."
          % (", ".join("%.2f" % r["ttft"]["remote_landed_per_page"]
                       for r in results.values()),
             NODE_THREADS, " ".join(load0), " ".join(load1)))
    save_results(RESULTS_DIR, {
        "bench": "hostpool", "ts": ts, "batch": BATCH, "runs": RUNS, "iter": ITER,
        "ttft_pages": TTFT_PAGES, "node_threads": NODE_THREADS,
        "loadavg": [load0, load1],
        "results": {str(k): v for k, v in results.items()}})


if __name__ == "__main__":
    try:
        main()
    finally:
        NODES.stop_all()
