/*
 * tests/unit/test_mp.c — the MessagePack scanner and reader: every split
 * point of valid messages, hostile counts and lengths, nesting, invalid
 * bytes, and every type read back after msgpack-c packed it.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rpc/mp.h"

static const struct mp_limits lim = {
	.max_bytes = 1 << 20,
	.max_elements = 1000,
	.max_depth = 8,
	.max_objects = 100000,
};

/* A message with every type in it. */
static size_t build_all_types(struct pc_wbuf *b)
{
	msgpack_packer pk;
	pc_wbuf_init(b, 0);
	pc_wbuf_packer(b, &pk);
	msgpack_pack_array(&pk, 17);
	msgpack_pack_nil(&pk);
	msgpack_pack_true(&pk);
	msgpack_pack_false(&pk);
	msgpack_pack_uint64(&pk, 7);
	msgpack_pack_uint64(&pk, 300);
	msgpack_pack_uint64(&pk, 70000);
	msgpack_pack_uint64(&pk, 1ull << 40);
	msgpack_pack_int64(&pk, -5);
	msgpack_pack_int64(&pk, -40000);
	msgpack_pack_double(&pk, 2.5);
	msgpack_pack_float(&pk, 1.25f);
	mp_pack_cstr(&pk, "hello, world: a str longer than 31 bytes ...");
	msgpack_pack_bin(&pk, 3);
	msgpack_pack_bin_body(&pk, "abc", 3);
	msgpack_pack_map(&pk, 1);
	mp_pack_cstr(&pk, "k");
	msgpack_pack_array(&pk, 2);
	msgpack_pack_uint8(&pk, 1);
	msgpack_pack_uint8(&pk, 2);
	msgpack_pack_ext(&pk, 4, 1);
	msgpack_pack_ext_body(&pk, "wxyz", 4);
	msgpack_pack_array(&pk, 0);
	msgpack_pack_int64(&pk, INT64_MIN);
	cr_assert(!b->failed);
	return b->len;
}

Test(mp, every_split_point_needs_more_until_complete)
{
	struct pc_wbuf b;
	size_t len = build_all_types(&b);
	for (size_t cut = 0; cut < len; cut++) {
		size_t size = 0;
		int ret = mp_scan(b.data, cut, &lim, &size);
		cr_assert_eq(ret, MP_NEED_MORE, "cut %zu: %d", cut, ret);
		cr_assert_gt(size, cut, "need hint must exceed what is there");
		cr_assert_leq(size, len, "need hint must not overshoot");
	}
	size_t size;
	cr_assert_eq(mp_scan(b.data, len, &lim, &size), MP_COMPLETE);
	cr_assert_eq(size, len);
	/* Trailing bytes of the next message do not matter. */
	pc_wbuf_append(&b, "\x91\x01", 2);
	cr_assert_eq(mp_scan(b.data, b.len, &lim, &size), MP_COMPLETE);
	cr_assert_eq(size, len);
	pc_wbuf_free(&b);
}

/*
 * mp_scan_resume over the pieces p[0..c1), p[0..c2), p[0..len) of a
 * message, each piece in a fresh copy (a connection's buffer moves as it
 * grows): every call must give what one mp_scan of the same bytes gives.
 */
static void resume_matches(const uint8_t *msg, size_t len,
			   const struct mp_limits *l, size_t c1, size_t c2)
{
	const size_t cuts[3] = {c1, c2, len};
	struct mp_scan_state st;
	mp_scan_begin(&st);
	for (unsigned k = 0; k < 3; k++) {
		uint8_t *copy = malloc(cuts[k] ? cuts[k] : 1);
		memcpy(copy, msg, cuts[k]);
		size_t want_size = 0, size = 0;
		int want = mp_scan(copy, cuts[k], l, &want_size);
		int ret = mp_scan_resume(&st, copy, cuts[k], l, &size);
		free(copy);
		cr_assert_eq(ret, want, "pieces %zu/%zu, at %zu: %d, one scan "
			     "%d", c1, c2, cuts[k], ret, want);
		if (ret >= 0)
			cr_assert_eq(size, want_size, "pieces %zu/%zu, at %zu: "
				     "size %zu, one scan %zu", c1, c2, cuts[k],
				     size, want_size);
		if (ret != MP_NEED_MORE)
			return; /* a state is begun again after a result */
	}
}

