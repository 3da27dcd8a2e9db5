"""Issue 13 item 6: discovery under network faults, a content oracle running.

Each node runs in a network namespace of its own with its own address on a
bridge (netns.py builds and deletes them), `cluster_secret` set through a
secret file. Scenarios: a node joins; a non-head node is killed (-9); the
head is killed and a new node joins through the second seed; one node's
link goes down and comes back; the cluster is partitioned and healed.
Throughout, an oracle writes pages of known content through the nodes' RPC
and reads them back through other nodes: misses are allowed during faults,
wrong bytes never (its counts are printed; run with -s to see them).

Where namespaces are unavailable (not root, no `ip netns`, or
PEERCACHE_NETNS=off) the netns variants skip with the reason and the
loopback variants run instead, with link down and partition emulated by
SIGSTOP (netns.LoopNet says what exactly). Deadlines are generous (CI is
slow); measured times are printed, never asserted tightly.
"""
import contextlib
import hashlib
import os
import random
import signal
import tempfile
import threading
import time

import pytest

from conftest import SANITIZED, Node, RpcClient, free_ports, freeze, report
from netns import LoopNet, NetnsNet, netns_unavailable
from test_discovery import SLACK, wait_until

NETNS_WHY = netns_unavailable()
# how long a fault lasts (s); longer by hand: PEERCACHE_NETNS_HOLD=30
HOLD = float(os.environ.get("PEERCACHE_NETNS_HOLD", "1.5"))
PURGE_BOUND = 10.0  # s: kill -9 purged from every view (CI-safe bound)


