/*
 * tests/unit/test_ring.c — unit tests for storage/ring.c.
 *
 * Owns: an independent reference ring written from the convention in
 * ring.h (snprintf "%s#%u", XXH3_64bits, sort, linear walk), and the
 * properties the rest of PeerCache relies on: every node builds the same
 * ring whatever the input order, load is balanced, a membership change moves
 * only the keys it must, and owners() lists distinct members in a stable
 * order. Every test is self-contained; Criterion runs each in its own
 * process. Measured figures (balance ratios, movement fractions, bytes per
 * vnode) are printed to stderr with a "ring:" prefix so they can be quoted.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "storage/ring.h"

/* Key sets: "key-<i>" for i in [0, n). */
#define KEYS_BALANCE 1000000u
#define KEYS_MOVE 1000000u
#define KEYS_OWNERS 100000u
#define NODES_MAX 128u

/* Member ids shaped like the real thing: RPC endpoints. */
struct ids {
	char buf[NODES_MAX][32];
	const char *ptr[NODES_MAX];
	unsigned n;
};

static void ids_make(struct ids *ids, unsigned n)
{
	cr_assert(n <= NODES_MAX);
	ids->n = n;
	for (unsigned i = 0; i < n; i++) {
		snprintf(ids->buf[i], sizeof(ids->buf[i]), "10.0.%u.%u:31999",
			 i / 250, i % 250 + 1);
		ids->ptr[i] = ids->buf[i];
	}
}

static size_t key_make(char *buf, size_t cap, unsigned i)
{
	int len = snprintf(buf, cap, "key-%u", i);

	cr_assert(len > 0 && (size_t)len < cap);
	return (size_t)len;
}

static struct ring *build_ok(const char *const *members, unsigned n,
			     unsigned vnodes)
{
	struct ring *r = NULL;
	int rc = ring_build(&r, members, n, vnodes);

	cr_assert_eq(rc, 0, "ring_build(%u members, %u vnodes) = %d", n,
		     vnodes, rc);
	cr_assert_not_null(r);
	return r;
}

static unsigned primary(const struct ring *r, unsigned i)
{
	char key[32];
	size_t len = key_make(key, sizeof(key), i);
	unsigned m;

	cr_assert_eq(ring_owners(r, key, len, 1, &m), 1u);
	return m;
}

/* ---- reference ring, straight from the convention in ring.h ---- */

struct ref_point {
	uint64_t point;
	const char *id;
};

static int ref_cmp(const void *a, const void *b)
{
	const struct ref_point *pa = a, *pb = b;

	if (pa->point != pb->point)
		return pa->point < pb->point ? -1 : 1;
	return strcmp(pa->id, pb->id);
}

static struct ref_point *ref_build(const char *const *members, unsigned n,
				   unsigned vnodes)
{
	struct ref_point *p = calloc((size_t)n * vnodes, sizeof(*p));

	cr_assert_not_null(p);
	for (unsigned m = 0; m < n; m++) {
		for (unsigned i = 0; i < vnodes; i++) {
			char s[300];
			int len = snprintf(s, sizeof(s), "%s#%u", members[m],
					   i);

			p[m * vnodes + i].point = XXH3_64bits(s, (size_t)len);
			p[m * vnodes + i].id = members[m];
		}
	}
	qsort(p, (size_t)n * vnodes, sizeof(*p), ref_cmp);
	return p;
}

/* First `want` distinct ids clockwise from key point kp, by linear scan. */
static unsigned ref_owners(const struct ref_point *p, unsigned np,
			   uint64_t kp, unsigned want, const char **out)
{
	unsigned start = 0, got = 0;

	while (start < np && p[start].point < kp)
		start++;
	for (unsigned s = 0; s < np && got < want; s++) {
		const char *id = p[(start + s) % np].id;
		unsigned j;

		for (j = 0; j < got && strcmp(out[j], id) != 0; j++)
			;
		if (j == got)
			out[got++] = id;
	}
	return got;
}

/* ---- the convention ---- */

