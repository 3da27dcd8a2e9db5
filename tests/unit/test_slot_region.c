/*
 * tests/unit/test_slot_region.c — the slotmap's slot region
 * (storage/slot_region.h): layouts and their refusals, the way choice
 * (same key, else empty, else oldest), one way per key, busy and oversized
 * refusals, and the rule that matters most: a snapshot of a slot is
 * accepted only if it is one whole write of the key. Torn snapshots built
 * by hand are rejected, and accepted when the checksum is off (the
 * negative control); then writers and readers hammer one bucket from
 * threads, readers judging raw copies of the bucket as a remote READ
 * would, with an oracle on every byte: zero wrong pages with the check,
 * and torn pages caught without it.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/checksum.h"
#include "storage/slot_region.h"

#define KIB 1024ull
#define MIB (1024ull * 1024ull)

static struct slot_layout one_class(uint64_t payload, uint32_t ways,
				    uint64_t buckets)
{
	struct slot_class_spec sp = {.max_payload = payload,
				     .ways = ways,
				     .buckets = buckets};
	struct slot_layout l;
	cr_assert_eq(slot_layout_plan(&l, UINT64_MAX, &sp, 1, NULL), 0);
	return l;
}

static struct slot_region *mk(const struct slot_layout *l, void **base)
{
	*base = calloc(1, l->bytes);
	cr_assert_not_null(*base);
	struct slot_region *s;
	cr_assert_eq(slot_region_new(&s, *base, l), 0);
	return s;
}

static struct slot_key key(const char *name)
{
	struct slot_key k;
	slot_key_of(&k, name, strlen(name));
	return k;
}

/* Page bytes derived from (key id, version): any byte tells them apart. */
static void fill(uint8_t *p, uint64_t len, uint32_t id, uint32_t ver)
{
	uint64_t x = ((uint64_t)id << 32 | ver) * 0x9e3779b97f4a7c15ull + 1;
	for (uint64_t i = 0; i < len; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(p + i, &x, len - i < 8 ? len - i : 8);
	}
	memcpy(p, &id, 4);
	memcpy(p + 4, &ver, 4);
}

/* Is p exactly the page of id at some version? */
static bool page_ok(const uint8_t *p, uint64_t len, uint32_t id,
		    uint8_t *scratch)
{
	uint32_t got_id, ver;
	memcpy(&got_id, p, 4);
	memcpy(&ver, p + 4, 4);
	if (got_id != id)
		return false;
	fill(scratch, len, id, ver);
	return memcmp(p, scratch, len) == 0;
}

Test(slot_layout, the_originals_default_geometry)
{
	/* 1 GiB, one 256 KiB class, 4 ways: 1023 buckets as in the
	 * original's docs; a slot is 64 B longer than the original's
	 * 262,208 B (the 8-byte trailer, rounded to 64). */
	struct slot_class_spec sp = {.max_payload = 256 * KIB,
				     .ways = 4,
				     .share_pm = 1000};
	struct slot_layout l;
	cr_assert_eq(slot_layout_plan(&l, 1024 * MIB, &sp, 1, NULL), 0);
	cr_assert_eq(l.cls[0].stride, 262272);
	cr_assert_eq(l.cls[0].buckets, 1023);
	cr_assert_eq(l.bytes, 1023ull * 4 * 262272);
}

Test(slot_layout, classes_are_sorted_and_laid_end_to_end)
{
	struct slot_class_spec sp[] = {
		{.max_payload = 4 * MIB, .ways = 4, .share_pm = 750},
		{.max_payload = 16 * KIB, .ways = 8, .share_pm = 250},
	};
	struct slot_layout l;
	cr_assert_eq(slot_layout_plan(&l, 1024 * MIB, sp, 2, NULL), 0);
	cr_assert_eq(l.nclasses, 2);
	cr_assert_eq(l.cls[0].max_payload, 16 * KIB);
	cr_assert_eq(l.cls[0].offset, 0);
	cr_assert_eq(l.cls[1].offset,
		     l.cls[0].buckets * slot_bucket_bytes(&l.cls[0]));
	cr_assert_leq(l.bytes, 1024 * MIB);
	cr_assert_eq(slot_class_for(&l, 1), 0);
	cr_assert_eq(slot_class_for(&l, 16 * KIB), 0);
	cr_assert_eq(slot_class_for(&l, 16 * KIB + 1), 1);
	cr_assert_eq(slot_class_for(&l, 4 * MIB), 1);
	cr_assert_eq(slot_class_for(&l, 4 * MIB + 1), -E2BIG);
	/* every bucket of a class is inside the class */
	for (int i = 0; i < 1000; i++) {
		char name[32];
		snprintf(name, sizeof(name), "k%d", i);
		struct slot_key k = key(name);
		for (int c = 0; c < 2; c++) {
			uint64_t off = slot_bucket_off(&l.cls[c], &k);
			cr_assert_geq(off, l.cls[c].offset);
			cr_assert_leq(off + slot_bucket_bytes(&l.cls[c]),
				      l.cls[c].offset +
					      l.cls[c].buckets *
						      slot_bucket_bytes(
							      &l.cls[c]));
		}
	}
}

