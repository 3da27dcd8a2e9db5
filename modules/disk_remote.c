/*
 * modules/disk_remote.c — remote promotion, part of the disk module
 * (docs/disk.md "Remote promotion"): a reader whose get meets a
 * non-resident record of another node's page asks that node, the page's
 * producer, to bring it back into its pool (the disk.promote RPC), and
 * reads it from the fresh location the producer answers with.
 *
 * Owns, on the reader: per reactor, the promotions asked of peers (a hash
 * table of keys, each with its waiters, queued until the next loop pass and
 * then sent batched per producer, up to RP_BATCH_MAX keys a call) and an RPC
 * client (the cluster secret authenticates it, as the directory's). On the
 * producer: the disk.promote handler, which runs the disk tier's own
 * promotion (disk_promote_wait, modules/disk.c) for each key and answers
 * when every key is settled. The metrics of both sides.
 *
 * Threading: everything of a reactor's table runs on that reactor; kv asks
 * on the reactor of its call and is answered there. A handler's keys may
 * share promotions running on other reactors; disk.c tells it on its own.
 *
 * Sharing: concurrent asks of one key on one reactor share one request
 * (peercache_tier_remote_promote_shared_total); asks on two reactors send
 * two, and the producer shares one promotion between them. A key is in the
 * table from the ask to the answer, so an ask after the answer is a new
 * request (the producer then answers from its pool, with no promotion).
 *
 * Deadlines: a call's timeout is the smallest of rpc_timeout and what the
 * earliest deadline of its keys leaves; a producer that does not answer
 * (refused, reset, timed out) is reported to the "health" service, and
 * the calls to a producer that turns suspect or leaves fail at once. Every
 * waiter is answered exactly once: by the reply, the call's failure, or the
 * reactor's stop (-ESHUTDOWN).
 *
 * Never wrong: an answer is a location only: it must name the producer
 * asked and be resident; kv validates the page it then reads like every
 * remote page (key hash, generation, length, checksum).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "modules/disk_int.h"
#include "modules/membership.h"
#include "modules/peer_health.h"
#include "modules/placement_wire.h"
#include "modules/tier.h"
#include "rpc/client.h"
#include "rpc/rpc.h"

#define LOG_MOD "disk"
#define RP_BUCKETS 1024   /* per reactor: keys asked of peers */
#define RP_BATCH_MAX 1024 /* keys in one disk.promote */

/* Someone waiting for a key's answer (kv's get or exists). */
struct rp_wait {
	struct rp_wait *next;
	void (*done)(void *arg, int res, const struct dir_rec *fresh);
	void *arg;
};

/* A key asked of its producer: queued, then in a call, then answered. */
struct rp_key {
	struct rp_key *hnext;      /* hash chain */
	struct rp_key *qnext;      /* the queue of keys not sent yet */
	struct rp_wait *waiters;
	uint64_t h;
	uint64_t deadline_ns;      /* the earliest asker's, while queued */
	char node[DIR_NODE_MAX];   /* the producer */
	uint16_t klen;
	char key[];
};

/* Per reactor. */
struct rpq {
	struct rx_reactor *r;
	struct rpc_client *cl;
	bool stopping;
	struct rp_key *tab[RP_BUCKETS];
	struct rp_key *queued;     /* in ask order */
	struct rp_key **qtail;
	struct rx_timer flush;
};

/* One disk.promote in flight: its keys, in the order sent. */
struct rp_call {
	struct rpq *q;
	unsigned n;
	unsigned timeout_ms;
	struct rp_key *k[];
};

static struct {
	const struct svc_cluster *cl;
	const struct ph_api *health;
	const char *secret;
	size_t msg_max;
	unsigned timeout_ms;       /* rpc_timeout */
	bool disk_on;              /* this node has a disk tier to promote from */
	struct rpq *qs;            /* per reactor */
	met_id rq, shared, served, failed;       /* reader */
	met_id o_req, o_served, o_failed;        /* producer */
} g;

static _Thread_local struct rpq *t_rpq;

/* ------------------------------------------------------------- reader */

