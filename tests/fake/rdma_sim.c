/*
 * tests/fake/rdma_sim.c — the simulated RDMA fabric (rdma_sim.h): devices
 * and contexts, PDs, MRs, CQs and completion channels, QPs and the worker
 * that carries out their work requests, faults, stats, rsim_reset and the
 * rv_api table. rdma_cm (event channels, ids, connections, cm events) is
 * in rdma_sim_cm.c; what both share is in rdma_sim_int.h.
 *
 * Owns: every sim object, in lists under one global mutex (S.mu), and the
 * worker thread. Threading: the rv_api entries run on the callers' threads
 * (reactors) and only queue work; the worker executes work requests in
 * order per QP once due, and publishes rdma_cm events (a global FIFO, each
 * event due a few µs after the call that made it, so never visible inside
 * that call). The worker drops the lock only around a WR's memcpy, with
 * S.busy set: dereg_mr, destroy_qp and rsim_reset wait for it to clear, so
 * once they return the worker touches none of their memory. While S.busy
 * no QP is freed, so the worker's walk of the QP list stays valid.
 *
 * Invariants: a QP's completions are all made by the worker, in WR order
 * (disconnect, modify_qp and kills only mark the QP; the worker flushes).
 * An fd of a channel is readable iff its queue is non-empty
 * (rsim_fd_level). Keys (lkey/rkey) come from a bijection of a
 * process-wide counter, so they are never reused while the process lives,
 * even across rsim_reset.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "tests/fake/rdma_sim_int.h"

#define WR_MAX 16384
#define CQE_MAX 65536
#define GIDS 16
#define DELAY_MAX_US_DEFAULT 50
#define KILL_DELAY_NS (RSIM_KILL_DELAY_MS * 1000000ull)
#define COPY_CHUNK 4096u

struct rsim_state rsim_fabric = {.mu = PTHREAD_MUTEX_INITIALIZER};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static uint32_t key_ctr, key_seed;

static void sim_init(void)
{
	pthread_condattr_t a;
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&S.wake, &a);
	pthread_condattr_destroy(&a);
	pthread_cond_init(&S.idle, NULL);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	S.rng = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)getpid() ^ 0x9e3779b97f4a7c15ull;
	key_seed = (uint32_t)(S.rng >> 17);
	S.qpn_next = 0x100 + (uint32_t)(S.rng & 0xffff);
	S.port_next = PORT_FIRST;
}

void rsim_lock(void)
{
	pthread_once(&once, sim_init);
	pthread_mutex_lock(&S.mu);
}

void rsim_unlock(void)
{
	pthread_mutex_unlock(&S.mu);
}

uint64_t rsim_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t rnd(void) /* xorshift64*, under the lock */
{
	S.rng ^= S.rng >> 12;
	S.rng ^= S.rng << 25;
	S.rng ^= S.rng >> 27;
	return S.rng * 0x2545f4914f6cdd1dull;
}

/* A bijection on 32 bits (so distinct counters give distinct keys). */
static uint32_t key_mix(uint32_t x)
{
	x ^= key_seed;
	x ^= x >> 16;
	x *= 0x7feb352du;
	x ^= x >> 15;
	x *= 0x846ca68bu;
	x ^= x >> 16;
	return x;
}

static uint32_t key_new(void)
{
	uint32_t k;
	do
		k = key_mix(key_ctr++);
	while (k == 0);
	return k;
}

/* The fd of a channel is readable iff want (an eventfd used as a level). */
void rsim_fd_level(int fd, bool *up, bool want)
{
	uint64_t v = 1;
	if (want && !*up) {
		if (write(fd, &v, sizeof(v)) == sizeof(v))
			*up = true;
	} else if (!want && *up) {
		if (read(fd, &v, sizeof(v)) == sizeof(v))
			*up = false;
	}
}

void *rsim_alloc_with_fd(size_t size, int *fd)
{
	void *p = calloc(1, size);
	*fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (!p || *fd < 0) {
		int e = *fd < 0 ? errno : ENOMEM;
		free(p);
		if (*fd >= 0)
			close(*fd);
		errno = e;
		return NULL;
	}
	return p;
}

static void *worker_main(void *arg);

/* Work may be due: make sure the worker runs and looks. */
void rsim_kick(void)
{
	if (!S.worker_on) {
		S.stop = false;
		if (pthread_create(&S.worker, NULL, worker_main, NULL) != 0) {
			fprintf(stderr, "rsim: cannot start the worker thread\n");
			return;
		}
		S.worker_on = true;
	}
	pthread_cond_signal(&S.wake);
}

static void wait_idle(void)
{
	while (S.busy)
		pthread_cond_wait(&S.idle, &S.mu);
}

int rsim_fail(int e) /* -1 with errno, the libraries' way */
{
	errno = e;
	return -1;
}

/* ------------------------------------------------ addresses and nodes */

static int key_parse(const char *s, struct skey *k)
{
	char ip[INET_ADDRSTRLEN];
	const char *c = s ? strrchr(s, ':') : NULL;
	if (!c || (size_t)(c - s) >= sizeof(ip))
		return -EINVAL;
	memcpy(ip, s, (size_t)(c - s));
	ip[c - s] = '\0';
	struct in_addr a;
	char *end;
	unsigned long port = strtoul(c + 1, &end, 10);
	if (inet_pton(AF_INET, ip, &a) != 1 || *end || end == c + 1 ||
	    port > 65535)
		return -EINVAL;
	k->ip = ntohl(a.s_addr);
	k->port = (uint16_t)port;
	return 0;
}

static bool key_eq(const struct skey *a, const struct skey *b)
{
	return a->ip == b->ip && a->port == b->port;
}

/* A bound id at k (either side may be the wildcard). */
bool rsim_key_overlaps(const struct skey *bound, const struct skey *k)
{
	return bound->port == k->port &&
	       (bound->ip == k->ip || bound->ip == INADDR_ANY ||
		k->ip == INADDR_ANY);
}

struct sim_node *rsim_node_find(const struct skey *k)
{
	for (struct sim_node *n = S.nodes; n; n = n->next)
		if (key_eq(&n->key, k))
			return n;
	return NULL;
}