Test(slot_layout, bad_geometries_are_refused_with_a_reason)
{
	struct slot_layout l;
	const char *why = NULL;
	struct slot_class_spec tiny = {.max_payload = 100, .ways = 4,
				       .share_pm = 1000};
	cr_assert_eq(slot_layout_plan(&l, 1024 * MIB, &tiny, 1, &why),
		     -EINVAL);
	cr_assert_not_null(why);
	struct slot_class_spec noway = {.max_payload = 64 * KIB, .ways = 0,
					.share_pm = 1000};
	cr_assert_eq(slot_layout_plan(&l, 1024 * MIB, &noway, 1, NULL),
		     -EINVAL);
	struct slot_class_spec two[] = {
		{.max_payload = 64 * KIB, .ways = 4, .share_pm = 600},
		{.max_payload = 1 * MIB, .ways = 4, .share_pm = 600},
	};
	cr_assert_eq(slot_layout_plan(&l, 1024 * MIB, two, 2, NULL), -EINVAL);
	struct slot_class_spec big = {.max_payload = 8 * MIB, .ways = 4,
				      .share_pm = 1000};
	why = NULL;
	cr_assert_eq(slot_layout_plan(&l, 16 * MIB, &big, 1, &why), -EINVAL);
	cr_assert(why && strstr(why, "too small"), "%s", why ? why : "-");
	struct slot_class_spec dup[] = {
		{.max_payload = 64 * KIB, .ways = 4, .share_pm = 500},
		{.max_payload = 64 * KIB, .ways = 2, .share_pm = 500},
	};
	cr_assert_eq(slot_layout_plan(&l, 1024 * MIB, dup, 2, NULL), -EINVAL);
}

Test(slot_region, write_read_exists_delete)
{
	struct slot_class_spec sp[] = {
		{.max_payload = 16 * KIB, .ways = 4, .buckets = 8},
		{.max_payload = 256 * KIB, .ways = 4, .buckets = 4},
	};
	struct slot_layout l;
	cr_assert_eq(slot_layout_plan(&l, UINT64_MAX, sp, 2, NULL), 0);
	void *base;
	struct slot_region *s = mk(&l, &base);
	static uint8_t page[256 * KIB], out[256 * KIB];
	struct slot_key a = key("a"), b = key("b");
	fill(page, 10000, 1, 1);
	cr_assert_eq(slot_write(s, &a, page, 10000), 0);
	fill(page, 200 * KIB, 2, 1);
	cr_assert_eq(slot_write(s, &b, page, 200 * KIB), 0);
	cr_assert_eq(slot_read(s, &a, 10000, out, sizeof(out)), 10000);
	cr_assert(page_ok(out, 10000, 1, page));
	cr_assert_eq(slot_read(s, &a, 0, out, sizeof(out)), 10000);
	cr_assert_eq(slot_read(s, &b, 0, out, sizeof(out)), 200 * KIB);
	cr_assert(page_ok(out, 200 * KIB, 2, page));
	cr_assert_eq(slot_read(s, &b, 200 * KIB, out, 100), -ENOSPC);
	/* a wrong expected length is a miss, never a short or long page */
	cr_assert_eq(slot_read(s, &a, 9999, out, sizeof(out)), -ENOENT);
	cr_assert(slot_exists(s, &a, 10000));
	cr_assert(slot_exists(s, &b, 0));
	cr_assert_not(slot_exists(s, &a, 20000));
	cr_assert_eq(slot_write(s, &a, page, 256 * KIB + 1), -E2BIG);
	cr_assert_eq(slot_del(s, &a), 1);
	cr_assert_not(slot_exists(s, &a, 0));
	cr_assert_eq(slot_read(s, &a, 0, out, sizeof(out)), -ENOENT);
	cr_assert_eq(slot_del(s, &a), 0);
	struct slot_stats st;
	slot_region_stats(s, &st);
	cr_assert_eq(st.writes, 2);
	cr_assert_eq(st.deletes, 1);
	slot_region_free(s);
	free(base);
}

