"""The built-in dashboard (GET / on the metrics port) as a browser renders it.

Headless Chromium is driven through the DevTools protocol over a pipe
(--remote-debugging-pipe: JSON messages ending in NUL on fds 3 and 4), so
only the Python standard library is needed. Chromium is kept off the
network: every request but loopback goes to a dead proxy, and host names do
not resolve.

- test_dashboard_shows_live_node_values: a real peercached; the page must
  show its node id, uptime, transport, mode and RPC counters that reflect
  calls this test made. The screenshot is kept in
  $PEERCACHE_BUILD_DIR/test-artifacts/dashboard.png.
- test_dashboard_shows_a_slotmap_node: a real slotmap node of two; the slot
  region card shows the node's figures, the p2p tiers' cards are hidden.
- On both live nodes: every metric name the page reads is one the node
  exports, but for the names of the cards it hides (a declared list), and
  nothing the page shows says "n/a" (a misspelt name would).
- the other tests serve the same modules/dashboard.html from a stand-in
  http.server with a scripted /metrics: hostile label values (no markup may
  be injected), the parser on tricky input, "n/a" for absent metrics, the
  disconnected banner and its recovery, counter resets.

Skipped, with the reason, when Chromium is not installed or cannot start.
"""
import base64
import fcntl
import http.server
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time

import re

import pytest

from conftest import BUILD, ROOT, RpcClient, metrics_of

DASHBOARD = os.path.join(ROOT, "modules", "dashboard.html")
ARTIFACTS = os.path.join(BUILD, "test-artifacts")


