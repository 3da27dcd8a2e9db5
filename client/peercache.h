/*
 * peercache.h — the PeerCache client library (libpeercache).
 *
 * A local process (an inference worker) talks to the peercached node on its
 * host through the node's Unix socket. KV bytes never travel through the
 * socket: the process shares memory with the node (a memfd), and names pages
 * by (key, offset, length) inside it. A set copies the page once into the
 * node's publish pool; a get lands a remote page straight in the shared
 * memory (or copies a local one once).
 *
 * Thread safety: every function may be called from many threads at once on
 * one struct pcache. Each call leases its own connection from a small pool
 * (a connection that failed is closed, never reused); no lock is held
 * across a call. Calls block until the node answered or the timeout passed.
 *
 * Errors: functions return 0 or a negative errno: -ENOENT/-ECONNREFUSED
 * (no node at the socket), -ETIMEDOUT, -EACCES (refused by the node),
 * -EREMOTEIO (the node answered with an error; pcache_last_error() tells
 * which, for this thread), -EINVAL (bad arguments), -ENOMEM.
 */
#ifndef PEERCACHE_H
#define PEERCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PCACHE_VERSION_MAJOR 0
#define PCACHE_VERSION_MINOR 1

#define PCACHE_KEY_MAX 512      /* bytes of a key */
#define PCACHE_BATCH_MAX 65536  /* items per call */
#define PCACHE_REGIONS_MAX 64   /* regions per struct pcache */

struct pcache;

struct pcache_opts {
	const char *socket_path; /* NULL: $PEERCACHE_SOCKET, else the default
				    /run/peercache/peercached.sock */
	unsigned timeout_ms;     /* per call; 0: 30000 */
	unsigned max_idle;       /* pooled idle connections; 0: 8 */
};

/* Open a client (connects lazily: the first call reaches the node). */
int pcache_open(const struct pcache_opts *opts, struct pcache **out);
/* Close every connection; the node drops their registrations. */
void pcache_close(struct pcache *pc);

/* Human-readable text of the last -EREMOTEIO of the calling thread. */
const char *pcache_last_error(void);

/*
 * Share memory with the node. fd: a memfd (or any shared-memory file) of at
 * least size bytes; the library keeps its own duplicate, so the caller may
 * close fd. *region names it in later calls. Regions are registered on each
 * connection when first used there.
 */
int pcache_region_add(struct pcache *pc, int fd, uint64_t size,
		      uint32_t *region);
/* Create a memfd of size bytes, map it, and add it; *addr is the mapping
 * (unmapped by pcache_region_remove or pcache_close). */
int pcache_region_create(struct pcache *pc, uint64_t size, void **addr,
			 uint32_t *region);
int pcache_region_remove(struct pcache *pc, uint32_t region);

/* One page: key, and its bytes at [offset, offset + len) of a region. */
struct pcache_item {
	const char *key;
	size_t keylen;
	uint64_t offset;
	uint64_t len;
};

/*
 * Store pages from a region (one copy each into the node's pool; the bytes
 * may be reused when this returns). ok[i]: stored (or already there).
 */
int pcache_set(struct pcache *pc, uint32_t region,
	       const struct pcache_item *items, size_t n, bool *ok);
/* Fetch pages into a region; ok[i]: the page of exactly len bytes landed. */
int pcache_get(struct pcache *pc, uint32_t region,
	       const struct pcache_item *items, size_t n, bool *ok);
/* How many leading keys exist. */
int pcache_exists(struct pcache *pc, const char *const *keys,
		  const size_t *keylens, size_t n, size_t *count);
/* Delete; *count = how many existed. */
int pcache_delete(struct pcache *pc, const char *const *keys,
		  const size_t *keylens, size_t n, size_t *count);

/* node.info as "key: value" lines (NUL-terminated, cut to len). */
int pcache_info(struct pcache *pc, char *buf, size_t len);

/* What this client did (cumulative, all threads). */
struct pcache_stats {
	uint64_t calls;
	uint64_t errors;
	uint64_t pages_set, pages_set_ok;
	uint64_t pages_get, pages_get_ok;
	uint64_t bytes_set, bytes_got;
	uint64_t registrations; /* region registrations sent */
	uint64_t connections;   /* connections opened */
};
void pcache_stats(struct pcache *pc, struct pcache_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* PEERCACHE_H */
