/*
 * storage/pool_alloc.c — the publish pool's extent allocator: how a stripe's
 * 4 KiB units are carved into entries and free blocks, and the span search
 * that picks what to evict when a page does not fit (pool.c's header comment
 * explains the policy and its bounds).
 *
 * Owns: per stripe, the record array (one 64-byte record per extent), the
 * boundary map (unit -> record at both ends of every extent), the segregated
 * free lists with their bitmap, and the span scratch arrays. Nothing here
 * lives in the region itself, so peers reading it see no allocator state.
 *
 * Threads: every function runs with the stripe's mutex held by the caller.
 *
 * Invariants: the extents tile the stripe; no two free blocks are adjacent;
 * edge[] is exact at extent ends (interior slots may be stale); a free block
 * sits on the list of pool_space_cls(units), and a class's bitmap bit is set
 * exactly when its list is non-empty; records never outnumber units.
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "common/util.h"
#include "storage/pool_int.h"

#define FL_SCAN 8 /* blocks tried per free list before a bigger class */

/* Metadata arrays sized for the worst case (one record per unit) but only
 * touched as used: a mapping, not calloc, so the kernel charges nothing
 * until then even under strict overcommit accounting. */
static void *meta_map(size_t bytes)
{
	void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	return m == MAP_FAILED ? NULL : m;
}

static void meta_unmap(void *m, size_t bytes)
{
	if (m)
		munmap(m, bytes);
}

/* ---- records ------------------------------------------------------------- */

static uint32_t rec_get(struct pool_stripe *s)
{
	uint32_t i = s->rec_free;
	if (i) {
		s->rec_free = s->ext[i].next;
	} else {
		/* Extents tile the stripe, so there are never more than units. */
		PC_ASSERT(s->rec_hwm < s->units);
		i = ++s->rec_hwm;
	}
	memset(&s->ext[i], 0, sizeof(s->ext[i]));
	return i;
}

static void rec_put(struct pool_stripe *s, uint32_t i)
{
	memset(&s->ext[i], 0, sizeof(s->ext[i]));
	s->ext[i].next = s->rec_free;
	s->rec_free = i;
}

static void set_edges(struct pool_stripe *s, uint32_t i)
{
	const struct pool_ext *x = &s->ext[i];
	s->edge[x->start] = i;
	s->edge[x->start + x->units - 1] = i;
}

/* ---- free lists ---------------------------------------------------------- */

/* Class whose list holds blocks of this size: exact below 17 units, then
 * four classes per power of two (blocks in a class differ by < 25%). */
unsigned pool_space_cls(uint32_t units)
{
	if (units <= 16)
		return units - 1;
	unsigned fl = 31u - (unsigned)__builtin_clz(units);
	unsigned sl = (units >> (fl - 2)) & 3u;
	return 16 + (fl - 4) * 4 + sl;
}

static void fl_insert(struct pool_stripe *s, uint32_t i)
{
	struct pool_ext *x = &s->ext[i];
	unsigned c = pool_space_cls(x->units);
	x->state = POOL_EXT_FREE;
	x->cls = (uint8_t)c;
	x->prev = 0;
	/* LIFO: a block just merged is found first by the next search. */
	x->next = s->fl_head[c];
	if (x->next)
		s->ext[x->next].prev = i;
	s->fl_head[c] = i;
	s->fl_map[c >> 6] |= 1ull << (c & 63);
}

static void fl_remove(struct pool_stripe *s, uint32_t i)
{
	struct pool_ext *x = &s->ext[i];
	unsigned c = x->cls;
	if (x->prev)
		s->ext[x->prev].next = x->next;
	else
		s->fl_head[c] = x->next;
	if (x->next)
		s->ext[x->next].prev = x->prev;
	if (!s->fl_head[c])
		s->fl_map[c >> 6] &= ~(1ull << (c & 63));
	x->prev = x->next = 0;
}

/* Smallest of up to `limit` blocks >= n in list c (0 = none). */
static uint32_t fl_scan(struct pool_stripe *s, unsigned c, uint32_t n,
			unsigned limit)
{
	uint32_t best = 0;
	unsigned k = 0;
	for (uint32_t i = s->fl_head[c]; i && k < limit; i = s->ext[i].next, k++) {
		uint32_t u = s->ext[i].units;
		if (u >= n && (!best || u < s->ext[best].units)) {
			best = i;
			if (u == n)
				break;
		}
	}
	return best;
}

