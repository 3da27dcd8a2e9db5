/*
 * storage/ring.h — the consistent-hash ring (DESIGN.md §4 "Ring").
 *
 * Every node builds the same ring from the same member list on its own, so
 * writers and readers agree on a key's owners without talking. That only
 * holds if every node hashes exactly the same bytes; the convention is part
 * of the cluster's compatibility contract and must never change silently:
 *
 *   vnode point (member id, i) = XXH3_64bits(id bytes || '#' || decimal(i))
 *       id bytes: the member id without its terminating NUL;
 *       decimal(i): i in base 10, ASCII, no sign, no leading zeros
 *       ("0", "1", ..., "159"), for i in [0, vnodes); seed 0.
 *       Example: member "10.0.0.1:31999", vnode 7 hashes the 16 bytes
 *       "10.0.0.1:31999#7".
 *   key point = XXH3_64bits(key bytes), seed 0.
 *
 * A key belongs to the first vnode whose point is >= the key point, walking
 * clockwise and wrapping past UINT64_MAX to the smallest point. Vnodes with
 * equal points (a 64-bit collision) are ordered by member id, compared
 * bytewise as unsigned char, so the order never depends on the input order.
 * The vnode byte string is injective: decimal(i) never contains '#', so the
 * last '#' always separates the id from i, whatever the id contains.
 *
 * Concurrency: a ring is immutable once ring_build() returns, so any number
 * of threads may read one ring without locks. A membership change builds a
 * new ring, with a higher epoch, and publishes it as a whole by swapping a
 * pointer (release store, acquire load); nothing ever edits a published
 * ring. Lifetime is a reference count: ring_build() returns the builder's
 * reference, ring_ref() takes another, ring_unref() (or ring_free(), the
 * same call) drops one and the last one frees. Who may read a pointer it
 * holds no reference on is the publisher's rule (modules/membership.h: for
 * the rest of the reactor callback that loaded it); anything kept across a
 * round trip holds a reference. Nothing here allocates or locks after
 * ring_build(); ref and unref are one atomic each.
 *
 * Cost: a lookup is one XXH3 of the key, a binary search over the sorted
 * points (O(log V), V = members x vnodes) and a short clockwise walk to
 * collect distinct members. Memory: RING_BYTES_PER_VNODE (10) bytes per
 * vnode plus the member ids.
 */
#ifndef PC_STORAGE_RING_H
#define PC_STORAGE_RING_H

#include <stddef.h>
#include <stdint.h>

/* Default virtual nodes per member: with 160 the most loaded member carries
 * about 1.05x / 1.15x / 1.23x the mean load with 3 / 10 / 100 members
 * (tests/unit/test_ring.c "balance"); 16 vnodes would give 1.2 / 1.4 / 1.7. */
#define RING_VNODES_DEFAULT 160u
/* More vnodes smooth the load further but cost memory and build time;
 * beyond a few thousand the gain is lost in the noise of real key sets. */
#define RING_VNODES_MAX 4096u
/* Member ids are RPC endpoints ("host:port"); 255 bytes bounds the on-stack
 * hashing buffer and matches the longest DNS name. */
#define RING_ID_BYTES_MAX 255u
/* Member indexes are stored in 16 bits; 4096 nodes is far past any cluster
 * this server is built for, and bounds the owners() scratch bitmap. */
#define RING_MEMBERS_MAX 4096u
/* Total vnodes (members x vnodes) in one ring: 4M points is 40 MiB, which
 * bounds what a bad configuration can make every node allocate. */
#define RING_POINTS_MAX (1u << 22)
/* Bytes per vnode: a 64-bit point plus a 16-bit member index, stored as two
 * parallel arrays so the binary search touches only the points. */
#define RING_BYTES_PER_VNODE (sizeof(uint64_t) + sizeof(uint16_t))

struct ring;

