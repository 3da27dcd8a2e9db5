/*
 * storage/slot_region.c — the slotmap's slot region (storage/slot_region.h).
 *
 * Owns: layout arithmetic, hashes, slot validation, and the owner-side
 * seqlock writes, reads and deletes. Threading: any thread. A bucket's
 * writers take its lock (a striped table of mutexes) for O(ways) work:
 * claiming a way, committing it, emptying ways. Payload bytes are copied
 * outside the lock, into a way marked busy (odd sequence), so no other
 * writer picks it and every reader rejects it until the commit.
 *
 * Memory order (the seqlock): a writer stores the odd sequence, then a
 * release fence, then header fields and payload; the commit writes the
 * header and trailer and stores the even sequence with release. A local
 * reader loads the sequence with acquire, copies, fences with acquire and
 * loads it again: equal and even means the copy is one write's bytes.
 * Remote readers get no such ordering (a READ is not atomic): they rely on
 * slot_judge's checksum, which is why the header carries one.
 */
#include "storage/slot_region.h"

#include <errno.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/checksum.h"

/* Seeds: the key hash and the bucket hash must be independent of each
 * other and of the ring's hash (storage/ring.c hashes with seed 0). */
#define SLOT_SEED_KEY 0x736c6f746b657931ull    /* "slotkey1" */
#define SLOT_SEED_BUCKET 0x736c6f746275636bull /* "slotbuck" */
#define SLOT_LOCKS_MAX 4096u
#define SLOT_READ_TRIES 4

struct slot_region {
	uint8_t *base;
	struct slot_layout l;
	pthread_mutex_t *locks;
	uint32_t nlocks; /* a power of two */
	_Atomic uint64_t clock;
	_Atomic uint64_t writes, evictions, busy_refusals, deletes;
	_Atomic uint64_t read_retries, read_rejects;
};

void slot_key_of(struct slot_key *k, const void *key, size_t klen)
{
	XXH128_hash_t h = XXH3_128bits_withSeed(key, klen, SLOT_SEED_KEY);
	k->lo = h.low64;
	k->hi = h.high64;
	k->bucket_hash = XXH3_64bits_withSeed(key, klen, SLOT_SEED_BUCKET);
}

uint64_t slot_stride_for(uint64_t max_payload)
{
	uint64_t n = SLOT_HDR_BYTES + max_payload + SLOT_TRAILER_BYTES;
	return (n + 63) & ~(uint64_t)63;
}

static int spec_cmp(const void *a, const void *b)
{
	const struct slot_class_spec *x = a, *y = b;
	return (x->max_payload > y->max_payload) -
	       (x->max_payload < y->max_payload);
}

static int refuse(const char **why, const char *reason)
{
	if (why)
		*why = reason;
	return -EINVAL;
}

int slot_layout_plan(struct slot_layout *l, uint64_t region_bytes,
		     const struct slot_class_spec *specs, unsigned n,
		     const char **why)
{
	memset(l, 0, sizeof(*l));
	if (n == 0 || n > SLOT_CLASSES_MAX)
		return refuse(why, "between 1 and 8 size classes");
	struct slot_class_spec s[SLOT_CLASSES_MAX];
	memcpy(s, specs, n * sizeof(*s));
	qsort(s, n, sizeof(*s), spec_cmp);
	uint32_t shares = 0;
	for (unsigned i = 0; i < n; i++) {
		if (s[i].max_payload < SLOT_PAYLOAD_MIN ||
		    s[i].max_payload > SLOT_PAYLOAD_MAX)
			return refuse(why, "a class's page size is below 4 KiB "
					   "or above 1 GiB");
		if (i > 0 && s[i].max_payload == s[i - 1].max_payload)
			return refuse(why, "two classes of one page size");
		if (s[i].ways == 0 || s[i].ways > SLOT_WAYS_MAX)
			return refuse(why, "ways must be 1 to 64");
		if (s[i].buckets == 0 &&
		    (s[i].share_pm == 0 || s[i].share_pm > 1000))
			return refuse(why, "a class needs a bucket count or a "
					   "share of the region");
		if (s[i].buckets == 0)
			shares += s[i].share_pm;
	}
	if (shares > 1000)
		return refuse(why, "the classes' shares exceed the region");
	uint64_t off = 0;
	for (unsigned i = 0; i < n; i++) {
		struct slot_class *c = &l->cls[i];
		c->max_payload = s[i].max_payload;
		c->ways = s[i].ways;
		c->stride = slot_stride_for(c->max_payload);
		c->buckets = s[i].buckets;
		if (c->buckets == 0) {
			/* share of the region in bytes, then whole buckets */
			unsigned __int128 b =
				(unsigned __int128)region_bytes * s[i].share_pm /
				1000;
			c->buckets = (uint64_t)(b / slot_bucket_bytes(c));
		}
		if (c->buckets == 0)
			return refuse(why, "the region is too small for one "
					   "bucket of a class");
		c->offset = off;
		off += c->buckets * slot_bucket_bytes(c);
	}
	if (off > region_bytes)
		return refuse(why, "the classes' buckets exceed the region");
	l->nclasses = n;
	l->bytes = off;
	return 0;
}

