/*
 * reactor/ops.c — the reactor's op table: slots for operations in flight,
 * their user_data tags, SQE allocation and cancel, and the completion
 * dispatch table that each op kind registers into.
 *
 * Owns: r->ops (the slots and their free list) and r->on_cqe (one handler
 * per enum rx_op_type). Thread: the reactor's own.
 *
 * Why a file of its own: the files that start operations (conn.c, io.c,
 * listen.c, loop.c's messages) and the loop that reaps completions all
 * need the slots, and the loop must reach every kind's completion handler.
 * With the table here, and each kind registering its handler when the
 * reactor is created, every direct call goes downwards:
 *
 *      group.c            reactor threads, posts to them
 *         |
 *      loop.c             create/run/stop/destroy; messages, test ops
 *         |               (calls everything below)
 *    +----+-----+--------+
 *    |          |        |
 *  conn.c     io.c    listen.c    start ops, register their handlers
 *    |  \       |      /  |
 *    |   +---> ops.c <-+   |      slots, tags, SQEs, dispatch
 *    |                     |
 *    +-----> timer.c <-----+      timers (loop.c uses them too)
 *
 * Edges: loop -> conn, io, listen, ops, timer; conn -> ops, timer;
 * io -> ops; listen -> ops, timer; ops and timer call nothing in
 * reactor/ but the stall detector (stall.c, a leaf that times each
 * dispatched completion and timer callback). Calls upwards happen only through function pointers: the
 * dispatch table r->on_cqe (filled by rx_conn_ops_register(),
 * rx_io_ops_register(), rx_listen_ops_register() and loop.c) and timer
 * callbacks.
 *
 * Invariants: a slot is live from rx_op_alloc() to rx_op_free(); a
 * completion whose type, slot generation or liveness does not match is
 * counted as stale and dropped, never dispatched (user_data layout in
 * rx_internal.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "rx_internal.h"
#include "stall.h"

#define LOG_MOD "reactor"

/* -------------------------------------------------------------------- slots */

int rx_ops_init(struct rx_reactor *r)
{
	r->ops = calloc(r->p.ops_max, sizeof(*r->ops));
	if (!r->ops)
		return -ENOMEM;
	for (uint32_t i = 0; i < r->p.ops_max; i++)
		r->ops[i].next_free = i + 1 < r->p.ops_max ? i + 1 : RX_NO_OP;
	r->ops_free = 0;
	return 0;
}

void rx_ops_fini(struct rx_reactor *r)
{
	free(r->ops);
	r->ops = NULL;
}

uint32_t rx_op_alloc(struct rx_reactor *r, enum rx_op_type type, void *obj)
{
	uint32_t idx = r->ops_free;
	if (PC_UNLIKELY(idx == RX_NO_OP)) {
		RX_STAT_INC(r->st.ops_exhausted);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD,
			  "all %u op slots in use; refusing new I/O (raise "
			  "reactor_ops_max)", r->p.ops_max);
		return RX_NO_OP;
	}
	struct rx_op *op = &r->ops[idx];
	PC_DASSERT(!op->live);
	r->ops_free = op->next_free;
	op->gen = (op->gen + 1) & RX_UD_GEN_MASK;
	op->type = (uint8_t)type;
	op->live = 1;
	op->flags = 0;
	op->obj = obj;
	RX_STAT_INC(r->st.ops_in_use);
	return idx;
}

void rx_op_free(struct rx_reactor *r, uint32_t idx)
{
	struct rx_op *op = &r->ops[idx];
	PC_ASSERT(op->live);
	op->live = 0;
	op->type = RX_OP_NONE;
	op->obj = NULL;
	op->next_free = r->ops_free;
	r->ops_free = idx;
	RX_STAT_ADD(r->st.ops_in_use, (uint64_t)-1);
}

uint64_t rx_op_ud(const struct rx_reactor *r, uint32_t idx)
{
	const struct rx_op *op = &r->ops[idx];
	return ((uint64_t)op->type << RX_UD_TYPE_SHIFT) |
	       ((uint64_t)(op->gen & RX_UD_GEN_MASK) << RX_UD_GEN_SHIFT) | idx;
}

