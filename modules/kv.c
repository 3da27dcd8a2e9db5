/*
 * modules/kv.c — moving pages (module "kv"): the publish pool, copies into
 * it, fetches out of it and from other nodes through the transport, and the
 * validation of what arrives. Where pages are is placement's business
 * (modules/placement.h, the "placement" service: p2p's directory today); what
 * happens to an evicted page is the tier's (modules/tier.h: the disk tier,
 * modules/disk.c, when the "tier" service is there, else none).
 * The kv API (modules/kv.h, the "kv" service) is the only way in: the kv.* RPC
 * methods (module kv_rpc, modules/kv_rpc.c) and the local-client sessions
 * (modules/session.c) both use it.
 *
 * Owns: the publish pool (storage/pool.c), registered once with the
 * transport as a region peers may read; the per-reactor queue of
 * unpublishes that evictions cause; the node's staging budget
 * (kv_staging_max, g.staging); the read/write metrics under the original
 * PeerCache names. Threads: calls run on the reactor that made them, and
 * every asynchronous step (placement lookup, remote read) comes back to
 * that reactor; the pool is striped for concurrent use.
 *
 * Paths and copies (DESIGN §5):
 *   set  — one memcpy from the caller into the pool, then the records go to
 *          placement. A key already in the pool counts as stored
 *          (idempotent set).
 *   get  — a page in this node's pool is one memcpy, no placement and no
 *          network; otherwise a placement lookup, then one read straight
 *          into the destination. Every remotely read page is validated (key
 *          hash, generation, length, checksum unless page_checksums=false)
 *          as soon as its bytes landed (fetch_landed, the transport's
 *          per-read hook: while they are still in cache), and a page that
 *          fails is a miss, counted. A record of a page on
 *          another node's disk (non-resident) is first promoted by its
 *          producer (the tier's promote_remote); the reads wait for the
 *          fresh locations, within the call's deadline.
 *
 * Memory per call: one arena (common/arena.h) holds the call's state — key
 * copies, flags, what the local pass pins — whatever the batch size.
 * The records, reads and checks of the keys the pool did not have take
 * one more allocation when their lookup starts (none when the pool held
 * them all: a 65,536-key get of pages here no longer zeroes ~36 MB of
 * them): get and fetch for the items not found here, exists for the keys
 * past the leading run. get (staged pages, for kv.*) adds at most two
 * blocks: one for the local pages, one for the remote ones. Staging: a get stages at most its stage_max, and
 * all calls together at most kv_staging_max (g.staging, a common/budget.h counter,
 * which also holds what kv.* calls keep per key: kv_api.hold). Bytes are
 * taken before a block is allocated and given back when the call ends; the
 * first refusal ends the call's staging.
 *
 * Deadlines and frozen peers: every set, get, exists and delete gets one
 * budget, request_deadline, from its start. The placement round trips,
 * the remote promotions and the data reads share it — a read gets what the lookup left, never a
 * timeout of its own on top — so a call touching a peer that stopped
 * answering returns within the budget. A page whose producer is suspect
 * (the "health" service) is a miss at once, and exists does not count it; a
 * read that gets no answer reports its producer.
 *
 * Never wrong: a page is ok only after a local copy out of a pinned entry
 * of the same key, or a remote read that passed pool_hdr_check_split.
 *
 * p2p only: in another placement mode (slotmap) the module does nothing —
 * no pool, no services, no metrics; that mode's own module is the "kv"
 * service. start, stop and fini then find g.pool NULL and return.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/arena.h"
#include "common/budget.h"
#include "common/checksum.h"
#include "common/copy.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "common/guard.h"
#include "modules/copier.h"
#include "modules/kv.h"
#include "modules/membership.h"
#include "modules/modules.h"
#include "modules/peer_health.h"
#include "modules/placement.h"
#include "modules/read_cache.h"
#include "modules/tier.h"
#include "modules/transport.h"
#include "modules/walk.h"
#include "reactor/stall.h"
#include "storage/pool.h"

#define LOG_MOD "kv"
#define KV_BATCH_MAX 65536
#define KV_KEY_MAX DIR_KEY_MAX

/* Unpublishes evictions queued, per reactor: keys packed in one buffer
 * (keys[i] at koff[i]), so an eviction costs no allocation of its own. */
struct evq {
	struct rx_reactor *r;
	bool stopped;       /* shutting down: evictions are not withdrawn */
	char *kbuf;
	size_t kused, kcap;
	size_t *koff;
	size_t *klens;
	uint64_t *gens;
	unsigned n, cap;
	struct rx_timer flush;
};

static struct {
	struct pc_ctx *ctx;
	struct pool *pool;
	const struct pl_ops *pl;    /* placement of the mode */
	const struct svc_cluster *cl;     /* services, looked up in init */
	const struct svc_transport *tp;
	const struct ph_api *health;      /* or NULL */
	const struct tier_ops *tier; /* the next tier down (set on reactor 0's
				      * start, before any page moves) */
	struct read_cache *rcache;  /* directory_read_cache_ttl, or NULL */
	struct evq *evqs;           /* per reactor */
	struct flush *flush;        /* the flush under way, or NULL; atomic */
	bool checksums;
	uint32_t rkey;              /* the transport's key of the pool */
	struct svc_pool pool_svc;   /* published: the pool and its key */
	struct pc_budget staging;   /* kv_staging_max: all calls */
	unsigned read_timeout_ms;   /* rpc_timeout: a read never waits longer */
	uint64_t deadline_ns;       /* request_deadline */
	met_id deadline_hit, rd_suspect, rc_stale, own_stale;
	met_id rd_req, rd_hit, rd_miss, rd_local, rd_remote, rd_fail, rd_tier;
	met_id wr_req, wr_pages, wr_bytes, ex_req, ex_found, del_req;
	met_id rd_bytes; /* every path: kv.get, session, shim, local, remote */
	met_id lat_read, lat_write, ev_pub, tier_kept, promotes;
	met_id copy_set, copy_get_local, landed, stage_warmed;
} g;

/* This reactor's queue (set by kv_start on each reactor thread), where
 * evictions caused by its own reserves go. */
static _Thread_local struct evq *t_evq;

/* ------------------------------------------------------------- evictions */

/* A queue's buffers, handed to one unpublish, and its keys' pointers. */
struct evq_batch {
	char *kbuf;
	size_t *koff;
	size_t *klens;
	uint64_t *gens;
	const char **keys;
};

static void evq_bufs_free(char *kbuf, size_t *koff, size_t *klens,
			  uint64_t *gens)
{
	free(kbuf);
	free(koff);
	free(klens);
	free(gens);
}

static void evq_sent(void *arg)
{
	struct evq_batch *b = arg;
	evq_bufs_free(b->kbuf, b->koff, b->klens, b->gens);
	free(b); /* and the key pointers with it */
}

/* Send what evictions queued: one conditional unpublish per batch (only
 * records that still name this node and the evicted generation go). */
static void evq_flush(struct rx_reactor *r, struct rx_timer *t)
{
	struct evq *q = t->arg;
	rx_stall_tag("kv evictions");
	if (!q->n || !g.pl)
		return;
	struct evq_batch *b = malloc(sizeof(*b) + q->n * sizeof(b->keys[0]));
	if (!b)
		return; /* retried at the next eviction */
	*b = (struct evq_batch){q->kbuf, q->koff, q->klens, q->gens,
				(const char **)(void *)(b + 1)};
	for (unsigned i = 0; i < q->n; i++) {
		PC_ASSERT(q->gens[i] != 0); /* only that generation goes */
		b->keys[i] = q->kbuf + q->koff[i];
	}
	struct dir_keys k = {b->keys, b->klens, q->n};
	q->kbuf = NULL;
	q->koff = q->klens = NULL;
	q->gens = NULL;
	q->kused = q->kcap = 0;
	q->n = q->cap = 0;
	if (g.pl->unpublish(r, &k, g.cl->self_id, b->gens, NULL, 0,
			    evq_sent, b) < 0)
		evq_sent(b);
}

/* Room for one more entry of klen bytes; false when out of memory. */
static bool evq_room(struct evq *q, size_t klen)
{
	if (q->n == q->cap) {
		unsigned cap = q->cap ? q->cap * 2 : 64;
		size_t *o = realloc(q->koff, cap * sizeof(*o));
		if (o)
			q->koff = o;
		size_t *l = realloc(q->klens, cap * sizeof(*l));
		if (l)
			q->klens = l;
		uint64_t *gs = realloc(q->gens, cap * sizeof(*gs));
		if (gs)
			q->gens = gs;
		if (!o || !l || !gs)
			return false;
		q->cap = cap;
	}
	if (q->kused + klen > q->kcap) {
		size_t cap = PC_MAX(q->kcap * 2, q->kused + klen);
		cap = PC_MAX(cap, (size_t)4096);
		char *kb = realloc(q->kbuf, cap);
		if (!kb)
			return false;
		q->kbuf = kb;
		q->kcap = cap;
	}
	return true;
}

/* Queue the unpublish of an evicted page's record (that generation only). */
static void evq_add(const char *key, size_t klen, uint64_t gen)
{
	struct evq *q = t_evq;
	if (!q || q->stopped || klen > KV_KEY_MAX)
		return;
	if (!evq_room(q, klen))
		return; /* the stale record stays: reads of it miss */
	memcpy(q->kbuf + q->kused, key, klen);
	q->koff[q->n] = q->kused;
	q->klens[q->n] = klen;
	q->gens[q->n++] = gen;
	q->kused += klen;
	met_inc(g.ev_pub);
	if (!rx_timer_armed(&q->flush))
		rx_timer_start(q->r, &q->flush, 0, 0);
}

/* Pool eviction: the next tier may keep the page (it then publishes the
 * record non-resident); otherwise the record must go. */
