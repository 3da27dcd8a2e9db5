"""Faults of the disk tier (issue 14 item 5, docs/disk.md "Faults"): a full
file system (ENOSPC), a file system gone read-only under the node (EROFS),
a dead one (EIO, from the kernel and from the test build's hook) and a
failed fsync each make the tier degraded — logged once with the cause,
peercache_disk_degraded 1, /healthz and node.health say so — while the node
keeps serving from memory, pool eviction deletes, write-through stops, and
no client ever reads a wrong byte (a content oracle over every get).

The file systems are the test's own: a tmpfs or an ext4 image on a loop
device, mounted under tmp_path with size= and unmounted in a finally. A
test that may not mount (no root, no loop device) is skipped with the
reason. disk_path that cannot be created is test_disk_tier's
test_bad_settings_are_refused_at_start."""
import contextlib
import ctypes
import fcntl
import os
import socket
import struct
import subprocess
import time

import pytest

from conftest import RpcClient, metrics_of, recv_all, report
from test_p2p import page as oracle_page   # bytes derived from the key

POOL = "1mb"          # holds 15 pages of PAGE
PAGE = 64 * 1024
EXT4_IOC_SHUTDOWN = 0x8004587D            # _IOR('X', 125, __u32)
EXT4_GOING_FLAGS_NOLOGFLUSH = 2


def run(*cmd):
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True,
                              timeout=60)
    except FileNotFoundError:
        return subprocess.CompletedProcess(cmd, 127, "", "%s: not installed"
                                           % cmd[0])


@contextlib.contextmanager
def mounted(tmp_path, kind, size_mb):
    """A private file system of size_mb at tmp_path/mnt-<kind>: "tmpfs", or
    "ext4" (an image on a loop device, errors=remount-ro). Skips the test
    when mounting is not permitted here."""
    mnt = tmp_path / ("mnt-" + kind)
    mnt.mkdir()
    if kind == "tmpfs":
        res = run("mount", "-t", "tmpfs", "-o", "size=%dm,mode=700" % size_mb,
                  "tmpfs", str(mnt))
    else:
        img = tmp_path / "ext4.img"
        with open(img, "wb") as f:
            f.truncate(size_mb << 20)
        res = run("mkfs.ext4", "-q", "-F", "-b", "4096", str(img))
        if res.returncode == 0:
            res = run("mount", "-o", "loop,errors=remount-ro", str(img),
                      str(mnt))
    if res.returncode != 0:
        report("skipped: cannot mount a %s file system here: %s"
               % (kind, res.stderr.strip()))
        pytest.skip("cannot mount a %s file system: %s"
                    % (kind, res.stderr.strip()))
    try:
        yield mnt
    finally:
        if run("umount", str(mnt)).returncode != 0:
            run("umount", "-l", str(mnt))


def page(key, version=0):
    return oracle_page("%s#%d" % (key, version), PAGE)


class Oracle:
    """What each key holds now; every get is checked byte for byte."""

    def __init__(self, node):
        self.node = node
        self.cl = RpcClient(node.endpoint("rpc"))
        self.want = {}
        self.hits = self.misses = self.wrong = 0

    def set(self, keys, version=0):
        vals = [page(k, version) for k in keys]
        err, ok = self.cl.call("kv.set", [keys, vals])
        assert err is None and ok == [True] * len(keys), (err, ok)
        for k, v in zip(keys, vals):
            self.want[k] = v

    def get(self, keys):
        err, got = self.cl.call("kv.get", [keys])
        assert err is None
        for k, g in zip(keys, got):
            if g is None:
                self.misses += 1
            elif g == self.want.get(k):
                self.hits += 1
            else:
                self.wrong += 1
        return got

    def get_all(self):
        keys = sorted(self.want)
        out = []
        for i in range(0, len(keys), 8):
            out += self.get(keys[i:i + 8])
        return dict(zip(keys, out))


def wait_for(cond, what, timeout=20.0):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, what
        time.sleep(0.05)


def disk_node(node_factory, path, *args, env=None, size="16mb"):
    n = node_factory("--pool-size", POOL, "--disk-enabled", "true",
                     "--disk-path", str(path), "--disk-size", size,
                     "--disk-region-size", "1mb", *args, env=env)
    n.wait_for("ready")
    return n


