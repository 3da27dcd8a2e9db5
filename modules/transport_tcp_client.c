/*
 * modules/transport_tcp_client.c — the initiator side of the TCP transport:
 * read and write batches over pipelined channels to peers' data ports.
 *
 * Owns: one struct tp_client per reactor, its peers (handles), channels and
 * live batches. Threading: everything here runs on the client's reactor.
 *
 * A batch is spread over up to max_channels_per_peer channels per peer (the
 * least-loaded channel, or a new one while under the cap); a channel
 * pipelines requests in order and receives each response header and then
 * the payload straight into the reader's buffers (rx_conn_read2: no copy).
 * A write's payload is copied into the channel's send queue (one copy), so
 * the caller's source is free once the batch is done.
 *
 * Completion rules (transport.h): a batch's done runs once, from the
 * reactor, when no operation of it can still touch the caller's buffers.
 * - timeout: the channels holding one of its operations are closed first;
 * - cancel: operations not yet sent are dropped; sent ones become "ghosts"
 *   whose response is read into a scratch buffer and thrown away (the
 *   channel stays usable); one whose payload is arriving at that moment
 *   has its channel closed. Ghosts keep the batch's memory (not the
 *   caller's) until their response came or their channel closed;
 * - peer_close / fail_node / a channel error: the peer's channels close and
 *   their operations fail with that error; when the reactor stops, every
 *   channel is closed at once and later batches fail with -ESHUTDOWN.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/auth.h"
#include "common/endpoint.h"
#include "common/log.h"
#include "common/util.h"
#include "modules/transport_tcp.h"
#include "modules/transport_wire.h"

#define LOG_MOD "transport"
#define SCRATCH_BYTES (64u * 1024)

struct tp_batch;

/* One operation of a batch, as a channel carries it. */
struct tp_pending {
	struct tp_batch *b;
	struct tp_pending *next; /* on its channel, in order */
	uint64_t id;
	uint16_t op;             /* TP_OP_READ, TP_OP_READ_SEL, TP_OP_WRITE */
	uint32_t rkey;
	uint64_t addr;
	uint32_t len;
	uint8_t *hdr;            /* read: lands here; write: sent from here */
	uint32_t hdr_len;
	uint8_t *buf;
	int *res;
	uint32_t *got;           /* reads: the extent that landed */
	bool *narrowed;
	struct tp_read *rd;      /* reads: the caller's (its landed hook) */
	uint32_t rlen;           /* the answer's bytes */
	bool rnarrowed;          /* the answer is the region's selection */
	uint8_t sel[TP_SEL_BYTES]; /* a READ_SEL's selector */
	bool sent;               /* its request is in the send queue */
	bool fin;                /* reported to the batch */
	bool ghost;              /* cancelled after sending: answer dropped */
};

struct tp_batch {
	struct tp_bcore c;            /* first: the list holds &c */
	struct tp_client *tc;
	unsigned ghosts;              /* pendings still on channels */
	bool finished;                /* done ran */
	struct tp_pending pend[];
};
_Static_assert(offsetof(struct tp_batch, c) == 0, "a batch is its core");

enum chan_state { CH_CONNECTING, CH_AUTH, CH_READY, CH_DEAD };

struct tp_chan {
	struct tp_peer *peer;
	struct rx_conn *c;
	enum chan_state state;
	struct tp_pending *head, *tail;   /* in flight, in order */
	struct tp_pending *unsent;        /* first not yet sent */
	unsigned inflight;
	bool receiving;
	bool in_payload;                  /* head's payload is arriving */
	uint64_t discard_left;            /* of a ghost's payload */
	uint8_t *scratch;                 /* where dropped payloads go */
	uint8_t resp[TP_RESP_BYTES];
	uint8_t auth_buf[PC_AUTH_PROOF_BYTES];
	uint8_t cnonce[PC_AUTH_NONCE_BYTES];
	uint8_t server_proof[PC_AUTH_PROOF_BYTES];
	int auth_step;
	struct tp_chan *next;
};

