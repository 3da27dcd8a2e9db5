/*
 * modules/transport_rdma.h — the RDMA transport: RC queue pairs set up with
 * rdma_cm, one-sided READs and WRITEs, completions on the reactor.
 *
 * Owns: RDMA nodes (one or more rails, each a device context with its
 * protection domain and an MR of every region peers may access, and the
 * rdma_cm listeners that accept peers' queue pairs) and RDMA clients (one
 * per reactor: its peers, their channels and the batches in flight). Every libibverbs / librdmacm call goes through
 * the verbs table of cfg.api (modules/rdma_verbs.h): rv_real in the node,
 * the simulation in tests.
 *
 * Channels: a peer has up to max_chans channels, each one RC QP with its
 * own CQ, opened lazily (a new one while every open one has work and the
 * cap allows), kept open for reuse. Operations are posted in chains with
 * selective signaling (the last WR of a chain and every signal_every-th are
 * signaled; the rest complete implicitly, in order); completions are
 * matched by wr_id, a per-channel sequence. One completion channel per
 * client, watched by the reactor (rx_watch_fd): get the event, ack it,
 * re-arm, drain.
 *
 * Failures: a failed completion tears its channel down (the QP is
 * destroyed at once, so nothing lands later); the operation that failed
 * reports the mapped errno, those flushed behind it are posted again once
 * on another channel. A channel whose oldest posted WR has not completed
 * within cfg.op_timeout_ms is stuck: it is torn down the same way, its
 * operations posted once more elsewhere (one that times out again ends
 * with -ETIMEDOUT). A timeout, a cancel, peer_close and fail_node also
 * destroy the QPs that still hold their operations before done runs: a
 * batch's done means no byte of it can still land.
 *
 * Keys: a region's key (what records name) is random and stays while the
 * region lives; the rkey of its MR is handed to a peer only in the accept
 * of its queue pair (the node's whole key table, at most TP_REGIONS_MAX
 * entries), and a channel translates keys to rkeys as it posts. An
 * operation naming a key its node did not hand out fails with -EFAULT
 * before anything is posted. A revoke (tp_ops.revoke, on a departure)
 * gives every region a fresh MR, disconnects every accepted queue pair and
 * deregisters the old MRs after cfg.revoke_grace_ms.
 *
 * Authentication (cfg.secret set): a connect request carries a timestamp,
 * a fresh nonce and HMAC-SHA256(secret, "peercache-rdma-v1 client" || ts ||
 * nonce || the address dialed, "ip:port"); the node accepts it only within
 * ±60 s of its clock, with a nonce it has not seen, for the address it was
 * received on, and
 * answers with its own proof over the same values, which the client checks
 * before it posts anything. A peer without the secret never gets a queue
 * pair on this node's protection domain. The secret never crosses the wire.
 *
 * Local memory: a READ lands (and a WRITE is sent from) registered memory.
 * A buffer inside a region of this node (reg_region) or one given to
 * tp_rdma_reg_local uses that region's MR; any other buffer is registered
 * for its batch only and deregistered when the batch ends (counted in
 * stats.lazy_mrs): correct for any memory, slow, so callers land pages in
 * registered memory.
 *
 * Rails (cfg.devices): rail 0 listens where tp_rdma_node_listen says,
 * rail k > 0 at its device's network address on the same port; an accept
 * on rail k hands out rail k's rkeys, and rail 0's lists the other rails'
 * addresses. A client spreads a batch over the rails it and the peer both
 * have (operation i on rail i % n, from its rail k to the peer's rail k);
 * the first batch to a peer, before any accept listed its rails, goes on
 * rail 0; a rail whose connect fails is skipped for RAIL_HOLD_MS.
 *
 * Device events: the listener's reactor also reads the device's
 * asynchronous events; each is logged (rate limited) and counted, and a
 * fatal error of a queue pair the node accepted drops that queue pair.
 *
 * Threading: a node's region table has its own lock (any thread); its
 * listener runs on one reactor; a client is used on its reactor only.
 */
#ifndef PC_MODULES_TRANSPORT_RDMA_H
#define PC_MODULES_TRANSPORT_RDMA_H

#include <stdint.h>

#include "modules/rdma_verbs.h"
#include "modules/transport.h"

/* Devices (rails) a node drives at most. */
#define TP_RDMA_RAILS_MAX 8

