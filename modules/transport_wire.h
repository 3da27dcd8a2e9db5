/*
 * modules/transport_wire.h — the TCP data port's frames (docs/protocol.md
 * "Data port"), encoded and decoded in one place.
 *
 * Owns: the wire structs and their checks. No state; any thread. The server
 * (transport_tcp.c), the client (transport_tcp_client.c) and the fuzz
 * target (tests/fuzz/fuzz_data.c) share these functions, so what the fuzzer
 * exercises is what the node runs.
 *
 *   request  32 B: magic "PCD1", op u16, flags u16, rkey u32, len u32,
 *                  addr u64, id u64 [+ payload: see tp_wire_req_payload]
 *   response 24 B: magic "PCR1", status i32 (0, TP_STATUS_SELECTED or
 *                  -errno), id u64, len u64 [+ len payload bytes]
 * A READ_SEL is a READ with a TP_SEL_BYTES selector as its payload; its
 * answer is either the whole range (status 0, len = the request's) or the
 * region's selection (status TP_STATUS_SELECTED, len <= the request's).
 * Little-endian.
 */
#ifndef PC_MODULES_TRANSPORT_WIRE_H
#define PC_MODULES_TRANSPORT_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define TP_MAGIC_REQ 0x31444350u  /* "PCD1" */
#define TP_MAGIC_RESP 0x31524350u /* "PCR1" */
#define TP_REQ_BYTES 32
#define TP_RESP_BYTES 24

enum tp_wire_op {
	TP_OP_READ = 1,
	TP_OP_AUTH_CHALLENGE = 2,
	TP_OP_AUTH_RESPONSE = 3,
	TP_OP_WRITE = 4,
	TP_OP_READ_SEL = 5,
};

/* The status of an answer that carries the region's selection. */
#define TP_STATUS_SELECTED 1

/* A decoded request header (host order). */
struct tp_req {
	uint16_t op;
	uint16_t flags;
	uint32_t rkey;
	uint32_t len;
	uint64_t addr;
	uint64_t id;
};

/* A decoded response header (host order). */
struct tp_resp {
	int32_t status;
	uint64_t id;
	uint64_t len;
};

void tp_wire_req_encode(const struct tp_req *q, uint8_t out[TP_REQ_BYTES]);
/*
 * Decode the request header at p (avail bytes): TP_REQ_BYTES and *q, 0 when
 * more bytes are needed, -EPROTO for a bad magic or an op with an
 * impossible length (a WRITE of 0 or over TP_IO_MAX bytes). Unknown ops
 * and odd AUTH_RESPONSE sizes decode: the server decides what they cost.
 */
ssize_t tp_wire_req_decode(const uint8_t *p, size_t avail, struct tp_req *q);
/* Payload bytes following a request header: len for WRITE and
 * AUTH_RESPONSE, TP_SEL_BYTES for READ_SEL, 0 otherwise. */
uint32_t tp_wire_req_payload(const struct tp_req *q);

void tp_wire_resp_encode(const struct tp_resp *r, uint8_t out[TP_RESP_BYTES]);
/* 0 and *r, or -EPROTO for a bad magic, a status above
 * TP_STATUS_SELECTED, or a failure that carries bytes. */
int tp_wire_resp_decode(const uint8_t p[TP_RESP_BYTES], struct tp_resp *r);

#endif /* PC_MODULES_TRANSPORT_WIRE_H */
