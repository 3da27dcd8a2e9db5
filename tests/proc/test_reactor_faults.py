"""Injected faults in the reactor under load (issue 18, item 4): three
nodes built with PEERCACHE_FAULT_INJECTION run with
PEERCACHE_TEST_REACTOR_FAULTS (reactor/fault.h): connection submissions
refused as if the ring stayed full, short sends and reads, errors
(-ECONNRESET, -ETIMEDOUT, -EIO) right after I/O, receive buffers held back
on a 16-buffer ring so that receives meet -ENOBUFS — on every client, peer
and data connection, at random from a printed seed. Meanwhile kv.* and
session clients (test_soak's workers) set and get pages on every node and
check every byte. Checked: no wrong page,
no node dies, each one still serves, and each stops cleanly (in the
sanitizer tree: no leak, no error report). A second test makes the node's
own allocations fail (PEERCACHE_TEST_ALLOC_FAULTS, server/fault_alloc.h)
under the same load and checks the same. The disk tier's EIO hook is
exercised by test_disk_faults.py.

FAULTS_SEED replays a run; FAULTS_RATE sets the rate (default 0.01),
ALLOC_FAULTS_RATE the allocation failures' (default 0.001); FAULTS_SECONDS
the length of each (default 15)."""
import os
import random
import time

import pytest

from conftest import RpcClient, free_ports, metrics_of, report
from test_soak import run_load

SEED = int(os.environ.get("FAULTS_SEED", str(random.SystemRandom().randrange(1 << 30))))
RATE = float(os.environ.get("FAULTS_RATE", "0.01"))
SECONDS = float(os.environ.get("FAULTS_SECONDS", "15"))


def metrics_retry(node):
    """/metrics, again when an injected fault cut the answer short."""
    for attempt in range(20):
        try:
            return metrics_of(node)
        except (OSError, IndexError, ValueError):
            time.sleep(0.1)
    return metrics_of(node)


def start_cluster(node_factory, n, env, extra=()):
    for attempt in range(3):
        ports = free_ports(n)
        peers = ",".join("127.0.0.1:%d" % p for p in ports)
        nodes = [node_factory("--rpc-port", str(p), "--peers", peers,
                              "--pool-size", "64mb", *extra, env=env)
                 for p in ports]
        try:
            for nd in nodes:
                nd.wait_for("ready", 30)
            return nodes
        except AssertionError:
            for nd in nodes:
                if nd.proc.poll() is None:
                    nd.proc.kill()
                    nd.proc.wait()
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def load_under_faults(nodes, what):
    """The soak's load on nodes for SECONDS: no node dies, no wrong page,
    and afterwards every node still answers (a call may meet an injected
    fault: retry). Returns (calls, failed calls)."""
    def alive():
        for n in nodes:
            assert n.proc.poll() is None, n.text()[-3000:]
    results = run_load(nodes, SEED, SECONDS, alive, 1.0)
    calls = sum(r[1] for r in results)
    errors = sum(r[2] for r in results)
    wrong = sum(r[3] for r in results)
    assert wrong == 0, results
    assert calls > 100 and errors < calls, results
    for n in nodes:
        for attempt in range(50):
            try:
                c = RpcClient(n.endpoint("rpc"), timeout=5)
                err, res = c.call("node.health")
                c.close()
                if err is None and res["status"] == "ok":
                    break
            except (OSError, ConnectionError, AssertionError):
                pass
            time.sleep(0.1)
        else:
            raise AssertionError("%s: node %s does not answer" % (
                what, n.endpoint("rpc")))
    return calls, errors


def test_reactor_faults_under_load(node_factory):
    env = {"PEERCACHE_TEST_REACTOR_FAULTS": "rate=%g,seed=%d" % (RATE, SEED)}
    # The smallest receive-buffer ring: with buffers held back now and
    # then, receives find it empty (-ENOBUFS) and must carry on.
    nodes = start_cluster(node_factory, 3, env, ("--reactor-buf-count", "16"))
    if "fault injection in the reactor is on" not in nodes[0].text():
        pytest.skip("this build has no PEERCACHE_FAULT_INJECTION")
    report("reactor faults: seed %d, rate %g (replay: FAULTS_SEED=%d)" % (
        SEED, RATE, SEED))
    calls, errors = load_under_faults(nodes, "reactor faults")
    ms = [metrics_retry(n) for n in nodes]
    refused = sum(v for m in ms for k, v in m.items()
                  if k.startswith("peercache_rpc_errors_total"))
    empty = sum(v for m in ms for k, v in m.items()
                if k.startswith("peercache_reactor_bufring_exhausted"))
    assert empty > 0, "no receive found the buffer ring empty"
    for n in nodes:
        assert n.stop() == 0, n.text()[-3000:]
    report("reactor faults: %d calls, %d failed, 0 wrong; rpc errors %d; "
           "receives that found the buffer ring empty %d" % (
               calls, errors, refused, empty))


ALLOC_RATE = float(os.environ.get("ALLOC_FAULTS_RATE", "0.001"))


def test_allocation_failures_under_load(node_factory):
    """The node's own allocations fail at random (server/fault_alloc.h:
    malloc, calloc, realloc and strdup from the project's code, from the
    ready line to the stop) while the same load runs. Every failure must
    become a clean error — a call answered with an error or false, a
    connection closed, a page not stored — never a crash, a hang, a wrong
    page or a leak. (Found at once: a reply that could not be queued left
    a hole in the stream and the client read garbage; now the connection
    closes.)"""
    env = {"PEERCACHE_TEST_ALLOC_FAULTS": "rate=%g,seed=%d" % (ALLOC_RATE, SEED)}
    nodes = start_cluster(node_factory, 3, env)
    if "allocation failures are on" not in nodes[0].text():
        pytest.skip("this build has no PEERCACHE_FAULT_INJECTION")
    report("allocation faults: seed %d, rate %g (replay: FAULTS_SEED=%d)" % (
        SEED, ALLOC_RATE, SEED))
    calls, errors = load_under_faults(nodes, "allocation faults")
    injected = []
    for n in nodes:
        assert n.stop() == 0, n.text()[-3000:]
        m = [l for l in n.text().splitlines()
             if "allocation failures injected:" in l]
        injected.append(int(m[-1].rsplit(":", 1)[1]) if m else 0)
    assert sum(injected) > 0, injected
    report("allocation faults: %d calls, %d failed, 0 wrong; allocations "
           "failed per node %s" % (calls, errors, injected))