static struct sim_node *node_get(const struct skey *k)
{
	struct sim_node *n = rsim_node_find(k);
	if (n)
		return n;
	n = calloc(1, sizeof(*n));
	if (!n)
		return NULL;
	n->key = *k;
	n->max_us = DELAY_MAX_US_DEFAULT;
	n->next = S.nodes;
	S.nodes = n;
	return n;
}

struct sim_dev *rsim_dev_active(void)
{
	for (unsigned i = 0; i < S.ndevs; i++)
		if (S.devs[i]->port_state == IBV_PORT_ACTIVE)
			return S.devs[i];
	return NULL;
}

struct sim_dev *rsim_dev_at(uint32_t ip)
{
	for (unsigned i = 0; ip && i < S.ndevs; i++)
		if (S.devs[i]->ip == ip)
			return S.devs[i]->port_state == IBV_PORT_ACTIVE
				       ? S.devs[i] : NULL;
	return rsim_dev_active();
}

/* -------------------------------------------------------------- devices */

/* rdma_get_devices: rdma_cm's own contexts, the ones its ids use. */
static struct ibv_context **sim_get_devices(int *num)
{
	rsim_lock();
	struct ibv_context **l = calloc(S.ndevs + 1, sizeof(*l));
	if (l)
		for (unsigned i = 0; i < S.ndevs; i++)
			l[i] = &S.devs[i]->cm_ctx->ctx;
	if (num)
		*num = l ? (int)S.ndevs : 0;
	rsim_unlock();
	if (!l)
		errno = ENOMEM;
	return l;
}

static void sim_free_devices(struct ibv_context **list)
{
	free(list);
}

static struct ibv_device **sim_get_device_list(int *num)
{
	rsim_lock();
	struct ibv_device **l = calloc(S.ndevs + 1, sizeof(*l));
	if (l)
		for (unsigned i = 0; i < S.ndevs; i++)
			l[i] = &S.devs[i]->dev;
	if (num)
		*num = l ? (int)S.ndevs : 0;
	rsim_unlock();
	if (!l)
		errno = ENOMEM;
	return l;
}

static void sim_free_device_list(struct ibv_device **list)
{
	free(list);
}

static const char *sim_get_device_name(struct ibv_device *dev)
{
	return dev ? dev->name : NULL;
}

static struct sim_ctx *ctx_new(struct sim_dev *d, bool cm)
{
	struct sim_ctx *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->ctx.device = &d->dev;
	c->ctx.cmd_fd = -1;
	c->ctx.async_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (c->ctx.async_fd < 0) {
		free(c);
		return NULL;
	}
	c->ctx.num_comp_vectors = 1;
	c->dev = d;
	c->cm = cm;
	c->next = S.ctxs;
	S.ctxs = c;
	return c;
}

static struct ibv_context *sim_open_device(struct ibv_device *dev)
{
	struct sim_ctx *c = NULL;
	rsim_lock();
	for (unsigned i = 0; i < S.ndevs; i++)
		if (&S.devs[i]->dev == dev)
			c = ctx_new(S.devs[i], false);
	if (c)
		S.st.contexts_open++;
	rsim_unlock();
	if (!c)
		errno = ENODEV;
	return c ? &c->ctx : NULL;
}

static int sim_close_device(struct ibv_context *ctx)
{
	struct sim_ctx *c = (struct sim_ctx *)ctx;
	rsim_lock();
	int e = c->cm ? EINVAL : c->users ? EBUSY : 0;
	if (!e) {
		UNLINK(S.ctxs, c);
		S.st.contexts_open--;
		rsim_ctx_free(c);
	}
	rsim_unlock();
	return e ? rsim_fail(e) : 0;
}

static int sim_device_addr(struct ibv_context *ctx, uint8_t port,
			   int family, struct sockaddr_storage *out)
{
	struct sim_ctx *c = (struct sim_ctx *)ctx;
	if (port != 1)
		return EINVAL;
	if (family != AF_INET)
		return EAFNOSUPPORT;
	rsim_lock();
	uint32_t ip = c->dev->ip;
	rsim_unlock();
	if (!ip)
		return ENOENT;
	memset(out, 0, sizeof(*out));
	struct sockaddr_in *in = (struct sockaddr_in *)out;
	in->sin_family = AF_INET;
	in->sin_addr.s_addr = htonl(ip);
	return 0;
}

static int sim_query_port(struct ibv_context *ctx, uint8_t port,
			  struct ibv_port_attr *attr)
{
	struct sim_ctx *c = (struct sim_ctx *)ctx;
	if (port != 1) {
		errno = EINVAL;
		return EINVAL; /* ibv_query_port returns the errno value */
	}
	memset(attr, 0, sizeof(*attr));
	rsim_lock();
	attr->state = (enum ibv_port_state)c->dev->port_state;
	rsim_unlock();
	attr->max_mtu = IBV_MTU_4096;
	attr->active_mtu = IBV_MTU_4096;
	attr->gid_tbl_len = GIDS;
	attr->max_msg_sz = 1u << 31;
	attr->link_layer = IBV_LINK_LAYER_ETHERNET;
	attr->active_width = 2;  /* 4x */
	attr->active_speed = 64; /* 50 Gb/s per lane: HDR-like */
	attr->phys_state = attr->state == IBV_PORT_ACTIVE ? 5 : 3;
	return 0;
}

static int sim_query_gid(struct ibv_context *ctx, uint8_t port, int index,
			 union ibv_gid *gid)
{
	struct sim_ctx *c = (struct sim_ctx *)ctx;
	if (port != 1 || index < 0 || index >= GIDS)
		return rsim_fail(EINVAL);
	memset(gid, 0, sizeof(*gid));
	gid->raw[0] = 0xfe; /* link-local, unique per device and index */
	gid->raw[1] = 0x80;
	gid->raw[14] = (uint8_t)(c->dev->idx + 1);
	gid->raw[15] = (uint8_t)(index + 1);
	return 0;
}

