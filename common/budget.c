/*
 * common/budget.c — a lock-free byte budget (budget.h).
 *
 * Owns: nothing beyond the caller's struct. Any thread: the counter is
 * moved with relaxed atomics (the budget orders nothing else).
 */
#include <errno.h>

#include "common/budget.h"
#include "common/metrics.h"
#include "common/util.h"

int pc_budget_hold(struct pc_budget *b, uint64_t bytes)
{
	if (__atomic_add_fetch(&b->used, bytes, __ATOMIC_RELAXED) > b->max) {
		__atomic_sub_fetch(&b->used, bytes, __ATOMIC_RELAXED);
		return -EBUSY;
	}
	return 0;
}

void pc_budget_release(struct pc_budget *b, uint64_t bytes)
{
	uint64_t was = __atomic_fetch_sub(&b->used, bytes, __ATOMIC_RELAXED);
	PC_ASSERT(was >= bytes); /* never more given back than held */
}

uint64_t pc_budget_used(const struct pc_budget *b)
{
	return __atomic_load_n(&b->used, __ATOMIC_RELAXED);
}

static double used_fn(void *arg)
{
	return (double)pc_budget_used(arg);
}

void pc_budget_metric(const struct pc_budget *b, const char *name,
		      const char *help)
{
	met_register_fn(name, help, NULL, used_fn, (void *)b);
}
