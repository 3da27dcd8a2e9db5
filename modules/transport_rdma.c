/*
 * modules/transport_rdma.c — the RDMA transport (transport_rdma.h).
 *
 * Owns: struct tp_node (device context, PD, the region table with one MR
 * per region, local registrations, the rdma_cm listener and the queue pairs
 * it accepted, the replay cache of connect proofs) and struct tp_client
 * (per reactor: the completion channel and the rdma_cm event channel, both
 * watched on the reactor; peers, their channels and the live batches).
 *
 * An operation (struct rop) is placed on a channel of its peer: queued
 * there until the channel is connected and its send queue has room, then
 * posted (pump). The channel's fifo holds posted operations in posting
 * order; a signaled completion with wr_id = seq finishes every operation up
 * to seq; a failed one finishes those before it, fails the one it names
 * and tears the channel down (destroy_qp: no byte moves after it); so does
 * the sweep when the fifo's head stays posted past cfg.op_timeout_ms. Batches
 * end through their timer (0-delay when the last operation finished), so
 * done never runs inside a call of the caller.
 */
#include "modules/transport_rdma.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/endpoint.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/util.h"

#define LOG_MOD "rdma"

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
	bool offered;               /* listed in accepts (rails > 0) */
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

static unsigned cfg_chans(const struct tp_node *tn)
{
	return tn->cfg.max_chans ? tn->cfg.max_chans : 16;
}

static unsigned cfg_sq(const struct tp_node *tn)
{
	return tn->cfg.sq_depth ? tn->cfg.sq_depth : 128;
}

static unsigned cfg_sig(const struct tp_node *tn)
{
	return tn->cfg.signal_every ? tn->cfg.signal_every : 16;
}

static unsigned cfg_rd(const struct tp_node *tn)
{
	return tn->cfg.rd_atomic ? tn->cfg.rd_atomic : 16;
}

static int cfg_ctimeout(const struct tp_node *tn)
{
	return (int)(tn->cfg.connect_timeout_ms ? tn->cfg.connect_timeout_ms
						: 2000);
}

static int neg_errno(int fallback)
{
	return errno > 0 ? -errno : fallback;
}

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

static uint64_t wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sa_set_port(struct sockaddr_storage *ss, uint16_t port)
{
	if (ss->ss_family == AF_INET)
		((struct sockaddr_in *)ss)->sin_port = htons(port);
	else if (ss->ss_family == AF_INET6)
		((struct sockaddr_in6 *)ss)->sin6_port = htons(port);
}

/* ---------------------------------------------------------- the proofs */

/* "ip:port" of sa, numerically: what both sides put in the proofs for the
 * address the client dialed (the node reads it off the request). */
static void sa_text(const struct sockaddr *sa, char *out, size_t len)
{
	char ip[INET6_ADDRSTRLEN] = "?";
	unsigned port = 0;
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const void *)sa;
		inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
		port = ntohs(in->sin_port);
		snprintf(out, len, "%s:%u", ip, port);
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const void *)sa;
		inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
		port = ntohs(in6->sin6_port);
		snprintf(out, len, "[%s]:%u", ip, port);
	} else {
		snprintf(out, len, "?");
	}
}

static void proof_of(const char *secret, bool server, uint64_t ts,
		     const uint8_t nonce[NONCE_BYTES], const char *endpoint,
		     uint8_t out[PC_SHA256_BYTES])
{
	static const char cl[] = "peercache-rdma-v1 client";
	static const char sv[] = "peercache-rdma-v1 server";
	uint8_t t[8];
	for (unsigned i = 0; i < 8; i++)
		t[i] = (uint8_t)(ts >> (8 * i));
	struct pc_iov_c parts[] = {
		{server ? sv : cl, server ? sizeof(sv) - 1 : sizeof(cl) - 1},
		{t, sizeof(t)},
		{nonce, NONCE_BYTES},
		{endpoint, strlen(endpoint)},
	};
	pc_hmac_sha256(secret, strlen(secret), parts, 4, out);
}

/* ---------------------------------------------------------------- probe */

/* Whether ctx's port (cfg->ib_port) is usable and the device can carry
 * our READs; why says what was found, *da gets the device's limits. */
static bool dev_usable(const struct tp_rdma_cfg *cfg, struct ibv_context *ctx,
		       char *why, size_t whylen, struct ibv_device_attr *da)
{
	const struct rv_api *api = cfg->api;
	const char *name = api->get_device_name(ctx->device);
	struct ibv_port_attr pa;
	memset(&pa, 0, sizeof(pa));
	if (api->query_port(ctx, (uint8_t)cfg->ib_port, &pa) != 0) {
		snprintf(why, whylen, "%s: no port %u", name, cfg->ib_port);
		return false;
	}
	if (pa.state != IBV_PORT_ACTIVE) {
		snprintf(why, whylen, "%s: port %u is not active", name,
			 cfg->ib_port);
		return false;
	}
	union ibv_gid gid;
	if (cfg->gid_index >= 0 &&
	    api->query_gid(ctx, (uint8_t)cfg->ib_port, cfg->gid_index, &gid)) {
		snprintf(why, whylen, "%s: no gid_index %d on port %u", name,
			 cfg->gid_index, cfg->ib_port);
		return false;
	}
	memset(da, 0, sizeof(*da));
	int err = api->query_device(ctx, da);
	if (err) {
		snprintf(why, whylen, "%s: query_device: %s", name,
			 strerror(err));
		return false;
	}
	/* A READ scatters a page's header and payload: two SGEs (max_sge_rd
	 * 0: the driver does not say, max_sge holds). */
	if (da->max_sge < 2 || (da->max_sge_rd && da->max_sge_rd < 2)) {
		snprintf(why, whylen, "%s: %d SGEs per WR (%d for READs), "
			 "2 needed", name, da->max_sge, da->max_sge_rd);
		return false;
	}
	if (da->max_qp_rd_atom < 1 || da->max_qp_init_rd_atom < 1) {
		snprintf(why, whylen, "%s: no RDMA READ in flight allowed "
			 "(max_qp_rd_atom %d, max_qp_init_rd_atom %d)", name,
			 da->max_qp_rd_atom, da->max_qp_init_rd_atom);
		return false;
	}
	snprintf(why, whylen, "%s port %u active", name, cfg->ib_port);
	return true;
}

/* The limits of two devices a node uses together: the smaller of each. */
static void da_min(struct ibv_device_attr *a, const struct ibv_device_attr *b)
{
	a->max_qp_wr = PC_MIN(a->max_qp_wr, b->max_qp_wr);
	a->max_cqe = PC_MIN(a->max_cqe, b->max_cqe);
	a->max_sge = PC_MIN(a->max_sge, b->max_sge);
	a->max_sge_rd = PC_MIN(a->max_sge_rd, b->max_sge_rd);
	a->max_qp_rd_atom = PC_MIN(a->max_qp_rd_atom, b->max_qp_rd_atom);
	a->max_qp_init_rd_atom = PC_MIN(a->max_qp_init_rd_atom,
					b->max_qp_init_rd_atom);
}

/* The next name of a comma list at *p ("" at its end); spaces trimmed. */
static bool list_next(const char **p, char *out, size_t len)
{
	while (**p == ' ' || **p == ',')
		(*p)++;
	if (!**p)
		return false;
	size_t n = strcspn(*p, ",");
	const char *e = *p + n;
	while (e > *p && e[-1] == ' ')
		e--;
	snprintf(out, len, "%.*s", (int)(e - *p), *p);
	*p += n;
	return true;
}

/*
 * The usable devices rdma_cm knows: those cfg->devices lists, in its order
 * (duplicates and unusable ones left out), else the one cfg->device names,
 * else the first usable. Up to max of their contexts (rdma_cm's own, the
 * ones its ids use) in out, their smallest limits in *da; returns how many
 * were found. why says what was found and what was left out.
 */
static int dev_open(const struct tp_rdma_cfg *cfg, struct ibv_context **out,
		    unsigned max, struct ibv_device_attr *da, char *why,
		    size_t whylen)
{
	int n = 0;
	struct ibv_context **list = cfg->api->get_devices(&n);
	bool listed = cfg->devices && *cfg->devices;
	bool named = !listed && cfg->device && *cfg->device;
	char one[160], left[200] = "";
	snprintf(why, whylen, "%s", n > 0 ? "no device matches"
					  : "no RDMA device seen by rdma_cm");
	if (named && n > 0)
		snprintf(why, whylen, "no RDMA device named %s", cfg->device);
	unsigned found = 0;
	const char *lp = cfg->devices;
	char want[64];
	struct ibv_context *got[RAILS_MAX]; /* what is found, in order */
	for (int i = 0; list && (listed || i < n); i++) {
		struct ibv_context *ctx = NULL;
		if (listed) {
			/* The next listed name, whichever its place. */
			if (!list_next(&lp, want, sizeof(want)))
				break;
			bool dup = false;
			for (unsigned j = 0; j < PC_MIN(found, RAILS_MAX); j++)
				dup |= !strcmp(want, cfg->api->get_device_name(
							     got[j]->device));
			for (int j = 0; j < n && !ctx && !dup; j++)
				if (!strcmp(want, cfg->api->get_device_name(
							  list[j]->device)))
					ctx = list[j];
			if (!ctx) {
				size_t l = strlen(left);
				snprintf(left + l, sizeof(left) - l, "%s%s: %s",
					 l ? "; " : "", want,
					 dup ? "listed twice" : "not seen");
				continue;
			}
		} else {
			ctx = list[i];
			const char *name = cfg->api->get_device_name(
				ctx->device);
			if (named && strcmp(cfg->device, name))
				continue;
		}
		struct ibv_device_attr a;
		if (!dev_usable(cfg, ctx, one, sizeof(one), &a)) {
			if (!found && !listed)
				snprintf(why, whylen, "%s", one);
			if (listed) {
				size_t l = strlen(left);
				snprintf(left + l, sizeof(left) - l, "%s%s",
					 l ? "; " : "", one);
			}
			continue;
		}
		if (found < RAILS_MAX)
			got[found] = ctx;
		if (found < max && out) {
			out[found] = ctx;
			if (!found && da)
				*da = a;
			else if (da)
				da_min(da, &a);
		}
		if (!found)
			snprintf(why, whylen, "%s", one);
		found++;
		if (!listed && !out)
			continue; /* a probe counts them all */
		if (!listed)
			break;
	}
	if (found > 1)
		snprintf(why + strlen(why), whylen - strlen(why),
			 " and %u more rail(s)", found - 1);
	if (*left)
		snprintf(why + strlen(why), whylen - strlen(why),
			 "%s(left out: %s)", found ? " " : "; ", left);
	if (list)
		cfg->api->free_devices(list);
	return (int)PC_MIN(found, max ? max : found);
}

int tp_rdma_probe(const struct tp_rdma_cfg *cfg, char *why, size_t whylen)
{
	return dev_open(cfg, NULL, 0, NULL, why, whylen);
}

/* ------------------------------------------------------------- regions */

static int access_of(unsigned a)
{
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
	if (a & TP_ACCESS_WRITE)
		acc |= IBV_ACCESS_REMOTE_WRITE;
	return acc;
}

/* The rail whose device ctx is (rdma_cm's context), or -1. */
static int rail_of(const struct tp_node *tn, const struct ibv_context *ctx)
{
	for (unsigned i = 0; i < tn->nrails; i++)
		if (tn->rails[i].ctx == ctx)
			return (int)i;
	return -1;
}

/* The region registered under key, or NULL. Under tn->lock. */
static struct rreg *reg_find(struct tp_node *tn, uint32_t key)
{
	for (unsigned i = 0; i < TP_REGIONS_MAX; i++)
		if (tn->regs[i].used && tn->regs[i].key == key)
			return &tn->regs[i];
	return NULL;
}

static void mr_drop(struct tp_node *tn, struct ibv_mr *mr, uint32_t key)
{
	if (mr && tn->api->dereg_mr(mr))
		PC_LOGW(LOG_MOD, "dereg_mr of key %08x: %s", key,
			strerror(errno));
}

