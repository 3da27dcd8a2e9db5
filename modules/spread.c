/*
 * modules/spread.c — spreading accepted connections over the reactors
 * (modules/spread.h): the least-loaded choice and the hand-off message.
 *
 * Owns: the hand-off messages in flight (struct handoff, freed by the
 * receiving reactor). Threading: see the header; the handing counters are
 * raised by the accepting reactor and lowered by the receiving one.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "modules/spread.h"
#include "reactor/group.h"

struct handoff {
	struct pc_spread *sp;
	int fd;
	unsigned to;
};

int pc_spread_init(struct pc_spread *sp, struct pc_ctx *ctx,
		   uint64_t (*load)(unsigned i),
		   void (*serve)(struct rx_reactor *r, int fd))
{
	sp->load = load;
	sp->serve = serve;
	sp->handing = calloc(ctx->threads ? ctx->threads : 1,
			     sizeof(*sp->handing));
	sp->next = 0;
	return sp->handing ? 0 : -ENOMEM;
}

void pc_spread_fini(struct pc_spread *sp)
{
	free(sp->handing);
	sp->handing = NULL;
}

/* On the chosen reactor: serve the connection here. */
static void handoff_run(struct rx_reactor *r, void *arg)
{
	struct handoff *h = arg;
	if (rx_reactor_stopping(r))
		close(h->fd); /* the node stops: the client sees EOF */
	else
		h->sp->serve(r, h->fd);
	__atomic_sub_fetch(&h->sp->handing[h->to], 1, __ATOMIC_RELAXED);
	free(h);
}

static unsigned least_loaded(struct pc_spread *sp, unsigned n)
{
	unsigned start = __atomic_load_n(&sp->next, __ATOMIC_RELAXED);
	unsigned best = 0;
	uint64_t best_load = UINT64_MAX;
	for (unsigned k = 0; k < n; k++) {
		unsigned i = (start + k) % n;
		uint64_t load = sp->load(i) + __atomic_load_n(&sp->handing[i],
							      __ATOMIC_RELAXED);
		if (load < best_load) {
			best = i;
			best_load = load;
		}
	}
	__atomic_store_n(&sp->next, (best + 1) % n, __ATOMIC_RELAXED);
	return best;
}

void pc_spread_accept(struct pc_spread *sp, struct pc_ctx *ctx,
		      struct rx_reactor *here, int fd)
{
	struct rx_group *grp = __atomic_load_n(&ctx->group, __ATOMIC_ACQUIRE);
	unsigned to = grp ? least_loaded(sp, ctx->threads) : rx_reactor_id(here);
	struct handoff *h = to != rx_reactor_id(here) ? malloc(sizeof(*h))
						      : NULL;
	if (h) {
		*h = (struct handoff){sp, fd, to};
		__atomic_add_fetch(&sp->handing[to], 1, __ATOMIC_RELAXED);
		if (rx_group_post(grp, to, handoff_run, h) == 0)
			return;
		__atomic_sub_fetch(&sp->handing[to], 1, __ATOMIC_RELAXED);
		free(h);
	}
	sp->serve(here, fd); /* here, then */
}
