/*
 * tests/fake/rdma_sim_int.h — what rdma_sim.c and rdma_sim_cm.c share:
 * the sim's objects, the fabric's global state and the few functions one
 * file calls in the other. Private to those two files (the tests use
 * rdma_sim.h).
 *
 * Threading: everything here is under the fabric's one mutex, S.mu
 * (rsim_lock/rsim_unlock), unless a function says otherwise.
 */
#ifndef PC_TESTS_FAKE_RDMA_SIM_INT_H
#define PC_TESTS_FAKE_RDMA_SIM_INT_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "tests/fake/rdma_sim.h"

#define DEVS_MAX 8
#define SGE_MAX 16
#define PORT_FIRST 20000
#define PORT_LAST 60999

/* Unlink x from the singly linked list at head (by ->next). */
#define UNLINK(head, x)                                                     \
	do {                                                                \
		__typeof__(x) *pp_ = &(head);                               \
		while (*pp_ && *pp_ != (x))                                 \
			pp_ = &(*pp_)->next;                                \
		if (*pp_)                                                   \
			*pp_ = (x)->next;                                   \
	} while (0)

#define SIM_MAX(a, b) ((a) > (b) ? (a) : (b))

struct skey { /* an IPv4 address, host order */
	uint32_t ip;
	uint16_t port;
};

struct sim_ctx;

struct sim_dev {
	struct ibv_device dev;   /* first: handed out */
	struct sim_ctx *cm_ctx;  /* rdma_cm's own context of the device */
	struct rsim_limits lim;
	int port_state;
	unsigned idx;
	uint32_t ip;             /* its network device's IPv4 (host order);
				  * 0: none (rsim_device_addr) */
};

struct sim_aev { /* an asynchronous event queued on a context */
	struct ibv_async_event ev;
	struct sim_aev *next;
};

struct sim_ctx {
	struct ibv_context ctx;  /* first; ctx.async_fd: an eventfd */
	struct sim_dev *dev;
	bool cm;                 /* rdma_cm's (not closable) */
	unsigned users;          /* PDs, CQs, comp channels on it */
	struct sim_aev *aev_head, *aev_tail; /* not got yet */
	bool afd_up;
	struct sim_ctx *next;
};

struct sim_mr;

struct sim_pd {
	struct ibv_pd pd;        /* first */
	struct sim_ctx *ctx;
	unsigned users;          /* MRs and QPs */
	struct sim_mr *mrs;
	struct sim_pd *next;
};

struct sim_mr {
	struct ibv_mr mr;        /* first */
	int access;
	struct sim_pd *pd;
	struct sim_mr *next;
};

struct sim_cq;

struct sim_cqev { /* one completion event queued on a channel */
	struct sim_cq *cq;
	struct sim_cqev *next;
};

struct sim_cch {
	struct ibv_comp_channel ch; /* first */
	struct sim_ctx *ctx;
	struct sim_cqev *head, *tail;
	bool fd_up;
	unsigned cqs;
	struct sim_cch *next;
};

struct sim_qp;

struct sim_wce { /* a completion in a CQ */
	struct ibv_wc wc;
	struct sim_qp *qp;       /* NULL once the QP is destroyed */
	uint64_t seq;            /* of its WR: frees send queue slots */
};

struct sim_cq {
	struct ibv_cq cq;        /* first */
	struct sim_ctx *ctx;
	struct sim_cch *ch;
	struct sim_wce *ring;
	int cap, head, n;
	bool armed;
	uint64_t got, acked;     /* completion events */
	unsigned qps;            /* QPs using it (as send or recv CQ) */
	struct sim_cq *next;
};

struct sim_wr {
	uint64_t wr_id;
	enum ibv_wr_opcode op;
	bool signaled;
	int nsge;
	struct ibv_sge sge[SGE_MAX];
	uint64_t raddr;
	uint32_t rkey;
	uint64_t len;            /* sum of the sges */
	uint64_t seq, due_ns;
	enum ibv_wc_status override; /* not SUCCESS: complete with this */
	struct sim_wr *next;
};

