/*
 * reactor/loop.c — ring setup and probing, the loop itself, shutdown, and
 * cross-thread messages. The op table and completion dispatch are in ops.c
 * (with the graph of which reactor file calls which).
 *
 * Owns: struct rx_reactor's lifetime. Thread: the reactor's own, except
 * rx_post() which any thread may call (it only touches the mutex-protected
 * message queue and the eventfd).
 *
 * One loop iteration: cache the time; run due timers; service the pending
 * connection list (flush queued output as one sendmsg per connection, re-feed
 * resumed input, finalise closed connections); return used receive buffers to
 * the kernel; submit everything and wait for at least one completion or the
 * next timer deadline, in one io_uring_enter; hand every completion to
 * rx_op_dispatch() (ops.c), which picks its kind's handler after checking
 * the slot generation.
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "fault.h"
#include "rx_internal.h"
#include "stall.h"

#define LOG_MOD "reactor"

void rx_params_default(struct rx_params *p)
{
	memset(p, 0, sizeof(*p));
	p->sq_entries = 1024;
	p->cq_factor = 8;
	p->ops_max = 16384;
	/* Every call in flight may arm a few (its deadline, its RPCs, its
	 * transfers): a bound no node budget lets clients reach. */
	p->timers_max = 1u << 22;
	p->buf_count = 512;
	p->buf_bytes = 16384;
	p->conn_in_max = 1u << 20;
	p->conn_out_high = 4u << 20;
	p->conn_out_low = 1u << 20;
	p->conn_out_max = 64u << 20;
	p->shutdown_grace_ms = 5000;
	p->idle_poll_yield_max_ns = 20000;
}

/* ----------------------------------------------------------------- messages */

static void msg_on_cqe(struct rx_reactor *r, struct rx_op *op,
		       const struct io_uring_cqe *cqe, uint32_t idx);

static void msg_arm(struct rx_reactor *r)
{
	uint32_t idx;
	struct io_uring_sqe *sqe = rx_op_start(r, RX_OP_MSG, NULL, &idx);
	if (!sqe) {
		/* Messages would be stranded: this reactor cannot work. */
		PC_LOGE(LOG_MOD, "cannot arm the message doorbell");
		abort();
	}
	io_uring_prep_read(sqe, r->efd, &r->efd_val, sizeof(r->efd_val), 0);
	rx_op_tag(r, sqe, idx);
	r->msg_op = idx;
}

static struct rx_msg *msg_take_all(struct rx_reactor *r)
{
	pthread_mutex_lock(&r->msg_lock);
	struct rx_msg *m = r->msg_head;
	r->msg_head = r->msg_tail = NULL;
	pthread_mutex_unlock(&r->msg_lock);
	return m;
}

static void msg_run_list(struct rx_reactor *r, struct rx_msg *m)
{
	while (m) {
		struct rx_msg *next = m->next;
		bool heap = m->heap;
		RX_STAT_INC(r->st.msgs);
		m->fn(r, m->arg); /* may free a poster's own m */
		if (heap)
			free(m);
		m = next;
	}
}

static void msg_on_cqe(struct rx_reactor *r, struct rx_op *op,
		       const struct io_uring_cqe *cqe, uint32_t idx)
{
	(void)op;
	rx_op_free(r, idx);
	r->msg_op = RX_NO_OP;
	/* Re-arm before draining: a post racing with the drain then either lands
	 * in this drain or rings the bell again — never lost. */
	if (cqe->res != -ECANCELED && r->state != RX_DONE)
		msg_arm(r);
	msg_run_list(r, msg_take_all(r));
}

static void msg_enqueue(struct rx_reactor *target, struct rx_msg *m)
{
	m->next = NULL;
	pthread_mutex_lock(&target->msg_lock);
	bool was_empty = target->msg_head == NULL;
	if (target->msg_tail)
		target->msg_tail->next = m;
	else
		target->msg_head = m;
	target->msg_tail = m;
	pthread_mutex_unlock(&target->msg_lock);
	if (was_empty) {
		uint64_t one = 1;
		/* Only the empty->non-empty edge rings: one wake-up per batch. */
		ssize_t w = write(target->efd, &one, sizeof(one));
		(void)w;
	}
}

