/*
 * modules/transport_batch.c — the bookkeeping every transport's batch
 * shares (struct tp_bcore, transport.h): the client's list of live batches,
 * the view of one operation, delivery of done, and the error a failed
 * operation reports.
 *
 * Owns: nothing; the transports own their batches. Threading: the client's
 * reactor only.
 */
#include <errno.h>

#include "modules/transport.h"

void tp_bcore_link(struct tp_bcore *b, struct tp_bcore **list, bool write,
		   void *ops, unsigned n, void *arg,
		   void (*timeout)(struct rx_reactor *r, struct rx_timer *t))
{
	b->write = write;
	b->ops = ops;
	b->n = n;
	b->left = n;
	b->arg = arg;
	rx_timer_init(&b->timer, timeout, b);
	b->prev = NULL;
	b->next = *list;
	if (*list)
		(*list)->prev = b;
	*list = b;
}

void tp_bcore_io(struct tp_bcore *b, unsigned i, struct tp_io *io)
{
	if (b->write) {
		struct tp_write *w = &((struct tp_write *)b->ops)[i];
		*io = (struct tp_io){w->ph, w->peer, w->node, w->rkey, w->addr,
				     w->len, w->hdr_len,
				     (uint8_t *)(uintptr_t)w->hdr,
				     (uint8_t *)(uintptr_t)w->src, &w->res,
				     NULL, NULL, NULL, NULL};
	} else {
		struct tp_read *rd = &((struct tp_read *)b->ops)[i];
		*io = (struct tp_io){rd->ph, rd->peer, rd->node, rd->rkey,
				     rd->addr, rd->len, rd->hdr_len, rd->hdr,
				     rd->dst, &rd->res,
				     rd->select ? rd->sel : NULL, &rd->got,
				     &rd->narrowed, rd};
		rd->got = rd->len;
		rd->narrowed = false;
		rd->landed_ran = false;
	}
	*io->res = 0;
}

void tp_read_landed(struct tp_read *rd)
{
	if (rd->landed && !rd->landed_ran && rd->res == 0) {
		rd->landed_ran = true;
		rd->landed(rd->landed_arg, rd);
	}
}

void tp_bcore_deliver(struct tp_bcore *b, struct tp_bcore **list,
		      struct rx_reactor *r)
{
	rx_timer_stop(r, &b->timer);
	if (b->prev)
		b->prev->next = b->next;
	else
		*list = b->next;
	if (b->next)
		b->next->prev = b->prev;
	b->prev = b->next = NULL;
	if (b->write) {
		b->wdone(b->arg, b->ops, b->n);
		return;
	}
	for (unsigned i = 0; i < b->n; i++)
		tp_read_landed(&((struct tp_read *)b->ops)[i]);
	b->rdone(b->arg, b->ops, b->n);
}

int tp_bcore_res(const struct tp_bcore *b, int err)
{
	if (err < 0 && b->cancelled)
		return -ECANCELED;
	if (err < 0 && b->timed_out)
		return -ETIMEDOUT;
	return err;
}