struct io_uring_sqe *rx_op_start(struct rx_reactor *r, enum rx_op_type type,
				 void *obj, uint32_t *idx)
{
	*idx = rx_op_alloc(r, type, obj);
	if (*idx == RX_NO_OP)
		return NULL;
	bool refuse = (type == RX_OP_SEND || type == RX_OP_RECV ||
		       type == RX_OP_CONNECT) && rx_fault_sqe();
	struct io_uring_sqe *sqe = refuse ? NULL : rx_sqe(r);
	if (!sqe) {
		rx_op_free(r, *idx);
		*idx = RX_NO_OP;
	}
	return sqe;
}

struct io_uring_sqe *rx_sqe(struct rx_reactor *r)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
	for (int tries = 0; !sqe && tries < 4; tries++) {
		/* SQ full: push what is queued to the kernel and retry. */
		RX_STAT_INC(r->st.sq_full);
		int ret = io_uring_submit(&r->ring);
		if (ret < 0 && ret != -EAGAIN && ret != -EBUSY && ret != -EINTR)
			PC_LOG_RL(PC_LOG_ERROR, LOG_MOD, "submit failed: %s",
				  strerror(-ret));
		sqe = io_uring_get_sqe(&r->ring);
	}
	if (!sqe)
		PC_LOG_RL(PC_LOG_ERROR, LOG_MOD,
			  "submission queue stays full; refusing new I/O");
	return sqe;
}

void rx_cancel_op(struct rx_reactor *r, uint32_t idx)
{
	struct io_uring_sqe *sqe = rx_sqe(r);
	if (!sqe)
		return;
	io_uring_prep_cancel64(sqe, rx_op_ud(r, idx), 0);
	io_uring_sqe_set_data64(sqe, 0);
}

/* ----------------------------------------------------------------- dispatch */

void rx_op_register(struct rx_reactor *r, enum rx_op_type type, rx_cqe_fn fn)
{
	PC_ASSERT(type > RX_OP_NONE && type < RX_OP__COUNT && !r->on_cqe[type]);
	r->on_cqe[type] = fn;
}

void rx_op_dispatch(struct rx_reactor *r, const struct io_uring_cqe *cqe)
{
	uint64_t ud = cqe->user_data;
	if (ud == 0)
		return; /* cancel/remove requests: their result is not needed */
	unsigned type = (unsigned)(ud >> RX_UD_TYPE_SHIFT);
	uint32_t gen = (uint32_t)(ud >> RX_UD_GEN_SHIFT) & RX_UD_GEN_MASK;
	uint32_t idx = (uint32_t)ud;
	struct rx_op *op = idx < r->p.ops_max ? &r->ops[idx] : NULL;
	if (!op || type >= RX_OP__COUNT || !op->live || op->type != type ||
	    op->gen != gen || !r->on_cqe[type]) {
		RX_STAT_INC(r->st.stale_cqes);
		PC_LOGD(LOG_MOD, "dropped stale completion type=%u slot=%u gen=%u "
			"res=%d", type, idx, gen, cqe->res);
		return;
	}
	static const char *const names[RX_OP__COUNT] = {
		[RX_OP_RECV] = "recv", [RX_OP_READ] = "read",
		[RX_OP_SEND] = "send", [RX_OP_CONNECT] = "connect",
		[RX_OP_ACCEPT] = "accept", [RX_OP_POLL] = "poll",
		[RX_OP_FILE] = "file", [RX_OP_MSG] = "message",
		[RX_OP_TEST] = "test"};
	/* The connection ops carry their rx_conn: its id names the stall. */
	uint64_t conn = type <= RX_OP_CONNECT && op->obj
				? ((const struct rx_conn *)op->obj)->id
				: 0;
	uint64_t t0 = rx_stall_begin();
	r->on_cqe[type](r, op, cqe, idx);
	rx_stall_end(r, t0, "completion", names[type], conn);
}
