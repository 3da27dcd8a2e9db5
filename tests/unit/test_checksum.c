/*
 * tests/unit/test_checksum.c — the page checksum equals libxxhash's
 * XXH3_64bits for every length class (short, mid, long, stripes, blocks)
 * and alignment, whichever implementation the CPU picked.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/checksum.h"

Test(checksum, equals_libxxhash_xxh3_64)
{
	enum { MAX = (1 << 20) + 129 };
	uint8_t *buf = malloc(MAX + 64);
	cr_assert(buf);
	uint64_t x = 0x9e3779b97f4a7c15ull;
	for (size_t i = 0; i < MAX + 64; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		buf[i] = (uint8_t)x;
	}
	static const size_t lens[] = {0,    1,    3,    4,    8,     9,
				      16,   17,   128,  129,  240,   241,
				      1023, 1024, 1025, 4096, 65536, 262143,
				      MAX};
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
		for (size_t off = 0; off < 64; off += 7)
			cr_assert_eq(pc_page_sum(buf + off, lens[i]),
				     XXH3_64bits(buf + off, lens[i]),
				     "len %zu offset %zu (%s)", lens[i], off,
				     pc_page_sum_impl());
	const char *impl = pc_page_sum_impl();
	cr_assert(!strcmp(impl, "avx2") || !strcmp(impl, "sse2") ||
		  !strcmp(impl, "scalar"), "%s", impl);
	free(buf);
}
