/*
 * modules/transport_rdma_int.h — what the RDMA transport's two files share
 * (not for other modules: they use transport_rdma.h).
 *
 * Owns: nothing at run time; the wire formats of the connect handshake
 * (struct hello, struct welcome, struct rails_tail), the node's and the
 * client's structures, the configuration defaults and the few functions
 * one file calls in the other:
 *  - transport_rdma_node.c: the node (devices and rails, regions and their
 *    MRs, the listeners and the queue pairs they accepted, device events,
 *    revokes) and the connect proofs;
 *  - transport_rdma.c: the client (peers, channels, batches, completions)
 *    and tp_rdma_ops.
 */
#ifndef PC_MODULES_TRANSPORT_RDMA_INT_H
#define PC_MODULES_TRANSPORT_RDMA_INT_H

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "common/sha256.h"
#include "modules/transport_rdma.h"
#include "reactor/reactor.h"

/* "PCR2" little-endian: version 2 accepts carry the node's key table
 * (a version 1 node refuses the hello; its peers read it over TCP). */
#define HELLO_MAGIC 0x32524350u
#define HELLO_AUTH 1u
#define NONCE_BYTES 16
#define PROOF_BYTES 24
#define SKEW_MS 60000
#define SEEN_MAX 1024
#define LOCAL_MAX 256 /* local registrations (client regions) */
/* A rail a connect to failed is left alone this long (its operations go
 * on the other rails meanwhile). */
#define RAIL_HOLD_MS 10000
/* Accepted queue pairs a revoke disconnects per loop pass (each one a
 * system call or two): thousands of peers' channels must not hold the
 * listener's reactor for more than a slice. */
#define CLOSE_SLICE 16
#define STAT_ADD(tn, f, n) __atomic_add_fetch(&(tn)->st.f, (n), __ATOMIC_RELAXED)

/* Connect request private data (56 bytes: the most an RC REQ carries). */
struct hello {
	uint32_t magic;
	uint32_t flags;
	uint64_t ts_ms;
	uint8_t nonce[NONCE_BYTES];
	uint8_t proof[PROOF_BYTES];
};
_Static_assert(sizeof(struct hello) == 56, "REQ private data is 56 bytes");

/* A region's key (what records name) and the rkey of its current MR. */
struct rkpair {
	uint32_t key, rkey;
};

/*
 * Accept / reject private data. A reject carries the header only (up to
 * nkeys); an accept also carries, in body, the node's key table for the
 * rail the queue pair is on (nkeys struct rkpair: the only place a peer
 * learns the rkeys of this node's regions), then, when the node has more
 * than one rail, its other rails' addresses (struct rails_tail). An older
 * peer reads the keys and ignores the rest.
 */
struct welcome {
	uint32_t magic;
	int32_t err; /* reject: the reason, a negative errno */
	uint8_t proof[PC_SHA256_BYTES];
	uint32_t nkeys;
	uint8_t body[152];
};
#define WELCOME_HDR offsetof(struct welcome, nkeys)
_Static_assert(sizeof(struct welcome) == 196, "REP private data: 196 bytes");
_Static_assert(WELCOME_HDR <= 148, "REJ private data: 148 bytes");
_Static_assert(TP_REGIONS_MAX * sizeof(struct rkpair) <= 152,
	       "a welcome holds a full key table");

/* After the keys: rails 1..n of the node, each listening at one address
 * (4 bytes for IPv4, 16 for IPv6) and port. */
struct rails_tail {
	uint8_t n;     /* rails after rail 0 (the address dialed) */
	uint8_t v6;    /* 1: the addresses are IPv6 */
	uint16_t port; /* network order */
	uint8_t addr[];
};
#define RAILS_MAX TP_RDMA_RAILS_MAX

/* ------------------------------------------------------------------ node */

/* A region's MRs: one per rail (each device has its own PD). */
struct rreg {
	bool used;
	uint32_t key;       /* what records name; stable while it lives */
	struct tp_region r;
	struct ibv_mr *mr[RAILS_MAX];  /* current: rkeys go out in accepts */
	struct ibv_mr *old[RAILS_MAX]; /* before a revoke, until grace ends */
};

/* A revoke's work off the reactor (the listener's offload): deregister
 * the MRs whose grace ended, register a fresh MR for each region. */
struct rrot {
	struct rx_offload o;
	bool fresh;                     /* register new MRs (a revoke) */
	uint64_t epoch;                 /* the revoke's */
	struct ibv_mr *stale[TP_REGIONS_MAX][RAILS_MAX];
	struct {
		uint32_t key;           /* 0: no region in this slot */
		struct tp_region r;
		struct ibv_mr *mr[RAILS_MAX]; /* out */
	} regs[TP_REGIONS_MAX];
};

