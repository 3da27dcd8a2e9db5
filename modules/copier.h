/*
 * modules/copier.h — page copies and checksums cut into slices on the
 * reactor, so that one large page move never holds a reactor for long.
 *
 * Owns: per reactor thread, the queue of copies still under way and the
 * zero-delay timer that resumes them on the next loop pass; the slice size
 * (copy_slice_bytes). Threading: everything on the reactor that started the
 * job; a job's done runs there.
 *
 * Invariants:
 *  - a loop pass copies (and sums) at most the slice size over all jobs
 *    (copier_copy counts what the calling pass already did), each job
 *    counted 1 KiB more for its caller's work per page, so a pass of
 *    copies stays near ~0.1 ms whatever the page size; with a time cap
 *    (copier_set_pass_max) it also ends once its copies and their done
 *    callbacks ran that long, whatever they cost per page; a job with its
 *    own slice takes at most that much of a pass (the queue waits behind
 *    it);
 *  - queued jobs take the passes in turn: one that the pass's budget ran
 *    out on goes behind the others, so a job waits at most a slice of each
 *    job queued before it (besides the slices jobs with a slice of their
 *    own take every pass), never their whole length; large requests under
 *    way together therefore finish about together, not one after another;
 *  - a job finishes exactly once: inline (copier_copy returns 1, done is
 *    not called) or later through done (copier_copy returned 0);
 *  - the sum (when asked) is pc_page_sum of the destination's bytes, taken
 *    slice by slice right after each slice is copied (still in cache);
 *  - copier_cancel_range ends every queued job touching a range with
 *    -ECANCELED before it touches another byte there (sessions call it when
 *    a client gives its memory up, so no page is ever half copied from
 *    memory that is no longer the client's); a job cancelled from a
 *    source means the rest of that memory is node memory now: kv's publish
 *    ends its batch there (the rest are not stored).
 */
#ifndef PC_MODULES_COPIER_H
#define PC_MODULES_COPIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/checksum.h"
#include "reactor/reactor.h"

struct copier_job {
	/* set by the caller */
	void *dst;      /* NULL: no copy, only the checksum of src (node
			 * memory, not guarded) in slices */
	const void *src;
	size_t len;
	bool guarded;   /* client memory on either side (common/guard.h) */
	bool sum;       /* compute the destination's checksum */
	size_t slice;   /* at most this many bytes of it a pass (0: the
			 * pass's budget): a background copy (the disk
			 * tier's write-through) that the requests arriving
			 * meanwhile must wait for only briefly */
	void (*done)(struct copier_job *j); /* when not finished inline */
	void *arg;
	/* results */
	int res;        /* 0, -EFAULT (client memory cut short), -ECANCELED */
	uint64_t sumv;  /* the checksum, when sum and res == 0 */
	/* private */
	size_t off;
	struct copier_job *next;
	struct pc_sum_state st;
};

/* Slice size for every reactor (init, main thread). */
void copier_set_slice(size_t bytes);
/* Also end a pass's copies once they ran ns (wall time since the pass's
 * first copy, checked between jobs and slices); 0 (the default): bytes
 * alone (init, main thread). */
void copier_set_pass_max(uint64_t ns);

/* Start a copy on reactor r (its own thread): 1 when it finished now
 * (j->res set, done not called), 0 when queued (done(j) later on r). */
int copier_copy(struct rx_reactor *r, struct copier_job *j);

/* Cancel queued jobs whose source or destination overlaps [base, base+len):
 * each completes (done) with -ECANCELED on a later pass. */
void copier_cancel_range(struct rx_reactor *r, const void *base, size_t len);

#endif /* PC_MODULES_COPIER_H */
