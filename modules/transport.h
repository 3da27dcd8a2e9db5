/*
 * modules/transport.h — the data transport: one-sided reads and writes of
 * registered memory on other nodes. Every transport (TCP today, the
 * in-process fake of the tests, RDMA RC QPs later) implements struct tp_ops.
 *
 * Owns: the interface, and the region table every transport shares
 * (struct tp_regs, transport.c): which regions of this node peers may read
 * or write, under which keys. Threading: regions are registered and
 * deregistered from any thread (the table has its own lock); a transport
 * client belongs to one reactor and is used on its thread only; every done
 * callback runs on that reactor, never inside the call that started it.
 *
 * The shape is one-sided: an initiator names (peer, key, remote addr, len)
 * and the bytes land in its own buffer (read) or in the peer's region
 * (write); the serving node runs no application code for it (RDMA), or only
 * validates and copies (TCP). An operation is served only when
 * [addr, addr+len) lies inside a region registered under that key with that
 * access, and the region's pin hook accepts it; the pin keeps the bytes from
 * being reused until the transfer completes.
 *
 * Keys: the transport chooses them (random, non-zero, never reused while the
 * region lives) and they stay the same while the region lives; the owner
 * publishes whatever key register returned. A key is not an RDMA rkey: the
 * RDMA transport hands its peers the rkeys behind the keys only when they
 * connect (authenticated), and replaces them on a revoke.
 *
 * Errors are negative errnos in each operation's res: -EFAULT (no such key,
 * or out of the region's bounds), -EACCES (region not writable, or not
 * authenticated; RDMA hardware reports a region without the access as a
 * wrong key, -EFAULT), -EINVAL (bad arguments), -ETIMEDOUT (the batch's
 * timeout),
 * -ECANCELED (tp_ops.cancel), -EHOSTDOWN / -ECONNRESET / -ECONNREFUSED
 * (peer closed, failed or departed), -ESHUTDOWN (the reactor stops), -EIO
 * (short transfer), -ENOMEM.
 */
#ifndef PC_MODULES_TRANSPORT_H
#define PC_MODULES_TRANSPORT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "reactor/reactor.h"

struct pc_settings;

/* What a region's pin hook hands back: opaque to the transport. */
struct tp_pin {
	uint64_t a, b;
};

/* Access a region grants to peers. */
enum { TP_ACCESS_READ = 1, TP_ACCESS_WRITE = 2 };

/* A selected read's selector: what the serving region narrows the read to
 * (slotmap: the key's 128-bit hash, little-endian lo then hi). */
#define TP_SEL_BYTES 16
/* The most pieces a region's selection may send. */
#define TP_SEL_PIECES 2

/* One piece of a selection: bytes of the region, inside the held range. */
struct tp_piece {
	uintptr_t addr;
	uint64_t len;
};

/* A region peers may read (and write, with TP_ACCESS_WRITE). */
struct tp_region {
	uintptr_t base;
	uint64_t len;
	unsigned access; /* TP_ACCESS_*; 0 means TP_ACCESS_READ */
	/* Pin [addr, addr+len) for a transfer; 0 and a handle, or -errno.
	 * Any reactor thread. */
	int (*pin)(void *ctx, uintptr_t addr, uint64_t len, struct tp_pin *pin);
	void (*unpin)(void *ctx, const struct tp_pin *pin);
	/* Optional: after deregistration, once no transfer touches the
	 * region any more (any thread). The owner may free it then. */
	void (*released)(void *ctx);
	/*
	 * Optional: narrow a selected read of [addr, addr+len) (pinned) to
	 * what sel names: up to TP_SEL_PIECES pieces inside the range (at
	 * most len bytes in all), sent in order and back to back instead of
	 * the range; *n = 0 sends nothing (the range holds nothing sel
	 * names). Returns 1 (narrowed), 0 (not this range: the whole range
	 * is sent) or -errno (the read fails). Only a transport whose
	 * serving side runs code (TCP) calls it; a one-sided one (RDMA, the
	 * fake) sends the range, so readers must accept both. The bytes are
	 * not locked: a selection is a hint the reader validates as it would
	 * the whole range. Any reactor.
	 */
	int (*select)(void *ctx, uintptr_t addr, uint64_t len,
		      const uint8_t sel[TP_SEL_BYTES], struct tp_piece *pieces,
		      unsigned *n);
	void *ctx;
};

