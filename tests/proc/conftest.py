"""Process-level test helpers: find the build, start and stop peercached.

Every node a test starts is stopped by PID when the test ends (also on
failure). Nodes listen on loopback only, on ports the kernel picks (0).
"""
import os
import random
import re
import signal
import socket
import subprocess
import tempfile
import time

import msgpack
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("PEERCACHE_BUILD_DIR", os.path.join(ROOT, "build"))
PEERCACHED = os.path.join(BUILD, "server", "peercached")
# The sanitizer build: memory figures mean nothing there (freed memory sits
# in ASan's quarantine), but every node's exit checks for leaks instead.
SANITIZED = os.environ.get("PEERCACHE_SANITIZED") == "1"


def clean_env(extra=None):
    """The environment for a node: ours, minus any PEERCACHE_* setting a
    developer may have exported, plus the test's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERCACHE_")}
    # A leak report fails the node's exit status (checked by stop()), also
    # when the test process itself runs without leak checks (shim tests).
    env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0"
    env.update(extra or {})
    return env


def freeze(pid, timeout=10.0):
    """SIGSTOP pid and wait until every one of its threads has stopped: a
    thread that is running when the signal comes may still finish what it
    was doing (answer a read) before it stops, which a test that expects
    silence at once must not see."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.time() + timeout
    while time.time() < deadline:
        states = []
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                    stat = f.read()
            except OSError:
                continue
            states.append(stat[stat.rindex(")") + 2])
        if states and all(st in "Tt" for st in states):
            return
        time.sleep(0.005)
    raise AssertionError("process %d did not stop within %.0f s" % (pid, timeout))


class Node:
    """A running peercached process with its log captured to a file."""

    def __init__(self, args, env=None, tmpdir=None, wrap=()):
        self.tmpdir = tmpdir or tempfile.mkdtemp(prefix="pc-node-")
        self.log_path = os.path.join(self.tmpdir, "node.log")
        self.log = open(self.log_path, "wb")
        # wrap: a command that execs the node (e.g. setpriv), so proc.pid
        # is still the node's. In front of it, setpriv (util-linux) gives
        # the node a parent-death signal and execs on: when the test
        # process dies before its fixtures could stop the node (a shim
        # library aborting Python under a sanitizer, an OOM kill), the
        # node goes with it instead of running on into later tests.
        argv = list(wrap) + [PEERCACHED] + list(args)
        self.proc = subprocess.Popen(["setpriv", "--pdeathsig", "KILL", "--"] + argv,
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     env=clean_env(env))
        # The node's command line, as tests read it to start it again
        # (proc.args[1:] are its arguments when there is no wrap).
        self.proc.args = argv

    def text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    # The node's own "ready" line (server/main.c), not any line that says
    # "ready" or "already": tests that waited for the bare word once went on
    # while the node was still starting and its ports refused connections.
    READY = re.compile(r"\] node \S+ ready \(")

    def wait_for(self, needle, timeout=10.0):
        """Waits until needle is in the log; "ready" means the node's ready
        line (READY)."""
        found = ((lambda t: self.READY.search(t)) if needle == "ready"
                 else (lambda t: needle in t))
        deadline = time.time() + timeout
        while time.time() < deadline:
            if found(self.text()):
                return True
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError("'%s' not seen in node log:\n%s" % (needle, self.text()))

    def endpoint(self, name, timeout=10.0):
        """The address the node logged for an endpoint ("rpc", "socket")."""
        self.wait_for("listening: %s on " % name, timeout)
        m = re.search(r"listening: %s on (\S+)" % name, self.text())
        return m.group(1)

    def rpc_port(self):
        return int(self.endpoint("rpc").rsplit(":", 1)[1])

    def rss_kb(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self, sig=signal.SIGINT, timeout=15.0):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("node did not stop within %ss:\n%s" % (timeout, self.text()))
        self.log.close()
        return self.proc.returncode


@pytest.fixture
def node_factory(tmp_path):
    nodes = []

    def start(*args, env=None, wrap=()):
        args = list(args)
        # Keep every test node off the fixed default ports and paths.
        # No prefault: many nodes at once must not commit all their pools
        # (test_pool.c covers prefault).
        defaults = {"--rpc-port": "0", "--data-port": "0", "--meta-port": "0",
                    "--metrics-port": "0", "--threads": "2", "--pool-prefault": "false",
                    "--socket": str(tmp_path / ("node%d.sock" % len(nodes)))}
        for k, v in defaults.items():
            if k not in args:
                args += [k, v]
        n = Node(args, env=env, tmpdir=tempfile.mkdtemp(dir=str(tmp_path)), wrap=wrap)
        nodes.append(n)
        return n

    yield start
    for n in nodes:
        if n.proc.poll() is None:
            n.proc.kill()
            n.proc.wait()


