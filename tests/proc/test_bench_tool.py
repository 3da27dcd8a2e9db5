"""peercache-bench (issue 17): serve and drive on a 3-node loopback cluster,
the four report forms, the HTML report rendered in headless Chromium, the
redis and memcached baselines in the same report, compare, republish on a
membership change, and clear errors for bad input.

Short durations everywhere: these tests check that the tool measures and
reports what happened (hits, wrong bytes, rows, files), not how fast the
machine is; figures come from bench/README.md's runs."""
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import zlib

import pytest

from conftest import BUILD, RpcClient, clean_env, free_ports, start_joiner

TOOL = os.path.join(BUILD, "bench", "tool", "peercache-bench")
SHORT = ["--duration", "600ms", "--warmup", "200ms"]


def bench(*args, timeout=120, env=None):
    return subprocess.run([TOOL] + [str(a) for a in args], capture_output=True,
                          text=True, timeout=timeout, env=clean_env(env))


class Serve:
    """A running `peercache-bench serve`, stopped with SIGINT."""

    def __init__(self, sock, *args):
        self.err_path = tempfile.mktemp(prefix="pcb-serve-")
        self.err = open(self.err_path, "wb")
        self.proc = subprocess.Popen([TOOL, "serve", "--node", sock] + [str(a) for a in args],
                                     stdout=subprocess.PIPE, stderr=self.err,
                                     text=True, env=clean_env())
        line = self.proc.stdout.readline()
        assert line.startswith("ready "), "serve did not get ready:\n" + self.text()
        self.ready = line

    def text(self):
        with open(self.err_path, "rb") as f:
            return f.read().decode(errors="replace")

    def wait_for(self, needle, timeout=30.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if needle in self.text():
                return
            assert self.proc.poll() is None, "serve exited:\n" + self.text()
            time.sleep(0.05)
        raise AssertionError("'%s' not in serve's output:\n%s" % (needle, self.text()))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(30)
        self.err.close()
        return self.proc.returncode


@pytest.fixture
def serves():
    started = []

    def start(sock, *args):
        s = Serve(sock, *args)
        started.append(s)
        return s

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
        s.err.close()
        try:
            os.unlink(s.err_path)  # serve's log: no scratch file left in /tmp
        except FileNotFoundError:
            pass


def load(prefix):
    with open(prefix + ".json") as f:
        return json.load(f)


def check_rows(rep, target, op, concs, hit_rate=1.0):
    rows = [r for r in rep["rows"] if r["target"] == target and r["op"] == op]
    assert [r["concurrency"] for r in rows] == concs, rows
    for r in rows:
        assert r["wrong"] == 0 and r["errors"] == 0, r
        assert r["calls"] > 0 and r["pages"] == r["calls"] * r["batch"], r
        assert r["hit_rate"] == pytest.approx(hit_rate), r
        assert r["pages_s"] > 0, r
        for lat in (r["batch_lat"], r["page_lat"]):
            assert 0 < lat["p50_us"] <= lat["p99_us"] <= lat["p999_us"] <= lat["max_us"] * 1.01, r
        assert r["page_lat"]["p50_us"] <= r["batch_lat"]["p50_us"], r
        # The figures agree with each other.
        assert r["seconds"] == pytest.approx(0.6), r
        assert r["pages_s"] == pytest.approx(r["hits"] / r["seconds"]), r
        assert r["gbps"] == pytest.approx(r["bytes"] / r["seconds"] / 1e9), r
    assert sum(1 for r in rows if r["peak"]) == 1, rows
    return rows


def test_three_nodes_serve_and_drive_every_report_form(cluster, serves, tmp_path):
    a, b, c = cluster(3, "--pool-size", "128mb")
    sa, sb, sc = (n.endpoint("socket") for n in (a, b, c))
    s = serves(sa, "--page-bytes", "64k", "--pages", "96", "--batch", "8",
               "--drivers", "2")
    assert "pages=96 page_bytes=65536" in s.ready
    out = {}
    for op, sock, drv in (("get", sb, 0), ("exists", sc, 1), ("set", sb, 0),
                          ("mixed", sc, 1)):
        prefix = str(tmp_path / op)
        r = bench("drive", "--node", sock, "--op", op, "--batch", "8",
                  "--concurrencies", "1,2", "--driver-id", drv,
                  "--verify", "full", "--report", prefix, *SHORT)
        assert r.returncode == 0, r.stderr
        for ext in ("json", "md", "html"):
            assert os.path.getsize(prefix + "." + ext) > 500, ext
        out[op] = (r, load(prefix))
    s.wait_for("2/2 drivers")
    rows = check_rows(out["get"][1], "peercache", "get", [1, 2])
    assert all(r["bytes"] == r["hits"] * 65536 for r in rows)
    assert all(r["mode"] == "p2p" and r["via"] == "session" for r in rows)
    check_rows(out["exists"][1], "peercache", "exists", [1, 2])
    rows = check_rows(out["set"][1], "peercache", "set", [1, 2])
    assert all(r["bytes"] == r["hits"] * 65536 for r in rows)
    # mixed: one row per op that ran (get at 8 parts in 10 always does).
    mixed = out["mixed"][1]["rows"]
    assert {r["op"] for r in mixed} <= {"mixed/get", "mixed/exists", "mixed/set"}
    assert [r["concurrency"] for r in mixed if r["op"] == "mixed/get"] == [1, 2]
    assert all(r["wrong"] == 0 and r["hit_rate"] > 0.9 for r in mixed), mixed
    # Console: a header and one line per row, the peak marked.
    console = out["get"][0].stdout
    assert console.count("peercache") >= 2 and "*" in console, console
    # progress goes to stderr, the table to stdout
    assert "calls/s" not in console and "calls/s" in out["get"][0].stderr
    # JSON: host, build, settings.
    rep = out["get"][1]
    assert rep["tool"] == "peercache-bench" and rep["host"]["cpus"] >= 1
    assert rep["settings"]["working_set_pages"] == "96"
    assert rep["settings"]["node_mode"] == "p2p"
    # Markdown: a table with the rows.
    md = open(str(tmp_path / "get.md")).read()
    assert md.count("\n| ") >= 3 and "peercache" in md
    # HTML: two charts, one data point per row in each.
    html = open(str(tmp_path / "get.html")).read()
    assert 'id="chart-throughput"' in html and 'id="chart-p99"' in html
    assert html.count('class="pt"') == 2 * len(rep["rows"])
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), "no fetches"
    # compare: the get run against itself is 1.0 everywhere.
    r = bench("compare", str(tmp_path / "get.json"), str(tmp_path / "get.json"))
    assert r.returncode == 0, r.stderr
    assert re.search(r"min 1\.0+, median 1\.0+, max 1\.0+", r.stdout), r.stdout
    r = bench("compare", str(tmp_path / "get.json"), str(tmp_path / "set.json"))
    assert r.returncode == 1 and "no row" in r.stderr
    assert s.stop() == 0
    assert "deleted 96 pages" in s.text()
    for n in (a, b, c):
        assert n.stop() == 0