static int sim_query_device(struct ibv_context *ctx,
			    struct ibv_device_attr *attr)
{
	struct sim_ctx *c = (struct sim_ctx *)ctx;
	memset(attr, 0, sizeof(*attr));
	rsim_lock();
	const struct rsim_limits *l = &c->dev->lim;
	snprintf(attr->fw_ver, sizeof(attr->fw_ver), "sim");
	attr->node_guid = 0x5153494d00000000ull + c->dev->idx;
	attr->max_mr_size = 1ull << 40;
	attr->page_size_cap = 0xfffff000u;
	attr->max_qp = 65536;
	attr->max_qp_wr = (int)l->max_qp_wr;
	attr->max_sge = (int)l->max_sge;
	attr->max_sge_rd = (int)l->max_sge_rd;
	attr->max_cq = 65536;
	attr->max_cqe = (int)l->max_cqe;
	attr->max_mr = 1 << 20;
	attr->max_pd = 1 << 16;
	attr->max_qp_rd_atom = (int)l->max_qp_rd_atom;
	attr->max_qp_init_rd_atom = (int)l->max_qp_init_rd_atom;
	attr->phys_port_cnt = 1;
	rsim_unlock();
	return 0;
}

int rsim_set_limits(const char *dev, const struct rsim_limits *lim)
{
	int ret = -ENODEV;
	rsim_lock();
	for (unsigned i = 0; i < S.ndevs; i++) {
		struct rsim_limits *l = &S.devs[i]->lim;
		if (strcmp(S.devs[i]->dev.name, dev))
			continue;
#define KEEP(f) l->f = lim->f ? lim->f : l->f
		KEEP(max_qp_wr);
		KEEP(max_sge);
		KEEP(max_sge_rd);
		KEEP(max_cqe);
		KEEP(max_qp_rd_atom);
		KEEP(max_qp_init_rd_atom);
#undef KEEP
		ret = 0;
	}
	rsim_unlock();
	return ret;
}

/* -------------------------------------------------------- PDs and MRs */

static struct ibv_pd *sim_alloc_pd(struct ibv_context *ctx)
{
	struct sim_pd *p = calloc(1, sizeof(*p));
	if (!p) {
		errno = ENOMEM;
		return NULL;
	}
	rsim_lock();
	p->pd.context = ctx;
	p->pd.handle = key_ctr;
	p->ctx = (struct sim_ctx *)ctx;
	p->ctx->users++;
	p->next = S.pds;
	S.pds = p;
	S.st.pds_live++;
	rsim_unlock();
	return &p->pd;
}

static int sim_dealloc_pd(struct ibv_pd *pd)
{
	struct sim_pd *p = (struct sim_pd *)pd;
	rsim_lock();
	int e = p->users ? EBUSY : 0;
	if (!e) {
		p->ctx->users--;
		UNLINK(S.pds, p);
		S.st.pds_live--;
		free(p);
	}
	rsim_unlock();
	return e ? rsim_fail(e) : 0;
}

static struct ibv_mr *sim_reg_mr(struct ibv_pd *pd, void *addr, size_t len,
				 int access)
{
	struct sim_pd *p = (struct sim_pd *)pd;
	/* verbs: remote write (or atomic) needs local write */
	if (!addr || !len ||
	    ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
	     !(access & IBV_ACCESS_LOCAL_WRITE))) {
		errno = EINVAL;
		return NULL;
	}
	struct sim_mr *m = calloc(1, sizeof(*m));
	if (!m) {
		errno = ENOMEM;
		return NULL;
	}
	rsim_lock();
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = addr;
	m->mr.length = len;
	m->mr.lkey = key_new();
	m->mr.rkey = key_new();
	m->mr.handle = m->mr.lkey;
	m->access = access;
	m->pd = p;
	m->next = p->mrs;
	p->mrs = m;
	p->users++;
	S.st.mrs_live++;
	rsim_unlock();
	return &m->mr;
}

static int sim_dereg_mr(struct ibv_mr *mr)
{
	struct sim_mr *m = (struct sim_mr *)mr;
	rsim_lock();
	wait_idle(); /* a copy through it may be under way */
	UNLINK(m->pd->mrs, m);
	m->pd->users--;
	S.st.mrs_live--;
	rsim_unlock();
	free(m);
	return 0;
}

/* An MR of pd with key (lkey or rkey) covering [addr, addr+len) with all of
 * the access bits; NULL if none. */
static struct sim_mr *mr_covering(struct sim_pd *pd, bool remote, uint32_t key,
				  uint64_t addr, uint64_t len, int access)
{
	for (struct sim_mr *m = pd->mrs; m; m = m->next) {
		if ((remote ? m->mr.rkey : m->mr.lkey) != key)
			continue;
		uint64_t lo = (uint64_t)(uintptr_t)m->mr.addr;
		if (addr < lo || len > m->mr.length ||
		    addr - lo > m->mr.length - len)
			return NULL;
		return (m->access & access) == access ? m : NULL;
	}
	return NULL;
}

/* ------------------------------------------------- CQs and comp channels */

static struct ibv_comp_channel *sim_create_comp_channel(struct ibv_context *c)
{
	int fd;
	struct sim_cch *ch = rsim_alloc_with_fd(sizeof(*ch), &fd);
	if (!ch)
		return NULL;
	rsim_lock();
	ch->ch.context = c;
	ch->ch.fd = fd;
	ch->ctx = (struct sim_ctx *)c;
	ch->ctx->users++;
	ch->next = S.cchs;
	S.cchs = ch;
	S.st.comp_channels_live++;
	rsim_unlock();
	return &ch->ch;
}

static int sim_destroy_comp_channel(struct ibv_comp_channel *chan)
{
	struct sim_cch *ch = (struct sim_cch *)chan;
	rsim_lock();
	int e = ch->cqs ? EBUSY : 0;
	if (!e) {
		ch->ctx->users--;
		UNLINK(S.cchs, ch);
		S.st.comp_channels_live--;
		close(ch->ch.fd);
		free(ch);
	}
	rsim_unlock();
	return e ? rsim_fail(e) : 0;
}

