/*
 * storage/disk_log.c — the disk store's regions, index and format
 * (storage/disk_log.h says what it owns and the never-wrong rules).
 *
 * Index: a chained hash table keyed by XXH3-64 of the key; it grows by
 * doubling, and the move from the old table to the new one is spread over
 * the following calls (DL_MIGRATE buckets each), so no call ever rehashes
 * millions of entries at once. Each entry is also on its region's list, so
 * evicting a region removes exactly its entries.
 *
 * Regions: FREE (nothing indexed, not open), OPEN (the one being
 * appended to), SEALED. Each has an I/O reference count (writes not yet
 * committed or aborted, reads between dl_get and dl_put) and an LRU stamp
 * (from the store's sequence counter: set on seal and on every read). The victim is
 * the sealed region with no I/O and the smallest stamp: a linear scan over
 * the regions, once per region's worth of writes (16k regions for 1 TiB at
 * the 64 MiB default: tens of microseconds).
 *
 * Invariants (asserted): an entry lies inside its region and after the
 * region header; a region's bytes_used is the sum of its entries' totals;
 * the open region's fill never passes region_bytes; sequence numbers
 * handed out only grow.
 */
#include "storage/disk_log.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/checksum.h"
#include "common/log.h"
#include "common/util.h"

#define DL_MIGRATE 64   /* old buckets moved per call while growing */
#define DL_BUCKETS_MIN 1024u

_Static_assert(sizeof(struct dl_region_hdr) == 48, "region header size");
_Static_assert(sizeof(struct dl_rec_hdr) == DL_HDR_BYTES, "record header");

enum dl_state { DL_FREE, DL_OPEN, DL_SEALED };

struct dl_ent {
	struct dl_ent *next;           /* hash chain */
	struct dl_ent *rnext, *rprev;  /* region list */
	uint64_t h;
	struct dl_loc loc;
	uint16_t klen;
	char key[];
};

struct dl_region {
	enum dl_state state;
	uint32_t refs;      /* I/O under way */
	uint64_t fill;      /* bytes appended (header block included) */
	uint64_t used;      /* record bytes of indexed entries */
	uint64_t stamp;     /* LRU */
	struct dl_ent *ents;
};

struct dl_table {
	struct dl_ent **b;
	uint64_t mask;      /* buckets - 1 */
};

struct dlog {
	pthread_mutex_t lock;
	struct dl_params p;
	uint32_t nregions;
	struct dl_region *rg;
	uint32_t open;      /* UINT32_MAX: none */
	uint64_t seq;       /* sequences and LRU stamps: one counter */
	struct dl_table t, old; /* old.b != NULL while growing */
	uint64_t migrated;  /* old buckets already moved */
	uint64_t keys, bytes_live, bytes_used;
	uint64_t evicted_regions, evicted_keys;
};

uint64_t dl_record_bytes(size_t klen, uint64_t len)
{
	uint64_t raw = DL_HDR_BYTES + klen + len;
	return (raw + DL_BLOCK - 1) / DL_BLOCK * DL_BLOCK;
}

uint32_t dl_regions(const struct dlog *d)
{
	return d->nregions;
}

uint32_t dl_region_bytes(const struct dlog *d)
{
	return d->p.region_bytes;
}

static int table_init(struct dl_table *t, uint64_t buckets)
{
	t->b = calloc(buckets, sizeof(*t->b));
	t->mask = buckets - 1;
	return t->b ? 0 : -ENOMEM;
}

int dl_new(struct dlog **out, const struct dl_params *p)
{
	if (p->region_bytes < DL_REGION_MIN || p->region_bytes % DL_BLOCK ||
	    p->capacity / p->region_bytes < 2 ||
	    p->capacity / p->region_bytes > DL_REGIONS_MAX)
		return -EINVAL;
	struct dlog *d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->p = *p;
	d->nregions = (uint32_t)(p->capacity / p->region_bytes);
	d->rg = calloc(d->nregions, sizeof(*d->rg));
	d->open = UINT32_MAX;
	if (!d->rg || table_init(&d->t, DL_BUCKETS_MIN) < 0) {
		free(d->rg);
		free(d);
		return -ENOMEM;
	}
	pthread_mutex_init(&d->lock, NULL);
	*out = d;
	return 0;
}

void dl_free(struct dlog *d)
{
	if (!d)
		return;
	for (uint32_t i = 0; i < d->nregions; i++) {
		struct dl_ent *e = d->rg[i].ents;
		while (e) {
			struct dl_ent *n = e->rnext;
			free(e);
			e = n;
		}
	}
	free(d->t.b);
	free(d->old.b);
	free(d->rg);
	pthread_mutex_destroy(&d->lock);
	free(d);
}

