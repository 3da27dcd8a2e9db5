#!/usr/bin/python3
"""bench/disk_bench.py — the disk tier (issue 14 item 7, docs/disk.md)
against fio on the same file system, in the same run: fio's sequential
write and read (ioengine=io_uring, direct=1, bs = the page size, iodepth =
the tier's own queue depth, measured), the node's write-through and
promotion throughput (bytes per second from its own metrics), and the set
latency with the tier on vs off.

Knobs from the environment (defaults in brackets): PEERCACHE_BUILD_DIR
[<repo>/build], DISK_PATH [a new directory under /var/tmp; it must take
O_DIRECT, checked first], RUNS [3], PAGE [262144 bytes: fio's block size
too], VOLUME [1gb written per run, by fio and by the node], THREADS [2,
peercached --threads], CLIENTS [2 connections setting pages], SET_BATCH [16
pages per set], PROMOTE_WINDOW [32: pages per kv.exists while promoting],
PROMOTE_DEPTH [512: pages asked and not yet counted promoted, at most],
PROMOTE_SCRAPE_MS [10: the node's metrics scraped while promoting], LAT_SETS [5000 one-page sets per latency run],
LAT_POOL [256mb], LAT_FIO [0; 1: a third latency run per round, tier off
with fio writing beside it at the write-through's queue depth, the tier's
sync cadence and the bytes/s the tier wrote in the round's tier-on latency
run (set_wt_gbps): what the disk's own work costs the sets],
NODE_ARGS [more peercached options for every node, e.g.
"--copy-slice-bytes 2mb"], RESULTS_DIR [$PEERCACHE_BUILD_DIR/bench-results].

Per run, on DISK_PATH:
  1. write-through: a node with the tier on (pool and write-through queue
     larger than VOLUME: nothing is evicted or dropped) takes VOLUME of
     pages from CLIENTS local clients (libpeercache on the node's Unix
     socket, pages in shared memory: the SGLang shim's path; a Python
     kv.set over TCP tops out near 0.1 GB/s here) as fast as they go; the
     figure is
     peercache_disk_write_bytes_total over the time the write-through queue
     was not empty (the disk, not the sets, was the limit), sampled every
     20 ms. Its I/O in flight (peercache_disk_ios_in_flight) is sampled too.
  2. promotion: the node restarted on the same store (its pool holds
     VOLUME: nothing promoted is evicted again): every page is
     non-resident; kv.exists of PROMOTE_WINDOW keys at a time starts
     their promotions, the next window as soon as it keeps at most
     PROMOTE_DEPTH asked and not counted done
     (peercache_disk_promotions_total, scraped every PROMOTE_SCRAPE_MS
     while asking, every 5 ms once all are asked: the only scrapes, each
     ~0.5 ms of node CPU; promote_scrape_hz). The node reads and copies
     at most 16 pages per reactor at a time (the rest wait in its queue),
     so PROMOTE_DEPTH only has to outrun the count's lag; it must stay
     within the promotions' budget, a quarter of the pool. The figure is
     peercache_disk_promote_bytes_total over the time from the first
     exists to every page promoted.
  3. fio: a VOLUME file, sequential write then sequential read, bs = PAGE,
     and the write again with an fdatasync every 64 MiB (as the tier syncs
     its store each time a region fills: fio_write_sync_gbps, wt_sync_ratio),
     iodepth = the node's queue depth, rounded: its mean I/O in flight
     (peercache_disk_ios_in_flight) while its write-through queue held
     pages (4 writes per reactor at most), and over phase 2 (promote_ios;
     promote_qd is the mean number of promotions asked and not yet counted
     done, which runs ahead of the reads by the scrape gap the count lags).
  4. set latency: LAT_SETS one-page sets (new keys, one local client,
     closed loop) into a node with the tier off, then on (the
     order alternates between runs), LAT_POOL pool (the pool evicts); p50
     and p99 of the calls as the client sees them. LAT_FIO=1 adds a run
     with the tier off and fio writing beside it as many bytes/s as the
     tier wrote in the tier-on run (set_p99_off_fio_off).
Prints each run and the min/median/max of every figure, and writes the
JSON to RESULTS_DIR/disk-bench-<time>.json. Only 127.0.0.1 is contacted;
nodes are stopped by PID.
"""
import ctypes
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "proc"))
sys.path.insert(0, HERE)
from conftest import BUILD, Node, RpcClient, metrics_of  # noqa: E402
import bench_results  # noqa: E402