Test(ring, key_point_is_xxh3_seed0)
{
	/* XXH3_64bits of the empty input, seed 0, as published by xxHash. */
	cr_assert_eq(ring_key_point("", 0), 0x2D06800538D394C2ull);
	cr_assert_eq(ring_key_point("key-1", 5), XXH3_64bits("key-1", 5));
}

Test(ring, matches_reference_built_from_the_convention)
{
	struct ids ids;
	const unsigned vnodes = 7, np = 5 * 7;
	struct ring *r;
	struct ref_point *ref;

	ids_make(&ids, 5);
	r = build_ok(ids.ptr, 5, vnodes);
	ref = ref_build(ids.ptr, 5, vnodes);
	for (unsigned i = 0; i < 20000; i++) {
		char key[32];
		size_t len = key_make(key, sizeof(key), i);
		unsigned got[5];
		const char *want[5];
		unsigned n = ring_owners(r, key, len, 5, got);

		cr_assert_eq(n, 5u);
		cr_assert_eq(ref_owners(ref, np, XXH3_64bits(key, len), 5,
					want), 5u);
		for (unsigned j = 0; j < 5; j++)
			cr_assert_str_eq(ring_member(r, got[j]), want[j],
					 "key %s owner %u", key, j);
	}
	/* A key point past the last vnode wraps to the smallest one. */
	{
		unsigned m;

		cr_assert_eq(ring_owners_at(r, UINT64_MAX, 1, &m), 1u);
		if (ref[np - 1].point != UINT64_MAX)
			cr_assert_str_eq(ring_member(r, m), ref[0].id);
		cr_assert_eq(ring_owners_at(r, 0, 1, &m), 1u);
		cr_assert_str_eq(ring_member(r, m), ref[0].id);
		cr_assert_eq(ring_owners_at(r, ref[3].point, 1, &m), 1u);
		cr_assert_str_eq(ring_member(r, m), ref[3].id);
		cr_assert_eq(ring_owners_at(r, ref[3].point + 1, 1, &m), 1u);
		cr_assert_str_eq(ring_member(r, m), ref[4].id);
	}
	free(ref);
	ring_free(r);
}

/* ---- determinism ---- */

Test(ring, same_members_any_order_same_owners)
{
	struct ids ids;
	const char *shuffled[NODES_MAX];
	struct ring *a, *b;
	uint64_t s = 0x9E3779B97F4A7C15ull;

	ids_make(&ids, 20);
	memcpy(shuffled, ids.ptr, sizeof(ids.ptr[0]) * 20);
	for (unsigned i = 19; i > 0; i--) { /* fixed-seed Fisher-Yates */
		unsigned j;
		const char *t;

		s ^= s << 13, s ^= s >> 7, s ^= s << 17;
		j = (unsigned)(s % (i + 1));
		t = shuffled[i], shuffled[i] = shuffled[j], shuffled[j] = t;
	}
	cr_assert(memcmp(shuffled, ids.ptr, sizeof(ids.ptr[0]) * 20) != 0);
	a = build_ok(ids.ptr, 20, RING_VNODES_DEFAULT);
	b = build_ok(shuffled, 20, RING_VNODES_DEFAULT);
	for (unsigned i = 0; i < KEYS_OWNERS; i++) {
		char key[32];
		size_t len = key_make(key, sizeof(key), i);
		unsigned oa[3], ob[3];

		cr_assert_eq(ring_owners(a, key, len, 3, oa), 3u);
		cr_assert_eq(ring_owners(b, key, len, 3, ob), 3u);
		for (unsigned j = 0; j < 3; j++)
			cr_assert_str_eq(ring_member(a, oa[j]),
					 ring_member(b, ob[j]), "key %s", key);
	}
	ring_free(a);
	ring_free(b);
}

/* ---- balance ---- */

static double balance_ratio(unsigned n)
{
	struct ids ids;
	struct ring *r;
	unsigned load[NODES_MAX] = {0}, max = 0;
	double mean = (double)KEYS_BALANCE / n;

	ids_make(&ids, n);
	r = build_ok(ids.ptr, n, RING_VNODES_DEFAULT);
	for (unsigned i = 0; i < KEYS_BALANCE; i++)
		load[primary(r, i)]++;
	for (unsigned m = 0; m < n; m++)
		max = load[m] > max ? load[m] : max;
	ring_free(r);
	fprintf(stderr, "ring: balance %u members x %u vnodes, %u keys: "
		"max/mean %.3f\n", n, RING_VNODES_DEFAULT, KEYS_BALANCE,
		max / mean);
	return max / mean;
}