/* ---------------------------------------------------------------- index */

static uint64_t key_hash(const char *key, size_t klen)
{
	return XXH3_64bits(key, klen);
}

/* Move a few old buckets into the new table; drop the old one when done. */
static void migrate(struct dlog *d)
{
	if (!d->old.b)
		return;
	for (unsigned i = 0; i < DL_MIGRATE && d->migrated <= d->old.mask;
	     i++, d->migrated++) {
		struct dl_ent *e = d->old.b[d->migrated];
		d->old.b[d->migrated] = NULL;
		while (e) {
			struct dl_ent *n = e->next;
			struct dl_ent **slot = &d->t.b[e->h & d->t.mask];
			e->next = *slot;
			*slot = e;
			e = n;
		}
	}
	if (d->migrated > d->old.mask) {
		free(d->old.b);
		d->old.b = NULL;
	}
}

/* The chain slot holding key, or the end of its chain. */
static struct dl_ent **find_slot(struct dlog *d, uint64_t h, const char *key,
				 size_t klen)
{
	struct dl_ent **s;
	if (d->old.b && (h & d->old.mask) >= d->migrated) {
		for (s = &d->old.b[h & d->old.mask]; *s; s = &(*s)->next)
			if ((*s)->h == h && (*s)->klen == klen &&
			    memcmp((*s)->key, key, klen) == 0)
				return s;
	}
	for (s = &d->t.b[h & d->t.mask]; *s; s = &(*s)->next)
		if ((*s)->h == h && (*s)->klen == klen &&
		    memcmp((*s)->key, key, klen) == 0)
			return s;
	return s;
}

static void grow(struct dlog *d)
{
	if (d->old.b || d->keys <= d->t.mask + 1)
		return;
	struct dl_table n;
	if (table_init(&n, (d->t.mask + 1) * 2) < 0)
		return; /* longer chains, still correct */
	d->old = d->t;
	d->t = n;
	d->migrated = 0;
}

/* A sealed region whose last entry left and whose I/O ended is free. */
static void region_maybe_free(struct dlog *d, uint32_t i)
{
	struct dl_region *r = &d->rg[i];
	if (r->state == DL_SEALED && !r->ents && r->refs == 0) {
		PC_ASSERT(r->used == 0);
		r->state = DL_FREE;
		r->fill = 0;
	}
}

/* Unlink e from its region and the counters (not from its chain). */
static void ent_unaccount(struct dlog *d, struct dl_ent *e)
{
	struct dl_region *r = &d->rg[e->loc.region];
	if (e->rprev)
		e->rprev->rnext = e->rnext;
	else
		r->ents = e->rnext;
	if (e->rnext)
		e->rnext->rprev = e->rprev;
	PC_ASSERT(r->used >= e->loc.total);
	r->used -= e->loc.total;
	d->keys--;
	d->bytes_live -= e->loc.len;
	d->bytes_used -= e->loc.total;
}

static void ent_remove(struct dlog *d, struct dl_ent **slot)
{
	struct dl_ent *e = *slot;
	*slot = e->next;
	uint32_t region = e->loc.region;
	ent_unaccount(d, e);
	free(e);
	region_maybe_free(d, region);
}

/* Insert key at loc (replacing an older record unless loc is older). */
static int ent_insert(struct dlog *d, const char *key, size_t klen,
		      const struct dl_loc *loc, bool keep_newer)
{
	uint64_t h = key_hash(key, klen);
	struct dl_ent **slot = find_slot(d, h, key, klen);
	if (*slot) {
		if (keep_newer && (*slot)->loc.seq > loc->seq)
			return 0;
		ent_remove(d, slot);
		slot = find_slot(d, h, key, klen);
	}
	struct dl_ent *e = malloc(sizeof(*e) + klen);
	if (!e)
		return -ENOMEM;
	e->h = h;
	e->loc = *loc;
	e->klen = (uint16_t)klen;
	memcpy(e->key, key, klen);
	e->next = NULL;
	*slot = e;
	struct dl_region *r = &d->rg[loc->region];
	e->rprev = NULL;
	e->rnext = r->ents;
	if (r->ents)
		r->ents->rprev = e;
	r->ents = e;
	r->used += loc->total;
	d->keys++;
	d->bytes_live += loc->len;
	d->bytes_used += loc->total;
	grow(d);
	return 1;
}

/* -------------------------------------------------------------- regions */