static struct ibv_cq *sim_create_cq(struct ibv_context *ctx, int cqe,
				    void *cq_context,
				    struct ibv_comp_channel *chan,
				    int comp_vector)
{
	struct sim_ctx *sc = (struct sim_ctx *)ctx;
	rsim_lock();
	unsigned max_cqe = sc->dev->lim.max_cqe;
	rsim_unlock();
	if (cqe < 1 || (unsigned)cqe > max_cqe || comp_vector != 0) {
		errno = EINVAL;
		return NULL;
	}
	struct sim_cq *cq = calloc(1, sizeof(*cq));
	struct sim_wce *ring = calloc((size_t)cqe, sizeof(*ring));
	if (!cq || !ring) {
		free(cq);
		free(ring);
		errno = ENOMEM;
		return NULL;
	}
	rsim_lock();
	cq->cq.context = ctx;
	cq->cq.channel = chan;
	cq->cq.cq_context = cq_context;
	cq->cq.cqe = cqe;
	cq->ctx = (struct sim_ctx *)ctx;
	cq->ctx->users++;
	cq->ch = (struct sim_cch *)chan;
	if (cq->ch)
		cq->ch->cqs++;
	cq->ring = ring;
	cq->cap = cqe;
	cq->next = S.cqs;
	S.cqs = cq;
	S.st.cqs_live++;
	rsim_unlock();
	return &cq->cq;
}

/* Drop cq's events that wait on its channel (not got yet). */
static void cch_purge(struct sim_cch *ch, struct sim_cq *cq)
{
	struct sim_cqev **pp = &ch->head;
	ch->tail = NULL;
	while (*pp) {
		struct sim_cqev *e = *pp;
		if (!cq || e->cq == cq) {
			*pp = e->next;
			free(e);
		} else {
			ch->tail = e;
			pp = &e->next;
		}
	}
	rsim_fd_level(ch->ch.fd, &ch->fd_up, ch->head != NULL);
}

static int sim_destroy_cq(struct ibv_cq *ibcq)
{
	struct sim_cq *cq = (struct sim_cq *)ibcq;
	rsim_lock();
	int e = cq->qps || cq->got != cq->acked ? EBUSY : 0;
	if (!e) {
		if (cq->ch) {
			cch_purge(cq->ch, cq);
			cq->ch->cqs--;
		}
		cq->ctx->users--;
		UNLINK(S.cqs, cq);
		S.st.cqs_live--;
		free(cq->ring);
		free(cq);
	}
	rsim_unlock();
	return e ? rsim_fail(e) : 0;
}

static int sim_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	(void)solicited_only; /* every completion here is "solicited" */
	rsim_lock();
	((struct sim_cq *)ibcq)->armed = true;
	rsim_unlock();
	return 0;
}

static int sim_get_cq_event(struct ibv_comp_channel *chan, struct ibv_cq **cq,
			    void **cq_context)
{
	struct sim_cch *ch = (struct sim_cch *)chan;
	rsim_lock();
	struct sim_cqev *e = ch->head;
	if (e) {
		ch->head = e->next;
		if (!ch->head)
			ch->tail = NULL;
		rsim_fd_level(ch->ch.fd, &ch->fd_up, ch->head != NULL);
		e->cq->got++;
		*cq = &e->cq->cq;
		*cq_context = e->cq->cq.cq_context;
	}
	rsim_unlock();
	free(e);
	return e ? 0 : rsim_fail(EAGAIN);
}

static void sim_ack_cq_events(struct ibv_cq *ibcq, unsigned int nevents)
{
	struct sim_cq *cq = (struct sim_cq *)ibcq;
	rsim_lock();
	if (cq->acked + nevents > cq->got)
		fprintf(stderr, "rsim: ack_cq_events acks %u, only %llu unacked\n",
			nevents, (unsigned long long)(cq->got - cq->acked));
	cq->acked += nevents;
	if (cq->acked > cq->got)
		cq->acked = cq->got;
	rsim_unlock();
}

static int sim_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
	struct sim_cq *cq = (struct sim_cq *)ibcq;
	if (n < 0)
		return -EINVAL;
	int i = 0;
	rsim_lock();
	for (; i < n && cq->n; i++) {
		struct sim_wce *e = &cq->ring[cq->head];
		wc[i] = e->wc;
		if (e->qp && e->seq > e->qp->polled)
			e->qp->polled = e->seq; /* frees its slot and older */
		cq->head = (cq->head + 1) % cq->cap;
		cq->n--;
	}
	rsim_unlock();
	return i;
}

/* q is in the error state: its WRs flush (the worker makes them). */
void rsim_qp_err(struct sim_qp *q)
{
	q->error = true;
	q->ready = false;
	q->qp.state = IBV_QPS_ERR;
}

/* Add a completion of q's WR w to q's send CQ: maybe an event. */
static void cq_add(struct sim_qp *q, const struct sim_wr *w,
		   enum ibv_wc_status st)
{
	struct sim_cq *cq = q->scq;
	if (cq->n == cq->cap) {
		S.st.cq_overflows++;
		rsim_qp_err(q);
		return;
	}
	struct sim_wce *e = &cq->ring[(cq->head + cq->n) % cq->cap];
	memset(e, 0, sizeof(*e));
	e->wc.wr_id = w->wr_id;
	e->wc.status = st;
	e->wc.opcode = w->op == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ
						 : IBV_WC_RDMA_WRITE;
	e->wc.byte_len = (uint32_t)w->len;
	e->wc.qp_num = q->qp.qp_num;
	e->qp = q;
	e->seq = w->seq;
	cq->n++;
	if (cq->armed && cq->ch) {
		struct sim_cqev *ev = calloc(1, sizeof(*ev));
		if (!ev) {
			fprintf(stderr, "rsim: out of memory: completion event lost\n");
			return;
		}
		cq->armed = false;
		ev->cq = cq;
		if (cq->ch->tail)
			cq->ch->tail->next = ev;
		else
			cq->ch->head = ev;
		cq->ch->tail = ev;
		rsim_fd_level(cq->ch->ch.fd, &cq->ch->fd_up, true);
		S.st.cq_events++;
	}
}

/* --------------------------------------------------------------- the worker */

static void wr_finish(struct sim_qp *q, struct sim_wr *w,
		      enum ibv_wc_status st)
{
	S.st.wrs_done++;
	if (st == IBV_WC_WR_FLUSH_ERR)
		S.st.flushes++;
	if (st != IBV_WC_SUCCESS)
		rsim_qp_err(q);
	if (st != IBV_WC_SUCCESS || w->signaled)
		cq_add(q, w, st);
	free(w);
}

