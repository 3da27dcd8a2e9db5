/*
 * storage/pool.c — the publish pool (see pool.h).
 *
 * Owns: the region (one mmap per node; the transport picks its key), the
 * stripes with their LRU of evictable entries, key index and counters,
 * and the eviction policy, and the optional thread that faults the region in
 * once the node is ready (pool_prefault_start_after). The extent allocator each stripe uses (records,
 * boundary map, free lists, span search) is pool_alloc.c. No metadata lives
 * inside the region except each entry's header and key, so peers reading
 * the region see nothing of the allocator.
 *
 * Threads: any thread may call any function. A key belongs to stripe
 * key_lo % S; each stripe owns a contiguous 1/S of the region and has its own
 * mutex, held only for metadata work — never while page bytes are copied, a
 * checksum is computed or the eviction callback runs. Generations come from
 * one pool-wide atomic counter, drawn under the stripe lock at commit so the
 * visible order of one key's entries is their generation order.
 *
 * Entry layout: [header 64 B][payload len B][key keylen B], starting on a
 * 4 KiB boundary, rounded up to whole 4 KiB units. The key sits after the
 * payload (in the last unit's slack for real page sizes) so the index needs
 * no per-entry heap allocation; only the pool writes there, and remote peers
 * may only read the region, so the index can trust it.
 *
 * Invariants (per stripe, under its mutex):
 *  - the extents tile the stripe: every unit lies in exactly one record that
 *    is FREE, RESERVED, LIVE or DEAD; no two FREE extents are adjacent;
 *  - edge[first unit] and edge[last unit] of every extent name its record;
 *    other edge slots may be stale, so a lookup by address must also check
 *    the record's start;
 *  - LIVE <=> in the key index; LIVE with pins == 0 <=> on the LRU;
 *    DEAD => pins > 0 (replaced or deleted, freed by the last unpin);
 *  - RESERVED, pinned and DEAD extents are never freed, merged or handed
 *    out, so bytes a reader pinned never change under it;
 *  - freeing an entry zeroes its header magic first, so a stale one-sided
 *    read (RDMA, no pin) of a reused page fails pool_hdr_check.
 *
 * Allocation (pool_alloc.c): TLSF-like segregated fit in 4 KiB units —
 * exact lists up to 16 units, then 4 lists per power of two; bitmaps find the
 * next non-empty list; freed extents coalesce with free neighbours through
 * the boundary map. Placement never moves an entry: remote readers hold
 * addresses, so there is no compaction, only choosing well what to evict.
 *
 * Eviction (POOL_EVICT_SPAN) and why over-eviction stays bounded: when n
 * units do not fit, for each of the POOL_EVICT_WINDOW (64) oldest evictable
 * entries we look at the address-contiguous run of free and evictable
 * extents around it and find the cheapest sub-run containing it whose size
 * is >= n, cheapest = fewest LIVE bytes to evict (free neighbours cost
 * nothing); ties go to the older candidate. That run is evicted and merges
 * into one free extent the page fits in. The run is minimal — dropping
 * either end would fall short of n — so the bytes freed beyond n are less
 * than one entry at the run's edge: at most one max-size page per reserve,
 * however the sizes mix. "Evict the LRU entry until something fits" has no
 * such bound: its victims need not be adjacent, so with 256 KiB and 4 MiB
 * pages it evicts many scattered small pages to open one 4 MiB hole — what
 * the original's exact-size lists did (reference §6 item 12). The surplus of
 * a run is not lost either: it stays a free extent later pages fill without
 * evicting. With a single page size the cheapest run is the oldest entry
 * alone, so single-size pools are exact LRU.
 *
 * LRU deviation is bounded too: victims are among the 64 oldest entries,
 * plus the neighbours a run needs. Each time a younger candidate is chosen,
 * every older one in the window counts a skip (reset by any use); the
 * oldest entry with POOL_SKIPS_MAX (512) skips becomes the only candidate,
 * so a large old page cannot be kept forever by a stream of cheaper small
 * ones. Only candidates are chosen by age; a run's other entries are its
 * candidate's address neighbours, so a run never takes in an entry used
 * among the stripe's last keys/2 uses (pool_recent): without that rule, an
 * old small page spared until it was forced took the large page next to it,
 * which could be the one the same batch had just written. 512 was measured against 64..1024: smaller limits force more
 * mismatched evictions in steady mixes (64: 4% of evicted bytes beyond the
 * page at 10% 4 MiB pages; 512: 0.00%) while old pages still drain within a
 * few hundred evictions. When pinned or reserved extents block every run,
 * the oldest entry is evicted and the search retried, after 1, 8, 64 and
 * 512 such evictions (a search costs up to ~0.3 ms): a reserve evicts at
 * most POOL_EVICT_MAX_PER_RESERVE entries that way plus one run, then fails
 * with -ENOSPC. Lock hold time is bounded by 64 candidates x
 * POOL_SPAN_REACH extents per side, and is a few microseconds when sizes
 * repeat (the run is one or two extents).
 */
#include "storage/pool.h"

#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/blocks.h"
#include "common/checksum.h"
#include "common/log.h"
#include "common/util.h"
#include "storage/pool_int.h"

#define STRIPE_UNITS_MAX (1u << 31)
#define RSV_TAG (1ull << 63) /* reservation tags never collide with gens */
#define THP_BYTES (2ull << 20)

struct pool {
	uint8_t *base;            /* region start (2 MiB aligned) */
	size_t capacity;          /* nstripes * stripe_bytes: what is managed */
	size_t stripe_bytes;      /* each stripe's contiguous share */
	void *map;                /* the mapping to munmap ... */
	size_t map_len;           /* ... and its length */
	unsigned nstripes;
	size_t max_page_bytes;    /* largest payload pool_reserve accepts */
	enum pool_evict_policy policy;
	pool_evict_fn evict_cb;   /* set before sharing; read without a lock */
	void *evict_arg;
	struct pool_stripe *stripe;
	/* The background thread faulting the region in (pool_prefault_start). */
	pthread_t pf_thread;
	bool pf_started;
	_Atomic bool pf_stop;
	_Atomic uint64_t pf_done;
	const int *pf_gate;       /* start once *pf_gate != 0 (NULL: at once) */
	/* Written by every commit: its own cache line, so commits on one
	 * reactor do not slow lookups of the fields above on another. */
	_Alignas(64) _Atomic uint64_t gen_next;
};

