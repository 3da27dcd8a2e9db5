/*
 * tests/unit/test_read_cache.c — the directory read cache
 * (modules/read_cache.h) as a data structure: time is passed in, so the
 * ttl is checked without sleeping. kv's use of it (lookups skipped, stale
 * records looked up again, a remove or a leave forgetting) is in
 * test_kv_remote.c.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <xxhash.h>

#include "modules/read_cache.h"

#define SEC 1000000000ull

static struct dir_rec rec_of(const char *node, uint64_t addr, uint64_t gen)
{
	struct dir_rec r = {.found = true, .resident = true, .addr = addr,
			    .rkey = 7, .len = 4096, .gen = gen};
	snprintf(r.node, sizeof(r.node), "%s", node);
	snprintf(r.data, sizeof(r.data), "%s-data", node);
	return r;
}

static bool get(struct read_cache *c, const char *key, uint64_t now,
		struct dir_rec *out)
{
	return rc_get(c, key, strlen(key), now, out);
}

static void put(struct read_cache *c, const char *key,
		const struct dir_rec *r, uint64_t now)
{
	rc_put(c, key, strlen(key), r, now);
}

Test(read_cache, a_record_lives_its_ttl_and_no_longer)
{
	struct read_cache *c;
	cr_assert_eq(rc_new(&c, 16, 2 * SEC), 0);
	struct dir_rec r = rec_of("10.0.0.1:31999", 0x1000, 3), got;
	cr_assert_not(get(c, "k", 10 * SEC, &got));
	put(c, "k", &r, 10 * SEC);
	cr_assert(get(c, "k", 11 * SEC, &got));
	cr_assert_eq(memcmp(&got, &r, sizeof(r)), 0, "not the record put");
	/* a hit does not extend it */
	cr_assert(get(c, "k", 12 * SEC - 1, &got));
	cr_assert_not(get(c, "k", 12 * SEC, &got));
	struct rc_stats st;
	rc_stats(c, &st);
	cr_assert_eq(st.hits, 2);
	cr_assert_eq(st.misses, 2);
	cr_assert_eq(st.entries, 0, "an expired entry met is removed");
	/* a put again starts it over, with the newer record */
	put(c, "k", &r, 20 * SEC);
	r.gen = 4;
	put(c, "k", &r, 21 * SEC);
	cr_assert(get(c, "k", 22 * SEC + SEC / 2, &got));
	cr_assert_eq(got.gen, 4);
	rc_stats(c, &st);
	cr_assert_eq(st.entries, 1);
	rc_free(c);
}

Test(read_cache, only_resident_records_of_proper_keys_are_kept)
{
	struct read_cache *c;
	cr_assert_eq(rc_new(&c, 16, SEC), 0);
	struct dir_rec r = rec_of("n", 1, 1), got;
	struct dir_rec absent = r, on_disk = r;
	absent.found = false;
	on_disk.resident = false;
	put(c, "absent", &absent, 0);
	put(c, "disk", &on_disk, 0);
	rc_put(c, "", 0, &r, 0);
	static char big[DIR_KEY_MAX + 2];
	memset(big, 'x', sizeof(big) - 1);
	put(c, big, &r, 0);
	big[DIR_KEY_MAX] = 0; /* the longest key there may be */
	put(c, big, &r, 0);
	cr_assert_not(get(c, "absent", 1, &got));
	cr_assert_not(get(c, "disk", 1, &got));
	cr_assert(get(c, big, 1, &got));
	struct rc_stats st;
	rc_stats(c, &st);
	cr_assert_eq(st.entries, 1);
	rc_free(c);
}

Test(read_cache, forget_takes_only_the_named_producer_and_generation)
{
	struct read_cache *c;
	cr_assert_eq(rc_new(&c, 16, SEC), 0);
	struct dir_rec a = rec_of("a", 1, 5), got;
	put(c, "k", &a, 0);
	rc_forget(c, "k", 1, "b", 5); /* another producer's */
	rc_forget(c, "k", 1, "a", 4); /* an older generation's */
	cr_assert(get(c, "k", 1, &got));
	rc_forget(c, "k", 1, "a", 5);
	cr_assert_not(get(c, "k", 1, &got));
	put(c, "k", &a, 0);
	rc_forget(c, "k", 1, NULL, 0); /* whatever it names */
	cr_assert_not(get(c, "k", 1, &got));
	rc_forget(c, "never", 5, NULL, 0);
	rc_free(c);
}

