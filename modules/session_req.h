/*
 * modules/session_req.h — the decoder of the local-session requests
 * (session.register / unregister / set / get params, docs/protocol.md
 * "Local sessions"), apart from the session state so it can be fuzzed
 * alone (tests/fuzz/fuzz_session.c).
 *
 * Owns: nothing; pure functions over a MessagePack cursor. Threading: any.
 *
 * Invariants (what a decoded request guarantees to session.c, checked again
 * in debug builds): a move has 1..SESS_ITEMS_MAX items; every key is
 * 1..SESS_KEY_MAX bytes and points into the request; every item has len > 0
 * and lies inside its region ([off, off + len) within region_size, no
 * overflow). A refused request names what was wrong (a static string).
 */
#ifndef PC_MODULES_SESSION_REQ_H
#define PC_MODULES_SESSION_REQ_H

#include <stdint.h>

#include "rpc/mp.h"

#define SESS_ITEMS_MAX 65536
#define SESS_KEY_MAX 512
#define SESS_REGION_BYTES_MAX (1ull << 40) /* 1 TiB */

struct sess_item {
	const char *key;
	uint32_t klen;
	uint64_t off;
	uint64_t len;
};

/* [region_id, size]: NULL, or why not. */
const char *sess_req_register(struct mp_rd *p, uint64_t *id, uint64_t *size);
/* [region_id]. */
const char *sess_req_unregister(struct mp_rd *p, uint64_t *id);
/* The head of set/get params: [region_id, [ ... n items ... ]]. */
const char *sess_req_move_head(struct mp_rd *p, uint64_t *id, uint32_t *n);
/* One item [key, offset, len] inside a region of region_size bytes. */
const char *sess_req_item(struct mp_rd *p, uint64_t region_size,
			  struct sess_item *it);

#endif /* PC_MODULES_SESSION_REQ_H */
