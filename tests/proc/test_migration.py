"""Drop-in for the original PeerCache (docs/migration.md): a node starts from a
config file written in the original's keys, the mapped keys take effect
(--print-config, node.info), the keys without effect here are logged once,
the original's PEERCACHE_RDMA_OP_TIMEOUT_MS sets rdma_op_timeout_ms; its
peercache-storage-server options parse too."""
import os
import signal
import subprocess

from conftest import Node, RpcClient, free_ports, run

ORIGINAL_CONF = """\
# written for the original PeerCache (python/peercache/config.py keys)
discovery_addr = {host}:{meta}
mode = p2p
role = storage
write_policy = local
protocol = tcp
device_names = mlx5_0,mlx5_1
ib_port = 1
gid_index = 3
global_segment_size = 64mb
local_hostname = {host}
control_bind_host = {host}
control_port = {control}
rdma_bind_host = {host}
rdma_port = {rdma}
meta_bind_host = {host}
metrics_bind_host = {host}
metrics_port = {metrics}
directory_read_cache_ttl = 0.5
vnodes = 160
directory_replicas = 2
max_channels_per_peer = 16
heartbeat_interval = 2.0
member_ttl = 6.0
disk_enabled = false
node_id = orig-1
"""

NO_EFFECT = ("role", "write_policy")


def write_conf(tmp_path):
    meta, control, rdma, metrics = free_ports(4)
    path = tmp_path / "original.conf"
    path.write_text(ORIGINAL_CONF.format(host="127.0.0.1", meta=meta,
                                         control=control, rdma=rdma,
                                         metrics=metrics))
    return str(path), control, rdma


def printed(stdout):
    return dict(line.split(" = ", 1) for line in stdout.splitlines()
                if " = " in line)


def test_original_config_file_starts_a_node(tmp_path):
    conf, control, rdma = write_conf(tmp_path)
    env = {"PEERCACHE_RDMA_OP_TIMEOUT_MS": "2000"}
    r = run("--config", conf, "--print-config", env=env)
    assert r.returncode == 0, r.stderr
    cfg = printed(r.stdout)
    assert cfg["pool_size"] == "64mb"
    assert cfg["rpc_port"] == str(control)
    assert cfg["data_port"] == str(rdma)
    assert cfg["bind"] == "127.0.0.1"
    assert cfg["advertise_host"] == "127.0.0.1"
    assert cfg["metrics_bind"] == "127.0.0.1"
    assert cfg["heartbeat_interval"] == "2s"
    # the RDMA transport's own keys take effect
    assert cfg["ib_port"] == "1"
    assert cfg["gid_index"] == "3"
    assert cfg["rdma_op_timeout_ms"] == "2000"
    assert cfg["device_names"] == "mlx5_0,mlx5_1"
    assert cfg["directory_read_cache_ttl"] == "500ms"

    sock = str(tmp_path / "orig.sock")
    node = Node(["--config", conf, "--socket", sock, "--threads", "2",
                 "--pool-prefault", "false"], env=env,
                tmpdir=str(tmp_path))
    try:
        rpc = node.endpoint("rpc", timeout=30)
        assert rpc == "127.0.0.1:%d" % control
        c = RpcClient(node.endpoint("socket", timeout=30))
        err, info = c.call("node.info")
        c.close()
        assert err is None, err
        assert info["node_id"] == "orig-1"
        assert info["addresses"]["rpc"] == "127.0.0.1:%d" % control
        assert info["addresses"]["data"] == "127.0.0.1:%d" % rdma
        log = node.text()
        for key in NO_EFFECT:
            needle = "accepted for compatibility, no effect: %s = " % key
            assert log.count(needle) == 1, (key, log)
        assert "no effect: rdma_op_timeout_ms" not in log
        assert "no effect: device_names" not in log
        assert "unknown environment variable" not in log
    finally:
        assert node.stop(signal.SIGTERM) == 0, node.text()


def test_original_launch_line_and_typos(tmp_path):
    # python/peercache/examples/launch_storage.py's options
    r = run("--global-segment-size", "32mb", "--disk-path", str(tmp_path),
            "--no-disk", "--device-name", "mlx5_0", "--node-id", "s1",
            "--print-config")
    assert r.returncode == 0, r.stderr
    cfg = printed(r.stdout)
    assert cfg["pool_size"] == "32mb"
    assert cfg["disk_enabled"] == "false"
    assert cfg["node_id"] == "s1"
    assert cfg["device_name"] == "mlx5_0"
    assert "no effect: device_name" not in r.stderr
    # our key wins over an alias, and says so
    r = run("--pool-size", "16mb", "--global-segment-size", "32mb",
            "--print-config")
    assert r.returncode == 0, r.stderr
    assert printed(r.stdout)["pool_size"] == "16mb"
    assert "ignored: pool_size is set too" in r.stderr
    # a typo is still an error, and so is a value the original refused
    path = tmp_path / "typo.conf"
    path.write_text("global_segmnt_size = 1gb\n")
    r = run("--config", str(path))
    assert r.returncode == 2
    assert "unknown key 'global_segmnt_size'" in r.stderr
    r = run("--print-config", env={"PEERCACHE_RDMA_OP_TIMEOUT_MS": "soon"})
    assert r.returncode == 2
    assert "rdma_op_timeout_ms: 'soon'" in r.stderr


def test_original_module_and_class_names_import():
    # SGLang's dynamic backend with the original's module_path/class_name
    src = os.path.join(os.path.dirname(__file__), "..", "..", "python")
    r = subprocess.run(
        ["/usr/bin/python3", "-c",
         "import importlib; m = importlib.import_module('peercache.store'); "
         "print(getattr(m, 'PeerCacheStore').__name__)"],
        capture_output=True, text=True, timeout=60,
        env=dict(os.environ, PYTHONPATH=os.path.abspath(src)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "PeerCacheStore"
