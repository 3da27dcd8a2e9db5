/*
 * tests/fake/rdma_sim_cm.c — the simulated rdma_cm (rdma_sim.h): event
 * channels, ids, bind/listen/resolve, connect/accept/reject/disconnect and
 * the cm events. The fabric, QPs and the worker are in rdma_sim.c; what
 * both share is in rdma_sim_int.h.
 *
 * Owns: the event channels, the ids and the rdma_cm events (pending in
 * S.pend_head.., on a channel, or got and not acked in S.gotten), in the
 * fabric's lists under its one mutex (S.mu). Threading: the rv_api entries
 * here run on the callers' threads and only queue events (ev_queue: one
 * global FIFO, each event due CM_DELAY_NS after the call that made it);
 * the worker (rdma_sim.c) publishes them onto their channels once due
 * (rsim_ev_publish), so no event is visible inside the call that made it.
 *
 * Invariants: an event channel's fd is readable iff events wait on it
 * (rsim_fd_level). Addresses are IPv4 on 127.0.0.0/8 (or the wildcard) in
 * a registry of bound ids: no socket is opened. A listener marked dead
 * (rsim_kill) neither takes connects nor holds its port.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/fake/rdma_sim_int.h"

#define CONN_PDATA_MAX 56
#define ACCEPT_PDATA_MAX 196
#define REJECT_PDATA_MAX 148
#define CM_DELAY_NS 20000ull

/* ------------------------------------------------------------ addresses */

static int key_of(const struct sockaddr *sa, struct skey *k)
{
	if (!sa || sa->sa_family != AF_INET)
		return -EAFNOSUPPORT;
	const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
	k->ip = ntohl(in->sin_addr.s_addr);
	k->port = ntohs(in->sin_port);
	if (k->ip != INADDR_ANY && (k->ip >> 24) != 127)
		return -EADDRNOTAVAIL;
	return 0;
}

static void sin_of(const struct skey *k, struct sockaddr_in *in)
{
	memset(in, 0, sizeof(*in));
	in->sin_family = AF_INET;
	in->sin_addr.s_addr = htonl(k->ip);
	in->sin_port = htons(k->port);
}

static bool port_taken(const struct skey *k)
{
	for (struct sim_id *i = S.ids; i; i = i->next)
		if (i->bound && !i->dead && rsim_key_overlaps(&i->src, k))
			return true;
	return false;
}

static int port_pick(struct skey *k)
{
	for (unsigned n = 0; n <= PORT_LAST - PORT_FIRST; n++) {
		k->port = S.port_next;
		S.port_next = S.port_next >= PORT_LAST ? PORT_FIRST
						       : S.port_next + 1;
		if (!port_taken(k))
			return 0;
	}
	return -EADDRINUSE;
}

static struct sim_id *listener_find(const struct skey *k)
{
	for (struct sim_id *i = S.ids; i; i = i->next)
		if (i->st == ID_LISTEN && !i->dead &&
		    rsim_key_overlaps(&i->src, k))
			return i;
	return NULL;
}

/* ---------------------------------------------------------- rdma_cm events */

static void ech_push(struct sim_ech *ch, struct sim_ev *e)
{
	e->next = NULL;
	if (ch->tail)
		ch->tail->next = e;
	else
		ch->head = e;
	ch->tail = e;
	rsim_fd_level(ch->ch.fd, &ch->fd_up, true);
}

/* Queue an event for sid (on its channel), published by the worker. */
static void ev_queue(struct sim_id *sid, enum rdma_cm_event_type type,
		     int status, const void *pdata, unsigned len,
		     struct sim_id *listen)
{
	struct sim_ev *e = calloc(1, sizeof(*e));
	if (!e) {
		fprintf(stderr, "rsim: out of memory: rdma_cm event %d lost\n",
			(int)type);
		return;
	}
	e->ev.id = &sid->id;
	e->ev.listen_id = listen ? &listen->id : NULL;
	e->ev.event = type;
	e->ev.status = status;
	if (len) {
		memcpy(e->pdata, pdata, len);
		e->ev.param.conn.private_data = e->pdata;
		e->ev.param.conn.private_data_len = (uint8_t)len;
	}
	e->sid = sid;
	e->slisten = listen;
	uint64_t due = rsim_now_ns() + CM_DELAY_NS;
	e->due = due > S.pend_last_due ? due : S.pend_last_due;
	S.pend_last_due = e->due;
	if (S.pend_tail)
		S.pend_tail->next = e;
	else
		S.pend_head = e;
	S.pend_tail = e;
	rsim_kick();
}