Test(read_cache, clear_makes_every_older_entry_a_miss)
{
	struct read_cache *c;
	cr_assert_eq(rc_new(&c, 64, SEC), 0);
	struct dir_rec r = rec_of("n", 1, 1), got;
	char key[16];
	for (unsigned i = 0; i < 10; i++) {
		snprintf(key, sizeof(key), "k%u", i);
		put(c, key, &r, 0);
	}
	rc_clear(c);
	put(c, "k0", &r, 0); /* after the clear: kept */
	cr_assert(get(c, "k0", 1, &got));
	for (unsigned i = 1; i < 10; i++) {
		snprintf(key, sizeof(key), "k%u", i);
		cr_assert_not(get(c, key, 1, &got), "%s outlived a clear", key);
	}
	rc_free(c);
}

/* The bound: never more than max entries, whatever the keys (an evicted
 * entry's memory is reused, or replaced for a longer key). */
Test(read_cache, never_more_than_max_entries)
{
	struct read_cache *c;
	struct dir_rec r = rec_of("n", 1, 1), got;
	cr_assert_eq(rc_new(&c, 1, SEC), 0);
	put(c, "a", &r, 0);
	put(c, "bb", &r, 0);
	cr_assert_not(get(c, "a", 1, &got));
	cr_assert(get(c, "bb", 1, &got));
	put(c, "bb", &r, 2); /* the same key: replaced, not evicted */
	struct rc_stats st;
	rc_stats(c, &st);
	cr_assert_eq(st.evicted, 1);
	rc_free(c);

	cr_assert_eq(rc_new(&c, 3, SEC), 0);
	char key[40];
	for (unsigned i = 0; i < 200; i++) {
		snprintf(key, sizeof(key), "%0*u", 1 + (int)(i % 30), i);
		put(c, key, &r, 0);
		rc_stats(c, &st);
		cr_assert_leq(st.entries, 3);
	}
	cr_assert_geq(st.evicted, 190);
	rc_free(c);
}

/* Three keys of one stripe (128 entries: 64 stripes of 2, a key's stripe
 * is the top 6 bits of its XXH3-64): a get keeps "a" over "b". */
Test(read_cache, the_least_recently_used_goes_first)
{
	char keys[3][16];
	unsigned n = 0;
	for (unsigned i = 0; n < 3; i++) {
		char k[16];
		snprintf(k, sizeof(k), "s%u", i);
		if (XXH3_64bits(k, strlen(k)) >> 58 == 0)
			memcpy(keys[n++], k, sizeof(k));
	}
	struct read_cache *c;
	cr_assert_eq(rc_new(&c, 128, SEC), 0);
	struct dir_rec r = rec_of("n", 1, 1), got;
	put(c, keys[0], &r, 0);
	put(c, keys[1], &r, 0);
	cr_assert(get(c, keys[0], 1, &got));
	put(c, keys[2], &r, 0);
	cr_assert(get(c, keys[0], 1, &got), "used, yet evicted");
	cr_assert_not(get(c, keys[1], 1, &got), "the least recently used stayed");
	cr_assert(get(c, keys[2], 1, &got));
	rc_free(c);
}

struct hammer {
	struct read_cache *c;
	unsigned id;
	unsigned hits;
};

static void *hammer_run(void *arg)
{
	struct hammer *h = arg;
	struct dir_rec r = rec_of("n", 1, 1), got;
	char key[16];
	for (unsigned i = 0; i < 20000; i++) {
		snprintf(key, sizeof(key), "h%u", (i * 7 + h->id) % 300);
		if (i % 3 == 0)
			put(h->c, key, &r, i);
		else if (i % 97 == 0)
			rc_forget(h->c, key, strlen(key), NULL, 0);
		else if (i % 1000 == 0)
			rc_clear(h->c);
		else if (get(h->c, key, i, &got))
			h->hits += got.gen == 1;
	}
	return NULL;
}

/* Several threads at once (ASan/UBSan tree: no race on a stripe's lists
 * shows up as a crash or a leak); the bound holds. */
Test(read_cache, threads_share_one_cache)
{
	struct read_cache *c;
	cr_assert_eq(rc_new(&c, 128, 1000000), 0);
	pthread_t t[4];
	struct hammer h[4];
	for (unsigned i = 0; i < 4; i++) {
		h[i] = (struct hammer){c, i, 0};
		cr_assert_eq(pthread_create(&t[i], NULL, hammer_run, &h[i]), 0);
	}
	unsigned hits = 0;
	for (unsigned i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		hits += h[i].hits;
	}
	struct rc_stats st;
	rc_stats(c, &st);
	cr_assert_leq(st.entries, 128);
	cr_assert_gt(hits, 0);
	cr_assert_eq(st.hits, hits, "every hit returned a whole record");
	rc_free(c);
}