/* A copy made in slices: slot_locate, copy, slot_loc_still. A write in
 * between makes the copy stale; a commit with a hash that is not the
 * bytes' makes the page fail every reader's check, the owner's included
 * (slot_read, slot_loc_sum_ok). */
Test(slot_region, located_copies_and_hashed_commits)
{
	struct slot_layout l = one_class(64 * KIB, 4, 2);
	void *base;
	struct slot_region *s = mk(&l, &base);
	static uint8_t page[64 * KIB], out[64 * KIB];
	struct slot_key a = key("a");
	fill(page, 40000, 1, 1);
	cr_assert_eq(slot_write(s, &a, page, 40000), 0);
	struct slot_loc loc;
	cr_assert_eq(slot_locate(s, &a, 0, &loc), 40000);
	memcpy(out, loc.payload, 20000); /* the first slice */
	cr_assert(slot_loc_still(&loc));
	fill(page, 40000, 1, 2);
	cr_assert_eq(slot_write(s, &a, page, 40000), 0); /* a write between */
	memcpy(out + 20000, loc.payload + 20000, 20000);
	cr_assert_not(slot_loc_still(&loc), "the copy must be seen stale");
	cr_assert_eq(slot_locate(s, &a, 40001, &loc), -ENOENT);
	/* a remote writer's commit: the hash of its own bytes */
	struct slot_key b = key("b");
	struct slot_wr w;
	fill(page, 30000, 2, 1);
	cr_assert_eq(slot_write_begin(s, &b, 30000, &w), 0);
	cr_assert_eq(slot_locate(s, &b, 0, &loc), -ENOENT, "busy is absent");
	memcpy(w.payload, page, 30000);
	slot_write_commit_hashed(s, &w, pc_page_sum(page, 30000));
	cr_assert(slot_exists(s, &b, 30000));
	/* bytes that are not the hashed ones (a late or partial write) */
	cr_assert_eq(slot_write_begin(s, &b, 30000, &w), 0);
	memcpy(w.payload, page, 30000);
	((uint8_t *)w.payload)[29999] ^= 1;
	slot_write_commit_hashed(s, &w, pc_page_sum(page, 30000));
	cr_assert_not(slot_exists(s, &b, 30000));
	/* the owner's own readers reject it too: committed is not whole */
	cr_assert_eq(slot_read(s, &b, 0, out, sizeof(out)), -ENOENT);
	cr_assert_eq(slot_locate(s, &b, 30000, &loc), 30000);
	memcpy(out, loc.payload, 30000);
	cr_assert(slot_loc_still(&loc));
	cr_assert_not(slot_loc_sum_ok(&b, &loc, pc_page_sum(out, 30000)));
	cr_assert(slot_loc_sum_ok(&b, &loc, pc_page_sum(page, 30000)),
		  "the header names the writer's bytes");
	const struct slot_class *c = &slot_region_layout(s)->cls[0];
	uint8_t *bucket = (uint8_t *)base + slot_bucket_off(c, &b);
	uint64_t len;
	cr_assert_eq(slot_find(bucket, c, &b, 30000, true, &len, NULL),
		     -ENOENT, "a remote reader rejects it");
	slot_region_free(s);
	free(base);
}