def size(v):
    m = re.fullmatch(r"(\d+)(k|kb|m|mb|g|gb)?", str(v).lower())
    if not m:
        raise SystemExit("not a size: %r" % v)
    return int(m.group(1)) << {None: 0, "k": 10, "kb": 10, "m": 20, "mb": 20,
                               "g": 30, "gb": 30}[m.group(2)]


RUNS = int(os.environ.get("RUNS", "3"))
PAGE = size(os.environ.get("PAGE", "262144"))
VOLUME = size(os.environ.get("VOLUME", "1gb"))
THREADS = int(os.environ.get("THREADS", "2"))
CLIENTS = int(os.environ.get("CLIENTS", "2"))
SET_BATCH = int(os.environ.get("SET_BATCH", "16"))
PROMOTE_WINDOW = int(os.environ.get("PROMOTE_WINDOW", "32"))
PROMOTE_DEPTH = int(os.environ.get("PROMOTE_DEPTH", "512"))
PROMOTE_SCRAPE_MS = float(os.environ.get("PROMOTE_SCRAPE_MS", "10"))
LAT_SETS = int(os.environ.get("LAT_SETS", "5000"))
LAT_FIO = os.environ.get("LAT_FIO", "0") == "1"
LAT_POOL = os.environ.get("LAT_POOL", "256mb")
NODE_ARGS = os.environ.get("NODE_ARGS", "").split()
RESULTS_DIR = os.environ.get("RESULTS_DIR", os.path.join(BUILD, "bench-results"))
REGION = 64 << 20   # the default disk_region_size
NPAGES = VOLUME // PAGE
GB = 1e9


def log(*a):
    print("disk_bench:", *a, file=sys.stderr, flush=True)


def check_direct(path):
    """Does the file system under path take O_DIRECT? (EINVAL: no.)"""
    probe = os.path.join(path, ".odirect-probe")
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError as e:
        return "O_DIRECT refused: %s" % e.strerror
    os.close(fd)
    os.unlink(probe)
    return None


def node(path, pool, *args, disk=True):
    # One directory for the socket and the node's log, gone at stop().
    home = tempfile.mkdtemp(prefix="pc-disk-bench-node-")
    sock = os.path.join(home, "node.sock")
    argv = ["--rpc-port", "0", "--data-port", "0", "--meta-port", "0",
            "--metrics-port", "0", "--threads", str(THREADS), "--socket", sock,
            "--pool-size", str(pool)]
    if disk:
        argv += ["--disk-enabled", "true", "--disk-path", path, "--disk-size",
                 str(VOLUME * 2 + (128 << 20)), "--disk-region-size", str(REGION)]
    n = Node(argv + list(args) + NODE_ARGS, tmpdir=home)
    n.sock = sock
    n.wait_for("ready", timeout=300)
    # Load starts once the pool is faulted in (or the prefault gave up).
    deadline = time.monotonic() + 300
    while not re.search(r"region faulted in|prefault", n.text()):
        if time.monotonic() > deadline or n.proc.poll() is not None:
            raise SystemExit("node: no prefault line:\n" + n.text()[-2000:])
        time.sleep(0.05)
    return n


def stop(n):
    n.stop(signal.SIGINT, timeout=60)
    shutil.rmtree(os.path.dirname(n.sock), ignore_errors=True)


