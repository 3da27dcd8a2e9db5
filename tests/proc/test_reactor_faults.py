"""Injected faults in the reactor under load (issue 18, item 4): three
nodes built with PEERCACHE_FAULT_INJECTION run with
PEERCACHE_TEST_REACTOR_FAULTS (reactor/fault.h): connection submissions
refused as if the ring stayed full, short sends and reads, resets right
after I/O — on every client, peer and data connection, at random from a
printed seed. Meanwhile kv.* and session clients (test_soak's workers) set
and get pages on every node and check every byte. Checked: no wrong page,
no node dies, each one still serves, and each stops cleanly (in the
sanitizer tree: no leak, no error report). The disk tier's EIO hook is
exercised by test_disk_faults.py.

FAULTS_SEED replays a run; FAULTS_RATE sets the rate (default 0.01);
FAULTS_SECONDS the length (default 20)."""
import os
import random
import time

import pytest

from conftest import RpcClient, free_ports, metrics_of, report
from test_soak import run_load

SEED = int(os.environ.get("FAULTS_SEED", str(random.SystemRandom().randrange(1 << 30))))
RATE = float(os.environ.get("FAULTS_RATE", "0.01"))
SECONDS = float(os.environ.get("FAULTS_SECONDS", "20"))


def metrics_retry(node):
    """/metrics, again when an injected fault cut the answer short."""
    for attempt in range(20):
        try:
            return metrics_of(node)
        except (OSError, IndexError, ValueError):
            time.sleep(0.1)
    return metrics_of(node)


def start_cluster(node_factory, n, env):
    for attempt in range(3):
        ports = free_ports(n)
        peers = ",".join("127.0.0.1:%d" % p for p in ports)
        nodes = [node_factory("--rpc-port", str(p), "--peers", peers,
                              "--pool-size", "64mb", env=env)
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


def test_reactor_faults_under_load(node_factory):
    env = {"PEERCACHE_TEST_REACTOR_FAULTS": "rate=%g,seed=%d" % (RATE, SEED)}
    nodes = start_cluster(node_factory, 3, env)
    if "fault injection in the reactor is on" not in nodes[0].text():
        pytest.skip("this build has no PEERCACHE_FAULT_INJECTION")
    report("reactor faults: seed %d, rate %g (replay: FAULTS_SEED=%d)" % (
        SEED, RATE, SEED))
    def alive():
        for n in nodes:
            assert n.proc.poll() is None, n.text()[-3000:]
    results = run_load(nodes, SEED, SECONDS, alive, 1.0)
    calls = sum(r[1] for r in results)
    errors = sum(r[2] for r in results)
    wrong = sum(r[3] for r in results)
    assert wrong == 0, results
    assert calls > 100 and errors < calls, results
    # every node still answers (a call may meet an injected reset: retry)
    for n in nodes:
        for attempt in range(20):
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
            raise AssertionError("node %s does not answer" % n.endpoint("rpc"))
    refused = sum(v for n in nodes for k, v in metrics_retry(n).items()
                  if k.startswith("peercache_rpc_errors_total"))
    for n in nodes:
        assert n.stop() == 0, n.text()[-3000:]
    report("reactor faults: %d calls, %d failed, 0 wrong; rpc errors %d" % (
        calls, errors, refused))
