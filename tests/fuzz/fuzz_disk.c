/*
 * tests/fuzz/fuzz_disk.c — libFuzzer target for the disk tier's store file
 * (storage/disk_log.c): the rebuild that scans a region's bytes at start-up
 * (region header, record headers, payload checksums, the index across
 * regions) and the read path's check of a record read back
 * (dl_rec_check, what modules/disk.c runs before a promotion copies a
 * page). "A corrupted store file never crashes the node or yields a wrong
 * page."
 *
 * Input: a flags byte, then the regions' images as runs: a u16 length L
 * (little-endian) and L bytes, each run starting at the next DL_BLOCK
 * boundary of the current image (the rest of a block is zeros), so a few
 * hundred input bytes describe records a block apart; L = 0xffff starts
 * the next region's image (at most DISK_FUZZ_REGIONS). Flags: bit 0 checks
 * payload checksums (the node always does; off tests the index alone);
 * bit 1 rewrites the region header's and every record header's checksum
 * and bit 2 every payload checksum before the rebuild (a fuzzer cannot
 * guess XXH3: this lets it reach the scan's other checks); bit 3 appends
 * records after the rebuild until regions are evicted.
 *
 * Invariants (else the target traps or the store's own assertions abort):
 * every key indexed is a record in the bytes given — inside its region,
 * after the region header, its header valid and its own key's, with the
 * index's length, sequence and checksum, a checksum that matches its
 * payload when checked — and the read path accepts it (dl_rec_check);
 * the store's counts equal what the index holds; a later dl_alloc hands
 * out sequences above every indexed one, and commits and evictions over a
 * rebuilt index keep it consistent.
 *
 * Build: cmake -DPEERCACHE_FUZZ=ON -DCMAKE_C_COMPILER=clang ...; run:
 * build-fuzz/tests/fuzz/fuzz_disk -max_total_time=60 WORKDIR
 * tests/fuzz/corpus/disk (scripts/test.sh does this as a smoke test;
 * tests/fuzz/make_seeds.c writes the corpus).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/checksum.h"
#include "storage/disk_log.h"

#define DISK_FUZZ_REGIONS 3
#define DISK_FUZZ_IMAGE (64u * DL_BLOCK) /* bytes of an image at most */

#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint8_t store_id[16] = "fuzz-store-id-01";

struct image {
	uint8_t *b;
	size_t n; /* a multiple of DL_BLOCK */
};

struct ctx {
	struct dlog *d;
	struct image *img;
	unsigned nimg;
	bool verify;
	uint64_t rebuilt_seq; /* entries up to it come from the images */
	uint64_t keys, bytes_live, max_seq;
};

/* Lay the runs of data out into images: built in a zeroed scratch, then
 * each copied to a heap block of exactly its size (so that a read past an
 * image's end is a heap overflow ASan reports, and a small input costs a
 * small allocation, not a megabyte to zero). */
static unsigned images(const uint8_t *data, size_t size, struct image *img)
{
	static uint8_t scratch[DISK_FUZZ_REGIONS][DISK_FUZZ_IMAGE];
	unsigned n = 0;
	size_t at = 0, pos = 0;
	while (at + 2 <= size) {
		uint32_t len = data[at] | (uint32_t)data[at + 1] << 8;
		at += 2;
		if (len == 0xffff) {
			img[n].n = pos;
			if (n + 1 == DISK_FUZZ_REGIONS)
				break;
			n++;
			pos = 0;
			continue;
		}
		if (len > size - at)
			len = (uint32_t)(size - at);
		if (pos + len > DISK_FUZZ_IMAGE)
			break;
		memcpy(scratch[n] + pos, data + at, len);
		at += len;
		pos = (pos + len + DL_BLOCK - 1) / DL_BLOCK * DL_BLOCK;
		if (len == 0)
			pos += DL_BLOCK;
	}
	img[n].n = pos < DISK_FUZZ_IMAGE ? pos : DISK_FUZZ_IMAGE;
	for (unsigned i = 0; i <= n; i++) {
		img[i].b = malloc(img[i].n ? img[i].n : 1);
		memcpy(img[i].b, scratch[i], img[i].n);
		memset(scratch[i], 0, img[i].n);
	}
	return n + 1;
}

/* Make the checksums right where a header claims to be one (bit 1 and
 * 2): walk the records the way the scan will. */
static void fix_sums(struct image *im, bool hdrs, bool payloads)
{
	if (im->n < DL_BLOCK)
		return;
	if (hdrs) {
		struct dl_region_hdr h;
		memcpy(&h, im->b, sizeof(h));
		h.hdr_sum = XXH3_64bits(&h, offsetof(struct dl_region_hdr,
						     hdr_sum));
		memcpy(im->b, &h, sizeof(h));
	}
	for (size_t pos = DL_BLOCK; pos + DL_HDR_BYTES <= im->n;) {
		struct dl_rec_hdr h;
		memcpy(&h, im->b + pos, sizeof(h));
		if (h.magic != DL_REC_MAGIC)
			break;
		if (payloads && h.klen <= DL_KEY_MAX &&
		    pos + DL_HDR_BYTES + h.klen + (uint64_t)h.len <= im->n)
			h.sum = pc_page_sum(im->b + pos + DL_HDR_BYTES + h.klen,
					    h.len);
		if (hdrs)
			h.hdr_sum = XXH3_64bits(&h, offsetof(struct dl_rec_hdr,
							     hdr_sum));
		memcpy(im->b + pos, &h, sizeof(h));
		if (h.total < DL_BLOCK || h.total % DL_BLOCK)
			break;
		pos += h.total;
	}
}