def chromium_binary():
    # Debian's /usr/bin/chromium is a shell wrapper that adds flags of its
    # own (extensions, API keys); the browser itself sits in /usr/lib.
    for c in (os.environ.get("PEERCACHE_CHROMIUM"), "/usr/lib/chromium/chromium",
              "/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if c and os.access(c, os.X_OK):
            return c
    return None


class Browser:
    """One headless Chromium process and one page, over the DevTools pipe."""

    FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--disable-extensions",
             "--disable-default-apps", "--disable-domain-reliability",
             "--disable-client-side-phishing-detection", "--mute-audio",
             "--hide-scrollbars", "--window-size=1280,900", "--disable-dev-shm-usage",
             # Offline: every request except to loopback (which Chromium
             # bypasses proxies for implicitly; "<-loopback>" would send it to
             # the proxy too) goes to a closed port, and no name resolves
             # (the rules apply to IP literals as well, hence the EXCLUDE).
             "--proxy-server=127.0.0.1:9",
             "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]

    def __init__(self, binary, tmpdir):
        self.tmpdir = tmpdir
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()
        # Chromium wants the pipe on fds 3 (its input) and 4 (its output).
        # Move the child's ends above 9 first so that placing them on 3 and
        # 4 cannot clobber one with the other; bash then puts them there.
        to_chrome_r, from_chrome_w = [self._high(fd) for fd in (to_chrome_r, from_chrome_w)]
        args = [binary] + self.FLAGS + ["--user-data-dir=" + os.path.join(tmpdir, "profile"),
                                        "--remote-debugging-pipe", "about:blank"]
        script = 'exec "$@" 3<&%d 4>&%d %d<&- %d>&-' % (to_chrome_r, from_chrome_w,
                                                         to_chrome_r, from_chrome_w)
        env = dict(os.environ, HOME=tmpdir, XDG_CONFIG_HOME=tmpdir, XDG_CACHE_HOME=tmpdir)
        self.log_path = os.path.join(tmpdir, "chromium.log")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(["/bin/bash", "-c", script, "bash"] + args,
                                         pass_fds=(to_chrome_r, from_chrome_w),
                                         stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.msgid = 0
        self.inbox = queue.Queue()
        self.events = []          # every event seen, in order: (method, params)
        self.session = None
        threading.Thread(target=self._reader, daemon=True).start()

    @staticmethod
    def _high(fd):
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(fd)
        return high

    def _reader(self):
        buf = b""
        while True:
            try:
                data = os.read(self._r, 1 << 16)
            except OSError:
                data = b""
            if not data:
                self.inbox.put(None)
                return
            buf += data
            while b"\0" in buf:
                msg, buf = buf.split(b"\0", 1)
                self.inbox.put(json.loads(msg))

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-3000:]

    def call(self, method, params=None, timeout=20.0, session=True):
        self.msgid += 1
        msg = {"id": self.msgid, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            left = deadline - time.time()
            if left <= 0:
                raise TimeoutError("no reply to %s from chromium" % method)
            try:
                m = self.inbox.get(timeout=left)
            except queue.Empty:
                continue
            if m is None:
                raise ConnectionError("chromium closed the pipe:\n" + self.log())
            if m.get("id") == self.msgid:
                if "error" in m:
                    raise RuntimeError("%s: %s" % (method, m["error"]))
                return m["result"]
            if "method" in m:
                self.events.append((m["method"], m.get("params", {})))

    def open_page(self, width=1280, height=900):
        """Attach to the first page; enable the domains whose events we check."""
        targets = self.call("Target.getTargets", session=False)["targetInfos"]
        pages = [t for t in targets if t["type"] == "page"]
        tid = pages[0]["targetId"] if pages else \
            self.call("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": tid, "flatten": True},
                                 session=False)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(domain + ".enable")
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def navigate(self, url):
        r = self.call("Page.navigate", {"url": url})
        assert not r.get("errorText"), "navigation to %s failed: %s" % (url, r)

    def eval(self, expr):
        r = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True,
                                           "awaitPromise": True})
        if "exceptionDetails" in r:
            raise RuntimeError("page script failed: %s" % r["exceptionDetails"])
        return r["result"].get("value")

    def updates(self):
        return int(self.eval("Number(document.body && document.body.dataset.updated || 0)") or 0)

    def wait_until(self, expr, timeout=20.0, what=None):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                v = self.eval(expr)
            except RuntimeError:
                v = None
            if v:
                return v
            time.sleep(0.1)
        raise AssertionError("timed out waiting for %s; status=%r\n%s" % (
            what or expr, self.eval("document.getElementById('status') && "
                                    "document.getElementById('status').textContent"),
            self.log()))

    def wait_updates(self, n, timeout=20.0):
        return self.wait_until("Number(document.body.dataset.updated || 0) >= %d" % n,
                               timeout, "%d dashboard refreshes" % n)

    def values(self):
        """{id: {text, value, title, cls}} for every element with an id."""
        return self.eval("""(() => { const o = {};
            for (const e of document.querySelectorAll('[id]'))
              o[e.id] = {text: e.textContent, value: e.dataset.value === undefined ? null
                         : e.dataset.value, title: e.title, cls: e.className};
            return o; })()""")

    def screenshot(self, path):
        height = self.eval("document.documentElement.scrollHeight")
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": 1280, "height": max(600, min(int(height), 4000)),
                   "deviceScaleFactor": 1, "mobile": False})
        time.sleep(0.3)  # let the charts redraw at the new size
        png = base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"})["data"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(png)
        return png

    def problems(self, http_errors_expected=False):
        """Script exceptions, console errors, dialogs and failed requests
        (unless the test made the server fail on purpose)."""
        bad = []
        for method, p in self.events:
            if method == "Runtime.exceptionThrown":
                bad.append("exception: %s" % p["exceptionDetails"])
            elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                bad.append("console.%s: %s" % (p["type"], p.get("args")))
            elif method == "Page.javascriptDialogOpening":
                bad.append("dialog: %s" % p.get("message"))
            elif method == "Log.entryAdded" and p["entry"]["level"] == "error" \
                    and "favicon.ico" not in p["entry"].get("url", "") \
                    and not (http_errors_expected and p["entry"].get("source") == "network"):
                bad.append("log: %s" % p["entry"].get("text"))
        return bad

    def close(self):
        if self.proc.poll() is None:
            try:
                self.call("Browser.close", session=False, timeout=5)
            except Exception:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for fd in (self._w, self._r):
            try:
                os.close(fd)
            except OSError:
                pass


@pytest.fixture
def browser(tmp_path):
    binary = chromium_binary()
    if binary is None:
        pytest.skip("chromium is not installed (Debian package 'chromium'; "
                    "scripts/deps.sh test installs it): dashboard not checked")
    b = Browser(binary, tempfile.mkdtemp(dir=str(tmp_path)))
    try:
        try:
            b.call("Browser.getVersion", session=False, timeout=30)
        except (TimeoutError, ConnectionError) as e:
            pytest.skip("chromium at %s cannot run here (%s): dashboard not checked"
                        % (binary, str(e).splitlines()[0]))
        b.open_page()
        yield b
    finally:
        b.close()


