"""The `peercache` command-line tool as an operator uses it: put/get through
files, stdin and stdout (byte for byte), misses, exists/del counts, info,
members, stats, the key and value limits, a cluster secret, an unreachable
node, the terminal guard, and a page put on one node and read on another."""
import os
import pty
import socket
import subprocess

import pytest

from conftest import BUILD, clean_env

CLI = os.path.join(BUILD, "client", "peercache")
COMMANDS = ["put", "get", "exists", "del", "info", "stats", "members"]
VALUE_MAX = (64 << 20) - 4096  # CLI_VALUE_BYTES_MAX in client/peercache_cli.c

pytestmark = pytest.mark.skipif(
    not os.path.exists(CLI),
    reason="%s is not built (the top-level CMakeLists.txt needs "
           "add_subdirectory(client))" % CLI)


def cli(*args, node=None, input=None, env=None, timeout=60):
    """Run peercache; stdout/stderr as bytes."""
    argv = [CLI] + (["--node", node] if node else []) + list(args)
    return subprocess.run(argv, input=input, capture_output=True,
                          env=clean_env(env), timeout=timeout)


def err(res):
    return res.stderr.decode(errors="replace")


def out(res):
    return res.stdout.decode(errors="replace")


def free_port():
    """A port nothing listens on (the kernel's pick, released again)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def node(node_factory):
    n = node_factory()
    n.wait_for(" ready ")
    return n


def test_help_lists_every_command_and_version():
    res = cli("--help")
    assert res.returncode == 0, err(res)
    text = out(res)
    for cmd in COMMANDS:
        assert "\n  %s " % cmd in text, cmd
    for opt in ("--node", "--secret", "--timeout", "PEERCACHE_NODE", "Exit status"):
        assert opt in text
    assert cli("-h").stdout == res.stdout
    res = cli("--version")
    assert res.returncode == 0 and out(res).startswith("peercache ")


def test_usage_errors():
    for args, needle in ((["frob"], "unknown command"),
                         ([], "no command given"),
                         (["--bogus", "info"], "unknown option"),
                         (["--timeout", "soon", "info"], "--timeout"),
                         (["info", "extra"], "too many operands"),
                         (["get"], "missing operand"),
                         (["get", "k", "--node", "x"], "options go before COMMAND")):
        res = cli(*args)
        assert res.returncode == 2, (args, err(res))
        assert needle in err(res), (args, err(res))
        assert res.stdout == b""


def test_put_get_files_stdin_stdout(node, tmp_path):
    sock = node.endpoint("socket")
    value = os.urandom(1 << 20)
    src = tmp_path / "value.bin"
    src.write_bytes(value)

    res = cli("put", "from-file", str(src), node=sock)
    assert res.returncode == 0 and out(res) == "stored\n", err(res)
    res = cli("put", "from-stdin", node=sock, input=value[::-1])
    assert res.returncode == 0 and out(res) == "stored\n", err(res)
    res = cli("put", "dash", "-", node=sock, input=b"small\x00value\n")
    assert res.returncode == 0, err(res)

    dst = tmp_path / "got.bin"
    res = cli("get", "from-file", str(dst), node=sock)
    assert res.returncode == 0 and res.stdout == b"", err(res)
    assert dst.read_bytes() == value
    res = cli("get", "from-stdin", node=sock)  # stdout is a pipe: raw bytes
    assert res.returncode == 0, err(res)
    assert res.stdout == value[::-1]
    res = cli("get", "dash", "-", node=sock)
    assert res.stdout == b"small\x00value\n"
    # Over TCP too, with the node from the environment.
    res = cli("get", "from-file", env={"PEERCACHE_NODE": node.endpoint("rpc")})
    assert res.returncode == 0 and res.stdout == value, err(res)
    assert node.stop() == 0


def test_miss(node, tmp_path):
    sock = node.endpoint("socket")
    dst = tmp_path / "never"
    res = cli("get", "no-such-key", str(dst), node=sock)
    assert res.returncode == 1
    assert err(res) == "miss: no-such-key\n"
    assert res.stdout == b"" and not dst.exists()


def test_exists_and_del_counts(node):
    sock = node.endpoint("socket")
    for k in ("a", "c"):
        assert cli("put", k, node=sock, input=b"v-" + k.encode()).returncode == 0
    res = cli("exists", "a", "b", "c", node=sock)  # a hole at b
    assert out(res) == "1\n" and res.returncode == 1
    res = cli("exists", "a", "c", node=sock)
    assert out(res) == "2\n" and res.returncode == 0
    res = cli("del", "a", "b", "c", node=sock)
    assert out(res) == "2\n" and res.returncode == 0, err(res)
    res = cli("exists", "a", node=sock)
    assert out(res) == "0\n" and res.returncode == 1
    assert cli("get", "c", node=sock).returncode == 1


def test_info_and_members(node):
    sock, rpc = node.endpoint("socket"), node.endpoint("rpc")
    res = cli("info", node=sock)
    assert res.returncode == 0, err(res)
    lines = out(res).splitlines()
    assert any(l.startswith("node_id: ") and len(l) > 9 for l in lines)
    assert "mode: p2p" in lines
    assert "addresses:" in lines
    assert "  rpc: %s" % rpc in lines and "  socket: %s" % sock in lines
    res = cli("members", node=rpc)
    assert res.returncode == 0 and out(res) == "%s self static\n" % rpc, err(res)


def test_stats(node):
    res = cli("stats", node=node.endpoint("socket"))
    assert res.returncode == 0, err(res)
    lines = out(res).splitlines()
    assert lines[0].startswith("node_id: ") and lines[1].startswith("uptime_s: ")
    assert "members: 1" in lines
    metrics = [l for l in lines if l.startswith("peercache_")]
    assert metrics == sorted(metrics) and len(metrics) > 10
    for l in metrics:
        name, value = l.split(" ")
        float(value)
        assert "{" not in name
    assert any(l.startswith("peercache_read_requests_total ") for l in metrics)


def test_stats_without_metrics_endpoint(node_factory):
    n = node_factory("--metrics-enabled", "false")
    n.wait_for(" ready ")
    res = cli("stats", node=n.endpoint("socket"))
    assert res.returncode == 0, err(res)
    assert "metrics: not published" in out(res)
    assert not any(l.startswith("peercache_") for l in out(res).splitlines())


def test_not_stored(node_factory):
    n = node_factory("--pool-size", "1mb")
    n.wait_for(" ready ")
    res = cli("put", "too-big-for-the-pool", node=n.endpoint("socket"),
              input=os.urandom(2 << 20))
    assert res.returncode == 1 and res.stdout == b""
    assert err(res).startswith("peercache: not stored: too-big-for-the-pool")


def test_key_and_value_limits(node, tmp_path):
    sock = node.endpoint("socket")
    res = cli("put", "k" * 513, node=sock, input=b"x")
    assert res.returncode == 2 and "513 bytes" in err(res) and "1..512" in err(res)
    res = cli("exists", "ok", "k" * 600, node=sock)
    assert res.returncode == 2 and "key 2 is 600 bytes" in err(res)
    res = cli("put", "k" * 512, node=sock, input=b"x")
    assert res.returncode == 0, err(res)
    assert cli("get", "k" * 512, node=sock).stdout == b"x"
    res = cli("put", "empty", node=sock, input=b"")
    assert res.returncode == 2 and "empty value" in err(res)
    res = cli("put", "huge", node=sock, input=b"\0" * (VALUE_MAX + 1))
    assert res.returncode == 2 and "value too large" in err(res)
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as f:
        f.truncate(1 << 30)  # refused from its size, not read
    res = cli("put", "huge", str(sparse), node=sock)
    assert res.returncode == 2 and "value too large" in err(res)
    res = cli("put", "x", str(tmp_path / "missing"), node=sock)
    assert res.returncode == 2 and "cannot open" in err(res)


def test_unreachable_node(tmp_path):
    port = free_port()
    res = cli("info", node="127.0.0.1:%d" % port)
    assert res.returncode == 3
    assert "cannot reach 127.0.0.1:%d: connection refused" % port in err(res)
    path = str(tmp_path / "no.sock")
    res = cli("get", "k", node=path)
    assert res.returncode == 3
    assert "cannot reach unix:%s: no such socket file" % path in err(res)
    # A node named by $PEERCACHE_NODE.
    res = cli("info", env={"PEERCACHE_NODE": path})
    assert res.returncode == 3 and path in err(res)


def test_silent_node_times_out():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        res = cli("--timeout", "300ms", "info", node="127.0.0.1:%d" % s.getsockname()[1],
                  timeout=10)
        assert res.returncode == 3 and "no answer within 300 ms" in err(res)
    finally:
        s.close()


def test_cluster_secret(node_factory):
    n = node_factory("--cluster-secret", "s3cret")
    rpc = n.endpoint("rpc")
    n.wait_for(" ready ")
    res = cli("info", node=rpc)
    assert res.returncode == 1 and "unauthorized" in err(res)
    res = cli("--secret", "wrong", "info", node=rpc)
    assert res.returncode == 3 and "authentication failed" in err(res)
    res = cli("put", "k", node=rpc, input=b"v", env={"PEERCACHE_SECRET": "s3cret"})
    assert res.returncode == 0, err(res)
    res = cli("--secret=s3cret", "get", "k", node=rpc)
    assert res.returncode == 0 and res.stdout == b"v", err(res)


def test_terminal_gets_hex_preview(node):
    """get with stdout on a terminal prints hex, never the raw bytes."""
    sock = node.endpoint("socket")
    value = bytes(range(256)) * 4
    assert cli("put", "bin", node=sock, input=value).returncode == 0
    master, slave = pty.openpty()
    proc = subprocess.Popen([CLI, "--node", sock, "get", "bin"], stdout=slave,
                            stderr=subprocess.PIPE, env=clean_env())
    os.close(slave)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    assert proc.wait(10) == 0
    note = proc.stderr.read().decode()
    assert "1024 bytes" in note and "| cat" in note
    assert b"00000000  00 01 02 03" in shown
    assert b"\x00" not in shown and b"\x1b" not in shown
    assert len(shown.splitlines()) == 16  # the first 256 bytes


def test_put_on_one_node_get_on_another(node_factory, tmp_path):
    ports = [free_port() for _ in range(3)]
    while len(set(ports)) < 3:
        ports = [free_port() for _ in range(3)]
    peers = ",".join("127.0.0.1:%d" % p for p in ports)
    nodes = [node_factory("--rpc-port", str(p), "--peers", peers) for p in ports]
    for n in nodes:
        n.wait_for(" ready ")
    a, b, c = ("127.0.0.1:%d" % p for p in ports)
    res = cli("members", node=c)
    assert res.returncode == 0, err(res)
    assert sorted(out(res).splitlines()) == sorted(
        "%s%s static" % (m, " self" if m == c else "") for m in (a, b, c))
    values = {"page-%d" % i: os.urandom(1 << 20) for i in range(4)}
    for k, v in values.items():
        src = tmp_path / k
        src.write_bytes(v)
        res = cli("put", k, str(src), node=a)
        assert res.returncode == 0 and out(res) == "stored\n", err(res)
    for k, v in values.items():
        dst = tmp_path / (k + ".got")
        res = cli("get", k, str(dst), node=c)
        assert res.returncode == 0, err(res)
        assert dst.read_bytes() == v
    res = cli("exists", *values, node=b)
    assert out(res) == "4\n" and res.returncode == 0
    for n in nodes:
        assert n.stop() == 0
