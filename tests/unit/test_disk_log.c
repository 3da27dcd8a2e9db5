/*
 * tests/unit/test_disk_log.c — the disk store's bookkeeping and format
 * (storage/disk_log.h): records land block-aligned inside their region,
 * eviction takes the least recently used idle region whole and names its
 * pages, busy regions are never reused, the index survives growth, and a
 * store "file" (a buffer here) rebuilt region by region gives back exactly
 * the valid, newest records: never a leftover of a region's previous life,
 * a foreign store's record, a torn header or a page whose checksum fails.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checksum.h"
#include "storage/disk_log.h"

#define MIB (1u << 20)

static struct dlog *mk(uint64_t cap, uint32_t region, uint8_t id)
{
	struct dl_params p = {.capacity = cap, .region_bytes = region};
	memset(p.store_id, id, sizeof(p.store_id));
	struct dlog *d;
	cr_assert_eq(dl_new(&d, &p), 0);
	return d;
}

/* A store file in memory: what the tier module writes with io_uring. */
struct file {
	uint8_t *b;
	uint64_t size;
};

static void payload(uint8_t *out, const char *key, uint32_t len, uint8_t v)
{
	for (uint32_t i = 0; i < len; i++)
		out[i] = (uint8_t)(key[i % strlen(key)] * 7 + i + v);
}

/* Store key (payload version v) as the tier would: alloc, write, commit. */
static int put(struct dlog *d, struct file *f, const char *key, uint32_t len,
	       uint8_t v, dl_evict_fn ev, void *arg, struct dl_loc *out)
{
	size_t klen = strlen(key);
	uint64_t total = dl_record_bytes(klen, len), off, seq, hoff, oseq;
	int ret = dl_alloc(d, total, &off, &seq, &hoff, &oseq, ev, arg);
	if (ret < 0)
		return ret;
	cr_assert_eq(off % DL_BLOCK, 0);
	if (hoff != UINT64_MAX) {
		cr_assert_eq(off, hoff + DL_BLOCK, "a record follows its "
			     "region's header");
		if (f)
			dl_region_hdr_encode(d, (uint32_t)(hoff /
				dl_region_bytes(d)), oseq, f->b + hoff);
	}
	uint8_t *pl = malloc(len ? len : 1);
	payload(pl, key, len, v);
	uint64_t sum = pc_page_sum(pl, len);
	if (f) {
		cr_assert_leq(off + total, f->size);
		dl_rec_hdr_encode(f->b + off, klen, len, 1000 + v, seq, sum);
		memcpy(f->b + off + DL_HDR_BYTES, key, klen);
		memcpy(f->b + off + DL_HDR_BYTES + klen, pl, len);
	}
	free(pl);
	struct dl_loc loc = {.off = off, .total = (uint32_t)total, .len = len,
			     .gen = 1000 + v, .sum = sum, .seq = seq,
			     .region = (uint32_t)(off / dl_region_bytes(d))};
	cr_assert_eq(dl_commit(d, key, klen, &loc), 0);
	if (out)
		*out = loc;
	return 0;
}

struct evicted {
	unsigned n;
	char keys[64][32];
};

static void on_evict(void *arg, const char *key, size_t klen, uint64_t gen)
{
	struct evicted *e = arg;
	(void)gen;
	cr_assert_lt(e->n, 64);
	memcpy(e->keys[e->n], key, klen);
	e->keys[e->n][klen] = 0;
	e->n++;
}

