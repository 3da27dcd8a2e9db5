"""A node stopped while calls to a frozen peer are pending exits cleanly.

Three nodes; node B publishes pages, then is SIGSTOPped. Node A gets
kv.get / kv.set / kv.exists calls (pipelined on one raw connection, never
waiting for a reply) and a session.get through its Unix socket, all touching
B: directory lookups and publishes to B as an owner, data reads from B's
pool. With long deadlines (10 s) every one is still pending when A receives
SIGTERM; or a peer-health probe of the
suspect B is in flight. A must finish them all (with a failure or a miss) at once:
well within shutdown_grace (never "shutdown grace expired"), free everything
and exit 0 — under ASan with no leak report.

Before the fix, the calls on connections the stop closed failed with
ESHUTDOWN, but the next round of a lookup opened a new connection to the
frozen peer during the drain and waited there until the grace expired; and
completions armed as zero-delay timers while the last connection closed were
dropped when the loop ended (the directory job, the kv fetch waiting on it
and the session call waiting on that leaked). A suspect report during the
stop could also post to a reactor that had already been freed.
"""
import os
import signal
import time

import pytest

from conftest import RpcClient, metrics_of
from test_hardening_frozen import Session
from test_p2p import page as oracle_page

PAGE = 2048
KEYS = 48        # pages B publishes; about a third have B as first owner
GRACE_S = 8     # --shutdown-grace: long, so waiting for it shows
STOP_S = 4.0     # the stop takes well under that (slack: a noisy host, ASan)


def page(key):
    return oracle_page(key, PAGE)


def sanitizer_report(text):
    return "LeakSanitizer" in text or "ERROR: AddressSanitizer" in text \
        or "runtime error:" in text


def wait_probe(node, timeout=10.0):
    """Until node has sent a peer-health probe (one is then in flight)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metrics_of(node).get("peercache_peer_probes_total", 0) >= 1:
            return
        time.sleep(0.05)
    raise AssertionError("no probe sent:\n" + node.text())


@pytest.mark.parametrize("client", ["rpc", "session", "probe"])
def test_stop_with_calls_pending_on_a_frozen_peer(cluster, client):
    if client == "probe":
        # Short call timeouts make B suspect soon; a probe (timeout: twice
        # the 2 s interval) is then in flight when A stops.
        timing = ("--request-deadline", "1s", "--rpc-timeout", "300ms",
                  "--peer-probe-interval", "2s")
    else:
        timing = ("--request-deadline", "10s", "--rpc-timeout", "10s")
    a, b, c = cluster(3, "--shutdown-grace", "%ds" % GRACE_S, *timing)
    keys = ["sd-%d" % i for i in range(KEYS)]
    cb = RpcClient(b.endpoint("rpc"))
    err, ok = cb.call("kv.set", [keys, [page(k) for k in keys]])
    assert err is None and ok == [True] * KEYS, (err, ok)
    cb.close()

    os.kill(b.proc.pid, signal.SIGSTOP)
    try:
        if client == "rpc":
            ca = RpcClient(a.endpoint("rpc"), timeout=30)
            for i in range(0, KEYS, 8):  # lookups, then reads from B
                ca.send("kv.get", [keys[i:i + 8]])
            new = ["sd-new-%d" % i for i in range(24)]
            for i in range(0, len(new), 6):  # publishes to B as an owner
                ca.send("kv.set", [new[i:i + 6], [page(k) for k in new[i:i + 6]]])
            for i in range(0, KEYS, 12):
                ca.send("kv.exists", [keys[i:i + 12]])
        elif client == "session":
            ca = Session(a.endpoint("socket"), KEYS * PAGE)
            ca.send("session.get", [1, [[k, i * PAGE, PAGE]
                                        for i, k in enumerate(keys)]])
        else:
            ca = RpcClient(a.endpoint("rpc"), timeout=30)
            err, got = ca.call("kv.get", [keys])  # B does not answer
            assert err is None, err
            wait_probe(a)
        time.sleep(1.0)  # everything reached B's socket and waits there
        assert a.proc.poll() is None
        t0 = time.monotonic()
        a.proc.send_signal(signal.SIGTERM)
        try:
            a.proc.wait(GRACE_S + 4)
        except Exception:
            pass
        took = time.monotonic() - t0
        ca.close()
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    rc = a.stop(timeout=10)
    text = a.text()
    assert not sanitizer_report(text), text
    assert rc == 0, text
    assert "shutdown grace" not in text, text
    assert took < STOP_S, (took, text)
    for n in (b, c):
        assert n.stop() == 0, n.text()