/* ---- header -------------------------------------------------------------- */

void pool_key_hash(const void *key, size_t keylen, uint64_t *key_hi,
		   uint64_t *key_lo)
{
	XXH128_hash_t h = XXH3_128bits(key, keylen);
	*key_hi = h.high64;
	*key_lo = h.low64;
}

int pool_hdr_check(const void *hdr_and_payload, size_t avail, uint64_t key_hi,
		   uint64_t key_lo, uint64_t gen, uint64_t len,
		   bool verify_checksum)
{
	if (avail < POOL_HDR_BYTES)
		return -ENODATA;
	return pool_hdr_check_split(hdr_and_payload,
				    (const uint8_t *)hdr_and_payload +
					    POOL_HDR_BYTES,
				    avail - POOL_HDR_BYTES, key_hi, key_lo, gen,
				    len, verify_checksum, NULL);
}

int pool_hdr_check_split(const void *hdr, const void *payload, size_t avail,
			 uint64_t key_hi, uint64_t key_lo, uint64_t gen,
			 uint64_t len, bool verify_checksum,
			 int (*sum)(const void *p, size_t n, uint64_t *out))
{
	struct pool_hdr h;
	memcpy(&h, hdr, sizeof(h));
	if (le32toh(h.magic) != POOL_HDR_MAGIC)
		return -EPROTO;
	uint16_t flags = le16toh(h.flags);
	if (le16toh(h.version) != POOL_HDR_VERSION ||
	    (flags & ~POOL_HDR_F_CHECKSUM))
		return -EPROTONOSUPPORT;
	if (le64toh(h.key_hi) != key_hi || le64toh(h.key_lo) != key_lo)
		return -ENOKEY;
	if (le64toh(h.gen) != gen)
		return -ESTALE;
	if (le64toh(h.len) != len)
		return -EMSGSIZE;
	if (avail < len)
		return -ENODATA;
	if (!verify_checksum)
		return 0;
	/* Required when asked: a torn read is only detectable by the sum. */
	if (!(flags & POOL_HDR_F_CHECKSUM))
		return -ENOMSG;
	uint64_t got;
	if (sum) {
		int ret = sum(payload, (size_t)len, &got);
		if (ret < 0)
			return ret;
	} else {
		got = pc_page_sum(payload, (size_t)len);
	}
	if (got != le64toh(h.checksum))
		return -EBADMSG;
	return 0;
}

/* ---- helpers ------------------------------------------------------------- */

static uint32_t units_for(uint64_t len, size_t keylen)
{
	uint64_t bytes = POOL_HDR_BYTES + len + keylen;
	return (uint32_t)((bytes + POOL_UNIT_BYTES - 1) >> POOL_UNIT_SHIFT);
}

/* ---- LRU and key index ------------------------------------------------- */

static void lru_push_head(struct pool_stripe *s, uint32_t i)
{
	struct pool_ext *x = &s->ext[i];
	x->skips = 0; /* a use restarts its aging */
	x->used = ++s->use_seq;
	x->prev = 0;
	x->next = s->lru_head;
	if (s->lru_head)
		s->ext[s->lru_head].prev = i;
	else
		s->lru_tail = i;
	s->lru_head = i;
}

static void lru_remove(struct pool_stripe *s, uint32_t i)
{
	struct pool_ext *x = &s->ext[i];
	if (x->prev)
		s->ext[x->prev].next = x->next;
	else
		s->lru_head = x->next;
	if (x->next)
		s->ext[x->next].prev = x->prev;
	else
		s->lru_tail = x->prev;
	x->prev = x->next = 0;
}

static uint32_t idx_find(const struct pool_stripe *s, uint64_t key_hi,
			 uint64_t key_lo, const void *key, size_t keylen)
{
	for (uint32_t i = s->bucket[key_hi & s->bucket_mask]; i;
	     i = s->ext[i].hnext) {
		const struct pool_ext *x = &s->ext[i];
		/* The 128-bit hash decides in practice; the bytes make it exact. */
		if (x->key_hi == key_hi && x->key_lo == key_lo &&
		    x->keylen == keylen && memcmp(pool_ext_key(s, x), key, keylen) == 0)
			return i;
	}
	return 0;
}

static void idx_insert(struct pool_stripe *s, uint32_t i)
{
	uint32_t *head = &s->bucket[s->ext[i].key_hi & s->bucket_mask];
	s->ext[i].hnext = *head;
	*head = i;
}

static void idx_remove(struct pool_stripe *s, uint32_t i)
{
	uint32_t *link = &s->bucket[s->ext[i].key_hi & s->bucket_mask];
	while (*link != i) {
		PC_ASSERT(*link != 0);
		link = &s->ext[*link].hnext;
	}
	*link = s->ext[i].hnext;
	s->ext[i].hnext = 0;
}

/* ---- entry state changes ------------------------------------------------- */

/* Give an entry's extent back (RESERVED, or LIVE/DEAD with no pins). */
static uint32_t entry_release(struct pool_stripe *s, uint32_t i)
{
	struct pool_ext *x = &s->ext[i];
	PC_ASSERT(x->pins == 0 && x->state != POOL_EXT_FREE);
	/* A one-sided reader racing with reuse must see "no entry here". */
	__atomic_store_n((uint32_t *)(void *)pool_ext_addr(s, x), 0u, __ATOMIC_RELEASE);
	s->used_units -= x->units;
	return pool_space_free(s, i);
}

