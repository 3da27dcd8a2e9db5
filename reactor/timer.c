/*
 * reactor/timer.c — one-shot and periodic timers: an intrusive binary
 * min-heap for timers with a delay, a list for those without one.
 *
 * Owns: the heap's root and the list of zero-delay one-shots ("soon").
 * Both are intrusive: a timer carries its own links (embedded in its
 * user's struct), so arming one never allocates. A timer with a delay
 * fails to arm only when timers_max of them are armed (a runaway guard);
 * a zero-delay one-shot takes no slot and never fails, so deferring a
 * callback to the next pass always works. Thread: the reactor's.
 *
 * The heap is a complete binary tree of linked nodes: position k (from 1)
 * is reached from the root by the bits of k below its top bit (0 left,
 * 1 right), so the last position — where an insert goes and what a removal
 * moves into the hole — is found in log2(n) steps; sifting swaps a node
 * with its parent by relinking.
 *
 * Order: by deadline, then by arming sequence, so timers due at the same
 * instant fire in the order they were armed; the soon list is in arming
 * order, so its deadlines (the arming times) are sorted too, and a pass
 * merges it with the heap. The loop sleeps until the earliest deadline
 * (see rx_timers_next_ns), so no timer SQEs are needed. A periodic timer
 * is re-armed from its previous deadline (no drift), but skips missed
 * periods instead of firing a burst after a stall.
 */
#include <errno.h>
#include <stdlib.h>

#include "rx_internal.h"
#include "stall.h"

enum { IDLE = 0, ON_HEAP = 1, SOON = 2 }; /* struct rx_timer's where */

static bool before(const struct rx_timer *a, const struct rx_timer *b)
{
	if (a->deadline_ns != b->deadline_ns)
		return a->deadline_ns < b->deadline_ns;
	return a->seq < b->seq;
}

/* ------------------------------------------------------------ the heap */

/* The node at position k (1 <= k <= heap_n). */
static struct rx_timer *node_at(const struct rx_reactor *r, unsigned k)
{
	struct rx_timer *n = r->heap_root;
	for (int b = 30 - __builtin_clz(k); b >= 0; b--)
		n = (k >> b) & 1 ? n->hp_right : n->hp_left;
	return n;
}

/* Point whatever held old (its parent's link, or the root) at new. */
static void replace_link(struct rx_reactor *r, struct rx_timer *up,
			 const struct rx_timer *old, struct rx_timer *new)
{
	if (!up)
		r->heap_root = new;
	else if (up->hp_left == old)
		up->hp_left = new;
	else
		up->hp_right = new;
}

/* Swap c with its parent p. */
static void swap_up(struct rx_reactor *r, struct rx_timer *p,
		    struct rx_timer *c)
{
	struct rx_timer *gp = p->hp_up, *cl = c->hp_left, *cr = c->hp_right;
	if (p->hp_left == c) {
		c->hp_left = p;
		c->hp_right = p->hp_right;
		if (c->hp_right)
			c->hp_right->hp_up = c;
	} else {
		c->hp_right = p;
		c->hp_left = p->hp_left;
		if (c->hp_left)
			c->hp_left->hp_up = c;
	}
	p->hp_left = cl;
	if (cl)
		cl->hp_up = p;
	p->hp_right = cr;
	if (cr)
		cr->hp_up = p;
	p->hp_up = c;
	c->hp_up = gp;
	replace_link(r, gp, p, c);
}

static void sift_up(struct rx_reactor *r, struct rx_timer *t)
{
	while (t->hp_up && before(t, t->hp_up))
		swap_up(r, t->hp_up, t);
}

static void sift_down(struct rx_reactor *r, struct rx_timer *t)
{
	for (;;) {
		struct rx_timer *m = t->hp_left;
		if (t->hp_right && before(t->hp_right, m))
			m = t->hp_right;
		if (!m || !before(m, t))
			return;
		swap_up(r, t, m);
	}
}

static void heap_add(struct rx_reactor *r, struct rx_timer *t)
{
	unsigned k = ++r->heap_n;
	t->where = ON_HEAP;
	t->hp_left = t->hp_right = NULL;
	t->hp_up = k == 1 ? NULL : node_at(r, k >> 1);
	if (!t->hp_up)
		r->heap_root = t;
	else if (k & 1)
		t->hp_up->hp_right = t;
	else
		t->hp_up->hp_left = t;
	sift_up(r, t);
}

static void heap_remove(struct rx_reactor *r, struct rx_timer *t)
{
	PC_DASSERT(t->where == ON_HEAP && r->heap_n > 0);
	struct rx_timer *last = node_at(r, r->heap_n);
	replace_link(r, last->hp_up, last, NULL); /* detach the last */
	r->heap_n--;
	if (last != t) { /* it fills t's place, then finds its own */
		last->hp_up = t->hp_up;
		last->hp_left = t->hp_left;
		last->hp_right = t->hp_right;
		if (last->hp_left)
			last->hp_left->hp_up = last;
		if (last->hp_right)
			last->hp_right->hp_up = last;
		replace_link(r, t->hp_up, t, last);
		if (last->hp_up && before(last, last->hp_up))
			sift_up(r, last);
		else
			sift_down(r, last);
	}
	t->hp_up = t->hp_left = t->hp_right = NULL;
	t->where = IDLE;
}

/* The most timers with a delay r may arm (at least one). */
static unsigned heap_max(const struct rx_reactor *r)
{
	return r->p.timers_max ? r->p.timers_max : 1;
}

int rx_timers_init(struct rx_reactor *r)
{
	r->heap_root = NULL;
	r->heap_n = 0;
	return 0;
}

