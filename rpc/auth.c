/*
 * rpc/auth.c — the RPC envelope of the cluster challenge-response (auth.h).
 *
 * Owns: nothing. Any thread.
 */
#include "auth.h"

#include <errno.h>
#include <string.h>

int rpc_auth_read_challenge(struct mp_rd r, uint8_t snonce[RPC_NONCE_BYTES])
{
	uint32_t n;
	int ret = -EPROTO;
	if (mp_rd_map(&r, &n) < 0)
		return -EPROTO;
	for (uint32_t i = 0; i < n; i++) {
		const char *k;
		uint32_t kl;
		const uint8_t *b;
		uint32_t bl;
		if (mp_rd_str(&r, &k, &kl) == 0 && mp_str_eq(k, kl, "nonce") &&
		    mp_rd_bin(&r, &b, &bl) == 0 && bl == RPC_NONCE_BYTES) {
			memcpy(snonce, b, bl);
			ret = 0;
		} else if (mp_skip(&r) < 0) {
			return -EPROTO;
		}
	}
	return ret;
}

void rpc_auth_pack_response(msgpack_packer *pk, const char *secret,
			    const uint8_t snonce[RPC_NONCE_BYTES],
			    const uint8_t cnonce[RPC_NONCE_BYTES])
{
	uint8_t proof[PC_SHA256_BYTES];
	pc_auth_proof(secret, snonce, cnonce, false, proof);
	msgpack_pack_bin(pk, sizeof(proof));
	msgpack_pack_bin_body(pk, proof, sizeof(proof));
	msgpack_pack_bin(pk, RPC_NONCE_BYTES);
	msgpack_pack_bin_body(pk, cnonce, RPC_NONCE_BYTES);
}

bool rpc_auth_check_server(struct mp_rd r, const char *secret,
			   const uint8_t snonce[RPC_NONCE_BYTES],
			   const uint8_t cnonce[RPC_NONCE_BYTES])
{
	uint32_t n;
	const char *k;
	uint32_t kl;
	const uint8_t *b;
	uint32_t bl;
	return mp_rd_map(&r, &n) == 0 && n == 1 && mp_rd_str(&r, &k, &kl) == 0 &&
	       mp_str_eq(k, kl, "proof") && mp_rd_bin(&r, &b, &bl) == 0 &&
	       bl == PC_AUTH_PROOF_BYTES &&
	       pc_auth_check(secret, snonce, cnonce, true, b);
}
