#!/usr/bin/python3
"""Write the malformed-input corpus for the RPC port to rpc-malformed/.

Each file is raw bytes a hostile or broken client might send. The process
test (tests/proc/test_rpc.py) replays every file against a live node and
expects an error reply or a closed connection within a second, while the node
keeps serving a well-behaved client. The fuzz target starts from these too.

Run with Debian's Python: /usr/bin/python3 tests/corpus/make_rpc_corpus.py
The output is committed; re-running it rewrites the same files.
"""
import os
import random
import shutil

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "rpc-malformed")
# Valid messages: seeds for the fuzz target (tests/fuzz/fuzz_rpc.c), which
# also reads rpc-malformed/.
SEEDS = os.path.join(HERE, "..", "fuzz", "corpus", "rpc")


def req(msgid, method, params):
    return msgpack.packb([0, msgid, method, params])


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    cases = []

    # 1. Valid requests truncated at every byte.
    for name, msg in (("info", req(1, "node.info", [])),
                      ("health", req(4000000000, "node.health", [])),
                      ("params", req(7, "node.info", [b"\x00" * 40, {"k": [1, 2.5, None]}]))):
        for cut in range(1, len(msg)):
            cases.append(("trunc-%s-%03d" % (name, cut), msg[:cut]))

    # 2. Lengths and counts far beyond what is sent or allowed.
    for tag, b in (("array32-max", b"\xdd\xff\xff\xff\xff"),
                   ("map32-max", b"\xdf\xff\xff\xff\xff"),
                   ("array16-max", b"\xdc\xff\xff"),
                   ("map16-max", b"\xde\xff\xff"),
                   ("str32-max", b"\x94\x00\x01\xdb\xff\xff\xff\xff"),
                   ("bin32-max", b"\x94\x00\x01\xa4node\xc6\xff\xff\xff\xff"),
                   ("ext32-max", b"\xc9\xff\xff\xff\xff\x01"),
                   ("str32-2g", b"\x94\x00\x01\xdb\x80\x00\x00\x00abc"),
                   ("params-array32", b"\x94\x00\x01\xa9node.info\xdd\x7f\xff\xff\xff"),
                   ("params-map32", b"\x94\x00\x01\xa9node.info\xdf\x7f\xff\xff\xff"),
                   ("array32-2m", b"\xdd\x00\x20\x00\x00" + b"\x00" * 64)):
        cases.append(("oversize-" + tag, b))

    # 3. Nesting deeper than any limit.
    for depth in (40, 100, 10000):
        cases.append(("deep-array-%d" % depth, b"\x91" * depth + b"\x00"))
    cases.append(("deep-map-100", b"\x81\x00" * 100 + b"\x00"))
    cases.append(("deep-in-params", req(1, "node.info", [])[:-1] + b"\x91" * 200 + b"\x00"))

    # 4. Wrong shapes and types (some with a readable msgid: error replies).
    wrong = [
        ("not-array-int", msgpack.packb(5)),
        ("not-array-str", msgpack.packb("node.info")),
        ("not-array-map", msgpack.packb({"method": "node.info"})),
        ("array-2", msgpack.packb([0, 1])),
        ("array-5", msgpack.packb([0, 1, "node.info", [], 1])),
        ("type-9", msgpack.packb([9, 1, "node.info", []])),
        ("type-neg", msgpack.packb([-1, 1, "node.info", []])),
        ("type-str", msgpack.packb(["0", 1, "node.info", []])),
        ("msgid-str", msgpack.packb([0, "1", "node.info", []])),
        ("msgid-neg", msgpack.packb([0, -1, "node.info", []])),
        ("msgid-huge", msgpack.packb([0, 2 ** 40, "node.info", []])),
        ("msgid-float", msgpack.packb([0, 1.5, "node.info", []])),
        ("method-int", msgpack.packb([0, 1, 17, []])),
        ("method-bin", msgpack.packb([0, 1, b"node.info", []])),
        ("method-nil", msgpack.packb([0, 1, None, []])),
        ("params-map", msgpack.packb([0, 1, "node.info", {}])),
        ("params-str", msgpack.packb([0, 1, "node.info", "x"])),
        ("params-nil", msgpack.packb([0, 1, "node.info", None])),
        ("unknown-method", req(1, "no.such.method", [])),
        ("method-empty", req(1, "", [])),
        ("method-long", req(1, "m" * 5000, [])),
        ("response-to-server", msgpack.packb([1, 1, None, "x"])),
        ("notify-3-bad", msgpack.packb([2, 5, []])),
        ("notify-4", msgpack.packb([2, "node.info", [], 1])),
        ("auth-response-junk", req(1, "auth.response", ["x", 1])),
        ("auth-response-first", req(1, "auth.response", [b"\x00" * 32, b"\x00" * 32])),
    ]
    cases += wrong

    # 5. Bytes that are not MessagePack at all.
    cases += [
        ("invalid-c1", b"\xc1"),
        ("invalid-c1-in-array", b"\x94\x00\x01\xc1\x90"),
        ("http-get", b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"),
        ("http-post", b"POST /rpc HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"),
        ("http-head", b"HEAD / HTTP/1.0\r\n\r\n"),
        ("http2-preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
        ("tls-client-hello", bytes.fromhex("160301020001") + b"\x03\x03" + bytes(range(32)) + b"\x00" * 40),
        ("tls-1.0-hello", bytes.fromhex("16030100a5010000a10301") + b"\x11" * 60),
        ("ssh-banner", b"SSH-2.0-OpenSSH_9.2\r\n"),
        ("redis-ping", b"*1\r\n$4\r\nPING\r\n"),
        ("json", b'{"jsonrpc":"2.0","method":"node.info","id":1}'),
        ("nul-bytes", b"\x00" * 64),
        ("ff-bytes", b"\xff" * 64),
    ]
    rnd = random.Random(1234)
    for i in range(12):
        cases.append(("random-%02d" % i, bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 300)))))
    # A valid request followed by garbage in the same write.
    cases.append(("valid-then-c1", req(1, "node.health", []) + b"\xc1"))
    cases.append(("valid-then-trunc", req(1, "node.health", []) + req(2, "node.info", [])[:5]))

    for i, (name, data) in enumerate(cases):
        with open(os.path.join(OUT, "%03d-%s.bin" % (i, name)), "wb") as f:
            f.write(data)
    print("wrote %d cases to %s" % (len(cases), OUT))

    shutil.rmtree(SEEDS, ignore_errors=True)
    os.makedirs(SEEDS)
    seeds = [
        req(1, "node.info", []),
        req(2, "node.health", []),
        msgpack.packb([2, "node.health", []]),
        msgpack.packb([1, 7, None, {"status": "ok", "uptime_s": 1.5}]),
        msgpack.packb([1, 8, {"code": "bad_params", "message": "x"}, None]),
        msgpack.packb([1, 9, "plain string error", None]),
        req(3, "auth.response", [b"\x01" * 32, b"\x02" * 32]),
        req(4, "kv.set", [["a", "b"], [b"\x00" * 100, b"\xff" * 10]]),
        req(5, "kv.get", [["k%d" % i for i in range(50)]]),
        req(6, "x", [1, -1, 2 ** 40, -2 ** 40, 1.5, True, False, None, "s" * 40,
                     b"b" * 300, {"m": [1, {"n": []}]}, msgpack.ExtType(5, b"ext")]),
        req(7, "node.info", []) + req(8, "node.health", []),
    ]
    for i, data in enumerate(seeds):
        with open(os.path.join(SEEDS, "seed-%02d.bin" % i), "wb") as f:
            f.write(data)
    print("wrote %d seeds to %s" % (len(seeds), os.path.normpath(SEEDS)))


if __name__ == "__main__":
    main()
