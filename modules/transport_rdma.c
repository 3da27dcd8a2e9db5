/*
 * modules/transport_rdma.c — the RDMA client (transport_rdma.h) and
 * tp_rdma_ops.
 *
 * Owns: struct tp_client (per reactor: a completion channel per rail and
 * the rdma_cm event channel, all watched on the reactor; peers, their
 * channels and the live batches). The node is transport_rdma_node.c.
 *
 * An operation (struct rop) is placed on a channel of its peer: queued
 * there until the channel is connected and its send queue has room, then
 * posted (pump). The channel's fifo holds posted operations in posting
 * order; a signaled completion with wr_id = seq finishes every operation up
 * to seq; a failed one finishes those before it, fails the one it names
 * and tears the channel down (destroy_qp: no byte moves after it); so does
 * the sweep when the fifo's head stays posted past cfg.op_timeout_ms. Batches
 * end through their timer (0-delay when the last operation finished), so
 * done never runs inside a call of the caller.
 */
#include "modules/transport_rdma_int.h"

#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/endpoint.h"
#include "common/log.h"
#include "common/util.h"

#define LOG_MOD "rdma"

/* The lkey on rail dev for [p, p+len) of batch b: the tables', one of the
 * batch's own registrations, or a new one for the batch. 0 and -errno in
 * *err. */
static uint32_t lkey_of(struct rbatch *b, unsigned dev, const void *p,
			size_t len, int *err)
{
	struct tp_node *tn = b->tc->tn;
	if (!len)
		return 0;
	uint32_t k = tp_rdma_table_lkey(tn, dev, p, len);
	if (k)
		return k;
	for (unsigned i = 0; i < b->nmrs; i++) {
		const struct ibv_mr *m = b->mrs[i].mr;
		if (b->mrs[i].dev == dev &&
		    covers((uintptr_t)m->addr, m->length, (uintptr_t)p, len))
			return m->lkey;
	}
	if (b->nmrs == b->capmrs) {
		unsigned cap = b->capmrs ? b->capmrs * 2 : 4;
		struct bmr *m = realloc(b->mrs, cap * sizeof(*m));
		if (!m) {
			*err = -ENOMEM;
			return 0;
		}
		b->mrs = m;
		b->capmrs = cap;
	}
	struct ibv_mr *mr = tn->api->reg_mr(tn->rails[dev].pd, (void *)p, len,
					    IBV_ACCESS_LOCAL_WRITE);
	if (!mr) {
		*err = neg_errno(-ENOMEM);
		return 0;
	}
	STAT_ADD(tn, lazy_mrs, 1);
	b->mrs[b->nmrs++] = (struct bmr){mr, dev};
	return mr->lkey;
}

/* Give o the lkeys of rail dev (once per rail it is posted on): 0 or
 * -errno. */
static int op_lkeys(struct rop *o, unsigned dev)
{
	if (o->lk_dev == (int8_t)dev)
		return 0;
	int err = 0;
	o->lkey_hdr = lkey_of(o->b, dev, o->hdr, o->hdr_len, &err);
	if (!err)
		o->lkey_buf = lkey_of(o->b, dev, o->buf, o->len - o->hdr_len,
				      &err);
	o->lk_dev = err ? -1 : (int8_t)dev;
	return err;
}

/* ----------------------------------------------------------- batches */

/* How a closing channel's operations go on. */
enum td { TD_FAIL, TD_RETRY, TD_CONNFAIL, TD_ABORT, TD_PEER };

static void chan_teardown(struct rchan *ch, enum td mode, int err);
static void op_place(struct tp_client *tc, struct rop *o, bool may_open);
static void sweep_arm(struct tp_client *tc);

static void batch_fire(struct rx_reactor *r, struct rx_timer *t);

/* Finish o with res (once); a finished batch ends from its timer. */
static void op_end(struct rop *o, int res)
{
	if (o->fin)
		return;
	o->fin = true;
	if (o->p)
		o->p->inflight--;
	*o->res = tp_bcore_res(&o->b->c, res);
	if (res == 0) {
		struct tp_node *tn = o->b->tc->tn;
		if (o->lk_dev >= 0)
			STAT_ADD(tn, rail_bytes[o->lk_dev], o->len);
		if (o->write) {
			STAT_ADD(tn, writes, 1);
			STAT_ADD(tn, write_bytes, o->len);
		} else {
			STAT_ADD(tn, reads, 1);
			STAT_ADD(tn, read_bytes, o->len);
		}
	}
	if (--o->b->c.left == 0)
		rx_timer_start(o->b->tc->r, &o->b->c.timer, 0, 0);
}

/* Take o off its channel's wait queue (it was not posted). */
static void op_unqueue(struct rop *o)
{
	struct rchan *ch = o->ch;
	struct rop **pp = &ch->wq, *prev = NULL;
	while (*pp && *pp != o) {
		prev = *pp;
		pp = &(*pp)->next;
	}
	if (!*pp)
		return;
	*pp = o->next;
	if (ch->wq_tail == o)
		ch->wq_tail = prev;
	ch->nwait--;
	o->ch = NULL;
	o->next = NULL;
}

/* End every unfinished operation of b with err, destroying the QPs that
 * hold posted ones first (their other operations go elsewhere). */
static void batch_abort(struct rbatch *b, int err)
{
	for (unsigned i = 0; i < b->c.n; i++) {
		struct rop *o = &b->ops[i];
		if (o->fin)
			continue;
		if (o->ch && o->posted)
			chan_teardown(o->ch, TD_ABORT, -ECONNRESET);
		else if (o->ch)
			op_unqueue(o);
	}
	for (unsigned i = 0; i < b->c.n; i++)
		op_end(&b->ops[i], err);
}

