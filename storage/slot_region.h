/*
 * storage/slot_region.h — the slotmap mode's slot region: where a key's
 * page lives without a directory, the slot format that lets one read of a
 * bucket prove a page is whole and is the key's, and the owner's local
 * writes, reads and deletes (issue 15; DESIGN §4).
 *
 * Owns: the layout arithmetic (size classes, buckets, ways, strides), the
 * key and bucket hashes, the 64-byte slot header and its trailer, the
 * validation of a snapshot of a slot (what a remote reader does on the
 * bytes one READ brought), and, for the node that owns a region, a
 * seqlock-style write/read/delete over the region's memory with one lock
 * per bucket. It does no I/O and allocates only its lock table: the
 * region's memory is given by the caller (registered through a transport
 * so peers can read it). Threading: any thread; writers of one bucket are
 * serialised by the bucket's lock, which is held for O(ways) work only,
 * never across a payload copy (a write is begin → copy → commit).
 *
 * Layout. A region holds one or more size classes, each a run of buckets
 * of `ways` slots of `stride` bytes: stride = align64(64-byte header +
 * max payload + 8-byte trailer). A page goes to the smallest class whose
 * max payload holds it; its bucket is a hash of the key independent of the
 * consistent-hash ring's, so a reader finds it with one READ of
 * ways × stride bytes at (class offset + bucket × ways × stride).
 *
 * The slot. [header 64 B][payload][... padding][trailer u64 at stride-8].
 * The header holds magic, version, the key's 128-bit hash, payload length,
 * a sequence that is odd while the slot is being written and grows by two
 * per write, a write stamp (the region's clock, for "oldest" eviction) and
 * a checksum that binds the key hash, the length and the payload's XXH3
 * together. The trailer is the sequence again, written last.
 *
 * Never a torn or foreign page. A snapshot is accepted only if: magic and
 * version are right, the sequence is even and non-zero, the trailer equals
 * it, the key hash is the wanted key's, the length is the wanted one (or
 * fits the class, when the caller does not know it), and the checksum of
 * (key hash, length, payload) equals the header's. Fields read from two
 * different writes cannot pass the last check unless the payload is the
 * key's own complete page (a 64-bit checksum: a false accept is 2^-64 per
 * torn read), so a reader that copied a slot while a writer was at work
 * either rejects it or holds bytes the key really had. The sequence and
 * trailer make the common in-progress cases cheap to reject; the checksum
 * is the proof. Readers never trust a header alone (the original's dirty
 * hits).
 */
#ifndef PC_STORAGE_SLOT_REGION_H
#define PC_STORAGE_SLOT_REGION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SLOT_HDR_BYTES 64u
#define SLOT_TRAILER_BYTES 8u
#define SLOT_MAGIC 0x31534350u /* "PCS1" little-endian */
#define SLOT_VERSION 1u
#define SLOT_CLASSES_MAX 8u
#define SLOT_WAYS_MAX 64u
#define SLOT_PAYLOAD_MIN 4096u
#define SLOT_PAYLOAD_MAX (1ull << 30)

/* The header at the start of every slot, little-endian (x86-64 native). */
struct slot_hdr {
	uint32_t magic;   /* SLOT_MAGIC, 0 for a slot never written */
	uint16_t version; /* SLOT_VERSION */
	uint16_t flags;   /* 0 */
	uint64_t seq;     /* odd: being written; +2 per write; 0: never */
	uint64_t key_lo;  /* 128-bit hash of the key (slot_key_of) */
	uint64_t key_hi;
	uint64_t len;   /* payload bytes */
	uint64_t stamp; /* the owner's write clock: smaller is older */
	uint64_t sum;   /* slot_sum(key, len, payload) */
	uint64_t rsvd;  /* 0 */
};
_Static_assert(sizeof(struct slot_hdr) == SLOT_HDR_BYTES, "slot header");

/* A key as the slotmap sees it: its 128-bit hash and its bucket hash. */
struct slot_key {
	uint64_t lo, hi;
	uint64_t bucket_hash; /* independent of lo/hi and of the ring's hash */
};
void slot_key_of(struct slot_key *k, const void *key, size_t klen);

/* One size class as configured: max payload bytes, ways, and either a
 * bucket count or a share of the region (per mille) to derive it from. */
struct slot_class_spec {
	uint64_t max_payload;
	uint32_t ways;
	uint64_t buckets;  /* 0: derive from share_pm */
	uint32_t share_pm; /* of the region's bytes, 1..1000 */
};

/* One size class as laid out. */
struct slot_class {
	uint64_t max_payload;
	uint32_t ways;
	uint64_t buckets;
	uint64_t stride; /* bytes per slot */
	uint64_t offset; /* of its first bucket, from the region's base */
};