/* Keys that all land in one bucket of a one-bucket class. */
Test(slot_region, way_choice_same_key_then_empty_then_oldest)
{
	struct slot_layout l = one_class(4 * KIB, 4, 1);
	void *base;
	struct slot_region *s = mk(&l, &base);
	static uint8_t page[4 * KIB], out[4 * KIB];
	struct slot_key k[6];
	for (int i = 0; i < 6; i++) {
		char name[8];
		snprintf(name, sizeof(name), "k%d", i);
		k[i] = key(name);
	}
	for (uint32_t i = 0; i < 4; i++) {
		fill(page, sizeof(page), i, 1);
		cr_assert_eq(slot_write(s, &k[i], page, sizeof(page)), 0);
	}
	/* same key: rewritten in place, version 2 replaces version 1 */
	fill(page, sizeof(page), 0, 2);
	cr_assert_eq(slot_write(s, &k[0], page, sizeof(page)), 0);
	cr_assert_eq(slot_read(s, &k[0], 0, out, sizeof(out)), sizeof(out));
	cr_assert_eq(memcmp(out, page, sizeof(page)), 0);
	for (uint32_t i = 1; i < 4; i++)
		cr_assert(slot_exists(s, &k[i], 0));
	/* full: the oldest write (k1) goes, not the rewritten k0 */
	fill(page, sizeof(page), 4, 1);
	cr_assert_eq(slot_write(s, &k[4], page, sizeof(page)), 0);
	cr_assert_not(slot_exists(s, &k[1], 0));
	cr_assert(slot_exists(s, &k[0], 0));
	cr_assert(slot_exists(s, &k[4], 0));
	/* an emptied way is taken before an older one is evicted */
	cr_assert_eq(slot_del(s, &k[2]), 1);
	fill(page, sizeof(page), 5, 1);
	cr_assert_eq(slot_write(s, &k[5], page, sizeof(page)), 0);
	cr_assert(slot_exists(s, &k[3], 0));
	cr_assert(slot_exists(s, &k[5], 0));
	struct slot_stats st;
	slot_region_stats(s, &st);
	cr_assert_eq(st.evictions, 1);
	slot_region_free(s);
	free(base);
}

Test(slot_region, busy_ways_are_never_taken_and_one_way_per_key)
{
	struct slot_layout l = one_class(4 * KIB, 2, 1);
	void *base;
	struct slot_region *s = mk(&l, &base);
	static uint8_t page[4 * KIB], out[4 * KIB];
	struct slot_key a = key("a"), b = key("b"), c = key("c");
	struct slot_wr w1, w2;
	/* two writers of one key at once take two ways ... */
	cr_assert_eq(slot_write_begin(s, &a, sizeof(page), &w1), 0);
	cr_assert_eq(slot_write_begin(s, &a, sizeof(page), &w2), 0);
	cr_assert_neq(w1.way, w2.way);
	/* ... so a third writer finds every way busy */
	cr_assert_eq(slot_write_begin(s, &b, sizeof(page), &(struct slot_wr){0}),
		     -EBUSY);
	/* busy is a miss for readers, never the half-written bytes */
	cr_assert_eq(slot_read(s, &a, 0, out, sizeof(out)), -ENOENT);
	cr_assert_not(slot_exists(s, &a, 0));
	fill(w1.payload, sizeof(page), 1, 1);
	fill(w2.payload, sizeof(page), 1, 2);
	slot_write_commit(s, &w2);
	slot_write_commit(s, &w1); /* the last commit wins, alone */
	cr_assert_eq(slot_read(s, &a, 0, out, sizeof(out)), sizeof(out));
	fill(page, sizeof(page), 1, 1);
	cr_assert_eq(memcmp(out, page, sizeof(page)), 0);
	cr_assert_eq(slot_del(s, &a), 1, "one way per key after the commits");
	/* an aborted write leaves an empty way */
	cr_assert_eq(slot_write_begin(s, &c, sizeof(page), &w1), 0);
	slot_write_abort(s, &w1);
	cr_assert_not(slot_exists(s, &c, 0));
	struct slot_stats st;
	slot_region_stats(s, &st);
	cr_assert_eq(st.busy_refusals, 1);
	slot_region_free(s);
	free(base);
}