static void batch_fire(struct rx_reactor *r, struct rx_timer *t)
{
	struct rbatch *b = t->arg;
	(void)r;
	if (b->c.left) {
		/* The timeout. */
		b->c.timed_out = true;
		STAT_ADD(b->tc->tn, timeouts, 1);
		batch_abort(b, -ETIMEDOUT);
	}
	for (unsigned i = 0; i < b->nmrs; i++)
		b->tc->tn->api->dereg_mr(b->mrs[i].mr);
	free(b->mrs);
	tp_bcore_deliver(&b->c, &b->tc->batches, b->tc->r);
	free(b);
}

/* ------------------------------------------------------------- peers */

static struct tp_peer *peer_get(struct tp_client *tc, const char *name,
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
		socklen_t sl;
		p->sa_err = pc_endpoint_parse(name, &p->sa, &sl);
		p->nrails = 1;
		p->next = tc->peers;
		tc->peers = p;
	}
	if (node && !p->node[0])
		snprintf(p->node, sizeof(p->node), "%s", node);
	return p;
}

/* Every operation to p ends with err; its channels close. */
static void peer_fail(struct tp_client *tc, struct tp_peer *p, int err)
{
	(void)tc;
	while (p->chans)
		chan_teardown(p->chans, TD_FAIL, err);
	p->up = false;
	p->last_err = err;
}

/* ------------------------------------------------------------ channels */

static void chan_reap(struct rx_reactor *r, struct rx_timer *t)
{
	struct tp_client *tc = t->arg;
	(void)r;
	while (tc->reap) {
		struct rchan *ch = tc->reap;
		tc->reap = ch->next;
		if (ch->id)
			tc->tn->api->destroy_id(ch->id);
		free(ch->fifo);
		free(ch);
	}
}

void tp_rdma_cq_destroy(struct tp_node *tn, struct ibv_cq **cq)
{
	if (*cq && tn->api->destroy_cq(*cq))
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "destroy_cq: %s",
			  strerror(errno));
	*cq = NULL;
}

/*
 * Close ch now: its QP is destroyed (nothing it holds can land after
 * this). Its operations end with err (TD_FAIL), or go on: TD_RETRY posts
 * the posted ones once more and the queued ones again on the peer's other
 * channels (a new one if need be); TD_CONNFAIL (the channel never
 * connected) moves the queued ones to channels that are still open or
 * opening, and ends them with err when there are none; TD_ABORT (another
 * batch's timeout or cancel) moves every one on without using up its
 * retry; TD_PEER (the peer closed the queue pair: a revoke, a restart; or
 * it went to error with no operation of its own failing) too, a few times
 * at most. The id is destroyed later, outside any rdma_cm event handling.
 */
static void chan_teardown(struct rchan *ch, enum td mode, int err)
{
	struct tp_client *tc = ch->tc;
	struct tp_node *tn = tc->tn;
	struct tp_peer *p = ch->p;
	if (ch->state == CH_DEAD)
		return;
	bool was_ready = ch->state == CH_READY;
	ch->state = CH_DEAD;
	STAT_ADD(tn, chans_torn_down, 1);
	if (mode == TD_CONNFAIL && ch->rail) {
		/* The peer's rail cannot be reached from ours: the other
		 * rails carry its share for a while. */
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: rail %u could not connect "
			  "(%s); its operations go on the other rails for %u "
			  "ms", p->name, ch->rail, strerror(-err),
			  RAIL_HOLD_MS);
		p->rail_hold[ch->rail] = rx_now_ns(tc->r) + RX_MS(RAIL_HOLD_MS);
	}
	rx_timer_stop(tc->r, &ch->timer);
	if (ch->id && ch->id->qp) {
		if (was_ready)
			tn->api->disconnect(ch->id);
		tn->api->destroy_qp(ch->id);
	}
	tp_rdma_cq_destroy(tn, &ch->cq);
	/* Off the peer's list first, so nothing is placed back on it. */
	struct rchan **pp = &p->chans;
	while (*pp && *pp != ch)
		pp = &(*pp)->next;
	if (*pp) {
		*pp = ch->next;
		p->nchans--;
	}
	ch->next = tc->reap;
	tc->reap = ch;
	rx_timer_start(tc->r, &tc->reaper, 0, 0);
	/* The posted operations, in order. */
	unsigned sq = cfg_sq(tn);
	while (ch->nfifo) {
		struct rop *o = ch->fifo[ch->head];
		ch->head = (ch->head + 1) % sq;
		ch->nfifo--;
		o->ch = NULL;
		o->posted = false;
		if (o->fin)
			continue;
		/* TD_ABORT: another batch's timeout or cancel closed the
		 * channel; TD_PEER: the peer did. These were not at fault
		 * and keep their retry (a peer that drops every channel
		 * moves them three times at most). */
		bool again = (mode == TD_ABORT ||
			      (mode == TD_PEER && o->moves < 3) ||
			      (mode == TD_RETRY && !o->retried)) &&
			     !o->b->c.cancelled &&
			     !o->b->c.timed_out && !tc->stopping;
		if (again) {
			o->retried |= mode == TD_RETRY;
			o->moves += mode == TD_PEER;
			STAT_ADD(tn, retried, 1);
			op_place(tc, o, true);
		} else {
			op_end(o, err);
		}
	}
	while (ch->wq) {
		struct rop *o = ch->wq;
		ch->wq = o->next;
		o->next = NULL;
		o->ch = NULL;
		ch->nwait--;
		if (o->fin)
			continue;
		/* Queued ones never ran: they move on, a few times at most
		 * (a peer that accepts and drops every channel); those of a
		 * rail that could not connect, to the other rails. */
		bool again = !tc->stopping && o->moves < 3 &&
			     (mode == TD_RETRY || mode == TD_ABORT ||
			      mode == TD_PEER ||
			      (mode == TD_CONNFAIL && (p->chans || ch->rail)));
		if (again) {
			o->moves++;
			op_place(tc, o, mode != TD_CONNFAIL || ch->rail);
		} else {
			op_end(o, err);
		}
	}
	ch->wq_tail = NULL;
}