/* Worker: the event is due; the client's QP is ready on ESTABLISHED. */
void rsim_ev_publish(struct sim_ev *e)
{
	struct sim_id *sid = e->sid;
	if (e->ev.event == RDMA_CM_EVENT_ESTABLISHED && sid->qp &&
	    sid->st == ID_CONNECTED && !sid->qp->error) {
		sid->qp->ready = true;
		sid->qp->qp.state = IBV_QPS_RTS;
	}
	ech_push(sid->ch, e);
}

static void id_free(struct sim_id *id);

/* Drop the events of id that were not got yet: pending and on its
 * channel. A connect request to a listener being destroyed takes its
 * hidden new id with it, and its client is told nobody listens. */
static void ev_purge(struct sim_id *id)
{
	struct sim_ev *drop = NULL;
	struct sim_ev **lists[2] = {&S.pend_head, &id->ch->head};
	for (int l = 0; l < 2; l++) {
		struct sim_ev **pp = lists[l], *last = NULL;
		while (*pp) {
			struct sim_ev *e = *pp;
			if (e->sid == id || e->slisten == id) {
				*pp = e->next;
				e->next = drop;
				drop = e;
			} else {
				last = e;
				pp = &e->next;
			}
		}
		if (l == 0)
			S.pend_tail = last;
		else
			id->ch->tail = last;
	}
	rsim_fd_level(id->ch->ch.fd, &id->ch->fd_up, id->ch->head != NULL);
	while (drop) {
		struct sim_ev *e = drop;
		drop = e->next;
		if (e->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST &&
		    e->slisten == id && e->sid != id) {
			struct sim_id *c = e->sid->peer;
			if (c && c->st == ID_CONNECTING) {
				c->st = ID_DONE;
				c->peer = NULL;
				ev_queue(c, RDMA_CM_EVENT_REJECTED,
					 RSIM_REJ_NO_LISTENER, NULL, 0, NULL);
			}
			id_free(e->sid);
		}
		free(e);
	}
}

void rsim_side_disconnect(struct sim_id *id)
{
	if (id->st != ID_CONNECTED)
		return;
	id->st = ID_DISC;
	ev_queue(id, RDMA_CM_EVENT_DISCONNECTED, 0, NULL, 0, NULL);
	if (id->qp)
		rsim_qp_err(id->qp);
}

/* ------------------------------------------------------------------ rdma_cm */

struct rdma_event_channel *rsim_cm_create_event_channel(void)
{
	int fd;
	struct sim_ech *ch = rsim_alloc_with_fd(sizeof(*ch), &fd);
	if (!ch)
		return NULL;
	ch->ch.fd = fd;
	rsim_lock();
	ch->next = S.echs;
	S.echs = ch;
	S.st.event_channels_live++;
	rsim_unlock();
	return &ch->ch;
}

void rsim_ech_free(struct sim_ech *ch)
{
	while (ch->head) {
		struct sim_ev *e = ch->head;
		ch->head = e->next;
		free(e);
	}
	close(ch->ch.fd);
	free(ch);
}

void rsim_cm_destroy_event_channel(struct rdma_event_channel *chan)
{
	struct sim_ech *ch = (struct sim_ech *)chan;
	rsim_lock();
	if (ch->ids) {
		fprintf(stderr, "rsim: destroy_event_channel with %u ids on it: "
				"not destroyed\n", ch->ids);
	} else {
		UNLINK(S.echs, ch);
		S.st.event_channels_live--;
		rsim_ech_free(ch);
	}
	rsim_unlock();
}

static struct sim_id *id_new(struct sim_ech *ch, void *context,
			     enum rdma_port_space ps)
{
	struct sim_id *id = calloc(1, sizeof(*id));
	if (!id)
		return NULL;
	id->id.channel = &ch->ch;
	id->id.context = context;
	id->id.ps = ps;
	id->id.qp_type = IBV_QPT_RC;
	id->ch = ch;
	ch->ids++;
	id->next = S.ids;
	S.ids = id;
	S.st.ids_live++;
	return id;
}

