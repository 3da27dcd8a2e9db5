/*
 * modules/disk.c — the L4 disk tier (module "disk", issue 14; docs/disk.md):
 * pages the pool holds are also written to one store file under disk_path;
 * pages the pool evicts stay findable as non-resident records and come back
 * into the pool on a get (promotion); a restart with the same disk_path
 * finds them again.
 *
 * Owns: the store file (one preallocated file, O_DIRECT when the file
 * system takes it, else buffered with the reason logged; locked with flock
 * so that one node at a time uses a disk_path), its identity file
 * (16 random bytes, made once), the store's index (storage/disk_log.h: the
 * regions, the key index, the on-disk format), per reactor the
 * write-through queue, its writes in flight and its batch of non-resident
 * records for placement, and the promotions in flight (one list for the
 * node). It is the "tier" service (modules/tier.h); kv calls its hooks.
 *
 * Threading: init (the index rebuilt from the regions' bytes, blocking
 * reads) and fini run on the main thread before and after the reactors.
 * Every hook runs on the reactor that calls it, and all its I/O
 * (rx_file_read / rx_file_write on that reactor's ring), copies (the
 * copier, in slices) and placement calls complete there — but a kv
 * promotion may be handed to another reactor (below) and complete there.
 * The index has its own mutex; the promotions list has one; the
 * queued-bytes count is atomic.
 *
 * Write-through: kv's commit of a page queues (key, gen, len) on its
 * reactor, within disk_queue_max bytes for the node (beyond: not queued,
 * counted, a rate-limited warning; a set never waits). DISK_WRITES writes
 * per reactor: pin the pool entry (skipped if its generation changed), copy
 * header room + key + payload into an aligned buffer with the copier,
 * DISK_COPY_SLICE a pass, so the requests behind it do not wait for a
 * whole page (its checksum is the record's, when the pool has none),
 * unpin, reserve the record's place (dl_alloc:
 * a region (re)opened for it has its header block written first, in the
 * same write), write, then index (dl_commit) or give back (dl_abort).
 *
 * Eviction: the pool's eviction of a generation the store holds is kept:
 * its record is published again with resident = false (batched per
 * reactor; each batch looked up first, so that it only replaces this
 * node's own record — never another producer's, nor a delete's absence). A region the store evicts for space takes its pages' records
 * with it (a conditional unpublish, for those the pool does not hold).
 *
 * Promotion: read the record (aligned), check its header (key, length,
 * sequence, checksum field) and its payload checksum while copying it into
 * a pool reservation, commit it, tell the index the pool's new generation
 * (dl_retag), publish the resident record. One promotion per key at a
 * time: a second ask while one runs shares it (-EALREADY to kv's ask; a
 * peer's, disk_promote_wait, joins its waiters and is told the outcome and
 * the resident record on its own reactor). modules/disk_remote.c serves
 * peers' disk.promote with it, and asks peers for theirs. kv's asks
 * (disk_promote) run on the reactor with the fewest promotions running
 * (the asking one on a tie): its read, copy and publish there, its done
 * too; the asks of one loop pass for another reactor go in one message.
 * A reactor runs at most DISK_PROMO_READS promotions' reads and copies at
 * once (each holds a read buffer); the promotions admitted beyond them
 * wait in its queue, oldest first, and each copy's end starts the next
 * read.
 * Promotions under way hold at most a quarter of the pool in reservations
 * (a page alone always goes); an ask beyond that is not started (-EBUSY).
 * A record whose header or checksum fails leaves the index, is counted and
 * is never served. A set or remove of the key during a promotion makes it
 * give up (never an older page over a newer one).
 *
 * Warm restart: init rebuilds the index (dl_rebuild_region, checksums
 * verified); reactor 0 then re-announces every indexed page as a
 * non-resident record, DISK_NR_BATCH at a time.
 *
 * Durability: fdatasync through a reactor's ring (one at a time for the
 * node) when a region fills, every DISK_SYNC_MS after writes (reactor 0),
 * and at a clean stop (fini, main thread).
 *
 * Faults (docs/disk.md "Faults"): the first read, write or sync that fails
 * for the disk's sake (not a cancel at stop) degrades the tier until the
 * restart — logged once with the cause, the module's degraded hook
 * (/healthz, node.health) and peercache_disk_degraded. Degraded: nothing
 * is queued or indexed any more, offer refuses (kv unpublishes), a read
 * that fails drops its record; reads of pages on disk go on (checked).
 * Test builds (PEERCACHE_FAULT_INJECTION) can make ops fail with EIO
 * (PEERCACHE_TEST_DISK_FAULT).
 *
 * With disk_enabled off the module still publishes a tier (tier_none's
 * hooks plus remote promotion): such a node reads other nodes' disk pages.
 * In a mode other than p2p (slotmap, where the settings refuse
 * disk_enabled) it does nothing at all (g.off): there is no pool or
 * placement for a tier under it, and its pages are never on a disk.
 *
 * Membership changes: the republish walk moves the records of the pages
 * the store holds (disk_scan, the tier's scan hook) after the pool's.
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/checksum.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "common/util.h"
#include "modules/copier.h"
#include "modules/disk_int.h"
#include "modules/modules.h"
#include "modules/placement.h"
#include "modules/tier.h"
#include "reactor/group.h"
#include "storage/disk_log.h"
#include "storage/pool.h"

#define LOG_MOD "disk"
#define DISK_WRITES 4      /* writes in flight per reactor */
#define DISK_NR_BATCH 1024 /* non-resident records per publish (~1.3 MB a
			   * batch, two per reactor); evictions beyond a
			   * full batch while one is in flight are not kept
			   * (kv unpublishes them) */
#define DISK_ANNOUNCE_GAP_MS 1
#define DISK_PROMO_READS 16 /* promotions reading or being copied per
			    * reactor (each holds a read buffer); the rest
			    * wait in its queue (admitted, charged): a burst
			    * of asks (an exists of thousands of pages)
			    * keeps the disk at this depth and reuses the
			    * kept buffers instead of making one per page */
#define DISK_READ_HUGE (2u << 20) /* promotion read buffers are whole
			    * (transparent) huge pages: an O_DIRECT read
			    * into one is a few contiguous pieces for the
			    * disk, not one per 4 KiB page */
#define DISK_READ_BUFS 64  /* promotion read buffers kept per reactor, */
#define DISK_READ_KEEP (32u << 20) /* and their bytes at most: a buffer
			    * freed (munmap) and made again (mmap, faults)
			    * per page cost more than its copy */
#define DISK_SYNC_MS 1000  /* pages written since the last sync: synced */
#define DISK_COPY_SLICE (64u << 10) /* a write-through copy's bytes a loop
			    * pass at most: a set arriving meanwhile waits
			    * ~5 us for it, not a whole page's copy */
#define DISK_STORE_FILE "store.pcd"
#define DISK_ID_FILE "store.id"

/* A page waiting for its write-through. */
struct wt_item {
	struct wt_item *next;
	uint64_t gen, len;
	uint16_t klen;
	char key[];
};

struct dq;

/* One write in flight. Layout of buf: one block for a region header, then
 * the record (header, key, payload, zero padding). */
struct wslot {
	struct dq *q;
	struct wt_item *it;     /* NULL: idle */
	uint8_t *buf;
	size_t cap;
	struct pool_ref ref;
	struct copier_job job;
	struct dl_loc loc;
	size_t iolen;
	uint64_t sum;           /* the pool's checksum of the page, when */
	bool have_sum;          /* it has one (not summed again then) */
};

/* Non-resident records on their way to placement. */
struct nrbatch {
	unsigned n;
	char keys[DISK_NR_BATCH][DIR_KEY_MAX];
	const char *kp[DISK_NR_BATCH];
	size_t klens[DISK_NR_BATCH];
	struct dir_rec recs[DISK_NR_BATCH];
	struct dir_rec look[DISK_NR_BATCH]; /* what placement has now */
	bool fresh[DISK_NR_BATCH]; /* restart: published also when absent */
	bool ok[DISK_NR_BATCH];
};

/* Per reactor. */
struct dq {
	struct rx_reactor *r;
	bool stopping;
	struct rx_timer sync;        /* reactor 0: the periodic sync */
	struct wt_item *head, *tail;
	struct wslot w[DISK_WRITES];
	struct rx_timer kick;        /* starts writes on the next pass */
	struct nrbatch *fill, *sent; /* sent: in flight while busy */
	bool busy;
	struct rx_timer flush;
	/* reactor 0: the warm-restart announcement */
	struct rx_timer announce;
	uint64_t cursor;
	bool announcing;
	uint64_t announced;
	/* promotion read buffers kept for the next ones */
	unsigned nbufs;
	size_t kept;
	uint8_t *bufs[DISK_READ_BUFS];
	size_t bufcap[DISK_READ_BUFS];
	/* promotions: those running here (atomic: other reactors read it to
	 * choose), and those asked here that go to other reactors, handed
	 * over once per loop pass (hand_timer) */
	unsigned promos;
	struct promo *hand;
	struct rx_timer hand_timer;
	/* promotions holding a read slot here: reading, or their copy
	 * under way (at most DISK_PROMO_READS), and the admitted ones
	 * waiting for a slot, oldest first */
	unsigned reading;
	struct promo *rq_head, *rq_tail;
};

/* Someone else waiting for a promotion under way (a peer's disk.promote
 * that asked while it ran): told on its own reactor. */
struct promo_wait {
	struct promo_wait *next;
	struct rx_reactor *r; /* only compared: another reactor is reached by
			       * its id (rid), which stays safe at shutdown */
	unsigned rid;
	disk_promoted_fn done;
	void *arg;
	int res;
	struct dir_rec rec;
};

#define PROMO_BUCKETS 4096u /* a power of two */

