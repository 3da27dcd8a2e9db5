/*
 * tests/fuzz/fuzz_slot.c — libFuzzer target for what a slotmap reader
 * trusts (storage/slot_region.c, modules/slotmap_wire.c): an owner's
 * slot.layout answer, a bucket read whole (slot_find / slot_judge), a
 * selection the owner sent instead (slot_judge_sel), and on the owner a
 * region whose slots were overwritten with arbitrary bytes (what a stale
 * or hostile remote WRITE can leave): slot_pick's selection, slot_read,
 * slot_exists. The first byte picks the mode (below); in modes 1-2 the
 * second byte's bits fix the key hash, the trailer and the checksum of
 * what follows (a fuzzer cannot guess XXH3: this lets it reach a hit).
 *
 * Invariants (else the target traps): a layout accepted has node and data,
 * a bucket of every class within one read and inside the region's bytes;
 * a slot accepted is the asked key's (its 128-bit hash), of an even
 * non-zero sequence equal to its trailer, a length within the class (and
 * the one asked for), a checksum matching its payload (when checked), and
 * a selection accepted is exactly header + payload + trailer; slot_find
 * answers the first way slot_judge accepts; on the owner a selection lies
 * inside the bucket asked for, and a page read is the key's own bytes.
 *
 * Build: cmake -DPEERCACHE_FUZZ=ON -DCMAKE_C_COMPILER=clang ...; run:
 * build-fuzz/tests/fuzz/fuzz_slot -max_total_time=60 WORKDIR
 * tests/fuzz/corpus/slot (scripts/test.sh does this as a smoke test;
 * tests/fuzz/make_seeds.c writes the corpus).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modules/slotmap_wire.h"
#include "modules/transport.h"
#include "storage/slot_region.h"

#define FIX_KEY 1
#define FIX_TRAILER 2
#define FIX_SUM 4
#define FIX_LEN 8   /* selection: the header's length from its size */
#define WANT_LEN 16 /* ask for the length the first slot claims */
#define NO_SUM 32   /* judge without the checksum (the copier checks it) */

#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The small geometry modes 1-3 use: the node's smallest page size. */
static const struct slot_class cls4k = {
	.max_payload = SLOT_PAYLOAD_MIN, .ways = 4, .buckets = 4,
	.stride = (SLOT_HDR_BYTES + SLOT_PAYLOAD_MIN + SLOT_TRAILER_BYTES +
		   63) / 64 * 64,
	.offset = 0};

/* ---- mode 0: a slot.layout answer */

static void layout(const uint8_t *p, size_t n)
{
	struct mp_rd rd;
	struct sm_layout l;
	mp_rd_init(&rd, p, n);
	if (sm_layout_read(&rd, &l) < 0)
		return;
	check(l.node[0] && l.data[0] && l.rkey && l.base && !l.valid);
	check(l.l.nclasses >= 1 && l.l.nclasses <= SLOT_CLASSES_MAX);
	struct slot_key k;
	slot_key_of(&k, p, n);
	for (uint32_t c = 0; c < l.l.nclasses; c++) {
		const struct slot_class *sc = &l.l.cls[c];
		uint64_t bb = slot_bucket_bytes(sc);
		check(bb > 0 && bb <= TP_IO_MAX);
		check(sc->max_payload + SLOT_HDR_BYTES + SLOT_TRAILER_BYTES <=
		      sc->stride);
		/* the key's bucket, the first and the last: inside */
		uint64_t off = slot_bucket_off(sc, &k);
		check(off >= sc->offset && off + bb <= l.l.bytes);
		check(sc->offset + sc->buckets * bb <= l.l.bytes);
		check(slot_class_for(&l.l, sc->max_payload) == (int)c);
	}
}

/* ---- modes 1-2: what a reader got */

static void fix(uint8_t *slot, uint64_t trailer_off, const struct slot_key *k,
		unsigned fl)
{
	struct slot_hdr h;
	memcpy(&h, slot, sizeof(h));
	if (fl & FIX_KEY) {
		h.key_lo = k->lo;
		h.key_hi = k->hi;
	}
	if ((fl & FIX_SUM) && h.len <= cls4k.max_payload &&
	    SLOT_HDR_BYTES + h.len <= trailer_off)
		h.sum = slot_sum(k, h.len, slot + SLOT_HDR_BYTES);
	if (fl & FIX_TRAILER)
		memcpy(slot + trailer_off, &h.seq, sizeof(h.seq));
	memcpy(slot, &h, sizeof(h));
}

