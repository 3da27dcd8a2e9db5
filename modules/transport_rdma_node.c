/*
 * modules/transport_rdma_node.c — the RDMA node (transport_rdma.h): what
 * peers reach.
 *
 * Owns: struct tp_node: its rails (a device context and PD each), the
 * region table with one MR per region and rail, local registrations, the
 * rdma_cm listeners and the queue pairs they accepted, the replay cache of
 * connect proofs, the device events and revokes; and the connect proofs
 * both sides make. The client is transport_rdma.c.
 */
#include "modules/transport_rdma_int.h"

#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/endpoint.h"
#include "common/log.h"
#include "common/util.h"

#define LOG_MOD "rdma"

/* ---------------------------------------------------------- the proofs */

/* "ip:port" of sa, numerically: what both sides put in the proofs for the
 * address the client dialed (the node reads it off the request). */
void tp_rdma_sa_text(const struct sockaddr *sa, char *out, size_t len)
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

void tp_rdma_proof(const char *secret, bool server, uint64_t ts,
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
int tp_rdma_rail_of(const struct tp_node *tn, const struct ibv_context *ctx)
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

int tp_rdma_reg_region(struct tp_node *tn, const struct tp_region *region,
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

int tp_rdma_dereg_region(struct tp_node *tn, uint32_t key)
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

/* The lkey, on rail dev, of an MR of the node's tables covering
 * [p, p+len), or 0. */
uint32_t tp_rdma_table_lkey(struct tp_node *tn, unsigned dev, const void *p,
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
	tp_rdma_sa_text(&ev->id->route.addr.src_addr, at, sizeof(at));
	tp_rdma_proof(tn->secret, false, h->ts_ms, h->nonce, at, want);
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
	/* tp_rdma_reg_region keeps keys and tail within the body */
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
	int rail = tp_rdma_rail_of(tn, id->verbs);
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
		tp_rdma_sa_text(&id->route.addr.src_addr, at, sizeof(at));
		if (tn->secret)
			tp_rdma_proof(tn->secret, true, h->ts_ms, h->nonce, at,
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
		tp_rdma_sa_text((const struct sockaddr *)&rl->sa, at, sizeof(at));
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
	if (h.n && !tn->tail_len)
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
		tp_rdma_cq_destroy(tn, &rl->scq);
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
void tp_rdma_revoke(struct tp_node *tn, struct rx_reactor *r,
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
			tp_rdma_dereg_region(tn, tn->regs[i].key);
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