int rx_post(struct rx_reactor *target, void (*fn)(struct rx_reactor *r,
						  void *arg),
	    void *arg)
{
	struct rx_msg *m = malloc(sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->fn = fn;
	m->arg = arg;
	m->heap = true;
	msg_enqueue(target, m);
	return 0;
}

void rx_post_msg(struct rx_reactor *target, struct rx_msg *m,
		 void (*fn)(struct rx_reactor *r, void *arg), void *arg)
{
	m->fn = fn;
	m->arg = arg;
	m->heap = false;
	msg_enqueue(target, m);
}

/* --------------------------------------------------------------- test hooks */

static void test_on_cqe(struct rx_reactor *r, struct rx_op *op,
			const struct io_uring_cqe *cqe, uint32_t idx)
{
	void (*fn)(void *) = op->u.test.fn;
	void *arg = op->u.test.arg;
	(void)cqe;
	rx_op_free(r, idx);
	if (fn)
		fn(arg);
}

int rx_test_submit_nop(struct rx_reactor *r, uint64_t user_data)
{
	struct io_uring_sqe *sqe = rx_sqe(r);
	if (!sqe)
		return -EBUSY;
	io_uring_prep_nop(sqe);
	io_uring_sqe_set_data64(sqe, user_data);
	return 0;
}

uint64_t rx_test_stale_user_data(struct rx_reactor *r)
{
	uint32_t idx = rx_op_alloc(r, RX_OP_TEST, NULL);
	PC_ASSERT(idx != RX_NO_OP);
	uint64_t ud = rx_op_ud(r, idx);
	rx_op_free(r, idx);
	return ud;
}

int rx_test_nop(struct rx_reactor *r, void (*fn)(void *arg), void *arg,
		uint64_t *user_data)
{
	uint32_t idx = rx_op_alloc(r, RX_OP_TEST, NULL);
	if (idx == RX_NO_OP)
		return -EBUSY;
	r->ops[idx].u.test.fn = fn;
	r->ops[idx].u.test.arg = arg;
	*user_data = rx_op_ud(r, idx);
	int ret = rx_test_submit_nop(r, *user_data);
	if (ret)
		rx_op_free(r, idx);
	return ret;
}

/* ------------------------------------------------------------------ reaping */

/* Every completion the loop runs goes through the one rx_op_dispatch() call
 * below (timers and pending connections aside): the place to time them. */
static void reap(struct rx_reactor *r)
{
	struct io_uring_cqe *batch[256];
	unsigned n;
	while ((n = io_uring_peek_batch_cqe(&r->ring, batch,
					    PC_ARRAY_LEN(batch))) > 0) {
		for (unsigned i = 0; i < n; i++)
			rx_op_dispatch(r, batch[i]);
		io_uring_cq_advance(&r->ring, n);
		RX_STAT_ADD(r->st.cqes, n);
		if (r->p.idle_poll_ns) /* capped at create: no wrap */
			r->poll_until_ns = pc_now_ns() + r->p.idle_poll_ns;
	}
}

/* Idle polling, Seastar's way: after a pass that handled completions the
 * loop does not go to sleep at once but keeps asking the kernel for
 * completions (running its deferred task work) until p.idle_poll_ns have
 * passed since the last one, or until "until" (the next timer). A request
 * that follows a reply within that window — the READs after a lookup, a
 * client's next call — is then taken without waking an idle CPU, which
 * costs 35-70 us on a VM. Between two tries the thread yields, so anything
 * else runnable on its CPU goes first; a yield that kept it off the CPU
 * longer than p.idle_poll_yield_max_ns gave the CPU to another thread's
 * time slice, and polling on would wait for such slices where a sleeping
 * reactor is woken by its completion at once: the poll ends there. The
 * time polled counts as waiting, not as the pass's busy time.
 * true: a completion is ready; *end: the time the poll ended. */
static bool idle_poll(struct rx_reactor *r, uint64_t from, uint64_t until,
		      uint64_t *end)
{
	bool ready = false;
	unsigned tries = 0;
	uint64_t now = from;
	for (;;) {
		int ret = io_uring_submit_and_get_events(&r->ring);
		tries++;
		now = pc_now_ns();
		if (io_uring_cq_ready(&r->ring)) {
			ready = true;
			break;
		}
		if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY)
			break; /* the wait that follows reports it */
		if (now >= until)
			break;
		sched_yield();
		uint64_t back = pc_now_ns();
		if (back - now > r->p.idle_poll_yield_max_ns) {
			now = back;
			RX_STAT_INC(r->st.idle_poll_yielded);
			break;
		}
	}
	/* What the first try finds is mostly the pass's own submissions (a
	 * reply's send completes inline): a hit is what came after a yield. */
	if (ready && tries > 1)
		RX_STAT_INC(r->st.idle_poll_hits);
	RX_STAT_ADD(r->st.idle_poll_ns, now - from);
	*end = now;
	return ready;
}