struct rlocal {
	void *base;
	size_t len;
	struct ibv_mr *mr[RAILS_MAX];
};

/*
 * A rail: one device of the node (device_names lists several; rail 0 is
 * the first, or the only one). Each has its own context, PD and MRs of
 * every region; peers reach rail k > 0 at its own address, which an
 * accept lists.
 */
struct rail {
	struct tp_node *tn;
	unsigned idx;
	char name[64];
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct sockaddr_storage sa; /* rails > 0: its network address */
	struct rdma_cm_id *lid;     /* its listener (rail 0's, or its own) */
	struct rx_watch *aw;        /* the device's async events */
	struct ibv_cq *scq;         /* accepted QPs' (they post nothing) */
};

struct sconn {
	struct rdma_cm_id *id;
	uint64_t gen;       /* tn->revoke_gen when accepted */
	bool closing;       /* disconnected by a revoke; dropped on its event */
	struct sconn *next;
};

struct tp_node {
	struct tp_rdma_cfg cfg;
	char *device, *devices, *secret;
	const struct rv_api *api;
	struct rail rails[RAILS_MAX];
	unsigned nrails;
	struct rails_tail *tail; /* what accepts list (NULL: one rail) */
	size_t tail_len;
	pthread_mutex_t lock; /* regs, locals, tail_len */
	struct rreg regs[TP_REGIONS_MAX];
	struct rlocal locals[LOCAL_MAX];
	/* the listener (its reactor only) */
	struct rx_reactor *lr;
	struct rdma_event_channel *lch; /* every rail's listener */
	struct rx_watch *lw;
	struct sconn *sconns;
	unsigned nsconns;      /* accepted and not yet dropped */
	struct {
		uint64_t ts;
		uint8_t nonce[NONCE_BYTES];
	} seen[SEEN_MAX];
	unsigned seen_next;
	unsigned clients;
	/* revokes (the listener's reactor) */
	struct rrot rot;
	bool rot_busy;       /* rot is queued or running */
	bool grace_due;      /* old MRs wait for a job to deregister them */
	uint64_t rot_asked;  /* newest epoch a revoke was asked for */
	uint64_t revoke_gen; /* revokes done: sconns of an older gen go */
	struct rx_timer grace;
	struct rx_timer closer; /* disconnects them, CLOSE_SLICE a pass */
	struct tp_rdma_stats st;
};

/* ------------------------------------------------------------- clients */

enum { CH_ADDR, CH_ROUTE, CH_CONN, CH_READY, CH_DEAD };

struct rbatch;
struct rchan;

struct rop {
	struct rbatch *b;
	struct tp_peer *p;
	struct rchan *ch;
	struct rop *next;   /* a channel's wait queue */
	uint64_t seq;
	uint64_t posted_ns; /* when posted (the reactor's clock) */
	bool fin, posted, retried;
	uint8_t moves;      /* times a closing channel passed it on */
	int8_t lk_dev;      /* the rail lkey_hdr/lkey_buf are of (-1: none) */
	bool write;
	uint32_t key;       /* the region's; the channel knows its rkey */
	uint64_t addr;
	uint32_t len, hdr_len;
	uint8_t *hdr, *buf;
	uint32_t lkey_hdr, lkey_buf;
	int *res;
};

/* A registration made for one batch, on one rail. */
struct bmr {
	struct ibv_mr *mr;
	unsigned dev;
};

struct rbatch {
	struct tp_bcore c; /* first: the list holds &c */
	struct tp_client *tc;
	struct bmr *mrs; /* registered for this batch */
	unsigned nmrs, capmrs;
	struct rop ops[];
};
_Static_assert(offsetof(struct rbatch, c) == 0, "a batch is its core");

struct rchan {
	struct tp_client *tc;
	struct tp_peer *p;
	unsigned rail;          /* the peer's rail it goes to */
	unsigned dev;           /* our rail it is on (known once resolved) */
	struct sockaddr_storage dst; /* the address dialed */
	int state;
	struct rdma_cm_id *id;
	struct ibv_cq *cq;
	uint64_t seq;           /* of the next WR */
	struct rop **fifo;      /* posted, in order (ring of sq_depth) */
	unsigned head, nfifo;
	unsigned since_signal;
	struct rop *wq, *wq_tail; /* placed, not posted */
	unsigned nwait;
	struct rx_timer timer;  /* connect step deadline; reaping */
	struct hello hi;
	unsigned nkeys;         /* the node's key table, from its accept */
	struct rkpair keys[TP_REGIONS_MAX];
	struct rchan *next;     /* the peer's channels, or the reap list */
};