/* Names a remote buffer: the peer, and the region key and address there.
 * The peer is a data endpoint ("host:port"), or a handle from peer_open
 * (then peer[] is ignored). */
struct tp_read {
	char peer[160];   /* data endpoint "host:port" */
	const char *node; /* the peer's ring id, for fail_node; may be NULL;
			   * must stay valid until done runs */
	uint32_t rkey;
	uint64_t addr;
	uint32_t len;     /* bytes read: hdr_len into hdr, the rest into dst */
	void *hdr;        /* may be NULL when hdr_len is 0 */
	uint32_t hdr_len; /* e.g. a page header kept apart from its payload */
	void *dst;        /* the remaining len - hdr_len bytes land here */
	int res;          /* on completion: 0, or a negative errno */
	struct tp_peer *ph; /* a peer handle, or NULL: use peer[] */
	/* A selected read: the serving region may send only what sel names
	 * (struct tp_region's select). */
	bool select;
	uint8_t sel[TP_SEL_BYTES];
	/* On completion with res 0: the bytes that landed (from the start
	 * of hdr, then dst), and whether they are the region's selection
	 * (then got <= len) rather than the whole range (got == len). */
	uint32_t got;
	bool narrowed;
	/*
	 * Optional (NULL: none): landed(landed_arg, rd) runs on the reactor
	 * once this read's bytes are all in hdr and dst (res 0, got set),
	 * before the batch's done, so the caller can use them while they are
	 * likely still in this CPU's caches (kv checks a page's checksum
	 * there). A transport that lands bytes without telling the CPU (RDMA)
	 * or keeps no per-read state runs it from the batch's delivery, just
	 * before done. Never for a read that failed; never twice (landed_ran,
	 * the transport's to set). rd may be a transport's copy of the
	 * caller's read: use landed_arg to find the caller's state.
	 */
	void (*landed)(void *landed_arg, const struct tp_read *rd);
	void *landed_arg;
	bool landed_ran;
};

/* One write of a batch: len bytes (hdr_len from hdr, the rest from src)
 * into [addr, addr+len) of a writable region of the peer. hdr and src must
 * stay valid until done runs. */
struct tp_write {
	char peer[160];
	const char *node;
	uint32_t rkey;
	uint64_t addr;
	uint32_t len;
	const void *hdr;
	uint32_t hdr_len;
	const void *src;
	int res;
	struct tp_peer *ph;
};

typedef void (*tp_done_fn)(void *arg, struct tp_read *reads, unsigned n);
typedef void (*tp_wdone_fn)(void *arg, struct tp_write *writes, unsigned n);

struct tp_node;   /* one node's transport instance (its regions, server) */
struct tp_client; /* one reactor's initiator side */
struct tp_peer;   /* a peer of one client (a handle) */

/* Peer health as a client sees it. */
enum tp_peer_state {
	TP_PEER_IDLE = 0,   /* no channel open, no failure since the last */
	TP_PEER_UP = 1,     /* a channel is open and answering */
	TP_PEER_FAILED = 2, /* no channel up; the last one failed (err) */
};

struct tp_peer_info {
	int state;          /* enum tp_peer_state */
	int err;            /* the last channel failure, 0 if none */
	unsigned channels;  /* open or opening (<= the per-peer cap) */
	unsigned inflight;  /* operations issued and not answered */
	unsigned refs;      /* peer_open handles held */
};

struct tp_ops {
	const char *name; /* "tcp", "fake", "rdma" */

	/*
	 * Let peers access region; *key gets the key they must name. Main
	 * thread or any, not on a hot path. 0, -ENOSPC (table full),
	 * -EINVAL (empty region, no pin hooks).
	 */
	int (*reg_region)(struct tp_node *tn, const struct tp_region *region,
			  uint32_t *key);
	/*
	 * Withdraw key: new operations naming it fail with -EFAULT at once;
	 * transfers already pinned finish, then the region's released hook
	 * runs. 0 or -ENOENT.
	 */
	int (*dereg_region)(struct tp_node *tn, uint32_t key);

