/*
 * tests/fake/rdma_sim_async.c — the simulated devices' asynchronous events
 * (rdma_sim.h: rsim_async_port, rsim_async_qp; the table's
 * get_async_event / ack_async_event).
 *
 * Owns: each context's queue of events not got yet (struct sim_aev) and
 * its async_fd, an eventfd readable iff the queue is non-empty (made by
 * ctx_new in rdma_sim.c, closed here). Threading: under the fabric's
 * mutex, like the rest of the sim. Events are queued by the test's hooks
 * at once (hardware raises them on its own; nothing here is due later).
 * Invariant: a queued QP event names a live QP (destroy_qp purges its
 * events, as uverbs drops an object's unreported events).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/fake/rdma_sim_int.h"

static void aev_level(struct sim_ctx *c)
{
	rsim_fd_level(c->ctx.async_fd, &c->afd_up, c->aev_head != NULL);
}

static int aev_push(struct sim_ctx *c, enum ibv_event_type type,
		    struct ibv_qp *qp, int port)
{
	struct sim_aev *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->ev.event_type = type;
	if (qp)
		e->ev.element.qp = qp;
	else
		e->ev.element.port_num = port;
	if (c->aev_tail)
		c->aev_tail->next = e;
	else
		c->aev_head = e;
	c->aev_tail = e;
	aev_level(c);
	return 0;
}

void rsim_aev_purge(struct sim_ctx *c, const struct ibv_qp *qp)
{
	struct sim_aev **pp = &c->aev_head;
	c->aev_tail = NULL;
	while (*pp) {
		struct sim_aev *e = *pp;
		if (!qp || e->ev.element.qp == qp) {
			*pp = e->next;
			free(e);
		} else {
			c->aev_tail = e;
			pp = &e->next;
		}
	}
	aev_level(c);
}

void rsim_ctx_free(struct sim_ctx *c)
{
	rsim_aev_purge(c, NULL);
	if (c->ctx.async_fd >= 0)
		close(c->ctx.async_fd);
	free(c);
}

int rsim_get_async_event(struct ibv_context *ctx, struct ibv_async_event *ev)
{
	struct sim_ctx *c = (struct sim_ctx *)ctx;
	rsim_lock();
	struct sim_aev *e = c->aev_head;
	if (e) {
		c->aev_head = e->next;
		if (!c->aev_head)
			c->aev_tail = NULL;
		aev_level(c);
		S.st.async_events_unacked++;
	}
	rsim_unlock();
	if (!e)
		return rsim_fail(EAGAIN);
	*ev = e->ev;
	free(e);
	return 0;
}

void rsim_ack_async_event(struct ibv_async_event *ev)
{
	(void)ev;
	rsim_lock();
	if (S.st.async_events_unacked)
		S.st.async_events_unacked--;
	rsim_unlock();
}

int rsim_async_port(const char *dev, enum ibv_event_type type)
{
	int ret = -ENODEV;
	rsim_lock();
	for (unsigned i = 0; i < S.ndevs && ret == -ENODEV; i++) {
		struct sim_dev *d = S.devs[i];
		if (strcmp(d->dev.name, dev))
			continue;
		if (type == IBV_EVENT_PORT_ERR)
			d->port_state = IBV_PORT_DOWN;
		else if (type == IBV_EVENT_PORT_ACTIVE)
			d->port_state = IBV_PORT_ACTIVE;
		ret = aev_push(d->cm_ctx, type, NULL, 1);
	}
	rsim_unlock();
	return ret;
}

int rsim_async_qp(const char *addr, enum ibv_event_type type)
{
	int n = 0;
	rsim_lock();
	for (struct sim_qp *q = S.qps; q; q = q->next) {
		if (!q->linked || !q->id || !q->id->listener)
			continue;
		struct in_addr a = {htonl(q->node.ip)};
		char ip[INET_ADDRSTRLEN], at[INET_ADDRSTRLEN + 8];
		inet_ntop(AF_INET, &a, ip, sizeof(ip));
		snprintf(at, sizeof(at), "%s:%u", ip, q->node.port);
		if (strcmp(at, addr))
			continue;
		rsim_qp_err(q);
		if (aev_push((struct sim_ctx *)q->qp.context, type, &q->qp,
			     0) == 0)
			n++;
	}
	rsim_kick();
	rsim_unlock();
	return n;
}
