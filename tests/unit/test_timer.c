/*
 * tests/unit/test_timer.c — timer ordering, periodic timers, stop, limits,
 * and that the loop sleeps until the next deadline instead of spinning.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "common/util.h"
#include "reactor/reactor.h"
#include "reactor/rx_internal.h"
#include "testutil.h"

struct rec {
	int order[64];
	int n;
	int stop_after;
	uint64_t fired_ns[64];
	uint64_t t0;
};

struct tmr {
	struct rx_timer t;
	int id;
	struct rec *rec;
};

static void rec_fire(struct rx_reactor *r, struct rx_timer *t)
{
	struct tmr *x = t->arg;
	struct rec *rec = x->rec;
	rec->fired_ns[rec->n] = pc_now_ns() - rec->t0;
	rec->order[rec->n++] = x->id;
	if (rec->n == rec->stop_after)
		rx_reactor_stop(r);
}

Test(timer, fires_in_deadline_order_ties_first_armed_first)
{
	struct rx_reactor *r = tu_reactor(NULL);
	struct rec rec = {.stop_after = 6, .t0 = pc_now_ns()};
	static const unsigned delays[] = {30, 10, 20, 10, 0, 20};
	struct tmr t[6];
	for (int i = 0; i < 6; i++) {
		t[i].id = i;
		t[i].rec = &rec;
		rx_timer_init(&t[i].t, rec_fire, &t[i]);
		cr_assert_eq(rx_timer_start(r, &t[i].t, RX_MS(delays[i]), 0), 0);
	}
	tu_run(r, 5000);
	static const int want[] = {4, 1, 3, 2, 5, 0};
	cr_assert_eq(rec.n, 6);
	for (int i = 0; i < 6; i++)
		cr_assert_eq(rec.order[i], want[i], "position %d: got %d", i,
			     rec.order[i]);
	/* Never early. */
	for (int i = 0; i < 6; i++)
		cr_assert_geq(rec.fired_ns[i], RX_MS(delays[rec.order[i]]));
	rx_reactor_destroy(r);
}

Test(timer, periodic_fires_repeatedly_and_can_stop_itself)
{
	struct rx_reactor *r = tu_reactor(NULL);
	struct rec rec = {.stop_after = 5, .t0 = pc_now_ns()};
	struct tmr t = {.id = 7, .rec = &rec};
	rx_timer_init(&t.t, rec_fire, &t);
	rx_timer_start(r, &t.t, RX_MS(5), RX_MS(5));
	tu_run(r, 5000);
	cr_assert_eq(rec.n, 5);
	cr_assert(rx_timer_armed(&t.t), "periodic timer stays armed");
	for (int i = 0; i < 5; i++)
		cr_assert_geq(rec.fired_ns[i], RX_MS(5) * (uint64_t)(i + 1));
	rx_timer_stop(r, &t.t);
	cr_assert(!rx_timer_armed(&t.t));
	rx_reactor_destroy(r);
}

static void stopper(struct rx_reactor *r, struct rx_timer *t)
{
	(void)t;
	rx_reactor_stop(r);
}

Test(timer, stopped_and_rearmed_timers)
{
	struct rx_reactor *r = tu_reactor(NULL);
	struct rec rec = {.stop_after = 100, .t0 = pc_now_ns()};
	struct tmr a = {.id = 1, .rec = &rec}, b = {.id = 2, .rec = &rec};
	rx_timer_init(&a.t, rec_fire, &a);
	rx_timer_init(&b.t, rec_fire, &b);
	rx_timer_start(r, &a.t, RX_MS(5), 0);
	rx_timer_start(r, &b.t, RX_MS(10), 0);
	rx_timer_stop(r, &a.t);            /* a never fires */
	rx_timer_stop(r, &a.t);            /* harmless twice */
	rx_timer_start(r, &b.t, RX_MS(20), 0); /* re-arm moves b later */
	struct rx_timer end;
	rx_timer_init(&end, stopper, NULL);
	rx_timer_start(r, &end, RX_MS(60), 0);
	tu_run(r, 5000);
	cr_assert_eq(rec.n, 1);
	cr_assert_eq(rec.order[0], 2);
	cr_assert_geq(rec.fired_ns[0], RX_MS(20));
	rx_reactor_destroy(r);
}

Test(timer, heap_limit_is_enforced)
{
	struct rx_params p;
	rx_params_default(&p);
	p.timers_max = 8;
	struct rx_reactor *r = tu_reactor(&p);
	struct rx_timer t[9];
	for (int i = 0; i < 8; i++) {
		rx_timer_init(&t[i], stopper, NULL);
		cr_assert_eq(rx_timer_start(r, &t[i], RX_MS(1000 + i), 0), 0);
	}
	rx_timer_init(&t[8], stopper, NULL);
	cr_assert_eq(rx_timer_start(r, &t[8], RX_MS(1), 0), -ENOSPC);
	/* Re-arming an armed timer does not need a new slot. */
	cr_assert_eq(rx_timer_start(r, &t[3], RX_MS(1), 0), 0);
	tu_run(r, 5000);
	rx_reactor_destroy(r);
}

