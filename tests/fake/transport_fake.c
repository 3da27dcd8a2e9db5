/*
 * tests/fake/transport_fake.c — the in-process transport (transport_fake.h).
 *
 * Owns: the list of fake nodes (mutex), and per client its peers, virtual
 * channels and live batches. Threading: a client's state is touched only on
 * its reactor (but for its count of operations in flight, an atomic any
 * thread may read); nodes are found under the list lock and served through their
 * region table (transport.c), exactly as the TCP server does.
 *
 * An operation is served when its timer fires: the node is looked up, the
 * range held (tp_regs_hold: key, bounds, access, pin), the bytes copied and
 * the hold released — all in one callback, so a finished, cancelled or
 * failed operation never touches the caller's buffers again. A channel
 * serves in order: each operation's timer is set after the previous one's
 * (unless reorder). Completions that must not run inside the caller's frame
 * (failures at start, cancel, peer close) are delivered from 0-delay timers.
 */
#include "tests/fake/transport_fake.h"

#include <errno.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

#define FAKE_CHANS_MAX 64
#define DROP_POLL_MS 10

/* ------------------------------------------------------------------ nodes */

#define FAKE_LOCALS_MAX 64

struct tp_node {
	char endpoint[160];
	struct tp_regs regs;
	void *locals[FAKE_LOCALS_MAX]; /* reg_local ranges (under the lock) */
	size_t local_len[FAKE_LOCALS_MAX];
	bool killed;             /* under the list lock */
	bool silent;             /* under the list lock */
	struct tp_node *next;
};

static pthread_mutex_t nodes_lock = PTHREAD_MUTEX_INITIALIZER;
static struct tp_node *nodes;

int tp_fake_node_new(const char *endpoint, struct tp_node **out)
{
	struct tp_node *tn = calloc(1, sizeof(*tn));
	if (!tn)
		return -ENOMEM;
	snprintf(tn->endpoint, sizeof(tn->endpoint), "%s", endpoint);
	tp_regs_init(&tn->regs);
	pthread_mutex_lock(&nodes_lock);
	for (struct tp_node *n = nodes; n; n = n->next)
		if (strcmp(n->endpoint, endpoint) == 0) {
			pthread_mutex_unlock(&nodes_lock);
			tp_regs_fini(&tn->regs);
			free(tn);
			return -EEXIST;
		}
	tn->next = nodes;
	nodes = tn;
	pthread_mutex_unlock(&nodes_lock);
	*out = tn;
	return 0;
}

void tp_fake_node_silence(struct tp_node *tn)
{
	pthread_mutex_lock(&nodes_lock);
	tn->silent = true;
	pthread_mutex_unlock(&nodes_lock);
}

void tp_fake_node_kill(struct tp_node *tn)
{
	pthread_mutex_lock(&nodes_lock);
	tn->killed = true;
	pthread_mutex_unlock(&nodes_lock);
}

void tp_fake_node_free(struct tp_node *tn)
{
	pthread_mutex_lock(&nodes_lock);
	struct tp_node **pp = &nodes;
	while (*pp && *pp != tn)
		pp = &(*pp)->next;
	if (*pp)
		*pp = tn->next;
	pthread_mutex_unlock(&nodes_lock);
	tp_regs_fini(&tn->regs);
	free(tn);
}

/*
 * Hold [addr, addr+len) of the node at endpoint: 0, -ECONNREFUSED (no such
 * node), -ECONNRESET (killed), or tp_regs_hold's error. The list lock is
 * held across the lookup so a node is not freed under us; tests free nodes
 * only once their clients are done.
 */
static int node_hold(const char *endpoint, uint32_t key, uint64_t addr,
		     uint64_t len, unsigned access, struct tp_hold *h)
{
	int ret = -ECONNREFUSED;
	pthread_mutex_lock(&nodes_lock);
	for (struct tp_node *n = nodes; n; n = n->next)
		if (strcmp(n->endpoint, endpoint) == 0) {
			ret = n->killed ? -ECONNRESET
					: tp_regs_hold(&n->regs, key, addr, len,
						       access, h);
			break;
		}
	pthread_mutex_unlock(&nodes_lock);
	return ret;
}