struct sim_id;

struct sim_qp {
	struct ibv_qp qp;        /* first */
	struct sim_id *id;
	struct sim_pd *pd;
	struct sim_cq *scq, *rcq;
	struct sim_qp *peer;     /* the connected QP; NULL once it is gone */
	struct skey node;        /* the listener the connection went through */
	bool linked;             /* was connected to a peer */
	bool ready;              /* RTS */
	bool error;
	bool silent;             /* rsim_silence_qps: its WRs are held */
	unsigned max_sge_rd;     /* the device's */
	uint64_t posted, polled; /* WR seqs: slots used = posted - polled */
	unsigned max_wr, max_sge;
	struct sim_wr *head, *tail;
	uint64_t last_due;
	uint64_t gone_ns;        /* when peer went away */
	uint64_t kill_due;       /* node killed: apply then; 0 none */
	struct sim_qp *next;
};

enum id_state {
	ID_IDLE, ID_BOUND, ID_LISTEN, ID_ADDR, ID_ROUTE, ID_CONNECTING,
	ID_REQ, ID_CONNECTED, ID_DISC, ID_DONE,
};

struct sim_ech;

struct sim_id {
	struct rdma_cm_id id;    /* first */
	struct sim_ech *ch;
	enum id_state st;
	struct skey src, dst;
	bool bound;
	bool dead;               /* a killed listener */
	struct sim_id *peer;     /* the other end while connecting/connected */
	struct sim_id *listener; /* for an id of a connect request */
	struct sim_qp *qp;
	unsigned unacked;
	struct sim_id *next;
};

struct sim_ev {
	struct rdma_cm_event ev; /* first: handed out */
	uint8_t pdata[256];
	struct sim_id *sid, *slisten;
	uint64_t due;
	struct sim_ev *next;
};

struct sim_ech {
	struct rdma_event_channel ch; /* first */
	struct sim_ev *head, *tail;
	bool fd_up;
	unsigned ids;
	struct sim_ech *next;
};

struct sim_node { /* faults of one listener address */
	struct skey key;
	unsigned min_us, max_us;
	bool silent, silent_cm;
	unsigned fail_n;
	enum ibv_wc_status fail_st;
	struct sim_node *next;
};

/* The fabric: every object list, the worker and the counters, under mu. */
struct rsim_state {
	pthread_mutex_t mu;
	pthread_cond_t wake;     /* the worker: work may be due */
	pthread_cond_t idle;     /* !busy */
	bool worker_on, stop, busy;
	pthread_t worker;
	struct sim_dev *devs[DEVS_MAX];
	unsigned ndevs;
	struct sim_ctx *ctxs;
	struct sim_pd *pds;
	struct sim_cch *cchs;
	struct sim_cq *cqs;
	struct sim_qp *qps;
	struct sim_ech *echs;
	struct sim_id *ids;
	struct sim_node *nodes;
	struct sim_ev *pend_head, *pend_tail, *gotten;
	uint64_t pend_last_due;
	uint64_t rng;
	uint32_t qpn_next;
	uint16_t port_next;
	struct rsim_stats st;
};

/* The fabric (defined in rdma_sim.c); S is the short name both files use. */
extern struct rsim_state rsim_fabric;
#define S rsim_fabric

/* The limits of the device id is on (id->id.verbs set). */
static inline const struct rsim_limits *rsim_id_lim(const struct sim_id *id)
{
	return &((const struct sim_ctx *)id->id.verbs)->dev->lim;
}

/* ------------------------------------------------ rdma_sim.c: the fabric */