Test(mp, a_resumed_scan_gives_what_one_scan_gives_at_every_pair_of_splits)
{
	struct pc_wbuf b;
	size_t len = build_all_types(&b);
	for (size_t c1 = 0; c1 <= len; c1++)
		for (size_t c2 = c1; c2 <= len; c2++)
			resume_matches(b.data, len, &lim, c1, c2);
	pc_wbuf_free(&b);
	/* The refusals, found in whichever piece holds them. */
	uint8_t deep[64];
	memset(deep, 0x91, sizeof(deep));
	deep[sizeof(deep) - 1] = 0x01;
	static const uint8_t bad[] = {0x93, 0x01, 0xa2, 'h', 'i', 0xc1};
	static const uint8_t a16[] = {0x92, 0x01, 0xdc, 0x03, 0xe9};
	static const uint8_t b32[] = {0x92, 0x01, 0xc6, 0x7f, 0xff, 0xff, 0xff};
	struct mp_limits few = lim;
	few.max_objects = 10;
	uint8_t arr[32] = {0x92, 0x01, 0xdc, 0x00, 20};
	const struct {
		const uint8_t *p;
		size_t len;
		const struct mp_limits *l;
		int want;
	} cases[] = {
		{deep, sizeof(deep), &lim, -ELOOP},
		{bad, sizeof(bad), &lim, -EBADMSG},
		{a16, sizeof(a16), &lim, -E2BIG},
		{b32, sizeof(b32), &lim, -EMSGSIZE},
		{arr, sizeof(arr), &few, -E2BIG},
	};
	for (unsigned i = 0; i < PC_ARRAY_LEN(cases); i++) {
		size_t size;
		cr_assert_eq(mp_scan(cases[i].p, cases[i].len, cases[i].l,
				     &size), cases[i].want, "case %u", i);
		for (size_t c1 = 0; c1 <= cases[i].len; c1++)
			for (size_t c2 = c1; c2 <= cases[i].len; c2++)
				resume_matches(cases[i].p, cases[i].len,
					       cases[i].l, c1, c2);
	}
}

/* A message of many small objects arriving a piece at a time is scanned
 * once: the bytes already scanned are not read again (here they are
 * spoiled before the next piece is given, and nothing notices). */
Test(mp, a_resumed_scan_does_not_read_what_it_scanned_before)
{
	enum { N = 5000 };
	struct pc_wbuf b;
	msgpack_packer pk;
	pc_wbuf_init(&b, 0);
	pc_wbuf_packer(&b, &pk);
	msgpack_pack_array(&pk, N);
	for (unsigned i = 0; i < N; i++)
		mp_pack_cstr(&pk, "k");
	struct mp_limits wide = lim;
	wide.max_elements = N;
	struct mp_scan_state st;
	mp_scan_begin(&st);
	size_t size, done = 0;
	for (size_t cut = 1; cut < b.len; cut += 7) {
		cr_assert_eq(mp_scan_resume(&st, b.data, cut, &wide, &size),
			     MP_NEED_MORE, "at %zu", cut);
		cr_assert_gt(size, cut);
		cr_assert_geq(st.pos + 2, cut, "at %zu the scan stands at %zu: "
			      "it did not go as far as the bytes allow", cut,
			      st.pos);
		memset(b.data + done, 0xc1, st.pos - done); /* not MessagePack */
		done = st.pos;
	}
	cr_assert_eq(mp_scan_resume(&st, b.data, b.len, &wide, &size),
		     MP_COMPLETE);
	cr_assert_eq(size, b.len);
	pc_wbuf_free(&b);
}