/* A snapshot stitched from two writes of the same key. */
Test(slot_judge, torn_snapshots_are_rejected_and_caught_only_by_the_check)
{
	struct slot_layout l = one_class(64 * KIB, 1, 1);
	const struct slot_class *c = &l.cls[0];
	void *base;
	struct slot_region *s = mk(&l, &base);
	struct slot_key a = key("a"), b = key("b");
	static uint8_t page[64 * KIB];
	uint8_t *v1 = malloc(c->stride), *v2 = malloc(c->stride),
		*snap = malloc(c->stride);
	fill(page, sizeof(page), 1, 1);
	cr_assert_eq(slot_write(s, &a, page, sizeof(page)), 0);
	memcpy(v1, base, c->stride);
	fill(page, sizeof(page), 1, 2);
	cr_assert_eq(slot_write(s, &a, page, sizeof(page)), 0);
	memcpy(v2, base, c->stride);
	uint64_t len = 0;
	cr_assert_eq(slot_judge(v1, c, &a, 0, true, &len), SLOT_HIT);
	cr_assert_eq(len, sizeof(page));
	cr_assert_eq(slot_judge(v2, c, &a, sizeof(page), true, NULL),
		     SLOT_HIT);
	cr_assert_eq(slot_judge(v2, c, &b, 0, true, NULL), SLOT_OTHER);
	cr_assert_eq(slot_judge(v2, c, &a, 100, true, NULL), SLOT_BAD);
	/* v1's header and trailer around half of v2's payload: what a
	 * READ overlapping a write (or a writer in the original) gives */
	memcpy(snap, v1, c->stride);
	memcpy(snap + SLOT_HDR_BYTES + 1000, v2 + SLOT_HDR_BYTES + 1000, 4096);
	cr_assert_eq(slot_judge(snap, c, &a, 0, true, NULL), SLOT_BAD);
	cr_assert_eq(slot_judge(snap, c, &a, 0, false, NULL), SLOT_HIT,
		     "the negative control: without the checksum it passes");
	/* v2's header with v1's trailer */
	memcpy(snap, v2, c->stride);
	memcpy(snap + c->stride - 8, v1 + c->stride - 8, 8);
	cr_assert_eq(slot_judge(snap, c, &a, 0, true, NULL), SLOT_BAD);
	/* v2's header fields but v1's checksum field */
	memcpy(snap, v2, c->stride);
	memcpy(snap + offsetof(struct slot_hdr, sum),
	       v1 + offsetof(struct slot_hdr, sum), 8);
	cr_assert_eq(slot_judge(snap, c, &a, 0, true, NULL), SLOT_BAD);
	/* another key's name on a's bytes: the checksum binds the key */
	memcpy(snap, v2, c->stride);
	memcpy(snap + offsetof(struct slot_hdr, key_lo), &b.lo, 8);
	memcpy(snap + offsetof(struct slot_hdr, key_hi), &b.hi, 8);
	cr_assert_eq(slot_judge(snap, c, &b, 0, true, NULL), SLOT_BAD);
	/* an odd sequence is busy, whatever else the slot says */
	memcpy(snap, v2, c->stride);
	uint64_t odd = 7;
	memcpy(snap + offsetof(struct slot_hdr, seq), &odd, 8);
	cr_assert_eq(slot_judge(snap, c, &a, 0, false, NULL), SLOT_BUSY);
	/* garbage (a corrupted region) never passes */
	for (int i = 0; i < 1000; i++) {
		for (uint64_t j = 0; j < c->stride; j++)
			snap[j] = (uint8_t)rand();
		memcpy(snap + offsetof(struct slot_hdr, key_lo), &a.lo, 8);
		memcpy(snap + offsetof(struct slot_hdr, key_hi), &a.hi, 8);
		cr_assert_neq(slot_judge(snap, c, &a, 0, true, NULL), SLOT_HIT);
	}
	free(v1);
	free(v2);
	free(snap);
	slot_region_free(s);
	free(base);
}

/* What an owner sends for a selected read: the picked way's header and
 * payload, then its trailer (a plain copy, as the transport's send is);
 * its size, 0 when nothing is picked. Any thread. */
static uint64_t sel_snap(struct slot_region *s, const struct slot_class *c,
			 const struct slot_key *k, uint8_t *out,
			 struct slot_sel *ss)
{
	const uint8_t *base = slot_region_base(s);
	if (slot_pick(s, slot_bucket_off(c, k), slot_bucket_bytes(c), k->lo,
		      k->hi, ss) != 1)
		return 0;
	memcpy(out, base + ss->slot_off, SLOT_HDR_BYTES + ss->len);
	memcpy(out + SLOT_HDR_BYTES + ss->len,
	       base + ss->slot_off + ss->trailer_off, SLOT_TRAILER_BYTES);
	return SLOT_HDR_BYTES + ss->len + SLOT_TRAILER_BYTES;
}