/* Every rail's MR of a set (NULL ones skipped), then none. */
static void mrs_drop(struct tp_node *tn, struct ibv_mr **mrs, uint32_t key)
{
	for (unsigned i = 0; i < RAILS_MAX; i++) {
		mr_drop(tn, mrs[i], key);
		mrs[i] = NULL;
	}
}

/* An MR of [base, base+len) on every rail, in mrs: 0 or -errno (none
 * left registered). */
static int mrs_reg(struct tp_node *tn, void *base, size_t len, int access,
		   struct ibv_mr **mrs)
{
	for (unsigned i = 0; i < tn->nrails; i++) {
		mrs[i] = tn->api->reg_mr(tn->rails[i].pd, base, len, access);
		if (!mrs[i]) {
			int err = neg_errno(-ENOMEM);
			mrs_drop(tn, mrs, 0);
			return err;
		}
	}
	return 0;
}

/* Bytes of a welcome's body that nkeys keys and the node's rail list take
 * (under tn->lock). */
static size_t body_len(const struct tp_node *tn, unsigned nkeys)
{
	return nkeys * sizeof(struct rkpair) + tn->tail_len;
}

static int rdma_reg(struct tp_node *tn, const struct tp_region *region,
		    uint32_t *key)
{
	if (tp_region_check(region))
		return -EINVAL;
	unsigned access = region->access ? region->access : TP_ACCESS_READ;
	pthread_mutex_lock(&tn->lock);
	int slot = -1;
	unsigned used = 0;
	for (unsigned i = 0; i < TP_REGIONS_MAX; i++) {
		used += tn->regs[i].used;
		if (!tn->regs[i].used && slot < 0)
			slot = (int)i;
	}
	if (slot >= 0 && body_len(tn, used + 1) > sizeof(((struct welcome *)
							   0)->body)) {
		/* The accept could not hand its rkey out. */
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "a region more (%u) and the "
			  "addresses of %u rail(s) do not fit in an RDMA "
			  "accept's private data; region refused", used + 1,
			  tn->nrails);
		slot = -1;
	}
	if (slot < 0) {
		pthread_mutex_unlock(&tn->lock);
		return -ENOSPC;
	}
	struct ibv_mr *mrs[RAILS_MAX] = {0};
	int err = mrs_reg(tn, (void *)region->base, region->len,
			  access_of(access), mrs);
	if (err) {
		pthread_mutex_unlock(&tn->lock);
		PC_LOGW(LOG_MOD, "registering %llu bytes failed: %s",
			(unsigned long long)region->len, strerror(-err));
		return err;
	}
	/* A random key, not the rkey: records name it, and it stays the same
	 * when a revoke gives the region a new MR. */
	uint32_t k = 0;
	while (!k || reg_find(tn, k))
		if (pc_random_bytes(&k, sizeof(k)) < 0) {
			mrs_drop(tn, mrs, 0);
			pthread_mutex_unlock(&tn->lock);
			return -EIO;
		}
	struct rreg *g = &tn->regs[slot];
	*g = (struct rreg){.used = true, .key = k, .r = *region};
	memcpy(g->mr, mrs, sizeof(mrs));
	g->r.access = access;
	*key = k;
	pthread_mutex_unlock(&tn->lock);
	return 0;
}

static int rdma_dereg(struct tp_node *tn, uint32_t key)
{
	pthread_mutex_lock(&tn->lock);
	struct rreg *g = reg_find(tn, key);
	if (!g) {
		pthread_mutex_unlock(&tn->lock);
		return -ENOENT;
	}
	/* Once dereg_mr returns, no peer reaches the bytes. A local
	 * operation still in flight that lands in the region (its lkey
	 * taken from this MR) then fails with a local protection error
	 * (-EINVAL): it never writes memory the region no longer owns. */
	struct tp_region r = g->r;
	mrs_drop(tn, g->mr, key);
	mrs_drop(tn, g->old, key);
	*g = (struct rreg){0};
	pthread_mutex_unlock(&tn->lock);
	if (r.released)
		r.released(r.ctx);
	return 0;
}

int tp_rdma_reg_local(struct tp_node *tn, void *base, size_t len)
{
	if (!base || !len)
		return -EINVAL;
	pthread_mutex_lock(&tn->lock);
	int ret = -ENOSPC;
	for (unsigned i = 0; i < LOCAL_MAX; i++) {
		struct rlocal *l = &tn->locals[i];
		if (l->base)
			continue;
		ret = mrs_reg(tn, base, len, IBV_ACCESS_LOCAL_WRITE, l->mr);
		if (!ret) {
			l->base = base;
			l->len = len;
		}
		break;
	}
	pthread_mutex_unlock(&tn->lock);
	return ret;
}

int tp_rdma_unreg_local(struct tp_node *tn, void *base)
{
	pthread_mutex_lock(&tn->lock);
	int ret = -ENOENT;
	for (unsigned i = 0; i < LOCAL_MAX; i++)
		if (tn->locals[i].base == base) {
			mrs_drop(tn, tn->locals[i].mr, 0);
			tn->locals[i] = (struct rlocal){0};
			ret = 0;
			break;
		}
	pthread_mutex_unlock(&tn->lock);
	return ret;
}

/* Whether [a, a+len) lies in [base, base+blen). */
static bool covers(uintptr_t base, size_t blen, uintptr_t a, size_t len)
{
	return a >= base && a - base <= blen && len <= blen - (a - base);
}

/* The lkey, on rail dev, of an MR of the node's tables covering
 * [p, p+len), or 0. */
static uint32_t table_lkey(struct tp_node *tn, unsigned dev, const void *p,
			   size_t len)
{
	uintptr_t a = (uintptr_t)p;
	uint32_t lkey = 0;
	pthread_mutex_lock(&tn->lock);
	for (unsigned i = 0; i < TP_REGIONS_MAX && !lkey; i++) {
		const struct rreg *g = &tn->regs[i];
		if (g->used && covers(g->r.base, g->r.len, a, len))
			lkey = g->mr[dev]->lkey;
	}
	for (unsigned i = 0; i < LOCAL_MAX && !lkey; i++) {
		const struct rlocal *l = &tn->locals[i];
		if (l->base && covers((uintptr_t)l->base, l->len, a, len))
			lkey = l->mr[dev]->lkey;
	}
	pthread_mutex_unlock(&tn->lock);
	return lkey;
}

/* The lkey on rail dev for [p, p+len) of batch b: the tables', one of the
 * batch's own registrations, or a new one for the batch. 0 and -errno in
 * *err. */
static uint32_t lkey_of(struct rbatch *b, unsigned dev, const void *p,
			size_t len, int *err)
{
	struct tp_node *tn = b->tc->tn;
	if (!len)
		return 0;
	uint32_t k = table_lkey(tn, dev, p, len);
	if (k)
		return k;
	for (unsigned i = 0; i < b->nmrs; i++) {
		const struct ibv_mr *m = b->mrs[i].mr;
		if (b->mrs[i].dev == dev &&
		    covers((uintptr_t)m->addr, m->length, (uintptr_t)p, len))
			return m->lkey;
	}
	if (b->nmrs == b->capmrs) {
		unsigned cap = b->capmrs ? b->capmrs * 2 : 4;
		struct bmr *m = realloc(b->mrs, cap * sizeof(*m));
		if (!m) {
			*err = -ENOMEM;
			return 0;
		}
		b->mrs = m;
		b->capmrs = cap;
	}
	struct ibv_mr *mr = tn->api->reg_mr(tn->rails[dev].pd, (void *)p, len,
					    IBV_ACCESS_LOCAL_WRITE);
	if (!mr) {
		*err = neg_errno(-ENOMEM);
		return 0;
	}
	STAT_ADD(tn, lazy_mrs, 1);
	b->mrs[b->nmrs++] = (struct bmr){mr, dev};
	return mr->lkey;
}

/* Give o the lkeys of rail dev (once per rail it is posted on): 0 or
 * -errno. */
static int op_lkeys(struct rop *o, unsigned dev)
{
	if (o->lk_dev == (int8_t)dev)
		return 0;
	int err = 0;
	o->lkey_hdr = lkey_of(o->b, dev, o->hdr, o->hdr_len, &err);
	if (!err)
		o->lkey_buf = lkey_of(o->b, dev, o->buf, o->len - o->hdr_len,
				      &err);
	o->lk_dev = err ? -1 : (int8_t)dev;
	return err;
}

/* ----------------------------------------------------------- batches */

/* How a closing channel's operations go on. */
enum td { TD_FAIL, TD_RETRY, TD_CONNFAIL, TD_ABORT };

static void chan_teardown(struct rchan *ch, enum td mode, int err);
static void op_place(struct tp_client *tc, struct rop *o, bool may_open);
static void sweep_arm(struct tp_client *tc);

static void batch_fire(struct rx_reactor *r, struct rx_timer *t);

/* Finish o with res (once); a finished batch ends from its timer. */
static void op_end(struct rop *o, int res)
{
	if (o->fin)
		return;
	o->fin = true;
	if (o->p)
		o->p->inflight--;
	*o->res = tp_bcore_res(&o->b->c, res);
	if (res == 0) {
		struct tp_node *tn = o->b->tc->tn;
		if (o->lk_dev >= 0)
			STAT_ADD(tn, rail_bytes[o->lk_dev], o->len);
		if (o->write) {
			STAT_ADD(tn, writes, 1);
			STAT_ADD(tn, write_bytes, o->len);
		} else {
			STAT_ADD(tn, reads, 1);
			STAT_ADD(tn, read_bytes, o->len);
		}
	}
	if (--o->b->c.left == 0)
		rx_timer_start(o->b->tc->r, &o->b->c.timer, 0, 0);
}

/* Take o off its channel's wait queue (it was not posted). */
static void op_unqueue(struct rop *o)
{
	struct rchan *ch = o->ch;
	struct rop **pp = &ch->wq, *prev = NULL;
	while (*pp && *pp != o) {
		prev = *pp;
		pp = &(*pp)->next;
	}
	if (!*pp)
		return;
	*pp = o->next;
	if (ch->wq_tail == o)
		ch->wq_tail = prev;
	ch->nwait--;
	o->ch = NULL;
	o->next = NULL;
}

/* End every unfinished operation of b with err, destroying the QPs that
 * hold posted ones first (their other operations go elsewhere). */
static void batch_abort(struct rbatch *b, int err)
{
	for (unsigned i = 0; i < b->c.n; i++) {
		struct rop *o = &b->ops[i];
		if (o->fin)
			continue;
		if (o->ch && o->posted)
			chan_teardown(o->ch, TD_ABORT, -ECONNRESET);
		else if (o->ch)
			op_unqueue(o);
	}
	for (unsigned i = 0; i < b->c.n; i++)
		op_end(&b->ops[i], err);
}

static void batch_fire(struct rx_reactor *r, struct rx_timer *t)
{
	struct rbatch *b = t->arg;
	(void)r;
	if (b->c.left) {
		/* The timeout. */
		b->c.timed_out = true;
		STAT_ADD(b->tc->tn, timeouts, 1);
		batch_abort(b, -ETIMEDOUT);
	}
	for (unsigned i = 0; i < b->nmrs; i++)
		b->tc->tn->api->dereg_mr(b->mrs[i].mr);
	free(b->mrs);
	tp_bcore_deliver(&b->c, &b->tc->batches, b->tc->r);
	free(b);
}

/* ------------------------------------------------------------- peers */

static struct tp_peer *peer_get(struct tp_client *tc, const char *name,
				const char *node)
{
	struct tp_peer *p;
	for (p = tc->peers; p; p = p->next)
		if (strcmp(p->name, name) == 0)
			break;
	if (!p) {
		p = calloc(1, sizeof(*p));
		if (!p)
			return NULL;
		snprintf(p->name, sizeof(p->name), "%s", name);
		socklen_t sl;
		p->sa_err = pc_endpoint_parse(name, &p->sa, &sl);
		p->nrails = 1;
		p->next = tc->peers;
		tc->peers = p;
	}
	if (node && !p->node[0])
		snprintf(p->node, sizeof(p->node), "%s", node);
	return p;
}

