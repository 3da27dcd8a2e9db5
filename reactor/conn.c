/*
 * reactor/conn.c — stream connections: receive through the provided-buffer
 * ring, an ordered send queue, outbound connect, pause/resume and close.
 *
 * Owns: struct rx_conn and its buffers; the reactor's provided-buffer ring
 * and the cache of free output chunks. Thread: the reactor's.
 *
 * Receive: one multishot recv per connection draws buffers from the ring;
 * each arrival goes to on_data straight from the ring buffer, and only the
 * unconsumed tail (a partial message) is copied into the connection's input
 * buffer, bounded by in_max. Send: writes append to a chunk queue; at the end
 * of a loop iteration the queue leaves as one sendmsg of up to RX_IOV_MAX
 * iovecs; one send in flight per connection; a short send resumes from where
 * the kernel stopped. Backpressure: above out_high the connection stops
 * reading (its peer then blocks in TCP flow control) until the queue drains
 * below out_low; above out_max it is closed — memory stays bounded for a
 * client that never reads. The time the queue last made progress is kept
 * (rx_conn_out_since) for the owner's write-stall deadline. Memory: a
 * connection may account its kept input and owned output chunks in a shared
 * rx_budget (per buffer growth, atomics); over the input budget it is
 * closed, over the output budget it stops reading like above its high
 * watermark. Teardown: close cancels every op
 * on the fd, and the struct is freed on the pending list once no op
 * references it, so a callback may close its own connection at any point.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/copy.h"
#include "fault.h"
#include "rx_internal.h"

/* AddressSanitizer builds: a receive buffer is poisoned while the kernel
 * owns it (in the ring), and only the bytes a completion reports are
 * readable until it goes back: a handler that kept a pointer into a
 * request it did not keep (rx_conn_take_input) is reported at its first
 * read, not when another client's bytes happen to land there. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define RX_BUF_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define RX_BUF_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define RX_BUF_POISON(p, n) ((void)(p), (void)(n))
#define RX_BUF_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define LOG_MOD "conn"
#define FLUSH_CLOSE_MS 5000u /* a flush-close gives the peer this long */

static void conn_touch(struct rx_conn *c);
static void conn_stop_reading(struct rx_conn *c);

/* A connection's op ended for good: release its slot and the reference. */
static void conn_op_done(struct rx_conn *c, uint32_t idx, uint32_t flag)
{
	rx_op_free(c->r, idx);
	c->inflight--;
	c->flags &= ~flag;
}
static void conn_timer_fired(struct rx_reactor *r, struct rx_timer *t);

/* ------------------------------------------------------------ buffer ring */

int rx_bufring_init(struct rx_reactor *r)
{
	size_t ring_bytes = (size_t)r->p.buf_count * sizeof(struct io_uring_buf);
	long page = sysconf(_SC_PAGESIZE);
	ring_bytes = (ring_bytes + (size_t)page - 1) & ~((size_t)page - 1);
	void *ring = mmap(NULL, ring_bytes, PROT_READ | PROT_WRITE,
			  MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
	if (ring == MAP_FAILED)
		return -errno;
	r->br = ring;
	r->br_bytes = ring_bytes;
	r->bufs = aligned_alloc((size_t)page,
				(size_t)r->p.buf_count * r->p.buf_bytes);
	if (!r->bufs)
		return -ENOMEM;
	/* liburing 2.3 has no io_uring_setup_buf_ring(): register by hand. */
	struct io_uring_buf_reg reg;
	memset(&reg, 0, sizeof(reg));
	reg.ring_addr = (uint64_t)(uintptr_t)ring;
	reg.ring_entries = r->p.buf_count;
	reg.bgid = r->bgid;
	int ret = io_uring_register_buf_ring(&r->ring, &reg, 0);
	if (ret < 0) {
		PC_LOGE(LOG_MOD, "cannot register a provided-buffer ring (%s); "
			"need Linux 5.19 or newer", strerror(-ret));
		return ret;
	}
	io_uring_buf_ring_init(r->br);
	int mask = io_uring_buf_ring_mask(r->p.buf_count);
	for (unsigned i = 0; i < r->p.buf_count; i++)
		io_uring_buf_ring_add(r->br, r->bufs + (size_t)i * r->p.buf_bytes,
				      r->p.buf_bytes, (unsigned short)i, mask,
				      (int)i);
	io_uring_buf_ring_advance(r->br, (int)r->p.buf_count);
	RX_BUF_POISON(r->bufs, (size_t)r->p.buf_count * r->p.buf_bytes);
	return 0;
}

void rx_bufring_fini(struct rx_reactor *r)
{
	if (r->br)
		munmap(r->br, r->br_bytes);
	if (r->bufs)
		RX_BUF_UNPOISON(r->bufs, (size_t)r->p.buf_count * r->p.buf_bytes);
	free(r->bufs);
	r->br = NULL;
	r->bufs = NULL;
}

static void bufring_return(struct rx_reactor *r, unsigned bid)
{
	RX_BUF_POISON(r->bufs + (size_t)bid * r->p.buf_bytes, r->p.buf_bytes);
	io_uring_buf_ring_add(r->br, r->bufs + (size_t)bid * r->p.buf_bytes,
			      r->p.buf_bytes, (unsigned short)bid,
			      io_uring_buf_ring_mask(r->p.buf_count),
			      (int)r->br_pending++);
}

void rx_bufring_flush(struct rx_reactor *r)
{
	/* test builds: sometimes the buffers stay out for another pass (with
	 * a small ring: receives meet a really empty one, -ENOBUFS) */
	if (r->br_pending && !rx_fault_hold()) {
		io_uring_buf_ring_advance(r->br, (int)r->br_pending);
		r->br_pending = 0;
	}
}

/* ----------------------------------------------------------------- chunks */

static struct rx_chunk *chunk_new(struct rx_reactor *r, size_t need)
{
	struct rx_chunk *ch;
	if (need <= RX_CHUNK_BYTES && r->chunk_cache) {
		ch = r->chunk_cache;
		r->chunk_cache = ch->next;
		r->chunk_cache_n--;
	} else {
		size_t cap = PC_MAX(need, (size_t)RX_CHUNK_BYTES);
		ch = malloc(sizeof(*ch) + cap);
		if (!ch)
			return NULL;
		ch->cap = cap;
	}
	ch->next = NULL;
	ch->base = ch->storage;
	ch->head = ch->tail = 0;
	ch->release = NULL;
	ch->rel_arg = NULL;
	return ch;
}

static void chunk_free(struct rx_reactor *r, struct rx_chunk *ch)
{
	if (ch->release)
		ch->release(ch->rel_arg);
	if (ch->cap == 0) { /* a reference (rx_conn_write_ref) */
		if (r->ref_cache_n < RX_REF_CACHE) {
			ch->next = r->ref_cache;
			r->ref_cache = ch;
			r->ref_cache_n++;
			return;
		}
		free(ch);
		return;
	}
	PC_DASSERT(!ch->release);
	if (ch->cap == RX_CHUNK_BYTES && r->chunk_cache_n < RX_CHUNK_CACHE) {
		ch->next = r->chunk_cache;
		r->chunk_cache = ch;
		r->chunk_cache_n++;
		return;
	}
	free(ch);
}

void rx_chunks_fini(struct rx_reactor *r)
{
	while (r->chunk_cache) {
		struct rx_chunk *ch = r->chunk_cache;
		r->chunk_cache = ch->next;
		free(ch);
	}
	r->chunk_cache_n = 0;
	while (r->ref_cache) {
		struct rx_chunk *ch = r->ref_cache;
		r->ref_cache = ch->next;
		free(ch);
	}
	r->ref_cache_n = 0;
	/* after the connections gave theirs */
	pc_blocks_drop(&r->in_warm);
	pc_blocks_drop(&r->mod_warm);
}

/* ----------------------------------------------------------- budgets */

int rx_budget_take(struct rx_budget *b, size_t bytes)
{
	size_t now = __atomic_add_fetch(&b->out_used, bytes, __ATOMIC_RELAXED);
	if (b->out_max && now > b->out_max) {
		__atomic_sub_fetch(&b->out_used, bytes, __ATOMIC_RELAXED);
		return -ENOBUFS;
	}
	return 0;
}

void rx_budget_give(struct rx_budget *b, size_t bytes)
{
	size_t was = __atomic_fetch_sub(&b->out_used, bytes, __ATOMIC_RELAXED);
	PC_ASSERT(was >= bytes);
}

void rx_conn_set_budget(struct rx_conn *c, struct rx_budget *b)
{
	PC_ASSERT(!c->in_cap && !c->out_owned);
	c->budget = b;
}

bool rx_conn_backlogged(const struct rx_conn *c)
{
	return (c->flags & RXC_PAUSE_OUT) != 0;
}

/* Input buffer growth by delta bytes: false (and the connection closing)
 * when the shared budget has no room. */
static bool in_budget_grow(struct rx_conn *c, size_t delta)
{
	struct rx_budget *b = c->budget;
	if (!b)
		return true;
	size_t now = __atomic_add_fetch(&b->in_used, delta, __ATOMIC_RELAXED);
	if (!b->in_max || now <= b->in_max)
		return true;
	__atomic_sub_fetch(&b->in_used, delta, __ATOMIC_RELAXED);
	__atomic_add_fetch(&b->in_closes, 1, __ATOMIC_RELAXED);
	PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "conn %llu: the node already holds "
		  "%zu bytes of incomplete input (limit %zu); closing",
		  (unsigned long long)c->id, now - delta, b->in_max);
	rx_conn_close(c, RX_CLOSE_NOW, -ENOBUFS);
	return false;
}