static void on_evict(void *arg, const char *key, size_t klen, uint64_t gen)
{
	(void)arg;
	PC_ASSERT(klen > 0 && gen != 0);
	struct tier_page pg = {key, klen, gen};
	if (g.tier->offer(&pg) == 0) {
		met_inc(g.tier_kept);
		return;
	}
	evq_add(key, klen, gen);
}

/* ------------------------------------------------------------------ keys */

/* A batch's keys, copied into its arena (async work outlives the
 * caller's buffers). */
struct keys {
	unsigned n;
	const char **k;
	size_t *len;
};

/* Lay the keys of items out in a (both passes). */
static void keys_layout(struct pc_arena *a, struct keys *ks,
			const struct kv_item *it, unsigned n)
{
	ks->n = n;
	ks->k = pc_arena_take(a, n * sizeof(*ks->k));
	ks->len = pc_arena_take(a, n * sizeof(*ks->len));
	for (unsigned i = 0; i < n; i++) {
		char *c = pc_arena_take(a, it[i].klen);
		if (!c)
			continue; /* planning */
		memcpy(c, it[i].key, it[i].klen);
		ks->k[i] = c;
		ks->len[i] = it[i].klen;
	}
}

/* A batch the API accepts: 1..KV_BATCH_MAX keys of 1..KV_KEY_MAX bytes. */
static bool items_valid(const struct kv_item *it, unsigned n)
{
	if (n == 0 || n > KV_BATCH_MAX)
		return false;
	for (unsigned i = 0; i < n; i++)
		if (it[i].klen == 0 || it[i].klen > KV_KEY_MAX)
			return false;
	return true;
}

static struct dir_keys dir_keys_of(const struct keys *ks, unsigned from)
{
	return (struct dir_keys){ks->k + from, ks->len + from, ks->n - from};
}

/* --------------------------------------------------------------- staging */

static int kv_hold(uint64_t bytes)
{
	return pc_budget_hold(&g.staging, bytes);
}

static void kv_release(uint64_t bytes)
{
	pc_budget_release(&g.staging, bytes);
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
	const struct ph_api *h = g.health;
	return h && h->suspect(r->node);
}

/* -------------------------------------------------------------- publish */

struct publish {
	unsigned n;
	bool *ok;
	struct dir_rec *recs;
	bool *pub_ok;       /* per record: placement stored it */
	unsigned *pub_idx;  /* record -> item index */
	const char **pk;    /* record -> key (the caller's, copied by
			     * placement before publish returns) */
	size_t *pl;
	unsigned npub;
	kv_freed_fn freed;
	kv_done_fn done;
	void *arg;
	bool placing;        /* inside placement's publish */
	bool placed;         /* ... which answered before it returned */
	uint64_t t0;
	uint64_t deadline;
	/* copying (client memory: in slices, modules/copier.h) */
	struct rx_reactor *r;
	const struct kv_item *it; /* the caller's, valid until done */
	enum kv_src src;
	unsigned cur;        /* next item to copy */
	struct pool_ref ref; /* the reservation being copied into */
	struct copier_job job;
	struct rx_timer walk; /* resumes the walk in the next pass */
};

static struct publish *publish_layout(struct pc_arena *a, unsigned n)
{
	struct publish *p = pc_arena_take(a, sizeof(*p));
	bool *ok = pc_arena_take(a, n * sizeof(*ok));
	struct dir_rec *recs = pc_arena_take(a, n * sizeof(*recs));
	bool *pub_ok = pc_arena_take(a, n * sizeof(*pub_ok));
	unsigned *pub_idx = pc_arena_take(a, n * sizeof(*pub_idx));
	const char **pk = pc_arena_take(a, n * sizeof(*pk));
	size_t *pl = pc_arena_take(a, n * sizeof(*pl));
	if (p)
		*p = (struct publish){.n = n, .ok = ok, .recs = recs,
				      .pub_ok = pub_ok, .pub_idx = pub_idx,
				      .pk = pk, .pl = pl};
	return p;
}

static void publish_finish(struct publish *p)
{
	for (unsigned i = 0; i < p->npub; i++)
		p->ok[p->pub_idx[i]] = p->pub_ok[i];
	met_observe_ns(g.lat_write, pc_now_ns() - p->t0);
	op_end(p->deadline);
	p->done(p->arg, p->ok, p->n);
	free(p); /* the arena */
}

static void publish_published(void *arg)
{
	struct publish *p = arg;
	if (p->placing)
		p->placed = true; /* publish_next finishes */
	else
		publish_finish(p);
}

/* The record of this node's page at addr (its header), len, gen. */
static void own_rec(struct dir_rec *r, uintptr_t addr, uint64_t len,
		    uint64_t gen)
{
	r->found = true;
	r->resident = true;
	pc_strcpy(r->node, sizeof(r->node), g.cl->self_id);
	pc_strcpy(r->data, sizeof(r->data), g.cl->self_data);
	r->addr = addr;
	r->len = (uint32_t)len;
	r->gen = gen;
	r->rkey = g.rkey;
	PC_DASSERT(g.pl->is_here(r));
}

/* The page of it is in the pool (sum: its checksum when have_sum): commit
 * it and fill the record for placement. */
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
	own_rec(r, addr, it->len, gen);
	struct tier_page pg = {it->key, it->klen, gen};
	g.tier->committed(&pg, it->len); /* write-through: queued, never waits */
	return true;
}

/* Item p->cur's page is committed: its record goes to placement. */
static void publish_add(struct publish *p)
{
	const struct kv_item *it = &p->it[p->cur];
	p->pk[p->npub] = it->key;
	p->pl[p->npub] = it->klen;
	p->pub_idx[p->npub++] = p->cur;
}

/* The copy of item p->cur ended (p->job.res): commit or give the space
 * back. */
static void publish_settle(struct publish *p)
{
	const struct kv_item *it = &p->it[p->cur];
	if (p->job.res < 0)
		pool_abort(g.pool, &p->ref);
	else if (publish_commit(it, &p->ref, p->job.sum, p->job.sumv,
				&p->recs[p->npub]))
		publish_add(p);
}

static void publish_next(struct publish *p, bool resumed);

static void publish_walk_fired(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	rx_stall_tag("kv.set walk");
	publish_next(PC_CONTAINER_OF(t, struct publish, walk), true);
}

static void publish_copied(struct copier_job *j)
{
	struct publish *p = j->arg;
	publish_settle(p);
	/* Cancelled: the client gave the memory up (copier_cancel_range) and
	 * node memory replaced it, so no later item's source is its page. */
	p->cur = j->res == -ECANCELED ? p->n : p->cur + 1;
	publish_next(p, false);
}

/* Copy the items from p->cur on into the pool — KV_SRC_NOW at once, the
 * others in slices (a job left under way resumes here through
 * publish_copied) — then send the records to placement. */
static void publish_next(struct publish *p, bool resumed)
{
	unsigned here = walk_here(resumed);
	for (; p->cur < p->n; p->cur++) {
		const struct kv_item *it = &p->it[p->cur];
		uint8_t *dst;
		if (it->klen == 0 || it->klen > KV_KEY_MAX)
			continue;
		/* Node memory kept for the call: its walk goes in slices.
		 * Sources valid during the call only are all copied in it;
		 * a client's are walked in one go (between two of its pages
		 * it could give the memory up unseen: copier_cancel_range
		 * sees only copies under way), their copies in slices. */
		if (p->src == KV_SRC_KEPT && !walk_take(p->r, &here)) {
			walk_later(p->r, &p->walk, publish_walk_fired);
			return;
		}
		/* Already here: publish its record again, and answer as that
		 * publish does. An earlier set may have stored the page but
		 * not its record (no owner reachable), and the page would
		 * stay unfindable while the set said true. */
		const uint8_t *hdr;
		uint64_t len, gen;
		struct pool_ref ref;
		if (pool_get(g.pool, it->key, it->klen, &ref, &hdr, &len,
			     &gen) == 0) {
			own_rec(&p->recs[p->npub], (uintptr_t)hdr, len, gen);
			pool_unpin(g.pool, &ref);
			publish_add(p);
			continue;
		}
		if (it->len == 0 || it->len > UINT32_MAX ||
		    pool_reserve(g.pool, it->key, it->klen, it->len, &p->ref,
				 &dst) < 0)
			continue;
		if (p->src == KV_SRC_NOW) {
			pc_copy(dst, it->data, it->len);
			if (publish_commit(it, &p->ref, false, 0,
					   &p->recs[p->npub]))
				publish_add(p);
			continue;
		}
		p->job = (struct copier_job){
			.dst = dst, .src = it->data, .len = it->len,
			.guarded = p->src == KV_SRC_CLIENT, .sum = g.checksums,
			.done = publish_copied, .arg = p};
		if (copier_copy(p->r, &p->job) == 0)
			return; /* resumes in publish_copied */
		publish_settle(p);
	}
	struct dir_keys k = {p->pk, p->pl, p->npub};
	p->placing = true;
	if (p->npub == 0 ||
	    g.pl->publish(p->r, &k, p->recs, p->pub_ok, p->deadline,
			  publish_published, p) < 0) {
		memset(p->pub_ok, 0, p->n * sizeof(bool));
		publish_finish(p); /* callers of publish accept an early done */
		return;
	}
	p->placing = false;
	if (p->placed) {
		publish_finish(p);
		return;
	}
	/* Placement copied the keys and waits on its owners (maybe until
	 * the deadline, a frozen one): the items are free to go now. */
	if (p->freed)
		p->freed(p->arg);
}

static int kv_publish(struct rx_reactor *rr, const struct kv_item *it,
		      unsigned n, enum kv_src src, kv_freed_fn freed,
		      kv_done_fn done, void *arg)
{
	if (n == 0 || n > KV_BATCH_MAX)
		return -EINVAL;
	struct pc_arena a;
	pc_arena_plan(&a);
	publish_layout(&a, n);
	if (!pc_arena_alloc(&a))
		return -ENOMEM;
	struct publish *p = publish_layout(&a, n);
	p->freed = freed;
	p->done = done;
	p->arg = arg;
	p->t0 = pc_now_ns();
	p->deadline = op_deadline();
	p->r = rr;
	p->it = it;
	p->src = src;
	met_inc(g.wr_req);
	publish_next(p, false);
	return 0;
}

