/*
 * storage/pool.h — the publish pool: one node-owned host memory region that
 * producers copy KV pages into and remote readers read from (DESIGN.md §4
 * p2p, §5 copies).
 *
 * Owns: nothing here (declarations only); see pool.c for the allocator,
 * eviction policy, threading rules and invariants.
 *
 * Life of an entry:
 *   pool_reserve  -> space for header + payload (+ key) is carved out; the
 *                    caller memcpys the payload into *payload_dst, no lock held
 *   pool_commit   -> header written, entry becomes visible (replacing an older
 *                    entry of the same key), gets a new generation
 *   pool_get / pool_pin_addr -> pins an entry for a local copy or a remote
 *                    read; a pinned entry is never evicted, freed or reused
 *   pool_unpin    -> last unpin of a replaced/deleted entry frees its space
 *
 * Threads: every function may be called from any thread at once, except
 * pool_new, pool_free and pool_set_evict_cb (before the pool is shared /
 * after every user stopped). Locks are per stripe and never held while page
 * bytes are copied or callbacks run.
 *
 * Readers and stale pages: a pinned entry's bytes never change. A one-sided
 * reader that takes no pin (RDMA READ) can race with eviction and reuse: the
 * header magic is cleared before an extent is freed and written last at
 * commit, and generations are unique, so pool_hdr_check rejects a reused
 * page — but a payload torn by reuse *during* the read is caught only by the
 * checksum. With checksums off, only pinned reads are guaranteed.
 *
 * Limits (each a #define below): key <= POOL_KEY_MAX bytes, page payload <=
 * max_page_bytes (default 64 MiB, at most POOL_PAGE_BYTES_MAX), pool size in
 * [POOL_SIZE_MIN, POOL_SIZE_MAX] (a stripe at most 2^31 units = 8 TiB),
 * stripes <= POOL_STRIPES_MAX, evictions per reserve <=
 * POOL_EVICT_MAX_PER_RESERVE one by one plus one contiguous run.
 * Metadata: a 64-byte record per entry and per free extent, plus 6 bytes
 * per 4 KiB of capacity (boundary map and key index, sized at start and
 * never grown); the key itself is stored in the region after the payload.
 */
#ifndef PC_STORAGE_POOL_H
#define PC_STORAGE_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the entry header, as remote readers see it ------------------------ */

#define POOL_HDR_BYTES 64
#define POOL_HDR_MAGIC 0x31504350u /* bytes "PCP1" in memory (little-endian) */
#define POOL_HDR_VERSION 1
#define POOL_HDR_F_CHECKSUM 0x1u /* checksum field holds XXH3-64 of payload */

/*
 * Every entry starts on a 4 KiB boundary of the region with this header; the
 * payload follows it directly, so one read of [hdr, hdr + 64 + len) fetches
 * both. All fields little-endian.
 */
struct pool_hdr {
	uint32_t magic;    /* POOL_HDR_MAGIC; 0 while reserved or after free */
	uint16_t version;  /* POOL_HDR_VERSION */
	uint16_t flags;    /* POOL_HDR_F_*; other bits must be zero */
	uint64_t key_hi;   /* XXH3-128 of the key, high half */
	uint64_t key_lo;   /* ... low half */
	uint64_t gen;      /* unique per publish in this pool (commit order) */
	uint64_t len;      /* payload bytes */
	uint64_t checksum; /* XXH3-64 of the payload, 0 without the flag */
	uint8_t pad[16];   /* zero */
};
_Static_assert(sizeof(struct pool_hdr) == POOL_HDR_BYTES, "pool_hdr is 64 bytes");

/* The key hash used in headers and for striping (XXH3-128, no seed). */
void pool_key_hash(const void *key, size_t keylen, uint64_t *key_hi,
		   uint64_t *key_lo);

/*
 * Validate bytes a reader received for the entry (key, gen, len) it expected:
 * hdr_and_payload holds avail bytes starting at the header. Returns 0, or the
 * first failure:
 *   -ENODATA          avail < 64 + len (short read)
 *   -EPROTO           bad magic (free, reserved or never an entry)
 *   -EPROTONOSUPPORT  unknown version or flag bits
 *   -ENOKEY           another key's page
 *   -ESTALE           same key, another generation (replaced / reused)
 *   -EMSGSIZE         payload length differs
 *   -ENOMSG           verify_checksum but the entry carries no checksum
 *   -EBADMSG          checksum mismatch (torn or corrupted payload)
 * Any failure must be treated as a miss ("never wrong bytes", DESIGN.md §4).
 */
int pool_hdr_check(const void *hdr_and_payload, size_t avail, uint64_t key_hi,
		   uint64_t key_lo, uint64_t gen, uint64_t len,
		   bool verify_checksum);

