/*
 * reactor/reactor.h — the io_uring event loop: one reactor per thread.
 *
 * Owns: one io_uring per reactor thread, created on that thread with
 * SINGLE_ISSUER | DEFER_TASKRUN; the op table (every in-flight SQE has a slot);
 * the timer heap; the provided-buffer ring used for socket receives; every
 * connection, listener and fd watch created on it; the cross-thread message
 * queue. Threading: every function here must be called on the reactor's own
 * thread, except rx_post() (any thread). Callbacks run on the reactor thread.
 *
 * Invariants:
 *  - user_data of every SQE encodes (op type, slot generation, slot index); a
 *    completion whose generation does not match its live slot is stale and is
 *    dropped and counted, never dispatched.
 *  - a multishot op keeps its slot until the CQE without IORING_CQE_F_MORE.
 *  - at most one send is in flight per connection; later writes queue behind
 *    it and leave as one sendmsg when it completes (short sends resume).
 *  - objects with asynchronous teardown (connections, listeners, watches) are
 *    owned by the reactor and freed only once no op references them.
 */
#ifndef PC_REACTOR_REACTOR_H
#define PC_REACTOR_REACTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

struct rx_reactor;
struct rx_conn;
struct rx_listener;
struct rx_watch;

/* Tunables of one reactor. rx_params_default() fills sane defaults. */
struct rx_params {
	unsigned sq_entries;      /* submission queue size (power of two) */
	unsigned cq_factor;       /* completion queue = sq_entries * this */
	unsigned ops_max;         /* in-flight op slots per reactor */
	unsigned timers_max;      /* armed timers with a delay per
				   * reactor (a runaway guard: arming
				   * never allocates) */
	unsigned buf_count;       /* provided receive buffers (power of two) */
	unsigned buf_bytes;       /* bytes per receive buffer */
	size_t conn_in_max;       /* max unconsumed input kept per connection */
	size_t conn_out_high;     /* stop reading a connection above this output */
	size_t conn_out_low;      /* resume reading once output drains below */
	size_t conn_out_max;      /* close a connection whose output exceeds this */
	unsigned shutdown_grace_ms; /* time for in-flight work before forced cancel */
	int nice;                 /* reactor threads' nice value; 0: inherit */
	uint64_t idle_poll_ns;    /* after a pass with completions, keep polling
				   * for more this long before sleeping in
				   * the kernel; 0 (the default): sleep at
				   * once; at most RX_IDLE_POLL_MAX_NS */
	uint64_t idle_poll_yield_max_ns; /* a yield between two polls that
				   * kept the thread off its CPU longer
				   * than this (another thread's slice) ends
				   * the poll: sleep instead */
};

#define RX_IDLE_POLL_MAX_NS 1000000000ull

void rx_params_default(struct rx_params *p);

/* Counters of one reactor. Written only by its thread with relaxed stores,
 * so another thread may read them (for metrics) without locks. Every field
 * is a uint64_t (rx_group_stats sums them as an array). */
struct rx_stats {
	uint64_t loop_iterations;   /* passes through the loop */
	uint64_t waits;             /* times the loop blocked in the kernel */
	uint64_t cqes;              /* completions handled */
	uint64_t stale_cqes;        /* completions dropped: slot generation mismatch */
	uint64_t sq_full;           /* times the SQ was full and had to be flushed */
	uint64_t ops_exhausted;     /* op slot allocation failures */
	uint64_t ops_in_use;        /* gauge: op slots in use */
	uint64_t bufring_exhausted; /* receives that found no provided buffer */
	uint64_t timers_fired;      /* timer callbacks run */
	uint64_t msgs;              /* cross-thread messages run */
	uint64_t conns_accepted;    /* connections accepted by listeners */
	uint64_t conns_connected;   /* outbound connections established */
	uint64_t conns_closed;      /* connections finalised */
	uint64_t conns_live;        /* gauge: connections alive */
	uint64_t bytes_in;          /* bytes received on connections */
	uint64_t bytes_out;         /* bytes sent on connections */
	uint64_t sends;             /* sendmsg ops completed */
	uint64_t short_sends;       /* sends that moved fewer bytes than queued */
	uint64_t out_pauses;        /* reading paused because output was high */
	uint64_t conn_out_peak;     /* most output ever queued on one connection */
	uint64_t out_cap_closes;    /* connections closed: output cap exceeded */
	uint64_t in_cap_closes;     /* connections closed: input cap exceeded */
	uint64_t in_taken;          /* messages whose input a handler kept
				     * past its on_data */
	uint64_t accept_errors;     /* accept completions with an error */
	uint64_t file_ops;          /* file read/write/fsync ops completed */
	uint64_t blocks_unmapped_off; /* large buffers the reactor's caches
				       * let go of, unmapped on the offload
				       * thread */
	uint64_t idle_poll_hits;    /* idle polls that found a completion
				     * after yielding at least once */
	uint64_t idle_poll_misses;  /* idle polls the loop slept after */
	uint64_t idle_poll_yielded; /* of them, ended by a long yield */
	uint64_t idle_poll_ns;      /* wall time spent idle polling */
};