static struct sim_wr *wr_pop(struct sim_qp *q)
{
	struct sim_wr *w = q->head;
	q->head = w->next;
	if (!q->head)
		q->tail = NULL;
	return w;
}

static enum ibv_wc_status wr_check(struct sim_qp *q, struct sim_wr *w,
				   uint8_t **remote)
{
	bool rd = w->op == IBV_WR_RDMA_READ;
	for (int i = 0; i < w->nsge; i++)
		if (w->sge[i].length &&
		    !mr_covering(q->pd, false, w->sge[i].lkey, w->sge[i].addr,
				 w->sge[i].length,
				 rd ? IBV_ACCESS_LOCAL_WRITE : 0))
			return IBV_WC_LOC_PROT_ERR;
	*remote = (uint8_t *)(uintptr_t)w->raddr;
	if (w->len &&
	    !mr_covering(q->peer->pd, true, w->rkey, w->raddr, w->len,
			 rd ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE))
		return IBV_WC_REM_ACCESS_ERR;
	return IBV_WC_SUCCESS;
}

/* In pages with a yield between them, as a NIC's DMA is not one atomic
 * copy: a caller that frees memory while a copy still runs (it must not:
 * see S.busy) gets caught by ASan on the next page. */
static void wr_copy(const struct sim_wr *w, uint8_t *remote)
{
	for (int i = 0; i < w->nsge; i++) {
		uint8_t *local = (uint8_t *)(uintptr_t)w->sge[i].addr;
		for (uint32_t off = 0; off < w->sge[i].length; off += COPY_CHUNK) {
			uint32_t n = w->sge[i].length - off;
			n = n < COPY_CHUNK ? n : COPY_CHUNK;
			if (w->op == IBV_WR_RDMA_READ)
				memcpy(local + off, remote + off, n);
			else
				memcpy(remote + off, local + off, n);
			sched_yield();
		}
		remote += w->sge[i].length;
	}
}

static void next_at(uint64_t *next, uint64_t t)
{
	if (t < *next)
		*next = t;
}

/* Carry out q's oldest WR if it can go now: true if it completed one.
 * May drop the lock around the copy (S.busy set). */
static bool qp_step(struct sim_qp *q, uint64_t now, uint64_t *next)
{
	struct sim_wr *w = q->head;
	enum ibv_wc_status st;
	if (!w)
		return false;
	if (q->error) {
		st = w->override != IBV_WC_SUCCESS ? w->override
						   : IBV_WC_WR_FLUSH_ERR;
		goto finish;
	}
	if (q->kill_due)
		return false; /* the node is dying: held until kill_apply */
	if (!q->peer) { /* nobody answers: the transport's retries run out */
		if (now < q->gone_ns + KILL_DELAY_NS) {
			next_at(next, q->gone_ns + KILL_DELAY_NS);
			return false;
		}
		st = IBV_WC_RETRY_EXC_ERR;
		goto finish;
	}
	if (w->due_ns > now) {
		next_at(next, w->due_ns);
		return false;
	}
	struct sim_node *n = rsim_node_find(&q->node);
	if ((n && n->silent) || q->silent)
		return false;
	if (n && n->fail_n) {
		n->fail_n--;
		st = n->fail_st;
		goto finish;
	}
	uint8_t *remote;
	st = wr_check(q, w, &remote);
	if (st != IBV_WC_SUCCESS)
		goto finish;
	wr_pop(q);
	S.busy = true;
	rsim_unlock();
	wr_copy(w, remote);
	pthread_mutex_lock(&S.mu);
	S.busy = false;
	pthread_cond_broadcast(&S.idle);
	wr_finish(q, w, IBV_WC_SUCCESS);
	return true;
finish:
	wr_pop(q);
	wr_finish(q, w, st);
	return true;
}

/* The node q is connected through died RSIM_KILL_DELAY_MS ago. */
static void kill_apply(struct sim_qp *q)
{
	q->kill_due = 0;
	if (q->head && !q->error)
		q->head->override = IBV_WC_RETRY_EXC_ERR;
	rsim_qp_err(q);
	if (q->id)
		rsim_side_disconnect(q->id);
}

static void *worker_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&S.mu);
	while (!S.stop) {
		uint64_t now = rsim_now_ns(), next = UINT64_MAX;
		bool did = false;
		while (S.pend_head && S.pend_head->due <= now) {
			struct sim_ev *e = S.pend_head;
			S.pend_head = e->next;
			if (!S.pend_head)
				S.pend_tail = NULL;
			rsim_ev_publish(e);
		}
		if (S.pend_head)
			next_at(&next, S.pend_head->due);
		for (struct sim_qp *q = S.qps; q; q = q->next) {
			if (q->kill_due && q->kill_due <= now)
				kill_apply(q);
			else if (q->kill_due)
				next_at(&next, q->kill_due);
			did |= qp_step(q, now, &next);
		}
		if (did || S.stop)
			continue;
		if (next == UINT64_MAX) {
			pthread_cond_wait(&S.wake, &S.mu);
		} else {
			struct timespec ts = {
				.tv_sec = (time_t)(next / 1000000000ull),
				.tv_nsec = (long)(next % 1000000000ull),
			};
			pthread_cond_timedwait(&S.wake, &S.mu, &ts);
		}
	}
	pthread_mutex_unlock(&S.mu);
	return NULL;
}

/* ------------------------------------------------------------- queue pairs */

