/*
 * modules/transport_wire.c — data-port frames (transport_wire.h).
 *
 * Owns: nothing. Any thread. Decoding copies out of the byte stream (no
 * alignment assumed) and checks every length before anyone trusts it.
 */
#include <endian.h>
#include <errno.h>
#include <string.h>

#include "modules/transport.h"
#include "modules/transport_wire.h"

struct req_wire {
	uint32_t magic;
	uint16_t op;
	uint16_t flags;
	uint32_t rkey;
	uint32_t len;
	uint64_t addr;
	uint64_t id;
};
_Static_assert(sizeof(struct req_wire) == TP_REQ_BYTES,
	       "data request is 32 bytes");

struct resp_wire {
	uint32_t magic;
	int32_t status;
	uint64_t id;
	uint64_t len;
};
_Static_assert(sizeof(struct resp_wire) == TP_RESP_BYTES,
	       "data response is 24 bytes");

void tp_wire_req_encode(const struct tp_req *q, uint8_t out[TP_REQ_BYTES])
{
	struct req_wire w = {htole32(TP_MAGIC_REQ), htole16(q->op),
			     htole16(q->flags), htole32(q->rkey),
			     htole32(q->len), htole64(q->addr), htole64(q->id)};
	memcpy(out, &w, sizeof(w));
}

ssize_t tp_wire_req_decode(const uint8_t *p, size_t avail, struct tp_req *q)
{
	struct req_wire w;
	if (avail < sizeof(w))
		return 0;
	memcpy(&w, p, sizeof(w));
	if (le32toh(w.magic) != TP_MAGIC_REQ)
		return -EPROTO;
	q->op = le16toh(w.op);
	q->flags = le16toh(w.flags);
	q->rkey = le32toh(w.rkey);
	q->len = le32toh(w.len);
	q->addr = le64toh(w.addr);
	q->id = le64toh(w.id);
	if (q->op == TP_OP_WRITE && (q->len == 0 || q->len > TP_IO_MAX))
		return -EPROTO;
	return sizeof(w);
}

uint32_t tp_wire_req_payload(const struct tp_req *q)
{
	if (q->op == TP_OP_READ_SEL)
		return TP_SEL_BYTES;
	return q->op == TP_OP_WRITE || q->op == TP_OP_AUTH_RESPONSE ? q->len
								    : 0;
}

void tp_wire_resp_encode(const struct tp_resp *r, uint8_t out[TP_RESP_BYTES])
{
	struct resp_wire w = {htole32(TP_MAGIC_RESP),
			      (int32_t)htole32((uint32_t)r->status),
			      htole64(r->id), htole64(r->len)};
	memcpy(out, &w, sizeof(w));
}

int tp_wire_resp_decode(const uint8_t p[TP_RESP_BYTES], struct tp_resp *r)
{
	struct resp_wire w;
	memcpy(&w, p, sizeof(w));
	if (le32toh(w.magic) != TP_MAGIC_RESP)
		return -EPROTO;
	r->status = (int32_t)le32toh((uint32_t)w.status);
	r->id = le64toh(w.id);
	r->len = le64toh(w.len);
	if (r->status > TP_STATUS_SELECTED || (r->status < 0 && r->len != 0))
		return -EPROTO;
	return 0;
}
