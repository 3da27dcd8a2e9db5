/*
 * modules/transport_mixed.c — RDMA with TCP beside it (transport_mixed.h).
 *
 * Owns: per node nothing but the two halves' handles; per client the peer
 * handles it made (each holding one handle of each transport), the peers
 * found without RDMA (until when they go over TCP), and its live batches.
 * A batch is split into at most three sub-batches: RDMA, TCP, and the
 * operations RDMA could not deliver because the peer has no RDMA (sent
 * again over TCP). Each sub-batch is a copy of the caller's operations;
 * results are copied back when it ends, and the batch ends (from a 0-delay
 * timer, or from the last sub-batch's done) once none is open.
 */
#include "modules/transport_mixed.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"

#define LOG_MOD "transport"

struct tp_node {
	const struct tp_ops *rops;
	struct tp_node *rdma;
	struct tp_regs *tcp;
};

struct tp_peer {
	char name[160];
	char node[160];
	struct tp_peer *rph, *tph; /* the halves' handles */
	unsigned refs;
	struct tp_peer *next;
};

struct notcp {
	char name[160];
	uint64_t until_ns;
	struct notcp *next;
};

enum { SUB_RDMA, SUB_TCP, SUB_RETRY, SUB_N };

struct mbatch;

struct sub {
	struct mbatch *b;
	unsigned n;
	unsigned *idx;   /* caller's index of each operation */
	void *ops;       /* struct tp_read[n] or tp_write[n] */
	bool open;
};

struct mbatch {
	struct tp_bcore c; /* first: the list holds &c */
	struct tp_client *mc;
	uint64_t deadline_ns;
	unsigned open;
	struct sub s[SUB_N];
};
_Static_assert(offsetof(struct mbatch, c) == 0, "a batch is its core");

struct tp_client {
	struct rx_reactor *r;
	const struct tp_ops *rops, *tops;
	struct tp_client *rc, *tc;
	struct tp_peer *peers;
	struct notcp *tcp_only;
	struct tp_bcore *batches;
	uint64_t fallbacks;
};

/* ------------------------------------------------------------- node */

struct tp_node *tp_mixed_node_new(const struct tp_ops *rdma_ops,
				  struct tp_node *rdma, struct tp_regs *tcp)
{
	struct tp_node *tn = calloc(1, sizeof(*tn));
	if (tn)
		*tn = (struct tp_node){rdma_ops, rdma, tcp};
	return tn;
}

void tp_mixed_node_free(struct tp_node *tn)
{
	free(tn);
}

/* RDMA first (it chooses the key), then TCP under the same key; only
 * TCP, which pins per transfer, runs the released hook. */
static int mixed_reg(struct tp_node *tn, const struct tp_region *region,
		     uint32_t *key)
{
	struct tp_region r = *region;
	r.released = NULL;
	int ret = tn->rops->reg_region(tn->rdma, &r, key);
	if (ret < 0)
		return ret;
	ret = tp_regs_add_key(tn->tcp, region, key);
	if (ret < 0)
		tn->rops->dereg_region(tn->rdma, *key);
	return ret;
}

static int mixed_dereg(struct tp_node *tn, uint32_t key)
{
	int ret = tn->rops->dereg_region(tn->rdma, key);
	int t = tp_regs_remove(tn->tcp, key);
	return ret < 0 ? ret : t;
}

static void mixed_revoke(struct tp_node *tn, struct rx_reactor *r,
			 uint64_t epoch)
{
	if (tn->rops->revoke)
		tn->rops->revoke(tn->rdma, r, epoch);
}

static int mixed_reg_local(struct tp_node *tn, void *base, size_t len)
{
	return tn->rops->reg_local ? tn->rops->reg_local(tn->rdma, base, len)
				   : 0;
}

static int mixed_unreg_local(struct tp_node *tn, void *base)
{
	return tn->rops->unreg_local ? tn->rops->unreg_local(tn->rdma, base)
				     : 0;
}

/* ------------------------------------------------------------ peers */

static bool tcp_only(struct tp_client *mc, const char *name)
{
	uint64_t now = rx_now_ns(mc->r);
	for (struct notcp **pp = &mc->tcp_only; *pp;) {
		struct notcp *e = *pp;
		if (e->until_ns <= now) {
			*pp = e->next;
			free(e);
			continue;
		}
		if (strcmp(e->name, name) == 0)
			return true;
		pp = &e->next;
	}
	return false;
}