static int sim_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
			 struct ibv_send_wr **bad)
{
	struct sim_qp *q = (struct sim_qp *)ibqp;
	int ret = 0;
	rsim_lock();
	if (!q->ready && !q->error) {
		ret = EINVAL;
		goto out;
	}
	uint64_t now = rsim_now_ns();
	struct sim_node *n = rsim_node_find(&q->node);
	unsigned lo = n ? n->min_us : 0;
	unsigned hi = n ? n->max_us : DELAY_MAX_US_DEFAULT;
	for (; wr; wr = wr->next) {
		if ((wr->opcode != IBV_WR_RDMA_READ &&
		     wr->opcode != IBV_WR_RDMA_WRITE) ||
		    wr->num_sge < 0 || (unsigned)wr->num_sge > q->max_sge ||
		    (wr->opcode == IBV_WR_RDMA_READ &&
		     (unsigned)wr->num_sge > q->max_sge_rd)) {
			ret = EINVAL;
			break;
		}
		if (q->posted - q->polled >= q->max_wr) {
			ret = ENOMEM;
			break;
		}
		struct sim_wr *w = calloc(1, sizeof(*w));
		if (!w) {
			ret = ENOMEM;
			break;
		}
		w->wr_id = wr->wr_id;
		w->op = wr->opcode;
		w->signaled = wr->send_flags & IBV_SEND_SIGNALED;
		w->nsge = wr->num_sge;
		for (int i = 0; i < wr->num_sge; i++) {
			w->sge[i] = wr->sg_list[i];
			w->len += wr->sg_list[i].length;
		}
		w->raddr = wr->wr.rdma.remote_addr;
		w->rkey = wr->wr.rdma.rkey;
		w->seq = ++q->posted;
		uint64_t due = now + 1000ull * (lo + (hi > lo ? rnd() % (hi - lo + 1) : 0));
		w->due_ns = due > q->last_due ? due : q->last_due;
		q->last_due = w->due_ns;
		if (q->tail)
			q->tail->next = w;
		else
			q->head = w;
		q->tail = w;
		S.st.wrs_posted++;
	}
	rsim_kick();
out:
	if (ret)
		*bad = wr;
	rsim_unlock();
	return ret;
}

static int sim_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr,
			 int mask)
{
	struct sim_qp *q = (struct sim_qp *)ibqp;
	if (mask != IBV_QP_STATE || attr->qp_state != IBV_QPS_ERR) {
		fprintf(stderr, "rsim: modify_qp: only IBV_QP_STATE to "
				"IBV_QPS_ERR is supported (rdma_cm moves the "
				"others)\n");
		return EOPNOTSUPP;
	}
	rsim_lock();
	rsim_qp_err(q);
	rsim_kick();
	rsim_unlock();
	return 0;
}

static int sim_create_qp(struct rdma_cm_id *cmid, struct ibv_pd *pd,
			 struct ibv_qp_init_attr *attr)
{
	struct sim_id *id = (struct sim_id *)cmid;
	if (!pd || !attr || !attr->send_cq || !attr->recv_cq ||
	    attr->qp_type != IBV_QPT_RC || attr->cap.max_send_wr < 1 ||
	    attr->cap.max_send_wr > WR_MAX || attr->cap.max_send_sge > SGE_MAX)
		return rsim_fail(EINVAL);
	struct sim_qp *q = calloc(1, sizeof(*q));
	if (!q)
		return rsim_fail(ENOMEM);
	rsim_lock();
	const struct rsim_limits *lim =
		id->id.verbs ? &((struct sim_ctx *)id->id.verbs)->dev->lim
			     : NULL;
	S.st.qp_send_wr_max = SIM_MAX(S.st.qp_send_wr_max,
				     attr->cap.max_send_wr);
	S.st.qp_send_sge_max = SIM_MAX(S.st.qp_send_sge_max,
				      attr->cap.max_send_sge);
	if (!id->id.verbs || pd->context != id->id.verbs || id->qp ||
	    attr->cap.max_send_wr > lim->max_qp_wr ||
	    attr->cap.max_send_sge > lim->max_sge) {
		rsim_unlock();
		free(q);
		return rsim_fail(EINVAL);
	}
	q->max_sge_rd = lim->max_sge_rd;
	do
		q->qp.qp_num = S.qpn_next++ & 0xffffff;
	while (q->qp.qp_num < 2);
	q->qp.context = id->id.verbs;
	q->qp.qp_context = attr->qp_context;
	q->qp.pd = pd;
	q->qp.send_cq = attr->send_cq;
	q->qp.recv_cq = attr->recv_cq;
	q->qp.qp_type = IBV_QPT_RC;
	q->qp.state = IBV_QPS_INIT;
	q->id = id;
	q->pd = (struct sim_pd *)pd;
	q->pd->users++;
	q->scq = (struct sim_cq *)attr->send_cq;
	q->rcq = (struct sim_cq *)attr->recv_cq;
	q->scq->qps++;
	q->rcq->qps++;
	q->max_wr = attr->cap.max_send_wr;
	q->max_sge = attr->cap.max_send_sge;
	q->next = S.qps;
	S.qps = q;
	S.st.qps_live++;
	id->qp = q;
	id->id.qp = &q->qp;
	id->id.pd = pd;
	id->id.send_cq = attr->send_cq;
	id->id.recv_cq = attr->recv_cq;
	id->id.send_cq_channel = attr->send_cq->channel;
	id->id.recv_cq_channel = attr->recv_cq->channel;
	rsim_unlock();
	return 0;
}

static void sim_destroy_qp(struct rdma_cm_id *cmid)
{
	struct sim_id *id = (struct sim_id *)cmid;
	rsim_lock();
	struct sim_qp *q = id->qp;
	if (!q) {
		rsim_unlock();
		return;
	}
	wait_idle(); /* its copy, if one is under way, ends first */
	while (q->head) {
		free(wr_pop(q));
		S.st.wrs_dropped++;
	}
	rsim_aev_purge((struct sim_ctx *)q->qp.context, &q->qp);
	if (q->peer) {
		q->peer->peer = NULL;
		q->peer->gone_ns = rsim_now_ns();
		rsim_kick();
	}
	for (struct sim_qp *o = S.qps; o; o = o->next)
		if (o->peer == q)
			o->peer = NULL;
	struct sim_cq *cqs[2] = {q->scq, q->rcq};
	for (int c = 0; c < 2; c++) {
		for (int i = 0; i < cqs[c]->n; i++) {
			struct sim_wce *e = &cqs[c]->ring[(cqs[c]->head + i) %
							  cqs[c]->cap];
			if (e->qp == q)
				e->qp = NULL;
		}
		cqs[c]->qps--;
	}
	q->pd->users--;
	UNLINK(S.qps, q);
	S.st.qps_live--;
	id->qp = NULL;
	id->id.qp = NULL;
	rsim_unlock();
	free(q);
}