/* sel_snap, checking that the pieces lie inside the key's bucket. */
static uint64_t sel_copy(struct slot_region *s, const struct slot_class *c,
			 const struct slot_key *k, uint8_t *out)
{
	struct slot_sel ss;
	uint64_t n = sel_snap(s, c, k, out, &ss);
	uint64_t off = slot_bucket_off(c, k);
	cr_assert(n == 0 || (ss.slot_off >= off &&
			     ss.slot_off + ss.trailer_off + SLOT_TRAILER_BYTES <=
				     off + slot_bucket_bytes(c)));
	return n;
}

Test(slot_judge, a_selection_is_judged_as_strictly_as_its_bucket)
{
	struct slot_layout l = one_class(64 * KIB, 4, 8);
	const struct slot_class *c = &l.cls[0];
	void *base;
	struct slot_region *s = mk(&l, &base);
	struct slot_key a = key("a"), b = key("b");
	static uint8_t page[40 * KIB];
	uint8_t *v1 = malloc(c->stride), *v2 = malloc(c->stride),
		*snap = malloc(c->stride);
	uint64_t off = slot_bucket_off(c, &a), bb = slot_bucket_bytes(c);
	struct slot_sel ss;
	/* nothing written: nothing to send */
	cr_assert_eq(slot_pick(s, off, bb, a.lo, a.hi, &ss), 0);
	cr_assert_eq(slot_judge_sel(v1, 0, c, &a, 0, true, NULL), SLOT_EMPTY);
	fill(page, sizeof(page), 1, 1);
	cr_assert_eq(slot_write(s, &a, page, sizeof(page)), 0);
	uint64_t n1 = sel_copy(s, c, &a, v1);
	cr_assert_eq(n1, SLOT_HDR_BYTES + sizeof(page) + SLOT_TRAILER_BYTES);
	fill(page, sizeof(page), 1, 2);
	cr_assert_eq(slot_write(s, &a, page, sizeof(page)), 0);
	uint64_t n2 = sel_copy(s, c, &a, v2);
	uint64_t len = 0;
	cr_assert_eq(slot_judge_sel(v2, n2, c, &a, 0, true, &len), SLOT_HIT);
	cr_assert_eq(len, sizeof(page));
	cr_assert(memcmp(v2 + SLOT_HDR_BYTES, page, sizeof(page)) == 0);
	cr_assert_eq(slot_judge_sel(v1, n1, c, &a, sizeof(page), true, NULL),
		     SLOT_HIT);
	cr_assert_eq(slot_judge_sel(v2, n2, c, &b, 0, true, NULL), SLOT_OTHER);
	cr_assert_eq(slot_judge_sel(v2, n2, c, &a, 100, true, NULL), SLOT_BAD);
	/* a size that is not the header's length plus header and trailer */
	cr_assert_eq(slot_judge_sel(v2, n2 - 1, c, &a, 0, false, NULL),
		     SLOT_BAD);
	cr_assert_eq(slot_judge_sel(v2, 40, c, &a, 0, false, NULL), SLOT_BAD);
	/* v1's header and trailer around part of v2's payload */
	memcpy(snap, v1, n1);
	memcpy(snap + SLOT_HDR_BYTES + 1000, v2 + SLOT_HDR_BYTES + 1000, 4096);
	cr_assert_eq(slot_judge_sel(snap, n1, c, &a, 0, true, NULL), SLOT_BAD);
	cr_assert_eq(slot_judge_sel(snap, n1, c, &a, 0, false, NULL), SLOT_HIT,
		     "the negative control: without the checksum it passes");
	/* v2's header with v1's trailer */
	memcpy(snap, v2, n2);
	memcpy(snap + n2 - 8, v1 + n1 - 8, 8);
	cr_assert_eq(slot_judge_sel(snap, n2, c, &a, 0, true, NULL), SLOT_BAD);
	/* only whole buckets are narrowed, and only to a committed way */
	cr_assert_eq(slot_pick(s, off + 64, bb, a.lo, a.hi, &ss), -EINVAL);
	cr_assert_eq(slot_pick(s, off, bb - 64, a.lo, a.hi, &ss), -EINVAL);
	cr_assert_eq(slot_pick(s, l.bytes, bb, a.lo, a.hi, &ss), -EINVAL);
	cr_assert_eq(slot_pick(s, slot_bucket_off(c, &b), bb, b.lo, b.hi,
			       &ss), 0);
	struct slot_wr w;
	cr_assert_eq(slot_write_begin(s, &a, sizeof(page), &w), 0);
	cr_assert_eq(slot_pick(s, off, bb, a.lo, a.hi, &ss), 0,
		     "a way being written is not sent");
	slot_write_abort(s, &w);
	free(v1);
	free(v2);
	free(snap);
	slot_region_free(s);
	free(base);
}