	/*
	 * Read a batch; done(arg, reads, n) runs once every read finished
	 * (each with its own res), later, on the reactor — never inside
	 * read_batch. timeout_ms bounds the whole batch. Reads to one peer
	 * are issued in order. Returns 0, or a negative errno when nothing
	 * was started (done does not run). A batch completes only when no
	 * read of it can still write into hdr or dst.
	 */
	int (*read_batch)(struct tp_client *tc, struct tp_read *reads,
			  unsigned n, unsigned timeout_ms, tp_done_fn done,
			  void *arg);
	/* The same for writes; a write's res 0 means the bytes are in the
	 * peer's region. */
	int (*write_batch)(struct tp_client *tc, struct tp_write *writes,
			   unsigned n, unsigned timeout_ms, tp_wdone_fn done,
			   void *arg);
	/*
	 * Cancel the batches of this client started with this done arg:
	 * their done runs once, soon (from the reactor, never inside this
	 * call), with -ECANCELED for every operation that had not finished.
	 * Returns how many batches were cancelled (0: none pending).
	 */
	int (*cancel)(struct tp_client *tc, void *arg);

	/*
	 * A handle on the peer at endpoint (node: its ring id, may be NULL),
	 * shared by every operation naming it by handle or by endpoint.
	 * Reference-counted: each open needs one peer_close. 0 or -errno
	 * (-EINVAL / -EHOSTUNREACH: bad endpoint, -ENOMEM).
	 */
	int (*peer_open)(struct tp_client *tc, const char *endpoint,
			 const char *node, struct tp_peer **out);
	/* The peer's state (enum tp_peer_state) and *out (may be NULL). */
	int (*peer_health)(struct tp_client *tc, struct tp_peer *p,
			   struct tp_peer_info *out);
	/*
	 * Drop a handle (p must not be used after its last close). Every
	 * operation in flight to the peer ends with err (-EHOSTDOWN if 0)
	 * soon, from the reactor, never inside this call; later operations
	 * naming the peer open new channels.
	 */
	void (*peer_close)(struct tp_client *tc, struct tp_peer *p, int err);
	/*
	 * Optional (NULL where reads need no registered memory, as TCP):
	 * let reads land in [base, base+len) of this process (and writes be
	 * sent from it) without a registration per batch, until
	 * unreg_local(base). Slow (the pages are pinned): call it off the
	 * reactor. A read still in flight into the range when unreg_local
	 * runs fails (-EINVAL) and lands nothing. 0 or -errno (-ENOSPC:
	 * no room; the range is then registered per batch).
	 */
	int (*reg_local)(struct tp_node *tn, void *base, size_t len);
	int (*unreg_local)(struct tp_node *tn, void *base);
	/*
	 * Node (a ring id, as in tp_read.node) departed or does not answer:
	 * every operation still waiting for it on this client fails with err,
	 * soon (from the reactor, never inside this call).
	 */
	void (*fail_node)(struct tp_client *tc, const char *node, int err);
	/*
	 * Optional (NULL where a peer holds nothing past its connection):
	 * take back every access to this node's regions that peers were
	 * granted so far (RDMA: new rkeys, every accepted queue pair closed;
	 * peers connect and authenticate again, and their operations in
	 * flight are sent again once). Region keys do not change, so no
	 * record needs republishing. Run on every reactor when a member
	 * left (epoch: the membership's); the transport acts once per epoch.
	 */
	void (*revoke)(struct tp_node *tn, struct rx_reactor *r,
		       uint64_t epoch);
};

/* ------------------------------------------------------- the region table */

#define TP_REGIONS_MAX 16

struct tp_reg_entry;

/* The regions of one node, shared by its transport's reactors. */
struct tp_regs {
	pthread_mutex_t lock;
	struct tp_reg_entry *e[TP_REGIONS_MAX];
};

/* A region an operation holds: pinned, and its entry kept alive. */
struct tp_hold {
	struct tp_reg_entry *e;
	struct tp_pin pin;
};

/* A region's fields make sense (length, hooks, access): 0 or -EINVAL. */
int tp_region_check(const struct tp_region *region);
void tp_regs_init(struct tp_regs *t);
/* Deregisters what is left (released hooks run once nothing holds them). */
void tp_regs_fini(struct tp_regs *t);
int tp_regs_add(struct tp_regs *t, const struct tp_region *region,
		uint32_t *key);
/* The same under the key *key when it is not 0 (-EEXIST if taken): a
 * region another transport registered first, under its key. */
int tp_regs_add_key(struct tp_regs *t, const struct tp_region *region,
		    uint32_t *key);
