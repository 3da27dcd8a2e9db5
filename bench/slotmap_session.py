#!/usr/bin/python3
"""bench/slotmap_session.py — session.get of known-size pages through a
reader node, the path the SGLang shim takes (batch_get_v1), for
bench/slotmap_bench.sh: a local client on the node's Unix socket with one
memfd region, reading batches of the pages pc-p2p-bench stored (keys
PREFIX:N:i, each value stamped with its key's number in its first and last
8 bytes, checked on every page read). A closed loop of one call at a time;
every call's time is recorded (perf_counter_ns).

usage: slotmap_session.py --socket PATH --value-bytes N --keys K
           [--batch B] [--duration S] [--warmup S] [--prefix P]
           [--held-by PORT] [--seed S]
--held-by: read only keys whose pages the slotmap node with that RPC port
holds (slot.probe), as pc-p2p-bench --held-by. Prints one JSON object
(p50_us, p99_us, max_us, gb_per_s, items_per_s, batches) on stdout; a miss,
a wrong page or a failed call exits 1 with the reason on stderr.
"""
import argparse
import json
import os
import random
import struct
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "proc"))

from conftest import RpcClient  # noqa: E402
from test_hardening_session import Client  # noqa: E402

STAMP = struct.Struct("<Q")


def stamp(k, value_bytes):
    """pc-p2p-bench's stamp of key k (bench/p2p_setup.c)."""
    return ((0x9e3779b97f4a7c15 * (k + 1)) & (2**64 - 1)) ^ value_bytes


def held(port, names, value_bytes):
    c = RpcClient("127.0.0.1:%d" % port, timeout=60)
    out = []
    try:
        for i in range(0, len(names), 1024):
            err, lens = c.call("slot.probe", [names[i:i + 1024], value_bytes])
            if err is not None:
                raise SystemExit("slotmap_session: slot.probe: %s" % (err,))
            out += [n == value_bytes for n in lens]
    finally:
        c.close()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--value-bytes", type=int, required=True)
    ap.add_argument("--keys", type=int, required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--prefix", default="pcb")
    ap.add_argument("--held-by", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    o = ap.parse_args()
    n = o.value_bytes
    names = ["%s:%d:%d" % (o.prefix, n, k) for k in range(o.keys)]
    pool = list(range(o.keys))
    if o.held_by:
        pool = [k for k, h in zip(pool, held(o.held_by, names, n)) if h]
    if len(pool) < o.batch:
        raise SystemExit("slotmap_session: %d keys to read, fewer than --batch %d"
                         % (len(pool), o.batch))
    c = Client(o.socket, size=o.batch * n, timeout=60.0)
    assert c.register() == {"sealed": False}
    rng = random.Random(o.seed)
    t0 = time.perf_counter()
    t_measure, t_end = t0 + o.warmup, t0 + o.warmup + o.duration
    lat = []
    while True:
        ks = rng.sample(pool, o.batch)
        items = [[names[k], i * n, n] for i, k in enumerate(ks)]
        a = time.perf_counter_ns()
        got = c.call("session.get", [c.rid, items])
        b = time.perf_counter_ns()
        for i, (k, g) in enumerate(zip(ks, got)):
            st = stamp(k, n)
            if g is not True:
                raise SystemExit("slotmap_session: %s: a miss" % names[k])
            if STAMP.unpack_from(c.mem, i * n)[0] != st or \
                    STAMP.unpack_from(c.mem, i * n + n - 8)[0] != st:
                raise SystemExit("slotmap_session: %s: payload of another key" % names[k])
        now = time.perf_counter()
        if now >= t_measure:
            lat.append(b - a)
        if now >= t_end and lat:
            break
    c.close()
    lat.sort()
    secs = sum(lat) / 1e9
    print(json.dumps({
        "target": "session", "value_bytes": n, "batch": o.batch, "keys": len(pool),
        "batches": len(lat), "items": len(lat) * o.batch,
        "p50_us": lat[len(lat) // 2] / 1e3,
        "p99_us": lat[min(len(lat) - 1, len(lat) * 99 // 100)] / 1e3,
        "max_us": lat[-1] / 1e3,
        "items_per_s": len(lat) * o.batch / secs,
        "gb_per_s": len(lat) * o.batch * n / secs / 1e9}))


if __name__ == "__main__":
    main()