/* 0: answers; 1: silent; -ECONNRESET: killed; -ECONNREFUSED: none. */
static int node_state(const char *endpoint)
{
	int st = -ECONNREFUSED;
	pthread_mutex_lock(&nodes_lock);
	for (struct tp_node *n = nodes; n; n = n->next)
		if (strcmp(n->endpoint, endpoint) == 0)
			st = n->killed ? -ECONNRESET : n->silent ? 1 : 0;
	pthread_mutex_unlock(&nodes_lock);
	return st;
}

static int fake_reg(struct tp_node *tn, const struct tp_region *region,
		    uint32_t *key)
{
	return tp_regs_add(&tn->regs, region, key);
}

static int fake_dereg(struct tp_node *tn, uint32_t key)
{
	return tp_regs_remove(&tn->regs, key);
}

/* Local registrations are only recorded: the fake needs none, tests look
 * at them (tp_fake_node_local). */
static int fake_reg_local(struct tp_node *tn, void *base, size_t len)
{
	int ret = -ENOSPC;
	pthread_mutex_lock(&nodes_lock);
	for (unsigned i = 0; i < FAKE_LOCALS_MAX; i++)
		if (tn->locals[i] == base) {
			ret = -EEXIST;
			break;
		}
	for (unsigned i = 0; i < FAKE_LOCALS_MAX && ret == -ENOSPC; i++)
		if (!tn->locals[i]) {
			tn->locals[i] = base;
			tn->local_len[i] = len;
			ret = 0;
		}
	pthread_mutex_unlock(&nodes_lock);
	return ret;
}

static int fake_unreg_local(struct tp_node *tn, void *base)
{
	int ret = -ENOENT;
	pthread_mutex_lock(&nodes_lock);
	for (unsigned i = 0; i < FAKE_LOCALS_MAX; i++)
		if (tn->locals[i] == base) {
			tn->locals[i] = NULL;
			tn->local_len[i] = 0;
			ret = 0;
		}
	pthread_mutex_unlock(&nodes_lock);
	return ret;
}

size_t tp_fake_node_local(struct tp_node *tn, const void *base)
{
	size_t len = 0;
	pthread_mutex_lock(&nodes_lock);
	for (unsigned i = 0; i < FAKE_LOCALS_MAX; i++)
		if (tn->locals[i] == base)
			len = tn->local_len[i];
	pthread_mutex_unlock(&nodes_lock);
	return len;
}

unsigned tp_fake_node_locals(struct tp_node *tn)
{
	unsigned n = 0;
	pthread_mutex_lock(&nodes_lock);
	for (unsigned i = 0; i < FAKE_LOCALS_MAX; i++)
		n += tn->locals[i] != NULL;
	pthread_mutex_unlock(&nodes_lock);
	return n;
}

/* ---------------------------------------------------------------- clients */

struct fbatch;

struct fpend {
	struct fbatch *b;
	struct tp_peer *peer;
	struct rx_timer timer;
	unsigned chan;
	bool write, fin;
	bool placed;       /* holds a channel slot */
	bool dropped;      /* the dice dropped it: never answered */
	int forced;        /* complete with this (peer close), not serve */
	uint32_t rkey;
	uint64_t addr;
	uint32_t len, hdr_len;
	uint8_t *hdr, *buf;
	int *res;
};

struct fbatch {
	struct tp_bcore c;       /* first: the list holds &c */
	struct tp_client *tc;
	struct fpend pend[];
};
_Static_assert(offsetof(struct fbatch, c) == 0, "a batch is its core");

struct tp_peer {
	char name[160];
	char node[160];
	unsigned refs;
	int last_err;
	bool up;
	unsigned busy[FAKE_CHANS_MAX];  /* operations per channel */
	uint64_t free_at[FAKE_CHANS_MAX]; /* when its queue drains (ns) */
	unsigned nchans;
	struct tp_peer *next;
};

struct tp_client {
	struct rx_reactor *r;
	struct tp_fake_opts o;
	uint64_t rng;
	struct tp_peer *peers;
	struct tp_bcore *batches;
	unsigned live;       /* placed, unfinished operations (atomic) */
};

static uint64_t rnd(struct tp_client *tc)
{
	uint64_t x = tc->rng; /* xorshift64 */
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	tc->rng = x;
	return x;
}

static bool dice(struct tp_client *tc, unsigned pct)
{
	return pct && rnd(tc) % 100 < pct;
}

