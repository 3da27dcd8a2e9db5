/*
 * reactor/io.c — watches on foreign fds, and file I/O for the disk tier.
 *
 * Owns: struct rx_watch; the per-op state of file reads/writes/fsyncs (kept
 * in the op slot). Thread: the reactor's.
 *
 * A watch is a multishot poll: each readiness edge becomes a callback, which
 * must treat it as a hint and drain its fd until EAGAIN (RDMA completion
 * channels, rdma_cm event channels). A watch is freed on the poll's final
 * completion after rx_watch_cancel(); the slot is released only after the
 * callback returns, so a callback may cancel its own watch.
 *
 * File ops resume short transfers in the same slot until the whole length
 * moved (reads stop early at EOF), so callers see one completion per request.
 * After a write or fsync error the data must be treated as lost: we report
 * the error and never retry it.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "rx_internal.h"

#define LOG_MOD "io"
#define FILE_CHUNK_MAX (1u << 30) /* per-SQE length: the kernel takes u32 */

/* -------------------------------------------------------------- fd watches */

static int watch_arm(struct rx_watch *w)
{
	struct rx_reactor *r = w->r;
	uint32_t idx;
	struct io_uring_sqe *sqe = rx_op_start(r, RX_OP_POLL, w, &idx);
	if (!sqe)
		return -EBUSY;
	io_uring_prep_poll_multishot(sqe, w->fd, w->events);
	rx_op_tag(r, sqe, idx);
	w->op = idx;
	return 0;
}

static void watch_retry(struct rx_reactor *r, struct rx_timer *t);

struct rx_watch *rx_watch_fd(struct rx_reactor *r, int fd, uint32_t events,
			     rx_watch_fn cb, void *arg, int *err)
{
	if (r->state != RX_RUNNING) {
		*err = -ESHUTDOWN;
		return NULL;
	}
	struct rx_watch *w = calloc(1, sizeof(*w));
	if (!w) {
		*err = -ENOMEM;
		return NULL;
	}
	w->r = r;
	w->fd = fd;
	w->events = events;
	w->cb = cb;
	w->arg = arg;
	w->op = RX_NO_OP;
	rx_timer_init(&w->retry, watch_retry, w);
	*err = watch_arm(w);
	if (*err) {
		free(w);
		return NULL;
	}
	RX_LIST_ADD(r->watches, w);
	return w;
}

static void watch_free(struct rx_watch *w)
{
	if (rx_timer_armed(&w->retry))
		rx_timer_stop(w->r, &w->retry);
	RX_LIST_DEL(w->r->watches, w);
	free(w);
}

/*
 * Ask the kernel to end w's poll. A removal that meets the poll while it
 * fires finds nothing to remove (-EALREADY) and the poll stays armed: if
 * the wake-up finds events, its completion still says "more" and
 * watch_on_poll asks again; if the fd was drained meanwhile, the poll
 * re-arms without a completion, so a timer asks again until the poll's
 * last completion frees the watch.
 */
static void watch_remove(struct rx_watch *w)
{
	struct io_uring_sqe *sqe = rx_sqe(w->r);
	if (sqe) {
		io_uring_prep_poll_remove(sqe, rx_op_ud(w->r, w->op));
		io_uring_sqe_set_data64(sqe, 0);
	}
	if (!rx_timer_armed(&w->retry))
		rx_timer_start(w->r, &w->retry, RX_MS(5), 0);
}

static void watch_retry(struct rx_reactor *r, struct rx_timer *t)
{
	struct rx_watch *w = t->arg;
	(void)r;
	if (w->op != RX_NO_OP)
		watch_remove(w);
}

static void watch_on_poll(struct rx_reactor *r, struct rx_op *op,
			  const struct io_uring_cqe *cqe, uint32_t idx)
{
	struct rx_watch *w = op->obj;
	bool more = (cqe->flags & IORING_CQE_F_MORE) != 0;
	int res = cqe->res;
	if (res >= 0 && !w->cancelled) {
		w->cb(w, (uint32_t)res, w->arg);
	} else if (res < 0 && res != -ECANCELED && !w->cancelled) {
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "watch on fd %d failed: %s",
			  w->fd, strerror(-res));
		w->cb(w, POLLNVAL, w->arg); /* tell the owner it is dead */
	}
	if (more) {
		if (w->cancelled)
			watch_remove(w);
		return;
	}
	rx_op_free(r, idx);
	w->op = RX_NO_OP;
	if (w->cancelled)
		watch_free(w);
	else if (res >= 0 && watch_arm(w) < 0)
		PC_LOG_RL(PC_LOG_ERROR, LOG_MOD, "cannot re-arm watch on fd %d",
			  w->fd);
}

void rx_watch_cancel(struct rx_watch *w)
{
	if (w->cancelled)
		return;
	w->cancelled = true;
	if (w->op == RX_NO_OP) {
		watch_free(w);
		return;
	}
	watch_remove(w);
}