/* A promotion in flight (in the table g.promos, by key hash). */
struct promo {
	struct promo *next;     /* in its g.promos chain */
	uint64_t h;             /* hash of the key */
	struct rx_reactor *r;
	void (*done)(void *arg, int res); /* kv's ask, or */
	disk_promoted_fn wdone;           /* a peer's (disk_promote_wait) */
	void *arg;
	struct promo_wait *waiters;       /* asks that joined it (g.plock) */
	struct dq *runs;        /* counted in its promos (NULL: not yet) */
	struct promo *hnext;    /* in a dq's hand list, or its read queue */
	unsigned to;            /* the reactor it is handed to */
	bool stale;             /* the key was set or removed meanwhile */
	uint64_t charged;       /* bytes counted in g.promo_bytes */
	uint64_t t0;
	uint64_t copied;        /* payload bytes put into the pool */
	struct dl_loc loc;
	uint8_t *buf;
	size_t cap;             /* buf's bytes */
	struct dq *slot;        /* holds one of its read slots (NULL: none) */
	struct pool_ref ref;
	struct copier_job job;
	struct dir_rec rec;
	bool ok;
	const char *kp;
	size_t klen;
	char key[];
};

/* I/O on the store, and how it failed: peercache_disk_errors_total. */
enum { OP_READ, OP_WRITE, OP_FSYNC, OP__N };
enum { E_EIO, E_ENOSPC, E_EROFS, E_OTHER, E_CANCELED, E_NORES, E__N };
static const char *const op_names[OP__N] = {"read", "write", "fsync"};
/* canceled and no_resources say nothing about the disk (a stop, no
 * memory or no op slot): labelled apart so they never read as failures. */
static const char *const err_names[E__N] = {"EIO", "ENOSPC", "EROFS",
					     "other", "canceled",
					     "no_resources"};

/* Pages the store evicted with a region, to unpublish. */
struct evl {
	unsigned n, cap;
	const char **kp;
	size_t *kl;
	uint64_t *gens;
};

static struct {
	struct pc_ctx *ctx;
	bool off;                   /* not p2p: no tier, nothing runs */
	bool on;
	struct pool *pool;
	uint32_t rkey;
	bool checksums;
	const struct pl_ops *pl;
	const struct svc_cluster *cl;
	struct dlog *d;
	int fd;
	bool direct;
	uint64_t queue_max;
	uint64_t queued;            /* atomic: bytes waiting */
	struct dq *dqs;
	pthread_mutex_t plock;
	/* Promotions in flight, chained by key hash (g.plock): every set
	 * and every ask looks a key up here, and peers' asks can put
	 * thousands in flight, so no list walk. */
	struct promo *promos[PROMO_BUCKETS];
	unsigned npromos; /* atomic: read without the lock on sets */
	uint64_t promo_bytes;       /* atomic: payload bytes being promoted */
	uint64_t promo_max;         /* a quarter of the pool */
	met_id promo_lat;
	/* atomics, exported as counters */
	uint64_t writes, write_bytes, dropped, write_errors, promotions,
		promote_bytes, promote_waits, promote_errors, bad, syncs;
	uint64_t ios; /* atomic: reads and writes with the kernel */
	uint64_t errs[OP__N][E__N];   /* atomics: failed I/O by op and kind */
	/* Degraded (an I/O fault; until the restart): 0 no, 2 being set (by
	 * the one thread that won it), 1 yes, why readable. */
	int degraded;
	char why[160];
	/* Syncs (fdatasync through a reactor's ring): one at a time for the
	 * node (syncing), another one wanted meanwhile (sync_wanted). */
	bool syncing, sync_wanted;
	uint64_t synced_writes;     /* g.writes when the last sync started */
	unsigned faults;            /* test builds: 1 << OP_x fails with EIO */
} g = {.fd = -1};

#ifdef PEERCACHE_FAULT_INJECTION
/* Test builds only: an op armed by PEERCACHE_TEST_DISK_FAULT completes with
 * EIO whatever the kernel said (a write may have reached the disk). */
#define FAULT(op, res) (g.faults & (1u << (op)) ? -EIO : (res))
#else
#define FAULT(op, res) (res)
#endif

static _Thread_local struct dq *t_dq;

/* ------------------------------------------------------------- helpers */

static void cnt(uint64_t *c, uint64_t n)
{
	__atomic_add_fetch(c, n, __ATOMIC_RELAXED);
}

static bool degraded(void)
{
	return __atomic_load_n(&g.degraded, __ATOMIC_ACQUIRE) != 0;
}

/* An I/O of op at off failed with res (a negative errno, or a short
 * count): counted, and — unless it says nothing about the disk (the ring
 * cancelled it at a stop, no memory, no slot) — the tier is degraded for
 * good (until a restart): logged once, with the cause. After a failed
 * write or sync the data is taken as lost, never retried and trusted.
 * true when the disk failed (not only the ring). */
