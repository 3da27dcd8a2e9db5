/*
 * common/util.h — small helpers shared by every layer of PeerCache.
 *
 * Owns: nothing (header only). Thread-safety: every function here is pure or
 * works on caller-owned memory. Dependency rule: this header includes only libc,
 * so every other folder may include it.
 */
#ifndef PC_COMMON_UTIL_H
#define PC_COMMON_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PC_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define PC_MIN(a, b) ((a) < (b) ? (a) : (b))
#define PC_MAX(a, b) ((a) > (b) ? (a) : (b))
#define PC_CONTAINER_OF(ptr, type, member) \
	((type *)(void *)((char *)(ptr) - offsetof(type, member)))
#define PC_LIKELY(x) __builtin_expect(!!(x), 1)
#define PC_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define PC_UNUSED __attribute__((unused))
#define PC_PRINTF(f, a) __attribute__((format(printf, f, a)))

/* Copy the string src into dst of size bytes (> 0), cut to fit and always
 * terminated: snprintf(dst, size, "%s", src) without the format parser,
 * for per-page paths (~20x cheaper). */
static inline void pc_strcpy(char *dst, size_t size, const char *src)
{
	size_t n = strnlen(src, size - 1);
	memcpy(dst, src, n);
	dst[n] = '\0';
}

/*
 * Always-on assertion for invariants: a broken invariant in a cache server is
 * a bug that must stop the process loudly rather than serve wrong bytes.
 */
#define PC_ASSERT(cond)                                                        \
	do {                                                                   \
		if (PC_UNLIKELY(!(cond)))                                      \
			pc_assert_fail(#cond, __FILE__, __LINE__, __func__);   \
	} while (0)

/* Debug-only assertion for hot loops (compiled out when NDEBUG is set). */
#ifdef NDEBUG
#define PC_DASSERT(cond) ((void)0)
#else
#define PC_DASSERT(cond) PC_ASSERT(cond)
#endif

__attribute__((noreturn)) static inline void
pc_assert_fail(const char *expr, const char *file, int line, const char *func)
{
	fprintf(stderr, "peercache: assertion failed: %s (%s:%d, %s)\n", expr,
		file, line, func);
	abort();
}

/* Monotonic clock in nanoseconds; the reactor caches it once per iteration. */
static inline uint64_t pc_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Allocation that aborts on failure: only for start-up sized structures. */
static inline void *pc_xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);
	if (!p) {
		fprintf(stderr, "peercache: out of memory (%zu x %zu bytes)\n", n,
			size);
		abort();
	}
	return p;
}

/* True when x is a power of two (and not zero). */
static inline int pc_is_pow2(uint64_t x)
{
	return x && !(x & (x - 1));
}

/* Smallest power of two >= x (x <= 2^63). */
static inline uint64_t pc_roundup_pow2(uint64_t x)
{
	if (x <= 1)
		return 1;
	return 1ull << (64 - __builtin_clzll(x - 1));
}

#endif /* PC_COMMON_UTIL_H */
