"""The node under systemd without systemd (issue 19, item 2): the readiness
protocol against a datagram socket the test binds, as systemd's manager
would (a path and an abstract '@' name; the sender's pid checked through
SCM_CREDENTIALS, as NotifyAccess=main does): READY=1 once the ready line is
logged and the listeners accept, RELOADING=1 with MONOTONIC_USEC= then
READY=1 around a SIGHUP, STOPPING=1 on SIGTERM; an address form the node
does not speak (vsock) is a warning, not a failure. And the journal form
of the log: with JOURNAL_STREAM naming stderr's device and inode, each line
starts with its syslog priority (<3> <4> <6>) and has no timestamp; with
JOURNAL_STREAM naming another file, the usual form."""
import os
import re
import signal
import socket
import struct
import subprocess
import time

import pytest

from conftest import PEERCACHED, clean_env

STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (ERROR|WARN |INFO |DEBUG)")


class Manager:
    """The service manager's end of NOTIFY_SOCKET: a datagram socket that
    receives the node's messages with the sender's credentials."""

    def __init__(self, tmp_path, abstract):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            name = "pc-test-notify-%d-%s" % (os.getpid(), os.urandom(4).hex())
            self.sock.bind("\0" + name)
            self.addr = "@" + name
        else:
            self.addr = str(tmp_path / "notify")
            self.sock.bind(self.addr)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)

    def recv(self, timeout=30.0):
        """The next message as (fields, sender pid); fails after timeout."""
        self.sock.settimeout(timeout)
        try:
            data, anc, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
        except socket.timeout:
            raise AssertionError("no sd_notify message within %.0f s" % timeout)
        pid = None
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid = struct.unpack("3i", payload[:12])[0]
        fields = dict(line.split("=", 1) for line in data.decode().split("\n") if line)
        return fields, pid

    def close(self):
        self.sock.close()


def start(tmp_path, env, *args, log=None):
    """peercached on kernel-picked ports with its output in log (a path)."""
    log = log or str(tmp_path / "node.log")
    out = open(log, "ab")
    argv = [PEERCACHED, "--rpc-port", "0", "--data-port", "0", "--meta-port", "0",
            "--metrics-port", "0", "--threads", "1", "--pool-size", "64mb",
            "--pool-prefault", "false", "--socket", str(tmp_path / "node.sock")] + list(args)
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=clean_env(env))
    out.close()
    return proc, log


def text(log):
    with open(log, "rb") as f:
        return f.read().decode(errors="replace")


def wait_ready(proc, log, timeout=30):
    """Until the node's ready line is in log (it must not exit first)."""
    deadline = time.time() + timeout
    while not re.search(r"\] node \S+ ready \(", text(log)):
        assert proc.poll() is None and time.time() < deadline, text(log)
        time.sleep(0.05)


def stop(proc, sig=signal.SIGTERM):
    """Signal proc (unless sig is None: it was signalled already) and wait
    for its exit status."""
    if sig is not None and proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("node did not stop within 30 s")


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_ready_reload_stopping(tmp_path, abstract):
    mgr = Manager(tmp_path, abstract)
    proc, log = start(tmp_path, {"NOTIFY_SOCKET": mgr.addr})
    try:
        fields, pid = mgr.recv()
        assert fields.get("READY") == "1", fields
        assert pid == proc.pid, "sent by pid %s, not the node's %d" % (pid, proc.pid)
        assert "ready" in fields.get("STATUS", ""), fields
        # Sent after the ready line, once the listeners accept.
        t = text(log)
        assert re.search(r"\] node \S+ ready \(", t), t
        rpc = re.search(r"listening: rpc on 127\.0\.0\.1:(\d+)", t)
        assert rpc, t
        socket.create_connection(("127.0.0.1", int(rpc.group(1))), timeout=10).close()

        before = time.monotonic_ns() // 1000
        proc.send_signal(signal.SIGHUP)
        fields, pid = mgr.recv()
        assert fields.get("RELOADING") == "1", fields
        assert pid == proc.pid
        # The same clock as systemd's (CLOCK_MONOTONIC), taken at the reload.
        usec = int(fields["MONOTONIC_USEC"])
        assert before <= usec <= time.monotonic_ns() // 1000, (before, usec)
        fields, pid = mgr.recv()
        assert fields.get("READY") == "1", fields
        assert "SIGHUP received" in text(log)

        proc.send_signal(signal.SIGTERM)
        fields, pid = mgr.recv()
        assert fields.get("STOPPING") == "1", fields
        assert stop(proc, None) == 0, text(log)
    finally:
        stop(proc, signal.SIGKILL)
        mgr.close()


def test_no_notify_socket_no_message(tmp_path):
    """Without NOTIFY_SOCKET the node sends nothing (a bound socket the node
    was not told about stays silent) and logs no sd_notify line."""
    mgr = Manager(tmp_path, abstract=False)
    proc, log = start(tmp_path, {})
    try:
        wait_ready(proc, log)
        assert stop(proc) == 0
        mgr.sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            mgr.sock.recv(4096)
        assert "sd_notify" not in text(log)
    finally:
        stop(proc, signal.SIGKILL)
        mgr.close()


def journal_run(tmp_path, name, same_stream, *args, env=None, ready=True):
    """Run a node with its output in tmp_path/name and JOURNAL_STREAM naming
    that file (same_stream) or another one; returns the log's text."""
    log = str(tmp_path / name)
    open(log, "wb").close()
    other = str(tmp_path / (name + ".other"))
    open(other, "wb").close()
    st = os.stat(log if same_stream else other)
    env = dict(env or {}, JOURNAL_STREAM="%d:%d" % (st.st_dev, st.st_ino))
    proc, _ = start(tmp_path, env, *args, log=log)
    try:
        if ready:
            wait_ready(proc, log)
            assert stop(proc) == 0, text(log)
        else:
            proc.wait(30)
    finally:
        stop(proc, signal.SIGKILL)
    return text(log)


def test_journal_form(tmp_path):
    # A vsock NOTIFY_SOCKET is a form the node does not speak: one warning.
    t = journal_run(tmp_path, "journal.log", True, env={"NOTIFY_SOCKET": "vsock:2:1"})
    lines = t.splitlines()
    assert lines, t
    for line in lines:
        assert re.match(r"^<[3467]>(ERROR|WARN |INFO |DEBUG|TRACE) \[", line), line
    assert any(line.startswith("<6>INFO  [main/main] peercached ") for line in lines), t
    assert re.search(r"^<6>INFO  \[main/main\] node \S+ ready \(", t, re.M), t
    assert re.search(r"^<4>WARN  \[main/main\] sd_notify to NOTIFY_SOCKET=vsock:2:1: ", t,
                     re.M), t
    # An error: a socket whose directory cannot be made stops the start.
    t = journal_run(tmp_path, "journal-err.log", True, "--socket", "/proc/none/x.sock",
                    ready=False)
    assert re.search(r"^<3>ERROR \[", t, re.M), t


def test_journal_stream_of_another_file(tmp_path):
    """JOURNAL_STREAM is inherited: it counts only while stderr is that
    stream. Here it names another file, so the lines keep their time."""
    t = journal_run(tmp_path, "plain.log", False)
    lines = t.splitlines()
    assert lines and all(STAMP.match(line) for line in lines), t
