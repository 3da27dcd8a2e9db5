/*
 * rpc/auth.h — cluster challenge-response on the RPC port, shared by server
 * and clients.
 *
 * Owns: the RPC envelope of the exchange (the proof is common/auth.h's). Any thread. The secret never crosses the wire:
 * each side proves it knows the secret with an HMAC over both sides' fresh
 * random nonces, so a recorded exchange cannot be replayed and each side
 * authenticates the other.
 *
 *   client -> auth.challenge []              -> {"nonce": bin32, ...}
 *   client -> auth.response [proof, cnonce]  -> {"proof": server_proof}
 *   proof        = HMAC-SHA256(secret, "peercache-auth-v1 client" || snonce || cnonce)
 *   server_proof = HMAC-SHA256(secret, "peercache-auth-v1 server" || snonce || cnonce)
 */
#ifndef PC_RPC_AUTH_H
#define PC_RPC_AUTH_H

#include <stdbool.h>
#include <stdint.h>

#include "common/auth.h"
#include "rpc/mp.h"

/* The proof itself is common/auth.h's (the data port uses it too). */
#define RPC_NONCE_BYTES PC_AUTH_NONCE_BYTES

/* Client side, shared by both clients. */
/* Take the node's nonce out of an auth.challenge result; 0 or -EPROTO. */
int rpc_auth_read_challenge(struct mp_rd result,
			    uint8_t snonce[RPC_NONCE_BYTES]);
/* Pack auth.response's two params (proof, client nonce). */
void rpc_auth_pack_response(msgpack_packer *pk, const char *secret,
			    const uint8_t snonce[RPC_NONCE_BYTES],
			    const uint8_t cnonce[RPC_NONCE_BYTES]);
/* True when an auth.response result carries the node's correct proof. */
bool rpc_auth_check_server(struct mp_rd result, const char *secret,
			   const uint8_t snonce[RPC_NONCE_BYTES],
			   const uint8_t cnonce[RPC_NONCE_BYTES]);

#endif /* PC_RPC_AUTH_H */
