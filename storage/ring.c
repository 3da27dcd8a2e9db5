/*
 * storage/ring.c — consistent-hash ring: build once, read from any thread.
 *
 * Owns: the sorted vnode points of one membership view, the member index of
 * each point, and a copy of the member ids. Threads: ring_build() and
 * ring_free() run on whichever thread applies a membership change; every
 * other function only reads and may run on any number of threads at once.
 *
 * Lifetime: an atomic reference count (ring.h); the epoch is set at build
 * and never changes.
 *
 * Invariants (the sort order is asserted once per build, the reference
 * count on every ref/unref, owners' distinctness per lookup in debug
 * builds; the rest hold by construction):
 *  - points[] is sorted ascending; equal points are ordered by member id
 *    rank, so the layout depends only on the member set, not its order.
 *  - owner[k] < n_members for every k, and each member owns exactly
 *    `vnodes` points, so one full turn of the ring meets every member.
 *  - by_id[] lists member indexes in bytewise id order with no two ids
 *    equal.
 *  - refs >= 1 while anyone may use the ring; ref() never sees 0 and
 *    unref() never takes it below 0.
 *  - ring_owners() returns distinct members.
 * The hashing convention is documented in ring.h and is a wire contract.
 */
#include "storage/ring.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/log.h"
#include "common/util.h"

_Static_assert(RING_MEMBERS_MAX <= UINT16_MAX + 1u,
	       "member indexes are stored in uint16_t");
_Static_assert((uint64_t)RING_MEMBERS_MAX * RING_VNODES_MAX <= UINT32_MAX,
	       "vnode counts are computed in unsigned");

/* owners() with n up to this uses a linear scan of out[] to skip repeats
 * (n is the replica count, 1..3 in practice); larger n uses a bitmap so a
 * walk over many members stays linear. */
#define RING_OWNERS_LINEAR_MAX 8u

struct ring {
	uint32_t refs;      /* atomic: references held */
	uint64_t epoch;     /* membership version, set at build */
	unsigned n_members; /* members given to ring_build() */
	unsigned vnodes;    /* virtual nodes per member */
	unsigned n_points;  /* n_members * vnodes */
	uint64_t *points;   /* [n_points] ascending vnode points */
	uint16_t *owner;    /* [n_points] member index of points[k] */
	uint16_t *by_id;    /* [n_members] member indexes, ids ascending */
	uint32_t *id_off;   /* [n_members] offset of member i's id in ids */
	char *ids;          /* all ids, NUL-terminated, back to back */
	size_t ids_bytes;   /* size of ids */
};

/* One vnode while sorting; rank breaks ties between equal points. */
struct ring_vnode {
	uint64_t point;
	uint16_t rank;   /* member's position in bytewise id order */
	uint16_t member; /* member index as given */
};

/* A member while sorting ids: qsort has no context argument in C11, so the
 * element carries its id. */
struct ring_id_ref {
	const char *id;
	uint16_t member;
};

/* strcmp() orders bytes as unsigned char: the same order on every node and
 * every architecture, whatever the host's char signedness. */
static int ring_cmp_id(const void *a, const void *b)
{
	const struct ring_id_ref *ra = a, *rb = b;

	return strcmp(ra->id, rb->id);
}

static int ring_cmp_vnode(const void *a, const void *b)
{
	const struct ring_vnode *va = a, *vb = b;

	if (va->point != vb->point)
		return va->point < vb->point ? -1 : 1;
	return (int)va->rank - (int)vb->rank;
}

/* Hash one vnode's byte string: id || '#' || decimal(i). */
static uint64_t ring_vnode_point(const char *id, size_t id_len, unsigned i)
{
	char buf[RING_ID_BYTES_MAX + 1 + 10]; /* id, '#', up to 10 digits */
	char digits[10];
	size_t nd = 0, len = id_len;

	PC_DASSERT(id_len <= RING_ID_BYTES_MAX);
	memcpy(buf, id, id_len);
	buf[len++] = '#';
	do {
		digits[nd++] = (char)('0' + i % 10);
		i /= 10;
	} while (i);
	while (nd)
		buf[len++] = digits[--nd];
	return XXH3_64bits(buf, len);
}

