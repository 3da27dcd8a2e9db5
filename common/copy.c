/*
 * common/copy.c — see copy.h.
 */
#include "copy.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

/* Aligned stores, unaligned loads, 128 bytes an iteration; the head up to
 * the destination's alignment and the tail go through memcpy (short). */
__attribute__((target("avx2"))) static void loop_avx2(uint8_t *d,
						      const uint8_t *s,
						      size_t n)
{
	size_t head = (32 - ((uintptr_t)d & 31)) & 31;
	memcpy(d, s, head);
	d += head;
	s += head;
	n -= head;
	size_t i = 0;
	for (; i + 128 <= n; i += 128) {
		__m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
		__m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
		__m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64));
		__m256i e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
		_mm256_store_si256((__m256i *)(d + i), a);
		_mm256_store_si256((__m256i *)(d + i + 32), b);
		_mm256_store_si256((__m256i *)(d + i + 64), c);
		_mm256_store_si256((__m256i *)(d + i + 96), e);
	}
	memcpy(d + i, s + i, n - i);
}

static void loop_sse2(uint8_t *d, const uint8_t *s, size_t n)
{
	size_t head = (16 - ((uintptr_t)d & 15)) & 15;
	memcpy(d, s, head);
	d += head;
	s += head;
	n -= head;
	size_t i = 0;
	for (; i + 64 <= n; i += 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)(s + i));
		__m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
		__m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
		_mm_store_si128((__m128i *)(d + i), a);
		_mm_store_si128((__m128i *)(d + i + 16), b);
		_mm_store_si128((__m128i *)(d + i + 32), c);
		_mm_store_si128((__m128i *)(d + i + 48), e);
	}
	memcpy(d + i, s + i, n - i);
}

typedef void (*loop_fn)(uint8_t *, const uint8_t *, size_t);

static loop_fn g_loop;

static loop_fn pick(void)
{
	loop_fn f = __atomic_load_n(&g_loop, __ATOMIC_RELAXED);
	if (!f) {
		__builtin_cpu_init();
		f = __builtin_cpu_supports("avx2") ? loop_avx2 : loop_sse2;
		/* idempotent: racing threads store the same value */
		__atomic_store_n(&g_loop, f, __ATOMIC_RELAXED);
	}
	return f;
}

void pc_copy(void *restrict dst, const void *restrict src, size_t n)
{
	size_t dist = ((uintptr_t)dst - (uintptr_t)src) & 4095;
	if (n < PC_COPY_LOOP_MIN || dist == 0 || dist > 63) {
		memcpy(dst, src, n);
		return;
	}
	pick()((uint8_t *)dst, (const uint8_t *)src, n);
}

const char *pc_copy_impl(void)
{
	return pick() == loop_avx2 ? "avx2" : "sse2";
}

int pc_copy_use(const char *impl)
{
	loop_fn f = NULL;
	__builtin_cpu_init();
	if (!strcmp(impl, "sse2"))
		f = loop_sse2;
	else if (!strcmp(impl, "avx2") && __builtin_cpu_supports("avx2"))
		f = loop_avx2;
	if (!f)
		return -ENOTSUP;
	__atomic_store_n(&g_loop, f, __ATOMIC_RELAXED);
	return 0;
}

#else /* not x86-64: the C library's memcpy throughout */

void pc_copy(void *restrict dst, const void *restrict src, size_t n)
{
	memcpy(dst, src, n);
}

const char *pc_copy_impl(void)
{
	return "memcpy";
}

int pc_copy_use(const char *impl)
{
	(void)impl;
	return -ENOTSUP;
}

#endif