/*
 * Bounds: with v vnodes a member's share of the ring has a relative spread
 * of about 1/sqrt(v) (8% at 160), and the maximum over n members sits a few
 * spreads above the mean, more so as n grows. These ids and keys measure
 * 3 -> 1.051, 10 -> 1.148, 100 -> 1.228 (deterministic: same ids, same
 * keys). Over 300 other id sets (other subnets and ports, 200k keys each)
 * the worst seen was 1.26 / 1.27 / 1.37 (p99 1.17 / 1.23 / 1.35), so the
 * bounds below survive a change of id scheme, yet a broken spread fails
 * them: 16 vnodes gives medians of 1.20 / 1.39 / 1.72 and 1 vnode 1.8 /
 * 2.7 / 5.2.
 */
Test(ring, balance_3_members)
{
	cr_assert_lt(balance_ratio(3), 1.30);
}

Test(ring, balance_10_members)
{
	cr_assert_lt(balance_ratio(10), 1.35);
}

Test(ring, balance_100_members)
{
	cr_assert_lt(balance_ratio(100), 1.50);
}

/* ---- movement on membership change ---- */

/*
 * Primary owners of KEYS_MOVE keys before and after a change where `big`
 * has exactly one member (`extra`) more than `small`. A key may move only
 * between `extra` and the others, never between two others; returns the
 * fraction that moved.
 */
static double moved_fraction(const struct ring *small, const struct ring *big,
			     const char *extra)
{
	unsigned moved = 0;

	for (unsigned i = 0; i < KEYS_MOVE; i++) {
		const char *a = ring_member(small, primary(small, i));
		const char *b = ring_member(big, primary(big, i));

		if (strcmp(a, b) == 0)
			continue;
		moved++;
		cr_assert_str_eq(b, extra, "key-%u moved %s -> %s", i, a, b);
	}
	return (double)moved / KEYS_MOVE;
}

/*
 * owners(key, 3) across the same change: with `extra` taken out of the big
 * ring's list, what remains is a prefix of the small ring's list — the
 * other members keep their relative order, and nobody else is promoted.
 */
static void check_owner_lists(const struct ring *small, const struct ring *big,
			      const char *extra)
{
	for (unsigned i = 0; i < KEYS_OWNERS; i++) {
		char key[32];
		size_t len = key_make(key, sizeof(key), i);
		unsigned os[3], ob[3], ns, nb, k = 0;

		ns = ring_owners(small, key, len, 3, os);
		nb = ring_owners(big, key, len, 3, ob);
		for (unsigned j = 0; j < nb; j++) {
			const char *id = ring_member(big, ob[j]);

			if (strcmp(id, extra) == 0)
				continue;
			cr_assert_lt(k, ns);
			cr_assert_str_eq(id, ring_member(small, os[k]),
					 "key %s position %u", key, j);
			k++;
		}
		cr_assert_geq(k + 1, nb, "key %s", key);
	}
}

/* Grow n -> n+1 (then read the same pair backwards as a removal of the
 * newest member). Expected movement is the new member's share, about
 * 1/(n+1); the bound allows the +-1/sqrt(160) spread several times over. */
static void check_add(unsigned n)
{
	struct ids ids;
	struct ring *small, *big;
	double f, expect = 1.0 / (n + 1);

	ids_make(&ids, n + 1);
	small = build_ok(ids.ptr, n, RING_VNODES_DEFAULT);
	big = build_ok(ids.ptr, n + 1, RING_VNODES_DEFAULT);
	f = moved_fraction(small, big, ids.ptr[n]);
	fprintf(stderr, "ring: add %u -> %u members: %.4f of keys moved "
		"(ideal %.4f), all to the new member\n", n, n + 1, f, expect);
	cr_assert(f > expect * 0.6 && f < expect * 1.4, "moved %.4f", f);
	check_owner_lists(small, big, ids.ptr[n]);
	ring_free(small);
	ring_free(big);
}

