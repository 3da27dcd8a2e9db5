/*
 * reactor/timer.c — one-shot and periodic timers on a binary min-heap.
 *
 * Owns: the heap array (16,384 timers at start-up, doubled as more are
 * armed, up to timers_max: only then does arming fail) and the list of
 * zero-delay one-shots ("soon"), which takes no slot: deferring a callback
 * to the next pass never fails. Timers themselves are embedded in their
 * users' structs. Thread: the reactor's.
 * Order: by deadline, then by arming sequence, so timers due at the same
 * instant fire in the order they were armed; the soon list is in arming
 * order, so its deadlines (the arming times) are sorted too, and a pass
 * merges it with the heap. The loop sleeps until the
 * earliest deadline (see rx_timers_next_ns), so no timer SQEs are needed.
 * A periodic timer is re-armed from its previous deadline (no drift), but
 * skips missed periods instead of firing a burst after a stall.
 */
#include <errno.h>
#include <stdlib.h>

#include "rx_internal.h"
#include "stall.h"

#define IDLE UINT32_MAX
#define SOON (UINT32_MAX - 1) /* on the soon list */

static bool before(const struct rx_timer *a, const struct rx_timer *b)
{
	if (a->deadline_ns != b->deadline_ns)
		return a->deadline_ns < b->deadline_ns;
	return a->seq < b->seq;
}

static void place(struct rx_reactor *r, unsigned i, struct rx_timer *t)
{
	r->heap[i] = t;
	t->heap_idx = i;
}

static void sift_up(struct rx_reactor *r, unsigned i)
{
	struct rx_timer *t = r->heap[i];
	while (i > 0) {
		unsigned parent = (i - 1) / 2;
		if (!before(t, r->heap[parent]))
			break;
		place(r, i, r->heap[parent]);
		i = parent;
	}
	place(r, i, t);
}

static void sift_down(struct rx_reactor *r, unsigned i)
{
	struct rx_timer *t = r->heap[i];
	for (;;) {
		unsigned l = 2 * i + 1, m = i;
		struct rx_timer *best = t;
		if (l < r->heap_n && before(r->heap[l], best)) {
			m = l;
			best = r->heap[l];
		}
		if (l + 1 < r->heap_n && before(r->heap[l + 1], best)) {
			m = l + 1;
			best = r->heap[l + 1];
		}
		if (m == i)
			break;
		place(r, i, best);
		i = m;
	}
	place(r, i, t);
}

static void heap_remove(struct rx_reactor *r, struct rx_timer *t)
{
	unsigned i = t->heap_idx;
	PC_ASSERT(i < r->heap_n && r->heap[i] == t);
	t->heap_idx = IDLE;
	r->heap_n--;
	if (i == r->heap_n)
		return;
	struct rx_timer *last = r->heap[r->heap_n];
	place(r, i, last);
	if (i > 0 && before(last, r->heap[(i - 1) / 2]))
		sift_up(r, i);
	else
		sift_down(r, i);
}

/* The heap's first size; it doubles as timers are armed, to timers_max. */
#define HEAP_FIRST 16384u

/* The most timers r may arm (at least one). */
static unsigned heap_max(const struct rx_reactor *r)
{
	return r->p.timers_max ? r->p.timers_max : 1;
}

int rx_timers_init(struct rx_reactor *r)
{
	unsigned max = heap_max(r);
	r->heap_cap = max < HEAP_FIRST ? max : HEAP_FIRST;
	r->heap = calloc(r->heap_cap, sizeof(*r->heap));
	return r->heap ? 0 : -ENOMEM;
}

/* Room for one more armed timer: 0, -ENOSPC (timers_max are armed) or
 * -ENOMEM. Timers hold their index, never the heap's address. */
static int heap_room(struct rx_reactor *r)
{
	unsigned max = heap_max(r);
	if (r->heap_n < r->heap_cap)
		return 0;
	if (r->heap_cap >= max) {
		PC_LOG_RL(PC_LOG_WARN, "reactor", "all %u timer slots in use",
			  max);
		return -ENOSPC;
	}
	unsigned cap = r->heap_cap > max / 2 ? max : r->heap_cap * 2;
	struct rx_timer **h = realloc(r->heap, (size_t)cap * sizeof(*h));
	if (!h) {
		PC_LOG_RL(PC_LOG_WARN, "reactor", "%u timers armed: no memory "
			  "for more", r->heap_n);
		return -ENOMEM;
	}
	r->heap = h;
	r->heap_cap = cap;
	return 0;
}