/* Counter bump for single-writer stats: no lock, no atomic RMW. */
#define RX_STAT_ADD(field, n)                                                  \
	__atomic_store_n(&(field), __atomic_load_n(&(field), __ATOMIC_RELAXED) + \
					   (n), __ATOMIC_RELAXED)
#define RX_STAT_INC(field) RX_STAT_ADD(field, 1)
#define RX_STAT_READ(field) __atomic_load_n(&(field), __ATOMIC_RELAXED)

/* ---------------------------------------------------------------- lifecycle */

/*
 * Create a reactor on the calling thread (the ring is bound to it). Probes
 * io_uring and fails with a clear log line and -ENOSYS/-EPERM when io_uring is
 * unavailable. id names the reactor in logs ("r<id>").
 */
int rx_reactor_create(struct rx_reactor **out, unsigned id,
		      const struct rx_params *p);

/* Run the loop until rx_reactor_stop() completes: returns 0 when all ops have
 * drained, or a negative errno on a fatal ring error. */
int rx_reactor_run(struct rx_reactor *r);

/*
 * Begin shutdown (own thread only; other threads use rx_post): stop hooks run,
 * listeners close, watches cancel, connections stop reading and flush their
 * output; after shutdown_grace_ms everything still in flight is cancelled.
 * rx_reactor_run() returns once no op is left.
 */
void rx_reactor_stop(struct rx_reactor *r);
bool rx_reactor_stopping(const struct rx_reactor *r);

/* Register a function run when stop begins (LIFO order), e.g. by modules. */
int rx_reactor_on_stop(struct rx_reactor *r, void (*fn)(struct rx_reactor *r,
							void *arg),
		       void *arg);

/* Free everything; only after rx_reactor_run() returned (or never ran). */
void rx_reactor_destroy(struct rx_reactor *r);

unsigned rx_reactor_id(const struct rx_reactor *r);
/* Large buffers modules keep warm on this reactor for their next call
 * (common/blocks.h; kv's and slotmap's staging): taken and given back on
 * the reactor's thread only; freed when the reactor is destroyed, after
 * its connections (so a reply still holding one gives it back first). */
struct pc_blocks *rx_reactor_blocks(struct rx_reactor *r);
/* Monotonic time cached at the top of the current loop iteration. */
uint64_t rx_now_ns(const struct rx_reactor *r);
const struct rx_stats *rx_reactor_stats(const struct rx_reactor *r);
const struct rx_params *rx_reactor_params(const struct rx_reactor *r);

/* ------------------------------------------------------- cross-thread posts */

/*
 * Run fn(target, arg) on target's thread, soon. Safe from any thread. For
 * rare control events (membership, shutdown), not per-request work: a wake-up
 * across cores costs more than a whole request. Returns 0 or -ENOMEM. A
 * message still queued when the target is destroyed runs then, with
 * rx_reactor_stopping() true, so it can free what it carries.
 */
int rx_post(struct rx_reactor *target, void (*fn)(struct rx_reactor *r,
						  void *arg),
	    void *arg);

/*
 * A message its poster owns (embed it where it lives): rx_post_msg() needs
 * no memory, so it cannot fail, for the posts that must not (a stop asked
 * for while allocations fail). fn(target, arg) runs once; the reactor
 * reads m only before fn starts, so from then on m may be freed or posted
 * again (an offload's done re-queues it), never while it is still queued.
 */
