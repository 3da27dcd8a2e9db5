/*
 * server/fault_alloc.c — test-only allocation failures (server/fault_alloc.h).
 */
#include "server/fault_alloc.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/faultspec.h"
#include "common/log.h"

#define LOG_MOD "main"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
int __real_posix_memalign(void **p, size_t align, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);
int __wrap_posix_memalign(void **p, size_t align, size_t n);

static struct {
	bool armed;      /* atomic */
	struct pc_fault_spec spec;
	uint64_t failed; /* atomic */
} g;

static _Thread_local uint64_t t_state;

static bool fail_now(void)
{
	if (!__atomic_load_n(&g.armed, __ATOMIC_ACQUIRE) ||
	    !pc_fault_hit(&g.spec, &t_state))
		return false;
	__atomic_add_fetch(&g.failed, 1, __ATOMIC_RELAXED);
	errno = ENOMEM;
	return true;
}

void *__wrap_malloc(size_t n)
{
	return fail_now() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
	return fail_now() ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
	/* realloc(p, 0) frees: never "fails" */
	return n && fail_now() ? NULL : __real_realloc(p, n);
}

char *__wrap_strdup(const char *s)
{
	return fail_now() ? NULL : __real_strdup(s);
}

char *__wrap_strndup(const char *s, size_t n)
{
	return fail_now() ? NULL : __real_strndup(s, n);
}

int __wrap_posix_memalign(void **p, size_t align, size_t n)
{
	/* posix_memalign reports the error instead of setting errno */
	return fail_now() ? ENOMEM : __real_posix_memalign(p, align, n);
}

void pc_fault_alloc_arm(void)
{
	if (!pc_fault_spec_read("PEERCACHE_TEST_ALLOC_FAULTS", &g.spec))
		return;
	PC_LOGW(LOG_MOD, "test-only allocation failures are on "
		"(PEERCACHE_TEST_ALLOC_FAULTS=%s): the node's own allocations "
		"fail at rate %.5f, seed %llu, until it stops",
		getenv("PEERCACHE_TEST_ALLOC_FAULTS"), g.spec.rate,
		(unsigned long long)g.spec.seed);
	__atomic_store_n(&g.armed, true, __ATOMIC_RELEASE);
}

uint64_t pc_fault_alloc_disarm(void)
{
	__atomic_store_n(&g.armed, false, __ATOMIC_RELEASE);
	return __atomic_load_n(&g.failed, __ATOMIC_RELAXED);
}