Test(ring, add_3_to_4_moves_only_to_new_member)
{
	check_add(3);
}

Test(ring, add_10_to_11_moves_only_to_new_member)
{
	check_add(10);
}

/* Shrink 100 -> 99 by removing a member from the middle of the list: keys
 * move only off the removed member, and all of its keys move. */
Test(ring, remove_100_to_99_moves_only_removed_keys)
{
	struct ids ids;
	const char *rest[NODES_MAX];
	const unsigned gone = 42;
	struct ring *before, *after;
	double f;

	ids_make(&ids, 100);
	for (unsigned i = 0, k = 0; i < 100; i++)
		if (i != gone)
			rest[k++] = ids.ptr[i];
	before = build_ok(ids.ptr, 100, RING_VNODES_DEFAULT);
	after = build_ok(rest, 99, RING_VNODES_DEFAULT);
	cr_assert_eq(ring_find(after, ids.ptr[gone]), -ENOENT);
	f = moved_fraction(after, before, ids.ptr[gone]);
	fprintf(stderr, "ring: remove 100 -> 99 members: %.4f of keys moved "
		"(ideal %.4f), all off the removed member\n", f, 1.0 / 100);
	cr_assert(f > 0.01 * 0.6 && f < 0.01 * 1.4, "moved %.4f", f);
	/* Every key the removed member owned must have moved. */
	for (unsigned i = 0; i < KEYS_MOVE; i++) {
		const char *now;

		if (primary(before, i) != gone)
			continue;
		now = ring_member(after, primary(after, i));
		cr_assert_str_neq(now, ids.ptr[gone]);
	}
	check_owner_lists(after, before, ids.ptr[gone]);
	ring_free(before);
	ring_free(after);
}

Test(ring, remove_4_to_3_moves_only_removed_keys)
{
	struct ids ids;
	const char *rest[3];
	struct ring *before, *after;
	double f;

	ids_make(&ids, 4);
	rest[0] = ids.ptr[0], rest[1] = ids.ptr[2], rest[2] = ids.ptr[3];
	before = build_ok(ids.ptr, 4, RING_VNODES_DEFAULT);
	after = build_ok(rest, 3, RING_VNODES_DEFAULT);
	f = moved_fraction(after, before, ids.ptr[1]);
	fprintf(stderr, "ring: remove 4 -> 3 members: %.4f of keys moved "
		"(ideal %.4f)\n", f, 0.25);
	cr_assert(f > 0.25 * 0.6 && f < 0.25 * 1.4, "moved %.4f", f);
	check_owner_lists(after, before, ids.ptr[1]);
	ring_free(before);
	ring_free(after);
}

/* ---- owners(key, n) ---- */

Test(ring, owners_distinct_capped_primary_first)
{
	struct ids ids;
	struct ring *r;

	ids_make(&ids, 100);
	r = build_ok(ids.ptr, 100, RING_VNODES_DEFAULT);
	for (unsigned i = 0; i < 2000; i++) {
		char key[32];
		size_t len = key_make(key, sizeof(key), i);
		unsigned all[100], few[3], first;
		unsigned char seen[100] = {0};

		/* n = 100 takes the bitmap path; n = 3 the linear one. */
		cr_assert_eq(ring_owners(r, key, len, 1000, all), 100u);
		cr_assert_eq(ring_owners(r, key, len, 3, few), 3u);
		cr_assert_eq(ring_owners(r, key, len, 1, &first), 1u);
		cr_assert_eq(ring_owners(r, key, len, 0, &first), 0u);
		for (unsigned j = 0; j < 100; j++) {
			cr_assert_lt(all[j], 100u);
			cr_assert_eq(seen[all[j]], 0, "repeat in owners");
			seen[all[j]] = 1;
		}
		cr_assert_eq(all[0], primary(r, i));
		cr_assert_eq(few[0], all[0]);
		cr_assert_eq(few[1], all[1]);
		cr_assert_eq(few[2], all[2]);
	}
	ring_free(r);
}