static struct rp_key **rp_slot(struct rpq *q, uint64_t h, const char *key,
			       size_t klen, const char *node)
{
	struct rp_key **kp = &q->tab[h % RP_BUCKETS];
	while (*kp && ((*kp)->h != h || (*kp)->klen != klen ||
		       memcmp((*kp)->key, key, klen) != 0 ||
		       strcmp((*kp)->node, node) != 0))
		kp = &(*kp)->hnext;
	return kp;
}

/* k's answer (res, fresh when 0) goes to its waiters; k leaves. */
static void rp_settle(struct rpq *q, struct rp_key *k, int res,
		      const struct dir_rec *fresh)
{
	struct rp_key **kp = rp_slot(q, k->h, k->key, k->klen, k->node);
	PC_ASSERT(*kp == k);
	*kp = k->hnext;
	met_inc(res == 0 ? g.served : g.failed);
	for (struct rp_wait *w = k->waiters, *next; w; w = next) {
		next = w->next;
		w->done(w->arg, res, res == 0 ? fresh : NULL);
		free(w);
	}
	free(k);
}

/* Is an answer for k a location of k's page (never another node's)? */
static int rp_check(const struct rp_key *k, const struct dir_rec *r)
{
	if (!r->resident || strcmp(r->node, k->node) != 0 || r->addr == 0)
		return -EPROTO;
	return 0;
}

static void rp_answered(void *arg, const struct rpc_result *res)
{
	struct rp_call *c = arg;
	struct rpq *q = c->q;
	struct mp_rd rd = res->result;
	uint32_t n = 0;
	int err = res->err;
	if (!err && (mp_rd_array(&rd, &n) < 0 || n != c->n))
		err = -EPROTO;
	if (err && err != -ESHUTDOWN) { /* this node stopping: no news */
		char why[256];
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "disk.promote of %u key%s at %s "
			  "failed: %s (misses)", c->n, c->n == 1 ? "" : "s",
			  c->k[0]->node, rpc_result_str(res, why, sizeof(why)));
		/* A timeout cut short by the deadline says nothing of A. */
		if (g.health && ph_evidence(err, c->timeout_ms))
			g.health->failed(c->k[0]->node, err, "disk.promote");
	}
	for (unsigned i = 0; i < c->n; i++) {
		struct dir_rec fresh = {0};
		int kres = err;
		if (!kres && mp_rd_try_nil(&rd))
			kres = -ENOENT;
		else if (!kres)
			kres = pl_rec_read(&rd, &fresh) < 0
				       ? -EPROTO
				       : rp_check(c->k[i], &fresh);
		if (kres == -EPROTO && !err) {
			err = -EPROTO; /* the rest cannot be read either */
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s answered disk.promote "
				  "with a bad record (misses)", c->k[i]->node);
		}
		rp_settle(q, c->k[i], kres, kres ? NULL : &fresh);
	}
	free(c);
}

/* Send the keys of q's queue that have node as producer (at most
 * RP_BATCH_MAX, taken off the queue) as one disk.promote. */