static bool io_failed(unsigned op, int64_t res, uint64_t off)
{
	int e = res < 0 ? (int)-res : 0;
	bool canceled = e == ECANCELED || e == ESHUTDOWN;
	bool nores = e == ENOMEM || e == EAGAIN || e == EBUSY;
	unsigned kind = e == EIO ? E_EIO : e == ENOSPC ? E_ENOSPC
			: e == EROFS ? E_EROFS : canceled ? E_CANCELED
			: nores ? E_NORES : E_OTHER;
	cnt(&g.errs[op][kind], 1);
	if (canceled || nores)
		return false;
	int expect = 0;
	if (!__atomic_compare_exchange_n(&g.degraded, &expect, 2, false,
					 __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
		return true; /* already */
	if (op == OP_FSYNC)
		snprintf(g.why, sizeof(g.why), "fsync of the store failed: %s",
			 strerror(e));
	else
		snprintf(g.why, sizeof(g.why), "a %s at offset %llu failed: %s",
			 op_names[op], (unsigned long long)off,
			 e ? strerror(e) : "short transfer");
	__atomic_store_n(&g.degraded, 1, __ATOMIC_RELEASE);
	PC_LOGE(LOG_MOD, "disk tier degraded: %s. The node keeps serving from "
		"memory; no page is written to disk any more, evicted pages are "
		"dropped, pages already on disk are read while their checksums "
		"hold. Restart the node once the disk is fixed", g.why);
	return true;
}

static void *block_alloc(size_t n)
{
	void *p = NULL;
	return posix_memalign(&p, DL_BLOCK, n) == 0 ? p : NULL;
}

/* A new read buffer of at least n bytes, whole DISK_READ_HUGE pages
 * (MADV_HUGEPAGE is a hint: 4 KiB pages where the kernel has no huge page
 * to give). On the virtio disk here the node promoted 1.2-1.8x the bytes
 * a second into huge pages as into 4 KiB pages scattered over memory (65
 * pieces a 260 KiB read; docs/disk.md, 2026-12-06). At 256 KiB pages a buffer is 2 MiB, so the
 * DISK_READ_KEEP bytes kept are 16 buffers, one per read slot. *cap: its
 * size. */
static uint8_t *read_buf_alloc(size_t n, size_t *cap)
{
	/* mmap, not malloc: it must start on a huge page, which an
	 * allocator (a sanitizer's, say) need not give */
	size_t sz = (n + DISK_READ_HUGE - 1) / DISK_READ_HUGE * DISK_READ_HUGE;
	uint8_t *m = mmap(NULL, sz + DISK_READ_HUGE, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return NULL;
	uintptr_t a = ((uintptr_t)m + DISK_READ_HUGE - 1) &
		      ~(uintptr_t)(DISK_READ_HUGE - 1);
	size_t head = a - (uintptr_t)m;
	if (head)
		munmap(m, head);
	if (DISK_READ_HUGE - head)
		munmap((uint8_t *)a + sz, DISK_READ_HUGE - head);
	(void)madvise((void *)a, sz, MADV_HUGEPAGE);
	*cap = sz;
	return (uint8_t *)a;
}

static void read_buf_free(uint8_t *b, size_t cap)
{
	if (b)
		munmap(b, cap);
}

/* An aligned buffer of at least n bytes for a read on q's reactor: a kept
 * one when one is large enough. *cap: its size. */
static uint8_t *read_buf_take(struct dq *q, size_t n, size_t *cap)
{
	for (unsigned i = 0; q && i < q->nbufs; i++) {
		if (q->bufcap[i] < n)
			continue;
		uint8_t *b = q->bufs[i];
		*cap = q->bufcap[i];
		q->kept -= *cap;
		q->nbufs--;
		q->bufs[i] = q->bufs[q->nbufs];
		q->bufcap[i] = q->bufcap[q->nbufs];
		return b;
	}
	return read_buf_alloc(n, cap);
}

/* Keep b (cap bytes) for the next read on q's reactor, or free it. */
static void read_buf_give(struct dq *q, uint8_t *b, size_t cap)
{
	if (b && q && !q->stopping && q->nbufs < DISK_READ_BUFS &&
	    q->kept + cap <= DISK_READ_KEEP) {
		q->kept += cap;
		q->bufs[q->nbufs] = b;
		q->bufcap[q->nbufs++] = cap;
		return;
	}
	read_buf_free(b, cap);
}

/* The record of an own page: resident at addr, or (addr 0) in this tier. */
static void rec_fill(struct dir_rec *r, bool resident, uint64_t addr,
		     uint64_t len, uint64_t gen)
{
	memset(r, 0, sizeof(*r));
	r->found = true;
	r->resident = resident;
	snprintf(r->node, sizeof(r->node), "%s", g.cl->self_id);
	snprintf(r->data, sizeof(r->data), "%s", g.cl->self_data);
	r->addr = addr;
	r->rkey = g.rkey;
	r->len = (uint32_t)len;
	r->gen = gen;
}

/* -------------------------------------------------- non-resident records */

static void nr_flush(struct rx_reactor *r, struct rx_timer *t);

static void nr_published(void *arg)
{
	struct dq *q = arg;
	q->busy = false;
	q->sent->n = 0;
	if (q->stopping)
		return;
	if (q->fill->n)
		rx_timer_start(q->r, &q->flush, 0, 0);
	if (q->announcing)
		rx_timer_start(q->r, &q->announce,
			       RX_MS(DISK_ANNOUNCE_GAP_MS), 0);
}

/* May record i of b be published? Only over this node's own record (its
 * resident one, at an eviction), or where there is none at a restart:
 * never over another producer's record (latest put wins, and a
 * non-resident record of ours is not readable by other nodes), nor over a
 * delete made since. */
static bool nr_wanted(const struct nrbatch *b, unsigned i)
{
	const struct dir_rec *now = &b->look[i];
	/* At an eviction: only over the evicted generation's own record,
	 * and not once the key is in the pool again (set again since: its
	 * resident record is the one readers need). */
	if (now->found)
		return g.pl->is_here(now) && now->gen == b->recs[i].gen &&
		       !pool_contains(g.pool, b->keys[i], b->klens[i]);
	return b->fresh[i];
}

static void nr_looked_up(void *arg)
{
	struct dq *q = arg;
	struct nrbatch *b = q->sent;
	unsigned n = 0;
	for (unsigned i = 0; i < b->n; i++) {
		if (!nr_wanted(b, i))
			continue;
		if (n != i) {
			memcpy(b->keys[n], b->keys[i], b->klens[i]);
			b->klens[n] = b->klens[i];
			b->recs[n] = b->recs[i];
		}
		b->kp[n] = b->keys[n];
		n++;
	}
	b->n = n;
	struct dir_keys k = {b->kp, b->klens, n};
	if (!n || q->stopping ||
	    g.pl->publish(q->r, &k, b->recs, b->ok, 0, nr_published, q) < 0) {
		if (n && !q->stopping)
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "cannot publish %u "
				  "non-resident records; those pages miss "
				  "until set again", n);
		nr_published(q);
	}
}

/* Send the batch: look its keys up, then publish what nr_wanted allows. */
static void nr_flush(struct rx_reactor *r, struct rx_timer *t)
{
	struct dq *q = t->arg;
	if (q->busy || !q->fill->n || q->stopping)
		return;
	struct nrbatch *b = q->fill;
	q->fill = q->sent;
	q->sent = b;
	for (unsigned i = 0; i < b->n; i++)
		b->kp[i] = b->keys[i];
	struct dir_keys k = {b->kp, b->klens, b->n};
	q->busy = true;
	/* In ring order: nr_wanted acts on the record it finds, the one
	 * readers are given first, not a replica this node may hold older. */
	if (g.pl->lookup(r, &k, b->look, PL_LOOKUP_IN_ORDER, 0, nr_looked_up,
			 q) < 0) {
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "cannot look up %u keys for "
			  "their non-resident records; those pages miss until "
			  "set again", b->n);
		nr_published(q);
	}
}

/* Queue key's non-resident record; false when the batch is full. */
static bool nr_add(struct dq *q, const char *key, size_t klen, uint64_t gen,
		   uint64_t len)
{
	struct nrbatch *b = q->fill;
	if (q->stopping || b->n == DISK_NR_BATCH || klen > DIR_KEY_MAX)
		return false;
	unsigned i = b->n++;
	memcpy(b->keys[i], key, klen);
	b->klens[i] = klen;
	b->fresh[i] = false;
	rec_fill(&b->recs[i], false, 0, len, gen);
	if (!q->busy && !rx_timer_armed(&q->flush))
		rx_timer_start(q->r, &q->flush, 0, 0);
	return true;
}

/* ------------------------------------------------ region evictions */

static void evl_free(void *arg)
{
	struct evl *e = arg;
	for (unsigned i = 0; i < e->n; i++)
		free((void *)(uintptr_t)e->kp[i]);
	free(e->kp);
	free(e->kl);
	free(e->gens);
	free(e);
}

/* dl_alloc's eviction callback (store mutex held): note the page. */
static void on_store_evict(void *arg, const char *key, size_t klen,
			   uint64_t gen)
{
	struct evl *e = arg;
	if (e->n == e->cap) {
		unsigned cap = e->cap ? e->cap * 2 : 64;
		const char **kp = realloc(e->kp, cap * sizeof(*kp));
		if (kp)
			e->kp = kp;
		size_t *kl = realloc(e->kl, cap * sizeof(*kl));
		if (kl)
			e->kl = kl;
		uint64_t *gs = realloc(e->gens, cap * sizeof(*gs));
		if (gs)
			e->gens = gs;
		if (!kp || !kl || !gs)
			return; /* its record stays: a read of it misses */
		e->cap = cap;
	}
	char *k = malloc(klen);
	if (!k)
		return;
	memcpy(k, key, klen);
	e->kp[e->n] = k;
	e->kl[e->n] = klen;
	e->gens[e->n++] = gen;
}

/* The store evicted these pages: their records go, unless the pool holds
 * the key (its record is the pool's). Conditional on this node and gen. */
static void evl_send(struct rx_reactor *r, struct evl *e)
{
	unsigned n = 0;
	for (unsigned i = 0; i < e->n; i++) {
		if (pool_contains(g.pool, e->kp[i], e->kl[i])) {
			free((void *)(uintptr_t)e->kp[i]);
			continue;
		}
		e->kp[n] = e->kp[i];
		e->kl[n] = e->kl[i];
		e->gens[n++] = e->gens[i];
	}
	e->n = n;
	struct dir_keys k = {e->kp, e->kl, n};
	if (!n || g.pl->unpublish(r, &k, g.cl->self_id, e->gens, NULL, 0,
				  evl_free, e) < 0)
		evl_free(e);
}

/* key's record (generation gen) cannot be read: it leaves the index, and
 * its non-resident record leaves placement (unless the pool holds the key:
 * then the record is the pool's). */
static void record_drop(struct rx_reactor *r, const char *key, size_t klen,
			uint64_t gen)
{
	dl_del(g.d, key, klen, gen);
	struct evl *e = calloc(1, sizeof(*e));
	if (!e)
		return; /* its record stays: a read of it misses */
	on_store_evict(e, key, klen, gen);
	evl_send(r, e);
}

/* --------------------------------------------------------- durability */

static void sync_done(void *arg, int64_t res);

static void sync_start(struct dq *q)
{
	__atomic_store_n(&g.sync_wanted, false, __ATOMIC_SEQ_CST);
	uint64_t writes = __atomic_load_n(&g.writes, __ATOMIC_RELAXED);
	int ret = rx_file_fsync(q->r, g.fd, true, sync_done, q);
	if (ret < 0) { /* the periodic sync tries again */
		__atomic_store_n(&g.syncing, false, __ATOMIC_SEQ_CST);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "cannot start a sync of the "
			  "store: %s (tried again later)", strerror(-ret));
		return;
	}
	__atomic_store_n(&g.synced_writes, writes, __ATOMIC_RELAXED);
}

/* An fdatasync of the store, through q's ring (never a blocking call on a
 * reactor): one at a time for the node; one asked while one runs follows
 * it (it covers the writes that completed meanwhile). */
static void sync_request(struct dq *q)
{
	if (degraded() || q->stopping)
		return;
	__atomic_store_n(&g.sync_wanted, true, __ATOMIC_SEQ_CST);
	if (!__atomic_exchange_n(&g.syncing, true, __ATOMIC_SEQ_CST))
		sync_start(q);
}

static void sync_done(void *arg, int64_t res)
{
	struct dq *q = arg;
	res = FAULT(OP_FSYNC, res);
	if (res < 0)
		io_failed(OP_FSYNC, res, 0);
	else
		cnt(&g.syncs, 1);
	__atomic_store_n(&g.syncing, false, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&g.sync_wanted, __ATOMIC_SEQ_CST))
		sync_request(q);
}

/* Reactor 0, every DISK_SYNC_MS: pages written since the last sync get
 * one, so a crash of the machine loses at most about that much. */
static void sync_tick(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	if (__atomic_load_n(&g.writes, __ATOMIC_RELAXED) !=
	    __atomic_load_n(&g.synced_writes, __ATOMIC_RELAXED))
		sync_request(t->arg);
}

/* --------------------------------------------------------- write-through */

static void pump(struct dq *q);

static void item_done(struct wslot *w)
{
	__atomic_sub_fetch(&g.queued, w->it->len, __ATOMIC_RELAXED);
	free(w->it);
	w->it = NULL;
}

/* The write ended with res: index the record or give its place back. A
 * record whose write failed is never indexed (nor announced); nor is one
 * that completes once the tier is degraded. */
static void write_finish(struct wslot *w, int64_t res)
{
	struct wt_item *it = w->it;
	bool opened = w->iolen > w->loc.total; /* the region's header too */
	if (res != (int64_t)w->iolen || degraded()) {
		if (opened)
			dl_abort_header(g.d, w->loc.off);
		else
			dl_abort(g.d, w->loc.off);
		if (res != (int64_t)w->iolen) {
			cnt(&g.write_errors, 1);
			io_failed(OP_WRITE, res, w->loc.off);
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "a page write at "
				  "offset %llu failed: %s",
				  (unsigned long long)w->loc.off,
				  res < 0 ? strerror((int)-res)
					  : "short write");
		} else {
			cnt(&g.dropped, 1);
		}
	} else if (!pool_contains(g.pool, it->key, it->klen)) {
		/* Removed (or evicted) meanwhile: not indexed. */
		dl_abort(g.d, w->loc.off);
	} else if (dl_commit(g.d, it->key, it->klen, &w->loc) == 0) {
		cnt(&g.writes, 1);
		cnt(&g.write_bytes, it->len);
	} else {
		cnt(&g.write_errors, 1);
	}
	/* A region filled: what it holds is synced now (the writes of other
	 * reactors still in flight into it, by the next sync). */
	if (opened && res == (int64_t)w->iolen)
		sync_request(w->q);
	item_done(w);
}

static void write_done(void *arg, int64_t res)
{
	struct wslot *w = arg;
	__atomic_sub_fetch(&g.ios, 1, __ATOMIC_RELAXED);
	write_finish(w, FAULT(OP_WRITE, res));
	pump(w->q);
}

