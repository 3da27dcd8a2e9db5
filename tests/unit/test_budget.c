/*
 * tests/unit/test_budget.c — common/budget.h: holds up to the cap and no
 * further, from one thread and from several at once.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>

#include "common/budget.h"

Test(budget, holds_up_to_the_cap_and_gives_back)
{
	struct pc_budget b;
	pc_budget_init(&b, 100);
	cr_assert_eq(pc_budget_hold(&b, 60), 0);
	cr_assert_eq(pc_budget_hold(&b, 41), -EBUSY);
	cr_assert_eq(pc_budget_used(&b), 60, "a refusal holds nothing");
	cr_assert_eq(pc_budget_hold(&b, 40), 0);
	cr_assert_eq(pc_budget_used(&b), 100);
	cr_assert_eq(pc_budget_hold(&b, 1), -EBUSY);
	pc_budget_release(&b, 60);
	cr_assert_eq(pc_budget_hold(&b, 60), 0);
	pc_budget_release(&b, 100);
	cr_assert_eq(pc_budget_used(&b), 0);
}

#define THREADS 4
#define ROUNDS 200000

static struct pc_budget shared;
static uint64_t granted; /* bytes of holds that succeeded, not yet given */
static int over;         /* granted passed the cap */
static uint64_t refusals;

/* The counter may pass the cap for a moment (a refused hold adds, then
 * takes back); what was granted never does. */
static void *taker(void *arg)
{
	uint64_t n = (uint64_t)(uintptr_t)arg;
	for (int i = 0; i < ROUNDS; i++) {
		if (pc_budget_hold(&shared, n) < 0) {
			__atomic_add_fetch(&refusals, 1, __ATOMIC_RELAXED);
			continue;
		}
		if (__atomic_add_fetch(&granted, n, __ATOMIC_SEQ_CST) >
		    shared.max)
			__atomic_store_n(&over, 1, __ATOMIC_RELAXED);
		__atomic_sub_fetch(&granted, n, __ATOMIC_SEQ_CST);
		pc_budget_release(&shared, n);
	}
	return NULL;
}

Test(budget, threads_never_hold_more_than_the_cap_together)
{
	pc_budget_init(&shared, 1000);
	/* 200 held throughout: the 900-byte taker is always refused, the
	 * others (300 + 400 + 500 > 800) contend. */
	cr_assert_eq(pc_budget_hold(&shared, 200), 0);
	__atomic_store_n(&granted, 200, __ATOMIC_SEQ_CST);
	static const uintptr_t sizes[THREADS] = {300, 400, 500, 900};
	pthread_t t[THREADS];
	for (int i = 0; i < THREADS; i++)
		pthread_create(&t[i], NULL, taker, (void *)sizes[i]);
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	cr_assert_eq(over, 0);
	cr_assert_geq(refusals, ROUNDS, "the 900-byte taker was let in");
	pc_budget_release(&shared, 200);
	cr_assert_eq(pc_budget_used(&shared), 0);
}
