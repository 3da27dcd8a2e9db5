"""The RPC port as a third party sees it: node.info over TCP and the Unix
socket with a raw socket and msgpack, the malformed-input corpus, limits,
and who may call (cluster secret, peer credentials, loopback-only bind)."""
import glob
import hashlib
import hmac
import os
import socket
import time

import msgpack
import pytest

from conftest import SANITIZED, RpcClient, run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = sorted(glob.glob(os.path.join(ROOT, "tests", "corpus", "rpc-malformed", "*.bin")))


def test_node_info_over_tcp_and_unix(node_factory):
    n = node_factory()
    rpc = n.endpoint("rpc")
    sock = n.endpoint("socket")
    for addr in (rpc, sock):
        c = RpcClient(addr)
        err, info = c.call("node.info")
        assert err is None
        assert info["mode"] == "p2p"
        assert info["version"]
        assert info["node_id"]
        assert info["addresses"]["rpc"] == rpc
        assert info["addresses"]["socket"] == sock
        assert info["uptime_s"] >= 0
        err, health = c.call("node.health")
        assert err is None and health["status"] == "ok"
        c.close()
    assert n.stop() == 0


def test_pipelined_calls_on_one_connection(node_factory):
    n = node_factory()
    c = RpcClient(n.endpoint("rpc"))
    ids = [c.send("node.health", []) for _ in range(200)]
    got = sorted(c.recv()[1] for _ in ids)
    assert got == sorted(ids)
    c.close()
    assert n.stop() == 0


def test_notification_gets_no_reply(node_factory):
    n = node_factory()
    c = RpcClient(n.endpoint("rpc"))
    c.sock.sendall(msgpack.packb([2, "node.health", []]))
    err, res = c.call("node.info")  # the next reply is for this call
    assert err is None and res["mode"] == "p2p"
    assert n.stop() == 0


def test_error_shapes(node_factory):
    n = node_factory()
    c = RpcClient(n.endpoint("rpc"))
    err, res = c.call("no.such.method")
    assert res is None and err["code"] == "unknown_method"
    c.sock.sendall(msgpack.packb([0, 99, "node.info", {}]))
    msg = c.recv()
    assert msg[1] == 99 and msg[2]["code"] == "bad_request"
    err, _ = c.call("node.info")
    assert err is None, "the connection keeps serving after errors"
    assert n.stop() == 0


def replay(addr, data, deadline_s=1.0):
    """Send data, half-close, and wait for an error reply or a close.
    Returns 'error', 'closed' or 'silent'."""
    s = socket.create_connection(addr, timeout=deadline_s)
    try:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
    except OSError:
        return "closed"
    unpacker = msgpack.Unpacker(raw=False)
    end = time.time() + deadline_s
    try:
        while time.time() < end:
            s.settimeout(max(0.01, end - time.time()))
            chunk = s.recv(65536)
            if not chunk:
                return "closed"
            unpacker.feed(chunk)
            for msg in unpacker:
                if isinstance(msg, list) and len(msg) == 4 and msg[0] == 1 and msg[2]:
                    return "error"
    except socket.timeout:
        return "silent"
    except OSError:
        return "closed"
    finally:
        s.close()
    return "silent"


def test_malformed_corpus_is_refused_and_the_node_keeps_serving(node_factory):
    assert len(CORPUS) >= 100
    n = node_factory("--rpc-max-message-bytes", "1mb", "--rpc-max-elements", "65536")
    host, port = n.endpoint("rpc").rsplit(":", 1)
    addr = (host, int(port))
    good = RpcClient(n.endpoint("rpc"))
    outcomes = {}
    for path in CORPUS:
        with open(path, "rb") as f:
            data = f.read()
        t0 = time.time()
        outcome = replay(addr, data)
        took = time.time() - t0
        name = os.path.basename(path)
        assert outcome in ("error", "closed"), "%s: no error and no close within 1 s" % name
        assert took < 1.5, "%s took %.2f s" % (name, took)
        outcomes[name] = outcome
        assert n.proc.poll() is None, "node died on " + name
        err, res = good.call("node.health")
        assert err is None and res["status"] == "ok", name
    # Inputs with a readable msgid get an error reply.
    assert outcomes[[k for k in outcomes if k.endswith("unknown-method.bin")][0]] == "error"
    assert outcomes[[k for k in outcomes if k.endswith("params-map.bin")][0]] == "error"
    assert "http request" in n.text().lower() or "HTTP request" in n.text()
    good.close()
    assert n.stop() == 0


@pytest.mark.skipif(SANITIZED, reason="ASan's quarantine holds freed memory; "
                    "this build checks leaks at exit instead")
def test_hostile_connections_do_not_grow_memory(node_factory):
    n = node_factory("--threads", "1")
    host, port = n.endpoint("rpc").rsplit(":", 1)
    addr = (host, int(port))
    hostile = [open(p, "rb").read() for p in CORPUS]
    for data in hostile:  # warm up allocator caches
        replay(addr, data, 0.5)
    base = n.rss_kb()
    for _ in range(3):
        for data in hostile:
            replay(addr, data, 0.5)
    grown = n.rss_kb() - base
    assert grown < 4096, "RSS grew by %d kB over %d hostile connections" % (grown, 3 * len(hostile))
    c = RpcClient(n.endpoint("rpc"))
    assert c.call("node.health")[0] is None
    assert n.stop() == 0


