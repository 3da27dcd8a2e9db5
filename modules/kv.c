/*
 * modules/kv.c — p2p mode's pages (module "kv"): the publish pool and the
 * kv.* RPC methods (set, get, exists, delete) for clients that carry values
 * inline (operators, tests, other languages).
 *
 * Owns: the publish pool (storage/pool.c), registered once with the
 * transport as a region peers may read; the per-reactor queue of directory
 * deletions that evictions cause; the read/write metrics under the original
 * PeerCache names. Threads: handlers run on the reactor that received the
 * call, and every asynchronous step (directory lookup, remote read) comes
 * back to that reactor; the pool is striped for concurrent use.
 *
 * Paths and copies (DESIGN §5):
 *   set  — one memcpy from the request into the pool, then the record goes
 *          to the key's directory owners. A key already in the pool counts
 *          as stored (idempotent set).
 *   get  — a page in this node's pool is one memcpy, no directory and no
 *          network; otherwise directory lookup, then one read straight into
 *          the result buffer. Every remotely read page is validated (key
 *          hash, generation, length, checksum unless page_checksums=false)
 *          and a page that fails is a miss, counted.
 * (Values travel inline in the RPC messages here, so the reply adds a copy;
 * local clients avoid that through shared memory.)
 *
 * Staging (kv.get only: it copies pages into buffers of its own before the
 * reply is packed): a call may stage at most what its reply may carry
 * (g.get_call_max), and all calls together at most kv_staging_max
 * (g.staged, an atomic counter). Bytes are taken before each buffer is
 * allocated and given back when the call is freed; the first refusal ends
 * the call's staging and it is answered with too_large or busy. Every kv.*
 * RPC call also holds its per-key state (KV_KEY_STATE) in g.staged from
 * its start to its reply (struct kv_call).
 *
 * Deadlines and frozen peers: every set, get, exists and delete (kv.* and
 * the sessions' calls alike) gets one budget, request_deadline, from its
 * start. The directory round trips and the data reads share it — a read
 * gets what the lookup left, never a timeout of its own on top — so a call
 * touching a peer that stopped answering returns within the budget. A page
 * whose producer is suspect (ctx->svc.health) is a miss at once, and exists
 * does not count it; a read that gets no answer reports its producer.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checksum.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "common/guard.h"
#include "modules/copier.h"
#include "modules/directory.h"
#include "modules/kv.h"
#include "modules/modules.h"
#include "modules/peer_health.h"
#include "modules/transport.h"
#include "rpc/rpc.h"
#include "storage/pool.h"
#include "storage/ring.h"

#define LOG_MOD "kv"
#define KV_BATCH_MAX 65536
#define KV_KEY_MAX DIR_KEY_MAX

/* Evictions waiting to be removed from the directory, per reactor. */
struct evq {
	struct rx_reactor *r;
	bool stopped;       /* shutting down: evictions are not withdrawn */
	char **keys;
	size_t *klens;
	uint64_t *gens;
	unsigned n, cap;
	struct rx_timer flush;
};

static struct {
	struct pc_ctx *ctx;
	struct pool *pool;
	struct evq *evqs;           /* per reactor */
	bool checksums;
	uint32_t rkey;              /* the pool's, for the records */
	/* kv.get staging (the reply is built from buffers of the node's own) */
	uint64_t get_call_max;      /* reply bytes one kv.get may build */
	const char *get_call_limit; /* the setting that sets get_call_max */
	uint64_t staging_max;       /* kv_staging_max: all kv.get calls */
	uint64_t staged;            /* atomic: bytes staged now */
	met_id refused_large, refused_busy;
	unsigned read_timeout_ms;   /* rpc_timeout: a read never waits longer */
	uint64_t deadline_ns;       /* request_deadline */
	met_id deadline_hit, rd_suspect;
	met_id rd_req, rd_hit, rd_miss, rd_local, rd_remote, rd_bytes, rd_fail;
	met_id wr_req, wr_pages, wr_bytes, ex_req, ex_found, del_req;
	met_id lat_read, lat_write, ev_pub;
	met_id copy_set, copy_get_local, copy_reply, landed;
} g;

/* This reactor's queue (set by kv_start on each reactor thread), where
 * evictions caused by its own reserves go. */
static _Thread_local struct evq *t_evq;

/* ------------------------------------------------------------- evictions */

static void evq_sent(void *arg)
{
	struct evq *batch = arg;
	for (unsigned i = 0; i < batch->n; i++)
		free(batch->keys[i]);
	free(batch->keys);
	free(batch->klens);
	free(batch->gens);
	free(batch);
}

/* Send what evictions queued: one conditional remove per batch. */
static void evq_flush(struct rx_reactor *r, struct rx_timer *t)
{
	struct evq *q = t->arg;
	if (!q->n || !g.ctx->svc.dir)
		return;
	struct evq *b = malloc(sizeof(*b));
	if (!b)
		return; /* retried at the next eviction */
	*b = *q;
	q->keys = NULL;
	q->klens = NULL;
	q->gens = NULL;
	q->n = q->cap = 0;
	struct dir_keys k = {(const char *const *)b->keys, b->klens, b->n};
	if (g.ctx->svc.dir->remove(r, &k, g.ctx->svc.self_id, b->gens, NULL, 0,
				   evq_sent, b) < 0)
		evq_sent(b);
}

/* Pool eviction: the record must go (only if it still names this gen). */
static void on_evict(void *arg, const char *key, size_t klen, uint64_t gen)
{
	(void)arg;
	struct evq *q = t_evq;
	if (!q || q->stopped || klen > KV_KEY_MAX)
		return;
	if (q->n == q->cap) {
		unsigned cap = q->cap ? q->cap * 2 : 64;
		char **k = realloc(q->keys, cap * sizeof(*k));
		if (k)
			q->keys = k;
		size_t *l = realloc(q->klens, cap * sizeof(*l));
		if (l)
			q->klens = l;
		uint64_t *gs = realloc(q->gens, cap * sizeof(*gs));
		if (gs)
			q->gens = gs;
		if (!k || !l || !gs)
			return; /* the stale record stays: reads of it miss */
		q->cap = cap;
	}
	char *copy = malloc(klen);
	if (!copy)
		return;
	memcpy(copy, key, klen);
	q->keys[q->n] = copy;
	q->klens[q->n] = klen;
	q->gens[q->n++] = gen;
	met_inc(g.ev_pub);
	if (!rx_timer_armed(&q->flush))
		rx_timer_start(q->r, &q->flush, 0, 0);
}

/* ------------------------------------------------------------------ keys */