static void hello_make(struct rchan *ch)
{
	struct tp_node *tn = ch->tc->tn;
	struct hello *h = &ch->hi;
	memset(h, 0, sizeof(*h));
	h->magic = HELLO_MAGIC;
	h->ts_ms = wall_ms();
	pc_random_bytes(h->nonce, sizeof(h->nonce));
	if (tn->secret) {
		uint8_t full[PC_SHA256_BYTES];
		h->flags = HELLO_AUTH;
		char at[80];
		tp_rdma_sa_text((const struct sockaddr *)&ch->dst, at, sizeof(at));
		tp_rdma_proof(tn->secret, false, h->ts_ms, h->nonce, at, full);
		memcpy(h->proof, full, PROOF_BYTES);
	}
}

static void chan_deadline(struct rx_reactor *r, struct rx_timer *t)
{
	struct rchan *ch = t->arg;
	(void)r;
	PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: connecting a channel (rail %u) "
		  "timed out", ch->p->name, ch->rail);
	STAT_ADD(ch->tc->tn, chans_failed, 1);
	ch->p->last_err = -ETIMEDOUT;
	chan_teardown(ch, TD_CONNFAIL, -ETIMEDOUT);
}

/* A new channel to p's rail (connecting); NULL and *err. Rail 0 is the
 * endpoint dialed; rail k > 0 goes from this node's rail k to the
 * peer's. */
static struct rchan *chan_open(struct tp_client *tc, struct tp_peer *p,
			       unsigned rail, int *err)
{
	struct tp_node *tn = tc->tn;
	if (p->sa_err) {
		*err = p->sa_err;
		return NULL;
	}
	struct rchan *ch = calloc(1, sizeof(*ch));
	if (ch)
		ch->fifo = calloc(cfg_sq(tn), sizeof(*ch->fifo));
	if (!ch || !ch->fifo) {
		if (ch)
			free(ch);
		*err = -ENOMEM;
		return NULL;
	}
	ch->tc = tc;
	ch->p = p;
	ch->rail = rail;
	ch->dst = rail ? p->rsa[rail] : p->sa;
	ch->state = CH_ADDR;
	rx_timer_init(&ch->timer, chan_deadline, ch);
	/* From our rail's own address (any port: its listener has one). */
	struct sockaddr_storage src = tn->rails[rail].sa;
	sa_set_port(&src, 0);
	bool from = rail && src.ss_family == ch->dst.ss_family;
	if (tn->api->create_id(tc->ech, &ch->id, ch, RDMA_PS_TCP)) {
		*err = neg_errno(-ENOMEM);
		free(ch->fifo);
		free(ch);
		return NULL;
	}
	if (tn->api->resolve_addr(ch->id, from ? (struct sockaddr *)&src
						: NULL,
				  (struct sockaddr *)&ch->dst,
				  cfg_ctimeout(tn))) {
		*err = neg_errno(-EHOSTUNREACH);
		tn->api->destroy_id(ch->id);
		free(ch->fifo);
		free(ch);
		return NULL;
	}
	rx_timer_start(tc->r, &ch->timer, RX_MS(cfg_ctimeout(tn)) * 2, 0);
	ch->next = p->chans;
	p->chans = ch;
	p->nchans++;
	STAT_ADD(tn, chans_opened, 1);
	return ch;
}

/* The rkey the node gave ch for its region key: false if it has none. */
static bool chan_rkey(const struct rchan *ch, uint32_t key, uint32_t *rkey)
{
	for (unsigned i = 0; i < ch->nkeys; i++)
		if (ch->keys[i].key == key) {
			*rkey = ch->keys[i].rkey;
			return true;
		}
	return false;
}