/* Evict region i whole: its entries leave the index. */
static void region_evict(struct dlog *d, uint32_t i, dl_evict_fn evict,
			 void *arg)
{
	struct dl_region *r = &d->rg[i];
	PC_ASSERT(r->state == DL_SEALED && r->refs == 0);
	while (r->ents) {
		struct dl_ent *e = r->ents;
		if (evict)
			evict(arg, e->key, e->klen, e->loc.gen);
		d->evicted_keys++;
		struct dl_ent **slot = find_slot(d, e->h, e->key, e->klen);
		PC_ASSERT(*slot == e);
		*slot = e->next;
		ent_unaccount(d, e);
		free(e);
	}
	d->evicted_regions++;
	r->state = DL_FREE;
	r->fill = 0;
}

/* A region to open: a free one, else the LRU sealed one without I/O
 * (evicted). UINT32_MAX when every region is busy. */
static uint32_t region_take(struct dlog *d, dl_evict_fn evict, void *arg)
{
	uint32_t victim = UINT32_MAX;
	for (uint32_t i = 0; i < d->nregions; i++) {
		struct dl_region *r = &d->rg[i];
		if (r->state == DL_FREE)
			return i;
		if (r->state == DL_SEALED && r->refs == 0 &&
		    (victim == UINT32_MAX || r->stamp < d->rg[victim].stamp))
			victim = i;
	}
	if (victim != UINT32_MAX)
		region_evict(d, victim, evict, arg);
	return victim;
}

int dl_alloc(struct dlog *d, uint64_t bytes, uint64_t *off, uint64_t *seq,
	     uint64_t *region_hdr_off, uint64_t *region_open_seq,
	     dl_evict_fn evict, void *arg)
{
	uint64_t rb = d->p.region_bytes;
	if (bytes == 0 || bytes % DL_BLOCK || bytes > rb - DL_BLOCK)
		return bytes > rb - DL_BLOCK ? -E2BIG : -EINVAL;
	pthread_mutex_lock(&d->lock);
	migrate(d);
	*region_hdr_off = UINT64_MAX;
	*region_open_seq = 0;
	if (d->open == UINT32_MAX || d->rg[d->open].fill + bytes > rb) {
		if (d->open != UINT32_MAX) {
			struct dl_region *o = &d->rg[d->open];
			o->state = DL_SEALED;
			o->stamp = ++d->seq;
			uint32_t was = d->open;
			d->open = UINT32_MAX;
			region_maybe_free(d, was);
		}
		uint32_t i = region_take(d, evict, arg);
		if (i == UINT32_MAX) {
			pthread_mutex_unlock(&d->lock);
			return -EBUSY;
		}
		struct dl_region *r = &d->rg[i];
		r->state = DL_OPEN;
		r->fill = DL_BLOCK;
		r->used = 0;
		d->open = i;
		*region_hdr_off = (uint64_t)i * rb;
		*region_open_seq = ++d->seq;
	}
	struct dl_region *r = &d->rg[d->open];
	*off = (uint64_t)d->open * rb + r->fill;
	r->fill += bytes;
	r->refs++;
	*seq = ++d->seq;
	pthread_mutex_unlock(&d->lock);
	return 0;
}

int dl_commit(struct dlog *d, const char *key, size_t klen,
	      const struct dl_loc *loc)
{
	if (klen == 0 || klen > DL_KEY_MAX || loc->region >= d->nregions)
		return -EINVAL;
	pthread_mutex_lock(&d->lock);
	migrate(d);
	struct dl_region *r = &d->rg[loc->region];
	PC_ASSERT(r->refs > 0 && r->state != DL_FREE);
	PC_ASSERT(loc->off >= (uint64_t)loc->region * d->p.region_bytes +
				      DL_BLOCK &&
		  loc->off + loc->total <=
			  (uint64_t)(loc->region + 1) * d->p.region_bytes);
	int ret = ent_insert(d, key, klen, loc, true);
	r->refs--;
	region_maybe_free(d, loc->region);
	pthread_mutex_unlock(&d->lock);
	return ret < 0 ? ret : 0;
}

void dl_abort(struct dlog *d, uint64_t off)
{
	uint32_t i = (uint32_t)(off / d->p.region_bytes);
	pthread_mutex_lock(&d->lock);
	PC_ASSERT(i < d->nregions && d->rg[i].refs > 0);
	d->rg[i].refs--;
	region_maybe_free(d, i);
	pthread_mutex_unlock(&d->lock);
}