# ---- a stand-in metrics port: the same page, a scripted /metrics ----------

class StandIn:
    """http.server on 127.0.0.1:0 serving dashboard.html at / and whatever
    self.metrics() returns at /metrics (self.status != 200 to fail it)."""

    def __init__(self, metrics):
        self.metrics = metrics
        self.status = 200
        self.scrapes = 0
        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                path = self.path.split("?")[0]
                if path == "/metrics":
                    if me.status != 200:
                        self.send_error(me.status)
                        return
                    me.scrapes += 1
                    body = me.metrics().encode()
                    ctype = "text/plain; version=0.0.4; charset=utf-8"
                elif path == "/":
                    with open(DASHBOARD, "rb") as f:
                        body = f.read()
                    ctype = "text/html; charset=utf-8"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d/" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def standin():
    servers = []

    def start(metrics):
        s = StandIn(metrics)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()


def shown(browser, id_):
    """Whether the element is rendered (not hidden itself or by an ancestor)."""
    return browser.eval("document.getElementById(%s).getClientRects().length > 0"
                        % json.dumps(id_))


def shown_na(browser):
    """Ids of the rendered elements that say "n/a"."""
    return browser.eval("""Array.from(document.querySelectorAll('.na'))
        .filter(e => e.getClientRects().length > 0).map(e => e.id)""")


def page_metric_names():
    """Every metric name the page spells out whole (names it builds from
    parts, the pool's and the disk's, are covered by shown_na)."""
    with open(DASHBOARD) as f:
        return set(re.findall(r"'(peercache_[a-z0-9_]+[a-z0-9])'", f.read()))


def not_exported(names, metrics):
    """The names a page reads that the node's /metrics (metrics_of) lacks.
    A latency "x_seconds" is read from its histogram buckets, as the page's
    buckets() does: "x_hist_seconds_bucket", else "x_seconds_bucket"."""
    have = {k.split("{")[0] for k in metrics}
    return {n for n in names
            if n not in have and n + "_bucket" not in have
            and re.sub(r"_seconds$", "_hist_seconds_bucket", n) not in have}


# The names a node without them does not export, by what reads them.
DISK_NAMES = {"peercache_disk_capacity_bytes", "peercache_disk_degraded",
              "peercache_disk_evicted_keys_total", "peercache_disk_ios_in_flight",
              "peercache_disk_promote_bytes_total", "peercache_disk_promote_latency_seconds",
              "peercache_disk_promotions_total", "peercache_disk_queue_bytes",
              "peercache_disk_write_bytes_total", "peercache_read_disk_hits_total"}
DISCOVERY_NAMES = {"peercache_discovery_members"}


def esc(v):
    """A label value in the exposition format."""
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# ---- the real node ------------------------------------------------------------

def test_dashboard_shows_live_node_values(node_factory, browser):
    n = node_factory()
    metrics = n.endpoint("metrics")
    c = RpcClient(n.endpoint("rpc"))
    err, info = c.call("node.info")
    assert err is None
    for _ in range(500):
        err, _res = c.call("node.health")
        assert err is None

    browser.navigate("http://%s/" % metrics)
    browser.wait_updates(1)
    v = browser.values()
    assert v["node-id"]["text"] == info["node_id"]
    assert float(v["uptime"]["value"]) > 0
    assert v["transport"]["text"] == "tcp"
    assert v["mode"]["text"] == "p2p"
    assert float(v["rpc-total"]["value"]) >= 501, v["rpc-total"]
    assert shown(browser, "pool-card") and not shown(browser, "slot-card")
    assert v["status"]["text"] == "connected"
    assert info["node_id"] in [r["text"] for r in browser.eval(
        "Array.from(document.querySelectorAll('#members tbody td')).map(td => ({text: td.textContent}))")]

    # Keep calling while the page takes two more scrapes: the rate it
    # computes from them must see the calls.
    stop = threading.Event()

    def caller():
        while not stop.is_set():
            c.call("node.health")
            time.sleep(0.002)
    t = threading.Thread(target=caller, daemon=True)
    t.start()
    try:
        browser.wait_updates(browser.updates() + 2, timeout=15)
    finally:
        stop.set()
        t.join()
    v = browser.values()
    assert float(v["rpc-rps"]["value"]) > 0, v["rpc-rps"]
    assert int(browser.eval("Number(document.getElementById('chart-rpc').dataset.points)")) >= 3
    # What a p2p node without disk tier and discovery lacks: those names
    # and the slot region's; "n/a" only for the disk tier and promotions.
    missing = not_exported(page_metric_names(), metrics_of(n))
    unexpected = {x for x in missing - DISK_NAMES - DISCOVERY_NAMES
                  if not x.startswith("peercache_slotmap_")}
    assert not unexpected, "the page reads names the node lacks: %s" % sorted(unexpected)
    na_ids = shown_na(browser)
    assert [i for i in na_ids if not i.startswith("promote") and not browser.eval(
        "!!document.getElementById(%s).closest('#disk-card')" % json.dumps(i))] == []
    browser.screenshot(os.path.join(ARTIFACTS, "dashboard.png"))
    assert browser.problems() == []
    c.close()
    assert n.stop() == 0