/* The page is in w->buf (or the copy failed): place and write it. */
static void write_copied(struct wslot *w)
{
	struct wt_item *it = w->it;
	pool_unpin(g.pool, &w->ref);
	if (w->job.res < 0) {
		cnt(&g.write_errors, 1);
		item_done(w);
		return;
	}
	uint64_t total = dl_record_bytes(it->klen, it->len), hoff, oseq;
	struct evl *ev = calloc(1, sizeof(*ev));
	int ret = ev ? dl_alloc(g.d, total, &w->loc.off, &w->loc.seq, &hoff,
				&oseq, on_store_evict, ev)
		     : -ENOMEM;
	if (ev)
		evl_send(w->q->r, ev);
	if (ret < 0) {
		cnt(&g.dropped, 1);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "a page was not written: no "
			  "room in the store (%s)", strerror(-ret));
		item_done(w);
		return;
	}
	uint32_t rb = dl_region_bytes(g.d);
	w->loc = (struct dl_loc){.off = w->loc.off, .total = (uint32_t)total,
				 .len = it->len, .gen = it->gen,
				 .sum = w->have_sum ? w->sum : w->job.sumv,
				 .seq = w->loc.seq,
				 .region = (uint32_t)(w->loc.off / rb)};
	dl_rec_hdr_encode(w->buf + DL_BLOCK, it->klen, it->len, it->gen,
			  w->loc.seq, w->loc.sum);
	uint8_t *io = w->buf + DL_BLOCK;
	uint64_t at = w->loc.off;
	w->iolen = total;
	if (hoff != UINT64_MAX) { /* a region opened: its header first */
		PC_ASSERT(hoff + DL_BLOCK == w->loc.off);
		dl_region_hdr_encode(g.d, (uint32_t)(hoff / rb), oseq, w->buf);
		io = w->buf;
		at = hoff;
		w->iolen += DL_BLOCK;
	}
	cnt(&g.ios, 1);
	ret = rx_file_write(w->q->r, g.fd, io, w->iolen, at, write_done, w);
	if (ret < 0) {
		__atomic_sub_fetch(&g.ios, 1, __ATOMIC_RELAXED);
		write_finish(w, ret);
	}
}

static void write_copy_done(struct copier_job *j)
{
	struct wslot *w = j->arg;
	write_copied(w);
	pump(w->q);
}

/* Start w on its item: pin the page, copy it out. false when the item is
 * skipped (its generation is gone, too large, no memory). */
static bool write_start(struct wslot *w)
{
	struct wt_item *it = w->it;
	const uint8_t *hdr;
	uint64_t len, gen;
	if (degraded()) {
		cnt(&g.dropped, 1);
		return false;
	}
	if (pool_get(g.pool, it->key, it->klen, &w->ref, &hdr, &len, &gen) < 0)
		return false; /* evicted or removed before its turn */
	uint64_t total = dl_record_bytes(it->klen, len);
	if (gen != it->gen || len != it->len) {
		pool_unpin(g.pool, &w->ref);
		return false; /* replaced: the newer one is queued */
	}
	if (total + DL_BLOCK > dl_region_bytes(g.d)) {
		pool_unpin(g.pool, &w->ref);
		cnt(&g.dropped, 1);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "a %llu-byte page is larger "
			  "than a disk region (disk_region_size): not written",
			  (unsigned long long)len);
		return false;
	}
	if (w->cap < DL_BLOCK + total) {
		free(w->buf);
		w->cap = 0;
		if (!(w->buf = block_alloc(DL_BLOCK + total))) {
			pool_unpin(g.pool, &w->ref);
			cnt(&g.write_errors, 1);
			return false;
		}
		w->cap = DL_BLOCK + total;
	}
	/* The pool's checksum is XXH3-64 of the payload, as the record's
	 * is: taken over, the copy does not sum the page again. The page
	 * is pinned, so the bytes copied are the ones it describes. */
	const struct pool_hdr *ph = (const struct pool_hdr *)hdr;
	w->have_sum = le16toh(ph->flags) & POOL_HDR_F_CHECKSUM;
	w->sum = le64toh(ph->checksum);
	uint8_t *rec = w->buf + DL_BLOCK;
	memcpy(rec + DL_HDR_BYTES, it->key, it->klen);
	size_t used = DL_HDR_BYTES + it->klen + len;
	memset(rec + used, 0, total - used);
	w->job = (struct copier_job){.dst = rec + DL_HDR_BYTES + it->klen,
				     .src = hdr + POOL_HDR_BYTES, .len = len,
				     .sum = !w->have_sum,
				     .slice = DISK_COPY_SLICE,
				     .done = write_copy_done,
				     .arg = w};
	if (copier_copy(w->q->r, &w->job) == 1)
		write_copied(w);
	return true;
}

/* Start queued writes on idle slots. */
static void pump(struct dq *q)
{
	for (unsigned i = 0; i < DISK_WRITES && q->head && !q->stopping; i++) {
		struct wslot *w = &q->w[i];
		while (!w->it && q->head) {
			w->it = q->head;
			q->head = w->it->next;
			if (!q->head)
				q->tail = NULL;
			if (!write_start(w))
				item_done(w);
		}
	}
}

static void kick(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	pump(t->arg);
}

/* A promotion of key under way is given up (the key changed). */
static uint64_t promo_hash(const char *key, size_t klen)
{
	return pc_page_sum(key, klen);
}

static struct promo **promo_chain(uint64_t h)
{
	return &g.promos[h & (PROMO_BUCKETS - 1)];
}

static void promos_mark_stale(const char *key, size_t klen)
{
	if (!__atomic_load_n(&g.npromos, __ATOMIC_ACQUIRE))
		return; /* the common case: nothing is being promoted */
	uint64_t h = promo_hash(key, klen);
	pthread_mutex_lock(&g.plock);
	for (struct promo *p = *promo_chain(h); p; p = p->next)
		if (p->h == h && p->klen == klen &&
		    memcmp(p->key, key, klen) == 0)
			__atomic_store_n(&p->stale, true, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&g.plock);
}

static void disk_committed(const struct tier_page *pg, uint64_t len)
{
	struct dq *q = t_dq;
	/* The store's copy, if any, is an older page of the key now. */
	dl_del(g.d, pg->key, pg->klen, 0);
	promos_mark_stale(pg->key, pg->klen);
	if (!q || q->stopping || degraded()) {
		cnt(&g.dropped, !q || degraded()); /* not a reactor thread */
		return;
	}
	uint64_t now = __atomic_add_fetch(&g.queued, len, __ATOMIC_RELAXED);
	struct wt_item *it = now <= g.queue_max
				     ? malloc(sizeof(*it) + pg->klen)
				     : NULL;
	if (!it) {
		__atomic_sub_fetch(&g.queued, len, __ATOMIC_RELAXED);
		cnt(&g.dropped, 1);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "write-through queue full "
			  "(disk_queue_max %llu bytes): a page was not written "
			  "to disk", (unsigned long long)g.queue_max);
		return;
	}
	*it = (struct wt_item){.gen = pg->gen, .len = len,
			       .klen = (uint16_t)pg->klen};
	memcpy(it->key, pg->key, pg->klen);
	if (q->tail)
		q->tail->next = it;
	else
		q->head = it;
	q->tail = it;
	if (!rx_timer_armed(&q->kick))
		rx_timer_start(q->r, &q->kick, 0, 0);
}

/* --------------------------------------------------------------- tier ops */

static int disk_offer(const struct tier_page *pg)
{
	struct dq *q = t_dq;
	struct dl_loc loc;
	if (degraded()) {
		/* Not kept: kv unpublishes the record, and the copy (if any)
		 * leaves the index. */
		dl_del(g.d, pg->key, pg->klen, pg->gen);
		return -EIO;
	}
	if (!q || q->stopping || !dl_get(g.d, pg->key, pg->klen, &loc))
		return -ENOTSUP;
	dl_put(g.d, loc.region);
	if (loc.gen != pg->gen) {
		/* An older page of the key: never to be served now. */
		dl_del(g.d, pg->key, pg->klen, loc.gen);
		return -ENOTSUP;
	}
	return nr_add(q, pg->key, pg->klen, loc.gen, loc.len) ? 0 : -ENOTSUP;
}

static bool disk_holds(const char *key, size_t klen)
{
	return dl_has(g.d, key, klen);
}

static void disk_drop(const char *key, size_t klen)
{
	dl_del(g.d, key, klen, 0);
	promos_mark_stale(key, klen);
}

static void wait_run(struct rx_reactor *r, void *arg)
{
	(void)r;
	struct promo_wait *w = arg;
	w->done(w->arg, w->res, w->res ? NULL : &w->rec);
	free(w);
}

/* Tell the asks that joined a promotion how it ended (res; rec when 0),
 * each on its own reactor: at once on this one, posted to another (rare:
 * two peers asked for one key through connections on two reactors). The
 * other reactor is reached through the group by id, never by pointer: at
 * shutdown reactors end one by one, and one that has ended may be freed;
 * its calls ended with it, so its waiter is only freed. */
static void waiters_tell(struct rx_reactor *r, struct promo_wait *w, int res,
			 const struct dir_rec *rec)
{
	struct rx_group *grp = __atomic_load_n(&g.ctx->group, __ATOMIC_ACQUIRE);
	while (w) {
		struct promo_wait *next = w->next;
		w->res = res;
		if (res == 0)
			w->rec = *rec;
		if (w->r == r) {
			wait_run(r, w);
		} else {
			/* No group: before it is published every reactor is
			 * still starting and the pointer is safe; after it
			 * is withdrawn (stopping) no post is. */
			int ret;
			if (grp)
				ret = rx_group_post(grp, w->rid, wait_run, w);
			else if (pc_ctx_state(g.ctx) == PC_NODE_STOPPING)
				ret = -ESHUTDOWN;
			else
				ret = rx_post(w->r, wait_run, w);
			if (ret < 0) {
				if (ret != -ESHUTDOWN)
					PC_LOG_RL(PC_LOG_ERROR, LOG_MOD,
						  "a peer waiting for a "
						  "promotion is not told (%s): "
						  "its call times out",
						  strerror(-ret));
				free(w);
			}
		}
		w = next;
	}
}