void dl_abort_header(struct dlog *d, uint64_t off)
{
	uint32_t i = (uint32_t)(off / d->p.region_bytes);
	pthread_mutex_lock(&d->lock);
	PC_ASSERT(i < d->nregions && d->rg[i].refs > 0);
	d->rg[i].refs--;
	if (d->open == i) {
		d->rg[i].state = DL_SEALED;
		d->rg[i].stamp = ++d->seq;
		d->open = UINT32_MAX;
	}
	region_maybe_free(d, i);
	pthread_mutex_unlock(&d->lock);
}

bool dl_get(struct dlog *d, const char *key, size_t klen, struct dl_loc *out)
{
	pthread_mutex_lock(&d->lock);
	migrate(d);
	struct dl_ent *e = *find_slot(d, key_hash(key, klen), key, klen);
	if (e) {
		struct dl_region *r = &d->rg[e->loc.region];
		r->refs++;
		if (r->state == DL_SEALED)
			r->stamp = ++d->seq;
		*out = e->loc;
	}
	pthread_mutex_unlock(&d->lock);
	return e != NULL;
}

void dl_put(struct dlog *d, uint32_t region)
{
	pthread_mutex_lock(&d->lock);
	PC_ASSERT(region < d->nregions && d->rg[region].refs > 0);
	d->rg[region].refs--;
	region_maybe_free(d, region);
	pthread_mutex_unlock(&d->lock);
}

bool dl_has(struct dlog *d, const char *key, size_t klen)
{
	pthread_mutex_lock(&d->lock);
	bool has = *find_slot(d, key_hash(key, klen), key, klen) != NULL;
	pthread_mutex_unlock(&d->lock);
	return has;
}

bool dl_del(struct dlog *d, const char *key, size_t klen, uint64_t gen)
{
	pthread_mutex_lock(&d->lock);
	migrate(d);
	struct dl_ent **slot = find_slot(d, key_hash(key, klen), key, klen);
	bool del = *slot && (gen == 0 || (*slot)->loc.gen == gen);
	if (del)
		ent_remove(d, slot);
	pthread_mutex_unlock(&d->lock);
	return del;
}

bool dl_retag(struct dlog *d, const char *key, size_t klen, uint64_t seq,
	      uint64_t gen)
{
	pthread_mutex_lock(&d->lock);
	struct dl_ent *e = *find_slot(d, key_hash(key, klen), key, klen);
	bool hit = e && e->loc.seq == seq;
	if (hit)
		e->loc.gen = gen;
	pthread_mutex_unlock(&d->lock);
	return hit;
}

/* cursor: region in the high 32 bits, entries of its list already passed
 * in the low 32. */
int dl_scan(struct dlog *d, uint64_t *cursor, unsigned max, dl_scan_fn fn,
	    void *arg)
{
	uint32_t region = (uint32_t)(*cursor >> 32);
	uint32_t skip = (uint32_t)*cursor;
	unsigned seen = 0;
	pthread_mutex_lock(&d->lock);
	while (region < d->nregions && seen < max) {
		struct dl_ent *e = d->rg[region].ents;
		for (uint32_t i = 0; e && i < skip; i++)
			e = e->rnext;
		for (; e && seen < max; e = e->rnext, seen++, skip++)
			fn(arg, e->key, e->klen, &e->loc);
		if (e)
			break; /* max reached inside this region */
		region++;
		skip = 0;
	}
	pthread_mutex_unlock(&d->lock);
	*cursor = (uint64_t)region << 32 | skip;
	return region < d->nregions;
}

void dl_stats(struct dlog *d, struct dl_stats *out)
{
	pthread_mutex_lock(&d->lock);
	uint32_t nfree = 0;
	for (uint32_t i = 0; i < d->nregions; i++)
		nfree += d->rg[i].state == DL_FREE;
	*out = (struct dl_stats){.regions = d->nregions, .free_regions = nfree,
				 .keys = d->keys, .bytes_live = d->bytes_live,
				 .bytes_used = d->bytes_used,
				 .evicted_regions = d->evicted_regions,
				 .evicted_keys = d->evicted_keys,
				 .seq = d->seq};
	pthread_mutex_unlock(&d->lock);
}

/* --------------------------------------------------------------- format */

void dl_region_hdr_encode(const struct dlog *d, uint32_t region,
			  uint64_t open_seq, void *block)
{
	struct dl_region_hdr h = {.magic = DL_REGION_HDR_MAGIC,
				  .version = DL_VERSION, .region = region,
				  .region_bytes = d->p.region_bytes,
				  .open_seq = open_seq};
	memcpy(h.store_id, d->p.store_id, sizeof(h.store_id));
	h.hdr_sum = XXH3_64bits(&h, offsetof(struct dl_region_hdr, hdr_sum));
	memset(block, 0, DL_BLOCK);
	memcpy(block, &h, sizeof(h));
}