static int fl_next_class(const struct pool_stripe *s, unsigned c)
{
	for (unsigned w = c >> 6; w < POOL_NCLASS / 64; w++) {
		uint64_t m = s->fl_map[w];
		if (w == c >> 6)
			m &= (c & 63) == 63 ? 0 : ~0ull << ((c & 63) + 1);
		if (m)
			return (int)(w * 64 + (unsigned)__builtin_ctzll(m));
	}
	return -1;
}

/* A free block of at least n units, or 0. */
uint32_t pool_space_find(struct pool_stripe *s, uint32_t n)
{
	unsigned c = pool_space_cls(n);
	uint32_t i = fl_scan(s, c, n, FL_SCAN);
	if (i)
		return i;
	/* Every block in a higher class is larger than n. */
	int c2 = fl_next_class(s, c);
	if (c2 >= 0)
		return fl_scan(s, (unsigned)c2, n, FL_SCAN);
	/* Last resort before evicting anything: the whole list of n's class. */
	return fl_scan(s, c, n, UINT32_MAX);
}

/* Take n units from the front of free block f; returns the new extent. */
uint32_t pool_space_carve(struct pool_stripe *s, uint32_t f, uint32_t n)
{
	fl_remove(s, f);
	if (s->ext[f].units == n) {
		set_edges(s, f);
		return f;
	}
	uint32_t a = rec_get(s);
	struct pool_ext *fx = &s->ext[f];
	s->ext[a].start = fx->start;
	s->ext[a].units = n;
	fx->start += n;
	fx->units -= n;
	set_edges(s, a);
	set_edges(s, f);
	fl_insert(s, f);
	return a;
}

/* Turn extent i into a free block merged with free neighbours; returns the
 * record of the merged block. */
uint32_t pool_space_free(struct pool_stripe *s, uint32_t i)
{
	struct pool_ext *x = &s->ext[i];
	if (x->start > 0) {
		uint32_t l = s->edge[x->start - 1];
		if (s->ext[l].state == POOL_EXT_FREE) {
			fl_remove(s, l);
			x->start = s->ext[l].start;
			x->units += s->ext[l].units;
			rec_put(s, l);
		}
	}
	uint32_t end = x->start + x->units;
	if (end < s->units) {
		uint32_t r = s->edge[end];
		if (s->ext[r].state == POOL_EXT_FREE) {
			fl_remove(s, r);
			x->units += s->ext[r].units;
			rec_put(s, r);
		}
	}
	x->pins = 0;
	x->hnext = 0;
	set_edges(s, i);
	fl_insert(s, i);
	return i;
}

/* ---- set-up -------------------------------------------------------------- */

int pool_space_init(struct pool_stripe *s)
{
	s->ext = meta_map(((size_t)s->units + 1) * sizeof(*s->ext));
	s->edge = meta_map((size_t)s->units * sizeof(*s->edge));
	s->scr = meta_map(sizeof(*s->scr));
	if (!s->ext || !s->edge || !s->scr)
		return -ENOMEM;
	uint32_t f = rec_get(s);
	s->ext[f].start = 0;
	s->ext[f].units = s->units;
	set_edges(s, f);
	fl_insert(s, f);
	return 0;
}

void pool_space_fini(struct pool_stripe *s)
{
	meta_unmap(s->ext, ((size_t)s->units + 1) * sizeof(*s->ext));
	meta_unmap(s->edge, (size_t)s->units * sizeof(*s->edge));
	meta_unmap(s->scr, sizeof(*s->scr));
	s->ext = NULL;
	s->edge = NULL;
	s->scr = NULL;
}

/* ---- span search ---------------------------------------------------------- */

static bool evictable(const struct pool_ext *x)
{
	return x->state == POOL_EXT_FREE || (x->state == POOL_EXT_LIVE && x->pins == 0);
}

/*
 * The span search (see the file comment). Fills scr->victim with the records
 * of the best run and returns their count, or 0 when no run in the window
 * reaches n units.
 */
/* Record extent j in scratch slot k: its size, and its cost if evicted. */
static void span_slot(struct pool_stripe *s, unsigned k, uint32_t j)
{
	const struct pool_ext *x = &s->ext[j];
	s->scr->idx[k] = j;
	s->scr->units[k] = x->units;
	s->scr->cost[k] = x->state == POOL_EXT_FREE ? 0 : x->units;
}

/* May extent x join a run as a candidate's neighbour? Free extents and
 * entries neither pinned nor recently used. */
