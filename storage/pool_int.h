/*
 * storage/pool_int.h — what pool.c and pool_alloc.c share: the per-stripe
 * metadata and the extent allocator's interface. Not part of the pool API.
 *
 * Owns: nothing (declarations). Threading: every function declared here
 * runs with the stripe's mutex held by its caller.
 */
#ifndef PC_STORAGE_POOL_INT_H
#define PC_STORAGE_POOL_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "storage/pool.h"

#define POOL_UNIT_SHIFT 12
#define POOL_NCLASS 128          /* free-list classes (see pool_space_cls) */
#define POOL_SPAN_REACH 1024     /* neighbour extents looked at on each side */
#define POOL_SPAN_SLOTS (2 * POOL_SPAN_REACH + 1)
#define POOL_SKIPS_MAX (8 * POOL_EVICT_WINDOW) /* times an old entry may be spared */

_Static_assert(POOL_UNIT_BYTES == 1u << POOL_UNIT_SHIFT, "unit shift");
_Static_assert(POOL_PAGE_BYTES_MAX <= UINT32_MAX, "a payload length fits 32 bits");

enum pool_ext_state {
	POOL_EXT_UNUSED = 0, /* record on the free stack */
	POOL_EXT_FREE,       /* free block, on a class list */
	POOL_EXT_RESERVED,   /* entry being filled; invisible */
	POOL_EXT_LIVE,       /* visible entry; on the LRU unless pinned */
	POOL_EXT_DEAD,       /* replaced/deleted while pinned */
};

/* One extent of a stripe: a free block or an entry. Index 0 is "none". */
struct pool_ext {
	uint64_t key_hi, key_lo; /* entry: XXH3-128 of the key */
	uint64_t gen;            /* entry: generation, or reservation tag */
	uint32_t len;            /* entry: payload bytes (<= POOL_PAGE_BYTES_MAX) */
	uint32_t used;           /* LIVE: the stripe's use_seq at its last use */
	uint32_t start, units;   /* extent within the stripe, in units */
	uint32_t prev, next;     /* FREE: class list; LIVE unpinned: LRU (prev =
				    newer); UNUSED: next = record free stack */
	uint32_t hnext;          /* LIVE: key index chain */
	uint32_t pins;           /* readers holding it */
	uint16_t keylen;
	uint8_t state;           /* enum pool_ext_state */
	uint8_t cls;             /* FREE: its class */
	uint16_t skips;          /* LIVE: evictions that spared it for a
				    younger candidate since its last use */
};
_Static_assert(sizeof(struct pool_ext) == 64, "one cache line per record");

/* Scratch for the span search; one per stripe, used under its mutex. */
struct pool_span_scratch {
	uint32_t idx[POOL_SPAN_SLOTS];
	uint32_t units[POOL_SPAN_SLOTS];
	uint32_t cost[POOL_SPAN_SLOTS];
	uint32_t victim[POOL_SPAN_SLOTS];
};

struct pool_stripe {
	pthread_mutex_t mu;
	uint8_t *base;         /* this stripe's first byte in the region */
	uint32_t units;        /* units owned */
	struct pool_ext *ext;  /* units + 1 records (lazily touched mapping) */
	uint32_t *edge;        /* unit -> record, valid at extent ends */
	uint32_t *bucket;      /* key index heads */
	uint32_t bucket_mask;
	uint32_t rec_free;     /* released records, linked by next */
	uint32_t rec_hwm;      /* records ever used: ext[1..rec_hwm] */
	uint32_t lru_head;     /* most recently used evictable entry */
	uint32_t lru_tail;     /* least recently used */
	uint32_t use_seq;      /* counts uses (LRU pushes); wraps */
	uint64_t fl_map[POOL_NCLASS / 64];
	uint32_t fl_head[POOL_NCLASS];
	uint64_t rsv_seq;      /* reservation tags */
	struct pool_span_scratch *scr;
	/* counters, summed by pool_stats */
	uint64_t used_units, keys, evictions, evicted_units, reserve_failures,
		pinned, span_picks;
} __attribute__((aligned(64)));

static inline uint8_t *pool_ext_addr(const struct pool_stripe *s,
				     const struct pool_ext *x)
{
	return s->base + ((size_t)x->start << POOL_UNIT_SHIFT);
}

/* The key is stored after the payload. */
static inline const uint8_t *pool_ext_key(const struct pool_stripe *s,
					  const struct pool_ext *x)
{
	return pool_ext_addr(s, x) + POOL_HDR_BYTES + x->len;
}

/* ---- pool_alloc.c: the extent allocator ---------------------------------- */

/* Map s's record, boundary and scratch arrays and make the whole stripe one
 * free block (s->base and s->units set by the caller). 0 or -ENOMEM. */
int pool_space_init(struct pool_stripe *s);
void pool_space_fini(struct pool_stripe *s);

/* Free-list class of a block of this many units. */
unsigned pool_space_cls(uint32_t units);

/* A free block of at least n units, or 0. */
uint32_t pool_space_find(struct pool_stripe *s, uint32_t n);

/* Take n units from the front of free block f; returns the new extent's
 * record, off every list, whose state the caller sets. */
uint32_t pool_space_carve(struct pool_stripe *s, uint32_t f, uint32_t n);

/* Make extent i free, merged with free neighbours (whose records fold into
 * i and are released); returns i. */
uint32_t pool_space_free(struct pool_stripe *s, uint32_t i);

/*
 * The span search (pool.c's header comment): among the POOL_EVICT_WINDOW
 * oldest LRU entries — or only the oldest one spared POOL_SKIPS_MAX times —
 * the cheapest run of address-contiguous free/evictable extents containing
 * one of them and reaching n units. Fills s->scr->victim with the LIVE
 * records to evict and returns their count, 0 if no run exists. Counts a
 * skip on every candidate older than the chosen one. A run never takes in a
 * neighbour used among the stripe's last keys/2 uses (pool_recent): the
 * candidates are old, their neighbours need not be.
 */
unsigned pool_span_pick(struct pool_stripe *s, uint32_t n);

/* Entry x was used among the last keys/2 uses of its stripe (at most half
 * of its entries; fewer when reads touch the same pages again and again, so
 * under read-heavy traffic a batch just written is protected only until
 * keys/2 further uses). Such an entry is evicted only in its own turn at the
 * LRU's tail, never as a run's neighbour.
 * (After 2^32 further uses an entry may look recent again; it is then only
 * spared as a neighbour, never kept from its own turn.) */
static inline bool pool_recent(const struct pool_stripe *s,
			       const struct pool_ext *x)
{
	return (uint32_t)(s->use_seq - x->used) < s->keys / 2;
}

#endif /* PC_STORAGE_POOL_INT_H */