int dl_region_hdr_decode(const struct dlog *d, uint32_t region,
			 const void *block, uint64_t *open_seq)
{
	struct dl_region_hdr h;
	memcpy(&h, block, sizeof(h));
	if (h.magic != DL_REGION_HDR_MAGIC || h.version != DL_VERSION ||
	    h.hdr_sum != XXH3_64bits(&h, offsetof(struct dl_region_hdr,
						   hdr_sum)) ||
	    h.region != region || h.region_bytes != d->p.region_bytes ||
	    h.open_seq > DL_SEQ_MAX ||
	    memcmp(h.store_id, d->p.store_id, sizeof(h.store_id)) != 0)
		return -EINVAL;
	*open_seq = h.open_seq;
	return 0;
}

void dl_rec_hdr_encode(void *out, size_t klen, uint64_t len, uint64_t gen,
		       uint64_t seq, uint64_t sum)
{
	struct dl_rec_hdr h = {.magic = DL_REC_MAGIC, .version = DL_VERSION,
			       .klen = (uint16_t)klen, .len = (uint32_t)len,
			       .total = (uint32_t)dl_record_bytes(klen, len),
			       .gen = gen, .seq = seq, .sum = sum};
	h.hdr_sum = XXH3_64bits(&h, offsetof(struct dl_rec_hdr, hdr_sum));
	memcpy(out, &h, sizeof(h));
}

int dl_rec_hdr_decode(const void *p, struct dl_rec_hdr *out)
{
	memcpy(out, p, sizeof(*out));
	if (out->magic != DL_REC_MAGIC || out->version != DL_VERSION ||
	    out->hdr_sum != XXH3_64bits(out, offsetof(struct dl_rec_hdr,
						       hdr_sum)) ||
	    out->klen == 0 || out->klen > DL_KEY_MAX || out->seq > DL_SEQ_MAX ||
	    out->total != dl_record_bytes(out->klen, out->len))
		return -EINVAL;
	return 0;
}

int dl_rec_check(const void *rec, size_t n, const char *key, size_t klen,
		 const struct dl_loc *loc, struct dl_rec_hdr *out)
{
	if (n < DL_HDR_BYTES || dl_rec_hdr_decode(rec, out) < 0 ||
	    out->total > n || out->klen != klen ||
	    memcmp((const uint8_t *)rec + DL_HDR_BYTES, key, klen) != 0 ||
	    out->len != loc->len || out->seq != loc->seq ||
	    out->sum != loc->sum)
		return -EBADMSG;
	return 0;
}

int dl_rebuild_region(struct dlog *d, uint32_t region, const void *buf,
		      size_t n, bool verify, unsigned *bad)
{
	const uint8_t *b = buf;
	uint64_t rb = d->p.region_bytes, open_seq, max_seq = 0;
	int found = 0;
	if (region >= d->nregions || n < DL_BLOCK || n > rb || n % DL_BLOCK ||
	    dl_region_hdr_decode(d, region, b, &open_seq) < 0)
		return 0;
	pthread_mutex_lock(&d->lock);
	struct dl_region *r = &d->rg[region];
	PC_ASSERT(r->state == DL_FREE && r->refs == 0);
	uint64_t pos = DL_BLOCK;
	while (pos + DL_HDR_BYTES <= n) {
		struct dl_rec_hdr h;
		if (dl_rec_hdr_decode(b + pos, &h) < 0 || h.seq < open_seq ||
		    pos + h.total > n)
			break; /* the end of the log, or a leftover */
		const uint8_t *key = b + pos + DL_HDR_BYTES;
		if (verify && pc_page_sum(key + h.klen, h.len) != h.sum) {
			if (bad)
				(*bad)++;
		} else {
			struct dl_loc loc = {.off = region * rb + pos,
					     .total = h.total, .len = h.len,
					     .gen = h.gen, .sum = h.sum,
					     .seq = h.seq, .region = region};
			if (ent_insert(d, (const char *)key, h.klen, &loc,
				       true) > 0)
				found++;
		}
		max_seq = PC_MAX(max_seq, h.seq);
		pos += h.total;
	}
	d->seq = PC_MAX(d->seq, PC_MAX(max_seq, open_seq));
	if (r->ents) {
		r->state = DL_SEALED;
		r->fill = pos;
		r->stamp = max_seq;
	}
	pthread_mutex_unlock(&d->lock);
	return found;
}