uint64_t ring_key_point(const void *key, size_t keylen)
{
	return XXH3_64bits(key, keylen);
}

/* Check the arguments before allocating anything. */
static int ring_check_args(const char *const *members, unsigned n,
			   unsigned vnodes)
{
	if (vnodes < 1 || vnodes > RING_VNODES_MAX) {
		PC_LOGW("ring", "vnodes %u outside 1..%u", vnodes,
			RING_VNODES_MAX);
		return -EINVAL;
	}
	if (n > RING_MEMBERS_MAX) {
		PC_LOGW("ring", "%u members, limit %u", n, RING_MEMBERS_MAX);
		return -EINVAL;
	}
	if ((uint64_t)n * vnodes > RING_POINTS_MAX) {
		PC_LOGW("ring", "%u members x %u vnodes exceeds %u points", n,
			vnodes, RING_POINTS_MAX);
		return -E2BIG;
	}
	if (n && !members)
		return -EINVAL;
	for (unsigned i = 0; i < n; i++) {
		size_t len = members[i] ? strnlen(members[i],
						  RING_ID_BYTES_MAX + 1) : 0;

		if (len == 0 || len > RING_ID_BYTES_MAX) {
			PC_LOGW("ring", "member %u: id %s (1..%u bytes)", i,
				len ? "too long" : "missing or empty",
				RING_ID_BYTES_MAX);
			return -EINVAL;
		}
	}
	return 0;
}

static void ring_destroy(struct ring *r)
{
	free(r->points);
	free(r->owner);
	free(r->by_id);
	free(r->id_off);
	free(r->ids);
	free(r);
}

/* Copy the ids and sort member indexes by id; -EINVAL on a duplicate. */
static int ring_build_ids(struct ring *r, const char *const *members)
{
	unsigned n = r->n_members;
	struct ring_id_ref *refs;
	size_t total = 0;
	int rc = 0;

	for (unsigned i = 0; i < n; i++)
		total += strlen(members[i]) + 1;
	r->ids_bytes = total;
	r->ids = malloc(total ? total : 1);
	r->id_off = malloc(sizeof(*r->id_off) * (n ? n : 1));
	r->by_id = malloc(sizeof(*r->by_id) * (n ? n : 1));
	refs = malloc(sizeof(*refs) * (n ? n : 1));
	if (!r->ids || !r->id_off || !r->by_id || !refs) {
		free(refs);
		return -ENOMEM;
	}
	total = 0;
	for (unsigned i = 0; i < n; i++) {
		size_t len = strlen(members[i]) + 1;

		memcpy(r->ids + total, members[i], len);
		r->id_off[i] = (uint32_t)total;
		refs[i].id = r->ids + total;
		refs[i].member = (uint16_t)i;
		total += len;
	}
	qsort(refs, n, sizeof(*refs), ring_cmp_id);
	for (unsigned k = 0; k < n; k++) {
		if (k > 0 && strcmp(refs[k - 1].id, refs[k].id) == 0) {
			PC_LOGW("ring", "duplicate member id \"%s\"",
				refs[k].id);
			rc = -EINVAL;
			break;
		}
		r->by_id[k] = refs[k].member;
	}
	free(refs);
	return rc;
}