/* Post what waits on ch while its send queue has room, in one chain. */
static void chan_pump(struct rchan *ch)
{
	struct tp_node *tn = ch->tc->tn;
	unsigned sq = cfg_sq(tn), sig = cfg_sig(tn);
	while (ch->state == CH_READY && ch->wq && ch->nfifo < sq) {
		enum { CHAIN = 32 };
		struct ibv_send_wr wr[CHAIN];
		struct ibv_sge sge[CHAIN][2];
		struct rop *ops[CHAIN];
		unsigned n = 0;
		while (ch->wq && n < CHAIN && ch->nfifo + n < sq) {
			struct rop *o = ch->wq;
			ch->wq = o->next;
			if (!ch->wq)
				ch->wq_tail = NULL;
			ch->nwait--;
			o->next = NULL;
			uint32_t rkey;
			if (!chan_rkey(ch, o->key, &rkey)) {
				/* No such region on the node (as a wrong
				 * rkey would be on hardware): nothing to
				 * post, and the channel stays. */
				o->ch = NULL;
				op_end(o, -EFAULT);
				continue;
			}
			int lerr = op_lkeys(o, ch->dev);
			if (lerr) {
				o->ch = NULL;
				op_end(o, lerr);
				continue;
			}
			ops[n] = o;
			struct ibv_send_wr *w = &wr[n];
			memset(w, 0, sizeof(*w));
			int ns = 0;
			if (o->hdr_len)
				sge[n][ns++] = (struct ibv_sge){
					(uintptr_t)o->hdr, o->hdr_len,
					o->lkey_hdr};
			if (o->len > o->hdr_len)
				sge[n][ns++] = (struct ibv_sge){
					(uintptr_t)o->buf, o->len - o->hdr_len,
					o->lkey_buf};
			w->sg_list = sge[n];
			w->num_sge = ns;
			w->opcode = o->write ? IBV_WR_RDMA_WRITE
					     : IBV_WR_RDMA_READ;
			w->wr.rdma.remote_addr = o->addr;
			w->wr.rdma.rkey = rkey;
			w->wr_id = ch->seq + n;
			if (++ch->since_signal >= sig) {
				w->send_flags = IBV_SEND_SIGNALED;
				ch->since_signal = 0;
			}
			w->next = NULL;
			if (n)
				wr[n - 1].next = w;
			n++;
		}
		if (!n)
			continue;
		/* The chain's last WR is signaled: every WR is covered. */
		if (!(wr[n - 1].send_flags & IBV_SEND_SIGNALED)) {
			wr[n - 1].send_flags = IBV_SEND_SIGNALED;
			ch->since_signal = 0;
		}
		struct ibv_send_wr *bad = NULL;
		int ret = tn->api->post_send(ch->id->qp, wr, &bad);
		unsigned posted = n;
		if (ret) {
			posted = bad ? (unsigned)(bad - wr) : 0;
			STAT_ADD(tn, post_failures, 1);
		}
		for (unsigned i = 0; i < posted; i++) {
			struct rop *o = ops[i];
			o->seq = ch->seq + i;
			o->posted_ns = rx_now_ns(ch->tc->r);
			o->posted = true;
			ch->fifo[(ch->head + ch->nfifo) % sq] = o;
			ch->nfifo++;
			if (wr[i].send_flags & IBV_SEND_SIGNALED)
				STAT_ADD(tn, wrs_signaled, 1);
		}
		STAT_ADD(tn, wrs_posted, posted);
		ch->seq += posted;
		if (posted)
			sweep_arm(ch->tc);
		if (posted < n) {
			/* Put the rest back, in order. */
			for (unsigned i = n; i-- > posted;) {
				ops[i]->next = ch->wq;
				ch->wq = ops[i];
				if (!ch->wq_tail)
					ch->wq_tail = ops[i];
				ch->nwait++;
			}
			if (posted && !(wr[posted - 1].send_flags &
					IBV_SEND_SIGNALED)) {
				/* The posted part ends unsignaled: nothing
				 * would report it. Start over. */
				PC_LOG_RL(PC_LOG_WARN, LOG_MOD,
					  "%s: post_send took part of a chain "
					  "(%s); reopening the channel",
					  ch->p->name, strerror(ret));
				chan_teardown(ch, TD_RETRY, -EIO);
				return;
			}
			if (ret != ENOMEM || !ch->nfifo) {
				PC_LOG_RL(PC_LOG_WARN, LOG_MOD,
					  "%s: post_send: %s", ch->p->name,
					  strerror(ret));
				chan_teardown(ch, TD_RETRY, -EIO);
			}
			return;
		}
	}
}

/*
 * The rail o goes on: a batch is spread over the rails this node and the
 * peer share, operation i on rail i % n (as the original); a rail held
 * after a failed connect is skipped, and an operation sent again moves on
 * to the next rail.
 */
static unsigned op_rail(struct tp_client *tc, const struct rop *o)
{
	const struct tp_peer *p = o->p;
	unsigned n = PC_MIN(tc->tn->nrails, p->nrails);
	if (n <= 1)
		return 0;
	unsigned i = (unsigned)(o - o->b->ops) + o->moves + o->retried;
	uint64_t now = rx_now_ns(tc->r);
	for (unsigned t = 0; t < n; t++) {
		unsigned k = (i + t) % n;
		if (k == 0 || p->rail_hold[k] <= now)
			return k;
	}
	return 0;
}

/* The least-loaded channel of p (on rail, or on any if rail < 0); *load
 * and *count (of that rail's channels) set. */
static struct rchan *chan_least(struct tp_peer *p, int rail, unsigned *load,
				unsigned *count)
{
	struct rchan *best = NULL;
	*load = UINT32_MAX;
	*count = 0;
	for (struct rchan *ch = p->chans; ch; ch = ch->next) {
		if (rail >= 0 && ch->rail != (unsigned)rail)
			continue;
		(*count)++;
		unsigned l = ch->nfifo + ch->nwait;
		if (l < *load) {
			*load = l;
			best = ch;
		}
	}
	return best;
}

/* Put o on the least-loaded channel of its rail to its peer (a new one
 * while every channel has work, the cap per rail allows and may_open; a
 * channel on another rail if its rail has none), or end it with the
 * reason. */
static void op_place(struct tp_client *tc, struct rop *o, bool may_open)
{
	struct tp_peer *p = o->p;
	unsigned rail = op_rail(tc, o), load, nr;
	struct rchan *best = chan_least(p, (int)rail, &load, &nr);
	if ((!best || load > 0) && nr < cfg_chans(tc->tn) && may_open) {
		int err = 0;
		struct rchan *ch = chan_open(tc, p, rail, &err);
		if (ch) {
			best = ch;
		} else if (!best && rail) {
			/* This rail cannot be used now: the next one. */
			p->rail_hold[rail] = rx_now_ns(tc->r) +
					     RX_MS(RAIL_HOLD_MS);
			op_place(tc, o, may_open);
			return;
		} else if (!best) {
			p->last_err = err;
			op_end(o, err);
			return;
		}
	}
	if (!best)
		best = chan_least(p, -1, &load, &nr);
	if (!best) {
		op_end(o, p->last_err ? p->last_err : -ECONNREFUSED);
		return;
	}
	o->ch = best;
	o->next = NULL;
	if (best->wq_tail)
		best->wq_tail->next = o;
	else
		best->wq = o;
	best->wq_tail = o;
	best->nwait++;
	if (best->state == CH_READY)
		chan_pump(best);
}

/* ---------------------------------------------------------- completions */

static int wc_errno(enum ibv_wc_status st)
{
	switch (st) {
	case IBV_WC_REM_ACCESS_ERR:
		return -EFAULT;
	case IBV_WC_LOC_PROT_ERR:
	case IBV_WC_LOC_LEN_ERR:
	case IBV_WC_REM_INV_REQ_ERR:
		return -EINVAL;
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR:
		return -EHOSTDOWN;
	case IBV_WC_WR_FLUSH_ERR:
		return -ECONNRESET;
	default:
		return -EIO;
	}
}