static void promo_next(struct dq *q);

/* p is done with its read buffer and its read slot (its copy ended, or it
 * ends): the buffer is kept for the next read, the slot goes to the
 * oldest promotion waiting for one. Not after the publish, which waits
 * for the directory's owners. On p's reactor. */
static void promo_release(struct promo *p)
{
	read_buf_give(t_dq, p->buf, p->cap);
	p->buf = NULL;
	struct dq *q = p->slot;
	p->slot = NULL;
	if (q) {
		q->reading--;
		promo_next(q);
	}
}

/* p leaves the list; the asks that joined it learn res. */
static void promo_free(struct promo *p, int res)
{
	pthread_mutex_lock(&g.plock);
	struct promo **pp = promo_chain(p->h);
	while (*pp && *pp != p)
		pp = &(*pp)->next;
	if (*pp) {
		*pp = p->next;
		__atomic_sub_fetch(&g.npromos, 1, __ATOMIC_RELEASE);
	}
	struct promo_wait *w = p->waiters;
	p->waiters = NULL;
	pthread_mutex_unlock(&g.plock);
	if (p->charged)
		__atomic_sub_fetch(&g.promo_bytes, p->charged,
				   __ATOMIC_RELAXED);
	if (p->runs)
		__atomic_sub_fetch(&p->runs->promos, 1, __ATOMIC_RELAXED);
	waiters_tell(p->r, w, res, &p->rec);
	promo_release(p);
	free(p);
}

static void promo_end(struct promo *p, int res)
{
	if (res == 0) {
		cnt(&g.promotions, 1);
		cnt(&g.promote_bytes, p->copied);
		met_observe_ns(g.promo_lat, pc_now_ns() - p->t0);
	}
	else if (res != -ESTALE)
		cnt(&g.promote_errors, 1);
	if (p->done)
		p->done(p->arg, res);
	else if (p->wdone) /* not told early (promo_tell_early) */
		p->wdone(p->arg, res, res ? NULL : &p->rec);
	promo_free(p, res);
}

static void promo_published(void *arg)
{
	struct promo *p = arg;
	promo_end(p, p->ok ? 0 : -EAGAIN);
}

/* The page is in the pool (p->rec): the peers waiting for it (a
 * disk.promote) are told now, not after the publish, which waits for every
 * directory owner (a frozen one: up to rpc_timeout) while the location is
 * good already. Asks that join later learn the publish's outcome. */
static void promo_tell_early(struct promo *p)
{
	pthread_mutex_lock(&g.plock);
	struct promo_wait *w = p->waiters;
	p->waiters = NULL;
	pthread_mutex_unlock(&g.plock);
	disk_promoted_fn wdone = p->wdone;
	p->wdone = NULL;
	if (wdone)
		wdone(p->arg, 0, &p->rec);
	waiters_tell(p->r, w, 0, &p->rec);
}

static void promo_publish(struct promo *p)
{
	struct dir_keys k = {&p->kp, &p->klen, 1};
	promo_release(p);
	promo_tell_early(p);
	if (g.pl->publish(p->r, &k, &p->rec, &p->ok, 0, promo_published, p) <
	    0)
		promo_end(p, -EAGAIN);
}

/* The pool holds the key already: publish that page's resident record. */
static bool promo_from_pool(struct promo *p)
{
	struct pool_ref ref;
	const uint8_t *hdr;
	uint64_t len, gen;
	if (pool_get(g.pool, p->key, p->klen, &ref, &hdr, &len, &gen) < 0)
		return false;
	rec_fill(&p->rec, true, (uintptr_t)hdr, len, gen);
	pool_unpin(g.pool, &ref);
	promo_publish(p);
	return true;
}

/* A record that is not what the index says: it leaves, counted. */
static void promo_bad(struct promo *p, const char *why)
{
	record_drop(p->r, p->key, p->klen, p->loc.gen);
	cnt(&g.bad, 1);
	PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "a page on disk at offset %llu is "
		  "damaged (%s): dropped, never served",
		  (unsigned long long)p->loc.off, why);
	promo_end(p, -EBADMSG);
}

static void promo_copied(struct copier_job *j)
{
	struct promo *p = j->arg;
	promo_release(p);
	/* A set of the key since (on any reactor) wins: its page is in the
	 * pool or the promotion was marked stale. */
	if (j->res < 0 || __atomic_load_n(&p->stale, __ATOMIC_RELAXED) ||
	    pool_contains(g.pool, p->key, p->klen)) {
		pool_abort(g.pool, &p->ref);
		promo_end(p, j->res < 0 ? j->res : -ESTALE);
		return;
	}
	if (j->sumv != p->loc.sum) {
		pool_abort(g.pool, &p->ref);
		promo_bad(p, "payload checksum");
		return;
	}
	uint64_t gen;
	uintptr_t addr;
	if (pool_commit_sum(g.pool, &p->ref, g.checksums, j->sumv, &gen,
			    &addr) < 0) {
		promo_end(p, -EIO);
		return;
	}
	p->copied = p->loc.len;
	/* Evicting this generation later keeps it again. */
	dl_retag(g.d, p->key, p->klen, p->loc.seq, gen);
	rec_fill(&p->rec, true, addr, p->loc.len, gen);
	promo_publish(p);
}

static void promo_read(void *arg, int64_t res)
{
	struct promo *p = arg;
	__atomic_sub_fetch(&g.ios, 1, __ATOMIC_RELAXED);
	res = FAULT(OP_READ, res);
	dl_put(g.d, p->loc.region);
	if (res != (int64_t)p->loc.total) {
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "a page read at offset %llu "
			  "failed: %s; the page is dropped",
			  (unsigned long long)p->loc.off,
			  res < 0 ? strerror((int)-res) : "short read");
		/* A miss, and never tried again: the record goes. */
		if (io_failed(OP_READ, res, p->loc.off))
			record_drop(p->r, p->key, p->klen, p->loc.gen);
		promo_end(p, res < 0 ? (int)res : -EIO);
		return;
	}
	struct dl_rec_hdr h;
	if (dl_rec_check(p->buf, (size_t)res, p->key, p->klen, &p->loc,
			 &h) < 0) {
		promo_bad(p, "record header");
		return;
	}
	if (__atomic_load_n(&p->stale, __ATOMIC_RELAXED)) {
		promo_end(p, -ESTALE);
		return;
	}
	if (promo_from_pool(p))
		return; /* set again meanwhile: that page is the one */
	uint8_t *dst;
	int ret = pool_reserve(g.pool, p->key, p->klen, h.len, &p->ref, &dst);
	if (ret < 0) {
		promo_end(p, ret);
		return;
	}
	p->job = (struct copier_job){.dst = dst,
				     .src = p->buf + DL_HDR_BYTES + p->klen,
				     .len = h.len, .sum = true,
				     .done = promo_copied, .arg = p};
	if (copier_copy(p->r, &p->job) == 1)
		promo_copied(&p->job);
}

static struct promo *promo_new(struct rx_reactor *r, const char *key,
			       size_t klen)
{
	struct promo *p = calloc(1, sizeof(*p) + klen);
	if (!p)
		return NULL;
	*p = (struct promo){.r = r, .h = promo_hash(key, klen), .kp = p->key,
			    .klen = klen, .t0 = pc_now_ns()};
	memcpy(p->key, key, klen);
	return p;
}

/* Make p key's promotion; false when one is under way (p is not used; w,
 * when not NULL, joins that one). */
static bool promo_insert(struct promo *p, struct promo_wait *w)
{
	struct promo **chain = promo_chain(p->h);
	pthread_mutex_lock(&g.plock);
	for (struct promo *o = *chain; o; o = o->next) {
		if (o->h == p->h && o->klen == p->klen &&
		    memcmp(o->key, p->key, p->klen) == 0) {
			if (w) {
				w->next = o->waiters;
				o->waiters = w;
			}
			pthread_mutex_unlock(&g.plock);
			return false;
		}
	}
	p->next = *chain;
	*chain = p;
	__atomic_add_fetch(&g.npromos, 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&g.plock);
	return true;
}

/* Admit the promotion p (on the list): 1 when the pool has the page (its
 * publish is under way), 0 when p may read (its region held, its bytes
 * charged), or -errno (p is gone, its asker not called). */
static int promo_admit(struct promo *p)
{
	if (promo_from_pool(p))
		return 1;
	if (!dl_get(g.d, p->key, p->klen, &p->loc)) {
		promo_free(p, -ENOENT);
		return -ENOENT;
	}
	/* Promotions under way hold pool reservations, which cannot be
	 * evicted: a quarter of the pool at most, so that they do not crowd
	 * each other (and the sets) out. Over it: not started. */
	p->charged = p->loc.len ? p->loc.len : 1;
	uint64_t now = __atomic_add_fetch(&g.promo_bytes, p->charged,
					  __ATOMIC_RELAXED);
	if (now > g.promo_max && now != p->charged) { /* alone: always */
		dl_put(g.d, p->loc.region);
		promo_free(p, -EBUSY);
		return -EBUSY;
	}
	return 0;
}

/* Read p's record now, on this reactor (p->r): 0, or -errno (its region
 * given back; p is the caller's to end). */
static int promo_read_start(struct promo *p)
{
	struct dq *q = t_dq;
	int ret = -ENOMEM;
	cnt(&g.ios, 1);
	if ((p->buf = read_buf_take(q, p->loc.total, &p->cap)))
		ret = rx_file_read(p->r, g.fd, p->buf, p->loc.total, p->loc.off,
				   promo_read, p);
	if (ret < 0) {
		__atomic_sub_fetch(&g.ios, 1, __ATOMIC_RELAXED);
		dl_put(g.d, p->loc.region);
	} else if (q) {
		q->reading++;
		p->slot = q;
	}
	return ret;
}

