/*
 * tests/unit/test_pool.c — the publish pool: header checks, reserve/commit/get
 * with a content oracle, replace and delete, pinning under eviction pressure,
 * LRU order, over-eviction with mixed page sizes (against naive LRU and a
 * model of the original's exact-size lists), pool_pin_addr bounds, the
 * eviction callback, a multi-threaded stress and an informational benchmark.
 *
 * Content oracle: a page's bytes and length are derived from its key, so any
 * wrong page (another key, a reused or torn extent) shows up as a mismatch.
 * Figures (over-eviction, throughput, stress counts) are printed with
 * cr_log_info: run with --verbose to see them. POOL_STRESS_SECONDS=N makes
 * the stress test a soak test.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/util.h"
#include "storage/pool.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)

/* ---- helpers ------------------------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static uint64_t key_seed(const char *key)
{
	return XXH3_64bits(key, strlen(key));
}

static void oracle_fill(uint8_t *dst, uint64_t len, uint64_t seed)
{
	uint64_t i = 0;
	for (; i + 8 <= len; i += 8) {
		uint64_t v = mix64(seed + i);
		memcpy(dst + i, &v, 8);
	}
	if (i < len) {
		uint64_t v = mix64(seed + i);
		memcpy(dst + i, &v, len - i);
	}
}

/* First mismatching offset, or -1. */
static long oracle_check(const uint8_t *src, uint64_t len, uint64_t seed)
{
	uint64_t i = 0;
	for (; i + 8 <= len; i += 8) {
		uint64_t v = mix64(seed + i);
		if (memcmp(src + i, &v, 8) != 0)
			return (long)i;
	}
	if (i < len) {
		uint64_t v = mix64(seed + i);
		if (memcmp(src + i, &v, len - i) != 0)
			return (long)i;
	}
	return -1;
}

static struct pool *mk_pool(size_t size, size_t max_page, unsigned stripes,
			    enum pool_evict_policy pol)
{
	struct pool_opts o = {.size = size, .max_page_bytes = max_page,
			      .stripes = stripes, .try_huge_pages = true,
			      .evict_policy = pol};
	struct pool *p = NULL;
	int rc = pool_new(&p, &o);
	cr_assert_eq(rc, 0, "pool_new: %d", rc);
	return p;
}

/* Publish key with oracle bytes (seed from the key, or given). */
static int put_seeded(struct pool *p, const char *key, uint64_t len,
		      uint64_t seed, bool checksum, uint64_t *gen,
		      uintptr_t *addr)
{
	struct pool_ref ref;
	uint8_t *dst;
	int rc = pool_reserve(p, key, strlen(key), len, &ref, &dst);
	if (rc)
		return rc;
	oracle_fill(dst, len, seed);
	return pool_commit(p, &ref, checksum, gen, addr);
}

static int put(struct pool *p, const char *key, uint64_t len, uint64_t *gen,
	       uintptr_t *addr)
{
	return put_seeded(p, key, len, key_seed(key), true, gen, addr);
}

/* Pin key, check header and oracle, unpin. 0, -ENOENT, or a check error. */
static int get_check(struct pool *p, const char *key, uint64_t want_len,
		     uint64_t seed)
{
	struct pool_ref ref;
	const uint8_t *hdr;
	uint64_t len, gen, kh, kl;
	int rc = pool_get(p, key, strlen(key), &ref, &hdr, &len, &gen);
	if (rc)
		return rc;
	pool_key_hash(key, strlen(key), &kh, &kl);
	rc = pool_hdr_check(hdr, POOL_HDR_BYTES + len, kh, kl, gen, want_len, true);
	if (rc == 0 && oracle_check(hdr + POOL_HDR_BYTES, len, seed) >= 0)
		rc = -EILSEQ;
	pool_unpin(p, &ref);
	return rc;
}

static struct pool_stats stats_of(struct pool *p)
{
	struct pool_stats st;
	pool_stats(p, &st);
	return st;
}

/* ---- creation and header ------------------------------------------------- */

Test(pool, new_validates_options_and_maps_the_region)
{
	struct pool *p;
	struct pool_opts o = {.size = 512 * KiB};
	cr_assert_eq(pool_new(&p, &o), -EINVAL);
	cr_assert_eq(pool_new(&p, NULL), -EINVAL);
	o = (struct pool_opts){.size = 4 * MiB, .max_page_bytes = 8 * MiB};
	cr_assert_eq(pool_new(&p, &o), -EINVAL, "page larger than a stripe");
	o = (struct pool_opts){.size = 4 * MiB, .stripes = POOL_STRIPES_MAX + 1};
	cr_assert_eq(pool_new(&p, &o), -EINVAL);

	/* Default max page shrinks to fit a small pool. */
	p = mk_pool(8 * MiB, 0, 0, POOL_EVICT_SPAN);
	cr_assert_lt(pool_max_page_bytes(p), 8 * MiB);
	cr_assert_eq(pool_stripes(p), 1);
	uint8_t *base;
	size_t len;
	pool_region(p, &base, &len);
	cr_assert_eq(len, 8 * MiB);
	cr_assert_eq((uintptr_t)base % POOL_UNIT_BYTES, 0);
	pool_free(p);

	/* Auto stripes: one per 256 MiB, each holding >= 4 max pages. */
	p = mk_pool(1024 * MiB, 4 * MiB, 0, POOL_EVICT_SPAN);
	cr_assert_eq(pool_stripes(p), 4);
	pool_free(p);
	p = mk_pool(1024 * MiB, 0, 0, POOL_EVICT_SPAN);
	cr_assert_eq(pool_stripes(p), 3, "64 MiB pages need bigger stripes");
	pool_free(p);
	pool_free(NULL);
}

