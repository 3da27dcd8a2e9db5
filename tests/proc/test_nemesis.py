"""The nemesis cluster (issue 18, item 1): 5 nodes, each in a network
namespace of its own, with discovery, a cluster secret and a disk tier;
writers and readers on every node through kv.* and through shared-memory
sessions (what the SGLang shim calls), every page checked against content
derived from its key; and faults drawn from a seeded schedule, one every
FAULT_GAP seconds:

  kill      kill -9, then a restart with the same disk (warm restart)
  wipe      kill -9, then a restart with its disk wiped
  full      kill -9, a restart refused on a full disk (a 1 MiB tmpfs over
            disk_path: the start must fail cleanly), then with room again
  stop      SIGSTOP for a few seconds, then SIGCONT
  link      the node's link down, then up
  partition one or two nodes cut off from the rest, then healed
  slow      the node's link slowed to a trickle (tc netem delay and loss
            where the kernel has netem, else a tbf rate limit: queueing
            delay and drops), then restored

Checked: 0 wrong bytes on either path; a killed node purged from every
other node's view within the detection bound; after each heal the hit rate
back to >= 90 % of what it was before the fault within 30 s; no call over
its deadline (request_deadline, 1 s, plus scheduling slack); no node crash
other than the nemesis's own kills; every node stops cleanly at the end.

The seed is printed (report) and NEMESIS_SEED=N replays a schedule;
NEMESIS_FAULTS=kill,stop,... draws from those kinds only;
NEMESIS_SECONDS sets the length (default 300; 120 in the sanitizer tree).
The 30-minute run: NEMESIS_SECONDS=1800 (docs/reliability.md). Needs root
and `ip netns` (skipped with the reason otherwise).
"""
import hashlib
import os
import random
import shutil
import signal
import subprocess
import threading
import time

import pytest

from conftest import PEERCACHED, SANITIZED, clean_env, freeze, report
from netns import NetnsNet, netns_unavailable
from test_discovery import SLACK, wait_until
from test_discovery_netns import PURGE_BOUND, Cluster, Oracle, delta
from test_hardening_session import Client

NETNS_WHY = netns_unavailable()
SECONDS = float(os.environ.get("NEMESIS_SECONDS", "120" if SANITIZED else "300"))
SEED = int(os.environ.get("NEMESIS_SEED", str(random.SystemRandom().randrange(1 << 30))))
NODES = 5
FAULT_GAP = (10.0, 30.0) if SECONDS >= 600 else (6.0, 14.0)
DEADLINE = 1.0                  # request_deadline (the default)
CALL_BOUND = DEADLINE + 2.0 * SLACK
RECOVERY = 30.0 * SLACK
# Every kind by default. (stop, link and partition were left out for a
# while: they met a discovery bug, now fixed and covered by
# test_discovery_netns.test_member_seeded_with_itself_rejoins_after_a_cut;
# seeds 886833960 and 435177121.)
FAULTS = os.environ.get("NEMESIS_FAULTS",
                        "kill,wipe,full,stop,link,partition,slow").split(",")
SESSION_PAGE = 32 << 10

pytestmark = pytest.mark.skipif(NETNS_WHY is not None,
                                reason="network namespaces: %s" % NETNS_WHY)