def test_dashboard_shows_a_slotmap_node(cluster, browser):
    from test_metrics_slotmap import set_on_a_get_on_b
    a, b, ca, cb, keys = set_on_a_get_on_b(cluster, "dash-sm")

    # Gets go on while the page takes two scrapes: the rates see them.
    browser.navigate("http://%s/?interval=300" % b.endpoint("metrics"))
    browser.wait_updates(1)
    stop = threading.Event()

    def getter():
        while not stop.is_set():
            cb.call("kv.get", [keys[:8]])
            time.sleep(0.002)
    t = threading.Thread(target=getter, daemon=True)
    t.start()
    try:
        browser.wait_updates(browser.updates() + 2, timeout=15)
        during = browser.values()
    finally:
        stop.set()
        t.join()
    assert float(during["slot-reads-local-rate"]["value"]) + \
        float(during["slot-reads-remote-rate"]["value"]) > 0, during["slot-reads-local-rate"]
    browser.wait_updates(browser.updates() + 2)    # a whole scrape after the last get
    m = metrics_of(b)
    v = browser.values()
    assert v["mode"]["text"] == "slotmap" and v["transport"]["text"] == "tcp"
    # The slot region replaces the pool; no disk tier, no pool evictions.
    assert shown(browser, "slot-card")
    for id_ in ("pool-card", "disk-card", "evictions-card", "read-disk-row"):
        assert not shown(browser, id_), id_
    # The page reads only what the node exports, but for the hidden cards'
    # names, and shows no "n/a".
    unexpected = not_exported(page_metric_names(), m) - DISK_NAMES - DISCOVERY_NAMES - {
        "peercache_pool_capacity_bytes", "peercache_evictions_total"}
    assert not unexpected, "the page reads names the node lacks: %s" % sorted(unexpected)
    assert shown_na(browser) == []
    # The figures are the node's.
    assert float(v["slot-region-bytes"]["value"]) == m["peercache_slotmap_region_bytes"]
    assert float(v["slot-slots"]["value"]) == m["peercache_slotmap_slots"]
    src = {s: m['peercache_slotmap_reads_total{source="%s"}' % s]
           for s in ("local_slot", "remote_slot", "miss", "rejected")}
    reads = sum(src.values())
    assert reads == m["peercache_read_requests_total"]
    for id_, s in (("local", "local_slot"), ("remote", "remote_slot"), ("miss", "miss"),
                   ("rejected", "rejected")):
        assert float(v["slot-reads-%s-ratio" % id_]["value"]) == pytest.approx(src[s] / reads), id_
        assert v["slot-reads-%s-rate" % id_]["value"] is not None, id_
    assert src["local_slot"] > 0 and src["remote_slot"] > 0 and src["miss"] == 1
    assert float(v["slot-wfail-busy"]["value"]) == \
        m['peercache_slotmap_write_failures_total{reason="busy"}']
    assert float(v["slot-evictions"]["value"]) == m["peercache_slotmap_evictions_total"]
    assert float(v["slot-claims-expired"]["value"]) == 0
    # The tiers card: local and remote are the slot sources, the rest missed.
    assert float(v["read-local-hit-ratio"]["value"]) == pytest.approx(src["local_slot"] / reads)
    assert float(v["read-remote-hit-ratio"]["value"]) == pytest.approx(src["remote_slot"] / reads)
    assert float(v["read-miss-ratio"]["value"]) == pytest.approx(
        (src["miss"] + src["rejected"]) / reads)
    assert v["read-p50"]["value"] is not None       # b wrote nothing: no write-p50
    browser.screenshot(os.path.join(ARTIFACTS, "dashboard-slotmap.png"))
    assert browser.problems() == []
    ca.close()
    cb.close()
    for n in (a, b):
        assert n.stop() == 0


