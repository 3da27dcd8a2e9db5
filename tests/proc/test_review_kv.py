"""Review of issue 11's merged kv/session seams.

- A session.set whose step holds many pages (session_slice_bytes larger
  than the batch) and whose region is given up while the first page is
  still being copied in slices: the cancelled copy must end the step's
  copying. Before the fix, the pages after the cancelled one were copied
  from the anonymous memory that replaced the region (zeros) and published
  under the client's keys: wrong bytes a later get returned as hits.
"""
from test_hardening_session import Client

MIB = 1 << 20


def test_region_given_up_mid_step_stores_no_zero_pages(node_factory):
    node = node_factory("--threads", "1", "--pool-size", "256mb",
                        "--session-slice-bytes", "256mb",
                        "--copy-slice-bytes", "16kb")
    c = Client(node.endpoint("socket"), size=32 * MIB, timeout=120)
    keys = ["step-gone-%d" % i for i in range(32)]
    try:
        assert c.register() == {"sealed": False}
        for i in range(32):
            c.mem[i * MIB:(i + 1) * MIB] = bytes([i + 1]) * MIB
        sid = c.send("session.set", [c.rid, [[k, i * MIB, MIB]
                                             for i, k in enumerate(keys)]])
        uid = c.send("session.unregister", [c.rid])
        got = {}
        for _ in range(2):
            msg = c.recv()
            got[msg[1]] = msg
        assert got[uid][2] is None and got[uid][3] is True, got[uid]
        assert got[sid][2] is None and len(got[sid][3]) == 32, got[sid][2]
    finally:
        c.close()
    r = Client(node.endpoint("socket"), region_id=2, size=MIB)
    try:
        assert r.register() == {"sealed": False}
        stored = 0
        for i, k in enumerate(keys):
            r.mem[0:16] = b"\xff" * 16
            (ok,) = r.call("session.get", [r.rid, [[k, 0, MIB]]])
            if ok:
                stored += 1
                assert bytes(r.mem[0:MIB]) == bytes([i + 1]) * MIB, k
        print("pages stored before the region went: %d of 32" % stored)
    finally:
        r.close()
    assert node.stop() == 0