/* ---------------------------------------------------------------- lifecycle */

static void log_probe(struct rx_reactor *r, const struct io_uring_params *up,
		      unsigned setup_flags)
{
	struct io_uring_probe *pr = io_uring_get_probe_ring(&r->ring);
	struct utsname un;
	uname(&un);
	static const struct {
		int op;
		const char *name;
	} optional[] = {
		{IORING_OP_SEND_ZC, "send_zc"},
		{IORING_OP_MSG_RING, "msg_ring"},
		{IORING_OP_SOCKET, "socket"},
	};
	char opt[128] = "";
	size_t len = 0;
	for (size_t i = 0; i < PC_ARRAY_LEN(optional); i++) {
		bool ok = pr && io_uring_opcode_supported(pr, optional[i].op);
		len += (size_t)snprintf(opt + len, sizeof(opt) - len, " %s=%s",
					optional[i].name, ok ? "yes" : "no");
		if (len >= sizeof(opt))
			break;
	}
	PC_LOGI(LOG_MOD,
		"io_uring set up: kernel %s, sq=%u cq=%u, defer_taskrun=%s, "
		"multishot recv/accept, provided buffers %u x %u B;%s",
		un.release, up->sq_entries, up->cq_entries,
		(setup_flags & IORING_SETUP_DEFER_TASKRUN) ? "yes" : "no",
		r->p.buf_count, r->p.buf_bytes, opt);
	if (pr)
		io_uring_free_probe(pr);
}

static int check_required_ops(struct rx_reactor *r)
{
	static const struct {
		int op;
		const char *name;
	} need[] = {
		{IORING_OP_NOP, "nop"},
		{IORING_OP_READ, "read"},
		{IORING_OP_WRITE, "write"},
		{IORING_OP_FSYNC, "fsync"},
		{IORING_OP_SENDMSG, "sendmsg"},
		{IORING_OP_RECV, "recv"},
		{IORING_OP_ACCEPT, "accept"},
		{IORING_OP_CONNECT, "connect"},
		{IORING_OP_POLL_ADD, "poll_add"},
		{IORING_OP_POLL_REMOVE, "poll_remove"},
		{IORING_OP_ASYNC_CANCEL, "async_cancel"},
	};
	struct io_uring_probe *pr = io_uring_get_probe_ring(&r->ring);
	if (!pr) {
		PC_LOGE(LOG_MOD, "io_uring opcode probe failed (kernel too old; "
			"need Linux 6.0 or newer)");
		return -ENOSYS;
	}
	int ret = 0;
	for (size_t i = 0; i < PC_ARRAY_LEN(need); i++) {
		if (!io_uring_opcode_supported(pr, need[i].op)) {
			PC_LOGE(LOG_MOD, "io_uring lacks opcode '%s' (need "
				"Linux 6.0 or newer)", need[i].name);
			ret = -ENOSYS;
		}
	}
	io_uring_free_probe(pr);
	return ret;
}