Test(ring, owners_at_matches_owners)
{
	struct ids ids;
	struct ring *r;

	ids_make(&ids, 10);
	r = build_ok(ids.ptr, 10, RING_VNODES_DEFAULT);
	for (unsigned i = 0; i < 1000; i++) {
		char key[32];
		size_t len = key_make(key, sizeof(key), i);
		unsigned a[4], b[4];

		cr_assert_eq(ring_owners(r, key, len, 4, a), 4u);
		cr_assert_eq(ring_owners_at(r, ring_key_point(key, len), 4, b),
			     4u);
		cr_assert_arr_eq(a, b, sizeof(a));
	}
	ring_free(r);
}

/* ---- members and lookups ---- */

Test(ring, find_and_member)
{
	struct ids ids;
	struct ring *r;

	ids_make(&ids, 50);
	r = build_ok(ids.ptr, 50, 16);
	cr_assert_eq(ring_size(r), 50u);
	cr_assert_eq(ring_vnodes(r), 16u);
	for (unsigned i = 0; i < 50; i++) {
		cr_assert_eq(ring_find(r, ids.ptr[i]), (int)i);
		cr_assert_str_eq(ring_member(r, i), ids.ptr[i]);
		cr_assert_neq(ring_member(r, i), ids.ptr[i], "id not copied");
	}
	cr_assert_eq(ring_find(r, "10.0.9.9:31999"), -ENOENT);
	cr_assert_eq(ring_find(r, ""), -ENOENT);
	cr_assert_eq(ring_find(r, NULL), -ENOENT);
	cr_assert_null(ring_member(r, 50));
	ring_free(r);
}

Test(ring, memory_per_vnode)
{
	struct ids ids;
	struct ring *r;
	size_t bytes, points = 100u * RING_VNODES_DEFAULT;

	ids_make(&ids, 100);
	r = build_ok(ids.ptr, 100, RING_VNODES_DEFAULT);
	bytes = ring_bytes(r);
	cr_assert_eq(RING_BYTES_PER_VNODE, 10u);
	cr_assert_geq(bytes, points * RING_BYTES_PER_VNODE);
	/* Ids and per-member bookkeeping stay small next to the points. */
	cr_assert_lt(bytes, points * RING_BYTES_PER_VNODE + 100u * 300u);
	fprintf(stderr, "ring: 100 members x %u vnodes: %zu bytes (%.2f per "
		"vnode incl. ids; %zu per vnode for points)\n",
		RING_VNODES_DEFAULT, bytes, (double)bytes / points,
		(size_t)RING_BYTES_PER_VNODE);
	ring_free(r);
}

/* ---- edge cases ---- */

Test(ring, empty_ring)
{
	struct ring *r = build_ok(NULL, 0, RING_VNODES_DEFAULT);
	unsigned out[1] = {77};

	cr_assert_eq(ring_size(r), 0u);
	cr_assert_eq(ring_owners(r, "k", 1, 3, out), 0u);
	cr_assert_eq(ring_owners_at(r, 0, 1, out), 0u);
	cr_assert_eq(out[0], 77u, "empty ring wrote to out");
	cr_assert_eq(ring_find(r, "a"), -ENOENT);
	cr_assert_null(ring_member(r, 0));
	ring_free(r);
	ring_free(NULL);
}

Test(ring, one_member_owns_everything)
{
	const char *m[] = {"127.0.0.1:31999"};
	struct ring *r = build_ok(m, 1, RING_VNODES_DEFAULT);

	for (unsigned i = 0; i < 1000; i++) {
		char key[32];
		size_t len = key_make(key, sizeof(key), i);
		unsigned out[3] = {9, 9, 9};

		cr_assert_eq(ring_owners(r, key, len, 3, out), 1u);
		cr_assert_eq(out[0], 0u);
		cr_assert_eq(out[1], 9u, "wrote past the member count");
	}
	ring_free(r);
}

