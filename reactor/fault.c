/*
 * reactor/fault.c — test-only fault injection (reactor/fault.h).
 */
#include "fault.h"

#ifdef PEERCACHE_FAULT_INJECTION
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

#define LOG_MOD "reactor"

static struct {
	pthread_once_t once;
	uint32_t threshold; /* fail when a 32-bit draw is below it; 0: off */
	uint64_t seed;
	unsigned threads;   /* streams handed out */
} g = {.once = PTHREAD_ONCE_INIT};

static _Thread_local uint64_t t_state;

static void fault_read_env(void)
{
	const char *v = getenv("PEERCACHE_TEST_REACTOR_FAULTS");
	if (!v || !*v)
		return;
	double rate = 0.0;
	unsigned long long seed = 1;
	const char *p = strstr(v, "rate=");
	if (p)
		rate = strtod(p + 5, NULL);
	p = strstr(v, "seed=");
	if (p)
		seed = strtoull(p + 5, NULL, 10);
	if (!(rate > 0.0))
		return;
	if (rate > 1.0)
		rate = 1.0;
	g.threshold = (uint32_t)(rate * 4294967295.0);
	g.seed = seed;
	PC_LOGW(LOG_MOD, "test-only fault injection in the reactor is on "
		"(PEERCACHE_TEST_REACTOR_FAULTS=%s): refused submissions, "
		"short sends and reads, resets after I/O, at rate %.4f, seed "
		"%llu", v, rate, seed);
}

void rx_fault_init(void)
{
	pthread_once(&g.once, fault_read_env);
}

/* splitmix64: one stream per thread, from the seed and the thread's rank */
static uint64_t draw(void)
{
	if (!t_state)
		t_state = g.seed * 0x9E3779B97F4A7C15ull +
			  __atomic_add_fetch(&g.threads, 1, __ATOMIC_RELAXED);
	uint64_t z = (t_state += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static bool hit(void)
{
	rx_fault_init();
	return g.threshold && (uint32_t)draw() < g.threshold;
}

bool rx_fault_sqe(void)
{
	return hit();
}

size_t rx_fault_len(size_t len)
{
	if (len < 2 || !hit())
		return len;
	return 1 + (size_t)(draw() % (len - 1));
}

int rx_fault_res(int res)
{
	return res >= 0 && hit() ? -ECONNRESET : res;
}
#endif