static void rp_send_one(struct rpq *q, const char *node, uint64_t now)
{
	/* Off the queue first (chained through qnext), so that a waiter
	 * answered below may ask again without meeting a stale queue. */
	struct rp_key *batch = NULL, **bt = &batch, **kp = &q->queued, *k;
	uint64_t first = UINT64_MAX;
	unsigned n = 0;
	while ((k = *kp) && n < RP_BATCH_MAX) {
		if (strcmp(k->node, node) != 0) {
			kp = &k->qnext;
			continue;
		}
		*kp = k->qnext;
		k->qnext = NULL;
		*bt = k;
		bt = &k->qnext;
		first = PC_MIN(first, k->deadline_ns);
		n++;
	}
	q->qtail = &q->queued;
	while (*q->qtail)
		q->qtail = &(*q->qtail)->qnext;
	uint64_t left_ms = first > now ? (first - now) / 1000000u : 0;
	unsigned timeout_ms = (unsigned)PC_MIN(left_ms, (uint64_t)g.timeout_ms);
	struct rp_call *c = left_ms ? malloc(sizeof(*c) + n * sizeof(c->k[0]))
				    : NULL;
	struct rpc_req *rq = c ? rpc_req_new(q->cl, node, "disk.promote", 1,
					     timeout_ms, rp_answered, c)
			       : NULL;
	if (!rq) { /* no time left, or out of memory: misses */
		free(c);
		while ((k = batch)) {
			batch = k->qnext;
			rp_settle(q, k, left_ms ? -ENOMEM : -ETIMEDOUT, NULL);
		}
		return;
	}
	*c = (struct rp_call){.q = q, .n = n, .timeout_ms = timeout_ms};
	msgpack_packer *pk = rpc_req_packer(rq);
	msgpack_pack_array(pk, n);
	for (unsigned i = 0; (k = batch); i++) {
		batch = k->qnext;
		c->k[i] = k;
		msgpack_pack_str(pk, k->klen);
		msgpack_pack_str_body(pk, k->key, k->klen);
	}
	met_add(g.rq, n);
	rpc_req_send(rq);
}

/* The next loop pass after asks: one call per producer (per
 * RP_BATCH_MAX keys). */
static void rp_flush(struct rx_reactor *r, struct rx_timer *t)
{
	struct rpq *q = t->arg;
	(void)r;
	uint64_t now = pc_now_ns(); /* the clock of the asks' deadlines */
	while (q->queued) {
		char node[DIR_NODE_MAX];
		snprintf(node, sizeof(node), "%s", q->queued->node);
		rp_send_one(q, node, now);
	}
}

static int rp_promote_remote(struct rx_reactor *r, const char *key,
			     size_t klen, const struct dir_rec *rec,
			     uint64_t deadline_ns,
			     void (*done)(void *arg, int res,
					  const struct dir_rec *fresh),
			     void *arg)
{
	struct rpq *q = t_rpq;
	if (!q || q->r != r || q->stopping)
		return -ESHUTDOWN;
	if (klen == 0 || klen > DIR_KEY_MAX || !rec->node[0] ||
	    strcmp(rec->node, g.cl->self_id) == 0)
		return -EINVAL;
	struct rp_wait *w = malloc(sizeof(*w));
	if (!w)
		return -ENOMEM;
	*w = (struct rp_wait){.done = done, .arg = arg};
	uint64_t h = XXH3_64bits(key, klen);
	struct rp_key **kp = rp_slot(q, h, key, klen, rec->node), *k = *kp;
	if (k) { /* asked already: share its answer */
		w->next = k->waiters;
		k->waiters = w;
		/* the shared ask ends by the earliest deadline among its
		 * waiters (while it is still queued: a sent one has its
		 * timeout already) */
		if (deadline_ns && (!k->deadline_ns || deadline_ns < k->deadline_ns))
			k->deadline_ns = deadline_ns;
		met_inc(g.shared);
		return 0;
	}
	/* the flush is what sends the queue (zero delay: arming it never
	 * fails) */
	if (!rx_timer_armed(&q->flush))
		rx_timer_start(r, &q->flush, 0, 0);
	if (!(k = malloc(sizeof(*k) + klen))) {
		free(w);
		return -ENOMEM;
	}
	*k = (struct rp_key){.waiters = w, .h = h, .deadline_ns = deadline_ns,
			     .klen = (uint16_t)klen};
	snprintf(k->node, sizeof(k->node), "%s", rec->node);
	memcpy(k->key, key, klen);
	*kp = k;
	*q->qtail = k;
	q->qtail = &k->qnext;
	return 0;
}

/* ----------------------------------------------------------- producer */

/* A disk.promote being served. */
struct rp_serve;
struct rp_slot {
	struct rp_serve *s;
	unsigned i;
};

struct rp_serve {
	struct rpc_call *call;
	unsigned n, pending;
	struct dir_rec *recs;
	struct rp_slot *slots;
};