/* Unlink a LIVE entry from the index; free it or leave it DEAD for the last
 * unpin. */
static void entry_retire(struct pool_stripe *s, uint32_t i)
{
	struct pool_ext *x = &s->ext[i];
	idx_remove(s, i);
	s->keys--;
	if (x->pins) {
		x->state = POOL_EXT_DEAD;
		return;
	}
	lru_remove(s, i);
	entry_release(s, i);
}

static void entry_pin(struct pool_stripe *s, uint32_t i)
{
	struct pool_ext *x = &s->ext[i];
	PC_ASSERT(x->pins < UINT32_MAX);
	if (x->pins++ == 0) {
		/* Pinned entries leave the LRU so eviction never walks past them. */
		lru_remove(s, i);
		s->pinned++;
	}
}

/* ---- eviction ------------------------------------------------------------ */

/* Keys and generations of evicted entries, copied under the lock because
 * their bytes may be reused as soon as it drops; the callbacks run after. */
struct evict_note {
	uint64_t gen;
	size_t off;
	size_t keylen;
};

struct evict_batch {
	bool on;              /* a callback is set: record */
	struct evict_note *note;
	unsigned n, cap;
	char *keys;
	size_t keys_len, keys_cap;
	struct evict_note note_stack[16];
	char key_stack[2048];
};

static void eb_init(struct evict_batch *eb, bool on)
{
	eb->on = on;
	eb->note = eb->note_stack;
	eb->n = 0;
	eb->cap = PC_ARRAY_LEN(eb->note_stack);
	eb->keys = eb->key_stack;
	eb->keys_len = 0;
	eb->keys_cap = sizeof(eb->key_stack);
}

static void eb_fini(struct evict_batch *eb)
{
	if (eb->note != eb->note_stack)
		free(eb->note);
	if (eb->keys != eb->key_stack)
		free(eb->keys);
}

/* Room for one more note of keylen bytes; called before evicting, so an
 * allocation failure never loses a callback. Growth is rare: the stack part
 * covers the usual one or two victims. */
static int eb_room(struct evict_batch *eb, size_t keylen)
{
	if (!eb->on)
		return 0;
	if (eb->n == eb->cap) {
		unsigned cap = eb->cap * 2;
		struct evict_note *nn = malloc(cap * sizeof(*nn));
		if (!nn)
			return -ENOMEM;
		memcpy(nn, eb->note, eb->n * sizeof(*nn));
		if (eb->note != eb->note_stack)
			free(eb->note);
		eb->note = nn;
		eb->cap = cap;
	}
	if (eb->keys_cap - eb->keys_len < keylen + 1) {
		size_t cap = eb->keys_cap * 2;
		while (cap - eb->keys_len < keylen + 1)
			cap *= 2;
		char *nk = malloc(cap);
		if (!nk)
			return -ENOMEM;
		memcpy(nk, eb->keys, eb->keys_len);
		if (eb->keys != eb->key_stack)
			free(eb->keys);
		eb->keys = nk;
		eb->keys_cap = cap;
	}
	return 0;
}

/* Evict LIVE unpinned entry i; returns the merged free block or -errno. */
static int64_t evict_entry(struct pool_stripe *s, uint32_t i,
			   struct evict_batch *eb)
{
	struct pool_ext *x = &s->ext[i];
	PC_ASSERT(x->state == POOL_EXT_LIVE && x->pins == 0);
	int rc = eb_room(eb, x->keylen);
	if (rc)
		return rc;
	if (eb->on) {
		struct evict_note *nt = &eb->note[eb->n++];
		nt->gen = x->gen;
		nt->off = eb->keys_len;
		nt->keylen = x->keylen;
		memcpy(eb->keys + eb->keys_len, pool_ext_key(s, x), x->keylen);
		eb->keys[eb->keys_len + x->keylen] = '\0';
		eb->keys_len += (size_t)x->keylen + 1;
	}
	s->evictions++;
	s->evicted_units += x->units;
	idx_remove(s, i);
	s->keys--;
	lru_remove(s, i);
	return entry_release(s, i);
}

/*
 * Find or make n free units in stripe s (lock held). Victims' keys go to eb.
 * Returns the carved extent's record (> 0) or -ENOSPC / -ENOMEM.
 */
static int64_t stripe_alloc(struct pool *p, struct pool_stripe *s, uint32_t n,
			    struct evict_batch *eb)
{
	unsigned evicted = 0, next_pick = 0;
	for (;;) {
		uint32_t f = pool_space_find(s, n);
		if (f)
			return pool_space_carve(s, f, n);
		if (!s->lru_tail || evicted >= POOL_EVICT_MAX_PER_RESERVE)
			return -ENOSPC;
		/* A run is looked for first, then again after 1, 8, 64 and
		 * 512 one-by-one evictions: a pick costs up to ~0.3 ms (64
		 * candidates x POOL_SPAN_REACH neighbours each way) — a page
		 * of 6,144 units in a stripe of 1-unit pages, looking after
		 * each of its 4,096 evictions, held the lock 1.3 s — while
		 * an eviction that moved the window past a blocked run (a
		 * pinned or reserved neighbour) is retried at once. */
		if (p->policy == POOL_EVICT_SPAN && evicted == next_pick) {
			next_pick = next_pick ? next_pick * 8 : 1;
			s->span_picks++;
			unsigned nv = pool_span_pick(s, n);
			int64_t m = 0;
			for (unsigned k = 0; k < nv; k++) {
				m = evict_entry(s, s->scr->victim[k], eb);
				if (m < 0)
					return m;
			}
			if (nv) {
				/* The last victim merged the whole run. */
				PC_ASSERT(s->ext[m].units >= n);
				return pool_space_carve(s, (uint32_t)m, n);
			}
		}
		int64_t m = evict_entry(s, s->lru_tail, eb);
		if (m < 0)
			return m;
		evicted++;
	}
}