/* A record a lookup returned, for the read cache (when on): another node's
 * (rc_put keeps only found, resident ones). */
static void cache_learn(const char *key, size_t klen, const struct dir_rec *r,
			uint64_t now)
{
	if (g.rcache && r->found && !g.pl->is_here(r))
		rc_put(g.rcache, key, klen, r, now);
}

/* ---------------------------------------------------------------- fetch */

/* An item's state: during a fetch's local pass (PINNED, READY); its record
 * taken from the read cache (CACHED); to be looked up again (AGAIN). */
enum { LOC_NONE, LOC_PINNED, LOC_READY, LOC_CACHED, LOC_AGAIN };

struct fetch;

/* A record whose producer is asked to promote its page (fetch_promoted). */
struct fetch_pr {
	struct fetch *f;
	unsigned j;
	bool promoted; /* the producer promoted it: read, a disk hit */
};

/* A remote page checked as its bytes landed (fetch_landed), while they
 * are likely still in this CPU's caches, rather than all of a call's
 * pages once the last arrived: the checksums are up to a fifth of a
 * remote get's time at 256 KiB pages, and a kv.get of 32 such pages
 * through a reading node ran 1.11x faster checked this way (medians,
 * bench/README.md "SGLang shim"). */
struct fetch_check {
	struct fetch *f;
	unsigned k;   /* the read */
	int res;      /* pool_hdr_check_split's */
	bool have;
};

struct fetch {
	struct rx_reactor *r;
	unsigned n;
	struct keys ks;
	uint8_t **at;        /* where page i lands: the caller's destination,
			      * or (staging) a place in stage[] */
	uint64_t *want;      /* wanted length; 0 = any */
	uint64_t *len;       /* the page's length when ok */
	bool *ok;
	bool client_mem;
	bool staging;        /* get: pages go to buffers of kv's own */
	uint64_t stage_max;  /* get: page bytes the call may stage */
	struct pc_block_set stage; /* get: local pages' block, remote
				    * pages' block, those looked up again
				    * (f->again); from the reactor's warm
				    * blocks (rx_reactor_blocks) */
	uint8_t *loc;        /* LOC_* per item */
	struct pool_ref *refs; /* local pass: pinned entries */
	const uint8_t **src; /* local pass: pinned payloads */
	/* The lookup's and the reads' state, per record: allocated (one
	 * arena, fetch_remote_alloc) for the items the local pass did not
	 * find, when the lookup starts; none when it found them all. */
	void *remote;        /* the allocation (NULL: none yet) */
	unsigned cap;        /* records it holds */
	uint8_t (*hdr)[POOL_HDR_BYTES]; /* remote pages' headers, by record */
	struct dir_rec *recs;
	unsigned *ridx;      /* record -> item */
	const char **lk;     /* record -> key (for the lookup) */
	size_t *ll;
	unsigned nrec;
	unsigned ncached;    /* records [0, ncached) came from the read cache */
	bool again;          /* the second lookup: of records from the read
			      * cache, or from this node's own directory
			      * replica, that did not read */
	bool again_own;      /* ... some from this node's own replica */
	struct tp_read *reads;
	struct fetch_check *checks; /* per read: its page's check, when done
				     * as it landed */
	unsigned *readr;     /* read -> record */
	unsigned nreads;
	struct fetch_pr *pr; /* record -> its remote promotion */
	unsigned promoting;  /* remote promotions not answered yet */
	kv_done_fn done;     /* fetch */
	kv_got_fn got;       /* get */
	void *arg;
	uint64_t t0;
	uint64_t staged;     /* bytes of stage[] taken from the node's budget */
	int refused;         /* -E2BIG (call over its cap), -EBUSY (node) */
	uint64_t deadline;
	unsigned read_ms;    /* the reads' timeout */
	/* local pins, in slices (walk_take) */
	unsigned pinned;     /* items [0, pinned) tried */
	uint64_t pin_need;   /* get: bytes of the pinned pages to stage */
	struct rx_timer walk; /* resumes the pins in the next pass */
	/* local copies (client memory: in slices, modules/copier.h) */
	unsigned cur;        /* next item of the local pass to copy */
	uint8_t *stage_cur;  /* get: where the next local page is staged */
	struct copier_job job;
	/* get: staging just mapped, faulted in off the reactor first */
	struct rx_offload warm;
	unsigned warm_block; /* f->stage's: 0 local pages, else remote */
	uint64_t warm_len;
};

static struct fetch *fetch_layout(struct pc_arena *a, const struct kv_item *it,
				  unsigned n)
{
	struct fetch *f = pc_arena_take(a, sizeof(*f));
	struct keys ks;
	keys_layout(a, &ks, it, n);
	uint8_t **at = pc_arena_take(a, n * sizeof(*at));
	uint64_t *want = pc_arena_take(a, n * sizeof(*want));
	uint64_t *len = pc_arena_take(a, n * sizeof(*len));
	bool *ok = pc_arena_take(a, n * sizeof(*ok));
	uint8_t *loc = pc_arena_take(a, n * sizeof(*loc));
	struct pool_ref *refs = pc_arena_take(a, n * sizeof(*refs));
	const uint8_t **src = pc_arena_take(a, n * sizeof(*src));
	if (f)
		*f = (struct fetch){.n = n, .ks = ks, .at = at, .want = want,
				    .len = len, .ok = ok, .loc = loc,
				    .refs = refs, .src = src};
	return f;
}

/* The per-record arrays for m records, in a (both passes). */
static void fetch_remote_layout(struct pc_arena *a, struct fetch *f,
				unsigned m)
{
	uint8_t (*hdr)[POOL_HDR_BYTES] = pc_arena_take(a, m * sizeof(*hdr));
	struct dir_rec *recs = pc_arena_take(a, m * sizeof(*recs));
	unsigned *ridx = pc_arena_take(a, m * sizeof(*ridx));
	const char **lk = pc_arena_take(a, m * sizeof(*lk));
	size_t *ll = pc_arena_take(a, m * sizeof(*ll));
	struct tp_read *reads = pc_arena_take(a, m * sizeof(*reads));
	struct fetch_check *checks = pc_arena_take(a, m * sizeof(*checks));
	unsigned *readr = pc_arena_take(a, m * sizeof(*readr));
	struct fetch_pr *pr = pc_arena_take(a, m * sizeof(*pr));
	if (!pr)
		return; /* planning (m > 0: the real pass takes memory) */
	f->cap = m;
	f->hdr = hdr;
	f->recs = recs;
	f->ridx = ridx;
	f->lk = lk;
	f->ll = ll;
	f->reads = reads;
	f->checks = checks;
	f->readr = readr;
	f->pr = pr;
}

/* Room for the records of the items not found here (m of them): false
 * when out of memory. Taken once; a second lookup (f->again) asks again
 * for some of the same items, so it fits. */
static bool fetch_remote_alloc(struct fetch *f, unsigned m)
{
	if (f->remote) {
		PC_ASSERT(m <= f->cap);
		return true;
	}
	struct pc_arena a;
	pc_arena_plan(&a);
	fetch_remote_layout(&a, f, m);
	f->remote = pc_arena_alloc(&a);
	if (!f->remote)
		return false;
	fetch_remote_layout(&a, f, m);
	return true;
}

static void fetch_free(struct fetch *f)
{
	if (f->staged)
		kv_release(f->staged);
	pc_block_set_put(&f->stage); /* unless the got callback took them */
	free(f->remote);
	free(f); /* the arena */
}

static void fetch_finish(struct fetch *f)
{
	unsigned hits = 0;
	uint64_t bytes = 0;
	for (unsigned i = 0; i < f->n; i++) {
		hits += f->ok[i];
		bytes += f->ok[i] ? f->len[i] : 0;
	}
	met_add(g.rd_hit, hits);
	met_add(g.rd_bytes, bytes);
	met_add(g.rd_miss, f->n - hits);
	met_observe_ns(g.lat_read, pc_now_ns() - f->t0);
	if (f->nrec)
		op_end(f->deadline); /* all local: no deadline to run into */
	if (f->got) {
		struct kv_got got = {f->n, f->ok, f->len, f->at, f->staged,
				     f->refused, &f->stage};
		f->got(f->arg, &got);
	} else {
		f->done(f->arg, f->ok, f->n);
	}
	fetch_free(f);
}

/*
 * Take len bytes of staging for a page the call must hold itself (get):
 * within the call's stage_max and the node's kv_staging_max. The first
 * refusal sticks: nothing more is staged, and the caller is told.
 */
static int stage_take(struct fetch *f, uint64_t len)
{
	if (f->refused)
		return f->refused;
	if (f->staged + len > f->stage_max) {
		f->refused = -E2BIG;
		return f->refused;
	}
	if (kv_hold(len) < 0) {
		f->refused = -EBUSY;
		return f->refused;
	}
	f->staged += len;
	return 0;
}

/* May item i take a page of len bytes (its size fits; staged: the call's
 * staging has room)? */
static bool fetch_dest_ok(struct fetch *f, unsigned i, uint64_t len)
{
	if (f->want[i] && f->want[i] != len)
		return false; /* a page of another size is a miss */
	return f->at[i] || stage_take(f, len) == 0;
}