struct tp_peer {
	char name[160];
	char node[160];              /* ring id, when an operation named it */
	struct sockaddr_storage addr;
	socklen_t addrlen;
	int resolve_err;
	int last_err;                /* the last channel failure */
	unsigned refs;               /* peer_open handles */
	struct tp_chan *chans;
	unsigned nchans;
	struct tp_client *tc;
	struct tp_peer *next;
};

struct tp_client {
	struct rx_reactor *r;
	const struct tp_tcpc_cfg *cfg;
	struct tp_peer *peers;
	struct tp_bcore *batches;     /* live (done not yet run) */
	uint64_t next_id;
};

/* ------------------------------------------------------------- batches */

static void batch_free_maybe(struct tp_batch *b)
{
	if (b->finished && b->ghosts == 0)
		free(b);
}

static void batch_finish(struct tp_batch *b)
{
	b->finished = true;
	tp_bcore_deliver(&b->c, &b->tc->batches, b->tc->r);
	batch_free_maybe(b);
}

/* Report p to its batch (once). */
static void pending_done(struct tp_pending *p, int res)
{
	struct tp_batch *b = p->b;
	const struct tp_tcpc_cfg *cfg = b->tc->cfg;
	if (p->fin)
		return;
	p->fin = true;
	res = tp_bcore_res(&b->c, res);
	*p->res = res;
	bool w = p->op == TP_OP_WRITE;
	if (res == 0) {
		met_inc(w ? cfg->writes : cfg->reads);
		met_add(w ? cfg->write_bytes : cfg->read_bytes,
			w ? p->len : p->rlen);
		if (!w) {
			*p->got = p->rlen;
			*p->narrowed = p->rnarrowed;
			tp_read_landed(p->rd); /* its bytes are hot now */
		}
	} else {
		met_inc(w ? cfg->write_errors : cfg->read_errors);
	}
	if (--b->c.left == 0)
		batch_finish(b);
}

/* p left its channel: report it, or, for a ghost, let its batch go. */
static void pending_unlinked(struct tp_pending *p, int res)
{
	if (p->ghost) {
		p->b->ghosts--;
		batch_free_maybe(p->b);
		return;
	}
	pending_done(p, res);
}

/* ------------------------------------------------------------ channels */

static void chan_send(struct tp_chan *ch)
{
	for (struct tp_pending *p = ch->unsent; p; p = p->next) {
		struct tp_req q = {p->op, 0, p->rkey, p->len, p->addr, p->id};
		uint8_t w[TP_REQ_BYTES];
		tp_wire_req_encode(&q, w);
		rx_conn_write(ch->c, w, sizeof(w));
		if (p->op == TP_OP_READ_SEL)
			rx_conn_write(ch->c, p->sel, sizeof(p->sel));
		if (p->op == TP_OP_WRITE) {
			if (p->hdr_len)
				rx_conn_write(ch->c, p->hdr, p->hdr_len);
			if (p->len > p->hdr_len)
				rx_conn_write(ch->c, p->buf,
					      p->len - p->hdr_len);
		}
		p->sent = true;
	}
	ch->unsent = NULL;
}

static void chan_recv_next(struct tp_chan *ch);

static struct tp_pending *chan_pop(struct tp_chan *ch)
{
	struct tp_pending *p = ch->head;
	ch->head = p->next;
	if (!ch->head)
		ch->tail = NULL;
	if (ch->unsent == p)
		ch->unsent = p->next;
	ch->inflight--;
	p->next = NULL;
	return p;
}

static void chan_fail_all(struct tp_chan *ch, int err)
{
	while (ch->head)
		pending_unlinked(chan_pop(ch), err);
	ch->unsent = NULL;
}

static void got_payload(struct rx_conn *c, ssize_t res, void *arg)
{
	struct tp_chan *ch = arg;
	(void)c;
	ch->receiving = false;
	ch->in_payload = false;
	if (res < 0)
		return; /* the close fails everything in on_close */
	pending_unlinked(chan_pop(ch), 0);
	chan_recv_next(ch);
}

