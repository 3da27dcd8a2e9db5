"""bench/shim_bench_common.py — what the SGLang shim's benches
(shim_bench.py, hostpool_bench.py, read_cache_bench.py) share: the import paths, reading SIZES, starting
peercached nodes on loopback in a scratch directory, and timing one call.

Nodes: every node started here listens on 127.0.0.1 only (ports the kernel
picks, except an --rpc-port the caller gives) and is stopped by PID by
stop_all(), which each bench calls on its way out however it exits, and
which removes the scratch directory.
Single-threaded: the benches start and stop nodes from their main thread.
"""
import json
import os
import shutil
import sys
import tempfile
import time

# Importing this module makes the checkout's shim (python/) and the test
# helpers (tests/proc: fake pools, Node) importable, and points the shim at
# the build's libpeercache unless PEERCACHE_LIBRARY says otherwise.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("PEERCACHE_BUILD_DIR", os.path.join(REPO, "build"))
sys.path.insert(0, os.path.join(REPO, "tests", "proc"))
sys.path.insert(0, os.path.join(REPO, "python"))
os.environ.setdefault("PEERCACHE_LIBRARY",
                      os.path.join(BUILD, "client", "libpeercache.so.0"))

from conftest import Node  # noqa: E402


def parse_sizes(bench, text, allowed):
    """SIZES ("256k 4m") as byte counts, each one of allowed."""
    out = []
    for s in text.split():
        s = s.strip().lower()
        mult = {"k": 1 << 10, "m": 1 << 20}.get(s[-1:], 1)
        try:
            n = int(s[:-1] if s[-1:] in "km" else s) * mult
        except ValueError:
            n = None
        if n not in allowed:
            raise SystemExit("%s: SIZES: %s is not one of %s" % (
                bench, s, ", ".join("%dk" % (a >> 10) if a < 1 << 20 else
                                    "%dm" % (a >> 20) for a in sorted(allowed))))
        out.append(n)
    return out


def save_results(results_dir, doc):
    """Write doc (with "bench" and "ts") as <results_dir>/<bench>-<ts>.json
    and say where on stdout."""
    os.makedirs(results_dir, exist_ok=True)
    path = os.path.join(results_dir, "%s-%s.json" % (doc["bench"], doc["ts"]))
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print("Results: %s" % path)


def mla_shim(nd):
    """A PeerCacheStore (interface v1, "allocator":"shm") on node nd's
    socket, for an MLA model (one object per page)."""
    from peercache._hicache import HiCacheStorageConfig
    from peercache.store import PeerCacheStore
    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, is_mla_model=True,
                               model_name="bench/model")
    cfg.extra_config = {"interface_v1": 1, "allocator": "shm",
                        "socket": nd.endpoint("socket")}
    return PeerCacheStore(cfg, {})


def timed(fn):
    """(seconds, result) of one call."""
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r


class Nodes:
    """peercached nodes of one bench run, in one scratch directory."""

    def __init__(self, prefix, threads):
        self.work = tempfile.mkdtemp(prefix=prefix)
        self.threads = threads
        self.started = []

    def start(self, name, *args):
        d = os.path.join(self.work, name)
        os.makedirs(d)
        n = Node(["--bind", "127.0.0.1", "--data-port", "0", "--meta-port", "0",
                  "--metrics-port", "0", "--threads", self.threads,
                  "--socket", os.path.join(d, "node.sock"), "--log-level", "info"]
                 + list(args), tmpdir=d)
        self.started.append(n)
        n.wait_for("ready")
        return n

    def stop_all(self):
        """Stop every node, then remove the scratch directory (their
        sockets and logs)."""
        for n in self.started:
            if n.proc.poll() is None:
                n.stop()
        shutil.rmtree(self.work, ignore_errors=True)
