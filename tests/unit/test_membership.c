/*
 * tests/unit/test_membership.c — the cluster module's views, epochs and
 * membership events on real reactor threads (issue 11 items 6 and 8).
 *
 * Owns: a node of two reactors running the cluster module and a probe
 * module. The probe module subscribes to every event and records on which
 * thread each one runs; on every reactor a 1 ms timer keeps a reference on
 * the ring it loaded until its next tick (a round trip's worth) and checks
 * that epochs only grow. Meanwhile the test thread applies membership
 * changes through the reload hook (what SIGHUP does), as fast as it can. The
 * sanitizer build turns a ring or view freed too early into a failure; here
 * we check epochs, event counts and threads. Each test is its own process.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/metrics.h"
#include "common/settings.h"
#include "modules/membership.h"
#include "modules/modules.h"
#include "reactor/group.h"
#include "modules/module.h"
#include "storage/ring.h"

#define THREADS 2
#define CHANGES 100

static const char *const list_a = "127.0.0.1:2001,127.0.0.1:2002";
static const char *const list_b = "127.0.0.1:2001,127.0.0.1:2002,127.0.0.1:2003";

static struct {
	struct pc_ctx *ctx;
	pthread_t thread[THREADS];
	uint32_t events[THREADS][MB_EVENTS]; /* atomics */
	uint32_t wrong_thread, epoch_back, ticks; /* atomics */
	uint64_t last_epoch[THREADS];
	struct ring *held[THREADS];
	struct rx_timer timer[THREADS];
} p;

static void on_event(struct rx_reactor *r, enum mb_event ev, const char *peer,
		     uint64_t epoch, void *arg)
{
	unsigned id = rx_reactor_id(r);
	(void)arg;
	(void)epoch;
	cr_assert(id < THREADS && (unsigned)ev < MB_EVENTS);
	if (!pthread_equal(pthread_self(), p.thread[id]))
		__atomic_add_fetch(&p.wrong_thread, 1, __ATOMIC_RELAXED);
	if (ev == MB_JOIN || ev == MB_LEAVE)
		cr_assert_str_eq(peer, "127.0.0.1:2003");
	__atomic_add_fetch(&p.events[id][ev], 1, __ATOMIC_RELAXED);
}

/* A reader: the ring kept across ticks by a reference. */
static void tick(struct rx_reactor *r, struct rx_timer *t)
{
	unsigned id = rx_reactor_id(r), o[2];
	(void)t;
	if (p.held[id]) {
		/* Still readable after any number of swaps. */
		cr_assert_eq(ring_owners(p.held[id], "k", 1, 2, o), 2u);
		cr_assert_not_null(ring_member(p.held[id], o[1]));
		ring_unref(p.held[id]);
	}
	struct ring *now = svc_find_membership(p.ctx)->ring();
	cr_assert_not_null(now);
	/* A bare pointer is fine until this callback returns: use it for a
	 * while (the window in which an early free would show). */
	for (unsigned i = 0; i < 2000; i++)
		cr_assert_eq(ring_owners(now, &i, sizeof(i), 2, o), 2u);
	if (ring_epoch(now) < p.last_epoch[id])
		__atomic_add_fetch(&p.epoch_back, 1, __ATOMIC_RELAXED);
	p.last_epoch[id] = ring_epoch(now);
	p.held[id] = ring_ref(now);
	__atomic_add_fetch(&p.ticks, 1, __ATOMIC_RELAXED);
}

static int probe_init(struct pc_ctx *ctx)
{
	p.ctx = ctx;
	return svc_find_membership(ctx)->subscribe(MB_ON_ALL, on_event, NULL);
}

static int probe_start(struct rx_reactor *r, struct pc_ctx *ctx)
{
	unsigned id = rx_reactor_id(r);
	(void)ctx;
	p.thread[id] = pthread_self();
	rx_timer_init(&p.timer[id], tick, NULL);
	return rx_timer_start(r, &p.timer[id], RX_MS(1), RX_MS(1));
}

static void probe_stop(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	rx_timer_stop(r, &p.timer[rx_reactor_id(r)]);
}

static void probe_exit(struct rx_reactor *r, struct pc_ctx *ctx)
{
	unsigned id = rx_reactor_id(r);
	(void)ctx;
	ring_unref(p.held[id]);
	p.held[id] = NULL;
}

static const struct pc_module probe_mod = {
	.name = "probe", .init = probe_init, .start = probe_start,
	.stop = probe_stop, .exit = probe_exit};

static const struct pc_module *const mods[] = {&pc_mod_cluster, &probe_mod};