static uint64_t g_fired[65536];
static int g_nfired;
static int g_expect;

static void record_deadline(struct rx_reactor *r, struct rx_timer *t)
{
	g_fired[g_nfired++] = t->deadline_ns;
	if (g_nfired == g_expect)
		rx_reactor_stop(r);
}

/* Run r until g_expect timers fired; they fired in deadline order. */
static void run_and_check_order(struct rx_reactor *r, unsigned limit_ms)
{
	tu_run(r, limit_ms);
	cr_assert_eq(g_nfired, g_expect);
	for (int i = 1; i < g_nfired; i++)
		cr_assert_leq(g_fired[i - 1], g_fired[i], "out of order at %d",
			      i);
	rx_reactor_destroy(r);
}

Test(timer, many_random_timers_fire_sorted)
{
	struct rx_reactor *r = tu_reactor(NULL);
	enum { N = 2000 };
	static struct rx_timer t[N];
	srand(42);
	g_nfired = 0;
	g_expect = 0;
	for (int i = 0; i < N; i++) {
		rx_timer_init(&t[i], record_deadline, NULL);
		rx_timer_start(r, &t[i], (uint64_t)(rand() % 50000) * 1000, 0);
	}
	for (int i = 0; i < N; i += 3) /* a third never fires */
		rx_timer_stop(r, &t[i]);
	for (int i = 0; i < N; i++)
		g_expect += rx_timer_armed(&t[i]);
	run_and_check_order(r, 5000);
}

/* Many timers (more than the array the heap once was started with) arm,
 * with no allocation, and fire in deadline order; the cap then holds. */
Test(timer, many_timers_arm_up_to_the_limit_and_keep_order)
{
	struct rx_params p;
	rx_params_default(&p);
	enum { N = 40000 };
	p.timers_max = N;
	struct rx_reactor *r = tu_reactor(&p);
	static struct rx_timer t[N + 1];
	srand(7);
	g_nfired = 0;
	g_expect = N;
	for (int i = 0; i < N; i++) {
		rx_timer_init(&t[i], record_deadline, NULL);
		cr_assert_eq(rx_timer_start(r, &t[i],
					    (uint64_t)(1 + rand() % 100000) * 1000,
					    0), 0, "timer %d not armed", i);
	}
	rx_timer_init(&t[N], record_deadline, NULL);
	cr_assert_eq(rx_timer_start(r, &t[N], RX_MS(1), 0), -ENOSPC);
	/* A zero-delay one-shot takes no slot: it arms at the cap, and fires
	 * in its place among the others. Moving it to the full heap fails and
	 * leaves it queued. */
	cr_assert_eq(rx_timer_start(r, &t[N], 0, 0), 0);
	cr_assert_eq(rx_timer_start(r, &t[N], RX_MS(1), 0), -ENOSPC);
	cr_assert(rx_timer_armed(&t[N]), "a failed re-arm disarmed it");
	g_expect = N + 1;
	run_and_check_order(r, 10000);
}

/* Zero-delay one-shots (the "soon" list) merge with the heap by deadline,
 * then arming order; stopping one takes it off; a timer moves between the
 * heap and the list when re-armed either way. */
static struct tmr g_m[7];

static void arm_mixed(struct rx_reactor *r, struct rx_timer *t)
{
	(void)t;
	struct rec *rec = g_m[0].rec;
	for (int i = 0; i < 7; i++) {
		g_m[i].id = i;
		g_m[i].rec = rec;
		rx_timer_init(&g_m[i].t, rec_fire, &g_m[i]);
	}
	cr_assert_eq(rx_timer_start(r, &g_m[0].t, 0, 0), 0);
	cr_assert_eq(rx_timer_start(r, &g_m[6].t, 0, 0), 0); /* moves, below */
	cr_assert_eq(rx_timer_start(r, &g_m[1].t, 1, 0), 0); /* the heap */
	uint64_t t1 = pc_now_ns();
	while (pc_now_ns() == t1) /* 2 is armed after 1's deadline */
		;
	cr_assert_eq(rx_timer_start(r, &g_m[2].t, 0, 0), 0);
	cr_assert_eq(rx_timer_start(r, &g_m[3].t, 0, 0), 0);
	cr_assert(rx_timer_armed(&g_m[3].t));
	rx_timer_stop(r, &g_m[3].t);
	cr_assert_not(rx_timer_armed(&g_m[3].t));
	cr_assert_eq(rx_timer_start(r, &g_m[4].t, 0, 0), 0);
	/* Re-arming an armed one moves it to the end. */
	cr_assert_eq(rx_timer_start(r, &g_m[0].t, 0, 0), 0);
	/* From the heap to the list, and from the list to the heap. */
	cr_assert_eq(rx_timer_start(r, &g_m[5].t, RX_MS(3600000), 0), 0);
	cr_assert_eq(rx_timer_start(r, &g_m[5].t, 0, 0), 0);
	cr_assert_eq(rx_timer_start(r, &g_m[6].t, 1, 0), 0);
}

