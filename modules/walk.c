/*
 * modules/walk.c — key walks in slices of loop passes (modules/walk.h).
 */
#include "common/util.h"
#include "modules/walk.h"

static _Thread_local struct {
	uint64_t pass; /* rx_now_ns of the pass that walked `used` */
	uint64_t t0;   /* the clock at its first key (with a time cap) */
	unsigned used;
	bool over;     /* the pass's walks ran out of time */
} t_walk;

static uint64_t g_yields;
static uint64_t g_pass_ns; /* 0: keys alone */

/* The clock is read every this many keys of a pass (~20 ns a read). */
#define WALK_CLOCK_KEYS 16

void walk_set_pass_max(uint64_t ns)
{
	g_pass_ns = ns;
}

bool walk_take(struct rx_reactor *r, unsigned *here)
{
	uint64_t pass = rx_now_ns(r);
	if (t_walk.pass != pass) {
		t_walk.pass = pass;
		t_walk.used = 0;
		t_walk.over = false;
		t_walk.t0 = g_pass_ns ? pc_now_ns() : 0;
	}
	if ((t_walk.used >= WALK_PASS_KEYS || t_walk.over) &&
	    *here >= WALK_MIN_KEYS)
		return false;
	if (g_pass_ns && t_walk.used % WALK_CLOCK_KEYS == WALK_CLOCK_KEYS - 1 &&
	    pc_now_ns() - t_walk.t0 >= g_pass_ns)
		t_walk.over = true; /* this key still goes */
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