/* One indexed key: the bytes it points at are its record. */
static void check_entry(void *arg, const char *key, size_t klen,
			const struct dl_loc *loc)
{
	struct ctx *c = arg;
	uint64_t rb = dl_region_bytes(c->d);
	uint64_t start = (uint64_t)loc->region * rb;
	check(loc->region < dl_regions(c->d) && klen >= 1 &&
	      klen <= DL_KEY_MAX);
	check(loc->off >= start + DL_BLOCK && loc->off + loc->total <=
						       start + rb);
	check(loc->total == dl_record_bytes(klen, loc->len));
	c->keys++;
	c->bytes_live += loc->len;
	if (loc->seq > c->max_seq)
		c->max_seq = loc->seq;
	if (loc->seq > c->rebuilt_seq)
		return; /* appended after the rebuild (append) */
	check(loc->region < c->nimg);
	const struct image *im = &c->img[loc->region];
	check(loc->off + loc->total <= start + im->n);
	const uint8_t *rec = im->b + (loc->off - start);
	struct dl_rec_hdr h;
	check(dl_rec_hdr_decode(rec, &h) == 0);
	check(h.klen == klen && memcmp(rec + DL_HDR_BYTES, key, klen) == 0);
	check(h.len == loc->len && h.seq == loc->seq && h.sum == loc->sum &&
	      h.gen == loc->gen && h.total == loc->total);
	if (c->verify)
		check(pc_page_sum(rec + DL_HDR_BYTES + klen, h.len) == h.sum);
	check(dl_rec_check(rec, loc->total, key, klen, loc, &h) == 0);
	/* never another key's record, nor a record cut short */
	char other[DL_KEY_MAX + 1];
	memcpy(other, key, klen);
	other[0] ^= 1;
	check(dl_rec_check(rec, loc->total, other, klen, loc, &h) < 0);
	check(dl_rec_check(rec, loc->total - 1, key, klen, loc, &h) < 0);
}

static void walk_index(struct ctx *c)
{
	uint64_t cursor = 0;
	c->keys = c->bytes_live = c->max_seq = 0;
	while (dl_scan(c->d, &cursor, 7, check_entry, c) == 1)
		;
	struct dl_stats st;
	dl_stats(c->d, &st);
	check(st.keys == c->keys && st.bytes_live == c->bytes_live);
	check(st.seq >= c->max_seq);
}

static void on_evict(void *arg, const char *key, size_t klen, uint64_t gen)
{
	(void)key, (void)klen, (void)gen;
	(*(unsigned *)arg)++;
}

/* Append records over the rebuilt store until regions are reused: every
 * sequence handed out is above the rebuilt ones, the index stays sound. */
static void append(struct ctx *c)
{
	uint64_t rb = dl_region_bytes(c->d), seen = c->max_seq;
	unsigned evicted = 0;
	for (unsigned i = 0; i < 12; i++) {
		uint64_t off, seq, hoff, oseq;
		uint64_t bytes = rb / 2 - DL_BLOCK * (i % 3);
		int ret = dl_alloc(c->d, bytes, &off, &seq, &hoff, &oseq,
				   on_evict, &evicted);
		if (ret < 0)
			break;
		check(seq > seen && (hoff == UINT64_MAX || oseq > seen));
		seen = seq;
		char key[8] = {'k', (char)('0' + i % 4)};
		struct dl_loc loc = {.off = off, .total = (uint32_t)bytes,
				     .len = (uint32_t)(bytes - DL_HDR_BYTES - 2),
				     .gen = i + 1, .seq = seq,
				     .region = (uint32_t)(off / rb)};
		if (i % 5 == 4) {
			dl_abort(c->d, off);
			continue;
		}
		check(dl_commit(c->d, key, 2, &loc) == 0);
		struct dl_loc got;
		check(dl_get(c->d, key, 2, &got) && got.seq == seq);
		dl_put(c->d, got.region);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	uint8_t flags = data[0];
	struct image img[DISK_FUZZ_REGIONS] = {0};
	unsigned n = images(data + 1, size - 1, img);
	struct dl_params p = {.capacity = (uint64_t)(DISK_FUZZ_REGIONS + 1) *
					  DL_REGION_MIN,
			      .region_bytes = DL_REGION_MIN};
	memcpy(p.store_id, store_id, sizeof(p.store_id));
	struct ctx c = {.img = img, .nimg = n, .verify = flags & 1};
	check(dl_new(&c.d, &p) == 0);
	unsigned bad = 0;
	for (unsigned i = 0; i < n; i++) {
		fix_sums(&img[i], flags & 2, flags & 4);
		int found = dl_rebuild_region(c.d, i, img[i].b, img[i].n,
					      c.verify, &bad);
		check(found >= 0 && (size_t)found <= img[i].n / DL_BLOCK);
	}
	c.rebuilt_seq = UINT64_MAX;
	walk_index(&c);
	if (flags & 8) {
		c.rebuilt_seq = c.max_seq;
		append(&c);
		walk_index(&c);
	}
	dl_free(c.d);
	for (unsigned i = 0; i < n; i++)
		free(img[i].b);
	return 0;
}