static void settings_with_peers(struct pc_settings *s, const char *peers)
{
	char err[PC_CFG_ERR_MAX];
	cr_assert_eq(pc_settings_defaults(s, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(pc_cfg_set(&pc_settings_table, s, "peers", peers, "test",
				err, sizeof(err)), 0, "%s", err);
}

static uint32_t events(unsigned id, enum mb_event ev)
{
	return __atomic_load_n(&p.events[id][ev], __ATOMIC_RELAXED);
}

Test(membership, swaps_under_readers_and_events_on_every_reactor)
{
	struct pc_settings s, a, b;
	struct pc_ctx ctx;
	struct rx_params rp;
	struct rx_group_hooks h;
	struct rx_group *grp;

	settings_with_peers(&s, list_a);
	settings_with_peers(&a, list_a);
	settings_with_peers(&b, list_b);
	cr_assert_eq(pc_ctx_init(&ctx, &s, THREADS, mods, 2), 0);
	pc_ctx_publish(&ctx, "rpc", "127.0.0.1:2000");
	pc_ctx_publish(&ctx, "data", "127.0.0.1:3000");
	cr_assert_eq(pc_modules_init(&ctx), 0);
	cr_assert_eq(met_start(THREADS), 0);
	rx_params_default(&rp);
	pc_modules_group_hooks(&ctx, &h);
	cr_assert_eq(rx_group_start(&grp, THREADS, &rp, &h), 0);
	__atomic_store_n(&ctx.group, grp, __ATOMIC_RELEASE);
	cr_assert_eq(svc_find_membership(&ctx)->epoch(), 1u);

	for (unsigned i = 0; i < CHANGES; i++) {
		struct timespec ts = {0, 100 * 1000};
		cr_assert_eq(pc_modules_reload(&ctx, i % 2 ? &a : &b), 0u);
		nanosleep(&ts, NULL);
	}
	/* The same list again is no change. */
	cr_assert_eq(pc_modules_reload(&ctx, &a), 0u);
	cr_assert_eq(svc_find_membership(&ctx)->epoch(), 1u + CHANGES);

	for (int waited = 0; waited < 5000; waited++) {
		bool all = true;
		for (unsigned t = 0; t < THREADS; t++)
			all &= events(t, MB_JOIN) == CHANGES / 2 &&
			       events(t, MB_LEAVE) == CHANGES / 2;
		if (all && __atomic_load_n(&p.ticks, __ATOMIC_RELAXED) > 20)
			break;
		struct timespec ms = {0, 1000 * 1000};
		nanosleep(&ms, NULL);
	}
	__atomic_store_n(&ctx.group, NULL, __ATOMIC_RELEASE);
	rx_group_stop(grp);
	rx_group_join(grp);
	for (unsigned t = 0; t < THREADS; t++) {
		cr_assert_eq(events(t, MB_JOIN), CHANGES / 2, "reactor %u", t);
		cr_assert_eq(events(t, MB_LEAVE), CHANGES / 2, "reactor %u", t);
		cr_assert_eq(events(t, MB_SUSPECT), 0u);
	}
	cr_assert_eq(p.wrong_thread, 0u, "an event ran on another thread");
	cr_assert_eq(p.epoch_back, 0u, "a reactor saw the epoch go back");
	cr_assert_gt(p.ticks, 20u);
	pc_modules_fini(&ctx);
	met_reset();
	pc_ctx_fini(&ctx);
	pc_settings_free(&s);
	pc_settings_free(&a);
	pc_settings_free(&b);
}

Test(membership, bad_reload_changes_nothing)
{
	struct pc_settings s, bad;
	struct pc_ctx ctx;
	struct rx_params rp;
	struct rx_group_hooks h;
	struct rx_group *grp;

	settings_with_peers(&s, list_a);
	settings_with_peers(&bad, "127.0.0.1:2001,nonsense");
	cr_assert_eq(pc_ctx_init(&ctx, &s, 1, mods, 2), 0);
	pc_ctx_publish(&ctx, "rpc", "127.0.0.1:2000");
	pc_ctx_publish(&ctx, "data", "127.0.0.1:3000");
	cr_assert_eq(pc_modules_init(&ctx), 0);
	cr_assert_eq(met_start(1), 0);
	rx_params_default(&rp);
	pc_modules_group_hooks(&ctx, &h);
	cr_assert_eq(rx_group_start(&grp, 1, &rp, &h), 0);
	__atomic_store_n(&ctx.group, grp, __ATOMIC_RELEASE);
	cr_assert_eq(pc_modules_reload(&ctx, &bad), 1u);
	cr_assert_eq(svc_find_membership(&ctx)->epoch(), 1u);
	__atomic_store_n(&ctx.group, NULL, __ATOMIC_RELEASE);
	rx_group_stop(grp);
	rx_group_join(grp);
	pc_modules_fini(&ctx);
	met_reset();
	pc_ctx_fini(&ctx);
	pc_settings_free(&s);
	pc_settings_free(&bad);
}
