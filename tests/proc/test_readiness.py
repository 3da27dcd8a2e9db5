"""Start-up and readiness (issue 12, item 6), and the members metric (item 7):
a node with a large pool (prefault on) answers and says it is ready quickly;
`peercache wait-ready` waits for a node that is not there yet and gives up
with exit 1; /healthz and node.health say "ok" once ready; the README's
3-node example runs as a script; peercache_member_info lists the ring
members. (Bytes read on every path: test_metrics_paths.py, which loads
libpeercache and so runs with the shim tests.) Bounds here are generous:
they catch a node that waits for its whole pool, not a slow machine."""
import os
import re
import signal
import socket
import subprocess
import time

import pytest

from conftest import BUILD, SANITIZED, RpcClient, clean_env, metrics_of
from test_metrics import get

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CLI = os.path.join(BUILD, "client", "peercache")
SLACK = 3 if SANITIZED else 1


def wait_ready(node, *opts, timeout=60):
    return subprocess.run([CLI, "--node", node] + list(opts) + ["wait-ready"],
                          capture_output=True, text=True, timeout=timeout)


def test_large_pool_ready_at_once(node_factory, tmp_path):
    sock = str(tmp_path / "big.sock")
    t0 = time.monotonic()
    n = node_factory("--pool-size", "8gb", "--pool-prefault", "true", "--socket", sock)
    res = wait_ready(sock, "--timeout", "60s")
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("ready: unix:" + sock), res.stdout
    # Not a performance bound: the whole 8 GiB pool takes many seconds to
    # fault in here; a node that waited for it would be far over this.
    assert took < 5 * SLACK, took
    err, health = RpcClient(n.endpoint("rpc")).call("node.health")
    assert err is None and health["status"] == "ok", (err, health)
    status, _, body = get(n.endpoint("metrics"), "/healthz")
    assert (status, body) == (200, b"ok\n")
    # The pool was not committed before serving: at most a part of it is
    # resident now (the prefault runs behind the listeners).
    assert n.rss_kb() < 8 * 1024 * 1024, n.rss_kb()
    assert n.stop() == 0


def test_wait_ready_gives_up(tmp_path):
    sock = str(tmp_path / "nobody.sock")
    t0 = time.monotonic()
    res = wait_ready(sock, "--timeout", "700ms")
    took = time.monotonic() - t0
    assert res.returncode == 1, res
    assert "not ready after 0.7 s" in res.stderr and "no such socket" in res.stderr, res.stderr
    assert 0.7 <= took < 10, took


def test_wait_ready_waits_for_a_late_node(node_factory, tmp_path):
    sock = str(tmp_path / "late.sock")
    waiter = subprocess.Popen([CLI, "--node", sock, "--timeout", "60s", "wait-ready"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        assert waiter.poll() is None  # nothing there yet: still waiting
        node_factory("--socket", sock)
        out, err = waiter.communicate(timeout=60)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    assert waiter.returncode == 0, err
    assert out.startswith("ready: unix:" + sock), out


def member_series(node):
    return {k: v for k, v in metrics_of(node).items()
            if k.startswith("peercache_member_info{")}


def test_member_info_lists_the_ring(cluster):
    nodes = cluster(3)
    ids = sorted(n.endpoint("rpc") for n in nodes)
    for n in nodes:
        series = member_series(n)
        assert len(series) == 3 and set(series.values()) == {1.0}, series
        me = n.endpoint("rpc")
        for m in ids:
            self_ = "true" if m == me else "false"
            state = "self" if m == me else "alive"
            key = ('peercache_member_info{member="%s",addr="%s",self="%s",state="%s"}'
                   % (m, m, self_, state))
            assert key in series, (key, series)


def readme_cluster_script():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text[text.index("## A 3-node cluster on one machine"):]
    m = re.search(r"```sh\n(.*?)```", section, re.S)
    return m.group(1)


def test_readme_cluster_example_runs_as_a_script(tmp_path):
    """The README's 3-node example, verbatim, as a non-interactive script
    (in a scratch directory whose build/ is this build)."""
    script = readme_cluster_script()
    ports = [int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", script.splitlines()[0])]
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the node does
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                pytest.skip("port %d is taken" % port)
    os.symlink(BUILD, str(tmp_path / "build"))
    proc = subprocess.Popen(["bash", "-c", script], cwd=str(tmp_path), env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        # The nodes are in the script's process group: none may outlive it.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    assert "connection refused" not in err, err
    lines = out.splitlines()
    assert [ln for ln in lines if ln.startswith("ready: ")] == [
        ln for ln in lines[:3]] and len(lines) >= 3, out
    assert "stored" in lines and "identical" in lines, out
    members = [ln for ln in lines if ln.startswith("127.0.0.1:")]
    assert sorted(m.split()[0] for m in members) == ["127.0.0.1:%d" % p for p in ports], out