static void serve_reply(struct rp_serve *s)
{
	msgpack_packer *pk = rpc_reply_begin(s->call);
	msgpack_pack_array(pk, s->n);
	unsigned served = 0;
	for (unsigned i = 0; i < s->n; i++) {
		if (s->recs[i].found) {
			pl_rec_pack(pk, &s->recs[i]);
			served++;
		} else {
			msgpack_pack_nil(pk);
		}
	}
	rpc_reply_end(s->call);
	met_add(g.o_served, served);
	met_add(g.o_failed, s->n - served);
	free(s);
}

static void serve_one(void *arg, int res, const struct dir_rec *rec)
{
	struct rp_slot *sl = arg;
	struct rp_serve *s = sl->s;
	if (res == 0)
		s->recs[sl->i] = *rec;
	if (--s->pending == 0)
		serve_reply(s);
}

/* disk.promote [[key, ...]] -> [record | nil, ...] */
static void m_promote(struct rpc_call *call, struct mp_rd *p)
{
	uint32_t n;
	if (!g.disk_on) {
		rpc_reply_error(call, RPC_E_UNSUPPORTED, "this node has no disk "
				"tier (disk_enabled = false)");
		return;
	}
	if (mp_rd_array(p, &n) < 0 || n == 0 || n > RP_BATCH_MAX) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected [[key, ...]] "
				"(1..%d keys of 1..%d bytes)", RP_BATCH_MAX,
				DIR_KEY_MAX);
		return;
	}
	struct rp_serve *s = calloc(1, sizeof(*s) + n * (sizeof(s->recs[0]) +
							 sizeof(s->slots[0])));
	if (!s) {
		rpc_reply_error(call, RPC_E_BUSY, "out of memory");
		return;
	}
	*s = (struct rp_serve){.call = call, .n = n,
			       .recs = (struct dir_rec *)(void *)(s + 1)};
	s->slots = (struct rp_slot *)(void *)(s->recs + n);
	/* Every key is read before any promotion starts: a bad one refuses
	 * the call with nothing under way. */
	struct mp_rd keys = *p;
	for (uint32_t i = 0; i < n; i++) {
		const char *k;
		uint32_t kl;
		if (mp_rd_str(p, &k, &kl) < 0 || kl == 0 || kl > DIR_KEY_MAX) {
			free(s);
			rpc_reply_error(call, RPC_E_BAD_PARAMS, "key %u: expected "
					"a string of 1..%d bytes", i,
					DIR_KEY_MAX);
			return;
		}
	}
	met_add(g.o_req, n);
	struct rx_reactor *r = rpc_call_reactor(call);
	s->pending = 1; /* until every key was asked */
	for (uint32_t i = 0; i < n; i++) {
		const char *k;
		uint32_t kl;
		mp_rd_str(&keys, &k, &kl);
		s->slots[i] = (struct rp_slot){s, i};
		/* Counted before the ask: its answer may come inside it. */
		s->pending++;
		int ret = disk_promote_wait(r, k, kl, &s->recs[i], serve_one,
					    &s->slots[i]);
		if (ret != 0)
			s->pending--; /* answered (1) or a miss: done not run */
		if (ret < 0)
			s->recs[i].found = false; /* a miss */
	}
	if (--s->pending == 0)
		serve_reply(s);
}

const struct rpc_method disk_rpc_methods[] = {
	{"disk.promote", m_promote, 0,
	 "[[key, ...]] -> [record | nil, ...]: bring this node's disk pages "
	 "into its pool; each key's resident record, or nil (a miss)"},
	{NULL, NULL, 0, NULL},
};

/* ---------------------------------------------------------- lifecycle */

/* A producer became suspect or left: its promotions asked from this
 * reactor fail now (misses) instead of at their timeout. */
static void on_peer_gone(struct rx_reactor *r, enum mb_event ev,
			 const char *peer, uint64_t epoch, void *arg)
{
	(void)ev;
	(void)epoch;
	(void)arg;
	struct rpq *q = &g.qs[rx_reactor_id(r)];
	if (q->cl)
		rpc_client_fail_endpoint(q->cl, peer, -EHOSTDOWN);
}