/* A mapped block a cache of this reactor lets go of (pc_blocks.drop) is
 * unmapped on the offload thread: unmapping 32 MiB of written pages took
 * 1.4-4 ms here, a stall whenever more large messages or gets were under
 * way on one reactor than its warm blocks keep. Without an offload (none,
 * or shutting down, or no memory for the job) it is unmapped here. */
struct block_unmap {
	struct rx_offload o;
	struct pc_block b;
};

static void unmap_work(struct rx_offload *o)
{
	pc_block_free_sliced(&((struct block_unmap *)o)->b);
}

static void unmap_done(struct rx_reactor *r, struct rx_offload *o)
{
	RX_STAT_INC(r->st.blocks_unmapped_off);
	free(o);
}

void rx_blocks_drop_off(struct pc_block *b, void *arg)
{
	struct rx_reactor *r = arg;
	struct block_unmap *u = malloc(sizeof(*u));
	if (u) {
		*u = (struct block_unmap){
			.o = {.work = unmap_work, .done = unmap_done},
			.b = *b};
		if (rx_offload(r, &u->o) == 0) {
			*b = (struct pc_block){0};
			return;
		}
		free(u);
	}
	pc_block_free(b);
}

/* Give a kept-input buffer of room bytes up: to the reactor's warm
 * blocks when it is large, else freed. */
static void in_buf_put(struct rx_reactor *r, uint8_t *p, size_t room,
		       size_t res)
{
	struct pc_block b = {.p = p, .cap = room, .res = res};
	if (room >= RX_IN_WARM_MIN)
		pc_blocks_put(&r->in_warm, &b);
	else
		free(p);
}

_Static_assert(RX_IN_WARM_MIN >= PC_BLOCK_MAP_MIN,
	       "large input buffers are mapped blocks: they grow in place");

/* Free the kept-input buffer and give its bytes back. */
static void in_release(struct rx_conn *c)
{
	if (c->budget && c->in_cap)
		__atomic_sub_fetch(&c->budget->in_used, c->in_cap,
				   __ATOMIC_RELAXED);
	in_buf_put(c->r, c->in, c->in_room, c->in_res);
	c->in = NULL;
	c->in_cap = c->in_room = c->in_res = 0;
}

/* A message known to be large (rx_conn_expect) moves to a block once this
 * much is charged for it, not at its header: a client holds a warm block
 * only for bytes it sent (and is charged for). */
#define RX_IN_EARLY_MIN (64u << 10)

/* A buffer of at least cap bytes holding the kept input (want: the size
 * of the message it holds, when known; rx_conn_expect): false when out of
 * memory (the old one is kept). A large one (a mapped block) grows in
 * place: nothing is copied, and only the pages the next bytes land in are
 * faulted in, a receive at a time (copying 16 MiB into fresh memory in one
 * step held the reactor for up to 125 ms). The first large one comes from
 * the warm blocks, where the smallest kept block that fits may be far
 * larger: growing into it later moves nothing. The small buffer it
 * replaces is freed. */
static bool in_buf_grow(struct rx_conn *c, size_t cap, size_t want)
{
	if (cap <= c->in_room)
		return true;
	if (cap < RX_IN_WARM_MIN &&
	    (want < RX_IN_WARM_MIN || cap < RX_IN_EARLY_MIN)) {
		uint8_t *p = realloc(c->in, cap);
		if (!p)
			return false;
		c->in = p;
		c->in_room = cap;
		return true;
	}
	if (c->in_room >= RX_IN_WARM_MIN) {
		struct pc_block cur = {.p = c->in, .cap = c->in_room,
				       .res = c->in_res};
		if (!pc_block_grow(&cur, cap))
			return false;
		c->in = cur.p;
		c->in_room = cur.cap;
		c->in_res = cur.res;
		return true;
	}
	/* The first large one (at once when the message is known to be
	 * large): a warm block the whole message fits, else the smallest
	 * that fits what is charged, else a new one that size, which grows
	 * in place as bytes arrive (common/blocks.h). */
	struct pc_block b = {0};
	if (!(want > cap && pc_blocks_take_kept(&c->r->in_warm, want, &b)) &&
	    !pc_blocks_take(&c->r->in_warm, PC_MAX(cap, RX_IN_WARM_MIN), &b))
		return false;
	if (c->in_len)
		pc_copy(b.p, c->in, c->in_len);
	free(c->in); /* small: from malloc */
	c->in = b.p;
	c->in_room = b.cap;
	c->in_res = b.res;
	return true;
}