/* Every operation to p ends with err; its channels close. */
static void peer_fail(struct tp_client *tc, struct tp_peer *p, int err)
{
	(void)tc;
	while (p->chans)
		chan_teardown(p->chans, TD_FAIL, err);
	p->up = false;
	p->last_err = err;
}

/* ------------------------------------------------------------ channels */

static void chan_reap(struct rx_reactor *r, struct rx_timer *t)
{
	struct tp_client *tc = t->arg;
	(void)r;
	while (tc->reap) {
		struct rchan *ch = tc->reap;
		tc->reap = ch->next;
		if (ch->id)
			tc->tn->api->destroy_id(ch->id);
		free(ch->fifo);
		free(ch);
	}
}

static void cq_destroy(struct tp_node *tn, struct ibv_cq **cq)
{
	if (*cq && tn->api->destroy_cq(*cq))
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "destroy_cq: %s",
			  strerror(errno));
	*cq = NULL;
}

/*
 * Close ch now: its QP is destroyed (nothing it holds can land after
 * this). Its operations end with err (TD_FAIL), or go on: TD_RETRY posts
 * the posted ones once more and the queued ones again on the peer's other
 * channels (a new one if need be); TD_CONNFAIL (the channel never
 * connected) moves the queued ones to channels that are still open or
 * opening, and ends them with err when there are none; TD_ABORT (another
 * batch's timeout or cancel) moves every one on without using up its
 * retry. The id is
 * destroyed later, outside any rdma_cm event handling.
 */
static void chan_teardown(struct rchan *ch, enum td mode, int err)
{
	struct tp_client *tc = ch->tc;
	struct tp_node *tn = tc->tn;
	struct tp_peer *p = ch->p;
	if (ch->state == CH_DEAD)
		return;
	bool was_ready = ch->state == CH_READY;
	ch->state = CH_DEAD;
	STAT_ADD(tn, chans_torn_down, 1);
	if (mode == TD_CONNFAIL && ch->rail) {
		/* The peer's rail cannot be reached from ours: the other
		 * rails carry its share for a while. */
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: rail %u could not connect "
			  "(%s); its operations go on the other rails for %u "
			  "ms", p->name, ch->rail, strerror(-err),
			  RAIL_HOLD_MS);
		p->rail_hold[ch->rail] = rx_now_ns(tc->r) + RX_MS(RAIL_HOLD_MS);
	}
	rx_timer_stop(tc->r, &ch->timer);
	if (ch->id && ch->id->qp) {
		if (was_ready)
			tn->api->disconnect(ch->id);
		tn->api->destroy_qp(ch->id);
	}
	cq_destroy(tn, &ch->cq);
	/* Off the peer's list first, so nothing is placed back on it. */
	struct rchan **pp = &p->chans;
	while (*pp && *pp != ch)
		pp = &(*pp)->next;
	if (*pp) {
		*pp = ch->next;
		p->nchans--;
	}
	ch->next = tc->reap;
	tc->reap = ch;
	rx_timer_start(tc->r, &tc->reaper, 0, 0);
	/* The posted operations, in order. */
	unsigned sq = cfg_sq(tn);
	while (ch->nfifo) {
		struct rop *o = ch->fifo[ch->head];
		ch->head = (ch->head + 1) % sq;
		ch->nfifo--;
		o->ch = NULL;
		o->posted = false;
		if (o->fin)
			continue;
		/* TD_ABORT: another batch's timeout or cancel closed the
		 * channel; these were not at fault and keep their retry. */
		bool again = (mode == TD_ABORT ||
			      (mode == TD_RETRY && !o->retried)) &&
			     !o->b->c.cancelled &&
			     !o->b->c.timed_out && !tc->stopping;
		if (again) {
			o->retried |= mode == TD_RETRY;
			STAT_ADD(tn, retried, 1);
			op_place(tc, o, true);
		} else {
			op_end(o, err);
		}
	}
	while (ch->wq) {
		struct rop *o = ch->wq;
		ch->wq = o->next;
		o->next = NULL;
		o->ch = NULL;
		ch->nwait--;
		if (o->fin)
			continue;
		/* Queued ones never ran: they move on, a few times at most
		 * (a peer that accepts and drops every channel); those of a
		 * rail that could not connect, to the other rails. */
		bool again = !tc->stopping && o->moves < 3 &&
			     (mode == TD_RETRY || mode == TD_ABORT ||
			      (mode == TD_CONNFAIL && (p->chans || ch->rail)));
		if (again) {
			o->moves++;
			op_place(tc, o, mode != TD_CONNFAIL || ch->rail);
		} else {
			op_end(o, err);
		}
	}
	ch->wq_tail = NULL;
}

static void hello_make(struct rchan *ch)
{
	struct tp_node *tn = ch->tc->tn;
	struct hello *h = &ch->hi;
	memset(h, 0, sizeof(*h));
	h->magic = HELLO_MAGIC;
	h->ts_ms = wall_ms();
	pc_random_bytes(h->nonce, sizeof(h->nonce));
	if (tn->secret) {
		uint8_t full[PC_SHA256_BYTES];
		h->flags = HELLO_AUTH;
		char at[80];
		sa_text((const struct sockaddr *)&ch->dst, at, sizeof(at));
		proof_of(tn->secret, false, h->ts_ms, h->nonce, at, full);
		memcpy(h->proof, full, PROOF_BYTES);
	}
}

static void chan_deadline(struct rx_reactor *r, struct rx_timer *t)
{
	struct rchan *ch = t->arg;
	(void)r;
	PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: connecting a channel (rail %u) "
		  "timed out", ch->p->name, ch->rail);
	STAT_ADD(ch->tc->tn, chans_failed, 1);
	ch->p->last_err = -ETIMEDOUT;
	chan_teardown(ch, TD_CONNFAIL, -ETIMEDOUT);
}

/* A new channel to p's rail (connecting); NULL and *err. Rail 0 is the
 * endpoint dialed; rail k > 0 goes from this node's rail k to the
 * peer's. */
static struct rchan *chan_open(struct tp_client *tc, struct tp_peer *p,
			       unsigned rail, int *err)
{
	struct tp_node *tn = tc->tn;
	if (p->sa_err) {
		*err = p->sa_err;
		return NULL;
	}
	struct rchan *ch = calloc(1, sizeof(*ch));
	if (ch)
		ch->fifo = calloc(cfg_sq(tn), sizeof(*ch->fifo));
	if (!ch || !ch->fifo) {
		if (ch)
			free(ch);
		*err = -ENOMEM;
		return NULL;
	}
	ch->tc = tc;
	ch->p = p;
	ch->rail = rail;
	ch->dst = rail ? p->rsa[rail] : p->sa;
	ch->state = CH_ADDR;
	rx_timer_init(&ch->timer, chan_deadline, ch);
	/* From our rail's own address (any port: its listener has one). */
	struct sockaddr_storage src = tn->rails[rail].sa;
	sa_set_port(&src, 0);
	bool from = rail && src.ss_family == ch->dst.ss_family;
	if (tn->api->create_id(tc->ech, &ch->id, ch, RDMA_PS_TCP)) {
		*err = neg_errno(-ENOMEM);
		free(ch->fifo);
		free(ch);
		return NULL;
	}
	if (tn->api->resolve_addr(ch->id, from ? (struct sockaddr *)&src
						: NULL,
				  (struct sockaddr *)&ch->dst,
				  cfg_ctimeout(tn))) {
		*err = neg_errno(-EHOSTUNREACH);
		tn->api->destroy_id(ch->id);
		free(ch->fifo);
		free(ch);
		return NULL;
	}
	rx_timer_start(tc->r, &ch->timer, RX_MS(cfg_ctimeout(tn)) * 2, 0);
	ch->next = p->chans;
	p->chans = ch;
	p->nchans++;
	STAT_ADD(tn, chans_opened, 1);
	return ch;
}

/* The rkey the node gave ch for its region key: false if it has none. */
static bool chan_rkey(const struct rchan *ch, uint32_t key, uint32_t *rkey)
{
	for (unsigned i = 0; i < ch->nkeys; i++)
		if (ch->keys[i].key == key) {
			*rkey = ch->keys[i].rkey;
			return true;
		}
	return false;
}

/* Post what waits on ch while its send queue has room, in one chain. */
static void chan_pump(struct rchan *ch)
{
	struct tp_node *tn = ch->tc->tn;
	unsigned sq = cfg_sq(tn), sig = cfg_sig(tn);
	while (ch->state == CH_READY && ch->wq && ch->nfifo < sq) {
		enum { CHAIN = 32 };
		struct ibv_send_wr wr[CHAIN];
		struct ibv_sge sge[CHAIN][2];
		struct rop *ops[CHAIN];
		unsigned n = 0;
		while (ch->wq && n < CHAIN && ch->nfifo + n < sq) {
			struct rop *o = ch->wq;
			ch->wq = o->next;
			if (!ch->wq)
				ch->wq_tail = NULL;
			ch->nwait--;
			o->next = NULL;
			uint32_t rkey;
			if (!chan_rkey(ch, o->key, &rkey)) {
				/* No such region on the node (as a wrong
				 * rkey would be on hardware): nothing to
				 * post, and the channel stays. */
				o->ch = NULL;
				op_end(o, -EFAULT);
				continue;
			}
			int lerr = op_lkeys(o, ch->dev);
			if (lerr) {
				o->ch = NULL;
				op_end(o, lerr);
				continue;
			}
			ops[n] = o;
			struct ibv_send_wr *w = &wr[n];
			memset(w, 0, sizeof(*w));
			int ns = 0;
			if (o->hdr_len)
				sge[n][ns++] = (struct ibv_sge){
					(uintptr_t)o->hdr, o->hdr_len,
					o->lkey_hdr};
			if (o->len > o->hdr_len)
				sge[n][ns++] = (struct ibv_sge){
					(uintptr_t)o->buf, o->len - o->hdr_len,
					o->lkey_buf};
			w->sg_list = sge[n];
			w->num_sge = ns;
			w->opcode = o->write ? IBV_WR_RDMA_WRITE
					     : IBV_WR_RDMA_READ;
			w->wr.rdma.remote_addr = o->addr;
			w->wr.rdma.rkey = rkey;
			w->wr_id = ch->seq + n;
			if (++ch->since_signal >= sig) {
				w->send_flags = IBV_SEND_SIGNALED;
				ch->since_signal = 0;
			}
			w->next = NULL;
			if (n)
				wr[n - 1].next = w;
			n++;
		}
		if (!n)
			continue;
		/* The chain's last WR is signaled: every WR is covered. */
		if (!(wr[n - 1].send_flags & IBV_SEND_SIGNALED)) {
			wr[n - 1].send_flags = IBV_SEND_SIGNALED;
			ch->since_signal = 0;
		}
		struct ibv_send_wr *bad = NULL;
		int ret = tn->api->post_send(ch->id->qp, wr, &bad);
		unsigned posted = n;
		if (ret) {
			posted = bad ? (unsigned)(bad - wr) : 0;
			STAT_ADD(tn, post_failures, 1);
		}
		for (unsigned i = 0; i < posted; i++) {
			struct rop *o = ops[i];
			o->seq = ch->seq + i;
			o->posted_ns = rx_now_ns(ch->tc->r);
			o->posted = true;
			ch->fifo[(ch->head + ch->nfifo) % sq] = o;
			ch->nfifo++;
			if (wr[i].send_flags & IBV_SEND_SIGNALED)
				STAT_ADD(tn, wrs_signaled, 1);
		}
		STAT_ADD(tn, wrs_posted, posted);
		ch->seq += posted;
		if (posted)
			sweep_arm(ch->tc);
		if (posted < n) {
			/* Put the rest back, in order. */
			for (unsigned i = n; i-- > posted;) {
				ops[i]->next = ch->wq;
				ch->wq = ops[i];
				if (!ch->wq_tail)
					ch->wq_tail = ops[i];
				ch->nwait++;
			}
			if (posted && !(wr[posted - 1].send_flags &
					IBV_SEND_SIGNALED)) {
				/* The posted part ends unsignaled: nothing
				 * would report it. Start over. */
				PC_LOG_RL(PC_LOG_WARN, LOG_MOD,
					  "%s: post_send took part of a chain "
					  "(%s); reopening the channel",
					  ch->p->name, strerror(ret));
				chan_teardown(ch, TD_RETRY, -EIO);
				return;
			}
			if (ret != ENOMEM || !ch->nfifo) {
				PC_LOG_RL(PC_LOG_WARN, LOG_MOD,
					  "%s: post_send: %s", ch->p->name,
					  strerror(ret));
				chan_teardown(ch, TD_RETRY, -EIO);
			}
			return;
		}
	}
}