static void fbatch_finish(struct fbatch *b)
{
	tp_bcore_deliver(&b->c, &b->tc->batches, b->tc->r);
	free(b);
}

/* Mark p finished with res; false if it already was. Does not deliver. */
static bool fpend_end(struct fpend *p, int res)
{
	if (p->fin)
		return false;
	p->fin = true;
	rx_timer_stop(p->b->tc->r, &p->timer);
	if (p->placed && p->peer->busy[p->chan])
		p->peer->busy[p->chan]--;
	if (p->placed)
		__atomic_sub_fetch(&p->b->tc->live, 1, __ATOMIC_RELEASE);
	*p->res = tp_bcore_res(&p->b->c, res);
	p->b->c.left--;
	return true;
}

static void fpend_done(struct fpend *p, int res)
{
	if (p->peer && res < 0 && res != -ECANCELED && res != -ETIMEDOUT &&
	    (res == -ECONNRESET || res == -ECONNREFUSED || res == -EHOSTDOWN))
		p->peer->last_err = res;
	if (fpend_end(p, res) && p->b->c.left == 0)
		fbatch_finish(p->b);
}

/* Copy the bytes of p between the caller and the node's region. */
static int fpend_serve(struct tp_client *tc, struct fpend *p)
{
	struct tp_hold h;
	int ret = node_hold(p->peer->name, p->rkey, p->addr, p->len,
			    p->write ? TP_ACCESS_WRITE : TP_ACCESS_READ, &h);
	if (ret < 0)
		return ret;
	uint8_t *remote = (uint8_t *)(uintptr_t)p->addr;
	uint32_t n = p->len;
	bool partial = !p->write && dice(tc, tc->o.partial_pct);
	if (partial)
		n = p->len / 2;
	uint32_t nh = PC_MIN(n, p->hdr_len);
	/* memcpy with a NULL pointer is undefined even for 0 bytes. */
	if (nh)
		memcpy(p->write ? remote : p->hdr, p->write ? p->hdr : remote,
		       nh);
	if (n > nh)
		memcpy(p->write ? remote + nh : p->buf,
		       p->write ? p->buf : remote + nh, n - nh);
	tp_regs_release(&h);
	return partial ? -EIO : 0;
}

static void fpend_fire(struct rx_reactor *r, struct rx_timer *t)
{
	struct fpend *p = t->arg;
	struct tp_client *tc = p->b->tc;
	if (p->forced) {
		fpend_done(p, p->forced);
		return;
	}
	if (!p->dropped && dice(tc, tc->o.drop_pct))
		p->dropped = true;
	int st = node_state(p->peer->name);
	if (st < 0) {
		fpend_done(p, st);
		return;
	}
	if (p->dropped || st == 1) {
		/* Wait for a timeout, cancel, close, or the node's death
		 * (polled). */
		rx_timer_start(r, t, RX_MS(DROP_POLL_MS), 0);
		return;
	}
	int ret = dice(tc, tc->o.error_pct)
			  ? (tc->o.error_errno ? tc->o.error_errno : -EIO)
			  : fpend_serve(tc, p);
	if (ret == 0)
		p->peer->up = true;
	fpend_done(p, ret);
}

static void fbatch_timeout(struct rx_reactor *r, struct rx_timer *t)
{
	struct fbatch *b = t->arg;
	(void)r;
	if (b->c.left) {
		b->c.timed_out = true;
		for (unsigned i = 0; i < b->c.n; i++)
			fpend_end(&b->pend[i], -ETIMEDOUT);
	}
	fbatch_finish(b);
}

static struct tp_peer *fpeer_get(struct tp_client *tc, const char *name,
				 const char *node)
{
	struct tp_peer *p;
	for (p = tc->peers; p; p = p->next)
		if (strcmp(p->name, name) == 0)
			break;
	if (!p) {
		p = calloc(1, sizeof(*p));
		if (!p)
			return NULL;
		snprintf(p->name, sizeof(p->name), "%s", name);
		p->next = tc->peers;
		tc->peers = p;
	}
	if (node && !p->node[0])
		snprintf(p->node, sizeof(p->node), "%s", node);
	return p;
}