struct keys {
	unsigned n;
	char **k;
	size_t *len;
};

static void keys_free(struct keys *ks)
{
	for (unsigned i = 0; ks->k && i < ks->n; i++)
		free(ks->k[i]);
	free(ks->k);
	free(ks->len);
	memset(ks, 0, sizeof(*ks));
}

static int keys_alloc(struct keys *ks, unsigned n)
{
	memset(ks, 0, sizeof(*ks));
	ks->k = calloc(n ? n : 1, sizeof(*ks->k));
	ks->len = calloc(n ? n : 1, sizeof(*ks->len));
	if (!ks->k || !ks->len) {
		keys_free(ks);
		return -ENOMEM;
	}
	return 0;
}

static int keys_add(struct keys *ks, const char *k, size_t len)
{
	if (len == 0 || len > KV_KEY_MAX || !(ks->k[ks->n] = malloc(len)))
		return -EINVAL;
	memcpy(ks->k[ks->n], k, len);
	ks->len[ks->n++] = len;
	return 0;
}

/* Copy [key, ...] out of a request (async work outlives its buffer). */
static int keys_read(struct mp_rd *p, struct keys *ks)
{
	uint32_t n;
	if (mp_rd_array(p, &n) < 0 || n == 0 || n > KV_BATCH_MAX ||
	    keys_alloc(ks, n) < 0)
		return -EINVAL;
	for (uint32_t i = 0; i < n; i++) {
		const char *s;
		uint32_t len;
		if (mp_rd_str(p, &s, &len) < 0 || keys_add(ks, s, len) < 0) {
			keys_free(ks);
			return -EINVAL;
		}
	}
	return 0;
}

static int keys_of_items(struct keys *ks, const struct kv_item *it,
			 unsigned n)
{
	if (n == 0 || n > KV_BATCH_MAX || keys_alloc(ks, n) < 0)
		return -EINVAL;
	for (unsigned i = 0; i < n; i++)
		if (keys_add(ks, it[i].key, it[i].klen) < 0) {
			keys_free(ks);
			return -EINVAL;
		}
	return 0;
}

static const char keys_help[] = "keys: an array of 1..65536 strings of "
				"1..512 bytes";

static struct dir_keys dir_keys_of(const struct keys *ks, unsigned from)
{
	return (struct dir_keys){(const char *const *)ks->k + from,
				 ks->len + from, ks->n - from};
}

/* ------------------------------------------------------------ deadlines */

/* The deadline of a call starting now (pc_now_ns() clock). */
static uint64_t op_deadline(void)
{
	return pc_now_ns() + g.deadline_ns;
}

/* At the end of a call: count it when it ran into its deadline (within a
 * millisecond: the steps' timeouts are whole milliseconds). */
static void op_end(uint64_t deadline_ns)
{
	if (pc_now_ns() + RX_MS(1) >= deadline_ns)
		met_inc(g.deadline_hit);
}

/* Is the producer of a record suspect (not answering)? */
static bool producer_suspect(const struct dir_rec *r)
{
	const struct ph_api *h = g.ctx->svc.health;
	return h && h->suspect(r->node);
}

/* -------------------------------------------------------------- publish */

struct publish {
	unsigned n;
	bool *ok;
	struct dir_rec *recs;
	bool *pub_ok;       /* per record: an owner stored it */
	unsigned *pub_idx;  /* record -> item index */
	unsigned npub;
	kv_done_fn done;
	void *arg;
	uint64_t t0;
	uint64_t deadline;
	/* copying (client memory: in slices, modules/copier.h) */
	struct rx_reactor *r;
	const struct kv_item *it; /* the caller's, valid until done */
	bool client_mem;
	unsigned cur;       /* next item to copy */
	const char **pk;    /* keys of the records */
	size_t *pl;
	struct pool_ref ref; /* the reservation being copied into */
	struct copier_job job;
};

static void publish_finish(struct publish *p)
{
	for (unsigned i = 0; i < p->npub; i++)
		p->ok[p->pub_idx[i]] = p->pub_ok[i];
	met_observe_ns(g.lat_write, pc_now_ns() - p->t0);
	op_end(p->deadline);
	p->done(p->arg, p->ok, p->n);
	free(p->ok);
	free(p->recs);
	free(p->pub_ok);
	free(p->pub_idx);
	free(p->pk);
	free(p->pl);
	free(p);
}

static void publish_published(void *arg)
{
	publish_finish(arg);
}

/* The page of it is in the pool (sum: its checksum when have_sum): commit
 * it and fill the record for the directory. */
static bool publish_commit(const struct kv_item *it, struct pool_ref *ref,
			   bool have_sum, uint64_t sum, struct dir_rec *r)
{
	uint64_t gen;
	uintptr_t addr;
	if ((have_sum ? pool_commit_sum(g.pool, ref, g.checksums, sum, &gen,
					&addr)
		      : pool_commit(g.pool, ref, g.checksums, &gen, &addr)) < 0)
		return false;
	met_add(g.copy_set, it->len);
	met_inc(g.wr_pages);
	met_add(g.wr_bytes, it->len);
	r->found = true;
	r->resident = true;
	snprintf(r->node, sizeof(r->node), "%s", g.ctx->svc.self_id);
	snprintf(r->data, sizeof(r->data), "%s", g.ctx->svc.self_data);
	r->addr = addr;
	r->len = (uint32_t)it->len;
	r->gen = gen;
	r->rkey = g.rkey;
	return true;
}

/* The copy of item p->cur ended (j->res): commit or give the space back. */
static void publish_settle(struct publish *p)
{
	const struct kv_item *it = &p->it[p->cur];
	if (p->job.res < 0) {
		pool_abort(g.pool, &p->ref);
	} else if (publish_commit(it, &p->ref, true, p->job.sumv,
				  &p->recs[p->npub])) {
		p->pk[p->npub] = it->key;
		p->pl[p->npub] = it->klen;
		p->pub_idx[p->npub++] = p->cur;
	}
}

static void publish_next(struct publish *p);

static void publish_copied(struct copier_job *j)
{
	struct publish *p = j->arg;
	publish_settle(p);
	p->cur++;
	publish_next(p);
}

/* Copy the items from p->cur on into the pool — request bytes at once,
 * client memory in slices (a job left under way resumes here through
 * publish_copied) — then send the records to the directory. */