static bool joinable(const struct pool_stripe *s, const struct pool_ext *x)
{
	return evictable(x) &&
	       (x->state == POOL_EXT_FREE || !pool_recent(s, x));
}

/*
 * Lay out the run around candidate `cand` in the scratch arrays, candidate
 * at slot POOL_SPAN_REACH, neighbours outwards until a pinned/reserved/dead
 * or recently used extent, the stripe's edge, the reach, or until one side
 * alone covers `need` (extents further out are never part of a cheapest
 * run).
 */
static void span_gather(struct pool_stripe *s, uint32_t cand, uint32_t need,
			unsigned *lo_out, unsigned *hi_out)
{
	const struct pool_ext *cx = &s->ext[cand];
	unsigned lo = POOL_SPAN_REACH, hi = POOL_SPAN_REACH;
	span_slot(s, lo, cand);
	uint64_t acc = 0;
	for (uint32_t u = cx->start; lo > 0 && acc < need && u > 0;) {
		uint32_t j = s->edge[u - 1];
		if (!joinable(s, &s->ext[j]))
			break;
		span_slot(s, --lo, j);
		acc += s->ext[j].units;
		u = s->ext[j].start;
	}
	acc = 0;
	for (uint32_t u = cx->start + cx->units;
	     hi < POOL_SPAN_SLOTS - 1 && acc < need && u < s->units;) {
		uint32_t j = s->edge[u];
		if (!joinable(s, &s->ext[j]))
			break;
		span_slot(s, ++hi, j);
		acc += s->ext[j].units;
		u = s->ext[j].start + s->ext[j].units;
	}
	*lo_out = lo;
	*hi_out = hi;
}

/*
 * Cheapest sub-run [*bl, *br] of slots lo..hi that contains the candidate
 * slot c and reaches n units; returns its cost, UINT64_MAX if none. Two
 * pointers: for each left end l <= c the shortest right end r >= c; r only
 * moves right as l does, and a shorter run never costs more (costs >= 0).
 */
static uint64_t span_cheapest(const struct pool_span_scratch *sc, unsigned lo,
			      unsigned hi, uint32_t n, unsigned *bl,
			      unsigned *br)
{
	const unsigned c = POOL_SPAN_REACH;
	unsigned r = c;
	uint64_t su = 0, sco = 0, best = UINT64_MAX;
	for (unsigned k = lo; k <= c; k++) {
		su += sc->units[k];
		sco += sc->cost[k];
	}
	for (unsigned l = lo; l <= c; l++) {
		while (su < n && r < hi) {
			r++;
			su += sc->units[r];
			sco += sc->cost[r];
		}
		if (su < n)
			break;
		if (sco < best) {
			best = sco;
			*bl = l;
			*br = r;
		}
		su -= sc->units[l];
		sco -= sc->cost[l];
	}
	return best;
}

unsigned pool_span_pick(struct pool_stripe *s, uint32_t n)
{
	struct pool_span_scratch *sc = s->scr;
	uint64_t best_cost = UINT64_MAX;
	unsigned best_n = 0, best_w = 0, w = 0, window = POOL_EVICT_WINDOW;
	uint32_t first = s->lru_tail;
	/* Aging: the oldest entry spared too often is the only candidate. */
	for (uint32_t i = s->lru_tail; i && w < window; i = s->ext[i].prev, w++) {
		if (s->ext[i].skips >= POOL_SKIPS_MAX) {
			first = i;
			window = 1;
			break;
		}
	}
	w = 0;
	for (uint32_t cand = first; cand && w < window;
	     cand = s->ext[cand].prev, w++) {
		uint32_t cu = s->ext[cand].units;
		if (cu >= best_cost)
			continue; /* its run costs at least itself: no better */
		unsigned lo, hi, bl = 0, br = 0;
		span_gather(s, cand, n > cu ? n - cu : 0, &lo, &hi);
		uint64_t cost = span_cheapest(sc, lo, hi, n, &bl, &br);
		if (cost < best_cost) { /* strict: ties go to the older */
			best_cost = cost;
			best_w = w;
			best_n = 0;
			for (unsigned k = bl; k <= br; k++)
				if (sc->cost[k])
					sc->victim[best_n++] = sc->idx[k];
		}
	}
	/* Every candidate older than the chosen one was spared once more. */
	if (best_n && window > 1) {
		uint32_t i = s->lru_tail;
		for (unsigned k = 0; k < best_w; k++, i = s->ext[i].prev)
			if (s->ext[i].skips < UINT16_MAX)
				s->ext[i].skips++;
	}
	return best_n;
}
