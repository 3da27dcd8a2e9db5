"""Issue 10, findings 3, 4 and 9: the RPC and metrics ports under hostile
clients — memory before authentication, connection floods, deadlines, and
protocol hygiene. Every test here failed on the code before the fix."""
import contextlib
import hashlib
import hmac
import os
import resource
import signal
import socket
import struct
import threading
import time

import msgpack
import pytest

from conftest import SANITIZED, RpcClient, metrics_of, report

SECRET = "hardening secret"
MiB = 1 << 20


def proof(snonce, cnonce, role):
    label = ("peercache-auth-v1 %s" % role).encode()
    return hmac.new(SECRET.encode(), label + snonce + cnonce, hashlib.sha256).digest()


def authed_client(node):
    c = RpcClient(node.endpoint("rpc"))
    err, ch = c.call("auth.challenge")
    assert err is None, err
    cn = os.urandom(32)
    err, res = c.call("auth.response", [proof(ch["nonce"], cn, "client"), cn])
    assert err is None, err
    assert res["proof"] == proof(ch["nonce"], cn, "server")
    return c


def addr_of(node, name="rpc"):
    host, port = node.endpoint(name).rsplit(":", 1)
    return host, int(port)


def closed_within(sock, seconds):
    """True when the node closes sock within seconds (reading and dropping
    whatever arrives first)."""
    sock.settimeout(0.2)
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if sock.recv(65536) == b"":
                return True
        except socket.timeout:
            continue
        except OSError:
            return True
    return False


def open_idle(addr, count):
    """count connections to addr that never send a byte."""
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(addr)
        socks.append(s)
    return socks


def wait_for_flood(node, count, seconds=60):
    """Wait until the node has admitted or refused count TCP connections."""
    deadline = time.time() + seconds
    while True:
        m = metrics_of(node)
        seen = (m["peercache_rpc_connections_total"] +
                m["peercache_rpc_connections_refused_total"])
        if seen >= count:
            return
        assert time.time() < deadline, "the node met %d of %d connections" % (
            seen, count)
        time.sleep(0.1)


def raise_nofile(want):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@contextlib.contextmanager
def memory_cgroup(pid, limit):
    """Put pid into a fresh child of our own cgroup-v1 memory cgroup with
    the given limit; yields the cgroup path, or None (then RLIMIT_AS of the
    node is used instead, outside ASan) when none can be made."""
    path = None
    with open("/proc/self/cgroup") as f:
        for line in f:
            parts = line.strip().split(":", 2)
            if len(parts) == 3 and "memory" in parts[1].split(","):
                base = "/sys/fs/cgroup/memory" + parts[2]
                path = os.path.join(base, "pc-hardening-%d" % pid)
    try:
        os.mkdir(path)
        with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit))
        # With swap, RAM alone is no bound: limit memory+swap as well.
        with contextlib.suppress(OSError):
            with open(os.path.join(path, "memory.memsw.limit_in_bytes"), "w") as f:
                f.write(str(limit))
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(pid))
    except (OSError, TypeError):
        with contextlib.suppress(OSError, TypeError):
            os.rmdir(path)
        path = None
        if not SANITIZED:  # ASan reserves terabytes of address space
            resource.prlimit(pid, resource.RLIMIT_AS, (limit * 4, limit * 4))
    try:
        yield path
    finally:
        if path:
            # A node still running (a failed test) moves back to our cgroup.
            with contextlib.suppress(OSError):
                with open(os.path.join(os.path.dirname(path), "cgroup.procs"), "w") as f:
                    f.write(str(pid))
            for _ in range(50):
                try:
                    os.rmdir(path)
                    break
                except OSError:  # the node is still being torn down
                    time.sleep(0.1)


# ------------------------------------------------- finding 3: memory budget


