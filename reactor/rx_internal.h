/*
 * reactor/rx_internal.h — structures shared by the reactor's own .c files.
 *
 * Owns: the layout of struct rx_reactor, the op slots and the per-object
 * structs, and the calls between the reactor's files (which file calls which:
 * the graph at the head of ops.c). Nothing outside reactor/ includes this
 * header. Threading: all of it belongs to the reactor's thread, except the
 * message queue (mutex).
 */
#ifndef PC_REACTOR_RX_INTERNAL_H
#define PC_REACTOR_RX_INTERNAL_H

#include <liburing.h>
#include <pthread.h>
#include <sys/uio.h>

#include "common/blocks.h"
#include "common/log.h"
#include "common/util.h"
#include "reactor.h"

/* Op types: the dispatch table (ops.c, r->on_cqe) is indexed by these. */
enum rx_op_type {
	RX_OP_NONE = 0, /* user_data 0: completions we never look at */
	RX_OP_RECV,
	RX_OP_READ,  /* manual receive into a caller buffer */
	RX_OP_SEND,
	RX_OP_CONNECT,
	RX_OP_ACCEPT,
	RX_OP_POLL,
	RX_OP_FILE,
	RX_OP_MSG,
	RX_OP_TEST,
	RX_OP__COUNT,
};

/*
 * user_data layout: [type:8][generation:24][slot index:32]. The generation is
 * bumped each time a slot is allocated, so a completion that arrives after its
 * slot was recycled carries the old generation and is dropped.
 */
#define RX_UD_TYPE_SHIFT 56
#define RX_UD_GEN_SHIFT 32
#define RX_UD_GEN_MASK 0xFFFFFFu
#define RX_NO_OP UINT32_MAX

enum rx_file_kind { RX_FILE_READ, RX_FILE_WRITE, RX_FILE_FSYNC };

struct rx_op {
	uint32_t gen;       /* generation of the current (or last) use */
	uint8_t type;       /* enum rx_op_type while live, RX_OP_NONE when free */
	uint8_t live;       /* 1 while an SQE for this slot may complete */
	uint16_t flags;     /* per-type flags */
	uint32_t next_free; /* free-list link while free */
	void *obj;          /* owner: conn, listener, watch; NULL when orphaned */
	union {
		struct {                 /* RX_OP_FILE */
			rx_io_fn cb;
			void *arg;
			uint8_t *buf;
			uint64_t len;
			uint64_t off;
			uint64_t done;
			int fd;
			uint8_t kind;    /* enum rx_file_kind */
			uint8_t datasync;
		} file;
		struct {                 /* RX_OP_READ */
			rx_read_fn cb;
			void *arg;
			uint8_t *buf;    /* first part */
			size_t len;
			uint8_t *buf2;   /* second part (rx_conn_read2), or NULL */
			size_t len2;
			size_t done;     /* bytes in, over both parts */
		} rd;
		struct {                 /* RX_OP_TEST */
			void (*fn)(void *arg);
			void *arg;
		} test;
	} u;
};

/* Output chunk: owned bytes (storage[]) or a zero-copy reference. */
struct rx_chunk {
	struct rx_chunk *next;
	const uint8_t *base;        /* storage or the referenced memory */
	size_t head;                /* first unsent byte */
	size_t tail;                /* end of written bytes */
	size_t cap;                 /* owned: storage bytes; ref: 0 */
	void (*release)(void *arg); /* ref: called once when done with it */
	void *rel_arg;
	uint8_t storage[];
};

#define RX_CHUNK_BYTES (16u * 1024u) /* default owned chunk size */
#define RX_CHUNK_CACHE 256u          /* free default chunks kept per reactor */
#define RX_REF_CACHE 1024u           /* free reference chunks kept per reactor
				      * (one per page a data port sends) */
#define RX_IOV_MAX 64u               /* iovecs per sendmsg */
/* Input buffers this large come from, and go back to, the reactor's warm
 * blocks (common/blocks.h): a message of tens of MiB (a kv.set of large
 * values) then lands in memory already faulted in, not in a fresh mapping
 * that faults a page per 4 KiB inside one callback. */
#define RX_IN_WARM_MIN (1u << 20)

/* Connection flags. */
#define RXC_READING 0x001u     /* a recv op is armed (multishot or single) */
#define RXC_SENDING 0x002u     /* a sendmsg is in flight */
#define RXC_CONNECTING 0x004u  /* outbound connect in flight */
#define RXC_PAUSE_USER 0x008u  /* rx_conn_pause() */
#define RXC_PAUSE_OUT 0x010u   /* output above the high watermark */
#define RXC_CLOSE_FLUSH 0x020u /* close once the output is flushed */
#define RXC_CLOSING 0x040u     /* cancelling: finalise when no op is left */
#define RXC_PENDING 0x080u     /* on the reactor's pending list */
#define RXC_CANCEL_SENT 0x100u /* cancel of the recv already submitted */
#define RXC_EOF 0x200u         /* peer closed its side */
#define RXC_FINAL 0x400u       /* on_close ran */
#define RXC_REDELIVER 0x800u   /* re-feed kept input after a resume */
#define RXC_MANUAL 0x1000u     /* the owner reads with rx_conn_read */
#define RXC_OUTGOING 0x2000u   /* opened by rx_conn_connect */
#define RXC_IN_FEED 0x4000u    /* on_data runs on the kept input */
#define RXC_IN_TAKEN 0x8000u   /* ... which rx_conn_take_input took */