Test(timer, zero_delay_timers_merge_with_the_heap_in_order)
{
	struct rx_reactor *r = tu_reactor(NULL);
	struct rec rec = {.stop_after = 6, .t0 = pc_now_ns()};
	g_m[0].rec = &rec;
	struct tmr first = {.id = 9, .rec = &rec};
	rx_timer_init(&first.t, arm_mixed, &first);
	cr_assert_eq(rx_timer_start(r, &first.t, 0, 0), 0);
	tu_run(r, 5000);
	static const int want[] = {1, 2, 4, 0, 5, 6};
	cr_assert_eq(rec.n, 6);
	for (int i = 0; i < 6; i++)
		cr_assert_eq(rec.order[i], want[i], "position %d: got %d", i,
			     rec.order[i]);
	rx_reactor_destroy(r);
}

/* A pass fires only what was armed before it began: a zero-delay timer
 * that re-arms itself from its callback runs once a pass, even when the
 * pass's clock says that everything armed during it is due already. */
static int g_rearms;

static void rearm_self(struct rx_reactor *r, struct rx_timer *t)
{
	if (++g_rearms < 10)
		rx_timer_start(r, t, 0, 0);
}

Test(timer, a_zero_delay_timer_rearmed_by_itself_runs_once_a_pass)
{
	struct rx_reactor *r = tu_reactor(NULL);
	struct rx_timer t;
	g_rearms = 0;
	rx_timer_init(&t, rearm_self, NULL);
	cr_assert_eq(rx_timer_start(r, &t, 0, 0), 0);
	r->now_ns = pc_now_ns() + RX_MS(3600000); /* a pass an hour ahead */
	rx_timers_run(r);
	cr_assert_eq(g_rearms, 1, "ran %d times in one pass", g_rearms);
	rx_timers_run(r);
	cr_assert_eq(g_rearms, 2);
	cr_assert(rx_timer_armed(&t));
	rx_reactor_destroy(r);
}

Test(timer, loop_sleeps_until_the_deadline)
{
	struct rx_reactor *r = tu_reactor(NULL);
	struct rx_timer end;
	rx_timer_init(&end, stopper, NULL);
	rx_timer_start(r, &end, RX_MS(200), 0);
	uint64_t ms = tu_run(r, 5000);
	const struct rx_stats *st = rx_reactor_stats(r);
	cr_assert_geq(ms, 200);
	/* A busy loop would iterate millions of times in 200 ms. */
	cr_assert_lt(st->loop_iterations, 20, "loop spun %llu times",
		     (unsigned long long)st->loop_iterations);
	rx_reactor_destroy(r);
}

/* The heap's shape, from the root (position 1; children 2k, 2k + 1):
 * a complete tree (no position past heap_n), every link back to its
 * parent, every node on the heap and not before its parent. The count. */
static unsigned check_subtree(const struct rx_reactor *r,
			      const struct rx_timer *n,
			      const struct rx_timer *up, unsigned k)
{
	if (!n)
		return 0;
	cr_assert_leq(k, r->heap_n, "a node past the last position");
	cr_assert_eq(n->hp_up, up, "a broken parent link");
	cr_assert(rx_timer_armed(n));
	if (up)
		cr_assert(up->deadline_ns < n->deadline_ns ||
			  (up->deadline_ns == n->deadline_ns &&
			   up->seq < n->seq), "a node before its parent");
	return 1 + check_subtree(r, n->hp_left, n, 2 * k) +
	       check_subtree(r, n->hp_right, n, 2 * k + 1);
}

static void check_heap(const struct rx_reactor *r)
{
	cr_assert_eq(check_subtree(r, r->heap_root, NULL, 1), r->heap_n);
}

/* Timers t[0..n) with ids 0..n-1, firing cb. */
static void tmrs_init(struct tmr *t, int n,
		      void (*cb)(struct rx_reactor *, struct rx_timer *))
{
	for (int i = 0; i < n; i++) {
		t[i].id = i;
		rx_timer_init(&t[i].t, cb, &t[i]);
	}
}

