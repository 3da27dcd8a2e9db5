/*
 * modules/stats_log.c — a periodic one-line activity summary in the log.
 *
 * Owns: one timer on reactor 0 and the totals it last reported. Thread:
 * reactor 0 (the timer), reading every reactor's counters through
 * rx_group_stats (relaxed loads, no locks on the reactors' hot paths).
 * Rule: silent when nothing happened since the last line — an idle node
 * does not fill its log.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/settings.h"
#include "modules/modules.h"
#include "reactor/group.h"

#define LOG_MOD "stats"

static struct {
	struct pc_ctx *ctx;
	struct rx_timer timer;
	struct rx_stats last;
	bool armed;
} g_sl;

static void stats_tick(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	(void)t;
	struct rx_group *g = __atomic_load_n(&g_sl.ctx->group, __ATOMIC_ACQUIRE);
	if (!g)
		return;
	struct rx_stats now;
	rx_group_stats(g, &now);
	const struct rx_stats *o = &g_sl.last;
	if (now.cqes == o->cqes)
		return; /* idle: timer expiries post no completions */
	PC_LOGI(LOG_MOD,
		"conns %" PRIu64 " live (+%" PRIu64 " accepted, +%" PRIu64
		" connected, -%" PRIu64 " closed); in %" PRIu64 " B, out %"
		PRIu64 " B; %" PRIu64 " completions, %" PRIu64
		" stale; sq full %" PRIu64 ", recv buffers exhausted %" PRIu64
		", output pauses %" PRIu64,
		now.conns_live, now.conns_accepted - o->conns_accepted,
		now.conns_connected - o->conns_connected,
		now.conns_closed - o->conns_closed, now.bytes_in - o->bytes_in,
		now.bytes_out - o->bytes_out, now.cqes - o->cqes,
		now.stale_cqes - o->stale_cqes, now.sq_full - o->sq_full,
		now.bufring_exhausted - o->bufring_exhausted,
		now.out_pauses - o->out_pauses);
	g_sl.last = now;
}

static int sl_init(struct pc_ctx *ctx)
{
	memset(&g_sl, 0, sizeof(g_sl));
	g_sl.ctx = ctx;
	return 0;
}

static int sl_start(struct rx_reactor *r, struct pc_ctx *ctx)
{
	uint64_t ms = ctx->cfg->stats_log_interval_ms;
	if (rx_reactor_id(r) != 0 || ms == 0)
		return 0;
	rx_timer_init(&g_sl.timer, stats_tick, NULL);
	int ret = rx_timer_start(r, &g_sl.timer, RX_MS(ms), RX_MS(ms));
	g_sl.armed = ret == 0;
	return ret;
}

static void sl_stop(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	if (rx_reactor_id(r) == 0 && g_sl.armed) {
		rx_timer_stop(r, &g_sl.timer);
		g_sl.armed = false;
	}
}

const struct pc_module pc_mod_stats_log = {
	.name = "stats_log",
	.init = sl_init,
	.start = sl_start,
	.stop = sl_stop,
};