/* Start the read of an admitted p on its reactor (p->r, this thread), or
 * queue it behind that reactor's DISK_PROMO_READS reads in flight: 0, or
 * -errno (its region given back; p is the caller's to end). Without the
 * cap, a burst of asks issued a read per page at once, each with a buffer
 * of its own beyond the DISK_READ_BUFS kept (mmap, faults, munmap): more
 * reads in flight, fewer bytes a second (docs/disk.md, 2026-12-06). */
static int promo_issue(struct promo *p)
{
	struct dq *q = t_dq;
	if (!p->runs) {
		p->runs = q;
		if (p->runs)
			__atomic_add_fetch(&p->runs->promos, 1,
					   __ATOMIC_RELAXED);
	}
	if (q && !q->stopping && q->reading >= DISK_PROMO_READS) {
		p->hnext = NULL;
		if (q->rq_tail)
			q->rq_tail->hnext = p;
		else
			q->rq_head = p;
		q->rq_tail = p;
		cnt(&g.promote_waits, 1);
		return 0;
	}
	return promo_read_start(p);
}

/* A read slot of q's came free (or q is stopping): the oldest waiting
 * promotions read; at a stop they end. On q's reactor. */
static void promo_next(struct dq *q)
{
	while (q && q->rq_head &&
	       (q->stopping || q->reading < DISK_PROMO_READS)) {
		struct promo *p = q->rq_head;
		q->rq_head = p->hnext;
		if (!q->rq_head)
			q->rq_tail = NULL;
		p->hnext = NULL;
		int ret;
		if (q->stopping) {
			dl_put(g.d, p->loc.region);
			ret = -ESHUTDOWN;
		} else {
			ret = promo_read_start(p);
		}
		if (ret < 0)
			promo_end(p, ret);
	}
}

/* Run the promotion p (on the list) here: 0 when under way (promo_end runs
 * later), or -errno (p is gone, its asker not called). */
static int promo_start(struct promo *p)
{
	int ret = promo_admit(p);
	if (ret)
		return ret > 0 ? 0 : ret;
	if ((ret = promo_issue(p)) < 0) {
		promo_free(p, ret);
		cnt(&g.promote_errors, 1);
	}
	return ret;
}

/* On the reactor promotions were handed to (one message per pass of the
 * reactor that took the asks): start them here. A message run as the
 * reactor ends only ends them. */
static void promos_take(struct rx_reactor *r, void *arg)
{
	for (struct promo *p = arg, *next; p; p = next) {
		next = p->hnext;
		p->r = r;
		int ret;
		if (rx_reactor_stopping(r)) {
			dl_put(g.d, p->loc.region);
			ret = -ESHUTDOWN;
		} else if ((ret = promo_issue(p)) == 0) {
			continue;
		}
		promo_end(p, ret);
	}
}

/* The asks this pass took, to their reactors: one message each (a post
 * per page would cost a wake-up per page). One that cannot be posted
 * (that reactor is ending) runs here. */
static void promos_hand(struct rx_reactor *r, struct rx_timer *t)
{
	struct dq *q = t->arg;
	struct rx_group *grp = __atomic_load_n(&g.ctx->group, __ATOMIC_ACQUIRE);
	while (q->hand) {
		unsigned to = q->hand->to;
		struct promo *mine = NULL, *rest = NULL;
		for (struct promo *p = q->hand, *next; p; p = next) {
			next = p->hnext;
			struct promo **l = p->to == to ? &mine : &rest;
			p->hnext = *l;
			*l = p;
		}
		q->hand = rest;
		if (!grp || rx_group_post(grp, to, promos_take, mine) < 0) {
			for (struct promo *p = mine; p; p = p->hnext) {
				__atomic_sub_fetch(&g.dqs[to].promos, 1,
						   __ATOMIC_RELAXED);
				p->runs = NULL;
			}
			promos_take(r, mine);
		}
	}
}

/* Which reactor runs a promotion asked on r: the one with the fewest
 * promotions running (r on a tie). All of one client's asks arrive on
 * its connection's reactor; each promotion's read, header check, copy with
 * checksum and publish is ~0.1 ms of one reactor, which at 1 GB/s kept
 * that reactor ~80 % busy while another idled. */
static unsigned promo_where(struct rx_reactor *r)
{
	unsigned here = rx_reactor_id(r), best = here;
	if (!__atomic_load_n(&g.ctx->group, __ATOMIC_ACQUIRE))
		return here;
	unsigned least = __atomic_load_n(&g.dqs[here].promos,
					 __ATOMIC_RELAXED);
	for (unsigned i = 0; i < g.ctx->threads; i++) {
		unsigned n = __atomic_load_n(&g.dqs[i].promos,
					     __ATOMIC_RELAXED);
		if (n < least) {
			least = n;
			best = i;
		}
	}
	return best;
}

static int disk_promote(struct rx_reactor *r, const char *key, size_t klen,
			const struct dir_rec *rec,
			void (*done)(void *arg, int res), void *arg)
{
	(void)rec;
	if (klen == 0 || klen > DL_KEY_MAX)
		return -EINVAL;
	struct promo *p = promo_new(r, key, klen);
	if (!p)
		return -ENOMEM;
	p->done = done;
	p->arg = arg;
	if (!promo_insert(p, NULL)) {
		free(p);
		return -EALREADY; /* shares the one under way */
	}
	struct dq *q = t_dq;
	unsigned to = q ? promo_where(r) : rx_reactor_id(r);
	if (to == rx_reactor_id(r))
		return promo_start(p);
	int ret = promo_admit(p);
	if (ret)
		return ret > 0 ? 0 : ret;
	/* Counted there now, so that the next choice sees it. */
	p->to = to;
	p->runs = &g.dqs[to];
	__atomic_add_fetch(&p->runs->promos, 1, __ATOMIC_RELAXED);
	p->hnext = q->hand;
	q->hand = p;
	if (!rx_timer_armed(&q->hand_timer))
		rx_timer_start(r, &q->hand_timer, 0, 0); /* never fails */
	return 0;
}

int disk_promote_wait(struct rx_reactor *r, const char *key, size_t klen,
		      struct dir_rec *rec, disk_promoted_fn done, void *arg)
{
	if (!g.on)
		return -ENOTSUP;
	if (klen == 0 || klen > DL_KEY_MAX)
		return -EINVAL;
	struct pool_ref ref;
	const uint8_t *hdr;
	uint64_t len, gen;
	if (pool_get(g.pool, key, klen, &ref, &hdr, &len, &gen) == 0) {
		rec_fill(rec, true, (uintptr_t)hdr, len, gen);
		pool_unpin(g.pool, &ref);
		return 1; /* in memory: its record is the answer */
	}
	struct promo *p = promo_new(r, key, klen);
	struct promo_wait *w = malloc(sizeof(*w));
	if (!p || !w) {
		free(p);
		free(w);
		return -ENOMEM;
	}
	*w = (struct promo_wait){
		.r = r, .rid = rx_reactor_id(r), .done = done, .arg = arg};
	if (!promo_insert(p, w)) {
		free(p);
		return 0; /* joined the one under way */
	}
	free(w);
	p->wdone = done;
	p->arg = arg;
	int ret = promo_start(p);
	return ret < 0 ? ret : 0;
}

struct scan_ctx {
	void (*fn)(void *arg, const struct tier_page *pg, uint64_t len);
	void *arg;
};

static void scan_one(void *arg, const char *key, size_t klen,
		     const struct dl_loc *loc)
{
	struct scan_ctx *c = arg;
	struct tier_page pg = {key, klen, loc->gen};
	c->fn(c->arg, &pg, loc->len);
}

static int disk_scan(uint64_t *cursor, unsigned max,
		     void (*fn)(void *arg, const struct tier_page *pg,
				uint64_t len),
		     void *arg)
{
	struct scan_ctx c = {fn, arg};
	return dl_scan(g.d, cursor, max, scan_one, &c);
}

/* The tier service: disk_tier with the disk tier on, else remote_only (no
 * pages of its own, but it asks peers to promote theirs); disk_remote_init
 * adds the remote promotion to both. */
static struct tier_ops disk_tier = {
	.name = "disk",
	.offer = disk_offer,
	.promote = disk_promote,
	.committed = disk_committed,
	.holds = disk_holds,
	.drop = disk_drop,
	.scan = disk_scan,
};

/* ------------------------------------------------------ warm restart */

static void announce_one(void *arg, const char *key, size_t klen,
			 const struct dl_loc *loc)
{
	struct nrbatch *b = arg;
	if (klen > DIR_KEY_MAX)
		return;
	unsigned i = b->n++;
	memcpy(b->keys[i], key, klen);
	b->klens[i] = klen;
	b->recs[i].gen = loc->gen;
	b->recs[i].len = loc->len;
}

/* Reactor 0, once after start: every page of the rebuilt store gets its
 * non-resident record, one batch at a time. */
static void announce_step(struct rx_reactor *r, struct rx_timer *t)
{
	struct dq *q = t->arg;
	if (q->busy || q->stopping)
		return; /* nr_published re-arms */
	struct nrbatch *b = q->fill;
	unsigned from = b->n;
	int more = dl_scan(g.d, &q->cursor, DISK_NR_BATCH - from,
			   announce_one, b);
	unsigned n = from;
	for (unsigned i = from; i < b->n; i++) {
		if (pool_contains(g.pool, b->keys[i], b->klens[i]))
			continue; /* set again since: its record is the pool's */
		uint64_t gen = b->recs[i].gen, len = b->recs[i].len;
		memmove(b->keys[n], b->keys[i], b->klens[i]);
		b->klens[n] = b->klens[i];
		b->fresh[n] = true;
		rec_fill(&b->recs[n++], false, 0, len, gen);
	}
	q->announced += n - from;
	b->n = n;
	if (!more) {
		q->announcing = false;
		PC_LOGI(LOG_MOD, "re-announced %llu page%s of the store as "
			"non-resident records", (unsigned long long)q->announced,
			q->announced == 1 ? "" : "s");
	}
	if (b->n)
		nr_flush(r, &q->flush); /* re-arms this step when back */
	else if (more)
		rx_timer_start(r, t, RX_MS(DISK_ANNOUNCE_GAP_MS), 0);
}

