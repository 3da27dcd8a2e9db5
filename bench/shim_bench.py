"""bench/shim_bench.py — the SGLang shim's page moves, against memcpy.

Run through bench/shim_bench.sh (which checks the tools and builds what is
missing). Two peercached nodes A and B on loopback name each other as peers;
a PeerCacheStore shim is attached to each, with a shared-memory (memfd) MLA
host pool of BATCH pages of the page size (one page = one stored object).
A third node C serves the p2p bench's reader (pc-p2p-bench --target p2p)
for the same page size and batch. For each page size, RUNS rounds of:
  memcpy      single-thread memcpy of the batch's bytes, page by page,
              between the two host pools (the ceiling)
  set         shim A batch_set_v1 of BATCH new keys (REPS batches)
  local get   shim A batch_get_v1 of them (pages in A's own pool)
  remote get  shim B batch_get_v1 of them (pages read from A)
  p2p         pc-p2p-bench reading BATCH pages per batch from node C
(memcpy first on even rounds, last on odd ones, so noise hits both sides.)
Per round it reads both nodes' copy counters, so the table shows the bytes
the nodes copied per page: 1 page per set and per local get, 0 for a remote
get, whose bytes land straight in the host pool (peercache_bytes_landed).

STALL_CPU=1 runs node B with reactor_stall_cpu_clock on and counts the
reactor callbacks over 1 ms of CPU it ran during the remote gets (each
page's checksum is checked as the page lands); off by default, because the
clock costs two system calls per callback. NODE_ARGS adds arguments to
every node (e.g. "--reactor-idle-poll-us 0", to compare one build under
two settings); NODE_B_ARGS adds more to node B, the remote reader (e.g.
"--page-checksums false", to see what verifying the pages costs).

Prints a markdown table (GB/s medians, ratios paired per round with
min/median/max) on stdout; progress on stderr; every round plus the summary
to RESULTS_DIR/shim-<timestamp>.json. Only 127.0.0.1 is contacted; every
node is stopped by PID on exit.
"""
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

from shim_bench_common import BUILD, Nodes, mla_shim, parse_sizes, save_results, timed  # paths first

env = os.environ
P2P_BIN = env.get("PC_P2P_BENCH", os.path.join(BUILD, "bench", "pc-p2p-bench"))

import torch  # noqa: E402
from conftest import free_ports, metrics_of  # noqa: E402
from fake_pools import MLAPool, indices  # noqa: E402

# An MLA page_first page is page_size x layers x kv_cache_dim x 2 bytes.
GEOMETRY = {256 << 10: (16, 16, 512), 4 << 20: (64, 32, 1024)}


def log(msg):
    print("shim_bench: " + msg, file=sys.stderr, flush=True)


SIZES = parse_sizes("shim_bench", env.get("SIZES", "256k 4m"), GEOMETRY)
RUNS = int(env.get("RUNS", "5"))
BATCH = int(env.get("BATCH", "128"))
REP_MB = int(env.get("REP_MB", "256"))
NODE_THREADS = env.get("NODE_THREADS", "2")
STALL_CPU = env.get("STALL_CPU", "0") == "1"
P2P_SECONDS = env.get("DURATION", "4")
RESULTS_DIR = env.get("RESULTS_DIR", os.path.join(BUILD, "bench-results"))
if RUNS < 1 or BATCH < 1 or BATCH > 1024 or REP_MB < 1:
    raise SystemExit("shim_bench: RUNS, BATCH (1..1024) and REP_MB must be positive")

NODES = Nodes("pc-shim-bench-", NODE_THREADS)
NODE_ARGS = env.get("NODE_ARGS", "").split()


def node(name, *args):
    return NODES.start(name, *args, *NODE_ARGS)


def counters(nd):
    m = metrics_of(nd)
    out = {k: m.get(k, 0) for k in (
        'peercache_copy_bytes_total{op="set"}',
        'peercache_copy_bytes_total{op="get_local"}',
        "peercache_bytes_landed_total")}
    out["cpu_stalls"] = sum(v for k, v in m.items()
                            if k.startswith("peercache_reactor_stalls_cpu_total"))
    return out


def delta(after, before):
    return {k: after[k] - before[k] for k in after}