struct rx_msg {
	struct rx_msg *next;
	void (*fn)(struct rx_reactor *r, void *arg);
	void *arg;
	bool heap;              /* rx_post()'s own: freed after fn */
};
void rx_post_msg(struct rx_reactor *target, struct rx_msg *m,
		 void (*fn)(struct rx_reactor *r, void *arg), void *arg);

/* ------------------------------------------------------------------ offloads */

/*
 * A blocking system call made off the reactor (reactor/offload.c): work(o)
 * runs on the process's offload thread of its lane, then done(r, o) on the
 * reactor that submitted it. Embed it in what it works on; it must stay
 * valid until done runs. For calls that can take milliseconds and have no
 * io_uring form (mmap/munmap of large regions, memory registration:
 * RX_LANE_SYSCALL, the default), and for bulk work that must not hold
 * those up (faulting in pages: RX_LANE_BULK). The reactor's shutdown waits
 * for its offloads.
 */
enum rx_lane { RX_LANE_SYSCALL, RX_LANE_BULK, RX_LANES };

struct rx_offload {
	void (*work)(struct rx_offload *o);                       /* worker */
	void (*done)(struct rx_reactor *r, struct rx_offload *o); /* reactor */
	unsigned lane;           /* enum rx_lane; 0 = RX_LANE_SYSCALL */
	struct rx_reactor *r_;   /* private */
	struct rx_offload *next_;
	struct rx_msg back_;     /* private: the way back, needs no memory */
};

/* Queue o. Own thread only. 0, or -ESHUTDOWN (the reactor is being
 * destroyed) or -EAGAIN (no offload thread): then nothing runs and the
 * caller makes the call itself. */
int rx_offload(struct rx_reactor *r, struct rx_offload *o);

/* ------------------------------------------------------------------- timers */

/* A timer is owned by the caller (embed it); the reactor only links it.
 * Never re-init, move or copy an armed timer: the timers linked under it
 * would be lost. */
struct rx_timer {
	uint64_t deadline_ns; /* absolute monotonic deadline */
	uint64_t period_ns;   /* 0 = one-shot */
	uint64_t seq;         /* arming order: ties fire first-armed first */
	void (*cb)(struct rx_reactor *r, struct rx_timer *t);
	void *arg;            /* for the callback's use */
	/* private (reactor/timer.c): idle, on the heap or on the next
	 * pass's list, and the links of either */
	unsigned where;
	struct rx_timer *hp_up, *hp_left, *hp_right;
	struct rx_timer *soon_prev, *soon_next;
};

void rx_timer_init(struct rx_timer *t,
		   void (*cb)(struct rx_reactor *r, struct rx_timer *t),
		   void *arg);
/*
 * (Re)arm: fire after delay_ns, then every period_ns if non-zero. Returns 0,
 * or -ENOSPC when timers_max timers with a delay are armed; then t is as it
 * was (armed as before, or idle). Arming never allocates: the links are in
 * t. A one-shot with no delay (delay_ns 0, period_ns 0) is "run on the
 * next pass": it takes no slot and never fails, so a callback deferred that
 * way (a completion that must not run inside its call) always runs. Timers
 * fire by deadline, then in arming order, either way.
 */
int rx_timer_start(struct rx_reactor *r, struct rx_timer *t, uint64_t delay_ns,
		   uint64_t period_ns);
/* Disarm; harmless on an idle timer. A callback may stop its own timer. */
void rx_timer_stop(struct rx_reactor *r, struct rx_timer *t);
bool rx_timer_armed(const struct rx_timer *t);

#define RX_MS(ms) ((uint64_t)(ms) * 1000000ull)

/* -------------------------------------------------------------- connections */