Test(pool, hdr_check_catches_each_field)
{
	struct pool *p = mk_pool(4 * MiB, 64 * KiB, 1, POOL_EVICT_SPAN);
	const char *key = "hdr-key";
	uint64_t gen, kh, kl, len = 5000;
	uintptr_t addr;
	cr_assert_eq(put(p, key, len, &gen, &addr), 0);
	pool_key_hash(key, strlen(key), &kh, &kl);
	size_t n = POOL_HDR_BYTES + len;
	uint8_t *good = malloc(n), *b = malloc(n);
	memcpy(good, (void *)addr, n);
	cr_assert_eq(pool_hdr_check(good, n, kh, kl, gen, len, true), 0);

	struct pool_hdr *h = (struct pool_hdr *)(void *)b;
#define MUTATE(stmt, want)                                                     \
	do {                                                                   \
		memcpy(b, good, n);                                            \
		stmt;                                                          \
		cr_assert_eq(pool_hdr_check(b, n, kh, kl, gen, len, true), want, \
			     "%s: got %d", #stmt,                              \
			     pool_hdr_check(b, n, kh, kl, gen, len, true));    \
	} while (0)
	MUTATE(h->magic ^= 1, -EPROTO);
	MUTATE(h->magic = 0, -EPROTO);
	MUTATE(h->version = 2, -EPROTONOSUPPORT);
	MUTATE(h->flags |= 0x8, -EPROTONOSUPPORT);
	MUTATE(h->key_hi ^= 1, -ENOKEY);
	MUTATE(h->key_lo ^= 1ull << 63, -ENOKEY);
	MUTATE(h->gen += 1, -ESTALE);
	MUTATE(h->len -= 1, -EMSGSIZE);
	MUTATE(b[POOL_HDR_BYTES + 4321] ^= 0x40, -EBADMSG);
	MUTATE(h->checksum ^= 1, -EBADMSG);
	MUTATE(h->flags = 0, -ENOMSG);
#undef MUTATE
	/* Expected values that differ are caught the same way. */
	cr_assert_eq(pool_hdr_check(good, n, kh ^ 1, kl, gen, len, true), -ENOKEY);
	cr_assert_eq(pool_hdr_check(good, n, kh, kl, gen - 1, len, true), -ESTALE);
	cr_assert_eq(pool_hdr_check(good, n, kh, kl, gen, len + 1, true), -EMSGSIZE);
	cr_assert_eq(pool_hdr_check(good, n - 1, kh, kl, gen, len, true), -ENODATA);
	cr_assert_eq(pool_hdr_check(good, 63, kh, kl, gen, len, true), -ENODATA);
	/* A payload corruption passes only when the reader skips the sum. */
	memcpy(b, good, n);
	b[n - 1] ^= 1;
	cr_assert_eq(pool_hdr_check(b, n, kh, kl, gen, len, false), 0);

	/* Published without checksum: flag clear, field zero. */
	cr_assert_eq(put_seeded(p, "nosum", 100, 7, false, &gen, &addr), 0);
	pool_key_hash("nosum", 5, &kh, &kl);
	const struct pool_hdr *hn = (const void *)addr;
	cr_assert_eq(hn->flags, 0);
	cr_assert_eq(hn->checksum, 0);
	cr_assert_eq(hn->magic, POOL_HDR_MAGIC);
	cr_assert_eq(memcmp((const void *)addr, "PCP1", 4), 0);
	cr_assert_eq(pool_hdr_check(hn, 164, kh, kl, gen, 100, false), 0);
	cr_assert_eq(pool_hdr_check(hn, 164, kh, kl, gen, 100, true), -ENOMSG);
	free(good);
	free(b);
	pool_free(p);
}

/* ---- basic life cycle ---------------------------------------------------- */

Test(pool, reserve_commit_get_round_trip)
{
	struct pool *p = mk_pool(16 * MiB, 1 * MiB, 1, POOL_EVICT_SPAN);
	static const uint64_t lens[] = {0, 1, 4032, 4033, 65536, 1 * MiB};
	char key[32];
	uint64_t last_gen = 0;
	for (unsigned i = 0; i < PC_ARRAY_LEN(lens); i++) {
		snprintf(key, sizeof(key), "rt-%u", i);
		uint64_t gen;
		uintptr_t addr;
		cr_assert_eq(put(p, key, lens[i], &gen, &addr), 0);
		cr_assert_gt(gen, last_gen, "generations increase");
		last_gen = gen;
		cr_assert_eq(addr % POOL_UNIT_BYTES, 0);
		cr_assert(pool_contains(p, key, strlen(key)));
	}
	for (unsigned i = 0; i < PC_ARRAY_LEN(lens); i++) {
		snprintf(key, sizeof(key), "rt-%u", i);
		cr_assert_eq(get_check(p, key, lens[i], key_seed(key)), 0, "%s", key);
	}
	struct pool_stats st = stats_of(p);
	cr_assert_eq(st.keys, PC_ARRAY_LEN(lens));
	cr_assert_eq(st.pinned, 0);
	cr_assert_eq(st.capacity, 16 * MiB);
	cr_assert_eq(pool_get(p, "nope", 4, &(struct pool_ref){0},
			      &(const uint8_t *){0}, &(uint64_t){0},
			      &(uint64_t){0}), -ENOENT);
	cr_assert(!pool_contains(p, "nope", 4));

	/* Limits. */
	struct pool_ref ref;
	uint8_t *dst;
	char big[POOL_KEY_MAX + 1];
	memset(big, 'k', sizeof(big));
	cr_assert_eq(pool_reserve(p, big, sizeof(big), 10, &ref, &dst), -EINVAL);
	cr_assert_eq(pool_reserve(p, big, POOL_KEY_MAX, 10, &ref, &dst), 0);
	pool_abort(p, &ref);
	cr_assert_eq(pool_reserve(p, "k", 0, 10, &ref, &dst), -EINVAL);
	cr_assert_eq(pool_reserve(p, "k", 1, 1 * MiB + 1, &ref, &dst), -EINVAL);

	/* A reserved entry is invisible until commit; abort gives it back. */
	uint64_t used = stats_of(p).bytes_used;
	cr_assert_eq(pool_reserve(p, "pending", 7, 9000, &ref, &dst), 0);
	cr_assert(!pool_contains(p, "pending", 7));
	cr_assert_eq(stats_of(p).bytes_used, used + 3 * POOL_UNIT_BYTES);
	pool_abort(p, &ref);
	cr_assert_eq(stats_of(p).bytes_used, used);
	cr_assert_eq(pool_audit(p), 0);
	pool_free(p);
}

Test(pool, replace_and_delete)
{
	struct pool *p = mk_pool(8 * MiB, 256 * KiB, 1, POOL_EVICT_SPAN);
	uint64_t g1, g2;
	uintptr_t a1, a2;
	cr_assert_eq(put_seeded(p, "K", 10000, 1, true, &g1, &a1), 0);
	cr_assert_eq(put_seeded(p, "K", 70000, 2, true, &g2, &a2), 0);
	cr_assert_gt(g2, g1);
	cr_assert_neq(a1, a2);
	cr_assert_eq(get_check(p, "K", 70000, 2), 0);
	cr_assert_eq(stats_of(p).keys, 1);
	/* The old entry was unpinned: freed at once. */
	struct pool_ref ref;
	cr_assert_eq(pool_pin_addr(p, a1, 64, &ref), -ENOENT);
	cr_assert_eq(stats_of(p).bytes_used, 18 * POOL_UNIT_BYTES);

	/* Replace while a reader holds the old one: it stays intact. */
	const uint8_t *hdr;
	uint64_t len, gen;
	cr_assert_eq(pool_get(p, "K", 1, &ref, &hdr, &len, &gen), 0);
	cr_assert_eq(put_seeded(p, "K", 5000, 3, true, &g1, &a1), 0);
	cr_assert_eq(get_check(p, "K", 5000, 3), 0);
	cr_assert_eq(oracle_check(hdr + POOL_HDR_BYTES, 70000, 2), -1);
	cr_assert_eq(stats_of(p).bytes_used, (18 + 2) * POOL_UNIT_BYTES);
	pool_unpin(p, &ref);
	cr_assert_eq(stats_of(p).bytes_used, 2 * POOL_UNIT_BYTES);

	cr_assert_eq(pool_delete(p, "K", 1), 0);
	cr_assert(!pool_contains(p, "K", 1));
	cr_assert_eq(pool_delete(p, "K", 1), -ENOENT);
	struct pool_stats st = stats_of(p);
	cr_assert_eq(st.keys, 0);
	cr_assert_eq(st.bytes_used, 0);
	cr_assert_eq(st.evictions, 0, "replace and delete are not evictions");
	cr_assert_eq(pool_audit(p), 0);
	pool_free(p);
}

/* ---- pinning ------------------------------------------------------------- */

