/*
 * modules/kv.h — moving pages in and out of p2p mode, for other modules.
 *
 * Owns: the interface the kv module (modules/kv.c) offers through
 * ctx->svc.kv. The RPC methods kv.* and the local-client sessions
 * (modules/session.c) both use it. Threading: calls are made on a reactor
 * thread and complete on it.
 */
#ifndef PC_MODULES_KV_H
#define PC_MODULES_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "reactor/reactor.h"

/* A page: its key and the memory its bytes come from or go to. */
struct kv_item {
	const char *key;
	size_t klen;
	void *data;   /* publish: the source; fetch: the destination */
	uint64_t len; /* publish: bytes to store; fetch: the page size wanted */
};

/* Per-item outcome, ok[i], and the bytes the node copied with its CPU. */
typedef void (*kv_done_fn)(void *arg, const bool *ok, unsigned n);

struct kv_api {
	/*
	 * Store pages: one copy each into the publish pool, then their records
	 * go to the directory; done runs when that finished. A key already in
	 * the pool counts as stored. !client_mem: the copies are done before
	 * this returns (the sources may be reused at once). client_mem: the
	 * sources are a client's shared memory, copied in slices over loop
	 * passes (modules/copier.h) and guarded against it shrinking; the
	 * items (keys and sources) must stay valid until done runs.
	 */
	int (*publish)(struct rx_reactor *r, const struct kv_item *items,
		       unsigned n, bool client_mem, kv_done_fn done, void *arg);
	/*
	 * Fetch pages of known size into their destinations: a local page is
	 * one copy (client_mem: in slices); a remote one is read straight into the destination and
	 * validated there. A page of another size is a miss. Destinations must
	 * stay valid until done runs.
	 */
	int (*fetch)(struct rx_reactor *r, const struct kv_item *items,
		     unsigned n, bool client_mem, kv_done_fn done, void *arg);
	/* How many leading keys exist (data unused). */
	int (*exists)(struct rx_reactor *r, const struct kv_item *items,
		      unsigned n, void (*done)(void *arg, unsigned count),
		      void *arg);
	/* Delete pages here and their records everywhere; ok[i] = existed. */
	int (*remove)(struct rx_reactor *r, const struct kv_item *items,
		      unsigned n, kv_done_fn done, void *arg);
};

#endif /* PC_MODULES_KV_H */