struct rx_conn_ops {
	/*
	 * Bytes arrived. Return how many were consumed (0..len) or a negative
	 * errno to close the connection with that error. Unconsumed bytes are
	 * kept (up to the input cap) and presented again, followed by new bytes.
	 */
	ssize_t (*on_data)(struct rx_conn *c, const uint8_t *data, size_t len);
	/* Outbound connection established (err 0) — optional. A failed connect
	 * reports through on_close instead. */
	void (*on_connect)(struct rx_conn *c);
	/* Output drained below the low watermark after a pause — optional. */
	void (*on_drain)(struct rx_conn *c);
	/* File descriptors received (SCM_RIGHTS) with the bytes that follow
	 * in the next on_data; the callee owns them (must close or keep them).
	 * Only on connections where rx_conn_enable_fds() was called. */
	void (*on_fds)(struct rx_conn *c, const int *fds, unsigned n);
	/* Called exactly once when the connection is gone; err is 0 for an
	 * orderly close (EOF or rx_conn_close) or a negative errno. The fd is
	 * closed and the struct freed right after this returns. */
	void (*on_close)(struct rx_conn *c, int err);
	/* The peer closed its sending side (EOF) — optional. Reading stops
	 * either way. Return true to keep the connection for a reply still
	 * being produced: the callee closes it (rx_conn_close) once the reply
	 * is queued. Absent or false: it closes after what is queued is sent. */
	bool (*on_eof)(struct rx_conn *c);
};

/* Close modes. */
enum rx_close {
	RX_CLOSE_FLUSH, /* stop reading, send what is queued, then close */
	RX_CLOSE_NOW,   /* cancel everything and close */
};

/* Adopt a connected, non-blocking socket. Reading starts at once. Returns
 * NULL with *err set (e.g. -ENOMEM); the fd is closed on failure. */
struct rx_conn *rx_conn_attach(struct rx_reactor *r, int fd,
			       const struct rx_conn_ops *ops, void *udata,
			       int *err);

/*
 * Start an outbound TCP or Unix connection. on_connect fires on success; on
 * failure or after timeout_ms (0 = none), on_close(c, -errno). Writes made
 * before the connection is up are queued. While the reactor stops, no new
 * connection starts (NULL, *err = -ESHUTDOWN), and the stop closes the
 * outgoing ones at once (on_close(c, -ESHUTDOWN)), not after a flush: they
 * stop reading either way, so no answer could come back on them.
 */
struct rx_conn *rx_conn_connect(struct rx_reactor *r,
				const struct sockaddr *addr, socklen_t addrlen,
				unsigned timeout_ms,
				const struct rx_conn_ops *ops, void *udata,
				int *err);

void *rx_conn_udata(const struct rx_conn *c);
void rx_conn_set_udata(struct rx_conn *c, void *udata);
struct rx_reactor *rx_conn_reactor(const struct rx_conn *c);
int rx_conn_fd(const struct rx_conn *c);
uint64_t rx_conn_id(const struct rx_conn *c);
bool rx_conn_closing(const struct rx_conn *c);
/* Bytes queued for sending and not yet acknowledged by a send completion. */
size_t rx_conn_out_bytes(const struct rx_conn *c);
/* 0 when no output is queued; else when the queue last made progress (the
 * kernel took a byte) or, if none since, when it began (loop time, ns). */
uint64_t rx_conn_out_since(const struct rx_conn *c);
/* Per-connection overrides of the reactor defaults. */
void rx_conn_set_limits(struct rx_conn *c, size_t in_max, size_t out_high,
			size_t out_low, size_t out_max);

/*
 * A memory budget shared by connections of any reactor (e.g. every RPC
 * connection of a node). Bytes of input kept for incomplete messages and of
 * owned output chunks are taken from it when a buffer grows and given back
 * when it is freed (atomics, touched per buffer growth, never per byte).
 * Over in_max the growing connection is closed (-ENOBUFS, counted); over
 * out_max a connection that queues more output stops reading until its own
 * queue drains below its low watermark. Others may take reservations from
 * out_used too (rx_budget_take). A limit of 0 means unbounded.
 */
struct rx_budget {
	size_t in_max;
	size_t out_max;
	size_t in_used;       /* atomic */
	size_t out_used;      /* atomic */
	uint64_t in_closes;   /* atomic: connections closed over in_max */
	uint64_t out_pauses;  /* atomic: reading paused over out_max */
};

/* Take bytes of output room: 0, or -ENOBUFS (nothing taken) when it would
 * go over out_max. rx_budget_give returns them. Any thread. */
int rx_budget_take(struct rx_budget *b, size_t bytes);
void rx_budget_give(struct rx_budget *b, size_t bytes);

/* Account this connection's buffers in b (NULL: none). Call right after
 * attach, before anything is buffered; b must outlive the connection. */
