/*
 * modules/read_cache.h — the directory read cache: records a reader learned,
 * kept for a while so that the next read of the key skips the lookup (the
 * original's `directory_read_cache_ttl`).
 *
 * Owns: a bounded map key -> placement record (modules/placement.h), each
 * entry valid for ttl after the lookup that brought it, LRU-evicted beyond
 * max entries; striped locks, so every reactor uses the one cache. kv
 * (modules/kv.c) is its only user: it asks before a lookup, fills it with
 * the resident records lookups return, and forgets an entry whose read
 * failed (then looks the key up again in the same call).
 *
 * Why a cached record is safe: a record may be stale (placement.h's
 * never-wrong rules), and every read is validated against the page's
 * header (key hash, generation, length; and its checksum): a pool entry's
 * header is zeroed when it is freed, so a cached record of a page deleted,
 * evicted or replaced since reads as a failure, never as bytes. What the
 * cache costs then is one more lookup.
 *
 * Threads: any; each call takes one stripe's lock for a few hundred
 * nanoseconds. rc_clear is O(1) (an epoch: older entries are misses).
 */
#ifndef PC_MODULES_READ_CACHE_H
#define PC_MODULES_READ_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "modules/placement.h"

struct read_cache;

struct rc_stats {
	uint64_t entries;
	uint64_t hits;    /* rc_get found a live entry */
	uint64_t misses;  /* rc_get found none, an expired or a cleared one */
	uint64_t evicted; /* live entries dropped for room (LRU) */
};

/* A cache of at most max entries (at least 1), each live for ttl_ns after
 * its rc_put. 0 or -errno. */
int rc_new(struct read_cache **out, uint64_t max, uint64_t ttl_ns);
void rc_free(struct read_cache *c);

/* The live record of key at now (pc_now_ns()) into *out: true. An expired
 * or cleared entry is removed: false. */
bool rc_get(struct read_cache *c, const char *key, size_t klen, uint64_t now,
	    struct dir_rec *out);

/* Keep rec (found, resident) for key from now on, replacing the key's
 * entry. Not kept (silently) when out of memory or klen is 0 or above
 * DIR_KEY_MAX. */
void rc_put(struct read_cache *c, const char *key, size_t klen,
	    const struct dir_rec *rec, uint64_t now);

/* Drop key's entry if it still names generation gen of producer node
 * (node NULL: whatever it names). */
void rc_forget(struct read_cache *c, const char *key, size_t klen,
	       const char *node, uint64_t gen);

/* Every entry made before this call is a miss from now on. */
void rc_clear(struct read_cache *c);

void rc_stats(struct read_cache *c, struct rc_stats *st);

#endif /* PC_MODULES_READ_CACHE_H */