int slot_class_for(const struct slot_layout *l, uint64_t len)
{
	for (uint32_t i = 0; i < l->nclasses; i++)
		if (len <= l->cls[i].max_payload)
			return (int)i;
	return -E2BIG;
}

int slot_class_at(const struct slot_layout *l, uint64_t off)
{
	for (uint32_t i = 0; i < l->nclasses; i++) {
		const struct slot_class *c = &l->cls[i];
		if (off >= c->offset &&
		    off - c->offset < c->buckets * slot_bucket_bytes(c))
			return (int)i;
	}
	return -EFAULT;
}

static uint64_t bucket_index(const struct slot_class *c,
			     const struct slot_key *k)
{
	/* Lemire's multiply-shift: uniform over buckets, no division */
	return (uint64_t)(((unsigned __int128)k->bucket_hash * c->buckets) >>
			  64);
}

uint64_t slot_bucket_off(const struct slot_class *c,
			 const struct slot_key *k)
{
	return c->offset + bucket_index(c, k) * slot_bucket_bytes(c);
}

uint64_t slot_sum(const struct slot_key *k, uint64_t len,
		  const void *payload)
{
	return slot_sum_hashed(k, len, pc_page_sum(payload, len));
}

static inline uint64_t *trailer_of(void *slot, const struct slot_class *c)
{
	return (uint64_t *)((uint8_t *)slot + c->stride - SLOT_TRAILER_BYTES);
}

static inline bool key_eq(const struct slot_hdr *h, const struct slot_key *k)
{
	return h->key_lo == k->lo && h->key_hi == k->hi;
}

/* Judge a snapshot whose header and payload start at slot and whose
 * trailer is at trailer_off from it: the stride's last 8 bytes in a
 * bucket, right after the payload in a selection (UINT64_MAX: the
 * selection's size does not match its header — torn). */
static enum slot_verdict judge(const uint8_t *slot, uint64_t trailer_off,
			       const struct slot_class *c,
			       const struct slot_key *k, uint64_t want_len,
			       bool check_sum, uint64_t *len)
{
	struct slot_hdr h;
	memcpy(&h, slot, sizeof(h));
	if (h.seq & 1)
		return SLOT_BUSY;
	if (h.magic == 0)
		return SLOT_EMPTY;
	if (!key_eq(&h, k))
		return SLOT_OTHER;
	if (h.magic != SLOT_MAGIC || h.version != SLOT_VERSION || h.seq == 0)
		return SLOT_BAD;
	if (h.len > c->max_payload || (want_len && h.len != want_len))
		return SLOT_BAD;
	if (trailer_off == UINT64_MAX)
		return SLOT_BAD;
	uint64_t tr;
	memcpy(&tr, slot + trailer_off, sizeof(tr));
	if (tr != h.seq)
		return SLOT_BAD;
	if (check_sum &&
	    slot_sum(k, h.len, (const uint8_t *)slot + SLOT_HDR_BYTES) != h.sum)
		return SLOT_BAD;
	if (len)
		*len = h.len;
	return SLOT_HIT;
}

enum slot_verdict slot_judge(const void *slot, const struct slot_class *c,
			     const struct slot_key *k, uint64_t want_len,
			     bool check_sum, uint64_t *len)
{
	return judge(slot, c->stride - SLOT_TRAILER_BYTES, c, k, want_len,
		     check_sum, len);
}

