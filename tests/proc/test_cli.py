"""The `peercache` command-line tool as an operator uses it: put/get through
files, stdin and stdout (byte for byte), misses, exists/del counts, info,
members, stats, the key and value limits, a cluster secret, an unreachable
node, the terminal guard, and a page put on one node and read on another;
then (issue 19) help for every command, config with the secret redacted,
flush (refused without --yes; pool, disk and records), drain (sets refused,
reads served, undone), stats --watch rates, and --json on the read
commands."""
import json
import os
import pty
import socket
import subprocess

import pytest

from conftest import BUILD, RpcClient, clean_env, metrics_of, rpc_result

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


# ---------------------------------------------------------------- issue 19:
# help per command, config, flush, drain, stats --watch, --json

ALL_COMMANDS = COMMANDS + ["config", "flush", "drain", "wait-ready"]


def test_help_for_every_command():
    text = out(cli("--help"))
    for cmd in ALL_COMMANDS:
        assert "\n  %s " % cmd in text, cmd
    assert "\n  help [COMMAND] " in text and "--json" in text
    assert "flush without --yes" in text  # an exit status of 2
    for cmd in ALL_COMMANDS:
        a, b = cli("help", cmd), cli(cmd, "--help")
        assert a.returncode == 0 and b.returncode == 0, (cmd, err(a), err(b))
        assert a.stdout == b.stdout and a.stderr == b"", cmd
        page = out(a)
        assert page.startswith("Usage: peercache [OPTIONS] %s" % cmd), page
        assert "Exit status: 0 " in page and "3 the node cannot be" in page
    assert "--count N" in out(cli("help", "stats"))
    assert "--yes" in out(cli("help", "flush"))
    assert "--off" in out(cli("help", "drain"))
    assert "--json" in out(cli("help", "config"))
    res = cli("help", "frob")
    assert res.returncode == 2 and "unknown command" in err(res)


def test_command_option_errors():
    for args, needle in ((["flush", "--json"], "flush takes no --json"),
                         (["info", "--yes"], "info takes no --yes"),
                         (["put", "k", "--json"], "put takes no --json"),
                         (["--json", "del", "k"], "del has no --json"),
                         (["stats", "--count", "2"], "--count goes with --watch"),
                         (["stats", "--watch", "0"], "--watch takes"),
                         (["stats", "--watch", "1s", "--count", "0"], "--count takes"),
                         (["drain", "now"], "too many operands"),
                         (["config", "--bogus"], "unknown option")):
        res = cli(*args)
        assert res.returncode == 2, (args, err(res))
        assert needle in err(res), (args, err(res))
        assert res.stdout == b""


def secret_file(tmp_path, text):
    path = tmp_path / "secret"
    path.write_text(text + "\n")
    os.chmod(path, 0o600)
    return str(path)


def test_config_shows_settings_and_redacts_the_secret(node_factory, tmp_path):
    secret = "Very-Secret-Value-%d" % os.getpid()
    sfile = secret_file(tmp_path, secret)
    n = node_factory("--cluster-secret-file", sfile, "--pool-size", "96mb")
    n.wait_for("ready")
    sock, rpc = n.endpoint("socket"), n.endpoint("rpc")
    res = cli("config", node=sock)
    assert res.returncode == 0, err(res)
    lines = out(res).splitlines()
    assert "cluster_secret = ***" in lines
    assert "cluster_secret_file = %s" % sfile in lines
    assert "pool_size = 96mb" in lines and "mode = p2p" in lines
    assert secret not in out(res) + err(res)
    # every key of the node's table, as `peercached --print-config` has it
    assert len(lines) == len([l for l in lines if " = " in l]) > 50
    # over TCP the call needs the secret, like every other call
    res = cli("config", node=rpc)
    assert res.returncode == 1 and "unauthorized" in err(res), err(res)
    assert res.stdout == b""
    res = cli("--secret-file", sfile, "config", "--json", node=rpc)
    assert res.returncode == 0, err(res)
    got = json.loads(out(res))
    assert got["cluster_secret"] == "***" and secret not in out(res)
    assert got["pool_size"] == "96mb" and got["cluster_secret_file"] == sfile
    assert len(got) == len(lines)
    # without a secret it says "" (nothing to hide, nothing redacted)
    plain = node_factory()
    plain.wait_for("ready")
    lines = out(cli("config", node=plain.endpoint("socket"))).splitlines()
    assert 'cluster_secret = ""' in lines