struct slot_layout {
	uint32_t nclasses; /* classes sorted by max_payload, ascending */
	struct slot_class cls[SLOT_CLASSES_MAX];
	uint64_t bytes; /* the region's size: the end of the last class */
};

/* Lay out n class specs in at most region_bytes. Refused (-EINVAL, and a
 * reason in why when not NULL) if a class is out of range (payload below
 * SLOT_PAYLOAD_MIN or above SLOT_PAYLOAD_MAX, ways 0 or above
 * SLOT_WAYS_MAX, shares summing above 1000, two classes of one size) or
 * ends up with no bucket. */
int slot_layout_plan(struct slot_layout *l, uint64_t region_bytes,
		     const struct slot_class_spec *specs, unsigned n,
		     const char **why);

/* The stride of a slot for max_payload bytes. */
uint64_t slot_stride_for(uint64_t max_payload);

/* The class a page of len bytes goes to: its index, or -E2BIG. */
int slot_class_for(const struct slot_layout *l, uint64_t len);
/* The class whose buckets hold byte off of the region: its index, or
 * -EFAULT (past the last class's whole buckets). */
int slot_class_at(const struct slot_layout *l, uint64_t off);

static inline uint64_t slot_bucket_bytes(const struct slot_class *c)
{
	return (uint64_t)c->ways * c->stride;
}

/* Byte offset (from the region's base) of key's bucket in class c. */
uint64_t slot_bucket_off(const struct slot_class *c,
			 const struct slot_key *k);

/* The checksum a slot's header holds for (key, len, payload). */
uint64_t slot_sum(const struct slot_key *k, uint64_t len,
		  const void *payload);
/* The same from the payload's hash (pc_page_sum, XXH3-64 of its bytes),
 * for callers that hashed it while copying. */
uint64_t slot_sum_hashed(const struct slot_key *k, uint64_t len,
			 uint64_t payload_hash);

/* What a snapshot of one slot says about a key. */
enum slot_verdict {
	SLOT_HIT,   /* the key's whole page */
	SLOT_EMPTY, /* never written, or deleted */
	SLOT_BUSY,  /* a write is under way (odd sequence) */
	SLOT_OTHER, /* another key's page (or its header: not checked) */
	SLOT_BAD,   /* the key's hash, but rejected: torn (trailer or
		     * checksum), a wrong length, or a malformed header */
};

/* Judge a snapshot of one slot of class c (stride bytes at slot) for key
 * k. want_len: the page's expected length, or 0 for any length up to the
 * class's max payload. On SLOT_HIT, *len (if not NULL) is its length and
 * the payload starts SLOT_HDR_BYTES into the slot. check_sum false skips
 * the checksum: only for the negative control of the tests, never on a
 * read path (a torn snapshot can then pass). */
enum slot_verdict slot_judge(const void *slot, const struct slot_class *c,
			     const struct slot_key *k, uint64_t want_len,
			     bool check_sum, uint64_t *len);

/* Judge a selection: the n bytes an owner sent for key k instead of its
 * bucket (slot_pick) — one way's header and payload, then its trailer, or
 * nothing (n == 0: SLOT_EMPTY). The same checks as slot_judge, and the
 * size must be the header's length plus header and trailer; on SLOT_HIT
 * the payload starts SLOT_HDR_BYTES into sel. */
enum slot_verdict slot_judge_sel(const void *sel, uint64_t n,
				 const struct slot_class *c,
				 const struct slot_key *k, uint64_t want_len,
				 bool check_sum, uint64_t *len);

/* Counts of a bucket scan. */
struct slot_scan {
	unsigned rejected; /* SLOT_BAD snapshots of the key */
	unsigned busy;     /* slots of the key being written */
};

/* Find key k in a snapshot of its whole bucket (one READ's bytes): the way
 * of a hit (>= 0; its payload at bucket + way*stride + SLOT_HDR_BYTES),
 * or -ENOENT. sc (optional) counts what was rejected on the way. */
int slot_find(const void *bucket, const struct slot_class *c,
	      const struct slot_key *k, uint64_t want_len, bool check_sum,
	      uint64_t *len, struct slot_scan *sc);

/* ---- The owner's region ---- */

struct slot_region;

/* A region over base (layout l's bytes, zeroed by the caller or fresh
 * anonymous memory). 0 or -ENOMEM. */
int slot_region_new(struct slot_region **out, void *base,
		    const struct slot_layout *l);
void slot_region_free(struct slot_region *s);
const struct slot_layout *slot_region_layout(const struct slot_region *s);
void *slot_region_base(const struct slot_region *s);

/* A write in progress: begin claims a way and marks it busy, the caller
 * copies len bytes to payload (any thread, any time, in slices if it
 * likes), then commit publishes it — or abort gives the way back empty. */