static unsigned cap_of(const struct tp_client *tc)
{
	unsigned cap = tc->o.max_chans ? tc->o.max_chans : 16;
	return PC_MIN(cap, FAKE_CHANS_MAX);
}

/* Queue p on the least-loaded channel of its peer (a new one while under
 * the cap) and arm its timer. */
static void fpend_place(struct tp_client *tc, struct fpend *p)
{
	struct tp_peer *peer = p->peer;
	unsigned best = 0;
	/* A lowered cap closes the channels above it (as new TCP ones
	 * would not open): they finish what they hold and get no more. */
	peer->nchans = PC_MIN(peer->nchans, cap_of(tc));
	for (unsigned i = 1; i < peer->nchans; i++)
		if (peer->busy[i] < peer->busy[best])
			best = i;
	if ((peer->nchans == 0 || peer->busy[best] > 0) &&
	    peer->nchans < cap_of(tc))
		best = peer->nchans++;
	p->chan = best;
	p->placed = true;
	peer->busy[best]++;
	__atomic_add_fetch(&tc->live, 1, __ATOMIC_RELEASE);
	uint64_t now = pc_now_ns();
	uint64_t cost = (uint64_t)tc->o.latency_us * 1000u;
	if (tc->o.jitter_us)
		cost += (rnd(tc) % ((uint64_t)tc->o.jitter_us + 1)) * 1000u;
	uint64_t at;
	if (tc->o.reorder) {
		at = now + cost;
	} else {
		at = PC_MAX(now, peer->free_at[best]) + cost;
		peer->free_at[best] = at;
	}
	rx_timer_start(tc->r, &p->timer, at - now, 0);
}

/* Start p, or end it at once with the reason it cannot start. */
static void fpend_start(struct tp_client *tc, struct fpend *p,
			struct tp_peer *ph, const char *name, const char *node)
{
	int check = tp_io_check(p->len, p->hdr_len, p->hdr, p->buf);
	rx_timer_init(&p->timer, fpend_fire, p);
	p->peer = ph ? ph : fpeer_get(tc, name, node);
	if (!check && !p->peer)
		check = -ENOMEM;
	if (!check && rx_reactor_stopping(tc->r))
		check = -ESHUTDOWN;
	if (check) {
		fpend_end(p, check);
		return;
	}
	fpend_place(tc, p);
}

/* Start a batch: every operation is placed on a channel of its peer, or
 * ends at once (delivered from a 0-delay timer). */
static int fbatch_start(struct tp_client *tc, bool write, void *ops,
			unsigned n, unsigned timeout_ms, tp_done_fn rdone,
			tp_wdone_fn wdone, void *arg)
{
	if (n == 0)
		return -EINVAL;
	struct fbatch *b = calloc(1, sizeof(*b) + n * sizeof(b->pend[0]));
	if (!b)
		return -ENOMEM;
	b->tc = tc;
	tp_bcore_link(&b->c, &tc->batches, write, ops, n, arg, fbatch_timeout);
	b->c.rdone = rdone;
	b->c.wdone = wdone;
	for (unsigned i = 0; i < n; i++) {
		struct tp_io io;
		tp_bcore_io(&b->c, i, &io);
		struct fpend *p = &b->pend[i];
		*p = (struct fpend){.b = b, .write = write, .rkey = io.rkey,
				    .addr = io.addr, .len = io.len,
				    .hdr_len = io.hdr_len, .hdr = io.hdr,
				    .buf = io.buf, .res = io.res};
		fpend_start(tc, p, io.ph, io.peer, io.node);
	}
	rx_timer_start(tc->r, &b->c.timer,
		       b->c.left ? RX_MS(timeout_ms) : 0, 0);
	return 0;
}

static int fake_read_batch(struct tp_client *tc, struct tp_read *reads,
			   unsigned n, unsigned timeout_ms, tp_done_fn done,
			   void *arg)
{
	return fbatch_start(tc, false, reads, n, timeout_ms, done, NULL, arg);
}

static int fake_write_batch(struct tp_client *tc, struct tp_write *writes,
			    unsigned n, unsigned timeout_ms, tp_wdone_fn done,
			    void *arg)
{
	return fbatch_start(tc, true, writes, n, timeout_ms, NULL, done, arg);
}

