/*
 * tests/unit/test_copy.c — pc_copy equals memcpy for every length class
 * and every source/destination distance, with each loop this CPU has (the
 * short-distance loops are where it differs from memcpy), and writes
 * nothing outside the destination.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/copy.h"

enum { PAD = 128, MAXLEN = (1 << 20) + 77 };

static uint8_t *g_src, *g_dst;

static void fill(uint8_t *p, size_t n, uint64_t x)
{
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		p[i] = (uint8_t)x;
	}
}

static void setup(void)
{
	/* page-aligned, so the offsets below set (dst - src) mod 4096 */
	cr_assert(posix_memalign((void **)&g_src, 4096, MAXLEN + 2 * 4096) ==
		  0);
	cr_assert(posix_memalign((void **)&g_dst, 4096, MAXLEN + 2 * 4096) ==
		  0);
	fill(g_src, MAXLEN + 2 * 4096, 0x9e3779b97f4a7c15ull);
}

static void teardown(void)
{
	free(g_src);
	free(g_dst);
}

/* Leading bytes of p[0..n) still 0xA5. */
static size_t untouched(const uint8_t *p, size_t n)
{
	size_t i = 0;
	while (i < n && p[i] == 0xA5)
		i++;
	return i;
}

/* Copy len bytes from src+so to dst+PAD+doff; compare, check the guards. */
static void one(size_t len, size_t so, size_t doff)
{
	uint8_t *d = g_dst + PAD + doff;
	memset(g_dst, 0xA5, PAD + doff + len + PAD);
	pc_copy(d, g_src + so, len);
	cr_assert(!memcmp(d, g_src + so, len),
		  "len %zu src+%zu dst+%zu (%s): bytes differ", len, so,
		  PAD + doff, pc_copy_impl());
	size_t before = untouched(g_dst, PAD + doff);
	cr_assert_eq(before, PAD + doff, "len %zu src+%zu dst+%zu (%s): byte "
		     "%zu before the destination written", len, so, PAD + doff,
		     pc_copy_impl(), PAD + doff - before);
	cr_assert_eq(untouched(d + len, PAD), PAD, "len %zu src+%zu dst+%zu "
		     "(%s): byte %zu after the destination written", len, so,
		     PAD + doff, pc_copy_impl(), untouched(d + len, PAD));
}

static void every_case(void)
{
	static const size_t lens[] = {0,    1,    15,   16,    63,    64,
				      2047, 2048, 2049, 4095,  4096,  4097,
				      8191, 65536 + 7,  262144, 262144 + 13,
				      MAXLEN};
	for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++)
		for (size_t so = 0; so < 64; so += 13)
			/* distances 0..70 (1..63: the loops) and a few far
			 * ones; dst+PAD+doff - (src+so) = dist */
			for (size_t dist = 0; dist < 4096; dist += dist < 70 ? 1 : 977)
				one(lens[l], so, (so + dist + 4096 - PAD) % 4096);
}

TestSuite(copy, .init = setup, .fini = teardown);

Test(copy, equals_memcpy_with_the_picked_loop)
{
	const char *impl = pc_copy_impl();
	cr_assert(!strcmp(impl, "avx2") || !strcmp(impl, "sse2") ||
		  !strcmp(impl, "memcpy"), "%s", impl);
	every_case();
}

Test(copy, equals_memcpy_with_the_sse2_loop)
{
	if (pc_copy_use("sse2") == -ENOTSUP)
		cr_skip_test("no SSE2 loop in this build (not x86-64)");
	cr_assert_str_eq(pc_copy_impl(), "sse2");
	every_case();
}

Test(copy, equals_memcpy_with_the_avx2_loop)
{
	if (pc_copy_use("avx2") == -ENOTSUP)
		cr_skip_test("this CPU has no AVX2");
	cr_assert_str_eq(pc_copy_impl(), "avx2");
	every_case();
}