def refused(node_factory, path, size, *says):
    """A node with its store at path does not start, and says why."""
    n = node_factory("--disk-enabled", "true", "--disk-path", str(path),
                     "--disk-size", size, "--disk-region-size", "1mb")
    assert n.proc.wait(20) != 0
    for s in says:
        assert s in n.text(), n.text()


def written(node):
    return metrics_of(node).get("peercache_disk_writes_total", 0)


def set_through(o, keys):
    """Set keys four at a time, each batch on disk before the next."""
    for i in range(0, len(keys), 4):
        before = written(o.node)
        o.set(keys[i:i + 4])
        wait_for(lambda: written(o.node) >= before + len(keys[i:i + 4]),
                 "written through")


def healthz(node):
    host, port = node.endpoint("metrics").rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
    head, body = recv_all(s).split(b"\r\n\r\n", 1)
    return int(head.split()[1]), body.decode()


def come_back(o, keys, tries=50):
    """Get keys until each is served (a page on disk misses once and is
    promoted) or tries run out: how many were served."""
    left = list(keys)
    for _ in range(tries):
        got = o.get(left)
        left = [k for k, g in zip(left, got) if g is None]
        if not left:
            break
        time.sleep(0.02)
    return len(keys) - len(left)


def degrade_until(o, prefix, cause):
    """Keep setting fresh pages (with gets) until the tier is degraded."""
    i = 0

    def more():
        nonlocal i
        keys = ["%s/%d" % (prefix, i + j) for j in range(4)]
        i += 4
        o.set(keys)
        o.get(keys)
        return metrics_of(o.node).get("peercache_disk_degraded") == 1

    wait_for(more, "the tier degrades (%s)" % cause, timeout=30.0)


def check_degraded(o, cause, err_label):
    """What an operator and a client see once the tier is degraded."""
    n = o.node
    m = metrics_of(n)
    assert m["peercache_disk_degraded"] == 1
    assert m['peercache_disk_errors_total{%s}' % err_label] >= 1, \
        {k: v for k, v in m.items() if "errors" in k}
    # Logged once, with the cause.
    assert n.text().count("disk tier degraded") == 1, n.text()
    assert cause in n.text().split("disk tier degraded", 1)[1].split("\n")[0]
    status, body = healthz(n)
    assert status == 200, "the node still serves from memory"
    lines = body.splitlines()
    assert lines[0] == "ok" and lines[1].startswith("disk degraded: "), body
    assert cause in lines[1], body
    err, h = o.cl.call("node.health")
    assert err is None and h["status"] == "ok", h
    assert cause in h["degraded"]["disk"], h
    # Eviction deletes and write-through stopped: three pools' worth of
    # new pages, none kept by the tier, none written.
    writes = m["peercache_disk_writes_total"]
    kept = m["peercache_tier_kept_total"]
    keys = ["after/%d" % i for i in range(48)]
    for i in range(0, len(keys), 4):
        o.set(keys[i:i + 4])
    m = metrics_of(n)
    assert m["peercache_disk_writes_total"] == writes
    assert m["peercache_tier_kept_total"] == kept, "eviction deleted"
    assert m["peercache_evictions_total"] > 0
    # The newest pages are served from memory, byte-exact; the evicted
    # ones are clean misses, never a record that cannot be read.
    got = o.get(keys)
    assert all(g is not None for g in got[-8:]), "served from memory"
    assert o.cl.call("kv.exists", [keys[:8]])[1] == \
        sum(g is not None for g in got[:8])
    # Every key set again with new bytes: the newest bytes or a miss,
    # never an older copy from the disk.
    old = sorted(o.want)
    for i in range(0, len(old), 4):
        o.set(old[i:i + 4], version=1)
    o.get_all()
    assert o.wrong == 0, "wrong bytes served"
    report("%s: degraded; %d hits, %d misses, 0 wrong pages in %d gets"
           % (cause, o.hits, o.misses, o.hits + o.misses))


# ------------------------------------------------------------------- ENOSPC