def test_rpc_path_and_wrong_mode(cluster, serves, tmp_path):
    a, b = cluster(2, "--pool-size", "64mb")
    serves(a.endpoint("socket"), "--page-bytes", "16k", "--pages", "40")
    r = bench("drive", "--via", "rpc", "--node", b.endpoint("rpc"), "--op", "get",
              "--concurrencies", "2", "--processes", "2", "--no-files", *SHORT)
    assert r.returncode == 0, r.stderr
    assert re.search(r"peercache\s*/?\s*rpc", r.stdout), r.stdout
    r = bench("drive", "--node", b.endpoint("socket"), "--mode", "slotmap",
              "--no-files", *SHORT)
    assert r.returncode == 1 and "runs p2p" in r.stderr, r.stderr


def test_serve_republishes_when_the_membership_changes(cluster, node_factory, serves, tmp_path):
    a, b = cluster(2, "--pool-size", "64mb")
    ids = ["127.0.0.1:%d" % n.rpc_port() for n in (a, b)]
    s = serves(a.endpoint("socket"), "--page-bytes", "8k", "--pages", "64",
               "--check-interval", "100ms")
    c, ids3 = start_joiner(node_factory, ids, "--pool-size", "64mb")
    for n in (a, b):
        cl = RpcClient(n.endpoint("rpc"))
        err, res = cl.call("cluster.set_peers", [ids3])
        cl.close()
        assert err is None and res["changed"], (err, res)
    s.wait_for("republished 64/64 pages")
    assert "membership changed (2 -> 3 members)" in s.text()
    # The joiner now owns part of the directory; every page is found from it.
    r = bench("drive", "--node", c.endpoint("socket"), "--concurrencies", "1",
              "--no-files", *SHORT)
    assert r.returncode == 0, r.stderr
    assert "100.0% hits" in r.stderr, r.stderr