static void publish_next(struct publish *p)
{
	for (; p->cur < p->n; p->cur++) {
		const struct kv_item *it = &p->it[p->cur];
		uint8_t *dst;
		if (it->klen == 0 || it->klen > KV_KEY_MAX)
			continue;
		if (pool_contains(g.pool, it->key, it->klen)) {
			p->ok[p->cur] = true; /* idempotent: already published */
			continue;
		}
		if (it->len == 0 || it->len > UINT32_MAX ||
		    pool_reserve(g.pool, it->key, it->klen, it->len, &p->ref,
				 &dst) < 0)
			continue;
		if (!p->client_mem) {
			memcpy(dst, it->data, it->len);
			if (!publish_commit(it, &p->ref, false, 0,
					    &p->recs[p->npub]))
				continue;
			p->pk[p->npub] = it->key;
			p->pl[p->npub] = it->klen;
			p->pub_idx[p->npub++] = p->cur;
			continue;
		}
		p->job = (struct copier_job){
			.dst = dst, .src = it->data, .len = it->len,
			.guarded = true, .sum = g.checksums,
			.done = publish_copied, .arg = p};
		if (copier_copy(p->r, &p->job) == 0)
			return; /* resumes in publish_copied */
		publish_settle(p);
	}
	struct dir_keys k = {p->pk, p->pl, p->npub};
	/* The directory copies the keys; the sources are free to go now. */
	if (p->npub == 0 ||
	    g.ctx->svc.dir->publish(p->r, &k, p->recs, p->pub_ok, p->deadline,
				    publish_published, p) < 0) {
		memset(p->pub_ok, 0, p->n * sizeof(bool));
		publish_finish(p); /* callers of publish accept an early done */
	}
}

static int kv_publish(struct rx_reactor *rr, const struct kv_item *it,
		      unsigned n, bool client_mem, kv_done_fn done, void *arg)
{
	if (n == 0 || n > KV_BATCH_MAX)
		return -EINVAL;
	struct publish *p = calloc(1, sizeof(*p));
	if (p) {
		p->ok = calloc(n, sizeof(bool));
		p->recs = calloc(n, sizeof(*p->recs));
		p->pub_ok = calloc(n, sizeof(bool));
		p->pub_idx = calloc(n, sizeof(unsigned));
		p->pk = calloc(n, sizeof(*p->pk));
		p->pl = calloc(n, sizeof(*p->pl));
	}
	if (!p || !p->ok || !p->recs || !p->pub_ok || !p->pub_idx || !p->pk ||
	    !p->pl) {
		if (p) {
			free(p->ok);
			free(p->recs);
			free(p->pub_ok);
			free(p->pub_idx);
			free(p->pk);
			free(p->pl);
		}
		free(p);
		return -ENOMEM;
	}
	p->n = n;
	p->done = done;
	p->arg = arg;
	p->t0 = pc_now_ns();
	p->deadline = op_deadline();
	p->r = rr;
	p->it = it;
	p->client_mem = client_mem;
	met_inc(g.wr_req);
	publish_next(p);
	return 0;
}

/* ---------------------------------------------------------------- fetch */

struct fetch {
	struct rx_reactor *r;
	unsigned n;
	struct keys ks;
	void **dst;          /* destinations; NULL entries: allocate */
	uint8_t **own;       /* allocated payloads */
	uint64_t *want;      /* wanted length; 0 = any */
	uint64_t *len;       /* the page's length when ok */
	bool *ok;
	bool client_mem;
	uint8_t (*hdr)[POOL_HDR_BYTES]; /* remote pages' headers */
	struct dir_rec *recs;
	unsigned *ridx;      /* record -> item */
	unsigned nrec;
	struct tp_read *reads;
	unsigned *readr;     /* read -> record */
	unsigned nreads;
	void (*done)(void *arg, struct fetch *f);
	void *arg;
	uint64_t t0;
	uint64_t staged;     /* bytes of own[] taken from the node's budget */
	int refused;         /* -E2BIG (call over its cap), -EBUSY (node) */
	uint64_t deadline;
	unsigned read_ms;    /* the reads' timeout */
	unsigned cur;        /* next item to look for in the pool */
	struct pool_ref ref; /* the local page being copied (pinned) */
	struct copier_job job;
};

static void fetch_free(struct fetch *f)
{
	for (unsigned i = 0; f->own && i < f->n; i++)
		free(f->own[i]);
	if (f->staged)
		__atomic_sub_fetch(&g.staged, f->staged, __ATOMIC_RELAXED);
	keys_free(&f->ks);
	free(f->dst);
	free(f->own);
	free(f->want);
	free(f->len);
	free(f->ok);
	free(f->hdr);
	free(f->recs);
	free(f->ridx);
	free(f->reads);
	free(f->readr);
	free(f);
}

static void fetch_finish(struct fetch *f)
{
	unsigned hits = 0;
	for (unsigned i = 0; i < f->n; i++)
		hits += f->ok[i];
	met_add(g.rd_hit, hits);
	met_add(g.rd_miss, f->n - hits);
	met_observe_ns(g.lat_read, pc_now_ns() - f->t0);
	if (f->nrec)
		op_end(f->deadline); /* all local: no deadline to run into */
	f->done(f->arg, f);
	fetch_free(f);
}

/* Reply bytes besides the pages: the envelope, the array header and one
 * bin header (or nil) per key. */
static uint64_t get_reply_overhead(unsigned n)
{
	return 32 + 5 * (uint64_t)n;
}

/*
 * Take len bytes of staging for a page the call must hold itself (kv.get):
 * within the call's cap (a reply must fit one message) and the node's
 * kv_staging_max. The first refusal sticks: nothing more is staged, and
 * the call is answered with the error instead of pages.
 */
static int stage_take(struct fetch *f, uint64_t len)
{
	if (f->refused)
		return f->refused;
	if (f->staged + len + get_reply_overhead(f->n) > g.get_call_max) {
		f->refused = -E2BIG;
		return f->refused;
	}
	uint64_t now = __atomic_add_fetch(&g.staged, len, __ATOMIC_RELAXED);
	if (now > g.staging_max) {
		__atomic_sub_fetch(&g.staged, len, __ATOMIC_RELAXED);
		f->refused = -EBUSY;
		return f->refused;
	}
	f->staged += len;
	return 0;
}

/* Where item i's payload of len bytes goes; NULL when it cannot. */
static void *fetch_dest(struct fetch *f, unsigned i, uint64_t len)
{
	if (f->want[i] && f->want[i] != len)
		return NULL; /* a page of another size is a miss */
	if (f->dst[i])
		return f->dst[i];
	if (stage_take(f, len) < 0)
		return NULL;
	f->own[i] = malloc(len ? len : 1);
	return f->own[i];
}

struct sum_args {
	const void *p;
	size_t n;
	uint64_t out;
};

static void do_sum(void *arg)
{
	struct sum_args *a = arg;
	a->out = pc_page_sum(a->p, a->n);
}

