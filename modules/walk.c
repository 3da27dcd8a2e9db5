/*
 * modules/walk.c — key walks in slices of loop passes (modules/walk.h).
 */
#include "modules/walk.h"

static _Thread_local struct {
	uint64_t pass; /* rx_now_ns of the pass that walked `used` */
	unsigned used;
} t_walk;

static uint64_t g_yields;

bool walk_take(struct rx_reactor *r, unsigned *here)
{
	uint64_t pass = rx_now_ns(r);
	if (t_walk.pass != pass) {
		t_walk.pass = pass;
		t_walk.used = 0;
	}
	if (t_walk.used >= WALK_PASS_KEYS && *here >= WALK_MIN_KEYS)
		return false;
	t_walk.used++;
	(*here)++;
	return true;
}

void walk_later(struct rx_reactor *r, struct rx_timer *t,
		void (*fn)(struct rx_reactor *r, struct rx_timer *t))
{
	__atomic_add_fetch(&g_yields, 1, __ATOMIC_RELAXED);
	rx_timer_init(t, fn, NULL);
	rx_timer_start(r, t, 0, 0);
}

uint64_t walk_yields_total(void)
{
	return __atomic_load_n(&g_yields, __ATOMIC_RELAXED);
}