/*
 * The same when the header and the payload landed in different places (the
 * header in a scratch buffer, the payload straight in the reader's
 * destination). avail = payload bytes at payload. sum, when given, computes
 * the payload's XXH3-64 (e.g. guarded against a client shrinking its shared
 * memory); it returns 0 or -errno, which is passed on.
 */
int pool_hdr_check_split(const void *hdr, const void *payload, size_t avail,
			 uint64_t key_hi, uint64_t key_lo, uint64_t gen,
			 uint64_t len, bool verify_checksum,
			 int (*sum)(const void *p, size_t n, uint64_t *out));

/* ---- the pool ----------------------------------------------------------- */

#define POOL_UNIT_BYTES 4096u                  /* allocation unit and alignment */
#define POOL_KEY_MAX 1024u                     /* key bytes */
#define POOL_PAGE_BYTES_DEFAULT (64ull << 20)  /* max_page_bytes when 0 */
#define POOL_PAGE_BYTES_MAX (1ull << 30)
#define POOL_SIZE_MIN (1ull << 20)
#define POOL_SIZE_MAX (16ull << 40)            /* 16 TiB */
#define POOL_STRIPES_MAX 64u
#define POOL_STRIPES_AUTO_MAX 16u
#define POOL_STRIPE_BYTES_AUTO (256ull << 20)  /* auto: one stripe per 256 MiB */
#define POOL_EVICT_WINDOW 64u                  /* oldest entries considered */
#define POOL_EVICT_MAX_PER_RESERVE 4096u       /* one-by-one evictions per reserve */

/* How space is made when a page does not fit. */
enum pool_evict_policy {
	/* Default: evict the cheapest address-contiguous run around one of the
	 * POOL_EVICT_WINDOW oldest entries (see pool.c). */
	POOL_EVICT_SPAN = 0,
	/* Naive "evict the LRU entry until it fits"; kept for comparison. */
	POOL_EVICT_LRU = 1,
};

struct pool_opts {
	size_t size;            /* region bytes (rounded down to stripes x 4 KiB) */
	size_t max_page_bytes;  /* largest payload; 0 = POOL_PAGE_BYTES_DEFAULT */
	unsigned stripes;       /* 0 = auto: clamp(size / 256 MiB, 1, 16), fewer
				   if a stripe would hold < 4 max-size pages */
	bool try_huge_pages;    /* try MAP_HUGETLB when huge pages are reserved */
	enum pool_evict_policy evict_policy;
};

struct pool;

/* Handle to a reserved entry (from pool_reserve) or a pinned one (from
 * pool_get / pool_pin_addr). Owned by the caller; consumed by exactly one
 * pool_commit / pool_abort (reserved) or pool_unpin (pinned). */
struct pool_ref {
	uint32_t stripe;
	uint32_t idx;
	uint64_t gen; /* entry generation, or a reservation tag (bit 63 set) */
};

struct pool_stats {
	uint64_t capacity;         /* bytes of region under management */
	uint64_t bytes_used;       /* bytes in live, reserved and dead entries */
	uint64_t keys;             /* live (visible) entries */
	uint64_t evictions;        /* entries evicted for space, cumulative */
	uint64_t evicted_bytes;    /* their extent bytes, cumulative */
	uint64_t reserve_failures; /* reserves that failed with -ENOSPC */
	uint64_t pinned;           /* entries with at least one pin now */
	uint64_t span_picks;       /* searches for a run to evict, cumulative */
};

/*
 * Create a pool: maps the region (huge pages when asked and reserved, else
 * anonymous memory advised for transparent huge pages; touched lazily).
 * Returns 0, -EINVAL for bad options, -ENOMEM.
 */
int pool_new(struct pool **out, const struct pool_opts *o);

/* Unmap and free. No other thread may use the pool any more; outstanding
 * refs become invalid. NULL is ignored. */
void pool_free(struct pool *p);

/*
 * Fault the whole region in from a background thread (2 MiB at a time, no
 * byte written), so first writes into the pool do not stall on page faults
 * and the memory is committed early, as RDMA registration would do.
 * Logs when done (or why it stopped). pool_free stops and joins it. Call at
 * most once; 0 or -errno.
 */
int pool_prefault_start(struct pool *p);
/* The same, but the thread waits (polling every 10 ms) until *gate is
 * nonzero — the node uses its ready state, so faulting never competes with
 * start-up for the mmap lock. *gate is read atomically; NULL = at once. */
int pool_prefault_start_after(struct pool *p, const int *gate);
/* Bytes faulted in so far by that thread. */
uint64_t pool_prefaulted(const struct pool *p);

/* The region to register with a transport (which chooses its key). */
void pool_region(const struct pool *p, uint8_t **base, size_t *len);

/* One live entry, as pool_scan() reports it. key is valid only during the
 * callback; addr is the header's address in the region. */