Test(disk_log, records_are_block_aligned_inside_their_region)
{
	struct dlog *d = mk(8 * MIB, MIB, 1);
	cr_assert_eq(dl_regions(d), 8);
	cr_assert_eq(dl_record_bytes(10, 0), DL_BLOCK);
	cr_assert_eq(dl_record_bytes(10, DL_BLOCK), 2 * DL_BLOCK);
	char key[32];
	for (unsigned i = 0; i < 40; i++) {
		snprintf(key, sizeof(key), "k%u", i);
		struct dl_loc loc, got;
		cr_assert_eq(put(d, NULL, key, 100000 + i, 0, NULL, NULL,
				 &loc), 0);
		cr_assert(dl_get(d, key, strlen(key), &got));
		cr_assert_eq(got.off, loc.off);
		cr_assert_geq(got.off % MIB, DL_BLOCK);
		cr_assert_leq(got.off % MIB + got.total, MIB);
		dl_put(d, got.region);
	}
	/* a record that cannot fit a region is refused, not split */
	uint64_t off, seq, h, o;
	cr_assert_eq(dl_alloc(d, MIB, &off, &seq, &h, &o, NULL, NULL), -E2BIG);
	struct dl_stats st;
	dl_stats(d, &st);
	cr_assert_eq(st.keys, 40);
	dl_free(d);
}

/*
 * Four regions of 1 MiB, records of 256 KiB on disk: three fit behind a
 * region's header block, a fourth does not.
 * Region of "a" is read again before the store fills: the next eviction
 * takes the least recently used other region, names exactly its keys, and
 * they are gone; the read region and its keys stay.
 */
Test(disk_log, eviction_takes_the_least_recently_used_idle_region)
{
	struct dlog *d = mk(4 * MIB, MIB, 2);
	struct evicted ev = {0};
	char key[32];
	struct dl_loc loc[12];
	for (unsigned i = 0; i < 12; i++) {
		snprintf(key, sizeof(key), "p%u", i);
		cr_assert_eq(put(d, NULL, key, 256 * 1024 - 200, 0, on_evict,
				 &ev, &loc[i]), 0);
	}
	cr_assert_eq(ev.n, 0, "nothing evicted while regions were free");
	for (unsigned i = 0; i < 12; i++)
		cr_assert_eq(loc[i].region, i / 3);
	/* region 0 read: most recent (region 3 is still open) */
	struct dl_loc got;
	cr_assert(dl_get(d, "p0", 2, &got));
	dl_put(d, got.region);
	cr_assert_eq(put(d, NULL, "new", 256 * 1024 - 200, 0, on_evict, &ev,
			 &got), 0);
	cr_assert_eq(ev.n, 3);
	cr_assert_eq(got.region, 1);
	for (unsigned i = 0; i < 3; i++) {
		snprintf(key, sizeof(key), "p%u", 3 + i);
		bool named = false;
		for (unsigned j = 0; j < ev.n; j++)
			named |= strcmp(ev.keys[j], key) == 0;
		cr_assert(named, "%s was not reported", key);
		cr_assert(!dl_has(d, key, strlen(key)));
	}
	for (unsigned i = 0; i < 3; i++) {
		snprintf(key, sizeof(key), "p%u", i);
		cr_assert(dl_has(d, key, strlen(key)));
	}
	struct dl_stats st;
	dl_stats(d, &st);
	cr_assert_eq(st.evicted_regions, 1);
	cr_assert_eq(st.evicted_keys, 3);
	cr_assert_eq(st.keys, 10);
	dl_free(d);
}

/* A region with a read or a write under way is never reused: with every
 * other region busy too, a new record is refused (-EBUSY). */
Test(disk_log, busy_regions_are_never_reused)
{
	struct dlog *d = mk(2 * MIB, MIB, 3);
	uint64_t big = dl_record_bytes(2, 600 * 1024);
	uint64_t off0, off1, seq, h, o;
	/* region 0: a write in flight (not committed) */
	cr_assert_eq(dl_alloc(d, big, &off0, &seq, &h, &o, NULL, NULL), 0);
	/* region 1: committed, then held by a read */
	struct dl_loc l;
	cr_assert_eq(put(d, NULL, "r1", 600 * 1024, 0, NULL, NULL, &l), 0);
	cr_assert_eq(l.region, 1);
	struct dl_loc got;
	cr_assert(dl_get(d, "r1", 2, &got));
	cr_assert_eq(dl_alloc(d, big, &off1, &seq, &h, &o, NULL, NULL),
		     -EBUSY);
	cr_assert(dl_has(d, "r1", 2));
	/* the write fails, the read ends: region 0 was sealed without a
	 * record, so it is free again; then region 1 can be evicted */
	dl_abort(d, off0);
	dl_put(d, got.region);
	cr_assert_eq(dl_alloc(d, big, &off1, &seq, &h, &o, NULL, NULL), 0);
	cr_assert_eq(off1 / MIB, 0);
	dl_abort(d, off1);
	struct dl_stats st;
	dl_stats(d, &st);
	cr_assert_eq(st.keys, 1);
	dl_free(d);
}

