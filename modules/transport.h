/*
 * modules/transport.h — the data transport: one-sided reads of registered
 * memory on other nodes.
 *
 * Owns: the interface every transport implements (TCP today; RDMA RC QPs
 * later), the table of regions this node lets peers read, and the read-batch
 * API. Threading: regions are registered on the main thread during init; a
 * transport client belongs to one reactor and is used on its thread only.
 *
 * The shape is one-sided: a reader names (peer, rkey, remote addr, len) and
 * the bytes land in its own destination buffer; the serving node runs no
 * application code for it (RDMA), or only validates and sends (TCP). A read
 * is served only when [addr, addr+len) lies inside a region registered under
 * that rkey; the region's pin hook then keeps the bytes from being reused
 * until the send completes.
 */
#ifndef PC_MODULES_TRANSPORT_H
#define PC_MODULES_TRANSPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "reactor/reactor.h"

/* What a region's pin hook hands back: opaque to the transport. */
struct tp_pin {
	uint64_t a, b;
};

/* A region peers may read, with hooks that pin what is being served. */
struct tp_region {
	uintptr_t base;
	uint64_t len;
	uint32_t rkey;
	/* Pin [addr, addr+len) for a read; 0 and a handle, or -errno. */
	int (*pin)(void *ctx, uintptr_t addr, uint64_t len, struct tp_pin *pin);
	void (*unpin)(void *ctx, const struct tp_pin *pin);
	void *ctx;
};

/* One read of a batch. */
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
};

typedef void (*tp_done_fn)(void *arg, struct tp_read *reads, unsigned n);

struct tp_client;

struct tp_ops {
	const char *name; /* "tcp", "rdma" */
	/*
	 * Read a batch; done(arg, reads, n) runs once every read finished
	 * (each with its own res), later, on the reactor — never inside
	 * read_batch. timeout_ms bounds the whole batch. Returns 0, or a
	 * negative errno when nothing was started (done does not run).
	 */
	int (*read_batch)(struct tp_client *tc, struct tp_read *reads,
			  unsigned n, unsigned timeout_ms, tp_done_fn done,
			  void *arg);
	/*
	 * Node (a ring id, as in tp_read.node) does not answer: every read
	 * still waiting for it on this client fails with err, soon (from the
	 * reactor, never inside this call).
	 */
	void (*fail_node)(struct tp_client *tc, const char *node, int err);
};

/* Counters of the transport (all reactors). */
struct tp_stats {
	uint64_t reads;          /* reads completed by clients */
	uint64_t read_bytes;
	uint64_t read_errors;
	uint64_t served;         /* reads served */
	uint64_t served_bytes;
	uint64_t refused;        /* requests refused: rkey, range, auth */
	uint64_t channels_open;  /* client channels */
};

#endif /* PC_MODULES_TRANSPORT_H */