def start_server(cmd, port, tmp_path, name):
    log = open(str(tmp_path / (name + ".log")), "wb")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 15
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return p
        except OSError:
            assert p.poll() is None, "%s exited" % name
            time.sleep(0.05)
    p.kill()
    raise AssertionError("%s did not listen on %d" % (name, port))


def test_redis_and_memcached_baselines_in_one_report(cluster, serves, tmp_path):
    redis, memcached = shutil.which("redis-server"), shutil.which("memcached")
    if not redis or not memcached:
        pytest.skip("redis-server and memcached are needed (scripts/deps.sh test)")
    a, b = cluster(2, "--pool-size", "64mb")
    serves(a.endpoint("socket"), "--page-bytes", "32k", "--pages", "48")
    rp, mp = free_ports(2)
    procs = []
    try:
        procs.append(start_server([redis, "--port", str(rp), "--bind", "127.0.0.1",
                                   "--save", "", "--appendonly", "no"], rp, tmp_path, "redis"))
        procs.append(start_server([memcached, "-l", "127.0.0.1", "-p", str(mp), "-U", "0",
                                   "-m", "256", "-I", "2m"]
                                  + (["-u", "nobody"] if os.geteuid() == 0 else []),
                                  mp, tmp_path, "memcached"))
        prefix = str(tmp_path / "vs")
        r = bench("drive", "--node", b.endpoint("socket"), "--op", "get",
                  "--concurrencies", "1,2", "--vs", "redis=127.0.0.1:%d" % rp,
                  "--vs", "memcached=127.0.0.1:%d" % mp, "--report", prefix, *SHORT)
        assert r.returncode == 0, r.stderr
        rep = load(prefix)
        for target in ("peercache", "redis", "memcached"):
            check_rows(rep, target, "get", [1, 2])
        html = open(prefix + ".html").read()
        assert html.count('class="pt"') == 2 * 6
        # The same mix of get, exists and set on all three.
        r = bench("drive", "--node", b.endpoint("socket"), "--op", "mixed", "--mix", "4:3:3",
                  "--concurrencies", "2", "--vs", "redis=127.0.0.1:%d" % rp,
                  "--vs", "memcached=127.0.0.1:%d" % mp, "--report", prefix + "-mixed", *SHORT)
        assert r.returncode == 0, r.stderr
        rows = load(prefix + "-mixed")["rows"]
        for target in ("peercache", "redis", "memcached"):
            mine = [x for x in rows if x["target"] == target]
            assert {x["op"] for x in mine} == {"mixed/get", "mixed/exists", "mixed/set"}, mine
            for x in mine:
                assert x["wrong"] == 0 and x["errors"] == 0 and x["hit_rate"] > 0.9, x
                assert (x["bytes"] > 0) == (x["op"] != "mixed/exists"), x
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_bad_input_is_refused_clearly(cluster, tmp_path):
    for cmd in ("serve", "drive", "compare"):
        r = bench(cmd, "--help")
        assert r.returncode == 0 and "usage: peercache-bench " + cmd in r.stdout
    r = bench("--help")
    assert r.returncode == 0 and "serve" in r.stdout and "compare" in r.stdout
    assert bench("frobnicate").returncode == 2
    assert bench("drive", "--op", "scan").returncode == 2
    assert bench("drive", "--concurrencies", "0").returncode == 2
    assert bench("drive", "--vs", "mysql").returncode == 2
    assert bench("serve", "--layout", "gqa").returncode == 2
    r = bench("drive", "--node", str(tmp_path / "nobody.sock"), "--no-files")
    assert r.returncode == 1 and "no node answers" in r.stderr, r.stderr
    (a,) = cluster(1, "--pool-size", "32mb")
    r = bench("drive", "--node", a.endpoint("socket"), "--no-files", *SHORT)
    assert r.returncode == 1 and "peercache-bench serve" in r.stderr, r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"tool": "peercache-bench", "rows": [{"target": 5}]')
    r = bench("compare", str(bad), str(bad))
    assert r.returncode == 1 and "bad.json" in r.stderr, r.stderr
    r = bench("drive", "--only-vs", "--vs", "redis=127.0.0.1:%d" % free_ports(1)[0],
              "--page-bytes", "4k", "--no-files", *SHORT)
    assert r.returncode == 1 and "redis" in r.stderr, r.stderr