# ---- the page itself, against a stand-in --------------------------------------

XSS_IMG = "<img src=x onerror=alert(1)>"
XSS_SCRIPT = '"</script><script>alert(2)</script>'
XSS_TAG = "<marquee>tcp</marquee>"
WEIRD = 'a\\b"c\nd'  # a backslash, a quote and a newline


def hostile_metrics():
    node = 'node="%s"' % esc(XSS_IMG)
    return "\n".join([
        "# HELP peercache_uptime_seconds Seconds since start.",
        "# TYPE peercache_uptime_seconds gauge",
        "peercache_uptime_seconds{%s} 12.5" % node,
        'peercache_transport_info{%s,transport="%s"} 1' % (node, esc(XSS_TAG)),
        'peercache_mode_info{%s,mode="%s"} 1' % (node, esc(XSS_SCRIPT)),
        "# TYPE peercache_rpc_requests_total counter",
        'peercache_rpc_requests_total{%s,method="%s"} 7' % (node, esc(XSS_SCRIPT)),
        'peercache_rpc_requests_total{%s,method="%s"} 5' % (node, esc(WEIRD)),
        'peercache_member_info{%s,member="%s",addr="%s",state="%s"} 1'
        % (node, esc(XSS_IMG), esc(XSS_SCRIPT), esc(XSS_SCRIPT)),
        'peercache_member_info{%s,member="%s",addr="%s",state="alive"} 1'
        % (node, esc(WEIRD), esc(XSS_TAG)),
    ]) + "\n"


def test_dashboard_does_not_inject_label_markup(browser, standin):
    s = standin(hostile_metrics)
    browser.navigate(s.url + "?interval=300")
    browser.wait_updates(2)
    v = browser.values()
    assert v["node-id"]["text"] == XSS_IMG
    assert v["transport"]["text"] == XSS_TAG
    assert v["mode"]["text"] == XSS_SCRIPT
    # Nothing from the labels became an element, nothing ran.
    counts = browser.eval("""({img: document.querySelectorAll('img').length,
        script: document.querySelectorAll('script').length,
        marquee: document.querySelectorAll('marquee').length,
        handlers: document.querySelectorAll('[onerror]').length})""")
    assert counts == {"img": 0, "script": 1, "marquee": 0, "handlers": 0}
    cells = browser.eval("Array.from(document.querySelectorAll('#members td, #rpc-methods td'))"
                         ".map(td => td.textContent)")
    for text in (XSS_IMG, XSS_SCRIPT, XSS_TAG, WEIRD):
        assert text in cells, (text, cells)
    dom = browser.eval("document.documentElement.outerHTML")
    assert "&lt;img src=x onerror=alert(1)&gt;" in dom
    assert "&lt;/script&gt;&lt;script&gt;alert(2)&lt;/script&gt;" in dom
    assert XSS_IMG not in dom
    assert browser.eval("document.title") == "PeerCache — " + XSS_IMG
    browser.screenshot(os.path.join(ARTIFACTS, "dashboard-hostile.png"))
    assert browser.problems() == []