static void chan_wc(struct rchan *ch, const struct ibv_wc *wc)
{
	struct tp_node *tn = ch->tc->tn;
	unsigned sq = cfg_sq(tn);
	if (ch->state != CH_READY)
		return;
	/* Every operation posted before wc's completed (in order). */
	while (ch->nfifo && ch->fifo[ch->head]->seq < wc->wr_id) {
		struct rop *o = ch->fifo[ch->head];
		ch->head = (ch->head + 1) % sq;
		ch->nfifo--;
		o->ch = NULL;
		o->posted = false;
		op_end(o, 0);
	}
	if (!ch->nfifo || ch->fifo[ch->head]->seq != wc->wr_id)
		return; /* not ours (stale): ignore */
	struct rop *o = ch->fifo[ch->head];
	if (wc->status == IBV_WC_SUCCESS) {
		ch->head = (ch->head + 1) % sq;
		ch->nfifo--;
		o->ch = NULL;
		o->posted = false;
		op_end(o, 0);
		ch->p->up = true;
		ch->p->last_err = 0;
		chan_pump(ch);
		return;
	}
	STAT_ADD(tn, wc_errors, 1);
	int err = wc_errno(wc->status);
	if (err == -EHOSTDOWN && ch->rail) {
		/* Nothing answers on this rail (its NIC or path is down):
		 * its operations, this one too, go on the other rails. */
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: rail %u does not answer "
			  "(%s); its operations go on the other rails for %u "
			  "ms", ch->p->name, ch->rail,
			  ibv_wc_status_str(wc->status), RAIL_HOLD_MS);
		ch->p->rail_hold[ch->rail] = rx_now_ns(ch->tc->r) +
					     RX_MS(RAIL_HOLD_MS);
		chan_teardown(ch, TD_RETRY, -ECONNRESET);
		return;
	}
	if (wc->status != IBV_WC_WR_FLUSH_ERR) {
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: %s of %u bytes failed: %s",
			  ch->p->name, o->write ? "write" : "read", o->len,
			  ibv_wc_status_str(wc->status));
		ch->head = (ch->head + 1) % sq;
		ch->nfifo--;
		o->ch = NULL;
		o->posted = false;
		op_end(o, err);
	}
	if (err == -EHOSTDOWN) {
		ch->p->up = false;
		ch->p->last_err = err;
		/* The peer does not answer: the rest of its work too. */
		peer_fail(ch->tc, ch->p, err);
		return;
	}
	/* A flush first: the QP went to error with none of its operations
	 * failing (the peer disconnected it); else one failed. */
	chan_teardown(ch, wc->status == IBV_WC_WR_FLUSH_ERR ? TD_PEER
							    : TD_RETRY,
		      -ECONNRESET);
}

static void chan_drain(struct rchan *ch)
{
	struct tp_node *tn = ch->tc->tn;
	struct ibv_wc wc[16];
	while (ch->state == CH_READY && ch->cq) {
		int n = tn->api->poll_cq(ch->cq, 16, wc);
		if (n < 0) {
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: poll_cq failed",
				  ch->p->name);
			chan_teardown(ch, TD_RETRY, -EIO);
			return;
		}
		for (int i = 0; i < n; i++)
			chan_wc(ch, &wc[i]);
		if (n < 16)
			return;
	}
}

/* The completion channel: get each event, ack it, re-arm, then drain (a
 * completion after the re-arm makes a new event: none is lost). */
static void on_cq_event(struct rx_watch *w, uint32_t revents, void *arg)
{
	const struct ccw *cw = arg;
	struct tp_client *tc = cw->tc;
	struct tp_node *tn = tc->tn;
	(void)w;
	(void)revents;
	for (;;) {
		struct ibv_cq *cq;
		void *ctx;
		if (tn->api->get_cq_event(tc->cch[cw->dev], &cq, &ctx))
			return;
		STAT_ADD(tn, cq_events, 1);
		tn->api->ack_cq_events(cq, 1);
		struct rchan *ch = ctx;
		if (ch->state != CH_READY || ch->cq != cq)
			continue;
		if (tn->api->req_notify_cq(cq, 0)) {
			chan_teardown(ch, TD_RETRY, -EIO);
			continue;
		}
		chan_drain(ch);
	}
}

/* ------------------------------------------------------ stuck channels */

/*
 * cfg.op_timeout_ms: a channel whose oldest posted WR has not completed
 * within it is stuck (a black-holed QP: nothing answers, and no error
 * comes before the QP's retries run out, seconds on hardware). One timer
 * per client sweeps the channels every quarter of the timeout while any
 * of them holds posted work. Posting times grow along a channel's fifo,
 * so its head is the one to look at: an operation costs one store of the
 * reactor's cached clock and no timer of its own (a timer per channel
 * would be re-armed on every completion). An operation is found late 1 to
 * 1.25 timeouts after it was posted. A stuck channel is torn down like
 * one with a failed completion (TD_RETRY): its QP is destroyed at once,
 * its operations are posted once more on another channel, and one that
 * was already retried ends with -ETIMEDOUT.
 */
static void sweep_arm(struct tp_client *tc)
{
	uint64_t ns = RX_MS(tc->tn->cfg.op_timeout_ms) / 4;
	if (!ns || tc->stopping || rx_timer_armed(&tc->sweep))
		return;
	rx_timer_start(tc->r, &tc->sweep, PC_MAX(ns, RX_MS(1)), 0);
}

/* A channel of p whose oldest posted WR is older than limit, or NULL;
 * *busy becomes true if one holds posted work. */
static struct rchan *chan_stuck(struct tp_peer *p, uint64_t now,
				uint64_t limit, bool *busy)
{
	for (struct rchan *ch = p->chans; ch; ch = ch->next) {
		if (ch->state != CH_READY || !ch->nfifo)
			continue;
		*busy = true;
		if (now - ch->fifo[ch->head]->posted_ns >= limit)
			return ch;
	}
	return NULL;
}