/* One staging block of need bytes; false when out of memory. */
static bool stage_block(struct fetch *f, unsigned which, uint64_t need)
{
	PC_ASSERT(f->staging && !f->stage.b[which].p && need <= f->staged);
	return pc_block_set_take(&f->stage, which, PC_MAX(need, 1)) != NULL;
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

static void fetch_lookup(struct fetch *f);
static bool fetch_local_copies(struct fetch *f);
static void fetch_reads_issue(struct fetch *f);

/* f->stage's block for remote pages: the first lookup's, or the one of
 * those looked up again (block 0 holds the local pages). */
static unsigned remote_block(const struct fetch *f)
{
	return f->again ? 2 : 1;
}

/* Milliseconds left of the call's deadline. */
static uint64_t fetch_left_ms(const struct fetch *f)
{
	uint64_t now = pc_now_ns();
	return now < f->deadline ? (f->deadline - now) / 1000000u : 0;
}

/*
 * Staging the reactor's warm blocks had none to fit is a new mapping: the
 * pages landing in it, by copy slices or by receives, would fault every
 * 4 KiB in on the reactor — about 10 us each in a VM, so 1.5-2 ms per
 * 512 KiB slice, a stall per slice on a fresh node's first large gets
 * (and on every get whose staging the warm blocks cannot keep). It is
 * faulted in on the offload thread first, then the get goes on.
 */
static void stage_warm_work(struct rx_offload *o)
{
	struct fetch *f = PC_CONTAINER_OF(o, struct fetch, warm);
	pc_block_fault_in(f->stage.b[f->warm_block].p, f->warm_len);
}

static void stage_warmed(struct rx_reactor *r, struct rx_offload *o)
{
	(void)r;
	struct fetch *f = PC_CONTAINER_OF(o, struct fetch, warm);
	met_add(g.stage_warmed, f->warm_len);
	if (f->warm_block)
		fetch_reads_issue(f);
	else
		fetch_local_copies(f);
}

/* need bytes of staging block which are about to be written: when the
 * block is fresh, fault them in off the reactor, resuming the reads (a
 * remote block) or the local copies (block 0) in stage_warmed. True when
 * that is queued; false (go on now) when the block is warm or no offload
 * thread takes it. */
static bool stage_warm(struct fetch *f, unsigned which, uint64_t need)
{
	const struct pc_block *b = &f->stage.b[which];
	if (!b->p || !b->fresh)
		return false;
	f->warm = (struct rx_offload){.work = stage_warm_work,
				      .done = stage_warmed,
				      .lane = RX_LANE_BULK};
	f->warm_block = which;
	f->warm_len = need;
	return rx_offload(f->r, &f->warm) == 0;
}

/* Read k's page against its record: header, and checksum when on. */
static int fetch_check_page(struct fetch *f, unsigned k, const void *dst)
{
	unsigned ri = f->readr[k];
	const struct dir_rec *r = &f->recs[ri];
	unsigned i = f->ridx[ri];
	uint64_t hi, lo;
	pool_key_hash(f->ks.k[i], f->ks.len[i], &hi, &lo);
	return pool_hdr_check_split(f->hdr[ri], dst, r->len, hi, lo, r->gen,
				    r->len, g.checksums,
				    f->client_mem ? guarded_sum : NULL);
}

/* tp_read.landed: read k's bytes are all here, likely still in cache. */
static void fetch_landed(void *arg, const struct tp_read *rd)
{
	struct fetch_check *c = arg;
	c->res = fetch_check_page(c->f, c->k, rd->dst);
	c->have = true;
}

/*
 * Did a read find no page of its record where the record says (the bytes
 * came and are another page, or the producer has no page there)? Not a
 * transport failure, after which the producer is no different.
 */
static bool read_names_no_page(const struct tp_read *rd)
{
	return rd->res == 0 || rd->res == -ENOENT || rd->res == -ERANGE ||
	       rd->res == -EFAULT;
}

static void fetch_read_done(void *arg, struct tp_read *reads, unsigned n)
{
	struct fetch *f = arg;
	/* Records from the read cache, or from this node's own directory
	 * replica (which may have missed a newer publish), that do not read
	 * are looked up again (the other owners first), once, if the call
	 * has time left. An own record counts as behind the others' only
	 * when its producer has no such page; a transport failure counts as
	 * a failed read, as without the second lookup. */
	bool may_again = !f->again && pc_now_ns() < f->deadline;
	unsigned again = 0;
	for (unsigned j = 0; j < n; j++) {
		unsigned ri = f->readr[j];
		struct dir_rec *r = &f->recs[ri];
		unsigned i = f->ridx[ri];
		int bad = reads[j].res;
		if (!bad) /* checked as it landed (every transport runs the
			   * hook of a read that succeeded); else now */
			bad = f->checks[j].have
				      ? f->checks[j].res
				      : fetch_check_page(f, j, reads[j].dst);
		if (bad) {
			bool cached = ri < f->ncached;
			bool guess = cached || r->own_replica;
			if (cached)
				rc_forget(g.rcache, f->ks.k[i], f->ks.len[i],
					  r->node, r->gen);
			met_inc(!(guess && may_again)	      ? g.rd_fail
				: cached		      ? g.rc_stale
				: read_names_no_page(&reads[j]) ? g.own_stale
								: g.rd_fail);
			PC_LOGD(LOG_MOD, "remote page from %s failed%s: %s",
				r->data, cached ? " (a cached record)"
				: r->own_replica ? " (this node's replica)"
						 : "",
				strerror(-bad));
			if (g.health && ph_evidence(reads[j].res, f->read_ms))
				g.health->failed(r->node, reads[j].res,
							  "data read");
			if (guess && may_again) {
				f->again_own |= !cached;
				/* Staged: a place of its new length, then. */
				if (f->staging)
					f->at[i] = NULL;
				f->loc[i] = LOC_AGAIN;
				again++;
			}
			continue;
		}
		f->ok[i] = true;
		f->len[i] = r->len;
		met_inc(f->pr[ri].promoted ? g.rd_tier : g.rd_remote);
		met_add(g.landed, r->len);
	}
	if (again) {
		f->again = true;
		fetch_lookup(f);
		return;
	}
	fetch_finish(f);
}

static void promote_done(void *arg, int res)
{
	(void)arg;
	if (res < 0)
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "a page could not be promoted "
			  "from the %s tier: %s", g.tier->name, strerror(-res));
}

/* A page this node produced lives in the next tier: ask for it back. This
 * get misses; the next one finds the page in memory. A page the tier is
 * bringing back (this ask or one under way) counts as a tier hit. */
static void fetch_promote(struct fetch *f, unsigned i, const struct dir_rec *r)
{
	int ret = g.tier->promote(f->r, f->ks.k[i], f->ks.len[i], r,
				  promote_done, NULL);
	if (ret == 0)
		met_inc(g.promotes);
	if (ret == 0 || ret == -EALREADY)
		met_inc(g.rd_tier);
}

/* Should record j be read from its producer? Staging is taken for it. */
static bool fetch_wants_read(struct fetch *f, unsigned j)
{
	struct dir_rec *r = &f->recs[j];
	unsigned i = f->ridx[j];
	if (!r->found)
		return false;
	if (!r->resident) { /* in a lower tier (another node's: its
			     * promotion did not come back, fetch_promoted) */
		if (g.pl->is_here(r))
			fetch_promote(f, i, r);
		return false;
	}
	/* Our own record but no page here: evicted since. */
	if (g.pl->is_here(r))
		return false;
	if (producer_suspect(r)) { /* not answering: a miss now */
		met_inc(g.rd_suspect);
		return false;
	}
	return fetch_dest_ok(f, i, r->len);
}

/* Read what the records name (after the remote promotions): which ones,
 * and their staging; then fetch_reads_issue. */
static void fetch_reads(struct fetch *f)
{
	/* The reads get what the lookup left of the budget. */
	uint64_t left_ms = fetch_left_ms(f);
	uint64_t need = 0; /* staging for the remote pages */
	for (unsigned j = 0; j < f->nrec && left_ms; j++) {
		if (!fetch_wants_read(f, j))
			continue;
		unsigned i = f->ridx[j];
		if (!f->at[i])
			need += f->recs[j].len;
		f->readr[f->nreads++] = j;
	}
	unsigned block = remote_block(f);
	if (need && !f->refused && !stage_block(f, block, need)) {
		fetch_finish(f); /* out of memory: misses */
		return;
	}
	if (need && !f->refused && stage_warm(f, block, need))
		return; /* resumes in stage_warmed */
	fetch_reads_issue(f);
}

/* The reads fetch_reads chose, into their places (staging faulted in by
 * then), within what is left of the call's deadline. */
static void fetch_reads_issue(struct fetch *f)
{
	uint64_t left_ms = fetch_left_ms(f);
	uint8_t *stage = f->stage.b[remote_block(f)].p;
	for (unsigned k = 0; k < f->nreads; k++) {
		struct dir_rec *r = &f->recs[f->readr[k]];
		unsigned i = f->ridx[f->readr[k]];
		if (!f->at[i] && stage) {
			f->at[i] = stage;
			stage += r->len;
		}
		struct tp_read *rd = &f->reads[k];
		snprintf(rd->peer, sizeof(rd->peer), "%s", r->data);
		rd->rkey = r->rkey;
		rd->addr = r->addr;
		rd->len = POOL_HDR_BYTES + r->len;
		rd->hdr = f->hdr[f->readr[k]];
		rd->hdr_len = POOL_HDR_BYTES;
		rd->dst = f->at[i]; /* the payload lands here: no copy */
		rd->node = r->node; /* f->recs outlive the batch */
		f->checks[k] = (struct fetch_check){.f = f, .k = k};
		rd->landed = fetch_landed;
		rd->landed_arg = &f->checks[k];
		rd->landed_ran = false;
	}
	f->read_ms = (unsigned)PC_MIN(left_ms, (uint64_t)g.read_timeout_ms);
	if (f->nreads == 0 || f->refused || f->read_ms == 0 ||
	    g.tp->ops->read_batch(g.tp->clients[rx_reactor_id(f->r)],
				      f->reads, f->nreads, f->read_ms,
				      fetch_read_done, f) < 0)
		fetch_finish(f);
}

/* A producer answered the promotion of record pr->j's page: read it from
 * its fresh (resident) record; without one, the record stays non-resident
 * and the page is a miss. */