/* An owned chunk now belongs to c: account it. */
static void out_owned_add(struct rx_conn *c, struct rx_chunk *ch)
{
	if (!c->budget)
		return;
	c->out_owned += ch->cap;
	__atomic_add_fetch(&c->budget->out_used, ch->cap, __ATOMIC_RELAXED);
}

static void conn_chunk_free(struct rx_conn *c, struct rx_chunk *ch)
{
	if (c->budget && ch->cap) {
		c->out_owned -= ch->cap;
		rx_budget_give(c->budget, ch->cap);
	}
	chunk_free(c->r, ch);
}

static void out_append(struct rx_conn *c, struct rx_chunk *ch)
{
	if (c->out_tail)
		c->out_tail->next = ch;
	else
		c->out_head = ch;
	c->out_tail = ch;
}

/* -------------------------------------------------------------- lifecycle */

static struct rx_conn *conn_new(struct rx_reactor *r, int fd,
				const struct rx_conn_ops *ops, void *udata)
{
	struct rx_conn *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->r = r;
	c->fd = fd;
	c->recv_op = RX_NO_OP;
	c->ops = ops;
	c->udata = udata;
	c->id = ++r->next_conn_id;
	c->in_max = r->p.conn_in_max;
	c->out_high = r->p.conn_out_high;
	c->out_low = r->p.conn_out_low;
	c->out_max = r->p.conn_out_max;
	c->msg.msg_iov = c->iov;
	rx_timer_init(&c->timer, conn_timer_fired, c);
	RX_LIST_ADD(r->conns, c);
	RX_STAT_INC(r->st.conns_live);
	return c;
}

static void set_nodelay(int fd)
{
	int one = 1;
	/* Replies are coalesced by the send queue; Nagle would only add delay.
	 * Fails harmlessly (ENOTSUP/EOPNOTSUPP) on Unix sockets. */
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

struct rx_conn *rx_conn_attach(struct rx_reactor *r, int fd,
			       const struct rx_conn_ops *ops, void *udata,
			       int *err)
{
	struct rx_conn *c = conn_new(r, fd, ops, udata);
	if (!c) {
		close(fd);
		*err = -ENOMEM;
		return NULL;
	}
	set_nodelay(fd);
	conn_touch(c); /* arms the first receive at the end of the iteration */
	*err = 0;
	return c;
}

static void conn_timer_fired(struct rx_reactor *r, struct rx_timer *t)
{
	struct rx_conn *c = t->arg;
	(void)r;
	rx_conn_close(c, RX_CLOSE_NOW, -ETIMEDOUT);
}

struct rx_conn *rx_conn_connect(struct rx_reactor *r,
				const struct sockaddr *addr, socklen_t addrlen,
				unsigned timeout_ms,
				const struct rx_conn_ops *ops, void *udata,
				int *err)
{
	if (addrlen > sizeof(struct sockaddr_storage)) {
		*err = -EINVAL;
		return NULL;
	}
	if (r->state != RX_RUNNING) { /* nothing new while draining */
		*err = -ESHUTDOWN;
		return NULL;
	}
	int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK |
						 SOCK_CLOEXEC, 0);
	if (fd < 0) {
		*err = -errno;
		return NULL;
	}
	struct rx_conn *c = conn_new(r, fd, ops, udata);
	if (!c) {
		close(fd);
		*err = -ENOMEM;
		return NULL;
	}
	set_nodelay(fd);
	memcpy(&c->peer, addr, addrlen);
	c->peer_len = addrlen;
	uint32_t idx;
	struct io_uring_sqe *sqe = rx_op_start(r, RX_OP_CONNECT, c, &idx);
	if (!sqe) {
		/* Report through *err, not on_close: the caller has no conn. */
		RX_LIST_DEL(r->conns, c);
		RX_STAT_ADD(r->st.conns_live, (uint64_t)-1);
		close(fd);
		free(c);
		*err = -EBUSY;
		return NULL;
	}
	io_uring_prep_connect(sqe, fd, (struct sockaddr *)&c->peer, addrlen);
	rx_op_tag(r, sqe, idx);
	c->flags |= RXC_CONNECTING | RXC_OUTGOING;
	c->inflight++;
	if (timeout_ms) {
		if (rx_timer_start(r, &c->timer, RX_MS(timeout_ms), 0) < 0)
			PC_LOGW(LOG_MOD, "conn %llu: no timer for the connect "
				"timeout", (unsigned long long)c->id);
	}
	*err = 0;
	return c;
}

static void conn_on_connect(struct rx_reactor *r, struct rx_op *op,
			    const struct io_uring_cqe *cqe, uint32_t idx)
{
	struct rx_conn *c = op->obj;
	conn_op_done(c, idx, RXC_CONNECTING);
	rx_timer_stop(r, &c->timer);
	if (c->flags & RXC_CLOSING) {
		conn_touch(c);
		return;
	}
	if (cqe->res < 0) {
		rx_conn_close(c, RX_CLOSE_NOW, cqe->res);
		return;
	}
	RX_STAT_INC(r->st.conns_connected);
	if (c->ops->on_connect)
		c->ops->on_connect(c);
	conn_touch(c);
}

void *rx_conn_udata(const struct rx_conn *c)
{
	return c->udata;
}

void rx_conn_set_udata(struct rx_conn *c, void *udata)
{
	c->udata = udata;
}

struct rx_reactor *rx_conn_reactor(const struct rx_conn *c)
{
	return c->r;
}

int rx_conn_fd(const struct rx_conn *c)
{
	return c->fd;
}

uint64_t rx_conn_id(const struct rx_conn *c)
{
	return c->id;
}

bool rx_conn_closing(const struct rx_conn *c)
{
	return (c->flags & (RXC_CLOSING | RXC_CLOSE_FLUSH)) != 0;
}

size_t rx_conn_out_bytes(const struct rx_conn *c)
{
	return c->out_bytes;
}

uint64_t rx_conn_out_since(const struct rx_conn *c)
{
	return c->out_bytes ? c->out_since_ns : 0;
}

