/*
 * tests/unit/test_sha256.c — unit tests for common/sha256.c.
 *
 * Owns: known-answer vectors from FIPS 180-4's examples (as published by
 * NIST) and RFC 4231 §4, plus padding-boundary digests of "a" * n computed
 * with Python's hashlib as an independent oracle. Every test is
 * self-contained; Criterion runs each in its own process.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sha256.h"

/* Hex digits to bytes; the vectors are literals, so a malformed one is a
 * bug in this file and fails the test loudly. */
static size_t hex_to_bytes(const char *hex, uint8_t *out, size_t cap)
{
	size_t n = strlen(hex);

	cr_assert(n % 2 == 0 && n / 2 <= cap, "bad vector %s", hex);
	for (size_t i = 0; i < n / 2; i++) {
		unsigned v;

		cr_assert(sscanf(hex + 2 * i, "%2x", &v) == 1, "bad hex %s", hex);
		out[i] = (uint8_t)v;
	}
	return n / 2;
}

static void to_hex(const uint8_t *p, size_t len, char *out)
{
	for (size_t i = 0; i < len; i++)
		sprintf(out + 2 * i, "%02x", p[i]);
}

/* Compare the first len bytes of got with hex (which has 2*len digits). */
static void expect_hex(const uint8_t *got, size_t len, const char *hex)
{
	uint8_t want[PC_SHA256_BYTES];
	char got_hex[2 * PC_SHA256_BYTES + 1];

	cr_assert_eq(hex_to_bytes(hex, want, sizeof(want)), len);
	to_hex(got, len, got_hex);
	cr_assert(memcmp(got, want, len) == 0, "got %s want %s", got_hex, hex);
}

static void expect_sha256(const void *msg, size_t len, const char *hex)
{
	uint8_t d[PC_SHA256_BYTES];

	pc_sha256(msg, len, d);
	expect_hex(d, sizeof(d), hex);
}

Test(sha256, empty)
{
	expect_sha256("", 0, "e3b0c44298fc1c149afbf4c8996fb924"
			     "27ae41e4649b934ca495991b7852b855");
	expect_sha256(NULL, 0, "e3b0c44298fc1c149afbf4c8996fb924"
			       "27ae41e4649b934ca495991b7852b855");
}

Test(sha256, fips_abc)
{
	expect_sha256("abc", 3, "ba7816bf8f01cfea414140de5dae2223"
				"b00361a396177a9cb410ff61f20015ad");
}

Test(sha256, fips_448_bit)
{
	const char *m =
		"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";

	cr_assert_eq(strlen(m), 56); /* exactly the two-block padding case */
	expect_sha256(m, strlen(m), "248d6a61d20638b8e5c026930c3e6039"
				    "a33ce45964ff2167f6ecedd419db06c1");
}

Test(sha256, fips_million_a)
{
	static const char *want = "cdc76e5c9914fb9281a1c7e284d73e67"
				  "f1809a48a497200e046d39ccc7112cd0";
	char *m = malloc(1000000);
	struct pc_sha256 s;
	uint8_t d[PC_SHA256_BYTES];

	cr_assert_not_null(m);
	memset(m, 'a', 1000000);
	expect_sha256(m, 1000000, want);
	free(m);

	/* Same message streamed in odd-sized pieces that never align. */
	char chunk[997];

	memset(chunk, 'a', sizeof(chunk));
	pc_sha256_init(&s);
	for (size_t left = 1000000; left > 0;) {
		size_t take = left < sizeof(chunk) ? left : sizeof(chunk);

		pc_sha256_update(&s, chunk, take);
		left -= take;
	}
	pc_sha256_final(&s, d);
	expect_hex(d, sizeof(d), want);
}

