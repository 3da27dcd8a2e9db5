"""New TCP connections are spread over the reactors (issue 11, item 9).

The kernel picks one of the reactors' SO_REUSEPORT listeners by a hash of
the connection's addresses, so a peer's few connections used to share one
reactor while another idled (8 connections split 4:4 over 2 reactors only
about a quarter of the time). Now the accepting reactor hands each one to
the reactor serving the fewest: RPC clients over TCP
(peercache_rpc_tcp_connections{reactor}) and data-port connections
(peercache_transport_reactor_connections{reactor}) end up 4 and 4, and
still work. No timing bound: deadlines are generous.
"""
import socket
import time

from conftest import RpcClient, metrics_of

N = 8


def per_reactor(node, name):
    m = metrics_of(node)
    return [m.get('%s{reactor="%d"}' % (name, r), 0) for r in (0, 1)]


def wait_total(node, name, want, timeout=20.0):
    deadline = time.time() + timeout
    while True:
        got = per_reactor(node, name)
        if sum(got) == want or time.time() > deadline:
            return got
        time.sleep(0.05)


def test_tcp_and_data_connections_spread_over_reactors(node_factory):
    node = node_factory("--threads", "2", "--pool-size", "64mb")
    rpc = node.endpoint("rpc")
    host, port = node.endpoint("data").rsplit(":", 1)
    clients, data = [], []
    try:
        for _ in range(N):
            c = RpcClient(rpc)
            clients.append(c)
            err, res = c.call("node.health")  # served: counted on its reactor
            assert err is None, err
        got = wait_total(node, "peercache_rpc_tcp_connections", N)
        assert got == [N / 2, N / 2], got
        for _ in range(N):
            data.append(socket.create_connection((host, int(port)), timeout=5))
        got = wait_total(node, "peercache_transport_reactor_connections", N)
        assert got == [N / 2, N / 2], got
        for c in clients:  # every client still answered where it went
            assert c.call("node.health")[0] is None
    finally:
        for c in clients:
            c.close()
        for s in data:
            s.close()
    assert sum(wait_total(node, "peercache_rpc_tcp_connections", 0)) == 0
    assert sum(wait_total(node, "peercache_transport_reactor_connections", 0)) == 0
    assert node.stop() == 0