/*
 * Build a ring of n members with `vnodes` virtual nodes each. members[i] is
 * a NUL-terminated id of 1..RING_ID_BYTES_MAX bytes; it is copied, and i is
 * the member's index in every answer of this ring. n == 0 builds an empty
 * ring (ring_owners() then returns 0).
 * Returns 0 and sets *out, or -EINVAL (NULL/empty/over-long or duplicate
 * id, n > RING_MEMBERS_MAX, vnodes outside 1..RING_VNODES_MAX), -E2BIG
 * (n x vnodes > RING_POINTS_MAX) or -ENOMEM. On error *out is untouched.
 */
int ring_build(struct ring **out, const char *const *members, unsigned n,
	       unsigned vnodes);

/* The same, with an epoch: the membership version this ring is (the
 * publisher's counter, monotonic; ring_build() gives epoch 0). */
int ring_build_epoch(struct ring **out, const char *const *members,
		     unsigned n, unsigned vnodes, uint64_t epoch);

/* Take a reference on r (one atomic increment); returns r. The caller must
 * already hold a reference, or be inside the publisher's grace rule, so the
 * count is never 0 here (asserted). */
struct ring *ring_ref(struct ring *r);

/* Drop a reference; the last one frees the ring. NULL is a no-op. The count
 * never goes below zero (asserted). */
void ring_unref(struct ring *r);

/* Drop the builder's reference: ring_unref() under its older name. */
void ring_free(struct ring *r);

/* The epoch given to ring_build_epoch() (0 for ring_build()). */
uint64_t ring_epoch(const struct ring *r);

/* References held now (a snapshot, for tests and assertions). */
unsigned ring_refs(const struct ring *r);

/* Number of members. */
unsigned ring_size(const struct ring *r);

/* Virtual nodes per member the ring was built with. */
unsigned ring_vnodes(const struct ring *r);

/* Member id at idx (as given to ring_build), or NULL when idx is out of
 * range. The string lives as long as the ring. */
const char *ring_member(const struct ring *r, unsigned idx);

/* Index of the member with this id, or -ENOENT. O(log n). */
int ring_find(const struct ring *r, const char *id);

/* The point a key hashes to: XXH3_64bits(key, keylen), seed 0. */
uint64_t ring_key_point(const void *key, size_t keylen);

/*
 * The first n distinct members clockwise from the key's point, primary
 * owner first. Writes min(n, ring_size(r)) member indexes to out (which
 * must have room for that many) and returns how many it wrote.
 */
unsigned ring_owners(const struct ring *r, const void *key, size_t keylen,
		     unsigned n, unsigned *out);

/* Same, for a key point already computed with ring_key_point(): lets a
 * caller that needs the hash for something else hash the key once. */
unsigned ring_owners_at(const struct ring *r, uint64_t point, unsigned n,
			unsigned *out);

/*
 * How a key's owners moved between rings. The key (at point) may have been
 * placed against any ring of from[0..nfrom) (a change that came during an
 * earlier move leaves several candidates). gained: the first n owners under
 * `to` that are not among the first n owners under every ring of from — the
 * owners that may lack the key's record. lost: members of `to` that were
 * among the first n owners under some ring of from but are not owners under
 * `to` — they may hold a record nobody asks them for. Both are indexes in
 * `to`, without repeats; gained has room for n (at most min(n, size of to)
 * are written), lost for lost_cap (extra ones are dropped; the return value
 * counts them all). Members that left (not in `to`) are never lost: nobody
 * can reach them. n is at most RING_MOVES_MAX. Returns *nlost plus the
 * lost members dropped for want of room (one dropped member may count once
 * per ring of from): more than *nlost means some were not reported.
 */
#define RING_MOVES_MAX 16u
unsigned ring_owner_moves(const struct ring *to, struct ring *const *from,
			  unsigned nfrom, uint64_t point, unsigned n,
			  unsigned *gained, unsigned *ngained, unsigned *lost,
			  unsigned *nlost, unsigned lost_cap);

/* Heap bytes this ring holds (points, indexes, ids and bookkeeping), for
 * the memory metric. */
size_t ring_bytes(const struct ring *r);

#endif /* PC_STORAGE_RING_H */