def page(key):
    seed = hashlib.sha256(key.encode()).digest()
    n = 2048 + seed[0] * 16
    return (seed * (n // 32 + 1))[:n]


class Cluster:
    """Nodes on a test network, all with the same cluster secret."""

    def __init__(self, net, tmp):
        self.net, self.tmp = net, tmp
        self.nodes, self.ids, self.metas = {}, {}, {}
        self.secret = os.path.join(tmp, "secret")
        with open(self.secret, "w") as f:
            f.write("netns-test-%d-%d\n" % (os.getpid(), random.getrandbits(64)))
        os.chmod(self.secret, 0o600)

    def args(self, i, seeds, sock, extra=()):
        """Node i's command line: its address and ports, the seeds, the
        secret, then extra (later options win)."""
        rpc, meta, data = self.net.ports(i)
        for j in seeds:  # seeds named before they start (LoopNet ports)
            self.net.ports(j)
        seed_list = ",".join("%s:%d" % (self.addr(j), self.net.ports(j)[1])
                             for j in seeds)
        return ["--bind", self.addr(i), "--rpc-port", str(rpc), "--meta-port",
                str(meta), "--data-port", str(data), "--metrics-port", "0",
                "--threads", "2", "--pool-size", "32mb",
                "--pool-prefault", "false", "--socket", sock,
                "--discovery-addr", seed_list,
                "--cluster-secret-file", self.secret] + list(extra)

    def launch(self, i, seeds, extra=()):
        """Start node i without waiting for it to be ready."""
        addr, wrap = self.net.add(i)
        assert addr == self.addr(i), (addr, self.addr(i))
        rpc, meta, data = self.net.ports(i)
        d = tempfile.mkdtemp(dir=self.tmp)
        args = self.args(i, seeds, os.path.join(d, "n.sock"), extra)
        n = Node(args, tmpdir=d, wrap=wrap)
        self.nodes[i] = n
        self.ids[i] = "%s:%d" % (addr, rpc)
        self.metas[i] = "%s:%d" % (addr, meta)
        return n

    def start(self, i, seeds, extra=()):
        n = self.launch(i, seeds, extra)
        n.wait_for("ready", 30)
        return n

    def addr(self, i):
        return "127.0.0.1" if self.net.kind == "loopback" else \
            "10.213.0.%d" % (i + 1)

    def kill(self, i):
        n = self.nodes[i]
        n.proc.kill()
        n.proc.wait()

    def view(self, i):
        c = RpcClient(self.nodes[i].endpoint("socket"), timeout=10.0)
        try:
            err, res = c.call("discovery.view")
        finally:
            c.close()
        assert err is None, err
        return res

    def converged(self, on, members):
        """Every node in `on` follows the same table (epoch, source) and
        it lists exactly `members`: the views, else False."""
        want = sorted(self.ids[i] for i in members)
        vs = [self.view(i) for i in on]
        if any(sorted(m["id"] for m in v["members"]) != want for v in vs):
            return False
        if len({(v["epoch"], v["from"]) for v in vs}) != 1:
            return False
        return vs

    def stop_clean(self):
        """Stop every running node (SIGINT: it deregisters); each must exit
        0 (in the sanitizer tree: no leak, no error report)."""
        codes = {i: n.stop() for i, n in self.nodes.items()
                 if n.proc.poll() is None}
        assert all(c == 0 for c in codes.values()), codes

    def stop_all(self):
        for n in self.nodes.values():
            if n.proc.poll() is None:
                try:
                    os.kill(n.proc.pid, signal.SIGCONT)
                except OSError:
                    pass
                n.proc.kill()
                n.proc.wait()
            n.log.close()


class Oracle:
    """Writes pages of known content (derived from the key) through the
    nodes in `on`, and reads random written keys back through random
    nodes in `on`: a read is a hit (right bytes), a miss (nil) or wrong.
    Calls that fail (a node unreachable, a timeout) count as errors."""

    def __init__(self, cluster, on):
        self.c = cluster
        self.on = set(on)
        self.lock = threading.Lock()
        self.keys = []
        self.st = dict(sets=0, set_false=0, reads=0, hits=0, misses=0,
                       wrong=0, errors=0)
        self.hits_on = {}  # reads that hit, by the node that served them
        self.busy = {}  # calls in flight, by node
        self.stop_ev = threading.Event()
        self.threads = [threading.Thread(target=self._writer, daemon=True)]
        self.threads += [threading.Thread(target=self._reader, args=(s,),
                                          daemon=True) for s in (1, 2)]
        self.clients = {}
        self.failures = []

    def start(self):
        for t in self.threads:
            t.start()

    def use(self, i, on=True):
        """Start or stop using node i; stopping waits for the calls in
        flight to it (a node about to be frozen must not hold one)."""
        with self.lock:
            (self.on.add if on else self.on.discard)(i)
        wait_until(lambda: on or not self.busy.get(i), 15,
                   "the oracle's calls to node %d" % i)

    def forget(self, i):
        """Stop using node i and reading its pages (it is to be killed)."""
        self.use(i, False)
        with self.lock:
            self.keys = [k for k in self.keys if not k.startswith("o%d-" % i)]

    def hits_by_node(self):
        with self.lock:
            return dict(self.hits_on)

    def recovered(self, timeout):
        """Wait for a 1 s window of reads without a miss: reads went back
        to hitting; the time it took."""
        t0 = time.time()

        def clean():
            a = self.snap()
            time.sleep(1.0)
            d = delta(a, self.snap())
            return d["reads"] > 0 and d["misses"] == 0 and d["errors"] == 0
        wait_until(clean, timeout, "reads without misses (%s)" % self.snap())
        return time.time() - t0

    def snap(self):
        with self.lock:
            return dict(self.st)

    def _pick(self, rnd):
        with self.lock:
            on = sorted(self.on)
        return rnd.choice(on) if on else None

    @contextlib.contextmanager
    def busy_on(self, i):
        """A call to node i is in flight within (use() waits for it);
        yields False, and counts nothing, when i was dropped since it was
        picked: then make no call."""
        with self.lock:
            ok = i in self.on
            if ok:
                self.busy[i] = self.busy.get(i, 0) + 1
        try:
            yield ok
        finally:
            if ok:
                with self.lock:
                    self.busy[i] -= 1

    def _call(self, conns, i, method, params):
        with self.busy_on(i) as ok:
            if not ok:
                return "dropped", None
            return self._call_on(conns, i, method, params)

    def _call_on(self, conns, i, method, params):
        try:
            if i not in conns:
                conns[i] = RpcClient(self.c.nodes[i].endpoint("socket"),
                                     timeout=10.0)
            return conns[i].call(method, params)
        except (OSError, ConnectionError, AssertionError):
            old = conns.pop(i, None)
            if old:
                old.close()
            with self.lock:
                self.st["errors"] += 1
            time.sleep(0.05)
            return "failed", None

    def _writer(self):
        rnd, conns, seq = random.Random(7), {}, 0
        try:
            while not self.stop_ev.is_set():
                i = self._pick(rnd)
                if i is None:
                    time.sleep(0.05)
                    continue
                keys = ["o%d-%d" % (i, (seq + k) % 600) for k in range(8)]
                seq += 8
                err, ok = self._call(conns, i, "kv.set",
                                     [keys, [page(k) for k in keys]])
                if err is not None:
                    continue
                with self.lock:
                    self.st["sets"] += len(keys)
                    self.st["set_false"] += ok.count(False)
                    # A set that got false (no directory owner reachable,
                    # e.g. during a partition) left the page without a
                    # record; a later set that says true published it
                    # again, so the key is read back from then on.
                    self.keys += [k for k, y in zip(keys, ok) if y]
                    if len(self.keys) > 4000:
                        del self.keys[:2000]
                time.sleep(0.01)
        except Exception as e:  # surfaced by check()
            self.failures.append(e)

    def _reader(self, seed):
        rnd, conns = random.Random(seed), {}
        try:
            while not self.stop_ev.is_set():
                i = self._pick(rnd)
                with self.lock:
                    keys = rnd.sample(self.keys, min(16, len(self.keys)))
                if i is None or not keys:
                    time.sleep(0.05)
                    continue
                err, got = self._call(conns, i, "kv.get", [keys])
                if err is not None:
                    continue
                hits = sum(1 for k, v in zip(keys, got) if v == page(k))
                miss = sum(1 for v in got if v is None)
                with self.lock:
                    self.hits_on[i] = self.hits_on.get(i, 0) + hits
                    self.st["reads"] += len(keys)
                    self.st["hits"] += hits
                    self.st["misses"] += miss
                    self.st["wrong"] += len(keys) - hits - miss
        except Exception as e:
            self.failures.append(e)

    def check(self, label):
        self.stop_ev.set()
        for t in self.threads:
            t.join(30)
        st = self.snap()
        report("[%s] oracle: %s" % (label, st))
        assert not self.failures, self.failures[0]
        assert st["wrong"] == 0, st
        assert st["hits"] > 0 and st["sets"] > 0, st
        return st


def marks(cl):
    """Where each running node's log ends now (for flaps())."""
    return {i: len(n.text()) for i, n in cl.nodes.items()
            if n.proc.poll() is None}


def flaps(cl, since):
    """Ring removals logged since `since`: a recovery must only add
    members; a live one dropped and re-added is a flap (MB_LEAVE, handles
    closed, records moved for nothing)."""
    out = []
    for i, m in since.items():
        out += ["node %d: %s" % (i, line.strip()[-120:])
                for line in cl.nodes[i].text()[m:].splitlines()
                if "left the ring" in line]
    return out


def delta(a, b):
    return {k: b[k] - a[k] for k in a}


@pytest.fixture(params=["netns", "loopback"])
def net(request, tmp_path):
    """The network: namespaces when available; the loopback emulation only
    where they are not (or PEERCACHE_NETNS=off), so each scenario runs
    once."""
    if request.param == "netns" and NETNS_WHY:
        report("netns variant skipped: %s (the loopback variant runs)"
              % NETNS_WHY)
        pytest.skip("network namespaces unavailable: " + NETNS_WHY)
    if request.param == "loopback" and not NETNS_WHY:
        pytest.skip("namespaces available: the netns variant runs instead")
    n = NetnsNet() if request.param == "netns" else LoopNet()
    if n.emulated:
        report("loopback variant, emulated: " + n.emulated)
    cl = Cluster(n, str(tmp_path))
    try:
        yield cl
    finally:
        cl.stop_all()
        n.close()


def start_nodes(cl, count, oracle=True):
    """count nodes: node 0 the head, the others seeded with [0, 1]."""
    t0 = time.time()
    cl.start(0, [0])
    for i in range(1, count):
        cl.start(i, [0, 1])
    wait_until(lambda: cl.converged(range(count), range(count)), 15,
               "%d nodes to converge" % count)
    report("%s: %d nodes up and converged in %.2f s"
          % (cl.net.kind, count, time.time() - t0))
    if cl.net.kind == "loopback":
        # Freeze nodes only once every master is warm (up member_ttl): a
        # node frozen before it saw them warm resumes preferring its own
        # table and may drop a member for a moment (docs/discovery.md).
        time.sleep(max(0.0, t0 + 2.2 * SLACK - time.time()))
    if not oracle:
        return None
    o = Oracle(cl, range(count))
    o.start()
    wait_until(lambda: o.snap()["hits"] > 0, 10, "the oracle's first hits")
    return o


def timed(fn, timeout, what):
    t0 = time.time()
    wait_until(fn, timeout, what)
    return time.time() - t0


def test_join(net):
    cl = net
    o = start_nodes(cl, 3)
    t0, m = time.time(), marks(cl)
    cl.start(3, [0, 1])
    wait_until(lambda: cl.converged(range(4), range(4)), 10,
               "all 4 nodes to see 4 members")
    report("%s join: 4th node in every view %.2f s after its start"
          % (cl.net.kind, time.time() - t0))
    o.use(3)
    time.sleep(1.0)
    assert not flaps(cl, m), flaps(cl, m)
    o.check("join")
    cl.stop_clean()


def test_kill_non_head(net):
    cl = net
    o = start_nodes(cl, 4)
    victim, rest = 2, [0, 1, 3]  # a master, not the head
    o.forget(victim)  # its own pages are gone with it
    time.sleep(0.5)
    before = o.snap()
    t0 = time.time()
    cl.kill(victim)
    wait_until(lambda: cl.converged(rest, rest), PURGE_BOUND,
               "the killed node to be purged everywhere")
    purged = time.time() - t0
    window = delta(before, o.snap())
    report("%s kill -9: purged from every view after %.2f s; reads meanwhile"
          " %s" % (cl.net.kind, purged, window))
    assert purged <= PURGE_BOUND * SLACK
    # Lookups fell over to the other directory owner: survivors' pages hit.
    assert window["hits"] > 0, window
    report("%s kill -9: reads hit again, no miss for 1 s, %.2f s after the "
          "purge" % (cl.net.kind, o.recovered(10)))
    roles = {m["id"]: m["role"] for m in cl.view(0)["members"]}
    assert sorted(roles.values()) == ["head", "master", "master"], roles
    time.sleep(0.5)
    o.check("kill -9 non-head")
    cl.stop_clean()


def test_kill_head_then_join_through_second_seed(net):
    cl = net
    o = start_nodes(cl, 3)
    o.forget(0)
    time.sleep(0.3)
    t0 = time.time()
    cl.kill(0)
    vs = wait_until(lambda: cl.converged([1, 2], [1, 2]), 10,
                    "the others to agree without the head")
    report("%s head killed: others agree on %s after %.2f s"
          % (cl.net.kind, vs[0]["from"], time.time() - t0))
    # the next master by meta address (port order on loopback)
    assert vs[0]["from"] == min(cl.metas[1], cl.metas[2])
    mid = o.snap()
    time.sleep(1.0)
    assert delta(mid, o.snap())["hits"] > 0  # still serving
    t0 = time.time()
    cl.start(3, [0, 1])  # its first seed is the dead head
    wait_until(lambda: cl.converged([1, 2, 3], [1, 2, 3]), 10,
               "the new node to join through the second seed")
    report("%s: new node joined through seed 2 in %.2f s"
          % (cl.net.kind, time.time() - t0))
    o.use(3)
    report("%s: reads hit again, no miss for 1 s, %.2f s later"
          % (cl.net.kind, o.recovered(10)))
    o.check("kill head + join")
    cl.stop_clean()


def test_link_down_up(net):
    cl = net
    o = start_nodes(cl, 4)
    cut, rest = 2, [0, 1, 3]
    if cl.net.kind == "loopback":
        o.use(cut, False)  # a frozen node would stall the oracle
    t0 = time.time()
    cl.net.link(cut, False, cl.nodes[cut])
    wait_until(lambda: cl.converged(rest, rest), 10,
               "the cut node to be removed")
    removed = time.time() - t0
    time.sleep(HOLD)
    t1, m = time.time(), marks(cl)
    cl.net.link(cut, True, cl.nodes[cut])
    vs = wait_until(lambda: cl.converged(range(4), range(4)), 20,
                    "everyone to converge to 4 members again")
    back = time.time() - t1
    time.sleep(0.5)
    assert not flaps(cl, m), flaps(cl, m)
    report("%s link down/up: removed after %.2f s, all 4 converged %.2f s "
          "after the link came back (epoch %d from %s)"
          % (cl.net.kind, removed, back, vs[0]["epoch"], vs[0]["from"]))
    assert vs[0]["from"] == cl.metas[0]
    o.use(cut)
    report("%s link up: reads hit again, no miss for 1 s, %.2f s after "
          "convergence" % (cl.net.kind, o.recovered(10)))
    o.check("link down/up")
    cl.stop_clean()


def partition_heal(cl, n, far, label):
    """Split n nodes into the head's side and `far`, check that each side
    serves, heal, and check that all converge to the head's membership
    without a flap and that reads recover."""
    near = [i for i in range(n) if i not in far]
    o = start_nodes(cl, n)
    if cl.net.kind == "loopback":
        for i in far:
            o.use(i, False)  # frozen
    # The far side converges on itself when it holds a master; without
    # one it keeps its last view (docs/discovery.md).
    far_master = any(m["role"] != "member" for m in cl.view(0)["members"]
                     if m["id"] in [cl.ids[i] for i in far])
    t0 = time.time()
    cl.net.partition(far, [cl.nodes[i] for i in far])
    wait_until(lambda: cl.converged(near, near), 10,
               "the head's side to converge on itself")
    sides = "head side %.2f s" % (time.time() - t0)
    if cl.net.kind == "netns" and far_master:
        wait_until(lambda: cl.converged(far, far), 10,
                   "the far side to converge on itself")
        sides += ", far side %.2f s" % (time.time() - t0)
    elif cl.net.kind == "netns":
        # Without a master each far node keeps its own last view: all n
        # members, so its ring is unchanged. Their table epochs may differ
        # (a node may have pulled a newer table just before the cut; no
        # master is left to bring the others to it), so only the members
        # are compared.
        want = sorted(cl.ids[i] for i in range(n))
        vs = {i: cl.view(i) for i in far}
        kept = {i: sorted(m["id"] for m in v["members"]) == want
                for i, v in vs.items()}
        assert all(kept.values()), (
            "a far node without a master did not keep its last view: %s\n%s" %
            ({i: (v["epoch"], v["from"], sorted(m["id"] for m in v["members"]))
              for i, v in vs.items()},
             # what those nodes logged, for the diagnosis (two CI failures,
             # both fixed: bug 6, then a move to a silent master's list)
             "\n".join("--- node %d (%s), last lines:\n%s" % (
                 i, cl.ids[i], "\n".join(cl.nodes[i].text().splitlines()[-40:]))
                 for i in far if not kept[i])))
        sides += ", far side keeps its last view of %d (epochs %s)" % (
            n, sorted({v["epoch"] for v in vs.values()}))
    # Each side serves: reads through every reachable node hit.
    mid, mid_on = o.snap(), o.hits_by_node()
    time.sleep(HOLD)
    during, on = delta(mid, o.snap()), o.hits_by_node()
    served = {i: on.get(i, 0) - mid_on.get(i, 0) for i in sorted(o.on)}
    report("%s %s partition: sides converged (%s); oracle during it %s, hits "
          "by node %s" % (cl.net.kind, label, sides, during, served))
    assert all(v > 0 for v in served.values()), served
    t1, m = time.time(), marks(cl)
    cl.net.heal(far, [cl.nodes[i] for i in far])
    vs = wait_until(lambda: cl.converged(range(n), range(n)), 20,
                    "both sides to converge to one membership")
    healed = time.time() - t1
    time.sleep(0.5)
    fl = flaps(cl, m)
    if fl and SANITIZED and not far_master:
        # Known limit (docs/discovery.md, failure model): a far node follows
        # a master again once it has answered for member_ttl; a far peer
        # that re-registers later than that (seen only in the 5-10x slower
        # sanitizer tree) is dropped from its ring once, then comes back.
        # Reported here; the normal tree keeps the assertion.
        report("%s %s heal: far-side flap in the sanitizer tree (known "
               "limit): %s" % (cl.net.kind, label, fl))
    else:
        assert not fl, fl
    report("%s %s heal: one membership (epoch %d from %s) on all %d after "
          "%.2f s" % (cl.net.kind, label, vs[0]["epoch"], vs[0]["from"], n,
                      healed))
    assert vs[0]["from"] == cl.metas[0]
    heads = {m["id"] for v in vs for m in v["members"] if m["role"] == "head"}
    assert heads == {cl.ids[0]}, heads
    for i in far:
        o.use(i)
    report("%s %s heal: reads hit again, no miss for 1 s, %.2f s after "
          "convergence" % (cl.net.kind, label, o.recovered(10)))
    o.check("partition/heal " + label)
    cl.stop_clean()


def test_partition_and_heal(net):
    # the head and a member | two masters and a member
    partition_heal(net, 5, [1, 2, 4], "masters on both sides")


def test_partition_far_side_without_master(net):
    # the head and both masters | three members, no master among them
    partition_heal(net, 6, [3, 4, 5], "no master on the far side")


def test_member_keeps_its_view_when_its_masters_fall_silent_together(net):
    """Found by test_partition_far_side_without_master (a rare CI failure
    in the sanitizer tree): a member cut off from every master followed, at
    the moment its own master's silence reached member_ttl, the master
    whose last answer had come in a few milliseconds later, and with it
    that master's list as last pulled, which can lack members (a pull lost
    to the cut, or a master still filling its table): its ring lost live
    members. Here the masters' answers stop some heartbeats apart, so that
    this happens every run: node 2's table lacks node 4 (node 4's frames to
    node 2 are lost), node 3 stops hearing the head and node 1, then, a
    moment later, node 2. Every master has then been silent for longer than
    member_ttl / 2, so node 3 keeps its last view, as any member without a
    reachable master does; after the heal it follows the head again."""
    cl = net
    if cl.net.kind != "netns":
        pytest.skip("needs silences between chosen nodes (network "
                    "namespaces)")
    # Short heartbeats and a long TTL: the answers stop 2-4 heartbeats
    # apart, well within member_ttl / 2 of each other.
    hb, ttl = 0.2, 3.0
    extra = ["--heartbeat-interval", "%dms" % (hb * 1000),
             "--member-ttl", "%ds" % ttl]
    cl.start(0, [0], extra)
    for i in range(1, 5):
        cl.start(i, [0, 1], extra)
    wait_until(lambda: cl.converged(range(5), range(5)), 15,
               "5 nodes to converge")
    roles = {m["id"]: m["role"] for m in cl.view(0)["members"]}
    assert [roles[cl.ids[i]] for i in range(5)] == \
        ["head", "master", "master", "member", "member"], roles
    x, y = 3, 4
    wait_until(lambda: "member %s registered" % cl.ids[y] in
               cl.nodes[2].text(), 10, "node 4 to register with node 2")
    cl.net.mute(y, 2)
    gone = "member %s silent for" % cl.ids[y]
    wait_until(lambda: any(gone in line and "removed" in line for line in
                           cl.nodes[2].text().splitlines()),
               ttl + 5, "node 2 to drop node 4 from its table")
    time.sleep(4 * hb)  # node 3 pulls node 2's table without node 4
    assert cl.converged(range(5), range(5))  # the head still lists it
    m = marks(cl)
    cl.net.mute(x, 0)
    cl.net.mute(x, 1)
    time.sleep(3 * hb)
    cl.net.partition([x])
    time.sleep(ttl + 1.5)  # every master silent past member_ttl
    v = cl.view(x)
    assert sorted(mb["id"] for mb in v["members"]) == \
        sorted(cl.ids.values()), (
            "node 3 did not keep its last view: %s\n%s" % (
                (v["epoch"], v["from"], [mb["id"] for mb in v["members"]]),
                "\n".join(cl.nodes[x].text().splitlines()[-30:])))
    left = flaps(cl, {x: m[x]})
    assert not left, left
    t1 = time.time()
    cl.net.heal([x])
    for i, j in ((x, 0), (x, 1), (y, 2)):
        cl.net.mute(i, j, False)
    vs = wait_until(lambda: cl.converged(range(5), range(5)), 20,
                    "node 3 to follow the head's table again")
    report("%s: masters silent one after another, the member kept its "
           "view; all follow the head again %.2f s after the heal"
           % (cl.net.kind, time.time() - t1))
    assert vs[0]["from"] == cl.metas[0]
    assert not flaps(cl, {x: m[x]}), flaps(cl, {x: m[x]})
    cl.stop_clean()


def test_member_seeded_with_itself_rejoins_after_a_cut(net):
    """Found by the nemesis (bug 6 of 2026-12-05, seeds 886833960 and
    435177121): a node that is no master but names itself among its seeds
    (operators often give every node the same list; the nemesis restarts
    nodes that way), cut off alone past member_ttl, then followed its own
    table, which held only itself, for good: nobody heartbeats a node that
    is not a master, so that table never filled again, and it ranked first
    among the masters the node then knew. Now a table that lists the node,
    and not as a master, outranks its own: cut off, the node keeps its last
    view, and after the heal it follows the head's table again."""
    cl = net
    cl.start(0, [0])
    for i in (1, 2, 3):
        cl.start(i, [0, i])
    wait_until(lambda: cl.converged(range(4), range(4)), 15,
               "4 nodes to converge")
    # max_masters 3: the head and two masters (by meta address), one member
    roles = {m["id"]: m["role"] for m in cl.view(0)["members"]}
    cut = [i for i in (1, 2, 3) if roles[cl.ids[i]] == "member"]
    assert len(cut) == 1, roles
    cut, rest = cut[0], [i for i in (0, 1, 2, 3) if i != cut[0]]
    if cl.net.kind == "loopback":
        time.sleep(2.2 * SLACK)  # every master warm (start_nodes)
    cl.net.partition([cut], [cl.nodes[cut]])
    t0 = time.time()
    wait_until(lambda: cl.converged(rest, rest), 10,
               "the others to remove the cut node")
    time.sleep(max(0.0, t0 + 3.0 - time.time()))
    if cl.net.kind == "netns":
        # alone, it keeps its last view, as any member without a master
        # (it used to follow its own table, which held only itself)
        v = cl.view(cut)
        assert sorted(m["id"] for m in v["members"]) == \
            sorted(cl.ids.values()), v
    t1, m = time.time(), marks(cl)
    cl.net.heal([cut], [cl.nodes[cut]])
    vs = wait_until(lambda: cl.converged(range(4), range(4)), 20,
                    "the cut node to follow the head's table again")
    report("%s: a member seeded with itself, cut off %.1f s, follows the "
           "head again %.2f s after the heal" % (
               cl.net.kind, t1 - t0, time.time() - t1))
    assert vs[0]["from"] == cl.metas[0]
    time.sleep(0.5)
    assert not flaps(cl, m), flaps(cl, m)
    cl.stop_clean()


def test_startup_no_member_leaves_a_ring(net):
    """Found by an instrumented run of the fault tests (2026-12-06): at
    start-up a master that is not the head follows the head's table while
    the head is cold, then its own once it has been up member_ttl itself
    (that the head is warm too it learns only from its next heartbeat
    reply), then the head's again at that reply. When that reply also
    showed a member that had registered in the last interval, another
    master's list arriving before the pull of the head's table came back
    moved the node to the head's list as pulled an interval earlier:
    without that member, which left its ring and came back with the pull
    a moment later. Now a list is not moved to while the last heartbeat
    reply of its master shows a newer table: the node waits for the pull.
    The head and node 1 start together (node 1 then follows its own table
    for a moment) and members join near the time both turn warm. A race of
    two pulls on a fast link, so there are several start-ups: the old code
    dropped a member in 11 of 71 (this test failed 3 of 6 runs on it, so
    one pass proves little; the new code: none in 46)."""
    cl = net
    if cl.net.kind != "netns":
        pytest.skip("start-ups in network namespaces (one address each)")
    rounds, n = 8, 6
    stints = 0
    for r in range(rounds):
        t0 = time.time()
        cl.launch(0, [0])
        cl.launch(1, [0, 1])
        for i in range(2, n):  # joins near both nodes' member_ttl
            time.sleep(max(0.0, t0 + 1.2 + 0.2 * (i - 2) - time.time()))
            cl.launch(i, [0, 1])
        for i in range(n):
            cl.nodes[i].wait_for("ready", 30)
        wait_until(lambda: cl.converged(range(n), range(n)), 20,
                   "%d nodes to converge" % n)
        time.sleep(1.0 * SLACK)  # node 1 back on the head's table
        stints += "following the table of this node" in cl.nodes[1].text()
        left = flaps(cl, {i: 0 for i in range(n)})
        assert not left, "start-up %d: %s\n%s" % (r, left, "\n".join(
            line for line in cl.nodes[1].text().splitlines()
            if "discovery]" in line or "left the ring" in line))
        cl.stop_clean()
        cl.nodes.clear()
    report("%s: %d start-ups of %d nodes, no member left a ring (node 1 "
           "followed its own table for a moment in %d)"
           % (cl.net.kind, rounds, n, stints))


def test_joiner_does_not_keep_its_own_table(tmp_path):
    """Found by the loopback variants (random ports): a node that joins
    while only the second seed answers adopts that seed's table; when the
    head does not heartbeat that seed (not one of the head's masters), the
    table lacks the head, and if it lists the joiner as a master, the
    joiner then followed its own one-member table for good. Loopback,
    always run; the head is frozen (SIGSTOP) for a moment so that only the
    second seed answers the joiner."""
    net = LoopNet()
    cl = Cluster(net, str(tmp_path))
    try:
        ports = sorted(free_ports(10))
        # Meta addresses in order: 2, 3, 4 below 1, so the head's masters
        # are 0, 2, 3 and the second seed's table (no head) lists 2, 3, 4.
        metas = {2: ports[0], 3: ports[1], 4: ports[2], 1: ports[3],
                 0: ports[4]}
        for i in range(5):
            net.port_of[i] = (ports[5 + i], metas[i], 0)
        cl.start(0, [0])
        for i in range(1, 4):
            cl.start(i, [0, 1])
        wait_until(lambda: cl.converged(range(4), range(4)), 15,
                   "4 nodes to converge")
        freeze(cl.nodes[0].proc.pid)
        t0 = time.time()
        try:
            cl.start(4, [0, 1])
            time.sleep(0.3)
        finally:
            os.kill(cl.nodes[0].proc.pid, signal.SIGCONT)
        report("head frozen for %.2f s" % (time.time() - t0))
        t0 = time.time()
        vs = wait_until(lambda: cl.converged(range(5), range(5)), 10,
                        "the joiner to follow the head with the others")
        report("joiner follows the head %.2f s after the head answers again"
              % (time.time() - t0))
        assert vs[0]["from"] == cl.metas[0]
        time.sleep(0.5)
        # its ring only grew: it never followed its own one-member table
        assert not flaps(cl, {4: 0}), flaps(cl, {4: 0})
        cl.stop_clean()
    finally:
        cl.stop_all()