/*
 * The rail o goes on: a batch is spread over the rails this node and the
 * peer share, operation i on rail i % n (as the original); a rail held
 * after a failed connect is skipped, and an operation sent again moves on
 * to the next rail.
 */
static unsigned op_rail(struct tp_client *tc, const struct rop *o)
{
	const struct tp_peer *p = o->p;
	unsigned n = PC_MIN(tc->tn->nrails, p->nrails);
	if (n <= 1)
		return 0;
	unsigned i = (unsigned)(o - o->b->ops) + o->moves + o->retried;
	uint64_t now = rx_now_ns(tc->r);
	for (unsigned t = 0; t < n; t++) {
		unsigned k = (i + t) % n;
		if (k == 0 || p->rail_hold[k] <= now)
			return k;
	}
	return 0;
}

/* The least-loaded channel of p (on rail, or on any if rail < 0); *load
 * and *count (of that rail's channels) set. */
static struct rchan *chan_least(struct tp_peer *p, int rail, unsigned *load,
				unsigned *count)
{
	struct rchan *best = NULL;
	*load = UINT32_MAX;
	*count = 0;
	for (struct rchan *ch = p->chans; ch; ch = ch->next) {
		if (rail >= 0 && ch->rail != (unsigned)rail)
			continue;
		(*count)++;
		unsigned l = ch->nfifo + ch->nwait;
		if (l < *load) {
			*load = l;
			best = ch;
		}
	}
	return best;
}

/* Put o on the least-loaded channel of its rail to its peer (a new one
 * while every channel has work, the cap per rail allows and may_open; a
 * channel on another rail if its rail has none), or end it with the
 * reason. */
static void op_place(struct tp_client *tc, struct rop *o, bool may_open)
{
	struct tp_peer *p = o->p;
	unsigned rail = op_rail(tc, o), load, nr;
	struct rchan *best = chan_least(p, (int)rail, &load, &nr);
	if ((!best || load > 0) && nr < cfg_chans(tc->tn) && may_open) {
		int err = 0;
		struct rchan *ch = chan_open(tc, p, rail, &err);
		if (ch) {
			best = ch;
		} else if (!best && rail) {
			/* This rail cannot be used now: the next one. */
			p->rail_hold[rail] = rx_now_ns(tc->r) +
					     RX_MS(RAIL_HOLD_MS);
			op_place(tc, o, may_open);
			return;
		} else if (!best) {
			p->last_err = err;
			op_end(o, err);
			return;
		}
	}
	if (!best)
		best = chan_least(p, -1, &load, &nr);
	if (!best) {
		op_end(o, p->last_err ? p->last_err : -ECONNREFUSED);
		return;
	}
	o->ch = best;
	o->next = NULL;
	if (best->wq_tail)
		best->wq_tail->next = o;
	else
		best->wq = o;
	best->wq_tail = o;
	best->nwait++;
	if (best->state == CH_READY)
		chan_pump(best);
}

/* ---------------------------------------------------------- completions */

static int wc_errno(enum ibv_wc_status st)
{
	switch (st) {
	case IBV_WC_REM_ACCESS_ERR:
		return -EFAULT;
	case IBV_WC_LOC_PROT_ERR:
	case IBV_WC_LOC_LEN_ERR:
	case IBV_WC_REM_INV_REQ_ERR:
		return -EINVAL;
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR:
		return -EHOSTDOWN;
	case IBV_WC_WR_FLUSH_ERR:
		return -ECONNRESET;
	default:
		return -EIO;
	}
}

static void chan_wc(struct rchan *ch, const struct ibv_wc *wc)
{
	struct tp_node *tn = ch->tc->tn;
	unsigned sq = cfg_sq(tn);
	if (ch->state != CH_READY)
		return;
	/* Every operation posted before wc's completed (in order). */
	while (ch->nfifo && ch->fifo[ch->head]->seq < wc->wr_id) {
		struct rop *o = ch->fifo[ch->head];
		ch->head = (ch->head + 1) % sq;
		ch->nfifo--;
		o->ch = NULL;
		o->posted = false;
		op_end(o, 0);
	}
	if (!ch->nfifo || ch->fifo[ch->head]->seq != wc->wr_id)
		return; /* not ours (stale): ignore */
	struct rop *o = ch->fifo[ch->head];
	if (wc->status == IBV_WC_SUCCESS) {
		ch->head = (ch->head + 1) % sq;
		ch->nfifo--;
		o->ch = NULL;
		o->posted = false;
		op_end(o, 0);
		ch->p->up = true;
		ch->p->last_err = 0;
		chan_pump(ch);
		return;
	}
	STAT_ADD(tn, wc_errors, 1);
	int err = wc_errno(wc->status);
	if (err == -EHOSTDOWN && ch->rail) {
		/* Nothing answers on this rail (its NIC or path is down):
		 * its operations, this one too, go on the other rails. */
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: rail %u does not answer "
			  "(%s); its operations go on the other rails for %u "
			  "ms", ch->p->name, ch->rail,
			  ibv_wc_status_str(wc->status), RAIL_HOLD_MS);
		ch->p->rail_hold[ch->rail] = rx_now_ns(ch->tc->r) +
					     RX_MS(RAIL_HOLD_MS);
		chan_teardown(ch, TD_RETRY, -ECONNRESET);
		return;
	}
	if (wc->status != IBV_WC_WR_FLUSH_ERR) {
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: %s of %u bytes failed: %s",
			  ch->p->name, o->write ? "write" : "read", o->len,
			  ibv_wc_status_str(wc->status));
		ch->head = (ch->head + 1) % sq;
		ch->nfifo--;
		o->ch = NULL;
		o->posted = false;
		op_end(o, err);
	}
	if (err == -EHOSTDOWN) {
		ch->p->up = false;
		ch->p->last_err = err;
		/* The peer does not answer: the rest of its work too. */
		peer_fail(ch->tc, ch->p, err);
		return;
	}
	chan_teardown(ch, TD_RETRY, -ECONNRESET);
}

static void chan_drain(struct rchan *ch)
{
	struct tp_node *tn = ch->tc->tn;
	struct ibv_wc wc[16];
	while (ch->state == CH_READY && ch->cq) {
		int n = tn->api->poll_cq(ch->cq, 16, wc);
		if (n < 0) {
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: poll_cq failed",
				  ch->p->name);
			chan_teardown(ch, TD_RETRY, -EIO);
			return;
		}
		for (int i = 0; i < n; i++)
			chan_wc(ch, &wc[i]);
		if (n < 16)
			return;
	}
}

/* The completion channel: get each event, ack it, re-arm, then drain (a
 * completion after the re-arm makes a new event: none is lost). */
static void on_cq_event(struct rx_watch *w, uint32_t revents, void *arg)
{
	const struct ccw *cw = arg;
	struct tp_client *tc = cw->tc;
	struct tp_node *tn = tc->tn;
	(void)w;
	(void)revents;
	for (;;) {
		struct ibv_cq *cq;
		void *ctx;
		if (tn->api->get_cq_event(tc->cch[cw->dev], &cq, &ctx))
			return;
		STAT_ADD(tn, cq_events, 1);
		tn->api->ack_cq_events(cq, 1);
		struct rchan *ch = ctx;
		if (ch->state != CH_READY || ch->cq != cq)
			continue;
		if (tn->api->req_notify_cq(cq, 0)) {
			chan_teardown(ch, TD_RETRY, -EIO);
			continue;
		}
		chan_drain(ch);
	}
}

/* ------------------------------------------------------ stuck channels */

/*
 * cfg.op_timeout_ms: a channel whose oldest posted WR has not completed
 * within it is stuck (a black-holed QP: nothing answers, and no error
 * comes before the QP's retries run out, seconds on hardware). One timer
 * per client sweeps the channels every quarter of the timeout while any
 * of them holds posted work. Posting times grow along a channel's fifo,
 * so its head is the one to look at: an operation costs one store of the
 * reactor's cached clock and no timer of its own (a timer per channel
 * would be re-armed on every completion). An operation is found late 1 to
 * 1.25 timeouts after it was posted. A stuck channel is torn down like
 * one with a failed completion (TD_RETRY): its QP is destroyed at once,
 * its operations are posted once more on another channel, and one that
 * was already retried ends with -ETIMEDOUT.
 */
static void sweep_arm(struct tp_client *tc)
{
	uint64_t ns = RX_MS(tc->tn->cfg.op_timeout_ms) / 4;
	if (!ns || tc->stopping || rx_timer_armed(&tc->sweep))
		return;
	rx_timer_start(tc->r, &tc->sweep, PC_MAX(ns, RX_MS(1)), 0);
}

/* A channel of p whose oldest posted WR is older than limit, or NULL;
 * *busy becomes true if one holds posted work. */
static struct rchan *chan_stuck(struct tp_peer *p, uint64_t now,
				uint64_t limit, bool *busy)
{
	for (struct rchan *ch = p->chans; ch; ch = ch->next) {
		if (ch->state != CH_READY || !ch->nfifo)
			continue;
		*busy = true;
		if (now - ch->fifo[ch->head]->posted_ns >= limit)
			return ch;
	}
	return NULL;
}

static void op_sweep(struct rx_reactor *r, struct rx_timer *t)
{
	struct tp_client *tc = t->arg;
	struct tp_node *tn = tc->tn;
	uint64_t now = rx_now_ns(r), limit = RX_MS(tn->cfg.op_timeout_ms);
	bool busy = false;
	for (struct tp_peer *p = tc->peers; p; p = p->next) {
		struct rchan *ch;
		/* A teardown changes p's channels (a retry may open one):
		 * look again from the start. */
		while ((ch = chan_stuck(p, now, limit, &busy))) {
			const struct rop *o = ch->fifo[ch->head];
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: an RDMA %s of %u "
				  "bytes posted %llu ms ago has not completed "
				  "(rdma_op_timeout_ms %u); closing its channel",
				  p->name, o->write ? "write" : "read", o->len,
				  (unsigned long long)((now - o->posted_ns) /
						       RX_MS(1)),
				  tn->cfg.op_timeout_ms);
			STAT_ADD(tn, op_timeouts, 1);
			p->last_err = -ETIMEDOUT;
			chan_teardown(ch, TD_RETRY, -ETIMEDOUT);
		}
	}
	if (busy)
		sweep_arm(tc);
}

/* ------------------------------------------------------ rdma_cm (client) */