/* XXH3 of client memory, guarded against the client shrinking it. */
static int guarded_sum(const void *p, size_t n, uint64_t *out)
{
	struct sum_args a = {p, n, 0};
	int ret = pc_guarded_run(do_sum, &a);
	*out = a.out;
	return ret;
}

static void fetch_read_done(void *arg, struct tp_read *reads, unsigned n)
{
	struct fetch *f = arg;
	for (unsigned j = 0; j < n; j++) {
		unsigned ri = f->readr[j];
		struct dir_rec *r = &f->recs[ri];
		unsigned i = f->ridx[ri];
		int bad = reads[j].res;
		if (!bad) {
			uint64_t hi, lo;
			pool_key_hash(f->ks.k[i], f->ks.len[i], &hi, &lo);
			bad = pool_hdr_check_split(
				f->hdr[i], reads[j].dst, r->len, hi, lo, r->gen,
				r->len, g.checksums,
				f->client_mem ? guarded_sum : NULL);
		}
		if (bad) {
			met_inc(g.rd_fail);
			PC_LOGD(LOG_MOD, "remote page from %s failed: %s",
				r->data, strerror(-bad));
			if (reads[j].res && g.ctx->svc.health &&
			    (reads[j].res != -ETIMEDOUT ||
			     f->read_ms >= PH_EVIDENCE_MS))
				g.ctx->svc.health->failed(r->node, reads[j].res,
							  "data read");
			continue;
		}
		f->ok[i] = true;
		f->len[i] = r->len;
		met_inc(g.rd_remote);
		met_add(g.landed, r->len);
	}
	fetch_finish(f);
}

static void fetch_looked_up(void *arg)
{
	struct fetch *f = arg;
	f->reads = calloc(f->nrec, sizeof(*f->reads));
	f->readr = calloc(f->nrec, sizeof(*f->readr));
	if (!f->reads || !f->readr) {
		fetch_finish(f);
		return;
	}
	/* The reads get what the lookup left of the budget. */
	uint64_t now = pc_now_ns();
	uint64_t left_ms = now < f->deadline ? (f->deadline - now) / 1000000u
					     : 0;
	for (unsigned j = 0; j < f->nrec && left_ms; j++) {
		struct dir_rec *r = &f->recs[j];
		unsigned i = f->ridx[j];
		/* Our own record but no page here: evicted since. No disk
		 * tier yet, so a non-resident record is a miss too. */
		if (!r->found || !r->resident ||
		    strcmp(r->node, g.ctx->svc.self_id) == 0)
			continue;
		if (producer_suspect(r)) { /* not answering: a miss now */
			met_inc(g.rd_suspect);
			continue;
		}
		void *dst = fetch_dest(f, i, r->len);
		if (!dst)
			continue;
		struct tp_read *rd = &f->reads[f->nreads];
		snprintf(rd->peer, sizeof(rd->peer), "%s", r->data);
		rd->rkey = r->rkey;
		rd->addr = r->addr;
		rd->len = POOL_HDR_BYTES + r->len;
		rd->hdr = f->hdr[i];
		rd->hdr_len = POOL_HDR_BYTES;
		rd->dst = dst; /* the payload lands here: no copy */
		rd->node = r->node; /* f->recs outlive the batch */
		f->readr[f->nreads++] = j;
	}
	f->read_ms = (unsigned)PC_MIN(left_ms, (uint64_t)g.read_timeout_ms);
	if (f->nreads == 0 || f->refused ||
	    g.ctx->svc.tp->read_batch(g.ctx->svc.tp_clients[rx_reactor_id(f->r)],
				      f->reads, f->nreads, f->read_ms,
				      fetch_read_done, f) < 0)
		fetch_finish(f);
}

/* The copy of local page f->cur (pinned in f->ref) ended. */
static void fetch_settle(struct fetch *f)
{
	unsigned i = f->cur;
	if (f->job.res == 0) {
		f->ok[i] = true;
		f->len[i] = f->job.len;
		met_inc(g.rd_local);
		met_add(g.copy_get_local, f->job.len);
	}
	pool_unpin(g.pool, &f->ref);
}

static void fetch_locals(struct fetch *f);

static void fetch_copied(struct copier_job *j)
{
	struct fetch *f = j->arg;
	fetch_settle(f);
	f->cur++;
	fetch_locals(f);
}

/* Look up what is not here; then the reads (fetch_looked_up). */
static void fetch_lookup(struct fetch *f)
{
	const char **lk = calloc(f->n, sizeof(*lk));
	size_t *ll = calloc(f->n, sizeof(*ll));
	for (unsigned i = 0; lk && ll && i < f->n; i++) {
		if (f->ok[i])
			continue; /* local: no directory, no network */
		lk[f->nrec] = f->ks.k[i];
		ll[f->nrec] = f->ks.len[i];
		f->ridx[f->nrec++] = i;
	}
	struct dir_keys k = {lk, ll, f->nrec};
	/* Nothing is looked up for a call already refused its staging. */
	int ret = lk && ll && f->nrec && !f->refused
			  ? g.ctx->svc.dir->lookup(f->r, &k, f->recs,
						   f->deadline, fetch_looked_up,
						   f)
			  : -ENOENT;
	free(lk);
	free(ll);
	if (ret < 0)
		fetch_finish(f); /* done runs now: callers accept that */
}

/* Copy the pages this node holds, from f->cur on — request buffers at
 * once, client memory in slices (resuming in fetch_copied) — then look
 * the others up. */
static void fetch_locals(struct fetch *f)
{
	for (; f->cur < f->n; f->cur++) {
		unsigned i = f->cur;
		const uint8_t *hdr;
		uint64_t len, gen;
		if (pool_get(g.pool, f->ks.k[i], f->ks.len[i], &f->ref, &hdr,
			     &len, &gen) < 0)
			continue;
		void *dst = fetch_dest(f, i, len);
		f->job = (struct copier_job){
			.dst = dst, .src = hdr + POOL_HDR_BYTES, .len = len,
			.guarded = true, .done = fetch_copied, .arg = f};
		if (!dst) {
			f->job.res = -ENOENT;
		} else if (!f->client_mem) {
			memcpy(dst, hdr + POOL_HDR_BYTES, len);
		} else if (copier_copy(f->r, &f->job) == 0) {
			return; /* resumes in fetch_copied */
		}
		fetch_settle(f);
	}
	fetch_lookup(f);
}