static int ring_init(struct rx_reactor *r, unsigned *flags_used)
{
	struct io_uring_params up;
	/* SINGLE_ISSUER|DEFER_TASKRUN: only this thread submits, and completion
	 * work runs when we enter the kernel to wait — no IPIs, no surprise
	 * task work in the middle of a callback. SUBMIT_ALL: one bad SQE does
	 * not strand the rest. CQSIZE: multishot ops post many CQEs per SQE. */
	unsigned flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
			 IORING_SETUP_CQSIZE | IORING_SETUP_SUBMIT_ALL;
	memset(&up, 0, sizeof(up));
	up.flags = flags;
	up.cq_entries = r->p.sq_entries * r->p.cq_factor;
	int ret = io_uring_queue_init_params(r->p.sq_entries, &r->ring, &up);
	if (ret == -EINVAL) {
		PC_LOGW(LOG_MOD, "kernel refused SINGLE_ISSUER|DEFER_TASKRUN; "
			"running without them");
		flags = IORING_SETUP_CQSIZE;
		memset(&up, 0, sizeof(up));
		up.flags = flags;
		up.cq_entries = r->p.sq_entries * r->p.cq_factor;
		ret = io_uring_queue_init_params(r->p.sq_entries, &r->ring, &up);
	}
	if (ret < 0) {
		const char *why =
			ret == -ENOSYS ? "this kernel has no io_uring"
			: ret == -EPERM ? "io_uring is disabled (sysctl "
					  "kernel.io_uring_disabled, or a "
					  "seccomp/container policy)"
			: ret == -ENOMEM ? "not enough locked memory for the "
					   "ring (raise ulimit -l or lower "
					   "reactor_sq_entries)"
					 : "io_uring setup failed";
		PC_LOGE(LOG_MOD, "cannot create io_uring: %s (%s)", why,
			strerror(-ret));
		return ret;
	}
	if (!(up.features & IORING_FEAT_EXT_ARG) ||
	    !(up.features & IORING_FEAT_NODROP)) {
		PC_LOGE(LOG_MOD, "io_uring lacks EXT_ARG/NODROP (need Linux 6.0 "
			"or newer)");
		io_uring_queue_exit(&r->ring);
		return -ENOSYS;
	}
	*flags_used = flags;
	if (r->id == 0)
		log_probe(r, &up, flags);
	return 0;
}

int rx_reactor_create(struct rx_reactor **out, unsigned id,
		      const struct rx_params *p)
{
	rx_fault_init(); /* test builds: says so once when it is on */
	*out = NULL;
	if (!pc_is_pow2(p->sq_entries) || !pc_is_pow2(p->buf_count) ||
	    p->buf_count > 32768 || p->buf_bytes == 0 || p->ops_max == 0 ||
	    p->conn_out_low > p->conn_out_high) {
		PC_LOGE(LOG_MOD, "invalid reactor parameters");
		return -EINVAL;
	}
	struct rx_reactor *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->id = id;
	r->p = *p;
	r->p.idle_poll_ns = PC_MIN(r->p.idle_poll_ns, RX_IDLE_POLL_MAX_NS);
	r->in_warm.reserve = PC_BLOCK_RESERVE; /* input buffers grow in place */
	r->in_warm.drop = r->mod_warm.drop = rx_blocks_drop_off;
	r->in_warm.drop_arg = r->mod_warm.drop_arg = r;
	r->efd = -1;
	r->msg_op = RX_NO_OP;
	r->recv_multishot = true;
	r->now_ns = pc_now_ns();
	pthread_mutex_init(&r->msg_lock, NULL);
	unsigned flags = 0;
	int ret = ring_init(r, &flags);
	if (ret < 0) {
		pthread_mutex_destroy(&r->msg_lock);
		free(r);
		return ret;
	}
	if ((ret = check_required_ops(r)) < 0 || (ret = rx_ops_init(r)) < 0 ||
	    (ret = rx_timers_init(r)) < 0 || (ret = rx_bufring_init(r)) < 0)
		goto fail;
	r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (r->efd < 0) {
		ret = -errno;
		PC_LOGE(LOG_MOD, "eventfd: %s", strerror(errno));
		goto fail;
	}
	rx_op_register(r, RX_OP_MSG, msg_on_cqe);
	rx_op_register(r, RX_OP_TEST, test_on_cqe);
	rx_conn_ops_register(r);
	rx_listen_ops_register(r);
	rx_io_ops_register(r);
	msg_arm(r);
	r->state = RX_RUNNING;
	*out = r;
	return 0;
fail:
	rx_reactor_destroy(r);
	return ret;
}