def session_bytes(key):
    seed = hashlib.sha256(b"nemesis" + key.encode()).digest()
    return (seed * (SESSION_PAGE // len(seed) + 1))[:SESSION_PAGE]


class NemesisOracle(Oracle):
    """The discovery tests' kv.* oracle, plus: every call timed (the
    slowest kept), and a session client per node that sets pages of its
    own and gets pages of every node's session writer back."""

    def __init__(self, cluster, on):
        super().__init__(cluster, on)
        self.st.update(s_sets=0, s_reads=0, s_hits=0, s_misses=0, s_wrong=0,
                       s_errors=0)
        self.slowest = (0.0, None)
        self.s_keys = []
        self.threads.append(threading.Thread(target=self._sessions,
                                             daemon=True))

    def _call_on(self, conns, i, method, params):
        t0 = time.time()
        try:
            return super()._call_on(conns, i, method, params)
        finally:
            self._took(time.time() - t0, i, method)
            # a steady load, not a CPU burner: the suite runs beside it
            time.sleep(0.005)

    def _took(self, took, i, what):
        with self.lock:
            if took > self.slowest[0]:
                self.slowest = (took, "%s on node %d at %s" % (
                    what, i, time.strftime("%H:%M:%S")))

    def _session_call(self, clients, i, method, params, fill=None):
        """One session call on node i (counted busy like kv calls), with
        fill(client) run first (a set's page bytes into its memory); None
        when it failed (connection dropped: a new one next time)."""
        with self.busy_on(i) as ok:
            return self._session_on(clients, i, method, params, fill) \
                if ok else None

    def _session_on(self, clients, i, method, params, fill):
        t0 = time.time()
        try:
            c = clients.get(i)
            if c is None or c.node is not self.c.nodes[i]:
                if c is not None:
                    c.close()
                c = Client(self.c.nodes[i].endpoint("socket"), size=2 << 20,
                           timeout=10)
                c.node = self.c.nodes[i]
                clients[i] = c
                c.register()
            if fill:
                fill(c)
            return c, c.call(method, [c.rid] + params)
        except (OSError, ConnectionError, AssertionError):
            old = clients.pop(i, None)
            if old:
                old.close()
            with self.lock:
                self.st["s_errors"] += 1
            time.sleep(0.05)
            return None
        finally:
            self._took(time.time() - t0, i, method)

    def _sessions(self):
        rnd, clients, seq = random.Random(SEED + 3), {}, 0
        try:
            while not self.stop_ev.is_set():
                i = self._pick(rnd)
                if i is None:
                    time.sleep(0.05)
                    continue
                if rnd.random() < 0.4:
                    keys = ["s%d-%d" % (i, (seq + k) % 300) for k in range(4)]
                    seq += 4
                    items = [[k, j * SESSION_PAGE, SESSION_PAGE]
                             for j, k in enumerate(keys)]
                    def fill(c, items=items):
                        for k, off, size in items:
                            c.mem[off:off + size] = session_bytes(k)
                    r = self._session_call(clients, i, "session.set", [items],
                                           fill)
                    if r is None:
                        continue
                    with self.lock:
                        self.st["s_sets"] += len(keys)
                        self.s_keys += [k for k, y in zip(keys, r[1]) if y]
                        if len(self.s_keys) > 2000:
                            del self.s_keys[:1000]
                else:
                    with self.lock:
                        keys = rnd.sample(self.s_keys, min(8, len(self.s_keys)))
                    if not keys:
                        time.sleep(0.02)
                        continue
                    items = [[k, (1 << 20) + j * SESSION_PAGE, SESSION_PAGE]
                             for j, k in enumerate(keys)]
                    r = self._session_call(clients, i, "session.get", [items])
                    if r is None:
                        continue
                    c, ok = r
                    hits = wrong = 0
                    for (k, off, size), y in zip(items, ok):
                        if y:
                            if bytes(c.mem[off:off + size]) == session_bytes(k):
                                hits += 1
                            else:
                                wrong += 1
                    with self.lock:
                        self.st["s_reads"] += len(keys)
                        self.st["s_hits"] += hits
                        self.st["s_wrong"] += wrong
                        self.st["s_misses"] += len(keys) - hits - wrong
                time.sleep(0.01)
        except Exception as e:  # surfaced by check()
            self.failures.append(e)
        for c in clients.values():
            c.close()

    def forget(self, i):
        super().forget(i)
        with self.lock:
            self.s_keys = [k for k in self.s_keys if not k.startswith("s%d-" % i)]


class Nemesis:
    def __init__(self, cl, oracle, tmp, rng):
        self.cl, self.o, self.tmp, self.rng = cl, oracle, tmp, rng
        self.log = []
        self.recoveries = []
        self.purges = []
        self.slow_kind = None

    def disk(self, i):
        return os.path.join(self.tmp, "disk%d" % i)

    def node_args(self, i):
        return ["--disk-enabled", "--disk-path", self.disk(i), "--disk-size",
                "64mb", "--disk-region-size", "4mb", "--threads", "1"]

    def start(self, i):
        live = [j for j in self.cl.nodes if j != i and self.alive(j)]
        seeds = [live[0], i] if live else [i]
        self.cl.start(i, seeds, self.node_args(i))

    def alive(self, i):
        n = self.cl.nodes.get(i)
        return n is not None and n.proc.poll() is None

    def hit_rate(self, seconds=2.0):
        a = self.o.snap()
        time.sleep(seconds)
        d = delta(a, self.o.snap())
        return d["hits"] / d["reads"] if d["reads"] else None

    def run_one(self, kind, i):
        cl, o = self.cl, self.o
        before = self.hit_rate()
        t0 = time.time()
        if kind in ("kill", "wipe", "full"):
            o.forget(i)
            gone = cl.ids[i]
            cl.kill(i)
            others = [j for j in cl.nodes if j != i and self.alive(j)]
            t = time.time()
            wait_until(lambda: all(gone not in [m["id"] for m in cl.view(j)["members"]]
                                   for j in others), PURGE_BOUND,
                       "node %d purged from every view" % i)
            self.purges.append(time.time() - t)
            if kind == "wipe":
                shutil.rmtree(self.disk(i), ignore_errors=True)
            elif kind == "full":
                self.refused_on_full_disk(i)
            time.sleep(self.rng.uniform(1, 3))
            self.start(i)
            o.use(i, True)
        elif kind == "stop":
            o.use(i, False)
            freeze(cl.nodes[i].proc.pid)
            time.sleep(self.rng.uniform(2, 6))
            os.kill(cl.nodes[i].proc.pid, signal.SIGCONT)
            o.use(i, True)
        elif kind == "link":
            cl.net.link(i, False)
            time.sleep(self.rng.uniform(2, 6))
            cl.net.link(i, True)
        elif kind == "partition":
            far = self.rng.sample(sorted(cl.nodes), self.rng.randint(1, 2))
            cl.net.partition(far)
            time.sleep(self.rng.uniform(3, 8))
            cl.net.heal(far)
            i = far
        elif kind == "slow":
            self.slow(i, True)
            time.sleep(self.rng.uniform(3, 8))
            self.slow(i, False)
        healed = time.time()
        # recovery: hits back to 90 % of the rate before the fault
        want = 0.9 * (before if before is not None else 1.0)
        wait_until(lambda: (self.hit_rate(1.0) or 0.0) >= want, RECOVERY,
                   "the hit rate back to %.2f after %s of %s (now %s)" % (
                       want, kind, i, self.o.snap()))
        self.recoveries.append(time.time() - healed)
        self.log.append("%6.1f s %s %s: before %.2f, recovered in %.1f s" % (
            t0 - self.t_start, kind, i, before or 0.0, time.time() - healed))

    def refused_on_full_disk(self, i):
        """The node's disk is a full 1 MiB tmpfs: its start must fail with a
        clear error, not crash or hang; the tmpfs goes again after."""
        d = self.disk(i)
        os.makedirs(d, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", d],
                       check=True, timeout=30)
        try:
            # in the killed node's namespace, which is still there
            wrap = ("ip", "netns", "exec", "%sn%d" % (self.cl.net.tag, i))
            cmd = list(wrap) + [PEERCACHED] + self.cl.args(
                i, [i], "", self.node_args(i))
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                               env=clean_env())
            assert r.returncode != 0 and r.returncode < 128, (r.returncode, r.stderr)
            assert "No space left on device" in r.stderr, r.stderr[-2000:]
        finally:
            subprocess.run(["umount", d], check=True, timeout=30)

    def slow(self, i, on):
        """Slow node i's link (the hub's port to it): netem when the kernel
        has it, else a tbf rate limit."""
        dev = ["dev", "v%d" % i]
        hub = ["tc", "-n", self.cl.net.hub, "qdisc"]
        if not on:
            subprocess.run(hub + ["del"] + dev + ["root"], timeout=30)
            return
        if self.slow_kind in (None, "netem"):
            r = subprocess.run(hub + ["add"] + dev + ["root", "netem", "delay",
                               "40ms", "20ms", "loss", "5%"],
                               capture_output=True, text=True, timeout=30)
            if r.returncode == 0:
                self.slow_kind = "netem delay 40ms+-20ms loss 5%"
                return
            self.slow_kind = "tbf"
        r = subprocess.run(hub + ["add"] + dev + ["root", "tbf", "rate", "2mbit",
                           "burst", "16kb", "latency", "150ms"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        self.slow_kind = "tbf rate 2mbit latency 150ms (no netem in this kernel)"


def test_nemesis(tmp_path):
    rng = random.Random(SEED)
    report("nemesis seed %d (replay: NEMESIS_SEED=%d), %d s" % (SEED, SEED, SECONDS))
    net = NetnsNet()
    cl = Cluster(net, str(tmp_path))
    nem = None
    try:
        nem = Nemesis(cl, None, str(tmp_path), rng)
        cl.start(0, [0], nem.node_args(0))
        for i in range(1, NODES):
            cl.start(i, [0, 1], nem.node_args(i))
        wait_until(lambda: cl.converged(range(NODES), range(NODES)), 20,
                   "%d nodes to converge" % NODES)
        o = NemesisOracle(cl, range(NODES))
        nem.o = o
        o.start()
        wait_until(lambda: o.snap()["hits"] > 0 and o.snap()["s_hits"] > 0, 20,
                   "the oracle's first hits")
        nem.t_start = time.time()
        counts = {}
        while time.time() - nem.t_start < SECONDS:
            time.sleep(rng.uniform(*FAULT_GAP))
            kind = rng.choice(FAULTS)
            i = rng.randrange(NODES)
            counts[kind] = counts.get(kind, 0) + 1
            nem.run_one(kind, i)
            for j in cl.nodes:
                assert nem.alive(j), "node %d died:\n%s" % (j, cl.nodes[j].text()[-3000:])
        st = o.check("nemesis")
        for line in nem.log:
            report("nemesis " + line)
        report("nemesis: %d faults %s in %.0f s; kv %s; slowest call %.2f s (%s); "
               "purged in %s s; recovered in %s s%s" % (
                   sum(counts.values()), counts, time.time() - nem.t_start,
                   {k: v for k, v in st.items()}, o.slowest[0], o.slowest[1],
                   ["%.1f" % p for p in nem.purges],
                   ["%.1f" % r for r in nem.recoveries],
                   "; slow link: " + nem.slow_kind if nem.slow_kind else ""))
        assert st["s_wrong"] == 0, st
        assert st["s_hits"] > 0, st
        assert o.slowest[0] <= CALL_BOUND, o.slowest
        assert sum(counts.values()) >= 3, counts
        cl.stop_clean()
    finally:
        cl.stop_all()
        net.close()