enum slot_verdict slot_judge_sel(const void *sel, uint64_t n,
				 const struct slot_class *c,
				 const struct slot_key *k, uint64_t want_len,
				 bool check_sum, uint64_t *len)
{
	if (n == 0)
		return SLOT_EMPTY; /* the owner had nothing of the key */
	if (n < SLOT_HDR_BYTES + SLOT_TRAILER_BYTES)
		return SLOT_BAD;
	uint64_t plen;
	memcpy(&plen, (const uint8_t *)sel + offsetof(struct slot_hdr, len),
	       sizeof(plen));
	uint64_t toff = n - SLOT_TRAILER_BYTES;
	/* the trailer must follow exactly the header's length of payload */
	if (plen > c->max_payload || toff - SLOT_HDR_BYTES != plen)
		toff = UINT64_MAX;
	return judge(sel, toff, c, k, want_len, check_sum, len);
}

int slot_find(const void *bucket, const struct slot_class *c,
	      const struct slot_key *k, uint64_t want_len, bool check_sum,
	      uint64_t *len, struct slot_scan *sc)
{
	const uint8_t *b = bucket;
	for (uint32_t w = 0; w < c->ways; w++) {
		const uint8_t *slot = b + (uint64_t)w * c->stride;
		switch (slot_judge(slot, c, k, want_len, check_sum, len)) {
		case SLOT_HIT:
			return (int)w;
		case SLOT_BAD:
			if (sc)
				sc->rejected++;
			break;
		case SLOT_BUSY:
			if (sc && key_eq((const struct slot_hdr *)slot, k))
				sc->busy++;
			break;
		default:
			break;
		}
	}
	return -ENOENT;
}

/* ---- The owner's region ---- */

int slot_region_new(struct slot_region **out, void *base,
		    const struct slot_layout *l)
{
	struct slot_region *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->base = base;
	s->l = *l;
	uint64_t buckets = 0;
	for (uint32_t i = 0; i < l->nclasses; i++)
		buckets += l->cls[i].buckets;
	s->nlocks = 1;
	while (s->nlocks < SLOT_LOCKS_MAX && s->nlocks < buckets)
		s->nlocks <<= 1;
	s->locks = calloc(s->nlocks, sizeof(*s->locks));
	if (!s->locks) {
		free(s);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < s->nlocks; i++)
		pthread_mutex_init(&s->locks[i], NULL);
	*out = s;
	return 0;
}

void slot_region_free(struct slot_region *s)
{
	if (!s)
		return;
	for (uint32_t i = 0; i < s->nlocks; i++)
		pthread_mutex_destroy(&s->locks[i]);
	free(s->locks);
	free(s);
}

const struct slot_layout *slot_region_layout(const struct slot_region *s)
{
	return &s->l;
}

void *slot_region_base(const struct slot_region *s)
{
	return s->base;
}

static pthread_mutex_t *lock_of(struct slot_region *s, uint32_t cls,
				uint64_t bucket)
{
	uint64_t h = (bucket * 0x9e3779b97f4a7c15ull) ^ cls;
	return &s->locks[(h >> 17) & (s->nlocks - 1)];
}

static uint8_t *slot_at(struct slot_region *s, uint32_t cls, uint64_t bucket,
			uint32_t way)
{
	const struct slot_class *c = &s->l.cls[cls];
	return s->base + c->offset + bucket * slot_bucket_bytes(c) +
	       (uint64_t)way * c->stride;
}

static _Atomic uint64_t *seq_of(uint8_t *slot)
{
	return (_Atomic uint64_t *)(slot + offsetof(struct slot_hdr, seq));
}

/* Empty an idle slot (caller holds the bucket lock): readers see the odd
 * sequence, then an empty slot with a newer even one. */
