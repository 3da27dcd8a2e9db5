/*
 * modules/placement.h — placement as a module interface: where pages live.
 *
 * Owns: the interface every placement implements, chosen by the `mode`
 * setting, and the record and key-batch types it speaks in. The kv module
 * (modules/kv.c) moves pages (copies into the pool, reads through the
 * transport, validates) and asks placement where things are; it reaches
 * the implementation as the "placement" service (modules/services.h).
 *
 * Implementations:
 *   p2p      — the directory (modules/directory.c): a producer keeps its
 *              pages in its own pool and publishes records of them on the
 *              key's owners on the ring; a lookup asks those owners.
 *   slotmap  — has no records, so it is not a placement: its module
 *              (modules/slotmap.c) hashes a key to a slot of its owner
 *              and is the "kv" service itself in that mode (kv and this
 *              interface stand aside; docs/slotmap.md).
 *
 * Threading: calls are made on a reactor thread and complete on it, never
 * inside the call. Deadlines: deadline_ns is a pc_now_ns() value after
 * which the call stops waiting and reports what it has; 0 means
 * rpc_timeout from now.
 *
 * Never-wrong rules every implementation keeps: a record names the
 * producer (node, gen) whose page it describes; an unpublish with a
 * producer and generations removes only records that still name them, so
 * a late unpublish never removes a newer page's record; a record may be
 * stale (the page evicted or replaced since), which readers find out by
 * validating the page header — stale records cost a miss, never wrong
 * bytes. The record and key types keep the directory's names (dir_rec,
 * dir_keys): p2p's directory record is the placement record.
 */
#ifndef PC_MODULES_PLACEMENT_H
#define PC_MODULES_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "reactor/reactor.h"

struct ring; /* storage/ring.h */

#define DIR_KEY_MAX 512 /* bytes of a key */
#define DIR_NODE_MAX 160

/*
 * Where a page lives: which node produced it, where to read it (data
 * endpoint, address, rkey), its payload length and generation, and whether
 * it is resident in memory. A non-resident record names a page a lower
 * tier holds (modules/tier.h): reading it takes a promote first.
 */
struct dir_rec {
	bool found;
	bool resident;
	char node[DIR_NODE_MAX]; /* producer's ring id ("host:rpc_port") */
	char data[DIR_NODE_MAX]; /* producer's data endpoint */
	uint64_t addr;           /* page header address in the producer */
	uint32_t rkey;
	uint32_t len;            /* payload bytes */
	uint64_t gen;
	/* A lookup's answer from this node's own replica of the record
	 * (its shard): that may be older than the other owners' when this
	 * node missed a publish (it did not answer in time), so a reader
	 * whose read of it fails asks them (PL_LOOKUP_ELSEWHERE).
	 * Never set on a record from the wire or the read cache. */
	bool own_replica;
};

/* A batch of keys: keys[i] has klens[i] bytes (1..DIR_KEY_MAX). */
struct dir_keys {
	const char *const *keys;
	const size_t *klens;
	unsigned n;
};

typedef void (*pl_done_fn)(void *arg);

/* Lookup flags. */
enum {
	/*
	 * Ask each key's owners in ring order, this node in its turn.
	 * Without it, a node that is one of a key's owners, but not its
	 * first, looks in its own replica first and asks no one when the
	 * record is there (dir_rec.own_replica): with directory_replicas 2
	 * a member of a two-node cluster then looks every key up without a
	 * round trip. Callers that must have the first owner's record (the
	 * disk tier's checks before it publishes over it) pass it.
	 */
	PL_LOOKUP_IN_ORDER = 1,
	/* This node's own replica last: the other owners are asked first (a
	 * second try after a record from here did not read). */
	PL_LOOKUP_ELSEWHERE = 2,
};

struct pl_ops {
	const char *mode; /* the `mode` value it implements: "p2p" */
	/* Look these keys up; recs[i].found tells. done runs once, later.
	 * flags: PL_LOOKUP_*. */
	int (*lookup)(struct rx_reactor *r, const struct dir_keys *k,
		      struct dir_rec *recs, unsigned flags,
		      uint64_t deadline_ns, pl_done_fn done, void *arg);
	/* Publish these pages' records; ok[i] when they are findable. The
	 * keys are copied before this returns; recs and ok must stay valid
	 * until done runs. */
	int (*publish)(struct rx_reactor *r, const struct dir_keys *k,
		       const struct dir_rec *recs, bool *ok,
		       uint64_t deadline_ns, pl_done_fn done, void *arg);
	/* Unpublish: only records of node with gens[i] (node NULL: whatever
	 * is there; gens NULL or gens[i] 0: any generation of node).
	 * existed[i] (may be NULL) tells if one was there. done may be NULL
	 * (fire and forget). */
	int (*unpublish)(struct rx_reactor *r, const struct dir_keys *k,
			 const char *node, const uint64_t *gens, bool *existed,
			 uint64_t deadline_ns, pl_done_fn done, void *arg);
	/*
	 * After a ring change: move this node's records of these pages (recs:
	 * this node's own records) that were placed against any of the rings
	 * from[0..nfrom). Each is published at the owners it gained under the
	 * current ring — and only there: owners that already had it are not
	 * asked — and done runs when that is over; ok[i]: the new owners have
	 * it (true when none was gained). Then, after a grace that lets every
	 * node adopt the new membership, and for the keys whose publish
	 * worked, this node's record with recs[i].gen is removed from the
	 * owners it lost that are still members (a conditional remove: a newer
	 * record stays). keys, recs and ok must stay valid until done runs;
	 * from is read inside the call.
	 */
	int (*move)(struct rx_reactor *r, const struct dir_keys *k,
		    const struct dir_rec *recs, bool *ok,
		    struct ring *const *from, unsigned nfrom,
		    uint64_t deadline_ns, pl_done_fn done, void *arg);
	/* Is the page this record names here, in this node's own memory? */
	bool (*is_here)(const struct dir_rec *rec);
};

#endif /* PC_MODULES_PLACEMENT_H */