Test(pool, pinned_entries_survive_eviction_pressure)
{
	struct pool *p = mk_pool(4 * MiB, 64 * KiB, 1, POOL_EVICT_SPAN);
	cr_assert_eq(put(p, "A", 30000, NULL, NULL), 0);
	cr_assert_eq(put(p, "B", 30000, NULL, NULL), 0);
	struct pool_ref ra, rb;
	const uint8_t *ha, *hb;
	uint64_t la, ga, lb, gb;
	cr_assert_eq(pool_get(p, "A", 1, &ra, &ha, &la, &ga), 0);
	cr_assert_eq(pool_get(p, "B", 1, &rb, &hb, &lb, &gb), 0);
	/* Deleting a pinned entry hides it; its bytes stay until unpin. */
	cr_assert_eq(pool_delete(p, "B", 1), 0);
	cr_assert(!pool_contains(p, "B", 1));

	char key[32];
	for (unsigned i = 0; i < 2000; i++) {
		snprintf(key, sizeof(key), "fill-%u", i);
		cr_assert_eq(put(p, key, 20000 + (i % 7) * 4096, NULL, NULL), 0);
	}
	struct pool_stats st = stats_of(p);
	cr_assert_gt(st.evictions, 1000);
	cr_assert_eq(st.pinned, 2);
	cr_assert(pool_contains(p, "A", 1));
	uint64_t kh, kl;
	pool_key_hash("A", 1, &kh, &kl);
	cr_assert_eq(pool_hdr_check(ha, 64 + la, kh, kl, ga, 30000, true), 0);
	cr_assert_eq(oracle_check(ha + 64, la, key_seed("A")), -1);
	pool_key_hash("B", 1, &kh, &kl);
	cr_assert_eq(pool_hdr_check(hb, 64 + lb, kh, kl, gb, 30000, true), 0);
	cr_assert_eq(oracle_check(hb + 64, lb, key_seed("B")), -1);
	cr_assert_eq(pool_audit(p), 0);

	/* Last unpin of the deleted B frees it; A becomes evictable again. */
	uint64_t used = stats_of(p).bytes_used;
	pool_unpin(p, &rb);
	cr_assert_eq(stats_of(p).bytes_used, used - 8 * POOL_UNIT_BYTES);
	pool_unpin(p, &ra);
	cr_assert_eq(stats_of(p).pinned, 0);
	for (unsigned i = 0; i < 2000; i++) {
		snprintf(key, sizeof(key), "more-%u", i);
		cr_assert_eq(put(p, key, 20000, NULL, NULL), 0);
	}
	cr_assert(!pool_contains(p, "A", 1));
	cr_assert_eq(pool_audit(p), 0);
	pool_free(p);
}

Test(pool, everything_pinned_is_enospc)
{
	struct pool *p = mk_pool(1 * MiB, 64 * KiB, 1, POOL_EVICT_SPAN);
	struct pool_ref refs[64];
	unsigned n = 0;
	char key[32];
	/* 16 units each: 16 entries fill the 256-unit pool. */
	for (; n < 16; n++) {
		snprintf(key, sizeof(key), "pin-%u", n);
		cr_assert_eq(put(p, key, 61440, NULL, NULL), 0);
		const uint8_t *h;
		uint64_t l, g;
		cr_assert_eq(pool_get(p, key, strlen(key), &refs[n], &h, &l, &g), 0);
	}
	struct pool_ref ref;
	uint8_t *dst;
	cr_assert_eq(pool_reserve(p, "x", 1, 100, &ref, &dst), -ENOSPC);
	cr_assert_eq(stats_of(p).reserve_failures, 1);
	pool_unpin(p, &refs[3]);
	cr_assert_eq(pool_reserve(p, "x", 1, 100, &ref, &dst), 0);
	cr_assert(!pool_contains(p, "pin-3", 5));
	pool_abort(p, &ref);
	for (unsigned i = 0; i < n; i++)
		if (i != 3)
			pool_unpin(p, &refs[i]);
	cr_assert_eq(pool_audit(p), 0);
	pool_free(p);
}

/* ---- LRU and the eviction callback -------------------------------------- */

struct evlog {
	struct pool *p;
	char keys[256][32];
	uint64_t gens[256];
	unsigned n;
	unsigned contains_true; /* callback saw the evicted key still visible */
	unsigned probe_ok;      /* callback's pool_contains of a live key */
	const char *probe;
};

static void evlog_cb(void *arg, const char *key, size_t keylen, uint64_t gen)
{
	struct evlog *e = arg;
	cr_assert_lt(keylen, sizeof(e->keys[0]));
	cr_assert_eq(key[keylen], '\0');
	if (e->n < 256) {
		memcpy(e->keys[e->n], key, keylen + 1);
		e->gens[e->n] = gen;
	}
	e->n++;
	/* Would deadlock if the stripe lock were held here. */
	if (pool_contains(e->p, key, keylen))
		e->contains_true++;
	if (e->probe && pool_contains(e->p, e->probe, strlen(e->probe)))
		e->probe_ok++;
	struct pool_stats st;
	pool_stats(e->p, &st);
}

Test(pool, lru_order_touched_entries_survive)
{
	struct pool *p = mk_pool(4 * MiB, 64 * KiB, 1, POOL_EVICT_SPAN);
	struct evlog ev = {.p = p};
	pool_set_evict_cb(p, evlog_cb, &ev);
	char key[32];
	/* 9 units each; 100 entries use 900 of 1024 units. */
	for (unsigned i = 0; i < 100; i++) {
		snprintf(key, sizeof(key), "e%u", i);
		cr_assert_eq(put(p, key, 32768, NULL, NULL), 0);
	}
	cr_assert_eq(stats_of(p).evictions, 0);
	for (unsigned i = 0; i < 50; i += 2) {
		snprintf(key, sizeof(key), "e%u", i);
		cr_assert_eq(get_check(p, key, 32768, key_seed(key)), 0);
	}
	/* 60 more: 13 fit in the free tail, 47 evict. */
	for (unsigned i = 100; i < 160; i++) {
		snprintf(key, sizeof(key), "e%u", i);
		cr_assert_eq(put(p, key, 32768, NULL, NULL), 0);
	}
	cr_assert_eq(ev.n, 47);
	/* Oldest first: odd keys below 50, then 50, 51, ... */
	unsigned k = 0;
	for (unsigned i = 1; i < 50; i += 2, k++)
		cr_assert_str_eq(ev.keys[k], (snprintf(key, sizeof(key), "e%u", i), key));
	for (unsigned i = 50; k < ev.n; i++, k++)
		cr_assert_str_eq(ev.keys[k], (snprintf(key, sizeof(key), "e%u", i), key));
	for (unsigned i = 0; i < 50; i += 2) {
		snprintf(key, sizeof(key), "e%u", i);
		cr_assert(pool_contains(p, key, strlen(key)), "touched %s survives", key);
	}
	pool_free(p);
}

/*
 * A run around an old entry may take in its neighbours, but never ones used
 * recently: small pages read in another order than they were written leave
 * old entries scattered between fresh large ones, and the run for a large
 * page used to take the freshest pages of the batch being written (a set
 * answered true, the get right after missed).
 */