static void slot_empty(uint8_t *slot, const struct slot_class *c)
{
	struct slot_hdr *h = (struct slot_hdr *)slot;
	uint64_t seq = atomic_load_explicit(seq_of(slot), memory_order_relaxed);
	atomic_store_explicit(seq_of(slot), seq + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	h->magic = 0;
	h->key_lo = h->key_hi = 0;
	h->len = 0;
	h->sum = 0;
	*trailer_of(slot, c) = seq + 2;
	atomic_store_explicit(seq_of(slot), seq + 2, memory_order_release);
}

int slot_write_begin(struct slot_region *s, const struct slot_key *k,
		     uint64_t len, struct slot_wr *w)
{
	int cls = slot_class_for(&s->l, len);
	if (cls < 0)
		return cls;
	const struct slot_class *c = &s->l.cls[cls];
	uint64_t bucket = bucket_index(c, k);
	pthread_mutex_t *mu = lock_of(s, (uint32_t)cls, bucket);
	pthread_mutex_lock(mu);
	int same = -1, empty = -1, oldest = -1;
	uint64_t oldest_stamp = UINT64_MAX;
	for (uint32_t wy = 0; wy < c->ways; wy++) {
		const struct slot_hdr *h =
			(const struct slot_hdr *)slot_at(s, (uint32_t)cls,
							 bucket, wy);
		if (atomic_load_explicit(seq_of((uint8_t *)h),
					 memory_order_relaxed) &
		    1)
			continue; /* another writer's */
		if (h->magic != SLOT_MAGIC || h->version != SLOT_VERSION) {
			if (empty < 0)
				empty = (int)wy;
			continue;
		}
		if (key_eq(h, k) && same < 0)
			same = (int)wy;
		if (h->stamp < oldest_stamp) {
			oldest_stamp = h->stamp;
			oldest = (int)wy;
		}
	}
	int way = same >= 0 ? same : empty >= 0 ? empty : oldest;
	if (way < 0) {
		pthread_mutex_unlock(mu);
		atomic_fetch_add_explicit(&s->busy_refusals, 1,
					  memory_order_relaxed);
		return -EBUSY;
	}
	if (same < 0 && empty < 0)
		atomic_fetch_add_explicit(&s->evictions, 1,
					  memory_order_relaxed);
	uint8_t *slot = slot_at(s, (uint32_t)cls, bucket, (uint32_t)way);
	struct slot_hdr *h = (struct slot_hdr *)slot;
	uint64_t seq = atomic_load_explicit(seq_of(slot), memory_order_relaxed);
	atomic_store_explicit(seq_of(slot), seq + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	/* The header names its new key while busy, so a second writer of
	 * the key does not take this way for "same key" and readers can
	 * count a busy page of theirs. */
	h->magic = SLOT_MAGIC;
	h->version = SLOT_VERSION;
	h->flags = 0;
	h->key_lo = k->lo;
	h->key_hi = k->hi;
	h->len = len;
	pthread_mutex_unlock(mu);
	*w = (struct slot_wr){.key = *k,
			      .cls = (uint32_t)cls,
			      .way = (uint32_t)way,
			      .bucket = bucket,
			      .len = len,
			      .seq = seq + 1,
			      .payload = slot + SLOT_HDR_BYTES};
	return 0;
}

uint64_t slot_sum_hashed(const struct slot_key *k, uint64_t len,
			 uint64_t payload_hash)
{
	uint64_t v[4] = {k->lo, k->hi, len, payload_hash};
	return XXH3_64bits(v, sizeof(v));
}

void slot_write_commit_hashed(struct slot_region *s, struct slot_wr *w,
			      uint64_t payload_hash)
{
	const struct slot_class *c = &s->l.cls[w->cls];
	uint8_t *slot = slot_at(s, w->cls, w->bucket, w->way);
	struct slot_hdr *h = (struct slot_hdr *)slot;
	uint64_t sum = slot_sum_hashed(&w->key, w->len, payload_hash);
	pthread_mutex_t *mu = lock_of(s, w->cls, w->bucket);
	pthread_mutex_lock(mu);
	h->stamp = atomic_fetch_add_explicit(&s->clock, 1,
					     memory_order_relaxed) +
		   1;
	h->sum = sum;
	h->rsvd = 0;
	*trailer_of(slot, c) = w->seq + 1;
	atomic_store_explicit(seq_of(slot), w->seq + 1, memory_order_release);
	for (uint32_t wy = 0; wy < c->ways; wy++) {
		if (wy == w->way)
			continue;
		uint8_t *o = slot_at(s, w->cls, w->bucket, wy);
		const struct slot_hdr *oh = (const struct slot_hdr *)o;
		if (!(atomic_load_explicit(seq_of(o), memory_order_relaxed) &
		      1) &&
		    oh->magic == SLOT_MAGIC && key_eq(oh, &w->key))
			slot_empty(o, c);
	}
	pthread_mutex_unlock(mu);
	atomic_fetch_add_explicit(&s->writes, 1, memory_order_relaxed);
}

void slot_write_commit(struct slot_region *s, struct slot_wr *w)
{
	/* the payload's hash outside the bucket lock */
	slot_write_commit_hashed(s, w, pc_page_sum(w->payload, w->len));
}

void slot_write_abort(struct slot_region *s, struct slot_wr *w)
{
	const struct slot_class *c = &s->l.cls[w->cls];
	uint8_t *slot = slot_at(s, w->cls, w->bucket, w->way);
	struct slot_hdr *h = (struct slot_hdr *)slot;
	pthread_mutex_t *mu = lock_of(s, w->cls, w->bucket);
	pthread_mutex_lock(mu);
	h->magic = 0;
	h->key_lo = h->key_hi = 0;
	h->len = 0;
	h->sum = 0;
	*trailer_of(slot, c) = w->seq + 1;
	atomic_store_explicit(seq_of(slot), w->seq + 1, memory_order_release);
	pthread_mutex_unlock(mu);
}

int slot_write(struct slot_region *s, const struct slot_key *k,
	       const void *page, uint64_t len)
{
	struct slot_wr w;
	int rc = slot_write_begin(s, k, len, &w);
	if (rc < 0)
		return rc;
	memcpy(w.payload, page, len);
	slot_write_commit(s, &w);
	return 0;
}

/* The way of key in its bucket, judged on the live header only (the
 * caller's seqlock check and checksum follow), or -ENOENT. */
static int live_way(struct slot_region *s, uint32_t cls, uint64_t bucket,
		    const struct slot_key *k, uint64_t want_len, uint64_t *seq,
		    uint64_t *len, uint64_t *sum)
{
	const struct slot_class *c = &s->l.cls[cls];
	for (uint32_t wy = 0; wy < c->ways; wy++) {
		uint8_t *slot = slot_at(s, cls, bucket, wy);
		uint64_t s1 = atomic_load_explicit(seq_of(slot),
						   memory_order_acquire);
		const struct slot_hdr *h = (const struct slot_hdr *)slot;
		if ((s1 & 1) || h->magic != SLOT_MAGIC || !key_eq(h, k))
			continue;
		/* Read once: a writer may change it under us (the callers'
		 * seqlock or the reader's checks catch that), but the bound
		 * checked must be the value handed out. */
		uint64_t n = *(volatile const uint64_t *)&h->len;
		if (n > c->max_payload || (want_len && n != want_len))
			continue;
		*seq = s1;
		*len = n;
		*sum = *(volatile const uint64_t *)&h->sum;
		return (int)wy;
	}
	return -ENOENT;
}

int slot_pick(struct slot_region *s, uint64_t off, uint64_t n,
	      uint64_t key_lo, uint64_t key_hi, struct slot_sel *out)
{
	int cls = slot_class_at(&s->l, off);
	if (cls < 0)
		return -EINVAL;
	const struct slot_class *c = &s->l.cls[cls];
	if (n != slot_bucket_bytes(c) || (off - c->offset) % n != 0)
		return -EINVAL;
	uint64_t bucket = (off - c->offset) / n;
	struct slot_key k = {.lo = key_lo, .hi = key_hi};
	uint64_t seq, len, sum;
	int wy = live_way(s, (uint32_t)cls, bucket, &k, 0, &seq, &len, &sum);
	if (wy < 0)
		return 0;
	*out = (struct slot_sel){
		.slot_off = off + (uint64_t)wy * c->stride,
		.len = len,
		.trailer_off = c->stride - SLOT_TRAILER_BYTES,
	};
	return 1;
}

/* Classes a key of want_len may be in: its own, or every one. */
static void class_range(const struct slot_layout *l, uint64_t want_len,
			uint32_t *lo, uint32_t *hi)
{
	if (want_len) {
		int c = slot_class_for(l, want_len);
		*lo = c < 0 ? l->nclasses : (uint32_t)c;
		*hi = c < 0 ? l->nclasses : (uint32_t)c + 1;
	} else {
		*lo = 0;
		*hi = l->nclasses;
	}
}

int64_t slot_locate(struct slot_region *s, const struct slot_key *k,
		    uint64_t want_len, struct slot_loc *loc)
{
	uint32_t lo, hi;
	class_range(&s->l, want_len, &lo, &hi);
	for (uint32_t cls = lo; cls < hi; cls++) {
		const struct slot_class *c = &s->l.cls[cls];
		uint64_t bucket = bucket_index(c, k);
		for (int t = 0; t < SLOT_READ_TRIES; t++) {
			uint64_t seq, len, sum;
			int wy = live_way(s, cls, bucket, k, want_len, &seq,
					  &len, &sum);
			if (wy < 0)
				break;
			uint8_t *slot = slot_at(s, cls, bucket, (uint32_t)wy);
			uint64_t tr = *(volatile uint64_t *)trailer_of(slot, c);
			atomic_thread_fence(memory_order_acquire);
			if (atomic_load_explicit(seq_of(slot),
						 memory_order_relaxed) != seq) {
				atomic_fetch_add_explicit(&s->read_retries, 1,
							  memory_order_relaxed);
				continue;
			}
			if (tr != seq)
				break; /* not a committed write: not whole */
			*loc = (struct slot_loc){.slot = slot,
						 .payload = slot +
							    SLOT_HDR_BYTES,
						 .seq = seq,
						 .len = len,
						 .sum = sum};
			return (int64_t)len;
		}
	}
	return -ENOENT;
}

bool slot_loc_still(const struct slot_loc *loc)
{
	atomic_thread_fence(memory_order_acquire);
	return atomic_load_explicit(seq_of(loc->slot), memory_order_relaxed) ==
	       loc->seq;
}

bool slot_loc_sum_ok(const struct slot_key *k, const struct slot_loc *loc,
		     uint64_t payload_hash)
{
	return slot_sum_hashed(k, loc->len, payload_hash) == loc->sum;
}

int64_t slot_read(struct slot_region *s, const struct slot_key *k,
		  uint64_t want_len, void *dst, uint64_t cap)
{
	for (int t = 0; t < SLOT_READ_TRIES; t++) {
		struct slot_loc loc;
		int64_t len = slot_locate(s, k, want_len, &loc);
		if (len < 0)
			return len;
		if ((uint64_t)len > cap)
			return -ENOSPC;
		memcpy(dst, loc.payload, (size_t)len);
		if (!slot_loc_still(&loc)) {
			atomic_fetch_add_explicit(&s->read_retries, 1,
						  memory_order_relaxed);
			continue;
		}
		if (slot_loc_sum_ok(k, &loc, pc_page_sum(dst, (size_t)len)))
			return len;
		atomic_fetch_add_explicit(&s->read_rejects, 1,
					  memory_order_relaxed);
		return -ENOENT;
	}
	return -EAGAIN;
}

bool slot_exists(struct slot_region *s, const struct slot_key *k,
		 uint64_t want_len)
{
	for (int t = 0; t < SLOT_READ_TRIES; t++) {
		struct slot_loc loc;
		if (slot_locate(s, k, want_len, &loc) < 0)
			return false;
		bool whole =
			slot_loc_sum_ok(k, &loc, pc_page_sum(loc.payload, loc.len));
		if (!slot_loc_still(&loc)) {
			atomic_fetch_add_explicit(&s->read_retries, 1,
						  memory_order_relaxed);
			continue;
		}
		if (!whole)
			atomic_fetch_add_explicit(&s->read_rejects, 1,
						  memory_order_relaxed);
		return whole;
	}
	return false;
}

int slot_del(struct slot_region *s, const struct slot_key *k)
{
	int n = 0;
	for (uint32_t cls = 0; cls < s->l.nclasses; cls++) {
		const struct slot_class *c = &s->l.cls[cls];
		uint64_t bucket = bucket_index(c, k);
		pthread_mutex_t *mu = lock_of(s, cls, bucket);
		pthread_mutex_lock(mu);
		for (uint32_t wy = 0; wy < c->ways; wy++) {
			uint8_t *slot = slot_at(s, cls, bucket, wy);
			const struct slot_hdr *h = (const struct slot_hdr *)slot;
			if (!(atomic_load_explicit(seq_of(slot),
						   memory_order_relaxed) &
			      1) &&
			    h->magic == SLOT_MAGIC && key_eq(h, k)) {
				slot_empty(slot, c);
				n++;
			}
		}
		pthread_mutex_unlock(mu);
	}
	if (n)
		atomic_fetch_add_explicit(&s->deletes, (uint64_t)n,
					  memory_order_relaxed);
	return n;
}

void slot_region_stats(const struct slot_region *s, struct slot_stats *st)
{
	st->writes = atomic_load(&s->writes);
	st->evictions = atomic_load(&s->evictions);
	st->busy_refusals = atomic_load(&s->busy_refusals);
	st->deletes = atomic_load(&s->deletes);
	st->read_retries = atomic_load(&s->read_retries);
	st->read_rejects = atomic_load(&s->read_rejects);
}