static void fetch_promoted(void *arg, int res, const struct dir_rec *fresh)
{
	struct fetch_pr *pr = arg;
	struct fetch *f = pr->f;
	if (res == 0) {
		f->recs[pr->j] = *fresh;
		pr->promoted = true;
	}
	if (--f->promoting == 0)
		fetch_reads(f);
}

/*
 * Records of pages on another node's disk (non-resident): ask their
 * producers to promote them (the tier batches per producer and shares
 * one request per key), then read every page — the reads wait for the
 * answers, all within the call's deadline. Pages this node's tier holds
 * are promoted in fetch_wants_read, without waiting.
 */
static void fetch_looked_up(void *arg)
{
	struct fetch *f = arg;
	uint64_t now = pc_now_ns();
	for (unsigned j = f->ncached; j < f->nrec; j++)
		cache_learn(f->lk[j], f->ll[j], &f->recs[j], now);
	f->promoting = 1; /* until every producer was asked */
	for (unsigned j = 0; j < f->nrec && pc_now_ns() < f->deadline; j++) {
		struct dir_rec *r = &f->recs[j];
		unsigned i = f->ridx[j];
		if (!r->found || r->resident || g.pl->is_here(r) ||
		    (f->want[i] && f->want[i] != r->len))
			continue;
		if (producer_suspect(r)) { /* not answering: a miss now */
			met_inc(g.rd_suspect);
			continue;
		}
		f->pr[j] = (struct fetch_pr){f, j, false};
		if (g.tier->promote_remote(f->r, f->ks.k[i], f->ks.len[i], r,
					   f->deadline, fetch_promoted,
					   &f->pr[j]) == 0)
			f->promoting++;
	}
	if (--f->promoting == 0)
		fetch_reads(f);
}

/* Pin item i's page if this node holds it and the item may take it. */
static void fetch_local_pin(struct fetch *f, unsigned i)
{
	const uint8_t *hdr;
	uint64_t len, gen;
	if (pool_get(g.pool, f->ks.k[i], f->ks.len[i], &f->refs[i], &hdr, &len,
		     &gen) < 0)
		return;
	f->loc[i] = LOC_PINNED;
	f->src[i] = hdr + POOL_HDR_BYTES;
	f->len[i] = len;
	if (fetch_dest_ok(f, i, len))
		f->loc[i] = LOC_READY;
}

/* Item i's copy out of the pool ended with res (0: the page is there):
 * count it, and unpin the page. */
static void fetch_local_settle(struct fetch *f, unsigned i, int res)
{
	if (res == 0) {
		f->ok[i] = true;
		met_inc(g.rd_local);
		met_add(g.copy_get_local, f->len[i]);
	}
	pool_unpin(g.pool, &f->refs[i]);
	f->loc[i] = LOC_NONE;
}

static void fetch_copied(struct copier_job *j)
{
	struct fetch *f = j->arg;
	fetch_local_settle(f, f->cur, j->res);
	f->cur++;
	fetch_local_copies(f);
}

/* Copy the pinned pages from f->cur on — into a fetch's destinations at
 * once, into client memory or staging in slices (resuming in
 * fetch_copied) — then look the others up. True when it stopped for a
 * copy going on in slices; false when it went on (f may be gone). */
static bool fetch_local_copies(struct fetch *f)
{
	for (; f->cur < f->n; f->cur++) {
		unsigned i = f->cur;
		if (f->loc[i] == LOC_NONE)
			continue;
		if (f->loc[i] == LOC_READY && !f->at[i] && f->stage_cur) {
			f->at[i] = f->stage_cur;
			f->stage_cur += f->len[i];
		}
		if (f->loc[i] != LOC_READY || !f->at[i]) {
			fetch_local_settle(f, i, -ENOENT);
			continue;
		}
		if (!f->client_mem && !f->staging) {
			pc_copy(f->at[i], f->src[i], f->len[i]);
			fetch_local_settle(f, i, 0);
			continue;
		}
		/* Into staging too: get's caller bounds how many gets that
		 * copy in slices it lets one client start (kv.get holds the
		 * client's input meanwhile), or a client pipelining gets
		 * would have every one of them hold its staging at once. */
		f->job = (struct copier_job){
			.dst = f->at[i], .src = f->src[i], .len = f->len[i],
			.guarded = f->client_mem, .done = fetch_copied,
			.arg = f};
		if (copier_copy(f->r, &f->job) == 0)
			return true; /* resumes in fetch_copied */
		fetch_local_settle(f, i, f->job.res);
	}
	fetch_lookup(f);
	return false;
}

static bool fetch_locals(struct fetch *f, bool resumed);

static void fetch_walk_fired(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	rx_stall_tag("kv.get walk");
	fetch_locals(PC_CONTAINER_OF(t, struct fetch, walk), true);
}

/* Pages this node holds: all pinned (in slices, walk_take) before any is
 * copied, so that what get stages for them is one block; then copied and
 * unpinned (fetch_local_copies, whose answer it returns). True when it
 * stopped to go on later (the next pass, or copies in slices). */
static bool fetch_locals(struct fetch *f, bool resumed)
{
	unsigned here = walk_here(resumed);
	for (; f->pinned < f->n; f->pinned++) {
		if (!walk_take(f->r, &here)) {
			walk_later(f->r, &f->walk, fetch_walk_fired);
			return true;
		}
		unsigned i = f->pinned;
		fetch_local_pin(f, i);
		if (f->loc[i] == LOC_READY && !f->at[i])
			f->pin_need += f->len[i];
	}
	uint64_t need = f->pin_need;
	if (need && stage_block(f, 0, need))
		f->stage_cur = f->stage.b[0].p;
	f->cur = 0;
	if (need && stage_warm(f, 0, need))
		return true; /* resumes in stage_warmed */
	return fetch_local_copies(f);
}

/*
 * Fetch items: into their data (dst) when staging is false, else into
 * blocks of kv's own (get). done or got runs once, maybe before this
 * returns (callers accept that).
 */
static int fetch_start(struct rx_reactor *r, const struct kv_item *it,
		       unsigned n, bool client_mem, bool staging,
		       uint64_t stage_max, kv_done_fn done, kv_got_fn got,
		       void *arg)
{
	if (!items_valid(it, n))
		return -EINVAL;
	for (unsigned i = 0; i < n && !staging; i++)
		if (!it[i].data)
			return -EINVAL; /* fetch: every page has a destination */
	struct pc_arena a;
	pc_arena_plan(&a);
	fetch_layout(&a, it, n);
	if (!pc_arena_alloc(&a))
		return -ENOMEM;
	struct fetch *f = fetch_layout(&a, it, n);
	f->r = r;
	f->client_mem = client_mem;
	f->staging = staging;
	f->stage.home = rx_reactor_blocks(r);
	f->stage_max = stage_max;
	f->done = done;
	f->got = got;
	f->arg = arg;
	f->t0 = pc_now_ns();
	f->deadline = op_deadline();
	for (unsigned i = 0; i < n && !staging; i++) {
		f->at[i] = it[i].data;
		f->want[i] = it[i].len ? it[i].len : UINT64_MAX;
	}
	met_add(g.rd_req, n);
	/* then fetch_lookup, maybe after copy slices: 1 (get's answer) */
	return fetch_locals(f, false);
}

/*
 * Look up what is not here; then the reads (fetch_looked_up). Records the
 * read cache holds come first (f->recs[0, ncached)) and are not looked up;
 * the second time (f->again), only the items whose cached record did not
 * read (LOC_AGAIN) are, and not in the cache.
 */
static void fetch_lookup(struct fetch *f)
{
	uint64_t now = pc_now_ns();
	f->nrec = f->ncached = f->nreads = 0;
	unsigned left = 0;
	for (unsigned i = 0; i < f->n; i++)
		left += !f->ok[i];
	if (!left || f->refused) {
		fetch_finish(f); /* done runs now: callers accept that */
		return;
	}
	if (!fetch_remote_alloc(f, left)) {
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "get of %u keys: out of memory "
			  "for the lookup of %u; they miss", f->n, left);
		fetch_finish(f);
		return;
	}
	if (f->again) /* the records' indexes start over */
		memset(f->pr, 0, f->cap * sizeof(*f->pr));
	for (unsigned i = 0; i < f->n && g.rcache && !f->again; i++) {
		struct dir_rec *r = &f->recs[f->nrec];
		/* A record of another length than the one wanted: the page
		 * may have been replaced since; the directory knows. */
		if (f->ok[i] ||
		    !rc_get(g.rcache, f->ks.k[i], f->ks.len[i], now, r) ||
		    (f->want[i] && f->want[i] != r->len))
			continue;
		f->loc[i] = LOC_CACHED;
		f->ridx[f->nrec++] = i;
	}
	f->ncached = f->nrec;
	for (unsigned i = 0; i < f->n; i++) {
		if (f->ok[i] || f->loc[i] == LOC_CACHED ||
		    (f->again && f->loc[i] != LOC_AGAIN))
			continue; /* local: no placement, no network */
		f->loc[i] = LOC_NONE;
		f->lk[f->nrec] = f->ks.k[i];
		f->ll[f->nrec] = f->ks.len[i];
		f->ridx[f->nrec++] = i;
	}
	/* Nothing is looked up for a call already refused its staging. */
	if (!f->nrec || f->refused) {
		fetch_finish(f); /* done runs now: callers accept that */
		return;
	}
	unsigned nlook = f->nrec - f->ncached;
	struct dir_rec *recs = f->recs + f->ncached;
	memset(recs, 0, nlook * sizeof(*recs));
	struct dir_keys k = {f->lk + f->ncached, f->ll + f->ncached, nlook};
	/* The second time, from the other owners: a record from this node's
	 * own replica that did not read may be older than theirs. */
	unsigned flags = !f->again      ? 0
			 : f->again_own ? PL_LOOKUP_ELSEWHERE
					: PL_LOOKUP_IN_ORDER;
	if (!nlook || g.pl->lookup(f->r, &k, recs, flags, f->deadline,
				   fetch_looked_up, f) < 0)
		fetch_looked_up(f); /* the cached ones alone */
}