static int chan_connect(struct rchan *ch)
{
	struct tp_client *tc = ch->tc;
	struct tp_node *tn = tc->tn;
	int dev = rail_of(tn, ch->id->verbs);
	if (dev < 0) {
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: reached through another "
			  "RDMA device than this node's; not supported",
			  ch->p->name);
		return -ENODEV;
	}
	ch->dev = (unsigned)dev;
	struct rail *rl = &tn->rails[dev];
	ch->cq = tn->api->create_cq(rl->ctx, (int)cfg_sq(tn) + 1, ch,
				    tc->cch[dev], 0);
	if (!ch->cq)
		return neg_errno(-ENOMEM);
	if (tn->api->req_notify_cq(ch->cq, 0))
		return -EIO;
	struct ibv_qp_init_attr qa;
	memset(&qa, 0, sizeof(qa));
	qa.send_cq = ch->cq;
	qa.recv_cq = ch->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = cfg_sq(tn);
	qa.cap.max_recv_wr = 1;
	qa.cap.max_send_sge = 2;
	qa.cap.max_recv_sge = 1;
	qa.sq_sig_all = 0;
	if (tn->api->create_qp(ch->id, rl->pd, &qa))
		return neg_errno(-ENOMEM);
	hello_make(ch);
	struct rdma_conn_param cp;
	memset(&cp, 0, sizeof(cp));
	cp.private_data = &ch->hi;
	cp.private_data_len = sizeof(ch->hi);
	cp.initiator_depth = (uint8_t)cfg_rd(tn);
	cp.responder_resources = 0;
	cp.retry_count = 7;
	cp.rnr_retry_count = 7;
	if (tn->api->connect(ch->id, &cp))
		return neg_errno(-ECONNREFUSED);
	return 0;
}

/*
 * The rails a node's accept lists after its keys (len bytes at t): p's
 * rail k > 0 is at those addresses, with p's port unless the list names
 * one. Nothing (zeros, an older node): one rail. Only rail 0's accepts
 * say it (the address dialed is rail 0).
 */
static void peer_rails(struct tp_peer *p, const uint8_t *t, size_t len)
{
	struct rails_tail h;
	if (len < sizeof(h))
		return;
	memcpy(&h, t, sizeof(h));
	size_t alen = h.v6 ? 16 : 4;
	unsigned n = PC_MIN(h.n, RAILS_MAX - 1);
	if (!h.n || len - sizeof(h) < n * alen)
		return;
	for (unsigned k = 0; k < n; k++) {
		struct sockaddr_storage *ss = &p->rsa[k + 1];
		memset(ss, 0, sizeof(*ss));
		const uint8_t *a = t + sizeof(h) + k * alen;
		if (h.v6) {
			struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
			in6->sin6_family = AF_INET6;
			memcpy(&in6->sin6_addr, a, 16);
			in6->sin6_port = h.port;
		} else {
			struct sockaddr_in *in = (struct sockaddr_in *)ss;
			in->sin_family = AF_INET;
			memcpy(&in->sin_addr, a, 4);
			in->sin_port = h.port;
		}
	}
	p->nrails = n + 1;
}

/* The node's answer: its proof over what we sent, when we have a secret,
 * and its key table for the rail (kept in ch). */
static int welcome_check(struct rchan *ch, const struct rdma_cm_event *ev)
{
	struct tp_node *tn = ch->tc->tn;
	const struct welcome *w = ev->param.conn.private_data;
	size_t len = w ? ev->param.conn.private_data_len : 0;
	if (len < WELCOME_HDR + sizeof(w->nkeys) || w->magic != HELLO_MAGIC)
		return tn->secret ? -EACCES : -EPROTO;
	if (tn->secret) {
		uint8_t want[PC_SHA256_BYTES];
		char at[80];
		sa_text((const struct sockaddr *)&ch->dst, at, sizeof(at));
		proof_of(tn->secret, true, ch->hi.ts_ms, ch->hi.nonce, at,
			 want);
		if (!pc_ct_equal(want, w->proof, sizeof(want)))
			return -EACCES;
	}
	uint32_t n = w->nkeys;
	size_t klen = n * sizeof(struct rkpair);
	size_t body = len - (WELCOME_HDR + sizeof(w->nkeys));
	if (n > TP_REGIONS_MAX || body < klen)
		return -EPROTO;
	memcpy(ch->keys, w->body, klen);
	ch->nkeys = n;
	if (ch->rail == 0)
		peer_rails(ch->p, w->body + klen, body - klen);
	return 0;
}

static int reject_reason(const struct rdma_cm_event *ev)
{
	const struct welcome *w = ev->param.conn.private_data;
	if (w && ev->param.conn.private_data_len >= 8 &&
	    w->magic == HELLO_MAGIC && w->err < 0)
		return w->err;
	return -ECONNREFUSED;
}

static void chan_cm_event(struct rchan *ch, const struct rdma_cm_event *ev)
{
	struct tp_node *tn = ch->tc->tn;
	if (ch->state == CH_DEAD)
		return;
	int err = 0;
	switch (ev->event) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		ch->state = CH_ROUTE;
		if (tn->api->resolve_route(ch->id, cfg_ctimeout(tn)))
			err = neg_errno(-EHOSTUNREACH);
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		ch->state = CH_CONN;
		err = chan_connect(ch);
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		err = welcome_check(ch, ev);
		if (err) {
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: %s; closing",
				  ch->p->name, err == -EACCES
				  ? "the node did not prove the cluster secret"
				  : "the node's accept has no valid key table");
			break;
		}
		rx_timer_stop(ch->tc->r, &ch->timer);
		ch->state = CH_READY;
		ch->p->up = true;
		ch->p->last_err = 0;
		chan_pump(ch);
		return;
	case RDMA_CM_EVENT_REJECTED:
		err = reject_reason(ev);
		/* No answer of ours: nobody listens (IB CM reason 8,
		 * invalid service id), or the node is not a PeerCache. */
		PC_LOG_RL(PC_LOG_INFO, LOG_MOD, "%s: RDMA connect refused "
			  "(%s, reject reason %d)", ch->p->name,
			  strerror(-err), ev->status);
		break;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_CONNECT_ERROR:
		err = -EHOSTUNREACH;
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		chan_teardown(ch, TD_RETRY, -ECONNRESET);
		return;
	default:
		return;
	}
	if (err) {
		STAT_ADD(tn, chans_failed, 1);
		ch->p->last_err = err;
		if (!ch->p->up || ch->p->nchans <= 1)
			ch->p->up = false;
		chan_teardown(ch, TD_CONNFAIL, err);
	}
}

static void on_cm_event(struct rx_watch *w, uint32_t revents, void *arg)
{
	struct tp_client *tc = arg;
	const struct rv_api *api = tc->tn->api;
	(void)w;
	(void)revents;
	struct rdma_cm_event *ev;
	while (api->get_cm_event(tc->ech, &ev) == 0) {
		struct rchan *ch = ev->id ? ev->id->context : NULL;
		if (ch)
			chan_cm_event(ch, ev);
		api->ack_cm_event(ev);
	}
}

/* ------------------------------------------------------ rdma_cm (node) */

static bool seen_before(struct tp_node *tn, const struct hello *h,
			uint64_t now)
{
	for (unsigned i = 0; i < SEEN_MAX; i++)
		if (tn->seen[i].ts == h->ts_ms &&
		    !memcmp(tn->seen[i].nonce, h->nonce, NONCE_BYTES) &&
		    now - tn->seen[i].ts < 4 * SKEW_MS)
			return true;
	tn->seen[tn->seen_next].ts = h->ts_ms;
	memcpy(tn->seen[tn->seen_next].nonce, h->nonce, NONCE_BYTES);
	tn->seen_next = (tn->seen_next + 1) % SEEN_MAX;
	return false;
}

/* 0, or why the request is refused. */
static int hello_check(struct tp_node *tn, const struct rdma_cm_event *ev)
{
	const struct hello *h = ev->param.conn.private_data;
	if (!h || ev->param.conn.private_data_len < sizeof(*h) ||
	    h->magic != HELLO_MAGIC)
		return -EPROTO;
	if (!tn->secret)
		return 0;
	if (!(h->flags & HELLO_AUTH))
		return -EACCES;
	uint64_t now = wall_ms();
	uint64_t d = now > h->ts_ms ? now - h->ts_ms : h->ts_ms - now;
	if (d > SKEW_MS)
		return -EKEYEXPIRED;
	uint8_t want[PC_SHA256_BYTES];
	char at[80];
	sa_text(&ev->id->route.addr.src_addr, at, sizeof(at));
	proof_of(tn->secret, false, h->ts_ms, h->nonce, at, want);
	if (!pc_ct_equal(want, h->proof, PROOF_BYTES))
		return -EACCES;
	if (seen_before(tn, h, now))
		return -EALREADY;
	return 0;
}

static void sconn_drop(struct tp_node *tn, struct sconn *s)
{
	struct sconn **pp = &tn->sconns;
	while (*pp && *pp != s)
		pp = &(*pp)->next;
	if (*pp)
		*pp = s->next;
	tn->nsconns--;
	if (s->id->qp)
		tn->api->destroy_qp(s->id);
	tn->api->destroy_id(s->id);
	free(s);
}

/* What an accept on rail hands out: every region's key and the rkey of
 * its current MR on that rail, then the node's other rails. Its length. */
static size_t keys_of(struct tp_node *tn, unsigned rail, struct welcome *w)
{
	pthread_mutex_lock(&tn->lock);
	w->nkeys = 0;
	for (unsigned i = 0; i < TP_REGIONS_MAX; i++)
		if (tn->regs[i].used) {
			struct rkpair k = {tn->regs[i].key,
					   tn->regs[i].mr[rail]->rkey};
			memcpy(w->body + w->nkeys++ * sizeof(k), &k,
			       sizeof(k));
		}
	size_t klen = w->nkeys * sizeof(struct rkpair);
	/* rdma_reg keeps keys and tail within the body */
	if (tn->tail_len)
		memcpy(w->body + klen, tn->tail, tn->tail_len);
	size_t len = WELCOME_HDR + sizeof(w->nkeys) + klen + tn->tail_len;
	pthread_mutex_unlock(&tn->lock);
	return len;
}

/* A connect request: accept it with a queue pair on our PD, or refuse. */
static void node_request(struct tp_node *tn, struct rdma_cm_event *ev,
			 struct rdma_cm_id **destroy)
{
	struct rdma_cm_id *id = ev->id;
	struct welcome w = {.magic = HELLO_MAGIC};
	int err = hello_check(tn, ev);
	int rail = rail_of(tn, id->verbs);
	if (!err && rail < 0)
		err = -ENODEV;
	/* A cap like the data port's on connections: a peer (holding the
	 * secret) cannot exhaust the device's queue pairs. */
	unsigned cap = tn->cfg.max_accepted ? tn->cfg.max_accepted : 8192;
	if (!err && tn->nsconns >= cap)
		err = -EMFILE;
	struct sconn *s = NULL;
	if (!err && !(s = calloc(1, sizeof(*s))))
		err = -ENOMEM;
	if (!err) {
		struct ibv_qp_init_attr qa;
		memset(&qa, 0, sizeof(qa));
		qa.send_cq = tn->rails[rail].scq;
		qa.recv_cq = tn->rails[rail].scq;
		qa.qp_type = IBV_QPT_RC;
		qa.cap.max_send_wr = 1;
		qa.cap.max_recv_wr = 1;
		qa.cap.max_send_sge = 1;
		qa.cap.max_recv_sge = 1;
		if (tn->api->create_qp(id, tn->rails[rail].pd, &qa))
			err = neg_errno(-ENOMEM);
	}
	if (!err) {
		const struct hello *h = ev->param.conn.private_data;
		char at[80];
		sa_text(&id->route.addr.src_addr, at, sizeof(at));
		if (tn->secret)
			proof_of(tn->secret, true, h->ts_ms, h->nonce, at,
				 w.proof);
		size_t wlen = keys_of(tn, (unsigned)rail, &w);
		struct rdma_conn_param cp;
		memset(&cp, 0, sizeof(cp));
		cp.private_data = &w;
		cp.private_data_len = (uint8_t)wlen;
		cp.responder_resources = (uint8_t)cfg_rd(tn);
		cp.initiator_depth = 0;
		cp.rnr_retry_count = 7;
		if (tn->api->accept(id, &cp)) {
			err = neg_errno(-EIO);
			tn->api->destroy_qp(id);
		}
	}
	if (err) {
		free(s);
		STAT_ADD(tn, refused, 1);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "refused a peer's channel: %s",
			  strerror(-err));
		w.err = err;
		memset(w.proof, 0, sizeof(w.proof));
		tn->api->reject(id, &w, (uint8_t)WELCOME_HDR);
		*destroy = id; /* after the event is acked */
		return;
	}
	STAT_ADD(tn, accepted, 1);
	tn->nsconns++;
	s->gen = tn->revoke_gen; /* keys_of ran on this reactor, after any
				  * revoke's swap */
	s->id = id;
	id->context = s;
	s->next = tn->sconns;
	tn->sconns = s;
}