/* ---- Writers and readers on one bucket, from threads ---- */

#define HAM_KEYS 6
#define HAM_PAGE (64 * KIB)

struct ham {
	struct slot_region *s;
	const struct slot_class *c;
	struct slot_key k[HAM_KEYS];
	bool check_sum;
	_Atomic bool stop;
	_Atomic uint64_t reads, hits, wrong, writes;
};

static void *ham_writer(void *arg)
{
	struct ham *h = arg;
	uint8_t *page = malloc(HAM_PAGE);
	uint32_t ver = 1;
	unsigned seed = (unsigned)(uintptr_t)pthread_self();
	while (!atomic_load(&h->stop)) {
		uint32_t id = (uint32_t)(rand_r(&seed) % HAM_KEYS);
		struct slot_wr w;
		if (slot_write_begin(h->s, &h->k[id], HAM_PAGE, &w) < 0)
			continue;
		fill(page, HAM_PAGE, id, ver++);
		/* the copy in quarters, last first: a sliced copier, or a
		 * remote WRITE whose packets land in any order, does not
		 * fill a slot front to back */
		for (int q = 3; q >= 0; q--) {
			memcpy((uint8_t *)w.payload + q * (HAM_PAGE / 4),
			       page + q * (HAM_PAGE / 4), HAM_PAGE / 4);
			sched_yield(); /* slices come on later passes */
		}
		slot_write_commit(h->s, &w);
		atomic_fetch_add(&h->writes, 1);
	}
	free(page);
	return NULL;
}

/* A remote reader: a raw copy of the bucket (no seqlock), then judged. */
static void *ham_reader(void *arg)
{
	struct ham *h = arg;
	uint64_t bb = slot_bucket_bytes(h->c);
	uint8_t *snap = malloc(bb), *scratch = malloc(HAM_PAGE);
	const uint8_t *base = slot_region_base(h->s);
	uint32_t id = 0;
	while (!atomic_load(&h->stop)) {
		id = (id + 1) % HAM_KEYS;
		uint64_t off = slot_bucket_off(h->c, &h->k[id]);
		memcpy(snap, base + off, bb);
		uint64_t len = 0;
		int w = slot_find(snap, h->c, &h->k[id], HAM_PAGE, h->check_sum,
				  &len, NULL);
		atomic_fetch_add(&h->reads, 1);
		if (w < 0)
			continue;
		atomic_fetch_add(&h->hits, 1);
		const uint8_t *p = snap + (uint64_t)w * h->c->stride +
				   SLOT_HDR_BYTES;
		if (len != HAM_PAGE || !page_ok(p, len, id, scratch))
			atomic_fetch_add(&h->wrong, 1);
	}
	free(snap);
	free(scratch);
	return NULL;
}

/* A remote reader of selections: what the owner picks, sent as a plain
 * copy while writers work, judged as a narrowed READ's bytes are. */
static void *ham_sel_reader(void *arg)
{
	struct ham *h = arg;
	uint8_t *snap = malloc(h->c->stride), *scratch = malloc(HAM_PAGE);
	uint32_t id = 0;
	while (!atomic_load(&h->stop)) {
		id = (id + 1) % HAM_KEYS;
		const struct slot_key *k = &h->k[id];
		struct slot_sel ss;
		uint64_t n = sel_snap(h->s, h->c, k, snap, &ss);
		uint64_t len = 0;
		enum slot_verdict v = slot_judge_sel(snap, n, h->c, k, HAM_PAGE,
						     h->check_sum, &len);
		atomic_fetch_add(&h->reads, 1);
		if (v != SLOT_HIT)
			continue;
		atomic_fetch_add(&h->hits, 1);
		if (len != HAM_PAGE ||
		    !page_ok(snap + SLOT_HDR_BYTES, len, id, scratch))
			atomic_fetch_add(&h->wrong, 1);
	}
	free(snap);
	free(scratch);
	return NULL;
}

