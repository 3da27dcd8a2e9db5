/*
 * common/auth.h — the cluster proof: HMAC over both sides' nonces.
 *
 * Owns: the proof format every authenticated port shares (the RPC port in
 * rpc/auth.c, the data port in the transports). Any thread, no state. The
 * secret never crosses the wire: each side proves it knows it with an HMAC
 * over both sides' fresh random nonces, so a recorded exchange cannot be
 * replayed and each side authenticates the other.
 *
 *   client proof = HMAC-SHA256(secret, "peercache-auth-v1 client" || snonce || cnonce)
 *   server proof = HMAC-SHA256(secret, "peercache-auth-v1 server" || snonce || cnonce)
 */
#ifndef PC_COMMON_AUTH_H
#define PC_COMMON_AUTH_H

#include <stdbool.h>
#include <stdint.h>

#include "common/sha256.h"

#define PC_AUTH_NONCE_BYTES 32
#define PC_AUTH_PROOF_BYTES PC_SHA256_BYTES

/* The proof of one side (server_side: the node's answer). */
void pc_auth_proof(const char *secret, const uint8_t snonce[PC_AUTH_NONCE_BYTES],
		   const uint8_t cnonce[PC_AUTH_NONCE_BYTES], bool server_side,
		   uint8_t out[PC_AUTH_PROOF_BYTES]);

/* True when proof is side's correct proof over (snonce, cnonce); constant
 * time. */
bool pc_auth_check(const char *secret, const uint8_t snonce[PC_AUTH_NONCE_BYTES],
		   const uint8_t cnonce[PC_AUTH_NONCE_BYTES], bool server_side,
		   const uint8_t *proof);

#endif /* PC_COMMON_AUTH_H */