static int fake_cancel(struct tp_client *tc, void *arg)
{
	int count = 0;
	for (struct tp_bcore *bc = tc->batches; bc; bc = bc->next) {
		struct fbatch *b = (struct fbatch *)bc;
		if (bc->arg != arg || bc->cancelled)
			continue;
		bc->cancelled = true;
		count++;
		for (unsigned i = 0; i < bc->n; i++)
			fpend_end(&b->pend[i], -ECANCELED);
		rx_timer_start(tc->r, &bc->timer, 0, 0);
	}
	return count;
}

/* Every live operation to peer ends with err, from its timer. */
static void fpeer_fail(struct tp_client *tc, struct tp_peer *peer, int err)
{
	for (struct tp_bcore *bc = tc->batches; bc; bc = bc->next)
		for (unsigned i = 0; i < bc->n; i++) {
			struct fpend *p = &((struct fbatch *)bc)->pend[i];
			if (p->peer == peer && !p->fin) {
				p->forced = err;
				rx_timer_start(tc->r, &p->timer, 0, 0);
			}
		}
	peer->up = false;
	peer->last_err = err;
}

static int fake_peer_open(struct tp_client *tc, const char *endpoint,
			  const char *node, struct tp_peer **out)
{
	if (!*endpoint)
		return -EINVAL;
	struct tp_peer *p = fpeer_get(tc, endpoint, node);
	if (!p)
		return -ENOMEM;
	p->refs++;
	*out = p;
	return 0;
}

static int fake_peer_health(struct tp_client *tc, struct tp_peer *p,
			    struct tp_peer_info *out)
{
	struct tp_peer_info i = {TP_PEER_IDLE, p->last_err, p->nchans, 0,
				 p->refs};
	for (struct tp_bcore *bc = tc->batches; bc; bc = bc->next)
		for (unsigned k = 0; k < bc->n; k++) {
			struct fpend *q = &((struct fbatch *)bc)->pend[k];
			i.inflight += q->peer == p && !q->fin;
		}
	if (p->up)
		i.state = TP_PEER_UP;
	else if (p->last_err)
		i.state = TP_PEER_FAILED;
	if (out)
		*out = i;
	return i.state;
}

static void fake_peer_close(struct tp_client *tc, struct tp_peer *p, int err)
{
	PC_ASSERT(p->refs > 0);
	p->refs--;
	fpeer_fail(tc, p, err ? err : -EHOSTDOWN);
}

static void fake_fail_node(struct tp_client *tc, const char *node, int err)
{
	for (struct tp_peer *p = tc->peers; p; p = p->next)
		if (strcmp(p->node, node) == 0)
			fpeer_fail(tc, p, err);
}

const struct tp_ops tp_fake_ops = {
	.name = "fake",
	.reg_region = fake_reg,
	.dereg_region = fake_dereg,
	.reg_local = fake_reg_local,
	.unreg_local = fake_unreg_local,
	.read_batch = fake_read_batch,
	.write_batch = fake_write_batch,
	.cancel = fake_cancel,
	.peer_open = fake_peer_open,
	.peer_health = fake_peer_health,
	.peer_close = fake_peer_close,
	.fail_node = fake_fail_node,
};

struct tp_client *tp_fake_client_new(struct rx_reactor *r,
				     const struct tp_fake_opts *o)
{
	struct tp_client *tc = calloc(1, sizeof(*tc));
	if (!tc)
		return NULL;
	tc->r = r;
	tp_fake_client_set(tc, o);
	return tc;
}

void tp_fake_client_set(struct tp_client *tc, const struct tp_fake_opts *o)
{
	static const struct tp_fake_opts none;
	tc->o = o ? *o : none;
	tc->rng = tc->o.seed ? tc->o.seed : 1;
}

unsigned tp_fake_client_inflight(const struct tp_client *tc)
{
	return __atomic_load_n(&tc->live, __ATOMIC_ACQUIRE);
}

void tp_fake_client_stop(struct tp_client *tc)
{
	for (struct tp_peer *p = tc->peers; p; p = p->next)
		fpeer_fail(tc, p, -ESHUTDOWN);
}

void tp_fake_client_free(struct tp_client *tc)
{
	PC_ASSERT(tc->batches == NULL);
	while (tc->peers) {
		struct tp_peer *p = tc->peers;
		tc->peers = p->next;
		free(p);
	}
	free(tc);
}