def test_parser_and_quantiles(browser, standin):
    s = standin(lambda: "")
    browser.navigate(s.url + "?interval=300")
    browser.wait_updates(1)
    text = "\n".join([
        "# HELP x_total A help line with \\\\ and \\n escapes.",
        "# TYPE x_total counter",
        "# some other comment",
        'x_total{a="q\\"uo\\\\te",b="line\\nbreak",} 1.5e+3 1712345678000',
        "x_total 42",
        "  spaced_metric   7  ",
        'inf_metric{le="+Inf"} +Inf',
        "neg_inf -Inf",
        "nan_metric NaN",
        "garbage line here",
        'broken{a="unterminated} 1',
        "no_value",
        "bad_value abc",
        "h_bucket{le=\"0.001\"} 50\r",
        'h_bucket{le="0.01"} 90',
        'h_bucket{le="+Inf"} 100',
        "h_sum 0.5",
        "h_count 100",
    ])
    got = browser.eval("""(() => {
        const p = window.peercacheDashboard.parse(%s);
        return {samples: p.samples.map(s => [s.name, Object.assign({}, s.labels), String(s.value)]),
                types: Object.assign({}, p.types)}; })()""" % json.dumps(text))
    assert got["samples"] == [
        ["x_total", {"a": 'q"uo\\te', "b": "line\nbreak"}, "1500"],
        ["x_total", {}, "42"],
        ["spaced_metric", {}, "7"],
        ["inf_metric", {"le": "+Inf"}, "Infinity"],
        ["neg_inf", {}, "-Infinity"],
        ["nan_metric", {}, "NaN"],
        ["h_bucket", {"le": "0.001"}, "50"],
        ["h_bucket", {"le": "0.01"}, "90"],
        ["h_bucket", {"le": "+Inf"}, "100"],
        ["h_sum", {}, "0.5"],
        ["h_count", {}, "100"],
    ]
    assert got["types"] == {"x_total": "counter"}
    q = browser.eval("""(() => {
        const d = window.peercacheDashboard;
        const b = d.buckets(d.indexByName(d.parse(%s).samples), 'h', {});
        return [0.25, 0.5, 0.9, 0.95, 0.99].map(x => d.quantile(x, b)); })()""" % json.dumps(text))
    assert q == pytest.approx([0.0005, 0.001, 0.01, 0.01, 0.01])


def test_absent_metrics_disconnect_and_counter_reset(browser, standin):
    state = {"rpc": 1000}

    def metrics():
        state["rpc"] += 100
        return "\n".join([
            'peercache_uptime_seconds{node="n1"} 3',
            'peercache_rpc_requests_total{node="n1",method="node.health"} %d' % state["rpc"],
            'peercache_pool_bytes_used{node="n1"} 1048576',
            'peercache_pool_capacity_bytes{node="n1"} 4194304',
            'peercache_read_requests_total{node="n1"} 0',
            'peercache_read_hits_total{node="n1"} 0',
            "# TYPE peercache_op_latency_seconds histogram",
            'peercache_op_latency_seconds_bucket{node="n1",op="read",le="0.0001"} 10',
            'peercache_op_latency_seconds_bucket{node="n1",op="read",le="0.001"} 20',
            'peercache_op_latency_seconds_bucket{node="n1",op="read",le="+Inf"} 20',
        ]) + "\n"
    s = standin(metrics)
    browser.navigate(s.url + "?interval=300")
    browser.wait_updates(3)
    v = browser.values()
    # Absent: n/a with a tooltip, never a number.
    for id_ in ("disk-used", "disk-keys", "transport", "reactor-sq-full", "write-p50",
                "evictions-total", "rpc-connections", "read-local-hit-ratio"):
        assert v[id_]["text"] == "n/a" and v[id_]["value"] is None, (id_, v[id_])
        assert v[id_]["title"] == "not in this version", (id_, v[id_])
    # Present.
    assert v["node-id"]["text"] == "n1"
    assert float(v["pool-fill"]["value"]) == pytest.approx(0.25)
    assert v["read-hit-ratio"]["value"] is None and v["read-hit-ratio"]["text"] == "—"
    assert float(v["read-p50"]["value"]) == pytest.approx(0.0001)
    assert float(v["read-p99"]["value"]) == pytest.approx(0.0001 + 0.0009 * 9.8 / 10)
    assert v["read-p50"]["text"] == "100 µs"
    assert float(v["rpc-rps"]["value"]) > 0
    members = browser.eval("Array.from(document.querySelectorAll('#members tbody tr'))"
                           ".map(tr => Array.from(tr.cells).map(td => td.textContent))")
    assert members == [["n1", "—", "self"]]

    # Disconnected, then back.
    s.status = 503
    browser.wait_until("document.getElementById('status').textContent"
                       ".startsWith('disconnected: HTTP 503')", what="the disconnected banner")
    assert "err" in browser.values()["status"]["cls"]
    s.status = 200
    browser.wait_until("document.getElementById('status').textContent === 'connected'",
                       what="recovery")

    # The node restarted: its counter went down. No negative rate.
    before = browser.updates()
    state["rpc"] = 0
    browser.wait_updates(before + 2)
    assert float(browser.values()["rpc-rps"]["value"]) >= 0
    assert browser.problems(http_errors_expected=True) == []