struct rx_conn {
	struct rx_reactor *r;
	int fd;
	uint32_t flags;               /* RXC_* */
	uint32_t recv_op;             /* op slot of the armed recv, or RX_NO_OP */
	unsigned inflight;            /* ops in flight that reference this conn */
	int close_err;                /* error reported to on_close */
	uint64_t id;                  /* unique per reactor, for logs */
	const struct rx_conn_ops *ops;
	void *udata;
	struct rx_budget *budget;     /* shared memory budget, or NULL */
	size_t out_owned;             /* owned chunk bytes taken from budget */
	/* input kept between arrivals (unconsumed bytes); in_cap is what the
	 * budget counts, in_room the buffer's real size (a warm block taken
	 * from r->in_warm may be larger) */
	uint8_t *in;
	size_t in_len, in_cap, in_room, in_max;
	size_t in_res;                /* a block's address space (pc_block.res) */
	size_t in_want;               /* rx_conn_expect: the size of the
				       * message being kept (0: unknown) */
	/* output queue */
	struct rx_chunk *out_head, *out_tail;
	size_t out_bytes;             /* unsent bytes in the queue */
	uint64_t out_since_ns;        /* queue began or last sent a byte */
	size_t out_high, out_low, out_max;
	unsigned iov_n;               /* iovecs in the in-flight sendmsg */
	struct iovec iov[RX_IOV_MAX];
	struct msghdr msg;
	/* fd passing: recvmsg with room for fds_max descriptors */
	unsigned fds_max;
	struct msghdr rmsg;
	/* the in-flight two-part manual read (rx_conn_read2) */
	struct iovec rd_iov[2];
	struct msghdr rd_msg;
	/* connect */
	struct sockaddr_storage peer;
	socklen_t peer_len;
	struct rx_timer timer;        /* connect timeout, then flush-close limit */
	/* lists */
	struct rx_conn *pend_next;    /* pending list (flush/finalise/redeliver) */
	struct rx_conn *prev, *next;  /* all connections of the reactor */
};

#define RXL_CLOSING 0x1u

struct rx_listener {
	struct rx_reactor *r;
	int fd;
	uint32_t flags;
	uint32_t op;                  /* accept op slot or RX_NO_OP */
	uint16_t port;
	char *unix_path;              /* unlinked on close (Unix listeners) */
	rx_accept_fn cb;
	void *arg;
	struct rx_timer rearm_timer;  /* re-arm after resource errors */
	struct rx_listener *prev, *next;
};

struct rx_watch {
	struct rx_reactor *r;
	int fd;
	uint32_t events;
	uint32_t op;
	bool cancelled;
	rx_watch_fn cb;
	void *arg;
	struct rx_timer retry;  /* cancelled: ask for the removal again */
	struct rx_watch *prev, *next;
};

struct rx_stop_hook {
	struct rx_stop_hook *next;
	void (*fn)(struct rx_reactor *r, void *arg);
	void *arg;
};

enum rx_state { RX_RUNNING, RX_DRAINING, RX_CANCELLING, RX_DONE };

/* A completion handler for one op kind (registered with rx_op_register). */
typedef void (*rx_cqe_fn)(struct rx_reactor *r, struct rx_op *op,
			  const struct io_uring_cqe *cqe, uint32_t idx);

struct rx_reactor {
	struct io_uring ring;
	unsigned id;
	struct rx_params p;
	enum rx_state state;
	uint64_t now_ns;              /* cached per loop iteration */
	uint64_t stop_deadline_ns;    /* forced cancel after this */
	uint64_t poll_until_ns;       /* idle polling: spin before a wait until this */
	struct rx_stats st;
	bool recv_multishot;          /* false after the kernel refused it */

	/* op table (ops.c) */
	struct rx_op *ops;
	uint32_t ops_free;            /* head of the free list */
	rx_cqe_fn on_cqe[RX_OP__COUNT]; /* handlers, set at create */

	/* timers: an intrusive binary min-heap ordered by (deadline, seq),
	 * at most timers_max of them (timer.c) */
	struct rx_timer *heap_root;
	unsigned heap_n;
	uint64_t timer_seq;
	/* zero-delay one-shots, in arming order (so by deadline too): no
	 * slot, no limit (timer.c) */
	struct rx_timer *soon_head, *soon_tail;

	/* provided buffer ring for receives */
	struct io_uring_buf_ring *br;
	size_t br_bytes;
	uint8_t *bufs;
	unsigned br_pending;          /* buffers returned, not yet advanced */
	uint16_t bgid;