/* ------------------------------------------------------- the soon list */

static void soon_add(struct rx_reactor *r, struct rx_timer *t)
{
	t->where = SOON;
	t->soon_next = NULL;
	t->soon_prev = r->soon_tail;
	if (r->soon_tail)
		r->soon_tail->soon_next = t;
	else
		r->soon_head = t;
	r->soon_tail = t;
}

static void soon_remove(struct rx_reactor *r, struct rx_timer *t)
{
	PC_DASSERT(t->where == SOON);
	if (t->soon_prev)
		t->soon_prev->soon_next = t->soon_next;
	else
		r->soon_head = t->soon_next;
	if (t->soon_next)
		t->soon_next->soon_prev = t->soon_prev;
	else
		r->soon_tail = t->soon_prev;
	t->soon_prev = t->soon_next = NULL;
	t->where = IDLE;
}

/* Take an armed t off the heap or the soon list. */
static void unlink_armed(struct rx_reactor *r, struct rx_timer *t)
{
	if (t->where == SOON)
		soon_remove(r, t);
	else
		heap_remove(r, t);
}

/* Leave every timer of the subtree at n idle (depth: log2 of the count). */
static void heap_clear(struct rx_timer *n)
{
	if (!n)
		return;
	heap_clear(n->hp_left);
	heap_clear(n->hp_right);
	n->hp_up = n->hp_left = n->hp_right = NULL;
	n->where = IDLE;
}

void rx_timers_fini(struct rx_reactor *r)
{
	while (r->soon_head)
		soon_remove(r, r->soon_head);
	heap_clear(r->heap_root);
	r->heap_root = NULL;
	r->heap_n = 0;
}

/* ------------------------------------------------------------ the API */

void rx_timer_init(struct rx_timer *t,
		   void (*cb)(struct rx_reactor *r, struct rx_timer *t),
		   void *arg)
{
	*t = (struct rx_timer){.cb = cb, .arg = arg, .where = IDLE};
}

bool rx_timer_armed(const struct rx_timer *t)
{
	return t->where != IDLE;
}

int rx_timer_start(struct rx_reactor *r, struct rx_timer *t, uint64_t delay_ns,
		   uint64_t period_ns)
{
	bool soon = delay_ns == 0 && period_ns == 0;
	/* A slot first, for a timer not on the heap yet: failing leaves t as
	 * it was (a queued zero-delay timer stays queued). One on the heap
	 * gives its slot back as it moves. */
	if (!soon && t->where != ON_HEAP && r->heap_n >= heap_max(r)) {
		PC_LOG_RL(PC_LOG_WARN, "reactor", "all %u timer slots in use",
			  heap_max(r));
		return -ENOSPC;
	}
	if (rx_timer_armed(t))
		unlink_armed(r, t);
	/* Use the live clock, not the iteration's cached time, so a timer armed
	 * late in a long iteration still waits its full delay. */
	t->deadline_ns = pc_now_ns() + delay_ns;
	t->period_ns = period_ns;
	t->seq = ++r->timer_seq;
	if (soon)
		soon_add(r, t);
	else
		heap_add(r, t);
	return 0;
}

void rx_timer_stop(struct rx_reactor *r, struct rx_timer *t)
{
	if (rx_timer_armed(t))
		unlink_armed(r, t);
}

/* The next timer to fire of those due at now and armed up to limit_seq:
 * the earlier of the heap's first and the soon list's first, or NULL. When
 * the heap's first was armed during this pass, nothing under it is due
 * either: now (the pass's cached time) is never ahead of the clock that
 * timer's deadline came from. */
static struct rx_timer *next_due(struct rx_reactor *r, uint64_t now,
				 uint64_t limit_seq)
{
	struct rx_timer *h = r->heap_root;
	struct rx_timer *s = r->soon_head;
	if (h && (h->deadline_ns > now || h->seq > limit_seq))
		h = NULL;
	if (s && (s->deadline_ns > now || s->seq > limit_seq))
		s = NULL;
	if (h && s)
		return before(s, h) ? s : h;
	return h ? h : s;
}

void rx_timers_run(struct rx_reactor *r)
{
	/* Fire only what was due at the start: a callback that re-arms with a
	 * zero delay runs next iteration, never in a tight loop here. */
	uint64_t now = r->now_ns;
	uint64_t limit_seq = r->timer_seq;
	struct rx_timer *t;
	while ((t = next_due(r, now, limit_seq)) != NULL) {
		unlink_armed(r, t);
		if (t->period_ns) { /* back on the heap: its slot was free */
			uint64_t next = t->deadline_ns + t->period_ns;
			if (next <= now) /* stalled: skip missed periods */
				next = now + t->period_ns;
			t->deadline_ns = next;
			t->seq = ++r->timer_seq;
			heap_add(r, t);
		}
		RX_STAT_INC(r->st.timers_fired);
		uint64_t t0 = rx_stall_begin();
		t->cb(r, t);
		rx_stall_end(r, t0, "timer", "callback", 0);
	}
}

uint64_t rx_timers_next_ns(const struct rx_reactor *r)
{
	if (r->soon_head)
		return 0;
	if (!r->heap_root)
		return UINT64_MAX;
	uint64_t d = r->heap_root->deadline_ns;
	uint64_t now = pc_now_ns();
	return d > now ? d - now : 0;
}

bool rx_timers_due(const struct rx_reactor *r)
{
	return r->soon_head ||
	       (r->heap_root && r->heap_root->deadline_ns <= pc_now_ns());
}