/* dst/want NULL: allocate and accept any length (kv.get). */
static int fetch_start(struct rx_reactor *r, struct keys *ks, void **dst,
		       const uint64_t *want, bool client_mem,
		       void (*done)(void *arg, struct fetch *f), void *arg)
{
	unsigned n = ks->n;
	struct fetch *f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->r = r;
	f->n = n;
	f->ks = *ks; /* takes the keys */
	memset(ks, 0, sizeof(*ks));
	f->client_mem = client_mem;
	f->done = done;
	f->arg = arg;
	f->t0 = pc_now_ns();
	f->deadline = op_deadline();
	f->dst = calloc(n, sizeof(*f->dst));
	f->own = calloc(n, sizeof(*f->own));
	f->want = calloc(n, sizeof(*f->want));
	f->len = calloc(n, sizeof(*f->len));
	f->ok = calloc(n, sizeof(*f->ok));
	f->hdr = calloc(n, sizeof(*f->hdr));
	f->recs = calloc(n, sizeof(*f->recs));
	f->ridx = calloc(n, sizeof(*f->ridx));
	if (!f->dst || !f->own || !f->want || !f->len || !f->ok || !f->hdr ||
	    !f->recs || !f->ridx) {
		fetch_free(f);
		return -ENOMEM;
	}
	if (dst)
		memcpy(f->dst, dst, n * sizeof(*dst));
	if (want)
		memcpy(f->want, want, n * sizeof(*want));
	met_add(g.rd_req, n);
	fetch_locals(f);
	return 0;
}

struct api_call {
	kv_done_fn done;
	void *arg;
};

static void api_fetched(void *arg, struct fetch *f)
{
	struct api_call c = *(struct api_call *)arg;
	free(arg);
	c.done(c.arg, f->ok, f->n);
}

static int kv_fetch(struct rx_reactor *r, const struct kv_item *it,
		    unsigned n, bool client_mem, kv_done_fn done, void *arg)
{
	struct keys ks;
	if (keys_of_items(&ks, it, n) < 0)
		return -EINVAL;
	void **dst = calloc(n, sizeof(*dst));
	uint64_t *want = calloc(n, sizeof(*want));
	struct api_call *c = malloc(sizeof(*c));
	if (!dst || !want || !c) {
		keys_free(&ks);
		free(dst);
		free(want);
		free(c);
		return -ENOMEM;
	}
	for (unsigned i = 0; i < n; i++) {
		dst[i] = it[i].data;
		want[i] = it[i].len ? it[i].len : UINT64_MAX;
	}
	c->done = done;
	c->arg = arg;
	int ret = fetch_start(r, &ks, dst, want, client_mem, api_fetched, c);
	free(dst);
	free(want);
	if (ret < 0) {
		keys_free(&ks);
		free(c);
	}
	return ret;
}

/* --------------------------------------------------------------- exists */

struct exists_op {
	struct keys ks;
	unsigned local;       /* leading keys found in the pool */
	struct dir_rec *recs; /* for keys [local, n) */
	uint64_t deadline;
	void (*done)(void *arg, unsigned count);
	void *arg;
};

static void exists_done(void *arg)
{
	struct exists_op *e = arg;
	unsigned count = e->local;
	for (unsigned i = e->local; i < e->ks.n && e->recs; i++) {
		struct dir_rec *r = &e->recs[i - e->local];
		/* A suspect producer's page could not be read now. */
		if (!r->found || !r->resident ||
		    strcmp(r->node, g.ctx->svc.self_id) == 0 ||
		    producer_suspect(r))
			break;
		count++;
	}
	if (e->recs)
		op_end(e->deadline);
	met_add(g.ex_found, count);
	e->done(e->arg, count);
	keys_free(&e->ks);
	free(e->recs);
	free(e);
}

/* Takes the keys. done may run before this returns. */
static int exists_start(struct rx_reactor *r, struct keys *ks,
			void (*done)(void *arg, unsigned count), void *arg)
{
	struct exists_op *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->ks = *ks;
	memset(ks, 0, sizeof(*ks));
	e->done = done;
	e->arg = arg;
	e->deadline = op_deadline();
	met_inc(g.ex_req);
	while (e->local < e->ks.n &&
	       pool_contains(g.pool, e->ks.k[e->local], e->ks.len[e->local]))
		e->local++;
	if (e->local == e->ks.n) {
		exists_done(e);
		return 0;
	}
	e->recs = calloc(e->ks.n - e->local, sizeof(*e->recs));
	struct dir_keys k = dir_keys_of(&e->ks, e->local);
	if (!e->recs ||
	    g.ctx->svc.dir->lookup(r, &k, e->recs, e->deadline, exists_done,
				   e) < 0) {
		free(e->recs);
		e->recs = NULL;
		exists_done(e);
	}
	return 0;
}

static int kv_exists(struct rx_reactor *r, const struct kv_item *it,
		     unsigned n, void (*done)(void *arg, unsigned count),
		     void *arg)
{
	struct keys ks;
	if (keys_of_items(&ks, it, n) < 0)
		return -EINVAL;
	return exists_start(r, &ks, done, arg);
}

/* --------------------------------------------------------------- remove */

struct del_op {
	struct keys ks;
	bool *local;
	bool *existed;
	kv_done_fn done;
	void *arg;
};

static void del_done(void *arg)
{
	struct del_op *d = arg;
	for (unsigned i = 0; i < d->ks.n; i++)
		d->existed[i] |= d->local[i];
	d->done(d->arg, d->existed, d->ks.n);
	keys_free(&d->ks);
	free(d->local);
	free(d->existed);
	free(d);
}

/* Takes the keys. done may run before this returns. */
static int remove_start(struct rx_reactor *r, struct keys *ks,
			kv_done_fn done, void *arg)
{
	struct del_op *d = calloc(1, sizeof(*d));
	bool *local = calloc(ks->n, sizeof(bool));
	bool *existed = calloc(ks->n, sizeof(bool));
	if (!d || !local || !existed) {
		free(d);
		free(local);
		free(existed);
		return -ENOMEM;
	}
	d->ks = *ks;
	memset(ks, 0, sizeof(*ks));
	d->local = local;
	d->existed = existed;
	d->done = done;
	d->arg = arg;
	met_add(g.del_req, d->ks.n);
	for (unsigned i = 0; i < d->ks.n; i++)
		d->local[i] = pool_delete(g.pool, d->ks.k[i], d->ks.len[i]) == 0;
	struct dir_keys k = dir_keys_of(&d->ks, 0);
	if (g.ctx->svc.dir->remove(r, &k, NULL, NULL, d->existed, op_deadline(),
				   del_done, d) < 0)
		del_done(d);
	return 0;
}