/* A ghost's payload: read into scratch and dropped, a slice at a time. */
static void got_discard(struct rx_conn *c, ssize_t res, void *arg)
{
	struct tp_chan *ch = arg;
	ch->receiving = false;
	if (res < 0)
		return;
	ch->discard_left -= (uint64_t)res;
	if (ch->discard_left) {
		ch->receiving = true;
		if (rx_conn_read(c, ch->scratch,
				 PC_MIN(ch->discard_left, SCRATCH_BYTES),
				 got_discard, ch) < 0) {
			ch->receiving = false;
			rx_conn_close(c, RX_CLOSE_NOW, -EIO);
		}
		return;
	}
	pending_unlinked(chan_pop(ch), -ECANCELED);
	chan_recv_next(ch);
}

static void got_header(struct rx_conn *c, ssize_t res, void *arg)
{
	struct tp_chan *ch = arg;
	ch->receiving = false;
	if (res < 0)
		return;
	struct tp_pending *p = ch->head;
	struct tp_resp r;
	bool reads = p && p->op != TP_OP_WRITE;
	uint64_t want = reads ? p->len : 0;
	/* A whole range is exactly what was asked; a selection (READ_SEL
	 * only) is at most that. */
	if (tp_wire_resp_decode(ch->resp, &r) < 0 || !p || r.id != p->id ||
	    (r.status == 0 && r.len != want) ||
	    (r.status == TP_STATUS_SELECTED &&
	     (p->op != TP_OP_READ_SEL || r.len > want))) {
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: bad data response; "
			  "closing the channel", ch->peer->name);
		rx_conn_close(c, RX_CLOSE_NOW, -EPROTO);
		return;
	}
	p->rlen = (uint32_t)r.len;
	p->rnarrowed = r.status == TP_STATUS_SELECTED;
	if (r.status < 0 || r.len == 0) {
		pending_unlinked(chan_pop(ch), r.status < 0 ? r.status : 0);
		chan_recv_next(ch);
		return;
	}
	int ret;
	ch->receiving = true;
	if (p->ghost) {
		if (!ch->scratch && !(ch->scratch = malloc(SCRATCH_BYTES))) {
			ch->receiving = false;
			rx_conn_close(c, RX_CLOSE_NOW, -ENOMEM);
			return;
		}
		ch->discard_left = r.len;
		ret = rx_conn_read(c, ch->scratch, PC_MIN(r.len, SCRATCH_BYTES),
				   got_discard, ch);
	} else {
		/* Split reads: the leading hdr_len bytes to hdr, the rest to
		 * buf, in one receive. */
		ch->in_payload = true;
		uint32_t n = p->rlen; /* the whole range, or a selection */
		ret = p->hdr_len && n > p->hdr_len
			      ? rx_conn_read2(c, p->hdr, p->hdr_len, p->buf,
					      n - p->hdr_len, got_payload, ch)
			      : rx_conn_read(c, p->hdr_len ? p->hdr : p->buf,
					     n, got_payload, ch);
	}
	if (ret < 0) {
		ch->receiving = false;
		ch->in_payload = false;
		rx_conn_close(c, RX_CLOSE_NOW, -EIO);
	}
}

static void chan_recv_next(struct tp_chan *ch)
{
	if (ch->receiving || !ch->head || ch->state != CH_READY || !ch->c)
		return;
	ch->receiving = true;
	if (rx_conn_read(ch->c, ch->resp, sizeof(ch->resp), got_header,
			 ch) < 0) {
		ch->receiving = false;
		rx_conn_close(ch->c, RX_CLOSE_NOW, -EIO);
	}
}

static void chan_ready(struct tp_chan *ch)
{
	ch->state = CH_READY;
	ch->peer->last_err = 0;
	chan_send(ch);
	chan_recv_next(ch);
}

/* Authentication on a channel: challenge, then response (common/auth.h). */
static void auth_step(struct rx_conn *c, ssize_t res, void *arg);

static void auth_send(struct tp_chan *ch, uint16_t op, const void *payload,
		      uint32_t len)
{
	struct tp_req q = {op, 0, 0, len, 0, 0};
	uint8_t w[TP_REQ_BYTES];
	tp_wire_req_encode(&q, w);
	rx_conn_write(ch->c, w, sizeof(w));
	if (len)
		rx_conn_write(ch->c, payload, len);
	ch->receiving = true;
	if (rx_conn_read(ch->c, ch->resp, sizeof(ch->resp), auth_step, ch) < 0)
		rx_conn_close(ch->c, RX_CLOSE_NOW, -EIO);
}