def test_preauth_huge_messages_cannot_exhaust_memory(node_factory):
    """30 pre-auth connections each sending 59 MiB of a declared 60 MiB
    message got the node OOM-killed in a 1.5 GiB cgroup; now each is
    refused at its header and a legitimate client keeps working."""
    n = node_factory("--cluster-secret", SECRET, "--pool-size", "64mb")
    n.wait_for("ready")
    addr = addr_of(n)
    with memory_cgroup(n.proc.pid, 1536 * MiB) as cg:
        good = authed_client(n)
        header = b"\x94\x00\x01" + msgpack.packb("auth.challenge") + b"\x91\xc6" + \
            struct.pack(">I", 60 * MiB)
        body = b"\0" * MiB

        def attack():
            s = socket.create_connection(addr, timeout=10)
            with contextlib.suppress(OSError):
                s.sendall(header)
                for _ in range(59):
                    s.sendall(body)
            s.close()

        threads = [threading.Thread(target=attack) for _ in range(30)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert n.proc.poll() is None, "node died (cgroup %s):\n%s" % (cg, n.text()[-2000:])
        if cg and not SANITIZED:
            with open(os.path.join(cg, "memory.max_usage_in_bytes")) as f:
                peak = int(f.read())
            assert peak < 512 * MiB, "the node's memory peaked at %d MiB" % (peak >> 20)
        assert good.call("node.health")[0] is None
        assert authed_client(n).call("node.info")[0] is None
        assert "rpc_preauth_max_bytes" in n.text()
        m = metrics_of(n)
        assert m['peercache_rpc_rejected_total{reason="too_large"}'] >= 30
        assert m["peercache_rpc_buffered_bytes"] < 64 * MiB
        good.close()
        assert n.stop() == 0


def test_incomplete_messages_of_all_clients_share_one_bound(node_factory):
    """Authenticated clients (no secret here) sending most of big messages:
    the input the node holds for them is bounded as a whole, the client
    that would go over is closed, and the others are served."""
    n = node_factory("--rpc-max-buffered-bytes", "48mb", "--pool-size", "64mb")
    addr = addr_of(n)
    header = b"\x94\x00\x01" + msgpack.packb("node.info") + b"\x91\xc6" + \
        struct.pack(">I", 20 * MiB)
    held = []
    for _ in range(8):
        s = socket.create_connection(addr, timeout=10)
        with contextlib.suppress(OSError):
            s.sendall(header)
            for _ in range(16):
                s.sendall(b"\0" * MiB)
        held.append(s)
    time.sleep(0.3)
    m = metrics_of(n)
    assert m["peercache_rpc_buffer_closes_total"] >= 1
    assert m["peercache_rpc_buffered_bytes"] <= 48 * MiB
    assert RpcClient(n.endpoint("rpc")).call("node.health")[0] is None
    assert "incomplete input" in n.text()
    for s in held:
        s.close()
    assert n.stop() == 0


def test_pipelined_big_replies_are_not_all_held(node_factory):
    """A client pipelining 64 requests for an 8 MiB page without reading
    made the node queue replies until the 64 MiB cap closed it; now reading
    its input pauses while its output is backlogged, and every reply
    arrives once it reads."""
    n = node_factory("--pool-size", "64mb")
    c = RpcClient(n.endpoint("rpc"), timeout=30)
    page = os.urandom(8 * MiB)
    err, res = c.call("kv.set", [["big"], [page]])
    assert err is None and res == [True], (err, res)
    reqs = b"".join(msgpack.packb([0, 100 + i, "kv.get", [["big"]]]) for i in range(64))
    c.sock.sendall(reqs)
    time.sleep(1.0)  # the node serves what it will while we do not read
    m = metrics_of(n)
    assert m["peercache_reactor_out_cap_closes_total"] == 0
    assert m["peercache_reactor_out_pauses_total"] >= 1
    # Far fewer than 64 replies are held at once.
    assert m["peercache_rpc_reply_bytes"] < 24 * MiB, m["peercache_rpc_reply_bytes"]
    for i in range(64):
        msg = c.recv()
        assert msg[1] == 100 + i and msg[2] is None and msg[3][0] == page
    assert c.call("node.health")[0] is None
    c.close()
    assert n.stop() == 0


# ------------------------------------------- finding 4: connection floods


def test_idle_tcp_flood_locks_out_neither_unix_nor_authenticated_clients(node_factory):
    """4,096 idle TCP connections used to fill rpc_max_connections, after
    which Unix-socket clients and peers were reset too."""
    assert raise_nofile(16384) >= 9000
    n = node_factory("--cluster-secret", SECRET, "--pool-size", "64mb")
    addr = addr_of(n)
    before = authed_client(n)
    local = RpcClient(n.endpoint("socket"))
    flood = []
    try:
        flood += open_idle(addr, 4096)
        # Wait until the node has met the whole flood: connects beyond the
        # listen backlogs come back as SYN retries a second or more later,
        # and a newcomer that arrives among them may be refused while every
        # unproven connection is younger than the eviction grace.
        wait_for_flood(n, 4096 + 2)  # and the two clients above
        time.sleep(0.5)
        # Those that were there keep working ...
        assert before.call("node.health")[0] is None
        assert local.call("node.health")[0] is None
        # ... and new ones get in: a Unix-socket client and a TCP client
        # that authenticates.
        assert RpcClient(n.endpoint("socket")).call("node.info")[0] is None
        assert authed_client(n).call("node.info")[0] is None
    finally:
        for s in flood:
            s.close()
    m = metrics_of(n)
    assert m["peercache_rpc_connections_evicted_total"] > 0
    assert n.proc.poll() is None
    assert n.stop() == 0


def test_flood_met_by_one_reactor_locks_no_newcomer_out(node_factory):
    """A reactor drops only its own unproven connections for a newcomer.
    When one reactor met a whole flood (here: the node was stopped while it
    arrived, and the first reactor to run took the class), every new client
    was placed on the other one, which had none to drop, and was reset
    until the handshake deadline freed the class; the flood test above
    failed in CI that way. Such a newcomer is now handed to the reactor
    that holds them. The handshake deadline is long, so nothing else frees
    the class meanwhile. Whether one reactor ends up with them all varies
    from run to run (about 1 in 3 here); the hand-over is checked when it
    does, and test_rpc_guard.c pins it on two reactors every time."""
    flood_n, cap = 4096, 128
    n = node_factory("--cluster-secret", SECRET, "--pool-size", "64mb",
                     "--threads", "2", "--rpc-handshake-timeout", "60s",
                     "--rpc-max-preauth-connections", str(cap))
    addr = addr_of(n)
    flood = []
    os.kill(n.proc.pid, signal.SIGSTOP)
    try:
        try:
            flood += open_idle(addr, flood_n)
            time.sleep(0.3)
        finally:
            os.kill(n.proc.pid, signal.SIGCONT)
        wait_for_flood(n, flood_n)
        time.sleep(0.3)  # every flood connection is past the 100 ms grace
        m = metrics_of(n)
        held = sorted(m['peercache_rpc_tcp_connections{reactor="%d"}' % i]
                      for i in range(2))
        assert sum(held) == cap, held
        for _ in range(10):
            authed_client(n).close()
    finally:
        for s in flood:
            s.close()
    moved = metrics_of(n)["peercache_rpc_connections_moved_total"]
    report("one-reactor flood: unproven connections per reactor %s; "
           "newcomers handed over %d" % (held, moved))
    if held[0] == 0:  # the case this is about: one reactor held them all
        assert moved >= 1
    assert n.proc.poll() is None
    assert n.stop() == 0


def test_client_mid_handshake_outlives_a_burst_of_silent_connections(node_factory):
    """The oldest unproven connection was dropped for a newcomer even when it
    had asked for its challenge and only the answer was outstanding: on a
    loaded host an honest client lost its handshake to an idle flood."""
    n = node_factory("--cluster-secret", SECRET, "--pool-size", "64mb",
                     "--threads", "1", "--rpc-max-preauth-connections", "8")
    addr = addr_of(n)
    c = RpcClient(n.endpoint("rpc"))
    err, ch = c.call("auth.challenge")
    assert err is None, err
    time.sleep(0.3)  # past the 100 ms grace every new connection gets
    flood = []
    try:
        flood += open_idle(addr, 32)
        time.sleep(0.5)
        cn = os.urandom(32)
        err, res = c.call("auth.response", [proof(ch["nonce"], cn, "client"), cn])
        assert err is None, err
        assert res["proof"] == proof(ch["nonce"], cn, "server")
        assert c.call("node.info")[0] is None
    finally:
        for s in flood:
            s.close()
    # The burst filled the class: newcomers beyond it were closed (no silent
    # one was old enough to drop), none of them displaced the client.
    assert n.proc.poll() is None
    assert n.stop() == 0


def test_connections_that_each_ask_one_challenge_cannot_lock_newcomers_out(node_factory):
    """Those that spoke are spared for 1 s only while they are at most half
    of the unproven class: a flood of connections that each send one
    auth.challenge must not refuse a new client for that long."""
    n = node_factory("--cluster-secret", SECRET, "--pool-size", "64mb",
                     "--threads", "1", "--rpc-max-preauth-connections", "8")
    talkers = []
    try:
        for _ in range(8):
            c = RpcClient(n.endpoint("rpc"))
            assert c.call("auth.challenge")[0] is None
            talkers.append(c)
        time.sleep(0.3)  # past the short grace, well within the long one
        assert authed_client(n).call("node.info")[0] is None
    finally:
        for c in talkers:
            c.sock.close()
    assert n.stop() == 0


def scrape_during_flood(node, tries=3):
    """A scrape while the flood's dropped SYNs are still being retried by
    the kernel (the listen backlog is far below 2,000): on a loaded host the
    scrape's own connection can be the oldest idle one from its address
    before the node has read its request, and be dropped for a newcomer. A
    scraper tries again (Prometheus does, next interval); an idle flood that
    locked scrapes out would fail every try."""
    for i in range(tries):
        try:
            return metrics_of(node)
        except (ConnectionResetError, BrokenPipeError, IndexError):
            if i == tries - 1:
                raise
            time.sleep(0.2)


def test_metrics_scrape_gets_through_idle_floods(node_factory):
    """The metrics port (64 connections) refused a scrape while 2,000 idle
    connections sat on it."""
    assert raise_nofile(16384) >= 9000
    n = node_factory("--pool-size", "64mb")
    maddr = addr_of(n, "metrics")
    raddr = addr_of(n)
    flood = []
    try:
        for target in (maddr, raddr):
            flood += open_idle(target, 2000)
        time.sleep(0.5)
        for _ in range(3):
            m = scrape_during_flood(n)
            assert "peercache_uptime_seconds" in m
        assert m["peercache_http_connections_evicted_total"] > 0
        assert RpcClient(n.endpoint("rpc")).call("node.health")[0] is None
    finally:
        for s in flood:
            s.close()
    assert n.stop() == 0


def test_deadlines_close_silent_slow_and_idle_connections(node_factory):
    n = node_factory("--cluster-secret", SECRET, "--rpc-handshake-timeout", "1s",
                     "--rpc-message-timeout", "2s", "--rpc-idle-timeout", "2s")
    addr = addr_of(n)
    silent = socket.create_connection(addr)
    half_auth = RpcClient(n.endpoint("rpc"))
    assert half_auth.call("auth.challenge")[0] is None
    slow = authed_client(n)
    t0 = time.time()
    # The silent and the half-authenticated connections go after ~1 s.
    assert closed_within(silent, 3.5)
    assert closed_within(half_auth.sock, 1.0)
    # Slowloris: one byte of a request every 0.4 s.
    raw = msgpack.packb([0, 9, "node.info", [b"x" * 200]])
    closed = False
    for b in raw:
        try:
            slow.sock.sendall(bytes([b]))
        except OSError:
            closed = True
            break
        if closed_within(slow.sock, 0.4):
            closed = True
            break
    assert closed, "a message trickling in was not cut off"
    assert time.time() - t0 < 8
    # An active connection stays; an idle one goes after ~2 s.
    idle = authed_client(n)
    busy = authed_client(n)
    for _ in range(5):
        assert busy.call("node.health")[0] is None
        time.sleep(0.6)
    assert closed_within(idle.sock, 0.1)
    text = n.text()
    assert "not authenticated within rpc_handshake_timeout" in text
    assert "rpc_message_timeout" in text
    assert "idle for rpc_idle_timeout" in text
    assert metrics_of(n)["peercache_rpc_connections_timed_out_total"] >= 4
    assert n.stop() == 0


# ------------------------------------------------- finding 9: hygiene


def test_malformed_message_closes_after_earlier_replies(node_factory):
    n = node_factory()
    # Two valid pipelined requests, then a byte that is not MessagePack.
    c = RpcClient(n.endpoint("rpc"))
    c.sock.sendall(msgpack.packb([0, 1, "node.health", []]) +
                   msgpack.packb([0, 2, "node.health", []]) + b"\xc1")
    assert [c.recv()[1], c.recv()[1]] == [1, 2]
    assert closed_within(c.sock, 2.0)
    # A well-formed MessagePack object that is not an RPC message is
    # logged "closing" and the connection really closes.
    c = RpcClient(n.endpoint("rpc"))
    c.sock.sendall(msgpack.packb([0, 3, "node.health", []]) + msgpack.packb({"a": 1}))
    assert c.recv()[1] == 3
    assert closed_within(c.sock, 2.0)
    assert "closing" in n.text()
    assert RpcClient(n.endpoint("rpc")).call("node.health")[0] is None
    assert n.stop() == 0


def test_unknown_method_reply_is_valid_utf8(node_factory):
    n = node_factory()
    c = RpcClient(n.endpoint("rpc"))
    bad = b"no\xff\xfe\xc3(\x00method\\"
    c.sock.sendall(b"\x94\x00\x07" + bytes([0xa0 | len(bad)]) + bad + b"\x90")
    err, res = c.recv()[2:]  # a strict UTF-8 decoder reads the reply
    assert err["code"] == "unknown_method" and res is None
    assert "\\xff\\xfe\\xc3(\\x00method\\x5c" in err["message"], err["message"]
    assert c.call("node.health")[0] is None
    assert n.stop() == 0