void rx_conn_set_limits(struct rx_conn *c, size_t in_max, size_t out_high,
			size_t out_low, size_t out_max)
{
	if (in_max)
		c->in_max = in_max;
	if (out_high)
		c->out_high = out_high;
	if (out_low)
		c->out_low = out_low;
	if (out_max)
		c->out_max = out_max;
	if (c->out_low > c->out_high)
		c->out_low = c->out_high;
}

static void conn_touch(struct rx_conn *c)
{
	struct rx_reactor *r = c->r;
	if (c->flags & RXC_PENDING)
		return;
	c->flags |= RXC_PENDING;
	c->pend_next = NULL;
	if (r->pend_tail)
		r->pend_tail->pend_next = c;
	else
		r->pend_head = c;
	r->pend_tail = c;
}

void rx_conn_close(struct rx_conn *c, enum rx_close how, int err)
{
	if (c->flags & RXC_CLOSING)
		return;
	if (err && !c->close_err)
		c->close_err = err;
	if (how == RX_CLOSE_FLUSH && c->out_bytes &&
	    !(c->flags & RXC_CONNECTING)) {
		if (!(c->flags & RXC_CLOSE_FLUSH)) {
			c->flags |= RXC_CLOSE_FLUSH;
			conn_stop_reading(c);
			/* A peer that never reads must not keep us forever. */
			rx_timer_start(c->r, &c->timer, RX_MS(FLUSH_CLOSE_MS), 0);
		}
		conn_touch(c);
		return;
	}
	c->flags |= RXC_CLOSING;
	rx_timer_stop(c->r, &c->timer);
	if (c->inflight) {
		struct io_uring_sqe *sqe = rx_sqe(c->r);
		if (sqe) {
			io_uring_prep_cancel_fd(sqe, c->fd,
						IORING_ASYNC_CANCEL_ALL);
			io_uring_sqe_set_data64(sqe, 0);
		} else {
			/* Cannot cancel: make the ops fail on their own. */
			shutdown(c->fd, SHUT_RDWR);
		}
	}
	conn_touch(c);
}

static void conn_finalize(struct rx_conn *c)
{
	struct rx_reactor *r = c->r;
	c->flags |= RXC_FINAL;
	rx_timer_stop(r, &c->timer);
	/* Count the close before telling the owner, so whoever learns of it
	 * from on_close also finds it in the stats. */
	RX_STAT_ADD(r->st.conns_live, (uint64_t)-1);
	RX_STAT_INC(r->st.conns_closed);
	if (c->ops->on_close)
		c->ops->on_close(c, c->close_err);
	close(c->fd);
	while (c->out_head) {
		struct rx_chunk *ch = c->out_head;
		c->out_head = ch->next;
		conn_chunk_free(c, ch);
	}
	in_release(c);
	RX_LIST_DEL(r->conns, c);
	free(c);
}

/* Shutdown: flush-close every connection, or (now) cancel them all. */
void rx_conns_stop(struct rx_reactor *r, bool now)
{
	for (struct rx_conn *c = r->conns, *next; c; c = next) {
		next = c->next;
		/* An outgoing connection closes at once: it stops reading
		 * either way, so the answers to what it would flush (its
		 * owner's calls) could never arrive; its owner fails them. */
		bool out = c->flags & RXC_OUTGOING;
		rx_conn_close(c, now || out ? RX_CLOSE_NOW : RX_CLOSE_FLUSH,
			      -ESHUTDOWN);
	}
}

/* ------------------------------------------------------------------ input */

/* The peer will send no more: close after the flush, unless the owner
 * still produces a reply (on_eof). */
static void conn_eof(struct rx_conn *c)
{
	c->flags |= RXC_EOF;
	if (!(c->ops->on_eof && c->ops->on_eof(c)))
		rx_conn_close(c, RX_CLOSE_FLUSH, 0);
}

static bool conn_should_read(const struct rx_conn *c)
{
	return !(c->flags & (RXC_MANUAL | RXC_PAUSE_USER | RXC_PAUSE_OUT | RXC_CLOSE_FLUSH |
			     RXC_CLOSING | RXC_CONNECTING | RXC_EOF));
}

static void conn_arm_recv(struct rx_conn *c)
{
	struct rx_reactor *r = c->r;
	if ((c->flags & RXC_READING) || !conn_should_read(c))
		return;
	uint32_t idx;
	struct io_uring_sqe *sqe = rx_op_start(r, RX_OP_RECV, c, &idx);
	if (!sqe) {
		rx_conn_close(c, RX_CLOSE_NOW, -EBUSY);
		return;
	}
	if (c->fds_max) /* recvmsg carries the control data (fds) */
		io_uring_prep_recvmsg_multishot(sqe, c->fd, &c->rmsg,
						MSG_CMSG_CLOEXEC);
	else if (r->recv_multishot)
		io_uring_prep_recv_multishot(sqe, c->fd, NULL, 0, 0);
	else
		io_uring_prep_recv(sqe, c->fd, NULL, r->p.buf_bytes, 0);
	sqe->flags |= IOSQE_BUFFER_SELECT;
	sqe->buf_group = r->bgid;
	rx_op_tag(r, sqe, idx);
	c->recv_op = idx;
	c->flags |= RXC_READING;
	c->flags &= ~RXC_CANCEL_SENT;
	c->inflight++;
}

static void conn_stop_reading(struct rx_conn *c)
{
	if ((c->flags & RXC_READING) && !(c->flags & RXC_CANCEL_SENT)) {
		rx_cancel_op(c->r, c->recv_op);
		c->flags |= RXC_CANCEL_SENT;
	}
}

/*
 * Keep bytes for later; false (and the connection closing) past limit. The
 * limit is in_max for a partial message; while paused it is higher, because
 * whatever the kernel had already received before the pause took effect must
 * be kept (it is bounded by the socket's receive buffer, not by the peer).
 */
static bool in_append(struct rx_conn *c, const uint8_t *data, size_t len)
{
	size_t limit = (c->flags & (RXC_PAUSE_USER | RXC_PAUSE_OUT))
			       ? c->in_max + c->out_max
			       : c->in_max;
	if (c->in_len + len > limit) {
		RX_STAT_INC(c->r->st.in_cap_closes);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD,
			  "conn %llu: %zu bytes of input without a complete "
			  "message (limit %zu); closing",
			  (unsigned long long)c->id, c->in_len + len, limit);
		rx_conn_close(c, RX_CLOSE_NOW, -EMSGSIZE);
		return false;
	}
	if (c->in_len + len > c->in_cap) {
		size_t need = c->in_len + len;
		size_t cap = c->in_cap ? c->in_cap : 4096;
		while (cap < need)
			cap *= 2;
		/* A large message of known size (rx_conn_expect) is charged
		 * no more than that size (twice what arrived at most, still);
		 * past it, an eighth more until on_data tells the next size.
		 * Its block grows in place, so the extra steps copy nothing. */
		if (c->in_want >= RX_IN_WARM_MIN)
			cap = PC_MIN(cap, need <= c->in_want ? c->in_want
							     : need + need / 8);
		cap = PC_MIN(cap, limit);
		if (!in_budget_grow(c, cap - c->in_cap))
			return false;
		if (!in_buf_grow(c, cap, PC_MIN(c->in_want, limit))) {
			if (c->budget)
				__atomic_sub_fetch(&c->budget->in_used,
						   cap - c->in_cap,
						   __ATOMIC_RELAXED);
			rx_conn_close(c, RX_CLOSE_NOW, -ENOMEM);
			return false;
		}
		c->in_cap = cap;
	}
	pc_copy(c->in + c->in_len, data, len);
	c->in_len += len;
	return true;
}