class Local:
    """A local client (libpeercache, what the SGLang shim uses) with a
    shared region of `pages` random pages: sets copy from it with no
    serialisation, so the client is not what limits the node."""

    def __init__(self, n, pages):
        sys.path.insert(0, os.path.join(ROOT, "python"))
        os.environ.setdefault("PEERCACHE_LIBRARY",
                              os.path.join(BUILD, "client", "libpeercache.so.0"))
        from peercache.client import Client
        self.c = Client(n.sock, timeout_ms=120000)
        self.rid, addr = self.c.region_create(pages * PAGE)
        ctypes.memmove(addr, os.urandom(pages * PAGE), pages * PAGE)
        self.offs = [i * PAGE for i in range(pages)]

    def set(self, keys):
        ok = self.c.set(self.rid, [k.encode() for k in keys], self.offs[:len(keys)],
                        [PAGE] * len(keys))
        assert all(ok), "a set failed"

    def close(self):
        self.c.close()


class Sampler:
    """Samples a few metrics of a node every `every` s on its own thread."""

    def __init__(self, n, names, every=0.02):
        self.n, self.names, self.rows, self.every = n, names, [], every
        self.stop_ev = threading.Event()
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()

    def loop(self):
        while not self.stop_ev.is_set():
            m = metrics_of(self.n)
            self.rows.append((time.monotonic(),) + tuple(m.get(k, 0) for k in self.names))
            time.sleep(self.every)

    def stop(self):
        self.stop_ev.set()
        self.t.join()
        return self.rows


def write_through(path):
    """Phase 1: GB/s written through while the queue was not empty, the
    set ingest GB/s, the median I/O in flight, the keys."""
    n = node(path, VOLUME + (256 << 20), "--disk-queue-max", str(VOLUME + (64 << 20)))
    keys = ["wt/%d" % i for i in range(NPAGES)]
    s = Sampler(n, ["peercache_disk_write_bytes_total", "peercache_disk_queue_bytes",
                    "peercache_disk_ios_in_flight"])
    parts = [keys[i::CLIENTS] for i in range(CLIENTS)]
    errs = []

    def client(mine):
        try:
            cl = Local(n, SET_BATCH)
            for i in range(0, len(mine), SET_BATCH):
                cl.set(mine[i:i + SET_BATCH])
            cl.close()
        except Exception as e:  # reported below
            errs.append(e)
    t0 = time.monotonic()
    ths = [threading.Thread(target=client, args=(p,)) for p in parts]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    ingest = NPAGES * PAGE / (time.monotonic() - t0) / GB
    deadline = time.monotonic() + 600
    while metrics_of(n)["peercache_disk_write_bytes_total"] < NPAGES * PAGE:
        if time.monotonic() > deadline:
            raise SystemExit("write-through did not finish:\n" + n.text()[-2000:])
        time.sleep(0.02)
    rows = s.stop()
    if errs:
        raise SystemExit("a set failed: %r" % errs[0])
    m = metrics_of(n)
    assert m["peercache_disk_write_dropped_total"] == 0, "pages dropped"
    assert m["peercache_disk_direct_io"] == 1, "the store is not on O_DIRECT"
    # The window where the queue held pages at both ends of a sample pair.
    busy_b = busy_t = 0.0
    for a, b in zip(rows, rows[1:]):
        if a[2] > 0 and b[2] > 0:
            busy_b += b[1] - a[1]
            busy_t += b[0] - a[0]
    qd = statistics.mean([r[3] for r in rows if r[2] > 0] or [0])
    stop(n)
    return (busy_b / busy_t / GB if busy_t > 0.2 else None), ingest, qd, \
        busy_t, keys