static void on_node_cm(struct rx_watch *w, uint32_t revents, void *arg)
{
	struct tp_node *tn = arg;
	(void)w;
	(void)revents;
	struct rdma_cm_event *ev;
	while (tn->api->get_cm_event(tn->lch, &ev) == 0) {
		struct rdma_cm_id *destroy = NULL;
		struct sconn *drop = NULL;
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
			node_request(tn, ev, &destroy);
		} else if (ev->id && ev->id->context != tn &&
			   (ev->event == RDMA_CM_EVENT_DISCONNECTED ||
			    ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL)) {
			drop = ev->id->context;
		}
		tn->api->ack_cm_event(ev);
		if (destroy)
			tn->api->destroy_id(destroy);
		if (drop)
			sconn_drop(tn, drop);
	}
}

/* ------------------------------------------------------ device events */

/* A QP's affiliated errors: the QP is in the error state for good. */
static bool qp_fatal(enum ibv_event_type t)
{
	return t == IBV_EVENT_QP_FATAL || t == IBV_EVENT_QP_REQ_ERR ||
	       t == IBV_EVENT_QP_ACCESS_ERR;
}

static bool port_event(enum ibv_event_type t)
{
	return t == IBV_EVENT_PORT_ACTIVE || t == IBV_EVENT_PORT_ERR ||
	       t == IBV_EVENT_LID_CHANGE || t == IBV_EVENT_PKEY_CHANGE ||
	       t == IBV_EVENT_GID_CHANGE || t == IBV_EVENT_SM_CHANGE ||
	       t == IBV_EVENT_CLIENT_REREGISTER;
}

/*
 * The device's asynchronous events (its context's async_fd, watched on
 * the listener's reactor): each is counted, logged (rate limited) and
 * acked. A fatal error of a QP this node accepted drops that QP once the
 * event is acked (a QP is destroyed only after its events are): its peer
 * sees a disconnect and opens another. A fatal error of one of our own
 * channels' QPs is left to that channel, which may live on another
 * reactor: its WRs complete in error and tear it down. Port and device
 * events only say what happened: channels fail on their completions or
 * rdma_cm events, and a port that comes back serves the next connect.
 */
static void on_async_event(struct rx_watch *w, uint32_t revents, void *arg)
{
	struct rail *rl = arg;
	struct tp_node *tn = rl->tn;
	(void)w;
	(void)revents;
	struct ibv_async_event ev;
	while (tn->api->get_async_event(rl->ctx, &ev) == 0) {
		enum ibv_event_type t = ev.event_type;
		struct sconn *drop = NULL;
		STAT_ADD(tn, async_events, 1);
		if (qp_fatal(t)) {
			for (drop = tn->sconns; drop; drop = drop->next)
				if (drop->id->qp == ev.element.qp)
					break;
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "device event (%s): %s on "
				  "%s", rl->name, ibv_event_type_str(t),
				  drop ? "a peer's queue pair; dropping it"
				       : "one of this node's channels");
		} else if (t == IBV_EVENT_DEVICE_FATAL) {
			PC_LOG_RL(PC_LOG_ERROR, LOG_MOD, "device event (%s): "
				  "%s: RDMA operations on it will fail until the "
				  "node is restarted on a working device",
				  rl->name, ibv_event_type_str(t));
		} else if (port_event(t)) {
			PC_LOG_RL(t == IBV_EVENT_PORT_ERR ? PC_LOG_WARN
							  : PC_LOG_INFO,
				  LOG_MOD, "device event (%s): port %d: %s",
				  rl->name, ev.element.port_num,
				  ibv_event_type_str(t));
		} else {
			PC_LOG_RL(PC_LOG_INFO, LOG_MOD, "device event (%s): %s",
				  rl->name, ibv_event_type_str(t));
		}
		tn->api->ack_async_event(&ev);
		if (drop)
			sconn_drop(tn, drop);
	}
}

static bool sa_wildcard(const struct sockaddr_storage *ss)
{
	if (ss->ss_family == AF_INET)
		return ((const struct sockaddr_in *)ss)->sin_addr.s_addr ==
		       htonl(INADDR_ANY);
	return ss->ss_family == AF_INET6 &&
	       IN6_IS_ADDR_UNSPECIFIED(
		       &((const struct sockaddr_in6 *)ss)->sin6_addr);
}

/* A listener of rail rl at ss on tn->lch: 0 or -errno. */
static int rail_listen(struct tp_node *tn, struct rail *rl,
		       const struct sockaddr_storage *ss)
{
	const struct rv_api *api = tn->api;
	int ret = 0;
	if (api->create_id(tn->lch, &rl->lid, tn, RDMA_PS_TCP))
		return neg_errno(-ENOMEM);
	if (api->bind_addr(rl->lid, (struct sockaddr *)ss))
		ret = neg_errno(-EADDRNOTAVAIL);
	if (!ret && api->listen(rl->lid, 1024))
		ret = neg_errno(-EIO);
	if (ret) {
		api->destroy_id(rl->lid);
		rl->lid = NULL;
	}
	return ret;
}

/*
 * Offer rails 1..n to peers, at port: each listens at its own address
 * (rail 0's wildcard listener, when rail 0 listens at one, hears them
 * all), and the accepts list those that do. A rail whose address is of
 * another family than rail 0's, or that cannot listen, is left out, as are
 * the last ones when the list and the regions' keys would not fit in an
 * accept. Each one left out is said.
 */
static void rails_offer(struct tp_node *tn, const struct sockaddr_storage *ss,
			uint16_t port)
{
	bool wild = sa_wildcard(ss), v6 = ss->ss_family == AF_INET6;
	size_t alen = v6 ? 16 : 4;
	uint8_t buf[sizeof(struct rails_tail) + (RAILS_MAX - 1) * 16];
	struct rails_tail h = {.v6 = v6, .port = htons(port)};
	for (unsigned k = 1; k < tn->nrails; k++) {
		struct rail *rl = &tn->rails[k];
		char at[80];
		sa_set_port(&rl->sa, port);
		sa_text((const struct sockaddr *)&rl->sa, at, sizeof(at));
		if (rl->sa.ss_family != ss->ss_family) {
			PC_LOGW(LOG_MOD, "rail %u (%s) at %s: not the address "
				"family of rail 0's; peers will not use it",
				k, rl->name, at);
			continue;
		}
		int err = wild ? 0 : rail_listen(tn, rl, &rl->sa);
		if (err) {
			PC_LOGW(LOG_MOD, "rail %u (%s): no listener at %s (%s); "
				"peers will not use it", k, rl->name, at,
				strerror(-err));
			continue;
		}
		const void *a = v6 ? (const void *)&((struct sockaddr_in6 *)
						     &rl->sa)->sin6_addr
				   : (const void *)&((struct sockaddr_in *)
						     &rl->sa)->sin_addr;
		memcpy(buf + sizeof(h) + h.n * alen, a, alen);
		h.n++;
		rl->offered = true;
		PC_LOGI(LOG_MOD, "rail %u (%s): accepting RDMA peers at %s%s",
			k, rl->name, at, wild ? " (rail 0's listener)" : "");
	}
	unsigned offered = h.n;
	pthread_mutex_lock(&tn->lock);
	unsigned nregs = 0;
	for (unsigned i = 0; i < TP_REGIONS_MAX; i++)
		nregs += tn->regs[i].used;
	while (h.n && nregs * sizeof(struct rkpair) + sizeof(h) + h.n * alen >
			      sizeof(((struct welcome *)0)->body))
		h.n--;
	if (h.n) {
		memcpy(buf, &h, sizeof(h));
		tn->tail = malloc(sizeof(h) + h.n * alen);
		if (tn->tail) {
			memcpy(tn->tail, buf, sizeof(h) + h.n * alen);
			tn->tail_len = sizeof(h) + h.n * alen;
		}
	}
	pthread_mutex_unlock(&tn->lock);
	if (h.n < offered)
		PC_LOGW(LOG_MOD, "an RDMA accept holds %u region key(s) and "
			"the addresses of %u more rail(s) only; peers use %u "
			"of the %u rails", nregs, h.n, 1u + h.n, tn->nrails);
	if (tn->tail_len != sizeof(h) + h.n * alen)
		PC_LOGW(LOG_MOD, "out of memory listing the rails; peers use "
			"rail 0 only");
}

int tp_rdma_node_listen(struct tp_node *tn, struct rx_reactor *r,
			const char *host, uint16_t port, const char *endpoint,
			uint16_t *bound)
{
	const struct rv_api *api = tn->api;
	char ep[200];
	snprintf(ep, sizeof(ep), "%s:%u", host, port);
	struct sockaddr_storage ss;
	socklen_t sl;
	int ret = pc_endpoint_parse(ep, &ss, &sl);
	if (ret < 0)
		return ret;
	if (!(tn->lch = api->create_event_channel()))
		return neg_errno(-ENODEV);
	ret = set_nonblock(tn->lch->fd);
	if (!ret)
		ret = rail_listen(tn, &tn->rails[0], &ss);
	for (unsigned k = 0; !ret && k < tn->nrails; k++)
		if (!(tn->rails[k].scq = api->create_cq(tn->rails[k].ctx, 16,
							NULL, NULL, 0)))
			ret = neg_errno(-ENOMEM);
	if (!ret) {
		__atomic_store_n(&tn->lr, r, __ATOMIC_RELEASE);
		tn->lw = rx_watch_fd(r, tn->lch->fd, POLLIN, on_node_cm, tn,
				     &ret);
	}
	for (unsigned k = 0; !ret && k < tn->nrails; k++) {
		struct rail *rl = &tn->rails[k];
		if (rl->ctx->async_fd < 0)
			continue;
		ret = set_nonblock(rl->ctx->async_fd);
		if (!ret)
			rl->aw = rx_watch_fd(r, rl->ctx->async_fd, POLLIN,
					     on_async_event, rl, &ret);
	}
	if (ret < 0) {
		tp_rdma_node_unlisten(tn);
		return ret;
	}
	*bound = ntohs(api->get_src_port(tn->rails[0].lid));
	PC_LOGI(LOG_MOD, "accepting RDMA peers at %s:%u%s%s%s", host, *bound,
		endpoint && *endpoint ? " (advertised as " : "",
		endpoint && *endpoint ? endpoint : "",
		endpoint && *endpoint ? ")" : "");
	if (tn->nrails > 1)
		rails_offer(tn, &ss, *bound);
	return 0;
}