/* A local reader: the owner's seqlock read. */
static void *ham_local(void *arg)
{
	struct ham *h = arg;
	uint8_t *out = malloc(HAM_PAGE), *scratch = malloc(HAM_PAGE);
	uint32_t id = 0;
	while (!atomic_load(&h->stop)) {
		id = (id + 1) % HAM_KEYS;
		int64_t n = slot_read(h->s, &h->k[id], HAM_PAGE, out, HAM_PAGE);
		atomic_fetch_add(&h->reads, 1);
		if (n < 0)
			continue;
		atomic_fetch_add(&h->hits, 1);
		if (n != HAM_PAGE || !page_ok(out, HAM_PAGE, id, scratch))
			atomic_fetch_add(&h->wrong, 1);
	}
	free(out);
	free(scratch);
	return NULL;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Runs 2 writers and 2 readers on a 4-way bucket shared by 6 keys until
 * `reads` hits (or, with until_wrong, a wrong page shows), at most
 * max_s seconds. */
static void hammer(struct ham *h, void *(*reader)(void *), uint64_t reads,
		   bool until_wrong, double max_s)
{
	struct slot_layout l = one_class(HAM_PAGE, 4, 1);
	void *base;
	h->s = mk(&l, &base);
	h->c = &slot_region_layout(h->s)->cls[0];
	for (int i = 0; i < HAM_KEYS; i++) {
		char name[16];
		snprintf(name, sizeof(name), "ham%d", i);
		h->k[i] = key(name);
	}
	pthread_t t[4];
	pthread_create(&t[0], NULL, ham_writer, h);
	pthread_create(&t[1], NULL, ham_writer, h);
	pthread_create(&t[2], NULL, reader, h);
	pthread_create(&t[3], NULL, reader, h);
	double end = now_s() + max_s;
	while (now_s() < end && atomic_load(&h->hits) < reads &&
	       !(until_wrong && atomic_load(&h->wrong) > 0)) {
		struct timespec ts = {0, 10 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	atomic_store(&h->stop, true);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	slot_region_free(h->s);
	free(base);
}

/* The hammer with the checksum on: hits, writes, and no wrong page. */
static void hammer_clean(void *(*reader)(void *), const char *what)
{
	struct ham h = {.check_sum = true};
	hammer(&h, reader, 200000, false, 5);
	cr_log_info("%s: %lu reads, %lu hits, %lu writes, %lu wrong", what,
		    (unsigned long)h.reads, (unsigned long)h.hits,
		    (unsigned long)h.writes, (unsigned long)h.wrong);
	cr_assert_gt(h.hits, 0);
	cr_assert_gt(h.writes, 0);
	cr_assert_eq(h.wrong, 0);
}

/* A negative control: the same load with the checksum off must let a
 * torn page through, or the clean run proves nothing. */
static void hammer_control(void *(*reader)(void *), const char *what)
{
	struct ham h = {.check_sum = false};
	hammer(&h, reader, UINT64_MAX, true, 60);
	cr_log_info("control, %s: %lu reads, %lu hits, %lu wrong", what,
		    (unsigned long)h.reads, (unsigned long)h.hits,
		    (unsigned long)h.wrong);
	cr_assert_gt(h.wrong, 0, "%s: no torn page in 60 s of hammering", what);
}

Test(slot_hammer, remote_readers_never_accept_a_wrong_page, .timeout = 120)
{
	hammer_clean(ham_reader, "remote");
}

Test(slot_hammer, local_seqlock_readers_never_see_a_wrong_page,
     .timeout = 120)
{
	hammer_clean(ham_local, "local");
}

Test(slot_hammer, without_the_checksum_torn_pages_get_through,
     .timeout = 120)
{
	hammer_control(ham_reader, "buckets");
}

Test(slot_hammer, selected_readers_never_accept_a_wrong_page, .timeout = 120)
{
	hammer_clean(ham_sel_reader, "selected");
}

/* Selections (narrowed READs) are torn too, and only the checksum stops
 * them. */
Test(slot_hammer, without_the_checksum_torn_selections_get_through,
     .timeout = 120)
{
	hammer_control(ham_sel_reader, "selections");
}