static void id_free(struct sim_id *id)
{
	for (struct sim_id *i = S.ids; i; i = i->next)
		if (i->listener == id)
			i->listener = NULL;
	UNLINK(S.ids, id);
	id->ch->ids--;
	S.st.ids_live--;
	free(id);
}

int rsim_cm_create_id(struct rdma_event_channel *chan,
		      struct rdma_cm_id **out, void *context,
		      enum rdma_port_space ps)
{
	if (!chan || (ps != RDMA_PS_TCP && ps != RDMA_PS_IB))
		return rsim_fail(EINVAL);
	rsim_lock();
	struct sim_id *id = id_new((struct sim_ech *)chan, context, ps);
	rsim_unlock();
	if (!id)
		return rsim_fail(ENOMEM);
	*out = &id->id;
	return 0;
}

int rsim_cm_destroy_id(struct rdma_cm_id *cmid)
{
	struct sim_id *id = (struct sim_id *)cmid;
	rsim_lock();
	int e = id->unacked || id->qp ? EBUSY : 0;
	if (e) {
		if (id->qp)
			fprintf(stderr, "rsim: destroy_id with a QP: "
					"destroy_qp first\n");
		rsim_unlock();
		return rsim_fail(e);
	}
	ev_purge(id);
	struct sim_id *p = id->peer;
	if (p) {
		if (id->st == ID_CONNECTED)
			rsim_side_disconnect(p);
		if (id->st == ID_REQ && p->st == ID_CONNECTING) {
			/* a request never answered: the kernel rejects it */
			p->st = ID_DONE;
			ev_queue(p, RDMA_CM_EVENT_REJECTED, RSIM_REJ_CONSUMER,
				 NULL, 0, NULL);
		}
		p->peer = NULL;
	}
	id_free(id);
	rsim_unlock();
	return 0;
}

int rsim_cm_bind_addr(struct rdma_cm_id *cmid, struct sockaddr *addr)
{
	struct sim_id *id = (struct sim_id *)cmid;
	struct skey k;
	int r = key_of(addr, &k);
	if (r)
		return rsim_fail(-r);
	rsim_lock();
	struct sim_dev *d = rsim_dev_at(k.ip);
	int e = id->st != ID_IDLE ? EINVAL : !d ? ENODEV : 0;
	if (!e && k.port == 0)
		e = -port_pick(&k);
	else if (!e && port_taken(&k))
		e = EADDRINUSE;
	if (!e) {
		id->src = k;
		id->bound = true;
		id->st = ID_BOUND;
		id->id.verbs = &d->cm_ctx->ctx;
		id->id.port_num = 1;
		sin_of(&k, &id->id.route.addr.src_sin);
	}
	rsim_unlock();
	return e ? rsim_fail(e) : 0;
}

int rsim_cm_listen(struct rdma_cm_id *cmid, int backlog)
{
	struct sim_id *id = (struct sim_id *)cmid;
	(void)backlog;
	rsim_lock();
	int e = id->st == ID_BOUND ? 0 : EINVAL;
	if (!e)
		id->st = ID_LISTEN;
	rsim_unlock();
	return e ? rsim_fail(e) : 0;
}

int rsim_cm_resolve_addr(struct rdma_cm_id *cmid, struct sockaddr *src,
			 struct sockaddr *dst, int timeout_ms)
{
	struct sim_id *id = (struct sim_id *)cmid;
	struct skey k;
	(void)timeout_ms;
	if (!dst || dst->sa_family != AF_INET)
		return rsim_fail(EAFNOSUPPORT);
	if (src && ((struct sim_id *)cmid)->st == ID_IDLE &&
	    rsim_cm_bind_addr(cmid, src) != 0)
		return -1;
	rsim_lock();
	int e = id->st == ID_IDLE || id->st == ID_BOUND ? 0 : EINVAL;
	if (!e && !id->bound) {
		id->src.ip = INADDR_LOOPBACK;
		e = -port_pick(&id->src);
		if (!e) {
			id->bound = true;
			sin_of(&id->src, &id->id.route.addr.src_sin);
		}
	}
	if (!e) {
		/* The device of the source address it was bound to, or else
		 * the one that has the destination (a local route). */
		int r = key_of(dst, &k);
		bool from = id->src.ip != INADDR_LOOPBACK;
		struct sim_dev *d = rsim_dev_at(from ? id->src.ip
						     : r ? 0 : k.ip);
		if (!d || r) {
			ev_queue(id, RDMA_CM_EVENT_ADDR_ERROR,
				 !d ? -ENODEV : -EHOSTUNREACH, NULL, 0, NULL);
		} else {
			id->dst = k;
			id->st = ID_ADDR;
			id->id.verbs = &d->cm_ctx->ctx;
			id->id.port_num = 1;
			sin_of(&k, &id->id.route.addr.dst_sin);
			ev_queue(id, RDMA_CM_EVENT_ADDR_RESOLVED, 0, NULL, 0,
				 NULL);
		}
	}
	rsim_unlock();
	return e ? rsim_fail(e) : 0;
}