static void op_sweep(struct rx_reactor *r, struct rx_timer *t)
{
	struct tp_client *tc = t->arg;
	struct tp_node *tn = tc->tn;
	uint64_t now = rx_now_ns(r), limit = RX_MS(tn->cfg.op_timeout_ms);
	bool busy = false;
	for (struct tp_peer *p = tc->peers; p; p = p->next) {
		struct rchan *ch;
		/* A teardown changes p's channels (a retry may open one):
		 * look again from the start. */
		while ((ch = chan_stuck(p, now, limit, &busy))) {
			const struct rop *o = ch->fifo[ch->head];
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: an RDMA %s of %u "
				  "bytes posted %llu ms ago has not completed "
				  "(rdma_op_timeout_ms %u); closing its channel",
				  p->name, o->write ? "write" : "read", o->len,
				  (unsigned long long)((now - o->posted_ns) /
						       RX_MS(1)),
				  tn->cfg.op_timeout_ms);
			STAT_ADD(tn, op_timeouts, 1);
			p->last_err = -ETIMEDOUT;
			chan_teardown(ch, TD_RETRY, -ETIMEDOUT);
		}
	}
	if (busy)
		sweep_arm(tc);
}

/* ------------------------------------------------------ rdma_cm (client) */

static int chan_connect(struct rchan *ch)
{
	struct tp_client *tc = ch->tc;
	struct tp_node *tn = tc->tn;
	int dev = tp_rdma_rail_of(tn, ch->id->verbs);
	if (dev < 0) {
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: reached through another "
			  "RDMA device than this node's; not supported",
			  ch->p->name);
		return -ENODEV;
	}
	ch->dev = (unsigned)dev;
	struct rail *rl = &tn->rails[dev];
	ch->cq = tn->api->create_cq(rl->ctx, (int)cfg_sq(tn) + 1, ch,
				    tc->cch[dev], 0);
	if (!ch->cq)
		return neg_errno(-ENOMEM);
	if (tn->api->req_notify_cq(ch->cq, 0))
		return -EIO;
	struct ibv_qp_init_attr qa;
	memset(&qa, 0, sizeof(qa));
	qa.send_cq = ch->cq;
	qa.recv_cq = ch->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = cfg_sq(tn);
	qa.cap.max_recv_wr = 1;
	qa.cap.max_send_sge = 2;
	qa.cap.max_recv_sge = 1;
	qa.sq_sig_all = 0;
	if (tn->api->create_qp(ch->id, rl->pd, &qa))
		return neg_errno(-ENOMEM);
	hello_make(ch);
	struct rdma_conn_param cp;
	memset(&cp, 0, sizeof(cp));
	cp.private_data = &ch->hi;
	cp.private_data_len = sizeof(ch->hi);
	cp.initiator_depth = (uint8_t)cfg_rd(tn);
	cp.responder_resources = 0;
	cp.retry_count = 7;
	cp.rnr_retry_count = 7;
	if (tn->api->connect(ch->id, &cp))
		return neg_errno(-ECONNREFUSED);
	return 0;
}

/*
 * The rails a node's accept lists after its keys (len bytes at t): p's
 * rail k > 0 is at those addresses, with p's port unless the list names
 * one. Nothing (zeros, an older node): one rail. Only rail 0's accepts
 * say it (the address dialed is rail 0).
 */
static void peer_rails(struct tp_peer *p, const uint8_t *t, size_t len)
{
	struct rails_tail h;
	p->nrails = 1; /* until the list says more (a node restarted with
			* fewer rails lists fewer) */
	if (len < sizeof(h))
		return;
	memcpy(&h, t, sizeof(h));
	size_t alen = h.v6 ? 16 : 4;
	unsigned n = PC_MIN(h.n, RAILS_MAX - 1);
	if (!h.n || len - sizeof(h) < n * alen)
		return;
	for (unsigned k = 0; k < n; k++) {
		struct sockaddr_storage *ss = &p->rsa[k + 1];
		memset(ss, 0, sizeof(*ss));
		const uint8_t *a = t + sizeof(h) + k * alen;
		if (h.v6) {
			struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
			in6->sin6_family = AF_INET6;
			memcpy(&in6->sin6_addr, a, 16);
			in6->sin6_port = h.port;
		} else {
			struct sockaddr_in *in = (struct sockaddr_in *)ss;
			in->sin_family = AF_INET;
			memcpy(&in->sin_addr, a, 4);
			in->sin_port = h.port;
		}
	}
	p->nrails = n + 1;
}

/* The node's answer: its proof over what we sent, when we have a secret,
 * and its key table for the rail (kept in ch). */
static int welcome_check(struct rchan *ch, const struct rdma_cm_event *ev)
{
	struct tp_node *tn = ch->tc->tn;
	const struct welcome *w = ev->param.conn.private_data;
	size_t len = w ? ev->param.conn.private_data_len : 0;
	if (len < WELCOME_HDR + sizeof(w->nkeys) || w->magic != HELLO_MAGIC)
		return tn->secret ? -EACCES : -EPROTO;
	if (tn->secret) {
		uint8_t want[PC_SHA256_BYTES];
		char at[80];
		tp_rdma_sa_text((const struct sockaddr *)&ch->dst, at, sizeof(at));
		tp_rdma_proof(tn->secret, true, ch->hi.ts_ms, ch->hi.nonce, at,
			 want);
		if (!pc_ct_equal(want, w->proof, sizeof(want)))
			return -EACCES;
	}
	uint32_t n = w->nkeys;
	size_t klen = n * sizeof(struct rkpair);
	size_t body = len - (WELCOME_HDR + sizeof(w->nkeys));
	if (n > TP_REGIONS_MAX || body < klen)
		return -EPROTO;
	memcpy(ch->keys, w->body, klen);
	ch->nkeys = n;
	if (ch->rail == 0)
		peer_rails(ch->p, w->body + klen, body - klen);
	return 0;
}