def test_hit_ratio_by_tier_and_disk_degraded(browser, standin):
    state = {"degraded": None}

    def metrics():
        lines = [
            'peercache_uptime_seconds{node="n1"} 3',
            'peercache_read_requests_total{node="n1"} 200',
            'peercache_read_hits_total{node="n1"} 140',
            'peercache_read_local_hits_total{node="n1"} 100',
            'peercache_read_remote_hits_total{node="n1"} 40',
            'peercache_read_disk_hits_total{node="n1"} 20',
            'peercache_read_misses_total{node="n1"} 60',
            'peercache_disk_bytes_used{node="n1"} 1048576',
            'peercache_disk_capacity_bytes{node="n1"} 2097152',
            'peercache_disk_queue_bytes{node="n1"} 0',
        ]
        if state["degraded"] is not None:
            lines.append('peercache_disk_degraded{node="n1"} %d' % state["degraded"])
        return "\n".join(lines) + "\n"
    s = standin(metrics)
    browser.navigate(s.url + "?interval=300")
    browser.wait_updates(2)
    v = browser.values()
    for id_, want in (("read-local-hit-ratio", 0.5), ("read-remote-hit-ratio", 0.2),
                      ("read-disk-hit-ratio", 0.1), ("read-miss-ratio", 0.2),
                      ("read-hit-ratio", 0.7), ("disk-fill", 0.5)):
        assert float(v[id_]["value"]) == pytest.approx(want), (id_, v[id_])
    assert v["read-miss-ratio"]["text"] == "20.0%"
    widths = browser.eval("['local', 'remote', 'disk'].map(b => "
                          "document.getElementById('tier-bar-' + b).style.width)")
    assert widths == ["50%", "20%", "10%"]
    # No degraded gauge in this version: its row is not shown.
    hidden = "document.getElementById('disk-degraded-row').hidden"
    assert browser.eval(hidden) is True
    assert not shown(browser, "disk-degraded-row")      # [hidden] beats .row's display
    # No mode metric: a p2p node of an older version; the p2p cards.
    assert v["mode"]["text"] == "n/a"
    assert not shown(browser, "slot-card")
    assert shown(browser, "pool-card") and shown(browser, "read-disk-row")
    assert v["disk-ios"]["text"] == "n/a"
    # The gauge appears: the row shows it, in the warning colour when set.
    state["degraded"] = 1
    browser.wait_until("!" + hidden, what="the degraded row")
    browser.wait_until("document.getElementById('disk-degraded').textContent === 'yes'")
    assert "warn" in browser.values()["disk-degraded"]["cls"]
    state["degraded"] = 0
    browser.wait_until("document.getElementById('disk-degraded').textContent === 'no'")
    browser.screenshot(os.path.join(ARTIFACTS, "dashboard-tiers.png"))
    assert browser.problems() == []