/* 200,000 keys: the index grows by doubling, moved a few buckets per call;
 * every key is found throughout, and deletes are conditional on gen. */
Test(disk_log, the_index_grows_without_losing_keys)
{
	struct dlog *d = mk(1024ull * MIB, 16 * MIB, 4);
	char key[32];
	for (unsigned i = 0; i < 200000; i++) {
		snprintf(key, sizeof(key), "g%u", i);
		cr_assert_eq(put(d, NULL, key, 10, 0, NULL, NULL, NULL), 0);
		if (i % 997 == 0) {
			for (unsigned j = 0; j <= i; j += 101) {
				snprintf(key, sizeof(key), "g%u", j);
				cr_assert(dl_has(d, key, strlen(key)), "%s",
					  key);
			}
		}
	}
	for (unsigned i = 0; i < 200000; i += 2) {
		snprintf(key, sizeof(key), "g%u", i);
		cr_assert(!dl_del(d, key, strlen(key), 999));
		cr_assert(dl_del(d, key, strlen(key), 1000));
	}
	struct dl_stats st;
	dl_stats(d, &st);
	cr_assert_eq(st.keys, 100000);
	cr_assert_eq(st.bytes_live, 100000 * 10);
	for (unsigned i = 0; i < 200000; i++) {
		snprintf(key, sizeof(key), "g%u", i);
		cr_assert_eq(dl_has(d, key, strlen(key)), i % 2 == 1, "%s",
			     key);
	}
	dl_free(d);
}

/* Two writes of one key finishing in the wrong order: the newer stays. */
Test(disk_log, the_newer_write_of_a_key_wins)
{
	struct dlog *d = mk(4 * MIB, MIB, 5);
	uint64_t t = dl_record_bytes(1, 5000), o1, o2, s1, s2, h, os;
	cr_assert_eq(dl_alloc(d, t, &o1, &s1, &h, &os, NULL, NULL), 0);
	cr_assert_eq(dl_alloc(d, t, &o2, &s2, &h, &os, NULL, NULL), 0);
	cr_assert_gt(s2, s1);
	struct dl_loc l2 = {.off = o2, .total = (uint32_t)t, .len = 5000,
			    .gen = 2, .seq = s2, .region = 0};
	struct dl_loc l1 = l2;
	l1.off = o1;
	l1.gen = 1;
	l1.seq = s1;
	cr_assert_eq(dl_commit(d, "k", 1, &l2), 0);
	cr_assert_eq(dl_commit(d, "k", 1, &l1), 0);
	struct dl_loc got;
	cr_assert(dl_get(d, "k", 1, &got));
	cr_assert_eq(got.gen, 2);
	dl_put(d, got.region);
	dl_free(d);
}

static void rebuild(struct dlog *d, struct file *f, unsigned *bad)
{
	uint32_t rb = dl_region_bytes(d);
	for (uint32_t i = 0; i < dl_regions(d); i++)
		dl_rebuild_region(d, i, f->b + (uint64_t)i * rb, rb, true, bad);
}