void tp_rdma_node_unlisten(struct tp_node *tn)
{
	const struct rv_api *api = tn->api;
	if (tn->lw) {
		rx_watch_cancel(tn->lw);
		tn->lw = NULL;
	}
	for (unsigned k = 0; k < tn->nrails; k++) {
		struct rail *rl = &tn->rails[k];
		if (!rl->aw)
			continue;
		rx_watch_cancel(rl->aw);
		rl->aw = NULL;
		/* Ack what was raised meanwhile: its QPs can then go. */
		struct ibv_async_event aev;
		while (api->get_async_event(rl->ctx, &aev) == 0)
			api->ack_async_event(&aev);
	}
	/* Ack whatever is queued, so that no id waits on an event. */
	struct rdma_cm_event *ev;
	while (tn->lch && api->get_cm_event(tn->lch, &ev) == 0) {
		bool req = ev->event == RDMA_CM_EVENT_CONNECT_REQUEST;
		struct rdma_cm_id *id = ev->id;
		api->ack_cm_event(ev);
		if (req)
			api->destroy_id(id);
	}
	while (tn->sconns)
		sconn_drop(tn, tn->sconns);
	for (unsigned k = 0; k < tn->nrails; k++) {
		struct rail *rl = &tn->rails[k];
		if (rl->lid) {
			api->destroy_id(rl->lid);
			rl->lid = NULL;
		}
		rl->offered = false;
		cq_destroy(tn, &rl->scq);
	}
	pthread_mutex_lock(&tn->lock);
	free(tn->tail);
	tn->tail = NULL;
	tn->tail_len = 0;
	pthread_mutex_unlock(&tn->lock);
	/* Old MRs stay until tp_rdma_node_free. */
	if (tn->lr) {
		rx_timer_stop(tn->lr, &tn->grace);
		rx_timer_stop(tn->lr, &tn->closer);
	}
	if (tn->lch) {
		api->destroy_event_channel(tn->lch);
		tn->lch = NULL;
	}
}

/* ------------------------------------------------------------- revokes */

/*
 * A revoke takes back every access to this node's regions that peers got
 * so far: each region gets a fresh MR (its key stays, its rkey changes),
 * every accepted queue pair is disconnected (its peer's operations in
 * flight are flushed and sent again on a new channel, whose accept hands
 * out the new rkeys), and the old MRs are deregistered after a grace
 * period (local operations still using their lkeys end first). All of it
 * runs on the listener's reactor; registration and deregistration, which
 * can take milliseconds on hardware, on its offload thread.
 */

static unsigned cfg_grace(const struct tp_node *tn)
{
	return tn->cfg.revoke_grace_ms ? tn->cfg.revoke_grace_ms : 10000;
}

static struct tp_node *rot_node(struct rx_offload *o)
{
	return (struct tp_node *)((char *)o - offsetof(struct tp_node, rot));
}

static void rot_work(struct rx_offload *o)
{
	struct tp_node *tn = rot_node(o);
	struct rrot *j = &tn->rot;
	for (unsigned i = 0; i < TP_REGIONS_MAX; i++)
		mrs_drop(tn, j->stale[i], 0);
	for (unsigned i = 0; j->fresh && i < TP_REGIONS_MAX; i++) {
		if (!j->regs[i].key)
			continue;
		const struct tp_region *r = &j->regs[i].r;
		int err = mrs_reg(tn, (void *)r->base, r->len,
				  access_of(r->access), j->regs[i].mr);
		if (err)
			PC_LOGW(LOG_MOD, "revoke: registering region %08x "
				"again failed (%s); it keeps its rkeys",
				j->regs[i].key, strerror(-err));
	}
}

static void rot_next(struct tp_node *tn);

/* Disconnect up to CLOSE_SLICE queue pairs accepted before the last
 * revoke; again next pass while some are left. Each is dropped on its
 * DISCONNECTED event. */
static void close_pass(struct rx_reactor *r, struct rx_timer *t)
{
	struct tp_node *tn = t->arg;
	unsigned n = 0;
	for (struct sconn *s = tn->sconns, *next; s; s = next) {
		next = s->next;
		if (s->closing || s->gen >= tn->revoke_gen)
			continue;
		if (n == CLOSE_SLICE) {
			rx_timer_start(r, t, 0, 0);
			return;
		}
		n++;
		s->closing = true;
		if (tn->api->disconnect(s->id))
			sconn_drop(tn, s); /* not connected: no event comes */
	}
}

static void rot_done(struct rx_reactor *r, struct rx_offload *o)
{
	struct tp_node *tn = rot_node(o);
	struct rrot *j = &tn->rot;
	tn->rot_busy = false;
	if (!j->fresh) {
		rot_next(tn);
		return;
	}
	unsigned swapped = 0, kept = 0, nspare = 0;
	struct ibv_mr **spare[TP_REGIONS_MAX];
	pthread_mutex_lock(&tn->lock);
	for (unsigned i = 0; i < TP_REGIONS_MAX; i++) {
		if (!j->regs[i].key)
			continue;
		struct rreg *g = reg_find(tn, j->regs[i].key);
		struct ibv_mr **mr = j->regs[i].mr;
		if (!mr[0]) {
			kept++;
		} else if (!g || g->old[0] || g->r.base != j->regs[i].r.base ||
			   g->r.len != j->regs[i].r.len) {
			spare[nspare++] = mr; /* withdrawn (or replaced) since */
		} else {
			memcpy(g->old, g->mr, sizeof(g->old));
			memcpy(g->mr, mr, sizeof(g->mr));
			memset(mr, 0, sizeof(j->regs[i].mr));
			swapped++;
		}
	}
	pthread_mutex_unlock(&tn->lock);
	for (unsigned i = 0; i < nspare; i++)
		mrs_drop(tn, spare[i], 0);
	/* Every peer connected so far knew the old rkeys: their queue pairs
	 * close, a slice a pass (close_pass). */
	tn->revoke_gen++;
	unsigned closed = 0;
	for (const struct sconn *s = tn->sconns; s; s = s->next)
		closed += !s->closing;
	close_pass(r, &tn->closer);
	STAT_ADD(tn, revokes, 1);
	PC_LOGI(LOG_MOD, "a member left (epoch %llu): peers' RDMA access "
		"revoked: %u region(s) have new rkeys%s, %u queue pair(s) "
		"closing (peers connect again); the old rkeys end in %u ms",
		(unsigned long long)j->epoch, swapped,
		kept ? ", some kept theirs (registration failed)" : "", closed,
		cfg_grace(tn));
	if (swapped && tn->rails[0].lid)
		rx_timer_start(r, &tn->grace, RX_MS(cfg_grace(tn)), 0);
	rot_next(tn);
}

/* Start what is due: a revoke asked for, or the old MRs' deregistration. */
static void rot_next(struct tp_node *tn)
{
	struct rrot *j = &tn->rot;
	if (tn->rot_busy || !tn->rails[0].lid)
		return;
	bool revoke = tn->rot_asked > j->epoch;
	if (!revoke && !tn->grace_due)
		return;
	memset(j->stale, 0, sizeof(j->stale));
	memset(j->regs, 0, sizeof(j->regs));
	j->fresh = revoke;
	if (revoke)
		j->epoch = tn->rot_asked;
	/* A revoke ends an earlier one's grace now: its old MRs go. */
	pthread_mutex_lock(&tn->lock);
	for (unsigned i = 0; i < TP_REGIONS_MAX; i++) {
		struct rreg *g = &tn->regs[i];
		if (!g->used)
			continue;
		memcpy(j->stale[i], g->old, sizeof(g->old));
		memset(g->old, 0, sizeof(g->old));
		if (revoke) {
			j->regs[i].key = g->key;
			j->regs[i].r = g->r;
		}
	}
	pthread_mutex_unlock(&tn->lock);
	tn->grace_due = false;
	rx_timer_stop(tn->lr, &tn->grace);
	j->o = (struct rx_offload){.work = rot_work, .done = rot_done};
	tn->rot_busy = true;
	if (rx_offload(tn->lr, &j->o) < 0) {
		/* No offload thread (or stopping): here, then. */
		rot_work(&j->o);
		rot_done(tn->lr, &j->o);
	}
}

static void grace_fire(struct rx_reactor *r, struct rx_timer *t)
{
	struct tp_node *tn = t->arg;
	(void)r;
	tn->grace_due = true;
	rot_next(tn);
}

/* On every reactor, for each departure; acts on the listener's, once per
 * epoch. */
static void rdma_revoke(struct tp_node *tn, struct rx_reactor *r,
			uint64_t epoch)
{
	if (r != __atomic_load_n(&tn->lr, __ATOMIC_ACQUIRE) ||
	    !tn->rails[0].lid ||
	    epoch <= tn->rot_asked)
		return;
	tn->rot_asked = epoch;
	rot_next(tn);
}

int tp_rdma_node_rail_rkey(struct tp_node *tn, unsigned rail, uint32_t key,
			   uint32_t *rkey)
{
	if (rail >= tn->nrails)
		return -ENOENT;
	pthread_mutex_lock(&tn->lock);
	struct rreg *g = reg_find(tn, key);
	if (g)
		*rkey = g->mr[rail]->rkey;
	pthread_mutex_unlock(&tn->lock);
	return g ? 0 : -ENOENT;
}

int tp_rdma_node_rkey(struct tp_node *tn, uint32_t key, uint32_t *rkey)
{
	return tp_rdma_node_rail_rkey(tn, 0, key, rkey);
}

unsigned tp_rdma_node_rails(const struct tp_node *tn)
{
	return tn->nrails;
}

const char *tp_rdma_node_rail_name(const struct tp_node *tn, unsigned k)
{
	return k < tn->nrails ? tn->rails[k].name : "";
}

/* --------------------------------------------------------------- node */

/*
 * What the QPs ask for, within the device's limits (queried once): the
 * send queue within max_qp_wr (and its CQ, one entry more, within
 * max_cqe); READs in flight within both max_qp_init_rd_atom (what a QP
 * may issue: connect's initiator_depth) and max_qp_rd_atom (what it may
 * serve: accept's responder_resources), one value for both roles since
 * a node is both. Said once if anything was cut.
 */
static void dev_limit(struct tp_node *tn, const struct ibv_device_attr *da)
{
	unsigned sq = cfg_sq(tn), rd = cfg_rd(tn);
	long sq_max = PC_MIN((long)da->max_qp_wr, (long)da->max_cqe - 1);
	/* dev_usable saw both READ limits >= 1 */
	long rd_max = PC_MIN(da->max_qp_rd_atom, da->max_qp_init_rd_atom);
	tn->cfg.sq_depth = (unsigned)PC_MAX(1, PC_MIN((long)sq, sq_max));
	tn->cfg.rd_atomic = (unsigned)PC_MIN((long)rd, rd_max);
	if (tn->cfg.sq_depth < sq || tn->cfg.rd_atomic < rd)
		PC_LOGW(LOG_MOD, "the device's limits cut what a queue pair "
			"asks for: send queue %u WRs (of %u; max_qp_wr %d, "
			"max_cqe %d), READs in flight %u (of %u; "
			"max_qp_rd_atom %d, max_qp_init_rd_atom %d)",
			tn->cfg.sq_depth, sq, da->max_qp_wr, da->max_cqe,
			tn->cfg.rd_atomic, rd, da->max_qp_rd_atom,
			da->max_qp_init_rd_atom);
}

/*
 * The address of each rail after the first (its device's network
 * device's, IPv4 else IPv6): a rail without one cannot be reached nor
 * connect from its own device, so it is left out (said).
 */
static void rails_addr(struct tp_node *tn)
{
	unsigned n = 1;
	for (unsigned k = 1; k < tn->nrails; k++) {
		struct rail *rl = &tn->rails[k];
		int err = tn->api->device_addr(rl->ctx, (uint8_t)tn->cfg.ib_port,
					       AF_INET, &rl->sa);
		if (err)
			err = tn->api->device_addr(rl->ctx,
						   (uint8_t)tn->cfg.ib_port,
						   AF_INET6, &rl->sa);
		if (err) {
			PC_LOGW(LOG_MOD, "rail %s: no network address found "
				"for port %u (%s); left out", rl->name,
				tn->cfg.ib_port, strerror(err));
			continue;
		}
		tn->rails[n++] = *rl;
	}
	for (unsigned k = n; k < tn->nrails; k++)
		tn->rails[k] = (struct rail){0};
	tn->nrails = n;
}