/* ---- region -------------------------------------------------------------- */

static uint64_t read_u64(const char *path)
{
	unsigned long long v = 0;
	FILE *f = fopen(path, "re");
	if (!f)
		return 0;
	if (fscanf(f, "%llu", &v) != 1)
		v = 0;
	fclose(f);
	return v;
}

static uint64_t meminfo_value(const char *field)
{
	char line[256];
	unsigned long long v = 0;
	size_t fl = strlen(field);
	FILE *f = fopen("/proc/meminfo", "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, field, fl) == 0 && line[fl] == ':') {
			if (sscanf(line + fl + 1, "%llu", &v) != 1)
				v = 0;
			break;
		}
	}
	fclose(f);
	return v;
}

/* Map len bytes: reserved huge pages if asked and enough are free, else
 * anonymous memory advised for THP. Nothing is touched here. */
static int region_map(struct pool *p, size_t len, bool try_huge, char *kind,
		      size_t kind_len)
{
	if (try_huge && read_u64("/proc/sys/vm/nr_hugepages") > 0) {
		uint64_t hps = meminfo_value("Hugepagesize") * 1024;
		uint64_t free_pages = meminfo_value("HugePages_Free");
		if (hps && len <= free_pages * hps) {
			size_t ml = (len + hps - 1) / hps * hps;
			/* No MAP_NORESERVE: the kernel reserves the huge pages
			 * now, so a fault later cannot SIGBUS. */
			void *m = mmap(NULL, ml, PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB,
				       -1, 0);
			if (m != MAP_FAILED) {
				p->map = m;
				p->map_len = ml;
				p->base = m;
				snprintf(kind, kind_len, "hugetlb %llu KiB pages",
					 (unsigned long long)(hps >> 10));
				goto mapped;
			}
			PC_LOGW("pool", "MAP_HUGETLB failed (%s); using anonymous memory",
				strerror(errno));
		}
	}
	/* Over-map by 2 MiB so the region starts on a THP boundary. */
	size_t ml = len + THP_BYTES;
	void *m = mmap(NULL, ml, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED)
		return -ENOMEM;
	uintptr_t a = ((uintptr_t)m + THP_BYTES - 1) & ~(uintptr_t)(THP_BYTES - 1);
	size_t head = a - (uintptr_t)m;
	if (head)
		munmap(m, head);
	size_t tail = ml - head - len;
	if (tail)
		munmap((uint8_t *)a + len, tail);
	p->map = (void *)a;
	p->map_len = len;
	p->base = (uint8_t *)a;
	if (madvise(p->base, len, MADV_HUGEPAGE) == 0)
		snprintf(kind, kind_len, "anonymous, transparent huge pages advised");
	else
		snprintf(kind, kind_len, "anonymous, 4 KiB pages (THP advice: %s)",
			 strerror(errno));
mapped:
	/* KV bytes have no place in a core dump of a many-GiB process. */
	(void)madvise(p->map, p->map_len, MADV_DONTDUMP);
	return 0;
}

/* ---- lifecycle ----------------------------------------------------------- */

static int stripe_init(struct pool_stripe *s, uint8_t *base, uint32_t units)
{
	memset(s, 0, sizeof(*s));
	int rc = pthread_mutex_init(&s->mu, NULL);
	if (rc)
		return -rc;
	s->base = base;
	s->units = units;
	/* Sized once for the worst case of one entry per 2 units (chains stay
	 * short even then); never grown, so no rehash under the lock. */
	uint64_t nb = pc_roundup_pow2(PC_MAX(units / 2, 64u));
	s->bucket = calloc(nb, sizeof(*s->bucket));
	if (!s->bucket)
		return -ENOMEM;
	s->bucket_mask = (uint32_t)(nb - 1);
	return pool_space_init(s);
}

static void stripe_fini(struct pool_stripe *s)
{
	if (!s->base)
		return;
	pool_space_fini(s);
	free(s->bucket);
	pthread_mutex_destroy(&s->mu);
}

int pool_new(struct pool **out, const struct pool_opts *o)
{
	*out = NULL;
	if (!o || o->size < POOL_SIZE_MIN || o->size > POOL_SIZE_MAX ||
	    o->stripes > POOL_STRIPES_MAX ||
	    o->max_page_bytes > POOL_PAGE_BYTES_MAX ||
	    (o->evict_policy != POOL_EVICT_SPAN && o->evict_policy != POOL_EVICT_LRU))
		return -EINVAL;
	size_t max_page = o->max_page_bytes ? o->max_page_bytes
					    : (size_t)POOL_PAGE_BYTES_DEFAULT;
	uint64_t total_units = o->size >> POOL_UNIT_SHIFT;
	uint64_t entry_max = units_for(max_page, POOL_KEY_MAX);
	unsigned ns = o->stripes;
	if (!ns) {
		ns = (unsigned)PC_MAX(1, PC_MIN(o->size / POOL_STRIPE_BYTES_AUTO,
						POOL_STRIPES_AUTO_MAX));
		/* A key may land in any stripe, so each must hold a handful of
		 * the largest pages or those evict their whole stripe. */
		while (ns > 1 && total_units / ns < 4 * entry_max)
			ns--;
	}
	uint64_t su = total_units / ns;
	if (su > STRIPE_UNITS_MAX)
		return -EINVAL;
	if (su < entry_max) {
		if (o->max_page_bytes)
			return -EINVAL;
		/* Default limit on a small pool: the largest page that fits. */
		max_page = (size_t)((su << POOL_UNIT_SHIFT) - POOL_HDR_BYTES - POOL_KEY_MAX);
	}

	struct pool *p = aligned_alloc(64, sizeof(*p)); /* gen_next's line */
	if (!p)
		return -ENOMEM;
	memset(p, 0, sizeof(*p));
	p->nstripes = ns;
	p->stripe_bytes = (size_t)su << POOL_UNIT_SHIFT;
	p->capacity = p->stripe_bytes * ns;
	p->max_page_bytes = max_page;
	p->policy = o->evict_policy;
	atomic_init(&p->gen_next, 1);
	char kind[96];
	int rc = region_map(p, p->capacity, o->try_huge_pages, kind, sizeof(kind));
	if (rc) {
		free(p);
		return rc;
	}
	p->stripe = aligned_alloc(64, ns * sizeof(*p->stripe));
	if (!p->stripe) {
		pool_free(p);
		return -ENOMEM;
	}
	memset(p->stripe, 0, ns * sizeof(*p->stripe));
	for (unsigned i = 0; i < ns; i++) {
		rc = stripe_init(&p->stripe[i], p->base + i * p->stripe_bytes,
				 (uint32_t)su);
		if (rc) {
			pool_free(p);
			return rc;
		}
	}
	PC_LOGI("pool", "region %zu MiB (%s, touched lazily): %u stripe(s), "
		"max page %zu KiB, eviction %s", p->capacity >> 20, kind, ns,
		max_page >> 10, p->policy == POOL_EVICT_SPAN ? "span" : "lru");
	*out = p;
	return 0;
}