def promotion(path, keys):
    """Phase 2: GB/s promoted, median I/O in flight, promotion p50/p99."""
    pool = VOLUME + (256 << 20)
    if PROMOTE_DEPTH * PAGE > pool // 4:
        raise SystemExit("PROMOTE_DEPTH %d pages of %d B is over the node's promotion "
                         "budget (a quarter of its %d B pool): asks beyond it are not "
                         "started" % (PROMOTE_DEPTH, PAGE, pool))
    n = node(path, pool)
    n.wait_for("re-announced", timeout=300)
    cl = RpcClient(n.endpoint("rpc"), timeout=120)
    # The sampler's scrapes are the only ones, and each costs the node
    # ~0.5 ms of CPU: every 5 ms took ~10 % of the node. So they are rare
    # (PROMOTE_SCRAPE_MS) while windows are being asked, and the asks run
    # up to PROMOTE_DEPTH ahead of the count: its lag (a scrape gap and
    # more, ~60 pages at 1 GB/s) must not starve the node, whose own
    # queue keeps its reads at its depth (at 128 ahead, ~100 asked and
    # ~25 reading: the rest were done and not yet seen). Once all are
    # asked, every 5 ms, so that the end is seen within 5 ms.
    s = Sampler(n, ["peercache_disk_promote_bytes_total", "peercache_disk_ios_in_flight",
                    "peercache_disk_promotions_total"], every=PROMOTE_SCRAPE_MS / 1e3)
    t0 = time.monotonic()
    deadline = t0 + 600
    issued = 0
    depth = []      # (time, promotions asked and not done)
    while True:
        done = s.rows[-1][3] if s.rows else 0
        depth.append((time.monotonic(), issued - done))
        if done >= len(keys):
            break
        if time.monotonic() > deadline:
            raise SystemExit("promotion did not finish:\n" + n.text()[-2000:])
        if issued < len(keys) and issued - done + PROMOTE_WINDOW <= PROMOTE_DEPTH:
            part = keys[issued:issued + PROMOTE_WINDOW]
            err, count = cl.call("kv.exists", [part])
            assert err is None and count == len(part), (err, count)
            issued += len(part)
            if issued == len(keys):
                s.every = 0.005
        else:
            time.sleep(0.001)
    dt = time.monotonic() - t0
    rows = s.stop()
    scrapes = sum(1 for r in rows if t0 <= r[0] <= t0 + dt) / dt
    m = metrics_of(n)
    gbps = m["peercache_disk_promote_bytes_total"] / dt / GB
    # The tier's queue depth here: promotions under way, time-weighted.
    qd = sum((b[0] - a[0]) * a[1] for a, b in zip(depth, depth[1:])) / dt
    ios = statistics.mean([r[2] for r in rows if t0 <= r[0] <= t0 + dt] or [0])
    lat = (m.get('peercache_disk_promote_latency_seconds{quantile="0.5"}'),
           m.get('peercache_disk_promote_latency_seconds{quantile="0.99"}'))
    assert m["peercache_disk_promote_errors_total"] == 0, "promotions failed"
    stop(n)
    return gbps, qd, ios, lat, scrapes