static bool page_ok(struct file *f, struct dlog *d, const char *key, uint8_t v)
{
	struct dl_loc l;
	if (!dl_get(d, key, strlen(key), &l))
		return false;
	uint8_t *want = malloc(l.len);
	payload(want, key, l.len, v);
	struct dl_rec_hdr h;
	bool ok = dl_rec_hdr_decode(f->b + l.off, &h) == 0 &&
		  memcmp(f->b + l.off + DL_HDR_BYTES, key, strlen(key)) == 0 &&
		  memcmp(f->b + l.off + DL_HDR_BYTES + h.klen, want, l.len) ==
			  0;
	free(want);
	dl_put(d, l.region);
	return ok;
}

/*
 * A store written through several region lives, then rebuilt from its
 * bytes by a fresh index: every indexed key comes back at its newest
 * version; evicted keys whose bytes still sit behind a reused region's new
 * records stay gone; a corrupted payload is counted and dropped; a torn
 * header ends its region's scan (the key's previous complete version may
 * come back, as after a crash during the write, never the torn one);
 * another store's regions give nothing.
 */
Test(disk_log, a_rebuild_gives_back_exactly_the_valid_newest_records)
{
	struct file f = {.size = 4 * MIB};
	f.b = calloc(1, f.size);
	struct dlog *d = mk(f.size, MIB, 6);
	struct evicted ev = {0};
	char key[32];
	/* 60 records of ~100 KiB (9 per region) over 30 keys written twice
	 * (version 0, then 1): regions fill, some are freed by rewrites and
	 * reused, others evicted with live keys */
	for (unsigned i = 0; i < 60; i++) {
		snprintf(key, sizeof(key), "r%u", i % 30);
		cr_assert_eq(put(d, &f, key, 100 * 1024, (uint8_t)(i / 30),
				 on_evict, &ev, NULL), 0);
	}
	struct dl_stats before;
	dl_stats(d, &before);
	cr_assert_gt(before.evicted_regions, 0);
	struct dlog *r = mk(f.size, MIB, 6);
	unsigned bad = 0;
	rebuild(r, &f, &bad);
	cr_assert_eq(bad, 0);
	struct dl_stats after;
	dl_stats(r, &after);
	cr_assert_eq(after.keys, before.keys);
	cr_assert_geq(after.seq, before.seq - 1);
	for (unsigned k = 0; k < 30; k++) {
		snprintf(key, sizeof(key), "r%u", k);
		bool in = dl_has(d, key, strlen(key));
		cr_assert_eq(dl_has(r, key, strlen(key)), in, "%s", key);
		if (in) {
			struct dl_loc a, b;
			cr_assert(dl_get(d, key, strlen(key), &a));
			cr_assert(dl_get(r, key, strlen(key), &b));
			cr_assert_eq(a.off, b.off, "%s", key);
			cr_assert_eq(a.gen, b.gen, "%s", key);
			dl_put(d, a.region);
			dl_put(r, b.region);
			cr_assert(page_ok(&f, r, key, 1), "%s", key);
		}
	}
	/* writes after a rebuild go on from past every old sequence (into a
	 * copy: the original stays as d knows it) */
	struct file g = {.b = malloc(f.size), .size = f.size};
	memcpy(g.b, f.b, f.size);
	cr_assert_eq(put(r, &g, "after", 1000, 0, NULL, NULL, NULL), 0);
	dl_free(r);
	r = mk(f.size, MIB, 6);
	rebuild(r, &g, &bad);
	cr_assert(page_ok(&g, r, "after", 0));
	dl_free(r);
	free(g.b);
	/* corrupt one payload byte of a live record, tear the header of
	 * another region's last live record */
	char ck[32] = "", tk[32] = "";
	struct dl_loc c = {0}, t = {0};
	for (unsigned k = 0; k < 30; k++) {
		snprintf(key, sizeof(key), "r%u", k);
		struct dl_loc l;
		if (!dl_get(d, key, strlen(key), &l))
			continue;
		dl_put(d, l.region);
		if (!ck[0]) {
			c = l;
			snprintf(ck, sizeof(ck), "%s", key);
		} else if (l.region != c.region && l.off >= t.off) {
			t = l;
			snprintf(tk, sizeof(tk), "%s", key);
		}
	}
	cr_assert(ck[0] && tk[0]);
	f.b[c.off + DL_HDR_BYTES + strlen(ck) + 500] ^= 0x40;
	f.b[t.off + 20] ^= 0x01;
	r = mk(f.size, MIB, 6);
	bad = 0;
	rebuild(r, &f, &bad);
	cr_assert_eq(bad, 1, "bad %u; %s at %lu (region %u), %s at %lu (region %u)",
		     bad, ck, (unsigned long)c.off, c.region, tk,
		     (unsigned long)t.off, t.region);
	/* neither comes back as its damaged version 1; the previous complete
	 * version (0), where its bytes are still on disk, is what a crash in
	 * the middle of writing version 1 would have left: it may */
	cr_assert(!dl_has(r, ck, strlen(ck)) || page_ok(&f, r, ck, 0), "%s", ck);
	cr_assert(!dl_has(r, tk, strlen(tk)) || page_ok(&f, r, tk, 0), "%s", tk);
	struct dl_stats torn;
	dl_stats(r, &torn);
	cr_assert_leq(torn.keys, before.keys);
	dl_free(r);
	/* another store's identity: nothing */
	r = mk(f.size, MIB, 7);
	rebuild(r, &f, &bad);
	struct dl_stats none;
	dl_stats(r, &none);
	cr_assert_eq(none.keys, 0);
	cr_assert_eq(none.free_regions, 4);
	dl_free(r);
	dl_free(d);
	free(f.b);
}

