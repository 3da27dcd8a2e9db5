/*
 * common/sha256.h — SHA-256 (FIPS 180-4), HMAC-SHA256 (RFC 2104), a
 * constant-time comparison and a CSPRNG wrapper, for the node's
 * challenge-response authentication.
 *
 * Owns: nothing global. Thread-safety: every function works on caller-owned
 * memory, so any thread may call them; a struct pc_sha256 must not be shared
 * between threads without external locking. Dependency rule: libc only.
 */
#ifndef PC_COMMON_SHA256_H
#define PC_COMMON_SHA256_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PC_SHA256_BYTES 32       /* digest size */
#define PC_SHA256_BLOCK_BYTES 64 /* compression-function block size */

/* Streaming hash state. Treat as opaque; fields are public only so callers
 * can keep it on the stack. */
struct pc_sha256 {
	uint32_t h[8];                         /* intermediate hash value */
	uint8_t block[PC_SHA256_BLOCK_BYTES];  /* partial block not yet hashed */
	uint64_t total_bytes;                  /* message length so far */
};

/* Start a new hash. */
void pc_sha256_init(struct pc_sha256 *s);

/* Absorb len bytes (any alignment; len may be 0, data may then be NULL). */
void pc_sha256_update(struct pc_sha256 *s, const void *data, size_t len);

/* Pad, write the digest to out and wipe the state; call init to reuse s. */
void pc_sha256_final(struct pc_sha256 *s, uint8_t out[PC_SHA256_BYTES]);

/* One-shot hash of a single buffer. */
void pc_sha256(const void *data, size_t len, uint8_t out[PC_SHA256_BYTES]);

/* One part of a message given as a scatter list (a const iovec). */
struct pc_iov_c {
	const void *p; /* may be NULL when len is 0 */
	size_t len;
};

/*
 * HMAC-SHA256 over the concatenation of n (ptr,len) parts, so callers need no
 * temporary buffer. Keys longer than the 64-byte block are hashed first
 * (RFC 2104 §2); key_len 0 is allowed. out is written last, so it may alias
 * the key or a part.
 */
void pc_hmac_sha256(const void *key, size_t key_len,
		    const struct pc_iov_c *parts, size_t n,
		    uint8_t out[PC_SHA256_BYTES]);

/*
 * Constant-time equality of two byte strings of equal length: true if equal.
 * The running time depends on len only, never on where the bytes differ, so
 * a peer probing MACs learns nothing from timing. len is not secret.
 */
bool pc_ct_equal(const void *a, const void *b, size_t len);

/*
 * Fill buf with len cryptographically random bytes (getrandom(2), retrying on
 * EINTR and short reads); 0 or -errno. len 0 succeeds without a syscall.
 */
int pc_random_bytes(void *buf, size_t len);

#endif /* PC_COMMON_SHA256_H */