/* mp_scan_held keeps a state only while a message is incomplete. */
Test(mp, a_held_scan_is_allocated_for_a_partial_message_and_freed_after)
{
	struct pc_wbuf b;
	size_t len = build_all_types(&b);
	struct mp_scan_state *held = NULL;
	size_t size;
	cr_assert_eq(mp_scan_held(&held, b.data, len, &lim, &size),
		     MP_COMPLETE);
	cr_assert_null(held, "a whole message allocates nothing");
	cr_assert_eq(size, len);
	cr_assert_eq(mp_scan_held(&held, b.data, len / 2, &lim, &size),
		     MP_NEED_MORE);
	cr_assert_not_null(held);
	cr_assert_eq(mp_scan_held(&held, b.data, len - 1, &lim, &size),
		     MP_NEED_MORE);
	cr_assert_eq(mp_scan_held(&held, b.data, len, &lim, &size),
		     MP_COMPLETE);
	cr_assert_eq(size, len);
	cr_assert_null(held, "freed once the message is whole");
	static const uint8_t bad[] = {0x92, 0x01, 0xc1};
	cr_assert_eq(mp_scan_held(&held, bad, 2, &lim, &size), MP_NEED_MORE);
	cr_assert_eq(mp_scan_held(&held, bad, 3, &lim, &size), -EBADMSG);
	cr_assert_null(held, "freed at a refusal");
	pc_wbuf_free(&b);
}

Test(mp, reader_reads_every_type)
{
	struct pc_wbuf b;
	size_t len = build_all_types(&b);
	struct mp_rd r;
	mp_rd_init(&r, b.data, len);
	uint32_t n;
	bool bv;
	uint64_t u;
	int64_t i;
	double d;
	const char *s;
	const uint8_t *bin;
	uint32_t sl;
	cr_assert_eq(mp_rd_array(&r, &n), 0);
	cr_assert_eq(n, 17);
	cr_assert_eq(mp_rd_nil(&r), 0);
	cr_assert_eq(mp_rd_bool(&r, &bv), 0);
	cr_assert(bv);
	cr_assert_eq(mp_rd_bool(&r, &bv), 0);
	cr_assert(!bv);
	cr_assert_eq(mp_rd_uint(&r, &u), 0);
	cr_assert_eq(u, 7);
	cr_assert_eq(mp_rd_uint(&r, &u), 0);
	cr_assert_eq(u, 300);
	cr_assert_eq(mp_rd_uint(&r, &u), 0);
	cr_assert_eq(u, 70000);
	cr_assert_eq(mp_rd_int(&r, &i), 0);
	cr_assert_eq(i, 1ll << 40);
	cr_assert_eq(mp_rd_uint(&r, &u), -EINVAL, "negative is not uint");
	cr_assert_eq(mp_rd_int(&r, &i), 0);
	cr_assert_eq(i, -5);
	cr_assert_eq(mp_rd_int(&r, &i), 0);
	cr_assert_eq(i, -40000);
	cr_assert_eq(mp_rd_float(&r, &d), 0);
	cr_assert_eq(d, 2.5);
	cr_assert_eq(mp_rd_float(&r, &d), 0);
	cr_assert_eq(d, 1.25);
	cr_assert_eq(mp_rd_bin(&r, &bin, &sl), -EINVAL, "str is not bin");
	cr_assert_eq(mp_rd_str(&r, &s, &sl), 0);
	cr_assert(mp_str_eq(s, sl, "hello, world: a str longer than 31 bytes ..."));
	cr_assert_eq(mp_rd_bin(&r, &bin, &sl), 0);
	cr_assert_eq(sl, 3);
	cr_assert_eq(memcmp(bin, "abc", 3), 0);
	cr_assert_eq(mp_peek(&r), MP_T_MAP);
	cr_assert_eq(mp_skip(&r), 0, "skip a map with a nested array");
	cr_assert_eq(mp_peek(&r), MP_T_EXT);
	cr_assert_eq(mp_skip(&r), 0);
	cr_assert_eq(mp_rd_array(&r, &n), 0);
	cr_assert_eq(n, 0);
	cr_assert_eq(mp_rd_int(&r, &i), 0);
	cr_assert_eq(i, INT64_MIN);
	cr_assert_eq(mp_peek(&r), MP_T_END);
	cr_assert_eq(mp_rd_nil(&r), -EBADMSG);
	pc_wbuf_free(&b);
}

