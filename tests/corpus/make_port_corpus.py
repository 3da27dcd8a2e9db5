#!/usr/bin/python3
"""Write the bad-input corpus for every port of a node to bad-input/<port>/.

Issue 18, item 3: cases a broken or hostile client sends to each of the
node's listeners — wrong types for every RPC method, lengths and counts far
beyond what is sent, truncations, bytes meant for another port (protocol
confusion), junk. tests/proc/test_bad_input.py replays every file against a
running node (each on a fresh connection, half-closed after the write) and
expects an answer or a close within a second, while a well-behaved client
keeps being served and the node's memory stays bounded. (The RPC framing's
own corpus is rpc-malformed/, written by make_rpc_corpus.py.)

Ports: rpc (TCP MessagePack-RPC), unix (the same on the Unix socket, where
the session.* methods live), data (the data-port frames, docs/protocol.md),
http (the metrics port).

Run with Debian's Python: /usr/bin/python3 tests/corpus/make_port_corpus.py
The output is committed; re-running it rewrites the same files.
"""
import os
import random
import shutil
import struct

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "bad-input")

# Every method a node registers (modules/*.c, rpc/*.c).
METHODS = [
    "auth.challenge", "auth.response", "cluster.members", "cluster.set_peers",
    "dir.del", "dir.get", "dir.put", "discovery.deregister",
    "discovery.heartbeat", "discovery.members", "discovery.register",
    "discovery.view", "disk.promote", "kv.delete", "kv.exists", "kv.flush",
    "kv.get", "kv.set", "node.config", "node.drain", "node.health",
    "node.info", "session.get", "session.register",
    "session.set", "session.unregister", "slot.claim", "slot.commit",
    "slot.delete", "slot.layout", "slot.probe",
]
# Methods whose every parameter list below is a wrong type; methods that
# take no parameters (node.info, node.health, cluster.members, ...) answer
# a result to some of them, which is fine: answered is what is checked.
WRONG_PARAMS = [
    ("nil", [None]),
    ("int", [12345]),
    ("neg", [-1, -1, -1]),
    ("str", ["x" * 300]),
    ("bin", [b"\x00" * 64]),
    ("nested", [[[[[[[[1]]]]]]]]),
    ("map", [{"keys": ["a"], "n": 1}]),
    ("float", [1.5, float("inf")]),
]


def req(msgid, method, params):
    return msgpack.packb([0, msgid, method, params], use_bin_type=True)


def array32_header(n):
    return b"\xdd" + struct.pack(">I", n)


def rpc_cases():
    cases = []
    for m in METHODS:
        for tag, params in WRONG_PARAMS:
            # some methods are refused before their parameters are read
            # (auth, local-only): an error either way
            cases.append(("%s-%s" % (m, tag), req(7, m, params)))
        # a parameter list that declares 2^31 elements and brings none
        cases.append(("%s-huge-count" % m, b"\x94\x00\x08" + msgpack.packb(m)
                      + array32_header(1 << 31)))
        # a key list of one key far over the 512-byte limit
        cases.append(("%s-long-key" % m, req(9, m, [["k" * 4096]])))
    # Wrong shapes for the page methods in particular.
    cases += [
        ("kv.set-count-mismatch", req(1, "kv.set", [["a", "b", "c"], [b"x"]])),
        ("kv.set-value-not-bin", req(1, "kv.set", [["a"], ["a string"]])),
        ("kv.set-empty-key", req(1, "kv.set", [[""], [b"x"]])),
        ("kv.set-declared-huge-bin", b"\x94\x00\x01\xa6kv.set\x92\x91\xa1a\x91\xc6\x7f\xff\xff\xff"),
        ("kv.get-65537-keys-declared", b"\x94\x00\x01\xa6kv.get\x91\xdd\x00\x01\x00\x01"),
        ("kv.get-keys-not-str", req(1, "kv.get", [[1, 2, 3]])),
        ("kv.exists-keys-map", req(1, "kv.exists", [{"a": 1}])),
        ("dir.put-short-record", req(1, "dir.put", [["k"], [[1, 2]]])),
        # (never a valid host:port here: a replayed case must not change
        # the node's membership)
        ("cluster.set_peers-port-0", req(1, "cluster.set_peers", [["127.0.0.1:0"]])),
        ("cluster.set_peers-no-port", req(1, "cluster.set_peers", ["127.0.0.1"])),
    ]
    # Bytes meant for other ports.
    cases += [
        ("data-frame", b"PCD1" + struct.pack("<HHIIQQ", 1, 0, 7, 64, 0, 1)),
        ("data-auth", b"PCD1" + struct.pack("<HHIIQQ", 2, 0, 0, 0, 0, 2)),
        ("http-metrics", b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("etcd-json", b'POST /v3/kv/range HTTP/1.1\r\nContent-Length: 10\r\n\r\n{"key":""}'),
        ("memcached-get", b"get key\r\n"),
        ("memcached-set", b"set key 0 0 5\r\nhello\r\n"),
    ]
    return cases


def unix_cases():
    cases = []
    for m in ("session.register", "session.unregister", "session.set", "session.get"):
        for tag, params in WRONG_PARAMS:
            cases.append(("%s-%s" % (m, tag), req(3, m, params)))
    cases += [
        # register without the descriptor it needs
        ("register-no-fd", req(1, "session.register", [1, 1 << 20])),
        ("register-size-0", req(1, "session.register", [1, 0])),
        ("register-size-huge", req(1, "session.register", [1, 1 << 62])),
        # moves in regions that were never registered
        ("get-no-region", req(1, "session.get", [5, [["k", 0, 4096]]])),
        ("set-no-region", req(1, "session.set", [5, [["k", 0, 4096]]])),
        ("get-item-short", req(1, "session.get", [1, [["k", 0]]])),
        ("get-offset-huge", req(1, "session.get", [1, [["k", 1 << 63, 4096]]])),
        ("get-items-declared-huge", b"\x94\x00\x01\xabsession.get\x92\x01\xdd\x7f\xff\xff\xff"),
        ("unregister-never", req(1, "session.unregister", [77])),
        ("many-in-one-write", b"".join(req(i, "session.get", [i, []]) for i in range(1, 200))),
    ]
    return cases


def data_header(op, rkey=0, length=0, addr=0, ident=1, flags=0, magic=b"PCD1"):
    return magic + struct.pack("<HHIIQQ", op, flags, rkey, length, addr, ident)


def data_cases():
    rnd = random.Random(77)
    cases = [
        ("read-before-auth", data_header(1, rkey=1, length=4096)),
        ("write-before-auth", data_header(4, rkey=1, length=16) + b"\x00" * 16),
        ("readsel-before-auth", data_header(5, rkey=1, length=4096) + b"\x00" * 16),
        ("auth-response-junk", data_header(3, length=64) + b"\x00" * 64),
        ("auth-response-huge", data_header(3, length=0xFFFFFFFF)),
        ("auth-response-short", data_header(3, length=64) + b"\x00" * 10),
        ("auth-challenge-twice", data_header(2) + data_header(2, ident=2)),
        ("op-0", data_header(0)),
        ("op-6", data_header(6)),
        ("op-ffff", data_header(0xFFFF)),
        ("flags-set", data_header(2, flags=0xFFFF)),
        ("magic-wrong", data_header(2, magic=b"XXXX")),
        ("magic-response", data_header(2, magic=b"PCR1")),
        ("magic-page", data_header(2, magic=b"PCP1")),
        ("write-len-huge", data_header(4, rkey=1, length=0xFFFFFFFF)),
        ("read-len-zero", data_header(1, rkey=1, length=0)),
        ("read-addr-max", data_header(1, rkey=1, length=4096, addr=2 ** 64 - 1)),
        ("header-1-byte", b"P"),
        ("header-31-bytes", data_header(2)[:31]),
        ("rpc-request", req(1, "node.info", [])),
        ("http-get", b"GET / HTTP/1.1\r\n\r\n"),
        ("tls-hello", bytes.fromhex("160301020001") + b"\x03\x03" + bytes(32)),
        ("nul-bytes", b"\x00" * 512),
        ("ff-bytes", b"\xff" * 512),
        ("valid-then-junk", data_header(2) + b"\xc1" * 40),
    ]
    for i in range(10):
        cases.append(("random-%02d" % i,
                      bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 200)))))
    return cases


