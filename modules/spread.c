/*
 * modules/spread.c — spreading accepted connections over the reactors
 * (modules/spread.h): the least-loaded choice and the hand-off message.
 *
 * Owns: the hand-off messages in flight (struct handoff, freed by the
 * receiving reactor) and the process's pairing notes (one table for every
 * node of the process, each note tagged with its node's ctx). Threading:
 * see the header; the handing counters are raised by the accepting reactor
 * and lowered by the receiving one; the notes are under their mutex, taken
 * once per accepted TCP connection.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/util.h"
#include "modules/spread.h"
#include "reactor/group.h"

#define PAIR_NOTES 128

/* Where the lead placed one client: its address, the fd it was accepted
 * as (to tell whether it is still connected), the reactor, the time. */
struct pair_note {
	const struct pc_ctx *ctx;
	struct sockaddr_storage peer;
	socklen_t peer_len;
	int fd;
	unsigned reactor;
	uint64_t at_ns;
	bool open; /* not followed yet */
};

static struct {
	pthread_mutex_t lock;
	struct pair_note note[PAIR_NOTES]; /* a ring: the oldest is overwritten */
	unsigned next;
} pairs = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* The host part of a peer address (no port): its bytes and length. */
static const void *peer_host(const struct sockaddr_storage *a, size_t *len)
{
	if (a->ss_family == AF_INET) {
		*len = 4;
		return &((const struct sockaddr_in *)a)->sin_addr;
	}
	if (a->ss_family == AF_INET6) {
		*len = 16;
		return &((const struct sockaddr_in6 *)a)->sin6_addr;
	}
	*len = 0;
	return NULL;
}

static bool same_host(const struct sockaddr_storage *a,
		      const struct sockaddr_storage *b)
{
	size_t la, lb;
	const void *ha = peer_host(a, &la), *hb = peer_host(b, &lb);
	return ha && hb && a->ss_family == b->ss_family && la == lb &&
	       memcmp(ha, hb, la) == 0;
}

/* Is the note's client still connected as fd? Its fd may have been closed
 * and reused (then its peer differs, or the call fails), or the client may
 * have closed its end while the node has not yet (then it is no longer
 * established: a client that closed a first connection and opened its
 * pair at once must not be paired with the one it closed). */
static bool note_live(const struct pair_note *n)
{
	struct sockaddr_storage now;
	socklen_t len = sizeof(now);
	if (getpeername(n->fd, (struct sockaddr *)&now, &len) < 0 ||
	    len != n->peer_len || memcmp(&now, &n->peer, len) != 0)
		return false;
	struct tcp_info ti;
	socklen_t tl = sizeof(ti);
	return getsockopt(n->fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) == 0 &&
	       ti.tcpi_state == TCP_ESTABLISHED;
}

/* The lead's note of fd: its peer address now (fd may be handed off and
 * closed before the note is added), the reactor filled in later. */
static bool pair_note_make(struct pair_note *n, const struct pc_ctx *ctx,
			   int fd)
{
	*n = (struct pair_note){.ctx = ctx, .fd = fd, .open = true};
	n->peer_len = sizeof(n->peer);
	size_t hl;
	return getpeername(fd, (struct sockaddr *)&n->peer, &n->peer_len) ==
		       0 &&
	       peer_host(&n->peer, &hl);
}

static void pair_note_add(struct pair_note *n, unsigned reactor)
{
	n->reactor = reactor;
	n->at_ns = pc_now_ns();
	pthread_mutex_lock(&pairs.lock);
	pairs.note[pairs.next] = *n;
	pairs.next = (pairs.next + 1) % PAIR_NOTES;
	pthread_mutex_unlock(&pairs.lock);
}

/* The oldest open, recent note of peer's host in ctx, or NULL (notes past
 * their time are closed on the way). Under the notes' lock. */
static struct pair_note *pair_note_oldest(const struct pc_ctx *ctx,
					  const struct sockaddr_storage *peer,
					  unsigned n, uint64_t now)
{
	struct pair_note *best = NULL;
	for (unsigned i = 0; i < PAIR_NOTES; i++) {
		struct pair_note *c = &pairs.note[i];
		if (!c->open || c->ctx != ctx || c->reactor >= n)
			continue;
		/* at_ns may be a little after now: noted meanwhile */
		if (now > c->at_ns && now - c->at_ns > PC_SPREAD_PAIR_NS) {
			c->open = false;
			continue;
		}
		if (same_host(&c->peer, peer) && (!best || c->at_ns < best->at_ns))
			best = c;
	}
	return best;
}

/* The reactor of the oldest open, live, recent note of fd's host in ctx
 * (the note is closed), or -1. Only the oldest candidate's liveness is
 * checked (two system calls); a dead one is closed and the next oldest
 * tried, so each note is found dead at most once and a host that holds
 * many RPC connections open costs one check per data connection, not one
 * per note. *checks counts them. */
static int pair_note_take(const struct pc_ctx *ctx, int fd, unsigned n,
			  uint64_t *checks)
{
	struct sockaddr_storage peer;
	socklen_t len = sizeof(peer);
	if (getpeername(fd, (struct sockaddr *)&peer, &len) < 0)
		return -1;
	uint64_t now = pc_now_ns();
	int ret = -1;
	pthread_mutex_lock(&pairs.lock);
	struct pair_note *c;
	while ((c = pair_note_oldest(ctx, &peer, n, now))) {
		c->open = false;
		__atomic_add_fetch(checks, 1, __ATOMIC_RELAXED);
		if (note_live(c)) {
			ret = (int)c->reactor;
			break;
		}
	}
	pthread_mutex_unlock(&pairs.lock);
	return ret;
}

struct handoff {
	struct pc_spread *sp;
	int fd;
	unsigned to;
};

int pc_spread_init(struct pc_spread *sp, struct pc_ctx *ctx,
		   enum pc_spread_pair pair, uint64_t (*load)(unsigned i),
		   void (*serve)(struct rx_reactor *r, int fd))
{
	sp->pair = pair;
	sp->paired = 0;
	sp->checks = 0;
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
	unsigned to = rx_reactor_id(here);
	struct pair_note note;
	bool noting = sp->pair == PC_SPREAD_LEAD && grp &&
		      pair_note_make(&note, ctx, fd);
	if (grp) {
		int p = sp->pair == PC_SPREAD_FOLLOW
				? pair_note_take(ctx, fd, ctx->threads,
						 &sp->checks)
				: -1;
		if (p >= 0)
			__atomic_add_fetch(&sp->paired, 1, __ATOMIC_RELAXED);
		to = p >= 0 ? (unsigned)p : least_loaded(sp, ctx->threads);
	}
	struct handoff *h = to != rx_reactor_id(here) ? malloc(sizeof(*h))
						      : NULL;
	if (h) {
		*h = (struct handoff){sp, fd, to};
		__atomic_add_fetch(&sp->handing[to], 1, __ATOMIC_RELAXED);
		if (rx_group_post(grp, to, handoff_run, h) == 0) {
			/* fd is the target's now (it may even be closed):
			 * the note carries the address taken before. */
			if (noting)
				pair_note_add(&note, to);
			return;
		}
		__atomic_sub_fetch(&sp->handing[to], 1, __ATOMIC_RELAXED);
		free(h);
	}
	if (noting)
		pair_note_add(&note, rx_reactor_id(here));
	sp->serve(here, fd); /* here, then */
}