unsigned rx_reactor_id(const struct rx_reactor *r)
{
	return r->id;
}

struct pc_blocks *rx_reactor_blocks(struct rx_reactor *r)
{
	return &r->mod_warm;
}

uint64_t rx_now_ns(const struct rx_reactor *r)
{
	return r->now_ns;
}

const struct rx_stats *rx_reactor_stats(const struct rx_reactor *r)
{
	return &r->st;
}

const struct rx_params *rx_reactor_params(const struct rx_reactor *r)
{
	return &r->p;
}

bool rx_reactor_stopping(const struct rx_reactor *r)
{
	return r->state != RX_RUNNING;
}

int rx_reactor_on_stop(struct rx_reactor *r,
		       void (*fn)(struct rx_reactor *r, void *arg), void *arg)
{
	struct rx_stop_hook *h = malloc(sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->fn = fn;
	h->arg = arg;
	h->next = r->stop_hooks;
	r->stop_hooks = h;
	return 0;
}

void rx_reactor_stop(struct rx_reactor *r)
{
	if (r->state != RX_RUNNING)
		return;
	r->state = RX_DRAINING;
	r->now_ns = pc_now_ns();
	r->stop_deadline_ns = r->now_ns + RX_MS(r->p.shutdown_grace_ms);
	PC_LOGD(LOG_MOD, "stopping: %llu ops in flight",
		(unsigned long long)r->st.ops_in_use);
	while (r->stop_hooks) {
		struct rx_stop_hook *h = r->stop_hooks;
		r->stop_hooks = h->next;
		h->fn(r, h->arg);
		free(h);
	}
	rx_listeners_close_all(r);
	rx_watches_cancel_all(r);
	rx_conns_stop(r, false);
}

/* Called each iteration while stopping: escalate after the grace period and
 * decide when the loop may end. */
static void check_drain(struct rx_reactor *r)
{
	if (r->state == RX_DRAINING && r->now_ns >= r->stop_deadline_ns) {
		PC_LOGW(LOG_MOD, "shutdown grace of %u ms expired: cancelling "
			"%llu ops in flight", r->p.shutdown_grace_ms,
			(unsigned long long)r->st.ops_in_use);
		r->state = RX_CANCELLING;
		r->stop_deadline_ns = r->now_ns + RX_MS(r->p.shutdown_grace_ms);
		rx_conns_stop(r, true);
		struct io_uring_sqe *sqe = rx_sqe(r);
		if (sqe) {
			io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY |
						       IORING_ASYNC_CANCEL_ALL);
			io_uring_sqe_set_data64(sqe, 0);
		}
	} else if (r->state == RX_CANCELLING &&
		   r->now_ns >= r->stop_deadline_ns) {
		PC_LOGE(LOG_MOD, "%llu ops still in flight after cancel; "
			"leaving them to the kernel",
			(unsigned long long)r->st.ops_in_use);
		r->state = RX_DONE;
		return;
	}
	/* A timer due now is a completion on its way (e.g. a call failed by
	 * the stop, reported from a zero-delay timer): the loop runs it, and
	 * whatever it finishes, before it may end. */
	if (r->conns || r->listeners || r->watches || r->pend_head ||
	    r->offloads || rx_timers_due(r))
		return;
	uint64_t msg_live = r->msg_op != RX_NO_OP ? 1 : 0;
	if (r->st.ops_in_use > msg_live)
		return;
	if (msg_live) {
		if (!(r->ops[r->msg_op].flags & 1)) {
			r->ops[r->msg_op].flags |= 1; /* cancel sent */
			rx_cancel_op(r, r->msg_op);
		}
		return;
	}
	r->state = RX_DONE;
}

