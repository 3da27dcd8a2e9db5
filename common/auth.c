/*
 * common/auth.c — the cluster proof (see auth.h).
 *
 * Owns: nothing. Any thread.
 */
#include "common/auth.h"

#include <string.h>

void pc_auth_proof(const char *secret, const uint8_t snonce[PC_AUTH_NONCE_BYTES],
		   const uint8_t cnonce[PC_AUTH_NONCE_BYTES], bool server_side,
		   uint8_t out[PC_AUTH_PROOF_BYTES])
{
	/* The role label keeps a client proof from passing as a server one. */
	const char *label = server_side ? "peercache-auth-v1 server"
					: "peercache-auth-v1 client";
	struct pc_iov_c parts[3] = {
		{label, strlen(label)},
		{snonce, PC_AUTH_NONCE_BYTES},
		{cnonce, PC_AUTH_NONCE_BYTES},
	};
	pc_hmac_sha256(secret, strlen(secret), parts, 3, out);
}

bool pc_auth_check(const char *secret, const uint8_t snonce[PC_AUTH_NONCE_BYTES],
		   const uint8_t cnonce[PC_AUTH_NONCE_BYTES], bool server_side,
		   const uint8_t *proof)
{
	uint8_t want[PC_AUTH_PROOF_BYTES];
	pc_auth_proof(secret, snonce, cnonce, server_side, want);
	bool ok = pc_ct_equal(want, proof, sizeof(want));
	explicit_bzero(want, sizeof(want));
	return ok;
}