/* The kept input was taken during on_data, which consumed n of its
 * in_len bytes: the connection starts a new buffer with the rest. */
static void conn_in_detach(struct rx_conn *c, size_t n)
{
	const uint8_t *old = c->in;
	size_t rest = c->in_len - n;
	c->flags &= ~RXC_IN_TAKEN;
	RX_STAT_INC(c->r->st.in_taken); /* still taken: not given back in on_data */
	c->in = NULL;
	c->in_len = c->in_cap = c->in_room = c->in_res = 0;
	if (rest && !(c->flags & (RXC_CLOSING | RXC_CLOSE_FLUSH)))
		in_append(c, old + n, rest);
}

bool rx_conn_take_input(struct rx_conn *c, const uint8_t *p, size_t len,
			struct rx_input *out)
{
	*out = (struct rx_input){0};
	if (!(c->flags & RXC_IN_FEED) || (c->flags & RXC_IN_TAKEN) ||
	    p < c->in || len > c->in_len ||
	    (size_t)(p - c->in) > c->in_len - len)
		return false;
	*out = (struct rx_input){c->r, c->budget, c->in, c->in_room, c->in_res,
				 c->budget ? c->in_cap : 0};
	c->flags |= RXC_IN_TAKEN; /* counted once on_data has returned */
	return true;
}

void rx_input_put(struct rx_input *in)
{
	if (!in->r)
		return;
	/* Given back before the on_data that took it returned (its call
	 * ended at once): the connection keeps it, as if never taken; it is
	 * still reading from it. */
	struct rx_conn *f = in->r->feeding;
	if (f && (f->flags & RXC_IN_TAKEN) && f->in == in->buf) {
		f->flags &= ~RXC_IN_TAKEN;
		*in = (struct rx_input){0};
		return;
	}
	if (in->counted)
		__atomic_sub_fetch(&in->budget->in_used, in->counted,
				   __ATOMIC_RELAXED);
	in_buf_put(in->r, in->buf, in->room, in->res);
	*in = (struct rx_input){0};
}

void rx_conn_expect(struct rx_conn *c, size_t bytes)
{
	c->in_want = bytes;
}

/* on_data, and the size hint it leaves (rx_conn_expect): one it gives
 * now, else the last one while it consumes nothing (the same message). */
static ssize_t conn_on_data(struct rx_conn *c, const uint8_t *data,
			    size_t len)
{
	size_t want = c->in_want;
	c->in_want = 0;
	ssize_t n = c->ops->on_data(c, data, len);
	if (n == 0 && !c->in_want)
		c->in_want = want;
	else if (n > 0 && (size_t)n == len)
		c->in_want = 0; /* nothing is kept: no message to size */
	return n;
}

/* Present the kept input to on_data and keep what it leaves. */
static void conn_feed_in(struct rx_conn *c)
{
	struct rx_conn *outer = c->r->feeding; /* none: on_data is not nested */
	c->flags |= RXC_IN_FEED;
	c->r->feeding = c;
	ssize_t n = conn_on_data(c, c->in, c->in_len);
	c->r->feeding = outer;
	c->flags &= ~RXC_IN_FEED;
	if (c->flags & RXC_IN_TAKEN) {
		conn_in_detach(c, n < 0 ? c->in_len : (size_t)n);
		if (n >= 0)
			return;
	}
	if (n < 0) {
		rx_conn_close(c, RX_CLOSE_NOW, (int)n);
		return;
	}
	PC_ASSERT((size_t)n <= c->in_len);
	if ((size_t)n == c->in_len) {
		c->in_len = 0;
		if (c->in_cap > 65536) /* give back a burst's memory */
			in_release(c);
	} else if (n > 0) {
		memmove(c->in, c->in + n, c->in_len - (size_t)n);
		c->in_len -= (size_t)n;
	}
}

static bool conn_paused(const struct rx_conn *c)
{
	return (c->flags & (RXC_PAUSE_USER | RXC_PAUSE_OUT)) != 0;
}

static void conn_deliver(struct rx_conn *c, const uint8_t *data, size_t len)
{
	if (c->flags & (RXC_CLOSE_FLUSH | RXC_CLOSING))
		return; /* closing: input is no longer wanted */
	if (conn_paused(c)) {
		/* Arrived before the cancel took effect: keep it for resume. */
		in_append(c, data, len);
		return;
	}
	if (c->in_len == 0) {
		ssize_t n = conn_on_data(c, data, len);
		if (n < 0) {
			rx_conn_close(c, RX_CLOSE_NOW, (int)n);
			return;
		}
		PC_ASSERT((size_t)n <= len);
		if ((size_t)n < len &&
		    !(c->flags & (RXC_CLOSING | RXC_CLOSE_FLUSH)))
			in_append(c, data + n, len - (size_t)n);
		return;
	}
	if (in_append(c, data, len))
		conn_feed_in(c);
}

int rx_conn_enable_fds(struct rx_conn *c, unsigned max_fds)
{
	if (max_fds == 0 || max_fds > 64)
		return -EINVAL;
	if (c->flags & RXC_READING)
		return -EBUSY;
	c->fds_max = max_fds;
	memset(&c->rmsg, 0, sizeof(c->rmsg));
	c->rmsg.msg_controllen = CMSG_SPACE(max_fds * sizeof(int));
	if (c->rmsg.msg_controllen + sizeof(struct io_uring_recvmsg_out) >=
	    c->r->p.buf_bytes)
		return -EINVAL;
	return 0;
}

static void close_fds(const int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		close(fds[i]);
}

/*
 * Unpack one recvmsg buffer: hand over the descriptors it carries, then
 * return its payload. -EPROTO when the control data was cut (the kernel
 * dropped descriptors) or is malformed; every descriptor seen is closed then.
 */
