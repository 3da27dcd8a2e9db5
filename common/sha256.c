/*
 * common/sha256.c — SHA-256 (FIPS 180-4 §6.2), HMAC-SHA256 (RFC 2104),
 * constant-time comparison and getrandom(2) wrapper.
 *
 * Written from the specifications; the round constants and initial hash value
 * are the ones FIPS 180-4 §4.2.2 / §5.3.3 define (fractional parts of the cube
 * and square roots of the first primes).
 *
 * Owns: no global state; every function works on caller memory, so any thread
 * may call any function. Invariants of struct pc_sha256: total_bytes % 64 is
 * the number of buffered bytes in block[], and that count is always < 64 after
 * update returns (a full block is compressed at once). Input is read bytewise,
 * so any alignment is fine and there is no type punning. Key-derived material
 * (pads, the inner digest, hash states that absorbed a pad) is wiped with
 * explicit_bzero, which the compiler may not elide as a dead store.
 */
#include "sha256.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

static const uint32_t k_round[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
	0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
	0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
	0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
	0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
	0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
	0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
	0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
	0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static const uint32_t h_initial[8] = {
	0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
	0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

/* n is always 1..31 at the call sites, so neither shift is by 0 or 32. */
static inline uint32_t rotr32(uint32_t x, unsigned n)
{
	return (x >> n) | (x << (32 - n));
}

/* Widen each byte before shifting: a uint8_t promotes to int, and
 * 0x80 << 24 would overflow a signed int. */
static inline uint32_t load_be32(const uint8_t *p)
{
	return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) |
	       ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline void store_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

/* One application of the compression function (FIPS 180-4 §6.2.2). */
static void sha256_compress(uint32_t h[8], const uint8_t block[64])
{
	uint32_t w[64];
	uint32_t a = h[0], b = h[1], c = h[2], d = h[3];
	uint32_t e = h[4], f = h[5], g = h[6], hh = h[7];

	for (int t = 0; t < 16; t++)
		w[t] = load_be32(block + 4 * t);
	for (int t = 16; t < 64; t++) {
		uint32_t s0 = rotr32(w[t - 15], 7) ^ rotr32(w[t - 15], 18) ^
			      (w[t - 15] >> 3);
		uint32_t s1 = rotr32(w[t - 2], 17) ^ rotr32(w[t - 2], 19) ^
			      (w[t - 2] >> 10);
		w[t] = w[t - 16] + s0 + w[t - 7] + s1;
	}
	for (int t = 0; t < 64; t++) {
		uint32_t big_s1 = rotr32(e, 6) ^ rotr32(e, 11) ^ rotr32(e, 25);
		uint32_t ch = (e & f) ^ (~e & g);
		uint32_t t1 = hh + big_s1 + ch + k_round[t] + w[t];
		uint32_t big_s0 = rotr32(a, 2) ^ rotr32(a, 13) ^ rotr32(a, 22);
		uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
		uint32_t t2 = big_s0 + maj;

		hh = g;
		g = f;
		f = e;
		e = d + t1;
		d = c;
		c = b;
		b = a;
		a = t1 + t2;
	}
	h[0] += a;
	h[1] += b;
	h[2] += c;
	h[3] += d;
	h[4] += e;
	h[5] += f;
	h[6] += g;
	h[7] += hh;
	/* The schedule is derived from the message, which may be a key pad. */
	explicit_bzero(w, sizeof(w));
}

void pc_sha256_init(struct pc_sha256 *s)
{
	memcpy(s->h, h_initial, sizeof(s->h));
	s->total_bytes = 0;
}

void pc_sha256_update(struct pc_sha256 *s, const void *data, size_t len)
{
	const uint8_t *p = data;
	size_t used = (size_t)(s->total_bytes % PC_SHA256_BLOCK_BYTES);

	if (len == 0)
		return; /* memcpy(…, NULL, 0) is undefined; data may be NULL */
	s->total_bytes += len;

	if (used > 0) {
		size_t take = PC_SHA256_BLOCK_BYTES - used;

		if (take > len)
			take = len;
		memcpy(s->block + used, p, take);
		p += take;
		len -= take;
		if (used + take < PC_SHA256_BLOCK_BYTES)
			return;
		sha256_compress(s->h, s->block);
	}
	/* Whole blocks straight from the caller's buffer: no copy needed
	 * because the compression function reads bytewise. */
	while (len >= PC_SHA256_BLOCK_BYTES) {
		sha256_compress(s->h, p);
		p += PC_SHA256_BLOCK_BYTES;
		len -= PC_SHA256_BLOCK_BYTES;
	}
	if (len > 0)
		memcpy(s->block, p, len);
}

void pc_sha256_final(struct pc_sha256 *s, uint8_t out[PC_SHA256_BYTES])
{
	size_t used = (size_t)(s->total_bytes % PC_SHA256_BLOCK_BYTES);
	/* Length in bits, mod 2^64 as §5.1.1 assumes (unsigned wrap is defined). */
	uint64_t bits = s->total_bytes << 3;

	/* §5.1.1: a 1 bit, zeros up to 56 mod 64 bytes, then the 64-bit length.
	 * With 56..63 bytes buffered the length does not fit: an extra block. */
	s->block[used++] = 0x80;
	if (used > 56) {
		memset(s->block + used, 0, PC_SHA256_BLOCK_BYTES - used);
		sha256_compress(s->h, s->block);
		used = 0;
	}
	memset(s->block + used, 0, 56 - used);
	store_be32(s->block + 56, (uint32_t)(bits >> 32));
	store_be32(s->block + 60, (uint32_t)bits);
	sha256_compress(s->h, s->block);

	for (int i = 0; i < 8; i++)
		store_be32(out + 4 * i, s->h[i]);
	explicit_bzero(s, sizeof(*s));
}

void pc_sha256(const void *data, size_t len, uint8_t out[PC_SHA256_BYTES])
{
	struct pc_sha256 s;

	pc_sha256_init(&s);
	pc_sha256_update(&s, data, len);
	pc_sha256_final(&s, out);
}

/* RFC 2104 §2: H(K0 ^ opad || H(K0 ^ ipad || text)). */
void pc_hmac_sha256(const void *key, size_t key_len,
		    const struct pc_iov_c *parts, size_t n,
		    uint8_t out[PC_SHA256_BYTES])
{
	uint8_t k0[PC_SHA256_BLOCK_BYTES] = {0};
	uint8_t pad[PC_SHA256_BLOCK_BYTES];
	uint8_t inner[PC_SHA256_BYTES];
	struct pc_sha256 s;

	if (key_len > PC_SHA256_BLOCK_BYTES)
		pc_sha256(key, key_len, k0);
	else if (key_len > 0)
		memcpy(k0, key, key_len);

	for (size_t i = 0; i < sizeof(pad); i++)
		pad[i] = k0[i] ^ 0x36;
	pc_sha256_init(&s);
	pc_sha256_update(&s, pad, sizeof(pad));
	for (size_t i = 0; i < n; i++)
		pc_sha256_update(&s, parts[i].p, parts[i].len);
	pc_sha256_final(&s, inner);

	for (size_t i = 0; i < sizeof(pad); i++)
		pad[i] = k0[i] ^ 0x5c;
	pc_sha256_init(&s);
	pc_sha256_update(&s, pad, sizeof(pad));
	pc_sha256_update(&s, inner, sizeof(inner));
	/* out is written only here, after key and parts were last read. */
	pc_sha256_final(&s, out);

	explicit_bzero(k0, sizeof(k0));
	explicit_bzero(pad, sizeof(pad));
	explicit_bzero(inner, sizeof(inner));
}

bool pc_ct_equal(const void *a, const void *b, size_t len)
{
	const volatile uint8_t *pa = a;
	const volatile uint8_t *pb = b;
	uint8_t diff = 0;

	/* No early exit, and volatile reads keep the compiler from inventing
	 * one: the loop always touches all len bytes of both inputs. */
	for (size_t i = 0; i < len; i++)
		diff |= (uint8_t)(pa[i] ^ pb[i]);
	return diff == 0;
}

int pc_random_bytes(void *buf, size_t len)
{
	uint8_t *p = buf;
	size_t done = 0;

	while (done < len) {
		/* flags 0: the urandom pool, blocking only until it is seeded
		 * at boot. Large requests may be cut short by a signal. */
		ssize_t r = getrandom(p + done, len - done, 0);

		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			return -EIO; /* cannot happen; refuse to spin */
		done += (size_t)r;
	}
	return 0;
}
