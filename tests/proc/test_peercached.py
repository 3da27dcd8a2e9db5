"""peercached as an operator sees it: help, version, configuration errors,
start-up, and a clean stop on SIGINT and SIGTERM."""
import os
import signal

from conftest import run

TEST_FLAGS = []  # node_factory adds free ports and a private socket path


def test_help_lists_every_setting():
    r = run("--help")
    assert r.returncode == 0
    for key in ("--rpc-port", "--data-port", "--meta-port", "--metrics-port",
                "--mode", "--vnodes", "--directory-replicas",
                "--max-channels-per-peer", "--max-masters", "--discovery-addr",
                "--metrics-enabled", "--metrics-dashboard", "--disk-enabled",
                "--disk-path", "--disk-size", "--slot-max-page-bytes",
                "--slot-ways", "--slot-num-buckets", "--slot-classes", "--config", "--version"):
        assert key in r.stdout, key


def test_version():
    r = run("--version")
    assert r.returncode == 0
    assert r.stdout.startswith("peercached ")


def test_bad_value_is_one_clear_line_and_exit_2():
    r = run("--rpc-port", "70000")
    assert r.returncode == 2
    first = r.stderr.splitlines()[0]
    assert "rpc_port" in first and "70000" in first and "allowed: 0..65535" in first


def test_bad_size_and_enum_and_unknown_key():
    r = run("--disk-size", "lots")
    assert r.returncode == 2 and "disk_size: 'lots'" in r.stderr
    r = run("--mode", "ring")
    assert r.returncode == 2 and "allowed: p2p, slotmap" in r.stderr
    r = run("--rpc-prot", "1")
    assert r.returncode == 2 and "did you mean 'rpc_port'" in r.stderr
    r = run("stray")
    assert r.returncode == 2 and "unexpected argument 'stray'" in r.stderr


def test_bad_environment_value():
    r = run(env={"PEERCACHE_VNODES": "many"})
    assert r.returncode == 2
    assert "PEERCACHE_VNODES" in r.stderr and "vnodes" in r.stderr


def test_slotmap_settings_are_checked(tmp_path):
    r = run("--mode", "slotmap", "--slot-classes", "256kb:4:40%,8mb:2:60%",
            "--print-config")
    assert r.returncode == 0, r.stderr
    assert "mode = slotmap" in r.stdout
    assert "slot_classes = 256kb:4:40%,8mb:2:60%" in r.stdout
    r = run("--slot-classes", "8mb:4:40%,8mb:2:10%")
    assert r.returncode == 2 and "two classes of one SIZE" in r.stderr
    r = run("--mode", "slotmap", "--disk-enabled", "--disk-path",
            str(tmp_path), "--disk-size", "1gb")
    assert r.returncode == 2
    assert "disk tier is not supported in slotmap mode" in r.stderr


def test_config_file_round_trip(tmp_path):
    r = run("--print-config", "--vnodes", "99", "--pool-size", "64mb")
    assert r.returncode == 0
    conf = tmp_path / "pc.conf"
    conf.write_text(r.stdout)
    r2 = run("--config", str(conf), "--print-config")
    assert r2.returncode == 0
    assert r2.stdout == r.stdout
    assert "vnodes = 99" in r2.stdout and "pool_size = 64mb" in r2.stdout


def test_bad_config_file_line_is_reported(tmp_path):
    conf = tmp_path / "bad.conf"
    conf.write_text("vnodes = 10\nthis line is wrong\n")
    r = run("--config", str(conf))
    assert r.returncode == 2
    assert "bad.conf:2" in r.stderr


def test_sample_config_is_valid():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = run("--config", os.path.join(root, "etc", "peercached.conf"), "--print-config")
    assert r.returncode == 0, r.stderr


def test_starts_and_stops_cleanly_on_sigint(node_factory):
    n = node_factory(*TEST_FLAGS)
    n.wait_for("ready")
    assert n.stop(signal.SIGINT) == 0
    log = n.text()
    assert "shutting down" in log and "stopped cleanly" in log
    assert "ERROR" not in log


def test_stops_cleanly_on_sigterm(node_factory):
    n = node_factory(*TEST_FLAGS)
    n.wait_for("ready")
    assert n.stop(signal.SIGTERM) == 0
    assert "stopped cleanly" in n.text()


def test_inactive_settings_are_reported(node_factory):
    n = node_factory(*TEST_FLAGS, "--slot-ways", "5")
    n.wait_for("ready")
    assert ("slot_ways is set but has no effect: it shapes the slot region "
            "of mode = slotmap") in n.text()
    assert n.stop() == 0


def test_unknown_environment_variable_is_a_warning_not_an_error(node_factory):
    n = node_factory(*TEST_FLAGS, env={"PEERCACHE_NO_SUCH_KEY": "1"})
    n.wait_for("ready")
    assert "ignoring unknown environment variable PEERCACHE_NO_SUCH_KEY" in n.text()
    assert n.stop() == 0


# A test process that starts a node (conftest.Node), reports its PID and then
# waits to be killed.
ORPHAN_CHILD = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
from conftest import Node
n = Node(["--rpc-port", "0", "--data-port", "0", "--meta-port", "0",
          "--metrics-port", "0", "--socket", "", "--pool-prefault", "false"],
         tmpdir=sys.argv[2])
n.wait_for("ready")
print(n.proc.pid, flush=True)
time.sleep(120)
"""


def test_a_node_goes_with_a_test_process_that_dies(tmp_path):
    """The harness's own guard: a test process killed before its fixtures
    could stop its nodes (a shim library aborting Python under a sanitizer,
    an OOM kill) takes them with it, so none runs on into later tests."""
    import subprocess
    import sys
    import time
    here = os.path.dirname(os.path.abspath(__file__))
    child = subprocess.Popen([sys.executable, "-c", ORPHAN_CHILD, here,
                              str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(child.stdout.readline())
    finally:
        child.kill()
        child.wait()
    state = None
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            with open("/proc/%d/stat" % pid) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            state = None  # gone (and reaped)
        if state in (None, "Z", "X"):
            break
        time.sleep(0.05)
    if state not in (None, "Z", "X"):
        os.kill(pid, signal.SIGKILL)
    assert state in (None, "Z", "X"), \
        "node %d still running (%s) after its test process died" % (pid, state)