Test(ring, one_vnode_per_member)
{
	const char *m[] = {"a:1", "b:1", "c:1"};
	struct ring *r = build_ok(m, 3, 1);
	struct ref_point *ref = ref_build(m, 3, 1);

	for (unsigned i = 0; i < 5000; i++) {
		char key[32];
		size_t len = key_make(key, sizeof(key), i);
		unsigned got[3];
		const char *want[3];

		cr_assert_eq(ring_owners(r, key, len, 3, got), 3u);
		ref_owners(ref, 3, XXH3_64bits(key, len), 3, want);
		for (unsigned j = 0; j < 3; j++)
			cr_assert_str_eq(ring_member(r, got[j]), want[j]);
	}
	free(ref);
	ring_free(r);
}

Test(ring, rejects_bad_members)
{
	struct ring *r = (struct ring *)0x1; /* must stay untouched */
	char long_id[RING_ID_BYTES_MAX + 2];
	const char *dup[] = {"a:1", "b:1", "a:1"};
	const char *has_null[] = {"a:1", NULL};
	const char *has_empty[] = {"a:1", ""};
	const char *too_long[] = {"a:1", long_id};
	const char *at_limit[] = {"a:1", long_id};
	struct ring *ok;

	cr_assert_eq(ring_build(&r, dup, 3, 16), -EINVAL);
	cr_assert_eq(ring_build(&r, has_null, 2, 16), -EINVAL);
	cr_assert_eq(ring_build(&r, has_empty, 2, 16), -EINVAL);
	cr_assert_eq(ring_build(&r, NULL, 2, 16), -EINVAL);
	cr_assert_eq(ring_build(NULL, dup, 2, 16), -EINVAL);

	memset(long_id, 'x', RING_ID_BYTES_MAX + 1);
	long_id[RING_ID_BYTES_MAX + 1] = '\0'; /* 256 bytes */
	cr_assert_eq(ring_build(&r, too_long, 2, 16), -EINVAL);
	cr_assert_eq(r, (struct ring *)0x1);

	long_id[RING_ID_BYTES_MAX] = '\0'; /* 255 bytes: the limit */
	cr_assert_eq(ring_build(&ok, at_limit, 2, 16), 0);
	cr_assert_eq(ring_find(ok, long_id), 1);
	ring_free(ok);
}

Test(ring, vnode_and_size_bounds)
{
	static char buf[RING_MEMBERS_MAX + 1][16];
	static const char *many[RING_MEMBERS_MAX + 1];
	const char *two[] = {"a:1", "b:1"};
	struct ring *r;

	cr_assert_eq(ring_build(&r, two, 2, 0), -EINVAL);
	cr_assert_eq(ring_build(&r, two, 2, RING_VNODES_MAX + 1), -EINVAL);
	cr_assert_eq(ring_build(&r, two, 2, UINT32_MAX), -EINVAL);

	/* The largest vnode count builds and still answers correctly. */
	r = build_ok(two, 2, RING_VNODES_MAX);
	cr_assert_eq(ring_bytes(r) >= 2u * RING_VNODES_MAX * 10u, 1);
	for (unsigned i = 0; i < 100; i++) {
		unsigned out[2];
		char key[32];
		size_t len = key_make(key, sizeof(key), i);

		cr_assert_eq(ring_owners(r, key, len, 2, out), 2u);
		cr_assert_neq(out[0], out[1]);
	}
	ring_free(r);

	for (unsigned i = 0; i <= RING_MEMBERS_MAX; i++) {
		snprintf(buf[i], sizeof(buf[i]), "n%u:1", i);
		many[i] = buf[i];
	}
	/* Too many members, and too many points in total, are refused before
	 * anything is allocated. */
	cr_assert_eq(ring_build(&r, many, RING_MEMBERS_MAX + 1, 1), -EINVAL);
	cr_assert_eq(ring_build(&r, many, RING_MEMBERS_MAX,
				RING_POINTS_MAX / RING_MEMBERS_MAX + 1),
		     -E2BIG);
	cr_assert_eq(ring_build(&r, many, RING_MEMBERS_MAX, RING_VNODES_MAX),
		     -E2BIG);
	/* The most members at a modest vnode count is fine. */
	r = build_ok(many, RING_MEMBERS_MAX, 8);
	cr_assert_eq(ring_size(r), RING_MEMBERS_MAX);
	cr_assert_eq(ring_find(r, "n4095:1"), 4095);
	{
		static unsigned out[RING_MEMBERS_MAX];
		cr_assert_eq(ring_owners(r, "k", 1, RING_MEMBERS_MAX + 5, out),
			     RING_MEMBERS_MAX);
	}
	ring_free(r);
}

