"""Issue 10, findings 5 and 8, and metrics_bind: who may use a node.

Out of the box (no cluster secret) only the node's own user, root and the
members of socket_group may read, write or delete pages, on every port: the
Unix socket checks SO_PEERCRED and loopback TCP the owner of the client's
socket (sock_diag). Another local user (here uid 65534, "nobody") is refused
on the RPC port and the data port alike, and cannot poison a page that a
reader on a third node then gets. A secret is read from a private file or the
environment; one given on the command line is blanked out of
/proc/PID/cmdline and the node says so.
"""
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import textwrap
import time

import msgpack
import pytest

from conftest import BUILD, RpcClient, run as run_node

NOBODY = 65534

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="switching to another user needs root and setpriv")

# A client that runs as another user: connects, sends each request, prints
# the replies (or how the connection ended) as one msgpack blob on stdout.
FOREIGN = textwrap.dedent("""
    import socket, sys, msgpack
    host, port, reqs = sys.argv[1], int(sys.argv[2]), msgpack.unpackb(bytes.fromhex(sys.argv[3]))
    out = []
    s = socket.create_connection((host, port), timeout=5)
    u = msgpack.Unpacker(raw=False)
    try:
        for r in reqs:
            s.sendall(msgpack.packb(r))
            rep = None
            while rep is None:
                d = s.recv(65536)
                if not d:
                    out.append("closed"); break
                u.feed(d); rep = next(u, None)
            if rep is None:
                break
            out.append(rep)
    except OSError as e:
        out.append("error: %s" % e)
    sys.stdout.buffer.write(msgpack.packb(out))
""")


def run(*args):
    """peercached to completion, on ports it picks (a node that should
    have refused to start must not take the default ports)."""
    return run_node("--rpc-port", "0", "--data-port", "0", "--meta-port", "0",
                    "--metrics-port", "0", "--threads", "1", *args, timeout=15)


def as_user(uid, args, gid=None):
    gid = uid if gid is None else gid
    cmd = ["setpriv", "--reuid=%d" % uid, "--regid=%d" % gid, "--clear-groups",
           "/usr/bin/python3"] + args
    return subprocess.run(cmd, capture_output=True, timeout=30)


def foreign_calls(port, reqs, uid=NOBODY, gid=None):
    p = as_user(uid, ["-c", FOREIGN, "127.0.0.1", str(port),
                      msgpack.packb(reqs).hex()], gid)
    assert p.returncode == 0, p.stderr.decode()
    return msgpack.unpackb(p.stdout, raw=False)


def data_port_of(node):
    return int(node.endpoint("data").rsplit(":", 1)[1])


def test_other_user_cannot_read_write_or_delete_over_tcp(cluster):
    a, b, c = cluster(3, "--pool-size", "64mb")
    page = os.urandom(4096)
    ca = RpcClient("127.0.0.1:%d" % a.rpc_port())
    assert ca.call("kv.set", [["victim"], [page]]) == (None, [True])
    reqs = [[0, 1, "kv.get", [["victim"]]],
            [0, 2, "kv.set", [["victim"], [b"x" * 4096]]],
            [0, 3, "kv.delete", [["victim"]]],
            [0, 4, "node.info", []]]
    for nd in (a, b):
        out = foreign_calls(nd.rpc_port(), reqs)
        # The first call is refused and the connection closes.
        assert isinstance(out[0], list), out
        assert out[0][2]["code"] == "unauthorized", out
        assert out[0][3] is None
        assert all(o == "closed" or (isinstance(o, str) and o.startswith("error"))
                   for o in out[1:]), out
        assert "refusing 127.0.0.1" in nd.text()
    # The page is intact and the same on every node: nothing was
    # overwritten, deleted or poisoned.
    for nd in (a, b, c):
        cl = RpcClient("127.0.0.1:%d" % nd.rpc_port())
        assert cl.call("kv.get", [["victim"]]) == (None, [page])
        cl.close()
    ca.close()


def test_other_user_cannot_publish_directory_records(cluster):
    a, b = cluster(2, "--pool-size", "64mb")
    rec = ["evil", "127.0.0.1:1", "127.0.0.1:2", 0, 1, 16, 1, True]
    out = foreign_calls(a.rpc_port(), [[0, 1, "dir.put", [["k"], [rec]]]])
    assert out[0][2]["code"] == "unauthorized", out