/* Take / drop S.mu (the first call sets the fabric up). */
void rsim_lock(void);
void rsim_unlock(void);
/* CLOCK_MONOTONIC in ns; any thread. */
uint64_t rsim_now_ns(void);
/* The fd of a channel is readable iff want (an eventfd used as a level). */
void rsim_fd_level(int fd, bool *up, bool want);
/* A zeroed object of size bytes and a non-blocking eventfd for it (a
 * channel's descriptor), or NULL with errno set and nothing left open. */
void *rsim_alloc_with_fd(size_t size, int *fd);
/* Work may be due: make sure the worker runs and looks. */
void rsim_kick(void);
/* -1 with errno e, the libraries' way; any thread. */
int rsim_fail(int e);
/* A bound id at k (either side may be the wildcard); any thread. */
bool rsim_key_overlaps(const struct skey *bound, const struct skey *k);
/* The faults of the node at k; NULL if none were set. */
struct sim_node *rsim_node_find(const struct skey *k);
/* The first device whose port is active; NULL if none. */
struct sim_dev *rsim_dev_active(void);
/* The device an id bound to (or reaching) ip uses: the one that has ip
 * (NULL if its port is down), else rsim_dev_active()'s. */
struct sim_dev *rsim_dev_at(uint32_t ip);
/* q is in the error state: its WRs flush (the worker makes them). */
void rsim_qp_err(struct sim_qp *q);

/* ------------------------------ rdma_sim_async.c: asynchronous events */

/* Drop c's queued events of qp (all of them if qp is NULL): the QP is
 * destroyed, or the context freed (then its fd is closed too). */
void rsim_aev_purge(struct sim_ctx *c, const struct ibv_qp *qp);
void rsim_ctx_free(struct sim_ctx *c);
/* The entries of the table. */
int rsim_get_async_event(struct ibv_context *ctx,
			 struct ibv_async_event *ev);
void rsim_ack_async_event(struct ibv_async_event *ev);

/* --------------------------------------------- rdma_sim_cm.c: rdma_cm */

/* Worker: the event is due; the client's QP is ready on ESTABLISHED. */
void rsim_ev_publish(struct sim_ev *e);
/* id (connected) is disconnected: a DISCONNECTED event, its QP in error. */
void rsim_side_disconnect(struct sim_id *id);
/* Free ch with the events still on it and close its fd (rsim_reset). */
void rsim_ech_free(struct sim_ech *ch);

/* The rdma_cm entries of the table (rdma_verbs.h has their contracts). */
struct rdma_event_channel *rsim_cm_create_event_channel(void);
void rsim_cm_destroy_event_channel(struct rdma_event_channel *chan);
int rsim_cm_create_id(struct rdma_event_channel *chan,
		      struct rdma_cm_id **out, void *context,
		      enum rdma_port_space ps);
int rsim_cm_destroy_id(struct rdma_cm_id *cmid);
int rsim_cm_bind_addr(struct rdma_cm_id *cmid, struct sockaddr *addr);
int rsim_cm_listen(struct rdma_cm_id *cmid, int backlog);
int rsim_cm_resolve_addr(struct rdma_cm_id *cmid, struct sockaddr *src,
			 struct sockaddr *dst, int timeout_ms);
int rsim_cm_resolve_route(struct rdma_cm_id *cmid, int timeout_ms);
int rsim_cm_connect(struct rdma_cm_id *cmid, struct rdma_conn_param *param);
int rsim_cm_accept(struct rdma_cm_id *cmid, struct rdma_conn_param *param);
int rsim_cm_reject(struct rdma_cm_id *cmid, const void *private_data,
		   uint8_t private_data_len);
int rsim_cm_disconnect(struct rdma_cm_id *cmid);
int rsim_cm_get_cm_event(struct rdma_event_channel *chan,
			 struct rdma_cm_event **event);
int rsim_cm_ack_cm_event(struct rdma_cm_event *event);
uint16_t rsim_cm_get_src_port(struct rdma_cm_id *cmid);

#endif /* PC_TESTS_FAKE_RDMA_SIM_INT_H */
