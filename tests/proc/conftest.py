"""Process-level test helpers: find the build, start and stop peercached.

Every node a test starts is stopped by PID when the test ends (also on
failure). Nodes listen on loopback only, on ports the kernel picks (0).
"""
import os
import signal
import subprocess
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("PEERCACHE_BUILD_DIR", os.path.join(ROOT, "build"))
PEERCACHED = os.path.join(BUILD, "server", "peercached")


def clean_env(extra=None):
    """The environment for a node: ours, minus any PEERCACHE_* setting a
    developer may have exported, plus the test's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERCACHE_")}
    env.update(extra or {})
    return env


class Node:
    """A running peercached process with its log captured to a file."""

    def __init__(self, args, env=None, tmpdir=None):
        self.tmpdir = tmpdir or tempfile.mkdtemp(prefix="pc-node-")
        self.log_path = os.path.join(self.tmpdir, "node.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([PEERCACHED] + list(args),
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     env=clean_env(env))

    def text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def wait_for(self, needle, timeout=10.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if needle in self.text():
                return True
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError("'%s' not seen in node log:\n%s" % (needle, self.text()))

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

    def start(*args, env=None):
        n = Node(args, env=env, tmpdir=str(tmp_path))
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