void rx_conn_set_budget(struct rx_conn *c, struct rx_budget *b);
/* True while reading is paused because output is high (the connection's
 * own watermark or the budget): stop taking new work from its input. */
bool rx_conn_backlogged(const struct rx_conn *c);

/* Output that cannot be queued for want of memory (-ENOMEM from the
 * three calls below) closes the connection at once: later bytes must never
 * follow a hole in the stream. */

/* Queue bytes (copied). Returns 0, -EPIPE if closing, -ENOMEM. */
int rx_conn_write(struct rx_conn *c, const void *data, size_t len);
/*
 * Queue bytes by reference (zero-copy): data must stay valid and unchanged
 * until release(arg) is called — after the kernel has sent it or the
 * connection closed. release (may be NULL) is called even on failure.
 */
int rx_conn_write_ref(struct rx_conn *c, const void *data, size_t len,
		      void (*release)(void *arg), void *arg);
/* Reserve len writable bytes at the tail of the output; fill them, then
 * rx_conn_commit(c, n) with n <= len. NULL if closing or out of memory. */
uint8_t *rx_conn_reserve(struct rx_conn *c, size_t len);
void rx_conn_commit(struct rx_conn *c, size_t len);

/*
 * Accept file descriptors passed with SCM_RIGHTS on this (Unix) connection,
 * up to max_fds per message; more is a protocol error (the connection closes
 * and every descriptor received is closed). Call right after attach, before
 * the first receive; -EBUSY afterwards, -EINVAL for max_fds outside 1..64.
 */
int rx_conn_enable_fds(struct rx_conn *c, unsigned max_fds);

/*
 * Manual receive: the connection never reads on its own (on_data is not
 * used); the owner asks for exactly len bytes into its own buffer and
 * rx_conn_read calls back once they are all there (short receives resume),
 * or with a negative errno (-ECONNRESET at EOF). Bytes land straight in buf:
 * no copy through the receive-buffer ring. One read at a time per
 * connection. rx_conn_set_manual must be called right after attach/connect.
 */
typedef void (*rx_read_fn)(struct rx_conn *c, ssize_t res, void *arg);
void rx_conn_set_manual(struct rx_conn *c);
int rx_conn_read(struct rx_conn *c, void *buf, size_t len, rx_read_fn cb,
		 void *arg);
/* The same into two buffers in order (len bytes, then len2): one receive for
 * a framing header and the payload behind it. res is len + len2. */
int rx_conn_read2(struct rx_conn *c, void *buf, size_t len, void *buf2,
		  size_t len2, rx_read_fn cb, void *arg);

/*
 * Input taken out of a connection (rx_conn_take_input): a message's bytes
 * that stay where they are, valid and counted in the connection's budget
 * (in_used), until rx_input_put — for a handler that works on a large
 * request over several loop passes instead of copying it out at once.
 */
struct rx_input {
	struct rx_reactor *r;   /* NULL: nothing taken */
	struct rx_budget *budget;
	uint8_t *buf;
	size_t room;            /* the buffer's size */
	size_t res;             /* its address space (struct pc_block.res) */
	size_t counted;         /* bytes of budget->in_used it holds */
};

/*
 * From on_data only: take the buffer [p, p + len) lies in, when that is
 * the connection's kept input (a message that arrived in several pieces;
 * one that came whole in a single receive lies in the receive ring and
 * cannot be taken: false, nothing changes). The bytes then stay put until
 * rx_input_put on this reactor; what on_data leaves unconsumed after them
 * moves to a new buffer when it returns. Pause the connection first if no
 * further input should be taken meanwhile.
 */
bool rx_conn_take_input(struct rx_conn *c, const uint8_t *p, size_t len,
			struct rx_input *out);
/* Give taken input back (its reactor's thread; emptied; harmless twice).
 * Given back before the on_data that took it has returned, it stays the
 * connection's, as if never taken. */
void rx_input_put(struct rx_input *in);

/*
 * From on_data: the bytes it leaves unconsumed begin a message of at least
 * bytes bytes (counted from the first of them). When that is large, the
 * buffer that keeps them becomes a block of its own once 64 KiB of it is
 * charged (a warm one the whole message fits, if the reactor keeps one),
 * which grows in place as bytes arrive, instead of a heap buffer that
 * doubles and is copied into the first block at 1 MiB: a message of tens
 * of MiB is copied nowhere beyond its first 64 KiB. Memory is committed,
 * and charged to the budget, only as bytes arrive (at most twice what
 * arrived, and no more than the message's size). The hint lasts until an
 * on_data consumes bytes without giving it again, and ends when one
 * consumes all.
 */