static const struct rv_api sim_api = {
	.name = "sim",
	.get_devices = sim_get_devices,
	.free_devices = sim_free_devices,
	.get_device_list = sim_get_device_list,
	.free_device_list = sim_free_device_list,
	.get_device_name = sim_get_device_name,
	.open_device = sim_open_device,
	.close_device = sim_close_device,
	.query_port = sim_query_port,
	.query_gid = sim_query_gid,
	.query_device = sim_query_device,
	.get_async_event = rsim_get_async_event,
	.ack_async_event = rsim_ack_async_event,
	.alloc_pd = sim_alloc_pd,
	.dealloc_pd = sim_dealloc_pd,
	.reg_mr = sim_reg_mr,
	.dereg_mr = sim_dereg_mr,
	.create_comp_channel = sim_create_comp_channel,
	.destroy_comp_channel = sim_destroy_comp_channel,
	.create_cq = sim_create_cq,
	.destroy_cq = sim_destroy_cq,
	.req_notify_cq = sim_req_notify_cq,
	.get_cq_event = sim_get_cq_event,
	.ack_cq_events = sim_ack_cq_events,
	.poll_cq = sim_poll_cq,
	.post_send = sim_post_send,
	.modify_qp = sim_modify_qp,
	.create_event_channel = rsim_cm_create_event_channel,
	.destroy_event_channel = rsim_cm_destroy_event_channel,
	.create_id = rsim_cm_create_id,
	.destroy_id = rsim_cm_destroy_id,
	.bind_addr = rsim_cm_bind_addr,
	.listen = rsim_cm_listen,
	.resolve_addr = rsim_cm_resolve_addr,
	.resolve_route = rsim_cm_resolve_route,
	.create_qp = sim_create_qp,
	.destroy_qp = sim_destroy_qp,
	.connect = rsim_cm_connect,
	.accept = rsim_cm_accept,
	.reject = rsim_cm_reject,
	.disconnect = rsim_cm_disconnect,
	.get_cm_event = rsim_cm_get_cm_event,
	.ack_cm_event = rsim_cm_ack_cm_event,
	.get_src_port = rsim_cm_get_src_port,
	.device_addr = sim_device_addr,
};

const struct rv_api *rsim_api(void)
{
	return &sim_api;
}

/* ------------------------------------------------------- the test's handles */

int rsim_reset(void)
{
	rsim_lock();
	if (S.worker_on) {
		S.stop = true;
		pthread_cond_signal(&S.wake);
		rsim_unlock();
		pthread_join(S.worker, NULL);
		pthread_mutex_lock(&S.mu);
		S.worker_on = false;
		S.stop = false;
	}
	struct sim_ev *lists[2] = {S.pend_head, S.gotten};
	for (int l = 0; l < 2; l++)
		while (lists[l]) {
			struct sim_ev *e = lists[l];
			lists[l] = e->next;
			free(e);
		}
	S.pend_head = S.pend_tail = S.gotten = NULL;
	while (S.qps) {
		struct sim_qp *q = S.qps;
		S.qps = q->next;
		while (q->head)
			free(wr_pop(q));
		free(q);
	}
	while (S.ids) {
		struct sim_id *id = S.ids;
		S.ids = id->next;
		free(id);
	}
	while (S.echs) {
		struct sim_ech *ch = S.echs;
		S.echs = ch->next;
		rsim_ech_free(ch);
	}
	while (S.cqs) {
		struct sim_cq *cq = S.cqs;
		S.cqs = cq->next;
		free(cq->ring);
		free(cq);
	}
	while (S.cchs) {
		struct sim_cch *ch = S.cchs;
		S.cchs = ch->next;
		cch_purge(ch, NULL);
		close(ch->ch.fd);
		free(ch);
	}
	while (S.pds) {
		struct sim_pd *p = S.pds;
		S.pds = p->next;
		while (p->mrs) {
			struct sim_mr *m = p->mrs;
			p->mrs = m->next;
			free(m);
		}
		free(p);
	}
	while (S.ctxs) {
		struct sim_ctx *c = S.ctxs;
		S.ctxs = c->next;
		rsim_ctx_free(c);
	}
	for (unsigned i = 0; i < S.ndevs; i++)
		free(S.devs[i]);
	S.ndevs = 0;
	while (S.nodes) {
		struct sim_node *n = S.nodes;
		S.nodes = n->next;
		free(n);
	}
	S.pend_last_due = 0;
	memset(&S.st, 0, sizeof(S.st));
	rsim_unlock();
	return 0;
}

int rsim_add_device(const char *name, int port_state)
{
	if (!name || !*name || strlen(name) >= IBV_SYSFS_NAME_MAX ||
	    (port_state != IBV_PORT_ACTIVE && port_state != IBV_PORT_DOWN))
		return -EINVAL;
	rsim_lock();
	int ret = S.ndevs == DEVS_MAX ? -ENOSPC : 0;
	for (unsigned i = 0; !ret && i < S.ndevs; i++)
		if (strcmp(S.devs[i]->dev.name, name) == 0)
			ret = -EEXIST;
	struct sim_dev *d = ret ? NULL : calloc(1, sizeof(*d));
	if (!ret && d) {
		snprintf(d->dev.name, sizeof(d->dev.name), "%s", name);
		snprintf(d->dev.dev_name, sizeof(d->dev.dev_name), "uverbs%u",
			 S.ndevs);
		d->dev.node_type = IBV_NODE_CA;
		d->dev.transport_type = IBV_TRANSPORT_IB;
		d->port_state = port_state;
		d->lim = (struct rsim_limits){WR_MAX, SGE_MAX, SGE_MAX,
					      CQE_MAX, 16, 16};
		d->idx = S.ndevs;
		d->cm_ctx = ctx_new(d, true);
		if (!d->cm_ctx) {
			free(d);
			d = NULL;
		}
	}
	if (!ret && !d)
		ret = -ENOMEM;
	if (!ret)
		S.devs[S.ndevs++] = d;
	rsim_unlock();
	return ret;
}