static int kv_remove(struct rx_reactor *r, const struct kv_item *it,
		     unsigned n, kv_done_fn done, void *arg)
{
	struct keys ks;
	if (keys_of_items(&ks, it, n) < 0)
		return -EINVAL;
	return remove_start(r, &ks, done, arg);
}

static const struct kv_api kv_api = {
	.publish = kv_publish,
	.fetch = kv_fetch,
	.exists = kv_exists,
	.remove = kv_remove,
};

/* ----------------------------------------------------------- kv.* methods */

/*
 * What a kv.* call holds per key while it is in flight, besides the page
 * bytes kv.get stages: the directory record and page header a lookup
 * fills, the operation's and its directory job's arrays, and two copies of
 * the key (an estimate on the high side). Without it 65,536 one-byte keys
 * (a 200 KB request) would hold ~40 MB, and a connection may have
 * rpc_max_inflight calls in flight.
 */
#define KV_KEY_STATE (sizeof(struct dir_rec) + POOL_HDR_BYTES + 224)

/* A kv.* call in flight and the staging its bookkeeping holds. */
struct kv_call {
	struct rpc_call *call;
	uint64_t held;
};

static void refuse_busy(struct rpc_call *call, const char *what)
{
	met_inc(g.refused_busy);
	PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: %s refused: the node already "
		  "holds kv_staging_max (%llu bytes) for other calls",
		  rpc_call_peer(call), what, (unsigned long long)g.staging_max);
	rpc_reply_error(call, RPC_E_BUSY, "the node already holds "
			"kv_staging_max (%llu bytes) for other kv.* calls; "
			"retry later", (unsigned long long)g.staging_max);
}

/*
 * Take the staging a call of n keys (key_bytes in all) holds until it
 * replies. NULL when it cannot: the call was answered (busy, or too_large
 * when it alone exceeds kv_staging_max).
 */
static struct kv_call *call_hold(struct rpc_call *call, const char *what,
				 unsigned n, uint64_t key_bytes)
{
	uint64_t need = (uint64_t)n * KV_KEY_STATE + 2 * key_bytes;
	if (need > g.staging_max) {
		met_inc(g.refused_large);
		rpc_reply_error(call, RPC_E_TOO_LARGE, "%s of %u keys needs %llu"
				" bytes of bookkeeping, over kv_staging_max "
				"(%llu); send fewer keys per call", what, n,
				(unsigned long long)need,
				(unsigned long long)g.staging_max);
		return NULL;
	}
	struct kv_call *kc = malloc(sizeof(*kc));
	if (!kc) {
		rpc_reply_error(call, RPC_E_BUSY, "out of memory");
		return NULL;
	}
	if (__atomic_add_fetch(&g.staged, need, __ATOMIC_RELAXED) >
	    g.staging_max) {
		__atomic_sub_fetch(&g.staged, need, __ATOMIC_RELAXED);
		free(kc);
		refuse_busy(call, what);
		return NULL;
	}
	kc->call = call;
	kc->held = need;
	return kc;
}

/* Give the staging back; the call, to reply to. */
static struct rpc_call *call_release(struct kv_call *kc)
{
	struct rpc_call *call = kc->call;
	__atomic_sub_fetch(&g.staged, kc->held, __ATOMIC_RELAXED);
	free(kc);
	return call;
}

static uint64_t keys_bytes(const struct keys *ks)
{
	uint64_t n = 0;
	for (unsigned i = 0; i < ks->n; i++)
		n += ks->len[i];
	return n;
}

static void reply_bools(void *arg, const bool *ok, unsigned n)
{
	rpc_reply_bools(call_release(arg), ok, n);
}

static void reply_count(void *arg, unsigned count)
{
	rpc_reply_uint(call_release(arg), count);
}

static void reply_existed(void *arg, const bool *ok, unsigned n)
{
	unsigned count = 0;
	for (unsigned i = 0; i < n; i++)
		count += ok[i];
	rpc_reply_uint(call_release(arg), count);
}

static void m_set(struct rpc_call *call, struct mp_rd *p)
{
	uint32_t nk, nv;
	struct mp_rd keys = *p;
	if (mp_rd_array(p, &nk) < 0 || nk == 0 || nk > KV_BATCH_MAX) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected [keys, values]"
				"; %s", keys_help);
		return;
	}
	/* The keys' bytes: what the call's bookkeeping copies of them. */
	uint64_t key_bytes = 0;
	for (uint32_t i = 0; i < nk; i++) {
		const uint8_t *before = p->p;
		mp_skip(p);
		key_bytes += (uint64_t)(p->p - before);
	}
	struct kv_call *kc = call_hold(call, "kv.set", nk, key_bytes);
	if (!kc)
		return;
	struct kv_item *it = calloc(nk, sizeof(*it));
	if (!it) {
		rpc_reply_error(call_release(kc), RPC_E_BUSY, "out of memory");
		return;
	}
	/* Items point into the request: publish copies before it returns. */
	bool bad = mp_rd_array(p, &nv) < 0 || nv != nk ||
		   mp_rd_array(&keys, &nk) < 0;
	for (uint32_t i = 0; i < nk && !bad; i++) {
		const char *k;
		uint32_t kl;
		const uint8_t *v;
		uint32_t vl;
		bad = mp_rd_str(&keys, &k, &kl) < 0 || kl == 0 ||
		      kl > KV_KEY_MAX || mp_rd_bin(p, &v, &vl) < 0;
		it[i] = (struct kv_item){k, kl, (void *)(uintptr_t)v, vl};
	}
	if (bad) {
		free(it);
		rpc_reply_error(call_release(kc), RPC_E_BAD_PARAMS,
				"expected [keys, values] with one bin value "
				"per key; %s", keys_help);
		return;
	}
	int ret = kv_publish(rpc_call_reactor(call), it, nk, false, reply_bools,
			     kc);
	free(it);
	if (ret < 0)
		rpc_reply_error(call_release(kc), RPC_E_BUSY, "%s",
				strerror(-ret));
}