static int reject_reason(const struct rdma_cm_event *ev)
{
	const struct welcome *w = ev->param.conn.private_data;
	if (w && ev->param.conn.private_data_len >= 8 &&
	    w->magic == HELLO_MAGIC && w->err < 0)
		return w->err;
	return -ECONNREFUSED;
}

static void chan_cm_event(struct rchan *ch, const struct rdma_cm_event *ev)
{
	struct tp_node *tn = ch->tc->tn;
	if (ch->state == CH_DEAD)
		return;
	int err = 0;
	switch (ev->event) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		ch->state = CH_ROUTE;
		if (tn->api->resolve_route(ch->id, cfg_ctimeout(tn)))
			err = neg_errno(-EHOSTUNREACH);
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		ch->state = CH_CONN;
		err = chan_connect(ch);
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		err = welcome_check(ch, ev);
		if (err) {
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: %s; closing",
				  ch->p->name, err == -EACCES
				  ? "the node did not prove the cluster secret"
				  : "the node's accept has no valid key table");
			break;
		}
		rx_timer_stop(ch->tc->r, &ch->timer);
		ch->state = CH_READY;
		ch->p->up = true;
		ch->p->last_err = 0;
		chan_pump(ch);
		return;
	case RDMA_CM_EVENT_REJECTED:
		err = reject_reason(ev);
		/* No answer of ours: nobody listens (IB CM reason 8,
		 * invalid service id), or the node is not a PeerCache. */
		PC_LOG_RL(PC_LOG_INFO, LOG_MOD, "%s: RDMA connect refused "
			  "(%s, reject reason %d)", ch->p->name,
			  strerror(-err), ev->status);
		break;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_CONNECT_ERROR:
		err = -EHOSTUNREACH;
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		chan_teardown(ch, TD_PEER, -ECONNRESET);
		return;
	default:
		return;
	}
	if (err) {
		STAT_ADD(tn, chans_failed, 1);
		ch->p->last_err = err;
		if (!ch->p->up || ch->p->nchans <= 1)
			ch->p->up = false;
		chan_teardown(ch, TD_CONNFAIL, err);
	}
}

static void on_cm_event(struct rx_watch *w, uint32_t revents, void *arg)
{
	struct tp_client *tc = arg;
	const struct rv_api *api = tc->tn->api;
	(void)w;
	(void)revents;
	struct rdma_cm_event *ev;
	while (api->get_cm_event(tc->ech, &ev) == 0) {
		struct rchan *ch = ev->id ? ev->id->context : NULL;
		if (ch)
			chan_cm_event(ch, ev);
		api->ack_cm_event(ev);
	}
}

/* ------------------------------------------------------------- client */

struct tp_client *tp_rdma_client_new(struct tp_node *tn, struct rx_reactor *r,
				     int *err)
{
	const struct rv_api *api = tn->api;
	struct tp_client *tc = calloc(1, sizeof(*tc));
	if (!tc) {
		*err = -ENOMEM;
		return NULL;
	}
	tc->tn = tn;
	tc->r = r;
	rx_timer_init(&tc->reaper, chan_reap, tc);
	rx_timer_init(&tc->sweep, op_sweep, tc);
	int ret = 0;
	for (unsigned k = 0; !ret && k < tn->nrails; k++) {
		tc->ccw[k] = (struct ccw){tc, k};
		if (!(tc->cch[k] = api->create_comp_channel(tn->rails[k].ctx)))
			ret = neg_errno(-ENOMEM);
		if (!ret)
			ret = set_nonblock(tc->cch[k]->fd);
		if (!ret)
			tc->cw[k] = rx_watch_fd(r, tc->cch[k]->fd, POLLIN,
						on_cq_event, &tc->ccw[k], &ret);
	}
	if (!ret && !(tc->ech = api->create_event_channel()))
		ret = neg_errno(-ENODEV);
	if (!ret)
		ret = set_nonblock(tc->ech->fd);
	if (!ret)
		tc->ew = rx_watch_fd(r, tc->ech->fd, POLLIN, on_cm_event, tc,
				     &ret);
	tn->clients++;
	if (ret < 0) {
		tp_rdma_client_free(tc);
		*err = ret;
		return NULL;
	}
	return tc;
}

/* Stop watching the client's channels (the loop must not wait for them). */
static void client_unwatch(struct tp_client *tc)
{
	for (unsigned k = 0; k < RAILS_MAX; k++)
		if (tc->cw[k]) {
			rx_watch_cancel(tc->cw[k]);
			tc->cw[k] = NULL;
		}
	if (tc->ew)
		rx_watch_cancel(tc->ew);
	tc->ew = NULL;
}

void tp_rdma_client_stop(struct tp_client *tc)
{
	tc->stopping = true;
	for (struct tp_peer *p = tc->peers; p; p = p->next)
		peer_fail(tc, p, -ESHUTDOWN);
	rx_timer_stop(tc->r, &tc->sweep);
	/* Nothing needs the channels' events any more. */
	client_unwatch(tc);
}