static void auth_step(struct rx_conn *c, ssize_t res, void *arg)
{
	struct tp_chan *ch = arg;
	const char *secret = ch->peer->tc->cfg->secret;
	ch->receiving = false;
	if (res < 0)
		return;
	if (res == (ssize_t)sizeof(ch->resp)) { /* a header */
		struct tp_resp r;
		if (tp_wire_resp_decode(ch->resp, &r) < 0 || r.status < 0 ||
		    r.len != (ch->auth_step == 0 ? PC_AUTH_NONCE_BYTES
						 : PC_AUTH_PROOF_BYTES)) {
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: data-port "
				  "authentication refused", ch->peer->name);
			rx_conn_close(c, RX_CLOSE_NOW, -EACCES);
			return;
		}
		ch->receiving = true;
		if (rx_conn_read(c, ch->auth_buf, r.len, auth_step, ch) < 0)
			rx_conn_close(c, RX_CLOSE_NOW, -EIO);
		return;
	}
	if (ch->auth_step++ == 0) {
		/* auth_buf holds the node's nonce: answer it. */
		uint8_t msg[PC_AUTH_PROOF_BYTES + PC_AUTH_NONCE_BYTES];
		uint8_t snonce[PC_AUTH_NONCE_BYTES];
		memcpy(snonce, ch->auth_buf, sizeof(snonce));
		if (pc_random_bytes(ch->cnonce, sizeof(ch->cnonce)) < 0) {
			rx_conn_close(c, RX_CLOSE_NOW, -EIO);
			return;
		}
		pc_auth_proof(secret, snonce, ch->cnonce, false, msg);
		pc_auth_proof(secret, snonce, ch->cnonce, true,
			      ch->server_proof); /* what the node must send */
		memcpy(msg + PC_AUTH_PROOF_BYTES, ch->cnonce,
		       sizeof(ch->cnonce));
		auth_send(ch, TP_OP_AUTH_RESPONSE, msg, sizeof(msg));
		return;
	}
	/* auth_buf holds the node's proof over (its nonce, ours). */
	if (!pc_ct_equal(ch->auth_buf, ch->server_proof, PC_AUTH_PROOF_BYTES)) {
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: the node could not prove "
			  "the cluster secret", ch->peer->name);
		rx_conn_close(c, RX_CLOSE_NOW, -EACCES);
		return;
	}
	chan_ready(ch);
}

static void ch_on_connect(struct rx_conn *c)
{
	struct tp_chan *ch = rx_conn_udata(c);
	if (ch->peer->tc->cfg->secret) {
		ch->state = CH_AUTH;
		auth_send(ch, TP_OP_AUTH_CHALLENGE, NULL, 0);
		return;
	}
	chan_ready(ch);
}

static void ch_on_close(struct rx_conn *c, int err)
{
	struct tp_chan *ch = rx_conn_udata(c);
	struct tp_peer *peer = ch->peer;
	if (err && err != -ESHUTDOWN && err != -ECONNABORTED)
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "data channel to %s closed: %s",
			  peer->name, strerror(-err));
	ch->c = NULL;
	ch->state = CH_DEAD;
	met_gauge_add(peer->tc->cfg->chans_open, -1);
	struct tp_chan **pp = &peer->chans;
	while (*pp && *pp != ch)
		pp = &(*pp)->next;
	if (*pp) {
		*pp = ch->next;
		peer->nchans--;
	}
	if (err)
		peer->last_err = err;
	chan_fail_all(ch, err ? err : -ECONNRESET);
	free(ch->scratch);
	free(ch);
}

static const struct rx_conn_ops ch_ops = {.on_connect = ch_on_connect,
					  .on_close = ch_on_close};

static struct tp_peer *peer_get(struct tp_client *tc, const char *name)
{
	for (struct tp_peer *p = tc->peers; p; p = p->next)
		if (strcmp(p->name, name) == 0)
			return p;
	struct tp_peer *p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	snprintf(p->name, sizeof(p->name), "%s", name);
	p->resolve_err = pc_endpoint_parse(name, &p->addr, &p->addrlen);
	p->tc = tc;
	p->next = tc->peers;
	tc->peers = p;
	return p;
}