def http_cases():
    rnd = random.Random(88)
    cases = [
        ("no-version", b"GET /metrics\r\n\r\n"),
        ("http-0.9", b"GET /\r\n"),
        ("bad-method", b"BREW /metrics HTTP/1.1\r\n\r\n"),
        ("post", b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"),
        ("put", b"PUT /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
        ("delete", b"DELETE / HTTP/1.1\r\n\r\n"),
        ("traversal", b"GET /../../../../etc/passwd HTTP/1.1\r\n\r\n"),
        ("encoded-traversal", b"GET /%2e%2e/%2e%2e/etc/passwd HTTP/1.1\r\n\r\n"),
        ("nul-in-path", b"GET /met\x00rics HTTP/1.1\r\n\r\n"),
        ("long-url", b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n"),
        ("long-header", b"GET / HTTP/1.1\r\nX-A: " + b"b" * 20000 + b"\r\n\r\n"),
        ("many-headers", b"GET / HTTP/1.1\r\n" + b"X-H: 1\r\n" * 2000 + b"\r\n"),
        ("no-crlf", b"GET / HTTP/1.1\n\n"),
        ("only-cr", b"GET / HTTP/1.1\r\r"),
        ("chunked", b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffff\r\n"),
        ("content-length-huge", b"POST / HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n"),
        ("content-length-neg", b"POST / HTTP/1.1\r\nContent-Length: -5\r\n\r\n"),
        ("two-content-lengths", b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 9\r\n\r\nx"),
        ("header-no-colon", b"GET / HTTP/1.1\r\nbroken header\r\n\r\n"),
        ("version-9", b"GET / HTTP/9.9\r\n\r\n"),
        ("pipelined-junk", b"GET /healthz HTTP/1.1\r\n\r\n\xc1\xc1\xc1"),
        ("http2-preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
        ("rpc-request", req(1, "node.info", [])),
        ("data-frame", data_header(2)),
        ("tls-hello", bytes.fromhex("160301020001") + b"\x03\x03" + bytes(32)),
        ("truncated-request-line", b"GET /metr"),
        ("absolute-uri", b"GET http://evil.example/metrics HTTP/1.1\r\n\r\n"),
        ("connect", b"CONNECT evil.example:443 HTTP/1.1\r\n\r\n"),
    ]
    for i in range(6):
        cases.append(("random-%02d" % i,
                      bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 300)))))
    return cases


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    total = 0
    for port, cases in (("rpc", rpc_cases()), ("unix", unix_cases()),
                        ("data", data_cases()), ("http", http_cases())):
        d = os.path.join(OUT, port)
        os.makedirs(d)
        names = set()
        for i, (name, data) in enumerate(cases):
            assert name not in names, name
            names.add(name)
            with open(os.path.join(d, "%03d-%s.bin" % (i, name)), "wb") as f:
                f.write(data)
        print("wrote %d cases to %s" % (len(cases), d))
        total += len(cases)
    print("%d cases in all" % total)


if __name__ == "__main__":
    main()