Test(mp, huge_declared_counts_are_refused_without_allocating)
{
	static const uint8_t a32[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
	static const uint8_t m32[] = {0xdf, 0x7f, 0xff, 0xff, 0xff};
	static const uint8_t a16[] = {0xdc, 0x03, 0xe9}; /* 1001 > 1000 */
	size_t size;
	cr_assert_eq(mp_scan(a32, sizeof(a32), &lim, &size), -E2BIG);
	cr_assert_eq(mp_scan(m32, sizeof(m32), &lim, &size), -E2BIG);
	cr_assert_eq(mp_scan(a16, sizeof(a16), &lim, &size), -E2BIG);
	/* A bin/str declaring more than the message limit fails at once. */
	static const uint8_t b32[] = {0xc6, 0x7f, 0xff, 0xff, 0xff};
	static const uint8_t s32[] = {0xdb, 0x00, 0x20, 0x00, 0x00};
	cr_assert_eq(mp_scan(b32, sizeof(b32), &lim, &size), -EMSGSIZE);
	cr_assert_eq(mp_scan(s32, sizeof(s32), &lim, &size), -EMSGSIZE);
	/* Under the element limit, but more elements than the byte limit
	 * could hold. */
	struct mp_limits tight = lim;
	tight.max_bytes = 100;
	static const uint8_t a500[] = {0xdc, 0x01, 0xf4};
	cr_assert_eq(mp_scan(a500, sizeof(a500), &tight, &size), -EMSGSIZE);
	/* The skipper copes with the same lies on unscanned input. */
	struct mp_rd r;
	mp_rd_init(&r, a32, sizeof(a32));
	cr_assert_eq(mp_skip(&r), -EBADMSG);
}

Test(mp, nesting_limit)
{
	uint8_t deep[64];
	memset(deep, 0x91, sizeof(deep)); /* [[[[...]]]] */
	deep[sizeof(deep) - 1] = 0x01;
	size_t size;
	cr_assert_eq(mp_scan(deep, 8, &lim, &size), MP_NEED_MORE);
	cr_assert_eq(mp_scan(deep, sizeof(deep), &lim, &size), -ELOOP);
	/* Exactly max_depth levels is fine. */
	uint8_t ok[9];
	memset(ok, 0x91, 8);
	ok[8] = 0x01;
	cr_assert_eq(mp_scan(ok, sizeof(ok), &lim, &size), MP_COMPLETE);
	cr_assert_eq(size, sizeof(ok));
}

Test(mp, invalid_byte_and_total_object_limit)
{
	static const uint8_t bad[] = {0x92, 0x01, 0xc1};
	size_t size;
	cr_assert_eq(mp_scan(bad, sizeof(bad), &lim, &size), -EBADMSG);
	struct mp_limits few = lim;
	few.max_objects = 10;
	uint8_t arr[32] = {0xdc, 0x00, 20};
	cr_assert_eq(mp_scan(arr, sizeof(arr), &few, &size), -E2BIG);
}

Test(mp, wbuf_limit_fails_the_packer)
{
	struct pc_wbuf b;
	msgpack_packer pk;
	pc_wbuf_init(&b, 16);
	pc_wbuf_packer(&b, &pk);
	mp_pack_cstr(&pk, "this is longer than sixteen bytes");
	cr_assert(b.failed);
	pc_wbuf_free(&b);
}