def run(*args, env=None, timeout=30):
    """Run peercached to completion (for --help, --version, bad configs)."""
    return subprocess.run([PEERCACHED] + list(args), capture_output=True,
                          text=True, env=clean_env(env), timeout=timeout)


class RpcClient:
    """A third-party MessagePack-RPC client: a raw socket and msgpack."""

    def __init__(self, addr, timeout=5.0):
        if addr.startswith("/") or addr.startswith("unix:"):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(addr.replace("unix:", "", 1))
        else:
            host, port = addr.rsplit(":", 1)
            self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.unpacker = msgpack.Unpacker(raw=False)
        self.msgid = 0

    def send(self, method, params):
        self.msgid += 1
        self.sock.sendall(msgpack.packb([0, self.msgid, method, params]))
        return self.msgid

    def recv(self):
        for msg in self.unpacker:
            return msg
        while True:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("closed by the node")
            self.unpacker.feed(data)
            for msg in self.unpacker:
                return msg

    def call(self, method, params=()):
        msgid = self.send(method, list(params))
        msg = self.recv()
        assert msg[0] == 1 and msg[1] == msgid, msg
        return msg[2], msg[3]

    def close(self):
        self.sock.close()


# Below the kernel's ephemeral range (ip_local_port_range, 32768+ by
# default), so a port picked here is not handed out meanwhile to someone
# binding port 0 or connecting (nodes of other tests running in parallel).
_PORT_LO, _PORT_HI = 20000, 31000  # and clear of the defaults (31997+)


def free_ports(n):
    """n distinct loopback ports that were free a moment ago (bound, noted,
    released). Another process may still take one before it is used; callers
    that can, retry (cluster below)."""
    socks, ports = [], []
    rng = random.Random()
    while len(ports) < n:
        port = rng.randrange(_PORT_LO, _PORT_HI)
        if port in ports:
            continue
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        socks.append(s)
        ports.append(port)
    for s in socks:
        s.close()
    return ports


def rpc_result(node, method, params=(), timeout=30.0):
    """One call on node's RPC port that must succeed: its result."""
    c = RpcClient(node.endpoint("rpc"), timeout=timeout)
    try:
        err, res = c.call(method, params)
        assert err is None, (method, err)
        return res
    finally:
        c.close()


def report(msg):
    """A line the suite's summary shows (scripts/test.sh prints every
    report after the tree's tests): printed, and appended to
    BUILD/test-artifacts/reports.txt with the test file's name."""
    print(msg)
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").split("::")[0]
    path = os.path.join(BUILD, "test-artifacts")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "reports.txt"), "a") as f:
        f.write("%s: %s\n" % (os.path.basename(test), msg))


def start_joiner(node_factory, members, *args):
    """A node on a free port whose --peers are members plus itself: returns
    (node, members + [its id]) once it is ready (a port taken meanwhile is
    retried)."""
    for attempt in range(3):
        port = free_ports(1)[0]
        ids = list(members) + ["127.0.0.1:%d" % port]
        d = node_factory("--rpc-port", str(port), "--peers", ",".join(ids),
                         *args)
        try:
            d.wait_for("ready")
            return d, ids
        except AssertionError:
            if "Address already in use" not in d.text() or attempt == 2:
                raise
    raise AssertionError("unreachable")


@pytest.fixture
def cluster(node_factory):
    """start(n, *args): n nodes that name each other in --peers."""

    def start(n=3, *args):
        for attempt in range(3):
            ports = free_ports(n)
            peers = ",".join("127.0.0.1:%d" % p for p in ports)
            nodes = [node_factory("--rpc-port", str(p), "--peers", peers, *args)
                     for p in ports]
            try:
                for nd in nodes:
                    nd.wait_for("ready")
                return nodes
            except AssertionError:
                taken = any("Address already in use" in nd.text() for nd in nodes)
                for nd in nodes:
                    if nd.proc.poll() is None:
                        nd.proc.kill()
                        nd.proc.wait()
                if not taken or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    return start


def recv_all(s):
    """Everything s receives until the peer closes; s is closed after."""
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    return data


def metric_settles(node, name, want, secs=10):
    """Polls the node's metric name until it equals want (or secs pass);
    its last value."""
    deadline = time.monotonic() + secs
    while True:
        v = metrics_of(node)[name]
        if v == want or time.monotonic() > deadline:
            return v
        time.sleep(0.05)


def metrics_of(node):
    """The node's /metrics as {name{labels}: value} (labels without node)."""
    host, port = node.endpoint("metrics").rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
    data = recv_all(s)
    out = {}
    for line in data.split(b"\r\n\r\n", 1)[1].decode().splitlines():
        if not line or line.startswith("#"):
            continue
        name, value = line.rsplit(" ", 1)
        name = re.sub(r'node="[^"]*",?', "", name).replace("{}", "")
        out[name] = float(value)
    return out