int disk_remote_init(struct pc_ctx *ctx, struct tier_ops *ops, bool disk_on)
{
	const struct pc_settings *s = ctx->cfg;
	memset(&g, 0, sizeof(g));
	g.disk_on = disk_on;
	if (!(g.cl = svc_need_cluster(ctx, "disk")))
		return -ENOENT;
	g.health = svc_find_health(ctx);
	g.secret = s->cluster_secret;
	g.msg_max = s->rpc_max_message_bytes;
	g.timeout_ms = (unsigned)s->rpc_timeout_ms;
	g.qs = calloc(ctx->threads, sizeof(*g.qs));
	if (!g.qs)
		return -ENOMEM;
	ops->promote_remote = rp_promote_remote;
	/* No unsubscribe: a failed init ends the process before any event. */
	const struct mb_api *mb = svc_find_membership(ctx);
	if (mb && mb->subscribe(MB_ON(MB_SUSPECT) | MB_ON(MB_LEAVE),
				on_peer_gone, NULL) < 0) {
		free(g.qs);
		g.qs = NULL;
		return -ENOSPC;
	}
	static const struct {
		met_id *id;
		const char *name, *help;
	} ctrs[] = { /* the reader's, then (disk tier on) the producer's */
		{&g.rq, "peercache_tier_remote_promote_requests_total",
		 "keys this node asked their producers to promote (disk.promote"
		 ", after sharing)"},
		{&g.shared, "peercache_tier_remote_promote_shared_total",
		 "asks for a remote promotion that shared a request already "
		 "made for the key"},
		{&g.served, "peercache_tier_remote_promote_served_total",
		 "keys a producer answered with a fresh location"},
		{&g.failed, "peercache_tier_remote_promote_failed_total",
		 "keys asked of a producer that came back without a location "
		 "(not on its disk, busy, error, timeout, no answer)"},
		{&g.o_req, "peercache_disk_remote_promote_requests_total",
		 "keys peers asked this node to promote (disk.promote)"},
		{&g.o_served, "peercache_disk_remote_promote_served_total",
		 "keys of disk.promote answered with a location"},
		{&g.o_failed, "peercache_disk_remote_promote_failed_total",
		 "keys of disk.promote answered nil (not on disk, busy, "
		 "failed)"},
	};
	for (size_t i = 0; i < (disk_on ? PC_ARRAY_LEN(ctrs) : 4); i++)
		*ctrs[i].id = met_register(MET_COUNTER, ctrs[i].name,
					   ctrs[i].help, NULL);
	return 0;
}

int disk_remote_start(struct rx_reactor *r)
{
	struct rpq *q = &g.qs[rx_reactor_id(r)];
	q->r = r;
	q->qtail = &q->queued;
	rx_timer_init(&q->flush, rp_flush, q);
	struct rpc_client_opts o;
	rpc_client_opts_default(&o);
	o.secret = g.secret;
	o.max_message_bytes = g.msg_max;
	o.conns_per_endpoint = 1;
	if (!(q->cl = rpc_client_new(r, &o)))
		return -ENOMEM;
	t_rpq = q;
	return 0;
}

/* Shutdown: no new asks; queued ones are answered -ESHUTDOWN now (the
 * client fails the calls in flight itself). */
void disk_remote_stop(struct rx_reactor *r)
{
	struct rpq *q = &g.qs[rx_reactor_id(r)];
	q->stopping = true;
	rx_timer_stop(r, &q->flush);
	while (q->queued) {
		struct rp_key *k = q->queued;
		q->queued = k->qnext;
		rp_settle(q, k, -ESHUTDOWN, NULL);
	}
	q->qtail = &q->queued;
}

void disk_remote_exit(struct rx_reactor *r)
{
	struct rpq *q = &g.qs[rx_reactor_id(r)];
	t_rpq = NULL;
	if (q->cl)
		rpc_client_free(q->cl); /* its calls answer their keys */
	q->cl = NULL;
}

void disk_remote_fini(void)
{
	free(g.qs);
	g.qs = NULL;
}
