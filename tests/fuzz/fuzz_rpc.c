/*
 * tests/fuzz/fuzz_rpc.c — libFuzzer target for everything that reads RPC
 * bytes from the network: the MessagePack scanner, the envelope parser, the
 * cursor reader walking every object of a message, and the response-to-
 * result decoding the clients use.
 *
 * Build: cmake -DPEERCACHE_FUZZ=ON -DCMAKE_C_COMPILER=clang ...; run:
 * build-fuzz/tests/fuzz/fuzz_rpc -max_total_time=60 WORKDIR tests/fuzz/corpus/rpc
 * (scripts/test.sh does this as a smoke test).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "rpc/client.h"
#include "rpc/mp.h"
#include "rpc/msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Read every object of a value with the typed readers. */
static void walk(struct mp_rd *r, unsigned budget)
{
	while (budget-- && r->p < r->end) {
		uint32_t n;
		uint64_t u;
		int64_t i;
		double d;
		bool b;
		const char *s;
		const uint8_t *bin;
		switch (mp_peek(r)) {
		case MP_T_ARRAY: mp_rd_array(r, &n); break;
		case MP_T_MAP: mp_rd_map(r, &n); break;
		case MP_T_UINT: mp_rd_uint(r, &u); break;
		case MP_T_INT: mp_rd_int(r, &i); break;
		case MP_T_FLOAT: mp_rd_float(r, &d); break;
		case MP_T_BOOL: mp_rd_bool(r, &b); break;
		case MP_T_STR: mp_rd_str(r, &s, &n); break;
		case MP_T_BIN: mp_rd_bin(r, &bin, &n); break;
		case MP_T_NIL: mp_rd_nil(r); break;
		case MP_T_EXT:
			if (mp_skip(r) < 0)
				return;
			break;
		default:
			return;
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const struct mp_limits lim = {
		.max_bytes = 1 << 20,
		.max_elements = 1 << 16,
		.max_depth = 32,
		.max_objects = 1 << 20,
	};
	size_t off = 0;
	/* Treat the input as a stream of messages, as a connection would. */
	while (off < size) {
		size_t len;
		int ret = mp_scan(data + off, size - off, &lim, &len);
		if (ret != MP_COMPLETE)
			break;
		struct rpc_msg m;
		const char *why;
		if (rpc_msg_parse(data + off, len, &m, &why) == 0) {
			if (m.type == RPC_RESPONSE) {
				struct rpc_result res;
				rpc_result_from_response(&m, &res);
			} else {
				walk(&m.params, 100000);
			}
		}
		struct mp_rd r;
		mp_rd_init(&r, data + off, len);
		walk(&r, 100000);
		mp_rd_init(&r, data + off, len);
		if (mp_skip(&r) != 0 || r.p != data + off + len)
			__builtin_trap(); /* scan and skip must agree */
		off += len;
	}
	/* The skipper alone on unscanned input must stay in bounds. */
	struct mp_rd r;
	mp_rd_init(&r, data, size);
	mp_skip(&r);
	return 0;
}