void pool_free(struct pool *p)
{
	if (!p)
		return;
	if (p->pf_started) {
		atomic_store(&p->pf_stop, true);
		pthread_join(p->pf_thread, NULL);
	}
	if (p->stripe) {
		for (unsigned i = 0; i < p->nstripes; i++)
			stripe_fini(&p->stripe[i]);
		free(p->stripe);
	}
	if (p->map)
		munmap(p->map, p->map_len);
	free(p);
}

/* ---- prefault ------------------------------------------------------------ */

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif
/* Small enough that the mmap lock, which each madvise holds for its chunk,
 * is never held for long (a reactor's mmap or io_uring setup waits for it). */
#define PREFAULT_CHUNK (2u << 20)
#define PREFAULT_GATE_POLL_US 10000
/* After each chunk the thread rests as long as the chunk took (at most this
 * long): the mmap lock is free half the time, and the reactors keep one
 * core's worth of memory bandwidth and CPU (see prefault_main). */
#define PREFAULT_REST_MAX_US 20000

/* Fault in [off, off + n) and rest; 0 or an errno. */
static int prefault_chunk(struct pool *p, size_t off, size_t n)
{
	uint64_t t0 = pc_now_ns();
	if (madvise(p->base + off, n, MADV_POPULATE_WRITE) < 0)
		return errno;
	pc_pages_touch(p->base + off, n); /* a hypervisor's own faults too */
	atomic_fetch_add(&p->pf_done, n);
	uint64_t us = (pc_now_ns() - t0) / 1000;
	usleep((useconds_t)PC_MIN(us, (uint64_t)PREFAULT_REST_MAX_US));
	return 0;
}

/*
 * Faults the region in, chunk by chunk, without writing a byte: the kernel
 * allocates (and zeroes) each page as a write fault would. The reactors may
 * be writing entries at the same time; a page they touched first is simply
 * skipped.
 *
 * Order: chunk k of every stripe before chunk k+1 of any. Each stripe hands
 * out its lowest free units first (pool_space_carve splits a free block at
 * its start), so right after start-up the pages being written are at the
 * stripes' starts: faulting those first keeps a reactor from faulting in
 * (and zeroing) fresh 2 MiB pages itself in the middle of a copy slice,
 * which on the shared 2-core machine made slices run 1-5 ms of CPU. The
 * rest after each chunk (as long as the chunk took) is measured in
 * docs/architecture.md: back to back, the thread held the mmap lock nearly
 * all the time, so a reactor's mmap of a client region waited for it, for
 * tens of ms when the thread was preempted holding it.
 */
static void *prefault_main(void *arg)
{
	struct pool *p = arg;
	while (p->pf_gate && !__atomic_load_n(p->pf_gate, __ATOMIC_ACQUIRE) &&
	       !atomic_load(&p->pf_stop))
		usleep(PREFAULT_GATE_POLL_US);
	uint64_t t0 = pc_now_ns();
	int err = 0;
	for (size_t k = 0; k < p->stripe_bytes && !err; k += PREFAULT_CHUNK) {
		size_t n = PC_MIN((size_t)PREFAULT_CHUNK, p->stripe_bytes - k);
		for (unsigned i = 0; i < p->nstripes && !err; i++) {
			if (atomic_load(&p->pf_stop))
				goto out;
			err = prefault_chunk(p, i * p->stripe_bytes + k, n);
		}
	}
out:;
	size_t off = atomic_load(&p->pf_done);
	double s = (double)(pc_now_ns() - t0) / 1e9;
	if (err == EINVAL)
		PC_LOGW("pool", "prefault: not supported by this kernel (needs "
			"Linux 5.14); pages are faulted in on first use");
	else if (err)
		PC_LOGW("pool", "prefault stopped after %zu MiB: %s; the rest "
			"is faulted in on first use", off >> 20, strerror(err));
	else if (off < p->capacity)
		PC_LOGD("pool", "prefault stopped at shutdown after %zu MiB",
			off >> 20);
	else
		PC_LOGI("pool", "region faulted in: %zu MiB in %.1f s", off >> 20,
			s);
	return NULL;
}

int pool_prefault_start(struct pool *p)
{
	return pool_prefault_start_after(p, NULL);
}

int pool_prefault_start_after(struct pool *p, const int *gate)
{
	if (p->pf_started)
		return -EALREADY;
	p->pf_gate = gate;
	int rc = pthread_create(&p->pf_thread, NULL, prefault_main, p);
	if (rc)
		return -rc;
	p->pf_started = true;
	return 0;
}

uint64_t pool_prefaulted(const struct pool *p)
{
	return atomic_load(&((struct pool *)p)->pf_done);
}

