"""The slotmap content-oracle hammer (issue 15, item 5), shared by
tests/proc/test_slotmap.py (CI-sized runs) and bench/slotmap_oracle.py (the
10^7-read run outside CI).

Writer processes kv.set pages of a small set of keys through some nodes
while reader processes kv.get all of them through every node. A page is a
function of (key id, version): its first 16 bytes are the key id and the
version (u64 each, little-endian), its length and the rest of its bytes
come from a hash of both, and a version names its writer (bits 32 and up)
and that writer's count. A reader checks every page it is handed: it must
be exactly the page of the key it asked for at some version a writer
issued. A miss is fine; a page that fails the check is wrong.

Workers are processes (fork), so that Python's lock does not serialise the
clients; each has its own stop event and a shared array of counters the
parent reads while they run.
"""
import hashlib
import multiprocessing
import random
import struct
import time

from conftest import RpcClient, metrics_of

HEAD = struct.Struct("<QQ")
WRITERS_MAX = 64
FIELDS = ("reads", "hits", "misses", "wrong", "errors", "sets", "refused")
SOURCES = ("local_slot", "remote_slot", "miss", "rejected")


def page(kid, ver, page_max):
    """The page of key kid at version ver: between page_max / 2 and
    page_max bytes, all of them derived from (kid, ver)."""
    head = HEAD.pack(kid, ver)
    d = hashlib.blake2b(head, digest_size=64).digest()
    half = page_max // 2
    n = half + int.from_bytes(d[:4], "little") % (page_max - half + 1)
    return head + (d * (n // 64 + 1))[:n - len(head)]


def judge(kid, got, page_max):
    """'miss', 'hit' (the page of kid at a version a writer can have
    issued) or 'wrong'."""
    if got is None:
        return "miss"
    if not isinstance(got, bytes) or len(got) < HEAD.size:
        return "wrong"
    k, v = HEAD.unpack_from(got)
    if k != kid or (v >> 32) >= WRITERS_MAX or v & 0xffffffff == 0:
        return "wrong"
    return "hit" if got == page(k, v, page_max) else "wrong"


def _worker(role, addr, wid, keys, page_max, batch, seed, stop, counters, out):
    """role 'writer': kv.set of `batch` random keys per call, each at a new
    version; 'reader': kv.get of every key (shuffled), `batch` keys per
    call."""
    rng = random.Random(seed)
    c = ctr = None
    examples = []
    seq = 0
    try:
        c = RpcClient(addr, timeout=60.0)
        ctr = counters
        while not stop.is_set():
            if role == "writer":
                pick = rng.sample(keys, batch)
                vals = []
                for kid, _ in pick:
                    seq += 1
                    vals.append(page(kid, wid << 32 | seq, page_max))
                err, res = c.call("kv.set", [[n for _, n in pick], vals])
                if err is not None:
                    ctr[4] += 1
                    if len(examples) < 3:
                        examples.append(("kv.set", str(err)))
                    continue
                done = sum(1 for r in res if r is True)
                ctr[5] += done
                ctr[6] += len(res) - done
                continue
            pick = list(keys)
            rng.shuffle(pick)
            pick = pick[:batch]
            err, res = c.call("kv.get", [[n for _, n in pick]])
            if err is not None or len(res) != len(pick):
                ctr[4] += 1
                if len(examples) < 3:
                    examples.append(("kv.get", str(err)))
                continue
            hits = misses = wrong = 0
            for (kid, name), got in zip(pick, res):
                v = judge(kid, got, page_max)
                if v == "hit":
                    hits += 1
                elif v == "miss":
                    misses += 1
                else:
                    wrong += 1
                    if len(examples) < 3:
                        examples.append(("wrong", name, len(got) if isinstance(got, bytes) else got,
                                         bytes(got[:16]).hex() if isinstance(got, bytes) else ""))
            ctr[1] += hits
            ctr[2] += misses
            ctr[3] += wrong
            ctr[0] += len(pick)  # last: a reader of reads sees the rest counted
    except Exception as e:  # reported by the parent as an error
        if ctr is not None:
            ctr[4] += 1
        examples.append(("exception", role, addr, repr(e)))
    finally:
        if c is not None:
            c.close()
        out.put((role, wid, examples))


class Hammer:
    """Workers over nodes; their counters summed on demand."""

    def __init__(self, keys, page_max, seed, write_batch=2, read_batch=None):
        self.keys, self.page_max = keys, page_max
        self.rng = random.Random(seed)
        self.write_batch = write_batch
        self.read_batch = read_batch or len(keys)
        self.ctx = multiprocessing.get_context("fork")
        self.out = self.ctx.Queue()
        self.workers = []   # (role, wid, process, stop, counters)
        self.examples = []
        self.nwriters = 0

    def start(self, role, node):
        """One worker on node's RPC port; returns its handle."""
        if role == "writer":
            self.nwriters += 1
            wid = self.nwriters
            assert wid < WRITERS_MAX
        else:
            wid = 0
        stop = self.ctx.Event()
        counters = self.ctx.Array("q", len(FIELDS), lock=False)
        p = self.ctx.Process(target=_worker, daemon=True,
                             args=(role, node.endpoint("rpc"), wid, self.keys,
                                   self.page_max,
                                   self.write_batch if role == "writer" else self.read_batch,
                                   self.rng.random(), stop, counters, self.out))
        p.start()
        h = (role, wid, p, stop, counters)
        self.workers.append(h)
        return h

    def totals(self, handles=None):
        t = dict.fromkeys(FIELDS, 0)
        for _, _, _, _, ctr in handles or self.workers:
            for i, f in enumerate(FIELDS):
                t[f] += ctr[i]
        return t

    def wait(self, done, timeout):
        """Until done(totals) holds, a worker fails or dies, or timeout
        seconds pass. Returns the totals."""
        deadline = time.time() + timeout
        while True:
            t = self.totals()
            if done(t) or t["errors"] or time.time() > deadline or \
                    any(not p.is_alive() for _, _, p, stop, _ in self.workers
                        if not stop.is_set()):
                return t
            time.sleep(0.1)

    def stop(self, handles=None):
        """Stops the workers (all by default; those stopped before are
        left alone) and collects their notes."""
        hs = list(handles or self.workers)
        live = [h for h in hs if not h[3].is_set()]
        for _, _, _, stop, _ in live:
            stop.set()
        for _ in live:
            role, wid, ex = self.out.get(timeout=120)
            self.examples += ex
        for _, _, p, _, _ in live:
            p.join(30)
        return self.totals(hs)


def slot_counters(nodes):
    """peercache_slotmap_reads_total by source and _writes_total by path,
    summed over nodes (KeyError if the node does not export them)."""
    out = dict.fromkeys(SOURCES + ("write_local", "write_remote"), 0.0)
    for n in nodes:
        m = metrics_of(n)
        for src in SOURCES:
            out[src] += m['peercache_slotmap_reads_total{source="%s"}' % src]
        for path in ("local", "remote"):
            out["write_" + path] += m['peercache_slotmap_writes_total{path="%s"}' % path]
    return out


def owners(nodes, names, page_max):
    """{name: index into nodes of its owner}: each key is set on nodes in
    turn until one counts it as a local slot write (the owner writes its own
    keys locally, a remote set goes to the owner)."""
    def local(n):
        return metrics_of(n)['peercache_slotmap_writes_total{path="local"}']

    found = {}
    for kid, name in names:
        owner = len(nodes) - 1
        for i, n in enumerate(nodes[:-1]):
            before = local(n)
            c = RpcClient(n.endpoint("rpc"), timeout=30.0)
            try:
                err, res = c.call("kv.set", [[name], [page(kid, 1, page_max)]])
            finally:
                c.close()
            assert err is None and res == [True], (name, err, res)
            if local(n) > before:
                owner = i
                break
        found[name] = owner
    return found


def pick_keys(nodes, per_owner, page_max, tag="ham"):
    """per_owner keys of each node (as (key id, name)), found by owners()."""
    chosen = {i: [] for i in range(len(nodes))}
    kid = 0
    while min(len(v) for v in chosen.values()) < per_owner:
        kid += 1
        assert kid < 60 * per_owner * len(nodes), ("owners are too uneven", chosen)
        name = "%s-%d" % (tag, kid)
        (o,) = owners(nodes, [(kid, name)], page_max).values()
        if len(chosen[o]) < per_owner:
            chosen[o].append((kid, name))
    return [k for i in sorted(chosen) for k in chosen[i]]