int rsim_device_addr(const char *name, const char *ip)
{
	char ep[64];
	struct skey k;
	snprintf(ep, sizeof(ep), "%s:0", ip ? ip : "");
	if (!name || key_parse(ep, &k) || (k.ip >> 24) != 127)
		return -EINVAL;
	rsim_lock();
	struct sim_dev *d = NULL;
	int ret = 0;
	for (unsigned i = 0; i < S.ndevs; i++) {
		if (strcmp(S.devs[i]->dev.name, name) == 0)
			d = S.devs[i];
		else if (S.devs[i]->ip == k.ip)
			ret = -EEXIST;
	}
	if (!ret && !d)
		ret = -ENODEV;
	if (!ret)
		d->ip = k.ip;
	rsim_unlock();
	return ret;
}

int rsim_add_rails(unsigned first, unsigned n)
{
	for (unsigned k = first; k < first + n; k++) {
		char dev[16], ip[24];
		snprintf(dev, sizeof(dev), "sim%u", k);
		snprintf(ip, sizeof(ip), "127.0.0.%u", k + 1);
		int ret = rsim_add_device(dev, IBV_PORT_ACTIVE);
		if (!ret)
			ret = rsim_device_addr(dev, ip);
		if (ret)
			return ret;
	}
	return 0;
}

/* Apply fn to the node at addr under the lock; 0 or -EINVAL / -ENOMEM. */
static int with_node(const char *addr, void (*fn)(struct sim_node *, void *),
		     void *arg)
{
	struct skey k;
	if (key_parse(addr, &k))
		return -EINVAL;
	rsim_lock();
	struct sim_node *n = node_get(&k);
	if (n) {
		fn(n, arg);
		rsim_kick();
	}
	rsim_unlock();
	return n ? 0 : -ENOMEM;
}

struct delay_arg {
	unsigned lo, hi;
};

static void set_delay(struct sim_node *n, void *arg)
{
	struct delay_arg *d = arg;
	n->min_us = d->lo;
	n->max_us = d->hi;
}

int rsim_set_delay(const char *addr, unsigned min_us, unsigned max_us)
{
	struct delay_arg d = {min_us, max_us < min_us ? min_us : max_us};
	return with_node(addr, set_delay, &d);
}

static void set_silent(struct sim_node *n, void *arg)
{
	n->silent = *(bool *)arg;
}

int rsim_silence(const char *addr, bool on)
{
	return with_node(addr, set_silent, &on);
}

static void silence_qps(struct sim_node *n, void *arg)
{
	(void)arg;
	for (struct sim_qp *q = S.qps; q; q = q->next)
		if (q->linked && key_eq(&q->node, &n->key))
			q->silent = true;
}

int rsim_silence_qps(const char *addr)
{
	return with_node(addr, silence_qps, NULL);
}

static void set_silent_cm(struct sim_node *n, void *arg)
{
	n->silent_cm = *(bool *)arg;
}

int rsim_silence_cm(const char *addr, bool on)
{
	return with_node(addr, set_silent_cm, &on);
}

struct fail_arg {
	unsigned n;
	enum ibv_wc_status st;
};

static void set_fail(struct sim_node *n, void *arg)
{
	struct fail_arg *f = arg;
	n->fail_n = f->n;
	n->fail_st = f->st;
}

int rsim_fail_next(const char *addr, unsigned n, enum ibv_wc_status status)
{
	struct fail_arg f = {n, status};
	if (status == IBV_WC_SUCCESS)
		return -EINVAL;
	return with_node(addr, set_fail, &f);
}

static void kill_node(struct sim_node *n, void *arg)
{
	(void)arg;
	uint64_t due = rsim_now_ns() + KILL_DELAY_NS;
	n->silent = false; /* the black hole ends: held WRs retry out */
	for (struct sim_qp *q = S.qps; q; q = q->next)
		if (key_eq(&q->node, &n->key))
			q->silent = false;
	for (struct sim_id *i = S.ids; i; i = i->next)
		if (i->st == ID_LISTEN && !i->dead &&
		    rsim_key_overlaps(&i->src, &n->key))
			i->dead = true;
	for (struct sim_qp *q = S.qps; q; q = q->next)
		if (q->linked && !q->kill_due && key_eq(&q->node, &n->key))
			q->kill_due = due;
}

int rsim_kill(const char *addr)
{
	return with_node(addr, kill_node, NULL);
}

bool rsim_rkey_live(uint32_t rkey)
{
	bool live = false;
	rsim_lock();
	for (struct sim_pd *p = S.pds; p && !live; p = p->next)
		for (struct sim_mr *m = p->mrs; m && !live; m = m->next)
			live = m->mr.rkey == rkey;
	rsim_unlock();
	return live;
}

void rsim_stats(struct rsim_stats *out)
{
	rsim_lock();
	*out = S.st;
	for (struct sim_ev *e = S.gotten; e; e = e->next)
		out->events_unacked++;
	for (struct sim_cq *cq = S.cqs; cq; cq = cq->next)
		out->cq_events_unacked += cq->got - cq->acked;
	rsim_unlock();
}

uint64_t rsim_leftovers(char *what, size_t len)
{
	struct rsim_stats st;
	rsim_stats(&st);
	const struct {
		const char *name;
		uint64_t n;
	} k[] = {
		{"QPs", st.qps_live},
		{"ids", st.ids_live},
		{"MRs", st.mrs_live},
		{"CQs", st.cqs_live},
		{"PDs", st.pds_live},
		{"completion channels", st.comp_channels_live},
		{"event channels", st.event_channels_live},
		{"opened contexts", st.contexts_open},
		{"rdma_cm events unacked", st.events_unacked},
		{"CQ events unacked", st.cq_events_unacked},
		{"async events unacked", st.async_events_unacked},
	};
	uint64_t total = 0;
	size_t at = 0;
	if (len)
		what[0] = '\0';
	for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
		if (!k[i].n)
			continue;
		total += k[i].n;
		if (at < len)
			at += (size_t)snprintf(what + at, len - at, "%s%llu %s",
					       at ? ", " : "",
					       (unsigned long long)k[i].n,
					       k[i].name);
	}
	return total;
}