void pool_region(const struct pool *p, uint8_t **base, size_t *len)
{
	*base = p->base;
	*len = p->capacity;
}

/* The cursor: stripe in the high 32 bits, next record index in the low. */
int pool_scan(struct pool *p, uint64_t *cursor, unsigned max,
	      void (*fn)(void *arg, const struct pool_entry_info *e),
	      void *arg)
{
	unsigned si = (unsigned)(*cursor >> 32);
	uint32_t ri = (uint32_t)*cursor;
	unsigned seen = 0;
	if (ri == 0)
		ri = 1; /* record 0 is "none" */
	while (si < p->nstripes && seen < max) {
		struct pool_stripe *s = &p->stripe[si];
		pthread_mutex_lock(&s->mu);
		for (; ri <= s->rec_hwm && seen < max; ri++, seen++) {
			const struct pool_ext *x = &s->ext[ri];
			if (x->state != POOL_EXT_LIVE)
				continue;
			struct pool_entry_info e = {
				.key = pool_ext_key(s, x),
				.keylen = x->keylen,
				.gen = x->gen,
				.addr = (uintptr_t)pool_ext_addr(s, x),
				.len = x->len,
			};
			fn(arg, &e);
		}
		bool stripe_done = ri > s->rec_hwm;
		pthread_mutex_unlock(&s->mu);
		if (!stripe_done)
			break;
		si++;
		ri = 1;
	}
	*cursor = ((uint64_t)si << 32) | ri;
	return si < p->nstripes;
}

size_t pool_max_page_bytes(const struct pool *p)
{
	return p->max_page_bytes;
}

unsigned pool_stripes(const struct pool *p)
{
	return p->nstripes;
}

void pool_set_evict_cb(struct pool *p, pool_evict_fn fn, void *arg)
{
	p->evict_cb = fn;
	p->evict_arg = arg;
}

/* ---- entries ------------------------------------------------------------- */

static struct pool_stripe *stripe_of(struct pool *p, uint64_t key_lo)
{
	return &p->stripe[key_lo % p->nstripes];
}

/* Does a live entry's header in the region say what its record says: its
 * key (stored after the payload, re-hashed), generation and length? For
 * debug assertions (lock held). */
static PC_UNUSED bool hdr_matches(const struct pool_stripe *s,
				  const struct pool_ext *x)
{
	const uint8_t *h = pool_ext_addr(s, x);
	uint64_t hi, lo;
	pool_key_hash(h + POOL_HDR_BYTES + x->len, x->keylen, &hi, &lo);
	return hi == x->key_hi && lo == x->key_lo &&
	       pool_hdr_check(h, POOL_HDR_BYTES + x->len, hi, lo, x->gen, x->len,
			      false) == 0;
}

/* The record a ref names, checked (lock held): a stale or forged ref is a
 * caller bug that would corrupt pin counts, so it stops the process. */
static struct pool_ext *ref_rec(struct pool *p, const struct pool_ref *ref,
				struct pool_stripe **sp)
{
	PC_ASSERT(ref->stripe < p->nstripes);
	struct pool_stripe *s = &p->stripe[ref->stripe];
	PC_ASSERT(ref->idx >= 1 && ref->idx <= s->rec_hwm);
	*sp = s;
	return &s->ext[ref->idx];
}

int pool_reserve(struct pool *p, const void *key, size_t keylen, uint64_t len,
		 struct pool_ref *ref, uint8_t **payload_dst)
{
	if (keylen == 0 || keylen > POOL_KEY_MAX || len > p->max_page_bytes)
		return -EINVAL;
	uint64_t kh, kl;
	pool_key_hash(key, keylen, &kh, &kl);
	struct pool_stripe *s = stripe_of(p, kl);
	uint32_t n = units_for(len, keylen);
	struct evict_batch eb;
	eb_init(&eb, p->evict_cb != NULL);

	pthread_mutex_lock(&s->mu);
	int64_t a = stripe_alloc(p, s, n, &eb);
	uint64_t tag = 0;
	if (a > 0) {
		struct pool_ext *x = &s->ext[a];
		PC_ASSERT(x->units >= n && x->pins == 0);
		x->state = POOL_EXT_RESERVED;
		x->key_hi = kh;
		x->key_lo = kl;
		PC_ASSERT(len <= POOL_PAGE_BYTES_MAX);
		x->len = (uint32_t)len;
		x->keylen = (uint16_t)keylen;
		x->pins = 0;
		x->gen = tag = RSV_TAG | ++s->rsv_seq;
		s->used_units += n;
	} else if (a == -ENOSPC) {
		s->reserve_failures++;
	}
	pthread_mutex_unlock(&s->mu);

	for (unsigned k = 0; k < eb.n; k++)
		p->evict_cb(p->evict_arg, eb.keys + eb.note[k].off,
			    eb.note[k].keylen, eb.note[k].gen);
	eb_fini(&eb);
	if (a < 0) {
		PC_LOG_RL(PC_LOG_WARN, "pool", "reserve of %llu bytes failed: %s",
			  (unsigned long long)len, strerror((int)-a));
		return (int)a;
	}
	/* The record is ours until commit: nobody reads these bytes before. */
	uint8_t *h = s->base + ((size_t)s->ext[a].start << POOL_UNIT_SHIFT);
	memset(h, 0, POOL_HDR_BYTES);
	memcpy(h + POOL_HDR_BYTES + len, key, keylen);
	ref->stripe = (uint32_t)(s - p->stripe);
	ref->idx = (uint32_t)a;
	ref->gen = tag;
	*payload_dst = h + POOL_HDR_BYTES;
	return 0;
}