def test_json_outputs_parse(node):
    sock = node.endpoint("socket")
    assert cli("put", "j1", node=sock, input=b"v").returncode == 0
    info = json.loads(out(cli("info", "--json", node=sock)))
    assert info["mode"] == "p2p" and info["draining"] is False
    assert info["addresses"]["socket"] == sock
    # --json may also come before the command
    assert json.loads(out(cli("--json", "info", node=sock)))["pid"] == info["pid"]
    members = json.loads(out(cli("members", "--json", node=sock)))
    assert members["view"] is None  # no discovery on this node
    assert [m["id"] for m in members["members"]] == [node.endpoint("rpc")]
    res = cli("exists", "j1", "nope", "--json", node=sock)
    assert res.returncode == 1 and json.loads(out(res)) == {"keys": 2, "exist": 1}
    res = cli("exists", "--json", "j1", node=sock)
    assert res.returncode == 0 and json.loads(out(res)) == {"keys": 1, "exist": 1}
    # a key that looks like an option, after --
    res = cli("exists", "--", "--json", node=sock)
    assert res.returncode == 1 and out(res) == "0\n"
    stats = json.loads(out(cli("stats", "--json", node=sock)))
    assert stats["node_id"] == info["node_id"] and stats["uptime_s"] > 0
    assert stats["metrics_address"] == node.endpoint("metrics")
    assert stats["metrics"]["peercache_write_pages_total"] >= 1
    assert stats["metrics"]["peercache_node_draining"] == 0
    assert len(stats["members"]) == 1
    config = json.loads(out(cli("config", "--json", node=sock)))
    assert config["mode"] == "p2p"


def test_stats_watch_gives_rates(node):
    sock = node.endpoint("socket")
    res = cli("stats", "--watch", "300ms", "--count", "2", node=sock)
    assert res.returncode == 0, err(res)
    text = out(res)
    heads = [l for l in text.splitlines() if l.startswith("--- ")]
    assert len(heads) == 2, text
    assert "sample 1: counters since the node started" in heads[0]
    assert "sample 2: counters per second over " in heads[1]
    second = text.split(heads[1])[1].splitlines()[1:]
    assert any(l.startswith("peercache_read_requests_total ") and
               l.endswith("/s") for l in second), second
    assert any(l == "peercache_node_draining 0" for l in second)
    # JSON: one object per line; rates = counter deltas / interval
    res = cli("stats", "--watch", "300ms", "--count", "2", "--json", node=sock)
    assert res.returncode == 0, err(res)
    docs = [json.loads(l) for l in out(res).splitlines()]
    assert len(docs) == 2 and [d["sample"] for d in docs] == [1, 2]
    first, then = docs
    assert first["interval_s"] is None and first["rates"] == {}
    assert then["interval_s"] >= 0.25
    assert set(then["rates"]) == set(then["counters"])
    # the node's own scrapes count between the samples: a rate above 0
    assert then["rates"]["peercache_http_requests_total"] > 0
    for name, rate in then["rates"].items():
        delta = then["counters"][name] - first["counters"][name]
        assert abs(rate * then["interval_s"] - delta) < 1e-6 * max(1, delta), name
    assert "peercache_pool_keys" in then["gauges"]


def test_flush_needs_yes(node):
    sock = node.endpoint("socket")
    assert cli("put", "keep", node=sock, input=b"v").returncode == 0
    res = cli("flush", node=sock)
    assert res.returncode == 2 and res.stdout == b""
    assert "--yes" in err(res) and "every page" in err(res)
    assert cli("exists", "keep", node=sock).returncode == 0


def test_flush_drops_pages_and_their_records(cluster):
    a, b = cluster(2, "--pool-size", "64mb")
    keys = ["flush-%d" % i for i in range(300)]  # more than one slice
    for k in keys[:3]:
        assert cli("put", k, node=a.endpoint("socket"), input=k.encode()).returncode == 0
    assert rpc_result(a, "kv.set", [keys[3:], [k.encode() for k in keys[3:]]]) \
        == [True] * (len(keys) - 3)
    res = cli("exists", *keys, node=b.endpoint("socket"))
    assert out(res) == "%d\n" % len(keys), err(res)
    res = cli("flush", "--yes", node=a.endpoint("socket"))
    assert res.returncode == 0, err(res)
    assert out(res) == ("flushed: %d pages from the pool, 0 more from the "
                        "disk tier\n" % len(keys))
    # gone here, and no record sends b to a for them
    assert out(cli("exists", *keys, node=a.endpoint("socket"))) == "0\n"
    assert out(cli("exists", keys[0], node=b.endpoint("socket"))) == "0\n"
    assert metrics_of(a)["peercache_pool_keys"] == 0
    recs = sum(metrics_of(n)["peercache_directory_records"] for n in (a, b))
    assert recs == 0, recs
    assert "flush done: %d pool pages" % len(keys) in a.text()
    # the node stores again at once
    assert cli("put", "after", node=a.endpoint("socket"), input=b"x").returncode == 0
    res = cli("flush", "--yes", node=a.endpoint("rpc"))
    assert out(res).startswith("flushed: 1 pages"), err(res)


