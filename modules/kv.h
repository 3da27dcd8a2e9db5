/*
 * modules/kv.h — moving pages in and out of the node, for other modules.
 *
 * Owns: the interface the "kv" service (modules/services.h) offers: the
 * kv module (modules/kv.c) publishes it in p2p mode, the mode's own module
 * in another. The RPC methods kv.* (module kv_rpc, modules/kv_rpc.c) and
 * the local-client sessions (modules/session.c) both use it and nothing
 * else of its provider. Threading: calls are made on a reactor thread and complete on it.
 *
 * Memory: each call makes one allocation for its own state (an arena,
 * common/arena.h), plus one for the records (and reads) of the keys it
 * looks up when this node's pool did not have them all, and, for get, at
 * most two for the pages it stages.
 */
#ifndef PC_MODULES_KV_H
#define PC_MODULES_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/blocks.h"
#include "reactor/reactor.h"

/* A page: its key and the memory its bytes come from or go to. */
struct kv_item {
	const char *key;
	size_t klen;
	void *data;   /* publish: the source; fetch: the destination */
	uint64_t len; /* publish: bytes to store; fetch: the page size wanted */
};

/*
 * The most items a caller should hand one kv API call. What a call does
 * in single callbacks grows with its items (checking and copying its keys
 * at its start, the bookkeeping of its last slice, a get's reply): ~0.1-0.3
 * ms at this many, over 1 ms at 65,536. The kv.* methods (kv_rpc.c) and
 * the local sessions (session.c) cut larger batches into steps of at most
 * this many, each started on a loop pass of its own.
 */
#define KV_STEP_KEYS 4096

/* Where publish's sources are and how long they stay valid. */
enum kv_src {
	KV_SRC_NOW,    /* valid during the call only: copied before publish
			* returns (the sources may be reused at once) */
	KV_SRC_KEPT,   /* node memory valid until done (a request kept with
			* rpc_call_keep_request): copied in slices over loop
			* passes (modules/copier.h) */
	KV_SRC_CLIENT, /* a client's shared memory, valid until done: in
			* slices, guarded against the client shrinking it */
};

/* Per-item outcome, ok[i], and the bytes the node copied with its CPU. */
typedef void (*kv_done_fn)(void *arg, const bool *ok, unsigned n);
/* publish reads its items no more (kv_api.publish). */
typedef void (*kv_freed_fn)(void *arg);

/* What a get found: page i is data[i] (len[i] bytes) when ok[i]. Valid
 * until the done callback returns, unless it takes the blocks they are in
 * (stage). */
struct kv_got {
	unsigned n;
	const bool *ok;
	const uint64_t *len;
	uint8_t *const *data;
	uint64_t staged;  /* page bytes staged for the call */
	int refused;      /* 0; -E2BIG: the pages exceed the call's stage_max;
			   * -EBUSY: the node's kv_staging_max is in use */
	/* The blocks every data[i] is in. The done callback may move them
	 * out (copy *stage, then empty it): data[] then stays valid until
	 * it gives them back (pc_block_set_put) on this reactor. The bytes
	 * leave kv_staging_max when the callback returns either way: the
	 * taker accounts for them (kv.get's reply: the RPC reply budget). */
	struct pc_block_set *stage;
};
typedef void (*kv_got_fn)(void *arg, const struct kv_got *got);

/* What a flush dropped. */
struct kv_flushed {
	uint64_t pages;      /* pool pages deleted */
	uint64_t disk_pages; /* pages only the next tier (disk) held, dropped
			      * there (a pool page's tier copy goes with it) */
	int res;             /* 0, or -ESHUTDOWN: the node stopped first */
};

struct kv_api {
	/*
	 * Store pages: one copy each into the publish pool, then their records
	 * go to placement; done runs when that finished. A key already in
	 * the pool is not copied again: its record is published again.
	 * src says when the sources are copied (enum kv_src). For every src
	 * but KV_SRC_NOW the items (keys and sources) must stay valid until
	 * done runs, or until freed runs when it is not NULL: at most once,
	 * on r, before done, when publish reads them no more. p2p runs it
	 * once the pages are in the pool and placement has taken the keys,
	 * before the records' publication ends (it may wait on a peer up to
	 * the call's deadline); a mode that reads them until the end
	 * (slotmap: a remote write sends them) does not run it.
	 */
	int (*publish)(struct rx_reactor *r, const struct kv_item *items,
		       unsigned n, enum kv_src src, kv_freed_fn freed,
		       kv_done_fn done, void *arg);
	/*
	 * Fetch pages of known size into their destinations: a local page is
	 * one copy (client_mem: in slices); a remote one is read straight into the destination and
	 * validated there. A page of another size is a miss. Destinations must
	 * stay valid until done runs.
	 */
	int (*fetch)(struct rx_reactor *r, const struct kv_item *items,
		     unsigned n, bool client_mem, kv_done_fn done, void *arg);
	/*
	 * Fetch pages of any size into buffers kv stages itself (for replies
	 * that carry values inline: kv.*). items' data and len are unused.
	 * A call stages at most stage_max bytes, and all calls together at
	 * most kv_staging_max; the first refusal ends the staging and is
	 * reported in got->refused (nothing more is looked up or read).
	 * When the call goes on over later loop passes before it knows
	 * what it stages — this node's pages copied into staging in slices,
	 * or its keys' pins walked in slices (modules/walk.h: a batch of
	 * more than 512 keys, fewer when the pass is busy) — get returns 1
	 * (else 0, or -errno when nothing started), and its caller should
	 * start no more gets for the same client until done — kv.get holds
	 * the client's connection (rpc_call_hold_input) — or a client
	 * pipelining gets would have all of them hold their staging at
	 * once.
	 */
	int (*get)(struct rx_reactor *r, const struct kv_item *items,
		   unsigned n, uint64_t stage_max, kv_got_fn done, void *arg);
	/* How many leading keys exist (data unused). */
	int (*exists)(struct rx_reactor *r, const struct kv_item *items,
		      unsigned n, void (*done)(void *arg, unsigned count),
		      void *arg);
	/* Delete pages here and their records everywhere; ok[i] = existed. */
	int (*remove)(struct rx_reactor *r, const struct kv_item *items,
		      unsigned n, kv_done_fn done, void *arg);
	/*
	 * Drop every page this node holds (flush): its pool's pages, the
	 * next tier's (disk) copies of them and the pages only that tier
	 * holds, with this node's records of them (only those naming this
	 * node and that page's generation) — in slices over loop passes.
	 * 0 when started (done runs once, later, on r), -EBUSY while another
	 * flush runs. NULL in a mode that cannot (slotmap).
	 */
	int (*flush)(struct rx_reactor *r,
		     void (*done)(void *arg, const struct kv_flushed *f),
		     void *arg);
	/* Hold bytes of the node's staging budget (kv_staging_max) for
	 * state a caller keeps besides pages: 0, or -EBUSY. */
	int (*hold)(uint64_t bytes);
	void (*release)(uint64_t bytes);
};

/* The gauge of the staging budget, exported by whichever module is "kv". */
#define KV_STAGED_METRIC "peercache_kv_staged_bytes"
#define KV_STAGED_HELP                                                        \
	"bytes kv.* calls in flight hold now: kv.get's pages and every "      \
	"call's per-key state"

#endif /* PC_MODULES_KV_H */
