/*
 * modules/republish.c — after a membership change, this node moves the
 * records of its own pages to their new directory owners (module
 * "republish").
 *
 * Owns: one walk at a time over the publish pool (storage/pool.h
 * pool_scan) and then over the pages the next tier holds that the pool
 * does not (tier_ops.scan: the disk tier's pages, whose records are
 * non-resident), on reactor 0, and the rings it compares, each held by a
 * reference: `placed`, the rings this node's records may have been placed
 * against (one after a finished walk; a change that interrupts a walk adds
 * the interrupted target, since the pages walked so far were moved to it),
 * and `target`, the ring of the walk in progress. Thread: reactor 0 only
 * (events for other reactors are ignored; the placement's callback comes
 * back to reactor 0).
 *
 * What moves (storage/ring.h ring_owner_moves): a page with an owner under
 * target that was not its owner under every placed ring (it may lack the
 * record: the record is sent there, and only there), or with an owner under
 * a placed ring that is still a member but no longer an owner (it holds a
 * record nobody asks it for: after the new owners have the record, this
 * node's record of that generation is removed there, after a grace of
 * member_ttl that lets every node adopt the new membership — a conditional
 * remove, so a newer record is never touched). Owners that left keep their
 * records; nobody asks them. Pages whose owners did not change are not
 * touched, so a join moves about replicas x K/(N+1) records of K pages.
 *
 * Bounded work: each step examines at most REPUB_BATCH pool entries under
 * their stripe's lock (copies only) and hands at most REPUB_BATCH records
 * to placement's move; one move is in flight at a time and the next step
 * waits REPUB_GAP_MS after it completes, so a walk never holds the reactor
 * for more than one slice and its network rate is bounded by the owners'
 * round trips. A change during a walk restarts it against the newest ring.
 * More than REPUB_PLACED_MAX interrupted walks in a row fold the oldest
 * ones into "placed anywhere": every owner is then sent the record (a
 * superset, never a miss), and records at owners only those rings had are
 * left to eviction. When a walk ends, target is the one placed ring.
 *
 * Never wrong: a page replaced or evicted while its record is in flight is
 * published with its old generation; readers validate (key, generation,
 * length, checksum), so such a record is a miss, never wrong bytes. A
 * non-resident record that moves names a page of the tier; a reader asks
 * this node to promote it (docs/disk.md). A page the pool holds again by
 * the tier walk's turn is left to the pool walk's record (skipped), one
 * the pool takes back or the tier evicts while its record is in flight
 * leaves a record that costs a miss, as above.
 *
 * p2p only: a mode without records (slotmap: a key's slot is fixed by the
 * ring) has nothing to move; init says so and the module stays idle.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "modules/placement.h"
#include "modules/membership.h"
#include "modules/modules.h"
#include "modules/tier.h"
#include "storage/pool.h"
#include "storage/ring.h"

#define LOG_MOD "republish"
#define REPUB_BATCH 64      /* entries examined, records sent, per step */
#define REPUB_GAP_MS 1      /* between steps */
#define REPUB_REPLICAS_MAX 8
#define REPUB_PLACED_MAX 4  /* rings the records may have been placed on */

static struct {
	struct pc_ctx *ctx;
	struct rx_reactor *r0;
	struct pool *pool;
	uint32_t rkey;
	unsigned replicas;
	/* references: rings the records may have been placed against;
	 * placed[nplaced] is the empty ring `none` when older interrupted
	 * walks were folded (every owner counts as gained) */
	struct ring *placed[REPUB_PLACED_MAX + 1];
	unsigned nplaced;
	struct ring *none;       /* an empty ring, for the fold */
	bool folded;
	struct ring *target;     /* reference: the walk's ring; NULL: idle */
	uint64_t cursor;         /* pool_scan position */
	bool in_tier;            /* the pool is walked; now the tier's pages */
	uint64_t tcursor;        /* tier scan position */
	bool busy;               /* a publish is in flight */
	bool stopping;
	uint64_t walk_sent;      /* records sent in this walk */
	struct rx_timer step;
	/* the batch being collected / in flight */
	unsigned n;
	char keys[REPUB_BATCH][DIR_KEY_MAX];
	const char *kptr[REPUB_BATCH];
	size_t klens[REPUB_BATCH];
	struct dir_rec recs[REPUB_BATCH];
	bool ok[REPUB_BATCH];
	met_id sent, stored, walks, sent_nr;
	const struct svc_cluster *cl;     /* services, looked up in init */
	const struct tier_ops *tier;      /* or NULL: no tier */
	const struct pl_ops *pl;
	const struct mb_api *mb;
} g;

/* The rings placed[] as ring_owner_moves takes them. */
static unsigned placed_rings(void)
{
	return g.nplaced + g.folded;
}

/* Does the key gain an owner, or lose one that is still a member? */
static bool key_moves(const void *key, size_t klen)
{
	unsigned gained[REPUB_REPLICAS_MAX], lost[1], ng, nl;
	unsigned all = ring_owner_moves(g.target, g.placed, placed_rings(),
					ring_key_point(key, klen), g.replicas,
					gained, &ng, lost, &nl, 1);
	return ng > 0 || all > 0;
}

