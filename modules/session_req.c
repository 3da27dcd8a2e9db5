/*
 * modules/session_req.c — see session_req.h.
 */
#include "common/util.h"
#include "modules/session_req.h"

const char *sess_req_register(struct mp_rd *p, uint64_t *id, uint64_t *size)
{
	if (mp_rd_uint(p, id) < 0 || mp_rd_uint(p, size) < 0 ||
	    *id > UINT32_MAX || *size == 0 || *size > SESS_REGION_BYTES_MAX)
		return "expected [region_id (u32), size (1 B..1 TiB)] and a "
		       "descriptor";
	return NULL;
}

const char *sess_req_unregister(struct mp_rd *p, uint64_t *id)
{
	return mp_rd_uint(p, id) < 0 ? "expected [region_id]" : NULL;
}

const char *sess_req_move_head(struct mp_rd *p, uint64_t *id, uint32_t *n)
{
	if (mp_rd_uint(p, id) < 0 || mp_rd_array(p, n) < 0 || *n == 0 ||
	    *n > SESS_ITEMS_MAX)
		return "expected [region_id, [[key, offset, len], ...]] with "
		       "1..65536 items";
	return NULL;
}

const char *sess_req_item(struct mp_rd *p, uint64_t region_size,
			  struct sess_item *it)
{
	uint32_t three;
	if (mp_rd_array(p, &three) < 0 || three != 3 ||
	    mp_rd_str(p, &it->key, &it->klen) < 0 || it->klen == 0 ||
	    it->klen > SESS_KEY_MAX || mp_rd_uint(p, &it->off) < 0 ||
	    mp_rd_uint(p, &it->len) < 0 || it->len == 0)
		return "each item is [key (1..512 bytes), offset, len (> 0)]";
	if (it->off > region_size || it->len > region_size - it->off)
		return "an item lies outside its region";
	PC_DASSERT(it->off + it->len <= region_size);
	return NULL;
}