static void get_reply(void *arg, struct fetch *f)
{
	struct rpc_call *call = call_release(arg);
	if (f->refused == -E2BIG) {
		met_inc(g.refused_large);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: kv.get of %u keys refused: "
			  "its pages exceed %llu bytes per call (%s)",
			  rpc_call_peer(call), f->n,
			  (unsigned long long)g.get_call_max, g.get_call_limit);
		rpc_reply_error(call, RPC_E_TOO_LARGE, "the pages of this kv.get "
				"exceed %llu reply bytes per call (setting %s); "
				"ask for fewer keys per call",
				(unsigned long long)g.get_call_max,
				g.get_call_limit);
		return;
	}
	if (f->refused) {
		refuse_busy(call, "kv.get");
		return;
	}
	/* The reply is copied into the connection's output queue: the RPC
	 * layer's reply budget (per connection and node-wide) must have room
	 * for it first; the queue accounts for the bytes once written. */
	size_t reply = (size_t)(f->staged + get_reply_overhead(f->n));
	int ret = rpc_call_budget_take(call, reply);
	if (ret < 0) {
		met_inc(g.refused_busy);
		rpc_reply_error(call, RPC_E_BUSY, "no room for a %zu-byte reply: "
				"this connection's unread replies or all "
				"connections' (rpc_max_reply_bytes) are at "
				"their limit; read the replies, or retry later",
				reply);
		return;
	}
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_array(pk, f->n);
	for (unsigned i = 0; i < f->n; i++) {
		if (!f->ok[i]) {
			msgpack_pack_nil(pk);
			continue;
		}
		msgpack_pack_bin(pk, f->len[i]);
		msgpack_pack_bin_body(pk, f->own[i], f->len[i]);
		met_add(g.rd_bytes, f->len[i]);
		met_add(g.copy_reply, f->len[i]);
	}
	rpc_call_budget_give(call, reply);
	rpc_reply_end(call);
}

/* Read [keys] and hold their bookkeeping: NULL when the call was answered. */
static struct kv_call *keys_call(struct rpc_call *call, struct mp_rd *p,
				 const char *what, struct keys *ks)
{
	if (keys_read(p, ks) < 0) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected [keys]; %s",
				keys_help);
		return NULL;
	}
	struct kv_call *kc = call_hold(call, what, ks->n, keys_bytes(ks));
	if (!kc)
		keys_free(ks);
	return kc;
}

/* An operation did not start: free what it did not take, answer busy. */
static void keys_call_failed(struct kv_call *kc, struct keys *ks)
{
	keys_free(ks);
	rpc_reply_error(call_release(kc), RPC_E_BUSY, "out of memory");
}

static void m_get(struct rpc_call *call, struct mp_rd *p)
{
	struct keys ks;
	struct kv_call *kc = keys_call(call, p, "kv.get", &ks);
	if (kc && fetch_start(rpc_call_reactor(call), &ks, NULL, NULL, false,
			      get_reply, kc) < 0)
		keys_call_failed(kc, &ks);
}

static void m_exists(struct rpc_call *call, struct mp_rd *p)
{
	struct keys ks;
	struct kv_call *kc = keys_call(call, p, "kv.exists", &ks);
	if (kc && exists_start(rpc_call_reactor(call), &ks, reply_count, kc) < 0)
		keys_call_failed(kc, &ks);
}

static void m_delete(struct rpc_call *call, struct mp_rd *p)
{
	struct keys ks;
	struct kv_call *kc = keys_call(call, p, "kv.delete", &ks);
	if (kc && remove_start(rpc_call_reactor(call), &ks, reply_existed, kc) <
			  0)
		keys_call_failed(kc, &ks);
}

static const struct rpc_method kv_methods[] = {
	{"kv.set", m_set, 0,
	 "[keys, values] -> [stored: bool, ...] (idempotent)"},
	{"kv.get", m_get, 0, "[keys] -> [bin | nil, ...]"},
	{"kv.exists", m_exists, 0,
	 "[keys] -> how many leading keys exist"},
	{"kv.delete", m_delete, 0, "[keys] -> how many existed"},
	{NULL, NULL, 0, NULL},
};

/* ------------------------------------------------------------- lifecycle */

static int pin_hook(void *ctx, uintptr_t addr, uint64_t len,
		    struct tp_pin *pin)
{
	struct pool_ref ref;
	int ret = pool_pin_addr(ctx, addr, len, &ref);
	_Static_assert(sizeof(ref) <= sizeof(*pin), "a pool_ref fits a tp_pin");
	memset(pin, 0, sizeof(*pin));
	memcpy(pin, &ref, sizeof(ref));
	return ret;
}

static void unpin_hook(void *ctx, const struct tp_pin *pin)
{
	struct pool_ref ref;
	memcpy(&ref, pin, sizeof(ref));
	pool_unpin(ctx, &ref);
}

static double pool_stat(void *arg)
{
	struct pool_stats st;
	pool_stats(g.pool, &st);
	return (double)*(const uint64_t *)((const char *)&st + (uintptr_t)arg);
}

#define POOL_STAT(f) ((void *)offsetof(struct pool_stats, f))

static double staged_fn(void *arg)
{
	(void)arg;
	return (double)__atomic_load_n(&g.staged, __ATOMIC_RELAXED);
}

/* A producer became suspect: reads still waiting for it on this reactor
 * fail now (misses) instead of at their deadline. */
static void on_suspect(struct rx_reactor *r, const char *peer)
{
	struct tp_client *tc = g.ctx->svc.tp_clients[rx_reactor_id(r)];
	if (tc)
		g.ctx->svc.tp->fail_node(tc, peer, -EHOSTDOWN);
}