static void mark_tcp_only(struct tp_client *mc, const char *name, int why)
{
	if (tcp_only(mc, name))
		return;
	struct notcp *e = calloc(1, sizeof(*e));
	if (!e)
		return;
	snprintf(e->name, sizeof(e->name), "%s", name);
	e->until_ns = rx_now_ns(mc->r) + RX_MS(TP_MIXED_TCP_HOLD_MS);
	e->next = mc->tcp_only;
	mc->tcp_only = e;
	PC_LOG_RL(PC_LOG_INFO, LOG_MOD, "%s: no RDMA there (%s); reaching it "
		  "over TCP for %u s", name, strerror(-why),
		  TP_MIXED_TCP_HOLD_MS / 1000);
}

/* An RDMA failure that says the peer has no RDMA listener or route. */
static bool no_rdma(int res)
{
	return res == -ECONNREFUSED || res == -EHOSTUNREACH ||
	       res == -ENODEV || res == -EPROTO;
}

/* ---------------------------------------------------------- batches */

static size_t op_size(const struct mbatch *b)
{
	return b->c.write ? sizeof(struct tp_write) : sizeof(struct tp_read);
}

static void *op_at(const struct mbatch *b, void *ops, unsigned i)
{
	return (char *)ops + (size_t)i * op_size(b);
}

/* The handle and result slots of an operation, read or write. */
static void op_peer(const struct mbatch *b, void *op, struct tp_peer ***ph,
		    int **res)
{
	if (b->c.write) {
		struct tp_write *w = op;
		*ph = &w->ph;
		*res = &w->res;
	} else {
		struct tp_read *rd = op;
		*ph = &rd->ph;
		*res = &rd->res;
	}
}

/* The peer's endpoint of one of the caller's operations (its handle, if
 * any, is one of ours). */
static const char *op_name(const struct mbatch *b, void *op)
{
	struct tp_peer **ph;
	int *res;
	op_peer(b, op, &ph, &res);
	if (*ph)
		return (*ph)->name;
	return b->c.write ? ((struct tp_write *)op)->peer
			  : ((struct tp_read *)op)->peer;
}

static void mb_end(struct rx_reactor *r, struct rx_timer *t)
{
	struct mbatch *b = t->arg;
	(void)r;
	if (b->open)
		return; /* a sub-batch still runs; its done ends us */
	for (unsigned k = 0; k < SUB_N; k++) {
		free(b->s[k].idx);
		free(b->s[k].ops);
	}
	tp_bcore_deliver(&b->c, &b->mc->batches, b->mc->r);
	free(b);
}

static void sub_done(void *arg, void *ops, unsigned n);

static void sub_rdone(void *arg, struct tp_read *reads, unsigned n)
{
	sub_done(arg, reads, n);
}

static void sub_wdone(void *arg, struct tp_write *writes, unsigned n)
{
	sub_done(arg, writes, n);
}

/* Start sub k (its ops filled) over RDMA or TCP; its ops fail with the
 * error when it cannot start. */
static void sub_start(struct mbatch *b, unsigned k, unsigned timeout_ms)
{
	struct tp_client *mc = b->mc;
	struct sub *s = &b->s[k];
	bool tcp = k != SUB_RDMA;
	const struct tp_ops *o = tcp ? mc->tops : mc->rops;
	struct tp_client *c = tcp ? mc->tc : mc->rc;
	/* Handles are the half's own. */
	for (unsigned i = 0; i < s->n; i++) {
		struct tp_peer **ph;
		int *res;
		op_peer(b, op_at(b, s->ops, i), &ph, &res);
		if (*ph)
			*ph = tcp ? (*ph)->tph : (*ph)->rph;
	}
	int ret = b->c.write
			  ? o->write_batch(c, s->ops, s->n, timeout_ms,
					   sub_wdone, s)
			  : o->read_batch(c, s->ops, s->n, timeout_ms,
					  sub_rdone, s);
	if (ret == 0) {
		s->open = true;
		b->open++;
		return;
	}
	for (unsigned i = 0; i < s->n; i++) {
		struct tp_peer **ph;
		int *res;
		op_peer(b, op_at(b, b->c.ops, s->idx[i]), &ph, &res);
		*res = ret;
	}
}

/* A sub-batch of n ops for the caller's indexes idx (taken). */
static int sub_fill(struct mbatch *b, unsigned k, unsigned *idx, unsigned n)
{
	struct sub *s = &b->s[k];
	s->b = b;
	s->n = n;
	s->idx = idx;
	s->ops = malloc(n * op_size(b));
	if (!s->ops)
		return -ENOMEM;
	for (unsigned i = 0; i < n; i++)
		memcpy(op_at(b, s->ops, i), op_at(b, b->c.ops, idx[i]),
		       op_size(b));
	return 0;
}