/* Lengths around the 55/56 (length no longer fits) and 64 (block) edges. */
Test(sha256, padding_boundaries)
{
	static const struct {
		size_t n;
		const char *hex;
	} v[] = {
		{55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
		{56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
		{57, "f13b2d724659eb3bf47f2dd6af1accc87b81f09f59f2b75e5c0bed6589dfe8c6"},
		{63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
		{64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
		{65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
		{119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
		{120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
		{128, "6836cf13bac400e9105071cd6af47084dfacad4e5e302c94bfed24e013afb73e"},
	};
	char m[128];

	memset(m, 'a', sizeof(m));
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
		expect_sha256(m, v[i].n, v[i].hex);
}

/* Any two-way split, plus a byte-at-a-time feed and empty updates, must
 * give the one-shot digest. The buffer is offset by one byte so whole-block
 * compression also runs on unaligned input (ASan/UBSan would flag a cast). */
Test(sha256, incremental_every_split)
{
	static const char *want = "2c7e18c942ef065b526a2d4e55462837"
				  "49cd3ddfb51d8fc71f42717363685f46";
	uint8_t storage[201];
	uint8_t *m = storage + 1;
	uint8_t one[PC_SHA256_BYTES], d[PC_SHA256_BYTES];
	struct pc_sha256 s;

	for (size_t i = 0; i < 200; i++)
		m[i] = (uint8_t)(i * 7 + 3);
	pc_sha256(m, 200, one);
	expect_hex(one, sizeof(one), want);

	for (size_t cut = 0; cut <= 200; cut++) {
		pc_sha256_init(&s);
		pc_sha256_update(&s, m, cut);
		pc_sha256_update(&s, NULL, 0);
		pc_sha256_update(&s, m + cut, 200 - cut);
		pc_sha256_final(&s, d);
		cr_assert(memcmp(d, one, sizeof(d)) == 0, "split at %zu", cut);
	}

	pc_sha256_init(&s);
	for (size_t i = 0; i < 200; i++)
		pc_sha256_update(&s, m + i, 1);
	pc_sha256_final(&s, d);
	cr_assert(memcmp(d, one, sizeof(d)) == 0, "byte at a time");
}

static void expect_hmac(const void *key, size_t key_len, const void *msg,
			size_t msg_len, size_t cmp_len, const char *hex)
{
	struct pc_iov_c part = {msg, msg_len};
	uint8_t d[PC_SHA256_BYTES];

	pc_hmac_sha256(key, key_len, &part, 1, d);
	expect_hex(d, cmp_len, hex);
}

Test(hmac_sha256, rfc4231_case1)
{
	uint8_t key[20];

	memset(key, 0x0b, sizeof(key));
	expect_hmac(key, sizeof(key), "Hi There", 8, PC_SHA256_BYTES,
		    "b0344c61d8db38535ca8afceaf0bf12b"
		    "881dc200c9833da726e9376c2e32cff7");
}

Test(hmac_sha256, rfc4231_case2)
{
	const char *msg = "what do ya want for nothing?";

	expect_hmac("Jefe", 4, msg, strlen(msg), PC_SHA256_BYTES,
		    "5bdcc146bf60754e6a042426089575c7"
		    "5a003f089d2739839dec58b964ec3843");
}

Test(hmac_sha256, rfc4231_case3)
{
	uint8_t key[20], msg[50];

	memset(key, 0xaa, sizeof(key));
	memset(msg, 0xdd, sizeof(msg));
	expect_hmac(key, sizeof(key), msg, sizeof(msg), PC_SHA256_BYTES,
		    "773ea91e36800e46854db8ebd09181a7"
		    "2959098b3ef8c122d9635514ced565fe");
}

Test(hmac_sha256, rfc4231_case4)
{
	uint8_t key[25], msg[50];

	for (size_t i = 0; i < sizeof(key); i++)
		key[i] = (uint8_t)(i + 1); /* 0x01..0x19 */
	memset(msg, 0xcd, sizeof(msg));
	expect_hmac(key, sizeof(key), msg, sizeof(msg), PC_SHA256_BYTES,
		    "82558a389a443c0ea4cc819899f2083a"
		    "85f0faa3e578f8077a2e3ff46729665b");
}

/* RFC 4231 truncates this case's output to 128 bits. */
Test(hmac_sha256, rfc4231_case5_truncated)
{
	uint8_t key[20];

	memset(key, 0x0c, sizeof(key));
	expect_hmac(key, sizeof(key), "Test With Truncation", 20, 16,
		    "a3b6167473100ee06e0c796c2955552b");
}

Test(hmac_sha256, rfc4231_case6_long_key)
{
	const char *msg = "Test Using Larger Than Block-Size Key - Hash Key First";
	uint8_t key[131];

	memset(key, 0xaa, sizeof(key));
	expect_hmac(key, sizeof(key), msg, strlen(msg), PC_SHA256_BYTES,
		    "60e431591ee0b67f0d8a26aacbf5b77f"
		    "8e0bc6213728c5140546040f0ee37f54");
}

Test(hmac_sha256, rfc4231_case7_long_key_and_data)
{
	const char *msg = "This is a test using a larger than block-size key "
			  "and a larger than block-size data. The key needs to "
			  "be hashed before being used by the algorithm.";
	uint8_t key[131];

	cr_assert_eq(strlen(msg), 147);
	memset(key, 0xaa, sizeof(key));
	expect_hmac(key, sizeof(key), msg, strlen(msg), PC_SHA256_BYTES,
		    "9a3f8e7ae8dcf1c31b00de0e6244594c"
		    "68b5446adf6e5cef516510e59732a357");
}

/* A key of exactly one block is used as is; one byte more is hashed, so it
 * must equal HMAC keyed with its digest (RFC 2104 §2). */
Test(hmac_sha256, key_block_boundary)
{
	uint8_t key[65], kd[PC_SHA256_BYTES], a[PC_SHA256_BYTES],
		b[PC_SHA256_BYTES];
	struct pc_iov_c part = {"boundary", 8};

	for (size_t i = 0; i < sizeof(key); i++)
		key[i] = (uint8_t)i;
	expect_hmac(key, 64, "boundary", 8, PC_SHA256_BYTES,
		    "04660fc313657aa3500078e1f2788cc4"
		    "e328654092b137f946516e4d7a17adae");

	pc_hmac_sha256(key, 65, &part, 1, a);
	pc_sha256(key, 65, kd);
	pc_hmac_sha256(kd, sizeof(kd), &part, 1, b);
	cr_assert(memcmp(a, b, sizeof(a)) == 0);
}

Test(hmac_sha256, parts_equal_one_part)
{
	const char *msg = "what do ya want for nothing?";
	size_t len = strlen(msg);
	uint8_t one[PC_SHA256_BYTES], many[PC_SHA256_BYTES];
	struct pc_iov_c whole = {msg, len};
	struct pc_iov_c split[] = {
		{msg, 4}, {NULL, 0}, {msg + 4, 1}, {msg + 5, len - 5 - 3},
		{msg + len - 3, 3}, {"", 0},
	};

	pc_hmac_sha256("Jefe", 4, &whole, 1, one);
	expect_hex(one, sizeof(one), "5bdcc146bf60754e6a042426089575c7"
				     "5a003f089d2739839dec58b964ec3843");
	pc_hmac_sha256("Jefe", 4, split, sizeof(split) / sizeof(split[0]),
		       many);
	cr_assert(memcmp(one, many, sizeof(one)) == 0);

	/* No parts at all is HMAC of the empty message. */
	struct pc_iov_c empty = {"", 0};

	pc_hmac_sha256("Jefe", 4, NULL, 0, one);
	pc_hmac_sha256("Jefe", 4, &empty, 1, many);
	cr_assert(memcmp(one, many, sizeof(one)) == 0);
}

/* The header promises out may alias the message: it is written last. */
Test(hmac_sha256, out_aliases_message)
{
	uint8_t buf[PC_SHA256_BYTES];
	uint8_t want[PC_SHA256_BYTES];
	struct pc_iov_c part = {buf, sizeof(buf)};

	memset(buf, 0x42, sizeof(buf));
	pc_hmac_sha256("k", 1, &part, 1, want);
	pc_hmac_sha256("k", 1, &part, 1, buf);
	cr_assert(memcmp(buf, want, sizeof(buf)) == 0);
}

Test(ct_equal, equal_and_different)
{
	uint8_t a[PC_SHA256_BYTES], b[PC_SHA256_BYTES];

	for (size_t i = 0; i < sizeof(a); i++)
		a[i] = b[i] = (uint8_t)(0xa5 ^ i);
	cr_assert(pc_ct_equal(a, b, sizeof(a)));
	cr_assert(pc_ct_equal(a, b, 0));

	b[0] ^= 0x01;
	cr_assert_not(pc_ct_equal(a, b, sizeof(a)));
	b[0] ^= 0x01;

	b[sizeof(b) - 1] ^= 0x80; /* only the last byte differs */
	cr_assert_not(pc_ct_equal(a, b, sizeof(a)));
	cr_assert(pc_ct_equal(a, b, sizeof(a) - 1));
}

Test(random_bytes, differs_and_len_zero)
{
	uint8_t a[32], b[32], big[1000];

	cr_assert_eq(pc_random_bytes(a, sizeof(a)), 0);
	cr_assert_eq(pc_random_bytes(b, sizeof(b)), 0);
	/* 2^-256 chance of a false failure. */
	cr_assert_not(pc_ct_equal(a, b, sizeof(a)));

	cr_assert_eq(pc_random_bytes(NULL, 0), 0);
	cr_assert_eq(pc_random_bytes(a, 0), 0);

	/* Past getrandom's 256-byte uninterruptible size, still filled fully:
	 * an all-zero tail would mean a short read was dropped. */
	memset(big, 0, sizeof(big));
	cr_assert_eq(pc_random_bytes(big, sizeof(big)), 0);
	uint8_t zero[64] = {0};
	cr_assert_not(pc_ct_equal(big + sizeof(big) - 64, zero, 64));
}
