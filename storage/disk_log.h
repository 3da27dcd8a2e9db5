/*
 * storage/disk_log.h — the L4 disk store's layout and bookkeeping: where a
 * page goes in the store file, which pages the store holds, which space is
 * reused next, and the self-describing on-disk format that lets a restart
 * find every page again (issue 14; docs/disk.md).
 *
 * Owns: the in-memory state of one store (regions, the key index, region
 * LRU) and the byte format of region and record headers. It does no I/O:
 * the disk tier module (modules/) reads and writes the store file with
 * io_uring and tells this file what happened. Threading: every call may
 * come from any thread; one mutex per store, held for O(1) work (never
 * across I/O, never while a callback runs, except dl_alloc's eviction
 * callback, which must not call back into the store).
 *
 * Layout: the store file is cut into regions of region_bytes (a multiple
 * of DL_BLOCK). A region is a log: a region header block, then records one
 * after the other, each a DL_HDR_BYTES header, the key, the payload, padded
 * to DL_BLOCK so every record starts on a block (O_DIRECT). One region is
 * open (being appended to); when a record does not fit, it is sealed and a
 * free region opens, or — with none free — the least recently used sealed
 * region with no I/O under way is evicted whole: its pages leave the index
 * (the callback names them) and it is reused from its start. Eviction by
 * region keeps writes sequential (the disk's best case, and what fio's
 * sequential write is measured at) and its LRU is by region: a read touches
 * its region.
 *
 * Never a wrong or stale page after a restart: every region header carries
 * the sequence number it was opened at, every record the sequence number
 * it was written at (both from one counter that only grows, persisted as
 * the records themselves); a record is valid only if its header checksum
 * holds, it lies inside its region, and its sequence is not older than its
 * region's — so records left over from the region's previous life, or a
 * header torn by a crash, end the scan of that region. The payload
 * checksum (XXH3-64) is checked on every read; a page that fails it is
 * dropped and counted, never served. What a restart can bring back: the
 * newest complete record of every key whose record was not reused — so a
 * write torn by a crash leaves the key's previous complete version, and a
 * dl_del is not persistent (nothing is written for it): a deleted page
 * whose record survives comes back, with its own bytes and generation.
 */
#ifndef PC_STORAGE_DISK_LOG_H
#define PC_STORAGE_DISK_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DL_BLOCK 4096u                  /* O_DIRECT alignment and unit */
#define DL_HDR_BYTES 64u
#define DL_REGION_HDR_MAGIC 0x52445350u /* "PSDR" little-endian */
#define DL_REC_MAGIC 0x31445350u        /* "PSD1" little-endian */
#define DL_VERSION 1u
#define DL_KEY_MAX 512u
#define DL_REGION_MIN (1u << 20)
#define DL_REGIONS_MAX (1u << 24)
/* No store reaches this sequence (one per write and region opening: 2^62
 * is millennia of writes); a header that claims more is not one of ours.
 * Accepting one would move the store's counter to where it wraps, and its
 * records would then beat every newer write at the next rebuild. */
#define DL_SEQ_MAX (1ull << 62)

/* On disk, little-endian, at the start of every region (one block). */
struct dl_region_hdr {
	uint32_t magic;     /* DL_REGION_HDR_MAGIC */
	uint16_t version;   /* DL_VERSION */
	uint16_t flags;     /* 0 */
	uint32_t region;    /* its index: a misplaced block is not this one */
	uint32_t region_bytes;
	uint64_t open_seq;  /* sequence when the region was (re)opened */
	uint8_t store_id[16]; /* the store's identity (persisted by the tier) */
	uint64_t hdr_sum;   /* XXH3-64 of the bytes before this field */
};

/* On disk, little-endian, at the start of every record; key then payload
 * follow directly. */
struct dl_rec_hdr {
	uint32_t magic;     /* DL_REC_MAGIC */
	uint16_t version;   /* DL_VERSION */
	uint16_t klen;      /* 1..DL_KEY_MAX */
	uint32_t len;       /* payload bytes */
	uint32_t total;     /* bytes of the record on disk, block-padded */
	uint64_t gen;       /* the producer's page generation */
	uint64_t seq;       /* store sequence when written */
	uint64_t sum;       /* XXH3-64 of the payload */
	uint8_t pad[16];
	uint64_t hdr_sum;   /* XXH3-64 of the bytes before this field */
};

/* Where a page is, as the index knows it. */
struct dl_loc {
	uint64_t off;       /* of the record header in the store file */
	uint32_t total;     /* record bytes on disk */
	uint32_t len;       /* payload bytes */
	uint64_t gen;
	uint64_t sum;       /* payload checksum */
	uint64_t seq;       /* store sequence it was written at */
	uint32_t region;
};

struct dl_params {
	uint64_t capacity;     /* bytes of the store file (regions fill it) */
	uint32_t region_bytes; /* multiple of DL_BLOCK, >= DL_REGION_MIN */
	uint8_t store_id[16];
};

struct dl_stats {
	uint32_t regions, free_regions;
	uint64_t keys, bytes_live; /* payload bytes indexed */
	uint64_t bytes_used;       /* record bytes of indexed records */
	uint64_t evicted_regions, evicted_keys;
	uint64_t seq;
};

struct dlog;

/* Bytes a record of a klen-byte key and len-byte payload takes on disk. */
uint64_t dl_record_bytes(size_t klen, uint64_t len);