def p2p_round(port, size):
    out = subprocess.run(
        [P2P_BIN, "--target", "p2p", "--host", "127.0.0.1", "--port", str(port),
         "--batch", str(BATCH), "--value-bytes", str(size), "--threads", "1",
         "--duration", P2P_SECONDS, "--warmup", "0.5", "--no-setup", "--json"],
        capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise SystemExit("shim_bench: pc-p2p-bench failed:\n" + out.stderr)
    return json.loads(out.stdout)["gb_per_s"]


def reps_for(size):
    """Batches per op per round: at least REP_MB MiB, at least 2."""
    return max(2, -(-(REP_MB << 20) // (BATCH * size)))


def bench_size(size, a, b, c):
    page_size, layers, dim = GEOMETRY[size]
    batch_bytes = BATCH * size
    reps = reps_for(size)
    log("page %d KiB: %d pages per batch, %d batches per op per round"
        % (size >> 10, BATCH, reps))
    pa = MLAPool("page_first", page_size=page_size, pages=BATCH, layer_num=layers,
                 kv_cache_dim=dim)
    pb = MLAPool("page_first", page_size=page_size, pages=BATCH, layer_num=layers,
                 kv_cache_dim=dim)
    for pool in (pa, pb):
        pool.kv_buffer.view(torch.uint8).view(-1)[::4096].fill_(1)  # touch
    sa, sb = mla_shim(a), mla_shim(b)
    sa.register_mem_pool_host(pa)
    sb.register_mem_pool_host(pb)
    idx = indices(BATCH, page_size)
    ptr_a, sizes = pa.get_page_buffer_meta(idx)
    ptr_b, _ = pb.get_page_buffer_meta(idx)
    assert all(s == size for s in sizes), "page geometry is off"

    setup = subprocess.run(
        [P2P_BIN, "--target", "p2p", "--host", "127.0.0.1", "--port",
         str(c.rpc_port()), "--value-bytes", str(size), "--setup-only", "--json"],
        capture_output=True, text=True, timeout=300)
    if setup.returncode != 0:
        raise SystemExit("shim_bench: pc-p2p-bench setup failed:\n" + setup.stderr)

    rounds = []
    for run in range(RUNS):
        r = {"run": run + 1, "reps": reps}

        def do_memcpy():
            t = 0.0
            for _ in range(reps):
                t0 = time.perf_counter()
                for i in range(BATCH):
                    ctypes.memmove(ptr_b[i], ptr_a[i], size)
                t += time.perf_counter() - t0
            r["memcpy"] = reps * batch_bytes / t / 1e9

        if run % 2 == 0:
            do_memcpy()
        keys = [["r%d-b%d-s%d-%061d" % (run, rep, size, i) for i in range(BATCH)]
                for rep in range(reps)]
        # The last page gets this round's bytes in A and is wiped in B, so
        # the check after the remote gets means something.
        ctypes.memset(ptr_a[BATCH - 1], run + 1, size)
        ctypes.memset(ptr_b[BATCH - 1], 0, size)
        ca0, cb0 = counters(a), counters(b)
        t_set = t_lget = t_rget = 0.0
        for rep in range(reps):
            t, ok = timed(lambda: sa.batch_set_v1(keys[rep], idx))
            if ok != [True] * BATCH:
                raise SystemExit("shim_bench: set failed: %d of %d stored"
                                 % (sum(ok), BATCH))
            t_set += t
        ca1 = counters(a)
        for rep in range(reps):
            t, ok = timed(lambda: sa.batch_get_v1(keys[rep], idx))
            if ok != [True] * BATCH:
                raise SystemExit("shim_bench: local get missed %d pages" % ok.count(False))
            t_lget += t
        ca2, cb1 = counters(a), counters(b)
        for rep in range(reps):
            t, ok = timed(lambda: sb.batch_get_v1(keys[rep], idx))
            if ok != [True] * BATCH:
                raise SystemExit("shim_bench: remote get missed %d pages" % ok.count(False))
            t_rget += t
        cb2 = counters(b)
        if pa.page_bytes(BATCH - 1) != pb.page_bytes(BATCH - 1):
            raise SystemExit("shim_bench: a remote page is not byte-identical")
        if run % 2 == 1:
            do_memcpy()
        r["p2p"] = p2p_round(c.rpc_port(), size)
        pages = reps * BATCH
        r["set"] = pages * size / t_set / 1e9
        r["local_get"] = pages * size / t_lget / 1e9
        r["remote_get"] = pages * size / t_rget / 1e9
        d_set, d_lget, d_rget = delta(ca1, ca0), delta(ca2, ca1), delta(cb2, cb1)
        r["copied_per_page"] = {
            "set": d_set['peercache_copy_bytes_total{op="set"}'] / pages / size,
            "local_get": d_lget['peercache_copy_bytes_total{op="get_local"}'] / pages / size,
            "remote_get": d_rget['peercache_copy_bytes_total{op="get_local"}'] / pages / size,
            "remote_landed": d_rget["peercache_bytes_landed_total"] / pages / size,
        }
        if STALL_CPU:
            r["b_cpu_stalls"] = d_rget["cpu_stalls"]
        log("  round %d: memcpy %.2f, set %.2f, local get %.2f, remote get %.2f, "
            "p2p %.2f GB/s" % (run + 1, r["memcpy"], r["set"], r["local_get"],
                               r["remote_get"], r["p2p"]))
        rounds.append(r)
    sa.close()
    sb.close()
    return rounds


def spread(vals):
    return statistics.median(vals), min(vals), max(vals)


def fmt(t):
    return "%.2f (%.2f-%.2f)" % t


def main():
    ts = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    load0 = open("/proc/loadavg").read().split()[:3]
    pa_port, pb_port = free_ports(2)
    peers = "127.0.0.1:%d,127.0.0.1:%d" % (pa_port, pb_port)
    # A holds a round's sets twice over (earlier rounds' pages are evicted).
    per_round = max(reps_for(s) * s * BATCH for s in SIZES)
    pool = "%dmb" % max(1024, 2 * per_round >> 20)
    a = node("a", "--rpc-port", str(pa_port), "--peers", peers, "--pool-size", pool)
    b = node("b", "--rpc-port", str(pb_port), "--peers", peers, "--pool-size", "256mb",
             *(["--reactor-stall-cpu-clock", "true"] if STALL_CPU else []),
             *env.get("NODE_B_ARGS", "").split())
    c = node("c", "--rpc-port", "0", "--pool-size", "1536mb")
    results = {}
    for size in SIZES:
        results[size] = bench_size(size, a, b, c)
    load1 = open("/proc/loadavg").read().split()[:3]

    print("### Shim page moves vs single-thread memcpy, %d-page batches, "
          "median of %d rounds" % (BATCH, RUNS))
    print()
    print("| page | memcpy GB/s | set GB/s | local get GB/s | remote get GB/s | p2p GB/s "
          "| set/memcpy | local get/memcpy | remote get/memcpy | remote get/p2p |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    summary = {}
    for size, rounds in results.items():
        med = {k: statistics.median(r[k] for r in rounds)
               for k in ("memcpy", "set", "local_get", "remote_get", "p2p")}
        ratios = {
            "set/memcpy": spread([r["set"] / r["memcpy"] for r in rounds]),
            "local_get/memcpy": spread([r["local_get"] / r["memcpy"] for r in rounds]),
            "remote_get/memcpy": spread([r["remote_get"] / r["memcpy"] for r in rounds]),
            "remote_get/p2p": spread([r["remote_get"] / r["p2p"] for r in rounds]),
        }
        summary[size] = {"median_gb_per_s": med, "ratios": ratios}
        print("| %d KiB | %.2f | %.2f | %.2f | %.2f | %.2f | %s | %s | %s | %s |" % (
            size >> 10, med["memcpy"], med["set"], med["local_get"], med["remote_get"],
            med["p2p"], fmt(ratios["set/memcpy"]), fmt(ratios["local_get/memcpy"]),
            fmt(ratios["remote_get/memcpy"]), fmt(ratios["remote_get/p2p"])))
    print()
    print("Bytes the nodes copied per page, per page moved (from their counters, "
          "median over rounds):")
    print()
    print("| page | set (node A) | local get (node A) | remote get (node B) "
          "| remote get landed (node B) |")
    print("|---:|---:|---:|---:|---:|")
    for size, rounds in results.items():
        cp = {k: statistics.median(r["copied_per_page"][k] for r in rounds)
              for k in ("set", "local_get", "remote_get", "remote_landed")}
        summary[size]["copied_per_page"] = cp
        print("| %d KiB | %.2f | %.2f | %.2f | %.2f |" % (
            size >> 10, cp["set"], cp["local_get"], cp["remote_get"], cp["remote_landed"]))
    print()
    if STALL_CPU:
        for size, rounds in results.items():
            st = spread([r["b_cpu_stalls"] for r in rounds])
            summary[size]["b_cpu_stalls"] = st
            print("Node B, remote gets of %d KiB pages: reactor callbacks over 1 ms "
                  "of CPU per round %s (median (min-max)), %d batches of %d pages "
                  "per round." % (size >> 10, "%d (%d-%d)" % st, rounds[0]["reps"],
                                  BATCH))
        print()
    for size in results:
        s = summary[size]["ratios"]
        print("Goals, %d KiB: local get >= 0.7x memcpy: %s (%.2f); remote get >= "
              "0.8x p2p: %s (%.2f)." % (
                  size >> 10, "met" if s["local_get/memcpy"][0] >= 0.7 else "not met",
                  s["local_get/memcpy"][0],
                  "met" if s["remote_get/p2p"][0] >= 0.8 else "not met",
                  s["remote_get/p2p"][0]))
    print()
    print("Ratios are paired per round (round i of each side), median (min-max). "
          "Nodes: peercached --threads %s; p2p: pc-p2p-bench --target p2p, 1 thread, "
          "batch %d, %s s per round, against a third node; node arguments '%s'; "
          "load average %s -> %s."
          % (NODE_THREADS, BATCH, P2P_SECONDS, " ".join(NODE_ARGS), " ".join(load0),
             " ".join(load1)))
    save_results(RESULTS_DIR, {
        "bench": "shim", "ts": ts, "batch": BATCH, "runs": RUNS,
        "node_threads": NODE_THREADS, "node_args": NODE_ARGS, "loadavg": [load0, load1],
        "rounds": {str(k): v for k, v in results.items()},
        "summary": {str(k): v for k, v in summary.items()}})


if __name__ == "__main__":
    try:
        main()
    finally:
        NODES.stop_all()