static int conn_unpack_msg(struct rx_conn *c, uint8_t *buf, int res,
			   const uint8_t **payload, size_t *plen)
{
	struct io_uring_recvmsg_out *o =
		io_uring_recvmsg_validate(buf, res, &c->rmsg);
	if (!o)
		return -EPROTO;
	int err = (o->flags & MSG_CTRUNC) ? -EPROTO : 0;
	uint8_t *ctl = (uint8_t *)io_uring_recvmsg_name(o) + c->rmsg.msg_namelen;
	size_t ctl_len = PC_MIN((size_t)o->controllen,
				(size_t)c->rmsg.msg_controllen);
	size_t off = 0;
	while (off + sizeof(struct cmsghdr) <= ctl_len) {
		struct cmsghdr cm;
		memcpy(&cm, ctl + off, sizeof(cm));
		if (cm.cmsg_len < CMSG_LEN(0) || cm.cmsg_len > ctl_len - off)
			break;
		if (cm.cmsg_level == SOL_SOCKET && cm.cmsg_type == SCM_RIGHTS) {
			unsigned n = (unsigned)((cm.cmsg_len - CMSG_LEN(0)) /
						sizeof(int));
			int fds[64];
			n = PC_MIN(n, 64u);
			memcpy(fds, ctl + off + CMSG_LEN(0), n * sizeof(int));
			if (err || !c->ops->on_fds ||
			    (c->flags & (RXC_CLOSING | RXC_CLOSE_FLUSH)))
				close_fds(fds, n);
			else
				c->ops->on_fds(c, fds, n);
		}
		off += CMSG_ALIGN(cm.cmsg_len);
	}
	*payload = io_uring_recvmsg_payload(o, &c->rmsg);
	*plen = io_uring_recvmsg_payload_length(o, res, &c->rmsg);
	return err;
}

static void conn_on_recv(struct rx_reactor *r, struct rx_op *op,
			 const struct io_uring_cqe *cqe, uint32_t idx)
{
	struct rx_conn *c = op->obj;
	bool more = (cqe->flags & IORING_CQE_F_MORE) != 0;
	int res = cqe->res;
	if (!more) {
		conn_op_done(c, idx, RXC_READING | RXC_CANCEL_SENT);
		c->recv_op = RX_NO_OP;
	}
	int injected = res > 0 ? rx_fault_res(res) : res;
	if (injected < 0 && res > 0) {
		/* test builds: the completion reports an error instead (its
		 * buffer goes back; the bytes are lost with the connection) */
		bufring_return(r, cqe->flags >> IORING_CQE_BUFFER_SHIFT);
		res = injected;
	}
	if (res > 0) {
		PC_ASSERT(cqe->flags & IORING_CQE_F_BUFFER);
		RX_BUF_UNPOISON(r->bufs + (size_t)(cqe->flags >>
						   IORING_CQE_BUFFER_SHIFT) *
					     r->p.buf_bytes,
				(size_t)res);
	}
	if (res > 0 && c->fds_max) {
		unsigned bid = cqe->flags >> IORING_CQE_BUFFER_SHIFT;
		const uint8_t *data;
		size_t len;
		int err = conn_unpack_msg(c, r->bufs + (size_t)bid *
						       r->p.buf_bytes,
					  res, &data, &len);
		if (err < 0) {
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "conn %llu: bad control "
				  "data (too many descriptors?); closing",
				  (unsigned long long)c->id);
			rx_conn_close(c, RX_CLOSE_NOW, err);
		} else if (len == 0) {
			conn_eof(c);
		} else {
			RX_STAT_ADD(r->st.bytes_in, (uint64_t)len);
			conn_deliver(c, data, len);
		}
		bufring_return(r, bid);
	} else if (res > 0) {
		unsigned bid = cqe->flags >> IORING_CQE_BUFFER_SHIFT;
		RX_STAT_ADD(r->st.bytes_in, (uint64_t)res);
		conn_deliver(c, r->bufs + (size_t)bid * r->p.buf_bytes,
			     (size_t)res);
		bufring_return(r, bid);
	} else if (res == 0) {
		conn_eof(c);
	} else if (res == -ENOBUFS) {
		/* Ring empty; buffers come back at the end of this iteration
		 * and the receive is re-armed below. */
		RX_STAT_INC(r->st.bufring_exhausted);
	} else if (res == -EINVAL && r->recv_multishot && !more &&
		   !(c->flags & RXC_CLOSING)) {
		r->recv_multishot = false;
		PC_LOGW(LOG_MOD, "kernel refused multishot recv; using "
			"single-shot receives");
	} else if (res != -ECANCELED) {
		rx_conn_close(c, RX_CLOSE_NOW, res);
	}
	if (!more)
		conn_touch(c); /* re-arm or finalise at the end of the pass */
}

/* ---------------------------------------------------------- manual reads */

void rx_conn_set_manual(struct rx_conn *c)
{
	c->flags |= RXC_MANUAL;
}

static int read_submit(struct rx_conn *c, uint32_t idx)
{
	struct rx_op *op = rx_op_get(c->r, idx);
	struct io_uring_sqe *sqe = rx_fault_sqe() ? NULL : rx_sqe(c->r);
	if (!sqe)
		return -EBUSY;
	size_t done = op->u.rd.done, len = op->u.rd.len;
	size_t cut = done < len ? rx_fault_len(len - done) : 0;
	if (cut && cut < len - done) {
		/* test builds: a short read of the first part alone */
		io_uring_prep_recv(sqe, c->fd, op->u.rd.buf + done, cut,
				   MSG_WAITALL);
	} else if (op->u.rd.buf2 && done < len) {
		/* Both parts left: one recvmsg over two iovecs. */
		c->rd_iov[0] = (struct iovec){op->u.rd.buf + done, len - done};
		c->rd_iov[1] = (struct iovec){op->u.rd.buf2, op->u.rd.len2};
		memset(&c->rd_msg, 0, sizeof(c->rd_msg));
		c->rd_msg.msg_iov = c->rd_iov;
		c->rd_msg.msg_iovlen = 2;
		io_uring_prep_recvmsg(sqe, c->fd, &c->rd_msg, MSG_WAITALL);
	} else if (op->u.rd.buf2) {
		size_t off = done - len, left = op->u.rd.len2 - off;
		io_uring_prep_recv(sqe, c->fd, op->u.rd.buf2 + off,
				   rx_fault_len(PC_MIN(left, (size_t)1 << 30)),
				   MSG_WAITALL);
	} else {
		size_t left = len - done;
		io_uring_prep_recv(sqe, c->fd, op->u.rd.buf + done,
				   PC_MIN(left, (size_t)1 << 30), MSG_WAITALL);
	}
	rx_op_tag(c->r, sqe, idx);
	return 0;
}

int rx_conn_read(struct rx_conn *c, void *buf, size_t len, rx_read_fn cb,
		 void *arg)
{
	return rx_conn_read2(c, buf, len, NULL, 0, cb, arg);
}