static int kv_fetch(struct rx_reactor *r, const struct kv_item *it,
		    unsigned n, bool client_mem, kv_done_fn done, void *arg)
{
	int ret = fetch_start(r, it, n, client_mem, false, 0, done, NULL, arg);
	return ret < 0 ? ret : 0;
}

static int kv_get(struct rx_reactor *r, const struct kv_item *it, unsigned n,
		  uint64_t stage_max, kv_got_fn got, void *arg)
{
	return fetch_start(r, it, n, false, true, stage_max, NULL, got, arg);
}

/* --------------------------------------------------------------- exists */

struct exists_op {
	struct rx_reactor *r;
	struct keys ks;
	unsigned local;       /* leading keys found in the pool */
	unsigned looked;      /* keys [local, looked) read cache's, the rest
			       * looked up */
	struct dir_rec *recs; /* for keys [local, n); allocated when the
			       * walk gets past the pool's leading run (NULL
			       * while it has not — the walk is in the pool
			       * — or when every key was found there) */
	unsigned learned;     /* after the lookup: records [looked, learned)
			       * went to the read cache */
	unsigned counted;     /* ... keys [0, counted) exist */
	struct rx_timer walk; /* resumes a walk in the next pass */
	uint64_t deadline;
	void (*done)(void *arg, unsigned count);
	void *arg;
};

static struct exists_op *exists_layout(struct pc_arena *a,
				       const struct kv_item *it, unsigned n)
{
	struct exists_op *e = pc_arena_take(a, sizeof(*e));
	struct keys ks;
	keys_layout(a, &ks, it, n);
	if (e)
		*e = (struct exists_op){.ks = ks};
	return e;
}

static void exists_finish(struct exists_op *e, unsigned count)
{
	met_add(g.ex_found, count);
	e->done(e->arg, count);
	free(e->recs);
	free(e); /* the arena */
}

/* Does a record name a page a get could read now? */
static bool exists_readable(const struct dir_rec *r)
{
	/* Not resident: promote first. Ours: not in the pool, so evicted.
	 * A suspect producer's page could not be read now. */
	return r->found && r->resident && !g.pl->is_here(r) &&
	       !producer_suspect(r);
}

/* Is a record one of this node's pages, in the pool or in the tier? A page
 * the tier holds counts, and a best-effort promotion starts so that the
 * next get finds it in memory. */
static bool exists_in_tier(struct exists_op *e, unsigned i,
			   const struct dir_rec *r)
{
	if (!r->found || !g.pl->is_here(r))
		return false;
	/* Ours and in the pool after all (past the leading local run, or
	 * promoted since the lookup). */
	if (pool_contains(g.pool, e->ks.k[i], e->ks.len[i]))
		return true;
	if (r->resident || !g.tier->holds(e->ks.k[i], e->ks.len[i]))
		return false;
	if (g.tier->promote(e->r, e->ks.k[i], e->ks.len[i], r, promote_done,
			    NULL) == 0)
		met_inc(g.promotes);
	return true;
}

static void exists_promoted(void *arg, int res, const struct dir_rec *fresh)
{
	(void)arg;
	(void)fresh;
	if (res < 0)
		PC_LOGD(LOG_MOD, "a remote promotion for exists failed: %s",
			strerror(-res));
}

/* Is a record another node's page on its disk (a non-resident record)? It
 * counts unless its producer is suspect, and a best-effort promotion is
 * asked of the producer, so that the next get finds the page in memory. */
static bool exists_remote_tier(struct exists_op *e, unsigned i,
			       const struct dir_rec *r)
{
	if (!r->found || r->resident || g.pl->is_here(r) ||
	    producer_suspect(r))
		return false;
	/* Its own budget: the exists answers now. */
	return g.tier->promote_remote(e->r, e->ks.k[i], e->ks.len[i], r,
				      op_deadline(), exists_promoted,
				      NULL) != -ENOTSUP;
}

static void exists_count(struct exists_op *e, bool resumed);

static void exists_count_fired(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	rx_stall_tag("kv.exists count");
	exists_count(PC_CONTAINER_OF(t, struct exists_op, walk), true);
}

/* The records looked up go to the read cache, then the leading run of
 * readable ones is counted after the pool's (in slices: walk_take). */
static void exists_count(struct exists_op *e, bool resumed)
{
	unsigned here = walk_here(resumed);
	uint64_t now = pc_now_ns();
	for (; g.rcache && e->learned < e->ks.n; e->learned++) {
		if (!walk_take(e->r, &here)) {
			walk_later(e->r, &e->walk, exists_count_fired);
			return;
		}
		unsigned i = e->learned;
		cache_learn(e->ks.k[i], e->ks.len[i], &e->recs[i - e->local],
			    now);
	}
	for (; e->counted < e->ks.n; e->counted++) {
		if (!walk_take(e->r, &here)) {
			walk_later(e->r, &e->walk, exists_count_fired);
			return;
		}
		unsigned i = e->counted;
		const struct dir_rec *r = &e->recs[i - e->local];
		if (!exists_readable(r) && !exists_in_tier(e, i, r) &&
		    !exists_remote_tier(e, i, r))
			break;
	}
	op_end(e->deadline);
	exists_finish(e, e->counted);
}

/* The lookup answered (or the leading run was all): count. */
static void exists_done(void *arg)
{
	struct exists_op *e = arg;
	if (!e->recs) { /* every key in the pool, or no memory for more */
		exists_finish(e, e->local);
		return;
	}
	e->learned = e->looked;
	e->counted = e->local;
	exists_count(e, false);
}

static void exists_walk(struct exists_op *e, bool resumed);

static void exists_walk_fired(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	rx_stall_tag("kv.exists walk");
	exists_walk(PC_CONTAINER_OF(t, struct exists_op, walk), true);
}

/* The leading run of keys in the pool, then the read cache's readable
 * records while they last (in slices: walk_take), then the lookup of the
 * rest. */
static void exists_walk(struct exists_op *e, bool resumed)
{
	unsigned here = walk_here(resumed);
	while (!e->recs && e->local < e->ks.n) {
		if (!walk_take(e->r, &here)) {
			walk_later(e->r, &e->walk, exists_walk_fired);
			return;
		}
		if (!pool_contains(g.pool, e->ks.k[e->local],
				   e->ks.len[e->local]))
			break;
		e->local++;
	}
	if (e->local == e->ks.n) {
		exists_done(e);
		return;
	}
	if (!e->recs) {
		/* The records of the keys past the leading run: a 352-byte
		 * dir_rec a key, so a batch found here whole never takes
		 * (and zeroes) them. Without them the count is the run. */
		e->recs = calloc(e->ks.n - e->local, sizeof(*e->recs));
		if (!e->recs) {
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "exists of %u keys: out "
				  "of memory for the records of %u; counted "
				  "%u found here", e->ks.n,
				  e->ks.n - e->local, e->local);
			exists_done(e);
			return;
		}
		e->looked = e->local;
	}
	uint64_t now = pc_now_ns();
	while (g.rcache && e->looked < e->ks.n) {
		if (!walk_take(e->r, &here)) {
			walk_later(e->r, &e->walk, exists_walk_fired);
			return;
		}
		struct dir_rec *rec = &e->recs[e->looked - e->local];
		if (!rc_get(g.rcache, e->ks.k[e->looked], e->ks.len[e->looked],
			    now, rec) || !exists_readable(rec))
			break;
		e->looked++;
	}
	struct dir_keys k = dir_keys_of(&e->ks, e->looked);
	struct dir_rec *recs = &e->recs[e->looked - e->local];
	if (k.n == 0 ||
	    g.pl->lookup(e->r, &k, recs, 0, e->deadline, exists_done, e) < 0) {
		memset(recs, 0, k.n * sizeof(*recs)); /* what was not there */
		exists_done(e);
	}
}

static int kv_exists(struct rx_reactor *r, const struct kv_item *it,
		     unsigned n, void (*done)(void *arg, unsigned count),
		     void *arg)
{
	if (!items_valid(it, n))
		return -EINVAL;
	struct pc_arena a;
	pc_arena_plan(&a);
	exists_layout(&a, it, n);
	if (!pc_arena_alloc(&a))
		return -ENOMEM;
	struct exists_op *e = exists_layout(&a, it, n);
	e->r = r;
	e->done = done;
	e->arg = arg;
	e->deadline = op_deadline();
	met_inc(g.ex_req);
	exists_walk(e, false);
	return 0;
}

/* --------------------------------------------------------------- remove */

struct del_op {
	struct rx_reactor *r;
	struct keys ks;
	bool *local;
	bool *existed;
	unsigned cur;         /* next key to delete here */
	struct rx_timer walk; /* resumes the deletes in the next pass */
	uint64_t deadline;
	kv_done_fn done;
	void *arg;
};

static struct del_op *del_layout(struct pc_arena *a, const struct kv_item *it,
				 unsigned n)
{
	struct del_op *d = pc_arena_take(a, sizeof(*d));
	struct keys ks;
	keys_layout(a, &ks, it, n);
	bool *local = pc_arena_take(a, n * sizeof(*local));
	bool *existed = pc_arena_take(a, n * sizeof(*existed));
	if (d)
		*d = (struct del_op){.ks = ks, .local = local,
				     .existed = existed};
	return d;
}

static void del_done(void *arg)
{
	struct del_op *d = arg;
	for (unsigned i = 0; i < d->ks.n; i++)
		d->existed[i] |= d->local[i];
	d->done(d->arg, d->existed, d->ks.n);
	free(d); /* the arena */
}

static void del_walk(struct del_op *d, bool resumed);

static void del_walk_fired(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	rx_stall_tag("kv.delete walk");
	del_walk(PC_CONTAINER_OF(t, struct del_op, walk), true);
}