void rx_conn_expect(struct rx_conn *c, size_t bytes);

/* Stop / restart reading (e.g. while an async handler holds a request). */
void rx_conn_pause(struct rx_conn *c);
void rx_conn_resume(struct rx_conn *c);

/* Close. May be called from any callback of this connection, repeatedly. */
void rx_conn_close(struct rx_conn *c, enum rx_close how, int err);

/* ---------------------------------------------------------------- listeners */

/* A new connection: the callback owns fd (non-blocking, close-on-exec). */
typedef void (*rx_accept_fn)(struct rx_listener *l, int fd, void *arg);

/*
 * Listen on host:port (IPv4 or IPv6 literal, or a name), port 0 = pick a free
 * port. reuseport lets each reactor listen on the same port (the kernel
 * spreads connections). Accepts with a multishot accept. NULL + *err on
 * failure (the error is logged with the address).
 */
struct rx_listener *rx_listen_tcp(struct rx_reactor *r, const char *host,
				  uint16_t port, bool reuseport, int backlog,
				  rx_accept_fn cb, void *arg, int *err);
/* Listen on a Unix socket path; a stale socket file (nobody listening) is
 * replaced, a live one is an error (-EADDRINUSE). mode sets the file mode. */
struct rx_listener *rx_listen_unix(struct rx_reactor *r, const char *path,
				   unsigned mode, int backlog, rx_accept_fn cb,
				   void *arg, int *err);
uint16_t rx_listener_port(const struct rx_listener *l);
struct rx_reactor *rx_listener_reactor(const struct rx_listener *l);
/* Stop accepting and close (unlinks a Unix socket path). */
void rx_listener_close(struct rx_listener *l);

/* ---------------------------------------------------------------- fd watch */

/* Readiness of a foreign fd (RDMA completion channel, rdma_cm channel, ...).
 * revents is a poll(2) mask. Treat it as a hint: drain until EAGAIN. */
typedef void (*rx_watch_fn)(struct rx_watch *w, uint32_t revents, void *arg);

struct rx_watch *rx_watch_fd(struct rx_reactor *r, int fd, uint32_t events,
			     rx_watch_fn cb, void *arg, int *err);
/* No callback runs after this returns; the watch is freed later. The fd is
 * not closed (the caller owns it). */
void rx_watch_cancel(struct rx_watch *w);

/* ----------------------------------------------------------------- file I/O */

/* Completion of a file op: res = bytes moved (full length unless EOF) or a
 * negative errno. Called exactly once if submission returned 0. */
typedef void (*rx_io_fn)(void *arg, int64_t res);

/*
 * Read/write len bytes at off; short transfers are resumed until complete
 * (a read stops early only at EOF). Buffers and fd must stay valid until the
 * callback. O_DIRECT works when buf, len and off meet the device alignment.
 * Returns 0, or -EBUSY when no op slot is free, or -ESHUTDOWN while stopping.
 */
int rx_file_read(struct rx_reactor *r, int fd, void *buf, size_t len,
		 uint64_t off, rx_io_fn cb, void *arg);
int rx_file_write(struct rx_reactor *r, int fd, const void *buf, size_t len,
		  uint64_t off, rx_io_fn cb, void *arg);
int rx_file_fsync(struct rx_reactor *r, int fd, bool datasync, rx_io_fn cb,
		  void *arg);

/* --------------------------------------------------------------- test hooks */

/* Submit a NOP whose completion carries user_data as given: lets tests play
 * a late completion for a recycled slot. */
int rx_test_submit_nop(struct rx_reactor *r, uint64_t user_data);
/* user_data of a fresh test op slot (then freed, so its slot is recycled). */
uint64_t rx_test_stale_user_data(struct rx_reactor *r);
/* Submit a NOP to a fresh test op slot; fn(arg) runs on its completion. */
int rx_test_nop(struct rx_reactor *r, void (*fn)(void *arg), void *arg,
		uint64_t *user_data);

#endif /* PC_REACTOR_REACTOR_H */