void rx_watches_cancel_all(struct rx_reactor *r)
{
	for (struct rx_watch *w = r->watches, *next; w; w = next) {
		next = w->next;
		rx_watch_cancel(w);
	}
}

void rx_watches_destroy(struct rx_reactor *r)
{
	while (r->watches)
		watch_free(r->watches);
}

/* ---------------------------------------------------------------- file I/O */

static int file_submit(struct rx_reactor *r, uint32_t idx)
{
	struct rx_op *op = &r->ops[idx];
	struct io_uring_sqe *sqe = rx_sqe(r);
	if (!sqe)
		return -EBUSY;
	uint64_t left = op->u.file.len - op->u.file.done;
	unsigned n = (unsigned)PC_MIN(left, (uint64_t)FILE_CHUNK_MAX);
	uint8_t *p = op->u.file.buf + op->u.file.done;
	uint64_t off = op->u.file.off + op->u.file.done;
	switch (op->u.file.kind) {
	case RX_FILE_READ:
		io_uring_prep_read(sqe, op->u.file.fd, p, n, off);
		break;
	case RX_FILE_WRITE:
		io_uring_prep_write(sqe, op->u.file.fd, p, n, off);
		/* To the kernel's workers: a write's inline issue (O_DIRECT,
		 * or a buffered write that must wait) holds the loop's
		 * submit, and every reply queued with it, for its duration;
		 * a write has no one waiting for its latency. */
		io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
		break;
	default:
		io_uring_prep_fsync(sqe, op->u.file.fd,
				    op->u.file.datasync ? IORING_FSYNC_DATASYNC
							: 0);
		break;
	}
	rx_op_tag(r, sqe, idx);
	return 0;
}

static int file_start(struct rx_reactor *r, enum rx_file_kind kind, int fd,
		      void *buf, size_t len, uint64_t off, bool datasync,
		      rx_io_fn cb, void *arg)
{
	if (r->state == RX_CANCELLING || r->state == RX_DONE)
		return -ESHUTDOWN;
	uint32_t idx = rx_op_alloc(r, RX_OP_FILE, NULL);
	if (idx == RX_NO_OP)
		return -EBUSY;
	struct rx_op *op = &r->ops[idx];
	op->u.file.cb = cb;
	op->u.file.arg = arg;
	op->u.file.buf = buf;
	op->u.file.len = len;
	op->u.file.off = off;
	op->u.file.done = 0;
	op->u.file.fd = fd;
	op->u.file.kind = (uint8_t)kind;
	op->u.file.datasync = datasync;
	int ret = file_submit(r, idx);
	if (ret < 0)
		rx_op_free(r, idx);
	return ret;
}

int rx_file_read(struct rx_reactor *r, int fd, void *buf, size_t len,
		 uint64_t off, rx_io_fn cb, void *arg)
{
	return file_start(r, RX_FILE_READ, fd, buf, len, off, false, cb, arg);
}

int rx_file_write(struct rx_reactor *r, int fd, const void *buf, size_t len,
		  uint64_t off, rx_io_fn cb, void *arg)
{
	return file_start(r, RX_FILE_WRITE, fd, (void *)(uintptr_t)buf, len, off,
			  false, cb, arg);
}

int rx_file_fsync(struct rx_reactor *r, int fd, bool datasync, rx_io_fn cb,
		  void *arg)
{
	return file_start(r, RX_FILE_FSYNC, fd, NULL, 0, 0, datasync, cb, arg);
}

static void file_on_cqe(struct rx_reactor *r, struct rx_op *op,
			const struct io_uring_cqe *cqe, uint32_t idx)
{
	int res = cqe->res;
	int64_t result;
	if (res == -EAGAIN || res == -EINTR) {
		if (file_submit(r, idx) == 0)
			return;
		result = -EBUSY;
	} else if (res < 0) {
		result = res;
	} else if (op->u.file.kind == RX_FILE_FSYNC) {
		result = 0;
	} else {
		op->u.file.done += (uint64_t)res;
		bool eof = res == 0;
		if (eof && op->u.file.kind == RX_FILE_WRITE) {
			result = -EIO; /* a write that moves nothing: give up */
		} else if (!eof && op->u.file.done < op->u.file.len) {
			if (file_submit(r, idx) == 0)
				return; /* short transfer: continue */
			result = -EBUSY;
		} else {
			result = (int64_t)op->u.file.done;
		}
	}
	rx_io_fn cb = op->u.file.cb;
	void *arg = op->u.file.arg;
	rx_op_free(r, idx);
	RX_STAT_INC(r->st.file_ops);
	cb(arg, result);
}

void rx_io_ops_register(struct rx_reactor *r)
{
	rx_op_register(r, RX_OP_POLL, watch_on_poll);
	rx_op_register(r, RX_OP_FILE, file_on_cqe);
}
