"""The transport a node runs (protocol = auto | tcp | rdma, docs/rdma.md), on
this machine without an RDMA device: auto says in one log line that it found
none and moves data over TCP; rdma refuses to start and says why; tcp does
not look for a device."""
import signal

from conftest import Node, RpcClient, run


def start(tmp_path, proto, name):
    sock = str(tmp_path / (name + ".sock"))
    return Node(["--protocol", proto, "--socket", sock, "--threads", "1",
                 "--pool-size", "16mb", "--pool-prefault", "false"],
                tmpdir=str(tmp_path)), sock


def put_get(sock):
    c = RpcClient(sock)
    try:
        err, res = c.call("kv.set", [["rdma-select-key"], [b"x" * 4096]])
        assert err is None and res == [True], (err, res)
        err, res = c.call("kv.get", [["rdma-select-key"]])
        assert err is None, err
        assert res == [b"x" * 4096]
    finally:
        c.close()


def test_auto_without_a_device_runs_tcp_and_says_so_once(tmp_path):
    node, sock = start(tmp_path, "auto", "auto")
    try:
        node.wait_for("ready", 30)
        log = node.text()
        assert log.count("protocol=auto: no usable RDMA device") == 1, log
        assert "data moves over TCP" in log
        put_get(sock)
    finally:
        assert node.stop(signal.SIGTERM) == 0, node.text()


def test_rdma_without_a_device_refuses_to_start(tmp_path):
    r = run("--protocol", "rdma", "--pool-size", "16mb",
            "--pool-prefault", "false",
            "--socket", str(tmp_path / "r.sock"))
    assert r.returncode != 0
    assert "protocol=rdma: no usable RDMA device" in r.stderr, r.stderr
    assert "set protocol = auto or tcp" in r.stderr


def test_tcp_does_not_look_for_a_device(tmp_path):
    node, sock = start(tmp_path, "tcp", "tcp")
    try:
        node.wait_for("ready", 30)
        assert "RDMA device" not in node.text()
        put_get(sock)
    finally:
        assert node.stop(signal.SIGTERM) == 0, node.text()