def test_flush_drops_disk_pages_too(node_factory, tmp_path):
    from test_disk_tier import disk_node, set_through
    n = disk_node(node_factory, tmp_path / "store")
    cl = RpcClient(n.endpoint("rpc"))
    keys = ["d-%d" % i for i in range(48)]  # 3x what the 1 MiB pool holds
    set_through(n, cl, keys)
    cl.close()
    m = metrics_of(n)
    in_pool = int(m["peercache_pool_keys"])
    assert m["peercache_disk_keys"] == len(keys) and in_pool < len(keys)
    res = cli("flush", "--yes", node=n.endpoint("socket"))
    assert res.returncode == 0, err(res)
    assert out(res) == ("flushed: %d pages from the pool, %d more from the "
                        "disk tier\n" % (in_pool, len(keys) - in_pool))
    m = metrics_of(n)
    assert m["peercache_disk_keys"] == 0 and m["peercache_pool_keys"] == 0
    assert out(cli("exists", *keys, node=n.endpoint("socket"))) == "0\n"


def test_flush_is_refused_in_slotmap_mode(node_factory):
    n = node_factory("--mode", "slotmap", "--pool-size", "64mb")
    n.wait_for("ready")
    res = cli("flush", "--yes", node=n.endpoint("socket"))
    assert res.returncode == 1 and "unsupported" in err(res), err(res)
    assert "slotmap" in err(res)


def test_drain_refuses_sets_and_serves_reads(node):
    from test_hardening_session import Client
    sock = node.endpoint("socket")
    assert cli("put", "before", node=sock, input=b"old").returncode == 0
    res = cli("drain", node=sock)
    assert res.returncode == 0 and out(res).startswith("draining: "), err(res)
    assert "draining: sets store nothing" in node.text()
    # sets: not stored, and the CLI says why
    res = cli("put", "during", node=sock, input=b"new")
    assert res.returncode == 1 and "draining" in err(res), err(res)
    assert rpc_result(node, "kv.set", [["r1", "r2"], [b"a", b"b"]]) == [False, False]
    c = Client(sock)
    c.register()
    c.mem[0:5] = b"hello"
    assert c.call("session.set", [c.rid, [["s1", 0, 5], ["s2", 0, 5]]]) == [False, False]
    # reads are served, from the CLI and through a session
    res = cli("get", "before", node=sock)
    assert res.returncode == 0 and res.stdout == b"old"
    assert c.call("session.get", [c.rid, [["before", 8, 3]]]) == [True]
    assert bytes(c.mem[8:11]) == b"old"
    assert cli("exists", "during", "r1", "s1", node=sock).stdout == b"0\n"
    # visible: info, the gauge, the refusals by method, node.health
    assert "draining: true" in out(cli("info", node=sock)).splitlines()
    m = metrics_of(node)
    assert m["peercache_node_draining"] == 1
    assert m['peercache_writes_refused_draining_total{method="kv.set"}'] == 3
    assert m['peercache_writes_refused_draining_total{method="session.set"}'] == 2
    assert rpc_result(node, "node.health")["draining"] is True
    res = cli("drain", node=sock)
    assert res.returncode == 0 and "(already)" in out(res)
    # off again: stored
    res = cli("drain", "--off", node=sock)
    assert res.returncode == 0 and out(res).startswith("not draining"), err(res)
    assert cli("put", "during", node=sock, input=b"new").returncode == 0
    assert c.call("session.set", [c.rid, [["s1", 0, 5]]]) == [True]
    c.close()
    assert cli("get", "s1", node=sock).stdout == b"hello"
    assert metrics_of(node)["peercache_node_draining"] == 0
    assert json.loads(out(cli("info", "--json", node=sock)))["draining"] is False