void tp_rdma_client_free(struct tp_client *tc)
{
	const struct rv_api *api = tc->tn->api;
	PC_ASSERT(tc->batches == NULL);
	tc->stopping = true;
	for (struct tp_peer *p = tc->peers; p; p = p->next)
		peer_fail(tc, p, -ESHUTDOWN);
	rx_timer_stop(tc->r, &tc->reaper);
	rx_timer_stop(tc->r, &tc->sweep);
	client_unwatch(tc);
	/* Ack what is queued so that no id waits on an event. */
	struct rdma_cm_event *ev;
	while (tc->ech && api->get_cm_event(tc->ech, &ev) == 0)
		api->ack_cm_event(ev);
	for (unsigned k = 0; k < RAILS_MAX; k++) {
		struct ibv_cq *cq;
		void *ctx;
		while (tc->cch[k] &&
		       api->get_cq_event(tc->cch[k], &cq, &ctx) == 0)
			api->ack_cq_events(cq, 1);
	}
	chan_reap(tc->r, &tc->reaper);
	while (tc->peers) {
		struct tp_peer *p = tc->peers;
		tc->peers = p->next;
		free(p);
	}
	if (tc->ech)
		api->destroy_event_channel(tc->ech);
	for (unsigned k = 0; k < RAILS_MAX; k++)
		if (tc->cch[k])
			api->destroy_comp_channel(tc->cch[k]);
	tc->tn->clients--;
	free(tc);
}

/* ------------------------------------------------------------- tp_ops */

static int batch_start(struct tp_client *tc, bool write, void *opsv,
		       unsigned n, unsigned timeout_ms, tp_done_fn rdone,
		       tp_wdone_fn wdone, void *arg)
{
	if (n == 0)
		return -EINVAL;
	struct rbatch *b = calloc(1, sizeof(*b) + n * sizeof(b->ops[0]));
	if (!b)
		return -ENOMEM;
	b->tc = tc;
	tp_bcore_link(&b->c, &tc->batches, write, opsv, n, arg, batch_fire);
	b->c.rdone = rdone;
	b->c.wdone = wdone;
	/* The timer first: an operation that ends at once re-arms it. */
	rx_timer_start(tc->r, &b->c.timer, RX_MS(timeout_ms), 0);
	for (unsigned i = 0; i < n; i++) {
		struct tp_io io;
		tp_bcore_io(&b->c, i, &io);
		struct rop *o = &b->ops[i];
		*o = (struct rop){.b = b, .write = write, .key = io.rkey,
				  .addr = io.addr, .len = io.len,
				  .hdr_len = io.hdr_len, .hdr = io.hdr,
				  .buf = io.buf, .res = io.res, .lk_dev = -1};
		int err = tp_io_check(io.len, io.hdr_len, io.hdr, io.buf);
		if (!err && tc->stopping)
			err = -ESHUTDOWN;
		if (!err) {
			o->p = io.ph ? io.ph : peer_get(tc, io.peer, io.node);
			if (!o->p)
				err = -ENOMEM;
		}
		/* The lkeys of the rail it will go on are found when it is
		 * posted (chan_pump); rail 0's now, as most go there and a
		 * buffer that cannot be registered fails before placing. */
		if (!err)
			err = op_lkeys(o, 0);
		if (err) {
			o->p = NULL;
			op_end(o, err);
			continue;
		}
		o->p->inflight++;
		op_place(tc, o, true);
	}
	return 0;
}

static int rdma_read_batch(struct tp_client *tc, struct tp_read *reads,
			   unsigned n, unsigned timeout_ms, tp_done_fn done,
			   void *arg)
{
	return batch_start(tc, false, reads, n, timeout_ms, done, NULL, arg);
}

static int rdma_write_batch(struct tp_client *tc, struct tp_write *writes,
			    unsigned n, unsigned timeout_ms, tp_wdone_fn done,
			    void *arg)
{
	return batch_start(tc, true, writes, n, timeout_ms, NULL, done, arg);
}

static int rdma_cancel(struct tp_client *tc, void *arg)
{
	int count = 0;
	for (struct tp_bcore *bc = tc->batches; bc; bc = bc->next) {
		if (bc->arg != arg || bc->cancelled || !bc->left)
			continue;
		bc->cancelled = true;
		count++;
		batch_abort((struct rbatch *)bc, -ECANCELED);
	}
	return count;
}

static int rdma_peer_open(struct tp_client *tc, const char *endpoint,
			  const char *node, struct tp_peer **out)
{
	if (!*endpoint)
		return -EINVAL;
	struct tp_peer *p = peer_get(tc, endpoint, node);
	if (!p)
		return -ENOMEM;
	if (p->sa_err)
		return p->sa_err;
	p->refs++;
	*out = p;
	return 0;
}

static int rdma_peer_health(struct tp_client *tc, struct tp_peer *p,
			    struct tp_peer_info *out)
{
	(void)tc;
	struct tp_peer_info i = {TP_PEER_IDLE, p->last_err, p->nchans,
				 p->inflight, p->refs};
	bool ready = false;
	for (struct rchan *ch = p->chans; ch; ch = ch->next)
		ready |= ch->state == CH_READY;
	if (ready || p->up)
		i.state = TP_PEER_UP;
	else if (p->last_err)
		i.state = TP_PEER_FAILED;
	if (out)
		*out = i;
	return i.state;
}

static void rdma_peer_close(struct tp_client *tc, struct tp_peer *p, int err)
{
	PC_ASSERT(p->refs > 0);
	p->refs--;
	peer_fail(tc, p, err ? err : -EHOSTDOWN);
}

static void rdma_fail_node(struct tp_client *tc, const char *node, int err)
{
	for (struct tp_peer *p = tc->peers; p; p = p->next)
		if (strcmp(p->node, node) == 0)
			peer_fail(tc, p, err);
}

const struct tp_ops tp_rdma_ops = {
	.name = "rdma",
	.reg_region = tp_rdma_reg_region,
	.dereg_region = tp_rdma_dereg_region,
	.reg_local = tp_rdma_reg_local,
	.unreg_local = tp_rdma_unreg_local,
	.read_batch = rdma_read_batch,
	.write_batch = rdma_write_batch,
	.cancel = rdma_cancel,
	.peer_open = rdma_peer_open,
	.peer_health = rdma_peer_health,
	.peer_close = rdma_peer_close,
	.fail_node = rdma_fail_node,
	.revoke = tp_rdma_revoke,
};