/* 0, or -EINVAL (capacity below two regions, bad region size, too many
 * regions) or -ENOMEM. Every region starts free. */
int dl_new(struct dlog **out, const struct dl_params *p);
void dl_free(struct dlog *d);

/* Evicted pages, one call each, store mutex held: do not call back. */
typedef void (*dl_evict_fn)(void *arg, const char *key, size_t klen,
			    uint64_t gen);

/*
 * Reserve room for a record of `bytes` (dl_record_bytes) in the open
 * region: *off is where it goes; *region_hdr_off is set to the region's
 * start when a region was (re)opened for it — the caller writes the region
 * header (dl_region_hdr_encode) there before the record, else UINT64_MAX.
 * The region holds an I/O reference until dl_commit or dl_abort. *seq is
 * the record's sequence. -E2BIG: larger than a region; -EBUSY: every
 * region is open or has I/O under way (the page is not stored).
 */
int dl_alloc(struct dlog *d, uint64_t bytes, uint64_t *off, uint64_t *seq,
	     uint64_t *region_hdr_off, uint64_t *region_open_seq,
	     dl_evict_fn evict, void *arg);

/* The record at off was written (and, if asked, synced): index it. An
 * older record of the key leaves the index. Drops the I/O reference. */
int dl_commit(struct dlog *d, const char *key, size_t klen,
	      const struct dl_loc *loc);

/* The write at off failed: drop the I/O reference (the space stays
 * unused until the region is reused). */
void dl_abort(struct dlog *d, uint64_t off);

/* The same for a write that carried its region's header: the header may
 * not be on disk, so the region takes no further record (it is sealed as
 * it is, and opened again — with a header — when it is reused). */
void dl_abort_header(struct dlog *d, uint64_t off);

/* Look key up; on a hit, take an I/O reference on its region (released
 * with dl_put) and mark the region used now. */
bool dl_get(struct dlog *d, const char *key, size_t klen, struct dl_loc *out);
void dl_put(struct dlog *d, uint32_t region);

/* Is key indexed (no reference, no LRU touch)? */
bool dl_has(struct dlog *d, const char *key, size_t klen);

/* Remove key's record if it is generation gen (0: any). true if removed. */
bool dl_del(struct dlog *d, const char *key, size_t klen, uint64_t gen);

/* The page the record at seq holds is now known to the pool as generation
 * gen (a promotion gave it a new one): the index answers gen from now on
 * (the record's own header keeps the generation it was written with; a
 * read checks the record by its sequence). true if key is at seq. */
bool dl_retag(struct dlog *d, const char *key, size_t klen, uint64_t seq,
	      uint64_t gen);

/*
 * Walk the index a slice at a time (the warm restart re-announces what the
 * store holds): at most max entries from *cursor (0 starts a walk), each
 * passed to fn with the store mutex held — fn copies what it needs and does
 * not call back into the store. 1 with *cursor advanced while entries
 * remain, 0 once the walk is over. Not a snapshot: entries written or
 * evicted meanwhile may be seen or missed. Cost per call: O(max) plus the
 * entries of the cursor's region before it.
 */
typedef void (*dl_scan_fn)(void *arg, const char *key, size_t klen,
			   const struct dl_loc *loc);
int dl_scan(struct dlog *d, uint64_t *cursor, unsigned max, dl_scan_fn fn,
	    void *arg);

void dl_stats(struct dlog *d, struct dl_stats *out);

/* ---- the on-disk format ----------------------------------------------- */

void dl_region_hdr_encode(const struct dlog *d, uint32_t region,
			  uint64_t open_seq, void *block);
void dl_rec_hdr_encode(void *out, size_t klen, uint64_t len, uint64_t gen,
		       uint64_t seq, uint64_t sum);
/* 0 and the fields, or -EINVAL: not a valid header of this store (a
 * sequence above DL_SEQ_MAX included). */
int dl_region_hdr_decode(const struct dlog *d, uint32_t region,
			 const void *block, uint64_t *open_seq);
int dl_rec_hdr_decode(const void *p, struct dl_rec_hdr *out);
/* The read path's check of a record read back whole (n bytes from loc's
 * offset): a valid header of key's record, with the length, sequence and
 * payload checksum the index knows (loc), inside the n bytes. 0 and *out
 * (the payload is at DL_HDR_BYTES + klen; its checksum is the caller's to
 * verify), or -EBADMSG. */
int dl_rec_check(const void *rec, size_t n, const char *key, size_t klen,
		 const struct dl_loc *loc, struct dl_rec_hdr *out);

/*
 * Rebuild: the caller read region `region` (its first `n` bytes, n a
 * multiple of DL_BLOCK, from its start) into buf. Every valid record in it
 * is indexed (a newer sequence of a key wins across regions), checked
 * against its payload checksum when verify is set (a record that fails is
 * counted in *bad and skipped); the region becomes sealed, with its LRU
 * stamp from its newest record, or stays free if it holds none. The store
 * sequence moves past everything seen. Returns the records indexed.
 */
int dl_rebuild_region(struct dlog *d, uint32_t region, const void *buf,
		      size_t n, bool verify, unsigned *bad);

uint32_t dl_regions(const struct dlog *d);
uint32_t dl_region_bytes(const struct dlog *d);

#endif /* PC_STORAGE_DISK_LOG_H */