static int kv_init(struct pc_ctx *ctx)
{
	const struct pc_settings *s = ctx->cfg;
	memset(&g, 0, sizeof(g));
	g.ctx = ctx;
	g.checksums = s->page_checksums;
	g.read_timeout_ms = (unsigned)s->rpc_timeout_ms;
	/* A kv.get reply must fit one message, the connection's output cap
	 * and the node's staging budget: the smallest names the limit. */
	g.staging_max = s->kv_staging_max;
	g.get_call_max = s->rpc_max_message_bytes;
	g.get_call_limit = "rpc_max_message_bytes";
	if (s->conn_out_max < g.get_call_max) {
		g.get_call_max = s->conn_out_max;
		g.get_call_limit = "conn_out_max";
	}
	if (s->kv_staging_max < g.get_call_max) {
		g.get_call_max = s->kv_staging_max;
		g.get_call_limit = "kv_staging_max";
	}
	/* One connection's share of the reply budget (rpc_server.c): a
	 * reply above it could only ever get busy; say too_large instead. */
	if (s->rpc_max_reply_bytes / 4 < g.get_call_max) {
		g.get_call_max = s->rpc_max_reply_bytes / 4;
		g.get_call_limit = "rpc_max_reply_bytes / 4";
	}
	g.deadline_ns = RX_MS(s->request_deadline_ms);
	if (!ctx->svc.dir || !ctx->svc.tp || !ctx->svc.tp_register) {
		PC_LOGE(LOG_MOD, "the directory and transport modules must come "
			"before kv in the module list");
		return -EINVAL;
	}
	struct pool_opts po = {.size = s->pool_size, .try_huge_pages = true};
	int ret = pool_new(&g.pool, &po);
	if (ret < 0) {
		PC_LOGE(LOG_MOD, "cannot create a %llu-byte pool: %s",
			(unsigned long long)s->pool_size, strerror(-ret));
		return ret;
	}
	pool_set_evict_cb(g.pool, on_evict, NULL);
	if (g.checksums)
		PC_LOGI(LOG_MOD, "page checksums on (XXH3-64, %s)",
			pc_page_sum_impl());
	if (s->pool_prefault && (ret = pool_prefault_start(g.pool)) < 0)
		PC_LOGW(LOG_MOD, "cannot start the pool prefault thread (%s); "
			"pages are faulted in on first use", strerror(-ret));
	uint8_t *base;
	size_t len;
	pool_region(g.pool, &base, &len, &g.rkey);
	struct tp_region reg = {(uintptr_t)base, len, g.rkey, pin_hook,
				unpin_hook, g.pool};
	if ((ret = ctx->svc.tp_register(&reg)) < 0) {
		pool_free(g.pool);
		return ret;
	}
	ctx->svc.pool = g.pool;
	ctx->svc.kv = &kv_api;
	if (ctx->svc.health && (ret = ctx->svc.health->on_suspect(on_suspect)) < 0)
		return ret;
	if ((ret = pc_guard_init()) < 0)
		return ret;
	g.evqs = calloc(ctx->threads, sizeof(*g.evqs));
	if (!g.evqs)
		return -ENOMEM;
#define CTR(var, name, help) var = met_register(MET_COUNTER, name, help, NULL)
	CTR(g.rd_req, "peercache_read_requests_total", "pages asked for");
	CTR(g.rd_hit, "peercache_read_hits_total", "pages found");
	CTR(g.rd_miss, "peercache_read_misses_total", "pages not found");
	CTR(g.rd_local, "peercache_read_local_hits_total",
	    "pages served from this node's pool (no network)");
	CTR(g.rd_remote, "peercache_read_remote_hits_total",
	    "pages read from another node's pool");
	CTR(g.rd_bytes, "peercache_bytes_read_total", "page bytes returned");
	CTR(g.rd_fail, "peercache_read_failures_total",
	    "remote pages that failed to arrive or to validate (counted as "
	    "misses)");
	CTR(g.wr_req, "peercache_write_requests_total", "set calls");
	CTR(g.wr_pages, "peercache_write_pages_total", "pages published");
	CTR(g.wr_bytes, "peercache_bytes_written_total", "page bytes published");
	CTR(g.ex_req, "peercache_exists_requests_total", "exists calls");
	CTR(g.ex_found, "peercache_exists_pages_found_total",
	    "pages reported by exists");
	CTR(g.del_req, "peercache_delete_requests_total", "keys deleted");
	CTR(g.ev_pub, "peercache_eviction_unpublishes_total",
	    "directory records withdrawn after an eviction");
	CTR(g.landed, "peercache_bytes_landed_total",
	    "remote page bytes received straight into their destination (no "
	    "CPU copy by the node)");
	CTR(g.deadline_hit, "peercache_request_deadline_exceeded_total",
	    "page calls (set, get, exists) that ran into "
	    "request_deadline (what was not done by then failed or missed)");
	CTR(g.rd_suspect, "peercache_read_suspect_misses_total",
	    "remote pages not read because their producer is suspect (misses "
	    "at once)");
#undef CTR
	static const char refused_help[] =
		"kv.* calls refused for memory (kv_staging_max, or a kv.get "
		"reply over its cap), by reason";
	g.refused_large = met_register(MET_COUNTER, "peercache_kv_refused_total",
				       refused_help, "reason=\"too_large\"");
	g.refused_busy = met_register(MET_COUNTER, "peercache_kv_refused_total",
				  refused_help, "reason=\"busy\"");
	met_register_fn("peercache_kv_staged_bytes",
			"bytes kv.* calls in flight hold now: kv.get's pages "
			"and every call's per-key state", NULL, staged_fn, NULL);
	static const char copy_help[] =
		"page bytes the node copied with its CPU, by operation";
	g.copy_set = met_register(MET_COUNTER, "peercache_copy_bytes_total",
				  copy_help, "op=\"set\"");
	g.copy_get_local = met_register(MET_COUNTER,
					"peercache_copy_bytes_total",
					copy_help, "op=\"get_local\"");
	g.copy_reply = met_register(MET_COUNTER, "peercache_copy_bytes_total",
				    copy_help, "op=\"rpc_reply\"");
	g.lat_read = met_register(MET_HISTOGRAM, "peercache_op_latency_seconds",
				  "latency of page operations", "op=\"read\"");
	g.lat_write = met_register(MET_HISTOGRAM, "peercache_op_latency_seconds",
				   "latency of page operations", "op=\"write\"");
	met_register_fn("peercache_pool_bytes_used", "pool bytes in use", NULL,
			pool_stat, POOL_STAT(bytes_used));
	met_register_fn("peercache_pool_capacity_bytes", "pool capacity", NULL,
			pool_stat, POOL_STAT(capacity));
	met_register_fn("peercache_pool_keys", "pages in the pool", NULL,
			pool_stat, POOL_STAT(keys));
	met_register_counter_fn("peercache_evictions_total",
			"pages evicted from the pool for space", NULL,
			pool_stat, POOL_STAT(evictions));
	return 0;
}

static int kv_start(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	struct evq *q = &g.evqs[rx_reactor_id(r)];
	q->r = r;
	rx_timer_init(&q->flush, evq_flush, q);
	t_evq = q;
	return 0;
}

static void kv_stop(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	struct evq *q = &g.evqs[rx_reactor_id(r)];
	/* Records of pages evicted in the last moments stay; a reader of
	 * one gets a validated miss. */
	rx_timer_stop(r, &q->flush);
	q->stopped = true;
	for (unsigned i = 0; i < q->n; i++)
		free(q->keys[i]);
	free(q->keys);
	free(q->klens);
	free(q->gens);
	q->keys = NULL;
	q->klens = NULL;
	q->gens = NULL;
	q->n = q->cap = 0;
}

static void kv_fini(struct pc_ctx *ctx)
{
	ctx->svc.pool = NULL;
	ctx->svc.kv = NULL;
	pool_free(g.pool);
	free(g.evqs);
	memset(&g, 0, sizeof(g));
}

const struct pc_module pc_mod_kv = {
	.name = "kv",
	.init = kv_init,
	.start = kv_start,
	.stop = kv_stop,
	.fini = kv_fini,
	.rpc_methods = kv_methods,
};
