/*
 * common/faultspec.c — settings and random streams of the test-only fault
 * injectors (common/faultspec.h).
 */
#include "common/faultspec.h"

#include <stdlib.h>
#include <string.h>

bool pc_fault_spec_read(const char *var, struct pc_fault_spec *sp)
{
	const char *v = getenv(var);
	if (!v || !*v)
		return false;
	double rate = 0.0;
	unsigned long long seed = 1;
	const char *p = strstr(v, "rate=");
	if (p)
		rate = strtod(p + 5, NULL);
	p = strstr(v, "seed=");
	if (p)
		seed = strtoull(p + 5, NULL, 10);
	if (!(rate > 0.0))
		return false;
	if (rate > 1.0)
		rate = 1.0;
	sp->threshold = (uint32_t)(rate * 4294967295.0);
	sp->seed = seed;
	sp->rate = rate;
	return true;
}

/* splitmix64: one stream per thread, from the seed and the thread's rank */
uint64_t pc_fault_draw(struct pc_fault_spec *sp, uint64_t *state)
{
	if (!*state)
		*state = sp->seed * 0x9E3779B97F4A7C15ull +
			 __atomic_add_fetch(&sp->threads, 1, __ATOMIC_RELAXED);
	uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

bool pc_fault_hit(struct pc_fault_spec *sp, uint64_t *state)
{
	return sp->threshold && (uint32_t)pc_fault_draw(sp, state) <
				sp->threshold;
}