def fio(path, rw, qd, *extra):
    """fio sequential rw on a VOLUME file: GB/s, clat p50, p99 (s)."""
    out = subprocess.run(
        ["fio", "--name=disk_bench", "--filename=" + os.path.join(path, "fio.dat"),
         "--size=%d" % VOLUME, "--bs=%d" % PAGE, "--rw=" + rw, "--ioengine=io_uring",
         "--direct=1", "--iodepth=%d" % qd, "--numjobs=1", "--output-format=json"]
        + list(extra), capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("fio failed: %s" % out.stderr[-2000:])
    job = json.loads(out.stdout)["jobs"][0]["read" if rw == "read" else "write"]
    pct = job["clat_ns"].get("percentile", {})
    return job["bw_bytes"] / GB, pct.get("50.000000", 0) / 1e9, pct.get("99.000000", 0) / 1e9


def fio_beside(path, qd, rate):
    """fio writing sequentially (QD qd, PAGE blocks, O_DIRECT, the tier's
    sync cadence, at most `rate` bytes/s: what the tier wrote in the same
    round's latency run) until stopped: the disk's own work beside a
    tier-off node (LAT_FIO=1)."""
    p = subprocess.Popen(
        ["fio", "--name=beside", "--filename=" + os.path.join(path, "fio.dat"),
         "--size=%d" % VOLUME, "--bs=%d" % PAGE, "--rw=write", "--ioengine=io_uring",
         "--direct=1", "--iodepth=%d" % qd, "--time_based", "--runtime=3600",
         "--fdatasync=%d" % max(1, REGION // PAGE), "--rate=%d" % max(PAGE, int(rate)),
         "--output=/dev/null"])
    time.sleep(1)  # laid out and writing
    if p.poll() is not None:
        raise SystemExit("fio beside the node exited with %d" % p.returncode)
    return p


def set_latency(path, disk, beside=None):
    """Phase 4: p50, p99 (s) of one-page sets, the tier on or off, and the
    bytes/s the tier wrote meanwhile (beside: (qd, rate), with fio writing
    on the same file system meanwhile)."""
    n = node(path, LAT_POOL, disk=disk)
    fio_p = fio_beside(os.path.dirname(path), *beside) if beside else None
    cl = Local(n, 1)
    lat = []
    w0 = metrics_of(n).get("peercache_disk_write_bytes_total", 0)
    t_start = time.monotonic()
    tag = "on" if disk else "off"
    for i in range(LAT_SETS + 200):
        k = ["lat-%s/%d" % (tag, i)]
        t0 = time.perf_counter()
        cl.set(k)
        dt = time.perf_counter() - t0
        if i >= 200:       # warm-up
            lat.append(dt)
    wrote = ((metrics_of(n).get("peercache_disk_write_bytes_total", 0) - w0)
             / (time.monotonic() - t_start))
    if fio_p:
        fio_p.send_signal(signal.SIGINT)
        fio_p.wait()
        os.unlink(os.path.join(os.path.dirname(path), "fio.dat"))
    cl.close()
    stop(n)
    lat.sort()
    return lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))], wrote


def clear(path):
    for f in os.listdir(path):
        p = os.path.join(path, f)
        if os.path.isdir(p):
            shutil.rmtree(p)
        else:
            os.unlink(p)