Test(pool, fresh_pages_are_never_run_neighbours)
{
	struct pool *p = mk_pool(64 * MiB, 1 * MiB, 1, POOL_EVICT_SPAN);
	char key[32];
	uint64_t rng = 0x5eed;
	enum { SMALL = 256, BATCH = 16, ROUNDS = 96 };
	unsigned order[SMALL];
	for (unsigned i = 0; i < SMALL; i++) {
		snprintf(key, sizeof(key), "s%u", i);
		cr_assert_eq(put(p, key, 128 * KiB, NULL, NULL), 0);
		order[i] = i;
	}
	/* Read them back in another order (a peer reading them). */
	for (unsigned i = SMALL - 1; i > 0; i--) {
		unsigned j = (unsigned)(rng_next(&rng) % (i + 1)), t = order[i];
		order[i] = order[j];
		order[j] = t;
	}
	for (unsigned i = 0; i < SMALL; i++) {
		snprintf(key, sizeof(key), "s%u", order[i]);
		cr_assert_eq(get_check(p, key, 128 * KiB,
				       key_seed(key)), 0);
	}
	for (unsigned r = 0; r < ROUNDS; r++) {
		for (unsigned b = 0; b < BATCH; b++) {
			snprintf(key, sizeof(key), "b%u-%u", r, b);
			cr_assert_eq(put(p, key, 512 * KiB, NULL, NULL), 0);
		}
		/* 8 MiB just written into a 64 MiB pool: all of it is there. */
		for (unsigned b = 0; b < BATCH; b++) {
			snprintf(key, sizeof(key), "b%u-%u", r, b);
			cr_assert(pool_contains(p, key, strlen(key)),
				  "round %u: %s evicted right after its set "
				  "(%llu evictions)", r, key,
				  (unsigned long long)stats_of(p).evictions);
		}
	}
	cr_assert_eq(pool_audit(p), 0);
	pool_free(p);
}

Test(pool, evict_callback_gets_keys_and_runs_unlocked, .timeout = 120)
{
	struct pool *p = mk_pool(1 * MiB, 64 * KiB, 1, POOL_EVICT_SPAN);
	struct evlog ev = {.p = p, .probe = "c19"};
	pool_set_evict_cb(p, evlog_cb, &ev);
	char key[32];
	uint64_t gens[20];
	/* 16 units each: the pool holds 16. */
	for (unsigned i = 0; i < 20; i++) {
		snprintf(key, sizeof(key), "c%u", i);
		cr_assert_eq(put(p, key, 61440, &gens[i], NULL), 0);
	}
	cr_assert_eq(ev.n, 4);
	for (unsigned i = 0; i < 4; i++) {
		snprintf(key, sizeof(key), "c%u", i);
		cr_assert_str_eq(ev.keys[i], key);
		cr_assert_eq(ev.gens[i], gens[i]);
	}
	cr_assert_eq(ev.contains_true, 0, "evicted keys are gone before the callback");
	/* c19 is published only after its own reserve's callbacks ran. */
	cr_assert_eq(ev.probe_ok, 0);
	/* Explicit deletes and replaces do not call back. */
	cr_assert_eq(pool_delete(p, "c10", 3), 0);
	cr_assert_eq(put(p, "c11", 100, NULL, NULL), 0);
	cr_assert_eq(ev.n, 4);
	/* A probe of a live key from inside the callback. */
	ev.probe = "c11";
	for (unsigned i = 20; i < 30; i++) {
		snprintf(key, sizeof(key), "c%u", i);
		cr_assert_eq(put(p, key, 61440, NULL, NULL), 0);
	}
	cr_assert_gt(ev.probe_ok, 0);
	pool_free(p);
}

/* A page far larger than a run can reach (POOL_SPAN_REACH extents each
 * way) in a stripe full of one-unit pages: made room for one LRU eviction
 * at a time, looking for a run again only after 1, 8, 64 and 512 of them
 * — it looked after every one (3,000 searches of 64 candidates x 2,049
 * neighbours: seconds under the stripe's lock). */
Test(pool, a_huge_page_among_tiny_ones_searches_for_a_run_a_few_times,
     .timeout = 120)
{
	struct pool *p = mk_pool(32 * MiB, 24 * MiB, 1, POOL_EVICT_SPAN);
	char key[32];
	unsigned n = 0;
	struct pool_stats st;
	do { /* fill it with 64-byte pages until they evict each other */
		snprintf(key, sizeof(key), "t%u", n++);
		cr_assert_eq(put(p, key, 64, NULL, NULL), 0);
		pool_stats(p, &st);
	} while (st.evictions < 100);
	uint64_t picks = st.span_picks, ev = st.evictions;
	/* 12 MiB: 3,073 units, more than a run of one-unit pages reaches. */
	cr_assert_eq(put(p, "huge", 12 * MiB, NULL, NULL), 0);
	pool_stats(p, &st);
	cr_assert_geq(st.evictions - ev, 3000, "room for 3,073 units took %llu "
		      "evictions", (unsigned long long)(st.evictions - ev));
	cr_assert_leq(st.span_picks - picks, 5, "%llu searches for a run",
		      (unsigned long long)(st.span_picks - picks));
	cr_assert_eq(pool_audit(p), 0);
	pool_free(p);
}

/* ---- pool_pin_addr ------------------------------------------------------- */

Test(pool, pin_addr_checks_bounds_and_liveness)
{
	struct pool *p = mk_pool(8 * MiB, 256 * KiB, 2, POOL_EVICT_SPAN);
	uint8_t *base;
	size_t cap;
	pool_region(p, &base, &cap);
	uintptr_t b = (uintptr_t)base;
	uint64_t gen;
	uintptr_t x;
	cr_assert_eq(put(p, "X", 10000, &gen, &x), 0); /* 3 units */
	struct pool_ref ref;

	cr_assert_eq(pool_pin_addr(p, b - POOL_UNIT_BYTES, 64, &ref), -EFAULT);
	cr_assert_eq(pool_pin_addr(p, b + cap, 1, &ref), -EFAULT);
	cr_assert_eq(pool_pin_addr(p, x, b + cap - x + 1, &ref), -EFAULT);
	cr_assert_eq(pool_pin_addr(p, x, UINT64_MAX, &ref), -EFAULT);
	cr_assert_eq(pool_pin_addr(p, x, 0, &ref), -EINVAL);
	cr_assert_eq(pool_pin_addr(p, x + 64, 64, &ref), -ENOENT, "mid-header");
	cr_assert_eq(pool_pin_addr(p, x + POOL_UNIT_BYTES, 64, &ref), -ENOENT,
		     "mid-entry unit");
	cr_assert_eq(pool_pin_addr(p, x + 2 * POOL_UNIT_BYTES, 64, &ref), -ENOENT);
	cr_assert_eq(pool_pin_addr(p, x + 3 * POOL_UNIT_BYTES, 64, &ref), -ENOENT,
		     "free space");
	cr_assert_eq(pool_pin_addr(p, b + cap - POOL_UNIT_BYTES, 64, &ref), -ENOENT);
	cr_assert_eq(pool_pin_addr(p, x, 64 + 10000 + 1, &ref), -ERANGE,
		     "the key bytes after the payload are not readable");
	cr_assert_eq(pool_pin_addr(p, x, 64 + 10000, &ref), 0);
	cr_assert_eq(ref.gen, gen);
	pool_unpin(p, &ref);

	/* Reserved, not yet committed. */
	struct pool_ref rr;
	uint8_t *dst;
	cr_assert_eq(pool_reserve(p, "Y", 1, 100, &rr, &dst), 0);
	cr_assert_eq(pool_pin_addr(p, (uintptr_t)(dst - 64), 64, &ref), -ENOENT);
	pool_abort(p, &rr);

	/* Dead (deleted while pinned), then freed. */
	struct pool_ref rx;
	cr_assert_eq(pool_pin_addr(p, x, 64, &rx), 0);
	cr_assert_eq(pool_delete(p, "X", 1), 0);
	cr_assert_eq(pool_pin_addr(p, x, 64, &ref), -ENOENT, "dead");
	pool_unpin(p, &rx);
	cr_assert_eq(pool_pin_addr(p, x, 64, &ref), -ENOENT, "freed");
	/* A freed header reads as "no entry" even without a pin. */
	cr_assert_eq(((const struct pool_hdr *)x)->magic, 0);

	/* Entries in the second stripe resolve too. */
	char key[16];
	unsigned in_second = 0;
	for (unsigned i = 0; i < 16; i++) {
		snprintf(key, sizeof(key), "s%u", i);
		cr_assert_eq(put(p, key, 5000, &gen, &x), 0);
		if (x >= b + cap / 2)
			in_second++;
		cr_assert_eq(pool_pin_addr(p, x, 64 + 5000, &ref), 0);
		cr_assert_eq(ref.gen, gen);
		pool_unpin(p, &ref);
	}
	cr_assert_gt(in_second, 0);
	cr_assert_lt(in_second, 16);
	cr_assert_eq(pool_audit(p), 0);
	pool_free(p);
}