static struct tp_chan *chan_open(struct tp_client *tc, struct tp_peer *peer)
{
	struct tp_chan *ch = calloc(1, sizeof(*ch));
	if (!ch)
		return NULL;
	ch->peer = peer;
	int err;
	ch->c = rx_conn_connect(tc->r, (struct sockaddr *)&peer->addr,
				peer->addrlen, tc->cfg->connect_timeout_ms,
				&ch_ops, ch, &err);
	if (!ch->c) {
		peer->last_err = err;
		free(ch);
		return NULL;
	}
	rx_conn_set_manual(ch->c);
	/* Writes queue copies of their payloads: let a batch of large ones
	 * queue (the peer reads them as fast as it can). */
	rx_conn_set_limits(ch->c, 0, 64u << 20, 32u << 20,
			   (size_t)TP_IO_MAX + (64u << 20));
	ch->next = peer->chans;
	peer->chans = ch;
	peer->nchans++;
	met_gauge_add(tc->cfg->chans_open, 1);
	return ch;
}

/* The channel for the next operation to peer: the least loaded, or a new
 * one while under the cap. */
static struct tp_chan *chan_pick(struct tp_client *tc, struct tp_peer *peer)
{
	struct tp_chan *best = NULL;
	for (struct tp_chan *ch = peer->chans; ch; ch = ch->next)
		if (ch->state != CH_DEAD &&
		    (!best || ch->inflight < best->inflight))
			best = ch;
	if ((!best || best->inflight > 0) && peer->nchans < tc->cfg->max_chans) {
		struct tp_chan *ch = chan_open(tc, peer);
		if (ch)
			return ch;
	}
	return best;
}

/* Close every channel of tc holding a live operation of b. */
static void batch_close_chans(struct tp_batch *b, int err)
{
	for (struct tp_peer *p = b->tc->peers; p; p = p->next)
		for (struct tp_chan *ch = p->chans; ch; ch = ch->next)
			for (struct tp_pending *q = ch->head; q; q = q->next)
				if (q->b == b && !q->ghost && ch->c) {
					rx_conn_close(ch->c, RX_CLOSE_NOW, err);
					break;
				}
}

static void batch_timeout(struct rx_reactor *r, struct rx_timer *t)
{
	struct tp_batch *b = t->arg;
	(void)r;
	if (b->c.left == 0) { /* finished before it started: deliver */
		batch_finish(b);
		return;
	}
	b->c.timed_out = true;
	/* Their operations end (-ETIMEDOUT) before the batch is reported. */
	batch_close_chans(b, -ETIMEDOUT);
}

/* Queue p on a channel to its peer; false (and *p->res set) when it
 * cannot be started. */
static bool pending_place(struct tp_client *tc, struct tp_pending *p,
			  struct tp_peer *peer, int check)
{
	struct tp_chan *ch = NULL;
	if (check)
		*p->res = check;
	else if (!peer)
		*p->res = -ENOMEM;
	else if (peer->resolve_err)
		*p->res = peer->resolve_err;
	else if (rx_reactor_stopping(tc->r)) /* no new channel now */
		*p->res = -ESHUTDOWN;
	else if (!(ch = chan_pick(tc, peer)))
		*p->res = peer->last_err ? peer->last_err : -ECONNREFUSED;
	if (!ch) {
		p->fin = true;
		return false;
	}
	if (ch->tail)
		ch->tail->next = p;
	else
		ch->head = p;
	ch->tail = p;
	if (!ch->unsent)
		ch->unsent = p;
	ch->inflight++;
	if (ch->state == CH_READY) {
		chan_send(ch);
		chan_recv_next(ch);
	}
	return true;
}

static struct tp_peer *peer_of(struct tp_client *tc, struct tp_peer *ph,
			       const char *name, const char *node)
{
	struct tp_peer *peer = ph ? ph : peer_get(tc, name);
	if (peer && node && !peer->node[0])
		snprintf(peer->node, sizeof(peer->node), "%s", node);
	return peer;
}

