"""Issue 10, "keep the good": never a wrong byte while peers die and freeze.

Three nodes; clients on every node write pages whose bytes are a function of
their key and read random keys back, verifying every page they get. Mid-run
one node is killed with SIGKILL and restarted on the same port, and another
is frozen with SIGSTOP for a few seconds. Every page a reader is handed must
be exactly the page of its key: a miss is fine, a wrong byte never is. The
seed is printed; PEERCACHE_TEST_SEED replays a run.
"""
import hashlib
import os
import random
import signal
import threading
import time

from conftest import RpcClient

PAGE = 16 * 1024
RUN_S = 12.0


def page_of(key):
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (PAGE // len(seed) + 1))[:PAGE]


class Worker(threading.Thread):
    def __init__(self, addr_fn, rng, keys, stop):
        super().__init__(daemon=True)
        self.addr_fn, self.rng, self.keys = addr_fn, rng, keys
        self.stop = stop
        self.stats = {"sets": 0, "hits": 0, "misses": 0, "wrong": 0,
                      "reconnects": 0}

    def client(self):
        try:
            return RpcClient(self.addr_fn(), timeout=5.0)
        except OSError:
            return None

    def run(self):
        c = None
        while not self.stop.is_set():
            if c is None:
                c = self.client()
                if c is None:
                    time.sleep(0.05)
                    continue
            batch = self.rng.sample(self.keys, 4)
            try:
                if self.rng.random() < 0.4:
                    err, res = c.call("kv.set", [batch, [page_of(k) for k in batch]])
                    self.stats["sets"] += 1
                else:
                    err, res = c.call("kv.get", [batch])
                    if err is None:
                        for k, v in zip(batch, res):
                            if v is None:
                                self.stats["misses"] += 1
                            elif v != page_of(k):
                                self.stats["wrong"] += 1
                            else:
                                self.stats["hits"] += 1
            except (OSError, ConnectionError, AssertionError):
                # The node this client talks to was killed or froze.
                c.close()
                c = None
                self.stats["reconnects"] += 1
        if c:
            c.close()


def test_no_wrong_bytes_while_peers_are_killed_and_frozen(cluster, node_factory):
    seed = int(os.environ.get("PEERCACHE_TEST_SEED", random.randrange(1 << 30)))
    print("seed", seed)
    rng = random.Random(seed)
    nodes = cluster(3, "--pool-size", "64mb")
    ports = [n.rpc_port() for n in nodes]
    peers = ",".join("127.0.0.1:%d" % p for p in ports)
    addrs = ["127.0.0.1:%d" % p for p in ports]
    keys = ["oracle-%d" % i for i in range(600)]
    stop = threading.Event()
    workers = [Worker(lambda a=addrs[i % 3]: a, random.Random(rng.random()),
                      keys, stop) for i in range(6)]
    for w in workers:
        w.start()
    t0 = time.time()
    try:
        time.sleep(RUN_S * 0.25)
        # Kill node 2 outright and bring it back on the same port.
        victim = nodes[2]
        victim.proc.kill()
        victim.proc.wait()
        time.sleep(1.0)
        nodes[2] = node_factory("--rpc-port", str(ports[2]), "--peers", peers,
                                "--pool-size", "64mb")
        nodes[2].wait_for("ready")
        time.sleep(RUN_S * 0.2)
        # Freeze node 1 for a few seconds.
        nodes[1].proc.send_signal(signal.SIGSTOP)
        time.sleep(3.0)
        nodes[1].proc.send_signal(signal.SIGCONT)
        time.sleep(max(0.0, RUN_S - (time.time() - t0)))
    finally:
        nodes[1].proc.send_signal(signal.SIGCONT)
        stop.set()
        for w in workers:
            w.join(30)
    stats = {k: sum(w.stats[k] for w in workers) for k in workers[0].stats}
    print("stats", stats)
    assert stats["wrong"] == 0, stats
    assert stats["hits"] > 100, stats
    for n in nodes:
        assert n.proc.poll() is None, n.text()
        assert n.stop() == 0, n.text()