/* ---- over-eviction with mixed sizes ------------------------------------ */

/*
 * Per reserve that evicted E bytes for an entry of S bytes (4 KiB units):
 *  - over_page = max(0, E - S): evicted beyond the page's own size; defined
 *    for every policy, including the model of the original;
 *  - over_opt = E - E_opt, where E_opt is the least any placement could have
 *    evicted given the region's layout just before (cheapest contiguous
 *    window >= S over the live entries and gaps, age ignored): what was
 *    truly needed to fit the page. The test tracks the layout from
 *    commit addresses and eviction callbacks.
 * Both are summed over the steady state (after a warm-up of many fills) and
 * reported as a share of evicted bytes. util is the mean share of capacity
 * in use; a victim's rank is how many live entries were older (0 = exact
 * LRU). Nothing is touched, so LRU order is insert order.
 */
#define OE_POOL (256 * MiB)
#define OE_UNITS (OE_POOL / POOL_UNIT_BYTES)
#define OE_SMALL (256 * KiB)
#define OE_BIG (4 * MiB)

struct oe_result {
	uint64_t evicted, over_page, over_opt, failures;
	double util;
	double mean_rank;
	uint64_t max_rank;
};

struct oe_ctx {
	uintptr_t base;
	unsigned n;       /* inserts so far */
	uint32_t *bit;    /* Fenwick tree over insert sequence numbers */
	unsigned nbit;
	uint64_t ranks, rank_n, rank_max;
	uint32_t *start;  /* per seq: first unit */
	uint32_t *units;  /* per seq: units */
	unsigned *live;   /* live seqs sorted by start */
	unsigned nlive;
};

static void bit_add(struct oe_ctx *c, unsigned i, int d)
{
	for (i++; i <= c->nbit; i += i & -i)
		c->bit[i - 1] += (uint32_t)d;
}

static uint64_t bit_prefix(const struct oe_ctx *c, unsigned i) /* [0, i) */
{
	uint64_t s = 0;
	for (; i > 0; i -= i & -i)
		s += c->bit[i - 1];
	return s;
}