/* ------------------------------------------------------------ store file */

/* mkdir -p path. */
static int mkdirs(const char *path)
{
	char buf[4096];
	snprintf(buf, sizeof(buf), "%s", path);
	for (char *s = buf + 1;; s++) {
		bool end = *s == '\0';
		if (*s == '/' || end) {
			*s = '\0';
			if (mkdir(buf, 0700) < 0 && errno != EEXIST)
				return -errno;
			if (end)
				break;
			*s = '/';
		}
	}
	struct stat st;
	if (stat(buf, &st) < 0)
		return -errno;
	return S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
}

/* fsync the directory dir: a file created or renamed in it stays after a
 * crash of the machine (init: a blocking call on the main thread). */
static int dir_sync(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int ret = fsync(fd) < 0 ? -errno : 0;
	close(fd);
	if (ret < 0)
		PC_LOGE(LOG_MOD, "cannot sync the directory %s: %s", dir,
			strerror(-ret));
	return ret;
}

/* The store's identity: read, or made once (16 random bytes). */
static int store_id(const char *dir, uint8_t id[16])
{
	char path[4200], tmp[4300];
	snprintf(path, sizeof(path), "%s/%s", dir, DISK_ID_FILE);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		ssize_t n = read(fd, id, 16);
		close(fd);
		if (n == 16)
			return 0;
		PC_LOGE(LOG_MOD, "%s is damaged (%zd bytes, not 16); remove it "
			"and the store file to start an empty store", path, n);
		return -EINVAL;
	}
	if (errno != ENOENT)
		return -errno;
	if (getrandom(id, 16, 0) != 16)
		return -EIO;
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	int ret = write(fd, id, 16) == 16 && fsync(fd) == 0 ? 0 : -EIO;
	close(fd);
	if (ret == 0 && rename(tmp, path) < 0)
		ret = -errno;
	if (ret == 0)
		ret = dir_sync(dir);
	if (ret == 0)
		PC_LOGI(LOG_MOD, "new store identity written to %s", path);
	return ret;
}

/* Open (creating and preallocating) the store file. */
static int store_open(const char *dir, uint64_t size)
{
	char path[4200];
	snprintf(path, sizeof(path), "%s/%s", dir, DISK_STORE_FILE);
	int fd = open(path, O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
	g.direct = fd >= 0;
	if (fd < 0 && errno == EINVAL) {
		PC_LOGW(LOG_MOD, "%s: the file system does not take O_DIRECT "
			"(tmpfs?): buffered I/O, through the page cache", path);
		fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	}
	if (fd < 0) {
		int e = errno;
		PC_LOGE(LOG_MOD, "cannot open the store file %s: %s", path,
			strerror(e));
		return -e;
	}
	/* One node per store: a second one on the same disk_path would
	 * write over the first one's records. */
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		int e = errno;
		PC_LOGE(LOG_MOD, "the store file %s is in use by another process "
			"(%s): one node per disk_path", path,
			e == EWOULDBLOCK ? "locked" : strerror(e));
		close(fd);
		return e == EWOULDBLOCK ? -EBUSY : -e;
	}
	struct stat st;
	int ret = fstat(fd, &st) < 0 ? -errno : 0;
	if (ret == 0 && (uint64_t)st.st_size > size && ftruncate(fd, size) < 0)
		ret = -errno;
	if (ret == 0 && (ret = -posix_fallocate(fd, 0, (off_t)size)) ==
			       -EOPNOTSUPP)
		ret = ftruncate(fd, size) < 0 ? -errno : 0;
	if (ret < 0) {
		PC_LOGE(LOG_MOD, "cannot allocate %llu bytes for the store file "
			"%s: %s", (unsigned long long)size, path,
			strerror(-ret));
		close(fd);
		return ret;
	}
	g.fd = fd;
	return 0;
}

/* The index, from the regions' own bytes (blocking reads: init). */
static int store_rebuild(void)
{
	uint32_t rb = dl_region_bytes(g.d), n = dl_regions(g.d);
	uint8_t *buf = block_alloc(rb);
	if (!buf)
		return -ENOMEM;
	uint64_t t0 = pc_now_ns(), seq;
	unsigned bad = 0, regions = 0;
	for (uint32_t i = 0; i < n; i++) {
		off_t off = (off_t)i * rb;
		ssize_t got = pread(g.fd, buf, DL_BLOCK, off);
		if (got != DL_BLOCK || dl_region_hdr_decode(g.d, i, buf,
							    &seq) < 0)
			continue;
		got = pread(g.fd, buf, rb, off);
		if (got < (ssize_t)DL_BLOCK) {
			PC_LOGW(LOG_MOD, "cannot read region %u of the store: "
				"%s", i, got < 0 ? strerror(errno) : "short");
			continue;
		}
		int found = dl_rebuild_region(g.d, i, buf,
					      (size_t)got / DL_BLOCK * DL_BLOCK,
					      true, &bad);
		regions += found > 0;
	}
	free(buf);
	cnt(&g.bad, bad);
	struct dl_stats st;
	dl_stats(g.d, &st);
	PC_LOGI(LOG_MOD, "store index rebuilt: %llu page%s (%llu bytes) in %u "
		"region%s, %u damaged record%s dropped, in %.3f s",
		(unsigned long long)st.keys, st.keys == 1 ? "" : "s",
		(unsigned long long)st.bytes_live, regions,
		regions == 1 ? "" : "s", bad, bad == 1 ? "" : "s",
		(double)(pc_now_ns() - t0) / 1e9);
	return 0;
}

/* ------------------------------------------------------------- metrics */

static double stat_of(void *arg)
{
	struct dl_stats st;
	dl_stats(g.d, &st);
	switch ((uintptr_t)arg) {
	case 0:
		return (double)st.regions * dl_region_bytes(g.d);
	case 1:
		return (double)st.bytes_used;
	case 2:
		return (double)st.keys;
	default:
		return (double)st.evicted_keys;
	}
}

static double atomic_of(void *arg)
{
	return (double)__atomic_load_n((uint64_t *)arg, __ATOMIC_RELAXED);
}

static double direct_of(void *arg)
{
	(void)arg;
	return g.direct;
}

static double degraded_of(void *arg)
{
	(void)arg;
	return degraded();
}

static void metrics_register(void)
{
	met_register_fn("peercache_disk_degraded",
			"1: the disk tier is degraded by an I/O fault (until "
			"a restart): nothing is written, evicted pages are "
			"dropped", NULL, degraded_of, NULL);
	for (unsigned op = 0; op < OP__N; op++) {
		for (unsigned k = 0; k < E__N; k++) {
			static char labels[OP__N][E__N][48];
			snprintf(labels[op][k], sizeof(labels[op][k]),
				 "op=\"%s\",error=\"%s\"", op_names[op],
				 err_names[k]);
			met_register_counter_fn("peercache_disk_errors_total",
						"failed I/O on the store file, "
						"by operation and error",
						labels[op][k], atomic_of,
						&g.errs[op][k]);
		}
	}
	met_register_fn("peercache_disk_capacity_bytes",
			"disk tier store bytes", NULL, stat_of, (void *)0);
	met_register_fn("peercache_disk_bytes_used",
			"disk tier bytes of the records it indexes", NULL,
			stat_of, (void *)1);
	met_register_fn("peercache_disk_keys", "pages the disk tier holds",
			NULL, stat_of, (void *)2);
	met_register_counter_fn("peercache_disk_evicted_keys_total",
				"pages the disk tier evicted with their region "
				"for space", NULL, stat_of, (void *)3);
	met_register_fn("peercache_disk_queue_bytes",
			"page bytes waiting for their write-through", NULL,
			atomic_of, &g.queued);
	met_register_fn("peercache_disk_ios_in_flight",
			"reads and writes of the store file with the kernel "
			"now (its queue depth)", NULL, atomic_of, &g.ios);
	met_register_fn("peercache_disk_direct_io",
			"1: the store file uses O_DIRECT; 0: buffered", NULL,
			direct_of, NULL);
	static const struct {
		const char *name, *help;
		uint64_t *v;
	} ctrs[] = {
		{"peercache_disk_writes_total", "pages written to disk",
		 &g.writes},
		{"peercache_disk_write_bytes_total",
		 "page payload bytes written to disk", &g.write_bytes},
		{"peercache_disk_write_dropped_total",
		 "pages not written: the write-through queue was full, the "
		 "page was larger than a region or the store had no room",
		 &g.dropped},
		{"peercache_disk_write_errors_total",
		 "page writes that failed (I/O errors)", &g.write_errors},
		{"peercache_disk_promotions_total",
		 "pages brought back from disk into the pool", &g.promotions},
		{"peercache_disk_promote_bytes_total",
		 "payload bytes of the pages brought back from disk",
		 &g.promote_bytes},
		{"peercache_disk_promote_waits_total",
		 "promotions that waited for a read slot (a reactor reads "
		 "and copies 16 at a time)", &g.promote_waits},
		{"peercache_disk_promote_errors_total",
		 "promotions that failed (I/O, damaged record, no pool room)",
		 &g.promote_errors},
		{"peercache_disk_syncs_total",
		 "fdatasyncs of the store file that succeeded", &g.syncs},
		{"peercache_disk_bad_pages_total",
		 "records dropped because their header or checksum failed "
		 "(at the rebuild or on a read)", &g.bad},
	};
	g.promo_lat = met_register(MET_HISTOGRAM,
				   "peercache_disk_promote_latency_seconds",
				   "from the ask to the resident record "
				   "published, promotions that succeeded",
				   NULL);
	for (size_t i = 0; i < PC_ARRAY_LEN(ctrs); i++)
		met_register_counter_fn(ctrs[i].name, ctrs[i].help, NULL,
					atomic_of, ctrs[i].v);
}

