/*
 * bench/tool/page.c — the working set's keys and page contents (pcb.h).
 *
 * Owns: nothing. A page is self-describing: a 32-byte header (magic, index,
 * length, seed) and then 64-bit words from a counter hash of (seed, index,
 * word), so a driver can check any page it fetched without knowing what the
 * producer did, and a page of another index or size never passes.
 */
#include <stdio.h>
#include <string.h>

#include "pcb.h"

#define PAGE_MAGIC 0x3147415042435050ull /* "PPCBPAG1" little-endian */
#define PAGE_HDR 32

int pcb_key(char *buf, size_t len, const char *prefix, uint64_t index)
{
	int n = snprintf(buf, len, "%s/p/%llu", prefix,
			 (unsigned long long)index);
	return n < 0 || (size_t)n >= len ? -1 : n;
}

/* splitmix64's finaliser: a good 64-bit mix of one word. */
static inline uint64_t mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static inline uint64_t word_at(uint64_t base, uint64_t w)
{
	return mix64(base + w * 0x9e3779b97f4a7c15ull);
}

static void header(uint8_t h[PAGE_HDR], uint64_t len, uint64_t index,
		   uint64_t seed)
{
	const uint64_t v[4] = {PAGE_MAGIC, index, len, seed};
	memcpy(h, v, PAGE_HDR);
}

static uint64_t base_of(uint64_t index, uint64_t seed)
{
	return mix64(seed ^ mix64(index + 1));
}

/* Page bytes [from, to) of the body (from >= PAGE_HDR) into dst[0..). */
static void body(uint8_t *dst, uint64_t from, uint64_t to, uint64_t base)
{
	for (uint64_t off = from; off < to;) {
		uint64_t v = word_at(base, off / 8);
		uint64_t skip = off % 8, n = 8 - skip;
		if (n > to - off)
			n = to - off;
		memcpy(dst + (off - from), (const uint8_t *)&v + skip, n);
		off += n;
	}
}

void pcb_page_fill(uint8_t *p, uint64_t len, uint64_t index, uint64_t seed)
{
	uint8_t h[PAGE_HDR];
	header(h, len, index, seed);
	memcpy(p, h, len < PAGE_HDR ? len : PAGE_HDR);
	if (len > PAGE_HDR)
		body(p + PAGE_HDR, PAGE_HDR, len, base_of(index, seed));
}

static bool body_equal(const uint8_t *p, uint64_t from, uint64_t to,
		       uint64_t base)
{
	uint8_t tmp[4096];
	for (uint64_t off = from; off < to;) {
		uint64_t n = to - off < sizeof(tmp) ? to - off : sizeof(tmp);
		body(tmp, off, off + n, base);
		if (memcmp(tmp, p + off, n) != 0)
			return false;
		off += n;
	}
	return true;
}

bool pcb_page_check(const uint8_t *p, uint64_t len, uint64_t index,
		    uint64_t seed, bool full)
{
	uint8_t h[PAGE_HDR];
	header(h, len, index, seed);
	if (memcmp(p, h, len < PAGE_HDR ? len : PAGE_HDR) != 0)
		return false;
	if (len <= PAGE_HDR)
		return true;
	uint64_t base = base_of(index, seed);
	if (full)
		return body_equal(p, PAGE_HDR, len, base);
	uint64_t tail = len - PAGE_HDR > 64 ? len - 64 : PAGE_HDR;
	return body_equal(p, tail, len, base);
}
