/*
 * rpc/auth.c — the proof of the cluster challenge-response (see auth.h).
 *
 * Owns: nothing. Any thread.
 */
#include "auth.h"

#include <errno.h>
#include <string.h>

void rpc_auth_proof(const char *secret, const uint8_t snonce[RPC_NONCE_BYTES],
		    const uint8_t cnonce[RPC_NONCE_BYTES], bool server_side,
		    uint8_t out[PC_SHA256_BYTES])
{
	/* The role label keeps a client proof from passing as a server one. */
	const char *label = server_side ? "peercache-auth-v1 server"
					: "peercache-auth-v1 client";
	struct pc_iov_c parts[3] = {
		{label, strlen(label)},
		{snonce, RPC_NONCE_BYTES},
		{cnonce, RPC_NONCE_BYTES},
	};
	pc_hmac_sha256(secret, strlen(secret), parts, 3, out);
}

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
	rpc_auth_proof(secret, snonce, cnonce, false, proof);
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
	uint8_t want[PC_SHA256_BYTES];
	rpc_auth_proof(secret, snonce, cnonce, true, want);
	return mp_rd_map(&r, &n) == 0 && n == 1 && mp_rd_str(&r, &k, &kl) == 0 &&
	       mp_str_eq(k, kl, "proof") && mp_rd_bin(&r, &b, &bl) == 0 &&
	       bl == sizeof(want) && pc_ct_equal(b, want, sizeof(want));
}