int pool_commit(struct pool *p, struct pool_ref *ref, bool checksum,
		uint64_t *gen_out, uintptr_t *hdr_addr_out)
{
	PC_ASSERT(ref->stripe < p->nstripes);
	struct pool_stripe *s = &p->stripe[ref->stripe];
	PC_ASSERT(ref->idx >= 1 && ref->idx <= s->units);
	/* A RESERVED record is only changed by its owner, so it can be read
	 * without the lock; the checksum pass stays outside the lock. */
	struct pool_ext *x = &s->ext[ref->idx];
	uint8_t *h = pool_ext_addr(s, x);
	uint64_t sum = checksum ? pc_page_sum(h + POOL_HDR_BYTES, (size_t)x->len) : 0;
	return pool_commit_sum(p, ref, checksum, sum, gen_out, hdr_addr_out);
}

int pool_commit_sum(struct pool *p, struct pool_ref *ref, bool checksum,
		    uint64_t sum, uint64_t *gen_out, uintptr_t *hdr_addr_out)
{
	PC_ASSERT(ref->stripe < p->nstripes);
	struct pool_stripe *s = &p->stripe[ref->stripe];
	PC_ASSERT(ref->idx >= 1 && ref->idx <= s->units);
	struct pool_ext *x = &s->ext[ref->idx];
	uint8_t *h = pool_ext_addr(s, x);
	PC_DASSERT(!checksum ||
		   sum == pc_page_sum(h + POOL_HDR_BYTES, (size_t)x->len));

	pthread_mutex_lock(&s->mu);
	x = ref_rec(p, ref, &s);
	PC_ASSERT(x->state == POOL_EXT_RESERVED && x->gen == ref->gen);
	uint64_t gen = atomic_fetch_add_explicit(&p->gen_next, 1, memory_order_relaxed);
	struct pool_hdr hd = {
		.magic = 0,
		.version = htole16(POOL_HDR_VERSION),
		.flags = htole16(checksum ? POOL_HDR_F_CHECKSUM : 0),
		.key_hi = htole64(x->key_hi),
		.key_lo = htole64(x->key_lo),
		.gen = htole64(gen),
		.len = htole64(x->len),
		.checksum = htole64(sum),
	};
	memcpy(h, &hd, sizeof(hd));
	/* Magic last: a one-sided reader never sees a valid magic over a
	 * half-written header. */
	__atomic_store_n((uint32_t *)(void *)h, htole32(POOL_HDR_MAGIC),
			 __ATOMIC_RELEASE);
	uint32_t old = idx_find(s, x->key_hi, x->key_lo, pool_ext_key(s, x), x->keylen);
	if (old)
		entry_retire(s, old);
	x->gen = gen;
	x->state = POOL_EXT_LIVE;
	/* Never wrong: a committed page's header names its key, generation
	 * and length (debug builds also re-hash the stored key). */
	PC_DASSERT(hdr_matches(s, x));
	idx_insert(s, ref->idx);
	lru_push_head(s, ref->idx);
	s->keys++;
	pthread_mutex_unlock(&s->mu);

	if (gen_out)
		*gen_out = gen;
	if (hdr_addr_out)
		*hdr_addr_out = (uintptr_t)h;
	ref->gen = gen;
	return 0;
}

void pool_abort(struct pool *p, struct pool_ref *ref)
{
	struct pool_stripe *s;
	pthread_mutex_lock(&p->stripe[ref->stripe % p->nstripes].mu);
	struct pool_ext *x = ref_rec(p, ref, &s);
	PC_ASSERT(x->state == POOL_EXT_RESERVED && x->gen == ref->gen);
	entry_release(s, ref->idx);
	pthread_mutex_unlock(&s->mu);
}

/* Lock key's stripe (the caller unlocks *sp) and find its live entry:
 * the index, 0 for none. keylen must be valid (1..POOL_KEY_MAX). */
static uint32_t find_locked(struct pool *p, const void *key, size_t keylen,
			    struct pool_stripe **sp)
{
	uint64_t kh, kl;
	pool_key_hash(key, keylen, &kh, &kl);
	struct pool_stripe *s = stripe_of(p, kl);
	pthread_mutex_lock(&s->mu);
	*sp = s;
	return idx_find(s, kh, kl, key, keylen);
}

int pool_get(struct pool *p, const void *key, size_t keylen,
	     struct pool_ref *ref, const uint8_t **hdr, uint64_t *len,
	     uint64_t *gen)
{
	if (keylen == 0 || keylen > POOL_KEY_MAX)
		return -ENOENT;
	struct pool_stripe *s;
	uint32_t i = find_locked(p, key, keylen, &s);
	if (i) {
		struct pool_ext *x = &s->ext[i];
		PC_DASSERT(x->state == POOL_EXT_LIVE && hdr_matches(s, x));
		entry_pin(s, i);
		ref->stripe = (uint32_t)(s - p->stripe);
		ref->idx = i;
		ref->gen = x->gen;
		*hdr = pool_ext_addr(s, x);
		*len = x->len;
		*gen = x->gen;
	}
	pthread_mutex_unlock(&s->mu);
	return i ? 0 : -ENOENT;
}

int pool_pin_addr(struct pool *p, uintptr_t hdr_addr, uint64_t total_len,
		  struct pool_ref *ref)
{
	uintptr_t b = (uintptr_t)p->base;
	if (hdr_addr < b || hdr_addr - b >= p->capacity ||
	    total_len > p->capacity - (hdr_addr - b))
		return -EFAULT;
	if (total_len == 0)
		return -EINVAL;
	size_t off = hdr_addr - b;
	if (off & (POOL_UNIT_BYTES - 1))
		return -ENOENT;
	unsigned si = (unsigned)(off / p->stripe_bytes);
	struct pool_stripe *s = &p->stripe[si];
	uint32_t u = (uint32_t)((off - (size_t)si * p->stripe_bytes) >> POOL_UNIT_SHIFT);
	int rc = 0;
	pthread_mutex_lock(&s->mu);
	uint32_t i = s->edge[u];
	struct pool_ext *x = &s->ext[i];
	/* edge[u] may be stale inside an extent: the record's own start
	 * decides whether an entry begins at u. */
	if (!i || x->start != u || x->state != POOL_EXT_LIVE) {
		rc = -ENOENT;
	} else if (total_len > POOL_HDR_BYTES + x->len) {
		rc = -ERANGE;
	} else {
		PC_DASSERT(hdr_matches(s, x));
		entry_pin(s, i);
		ref->stripe = si;
		ref->idx = i;
		ref->gen = x->gen;
	}
	pthread_mutex_unlock(&s->mu);
	return rc;
}