/*
 * A header whose checksum holds but whose sequence no store reaches (found
 * by tests/fuzz/fuzz_disk.c): taken, it moved the store's counter to where
 * the next write wraps it to 0, and at the next rebuild the stale record
 * beat the newer write of its key — a wrong page. It is not a record: the
 * key's newer version is what comes back.
 */
Test(disk_log, a_sequence_no_store_reaches_is_not_a_record)
{
	struct file f = {.size = 4 * MIB};
	f.b = calloc(1, f.size);
	struct dlog *d = mk(f.size, MIB, 8);
	struct dl_loc old;
	cr_assert_eq(put(d, &f, "k", 1000, 1, NULL, NULL, &old), 0);
	/* the same record, its sequence rewritten (checksum made right) */
	dl_rec_hdr_encode(f.b + old.off, 1, old.len, old.gen, UINT64_MAX,
			  old.sum);
	struct dl_rec_hdr h;
	cr_assert_eq(dl_rec_hdr_decode(f.b + old.off, &h), -EINVAL);
	dl_free(d);
	struct dlog *r = mk(f.size, MIB, 8);
	unsigned bad = 0;
	rebuild(r, &f, &bad);
	cr_assert(!dl_has(r, "k", 1));
	struct dl_stats st;
	dl_stats(r, &st);
	cr_assert_leq(st.seq, DL_SEQ_MAX);
	cr_assert_eq(put(r, &f, "k", 1000, 2, NULL, NULL, NULL), 0);
	dl_free(r);
	r = mk(f.size, MIB, 8);
	rebuild(r, &f, &bad);
	cr_assert(page_ok(&f, r, "k", 2), "the newer write of k comes back");
	dl_free(r);
	/* a region header that claims such a sequence gives nothing */
	uint8_t blk[DL_BLOCK];
	uint64_t seq;
	r = mk(f.size, MIB, 8);
	dl_region_hdr_encode(r, 0, DL_SEQ_MAX + 1, blk);
	cr_assert_eq(dl_region_hdr_decode(r, 0, blk, &seq), -EINVAL);
	dl_region_hdr_encode(r, 0, DL_SEQ_MAX, blk);
	cr_assert_eq(dl_region_hdr_decode(r, 0, blk, &seq), 0);
	dl_free(r);
	free(f.b);
}

struct scanned {
	unsigned n;
	unsigned hits[300];
};