struct slot_wr {
	struct slot_key key;
	uint32_t cls, way;
	uint64_t bucket; /* index within the class */
	uint64_t len;
	uint64_t seq; /* the odd sequence of this write */
	void *payload;
};

/* Claim a way for key's page of len bytes: same key (not busy), else an
 * empty way, else the oldest idle way (by stamp). -E2BIG: no class holds
 * len; -EBUSY: every way of the bucket is being written. */
int slot_write_begin(struct slot_region *s, const struct slot_key *k,
		     uint64_t len, struct slot_wr *w);
/* Publish w: checksum, header, trailer, even sequence; other idle ways of
 * the bucket that hold the same key are emptied (the newest write wins, a
 * key is in one way). */
void slot_write_commit(struct slot_region *s, struct slot_wr *w);
void slot_write_abort(struct slot_region *s, struct slot_wr *w);
/* Commit with the payload's hash given (pc_page_sum of the bytes the
 * writer meant to write, taken from its own source while copying, or sent
 * by a remote writer): if the bytes in the slot are not those, readers
 * reject the page (a late or partial write never passes as the key's). */
void slot_write_commit_hashed(struct slot_region *s, struct slot_wr *w,
			      uint64_t payload_hash);

/* begin + copy + commit of a contiguous page, for callers that copy
 * inline (small pages, tests). */
int slot_write(struct slot_region *s, const struct slot_key *k,
	       const void *page, uint64_t len);

/* Read key's page into dst (cap bytes) on the owner: a seqlock read that
 * retries a few times if a writer moved the slot under it, and accepts
 * the copy only if its checksum is the header's (slot_loc_sum_ok).
 * want_len as in slot_judge. Returns the length (>= 0), -ENOENT (absent,
 * busy, or rejected by the checksum), -EAGAIN (kept moving), -ENOSPC (cap
 * too small). */
int64_t slot_read(struct slot_region *s, const struct slot_key *k,
		  uint64_t want_len, void *dst, uint64_t cap);

/* Where key's committed page is, for a copy the caller makes itself (in
 * slices, over loop passes): check slot_loc_still after the copy — the
 * bytes copied are one commit's only if no write touched the slot since —
 * and slot_loc_sum_ok on the copy's hash. A committed page is one whose
 * sequence is even and whose trailer equals it. That alone does not prove
 * the payload: a remote writer's commit carries the hash of the bytes it
 * meant to write, and a stale WRITE (from a writer whose claim ended, the
 * way since claimed by another) can land in a claimed way before its
 * commit, so the owner's readers check the checksum as remote ones do.
 * Returns the length, or -ENOENT. */
struct slot_loc {
	uint8_t *slot;
	const uint8_t *payload;
	uint64_t seq, len;
	uint64_t sum; /* the header's checksum */
};
int64_t slot_locate(struct slot_region *s, const struct slot_key *k,
		    uint64_t want_len, struct slot_loc *loc);
bool slot_loc_still(const struct slot_loc *loc);
/* Is payload_hash (pc_page_sum of a copy of loc's payload) the page the
 * header's checksum names? */
bool slot_loc_sum_ok(const struct slot_key *k, const struct slot_loc *loc,
		     uint64_t payload_hash);

/* What an owner sends for a selected read of one bucket (a narrowed
 * READ): the way holding a committed page of the key — its header and
 * payload (SLOT_HDR_BYTES + len bytes at slot_off), then its trailer (8
 * bytes at slot_off + trailer_off). Offsets are from the region's base. */
struct slot_sel {
	uint64_t slot_off, len, trailer_off;
};
/* The selection for key hash (key_lo, key_hi) of [off, off+n): 1 and *out,
 * 0 when no way of the bucket holds a committed page of the key (send
 * nothing), -EINVAL when the range is not exactly one bucket (send it
 * whole). The headers are read without the bucket's lock: a write racing
 * the send is caught by the reader's checks (slot_judge_sel). */
int slot_pick(struct slot_region *s, uint64_t off, uint64_t n,
	      uint64_t key_lo, uint64_t key_hi, struct slot_sel *out);

/* Does the region hold key's whole page (the full check, checksum
 * included)? want_len as in slot_judge. */
bool slot_exists(struct slot_region *s, const struct slot_key *k,
		 uint64_t want_len);

/* Empty every idle way that holds key, in every class. Returns how many. */
int slot_del(struct slot_region *s, const struct slot_key *k);

/* Counters (monotonic, any thread). */
struct slot_stats {
	uint64_t writes, evictions, busy_refusals, deletes;
	uint64_t read_retries, read_rejects;
};
void slot_region_stats(const struct slot_region *s, struct slot_stats *st);

#endif /* PC_STORAGE_SLOT_REGION_H */