/* ------------------------------------------------------------- lifecycle */

static void disk_close(void)
{
	if (g.fd >= 0)
		close(g.fd);
	dl_free(g.d);
	free(g.dqs);
	g.fd = -1;
	g.d = NULL;
	g.dqs = NULL;
}

static struct tier_ops remote_only;

#ifdef PEERCACHE_FAULT_INJECTION
/* Test builds: PEERCACHE_TEST_DISK_FAULT=read,write,fsync (any of them)
 * makes those ops on the store complete with EIO. Loud: never silent. */
static int faults_arm(void)
{
	const char *v = getenv("PEERCACHE_TEST_DISK_FAULT");
	if (!v || !*v)
		return 0;
	char buf[64];
	snprintf(buf, sizeof(buf), "%s", v);
	for (char *save, *t = strtok_r(buf, ",", &save); t;
	     t = strtok_r(NULL, ",", &save)) {
		unsigned op = 0;
		while (op < OP__N && strcmp(t, op_names[op]) != 0)
			op++;
		if (op == OP__N) {
			PC_LOGE(LOG_MOD, "PEERCACHE_TEST_DISK_FAULT: unknown op "
				"'%s' (read, write, fsync)", t);
			return -EINVAL;
		}
		g.faults |= 1u << op;
	}
	PC_LOGW(LOG_MOD, "fault injection (a test build): the store's%s%s%s"
		" fail with EIO", g.faults & 1u << OP_READ ? " reads" : "",
		g.faults & 1u << OP_WRITE ? " writes" : "",
		g.faults & 1u << OP_FSYNC ? " fsyncs" : "");
	return 0;
}
#endif

static int disk_init(struct pc_ctx *ctx)
{
	const struct pc_settings *s = ctx->cfg;
	memset(&g, 0, sizeof(g));
	g.fd = -1;
	g.ctx = ctx;
	if (s->mode != PC_MODE_P2P) {
		g.off = true; /* no tier in this mode (and no kv under it) */
		return 0;
	}
	if (!s->disk_enabled) {
		remote_only = tier_none;
		int ret = disk_remote_init(ctx, &remote_only, false);
		if (ret == 0 &&
		    (ret = svc_publish_tier(ctx, "disk", &remote_only)) < 0)
			disk_remote_fini();
		return ret;
	}
	const struct svc_pool *ps;
	if (!(ps = svc_need_pool(ctx, "disk")) ||
	    !(g.pl = svc_need_placement(ctx, "disk")) ||
	    !(g.cl = svc_need_cluster(ctx, "disk")))
		return -ENOENT;
	g.pool = ps->pool;
	g.rkey = ps->rkey;
	struct pool_stats pst;
	pool_stats(g.pool, &pst);
	g.promo_max = pst.capacity / 4;
	g.checksums = s->page_checksums;
	g.queue_max = s->disk_queue_max;
	int ret;
#ifdef PEERCACHE_FAULT_INJECTION
	if ((ret = faults_arm()) < 0)
		return ret;
#endif
	ret = mkdirs(s->disk_path);
	if (ret < 0) {
		PC_LOGE(LOG_MOD, "disk_path %s cannot be created: %s",
			s->disk_path, strerror(-ret));
		return ret;
	}
	struct dl_params p = {.region_bytes = (uint32_t)s->disk_region_size};
	p.capacity = s->disk_size / p.region_bytes * p.region_bytes;
	if ((ret = store_id(s->disk_path, p.store_id)) < 0) {
		PC_LOGE(LOG_MOD, "no store identity in %s: %s", s->disk_path,
			strerror(-ret));
		return ret;
	}
	if ((ret = dl_new(&g.d, &p)) < 0) {
		PC_LOGE(LOG_MOD, "cannot build a %llu-byte store of %u-byte "
			"regions: %s", (unsigned long long)p.capacity,
			p.region_bytes, ret == -EINVAL ? "too many regions "
			"(raise disk_region_size)" : strerror(-ret));
		return ret;
	}
	g.dqs = calloc(ctx->threads, sizeof(*g.dqs));
	if (!g.dqs || (ret = store_open(s->disk_path, p.capacity)) < 0 ||
	    (ret = dir_sync(s->disk_path)) < 0 || /* the store file stays */
	    (ret = store_rebuild()) < 0 ||
	    (ret = disk_remote_init(ctx, &disk_tier, true)) < 0) {
		disk_close();
		return ret < 0 ? ret : -ENOMEM;
	}
	if ((ret = svc_publish_tier(ctx, "disk", &disk_tier)) < 0) {
		disk_remote_fini();
		disk_close();
		return ret;
	}
	pthread_mutex_init(&g.plock, NULL);
	g.on = true;
	metrics_register();
	PC_LOGI(LOG_MOD, "disk tier on: %s/%s, %llu bytes in %u regions, %s "
		"I/O", s->disk_path, DISK_STORE_FILE,
		(unsigned long long)p.capacity, dl_regions(g.d),
		g.direct ? "direct" : "buffered");
	return 0;
}

static int disk_start(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	if (g.off)
		return 0;
	int ret = disk_remote_start(r);
	if (ret < 0 || !g.on)
		return ret;
	struct dq *q = &g.dqs[rx_reactor_id(r)];
	q->r = r;
	q->fill = calloc(1, sizeof(*q->fill));
	q->sent = calloc(1, sizeof(*q->sent));
	if (!q->fill || !q->sent)
		return -ENOMEM;
	for (unsigned i = 0; i < DISK_WRITES; i++)
		q->w[i].q = q;
	rx_timer_init(&q->kick, kick, q);
	rx_timer_init(&q->flush, nr_flush, q);
	rx_timer_init(&q->announce, announce_step, q);
	rx_timer_init(&q->sync, sync_tick, q);
	rx_timer_init(&q->hand_timer, promos_hand, q);
	t_dq = q;
	if (rx_reactor_id(r) == 0)
		rx_timer_start(r, &q->sync, RX_MS(DISK_SYNC_MS),
			       RX_MS(DISK_SYNC_MS));
	struct dl_stats st;
	dl_stats(g.d, &st);
	if (rx_reactor_id(r) == 0 && st.keys) {
		q->announcing = true;
		rx_timer_start(r, &q->announce, 0, 0);
	}
	return 0;
}

static void disk_stop(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	if (g.off)
		return;
	disk_remote_stop(r);
	if (!g.on)
		return;
	struct dq *q = &g.dqs[rx_reactor_id(r)];
	q->stopping = true;
	rx_timer_stop(r, &q->kick);
	rx_timer_stop(r, &q->flush);
	rx_timer_stop(r, &q->announce);
	rx_timer_stop(r, &q->sync);
	rx_timer_stop(r, &q->hand_timer);
	promos_hand(r, &q->hand_timer); /* asks not handed over yet */
	promo_next(q); /* those waiting for a read slot end */
}

static void disk_exit(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	if (g.off)
		return;
	disk_remote_exit(r);
	if (!g.on)
		return;
	struct dq *q = &g.dqs[rx_reactor_id(r)];
	q->stopping = true;
	t_dq = NULL;
	while (q->head) {
		struct wt_item *it = q->head;
		q->head = it->next;
		__atomic_sub_fetch(&g.queued, it->len, __ATOMIC_RELAXED);
		free(it);
	}
	q->tail = NULL;
	/* A forced stop may leave writes to the kernel (ops still in use):
	 * their buffers are left alone, the process is ending anyway. */
	bool inflight = rx_reactor_stats(r)->ops_in_use > 0;
	for (unsigned i = 0; i < DISK_WRITES; i++) {
		free(q->w[i].it); /* a copy the loop's end cut short */
		if (!inflight)
			free(q->w[i].buf);
		q->w[i] = (struct wslot){.q = q};
	}
	free(q->fill);
	free(q->sent);
	q->fill = q->sent = NULL;
	while (q->nbufs) {
		q->nbufs--;
		read_buf_free(q->bufs[q->nbufs], q->bufcap[q->nbufs]);
	}
	q->kept = 0;
}

static void disk_fini(struct pc_ctx *ctx)
{
	if (g.off)
		return;
	if (svc_find_tier(ctx))
		svc_withdraw_tier(ctx);
	disk_remote_fini();
	if (!g.on)
		return;
	/* promotions cut short by the end of the loops */
	for (unsigned b = 0; b < PROMO_BUCKETS; b++) {
		while (g.promos[b]) {
			struct promo *p = g.promos[b];
			g.promos[b] = p->next;
			while (p->waiters) {
				struct promo_wait *w = p->waiters;
				p->waiters = w->next;
				free(w);
			}
			read_buf_free(p->buf, p->cap);
			free(p);
		}
	}
	g.npromos = 0;
	pthread_mutex_destroy(&g.plock);
	/* A clean stop: everything written is synced (the reactors ended,
	 * so a blocking call is fine here). */
	if (!degraded() && g.fd >= 0 && fdatasync(g.fd) < 0)
		PC_LOGE(LOG_MOD, "the last sync of the store failed: %s; pages "
			"written lately may be lost if the machine crashes",
			strerror(errno));
	disk_close();
	g.on = false;
}

/* The module's degraded hook (/healthz, node.health): any thread. */
static int disk_degraded(char *why, size_t cap)
{
	if (__atomic_load_n(&g.degraded, __ATOMIC_ACQUIRE) != 1)
		return 0;
	snprintf(why, cap, "%s", g.why);
	return 1;
}

const struct pc_module pc_mod_disk = {
	.name = "disk",
	.init = disk_init,
	.start = disk_start,
	.stop = disk_stop,
	.exit = disk_exit,
	.fini = disk_fini,
	.degraded = disk_degraded,
	.rpc_methods = disk_rpc_methods, /* modules/disk_remote.c */
};