static void sub_done(void *arg, void *ops, unsigned n)
{
	struct sub *s = arg;
	struct mbatch *b = s->b;
	struct tp_client *mc = b->mc;
	unsigned *again = NULL, nagain = 0;
	for (unsigned i = 0; i < n; i++) {
		void *src = op_at(b, ops, i);
		void *dst = op_at(b, b->c.ops, s->idx[i]);
		struct tp_peer **sph, **dph;
		int *sres, *dres;
		const char *name = op_name(b, dst);
		op_peer(b, dst, &dph, &dres);
		op_peer(b, src, &sph, &sres);
		*dres = *sres;
		if (!b->c.write) {
			((struct tp_read *)dst)->got = ((struct tp_read *)src)->got;
			((struct tp_read *)dst)->narrowed =
				((struct tp_read *)src)->narrowed;
			((struct tp_read *)dst)->landed_ran =
				((struct tp_read *)src)->landed_ran;
		}
		if (s == &b->s[SUB_RDMA] && no_rdma(*sres) &&
		    !b->c.cancelled) {
			mark_tcp_only(mc, name, *sres);
			if (!again)
				again = calloc(n, sizeof(*again));
			if (again)
				again[nagain++] = s->idx[i];
		}
	}
	s->open = false;
	b->open--;
	uint64_t now = rx_now_ns(mc->r);
	if (nagain && now < b->deadline_ns &&
	    sub_fill(b, SUB_RETRY, again, nagain) == 0) {
		__atomic_add_fetch(&mc->fallbacks, nagain, __ATOMIC_RELAXED);
		unsigned left = (unsigned)((b->deadline_ns - now) / 1000000u);
		sub_start(b, SUB_RETRY, PC_MAX(left, 1u));
	} else if (again && !b->s[SUB_RETRY].idx) {
		free(again);
	}
	if (!b->open)
		rx_timer_start(mc->r, &b->c.timer, 0, 0);
}

static int batch_start(struct tp_client *mc, bool write, void *opsv,
		       unsigned n, unsigned timeout_ms, tp_done_fn rdone,
		       tp_wdone_fn wdone, void *arg)
{
	if (n == 0)
		return -EINVAL;
	struct mbatch *b = calloc(1, sizeof(*b));
	unsigned *ri = calloc(n, sizeof(*ri)), *ti = calloc(n, sizeof(*ti));
	if (!b || !ri || !ti) {
		free(b);
		free(ri);
		free(ti);
		return -ENOMEM;
	}
	b->mc = mc;
	b->c.write = write; /* what op_at needs before the link */
	b->c.ops = opsv;
	b->deadline_ns = rx_now_ns(mc->r) + RX_MS(timeout_ms);
	unsigned nr = 0, nt = 0;
	for (unsigned i = 0; i < n; i++) {
		struct tp_peer **ph;
		int *res;
		const char *name = op_name(b, op_at(b, opsv, i));
		op_peer(b, op_at(b, opsv, i), &ph, &res);
		*res = 0;
		if (!write) /* the sub-batches' copies say when it ran */
			((struct tp_read *)op_at(b, opsv, i))->landed_ran = false;
		if (tcp_only(mc, name))
			ti[nt++] = i;
		else
			ri[nr++] = i;
	}
	int ret = 0;
	if (nr && (ret = sub_fill(b, SUB_RDMA, ri, nr)) == 0)
		ri = NULL;
	if (!ret && nt && (ret = sub_fill(b, SUB_TCP, ti, nt)) == 0)
		ti = NULL;
	free(ri);
	free(ti);
	if (ret < 0) {
		for (unsigned k = 0; k < SUB_N; k++) {
			free(b->s[k].idx);
			free(b->s[k].ops);
		}
		free(b);
		return ret;
	}
	tp_bcore_link(&b->c, &mc->batches, write, opsv, n, arg, mb_end);
	b->c.rdone = rdone;
	b->c.wdone = wdone;
	if (nr)
		sub_start(b, SUB_RDMA, timeout_ms);
	if (nt)
		sub_start(b, SUB_TCP, timeout_ms);
	if (!b->open)
		rx_timer_start(mc->r, &b->c.timer, 0, 0);
	return 0;
}

static int mixed_read_batch(struct tp_client *mc, struct tp_read *reads,
			    unsigned n, unsigned timeout_ms, tp_done_fn done,
			    void *arg)
{
	return batch_start(mc, false, reads, n, timeout_ms, done, NULL, arg);
}