int rsim_cm_resolve_route(struct rdma_cm_id *cmid, int timeout_ms)
{
	struct sim_id *id = (struct sim_id *)cmid;
	(void)timeout_ms;
	rsim_lock();
	int e = id->st == ID_ADDR ? 0 : EINVAL;
	if (!e) {
		id->st = ID_ROUTE;
		ev_queue(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0, NULL, 0, NULL);
	}
	rsim_unlock();
	return e ? rsim_fail(e) : 0;
}

int rsim_cm_connect(struct rdma_cm_id *cmid, struct rdma_conn_param *param)
{
	struct sim_id *id = (struct sim_id *)cmid;
	unsigned len = param ? param->private_data_len : 0;
	if (len > CONN_PDATA_MAX || (len && !param->private_data))
		return rsim_fail(EINVAL);
	rsim_lock();
	unsigned depth = param ? param->initiator_depth : 0;
	S.st.init_depth_max = SIM_MAX(S.st.init_depth_max, depth);
	if (id->st != ID_ROUTE || !id->qp ||
	    depth > rsim_id_lim(id)->max_qp_init_rd_atom) {
		rsim_unlock();
		return rsim_fail(EINVAL);
	}
	id->st = ID_CONNECTING;
	struct sim_node *n = rsim_node_find(&id->dst);
	struct sim_id *l = listener_find(&id->dst);
	if (n && n->silent_cm) {
		/* never answered: the caller's connect timeout must act */
	} else if (!l) {
		id->st = ID_DONE;
		ev_queue(id, RDMA_CM_EVENT_REJECTED, RSIM_REJ_NO_LISTENER, NULL,
			 0, NULL);
	} else {
		struct sim_id *s = id_new(l->ch, l->id.context, l->id.ps);
		if (!s) {
			id->st = ID_ROUTE;
			rsim_unlock();
			return rsim_fail(ENOMEM);
		}
		s->st = ID_REQ;
		s->peer = id;
		s->listener = l;
		s->src = id->dst;
		s->dst = id->src;
		/* A wildcard listener hears requests on every device: the
		 * new id is on the one that has the address dialed. */
		struct sim_dev *ld = l->src.ip == INADDR_ANY
					     ? rsim_dev_at(id->dst.ip) : NULL;
		s->id.verbs = ld ? &ld->cm_ctx->ctx : l->id.verbs;
		s->id.port_num = 1;
		sin_of(&s->src, &s->id.route.addr.src_sin);
		sin_of(&s->dst, &s->id.route.addr.dst_sin);
		id->peer = s;
		ev_queue(s, RDMA_CM_EVENT_CONNECT_REQUEST, 0,
			 len ? param->private_data : NULL, len, l);
	}
	rsim_unlock();
	return 0;
}

