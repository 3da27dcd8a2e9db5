/*
 * tests/unit/test_walk.c — a loop pass's key walks (modules/walk.h): at
 * most WALK_PASS_KEYS keys a pass over all walks, WALK_MIN_KEYS for a
 * walk resumed from its timer whatever the pass took, and with a time cap
 * (walk_set_pass_max) fewer keys when each costs more than usual.
 */
#include <criterion/criterion.h>

#include "common/util.h"
#include "modules/walk.h"
#include "testutil.h"

static struct {
	uint64_t key_ns;   /* the work each key stands for */
	unsigned fresh;    /* keys a walk started in the pass took */
	unsigned resumed;  /* keys a walk resumed after it took */
	unsigned second;   /* keys a second fresh walk took after both */
} w;

static void work(void)
{
	uint64_t t0 = pc_now_ns();
	while (pc_now_ns() - t0 < w.key_ns)
		;
}

/* Walks take keys until told to stop: one started in the pass (a call),
 * then one resumed from its timer, then another call's. */
static void walks(struct rx_reactor *r, struct rx_timer *t)
{
	(void)t;
	unsigned here = walk_here(false);
	while (w.fresh < 100000 && walk_take(r, &here)) {
		w.fresh++;
		work();
	}
	here = walk_here(true);
	while (w.resumed < 100000 && walk_take(r, &here)) {
		w.resumed++;
		work();
	}
	here = walk_here(false);
	while (w.second < 100000 && walk_take(r, &here))
		w.second++;
	rx_reactor_stop(r);
}

static void run(uint64_t key_ns, uint64_t pass_ns)
{
	w = (typeof(w)){.key_ns = key_ns};
	walk_set_pass_max(pass_ns);
	struct rx_reactor *r = tu_reactor(NULL);
	struct rx_timer t;
	rx_timer_init(&t, walks, NULL);
	rx_timer_start(r, &t, 0, 0);
	tu_run(r, 20000);
	rx_reactor_destroy(r);
	walk_set_pass_max(0);
}

Test(walk, a_pass_takes_its_keys_then_only_a_resumed_walk_goes_on)
{
	run(0, 0);
	cr_assert_eq(w.fresh, WALK_PASS_KEYS);
	cr_assert_eq(w.resumed, WALK_MIN_KEYS, "a resumed walk always makes "
		     "progress: %u", w.resumed);
	cr_assert_eq(w.second, 0);
}

Test(walk, expensive_keys_end_the_pass_by_time)
{
	/* 20 us a key: 512 keys would be 10 ms. Without a cap they all go. */
	run(20 * 1000, 0);
	cr_assert_eq(w.fresh, WALK_PASS_KEYS);
	/* A 1 ms cap, the clock read every 16 keys: at most ~50 + 16. */
	run(20 * 1000, 1000 * 1000);
	cr_assert_geq(w.fresh, 1);
	cr_assert_leq(w.fresh, 80, "%u keys of 20 us in a pass capped at 1 ms",
		      w.fresh);
	cr_assert_eq(w.resumed, WALK_MIN_KEYS, "a resumed walk still gets its "
		     "%u keys: %u", WALK_MIN_KEYS, w.resumed);
	cr_assert_eq(w.second, 0);
}

Test(walk, cheap_keys_never_meet_the_time_cap)
{
	run(0, 100 * 1000 * 1000); /* 100 ms: far beyond 512 cheap keys */
	cr_assert_eq(w.fresh, WALK_PASS_KEYS);
}