/* Add this node's record of key to the batch if the key moves (a scan's
 * callback, its lock held: copies only). addr 0: not resident. */
static void batch_add(const char *key, size_t klen, uint64_t addr,
		      uint64_t len, uint64_t gen)
{
	if (klen == 0 || klen > DIR_KEY_MAX || len > UINT32_MAX ||
	    g.n == REPUB_BATCH || !key_moves(key, klen))
		return;
	unsigned i = g.n++;
	memcpy(g.keys[i], key, klen);
	g.klens[i] = klen;
	struct dir_rec *r = &g.recs[i];
	memset(r, 0, sizeof(*r));
	r->found = true;
	r->resident = addr != 0;
	pc_strcpy(r->node, sizeof(r->node), g.cl->self_id);
	pc_strcpy(r->data, sizeof(r->data), g.cl->self_data);
	r->addr = addr;
	r->rkey = g.rkey;
	r->len = (uint32_t)len;
	r->gen = gen;
}

/* pool_scan callback, stripe lock held. */
static void collect(void *arg, const struct pool_entry_info *e)
{
	(void)arg;
	batch_add(e->key, e->keylen, e->addr, e->len, e->gen);
}

/* tier scan callback, the tier's lock held: a page in the tier, its
 * record non-resident (unless the pool holds it: see tier_drop_pooled). */
static void collect_tier(void *arg, const struct tier_page *pg, uint64_t len)
{
	(void)arg;
	batch_add(pg->key, pg->klen, 0, len, pg->gen);
}

/* Leave out of the batch the tier's pages the pool holds too: their
 * record is the pool's (resident), moved by the pool walk. */
static void tier_drop_pooled(void)
{
	unsigned n = 0;
	for (unsigned i = 0; i < g.n; i++) {
		if (pool_contains(g.pool, g.keys[i], g.klens[i]))
			continue;
		if (n != i) {
			memcpy(g.keys[n], g.keys[i], g.klens[i]);
			g.klens[n] = g.klens[i];
			g.recs[n] = g.recs[i];
		}
		n++;
	}
	g.n = n;
}

/* One slice of the walk into the batch: the pool's pages, then the
 * tier's. 1 while more remain. */
static int walk_slice(void)
{
	if (!g.in_tier) {
		int more = pool_scan(g.pool, &g.cursor, REPUB_BATCH, collect,
				     NULL);
		if (more || !g.tier)
			return more;
		g.in_tier = true; /* the tier's pages from the next step on */
		g.tcursor = 0;
		return 1;
	}
	int more = g.tier->scan(&g.tcursor, REPUB_BATCH, collect_tier, NULL);
	tier_drop_pooled();
	met_add(g.sent_nr, g.n);
	return more;
}

/* Forget the placed rings (and the fold). */
static void placed_clear(void)
{
	for (unsigned i = 0; i < g.nplaced; i++)
		ring_unref(g.placed[i]);
	g.nplaced = 0;
	g.folded = false;
}

/* The records may also have been placed against r (a reference, kept). */
static void placed_add(struct ring *r)
{
	if (g.nplaced == REPUB_PLACED_MAX) {
		/* fold the oldest interrupted ring: its owners all count as
		 * gained from now on (g.none sits after the last one) */
		ring_unref(g.placed[1]);
		memmove(&g.placed[1], &g.placed[2],
			(REPUB_PLACED_MAX - 2) * sizeof(g.placed[0]));
		g.nplaced--;
		g.folded = true;
	}
	g.placed[g.nplaced++] = r;
	g.placed[g.nplaced] = g.none;
}

static void walk_end(void)
{
	PC_LOGI(LOG_MOD, "placement for epoch %llu done: %llu record%s of "
		"this node's pages sent to their new owners (their old "
		"owners drop them after a grace)",
		(unsigned long long)ring_epoch(g.target),
		(unsigned long long)g.walk_sent, g.walk_sent == 1 ? "" : "s");
	placed_clear();
	placed_add(g.target);
	g.target = NULL;
}

static void published(void *arg)
{
	(void)arg;
	g.busy = false;
	if (g.stopping)
		return;
	unsigned stored = 0;
	for (unsigned i = 0; i < g.n; i++)
		stored += g.ok[i];
	met_add(g.stored, stored);
	g.n = 0;
	if (g.target)
		rx_timer_start(g.r0, &g.step, RX_MS(REPUB_GAP_MS), 0);
}