struct tp_peer {
	char name[160];
	char node[160];
	struct sockaddr_storage sa;
	int sa_err;             /* endpoint parse error, 0 if resolved */
	unsigned refs;
	int last_err;
	bool up;
	struct rchan *chans;
	unsigned nchans;
	unsigned inflight;
	/* Its rails (an accept lists those after rail 0, which is sa):
	 * 1 until one did. */
	unsigned nrails;
	struct sockaddr_storage rsa[RAILS_MAX];
	uint64_t rail_hold[RAILS_MAX]; /* a connect failed: unused until */
	struct tp_peer *next;
};

/* A completion channel's watch: which client, which rail. */
struct ccw {
	struct tp_client *tc;
	unsigned dev;
};

struct tp_client {
	struct tp_node *tn;
	struct rx_reactor *r;
	struct ibv_comp_channel *cch[RAILS_MAX]; /* one per rail */
	struct ccw ccw[RAILS_MAX];
	struct rx_watch *cw[RAILS_MAX];
	struct rdma_event_channel *ech;
	struct rx_watch *ew;
	struct tp_peer *peers;
	struct tp_bcore *batches;
	struct rchan *reap;     /* dead channels to free */
	struct rx_timer reaper;
	struct rx_timer sweep;  /* op_timeout_ms: finds stuck channels */
	bool stopping;
};

static inline unsigned cfg_chans(const struct tp_node *tn)
{
	return tn->cfg.max_chans ? tn->cfg.max_chans : 16;
}

static inline unsigned cfg_sq(const struct tp_node *tn)
{
	return tn->cfg.sq_depth ? tn->cfg.sq_depth : 128;
}

static inline unsigned cfg_sig(const struct tp_node *tn)
{
	return tn->cfg.signal_every ? tn->cfg.signal_every : 16;
}

static inline unsigned cfg_rd(const struct tp_node *tn)
{
	return tn->cfg.rd_atomic ? tn->cfg.rd_atomic : 16;
}

static inline int cfg_ctimeout(const struct tp_node *tn)
{
	return (int)(tn->cfg.connect_timeout_ms ? tn->cfg.connect_timeout_ms
						: 2000);
}

static inline int neg_errno(int fallback)
{
	return errno > 0 ? -errno : fallback;
}

static inline int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

static inline uint64_t wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Whether [a, a+len) lies in [base, base+blen). */
static inline bool covers(uintptr_t base, size_t blen, uintptr_t a,
			  size_t len)
{
	return a >= base && a - base <= blen && len <= blen - (a - base);
}

static inline void sa_set_port(struct sockaddr_storage *ss, uint16_t port)
{
	if (ss->ss_family == AF_INET)
		((struct sockaddr_in *)ss)->sin_port = htons(port);
	else if (ss->ss_family == AF_INET6)
		((struct sockaddr_in6 *)ss)->sin6_port = htons(port);
}

/* ------------------------------------------- transport_rdma_node.c's */

/* "ip:port" of sa, numerically (what the connect proofs are made for). */
void tp_rdma_sa_text(const struct sockaddr *sa, char *out, size_t len);
/* The proof of a client (server false) or a node over ts, nonce and the
 * address dialed. */
void tp_rdma_proof(const char *secret, bool server, uint64_t ts,
		   const uint8_t nonce[NONCE_BYTES], const char *endpoint,
		   uint8_t out[PC_SHA256_BYTES]);
/* The rail whose device context ctx is, or -1. */
int tp_rdma_rail_of(const struct tp_node *tn, const struct ibv_context *ctx);
/* tp_ops.reg_region, dereg_region and revoke. */
int tp_rdma_reg_region(struct tp_node *tn, const struct tp_region *region,
		       uint32_t *key);
int tp_rdma_dereg_region(struct tp_node *tn, uint32_t key);
void tp_rdma_revoke(struct tp_node *tn, struct rx_reactor *r, uint64_t epoch);
/* The lkey, on rail dev, of an MR of the node's region or local tables
 * covering [p, p+len), or 0. Any thread. */
uint32_t tp_rdma_table_lkey(struct tp_node *tn, unsigned dev, const void *p,
			    size_t len);

/* ------------------------------------------------ transport_rdma.c's */

/* Destroy *cq (logged if it fails) and clear it. */
void tp_rdma_cq_destroy(struct tp_node *tn, struct ibv_cq **cq);

#endif /* PC_MODULES_TRANSPORT_RDMA_INT_H */