def test_slot_region_card(browser, standin):
    state = {"n": 0}

    def metrics():
        k = state["n"]
        state["n"] += 1
        return "\n".join([
            'peercache_uptime_seconds{node="s1"} 3',
            'peercache_transport_info{node="s1",transport="tcp"} 1',
            'peercache_mode_info{node="s1",mode="slotmap"} 1',
            'peercache_slotmap_region_bytes{node="s1"} 268435456',
            'peercache_slotmap_slots{node="s1"} 1996',
            'peercache_slotmap_reads_total{node="s1",source="local_slot"} %d' % (500 + 10 * k),
            'peercache_slotmap_reads_total{node="s1",source="remote_slot"} %d' % (250 + 5 * k),
            'peercache_slotmap_reads_total{node="s1",source="miss"} %d' % (200 + 4 * k),
            'peercache_slotmap_reads_total{node="s1",source="rejected"} %d' % (50 + k),
            'peercache_read_requests_total{node="s1"} %d' % (1000 + 20 * k),
            'peercache_read_hits_total{node="s1"} %d' % (750 + 15 * k),
            'peercache_read_local_hits_total{node="s1"} %d' % (500 + 10 * k),
            'peercache_read_remote_hits_total{node="s1"} %d' % (250 + 5 * k),
            'peercache_slotmap_writes_total{node="s1",path="local"} %d' % (70 + k),
            'peercache_slotmap_writes_total{node="s1",path="remote"} 30',
            'peercache_slotmap_write_failures_total{node="s1",reason="busy"} 3',
            'peercache_slotmap_write_failures_total{node="s1",reason="too_large"} 0',
            'peercache_slotmap_write_failures_total{node="s1",reason="remote"} 0',
            'peercache_slotmap_claims_expired_total{node="s1"} 1',
            'peercache_slotmap_evictions_total{node="s1"} 9',
        ]) + "\n"
    s = standin(metrics)
    browser.navigate(s.url + "?interval=300")
    browser.wait_updates(3)
    v = browser.values()
    assert v["mode"]["text"] == "slotmap"
    assert shown(browser, "slot-card")
    for id_ in ("pool-card", "disk-card", "evictions-card", "read-disk-row"):
        assert not shown(browser, id_), id_
    assert float(v["slot-region-bytes"]["value"]) == 268435456
    assert v["slot-region-bytes"]["text"] == "256 MiB"
    assert float(v["slot-slots"]["value"]) == 1996
    # Shares of the four sources (they partition the reads), lifetime: every
    # scrape keeps them at 50, 25, 20 and 5 %.
    shares = {"local": 0.5, "remote": 0.25, "miss": 0.2, "rejected": 0.05}
    for id_, want in shares.items():
        assert float(v["slot-reads-%s-ratio" % id_]["value"]) == pytest.approx(want), id_
        # Every scrape adds 10, 5, 4, 1: the rates keep those proportions.
        assert float(v["slot-reads-%s-rate" % id_]["value"]) > 0, id_
    rl = float(v["slot-reads-local-rate"]["value"])
    assert float(v["slot-reads-remote-rate"]["value"]) == pytest.approx(rl / 2)
    assert float(v["slot-reads-rejected-rate"]["value"]) == pytest.approx(rl / 10)
    assert "warn" in v["slot-reads-rejected-ratio"]["cls"]
    assert "warn" not in v["slot-reads-local-ratio"]["cls"]
    widths = browser.eval("['local', 'remote', 'miss', 'rejected'].map(b => "
                          "parseFloat(document.getElementById('slot-bar-' + b).style.width))")
    assert widths == pytest.approx([50, 25, 20, 5])
    assert float(v["slot-writes-local-rate"]["value"]) == pytest.approx(rl / 10)
    assert float(v["slot-writes-remote-rate"]["value"]) == 0
    assert float(v["slot-wfail-busy"]["value"]) == 3 and "warn" in v["slot-wfail-busy"]["cls"]
    assert float(v["slot-wfail-too-large"]["value"]) == 0
    assert float(v["slot-claims-expired"]["value"]) == 1
    assert "warn" in v["slot-claims-expired"]["cls"]
    assert float(v["slot-evictions"]["value"]) == 9
    assert float(v["slot-evictions-rate"]["value"]) == 0
    # The tiers card: local and remote from the read counters, the rest missed.
    assert float(v["read-miss-ratio"]["value"]) == pytest.approx(0.25)
    browser.screenshot(os.path.join(ARTIFACTS, "dashboard-slot-card.png"))
    assert browser.problems() == []


def test_dashboard_shows_disk_hits_of_a_live_node(node_factory, browser, tmp_path):
    from test_disk_tier import disk_node, get_back, page, set_through
    n = disk_node(node_factory, tmp_path / "store")
    c = RpcClient(n.endpoint("rpc"))
    keys = ["dash/%d" % i for i in range(48)]
    set_through(n, c, keys)
    assert get_back(c, keys[0]) == page(keys[0])   # from disk, then local
    browser.navigate("http://%s/?interval=300" % n.endpoint("metrics"))
    browser.wait_updates(2)
    v = browser.values()
    m = metrics_of(n)
    reqs = m["peercache_read_requests_total"]
    assert float(v["read-disk-hit-ratio"]["value"]) == \
        pytest.approx(m["peercache_read_disk_hits_total"] / reqs) != 0
    assert float(v["read-local-hit-ratio"]["value"]) == \
        pytest.approx(m["peercache_read_local_hits_total"] / reqs) != 0
    assert float(v["disk-used"]["value"]) == m["peercache_disk_bytes_used"]
    assert float(v["promotes-total"]["value"]) >= 1
    assert v["promote-p99"]["value"] is not None
    # Latencies come from the node's "_hist_seconds" histograms.
    assert v["write-p50"]["value"] is not None, v["write-p50"]
    assert v["disk-ios"]["value"] is not None
    assert browser.problems() == []
    c.close()
    assert n.stop() == 0