/* Is id among the first n owners of key under r? */
static bool owns(const struct ring *r, const char *key, size_t len, unsigned n,
		 const char *id)
{
	unsigned o[8], k = ring_owners(r, key, len, n, o);

	for (unsigned i = 0; i < k; i++)
		if (strcmp(ring_member(r, o[i]), id) == 0)
			return true;
	return false;
}

/*
 * ring_owner_moves against the set definition, member by member: 3 -> 4 (a
 * join), 4 -> 3 (a leave) and {3, 4} -> 4 minus another (a change during a
 * move). Also: a join moves about replicas/(n+1) of the keys' records and
 * gives every moved key exactly the new member.
 */
Test(ring, owner_moves_match_the_set_definition)
{
	struct ids ids;
	const char *three_b[3];
	struct ring *r3, *r4, *r3b;
	const unsigned n = 2, keys = 4000;
	unsigned join_gained = 0, join_lost = 0;

	ids_make(&ids, 4);
	r3 = build_ok(ids.ptr, 3, RING_VNODES_DEFAULT);
	r4 = build_ok(ids.ptr, 4, RING_VNODES_DEFAULT);
	three_b[0] = ids.ptr[0];
	three_b[1] = ids.ptr[2];
	three_b[2] = ids.ptr[3];
	r3b = build_ok(three_b, 3, RING_VNODES_DEFAULT);
	struct {
		struct ring *to;
		struct ring *from[2];
		unsigned nfrom;
	} cases[] = {
		{r4, {r3}, 1}, {r3, {r4}, 1}, {r3b, {r3, r4}, 2}, {r4, {r4}, 1},
	};
	for (unsigned c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		for (unsigned i = 0; i < keys; i++) {
			char key[32];
			size_t len = key_make(key, sizeof(key), i);
			unsigned g[8], l[8], ng, nl, all;
			struct ring *to = cases[c].to;

			all = ring_owner_moves(to, cases[c].from,
					       cases[c].nfrom,
					       ring_key_point(key, len), n, g,
					       &ng, l, &nl, 8);
			cr_assert_eq(all, nl);
			for (unsigned m = 0; m < ring_size(to); m++) {
				const char *id = ring_member(to, m);
				bool now = owns(to, key, len, n, id);
				bool every = true, some = false;
				bool in_g = false, in_l = false;

				for (unsigned f = 0; f < cases[c].nfrom; f++) {
					bool had = owns(cases[c].from[f], key,
							len, n, id);
					every = every && had;
					some = some || had;
				}
				for (unsigned x = 0; x < ng; x++)
					in_g |= g[x] == m;
				for (unsigned x = 0; x < nl; x++)
					in_l |= l[x] == m;
				cr_assert_eq(in_g, now && !every,
					     "case %u key %s member %s", c,
					     key, id);
				cr_assert_eq(in_l, !now && some,
					     "case %u key %s member %s", c,
					     key, id);
			}
			if (c == 0) {
				join_gained += ng;
				join_lost += nl;
				for (unsigned x = 0; x < ng; x++)
					cr_assert_str_eq(ring_member(to, g[x]),
							 ids.ptr[3]);
			}
			if (c == 3)
				cr_assert(ng == 0 && nl == 0);
		}
	}
	/* a join gives the new member about n/(N+1) of the records and takes
	 * as many from the old owners */
	double share = (double)join_gained / keys, ideal = (double)n / 4;
	fprintf(stderr, "ring: join 3 -> 4, %u replicas: %.4f records per "
		"key gained (ideal %.4f), %.4f lost\n", n, share, ideal,
		(double)join_lost / keys);
	cr_assert(share > ideal * 0.6 && share < ideal * 1.4, "%.4f", share);
	cr_assert_eq(join_gained, join_lost);
	ring_free(r3);
	ring_free(r4);
	ring_free(r3b);
}