int tp_rdma_node_new(const struct tp_rdma_cfg *cfg, struct tp_node **out)
{
	struct tp_node *tn = calloc(1, sizeof(*tn));
	if (!tn)
		return -ENOMEM;
	tn->cfg = *cfg;
	tn->api = cfg->api;
	pthread_mutex_init(&tn->lock, NULL);
	rx_timer_init(&tn->grace, grace_fire, tn);
	rx_timer_init(&tn->closer, close_pass, tn);
	tn->device = strdup(cfg->device ? cfg->device : "");
	tn->devices = strdup(cfg->devices ? cfg->devices : "");
	tn->secret = cfg->secret && *cfg->secret ? strdup(cfg->secret) : NULL;
	tn->cfg.device = tn->device;
	tn->cfg.devices = tn->devices;
	tn->cfg.secret = tn->secret;
	if (!tn->device || !tn->devices ||
	    (cfg->secret && *cfg->secret && !tn->secret)) {
		tp_rdma_node_free(tn);
		return -ENOMEM;
	}
	char why[400];
	struct ibv_device_attr da;
	struct ibv_context *ctxs[RAILS_MAX];
	int n = dev_open(&tn->cfg, ctxs, RAILS_MAX, &da, why, sizeof(why));
	if (n <= 0) {
		PC_LOGE(LOG_MOD, "no usable RDMA device: %s", why);
		tp_rdma_node_free(tn);
		return -ENODEV;
	}
	tn->nrails = (unsigned)n;
	for (unsigned k = 0; k < tn->nrails; k++) {
		struct rail *rl = &tn->rails[k];
		rl->ctx = ctxs[k];
		snprintf(rl->name, sizeof(rl->name), "%s",
			 tn->api->get_device_name(ctxs[k]->device));
	}
	rails_addr(tn);
	dev_limit(tn, &da);
	for (unsigned k = 0; k < tn->nrails; k++) {
		struct rail *rl = &tn->rails[k];
		rl->tn = tn;
		rl->idx = k;
		if (!(rl->pd = tn->api->alloc_pd(rl->ctx))) {
			int err = neg_errno(-ENOMEM);
			tp_rdma_node_free(tn);
			return err;
		}
	}
	PC_LOGI(LOG_MOD, "RDMA device: %s (verbs: %s)%s", why, tn->api->name,
		tn->nrails > 1 ? "; a batch is striped over the rails" : "");
	*out = tn;
	return 0;
}

void tp_rdma_node_free(struct tp_node *tn)
{
	if (!tn)
		return;
	PC_ASSERT(tn->clients == 0);
	tp_rdma_node_unlisten(tn);
	for (unsigned i = 0; i < TP_REGIONS_MAX; i++)
		if (tn->regs[i].used)
			rdma_dereg(tn, tn->regs[i].key);
	for (unsigned i = 0; i < LOCAL_MAX; i++)
		if (tn->locals[i].base)
			mrs_drop(tn, tn->locals[i].mr, 0);
	for (unsigned k = 0; k < tn->nrails; k++)
		if (tn->rails[k].pd)
			tn->api->dealloc_pd(tn->rails[k].pd);
	pthread_mutex_destroy(&tn->lock);
	free(tn->device);
	free(tn->devices);
	if (tn->secret) {
		explicit_bzero(tn->secret, strlen(tn->secret));
		free(tn->secret);
	}
	free(tn);
}

void tp_rdma_node_stats(const struct tp_node *tn, struct tp_rdma_stats *out)
{
	const uint64_t *src = (const uint64_t *)&tn->st;
	uint64_t *dst = (uint64_t *)out;
	for (size_t i = 0; i < sizeof(*out) / sizeof(uint64_t); i++)
		dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}

/* ------------------------------------------------------------- client */

struct tp_client *tp_rdma_client_new(struct tp_node *tn, struct rx_reactor *r,
				     int *err)
{
	const struct rv_api *api = tn->api;
	struct tp_client *tc = calloc(1, sizeof(*tc));
	if (!tc) {
		*err = -ENOMEM;
		return NULL;
	}
	tc->tn = tn;
	tc->r = r;
	rx_timer_init(&tc->reaper, chan_reap, tc);
	rx_timer_init(&tc->sweep, op_sweep, tc);
	int ret = 0;
	for (unsigned k = 0; !ret && k < tn->nrails; k++) {
		tc->ccw[k] = (struct ccw){tc, k};
		if (!(tc->cch[k] = api->create_comp_channel(tn->rails[k].ctx)))
			ret = neg_errno(-ENOMEM);
		if (!ret)
			ret = set_nonblock(tc->cch[k]->fd);
		if (!ret)
			tc->cw[k] = rx_watch_fd(r, tc->cch[k]->fd, POLLIN,
						on_cq_event, &tc->ccw[k], &ret);
	}
	if (!ret && !(tc->ech = api->create_event_channel()))
		ret = neg_errno(-ENODEV);
	if (!ret)
		ret = set_nonblock(tc->ech->fd);
	if (!ret)
		tc->ew = rx_watch_fd(r, tc->ech->fd, POLLIN, on_cm_event, tc,
				     &ret);
	tn->clients++;
	if (ret < 0) {
		tp_rdma_client_free(tc);
		*err = ret;
		return NULL;
	}
	return tc;
}

/* Stop watching the client's channels (the loop must not wait for them). */
static void client_unwatch(struct tp_client *tc)
{
	for (unsigned k = 0; k < RAILS_MAX; k++)
		if (tc->cw[k]) {
			rx_watch_cancel(tc->cw[k]);
			tc->cw[k] = NULL;
		}
	if (tc->ew)
		rx_watch_cancel(tc->ew);
	tc->ew = NULL;
}

void tp_rdma_client_stop(struct tp_client *tc)
{
	tc->stopping = true;
	for (struct tp_peer *p = tc->peers; p; p = p->next)
		peer_fail(tc, p, -ESHUTDOWN);
	rx_timer_stop(tc->r, &tc->sweep);
	/* Nothing needs the channels' events any more. */
	client_unwatch(tc);
}

void tp_rdma_client_free(struct tp_client *tc)
{
	const struct rv_api *api = tc->tn->api;
	PC_ASSERT(tc->batches == NULL);
	tc->stopping = true;
	for (struct tp_peer *p = tc->peers; p; p = p->next)
		peer_fail(tc, p, -ESHUTDOWN);
	rx_timer_stop(tc->r, &tc->reaper);
	rx_timer_stop(tc->r, &tc->sweep);
	client_unwatch(tc);
	/* Ack what is queued so that no id waits on an event. */
	struct rdma_cm_event *ev;
	while (tc->ech && api->get_cm_event(tc->ech, &ev) == 0)
		api->ack_cm_event(ev);
	for (unsigned k = 0; k < RAILS_MAX; k++) {
		struct ibv_cq *cq;
		void *ctx;
		while (tc->cch[k] &&
		       api->get_cq_event(tc->cch[k], &cq, &ctx) == 0)
			api->ack_cq_events(cq, 1);
	}
	chan_reap(tc->r, &tc->reaper);
	while (tc->peers) {
		struct tp_peer *p = tc->peers;
		tc->peers = p->next;
		free(p);
	}
	if (tc->ech)
		api->destroy_event_channel(tc->ech);
	for (unsigned k = 0; k < RAILS_MAX; k++)
		if (tc->cch[k])
			api->destroy_comp_channel(tc->cch[k]);
	tc->tn->clients--;
	free(tc);
}

/* ------------------------------------------------------------- tp_ops */

static int batch_start(struct tp_client *tc, bool write, void *opsv,
		       unsigned n, unsigned timeout_ms, tp_done_fn rdone,
		       tp_wdone_fn wdone, void *arg)
{
	if (n == 0)
		return -EINVAL;
	struct rbatch *b = calloc(1, sizeof(*b) + n * sizeof(b->ops[0]));
	if (!b)
		return -ENOMEM;
	b->tc = tc;
	tp_bcore_link(&b->c, &tc->batches, write, opsv, n, arg, batch_fire);
	b->c.rdone = rdone;
	b->c.wdone = wdone;
	/* The timer first: an operation that ends at once re-arms it. */
	rx_timer_start(tc->r, &b->c.timer, RX_MS(timeout_ms), 0);
	for (unsigned i = 0; i < n; i++) {
		struct tp_io io;
		tp_bcore_io(&b->c, i, &io);
		struct rop *o = &b->ops[i];
		*o = (struct rop){.b = b, .write = write, .key = io.rkey,
				  .addr = io.addr, .len = io.len,
				  .hdr_len = io.hdr_len, .hdr = io.hdr,
				  .buf = io.buf, .res = io.res, .lk_dev = -1};
		int err = tp_io_check(io.len, io.hdr_len, io.hdr, io.buf);
		if (!err && tc->stopping)
			err = -ESHUTDOWN;
		if (!err) {
			o->p = io.ph ? io.ph : peer_get(tc, io.peer, io.node);
			if (!o->p)
				err = -ENOMEM;
		}
		/* The lkeys of the rail it will go on are found when it is
		 * posted (chan_pump); rail 0's now, as most go there and a
		 * buffer that cannot be registered fails before placing. */
		if (!err)
			err = op_lkeys(o, 0);
		if (err) {
			o->p = NULL;
			op_end(o, err);
			continue;
		}
		o->p->inflight++;
		op_place(tc, o, true);
	}
	return 0;
}

static int rdma_read_batch(struct tp_client *tc, struct tp_read *reads,
			   unsigned n, unsigned timeout_ms, tp_done_fn done,
			   void *arg)
{
	return batch_start(tc, false, reads, n, timeout_ms, done, NULL, arg);
}

static int rdma_write_batch(struct tp_client *tc, struct tp_write *writes,
			    unsigned n, unsigned timeout_ms, tp_wdone_fn done,
			    void *arg)
{
	return batch_start(tc, true, writes, n, timeout_ms, NULL, done, arg);
}

static int rdma_cancel(struct tp_client *tc, void *arg)
{
	int count = 0;
	for (struct tp_bcore *bc = tc->batches; bc; bc = bc->next) {
		if (bc->arg != arg || bc->cancelled || !bc->left)
			continue;
		bc->cancelled = true;
		count++;
		batch_abort((struct rbatch *)bc, -ECANCELED);
	}
	return count;
}

static int rdma_peer_open(struct tp_client *tc, const char *endpoint,
			  const char *node, struct tp_peer **out)
{
	if (!*endpoint)
		return -EINVAL;
	struct tp_peer *p = peer_get(tc, endpoint, node);
	if (!p)
		return -ENOMEM;
	if (p->sa_err)
		return p->sa_err;
	p->refs++;
	*out = p;
	return 0;
}

static int rdma_peer_health(struct tp_client *tc, struct tp_peer *p,
			    struct tp_peer_info *out)
{
	(void)tc;
	struct tp_peer_info i = {TP_PEER_IDLE, p->last_err, p->nchans,
				 p->inflight, p->refs};
	bool ready = false;
	for (struct rchan *ch = p->chans; ch; ch = ch->next)
		ready |= ch->state == CH_READY;
	if (ready || p->up)
		i.state = TP_PEER_UP;
	else if (p->last_err)
		i.state = TP_PEER_FAILED;
	if (out)
		*out = i;
	return i.state;
}

static void rdma_peer_close(struct tp_client *tc, struct tp_peer *p, int err)
{
	PC_ASSERT(p->refs > 0);
	p->refs--;
	peer_fail(tc, p, err ? err : -EHOSTDOWN);
}

static void rdma_fail_node(struct tp_client *tc, const char *node, int err)
{
	for (struct tp_peer *p = tc->peers; p; p = p->next)
		if (strcmp(p->node, node) == 0)
			peer_fail(tc, p, err);
}

const struct tp_ops tp_rdma_ops = {
	.name = "rdma",
	.reg_region = rdma_reg,
	.dereg_region = rdma_dereg,
	.reg_local = tp_rdma_reg_local,
	.unreg_local = tp_rdma_unreg_local,
	.read_batch = rdma_read_batch,
	.write_batch = rdma_write_batch,
	.cancel = rdma_cancel,
	.peer_open = rdma_peer_open,
	.peer_health = rdma_peer_health,
	.peer_close = rdma_peer_close,
	.fail_node = rdma_fail_node,
	.revoke = rdma_revoke,
};
