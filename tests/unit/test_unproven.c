/*
 * tests/unit/test_unproven.c — common/unproven.h: which reactor a newcomer
 * its own reactor cannot admit is handed to.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/unproven.h"

#define NOW 1000000000ull

Test(unproven, entries_are_zeroed_and_a_cache_line_apart)
{
	struct pc_unproven *u = pc_unproven_new(3);
	cr_assert_not_null(u);
	for (unsigned i = 0; i < 3; i++)
		cr_assert(u[i].n == 0 && u[i].drop_ns == 0);
	cr_assert_eq((uintptr_t)&u[1] - (uintptr_t)&u[0], 64);
	cr_assert_eq((uintptr_t)u % 64, 0);
	cr_assert_eq(pc_unproven_pick(u, 3, 0, NOW), -1, "none holds any");
	free(u);
}

Test(unproven, picks_the_one_holding_the_most_with_one_to_drop_now)
{
	struct pc_unproven *u = pc_unproven_new(4);
	cr_assert_not_null(u);
	pc_unproven_set(&u[0], 500, NOW - 1);  /* here: never picked */
	pc_unproven_set(&u[1], 10, NOW - 5);   /* droppable, few */
	pc_unproven_set(&u[2], 200, NOW + 1);  /* many, all in their grace */
	pc_unproven_set(&u[3], 40, NOW);       /* droppable from now on */
	cr_assert_eq(pc_unproven_pick(u, 4, 0, NOW), 3);
	pc_unproven_set(&u[3], 0, 0);          /* proved themselves */
	cr_assert_eq(pc_unproven_pick(u, 4, 0, NOW), 1);
	cr_assert_eq(pc_unproven_pick(u, 4, 0, NOW + 1), 2, "past the grace");
	cr_assert_eq(pc_unproven_pick(u, 4, 2, NOW + 1), 0, "not itself");
	pc_unproven_set(&u[1], 0, 0);
	cr_assert_eq(pc_unproven_pick(u, 4, 0, NOW), -1);
	free(u);
}