/* The keys' pages here go (in slices: walk_take), then their records. */
static void del_walk(struct del_op *d, bool resumed)
{
	unsigned here = walk_here(resumed);
	for (; d->cur < d->ks.n; d->cur++) {
		if (!walk_take(d->r, &here)) {
			walk_later(d->r, &d->walk, del_walk_fired);
			return;
		}
		unsigned i = d->cur;
		if (g.rcache)
			rc_forget(g.rcache, d->ks.k[i], d->ks.len[i], NULL, 0);
		/* The tier first: a promotion under way is marked stale
		 * before the pool entry goes, so it cannot bring it back. */
		g.tier->drop(d->ks.k[i], d->ks.len[i]);
		d->local[i] = pool_delete(g.pool, d->ks.k[i], d->ks.len[i]) == 0;
	}
	struct dir_keys k = dir_keys_of(&d->ks, 0);
	if (g.pl->unpublish(d->r, &k, NULL, NULL, d->existed, d->deadline,
			    del_done, d) < 0)
		del_done(d);
}

/* Delete here and unpublish whatever record of the key exists. */
static int kv_remove(struct rx_reactor *r, const struct kv_item *it,
		     unsigned n, kv_done_fn done, void *arg)
{
	if (!items_valid(it, n))
		return -EINVAL;
	struct pc_arena a;
	pc_arena_plan(&a);
	del_layout(&a, it, n);
	if (!pc_arena_alloc(&a))
		return -ENOMEM;
	struct del_op *d = del_layout(&a, it, n);
	d->r = r;
	d->done = done;
	d->arg = arg;
	d->deadline = op_deadline();
	met_add(g.del_req, d->ks.n);
	del_walk(d, false);
	return 0;
}

/* ---------------------------------------------------------------- flush */

/*
 * One flush at a time (g.flush), on the reactor that started it. A step
 * examines at most FLUSH_BATCH pool records (pool_scan) — then, once the
 * pool is walked, at most FLUSH_BATCH pages of the tier — deletes what it
 * found and sends one conditional unpublish (this node, those
 * generations) for them; the next step starts on the next loop pass after
 * the unpublish answered. So the reactor is held for one slice at a time
 * (a few hundred deletes under short stripe locks) and one unpublish is in
 * flight. The pool walk's cursor is stable under deletes; the tier's is
 * not (storage/disk_log.c counts entries in a region's list), so the tier
 * walk restarts from 0 each step — every page it saw was dropped — and
 * ends with a step whose scan covered the whole index. Pages set during a
 * flush may survive it or not (drain first, for a planned shutdown).
 */
#define FLUSH_BATCH 256

struct flush {
	struct rx_reactor *r;
	struct rx_timer step;
	uint64_t cursor;     /* pool_scan position */
	bool in_tier;        /* the pool is walked: the tier's pages now */
	bool last;           /* this step's scan reached the end */
	bool stopping;       /* the reactor stops: end after the unpublish */
	bool busy;           /* an unpublish is in flight */
	unsigned n;          /* pages of this step */
	char keys[FLUSH_BATCH][KV_KEY_MAX];
	const char *kptr[FLUSH_BATCH];
	size_t klens[FLUSH_BATCH];
	uint64_t gens[FLUSH_BATCH];
	struct kv_flushed res;
	void (*done)(void *arg, const struct kv_flushed *f);
	void *arg;
};

static void flush_take(struct flush *f, const void *key, size_t klen,
		       uint64_t gen)
{
	if (klen == 0 || klen > KV_KEY_MAX || f->n >= FLUSH_BATCH)
		return;
	memcpy(f->keys[f->n], key, klen);
	f->kptr[f->n] = f->keys[f->n];
	f->klens[f->n] = klen;
	f->gens[f->n++] = gen;
}

static void flush_pool_one(void *arg, const struct pool_entry_info *e)
{
	flush_take(arg, e->key, e->keylen, e->gen);
}

static void flush_tier_one(void *arg, const struct tier_page *pg,
			   uint64_t len)
{
	(void)len;
	flush_take(arg, pg->key, pg->klen, pg->gen);
}

static void flush_finish(struct flush *f)
{
	PC_LOGI(LOG_MOD, "flush %s: %llu pool pages and %llu disk-only pages "
		"dropped", f->res.res ? "stopped by the shutdown" : "done",
		(unsigned long long)f->res.pages,
		(unsigned long long)f->res.disk_pages);
	f->done(f->arg, &f->res);
	__atomic_store_n(&g.flush, NULL, __ATOMIC_RELEASE);
	free(f);
}

static void flush_unpublished(void *arg)
{
	struct flush *f = arg;
	f->busy = false;
	if (f->stopping || (f->in_tier && f->last)) {
		flush_finish(f);
		return;
	}
	if (!f->in_tier && f->last)
		f->in_tier = true; /* the pool is walked */
	rx_timer_start(f->r, &f->step, 0, 0);
}

/* Drop the pages found (f->n of them) and unpublish their records. */
static void flush_drop(struct flush *f)
{
	unsigned keep = 0;
	for (unsigned i = 0; i < f->n; i++) {
		/* The tier first, as kv_remove does: a promotion under way is
		 * marked stale before the pool entry goes. */
		g.tier->drop(f->kptr[i], f->klens[i]);
		if (!f->in_tier) {
			f->res.pages += pool_delete(g.pool, f->kptr[i],
						    f->klens[i]) == 0;
		} else if (pool_contains(g.pool, f->kptr[i], f->klens[i])) {
			continue; /* set since the pool walk: its record stays */
		} else {
			f->res.disk_pages++;
		}
		f->kptr[keep] = f->kptr[i];
		f->klens[keep] = f->klens[i];
		f->gens[keep++] = f->gens[i];
	}
	struct dir_keys k = {f->kptr, f->klens, keep};
	f->busy = true;
	if (keep == 0 || g.pl->unpublish(f->r, &k, g.cl->self_id, f->gens,
					 NULL, op_deadline(), flush_unpublished,
					 f) < 0)
		flush_unpublished(f);
}

static void flush_step(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	struct flush *f = t->arg;
	f->n = 0;
	if (!f->in_tier) {
		f->last = pool_scan(g.pool, &f->cursor, FLUSH_BATCH,
				    flush_pool_one, f) == 0;
	} else {
		uint64_t from = 0; /* every page seen before was dropped */
		f->last = g.tier->scan(&from, FLUSH_BATCH, flush_tier_one,
				       f) == 0;
	}
	flush_drop(f);
}