void pool_unpin(struct pool *p, struct pool_ref *ref)
{
	struct pool_stripe *s;
	pthread_mutex_lock(&p->stripe[ref->stripe % p->nstripes].mu);
	struct pool_ext *x = ref_rec(p, ref, &s);
	PC_ASSERT((x->state == POOL_EXT_LIVE || x->state == POOL_EXT_DEAD) &&
		  x->gen == ref->gen && x->pins > 0);
	if (--x->pins == 0) {
		s->pinned--;
		if (x->state == POOL_EXT_DEAD)
			entry_release(s, ref->idx);
		else
			lru_push_head(s, ref->idx); /* a read is a use */
	}
	pthread_mutex_unlock(&s->mu);
}

bool pool_contains(struct pool *p, const void *key, size_t keylen)
{
	if (keylen == 0 || keylen > POOL_KEY_MAX)
		return false;
	struct pool_stripe *s;
	bool found = find_locked(p, key, keylen, &s) != 0;
	pthread_mutex_unlock(&s->mu);
	return found;
}

int pool_delete(struct pool *p, const void *key, size_t keylen)
{
	if (keylen == 0 || keylen > POOL_KEY_MAX)
		return -ENOENT;
	struct pool_stripe *s;
	uint32_t i = find_locked(p, key, keylen, &s);
	if (i)
		entry_retire(s, i);
	pthread_mutex_unlock(&s->mu);
	return i ? 0 : -ENOENT;
}

void pool_stats(struct pool *p, struct pool_stats *out)
{
	memset(out, 0, sizeof(*out));
	out->capacity = p->capacity;
	for (unsigned i = 0; i < p->nstripes; i++) {
		struct pool_stripe *s = &p->stripe[i];
		pthread_mutex_lock(&s->mu);
		out->bytes_used += s->used_units << POOL_UNIT_SHIFT;
		out->keys += s->keys;
		out->evictions += s->evictions;
		out->evicted_bytes += s->evicted_units << POOL_UNIT_SHIFT;
		out->reserve_failures += s->reserve_failures;
		out->pinned += s->pinned;
		out->span_picks += s->span_picks;
		pthread_mutex_unlock(&s->mu);
	}
}

/* ---- audit ---------------------------------------------------------------- */

#define AUDIT(cond)                                                            \
	do {                                                                   \
		if (!(cond)) {                                                 \
			PC_LOGE("pool", "audit: stripe %u: %s", si, #cond);    \
			return -EUCLEAN;                                       \
		}                                                              \
	} while (0)

static int stripe_audit(struct pool_stripe *s, unsigned si)
{
	uint64_t used = 0, keys = 0, pinned = 0, lru = 0, nfree = 0, fl = 0;
	bool prev_free = false;
	uint32_t u = 0;
	while (u < s->units) {
		uint32_t i = s->edge[u];
		AUDIT(i >= 1 && i <= s->rec_hwm);
		const struct pool_ext *x = &s->ext[i];
		AUDIT(x->start == u && x->units >= 1);
		AUDIT((uint64_t)u + x->units <= s->units);
		AUDIT(s->edge[u + x->units - 1] == i);
		AUDIT(x->state != POOL_EXT_UNUSED);
		bool is_free = x->state == POOL_EXT_FREE;
		AUDIT(!(is_free && prev_free));
		if (is_free) {
			AUDIT(x->cls == pool_space_cls(x->units));
			nfree++;
		} else {
			used += x->units;
			AUDIT(x->state != POOL_EXT_DEAD || x->pins > 0);
			if (x->pins)
				pinned++;
			if (x->state == POOL_EXT_LIVE) {
				keys++;
				AUDIT(idx_find(s, x->key_hi, x->key_lo, pool_ext_key(s, x),
					       x->keylen) == i);
			}
		}
		prev_free = is_free;
		u += x->units;
	}
	for (uint32_t i = s->lru_head, prev = 0; i; prev = i, i = s->ext[i].next) {
		AUDIT(s->ext[i].state == POOL_EXT_LIVE && s->ext[i].pins == 0);
		AUDIT(s->ext[i].prev == prev);
		AUDIT(++lru <= keys);
	}
	for (unsigned c = 0; c < POOL_NCLASS; c++) {
		AUDIT(!s->fl_head[c] == !(s->fl_map[c >> 6] & (1ull << (c & 63))));
		for (uint32_t i = s->fl_head[c]; i; i = s->ext[i].next) {
			AUDIT(s->ext[i].state == POOL_EXT_FREE && s->ext[i].cls == c);
			AUDIT(++fl <= nfree);
		}
	}
	AUDIT(fl == nfree);
	AUDIT(used == s->used_units && keys == s->keys && pinned == s->pinned);
	/* Entries pinned while LIVE are off the LRU, all others on it. */
	uint64_t live_pinned = 0;
	for (uint32_t i = 1; i <= s->rec_hwm; i++)
		if (s->ext[i].state == POOL_EXT_LIVE && s->ext[i].pins)
			live_pinned++;
	AUDIT(lru == keys - live_pinned);
	return 0;
}

int pool_audit(struct pool *p)
{
	for (unsigned i = 0; i < p->nstripes; i++) {
		struct pool_stripe *s = &p->stripe[i];
		pthread_mutex_lock(&s->mu);
		int rc = stripe_audit(s, i);
		pthread_mutex_unlock(&s->mu);
		if (rc)
			return rc;
	}
	return 0;
}