/* Start a batch of reads or writes: each is queued on a channel of its
 * peer, or fails at once (delivered from a 0-delay timer, never from the
 * caller's frame). */
static int batch_start(struct tp_client *tc, bool write, void *ops,
		       unsigned n, unsigned timeout_ms, tp_done_fn rdone,
		       tp_wdone_fn wdone, void *arg)
{
	if (n == 0)
		return -EINVAL;
	struct tp_batch *b = calloc(1, sizeof(*b) + n * sizeof(b->pend[0]));
	if (!b)
		return -ENOMEM;
	b->tc = tc;
	tp_bcore_link(&b->c, &tc->batches, write, ops, n, arg, batch_timeout);
	b->c.rdone = rdone;
	b->c.wdone = wdone;
	unsigned failed = 0;
	for (unsigned i = 0; i < n; i++) {
		struct tp_io io;
		tp_bcore_io(&b->c, i, &io);
		struct tp_pending *p = &b->pend[i];
		*p = (struct tp_pending){.b = b, .id = ++tc->next_id,
			.op = write ? TP_OP_WRITE
			      : io.sel ? TP_OP_READ_SEL : TP_OP_READ,
			.rkey = io.rkey, .addr = io.addr, .len = io.len,
			.hdr = io.hdr, .hdr_len = io.hdr_len, .buf = io.buf,
			.res = io.res, .got = io.got, .narrowed = io.narrowed,
			.rd = io.rd};
		if (io.sel)
			memcpy(p->sel, io.sel, sizeof(p->sel));
		int check = tp_io_check(io.len, io.hdr_len, io.hdr, io.buf);
		struct tp_peer *peer = peer_of(tc, io.ph, io.peer, io.node);
		failed += !pending_place(tc, p, peer, check);
	}
	b->c.left -= failed;
	rx_timer_start(tc->r, &b->c.timer, b->c.left ? RX_MS(timeout_ms) : 0,
		       0);
	return 0;
}

int tp_tcpc_read_batch(struct tp_client *tc, struct tp_read *reads,
		       unsigned n, unsigned timeout_ms, tp_done_fn done,
		       void *arg)
{
	return batch_start(tc, false, reads, n, timeout_ms, done, NULL, arg);
}

int tp_tcpc_write_batch(struct tp_client *tc, struct tp_write *writes,
			unsigned n, unsigned timeout_ms, tp_wdone_fn done,
			void *arg)
{
	return batch_start(tc, true, writes, n, timeout_ms, NULL, done, arg);
}

/* Cancel one pending on ch: drop it if unsent, make it a ghost if sent,
 * close the channel if its payload is arriving. true when it is done now. */
static bool cancel_on_chan(struct tp_chan *ch, struct tp_pending *p)
{
	if (!p->sent) {
		struct tp_pending **pp = &ch->head, *prev = NULL;
		while (*pp != p) {
			prev = *pp;
			pp = &(*pp)->next;
		}
		*pp = p->next;
		if (ch->tail == p)
			ch->tail = prev;
		if (ch->unsent == p)
			ch->unsent = p->next;
		ch->inflight--;
		return true;
	}
	if (ch->in_payload && ch->head == p) {
		/* Its bytes are landing in the caller's buffer: only a close
		 * stops them. The other operations of the channel fail with
		 * -ECONNABORTED (not -ECANCELED: they were not cancelled). */
		rx_conn_close(ch->c, RX_CLOSE_NOW, -ECONNABORTED);
		return false;
	}
	p->ghost = true;
	p->b->ghosts++;
	return true;
}

int tp_tcpc_cancel(struct tp_client *tc, void *arg)
{
	int count = 0;
	for (struct tp_bcore *bc = tc->batches; bc; bc = bc->next) {
		struct tp_batch *b = (struct tp_batch *)bc;
		if (bc->arg != arg || bc->cancelled)
			continue;
		bc->cancelled = true;
		count++;
		for (struct tp_peer *peer = tc->peers; peer; peer = peer->next)
			for (struct tp_chan *ch = peer->chans; ch;
			     ch = ch->next) {
				struct tp_pending *next;
				for (struct tp_pending *p = ch->head; p;
				     p = next) {
					next = p->next;
					if (p->b != b || p->ghost || p->fin)
						continue;
					if (cancel_on_chan(ch, p)) {
						p->fin = true;
						*p->res = -ECANCELED;
						bc->left--;
					}
				}
			}
		/* Deliver from the reactor; a closing channel delivers the
		 * rest. */
		if (bc->left == 0)
			rx_timer_start(tc->r, &bc->timer, 0, 0);
	}
	return count;
}

