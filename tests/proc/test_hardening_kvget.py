"""Hardening (issue 10, finding 2): a small kv.get must not make the node
allocate gigabytes.

A kv.get's reply is built from buffers the node stages itself; the pages one
call may stage are capped by what fits one reply message, and the pages all
calls stage at once by kv_staging_max. The first test runs the node inside a
1.5 GiB memory cgroup (cgroup v1), where the old code was OOM-killed by one
270-byte request.
"""
import os
import socket
import threading

import pytest

from conftest import RpcClient, metrics_of

MiB = 1 << 20


def _memory_cgroup_root():
    """This process's memory cgroup directory (v1), or None."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, ctrl, path = line.rstrip("\n").split(":", 2)
                if "memory" in ctrl.split(","):
                    d = "/sys/fs/cgroup/memory" + path
                    return d if os.path.isdir(d) else None
    except OSError:
        pass
    return None


class MemoryLimit:
    """Confine one process to limit bytes: a child memory cgroup when one
    can be made, else RLIMIT_AS through prlimit (weaker: address space)."""

    def __init__(self, pid, limit):
        self.dir = None
        self.how = None
        root = _memory_cgroup_root()
        if root:
            d = os.path.join(root, "pc-kvget-%d-%d" % (os.getpid(), pid))
            try:
                os.mkdir(d)
                with open(os.path.join(d, "memory.limit_in_bytes"), "w") as f:
                    f.write(str(limit))
                with open(os.path.join(d, "cgroup.procs"), "w") as f:
                    f.write(str(pid))
                self.dir, self.how = d, "cgroup " + d
                return
            except OSError:
                try:
                    os.rmdir(d)
                except OSError:
                    pass
        if os.environ.get("PEERCACHE_SANITIZED") == "1":
            # ASan reserves terabytes of address space for its shadow.
            self.how = "nothing (no memory cgroup; ASan cannot run under RLIMIT_AS)"
            return
        import resource
        resource.prlimit(pid, resource.RLIMIT_AS, (limit * 4, limit * 4))
        self.how = "prlimit RLIMIT_AS (no memory cgroup could be made)"

    def oom_kills(self):
        if not self.dir:
            return 0
        try:
            with open(os.path.join(self.dir, "memory.oom_control")) as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    def release(self):
        if self.dir:
            try:
                os.rmdir(self.dir)
            except OSError:
                pass


def _call_all(addr, method, params, n):
    """n concurrent calls, one connection each; their (error, result)s."""
    out = [None] * n
    start = threading.Barrier(n)

    def one(i):
        c = RpcClient(addr, timeout=60)
        start.wait()
        try:
            out[i] = c.call(method, params)
        except (OSError, ConnectionError) as e:
            out[i] = ("connection: %s" % e, None)
        c.close()

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def test_kv_get_of_one_big_key_64_times_in_a_memory_cgroup(node_factory):
    n = node_factory("--pool-size", "1gb")
    addr = n.endpoint("rpc")
    n.wait_for("ready")
    lim = MemoryLimit(n.proc.pid, 3 * 512 * MiB)
    print("confined by", lim.how)
    try:
        c = RpcClient(addr, timeout=60)
        big = os.urandom(60 * MiB)
        assert c.call("kv.set", [["big"], [big]]) == (None, [True])
        # One call: 64 x 60 MiB (the old node allocated 3.75 GiB here).
        err, got = c.call("kv.get", [["big"] * 64])
        assert got is None and err["code"] == "too_large", err
        assert "rpc_max_message_bytes" in err["message"], err
        # Several at once.
        for err, got in _call_all(addr, "kv.get", [["big"] * 64], 4):
            assert got is None and err["code"] == "too_large", err
        # One page at a time still works, concurrently too (or is busy).
        for err, got in _call_all(addr, "kv.get", [["big"]], 4):
            assert (err is None and got == [big]) or err["code"] == "busy", err
        # And a normal client goes on.
        c2 = RpcClient(addr)
        assert c2.call("kv.set", [["small"], [b"x" * 4096]]) == (None, [True])
        assert c2.call("kv.get", [["small", "big"]]) == (None, [b"x" * 4096, big])
        assert n.proc.poll() is None
        m = metrics_of(n)
        assert m['peercache_kv_refused_total{reason="too_large"}'] >= 5
        assert m["peercache_kv_staged_bytes"] == 0
        assert lim.oom_kills() == 0
        assert n.stop() == 0
    finally:
        if n.proc.poll() is None:
            n.proc.kill()
            n.proc.wait()
        lim.release()


def test_kv_get_staging_is_bounded_node_wide(cluster):
    # Pages read from another node are staged while the read is in flight:
    # 8 pipelined 24 MiB gets against a 48 MiB budget cannot all hold theirs.
    a, b = cluster(2, "--pool-size", "256mb", "--kv-staging-max", "48mb")
    ca, cb = RpcClient(a.endpoint("rpc"), timeout=60), RpcClient(b.endpoint("rpc"), timeout=60)
    val = os.urandom(24 * MiB)
    assert ca.call("kv.set", [["remote"], [val]]) == (None, [True])
    # Over the per-call cap, which kv_staging_max sets here.
    err, got = cb.call("kv.get", [["remote"] * 3])
    assert got is None and err["code"] == "too_large", err
    assert "kv_staging_max" in err["message"], err
    # Every call's per-key state counts too: 65,536 keys of 400 bytes hold
    # ~90 MB of bookkeeping, over this node's 48 MiB.
    keys = ["%0400d" % i for i in range(65536)]
    err, got = cb.call("kv.exists", [keys])
    assert got is None and err["code"] == "too_large", err
    assert "kv_staging_max" in err["message"], err
    busy = 0
    for attempt in range(3):
        ids = [cb.send("kv.get", [["remote"]]) for _ in range(8)]
        for i in ids:
            msg = cb.recv()
            assert msg[0] == 1
            err, got = msg[2], msg[3]
            if err is None:
                assert got == [val]
            else:
                assert err["code"] == "busy" and "kv_staging_max" in err["message"], err
                busy += 1
        if busy:
            break
    assert busy > 0
    m = metrics_of(b)
    assert m['peercache_kv_refused_total{reason="busy"}'] == busy
    assert m["peercache_kv_staged_bytes"] == 0
    assert cb.call("kv.get", [["remote"]]) == (None, [val])
    for nd in (a, b):
        assert nd.stop() == 0