/* A hit's slot is the key's own whole page. */
static void check_hit(const uint8_t *slot, uint64_t trailer_off,
		      const struct slot_key *k, uint64_t want, bool sum,
		      uint64_t len)
{
	struct slot_hdr h;
	uint64_t tr;
	memcpy(&h, slot, sizeof(h));
	memcpy(&tr, slot + trailer_off, sizeof(tr));
	check(h.key_lo == k->lo && h.key_hi == k->hi);
	check(h.magic == SLOT_MAGIC && h.version == SLOT_VERSION);
	check(h.seq && !(h.seq & 1) && tr == h.seq);
	check(h.len == len && len <= cls4k.max_payload && (!want || want == len));
	check(SLOT_HDR_BYTES + len <= trailer_off);
	if (sum)
		check(slot_sum(k, len, slot + SLOT_HDR_BYTES) == h.sum);
}

static void bucket(const uint8_t *p, size_t n, unsigned fl,
		   const struct slot_key *k)
{
	uint64_t bb = slot_bucket_bytes(&cls4k), toff = cls4k.stride - 8;
	uint8_t *b = calloc(1, bb);
	/* each way: a u16 length and that many bytes from its start */
	for (uint32_t w = 0, at = 0; w < cls4k.ways && at + 2 <= n; w++) {
		size_t len = p[at] | (size_t)p[at + 1] << 8;
		at += 2;
		if (len > n - at)
			len = n - at;
		if (len > cls4k.stride)
			len = cls4k.stride;
		memcpy(b + w * cls4k.stride, p + at, len);
		at += (uint32_t)len;
		fix(b + w * cls4k.stride, toff, k, fl);
	}
	uint64_t want = 0;
	if (fl & WANT_LEN)
		memcpy(&want, b + offsetof(struct slot_hdr, len), 8);
	bool sum = !(fl & NO_SUM);
	uint64_t len = 0;
	struct slot_scan sc = {0};
	int way = slot_find(b, &cls4k, k, want, sum, &len, &sc);
	int first = -1;
	unsigned bad = 0;
	for (uint32_t w = 0; w < cls4k.ways; w++) {
		uint64_t l2 = 0;
		enum slot_verdict v = slot_judge(b + w * cls4k.stride, &cls4k,
						 k, want, sum, &l2);
		if (v == SLOT_HIT && first < 0) {
			first = (int)w;
			check_hit(b + w * cls4k.stride, toff, k, want, sum, l2);
		}
		bad += first < 0 && v == SLOT_BAD;
	}
	check(way == (first < 0 ? -ENOENT : first));
	check(sc.rejected == bad);
	if (way >= 0)
		check_hit(b + (uint64_t)way * cls4k.stride, toff, k, want, sum,
			  len);
	free(b);
}

static void selection(const uint8_t *p, size_t n, unsigned fl,
		      const struct slot_key *k)
{
	uint8_t *s = malloc(n + 1);
	memcpy(s, p, n);
	if (n >= SLOT_HDR_BYTES + SLOT_TRAILER_BYTES) {
		if (fl & FIX_LEN) {
			uint64_t len = n - SLOT_HDR_BYTES - SLOT_TRAILER_BYTES;
			memcpy(s + offsetof(struct slot_hdr, len), &len, 8);
		}
		fix(s, n - SLOT_TRAILER_BYTES, k, fl);
	}
	uint64_t want = 0, len = 0;
	if ((fl & WANT_LEN) && n >= SLOT_HDR_BYTES)
		memcpy(&want, s + offsetof(struct slot_hdr, len), 8);
	bool sum = !(fl & NO_SUM);
	if (slot_judge_sel(s, n, &cls4k, k, want, sum, &len) == SLOT_HIT) {
		check(n == SLOT_HDR_BYTES + len + SLOT_TRAILER_BYTES);
		check_hit(s, n - SLOT_TRAILER_BYTES, k, want, sum, len);
	}
	free(s);
}