	/* objects */
	struct rx_conn *conns;        /* all live connections */
	struct rx_conn *pend_head, *pend_tail;
	struct rx_listener *listeners;
	struct rx_watch *watches;
	struct rx_chunk *chunk_cache; /* free default-size chunks */
	unsigned chunk_cache_n;
	struct rx_chunk *ref_cache;   /* free reference chunks (cap 0) */
	unsigned ref_cache_n;
	struct pc_blocks in_warm;     /* input buffers of RX_IN_WARM_MIN and
				       * more, kept for the next large message */
	struct pc_blocks mod_warm;    /* modules' (rx_reactor_blocks) */
	struct rx_conn *feeding;      /* on_data runs on its kept input now */
	uint64_t next_conn_id;
	struct rx_stop_hook *stop_hooks;

	/* cross-thread messages */
	pthread_mutex_t msg_lock;
	struct rx_msg *msg_head, *msg_tail;
	int efd;
	uint64_t efd_val;
	uint32_t msg_op;
	unsigned offloads;            /* rx_offload calls not yet done */
};

/* ops.c — the op table and completion dispatch */
int rx_ops_init(struct rx_reactor *r);
void rx_ops_fini(struct rx_reactor *r);
struct io_uring_sqe *rx_sqe(struct rx_reactor *r);
uint32_t rx_op_alloc(struct rx_reactor *r, enum rx_op_type type, void *obj);
void rx_op_free(struct rx_reactor *r, uint32_t idx);
uint64_t rx_op_ud(const struct rx_reactor *r, uint32_t idx);
/* Allocate a slot and an SQE for it, or neither: NULL when the op table or
 * the SQ is exhausted. The caller preps the SQE, then rx_op_tag()s it (after
 * the prep helper, which may reset user_data). */
struct io_uring_sqe *rx_op_start(struct rx_reactor *r, enum rx_op_type type,
				 void *obj, uint32_t *idx);
static inline void rx_op_tag(struct rx_reactor *r, struct io_uring_sqe *sqe,
			     uint32_t idx)
{
	io_uring_sqe_set_data64(sqe, rx_op_ud(r, idx));
}
static inline struct rx_op *rx_op_get(struct rx_reactor *r, uint32_t idx)
{
	return &r->ops[idx];
}
/* Submit an async cancel for one op (its completion is ignored). */
void rx_cancel_op(struct rx_reactor *r, uint32_t idx);
/* Each op kind's owner registers its handler once, at reactor creation. */
void rx_op_register(struct rx_reactor *r, enum rx_op_type type, rx_cqe_fn fn);
/* Hand one completion to its kind's handler, or drop it as stale. */
void rx_op_dispatch(struct rx_reactor *r, const struct io_uring_cqe *cqe);

/* timer.c */
int rx_timers_init(struct rx_reactor *r);
void rx_timers_fini(struct rx_reactor *r);
void rx_timers_run(struct rx_reactor *r);
/* Nanoseconds until the next deadline, or UINT64_MAX when none is armed. */
uint64_t rx_timers_next_ns(const struct rx_reactor *r);
/* A timer is due (armed to fire by now, e.g. a zero-delay completion). */
bool rx_timers_due(const struct rx_reactor *r);

/* conn.c */
void rx_conn_ops_register(struct rx_reactor *r); /* RECV READ SEND CONNECT */
void rx_conns_run_pending(struct rx_reactor *r);
void rx_conns_stop(struct rx_reactor *r, bool now);
void rx_conns_destroy(struct rx_reactor *r);
void rx_chunks_fini(struct rx_reactor *r);
int rx_bufring_init(struct rx_reactor *r);
void rx_bufring_fini(struct rx_reactor *r);
void rx_bufring_flush(struct rx_reactor *r);

/* listen.c */
void rx_listen_ops_register(struct rx_reactor *r); /* ACCEPT */
void rx_listeners_close_all(struct rx_reactor *r);
void rx_listeners_destroy(struct rx_reactor *r);

/* io.c */
void rx_io_ops_register(struct rx_reactor *r); /* POLL FILE */
void rx_watches_cancel_all(struct rx_reactor *r);
void rx_watches_destroy(struct rx_reactor *r);

/* Intrusive doubly-linked list helpers for prev/next objects. */
#define RX_LIST_ADD(head, o)                                                   \
	do {                                                                   \
		(o)->prev = NULL;                                              \
		(o)->next = (head);                                            \
		if (head)                                                      \
			(head)->prev = (o);                                    \
		(head) = (o);                                                  \
	} while (0)
#define RX_LIST_DEL(head, o)                                                   \
	do {                                                                   \
		if ((o)->prev)                                                 \
			(o)->prev->next = (o)->next;                           \
		else                                                           \
			(head) = (o)->next;                                    \
		if ((o)->next)                                                 \
			(o)->next->prev = (o)->prev;                           \
		(o)->prev = (o)->next = NULL;                                  \
	} while (0)

/* The reactor's block caches' drop hook (conn.c): a mapped block they
 * let go of is unmapped on the offload thread. arg: the reactor. */
void rx_blocks_drop_off(struct pc_block *b, void *arg);

#endif /* PC_REACTOR_RX_INTERNAL_H */
