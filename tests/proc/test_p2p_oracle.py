"""Never wrong bytes under churn: pages are evicted and their memory reused
while other threads read them, locally and from another node. Every page
that comes back is checked against a content oracle (bytes derived from the
key); over a million reads, none may differ."""
import hashlib
import random
import threading
import time

from conftest import RpcClient, metrics_of

KEYS = 4096


def oracle(i):
    seed = hashlib.sha256(b"oracle-%d" % i).digest()
    size = 512 + int.from_bytes(seed[:2], "little") % 7680   # mixed sizes
    out = bytearray()
    n = 0
    while len(out) < size:
        out += hashlib.sha256(seed + n.to_bytes(4, "little")).digest()
        n += 1
    return bytes(out[:size])


def test_a_million_reads_under_eviction_and_reuse(cluster):
    # ~17 MiB of pages churned through a 4 MiB pool.
    a, b = cluster(2, "--pool-size", "4mb", "--threads", "2")
    pages = [oracle(i) for i in range(KEYS)]
    keys = ["oracle-%d" % i for i in range(KEYS)]
    stop = threading.Event()
    stats = {"reads": 0, "hits": 0, "wrong": 0, "sets": 0}
    lock = threading.Lock()
    errors = []

    def writer():
        c = RpcClient(a.endpoint("rpc"))
        rnd = random.Random(1)
        try:
            while not stop.is_set():
                idx = rnd.sample(range(KEYS), 16)
                err, ok = c.call("kv.set", [[keys[i] for i in idx], [pages[i] for i in idx]])
                assert err is None, err
                with lock:
                    stats["sets"] += 16
        except Exception as e:  # surfaced by the main thread
            errors.append(e)

    def reader(node, seed):
        c = RpcClient(node.endpoint("rpc"))
        rnd = random.Random(seed)
        try:
            while not stop.is_set():
                idx = [rnd.randrange(KEYS) for _ in range(128)]
                err, got = c.call("kv.get", [[keys[i] for i in idx]])
                assert err is None, err
                wrong = sum(1 for i, g in zip(idx, got) if g is not None and g != pages[i])
                hits = sum(1 for g in got if g is not None)
                with lock:
                    stats["reads"] += len(idx)
                    stats["hits"] += hits
                    stats["wrong"] += wrong
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=writer)]
    threads += [threading.Thread(target=reader, args=(b, s)) for s in (1, 2)]
    threads += [threading.Thread(target=reader, args=(a, 3))]
    for t in threads:
        t.start()
    deadline = time.time() + 240
    while time.time() < deadline and not errors:
        with lock:
            if stats["reads"] >= 1_000_000:
                break
        time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, errors[0]
    print("reads %(reads)d hits %(hits)d wrong %(wrong)d sets %(sets)d" % stats)
    assert stats["reads"] >= 1_000_000, stats
    assert stats["wrong"] == 0, stats
    assert stats["hits"] > 0.02 * stats["reads"], "the test must read live pages"
    ma = metrics_of(a)
    assert ma["peercache_evictions_total"] > 1000, "pages were evicted and reused"
    for n in (a, b):
        assert n.stop() == 0