static int kv_flush(struct rx_reactor *r,
		    void (*done)(void *arg, const struct kv_flushed *fl),
		    void *arg)
{
	struct flush *f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	struct flush *none = NULL;
	if (!__atomic_compare_exchange_n(&g.flush, &none, f, false,
					 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
		free(f);
		return -EBUSY;
	}
	f->r = r;
	f->done = done;
	f->arg = arg;
	rx_timer_init(&f->step, flush_step, f);
	bool tier = strcmp(g.tier->name, "none") != 0;
	PC_LOGI(LOG_MOD, "flush: dropping every page of this node (the pool%s"
		"%s%s) and its records of them", tier ? ", the " : "",
		tier ? g.tier->name : "", tier ? " tier" : "");
	rx_timer_start(r, &f->step, 0, 0);
	return 0;
}

static const struct kv_api kv_api = {
	.publish = kv_publish,
	.fetch = kv_fetch,
	.get = kv_get,
	.exists = kv_exists,
	.remove = kv_remove,
	.flush = kv_flush,
	.hold = kv_hold,
	.release = kv_release,
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

static double walk_yields_stat(void *arg)
{
	(void)arg;
	return (double)walk_yields_total();
}

static double pool_stat(void *arg)
{
	struct pool_stats st;
	pool_stats(g.pool, &st);
	return (double)*(const uint64_t *)((const char *)&st + (uintptr_t)arg);
}

#define POOL_STAT(f) ((void *)offsetof(struct pool_stats, f))

/* A producer became suspect or left: reads still waiting for it on this
 * reactor fail now (misses) instead of at their deadline; and the read
 * cache is emptied (a departure also changes every producer's RDMA keys:
 * docs/security.md). */
static void on_peer_gone(struct rx_reactor *r, enum mb_event ev,
			 const char *peer, uint64_t epoch, void *arg)
{
	(void)ev;
	(void)epoch;
	(void)arg;
	if (g.rcache)
		rc_clear(g.rcache);
	struct tp_client *tc = g.tp->clients[rx_reactor_id(r)];
	if (tc)
		g.tp->ops->fail_node(tc, peer, -EHOSTDOWN);
}

static double rc_stat(void *arg)
{
	struct rc_stats st;
	rc_stats(g.rcache, &st);
	return (double)*(const uint64_t *)((const char *)&st + (uintptr_t)arg);
}

#define RC_STAT(f) ((void *)offsetof(struct rc_stats, f))

/* The directory read cache (directory_read_cache_ttl) and its metrics. */
static int read_cache_init(const struct pc_settings *s)
{
	int ret = rc_new(&g.rcache, (uint64_t)s->directory_read_cache_entries,
			 RX_MS(s->directory_read_cache_ttl_ms));
	if (ret < 0) {
		PC_LOGE(LOG_MOD, "cannot create the directory read cache: %s",
			strerror(-ret));
		return ret;
	}
	PC_LOGI(LOG_MOD, "directory read cache: up to %lld records, each for "
		"%llu ms", (long long)s->directory_read_cache_entries,
		(unsigned long long)s->directory_read_cache_ttl_ms);
	met_register_counter_fn("peercache_read_cache_hits_total",
				"records a read or exists took from the "
				"directory read cache (no lookup)", NULL,
				rc_stat, RC_STAT(hits));
	met_register_counter_fn("peercache_read_cache_misses_total",
				"keys the directory read cache did not hold "
				"(or held expired): looked up", NULL, rc_stat,
				RC_STAT(misses));
	met_register_counter_fn("peercache_read_cache_evictions_total",
				"live records the directory read cache "
				"dropped for room", NULL, rc_stat,
				RC_STAT(evicted));
	g.rc_stale = met_register(MET_COUNTER,
				  "peercache_read_cache_stale_total",
				  "records from the directory read cache whose "
				  "read failed (the key was looked up again)",
				  NULL);
	met_register_fn("peercache_read_cache_entries",
			"records the directory read cache holds", NULL,
			rc_stat, RC_STAT(entries));
	return 0;
}

static int kv_init(struct pc_ctx *ctx)
{
	const struct pc_settings *s = ctx->cfg;
	memset(&g, 0, sizeof(g));
	if (s->mode != PC_MODE_P2P) {
		if (s->directory_read_cache_ttl_ms)
			PC_LOGW(LOG_MOD, "directory_read_cache_ttl has no "
				"effect in this mode: there is no directory "
				"to skip");
		return 0; /* its mode's module moves the pages */
	}
	g.ctx = ctx;
	g.checksums = s->page_checksums;
	g.read_timeout_ms = (unsigned)s->rpc_timeout_ms;
	walk_set_pass_max((uint64_t)s->slice_pass_max_us * 1000);
	pc_budget_init(&g.staging, s->kv_staging_max);
	g.deadline_ns = RX_MS(s->request_deadline_ms);
	if (!(g.cl = svc_need_cluster(ctx, "kv")) ||
	    !(g.tp = svc_need_transport(ctx, "kv")) ||
	    !(g.pl = svc_need_placement(ctx, "kv")))
		return -ENOENT;
	g.health = svc_find_health(ctx);
	g.tier = &tier_none; /* until start: the tier module inits after kv */
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
	if (s->pool_prefault &&
	    (ret = pool_prefault_start_after(g.pool, &ctx->state)) < 0)
		PC_LOGW(LOG_MOD, "cannot start the pool prefault thread (%s); "
			"pages are faulted in on first use", strerror(-ret));
	uint8_t *base;
	size_t len;
	pool_region(g.pool, &base, &len);
	struct tp_region reg = {.base = (uintptr_t)base, .len = len,
				.access = TP_ACCESS_READ, .pin = pin_hook,
				.unpin = unpin_hook, .ctx = g.pool};
	if ((ret = g.tp->ops->reg_region(g.tp->node, &reg, &g.rkey)) < 0)
		goto fail_pool;
	g.pool_svc.pool = g.pool;
	g.pool_svc.rkey = g.rkey;
	/* From here on a failure undoes it all (a module whose init fails
	 * gets no fini call): the services, the registration, the pool. */
	if ((ret = svc_publish_pool(ctx, "kv", &g.pool_svc)) < 0)
		goto fail_region;
	if ((ret = svc_publish_kv(ctx, "kv", &kv_api)) < 0)
		goto fail_pool_svc;
	const struct mb_api *mb = svc_find_membership(ctx);
	/* The membership API has no unsubscribe: a failure past this point
	 * leaves on_peer_gone subscribed. Harmless, as a failed init ends the
	 * process before any reactor runs an event. */
	if (mb && (ret = mb->subscribe(MB_ON(MB_SUSPECT) | MB_ON(MB_LEAVE),
				       on_peer_gone, NULL)) < 0)
		goto fail_kv_svc;
	if ((ret = pc_guard_init()) < 0)
		goto fail_kv_svc;
	g.evqs = calloc(ctx->threads, sizeof(*g.evqs));
	if (!g.evqs) {
		ret = -ENOMEM;
		goto fail_kv_svc;
	}
	if (s->directory_read_cache_ttl_ms &&
	    (ret = read_cache_init(s)) < 0) {
		free(g.evqs);
		g.evqs = NULL;
		goto fail_kv_svc;
	}
#define CTR(var, name, help) var = met_register(MET_COUNTER, name, help, NULL)
	CTR(g.rd_req, "peercache_read_requests_total", "pages asked for");
	CTR(g.rd_hit, "peercache_read_hits_total", "pages found");
	CTR(g.rd_miss, "peercache_read_misses_total", "pages not found");
	CTR(g.rd_local, "peercache_read_local_hits_total",
	    "pages served from this node's pool (no network)");
	CTR(g.rd_remote, "peercache_read_remote_hits_total",
	    "pages read from another node's pool (a page its producer "
	    "promoted from disk for the get counts as a disk hit)");
	CTR(g.rd_tier, "peercache_read_disk_hits_total",
	    "pages a get found on a disk: another node's, promoted by its "
	    "producer and read (a hit), or this node's, whose promotion the "
	    "get started (that get misses, counted in "
	    "peercache_read_misses_total too; the next finds it in memory)");
	CTR(g.rd_fail, "peercache_read_failures_total",
	    "remote pages that failed to arrive or to validate (counted as "
	    "misses)");
	CTR(g.own_stale, "peercache_read_own_replica_stale_total",
	    "remote pages whose record came from this node's own directory "
	    "replica and did not read (the key was looked up again at the "
	    "other owners)");
	CTR(g.rd_bytes, "peercache_bytes_read_total",
	    "page bytes read (found pages, local or remote, on every path)");
	CTR(g.wr_req, "peercache_write_requests_total", "set calls");
	CTR(g.wr_pages, "peercache_write_pages_total", "pages published");
	CTR(g.wr_bytes, "peercache_bytes_written_total", "page bytes published");
	CTR(g.ex_req, "peercache_exists_requests_total", "exists calls");
	CTR(g.ex_found, "peercache_exists_pages_found_total",
	    "pages reported by exists");
	CTR(g.del_req, "peercache_delete_requests_total", "keys deleted");
	met_register_counter_fn("peercache_key_walk_yields_total",
				"times a call's walk over its keys (kv's pool "
				"walks, a directory round) stopped for the "
				"loop pass's key budget and went on in the "
				"next pass (modules/walk.h)", NULL,
				walk_yields_stat, NULL);
	CTR(g.ev_pub, "peercache_eviction_unpublishes_total",
	    "directory records withdrawn after an eviction");
	CTR(g.tier_kept, "peercache_tier_kept_total",
	    "evicted pages the next tier kept (none without a tier)");
	CTR(g.promotes, "peercache_tier_promotions_total",
	    "promotions of non-resident pages started (none without a "
	    "tier)");
	CTR(g.landed, "peercache_bytes_landed_total",
	    "remote page bytes received straight into their destination (no "
	    "CPU copy by the node)");
	CTR(g.deadline_hit, "peercache_request_deadline_exceeded_total",
	    "page calls (set, get, exists) that ran into "
	    "request_deadline (what was not done by then failed or missed)");
	CTR(g.stage_warmed, "peercache_kv_staging_faulted_in_bytes_total",
	    "bytes of kv.get staging faulted in on the offload thread "
	    "before use (new staging memory; the reactor would have faulted "
	    "them in itself)");
	CTR(g.rd_suspect, "peercache_read_suspect_misses_total",
	    "remote pages not read because their producer is suspect (misses "
	    "at once)");
#undef CTR
	pc_budget_metric(&g.staging, KV_STAGED_METRIC, KV_STAGED_HELP);
	static const char copy_help[] =
		"page bytes the node copied with its CPU, by operation";
	g.copy_set = met_register(MET_COUNTER, "peercache_copy_bytes_total",
				  copy_help, "op=\"set\"");
	g.copy_get_local = met_register(MET_COUNTER,
					"peercache_copy_bytes_total",
					copy_help, "op=\"get_local\"");
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
fail_kv_svc:
	svc_withdraw_kv(ctx);
fail_pool_svc:
	svc_withdraw_pool(ctx);
fail_region:
	g.tp->ops->dereg_region(g.tp->node, g.rkey);
	g.rkey = 0;
fail_pool:
	pool_free(g.pool);
	g.pool = NULL;
	return ret;
}

static int kv_start(struct rx_reactor *r, struct pc_ctx *ctx)
{
	if (!g.pool)
		return 0; /* not p2p: kv_init did nothing */
	/* Reactor 0 starts first, alone: the tier (published by a module
	 * that needs kv's pool, so inits after kv) is known from here on. */
	if (rx_reactor_id(r) == 0) {
		const struct tier_ops *t = svc_find_tier(ctx);
		g.tier = t ? t : &tier_none;
	}
	struct evq *q = &g.evqs[rx_reactor_id(r)];
	q->r = r;
	rx_timer_init(&q->flush, evq_flush, q);
	t_evq = q;
	return 0;
}

static void kv_stop(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	if (!g.pool)
		return;
	struct evq *q = &g.evqs[rx_reactor_id(r)];
	struct flush *f = __atomic_load_n(&g.flush, __ATOMIC_ACQUIRE);
	if (f && f->r == r) {
		/* A flush on this reactor ends with its step, or its
		 * unpublish under way: what was not dropped stays. */
		f->stopping = true;
		f->res.res = -ESHUTDOWN;
		if (!f->busy) {
			rx_timer_stop(r, &f->step);
			flush_finish(f);
		}
	}
	/* Records of pages evicted in the last moments stay; a reader of
	 * one gets a validated miss. */
	rx_timer_stop(r, &q->flush);
	q->stopped = true;
	evq_bufs_free(q->kbuf, q->koff, q->klens, q->gens);
	q->kbuf = NULL;
	q->koff = q->klens = NULL;
	q->gens = NULL;
	q->kused = q->kcap = 0;
	q->n = q->cap = 0;
}

static void kv_fini(struct pc_ctx *ctx)
{
	if (!g.pool)
		return; /* not p2p: "kv" is another module's */
	svc_withdraw_pool(ctx);
	svc_withdraw_kv(ctx);
	if (g.rkey && g.tp)
		g.tp->ops->dereg_region(g.tp->node, g.rkey);
	pool_free(g.pool);
	free(g.evqs);
	rc_free(g.rcache);
	memset(&g, 0, sizeof(g));
}

const struct pc_module pc_mod_kv = {
	.name = "kv",
	.init = kv_init,
	.start = kv_start,
	.stop = kv_stop,
	.fini = kv_fini,
};