int tp_regs_remove(struct tp_regs *t, uint32_t key);
/*
 * Find and pin [addr, addr+len) of the region under key for access: 0 and
 * *h (release with tp_regs_release), or -EFAULT (no key, out of bounds),
 * -EACCES (access not granted), -EINVAL (len 0), or the pin hook's error.
 * Any thread.
 */
int tp_regs_hold(struct tp_regs *t, uint32_t key, uint64_t addr,
		 uint64_t len, unsigned access, struct tp_hold *h);
void tp_regs_release(struct tp_hold *h);
/*
 * The held region's selection of [addr, addr+len) (held by h) for sel:
 * 1 and pieces[0..*n) inside the range (at most len bytes in all), 0 when
 * the region does not narrow it (send the range), the hook's -errno, or
 * -EINVAL for pieces that break those bounds. Any thread.
 */
int tp_regs_select(const struct tp_hold *h, uint64_t addr, uint64_t len,
		   const uint8_t sel[TP_SEL_BYTES], struct tp_piece *pieces,
		   unsigned *n);

/* The largest single transfer any transport accepts. */
#define TP_IO_MAX (1u << 30)

/* Shared argument checks of one read or write: 0 or -EINVAL. */
int tp_io_check(uint32_t len, uint32_t hdr_len, const void *hdr,
		const void *buf);

/* ---------------------------------------- what every transport's batch has */

/*
 * The bookkeeping of one batch, embedded first in each transport's own
 * batch struct: the caller's operations, how many are still open, the
 * done callback and the timeout timer, and its place in the client's list
 * of live batches (for cancel and peer failures). Reactor thread only.
 */
struct tp_bcore {
	struct tp_bcore *prev, *next;
	bool write;              /* ops are struct tp_write, else tp_read */
	bool cancelled, timed_out;
	void *ops;
	unsigned n, left;        /* operations; not yet finished */
	tp_done_fn rdone;
	tp_wdone_fn wdone;
	void *arg;
	struct rx_timer timer;   /* the timeout, or a 0-delay delivery */
};

/* One operation of a batch seen the same way for reads and writes. */
struct tp_io {
	struct tp_peer *ph;
	const char *peer, *node;
	uint32_t rkey;
	uint64_t addr;
	uint32_t len, hdr_len;
	uint8_t *hdr, *buf;      /* writes: sent from, never written to */
	int *res;
	/* Reads only (NULL for writes): the selector (NULL: a plain read),
	 * and where the result's extent goes (preset to len, not narrowed). */
	const uint8_t *sel;
	uint32_t *got;
	bool *narrowed;
	struct tp_read *rd;      /* reads: the read itself (its landed hook) */
};

/* Fill b (zeroed by the caller) and put it first on *list. */
void tp_bcore_link(struct tp_bcore *b, struct tp_bcore **list, bool write,
		   void *ops, unsigned n, void *arg,
		   void (*timeout)(struct rx_reactor *r, struct rx_timer *t));
/* Operation i of b, with its res reset to 0 (and a read's got to its len,
 * narrowed to false). */
void tp_bcore_io(struct tp_bcore *b, unsigned i, struct tp_io *io);
/* A read's bytes have all landed (res 0): run its landed hook, once. */
void tp_read_landed(struct tp_read *rd);
/* Stop the timer, leave *list, run the landed hooks of the reads that
 * succeeded and have not run theirs, and run done (once). b is not freed. */
void tp_bcore_deliver(struct tp_bcore *b, struct tp_bcore **list,
		      struct rx_reactor *r);
/* The res an operation that failed with err reports: -ECANCELED once the
 * batch was cancelled, -ETIMEDOUT once it timed out, else err. */
int tp_bcore_res(const struct tp_bcore *b, int err);

/* ------------------------------------------------------------- selection */

struct rv_api;
struct tp_rdma_cfg;

/*
 * protocol = auto | tcp | rdma (transport_select.c): PC_PROTO_TCP or
 * PC_PROTO_RDMA (run RDMA with TCP beside it: a usable device of api and
 * a cluster_secret), or for "rdma" -ENODEV (no usable device) or -EACCES
 * (no secret). Logs what it found and chose (one line).
 * Main thread.
 */
int tp_select(const struct pc_settings *s, const struct rv_api *api);
/* The RDMA transport's configuration from the node's settings. */
void tp_rdma_cfg_of(const struct pc_settings *s, const struct rv_api *api,
		    struct tp_rdma_cfg *cfg);

#endif /* PC_MODULES_TRANSPORT_H */