static void on_scan(void *arg, const char *key, size_t klen,
		    const struct dl_loc *loc)
{
	struct scanned *s = arg;
	char k[32];
	unsigned i;
	cr_assert_lt(klen, sizeof(k));
	memcpy(k, key, klen); /* index keys are not NUL-terminated */
	k[klen] = 0;
	cr_assert_eq(sscanf(k, "s%u", &i), 1);
	cr_assert_lt(i, 300);
	cr_assert_eq(loc->len, 100 + i);
	s->hits[i]++;
	s->n++;
}

/* A walk in slices sees every indexed key exactly once, whatever the
 * slice size, across regions and empty regions. */
Test(disk_log, a_scan_in_slices_sees_every_key_once)
{
	struct dlog *d = mk(16 * MIB, 1 * MIB, 5);
	char key[32];
	for (unsigned i = 0; i < 300; i++) {
		snprintf(key, sizeof(key), "s%u", i);
		cr_assert_eq(put(d, NULL, key, 100 + i, 0, NULL, NULL, NULL),
			     0);
	}
	for (unsigned i = 0; i < 300; i += 3) { /* holes */
		snprintf(key, sizeof(key), "s%u", i);
		cr_assert(dl_del(d, key, strlen(key), 0));
	}
	static const unsigned slices[] = {1, 7, 64, 1000};
	for (unsigned k = 0; k < 4; k++) {
		struct scanned s = {0};
		uint64_t cur = 0;
		unsigned calls = 0;
		while (dl_scan(d, &cur, slices[k], on_scan, &s) == 1)
			cr_assert_lt(++calls, 1000, "the walk ends");
		cr_assert_eq(s.n, 200, "slice %u", slices[k]);
		for (unsigned i = 0; i < 300; i++)
			cr_assert_eq(s.hits[i], i % 3 ? 1u : 0u, "s%u", i);
	}
	struct dlog *e = mk(4 * MIB, 1 * MIB, 5);
	uint64_t cur = 0;
	struct scanned s = {0};
	cr_assert_eq(dl_scan(e, &cur, 8, on_scan, &s), 0, "empty store");
	cr_assert_eq(s.n, 0);
	dl_free(e);
	dl_free(d);
}

/* A retag changes the generation the index answers, only for the record
 * it names. */
Test(disk_log, a_retag_names_the_record_by_its_sequence)
{
	struct dlog *d = mk(4 * MIB, 1 * MIB, 6);
	struct dl_loc loc, got;
	cr_assert_eq(put(d, NULL, "k", 10, 0, NULL, NULL, &loc), 0);
	cr_assert_not(dl_retag(d, "k", 1, loc.seq + 1, 77), "another record");
	cr_assert_not(dl_retag(d, "x", 1, loc.seq, 77), "another key");
	cr_assert(dl_retag(d, "k", 1, loc.seq, 77));
	cr_assert(dl_get(d, "k", 1, &got));
	dl_put(d, got.region);
	cr_assert_eq(got.gen, 77);
	cr_assert_eq(got.seq, loc.seq);
	cr_assert(!dl_del(d, "k", 1, 1000), "the old generation is gone");
	cr_assert(dl_del(d, "k", 1, 77));
	dl_free(d);
}

/* A failed write that carried its region's header: the region takes no
 * further record; the next one goes to a region opened with a header. */
Test(disk_log, a_failed_header_write_never_leaves_a_region_headless)
{
	struct dlog *d = mk(4 * MIB, MIB, 8);
	uint64_t t = dl_record_bytes(1, 1000), off, seq, h, o;
	cr_assert_eq(dl_alloc(d, t, &off, &seq, &h, &o, NULL, NULL), 0);
	cr_assert_neq(h, UINT64_MAX);
	dl_abort_header(d, off);
	uint64_t off2, h2;
	cr_assert_eq(dl_alloc(d, t, &off2, &seq, &h2, &o, NULL, NULL), 0);
	cr_assert_neq(h2, UINT64_MAX, "a record placed behind a header that "
		      "may not be on disk");
	dl_abort(d, off2);
	dl_free(d);
}
