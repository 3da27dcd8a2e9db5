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
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checksum.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "modules/directory.h"
#include "modules/modules.h"
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
	unsigned read_timeout_ms;
	met_id rd_req, rd_hit, rd_miss, rd_local, rd_remote, rd_bytes, rd_fail;
	met_id wr_req, wr_pages, wr_bytes, ex_req, ex_found, del_req;
	met_id lat_read, lat_write, ev_pub;
} g;

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
	if (g.ctx->svc.dir->remove(r, &k, g.ctx->svc.self_id, b->gens, NULL,
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
	for (unsigned i = 0; i < ks->n; i++)
		free(ks->k[i]);
	free(ks->k);
	free(ks->len);
}

/* Copy [key, ...] out of the request (async work outlives the buffer). */
static int keys_read(struct mp_rd *p, struct keys *ks)
{
	uint32_t n;
	memset(ks, 0, sizeof(*ks));
	if (mp_rd_array(p, &n) < 0 || n == 0 || n > KV_BATCH_MAX)
		return -EINVAL;
	ks->k = calloc(n, sizeof(*ks->k));
	ks->len = calloc(n, sizeof(*ks->len));
	if (!ks->k || !ks->len) {
		free(ks->k);
		free(ks->len);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++) {
		const char *s;
		uint32_t len;
		if (mp_rd_str(p, &s, &len) < 0 || len == 0 || len > KV_KEY_MAX ||
		    !(ks->k[i] = malloc(len))) {
			ks->n = i;
			keys_free(ks);
			return -EINVAL;
		}
		memcpy(ks->k[i], s, len);
		ks->len[i] = len;
		ks->n = i + 1;
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

static void bind_reactor(struct rpc_call *call)
{
	t_evq = &g.evqs[rx_reactor_id(rpc_call_reactor(call))];
}

/* ------------------------------------------------------------------ set */

struct set_op {
	struct rpc_call *call;
	struct keys ks;
	bool *ok;
	struct dir_rec *recs;
	bool *pub_ok;       /* per record published */
	unsigned *pub_idx;  /* record -> key index */
	unsigned npub;
	uint64_t t0;
};

static void set_reply(struct set_op *s)
{
	for (unsigned i = 0; i < s->npub; i++)
		s->ok[s->pub_idx[i]] = s->pub_ok[i];
	msgpack_packer *pk = rpc_reply_begin(s->call);
	msgpack_pack_array(pk, s->ks.n);
	for (unsigned i = 0; i < s->ks.n; i++) {
		if (s->ok[i])
			msgpack_pack_true(pk);
		else
			msgpack_pack_false(pk);
	}
	rpc_reply_end(s->call);
	met_observe_ns(g.lat_write, pc_now_ns() - s->t0);
	keys_free(&s->ks);
	free(s->ok);
	free(s->recs);
	free(s->pub_ok);
	free(s->pub_idx);
	free(s);
}

static void set_published(void *arg)
{
	set_reply(arg);
}

static void m_set(struct rpc_call *call, struct mp_rd *p)
{
	struct set_op *s = calloc(1, sizeof(*s));
	uint32_t nv;
	if (!s) {
		rpc_reply_error(call, RPC_E_BUSY, "out of memory");
		return;
	}
	s->call = call;
	s->t0 = pc_now_ns();
	bind_reactor(call);
	if (keys_read(p, &s->ks) < 0 || mp_rd_array(p, &nv) < 0 ||
	    nv != s->ks.n) {
		keys_free(&s->ks);
		free(s);
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected [keys, values]"
				" with as many values (bin) as keys; %s",
				keys_help);
		return;
	}
	unsigned n = s->ks.n;
	s->ok = calloc(n, sizeof(bool));
	s->recs = calloc(n, sizeof(*s->recs));
	s->pub_ok = calloc(n, sizeof(bool));
	s->pub_idx = calloc(n, sizeof(unsigned));
	if (!s->ok || !s->recs || !s->pub_ok || !s->pub_idx) {
		s->npub = 0;
		set_reply(s);
		return;
	}
	met_inc(g.wr_req);
	const char **pkeys = calloc(n, sizeof(*pkeys));
	size_t *plens = calloc(n, sizeof(*plens));
	for (unsigned i = 0; i < n; i++) {
		const uint8_t *v;
		uint32_t vlen;
		if (mp_rd_bin(p, &v, &vlen) < 0) {
			free(pkeys);
			free(plens);
			s->npub = 0;
			memset(s->ok, 0, n * sizeof(bool));
			set_reply(s);
			return;
		}
		if (pool_contains(g.pool, s->ks.k[i], s->ks.len[i])) {
			s->ok[i] = true; /* idempotent: already published */
			continue;
		}
		struct pool_ref ref;
		uint8_t *dst;
		if (vlen == 0 || !pkeys || !plens ||
		    pool_reserve(g.pool, s->ks.k[i], s->ks.len[i], vlen, &ref,
				 &dst) < 0)
			continue;
		memcpy(dst, v, vlen); /* the one copy of a set */
		uint64_t gen;
		uintptr_t addr;
		if (pool_commit(g.pool, &ref, g.checksums, &gen, &addr) < 0)
			continue;
		met_inc(g.wr_pages);
		met_add(g.wr_bytes, vlen);
		struct dir_rec *r = &s->recs[s->npub];
		r->found = true;
		r->resident = true;
		snprintf(r->node, sizeof(r->node), "%s", g.ctx->svc.self_id);
		snprintf(r->data, sizeof(r->data), "%s", g.ctx->svc.self_data);
		r->addr = addr;
		r->len = vlen;
		r->gen = gen;
		uint8_t *base;
		size_t blen;
		pool_region(g.pool, &base, &blen, &r->rkey);
		pkeys[s->npub] = s->ks.k[i];
		plens[s->npub] = s->ks.len[i];
		s->pub_idx[s->npub++] = i;
	}
	if (s->npub == 0 || !pkeys || !plens) {
		free(pkeys);
		free(plens);
		s->npub = 0;
		set_reply(s);
		return;
	}
	struct dir_keys k = {pkeys, plens, s->npub};
	int ret = g.ctx->svc.dir->publish(rpc_call_reactor(call), &k, s->recs,
					  s->pub_ok, set_published, s);
	free(pkeys); /* the directory copied the keys */
	free(plens);
	if (ret < 0)
		set_reply(s); /* pub_ok all false */
}

/* ------------------------------------------------------------------ get */

struct get_op {
	struct rpc_call *call;
	struct keys ks;
	uint8_t **buf;         /* per key: header + payload, or NULL (miss) */
	uint32_t *len;         /* payload bytes */
	struct dir_rec *recs;  /* for the keys not found locally */
	unsigned *ridx;        /* rec -> key index */
	unsigned nrec;
	struct tp_read *reads;
	unsigned *readk;       /* read -> rec index */
	unsigned nreads;
	uint64_t t0;
};

static void get_free(struct get_op *o)
{
	for (unsigned i = 0; i < o->ks.n; i++)
		free(o->buf ? o->buf[i] : NULL);
	keys_free(&o->ks);
	free(o->buf);
	free(o->len);
	free(o->recs);
	free(o->ridx);
	free(o->reads);
	free(o->readk);
	free(o);
}

static void get_reply(struct get_op *o)
{
	msgpack_packer *pk = rpc_reply_begin(o->call);
	msgpack_pack_array(pk, o->ks.n);
	unsigned hits = 0;
	for (unsigned i = 0; i < o->ks.n; i++) {
		if (!o->buf[i]) {
			msgpack_pack_nil(pk);
			continue;
		}
		hits++;
		msgpack_pack_bin(pk, o->len[i]);
		msgpack_pack_bin_body(pk, o->buf[i] + POOL_HDR_BYTES, o->len[i]);
		met_add(g.rd_bytes, o->len[i]);
	}
	rpc_reply_end(o->call);
	met_add(g.rd_hit, hits);
	met_add(g.rd_miss, o->ks.n - hits);
	met_observe_ns(g.lat_read, pc_now_ns() - o->t0);
	get_free(o);
}

static void get_read_done(void *arg, struct tp_read *reads, unsigned n)
{
	struct get_op *o = arg;
	for (unsigned i = 0; i < n; i++) {
		struct dir_rec *r = &o->recs[o->readk[i]];
		unsigned k = o->ridx[o->readk[i]];
		int bad = reads[i].res;
		if (!bad) {
			uint64_t hi, lo;
			pool_key_hash(o->ks.k[k], o->ks.len[k], &hi, &lo);
			bad = pool_hdr_check(o->buf[k], POOL_HDR_BYTES + r->len,
					     hi, lo, r->gen, r->len,
					     g.checksums);
		}
		if (bad) {
			met_inc(g.rd_fail);
			PC_LOGD(LOG_MOD, "remote page from %s failed: %s",
				r->data, strerror(-bad));
			free(o->buf[k]);
			o->buf[k] = NULL;
			continue;
		}
		o->len[k] = r->len;
		met_inc(g.rd_remote);
	}
	get_reply(o);
}

static void get_looked_up(void *arg)
{
	struct get_op *o = arg;
	o->reads = calloc(o->nrec, sizeof(*o->reads));
	o->readk = calloc(o->nrec, sizeof(*o->readk));
	if (!o->reads || !o->readk) {
		get_reply(o);
		return;
	}
	for (unsigned j = 0; j < o->nrec; j++) {
		struct dir_rec *r = &o->recs[j];
		unsigned k = o->ridx[j];
		/* Our own record but no page here: evicted since. No disk
		 * tier yet, so a non-resident record is a miss too. */
		if (!r->found || !r->resident ||
		    strcmp(r->node, g.ctx->svc.self_id) == 0)
			continue;
		if (!(o->buf[k] = malloc(POOL_HDR_BYTES + (size_t)r->len)))
			continue;
		struct tp_read *rd = &o->reads[o->nreads];
		snprintf(rd->peer, sizeof(rd->peer), "%s", r->data);
		rd->rkey = r->rkey;
		rd->addr = r->addr;
		rd->len = POOL_HDR_BYTES + r->len;
		rd->dst = o->buf[k];
		o->readk[o->nreads++] = j;
	}
	struct rx_reactor *rr = rpc_call_reactor(o->call);
	if (o->nreads == 0 ||
	    g.ctx->svc.tp->read_batch(g.ctx->svc.tp_clients[rx_reactor_id(rr)],
				      o->reads, o->nreads, g.read_timeout_ms,
				      get_read_done, o) < 0) {
		for (unsigned i = 0; i < o->nreads; i++) {
			free(o->buf[o->ridx[o->readk[i]]]);
			o->buf[o->ridx[o->readk[i]]] = NULL;
		}
		get_reply(o);
	}
}

static void m_get(struct rpc_call *call, struct mp_rd *p)
{
	struct get_op *o = calloc(1, sizeof(*o));
	if (!o) {
		rpc_reply_error(call, RPC_E_BUSY, "out of memory");
		return;
	}
	o->call = call;
	o->t0 = pc_now_ns();
	bind_reactor(call);
	if (keys_read(p, &o->ks) < 0) {
		free(o);
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected [keys]; %s",
				keys_help);
		return;
	}
	unsigned n = o->ks.n;
	o->buf = calloc(n, sizeof(*o->buf));
	o->len = calloc(n, sizeof(*o->len));
	o->recs = calloc(n, sizeof(*o->recs));
	o->ridx = calloc(n, sizeof(*o->ridx));
	const char **lk = calloc(n, sizeof(*lk));
	size_t *ll = calloc(n, sizeof(*ll));
	if (!o->buf || !o->len || !o->recs || !o->ridx || !lk || !ll) {
		free(lk);
		free(ll);
		get_reply(o);
		return;
	}
	met_add(g.rd_req, n);
	for (unsigned i = 0; i < n; i++) {
		struct pool_ref ref;
		const uint8_t *hdr;
		uint64_t len, gen;
		if (pool_get(g.pool, o->ks.k[i], o->ks.len[i], &ref, &hdr, &len,
			     &gen) == 0) {
			/* Local page: one memcpy, no directory, no network. */
			o->buf[i] = malloc(POOL_HDR_BYTES + len);
			if (o->buf[i]) {
				memcpy(o->buf[i], hdr, POOL_HDR_BYTES + len);
				o->len[i] = (uint32_t)len;
				met_inc(g.rd_local);
			}
			pool_unpin(g.pool, &ref);
			continue;
		}
		lk[o->nrec] = o->ks.k[i];
		ll[o->nrec] = o->ks.len[i];
		o->ridx[o->nrec++] = i;
	}
	if (o->nrec == 0) {
		free(lk);
		free(ll);
		get_reply(o);
		return;
	}
	struct dir_keys k = {lk, ll, o->nrec};
	int ret = g.ctx->svc.dir->lookup(rpc_call_reactor(call), &k, o->recs,
					 get_looked_up, o);
	free(lk);
	free(ll);
	if (ret < 0)
		get_reply(o);
}

/* --------------------------------------------------------------- exists */

struct exists_op {
	struct rpc_call *call;
	struct keys ks;
	unsigned local;       /* leading keys found in the pool */
	struct dir_rec *recs; /* for keys [local, n) */
};

static void exists_done(void *arg)
{
	struct exists_op *e = arg;
	unsigned count = e->local;
	for (unsigned i = e->local; i < e->ks.n && e->recs; i++) {
		struct dir_rec *r = &e->recs[i - e->local];
		if (!r->found || !r->resident ||
		    strcmp(r->node, g.ctx->svc.self_id) == 0)
			break;
		count++;
	}
	met_add(g.ex_found, count);
	rpc_reply_uint(e->call, count);
	keys_free(&e->ks);
	free(e->recs);
	free(e);
}

static void m_exists(struct rpc_call *call, struct mp_rd *p)
{
	struct exists_op *e = calloc(1, sizeof(*e));
	if (!e) {
		rpc_reply_error(call, RPC_E_BUSY, "out of memory");
		return;
	}
	e->call = call;
	if (keys_read(p, &e->ks) < 0) {
		free(e);
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected [keys]; %s",
				keys_help);
		return;
	}
	met_inc(g.ex_req);
	while (e->local < e->ks.n &&
	       pool_contains(g.pool, e->ks.k[e->local], e->ks.len[e->local]))
		e->local++;
	if (e->local == e->ks.n) {
		exists_done(e);
		return;
	}
	e->recs = calloc(e->ks.n - e->local, sizeof(*e->recs));
	struct dir_keys k = dir_keys_of(&e->ks, e->local);
	if (!e->recs || g.ctx->svc.dir->lookup(rpc_call_reactor(call), &k,
					       e->recs, exists_done, e) < 0) {
		free(e->recs);
		e->recs = NULL;
		exists_done(e);
	}
}