static void soon_add(struct rx_reactor *r, struct rx_timer *t)
{
	t->heap_idx = SOON;
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
	PC_DASSERT(t->heap_idx == SOON);
	if (t->soon_prev)
		t->soon_prev->soon_next = t->soon_next;
	else
		r->soon_head = t->soon_next;
	if (t->soon_next)
		t->soon_next->soon_prev = t->soon_prev;
	else
		r->soon_tail = t->soon_prev;
	t->soon_prev = t->soon_next = NULL;
	t->heap_idx = IDLE;
}

/* Take an armed t off the heap or the soon list. */
static void unlink_armed(struct rx_reactor *r, struct rx_timer *t)
{
	if (t->heap_idx == SOON)
		soon_remove(r, t);
	else
		heap_remove(r, t);
}

void rx_timers_fini(struct rx_reactor *r)
{
	while (r->soon_head)
		soon_remove(r, r->soon_head);
	for (unsigned i = 0; i < r->heap_n; i++)
		r->heap[i]->heap_idx = IDLE;
	r->heap_n = 0;
	r->heap_cap = 0;
	free(r->heap);
	r->heap = NULL;
}

void rx_timer_init(struct rx_timer *t,
		   void (*cb)(struct rx_reactor *r, struct rx_timer *t),
		   void *arg)
{
	t->deadline_ns = 0;
	t->period_ns = 0;
	t->seq = 0;
	t->heap_idx = IDLE;
	t->cb = cb;
	t->arg = arg;
	t->soon_prev = t->soon_next = NULL;
}

bool rx_timer_armed(const struct rx_timer *t)
{
	return t->heap_idx != IDLE;
}

int rx_timer_start(struct rx_reactor *r, struct rx_timer *t, uint64_t delay_ns,
		   uint64_t period_ns)
{
	bool soon = delay_ns == 0 && period_ns == 0;
	/* A slot first, for a timer not on the heap yet: failing leaves t as
	 * it was (a queued zero-delay timer stays queued). One on the heap
	 * gives its slot back as it moves. */
	if (!soon && (!rx_timer_armed(t) || t->heap_idx == SOON)) {
		int room = heap_room(r);
		if (room < 0)
			return room;
	}
	if (rx_timer_armed(t))
		unlink_armed(r, t);
	/* Use the live clock, not the iteration's cached time, so a timer armed
	 * late in a long iteration still waits its full delay. */
	t->deadline_ns = pc_now_ns() + delay_ns;
	t->period_ns = period_ns;
	t->seq = ++r->timer_seq;
	if (soon) {
		soon_add(r, t);
		return 0;
	}
	r->heap[r->heap_n] = t;
	t->heap_idx = r->heap_n++;
	sift_up(r, t->heap_idx);
	return 0;
}

void rx_timer_stop(struct rx_reactor *r, struct rx_timer *t)
{
	if (rx_timer_armed(t))
		unlink_armed(r, t);
}

/* The next timer to fire of those due at now and armed up to limit_seq:
 * the earlier of the heap's first and the soon list's first, or NULL. */
static struct rx_timer *next_due(struct rx_reactor *r, uint64_t now,
				 uint64_t limit_seq)
{
	struct rx_timer *h = r->heap_n ? r->heap[0] : NULL;
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
		if (t->period_ns) {
			uint64_t next = t->deadline_ns + t->period_ns;
			if (next <= now) /* stalled: skip missed periods */
				next = now + t->period_ns;
			t->deadline_ns = next;
			t->seq = ++r->timer_seq;
			r->heap[r->heap_n] = t;
			t->heap_idx = r->heap_n++;
			sift_up(r, t->heap_idx);
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
	if (r->heap_n == 0)
		return UINT64_MAX;
	uint64_t d = r->heap[0]->deadline_ns;
	uint64_t now = pc_now_ns();
	return d > now ? d - now : 0;
}

bool rx_timers_due(const struct rx_reactor *r)
{
	return r->soon_head ||
	       (r->heap_n > 0 && r->heap[0]->deadline_ns <= pc_now_ns());
}