int rx_conn_read2(struct rx_conn *c, void *buf, size_t len, void *buf2,
		  size_t len2, rx_read_fn cb, void *arg)
{
	if (!(c->flags & RXC_MANUAL) || (len2 && !buf2))
		return -EINVAL;
	if (c->flags & (RXC_CLOSING | RXC_CLOSE_FLUSH | RXC_READING))
		return c->flags & RXC_READING ? -EBUSY : -EPIPE;
	uint32_t idx = rx_op_alloc(c->r, RX_OP_READ, c);
	if (idx == RX_NO_OP)
		return -EBUSY;
	struct rx_op *op = rx_op_get(c->r, idx);
	op->u.rd.cb = cb;
	op->u.rd.arg = arg;
	op->u.rd.buf = buf;
	op->u.rd.len = len;
	op->u.rd.buf2 = len2 ? buf2 : NULL;
	op->u.rd.len2 = len2 ? len2 : 0;
	op->u.rd.done = 0;
	int ret = read_submit(c, idx);
	if (ret < 0) {
		rx_op_free(c->r, idx);
		return ret;
	}
	c->flags |= RXC_READING;
	c->inflight++;
	return 0;
}

static void conn_on_read(struct rx_reactor *r, struct rx_op *op,
			 const struct io_uring_cqe *cqe, uint32_t idx)
{
	struct rx_conn *c = op->obj;
	int res = rx_fault_res(cqe->res);
	size_t total = op->u.rd.len + op->u.rd.len2;
	if (res > 0) {
		RX_STAT_ADD(r->st.bytes_in, (uint64_t)res);
		op->u.rd.done += (size_t)res;
		if (op->u.rd.done < total &&
		    !(c->flags & RXC_CLOSING) && read_submit(c, idx) == 0)
			return; /* short receive: continue where it stopped */
	}
	ssize_t result = op->u.rd.done == total ? (ssize_t)total
			 : res < 0 && res != -ECANCELED ? res
			 : (c->flags & RXC_CLOSING) ? -ECANCELED
			 : res == 0 ? -ECONNRESET : -EBUSY;
	rx_read_fn cb = op->u.rd.cb;
	void *arg = op->u.rd.arg;
	conn_op_done(c, idx, RXC_READING);
	if (result < 0 && !(c->flags & RXC_CLOSING))
		rx_conn_close(c, RX_CLOSE_NOW, (int)result);
	cb(c, result, arg);
	conn_touch(c);
}

void rx_conn_pause(struct rx_conn *c)
{
	c->flags |= RXC_PAUSE_USER;
	conn_stop_reading(c);
}

static void conn_maybe_resume(struct rx_conn *c)
{
	if (conn_paused(c))
		return;
	if (c->in_len)
		c->flags |= RXC_REDELIVER;
	conn_touch(c);
}

void rx_conn_resume(struct rx_conn *c)
{
	if (!(c->flags & RXC_PAUSE_USER))
		return;
	c->flags &= ~RXC_PAUSE_USER;
	conn_maybe_resume(c);
}

/* ----------------------------------------------------------------- output */

static void conn_after_queue(struct rx_conn *c)
{
	if (c->out_bytes > c->r->st.conn_out_peak)
		RX_STAT_ADD(c->r->st.conn_out_peak,
			    c->out_bytes - c->r->st.conn_out_peak);
	if (c->out_bytes > c->out_max) {
		RX_STAT_INC(c->r->st.out_cap_closes);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD,
			  "conn %llu: peer is not reading; %zu bytes queued "
			  "exceed the %zu-byte cap; closing",
			  (unsigned long long)c->id, c->out_bytes, c->out_max);
		rx_conn_close(c, RX_CLOSE_NOW, -ENOBUFS);
		return;
	}
	struct rx_budget *b = c->budget;
	bool over_budget = b && b->out_max &&
		__atomic_load_n(&b->out_used, __ATOMIC_RELAXED) > b->out_max;
	if ((c->out_bytes > c->out_high || over_budget) &&
	    !(c->flags & RXC_PAUSE_OUT)) {
		c->flags |= RXC_PAUSE_OUT;
		RX_STAT_INC(c->r->st.out_pauses);
		if (c->out_bytes <= c->out_high)
			__atomic_add_fetch(&b->out_pauses, 1, __ATOMIC_RELAXED);
		conn_stop_reading(c);
	}
	conn_touch(c);
}

/* Output that could not be queued leaves a hole in the byte stream: what
 * follows would be read as the rest of the lost message. The connection
 * closes at once instead (its peer sees a reset, never a corrupt frame). */
static void out_lost(struct rx_conn *c, size_t len)
{
	PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "conn %llu: no memory to queue %zu "
		  "bytes of output; closing", (unsigned long long)c->id, len);
	rx_conn_close(c, RX_CLOSE_NOW, -ENOMEM);
}

uint8_t *rx_conn_reserve(struct rx_conn *c, size_t len)
{
	if (c->flags & (RXC_CLOSING | RXC_CLOSE_FLUSH))
		return NULL;
	struct rx_chunk *t = c->out_tail;
	if (t && t->cap && t->cap - t->tail >= len)
		return t->storage + t->tail;
	struct rx_chunk *ch = chunk_new(c->r, len);
	if (!ch) {
		out_lost(c, len);
		return NULL;
	}
	out_owned_add(c, ch);
	out_append(c, ch);
	return ch->storage;
}

/* len bytes joined the queue; an empty queue starts its progress clock. */
static void out_queued(struct rx_conn *c, size_t len)
{
	if (!c->out_bytes)
		c->out_since_ns = c->r->now_ns;
	c->out_bytes += len;
	conn_after_queue(c);
}

void rx_conn_commit(struct rx_conn *c, size_t len)
{
	struct rx_chunk *t = c->out_tail;
	PC_ASSERT(t && t->cap && t->tail + len <= t->cap);
	if (len == 0)
		return;
	t->tail += len;
	out_queued(c, len);
}

int rx_conn_write(struct rx_conn *c, const void *data, size_t len)
{
	if (c->flags & (RXC_CLOSING | RXC_CLOSE_FLUSH))
		return -EPIPE;
	if (len == 0)
		return 0;
	uint8_t *p = rx_conn_reserve(c, len);
	if (!p)
		return -ENOMEM;
	pc_copy(p, data, len);
	rx_conn_commit(c, len);
	return 0;
}