/* Hash every vnode, sort, and split into the two lookup arrays. */
static int ring_build_points(struct ring *r)
{
	unsigned n = r->n_members, np = r->n_points;
	struct ring_vnode *v = malloc(sizeof(*v) * (np ? np : 1));
	uint16_t *rank = calloc(n ? n : 1, sizeof(*rank));
	unsigned k = 0;

	r->points = malloc(sizeof(*r->points) * (np ? np : 1));
	r->owner = malloc(sizeof(*r->owner) * (np ? np : 1));
	if (!v || !rank || !r->points || !r->owner) {
		free(v);
		free(rank);
		return -ENOMEM;
	}
	for (unsigned j = 0; j < n; j++)
		rank[r->by_id[j]] = (uint16_t)j;
	for (unsigned m = 0; m < n; m++) {
		const char *id = r->ids + r->id_off[m];
		size_t len = strlen(id);

		for (unsigned i = 0; i < r->vnodes; i++) {
			v[k].point = ring_vnode_point(id, len, i);
			v[k].rank = rank[m];
			v[k].member = (uint16_t)m;
			k++;
		}
	}
	PC_ASSERT(k == np);
	qsort(v, np, sizeof(*v), ring_cmp_vnode);
	for (k = 0; k < np; k++) {
		/* The sort order is the lookup contract: check it, once. */
		PC_ASSERT(k == 0 || ring_cmp_vnode(&v[k - 1], &v[k]) <= 0);
		r->points[k] = v[k].point;
		r->owner[k] = v[k].member;
	}
	free(v);
	free(rank);
	return 0;
}

struct ring *ring_ref(struct ring *r)
{
	uint32_t old = __atomic_fetch_add(&r->refs, 1, __ATOMIC_RELAXED);

	PC_ASSERT(old > 0 && old < UINT32_MAX);
	return r;
}

void ring_unref(struct ring *r)
{
	uint32_t old;

	if (!r)
		return;
	old = __atomic_fetch_sub(&r->refs, 1, __ATOMIC_ACQ_REL);
	PC_ASSERT(old > 0);
	if (old == 1)
		ring_destroy(r);
}

void ring_free(struct ring *r)
{
	ring_unref(r);
}

uint64_t ring_epoch(const struct ring *r)
{
	return r->epoch;
}

unsigned ring_refs(const struct ring *r)
{
	return __atomic_load_n(&r->refs, __ATOMIC_RELAXED);
}

int ring_build(struct ring **out, const char *const *members, unsigned n,
	       unsigned vnodes)
{
	return ring_build_epoch(out, members, n, vnodes, 0);
}

int ring_build_epoch(struct ring **out, const char *const *members,
		     unsigned n, unsigned vnodes, uint64_t epoch)
{
	struct ring *r;
	int rc;

	if (!out)
		return -EINVAL;
	rc = ring_check_args(members, n, vnodes);
	if (rc < 0)
		return rc;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->refs = 1;
	r->epoch = epoch;
	r->n_members = n;
	r->vnodes = vnodes;
	r->n_points = n * vnodes;
	rc = ring_build_ids(r, members);
	if (rc == 0)
		rc = ring_build_points(r);
	if (rc < 0) {
		ring_destroy(r);
		return rc;
	}
	*out = r;
	return 0;
}

unsigned ring_size(const struct ring *r)
{
	return r->n_members;
}

unsigned ring_vnodes(const struct ring *r)
{
	return r->vnodes;
}

const char *ring_member(const struct ring *r, unsigned idx)
{
	if (idx >= r->n_members)
		return NULL;
	return r->ids + r->id_off[idx];
}