def test_other_user_is_closed_on_the_data_port(node_factory):
    n = node_factory("--pool-size", "64mb")
    n.wait_for("ready")
    port = data_port_of(n)
    # A READ request for the pool's first bytes (rkey and address guessed:
    # the connection must close before any answer).
    req = struct.pack("<IHHIIQQ", 0x31444350, 1, 0, 1, 64, 0, 7)
    script = textwrap.dedent("""
        import socket, sys
        s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
        try:
            s.sendall(bytes.fromhex(sys.argv[2]))
            d = s.recv(64)
            print("closed" if not d else "answered %d" % len(d))
        except OSError as e:
            print("closed (%s)" % e.strerror)
    """)
    p = as_user(NOBODY, ["-c", script, str(port), req.hex()])
    assert p.stdout.decode().startswith("closed"), p.stdout + p.stderr
    assert "refusing a data connection from uid=65534" in n.text()
    # The node's own user still gets an answer (an error for a bad rkey,
    # but an answer).
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(req)
    assert len(s.recv(24)) > 0
    s.close()


def test_socket_group_admits_its_members_over_tcp(node_factory):
    n = node_factory("--pool-size", "64mb", "--socket-group", str(NOBODY))
    n.wait_for("ready")
    out = foreign_calls(n.rpc_port(), [[0, 1, "node.health", []]],
                        uid=NOBODY, gid=NOBODY)
    assert out[0][2] is None, out
    # A user outside the group is still refused.
    out = foreign_calls(n.rpc_port(), [[0, 1, "node.health", []]],
                        uid=NOBODY - 1, gid=NOBODY - 1)
    assert out[0][2]["code"] == "unauthorized", out


def test_secret_on_the_command_line_is_blanked_and_warned(node_factory):
    n = node_factory("--cluster-secret", "hunter2-very-secret")
    n.wait_for("ready")
    with open("/proc/%d/cmdline" % n.proc.pid, "rb") as f:
        cmdline = f.read()
    assert b"hunter2" not in cmdline
    assert "given on the command line" in n.text()
    # Still the secret the node uses: a client without it is refused.
    c = RpcClient("127.0.0.1:%d" % n.rpc_port())
    c.send("node.info", [])
    assert c.recv()[2]["code"] == "unauthorized"
    c.close()


def test_secret_file_rules(node_factory, tmp_path):
    f = tmp_path / "secret"
    f.write_text("s3cret-from-file\n")
    f.chmod(0o644)
    r = run("--cluster-secret-file", str(f), "--socket", "")
    assert r.returncode == 2
    assert "accessible to every user" in r.stderr and "chmod 600" in r.stderr
    f.chmod(0o600)
    r = run("--cluster-secret-file", str(f), "--cluster-secret", "x", "--socket", "")
    assert r.returncode == 2 and "set only one" in r.stderr
    empty = tmp_path / "empty"
    empty.write_text("\n")
    empty.chmod(0o600)
    r = run("--cluster-secret-file", str(empty), "--socket", "")
    assert r.returncode == 2 and "empty" in r.stderr

    n = node_factory("--cluster-secret-file", str(f))
    n.wait_for("ready")
    assert "given on the command line" not in n.text()
    tool = os.path.join(BUILD, "client", "peercache")
    node = "127.0.0.1:%d" % n.rpc_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERCACHE_")}
    ok = subprocess.run([tool, "--node", node, "--secret-file", str(f), "info"],
                        capture_output=True, text=True, env=env, timeout=30)
    assert ok.returncode == 0, ok.stderr
    assert "warning" not in ok.stderr
    env["PEERCACHE_SECRET_FILE"] = str(f)
    ok = subprocess.run([tool, "--node", node, "info"], capture_output=True,
                        text=True, env=env, timeout=30)
    assert ok.returncode == 0, ok.stderr
    del env["PEERCACHE_SECRET_FILE"]
    bad = subprocess.run([tool, "--node", node, "info"], capture_output=True,
                         text=True, env=env, timeout=30)
    assert bad.returncode != 0
    warn = subprocess.run([tool, "--node", node, "--secret", "s3cret-from-file", "info"],
                          capture_output=True, text=True, env=env, timeout=30)
    assert warn.returncode == 0 and "visible to every local user" in warn.stderr


