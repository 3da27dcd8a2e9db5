"""The metrics port as an operator and Prometheus see it: /metrics passes
promtool, counters move with known operations, /healthz, malformed and slow
HTTP clients, a taken port, and the switches."""
import re
import shutil
import socket
import subprocess
import time

import pytest

from conftest import RpcClient, run


def http(addr, raw, timeout=3.0):
    """Send raw bytes to addr; return everything the node sends back."""
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=timeout)
    s.sendall(raw)
    out = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    except socket.timeout:
        pass
    s.close()
    return out


def get(addr, path):
    resp = http(addr, ("GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path).encode())
    head, _, body = resp.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, head.decode(), body


def metric(text, name, labels=""):
    """Value of one sample (labels: a substring of its label set)."""
    for line in text.splitlines():
        if line.startswith(name + "{") and labels in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_metrics_pass_promtool(node_factory):
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    n = node_factory()
    c = RpcClient(n.endpoint("rpc"))
    for _ in range(10):
        c.call("node.info")
    status, head, body = get(n.endpoint("metrics"), "/metrics")
    assert status == 200
    assert "text/plain; version=0.0.4" in head
    r = subprocess.run([promtool, "check", "metrics"], input=body,
                       capture_output=True)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()
    assert n.stop() == 0


def test_counters_follow_known_operations(node_factory):
    n = node_factory()
    m = n.endpoint("metrics")
    _, _, before = get(m, "/metrics")
    before = before.decode()
    node_id = re.search(r'node="([^"]*)"', before).group(1)
    c = RpcClient(n.endpoint("rpc"))
    assert c.call("node.info")[1]["node_id"] == node_id
    for _ in range(123):
        assert c.call("node.health")[0] is None
    c.call("no.such.method")
    c.sock.sendall(b"\xc1")  # not msgpack: rejected and closed
    time.sleep(0.2)
    _, _, after = get(m, "/metrics")
    after = after.decode()
    req = 'method="node.health"'
    assert metric(after, "peercache_rpc_requests_total", req) - \
        (metric(before, "peercache_rpc_requests_total", req) or 0) == 123
    assert metric(after, "peercache_rpc_latency_seconds_count", req) >= 123
    assert metric(after, "peercache_rpc_latency_hist_seconds_bucket",
                  req + ',le="+Inf"') >= 123
    assert metric(after, "peercache_rpc_rejected_total", 'reason="not_msgpack"') == 1
    assert metric(after, "peercache_uptime_seconds") > 0
    assert metric(after, "peercache_transport_info", 'transport="tcp"') == 1
    assert metric(after, "peercache_reactor_cqes_total") > 0
    assert metric(after, "peercache_rpc_connections_total") >= 1
    assert n.stop() == 0


def test_healthz_and_dashboard(node_factory):
    n = node_factory()
    m = n.endpoint("metrics")
    status, _, body = get(m, "/healthz")
    assert status == 200 and body == b"ok\n"
    status, head, body = get(m, "/")
    assert status == 200 and "text/html" in head
    assert b"<html" in body.lower() and b"/metrics" in body
    assert "Content-Security-Policy" in head
    status, _, _ = get(m, "/no/such/page")
    assert status == 404
    assert n.stop() == 0


BAD = [
    (b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", (405, 413)),
    (b"DELETE /metrics HTTP/1.1\r\n\r\n", (405,)),
    (b"GET /metrics HTTP/9.9\r\n\r\n", (505,)),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", (505, 400)),
    (b"GET metrics HTTP/1.1\r\n\r\n", (400,)),
    (b"GET /\x00 HTTP/1.1\r\n\r\n", (400,)),
    (b"GET / HTTP/1.1\r\nno colon here\r\n\r\n", (400,)),
    (b"GET / HTTP/1.1\r\n folded: x\r\n\r\n", (400,)),
    (b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", (501, 400)),
    (b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\n\r\n", (414,)),
    (b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(100)) + b"\r\n", (431,)),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", (400,)),
    (b"\x94\x00\x01\xa9node.info\x90", (400,)),
]


@pytest.mark.parametrize("raw,codes", BAD, ids=[str(i) for i in range(len(BAD))])
def test_malformed_http_gets_4xx_or_close(node_factory, raw, codes):
    n = node_factory()
    m = n.endpoint("metrics")
    resp = http(m, raw)
    if resp:
        status = int(resp.split(b" ", 2)[1])
        assert status in codes, resp[:200]
    # The node keeps serving.
    assert get(m, "/healthz")[0] == 200
    assert n.stop() == 0


def test_pipelined_keep_alive_requests(node_factory):
    n = node_factory()
    resp = http(n.endpoint("metrics"),
                b"GET /healthz HTTP/1.1\r\n\r\nHEAD /healthz HTTP/1.1\r\n\r\n"
                b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert resp.count(b"HTTP/1.1 200 OK") == 3
    assert resp.count(b"ok\n") == 2, "HEAD has no body"
    assert n.stop() == 0


def test_slow_client_is_answered_408(node_factory):
    n = node_factory()
    host, port = n.endpoint("metrics").rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=60)
    s.sendall(b"GET /metr")  # and never more
    t0 = time.time()
    resp = s.recv(4096)
    # The head deadline (10 s) answered, not the 30 s idle close; the bound
    # is loose because CI hosts can be far slower than this one.
    assert b" 408 " in resp and time.time() - t0 < 25
    assert "to send a request head; answered 408" in n.text()
    s.close()
    assert n.stop() == 0


def test_port_taken_fails_clearly(node_factory):
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    port = blocker.getsockname()[1]
    r = run("--rpc-port", "0", "--socket", "", "--metrics-port", str(port))
    blocker.close()
    assert r.returncode != 0
    assert "metrics_port %d is in use" % port in r.stderr


def test_switches(node_factory):
    n = node_factory("--metrics-dashboard", "false")
    m = n.endpoint("metrics")
    assert get(m, "/")[0] == 404
    assert get(m, "/metrics")[0] == 200
    assert n.stop() == 0
    n = node_factory("--metrics-enabled", "false")
    n.wait_for("ready")
    assert "listening: metrics" not in n.text()
    assert n.stop() == 0