struct pool_entry_info {
	const void *key;
	size_t keylen;
	uint64_t gen;
	uintptr_t addr;
	uint64_t len;
};

/*
 * Walk the live entries a slice at a time (a membership change re-publishes
 * them): examines at most max entry records from *cursor (0 starts a walk)
 * and calls fn for each live one, with that stripe's lock held — fn only
 * copies what it needs, quickly, and calls no pool function. Returns 1 with
 * *cursor advanced while records remain, 0 once the walk is over. Not a
 * snapshot: entries committed, replaced or evicted meanwhile may be seen or
 * missed. Any thread.
 */
int pool_scan(struct pool *p, uint64_t *cursor, unsigned max,
	      void (*fn)(void *arg, const struct pool_entry_info *e),
	      void *arg);

/* Effective limits after pool_new's rounding. */
size_t pool_max_page_bytes(const struct pool *p);
unsigned pool_stripes(const struct pool *p);

/*
 * Called once for every entry evicted to make space (not for delete or
 * replace), on the thread that called pool_reserve, after the pool released
 * its locks: it may call any pool function. key is a copy (NUL-terminated
 * after keylen bytes) valid during the call; gen is the evicted generation,
 * so a directory should delete or mark its record only if the record still
 * names that gen. Set before the pool is shared between threads.
 */
typedef void (*pool_evict_fn)(void *arg, const char *key, size_t keylen,
			      uint64_t gen);
void pool_set_evict_cb(struct pool *p, pool_evict_fn fn, void *arg);

/*
 * Reserve space for a page of len payload bytes under key (1..POOL_KEY_MAX
 * bytes), evicting old entries if needed. On success *payload_dst is where
 * the caller copies exactly len bytes, with no lock held, before
 * pool_commit. The entry is invisible until committed.
 * Returns 0, -EINVAL (key or len out of limits), -ENOSPC (no space could be
 * made: what is left is pinned or reserved), -ENOMEM.
 */
int pool_reserve(struct pool *p, const void *key, size_t keylen, uint64_t len,
		 struct pool_ref *ref, uint8_t **payload_dst);

/*
 * Publish a reserved entry: computes the checksum (if asked; outside the
 * lock), writes the header, makes the entry visible and the key's previous
 * entry dead (freed once unpinned). Returns 0 and the new generation and the
 * header's address (what goes into the directory record).
 */
int pool_commit(struct pool *p, struct pool_ref *ref, bool checksum,
		uint64_t *gen_out, uintptr_t *hdr_addr_out);
/* The same with the payload's checksum computed by the caller (while it
 * copied the payload in, in slices): sum must be pc_page_sum of it. */
int pool_commit_sum(struct pool *p, struct pool_ref *ref, bool checksum,
		    uint64_t sum, uint64_t *gen_out, uintptr_t *hdr_addr_out);

/* Give a reserved entry's space back without publishing it. */
void pool_abort(struct pool *p, struct pool_ref *ref);

/*
 * Look key up and pin its entry: *hdr points at the header (payload at
 * *hdr + POOL_HDR_BYTES), stable until pool_unpin. Counts as a use for LRU:
 * the entry leaves the LRU while pinned and re-enters it as the most
 * recently used when its last pin drops. Returns 0 or -ENOENT.
 */
int pool_get(struct pool *p, const void *key, size_t keylen,
	     struct pool_ref *ref, const uint8_t **hdr, uint64_t *len,
	     uint64_t *gen);

/*
 * Pin the entry a remote read of [hdr_addr, hdr_addr + total_len) targets
 * (TCP data plane): the range must start exactly at a live entry's header
 * and lie within header + payload. Returns 0, -EFAULT (not inside the
 * region), -ENOENT (no live entry starts there), -ERANGE (longer than the
 * entry), -EINVAL (total_len 0).
 */
int pool_pin_addr(struct pool *p, uintptr_t hdr_addr, uint64_t total_len,
		  struct pool_ref *ref);

/* Drop a pin taken by pool_get / pool_pin_addr (any thread). The last unpin
 * of a replaced or deleted entry frees its space. */
void pool_unpin(struct pool *p, struct pool_ref *ref);

/* True when key has a visible entry (no pin, no LRU touch). */
bool pool_contains(struct pool *p, const void *key, size_t keylen);

/* Remove key's visible entry (freed once unpinned); no eviction callback.
 * Returns 0 or -ENOENT. */
int pool_delete(struct pool *p, const void *key, size_t keylen);

/* Counters summed over stripes (each stripe's lock taken briefly). */
void pool_stats(struct pool *p, struct pool_stats *out);

/* Check every metadata invariant (see pool.c), one stripe lock at a time:
 * O(extents), for tests and debugging. Returns 0 or -EUCLEAN (logged). */
int pool_audit(struct pool *p);

#endif /* PC_STORAGE_POOL_H */