def test_secret_from_the_environment(node_factory):
    n = node_factory(env={"PEERCACHE_CLUSTER_SECRET": "env-secret"})
    n.wait_for("ready")
    assert "given on the command line" not in n.text()
    assert "cluster authentication on" in n.text()


def test_metrics_beyond_loopback_needs_the_same_opt_in_as_bind():
    r = run("--metrics-bind", "0.0.0.0", "--socket", "")
    assert r.returncode == 2
    assert "metrics_bind" in r.stderr and "cluster_secret" in r.stderr
    r = run("--metrics-bind", "127.0.0.2", "--socket", "", "--print-config")
    assert r.returncode == 0, r.stderr


# Send, then close at once: by the time the node accepts, the client's
# socket is an orphan, for which the kernel reports uid 0. It must not pass
# for root (found in review: 889 of 4,000 such writes got through).
SEND_AND_CLOSE = textwrap.dedent("""
    import socket, sys, msgpack
    port, n = int(sys.argv[1]), int(sys.argv[2])
    req = msgpack.packb([0, 1, "kv.set", [["victim"], [b"EVIL" * 1024]]])
    socks = []
    for i in range(n):
        s = socket.socket()
        s.bind(("127.1.%d.%d" % (1 + i // 250, 1 + i % 250), 0))
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        socks.append(s)
    for s in reversed(socks):
        try:
            s.send(req)
        except OSError:
            pass
        s.close()
""")


def test_a_client_that_closed_at_once_is_not_taken_for_root(node_factory):
    n = node_factory("--pool-size", "64mb", "--threads", "1")
    n.wait_for("ready")
    page = os.urandom(4096)
    c = RpcClient("127.0.0.1:%d" % n.rpc_port())
    assert c.call("kv.set", [["victim"], [page]]) == (None, [True])
    c.call("kv.delete", [["victim"]])
    for _ in range(2):
        p = as_user(NOBODY, ["-c", SEND_AND_CLOSE, str(n.rpc_port()), "3000"])
        assert p.returncode == 0, p.stderr.decode()
    time.sleep(1.0)
    assert c.call("kv.get", [["victim"]]) == (None, [None])
    c.close()


HOLD_UNIX = textwrap.dedent("""
    import socket, sys, time
    path, n = sys.argv[1], int(sys.argv[2])
    socks = []
    for i in range(n):
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(path)
        except OSError:
            break
        socks.append(s)
    print(len(socks), flush=True)
    time.sleep(float(sys.argv[3]))
""")


def test_other_users_cannot_fill_the_local_client_slots(node_factory):
    d = tempfile.mkdtemp(prefix="pc-sec-")
    os.chmod(d, 0o755)
    sock = os.path.join(d, "node.sock")
    try:
        n = node_factory("--pool-size", "64mb", "--socket", sock,
                         "--rpc-max-local-connections", "64",
                         "--rpc-max-preauth-connections", "64")
        n.wait_for("ready")
        flood = subprocess.Popen(
            ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY,
             "--clear-groups", "/usr/bin/python3", "-c", HOLD_UNIX, sock, "300", "8"],
            stdout=subprocess.PIPE)
        try:
            assert int(flood.stdout.readline() or b"0") > 0
            # The owner's local clients still get in, every one of them.
            clients = [RpcClient(sock) for _ in range(32)]
            for c in clients:
                assert c.call("node.health", [])[0] is None
                c.close()
        finally:
            flood.kill()
            flood.wait()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_before_authentication_only_a_few_messages_are_answered(node_factory):
    """Public calls (auth.challenge) and unknown methods did not count: an
    unauthenticated client could pipeline them and fill the reply budget."""
    n = node_factory("--cluster-secret", "s3cret-pre")
    n.wait_for("ready")
    s = socket.create_connection(("127.0.0.1", n.rpc_port()), timeout=5)
    s.sendall(b"".join(msgpack.packb([0, i, "auth.challenge", []]) for i in range(200)))
    u = msgpack.Unpacker(raw=False)
    replies = 0
    while True:
        try:
            d = s.recv(65536)
        except ConnectionResetError:
            break
        if not d:
            break
        u.feed(d)
        replies += sum(1 for _ in u)
    s.close()
    assert 2 <= replies <= 8, replies
    assert "too many messages before authentication" in n.text()