struct tp_rdma_cfg {
	const struct rv_api *api;
	const char *device;          /* device_name; "" or NULL: first active */
	/* device_names: a comma list of devices, one rail each (overrides
	 * device); "" or NULL: one rail, device's */
	const char *devices;
	unsigned ib_port;            /* 1..255 */
	int gid_index;               /* -1: no GRH (checked to exist if >= 0) */
	unsigned max_chans;          /* per peer; 0: 16 */
	unsigned connect_timeout_ms; /* each rdma_cm step; 0: 2000 */
	unsigned sq_depth;           /* WRs in flight per QP; 0: 128 */
	unsigned signal_every;       /* 0: 16 */
	unsigned rd_atomic;          /* READs in flight per QP; 0: 16 */
	unsigned max_accepted;       /* peers' QPs held at once; 0: 8192 */
	unsigned revoke_grace_ms;    /* old MRs live on after a revoke; 0:
				      * 10000 */
	const char *secret;          /* cluster_secret, or NULL */
	/* A WR posted this long ago and not completed: its channel is stuck
	 * (torn down, its operations retried once elsewhere); 0: off. */
	unsigned op_timeout_ms;
};

/* Counters (any thread may read; relaxed). */
struct tp_rdma_stats {
	uint64_t chans_opened, chans_failed, chans_torn_down;
	uint64_t wrs_posted, wrs_signaled, cq_events, post_failures;
	uint64_t reads, read_bytes, writes, write_bytes;
	uint64_t wc_errors, retried, lazy_mrs, timeouts;
	uint64_t accepted, refused;  /* connect requests (served side) */
	uint64_t revokes;            /* peers' access taken back */
	uint64_t op_timeouts;        /* channels closed by op_timeout_ms */
	uint64_t async_events;       /* the device's, read by the listener */
	/* bytes this node's reads and writes moved through each rail */
	uint64_t rail_bytes[TP_RDMA_RAILS_MAX];
};

extern const struct tp_ops tp_rdma_ops;

/*
 * Usable devices of api: how many have cfg->ib_port active (and, when
 * device is set, only that one). why gets what was found, for the log.
 */
int tp_rdma_probe(const struct tp_rdma_cfg *cfg, char *why, size_t whylen);

/* A node on the device cfg names: 0, -ENODEV (none usable, why in the
 * log), -ENOMEM, or the verbs' errno. cfg's strings are copied. */
int tp_rdma_node_new(const struct tp_rdma_cfg *cfg, struct tp_node **out);
/*
 * Accept peers' queue pairs at host:port (port 0: any) on reactor r;
 * endpoint (may be NULL) is how peers know it, for the log. *bound gets
 * the port. Once per node.
 */
int tp_rdma_node_listen(struct tp_node *tn, struct rx_reactor *r,
			const char *host, uint16_t port, const char *endpoint,
			uint16_t *bound);
/* Close the listener and every accepted queue pair (on the listener's
 * reactor, or after it stopped). */
void tp_rdma_node_unlisten(struct tp_node *tn);
/* After every client of the node was freed: deregisters what is left. */
void tp_rdma_node_free(struct tp_node *tn);
/* Let reads land in (and writes be sent from) [base, base+len) without a
 * registration per batch: 0 or -errno. Until tp_rdma_unreg_local. */
int tp_rdma_reg_local(struct tp_node *tn, void *base, size_t len);
int tp_rdma_unreg_local(struct tp_node *tn, void *base);
void tp_rdma_node_stats(const struct tp_node *tn, struct tp_rdma_stats *out);
/* The rkey peers are handed now for the region registered under key (logs,
 * tests): 0, or -ENOENT. Any thread. rail_rkey: on rail (0: the first
 * device). */
int tp_rdma_node_rkey(struct tp_node *tn, uint32_t key, uint32_t *rkey);
int tp_rdma_node_rail_rkey(struct tp_node *tn, unsigned rail, uint32_t key,
			   uint32_t *rkey);
/* How many rails (devices) the node drives; rail k's device name. */
unsigned tp_rdma_node_rails(const struct tp_node *tn);
const char *tp_rdma_node_rail_name(const struct tp_node *tn, unsigned k);

/* A client of node tn on reactor r (its thread); NULL and *err. */
struct tp_client *tp_rdma_client_new(struct tp_node *tn, struct rx_reactor *r,
				     int *err);
/* The reactor stops: every operation ends with -ESHUTDOWN (from 0-delay
 * timers) and every channel closes. */
void tp_rdma_client_stop(struct tp_client *tc);
/* After every batch finished (the reactor drained). */
void tp_rdma_client_free(struct tp_client *tc);

#endif /* PC_MODULES_TRANSPORT_RDMA_H */