static int mixed_write_batch(struct tp_client *mc, struct tp_write *writes,
			     unsigned n, unsigned timeout_ms, tp_wdone_fn done,
			     void *arg)
{
	return batch_start(mc, true, writes, n, timeout_ms, NULL, done, arg);
}

static int mixed_cancel(struct tp_client *mc, void *arg)
{
	int count = 0;
	for (struct tp_bcore *bc = mc->batches; bc; bc = bc->next) {
		struct mbatch *b = (struct mbatch *)bc;
		if (bc->arg != arg || bc->cancelled)
			continue;
		bc->cancelled = true;
		count++;
		for (unsigned k = 0; k < SUB_N; k++) {
			if (!b->s[k].open)
				continue;
			if (k == SUB_RDMA)
				mc->rops->cancel(mc->rc, &b->s[k]);
			else
				mc->tops->cancel(mc->tc, &b->s[k]);
		}
		/* Nothing open: it ends from its timer (already set). */
	}
	return count;
}

static int mixed_peer_open(struct tp_client *mc, const char *endpoint,
			   const char *node, struct tp_peer **out)
{
	struct tp_peer *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	snprintf(p->name, sizeof(p->name), "%s", endpoint);
	snprintf(p->node, sizeof(p->node), "%s", node ? node : "");
	int ret = mc->rops->peer_open(mc->rc, endpoint, node, &p->rph);
	if (ret == 0) {
		ret = mc->tops->peer_open(mc->tc, endpoint, node, &p->tph);
		if (ret < 0)
			mc->rops->peer_close(mc->rc, p->rph, 0);
	}
	if (ret < 0) {
		free(p);
		return ret;
	}
	p->refs = 1;
	p->next = mc->peers;
	mc->peers = p;
	*out = p;
	return 0;
}

static int mixed_peer_health(struct tp_client *mc, struct tp_peer *p,
			     struct tp_peer_info *out)
{
	if (tcp_only(mc, p->name))
		return mc->tops->peer_health(mc->tc, p->tph, out);
	return mc->rops->peer_health(mc->rc, p->rph, out);
}

static void mixed_peer_close(struct tp_client *mc, struct tp_peer *p, int err)
{
	mc->rops->peer_close(mc->rc, p->rph, err);
	mc->tops->peer_close(mc->tc, p->tph, err);
	PC_ASSERT(p->refs > 0);
	if (--p->refs)
		return;
	struct tp_peer **pp = &mc->peers;
	while (*pp && *pp != p)
		pp = &(*pp)->next;
	if (*pp)
		*pp = p->next;
	free(p);
}

static void mixed_fail_node(struct tp_client *mc, const char *node, int err)
{
	mc->rops->fail_node(mc->rc, node, err);
	mc->tops->fail_node(mc->tc, node, err);
}

const struct tp_ops tp_mixed_ops = {
	.name = "rdma+tcp",
	.reg_region = mixed_reg,
	.dereg_region = mixed_dereg,
	.reg_local = mixed_reg_local,
	.unreg_local = mixed_unreg_local,
	.read_batch = mixed_read_batch,
	.write_batch = mixed_write_batch,
	.cancel = mixed_cancel,
	.peer_open = mixed_peer_open,
	.peer_health = mixed_peer_health,
	.peer_close = mixed_peer_close,
	.fail_node = mixed_fail_node,
	.revoke = mixed_revoke,
};

struct tp_client *tp_mixed_client_new(struct rx_reactor *r,
				      const struct tp_ops *rdma_ops,
				      struct tp_client *rdma,
				      const struct tp_ops *tcp_ops,
				      struct tp_client *tcp)
{
	struct tp_client *mc = calloc(1, sizeof(*mc));
	if (mc)
		*mc = (struct tp_client){.r = r, .rops = rdma_ops,
					 .tops = tcp_ops, .rc = rdma,
					 .tc = tcp};
	return mc;
}

void tp_mixed_client_free(struct tp_client *mc)
{
	if (!mc)
		return;
	PC_ASSERT(mc->batches == NULL);
	while (mc->peers) {
		struct tp_peer *p = mc->peers;
		mc->peers = p->next;
		free(p);
	}
	while (mc->tcp_only) {
		struct notcp *e = mc->tcp_only;
		mc->tcp_only = e->next;
		free(e);
	}
	free(mc);
}

uint64_t tp_mixed_client_fallbacks(const struct tp_client *mc)
{
	return __atomic_load_n(&mc->fallbacks, __ATOMIC_RELAXED);
}