/* One bounded step of the walk. */
static void step(struct rx_reactor *r, struct rx_timer *t)
{
	(void)t;
	if (g.busy || !g.target || g.stopping)
		return; /* the publish in flight re-arms when it is done */
	g.n = 0;
	int more = walk_slice();
	if (g.n) {
		for (unsigned i = 0; i < g.n; i++)
			g.kptr[i] = g.keys[i];
		struct dir_keys k = {g.kptr, g.klens, g.n};
		met_add(g.sent, g.n);
		g.walk_sent += g.n;
		g.busy = true;
		if (g.pl->move(r, &k, g.recs, g.ok, g.placed, placed_rings(),
				0, published, NULL) < 0) {
			g.busy = false;
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "cannot publish %u "
				  "records again; their new owners miss them "
				  "until they are set again", g.n);
			g.n = 0;
		}
	}
	if (!more && !g.busy) {
		walk_end();
		return;
	}
	if (!more) /* the last batch is in flight: finish when it is back */
		return;
	if (!g.busy)
		rx_timer_start(r, &g.step, RX_MS(REPUB_GAP_MS), 0);
}

/* Membership changed: (re)start a walk against the newest ring. */
static void on_change(struct rx_reactor *r, enum mb_event ev,
		      const char *peer, uint64_t epoch, void *arg)
{
	(void)ev;
	(void)peer;
	(void)arg;
	if (rx_reactor_id(r) != 0 || !g.nplaced)
		return;
	struct ring *now = g.mb->ring();
	if (!now || ring_epoch(now) < epoch ||
	    (g.target && ring_epoch(g.target) == ring_epoch(now)) ||
	    (!g.target && g.nplaced == 1 && !g.folded &&
	     ring_epoch(g.placed[0]) == ring_epoch(now)))
		return; /* already walking (or placed) for this ring */
	if (!g.target) {
		g.walk_sent = 0;
		met_inc(g.walks);
	} else {
		/* the pages walked so far were moved to the old target */
		placed_add(g.target);
	}
	g.target = ring_ref(now);
	g.cursor = 0;
	g.in_tier = false;
	if (!g.busy)
		rx_timer_start(r, &g.step, 0, 0);
}

static int rp_init(struct pc_ctx *ctx)
{
	memset(&g, 0, sizeof(g));
	g.ctx = ctx;
	/* first: rp_stop and rp_exit stop it whatever init returned early */
	rx_timer_init(&g.step, step, NULL);
	if (ctx->cfg->mode != PC_MODE_P2P) {
		PC_LOGI(LOG_MOD, "placement mode %s keeps no records: nothing "
			"to republish", ctx->cfg->mode == PC_MODE_SLOTMAP
						? "slotmap" : "?");
		return 0; /* g.mb NULL: rp_start does nothing */
	}
	const struct svc_pool *ps;
	if (!(ps = svc_need_pool(ctx, "republish")) ||
	    !(g.pl = svc_need_placement(ctx, "republish")) ||
	    !(g.mb = svc_need_membership(ctx, "republish")) ||
	    !(g.cl = svc_need_cluster(ctx, "republish")))
		return -ENOENT;
	g.pool = ps->pool;
	g.rkey = ps->rkey; /* what kv's own records carry */
	g.replicas = (unsigned)PC_MIN(ctx->cfg->directory_replicas,
				      (int64_t)REPUB_REPLICAS_MAX);
	if (!g.pl->move) {
		PC_LOGI(LOG_MOD, "placement \"%s\" does not place records by "
			"owner: nothing to move on membership changes",
			g.pl->mode);
		return 0;
	}
	int ret = ring_build(&g.none, NULL, 0, 1);
	if (ret < 0)
		return ret;
	g.sent = met_register(MET_COUNTER, "peercache_republish_records_total",
			      "records of this node's pages published again "
			      "after a membership change gave them new owners",
			      NULL);
	g.stored = met_register(MET_COUNTER,
				"peercache_republish_stored_total",
				"of those, records an owner stored", NULL);
	g.walks = met_register(MET_COUNTER, "peercache_republish_walks_total",
			       "walks over the pool after membership changes",
			       NULL);
	g.sent_nr = met_register(MET_COUNTER,
				 "peercache_republish_nonresident_total",
				 "of those, non-resident records (pages the "
				 "disk tier holds, not the pool)", NULL);
	/* The disk module (the tier) inits before this one. */
	g.tier = svc_find_tier(ctx);
	return g.mb->subscribe(MB_ON(MB_JOIN) | MB_ON(MB_LEAVE),
					      on_change, NULL);
}

static int rp_start(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	if (rx_reactor_id(r) != 0 || !g.mb)
		return 0; /* !g.mb: not p2p, nothing to do */
	struct ring *now = g.mb->ring();
	if (!now)
		return -EINVAL; /* the cluster module starts first */
	g.r0 = r;
	if (g.none)
		placed_add(ring_ref(now));
	return 0;
}

static void rp_stop(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	if (rx_reactor_id(r) != 0)
		return;
	g.stopping = true; /* a publish in flight ends with the directory */
	rx_timer_stop(r, &g.step);
}

static void rp_exit(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	if (rx_reactor_id(r) != 0)
		return;
	g.stopping = true;
	rx_timer_stop(r, &g.step);
	ring_unref(g.target);
	g.target = NULL;
	placed_clear();
	ring_unref(g.none);
	g.none = NULL;
}

const struct pc_module pc_mod_republish = {
	.name = "republish",
	.init = rp_init,
	.start = rp_start,
	.stop = rp_stop,
	.exit = rp_exit,
};
