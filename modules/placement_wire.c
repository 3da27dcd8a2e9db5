/*
 * modules/placement_wire.c — a placement record on the wire (see
 * modules/placement_wire.h).
 */
#include <errno.h>
#include <string.h>

#include "modules/placement_wire.h"

void pl_rec_pack(msgpack_packer *pk, const struct dir_rec *r)
{
	msgpack_pack_array(pk, 7);
	mp_pack_cstr(pk, r->node);
	mp_pack_cstr(pk, r->data);
	msgpack_pack_uint64(pk, r->addr);
	msgpack_pack_uint32(pk, r->rkey);
	msgpack_pack_uint32(pk, r->len);
	msgpack_pack_uint64(pk, r->gen);
	if (r->resident)
		msgpack_pack_true(pk);
	else
		msgpack_pack_false(pk);
}

int pl_str_read(struct mp_rd *p, char *out, size_t cap)
{
	const char *s;
	uint32_t n;
	if (mp_rd_str(p, &s, &n) < 0 || n == 0 || n >= cap)
		return -EINVAL;
	memcpy(out, s, n);
	out[n] = '\0';
	return 0;
}

int pl_rec_read(struct mp_rd *p, struct dir_rec *r)
{
	uint32_t n;
	uint64_t rkey, len;
	if (mp_rd_array(p, &n) < 0 || n != 7 ||
	    pl_str_read(p, r->node, sizeof(r->node)) < 0 ||
	    pl_str_read(p, r->data, sizeof(r->data)) < 0 ||
	    mp_rd_uint(p, &r->addr) < 0 || mp_rd_uint(p, &rkey) < 0 ||
	    mp_rd_uint(p, &len) < 0 || mp_rd_uint(p, &r->gen) < 0 ||
	    mp_rd_bool(p, &r->resident) < 0 || rkey > UINT32_MAX ||
	    len > UINT32_MAX)
		return -EINVAL;
	r->rkey = (uint32_t)rkey;
	r->len = (uint32_t)len;
	r->found = true;
	r->own_replica = false; /* from the wire: another node's replica */
	return 0;
}