# ------------------------------------------------------------- the browser

def png_pixels(png):
    """(width, height, rows of RGB(A) bytes) of an 8-bit, non-interlaced
    RGB or RGBA PNG (what Chromium's screenshots are)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, hdr = 8, b"", None
    while pos < len(png):
        n, kind = struct.unpack(">I4s", png[pos:pos + 8])
        body = png[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
    w, h, depth, ctype, _, _, interlace = hdr
    assert depth == 8 and ctype in (2, 6) and interlace == 0, hdr
    bpp = 3 if ctype == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


def test_html_report_renders_with_data_points(cluster, serves, tmp_path):
    from test_dashboard import Browser, chromium_binary
    binary = chromium_binary()
    if binary is None:
        pytest.skip("chromium is not installed (scripts/deps.sh test installs it)")
    a, b = cluster(2, "--pool-size", "64mb")
    serves(a.endpoint("socket"), "--page-bytes", "16k", "--pages", "64")
    prefix = str(tmp_path / "html")
    r = bench("drive", "--node", b.endpoint("socket"), "--op", "get",
              "--concurrencies", "1,2,4", "--report", prefix, *SHORT)
    assert r.returncode == 0, r.stderr
    b_ = Browser(binary, tempfile.mkdtemp(dir=str(tmp_path)))
    try:
        b_.call("Browser.getVersion", session=False, timeout=30)
        b_.open_page()
        b_.navigate("file://" + prefix + ".html")
        b_.wait_until("document.readyState === 'complete'")
        pts = b_.eval("""(() => Array.from(document.querySelectorAll('circle.pt')).map(c => {
            const r = c.getBoundingClientRect(); const svg = c.closest('svg');
            const s = svg.getBoundingClientRect();
            return {chart: svg.id, w: r.width, x: r.x + r.width / 2 - s.x,
                    y: r.y + r.height / 2 - s.y, sw: s.width, sh: s.height,
                    fill: getComputedStyle(c).fill}; }))()""")
        assert len(pts) == 6, pts
        assert sorted({p["chart"] for p in pts}) == ["chart-p99", "chart-throughput"]
        for p in pts:
            assert p["w"] >= 6 and 0 < p["x"] < p["sw"] and 0 < p["y"] < p["sh"], p
        # Throughput points rise or fall with concurrency: x grows with it.
        xs = [p["x"] for p in pts if p["chart"] == "chart-throughput"]
        assert xs == sorted(xs) and len(set(xs)) == 3, xs
        path = os.path.join(BUILD, "test-artifacts", "bench-report.png")
        png = b_.screenshot(path)
        assert not b_.problems(), b_.problems()
    finally:
        b_.close()
    w, h, bpp, rows = png_pixels(png)
    fill = pts[0]["fill"]
    rgb = tuple(int(v) for v in re.findall(r"\d+", fill)[:3])
    hits = 0
    for line in rows:
        for x in range(0, w * bpp, bpp):
            if all(abs(line[x + k] - rgb[k]) <= 8 for k in range(3)):
                hits += 1
    # Three points of radius >= 4 in each of two charts, plus the legend
    # swatch and the line: well over 100 pixels of the series colour.
    assert hits > 100, (fill, hits)


def test_serve_and_drive_start_their_own_nodes(cluster, node_factory, serves, tmp_path):
    """serve -- ARGS starts a peercached that joins the cluster ARGS name;
    drive -- ARGS the same; both stop their node when they end."""
    ports = free_ports(4)
    ids = ["127.0.0.1:%d" % p for p in ports]
    peers = ",".join(ids)
    a = node_factory("--rpc-port", str(ports[0]), "--peers", peers, "--pool-size", "64mb")
    b = node_factory("--rpc-port", str(ports[1]), "--peers", peers, "--pool-size", "64mb")
    own = ["--rpc-port", str(ports[2]), "--peers", peers, "--data-port", "0",
           "--meta-port", "0", "--metrics-port", "0", "--threads", "2",
           "--pool-size", "64mb", "--pool-prefault", "false"]
    # The cluster's other members first: a set on serve's node stores a
    # page only once a directory owner of its key answers.
    for n in (a, b):
        n.wait_for("ready")
    s = serves("unused", "--page-bytes", "16k", "--pages", "48", "--", *own)
    pid = int(re.search(r"started \S+ \(pid (\d+)", s.text()).group(1))
    r = bench("drive", "--node", b.endpoint("socket"), "--concurrencies", "1",
              "--no-files", *SHORT)
    assert r.returncode == 0 and "100.0% hits" in r.stderr, r.stderr
    own4 = list(own)
    own4[1] = str(ports[3])
    r = bench("drive", "--concurrencies", "1", "--no-files", *SHORT, "--", *own4)
    assert r.returncode == 0 and "100.0% hits" in r.stderr, r.stderr
    assert "node stopped" in r.stderr and "not cleanly" not in r.stderr, r.stderr
    assert s.stop() == 0
    assert "node stopped" in s.text() and "not cleanly" not in s.text(), s.text()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_drive_a_slotmap_cluster(cluster, serves, tmp_path):
    a, b, c = cluster(3, "--mode", "slotmap", "--pool-size", "64mb")
    serves(a.endpoint("socket"), "--page-bytes", "16k", "--pages", "48")
    prefix = str(tmp_path / "slotmap")
    r = bench("drive", "--node", c.endpoint("socket"), "--mode", "slotmap", "--op", "get",
              "--concurrencies", "1,2", "--verify", "full", "--report", prefix, *SHORT)
    assert r.returncode == 0, r.stderr
    rows = check_rows(load(prefix), "peercache", "get", [1, 2])
    assert all(x["mode"] == "slotmap" for x in rows)


def test_a_page_with_wrong_bytes_fails_the_run(cluster, serves, tmp_path):
    """The check is real: a page stored under a working-set key with other
    bytes (the node keeps it: a set of a held key does not copy again) is
    counted as wrong and fails the run."""
    a, b = cluster(2, "--pool-size", "64mb")
    cl = RpcClient(a.endpoint("rpc"))
    err, ok = cl.call("kv.set", [["pcb/p/3"], [b"\x5a" * 16384]])
    cl.close()
    assert err is None and ok == [True]
    serves(a.endpoint("socket"), "--page-bytes", "16k", "--pages", "8")
    prefix = str(tmp_path / "wrong")
    r = bench("drive", "--node", b.endpoint("socket"), "--concurrencies", "1",
              "--batch", "4", "--verify", "sample", "--report", prefix, *SHORT)
    assert r.returncode == 1, r.stderr
    assert "not theirs" in r.stderr and "wrong bytes" in r.stderr, r.stderr
    (row,) = load(prefix)["rows"]
    assert row["wrong"] > 0 and row["hit_rate"] == 1.0, row


def test_ctrl_c_ends_a_sweep_without_reporting_the_cut_level(cluster, serves, tmp_path):
    a, b = cluster(2, "--pool-size", "64mb")
    serves(a.endpoint("socket"), "--page-bytes", "16k", "--pages", "16")
    prefix = str(tmp_path / "cut")
    p = subprocess.Popen([TOOL, "drive", "--node", b.endpoint("socket"),
                          "--concurrencies", "1,2", "--duration", "60s", "--warmup",
                          "100ms", "--report", prefix], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=clean_env())
    time.sleep(1.5)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)  # not the 60 s of the level
    assert p.returncode == 1 and "interrupted" in err, err
    assert not os.path.exists(prefix + ".json"), "no row was measured whole"
