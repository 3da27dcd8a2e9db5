/*
 * tests/unit/test_ring_epoch.c — ring epochs and reference counts
 * (storage/ring.h, issue 11 item 6).
 *
 * Owns: the lifetime contract membership changes rely on: a ring carries
 * the epoch it was built with and never changes placement because of it;
 * references taken and dropped from many threads at once balance, the
 * last drop frees (the sanitizer build reports a leak or a use after free
 * otherwise); a reader holding a reference keeps using a ring after the
 * publisher dropped its own. Each test runs in its own process.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "storage/ring.h"

static const char *const three[] = {"10.0.0.1:31999", "10.0.0.2:31999",
				    "10.0.0.3:31999"};
static const char *const four[] = {"10.0.0.1:31999", "10.0.0.2:31999",
				   "10.0.0.3:31999", "10.0.0.4:31999"};

Test(ring_epoch, build_sets_epoch_not_placement)
{
	struct ring *a, *b, *c;

	cr_assert_eq(ring_build(&a, three, 3, 64), 0);
	cr_assert_eq(ring_build_epoch(&b, three, 3, 64, 7), 0);
	cr_assert_eq(ring_build_epoch(&c, four, 4, 64, UINT64_MAX), 0);
	cr_assert_eq(ring_epoch(a), 0);
	cr_assert_eq(ring_epoch(b), 7);
	cr_assert_eq(ring_epoch(c), UINT64_MAX);
	for (unsigned i = 0; i < 2000; i++) {
		char key[32];
		unsigned oa[2], ob[2];
		int len = snprintf(key, sizeof(key), "k-%u", i);

		cr_assert_eq(ring_owners(a, key, (size_t)len, 2, oa), 2u);
		cr_assert_eq(ring_owners(b, key, (size_t)len, 2, ob), 2u);
		cr_assert_arr_eq(oa, ob, sizeof(oa), "the epoch moved %s", key);
		cr_assert_neq(oa[0], oa[1]);
	}
	ring_free(a);
	ring_free(b);
	ring_free(c);
}

Test(ring_epoch, bad_arguments_leave_out_untouched)
{
	struct ring *r = (struct ring *)(uintptr_t)0x1;

	cr_assert_eq(ring_build_epoch(&r, three, 3, 0, 5), -EINVAL);
	cr_assert_eq((uintptr_t)r, 0x1u);
	cr_assert_eq(ring_build_epoch(NULL, three, 3, 16, 5), -EINVAL);
}

Test(ring_epoch, refs_count_and_last_drop_frees)
{
	struct ring *r;

	cr_assert_eq(ring_build_epoch(&r, three, 3, 16, 1), 0);
	cr_assert_eq(ring_refs(r), 1u);
	cr_assert_eq(ring_ref(r), r);
	cr_assert_eq(ring_ref(r), r);
	cr_assert_eq(ring_refs(r), 3u);
	ring_unref(r);
	ring_unref(r);
	cr_assert_eq(ring_refs(r), 1u);
	ring_unref(NULL);
	ring_free(r); /* the last one: the sanitizer build checks the free */
}

/* A reader that took a reference keeps a usable ring after the publisher
 * replaced it and dropped its own reference. */
Test(ring_epoch, reader_outlives_publisher)
{
	struct ring *cur, *next, *held;
	unsigned before[2], after[2];

	cr_assert_eq(ring_build_epoch(&cur, three, 3, 32, 1), 0);
	held = ring_ref(cur);
	cr_assert_eq(ring_owners(held, "page", 4, 2, before), 2u);
	cr_assert_eq(ring_build_epoch(&next, four, 4, 32, ring_epoch(cur) + 1),
		     0);
	ring_unref(cur); /* the publisher swapped and retired it */
	cur = next;
	cr_assert_eq(ring_refs(held), 1u);
	cr_assert_eq(ring_epoch(held), 1u);
	cr_assert_eq(ring_epoch(cur), 2u);
	cr_assert_eq(ring_owners(held, "page", 4, 2, after), 2u);
	cr_assert_arr_eq(before, after, sizeof(before));
	cr_assert_str_eq(ring_member(held, before[0]), three[before[0]]);
	ring_unref(held);
	ring_free(cur);
}

#define THREADS 4
#define ROUNDS 200000

static void *ref_storm(void *arg)
{
	struct ring *r = arg;

	for (unsigned i = 0; i < ROUNDS; i++) {
		struct ring *mine = ring_ref(r);
		unsigned o[1];

		ring_owners(mine, &i, sizeof(i), 1, o);
		ring_unref(mine);
	}
	return NULL;
}

Test(ring_epoch, refs_balance_across_threads)
{
	pthread_t t[THREADS];
	struct ring *r;

	cr_assert_eq(ring_build_epoch(&r, four, 4, 16, 3), 0);
	for (unsigned i = 0; i < THREADS; i++)
		cr_assert_eq(pthread_create(&t[i], NULL, ref_storm, r), 0);
	for (unsigned i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	cr_assert_eq(ring_refs(r), 1u);
	ring_free(r);
}
