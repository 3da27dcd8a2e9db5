"""A client's data-port connection is served on the reactor of its RPC
connection (modules/spread.h, "Pairing"), shown by
peercache_transport_paired_connections_total on a real node: a data
connection opened after an RPC connection of the same host is paired, one
with no open RPC connection left to pair with is not, and an RPC
connection the client already closed is never paired with."""
import socket
import struct

from conftest import RpcClient, metrics_of

PAIRED = "peercache_transport_paired_connections_total"


def data_conn(node):
    """A data-port connection the node has placed: a READ of a region that
    does not exist is answered (with an error), so it is served somewhere."""
    host, port = node.endpoint("data").rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(struct.pack("<IHHIIQQ", 0x31444350, 1, 0, 0xDEADBEEF, 64, 0, 7))
    resp = b""
    while len(resp) < 24:
        chunk = s.recv(24 - len(resp))
        assert chunk, "the data port closed the connection"
        resp += chunk
    magic, status, rid, length = struct.unpack("<IiQQ", resp)
    assert magic == 0x31524350 and rid == 7 and status < 0 and length == 0, resp
    return s


def test_data_connections_pair_with_open_rpc_connections(node_factory):
    node = node_factory("--threads", "2")
    node.wait_for("listening: metrics")
    assert metrics_of(node).get(PAIRED) == 0

    # The first connection of a reader, made and closed (p2p_bench's seed):
    # nothing may pair with it.
    seed = RpcClient(node.endpoint("rpc"))
    assert seed.call("node.health")[0] is None
    seed.close()
    lone = data_conn(node)
    assert metrics_of(node).get(PAIRED) == 0, "paired with a closed client"

    # Two readers, each an RPC connection, then its data connection.
    open_ = []
    for k in range(2):
        c = RpcClient(node.endpoint("rpc"))
        assert c.call("node.health")[0] is None
        open_.append(c)
        open_.append(data_conn(node))
        assert metrics_of(node).get(PAIRED) == k + 1
    # Every RPC connection has its pair: one more data connection has none.
    extra = data_conn(node)
    assert metrics_of(node).get(PAIRED) == 2
    for c in open_ + [lone, extra]:
        c.close()