def test_max_connections(node_factory):
    n = node_factory("--rpc-max-connections", "4")
    host, port = n.endpoint("rpc").rsplit(":", 1)
    keep = [RpcClient(n.endpoint("rpc")) for _ in range(4)]
    for c in keep:
        assert c.call("node.health")[0] is None
    extra = socket.create_connection((host, int(port)), timeout=2)
    extra.settimeout(2)
    assert extra.recv(10) == b"", "the fifth connection is closed"
    extra.close()
    keep[0].close()
    time.sleep(0.2)
    again = RpcClient(n.endpoint("rpc"))
    assert again.call("node.health")[0] is None
    assert "rpc_max_connections" in n.text()
    assert n.stop() == 0


def test_message_over_the_size_limit_closes(node_factory):
    n = node_factory("--rpc-max-message-bytes", "64kb")
    c = RpcClient(n.endpoint("rpc"))
    c.sock.sendall(msgpack.packb([0, 1, "node.info", [b"x" * 100000]]))
    with pytest.raises((ConnectionError, OSError)):
        c.recv()
    assert "message over the size limit" in n.text()
    assert n.stop() == 0


# ------------------------------------------------------------- who may call


def proof(secret, snonce, cnonce, role):
    label = ("peercache-auth-v1 %s" % role).encode()
    return hmac.new(secret.encode(), label + snonce + cnonce, hashlib.sha256).digest()


def test_secret_requires_challenge_response(node_factory):
    n = node_factory("--cluster-secret", "correct horse")
    c = RpcClient(n.endpoint("rpc"))
    err, _ = c.call("node.info")
    assert err["code"] == "unauthorized"
    err, ch = c.call("auth.challenge")
    assert err is None and ch["alg"] == "hmac-sha256" and len(ch["nonce"]) == 32
    cnonce = os.urandom(32)
    err, res = c.call("auth.response", [proof("correct horse", ch["nonce"], cnonce, "client"), cnonce])
    assert err is None
    assert res["proof"] == proof("correct horse", ch["nonce"], cnonce, "server")
    err, info = c.call("node.info")
    assert err is None and info["mode"] == "p2p"
    # The Unix socket is checked by peer credentials, not the secret.
    u = RpcClient(n.endpoint("socket"))
    assert u.call("node.info")[0] is None
    # A wrong proof is refused and the connection closed.
    w = RpcClient(n.endpoint("rpc"))
    _, ch = w.call("auth.challenge")
    err, _ = w.call("auth.response", [proof("wrong", ch["nonce"], cnonce, "client"), cnonce])
    assert err["code"] == "unauthorized"
    with pytest.raises((ConnectionError, OSError)):
        w.call("node.info")
    # Replaying an old proof on a new challenge fails too.
    r = RpcClient(n.endpoint("rpc"))
    _, ch2 = r.call("auth.challenge")
    err, _ = r.call("auth.response", [proof("correct horse", ch["nonce"], cnonce, "client"), cnonce])
    assert err["code"] == "unauthorized"
    assert "wrong cluster secret" in n.text()
    assert "correct horse" not in n.text(), "the secret never reaches the log"
    assert n.stop() == 0


def test_repeated_unauthenticated_calls_close_the_connection(node_factory):
    n = node_factory("--cluster-secret", "s")
    c = RpcClient(n.endpoint("rpc"))
    for _ in range(2):
        assert c.call("node.info")[0]["code"] == "unauthorized"
    with pytest.raises((ConnectionError, OSError)):
        c.call("node.info")
        c.call("node.info")
    assert n.stop() == 0


def test_non_loopback_bind_needs_a_secret():
    r = run("--bind", "0.0.0.0", "--rpc-port", "0", "--socket", "")
    assert r.returncode == 2
    assert "needs cluster_secret" in r.stderr


@pytest.fixture
def open_socket_dir():
    """A socket path in a directory another user can reach (pytest's tmp
    dirs are 0700); the directory is removed after the test."""
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="pc-sock-", dir="/tmp")
    os.chmod(d, 0o755)
    yield os.path.join(d, "node.sock")
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_unix_socket_refuses_other_users(node_factory, open_socket_dir):
    n = node_factory("--socket", open_socket_dir)
    path = n.endpoint("socket")
    pid = os.fork()
    if pid == 0:  # child: become nobody and try
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            c = RpcClient(path)
            err, _ = c.call("node.info")
            code = 0 if err and err["code"] == "unauthorized" else 3
        except Exception:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0, "nobody was not refused (%d)" % os.WEXITSTATUS(status)
    assert "refusing unix uid=65534" in n.text()
    # Allowed by group.
    assert n.stop() == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_unix_socket_admits_the_configured_group(node_factory, open_socket_dir):
    n = node_factory("--socket-group", "65534", "--socket", open_socket_dir)
    path = n.endpoint("socket")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            c = RpcClient(path)
            err, res = c.call("node.health")
            code = 0 if err is None and res["status"] == "ok" else 3
        except Exception:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert n.stop() == 0