/* ---- mode 3: the owner's region after arbitrary writes */

#define OWN_KEYS 6

static void owner(const uint8_t *p, size_t n)
{
	const struct slot_class_spec specs[] = {
		{.max_payload = 4096, .ways = 2, .buckets = 2},
		{.max_payload = 8192, .ways = 2, .buckets = 1}};
	struct slot_layout l;
	check(slot_layout_plan(&l, 1 << 20, specs, 2, NULL) == 0);
	uint8_t *base = calloc(1, l.bytes);
	struct slot_region *s;
	check(slot_region_new(&s, base, &l) == 0);
	/* real pages first: key i's page is OWN_PAGE(i) bytes of i */
	static uint8_t page[8192];
	struct slot_key keys[OWN_KEYS];
	uint64_t lens[OWN_KEYS];
	for (unsigned i = 0; i < OWN_KEYS; i++) {
		char name[2] = {'k', (char)('0' + i)};
		slot_key_of(&keys[i], name, 2);
		lens[i] = 1 + i * 1500;
		memset(page, 'a' + (int)i, lens[i]);
		(void)slot_write(s, &keys[i], page, lens[i]);
	}
	/* then the input's writes: (u32 offset, u16 length, bytes)... */
	size_t at = 0;
	while (at + 6 <= n) {
		uint32_t off;
		memcpy(&off, p + at, 4);
		size_t len = p[at + 4] | (size_t)p[at + 5] << 8;
		at += 6;
		if (len > n - at)
			len = n - at;
		off %= (uint32_t)l.bytes;
		if (len > l.bytes - off)
			len = l.bytes - off;
		memcpy(base + off, p + at, len);
		at += len;
	}
	static uint8_t out[8192 + 1];
	for (unsigned i = 0; i < OWN_KEYS; i++) {
		const struct slot_key *k = &keys[i];
		int64_t got = slot_read(s, k, 0, out, sizeof(out));
		if (got >= 0) {
			/* only the key's own page passes the checksum (the
			 * input cannot forge one: 2^-64) */
			memset(page, 'a' + (int)i, lens[i]);
			check((uint64_t)got == lens[i] &&
			      memcmp(out, page, lens[i]) == 0);
		}
		(void)slot_exists(s, k, 0);
		/* a selected read of each class's bucket of the key */
		for (uint32_t c = 0; c < l.nclasses; c++) {
			const struct slot_class *sc = &l.cls[c];
			uint64_t boff = slot_bucket_off(sc, k),
				 bb = slot_bucket_bytes(sc);
			struct slot_sel sel;
			int r = slot_pick(s, boff, bb, k->lo, k->hi, &sel);
			check(r == 0 || r == 1);
			if (r != 1)
				continue;
			check(sel.slot_off >= boff &&
			      sel.slot_off + SLOT_HDR_BYTES + sel.len <=
				      boff + bb &&
			      sel.slot_off + sel.trailer_off + 8 <= boff + bb &&
			      sel.len <= sc->max_payload);
			/* what rselect sends, judged as a reader does */
			uint64_t sn = SLOT_HDR_BYTES + sel.len + 8, len;
			uint8_t *b = malloc(sn);
			memcpy(b, base + sel.slot_off, sn - 8);
			memcpy(b + sn - 8, base + sel.slot_off +
						   sel.trailer_off, 8);
			if (slot_judge_sel(b, sn, sc, k, 0, true, &len) ==
			    SLOT_HIT)
				check(len == sel.len);
			free(b);
		}
		/* a range that is not one bucket is refused */
		struct slot_sel sel;
		check(slot_pick(s, 1, slot_bucket_bytes(&l.cls[0]), k->lo,
				k->hi, &sel) < 0);
	}
	slot_region_free(s);
	free(base);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 3)
		return 0;
	struct slot_key k;
	char name[2] = {'k', (char)data[2]};
	slot_key_of(&k, name, 2);
	const uint8_t *p = data + 3;
	size_t n = size - 3;
	switch (data[0] % 4) {
	case 0: layout(data + 1, size - 1); break;
	case 1: bucket(p, n, data[1], &k); break;
	case 2: selection(p, n, data[1], &k); break;
	default: owner(data + 1, size - 1); break;
	}
	return 0;
}