/* --------------------------------------------------------------- delete */

struct del_op {
	struct rpc_call *call;
	struct keys ks;
	bool *local;
	bool *existed;
};

static void del_done(void *arg)
{
	struct del_op *d = arg;
	unsigned count = 0;
	for (unsigned i = 0; i < d->ks.n; i++)
		count += d->local[i] || (d->existed && d->existed[i]);
	rpc_reply_uint(d->call, count);
	keys_free(&d->ks);
	free(d->local);
	free(d->existed);
	free(d);
}

static void m_delete(struct rpc_call *call, struct mp_rd *p)
{
	struct del_op *d = calloc(1, sizeof(*d));
	if (!d) {
		rpc_reply_error(call, RPC_E_BUSY, "out of memory");
		return;
	}
	d->call = call;
	if (keys_read(p, &d->ks) < 0) {
		free(d);
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected [keys]; %s",
				keys_help);
		return;
	}
	met_add(g.del_req, d->ks.n);
	d->local = calloc(d->ks.n, sizeof(bool));
	d->existed = calloc(d->ks.n, sizeof(bool));
	if (!d->local || !d->existed) {
		free(d->existed);
		d->existed = NULL;
		if (!d->local)
			d->local = calloc(d->ks.n, sizeof(bool));
		if (!d->local) {
			keys_free(&d->ks);
			free(d);
			rpc_reply_error(call, RPC_E_BUSY, "out of memory");
			return;
		}
		del_done(d);
		return;
	}
	for (unsigned i = 0; i < d->ks.n; i++)
		d->local[i] = pool_delete(g.pool, d->ks.k[i], d->ks.len[i]) == 0;
	struct dir_keys k = dir_keys_of(&d->ks, 0);
	if (g.ctx->svc.dir->remove(rpc_call_reactor(call), &k, NULL, NULL,
				   d->existed, del_done, d) < 0)
		del_done(d);
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

static int kv_init(struct pc_ctx *ctx)
{
	const struct pc_settings *s = ctx->cfg;
	memset(&g, 0, sizeof(g));
	g.ctx = ctx;
	g.checksums = s->page_checksums;
	g.read_timeout_ms = (unsigned)s->rpc_timeout_ms;
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
	uint32_t rkey;
	pool_region(g.pool, &base, &len, &rkey);
	struct tp_region reg = {(uintptr_t)base, len, rkey, pin_hook,
				unpin_hook, g.pool};
	if ((ret = ctx->svc.tp_register(&reg)) < 0) {
		pool_free(g.pool);
		return ret;
	}
	ctx->svc.pool = g.pool;
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
#undef CTR
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