int rx_reactor_run(struct rx_reactor *r)
{
	while (r->state != RX_DONE) {
		r->now_ns = pc_now_ns();
		uint64_t top = r->now_ns;
		RX_STAT_INC(r->st.loop_iterations);
		rx_timers_run(r);
		rx_conns_run_pending(r);
		if (r->state != RX_RUNNING) {
			check_drain(r);
			if (r->state == RX_DONE)
				break;
		}
		rx_bufring_flush(r);

		uint64_t wait_ns = rx_timers_next_ns(r);
		if (r->pend_head)
			wait_ns = 0;
		if (r->state != RX_RUNNING) {
			uint64_t left = r->stop_deadline_ns > r->now_ns
						? r->stop_deadline_ns - r->now_ns
						: 0;
			wait_ns = PC_MIN(wait_ns, left);
		}
		uint64_t pre = pc_now_ns();
		int ret;
		bool hit = false;
		if (wait_ns && r->poll_until_ns > pre) {
			/* A miss leaves only what is left of the wait (the
			 * next timer must not fire late by the time spun). */
			uint64_t end, due = wait_ns > UINT64_MAX - pre
						    ? UINT64_MAX
						    : pre + wait_ns;
			hit = idle_poll(r, pre, PC_MIN(r->poll_until_ns, due),
					&end);
			if (hit)
				wait_ns = 0;
			else if (wait_ns != UINT64_MAX)
				wait_ns = wait_ns > end - pre ? wait_ns - (end - pre)
							      : 0;
			if (wait_ns == 0)
				r->now_ns = end;
			else
				RX_STAT_INC(r->st.idle_poll_misses);
		}
		if (hit) {
			ret = 0; /* the poll collected them */
		} else if (wait_ns == 0) {
			ret = io_uring_submit_and_get_events(&r->ring);
		} else if (wait_ns == UINT64_MAX) {
			RX_STAT_INC(r->st.waits);
			ret = io_uring_submit_and_wait(&r->ring, 1);
		} else {
			struct __kernel_timespec ts = {
				.tv_sec = (long long)(wait_ns / 1000000000ull),
				.tv_nsec = (long long)(wait_ns % 1000000000ull),
			};
			struct io_uring_cqe *cqe;
			RX_STAT_INC(r->st.waits);
			ret = io_uring_submit_and_wait_timeout(&r->ring, &cqe, 1,
							       &ts, NULL);
		}
		if (ret < 0 && ret != -ETIME && ret != -EINTR &&
		    ret != -EAGAIN && ret != -EBUSY) {
			PC_LOGE(LOG_MOD, "io_uring_enter failed: %s",
				strerror(-ret));
			return ret;
		}
		/* The wait may have lasted long: completions must see the
		 * time they arrived, not the time the pass began (a deadline
		 * computed from a stale clock fires early). */
		if (wait_ns)
			r->now_ns = pc_now_ns();
		uint64_t post = wait_ns ? r->now_ns : pc_now_ns();
		reap(r);
		rx_stall_pass(r, top, pre, post);
	}
	return 0;
}

void rx_reactor_destroy(struct rx_reactor *r)
{
	if (!r)
		return;
	/* Messages that arrived too late still run, so they can free what they
	 * carry; they see rx_reactor_stopping() == true. */
	r->state = RX_DONE;
	msg_run_list(r, msg_take_all(r));
	/* A forced stop may leave offloads running: their done comes as a
	 * message, and must not find the reactor freed. */
	while (r->offloads) {
		struct pollfd pfd = {.fd = r->efd, .events = POLLIN};
		uint64_t v;
		if (poll(&pfd, 1, 100) > 0) {
			ssize_t n = read(r->efd, &v, sizeof(v));
			(void)n; /* EAGAIN: taken by a stale read op */
		}
		msg_run_list(r, msg_take_all(r));
	}
	while (r->stop_hooks) {
		struct rx_stop_hook *h = r->stop_hooks;
		r->stop_hooks = h->next;
		free(h);
	}
	/* After the ring is gone the kernel touches no buffer of ours, so what
	 * a forced exit left behind can be freed safely. */
	io_uring_queue_exit(&r->ring);
	rx_conns_destroy(r);
	rx_listeners_destroy(r);
	rx_watches_destroy(r);
	rx_bufring_fini(r);
	rx_chunks_fini(r);
	rx_timers_fini(r);
	rx_ops_fini(r);
	if (r->efd >= 0)
		close(r->efd);
	pthread_mutex_destroy(&r->msg_lock);
	free(r);
}