int ring_find(const struct ring *r, const char *id)
{
	unsigned lo = 0, hi = r->n_members;

	if (!id)
		return -ENOENT;
	while (lo < hi) {
		unsigned mid = lo + (hi - lo) / 2;
		int c = strcmp(r->ids + r->id_off[r->by_id[mid]], id);

		if (c == 0)
			return r->by_id[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -ENOENT;
}

/* Index of the first point >= p, or n_points when p is past the last one
 * (the caller wraps to 0). */
static unsigned ring_lower_bound(const struct ring *r, uint64_t p)
{
	unsigned lo = 0, hi = r->n_points;

	while (lo < hi) {
		unsigned mid = lo + (hi - lo) / 2;

		if (r->points[mid] < p)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

unsigned ring_owners_at(const struct ring *r, uint64_t point, unsigned n,
			unsigned *out)
{
	uint64_t seen[RING_MEMBERS_MAX / 64];
	bool use_bitmap;
	unsigned k, got = 0;

	if (n > r->n_members)
		n = r->n_members;
	if (n == 0)
		return 0;
	use_bitmap = n > RING_OWNERS_LINEAR_MAX;
	if (use_bitmap)
		memset(seen, 0, sizeof(seen[0]) * ((r->n_members + 63) / 64));
	k = ring_lower_bound(r, point);
	/* Every member owns at least one point, so one full turn finds n
	 * distinct members; the step bound only guards that invariant. */
	for (unsigned step = 0; step < r->n_points; step++, k++) {
		unsigned m, j;

		if (k == r->n_points)
			k = 0;
		m = r->owner[k];
		if (use_bitmap) {
			if (seen[m / 64] & (1ull << (m % 64)))
				continue;
			seen[m / 64] |= 1ull << (m % 64);
		} else {
			for (j = 0; j < got && out[j] != m; j++)
				;
			if (j < got)
				continue;
		}
		out[got++] = m;
		if (got == n) {
#ifndef NDEBUG /* the short lists; the bitmap walk marks as it goes */
			for (unsigned a = 0; !use_bitmap && a < got; a++)
				for (unsigned b = a + 1; b < got; b++)
					PC_ASSERT(out[a] != out[b]);
#endif
			return got;
		}
	}
	/* Unreachable while the invariants hold. */
	PC_ASSERT(got == n);
	return got;
}

unsigned ring_owners(const struct ring *r, const void *key, size_t keylen,
		     unsigned n, unsigned *out)
{
	return ring_owners_at(r, ring_key_point(key, keylen), n, out);
}

static bool ring_idx_in(const unsigned *a, unsigned n, unsigned x)
{
	for (unsigned i = 0; i < n; i++)
		if (a[i] == x)
			return true;
	return false;
}

unsigned ring_owner_moves(const struct ring *to, struct ring *const *from,
			  unsigned nfrom, uint64_t point, unsigned n,
			  unsigned *gained, unsigned *ngained, unsigned *lost,
			  unsigned *nlost, unsigned lost_cap)
{
	unsigned now[RING_MOVES_MAX], was[RING_MOVES_MAX];
	unsigned nnow, ng = 0, nl = 0, all_lost = 0;

	PC_ASSERT(n <= RING_MOVES_MAX);
	nnow = ring_owners_at(to, point, n, now);
	/* an owner is gained unless every candidate ring had it */
	bool keep[RING_MOVES_MAX] = {false};
	for (unsigned i = 0; i < nnow; i++)
		keep[i] = nfrom > 0;
	for (unsigned f = 0; f < nfrom; f++) {
		unsigned nwas = ring_owners_at(from[f], point, n, was);

		for (unsigned i = 0; i < nnow; i++) {
			const char *id = ring_member(to, now[i]);
			bool had = false;

			for (unsigned j = 0; j < nwas && !had; j++)
				had = strcmp(id, ring_member(from[f],
							     was[j])) == 0;
			keep[i] = keep[i] && had;
		}
		for (unsigned j = 0; j < nwas; j++) {
			int m = ring_find(to, ring_member(from[f], was[j]));

			if (m < 0 || ring_idx_in(now, nnow, (unsigned)m) ||
			    ring_idx_in(lost, nl, (unsigned)m))
				continue; /* left, still an owner, or seen */
			if (nl < lost_cap)
				lost[nl++] = (unsigned)m;
			else
				all_lost++;
		}
	}
	for (unsigned i = 0; i < nnow; i++)
		if (!keep[i])
			gained[ng++] = now[i];
	*ngained = ng;
	*nlost = nl;
	return nl + all_lost;
}

size_t ring_bytes(const struct ring *r)
{
	return sizeof(*r) + (size_t)r->n_points * RING_BYTES_PER_VNODE +
	       (size_t)r->n_members * (sizeof(*r->by_id) + sizeof(*r->id_off)) +
	       r->ids_bytes;
}
