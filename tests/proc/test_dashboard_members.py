"""Issue 13 (item 8): the discovery members on the metrics port and on the
dashboard.

GET /discovery/view.json on the metrics port is the view discovery.view
gives on the RPC port (epoch, master, members with role, state and the age
of their last heartbeat), as JSON; 404 on a node without discovery. The
dashboard shows it as a members table (only when /metrics shows discovery
on: a node without it shows no such table and makes no such request), and
follows a kill -9. The browser part needs Debian's chromium (skipped
without it, like test_dashboard.py).
"""
import json
import socket

import test_dashboard
from conftest import free_ports, recv_all
from test_discovery import SLACK, wait_until
from test_discovery import view as rpc_view

browser = test_dashboard.browser  # the fixture: headless chromium

SECRET = "dashboard-members-secret"


def http_get(node, path):
    host, port = node.endpoint("metrics").rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(b"GET %s HTTP/1.1\r\nConnection: close\r\n\r\n" % path.encode())
    head, _, body = recv_all(s).partition(b"\r\n\r\n")
    return int(head.split()[1]), head.decode(), body


def three_nodes(node_factory):
    ports = free_ports(6)
    rpc, meta = ports[:3], ports[3:]
    nodes = [node_factory("--rpc-port", str(rpc[i]), "--meta-port",
                          str(meta[i]), "--discovery-addr",
                          "127.0.0.1:%d" % meta[0], "--cluster-secret",
                          SECRET, "--pool-size", "16mb", "--threads", "1")
             for i in range(3)]
    for n in nodes:
        n.wait_for("ready", 30)
    ids = sorted("127.0.0.1:%d" % p for p in rpc)
    wait_until(lambda: all(sorted(m["id"] for m in rpc_view(n)["members"])
                           == ids for n in nodes), 15, "three members")
    return nodes, ids


def test_view_json(node_factory):
    nodes, ids = three_nodes(node_factory)
    status, head, body = http_get(nodes[2], "/discovery/view.json")
    assert status == 200, head
    assert "Content-Type: application/json" in head, head
    v = json.loads(body)
    r = rpc_view(nodes[2])
    assert (v["epoch"], v["from"], v["self"]) == (r["epoch"], r["from"],
                                                  r["self"]), (v, r)
    assert sorted(m["id"] for m in v["members"]) == ids
    assert {m["id"]: m["role"] for m in v["members"]} == \
        {m["id"]: m["role"] for m in r["members"]}
    assert {m["state"] for m in v["members"]} == {"alive"}, v
    assert all(isinstance(m["age_ms"], int) for m in v["members"]), v
    # the route is read-only: other methods are refused
    host, port = nodes[2].endpoint("metrics").rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(b"POST /discovery/view.json HTTP/1.1\r\nContent-Length: 0\r\n"
              b"Connection: close\r\n\r\n")
    assert recv_all(s).split()[1] == b"405"
    # a node without discovery has no view
    plain = node_factory("--threads", "1", "--pool-size", "16mb")
    status, head, body = http_get(plain, "/discovery/view.json")
    assert status == 404 and b"discovery is off" in body, (head, body)
    # clean exits (the sanitized build checks for leaks there)
    assert plain.stop() == 0 and nodes[2].stop() == 0


ROWS = """(() => Array.from(document.querySelectorAll('#disc-members tbody tr'))
    .map(tr => ({id: tr.dataset.id, me: tr.className === 'me',
                 cells: Array.from(tr.cells).map(td => td.textContent),
                 cls: tr.cells[2].className})))()"""


def test_dashboard_members_table(node_factory, browser):
    nodes, ids = three_nodes(node_factory)
    browser.navigate("http://%s/?interval=300" % nodes[1].endpoint("metrics"))
    browser.wait_until("Number(document.getElementById('discovery-card')"
                       ".dataset.updated) >= 1", 20 * SLACK,
                       "the members table")
    v = browser.values()
    rows = browser.eval(ROWS)
    assert sorted(r["id"] for r in rows) == ids, rows
    view = rpc_view(nodes[1])
    roles = {m["id"]: m["role"] for m in view["members"]}
    for r in rows:
        assert r["cells"][0] == r["id"] and r["cells"][1] == roles[r["id"]]
        assert r["cells"][2] == "alive" and r["cls"] == "alive", r
        assert r["cells"][3].endswith(" ago"), r
    assert [r["id"] for r in rows if r["me"]] == [view["self"]], rows
    assert v["disc-count"]["value"] == "3"
    assert v["disc-epoch"]["value"] == str(view["epoch"]), v["disc-epoch"]
    assert not browser.eval("document.getElementById('discovery-card').hidden")
    # kill -9 a master (not the head, not this node): the table follows
    gone = [m["id"] for m in view["members"]
            if m["role"] == "master" and m["id"] != view["self"]][:1]
    victim = [n for n in nodes if n.endpoint("rpc") in gone][0]
    victim.proc.kill()
    victim.proc.wait()
    rest = sorted(i for i in ids if i not in gone)
    browser.wait_until(
        "JSON.stringify(Array.from(document.querySelectorAll("
        "'#disc-members tbody tr')).map(tr => tr.dataset.id).sort()) === %s"
        % json.dumps(json.dumps(rest, separators=(",", ":"))), 20 * SLACK,
        "the killed member to leave the table")
    assert browser.problems() == []
    # a node without discovery: no table, no request for the view
    plain = node_factory("--threads", "1", "--pool-size", "16mb")
    browser.navigate("http://%s/?interval=300" % plain.endpoint("metrics"))
    browser.wait_updates(2)
    assert browser.eval("document.getElementById('discovery-card').hidden")
    assert browser.problems() == []
