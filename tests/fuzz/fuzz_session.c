/*
 * tests/fuzz/fuzz_session.c — libFuzzer target for the local-session
 * requests: every message of the input that parses as an RPC request has
 * its params decoded the way session.c does (modules/session_req.c), as
 * session.register, .unregister, and .set/.get against a region whose size
 * comes from the input's first bytes; a decoded move must satisfy the
 * decoder's invariants (items inside the region, key and item bounds),
 * else the target traps.
 *
 * Build: cmake -DPEERCACHE_FUZZ=ON -DCMAKE_C_COMPILER=clang ...; run:
 * build-fuzz/tests/fuzz/fuzz_session -max_total_time=60 WORKDIR
 * tests/fuzz/corpus/session (scripts/test.sh does this as a smoke test).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "modules/session_req.h"
#include "rpc/mp.h"
#include "rpc/msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(bool ok)
{
	if (!ok)
		__builtin_trap();
}

/* Decode params as a move against a region of region_size bytes. */
static void decode_move(struct mp_rd p, uint64_t region_size)
{
	uint64_t id;
	uint32_t n;
	if (sess_req_move_head(&p, &id, &n))
		return;
	check(n >= 1 && n <= SESS_ITEMS_MAX);
	for (uint32_t i = 0; i < n; i++) {
		struct sess_item it;
		const uint8_t *before = p.p;
		if (sess_req_item(&p, region_size, &it))
			return;
		check(p.p > before && p.p <= p.end);
		check(it.klen >= 1 && it.klen <= SESS_KEY_MAX);
		check((const uint8_t *)it.key >= before &&
		      (const uint8_t *)it.key + it.klen <= p.p);
		check(it.len > 0 && it.off <= region_size &&
		      it.len <= region_size - it.off);
	}
}

static void decode(const struct rpc_msg *m, uint64_t region_size)
{
	struct mp_rd p = m->params;
	uint32_t nparams;
	if (mp_rd_array(&p, &nparams) < 0)
		return;
	struct mp_rd q = p;
	uint64_t id, sz;
	if (!sess_req_register(&q, &id, &sz))
		check(id <= UINT32_MAX && sz >= 1 &&
		      sz <= SESS_REGION_BYTES_MAX);
	q = p;
	(void)sess_req_unregister(&q, &id);
	decode_move(p, region_size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const struct mp_limits lim = {
		.max_bytes = 1 << 20,
		.max_elements = 1 << 16,
		.max_depth = 32,
		.max_objects = 1 << 20,
	};
	/* The first 8 bytes pick the region size (small ones are the
	 * interesting edge), the rest is a stream of messages. */
	uint64_t region_size = 0;
	if (size >= 8) {
		memcpy(&region_size, data, 8);
		region_size = (region_size & 1) ? region_size >> 1
						: region_size % 65537;
		data += 8;
		size -= 8;
	}
	size_t off = 0;
	while (off < size) {
		size_t len;
		if (mp_scan(data + off, size - off, &lim, &len) != MP_COMPLETE)
			break;
		struct rpc_msg m;
		const char *why;
		if (rpc_msg_parse(data + off, len, &m, &why) == 0 &&
		    m.type != RPC_RESPONSE)
			decode(&m, region_size);
		off += len;
	}
	return 0;
}
