/*
 * modules/copier.c — see copier.h. Why slices on the reactor and not worker
 * threads: a page being copied from a client's shared memory must stop the
 * moment the client gives that memory up (the session swaps the mapping on
 * the reactor thread); on the reactor that is a check between slices, with
 * worker threads it would be a race. On the 2-core machine extra threads
 * would also compete with the reactors for the same cores. Measured in
 * docs/architecture.md ("Local clients on every core").
 */
#include <errno.h>
#include <string.h>

#include "common/copy.h"
#include "common/guard.h"
#include "common/util.h"
#include "modules/copier.h"
#include "reactor/stall.h"

#define COPIER_SLICE_DEFAULT (512u << 10)

static size_t g_slice = COPIER_SLICE_DEFAULT;
static uint64_t g_pass_ns; /* 0: no time cap (copier_set_pass_max) */

/* What a job costs a pass besides its bytes: the caller's work per page
 * (pin, unpin, bookkeeping; ~0.1-0.2 us, the time of ~1 KiB of copy and
 * sum). Without it a pass of 64-byte pages (8,192 of them in 512 KiB)
 * took over a millisecond. */
#define COPIER_JOB_BYTES 1024u

/* Per reactor thread (one reactor per thread). */
static _Thread_local struct {
	struct copier_job *head, *tail;
	struct rx_timer timer;
	bool timer_ready;
	uint64_t pass;   /* rx_now_ns of the pass that used `used` */
	uint64_t t0;     /* the clock when the copier first ran in it */
	size_t used;     /* bytes copied in that pass */
	unsigned fg;     /* queued jobs without a slice of their own */
} t;

void copier_set_slice(size_t bytes)
{
	g_slice = bytes ? bytes : COPIER_SLICE_DEFAULT;
}

void copier_set_pass_max(uint64_t ns)
{
	g_pass_ns = ns;
}

/* Bytes this pass may still copy: none once it copied its slice, or (with
 * a time cap) once the copies it ran took that long — jobs whose callers
 * do much more per page than COPIER_JOB_BYTES stands for (a session set
 * of 64-byte pages: a guarded copy, then a checksum, a pool commit and a
 * record per page) end the pass by time before they reach its bytes. */
static size_t budget(struct rx_reactor *r)
{
	if (t.pass != rx_now_ns(r)) {
		t.pass = rx_now_ns(r);
		t.used = 0;
		t.t0 = g_pass_ns ? pc_now_ns() : 0;
	}
	if (t.used >= g_slice)
		return 0;
	if (g_pass_ns && t.used && pc_now_ns() - t.t0 >= g_pass_ns) {
		t.used = g_slice; /* the pass is over for every job */
		return 0;
	}
	return g_slice - t.used;
}

/* Copy (and sum) up to room bytes of j; true when j is complete. */
static bool job_run(struct copier_job *j, size_t room)
{
	if (j->off == 0)
		t.used += COPIER_JOB_BYTES;
	size_t n = PC_MIN(room, j->len - j->off);
	const uint8_t *s = (const uint8_t *)j->src + j->off;
	if (!j->dst) { /* a checksum of the source only */
		if (j->sum)
			pc_sum_update(&j->st, s, n);
	} else {
		uint8_t *d = (uint8_t *)j->dst + j->off;
		if (j->guarded)
			j->res = pc_guarded_copy(d, s, n);
		else
			pc_copy(d, s, n);
		if (!j->res && j->sum)
			pc_sum_update(&j->st, d, n);
	}
	j->off += n;
	t.used += n;
	if (j->res || j->off < j->len)
		return j->res != 0;
	if (j->sum)
		j->sumv = pc_sum_digest(&j->st);
	return true;
}

static void fired(struct rx_reactor *r, struct rx_timer *tm);

/* Run queued jobs within this pass's budget. A job with a slice of its own
 * takes at most that much of a pass, and the jobs behind it go on
 * meanwhile. A job the pass's budget ran out on goes to the back of the
 * queue: the jobs take the passes in turn (one job a request at a time:
 * kv's sets and gets copy page by page), so a request's copy queued behind
 * large ones waits a slice of each, not all of their pages. */
static void drain(struct rx_reactor *r)
{
	size_t room = budget(r);
	struct copier_job **at = &t.head, *prev = NULL;
	while (*at && room) {
		struct copier_job *j = *at;
		bool capped = j->slice != 0;
		bool fin = j->res ? true
				  : job_run(j, capped ? PC_MIN(room, j->slice)
						      : room);
		room = budget(r);
		if (!fin && capped) { /* its slice for this pass is done */
			prev = j;
			at = &j->next;
			continue;
		}
		if (!fin) {
			if (j->next) { /* to the back: the others go first */
				*at = j->next;
				j->next = NULL;
				t.tail->next = j;
				t.tail = j;
			}
			break;
		}
		*at = j->next;
		if (t.tail == j)
			t.tail = prev;
		t.fg -= !j->slice;
		j->done(j); /* may queue new jobs (and arm) */
		/* ... or copy some inline, out of this pass's budget: room
		 * from before it would let this pass copy up to 2 slices. */
		room = budget(r);
	}
	if (t.head && !rx_timer_armed(&t.timer))
		rx_timer_start(r, &t.timer, 0, 0); /* zero delay: never fails */
}

static void fired(struct rx_reactor *r, struct rx_timer *tm)
{
	(void)tm;
	rx_stall_tag("copier slices");
	drain(r);
}

/* The timer that resumes the queue is armed (it is whenever jobs are
 * queued). A zero-delay timer takes no slot: arming it never fails. */
static void arm(struct rx_reactor *r)
{
	if (!t.timer_ready) {
		rx_timer_init(&t.timer, fired, NULL);
		t.timer_ready = true;
	}
	if (!rx_timer_armed(&t.timer))
		rx_timer_start(r, &t.timer, 0, 0);
}

int copier_copy(struct rx_reactor *r, struct copier_job *j)
{
	j->res = 0;
	j->off = 0;
	j->next = NULL;
	if (j->sum)
		pc_sum_reset(&j->st);
	/* Behind queued jobs a new one waits its turn (those with a slice of
	 * their own let it pass); else it starts now. */
	if (!t.fg) {
		size_t room = budget(r);
		if (j->slice)
			room = PC_MIN(room, j->slice);
		if (room && job_run(j, room))
			return 1;
	}
	arm(r);
	if (t.tail)
		t.tail->next = j;
	else
		t.head = j;
	t.tail = j;
	t.fg += !j->slice;
	return 0;
}

static bool overlaps(const void *a, size_t alen, const void *b, size_t blen)
{
	uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
	return a && x < y + blen && y < x + alen;
}

void copier_cancel_range(struct rx_reactor *r, const void *base, size_t len)
{
	(void)r;
	for (struct copier_job *j = t.head; j; j = j->next)
		if (!j->res && (overlaps(j->dst, j->len, base, len) ||
				overlaps(j->src, j->len, base, len)))
			j->res = -ECANCELED;
}