/* ops random operations on t[0..n): a fifth are stops, a tenth arms
 * without delay, the rest arms with a delay under max_us microseconds
 * (with periodic, one in eight of those every 1 us); the heap is checked
 * every check_every operations and at the end. */
static void random_ops(struct rx_reactor *r, struct tmr *t, int n, int ops,
		       unsigned max_us, bool periodic, int check_every)
{
	for (int op = 0; op < ops; op++) {
		struct rx_timer *x = &t[rand() % n].t;
		int what = rand() % 10;
		if (what < 2)
			rx_timer_stop(r, x);
		else
			cr_assert_eq(rx_timer_start(r, x, what == 2 ? 0 :
						    (uint64_t)(rand() % max_us) *
						    1000, periodic && what == 9 ?
						    1000 : 0), 0);
		if (op % check_every == 0)
			check_heap(r);
	}
	check_heap(r);
}

#define RND_N 3000

static struct tmr g_rnd[RND_N];
static int g_rnd_order[RND_N];
static int g_rnd_fired;
static int g_rnd_want;

static void rnd_fire(struct rx_reactor *r, struct rx_timer *t)
{
	struct tmr *x = t->arg;
	cr_assert_lt(g_rnd_fired, RND_N, "a timer fired twice");
	g_rnd_order[g_rnd_fired++] = x->id;
	if (g_rnd_fired == g_rnd_want)
		rx_reactor_stop(r);
}

static int by_deadline(const void *a, const void *b)
{
	const struct rx_timer *x = &g_rnd[*(const int *)a].t;
	const struct rx_timer *y = &g_rnd[*(const int *)b].t;
	if (x->deadline_ns != y->deadline_ns)
		return x->deadline_ns < y->deadline_ns ? -1 : 1;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Random arms (a tenth without delay), re-arms and stops: the heap keeps
 * its shape throughout, and every timer armed at the end fires once, in
 * (deadline, arming) order — the order a sort of them gives. */
Test(timer, random_arms_rearms_and_stops_fire_every_armed_timer_once_in_order)
{
	struct rx_reactor *r = tu_reactor(NULL);
	srand(11);
	tmrs_init(g_rnd, RND_N, rnd_fire);
	random_ops(r, g_rnd, RND_N, 40000, 20000, false, 5000);
	static int want[RND_N];
	g_rnd_want = 0;
	for (int i = 0; i < RND_N; i++)
		if (rx_timer_armed(&g_rnd[i].t))
			want[g_rnd_want++] = i;
	qsort(want, (size_t)g_rnd_want, sizeof(want[0]), by_deadline);
	g_rnd_fired = 0;
	tu_run(r, 10000);
	cr_assert_eq(g_rnd_fired, g_rnd_want);
	for (int i = 0; i < g_rnd_want; i++)
		cr_assert_eq(g_rnd_order[i], want[i], "position %d", i);
	cr_assert_null(r->heap_root);
	cr_assert_eq(r->heap_n, 0);
	rx_reactor_destroy(r);
}

/* A small heap, checked after every operation; then passes whose callbacks
 * stop and re-arm other timers (some periodic): each firing is due, no
 * earlier than the one before it in its pass, and the heap keeps its
 * shape. */
#define SMALL_N 64

static struct tmr g_small[SMALL_N];
static uint64_t g_last_deadline;
static int g_small_fired;

static void small_fire(struct rx_reactor *r, struct rx_timer *t)
{
	if (!t->period_ns) { /* a periodic one shows its next deadline */
		cr_assert_leq(t->deadline_ns, r->now_ns,
			      "fired before its deadline");
		cr_assert_leq(g_last_deadline, t->deadline_ns,
			      "out of order within a pass");
		g_last_deadline = t->deadline_ns;
	}
	g_small_fired++;
	for (int k = 0; k < 3; k++) {
		struct rx_timer *o = &g_small[rand() % SMALL_N].t;
		if (o == t)
			continue;
		if (rand() % 2)
			rx_timer_stop(r, o);
		else
			rx_timer_start(r, o, (uint64_t)(rand() % 3) * 1000, 0);
	}
	check_heap(r);
}

Test(timer, a_small_heap_keeps_its_shape_through_every_operation_and_pass)
{
	struct rx_reactor *r = tu_reactor(NULL);
	srand(5);
	tmrs_init(g_small, SMALL_N, small_fire);
	random_ops(r, g_small, SMALL_N, 20000, 50, true, 1);
	g_small_fired = 0;
	for (int pass = 0; pass < 200; pass++) {
		r->now_ns = pc_now_ns(); /* what the loop caches */
		g_last_deadline = 0;
		rx_timers_run(r);
		check_heap(r);
	}
	cr_assert_gt(g_small_fired, 200, "%d firings", g_small_fired);
	rx_reactor_destroy(r);
}