int rx_conn_write_ref(struct rx_conn *c, const void *data, size_t len,
		      void (*release)(void *arg), void *arg)
{
	if ((c->flags & (RXC_CLOSING | RXC_CLOSE_FLUSH)) || len == 0) {
		if (release)
			release(arg);
		return len == 0 ? 0 : -EPIPE;
	}
	struct rx_reactor *r = c->r;
	struct rx_chunk *ch = r->ref_cache;
	if (ch) {
		r->ref_cache = ch->next;
		r->ref_cache_n--;
	} else if (!(ch = malloc(sizeof(*ch)))) {
		if (release)
			release(arg);
		out_lost(c, len);
		return -ENOMEM;
	}
	ch->next = NULL;
	ch->base = data;
	ch->head = 0;
	ch->tail = len;
	ch->cap = 0;
	ch->release = release;
	ch->rel_arg = arg;
	out_append(c, ch);
	out_queued(c, len);
	return 0;
}

static void conn_flush(struct rx_conn *c)
{
	struct rx_reactor *r = c->r;
	if ((c->flags & (RXC_SENDING | RXC_CONNECTING | RXC_CLOSING)) ||
	    !c->out_bytes)
		return;
	unsigned n = 0;
	for (struct rx_chunk *ch = c->out_head; ch && n < RX_IOV_MAX;
	     ch = ch->next) {
		if (ch->tail == ch->head)
			continue;
		c->iov[n].iov_base = (void *)(uintptr_t)(ch->base + ch->head);
		c->iov[n].iov_len = ch->tail - ch->head;
		n++;
	}
	PC_ASSERT(n > 0);
	/* test builds: sometimes a short send (the rest goes next time) */
	size_t total = 0;
	for (unsigned i = 0; i < n; i++)
		total += c->iov[i].iov_len;
	for (size_t want = rx_fault_len(total), k = 0; want < total; k++) {
		if (c->iov[k].iov_len >= want) {
			c->iov[k].iov_len = want;
			n = (unsigned)k + 1;
			break;
		}
		want -= c->iov[k].iov_len;
	}
	uint32_t idx;
	struct io_uring_sqe *sqe = rx_op_start(r, RX_OP_SEND, c, &idx);
	if (!sqe) {
		rx_conn_close(c, RX_CLOSE_NOW, -EBUSY);
		return;
	}
	c->msg.msg_iov = c->iov;
	c->msg.msg_iovlen = n;
	c->iov_n = n;
	io_uring_prep_sendmsg(sqe, c->fd, &c->msg, MSG_NOSIGNAL);
	rx_op_tag(r, sqe, idx);
	c->flags |= RXC_SENDING;
	c->inflight++;
}

/* Drop res sent bytes from the front of the queue. */
static void out_consume(struct rx_conn *c, size_t res)
{
	while (res) {
		struct rx_chunk *ch = c->out_head;
		PC_ASSERT(ch);
		size_t take = PC_MIN(res, ch->tail - ch->head);
		ch->head += take;
		res -= take;
		c->out_bytes -= take;
		if (ch->head < ch->tail)
			break;
		if (ch == c->out_tail && ch->cap == RX_CHUNK_BYTES) {
			/* Reuse a default tail chunk; a big one (one large
			 * reply) goes, or every connection that ever sent a
			 * big reply would keep its memory. */
			ch->head = ch->tail = 0;
			break;
		}
		c->out_head = ch->next;
		if (!c->out_head)
			c->out_tail = NULL;
		conn_chunk_free(c, ch);
	}
	/* Zero-length chunks left at the front (a reserve never committed). */
	while (c->out_head && c->out_head != c->out_tail &&
	       c->out_head->head == c->out_head->tail) {
		struct rx_chunk *ch = c->out_head;
		c->out_head = ch->next;
		conn_chunk_free(c, ch);
	}
}

static void conn_on_send(struct rx_reactor *r, struct rx_op *op,
			 const struct io_uring_cqe *cqe, uint32_t idx)
{
	struct rx_conn *c = op->obj;
	conn_op_done(c, idx, RXC_SENDING);
	RX_STAT_INC(r->st.sends);
	int res = rx_fault_res(cqe->res);
	if (res < 0) {
		if (!(c->flags & RXC_CLOSING))
			rx_conn_close(c, RX_CLOSE_NOW, res);
		conn_touch(c);
		return;
	}
	size_t queued = 0;
	for (unsigned i = 0; i < c->iov_n; i++)
		queued += c->iov[i].iov_len;
	if ((size_t)res < queued)
		RX_STAT_INC(r->st.short_sends);
	RX_STAT_ADD(r->st.bytes_out, (uint64_t)res);
	if (res > 0)
		c->out_since_ns = r->now_ns;
	out_consume(c, (size_t)res);
	if ((c->flags & RXC_PAUSE_OUT) && c->out_bytes <= c->out_low) {
		c->flags &= ~RXC_PAUSE_OUT;
		conn_maybe_resume(c);
		if (c->ops->on_drain && !(c->flags & RXC_CLOSING))
			c->ops->on_drain(c);
	}
	conn_touch(c);
}

/* --------------------------------------------------------- pending service */

static void conn_service(struct rx_conn *c)
{
	if (c->flags & RXC_CLOSING) {
		if (!c->inflight)
			conn_finalize(c);
		return;
	}
	if ((c->flags & RXC_REDELIVER) && !conn_paused(c)) {
		c->flags &= ~RXC_REDELIVER;
		if (c->in_len)
			conn_feed_in(c);
		if (c->flags & RXC_CLOSING)
			return; /* the close re-queued it; finalised there */
	}
	if ((c->flags & RXC_CLOSE_FLUSH) && !c->out_bytes &&
	    !(c->flags & RXC_SENDING)) {
		rx_conn_close(c, RX_CLOSE_NOW, c->close_err);
		return; /* re-queued by the close */
	}
	conn_flush(c);
	conn_arm_recv(c);
}

void rx_conns_run_pending(struct rx_reactor *r)
{
	while (r->pend_head) {
		struct rx_conn *c = r->pend_head;
		r->pend_head = c->pend_next;
		if (!r->pend_head)
			r->pend_tail = NULL;
		c->flags &= ~RXC_PENDING;
		conn_service(c);
	}
}

/* After the ring is gone (forced exit): free what is left, reporting it. */
void rx_conns_destroy(struct rx_reactor *r)
{
	while (r->conns) {
		struct rx_conn *c = r->conns;
		if (!c->close_err)
			c->close_err = -ESHUTDOWN;
		c->flags |= RXC_CLOSING;
		c->inflight = 0;
		conn_finalize(c);
	}
	r->pend_head = r->pend_tail = NULL;
}

/* ------------------------------------------------------------ registration */

void rx_conn_ops_register(struct rx_reactor *r)
{
	rx_op_register(r, RX_OP_RECV, conn_on_recv);
	rx_op_register(r, RX_OP_READ, conn_on_read);
	rx_op_register(r, RX_OP_SEND, conn_on_send);
	rx_op_register(r, RX_OP_CONNECT, conn_on_connect);
}
