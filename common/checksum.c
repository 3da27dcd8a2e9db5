/*
 * common/checksum.c — see checksum.h. This file holds the baseline variant
 * and the dispatch; checksum_avx2.c is the same xxHash code compiled for
 * AVX2 (CMake gives that one file -mavx2 and this one PC_HAVE_AVX2_SUM).
 */
#include "checksum.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

typedef uint64_t (*sum_fn)(const void *, size_t);

static uint64_t sum_base(const void *p, size_t n)
{
	return XXH3_64bits(p, n);
}

#ifdef PC_HAVE_AVX2_SUM
uint64_t pc_page_sum_avx2(const void *p, size_t n);

static sum_fn pick(void)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2") ? pc_page_sum_avx2 : sum_base;
}
#define BASE_NAME "sse2"
#else
static sum_fn pick(void)
{
	return sum_base;
}
#define BASE_NAME "scalar"
#endif

static sum_fn g_fn;

uint64_t pc_page_sum(const void *p, size_t n)
{
	sum_fn f = __atomic_load_n(&g_fn, __ATOMIC_RELAXED);
	if (!f) {
		f = pick(); /* idempotent: racing threads store the same value */
		__atomic_store_n(&g_fn, f, __ATOMIC_RELAXED);
	}
	return f(p, n);
}

_Static_assert(sizeof(XXH3_state_t) <= sizeof(struct pc_sum_state) &&
		       _Alignof(XXH3_state_t) <= 64,
	       "pc_sum_state is too small for XXH3_state_t");

void pc_sum_reset(struct pc_sum_state *st)
{
	XXH3_64bits_reset((XXH3_state_t *)(void *)st->opaque);
}

#ifdef PC_HAVE_AVX2_SUM
void pc_sum_update_avx2(void *st, const void *p, size_t n);
#endif

void pc_sum_update(struct pc_sum_state *st, const void *p, size_t n)
{
#ifdef PC_HAVE_AVX2_SUM
	if (pc_page_sum_impl()[0] == 'a') {
		pc_sum_update_avx2(st->opaque, p, n);
		return;
	}
#endif
	XXH3_64bits_update((XXH3_state_t *)(void *)st->opaque, p, n);
}

uint64_t pc_sum_digest(const struct pc_sum_state *st)
{
	return XXH3_64bits_digest((const XXH3_state_t *)(const void *)st->opaque);
}

const char *pc_page_sum_impl(void)
{
	if (!__atomic_load_n(&g_fn, __ATOMIC_RELAXED))
		(void)pc_page_sum("", 0);
	return g_fn == sum_base ? BASE_NAME : "avx2";
}