def main():
    if shutil.which("fio") is None:
        raise SystemExit("fio is not installed (Debian package fio; scripts/deps.sh bench)")
    given = os.environ.get("DISK_PATH")
    path = given or tempfile.mkdtemp(prefix="pc-disk-bench-", dir="/var/tmp")
    os.makedirs(path, exist_ok=True)
    why = check_direct(path)
    if why:
        raise SystemExit("%s: %s; the comparison needs O_DIRECT (fio direct=1, the "
                         "store's O_DIRECT): give DISK_PATH on another file system"
                         % (path, why))
    store = os.path.join(path, "store")
    log("%s: O_DIRECT ok; page %d B, %d pages (%.2f GB) per run, %d runs"
        % (path, PAGE, NPAGES, NPAGES * PAGE / GB, RUNS))
    loads0 = bench_results.loadavg()
    rows = []
    try:
        for run in range(RUNS):
            r = {}
            os.makedirs(store, exist_ok=True)
            clear(store)
            (r["wt_gbps"], r["set_ingest_gbps"], r["wt_qd"], r["wt_busy_s"],
             keys) = write_through(store)
            (r["promote_gbps"], r["promote_qd"], r["promote_ios"],
             (r["promote_p50_s"], r["promote_p99_s"]),
             r["promote_scrape_hz"]) = promotion(store, keys)
            clear(store)
            r["fio_write_qd"] = wq = max(1, int(round(r["wt_qd"])))
            r["fio_read_qd"] = rq = max(1, int(round(r["promote_ios"])))
            r["fio_write_gbps"], r["fio_write_p50_s"], r["fio_write_p99_s"] = fio(path, "write", wq)
            # The tier syncs the store each time a region fills (and each
            # second): fio with an fdatasync as often is the other baseline.
            r["fio_write_sync_gbps"] = fio(path, "write", wq, "--fdatasync=%d"
                                           % max(1, REGION // PAGE))[0]
            r["fio_read_gbps"], r["fio_read_p50_s"], r["fio_read_p99_s"] = fio(path, "read", rq)
            os.unlink(os.path.join(path, "fio.dat"))
            order = (False, True) if run % 2 == 0 else (True, False)
            for disk in order:
                clear(store)
                tag = "on" if disk else "off"
                r["set_p50_%s_s" % tag], r["set_p99_%s_s" % tag], wrote = set_latency(store, disk)
                if disk:
                    r["set_wt_gbps"] = wrote / GB
            if LAT_FIO:
                clear(store)
                r["set_p50_off_fio_s"], r["set_p99_off_fio_s"], _ = set_latency(
                    store, False, (wq, r["set_wt_gbps"] * GB))
                r["set_p99_off_fio_off"] = r["set_p99_off_fio_s"] / r["set_p99_off_s"]
            r["wt_ratio"] = r["wt_gbps"] / r["fio_write_gbps"] if r["wt_gbps"] else None
            r["wt_sync_ratio"] = (r["wt_gbps"] / r["fio_write_sync_gbps"]
                                  if r["wt_gbps"] else None)
            r["promote_ratio"] = r["promote_gbps"] / r["fio_read_gbps"]
            r["set_p99_on_off"] = r["set_p99_on_s"] / r["set_p99_off_s"]
            rows.append(r)
            log("run %d: %s" % (run + 1, json.dumps(
                {k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()})))
    finally:
        if not given:
            shutil.rmtree(path, ignore_errors=True)
        else:
            shutil.rmtree(store, ignore_errors=True)
    keys = ["fio_write_gbps", "wt_gbps", "wt_ratio", "fio_write_sync_gbps", "wt_sync_ratio",
            "fio_read_gbps", "promote_gbps",
            "promote_ratio", "set_p99_off_s", "set_p99_on_s", "set_p99_on_off",
            "set_p50_off_s", "set_p50_on_s", "set_wt_gbps", "set_p99_off_fio_s",
            "set_p99_off_fio_off",
            "fio_write_p50_s", "fio_write_p99_s",
            "fio_read_p50_s", "fio_read_p99_s", "promote_p50_s", "promote_p99_s",
            "set_ingest_gbps", "wt_qd", "promote_qd", "promote_ios", "promote_scrape_hz",
            "wt_busy_s"]
    sp = bench_results.spread(rows, keys)
    print("| figure (%d runs, page %d B, %.2f GB a run) | min | median | max |"
          % (RUNS, PAGE, NPAGES * PAGE / GB))
    print("|---|---|---|---|")
    for k in keys:
        if k in sp:
            ms = k.endswith("_s") and not k.endswith("busy_s")
            f = (lambda v: "%.3f ms" % (v * 1e3)) if ms else (lambda v: "%.3f" % v)
            print("| %s | %s | %s | %s |" % (k, f(sp[k]["min"]), f(sp[k]["median"]),
                                             f(sp[k]["max"])))
    out = bench_results.write(
        RESULTS_DIR, "disk_bench", "disk-bench", bench_results.stamp(),
        (loads0, bench_results.loadavg()),
        {"page": PAGE, "volume": VOLUME, "runs": RUNS, "threads": THREADS,
         "clients": CLIENTS, "set_batch": SET_BATCH, "promote_window": PROMOTE_WINDOW,
         "promote_depth": PROMOTE_DEPTH, "promote_scrape_ms": PROMOTE_SCRAPE_MS,
         "lat_sets": LAT_SETS, "lat_fio": LAT_FIO, "node_args": NODE_ARGS, "lat_pool": LAT_POOL, "path": path},
        runs=rows, summary=sp)
    log("results in %s" % out)


if __name__ == "__main__":
    main()