/* Position of the first live entry starting at or after unit u. */
static unsigned oe_lower(const struct oe_ctx *c, uint32_t u)
{
	unsigned lo = 0, hi = c->nlive;
	while (lo < hi) {
		unsigned mid = (lo + hi) / 2;
		if (c->start[c->live[mid]] < u)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static void oe_layout_add(struct oe_ctx *c, unsigned seq)
{
	unsigned at = oe_lower(c, c->start[seq]);
	memmove(&c->live[at + 1], &c->live[at], (c->nlive - at) * sizeof(c->live[0]));
	c->live[at] = seq;
	c->nlive++;
}

static void oe_layout_del(struct oe_ctx *c, unsigned seq)
{
	unsigned at = oe_lower(c, c->start[seq]);
	cr_assert(at < c->nlive && c->live[at] == seq);
	c->nlive--;
	memmove(&c->live[at], &c->live[at + 1], (c->nlive - at) * sizeof(c->live[0]));
}

/* Least units any contiguous placement of n units must evict now. */
static uint64_t oe_opt_units(const struct oe_ctx *c, uint32_t n)
{
	/* Segments in address order: gap before live[i] (free), live[i]
	 * (cost = its units), ..., final gap. Two pointers over whole
	 * segments; a window never needs a partial segment. */
	unsigned nseg = 2 * c->nlive + 1;
	uint64_t best = UINT64_MAX, su = 0, sc = 0;
	unsigned r = 0;
#define SEG_UNITS(k)                                                           \
	((k) % 2 == 0 ? (uint64_t)(((k) / 2 < c->nlive ? c->start[c->live[(k) / 2]] \
						       : OE_UNITS) -          \
				   ((k) / 2 ? c->start[c->live[(k) / 2 - 1]] +     \
					      c->units[c->live[(k) / 2 - 1]]      \
					    : 0))                             \
		      : (uint64_t)c->units[c->live[(k) / 2]])
#define SEG_COST(k) ((k) % 2 == 0 ? 0 : SEG_UNITS(k))
	for (unsigned l = 0; l < nseg; l++) {
		while (su < n && r < nseg) {
			su += SEG_UNITS(r);
			sc += SEG_COST(r);
			r++;
		}
		if (su < n)
			break;
		best = PC_MIN(best, sc);
		su -= SEG_UNITS(l);
		sc -= SEG_COST(l);
	}
#undef SEG_UNITS
#undef SEG_COST
	return best;
}

static void oe_cb(void *arg, const char *key, size_t keylen, uint64_t gen)
{
	struct oe_ctx *c = arg;
	unsigned seq = (unsigned)strtoul(key + 1, NULL, 10);
	uint64_t r = bit_prefix(c, seq);
	c->ranks += r;
	c->rank_n++;
	c->rank_max = PC_MAX(c->rank_max, r);
	bit_add(c, seq, -1);
	if (c->units)
		oe_layout_del(c, seq);
}

/* pct_big: share of 4 MiB pages (the rest 256 KiB); OE_ANY: any size from
 * 4 KiB to 4 MiB. */
#define OE_ANY 1000u
static uint64_t oe_size(uint64_t *rng, unsigned pct_big)
{
	if (pct_big == OE_ANY)
		return (1 + rng_next(rng) % 1024) * 4 * KiB - 128;
	return rng_next(rng) % 100 < pct_big ? OE_BIG : OE_SMALL;
}

static void oe_run_pool(enum pool_evict_policy pol, unsigned pct_big,
			unsigned inserts, unsigned warm, struct oe_result *r)
{
	memset(r, 0, sizeof(*r));
	struct pool *p = mk_pool(OE_POOL, OE_BIG, 1, pol);
	uint8_t *base;
	size_t cap;
	pool_region(p, &base, &cap);
	struct oe_ctx c = {.base = (uintptr_t)base, .nbit = inserts};
	c.bit = calloc(inserts, sizeof(*c.bit));
	c.start = calloc(inserts, sizeof(*c.start));
	c.units = calloc(inserts, sizeof(*c.units));
	c.live = calloc(inserts, sizeof(*c.live));
	pool_set_evict_cb(p, oe_cb, &c);
	uint64_t rng = 0x1234567 + pct_big;
	char key[32];
	uint64_t util_sum = 0;
	for (unsigned i = 0; i < inserts; i++) {
		uint64_t len = oe_size(&rng, pct_big);
		int kl = snprintf(key, sizeof(key), "m%u", i);
		uint32_t n = (uint32_t)((POOL_HDR_BYTES + len + (uint64_t)kl +
					 POOL_UNIT_BYTES - 1) / POOL_UNIT_BYTES);
		uint64_t opt = i >= warm ? oe_opt_units(&c, n) : 0;
		uint64_t ev0 = stats_of(p).evicted_bytes;
		if (i == warm)
			c.ranks = c.rank_n = c.rank_max = 0;
		struct pool_ref ref;
		uint8_t *dst;
		if (pool_reserve(p, key, (size_t)kl, len, &ref, &dst)) {
			r->failures++;
			continue;
		}
		/* No payload copy: only placement matters here. */
		uintptr_t addr;
		cr_assert_eq(pool_commit(p, &ref, false, NULL, &addr), 0);
		c.start[i] = (uint32_t)((addr - c.base) / POOL_UNIT_BYTES);
		c.units[i] = n;
		oe_layout_add(&c, i);
		bit_add(&c, i, +1);
		struct pool_stats st = stats_of(p);
		uint64_t ev = st.evicted_bytes - ev0;
		if (i >= warm) {
			uint64_t s = (uint64_t)n * POOL_UNIT_BYTES;
			r->evicted += ev;
			r->over_page += ev > s ? ev - s : 0;
			if (ev) {
				cr_assert_geq(ev, opt * POOL_UNIT_BYTES, "no policy beats the optimum");
				r->over_opt += ev - opt * POOL_UNIT_BYTES;
			}
			util_sum += st.bytes_used * 10000 / st.capacity;
		}
	}
	r->util = (double)util_sum / 10000.0 / (inserts - warm);
	r->mean_rank = c.rank_n ? (double)c.ranks / (double)c.rank_n : 0;
	r->max_rank = c.rank_max;
	cr_assert_eq(pool_audit(p), 0);
	free(c.bit);
	free(c.start);
	free(c.units);
	free(c.live);
	pool_free(p);
}

/* The original (reference §3.3): exact-size free lists, a bump allocator,
 * and when full "evict LRU entries until a same-size slot frees". */
static void oe_run_original(unsigned pct_big, unsigned inserts, unsigned warm,
			    struct oe_result *r)
{
	memset(r, 0, sizeof(*r));
	uint64_t *fifo = calloc(inserts, sizeof(*fifo)); /* LRU = insert order */
	unsigned head = 0, tail = 0;
	uint64_t free_small = 0, free_big = 0, bump = 0, used = 0;
	uint64_t rng = 0x1234567 + pct_big, util_sum = 0;
	for (unsigned i = 0; i < inserts; i++) {
		uint64_t s = oe_size(&rng, pct_big), ev = 0;
		uint64_t *fl = s == OE_BIG ? &free_big : &free_small;
		if (!*fl && bump + s <= OE_POOL) {
			bump += s;
		} else {
			while (!*fl) {
				uint64_t z = fifo[head++];
				(*(z == OE_BIG ? &free_big : &free_small))++;
				used -= z;
				ev += z;
			}
			(*fl)--;
		}
		used += s;
		fifo[tail++] = s;
		if (i >= warm) {
			r->evicted += ev;
			r->over_page += ev > s ? ev - s : 0;
			util_sum += used * 10000 / OE_POOL;
		}
	}
	r->util = (double)util_sum / 10000.0 / (inserts - warm);
	free(fifo);
}

static double oe_pct(uint64_t part, uint64_t whole)
{
	return whole ? 100.0 * (double)part / (double)whole : 0;
}

static void oe_report(const char *name, unsigned pct_big, const struct oe_result *r,
		      bool has_opt)
{
	char mix[32], opt[48] = "n/a";
	if (pct_big == OE_ANY)
		snprintf(mix, sizeof(mix), "4K..4M any");
	else
		snprintf(mix, sizeof(mix), "%u%% 4MiB", pct_big);
	if (has_opt)
		snprintf(opt, sizeof(opt), "%6.3f%%", oe_pct(r->over_opt, r->evicted));
	cr_log_info("over-eviction %-8s %-10s: evicted %6llu MiB; beyond page "
		    "%6llu MiB = %6.3f%%; beyond optimum %s; util %.4f; "
		    "victim rank mean %.1f max %llu",
		    name, mix, (unsigned long long)(r->evicted >> 20),
		    (unsigned long long)(r->over_page >> 20),
		    oe_pct(r->over_page, r->evicted), opt, r->util, r->mean_rank,
		    (unsigned long long)r->max_rank);
}

/*
 * Bounds from measurement: over 4 seeds and the three mixes, span evicted
 * 0.00% beyond the page and beyond the optimum (naive LRU 0.7-33% and
 * 1.6-43%, the original's model 1.1-64% beyond the page); 1% leaves room
 * for other seeds and still fails any regression towards naive LRU.
 */
#define OE_BOUND_PCT 1.0

Test(pool, mixed_sizes_do_not_over_evict, .timeout = 120)
{
	/* Shares of 4 MiB pages (the rest 256 KiB), random order. About 110
	 * entries fit at 50%: a quarter of the inserts is warm-up (tens of pool
	 * fills), the rest is measured. */
	static const unsigned mixes[] = {50, 10, 90};
	for (unsigned m = 0; m < PC_ARRAY_LEN(mixes); m++) {
		unsigned pct = mixes[m];
		unsigned inserts = pct == 10 ? 30000 : 12000;
		unsigned warm = inserts / 4;
		struct oe_result span, lru, orig;
		oe_run_pool(POOL_EVICT_SPAN, pct, inserts, warm, &span);
		oe_run_pool(POOL_EVICT_LRU, pct, inserts, warm, &lru);
		oe_run_original(pct, inserts, warm, &orig);
		oe_report("span", pct, &span, true);
		oe_report("lru", pct, &lru, true);
		oe_report("original", pct, &orig, false);
		cr_assert_eq(span.failures, 0);
		cr_assert_gt(span.evicted, 0);
		double sp = oe_pct(span.over_page, span.evicted);
		double so = oe_pct(span.over_opt, span.evicted);
		cr_assert_lt(sp, OE_BOUND_PCT, "span beyond page %.2f%%", sp);
		cr_assert_lt(so, OE_BOUND_PCT, "span beyond optimum %.2f%%", so);
		cr_assert_lt(sp, oe_pct(lru.over_page, lru.evicted));
		cr_assert_lt(so, oe_pct(lru.over_opt, lru.evicted));
		cr_assert_geq(span.util, lru.util - 0.001);
		cr_assert_gt(span.util, orig.util);
	}
}

/* Any size from 4 KiB to 4 MiB: information, and no worse than naive. */
Test(pool, any_sizes_over_eviction_report, .timeout = 120)
{
	struct oe_result span, lru;
	oe_run_pool(POOL_EVICT_SPAN, OE_ANY, 16000, 4000, &span);
	oe_run_pool(POOL_EVICT_LRU, OE_ANY, 16000, 4000, &lru);
	oe_report("span", OE_ANY, &span, true);
	oe_report("lru", OE_ANY, &lru, true);
	cr_assert_eq(span.failures, 0);
	cr_assert_leq(span.over_opt, lru.over_opt);
	cr_assert_geq(span.util, lru.util - 0.001);
}

/* ---- concurrency --------------------------------------------------------- */

#define ST_KEYS 600
#define ST_POOL (64 * MiB)
#define ST_MAX_PAGE (1 * MiB)

struct stress {
	struct pool *p;
	atomic_bool stop;
	atomic_ulong writes, aborts, deletes, enospc;
	atomic_ulong gets, hits, addr_pins, addr_valid, addr_stale, wrong;
	atomic_ulong evicted, cb_contains, errors;
};

struct st_key {
	char key[16];
	size_t keylen;
	uint64_t seed, len, kh, kl;
	bool checksum;
};
static struct st_key st_keys[ST_KEYS];

static void st_keys_init(void)
{
	static const uint64_t sizes[] = {4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB,
					 1 * MiB};
	for (unsigned i = 0; i < ST_KEYS; i++) {
		struct st_key *k = &st_keys[i];
		k->keylen = (size_t)snprintf(k->key, sizeof(k->key), "st-%u", i);
		k->seed = key_seed(k->key);
		uint64_t s = sizes[k->seed % PC_ARRAY_LEN(sizes)];
		k->len = s - (k->seed >> 8) % PC_MIN(s, 4096); /* odd lengths too */
		k->checksum = i % 4 != 0;
		pool_key_hash(k->key, k->keylen, &k->kh, &k->kl);
	}
}

static void st_evict_cb(void *arg, const char *key, size_t keylen, uint64_t gen)
{
	struct stress *st = arg;
	atomic_fetch_add(&st->evicted, 1);
	if (pool_contains(st->p, key, keylen))
		atomic_fetch_add(&st->cb_contains, 1); /* re-published meanwhile */
}

static void *st_writer(void *arg)
{
	struct stress *st = arg;
	uint64_t rng = (uint64_t)(uintptr_t)&rng | 1;
	while (!atomic_load(&st->stop)) {
		const struct st_key *k = &st_keys[rng_next(&rng) % ST_KEYS];
		unsigned op = (unsigned)(rng_next(&rng) % 100);
		if (op < 3) {
			if (pool_delete(st->p, k->key, k->keylen) == 0)
				atomic_fetch_add(&st->deletes, 1);
			continue;
		}
		struct pool_ref ref;
		uint8_t *dst;
		int rc = pool_reserve(st->p, k->key, k->keylen, k->len, &ref, &dst);
		if (rc == -ENOSPC) {
			atomic_fetch_add(&st->enospc, 1);
			continue;
		}
		if (rc) {
			atomic_fetch_add(&st->errors, 1);
			continue;
		}
		oracle_fill(dst, k->len, k->seed);
		if (op < 6) {
			pool_abort(st->p, &ref);
			atomic_fetch_add(&st->aborts, 1);
			continue;
		}
		if (pool_commit(st->p, &ref, k->checksum, NULL, NULL))
			atomic_fetch_add(&st->errors, 1);
		atomic_fetch_add(&st->writes, 1);
	}
	return NULL;
}

/* A remembered location, as a directory record would hold it. */
struct st_loc {
	unsigned k;
	uintptr_t addr;
	uint64_t gen;
};

static bool st_verify(const struct st_key *k,
		      const uint8_t *hdr, uint64_t gen)
{
	int rc = pool_hdr_check(hdr, POOL_HDR_BYTES + k->len, k->kh, k->kl, gen,
				k->len, k->checksum);
	if (rc == 0 && oracle_check(hdr + POOL_HDR_BYTES, k->len, k->seed) < 0)
		return true;
	return false;
}

static void *st_reader(void *arg)
{
	struct stress *st = arg;
	uint64_t rng = (uint64_t)(uintptr_t)&rng | 3;
	struct st_loc locs[64];
	unsigned nloc = 0;
	while (!atomic_load(&st->stop)) {
		unsigned ki = (unsigned)(rng_next(&rng) % ST_KEYS);
		const struct st_key *k = &st_keys[ki];
		struct pool_ref ref;
		const uint8_t *hdr;
		uint64_t len, gen;
		atomic_fetch_add(&st->gets, 1);
		if (pool_get(st->p, k->key, k->keylen, &ref, &hdr, &len, &gen) == 0) {
			atomic_fetch_add(&st->hits, 1);
			if (len != k->len || !st_verify(k, hdr, gen))
				atomic_fetch_add(&st->wrong, 1);
			locs[nloc++ % 64] = (struct st_loc){ki, (uintptr_t)hdr, gen};
			/* Still intact after others had time to churn. */
			sched_yield();
			if (!st_verify(k, hdr, gen))
				atomic_fetch_add(&st->wrong, 1);
			pool_unpin(st->p, &ref);
		}
		if (nloc == 0)
			continue;
		/* A remote read through a possibly stale record. */
		struct st_loc l = locs[rng_next(&rng) % PC_MIN(nloc, 64u)];
		const struct st_key *lk = &st_keys[l.k];
		if (pool_pin_addr(st->p, l.addr, POOL_HDR_BYTES + lk->len, &ref) == 0) {
			atomic_fetch_add(&st->addr_pins, 1);
			const uint8_t *h = (const uint8_t *)l.addr;
			int rc = pool_hdr_check(h, POOL_HDR_BYTES + lk->len, lk->kh,
						lk->kl, l.gen, lk->len, lk->checksum);
			if (rc == 0) {
				atomic_fetch_add(&st->addr_valid, 1);
				if (oracle_check(h + POOL_HDR_BYTES, lk->len, lk->seed) >= 0)
					atomic_fetch_add(&st->wrong, 1);
			} else {
				atomic_fetch_add(&st->addr_stale, 1);
			}
			pool_unpin(st->p, &ref);
		} else {
			atomic_fetch_add(&st->addr_stale, 1);
		}
	}
	return NULL;
}

Test(pool, stress_two_writers_two_readers_zero_wrong_pages, .timeout = 120)
{
	st_keys_init();
	struct stress st = {0};
	st.p = mk_pool(ST_POOL, ST_MAX_PAGE, 2, POOL_EVICT_SPAN);
	pool_set_evict_cb(st.p, st_evict_cb, &st);
	pthread_t w[2], r[2];
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(pthread_create(&w[i], NULL, st_writer, &st), 0);
		cr_assert_eq(pthread_create(&r[i], NULL, st_reader, &st), 0);
	}
	/* POOL_STRESS_SECONDS stretches the run for soak testing. */
	const char *env = getenv("POOL_STRESS_SECONDS");
	struct timespec ts = {.tv_sec = env ? atoi(env) : 3};
	nanosleep(&ts, NULL);
	/* On a loaded machine (a sanitizer build beside other tests) 3 s may
	 * not be enough to exercise everything checked below: go on until it
	 * was, for at most a minute. What is checked stays the same. */
	for (int i = 0; i < 600 && (atomic_load(&st.hits) <= 100 ||
				    atomic_load(&st.addr_valid) == 0 ||
				    atomic_load(&st.evicted) <= 100); i++) {
		struct timespec tick = {.tv_nsec = 100 * 1000 * 1000};
		nanosleep(&tick, NULL);
	}
	atomic_store(&st.stop, true);
	for (int i = 0; i < 2; i++) {
		pthread_join(w[i], NULL);
		pthread_join(r[i], NULL);
	}
	struct pool_stats ps = stats_of(st.p);
	cr_log_info("stress: %lu writes %lu aborts %lu deletes %lu enospc; "
		    "%lu gets %lu hits; %lu addr pins (%lu valid), %lu stale; "
		    "%llu evictions; wrong pages %lu",
		    atomic_load(&st.writes), atomic_load(&st.aborts),
		    atomic_load(&st.deletes), atomic_load(&st.enospc),
		    atomic_load(&st.gets), atomic_load(&st.hits),
		    atomic_load(&st.addr_pins), atomic_load(&st.addr_valid),
		    atomic_load(&st.addr_stale),
		    (unsigned long long)ps.evictions, atomic_load(&st.wrong));
	cr_assert_eq(atomic_load(&st.wrong), 0, "wrong pages");
	cr_assert_eq(atomic_load(&st.errors), 0);
	cr_assert_gt(atomic_load(&st.hits), 100);
	cr_assert_gt(atomic_load(&st.addr_valid), 0);
	cr_assert_gt(ps.evictions, 100);
	cr_assert_eq(ps.evictions, atomic_load(&st.evicted));
	cr_assert_eq(ps.pinned, 0);
	cr_assert_eq(pool_audit(st.p), 0);
	/* Nothing leaked: deleting every key empties the pool... */
	for (unsigned i = 0; i < ST_KEYS; i++)
		pool_delete(st.p, st_keys[i].key, st_keys[i].keylen);
	ps = stats_of(st.p);
	cr_assert_eq(ps.keys, 0);
	cr_assert_eq(ps.bytes_used, 0);
	/* ...and each stripe is one free extent again: a max page fits in both. */
	cr_assert_eq(pool_audit(st.p), 0);
	pool_free(st.p);
}

/* ---- throughput (information only) -------------------------------------- */

Test(pool, bench_publish_throughput, .timeout = 120)
{
	const size_t pool_bytes = 512 * MiB;
	struct pool *p = mk_pool(pool_bytes, 4 * MiB, 0, POOL_EVICT_SPAN);
	uint8_t *src = malloc(4 * MiB);
	oracle_fill(src, 4 * MiB, 42);
	char key[32];
	/* Fault the region in first so the runs measure copies, not faults. */
	for (unsigned i = 0; i < pool_bytes / (4 * MiB) * 2; i++) {
		snprintf(key, sizeof(key), "w%u", i);
		struct pool_ref ref;
		uint8_t *dst;
		cr_assert_eq(pool_reserve(p, key, strlen(key), 4 * MiB - 8192, &ref, &dst), 0);
		memset(dst, 0, 4 * MiB - 8192);
		cr_assert_eq(pool_commit(p, &ref, false, NULL, NULL), 0);
	}
	static const uint64_t sizes[] = {256 * KiB, 4 * MiB};
	for (unsigned si = 0; si < 2; si++) {
		for (int cs = 0; cs < 2; cs++) {
			uint64_t len = sizes[si], bytes = 0, n = 0;
			uint64_t t0 = pc_now_ns(), t1;
			do {
				snprintf(key, sizeof(key), "b%llu", (unsigned long long)n++);
				struct pool_ref ref;
				uint8_t *dst;
				cr_assert_eq(pool_reserve(p, key, strlen(key), len, &ref, &dst), 0);
				memcpy(dst, src, len);
				cr_assert_eq(pool_commit(p, &ref, cs, NULL, NULL), 0);
				bytes += len;
				t1 = pc_now_ns();
			} while (t1 - t0 < 400000000ull);
			cr_log_info("publish %4llu KiB pages, checksum %-3s: %.2f GB/s "
				    "(%.1f us/page, 1 thread)",
				    (unsigned long long)(len >> 10), cs ? "on" : "off",
				    (double)bytes / (double)(t1 - t0),
				    (double)(t1 - t0) / 1000.0 / (double)n);
		}
	}
	/* Metadata cost alone (no copy; the lock is held for all of it but
	 * the key copy): a steady mix of 256 KiB and 4 MiB pages, each
	 * reserve evicting. */
	uint64_t rng = 99, n = 0, t0 = pc_now_ns(), t1;
	do {
		snprintf(key, sizeof(key), "md%llu", (unsigned long long)n++);
		struct pool_ref ref;
		uint8_t *dst;
		uint64_t len = rng_next(&rng) % 2 ? 4 * MiB - 8192 : 256 * KiB;
		cr_assert_eq(pool_reserve(p, key, strlen(key), len, &ref, &dst), 0);
		cr_assert_eq(pool_commit(p, &ref, false, NULL, NULL), 0);
		t1 = pc_now_ns();
	} while (t1 - t0 < 200000000ull);
	cr_log_info("reserve+commit without copy, mixed sizes, evicting: %.2f us/op",
		    (double)(t1 - t0) / 1000.0 / (double)n);
	free(src);
	pool_free(p);
}

/* Prefault commits the whole region in the background and never changes a
 * byte of an entry written before or while it runs. */
Test(pool, prefault_commits_the_region_and_keeps_entries)
{
	struct pool *p = mk_pool(64 * MiB, 1 * MiB, 1, POOL_EVICT_SPAN);
	uint8_t *base;
	size_t len;
	pool_region(p, &base, &len);
	cr_assert_eq(put(p, "before", 300000, NULL, NULL), 0);
	cr_assert_eq(pool_prefault_start(p), 0);
	cr_assert_eq(pool_prefault_start(p), -EALREADY);
	char key[32];
	for (unsigned i = 0; i < 32; i++) { /* writers race the thread */
		snprintf(key, sizeof(key), "during-%u", i);
		cr_assert_eq(put(p, key, 200000, NULL, NULL), 0);
	}
	uint64_t t0 = pc_now_ns();
	while (pool_prefaulted(p) < len && pc_now_ns() - t0 < 50000000000ull)
		usleep(1000);
	cr_assert_eq(pool_prefaulted(p), len, "prefault stopped at %llu of %zu",
		     (unsigned long long)pool_prefaulted(p), len);
	/* Every page of the region is resident now. */
	size_t pages = len / 4096;
	unsigned char *vec = malloc(pages);
	cr_assert_eq(mincore(base, len, vec), 0);
	size_t resident = 0;
	for (size_t i = 0; i < pages; i++)
		resident += vec[i] & 1;
	free(vec);
	cr_assert_eq(resident, pages, "%zu of %zu pages resident", resident,
		     pages);
	cr_assert_eq(get_check(p, "before", 300000, key_seed("before")), 0);
	for (unsigned i = 0; i < 32; i++) {
		snprintf(key, sizeof(key), "during-%u", i);
		cr_assert_eq(get_check(p, key, 200000, key_seed(key)), 0, "%s", key);
	}
	pool_free(p);
}

/* pool_free stops a prefault still running (a node stopping at once). */
Test(pool, free_stops_a_running_prefault)
{
	struct pool *p = mk_pool(512 * MiB, 1 * MiB, 0, POOL_EVICT_SPAN);
	cr_assert_eq(pool_prefault_start(p), 0);
	pool_free(p);
}
