/*
 * tests/unit/test_pool_scan.c — pool_scan(), the sliced walk over live
 * entries that re-publishing after a membership change relies on
 * (storage/pool.h, issue 11 item 6).
 *
 * Owns: the walk's contract: every live entry reported exactly once when
 * nothing changes, with its key, generation, header address and length as
 * pool_commit gave them; at most `max` records examined per call; deleted
 * and reserved (uncommitted) entries never reported; a finished walk says
 * so. Each test runs in its own process.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "storage/pool.h"

#define ENTRIES 300u

struct seen {
	unsigned count[ENTRIES];
	uint64_t gen[ENTRIES];
	uintptr_t addr[ENTRIES];
	unsigned calls;
	unsigned other; /* keys not of this test */
};

static struct pool *pool_make(unsigned stripes)
{
	struct pool *p = NULL;
	struct pool_opts o = {.size = 64u << 20, .max_page_bytes = 1u << 20,
			      .stripes = stripes};

	cr_assert_eq(pool_new(&p, &o), 0);
	return p;
}

static void put(struct pool *p, unsigned i, uint64_t *gen, uintptr_t *addr)
{
	char key[32];
	struct pool_ref ref;
	uint8_t *dst;
	int len = snprintf(key, sizeof(key), "scan-%u", i);

	cr_assert_eq(pool_reserve(p, key, (size_t)len, 1000 + i, &ref, &dst),
		     0);
	memset(dst, (int)i, 1000 + i);
	cr_assert_eq(pool_commit(p, &ref, true, gen, addr), 0);
}

static void note(void *arg, const struct pool_entry_info *e)
{
	struct seen *s = arg;
	char key[32];
	unsigned i;

	s->calls++;
	cr_assert(e->keylen < sizeof(key));
	memcpy(key, e->key, e->keylen);
	key[e->keylen] = '\0';
	if (sscanf(key, "scan-%u", &i) != 1 || i >= ENTRIES) {
		s->other++;
		return;
	}
	s->count[i]++;
	s->gen[i] = e->gen;
	s->addr[i] = e->addr;
	cr_assert_eq(e->len, 1000 + i);
}

static unsigned walk(struct pool *p, unsigned max, struct seen *s)
{
	uint64_t cursor = 0;
	unsigned steps = 0;

	for (;;) {
		unsigned before = s->calls;
		int more = pool_scan(p, &cursor, max, note, s);

		cr_assert_leq(s->calls - before, max);
		steps++;
		cr_assert_lt(steps, 100000u, "the walk does not end");
		if (!more)
			return steps;
	}
}

Test(pool_scan, every_live_entry_once_in_slices)
{
	struct pool *p = pool_make(4);
	static struct seen s;
	uint64_t gen[ENTRIES];
	uintptr_t addr[ENTRIES];

	for (unsigned i = 0; i < ENTRIES; i++)
		put(p, i, &gen[i], &addr[i]);
	unsigned steps = walk(p, 7, &s);
	cr_assert_geq(steps, ENTRIES / 7, "slices were not bounded");
	cr_assert_eq(s.other, 0u);
	for (unsigned i = 0; i < ENTRIES; i++) {
		cr_assert_eq(s.count[i], 1u, "entry %u seen %u times", i,
			     s.count[i]);
		cr_assert_eq(s.gen[i], gen[i]);
		cr_assert_eq(s.addr[i], addr[i]);
	}
	pool_free(p);
}

Test(pool_scan, deleted_replaced_and_reserved_entries)
{
	struct pool *p = pool_make(2);
	static struct seen s;
	uint64_t gen[ENTRIES], newer;
	uintptr_t addr[ENTRIES], naddr;
	struct pool_ref ref;
	uint8_t *dst;

	for (unsigned i = 0; i < 50; i++)
		put(p, i, &gen[i], &addr[i]);
	cr_assert_eq(pool_delete(p, "scan-3", 6), 0);
	put(p, 4, &newer, &naddr); /* replaced: only the newer is live */
	cr_assert_eq(pool_reserve(p, "scan-60", 7, 100, &ref, &dst), 0);
	walk(p, 1000, &s);
	cr_assert_eq(s.count[3], 0u, "a deleted entry was reported");
	cr_assert_eq(s.count[4], 1u);
	cr_assert_eq(s.gen[4], newer);
	cr_assert_eq(s.count[60], 0u, "a reserved entry was reported");
	for (unsigned i = 5; i < 50; i++)
		cr_assert_eq(s.count[i], 1u);
	pool_abort(p, &ref);
	pool_free(p);
}

Test(pool_scan, empty_pool_ends_at_once)
{
	struct pool *p = pool_make(0);
	static struct seen s;

	walk(p, 16, &s);
	cr_assert_eq(s.calls, 0u);
	pool_free(p);
}