int rsim_cm_accept(struct rdma_cm_id *cmid, struct rdma_conn_param *param)
{
	struct sim_id *id = (struct sim_id *)cmid;
	unsigned len = param ? param->private_data_len : 0;
	if (len > ACCEPT_PDATA_MAX || (len && !param->private_data))
		return rsim_fail(EINVAL);
	rsim_lock();
	unsigned res = param ? param->responder_resources : 0;
	S.st.resp_res_max = SIM_MAX(S.st.resp_res_max, res);
	if (id->st != ID_REQ || !id->qp ||
	    res > rsim_id_lim(id)->max_qp_rd_atom) {
		rsim_unlock();
		return rsim_fail(EINVAL);
	}
	struct sim_id *c = id->peer;
	if (!c || !c->qp || c->st != ID_CONNECTING) {
		/* the connecting side went away meanwhile */
		id->st = ID_DONE;
		if (c)
			c->peer = NULL;
		id->peer = NULL;
		ev_queue(id, RDMA_CM_EVENT_CONNECT_ERROR, -ECONNRESET, NULL, 0,
			 NULL);
		rsim_unlock();
		return 0;
	}
	id->st = ID_CONNECTED;
	c->st = ID_CONNECTED;
	struct sim_qp *sq = id->qp, *cq = c->qp;
	sq->peer = cq;
	cq->peer = sq;
	sq->node = c->dst;
	cq->node = c->dst;
	sq->linked = cq->linked = true;
	sq->ready = !sq->error;
	if (sq->ready)
		sq->qp.state = IBV_QPS_RTS;
	ev_queue(c, RDMA_CM_EVENT_ESTABLISHED, 0,
		 len ? param->private_data : NULL, len, NULL);
	ev_queue(id, RDMA_CM_EVENT_ESTABLISHED, 0, NULL, 0, NULL);
	rsim_unlock();
	return 0;
}

int rsim_cm_reject(struct rdma_cm_id *cmid, const void *private_data,
		   uint8_t private_data_len)
{
	struct sim_id *id = (struct sim_id *)cmid;
	if (private_data_len > REJECT_PDATA_MAX ||
	    (private_data_len && !private_data))
		return rsim_fail(EINVAL);
	rsim_lock();
	if (id->st != ID_REQ) {
		rsim_unlock();
		return rsim_fail(EINVAL);
	}
	struct sim_id *c = id->peer;
	if (c && c->st == ID_CONNECTING) {
		c->st = ID_DONE;
		c->peer = NULL;
		ev_queue(c, RDMA_CM_EVENT_REJECTED, RSIM_REJ_CONSUMER,
			 private_data, private_data_len, NULL);
	}
	id->st = ID_DONE;
	id->peer = NULL;
	rsim_unlock();
	return 0;
}

int rsim_cm_disconnect(struct rdma_cm_id *cmid)
{
	struct sim_id *id = (struct sim_id *)cmid;
	rsim_lock();
	int e = 0;
	if (id->st == ID_CONNECTED) {
		rsim_side_disconnect(id);
		if (id->peer)
			rsim_side_disconnect(id->peer);
		rsim_kick();
	} else if (id->st != ID_DISC) {
		e = EINVAL;
	}
	rsim_unlock();
	return e ? rsim_fail(e) : 0;
}

int rsim_cm_get_cm_event(struct rdma_event_channel *chan,
			 struct rdma_cm_event **event)
{
	struct sim_ech *ch = (struct sim_ech *)chan;
	rsim_lock();
	struct sim_ev *e = ch->head;
	if (e) {
		ch->head = e->next;
		if (!ch->head)
			ch->tail = NULL;
		rsim_fd_level(ch->ch.fd, &ch->fd_up, ch->head != NULL);
		e->next = S.gotten;
		S.gotten = e;
		e->sid->unacked++;
		if (e->slisten)
			e->slisten->unacked++;
		*event = &e->ev;
	}
	rsim_unlock();
	return e ? 0 : rsim_fail(EAGAIN);
}

int rsim_cm_ack_cm_event(struct rdma_cm_event *event)
{
	struct sim_ev *e = (struct sim_ev *)event, **pp;
	rsim_lock();
	for (pp = &S.gotten; *pp && *pp != e; pp = &(*pp)->next)
		;
	if (!*pp) {
		rsim_unlock();
		fprintf(stderr, "rsim: ack_cm_event of an event not got\n");
		return rsim_fail(EINVAL);
	}
	*pp = e->next;
	e->sid->unacked--;
	if (e->slisten)
		e->slisten->unacked--;
	rsim_unlock();
	free(e);
	return 0;
}

uint16_t rsim_cm_get_src_port(struct rdma_cm_id *cmid)
{
	struct sim_id *id = (struct sim_id *)cmid;
	rsim_lock();
	uint16_t p = id->bound ? id->src.port : 0;
	rsim_unlock();
	return htons(p); /* as rdma_get_src_port: network order */
}