def test_enospc(node_factory, tmp_path):
    """The store is preallocated at start, so ENOSPC can hit (1) the start
    itself, refused with a clear message, and (2) a store whose
    preallocation is gone — a sparse copy, a hole punched, a copy-on-write
    or thin-provisioned file system — once the file system filled: made
    here by punching the store's unwritten regions and filling the tmpfs."""
    with mounted(tmp_path, "tmpfs", 24) as mnt:
        refused(node_factory, mnt / "big", "32mb",
                "cannot allocate 33554432 bytes for the store file",
                "No space left on device")
        run("rm", "-rf", str(mnt / "big"))

        n = disk_node(node_factory, mnt / "store")
        o = Oracle(n)
        set_through(o, ["early/%d" % i for i in range(16)])  # regions 0, 1
        store = mnt / "store" / "store.pcd"
        fd = os.open(str(store), os.O_RDWR)
        try:
            # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, regions 2..15.
            libc = ctypes.CDLL(None, use_errno=True)
            assert libc.fallocate(fd, 3, ctypes.c_long(2 << 20),
                                  ctypes.c_long(14 << 20)) == 0, \
                os.strerror(ctypes.get_errno())
        finally:
            os.close(fd)
        fd = os.open(str(mnt / "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while os.write(fd, b"\1" * 65536) > 0:
                pass
        except OSError as e:
            assert e.errno == 28, e         # the file system is full
        finally:
            os.close(fd)
        kept = metrics_of(n)["peercache_tier_kept_total"]
        degrade_until(o, "full", "No space left on device")
        # What reached the disk before is still served (promotions).
        assert come_back(o, ["early/%d" % i for i in range(16)]) >= kept > 0
        check_degraded(o, "No space left on device",
                       'op="write",error="ENOSPC"')
        assert n.stop() == 0


# ---------------------------------------------------------- EROFS and EIO

def ext4_dev(mnt):
    src = run("findmnt", "-no", "SOURCE", str(mnt)).stdout.strip()
    return os.path.basename(os.path.realpath(src))


@pytest.mark.parametrize("fault", ["erofs", "shutdown"])
def test_ext4_goes_read_only_or_dies(node_factory, tmp_path, fault):
    """erofs: the file system turns read-only under the running node. A
    plain `mount -o remount,ro` is refused by the kernel while the node
    holds the store open for writing (EBUSY), so the way it happens is the
    file system's own: an ext4 error with errors=remount-ro. shutdown: the
    file system dies (EXT4_IOC_SHUTDOWN): every read, write and fsync
    fails with EIO."""
    with mounted(tmp_path, "ext4", 64) as mnt:
        n = disk_node(node_factory, mnt / "store")
        o = Oracle(n)
        early = ["early/%d" % i for i in range(24)]
        set_through(o, early)                       # 9 evicted, on disk
        kept = metrics_of(n)["peercache_tier_kept_total"]
        assert kept > 0
        if fault == "erofs":
            res = run("mount", "-o", "remount,ro", str(mnt))
            if res.returncode == 0:
                report("erofs: mount -o remount,ro took effect under the node")
            else:
                report("erofs: mount -o remount,ro refused while the store "
                       "is open (%s); ext4 error with errors=remount-ro"
                       % res.stderr.strip().splitlines()[0])
                with open("/sys/fs/ext4/%s/trigger_fs_error" % ext4_dev(mnt),
                          "w") as f:
                    f.write("peercache test: going read-only")
            cause, label = "Read-only file system", 'op="write",error="EROFS"'
        else:
            d = os.open(str(mnt), os.O_RDONLY)
            try:
                fcntl.ioctl(d, EXT4_IOC_SHUTDOWN,
                            struct.pack("I", EXT4_GOING_FLAGS_NOLOGFLUSH))
            finally:
                os.close(d)
            cause, label = "Input/output error", 'error="EIO"'
        degrade_until(o, "late", cause)
        # Pages evicted to disk before the fault (kept, and those the pool
        # evicted before the tier noticed): read-only, they come back
        # whole; dead, each get is a miss and the record goes.
        back = come_back(o, early)
        if fault == "erofs":
            assert back >= kept, "read-only: disk pages still served"
        m = metrics_of(n)
        label = [k for k in m if k.startswith("peercache_disk_errors_total{")
                 and label in k and m[k] > 0]
        assert label, {k: v for k, v in m.items() if "errors" in k}
        check_degraded(o, cause, label[0].split("{", 1)[1][:-1])
        assert n.stop() == 0
        if fault == "erofs":
            # A node started on the read-only store is refused, with the
            # reason.
            refused(node_factory, mnt / "store", "16mb",
                    "cannot open the store file", "Read-only file system")


# ------------------------------------------------------------- the hook

def hooked_node(node_factory, tmp_path, ops):
    n = disk_node(node_factory, tmp_path / "store",
                  env={"PEERCACHE_TEST_DISK_FAULT": ops})
    if "fault injection (a test build)" not in n.text():
        report("skipped: this build has no fault injection "
               "(PEERCACHE_FAULT_INJECTION off)")
        pytest.skip("built without PEERCACHE_FAULT_INJECTION")
    return n


def test_eio_on_write(node_factory, tmp_path):
    """Every write fails: no record is ever indexed or announced, the first
    failure degrades the tier, and the node serves from memory."""
    n = hooked_node(node_factory, tmp_path, "write")
    o = Oracle(n)
    degrade_until(o, "w", "Input/output error")
    m = metrics_of(n)
    assert m["peercache_disk_writes_total"] == 0
    assert m["peercache_disk_keys"] == 0, "a failed write is never indexed"
    assert m["peercache_tier_kept_total"] == 0
    check_degraded(o, "Input/output error", 'op="write",error="EIO"')
    assert n.stop() == 0


def test_eio_on_read(node_factory, tmp_path):
    """Writes work, reads fail: a promotion is a miss, its record goes (no
    retry, exists no longer counts it), and the tier is degraded."""
    n = hooked_node(node_factory, tmp_path, "read")
    o = Oracle(n)
    early = ["r/%d" % i for i in range(24)]
    set_through(o, early)
    m = metrics_of(n)
    assert m["peercache_tier_kept_total"] > 0 and m["peercache_disk_degraded"] == 0
    on_disk = [k for k, g in zip(early, o.get(early)) if g is None]
    assert on_disk, "some pages were evicted to disk"
    wait_for(lambda: metrics_of(n)["peercache_disk_degraded"] == 1,
             "a failed read degrades the tier")
    # Every page that was only on disk: a miss, and its record is gone.
    wait_for(lambda: o.cl.call("kv.exists", [on_disk])[1] == 0,
             "the unreadable records are dropped")
    assert all(g is None for g in o.get(on_disk))
    check_degraded(o, "Input/output error", 'op="read",error="EIO"')
    assert n.stop() == 0
    # Recovery is a restart: without the fault the tier is healthy again,
    # and the pages the store holds (written before the fault; the keys set
    # again since never reached the disk: docs/disk.md "Restart") come back
    # byte-exact.
    n = disk_node(node_factory, tmp_path / "store")
    n.wait_for("re-announced %d pages" % len(early))
    assert metrics_of(n)["peercache_disk_degraded"] == 0
    assert healthz(n) == (200, "ok\n")
    o = Oracle(n)
    o.want = {k: page(k) for k in early}
    assert come_back(o, early) == len(early) and o.wrong == 0
    assert n.stop() == 0


def test_failed_fsync(node_factory, tmp_path):
    """The store is synced when a region fills and every second after
    writes; a failed sync degrades the tier (what it covered is taken as
    lost for new writes; pages on disk are served while their checksums
    hold)."""
    n = hooked_node(node_factory, tmp_path, "fsync")
    o = Oracle(n)
    degrade_until(o, "s", "fsync of the store failed")
    assert metrics_of(n)["peercache_disk_syncs_total"] == 0
    check_degraded(o, "fsync of the store failed", 'op="fsync",error="EIO"')
    assert n.stop() == 0


def test_syncs_when_healthy(node_factory, tmp_path):
    """Without faults the store is synced (through the ring) and the tier
    reports healthy everywhere."""
    n = disk_node(node_factory, tmp_path / "store")
    o = Oracle(n)
    set_through(o, ["ok/%d" % i for i in range(20)])   # fills region 0
    wait_for(lambda: metrics_of(n)["peercache_disk_syncs_total"] >= 1,
             "the store is synced")
    m = metrics_of(n)
    assert m["peercache_disk_degraded"] == 0
    assert not any(v for k, v in m.items()
                   if k.startswith("peercache_disk_errors_total"))
    assert healthz(n) == (200, "ok\n")
    err, h = o.cl.call("node.health")
    assert err is None and h["status"] == "ok" and h["degraded"] == {}
    o.get_all()
    assert o.wrong == 0
    assert n.stop() == 0