/* ---------------------------------------------------------------- peers */

static void peer_fail(struct tp_peer *p, int err)
{
	for (struct tp_chan *ch = p->chans; ch; ch = ch->next)
		if (ch->c)
			rx_conn_close(ch->c, RX_CLOSE_NOW, err);
}

int tp_tcpc_peer_open(struct tp_client *tc, const char *endpoint,
		      const char *node, struct tp_peer **out)
{
	struct tp_peer *p = peer_of(tc, NULL, endpoint, node);
	if (!p)
		return -ENOMEM;
	if (p->resolve_err)
		return p->resolve_err;
	p->refs++;
	*out = p;
	return 0;
}

int tp_tcpc_peer_health(struct tp_client *tc, struct tp_peer *p,
			struct tp_peer_info *out)
{
	(void)tc;
	struct tp_peer_info i = {TP_PEER_IDLE, p->last_err, p->nchans, 0,
				 p->refs};
	for (struct tp_chan *ch = p->chans; ch; ch = ch->next) {
		i.inflight += ch->inflight;
		if (ch->state == CH_READY)
			i.state = TP_PEER_UP;
	}
	if (i.state != TP_PEER_UP && p->last_err)
		i.state = TP_PEER_FAILED;
	if (out)
		*out = i;
	return i.state;
}

void tp_tcpc_peer_close(struct tp_client *tc, struct tp_peer *p, int err)
{
	(void)tc;
	PC_ASSERT(p->refs > 0);
	p->refs--;
	peer_fail(p, err ? err : -EHOSTDOWN);
}

/* Close the channels to node's data endpoint; their operations fail with
 * err when the closes complete. */
void tp_tcpc_fail_node(struct tp_client *tc, const char *node, int err)
{
	for (struct tp_peer *p = tc->peers; p; p = p->next)
		if (strcmp(p->node, node) == 0)
			peer_fail(p, err);
}

/* -------------------------------------------------------------- client */

void tp_tcpc_metrics(struct tp_tcpc_cfg *cfg)
{
#define CTR(var, name, help) cfg->var = met_register(MET_COUNTER, name, help, NULL)
	CTR(reads, "peercache_transport_reads_total",
	    "one-sided reads completed by this node");
	CTR(read_bytes, "peercache_transport_read_bytes_total",
	    "bytes read from peers");
	CTR(read_errors, "peercache_transport_read_errors_total",
	    "reads that failed");
	CTR(writes, "peercache_transport_writes_total",
	    "one-sided writes into peers completed by this node");
	CTR(write_bytes, "peercache_transport_write_bytes_total",
	    "bytes written into peers");
	CTR(write_errors, "peercache_transport_write_errors_total",
	    "writes that failed");
#undef CTR
	cfg->chans_open = met_register(MET_GAUGE, "peercache_transport_channels",
				       "data channels open to peers", NULL);
}

struct tp_client *tp_tcpc_new(struct rx_reactor *r,
			      const struct tp_tcpc_cfg *cfg)
{
	struct tp_client *tc = calloc(1, sizeof(*tc));
	if (!tc)
		return NULL;
	tc->r = r;
	tc->cfg = cfg;
	return tc;
}

void tp_tcpc_free(struct tp_client *tc)
{
	/* Batches that failed at once and whose delivery timer never ran
	 * before the loop ended: nobody waits for them any more. */
	while (tc->batches) {
		struct tp_batch *b = (struct tp_batch *)tc->batches;
		tc->batches = b->c.next;
		PC_ASSERT(b->ghosts == 0);
		free(b);
	}
	while (tc->peers) {
		struct tp_peer *p = tc->peers;
		tc->peers = p->next;
		PC_ASSERT(p->chans == NULL);
		free(p);
	}
	free(tc);
}
