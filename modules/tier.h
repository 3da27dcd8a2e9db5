/*
 * modules/tier.h — the hooks where a lower storage tier (disk) attaches
 * below the memory pool.
 *
 * Owns: the tier interface and tier_none, the tier of a node that has none
 * (a node without the disk module). The kv module (modules/kv.c) calls
 * it; the disk tier (modules/disk.c) is its real implementation.
 * Threading: hooks are called on a reactor thread; promote completes on
 * it or on another reactor's thread (the tier may spread its work: the
 * done of promote must not need r's thread), never inside the call.
 *
 * The three places a tier joins the life of a page:
 *   1. Eviction — when the pool evicts a page for space, kv offers it to
 *      the tier (offer). A tier that keeps it re-publishes its record with
 *      resident = false (through placement, modules/placement.h); one that
 *      does not (tier_none: -ENOTSUP) leaves kv to unpublish the record of
 *      that generation, as nodes without a tier always did.
 *   2. Lookup — placement may answer with a non-resident record
 *      (dir_rec.resident false): the page exists, but not in memory.
 *   3. Promote — a get that meets a non-resident record of a page this
 *      node produced asks the tier to bring it back into the pool and
 *      publish it resident again; that get is a miss, the next one finds
 *      the page in memory. tier_none has nothing to bring back (-ENOENT):
 *      a miss, as today. A non-resident record of another node's page
 *      (promote_remote) is asked of its producer, which promotes it and
 *      answers with the fresh resident record; the get waits for that
 *      answer (within its deadline) and reads the page from there.
 *      tier_none cannot ask (-ENOTSUP): a miss.
 *
 * And four more, for a tier that keeps copies of what the pool holds
 * (the disk tier, modules/disk.c):
 *   4. Write-through — committed: kv committed a page to the pool; the
 *      tier may queue it for writing. It never waits and never fails a set.
 *   5. Exists — holds: does the tier hold key's page (an own non-resident
 *      record then counts as a hit, and a promotion starts)?
 *   6. Remove — drop: the key was removed; the tier forgets its copy.
 *   7. Walk — scan: the pages it holds, for the republish walk after a
 *      membership change (their non-resident records move too).
 * A tier is found through the "tier" service (modules/services.h); kv
 * looks it up when it starts and uses tier_none without one.
 *
 * What the hooks see: offer runs from the pool's eviction callback
 * (storage/pool.h pool_set_evict_cb), after the pool released its locks,
 * with the page's key and generation; its bytes are no longer the pool's
 * to give. A tier that keeps evicted bytes needs the pool to hold the
 * extent until the tier copied it — the disk-tier issue adds that to the
 * pool; the hook's shape stays.
 */
#ifndef PC_MODULES_TIER_H
#define PC_MODULES_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "modules/placement.h"
#include "reactor/reactor.h"

/* A page leaving memory. */
struct tier_page {
	const char *key;
	size_t klen;
	uint64_t gen; /* the pool generation that was evicted */
};

struct tier_ops {
	const char *name; /* "none", "disk" */
	/* Keep an evicted page: 0 (the tier owns it now and publishes its
	 * record non-resident), or -errno (not kept: kv unpublishes it). */
	int (*offer)(const struct tier_page *pg);
	/* Bring key's page (rec: its non-resident record) back into memory.
	 * 0 when started (done(arg, res) runs later, on r or on another
	 * reactor the tier chose: it must be thread-safe), or -errno when
	 * not (done does not run): -ENOENT when the tier does not hold it,
	 * -EALREADY when a promotion of key is under way (the page comes
	 * back with that one). */
	int (*promote)(struct rx_reactor *r, const char *key, size_t klen,
		       const struct dir_rec *rec,
		       void (*done)(void *arg, int res), void *arg);
	/* Ask rec->node, the producer of key's non-resident record rec (not
	 * this node), to promote the page. 0 when asked (done(arg, res,
	 * fresh) runs once, later, on r, at the latest soon after
	 * deadline_ns: res 0 with fresh the producer's resident record, or
	 * -errno: a miss), or -errno when not (done does not run). Concurrent
	 * asks for one key on one reactor share one request. */
	int (*promote_remote)(struct rx_reactor *r, const char *key,
			      size_t klen, const struct dir_rec *rec,
			      uint64_t deadline_ns,
			      void (*done)(void *arg, int res,
					   const struct dir_rec *fresh),
			      void *arg);
	/* Write-through: pg (generation pg->gen, len payload bytes) was just
	 * committed to the pool, on this reactor thread. */
	void (*committed)(const struct tier_page *pg, uint64_t len);
	/* Does the tier hold key's page? Any thread, no I/O. */
	bool (*holds)(const char *key, size_t klen);
	/* key was removed from the node: forget the tier's copy. */
	void (*drop)(const char *key, size_t klen);
	/* Walk the pages the tier holds (a membership change moves their
	 * records, modules/republish.c): at most max from *cursor (0 starts a
	 * walk), fn(arg, pg, len) for each, under the tier's lock — fn copies
	 * what it needs and calls nothing. 1 while more remain, 0 at the end.
	 * Not a snapshot. Any thread, no I/O. */
	int (*scan)(uint64_t *cursor, unsigned max,
		    void (*fn)(void *arg, const struct tier_page *pg,
			       uint64_t len),
		    void *arg);
};

/* No lower tier: evicted pages are dropped, non-resident pages miss. */
extern const struct tier_ops tier_none;

#endif /* PC_MODULES_TIER_H */
