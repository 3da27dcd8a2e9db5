/*
 * tests/fake/rdma_sim.h — an in-process simulation of RDMA devices, queue
 * pairs and rdma_cm behind the verbs table (modules/rdma_verbs.h), so the
 * RDMA transport's own logic runs in tests without hardware.
 *
 * Owns: one process-wide "fabric": devices, their contexts, protection
 * domains, memory regions, completion queues and channels, queue pairs,
 * rdma_cm ids, event channels, listeners (a registry keyed by IPv4 ip:port
 * on 127.0.0.0/8 — no sockets are opened) and per-node fault settings.
 * Threading: every entry takes one global mutex; work requests and
 * rdma_cm events are carried out by one sim worker thread (started lazily,
 * stopped by rsim_reset). The sim never calls back into user code; it only
 * makes fds readable (comp channels, event channels: eventfds, non-blocking
 * from the start, readable while events are queued).
 *
 * Objects are the libraries' own structs, embedded first in the sim's,
 * with the fields rdma_verbs.h lists filled in. The semantics are
 * rdma_verbs.h's (the hardware's), plus these, chosen where hardware
 * varies or a mistake should be visible:
 *  - Contexts: rdma_cm uses one context per device of its own (id->verbs);
 *    open_device returns a separate context. As with librdmacm,
 *    create_qp needs pd->context == id->verbs (EINVAL otherwise), so PDs
 *    for QPs must be allocated on id->verbs.
 *  - bind_addr needs an active device (ENODEV), sets id->verbs; port 0
 *    picks a free port; EADDRINUSE if the ip:port is bound. get_src_port
 *    returns it in network byte order, as rdma_get_src_port does (its real
 *    type is __be16): callers need ntohs. resolve_addr without a bound
 *    address takes 127.0.0.1 and a free port.
 *  - connect to an address nobody listens on: RDMA_CM_EVENT_REJECTED with
 *    status RSIM_REJ_NO_LISTENER (8, the IB CM's "invalid service id", as
 *    hardware answers a port with no listener); reject() and destroying a
 *    connect request's id unanswered: REJECTED with status
 *    RSIM_REJ_CONSUMER (28, "consumer defined"). Private data: connect
 *    <= 56 bytes, accept <= 196, reject <= 148 (EINVAL beyond).
 *  - accept after the connecting id was destroyed: the accepting id gets
 *    RDMA_CM_EVENT_CONNECT_ERROR. The client's QP is usable from its
 *    ESTABLISHED event on, the server's from accept.
 *  - disconnect: both sides get RDMA_CM_EVENT_DISCONNECTED once; both QPs
 *    go to the error state. disconnect of an id that is not connected:
 *    EINVAL; of one already disconnected: 0, nothing more happens.
 *  - destroy_id: EBUSY while an event of the id (for a connect request:
 *    of the new id or the listener) is unacked, or while it still has a
 *    QP (destroy_qp first); a connected id's peer sees a disconnect.
 *  - Send queue slots: a WR holds its slot until a completion of it or of
 *    a later WR of the QP is polled (hardware's rule: selective signaling
 *    must signal at least one WR per max_send_wr). post_send beyond the
 *    slots: ENOMEM, *bad at the first WR that did not fit.
 *  - post_send on a QP never connected: EINVAL; on a QP in error: accepted,
 *    flushed (IBV_WC_WR_FLUSH_ERR). Completions carry wr_id, status,
 *    opcode, byte_len (the WR's total length), qp_num.
 *  - destroy_qp: once it returns no WR of it moves bytes or completes
 *    (completions already in the CQ stay pollable). Its peer's WRs then
 *    complete with IBV_WC_RETRY_EXC_ERR ~20 ms later (nobody answers).
 *  - CQ overflow: the completion is dropped, the QP that made it goes to
 *    error, cq_overflows counts it.
 *  - Faults are per node, i.e. per listener address ("ip:port", the one
 *    the client connected to), and apply to both directions of every
 *    connection made through that listener.
 *  - rsim_kill: the listener vanishes at once (connects are REJECTED as
 *    unreachable); every QP connected through it, on both sides, ~20 ms
 *    later: its oldest outstanding WR completes with IBV_WC_RETRY_EXC_ERR,
 *    the rest flush, the QP is in error, and both ids get DISCONNECTED.
 *    A connect request still pending to the killed node is not modeled.
 */
#ifndef PC_TESTS_FAKE_RDMA_SIM_H
#define PC_TESTS_FAKE_RDMA_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "modules/rdma_verbs.h"

#define RSIM_REJ_NO_LISTENER 8
#define RSIM_REJ_CONSUMER 28
#define RSIM_KILL_DELAY_MS 20

struct rsim_stats {
	uint64_t wrs_posted;     /* accepted by post_send */
	uint64_t wrs_done;       /* executed or failed or flushed */
	uint64_t wrs_dropped;    /* discarded by destroy_qp, never completed */
	uint64_t cq_events;      /* completion channel events made */
	uint64_t flushes;        /* IBV_WC_WR_FLUSH_ERR completions */
	uint64_t cq_overflows;   /* completions dropped on a full CQ */
	uint64_t qps_live;
	uint64_t mrs_live;
	uint64_t pds_live;
	uint64_t cqs_live;
	uint64_t comp_channels_live;
	uint64_t event_channels_live;
	uint64_t ids_live;
	uint64_t contexts_open;  /* by open_device, not yet closed */
	uint64_t events_unacked; /* rdma_cm events got and not acked */
	uint64_t cq_events_unacked; /* completion events got and not acked */
	uint64_t async_events_unacked; /* asynchronous events got, not acked */
	/* the most asked for so far (device limits: rsim_set_limits) */
	uint64_t qp_send_wr_max;  /* max_send_wr of a created QP */
	uint64_t qp_send_sge_max; /* max_send_sge of a created QP */
	uint64_t init_depth_max;  /* initiator_depth given to connect */
	uint64_t resp_res_max;    /* responder_resources given to accept */
};

/* The table (name "sim"). */
const struct rv_api *rsim_api(void);

/* Tear the fabric down: stop the worker, free every object (pointers the
 * caller still holds dangle), forget devices, listeners and faults, zero
 * the counters. Safe when empty; not while other threads use the sim. */
int rsim_reset(void);

/* A device (name unique, < 64 chars) with port 1 in port_state
 * (IBV_PORT_ACTIVE or IBV_PORT_DOWN). 0, -EINVAL, -EEXIST, -ENOSPC. */
int rsim_add_device(const char *name, int port_state);

/*
 * Give device name a network address (an IPv4 on 127.0.0.0/8, "a.b.c.d"):
 * its device_addr answers it, an id bound to it (or connecting from it)
 * uses the device, and a connect request that reaches a wildcard listener
 * at it comes on the device. Ids bound to addresses no device has, or
 * with no source address, use the first active device (as before any
 * address was given). 0, -EINVAL, -ENODEV, -EEXIST (another device has
 * it).
 */
int rsim_device_addr(const char *name, const char *ip);
/* Devices sim<first>..sim<first+n-1>, active, device sim<k> at
 * 127.0.0.<k+1> (the rails tests' layout): 0 or the first error. */
int rsim_add_rails(unsigned first, unsigned n);

/*
 * Limits a device reports (query_device) and enforces, as hardware does:
 * create_qp with more than max_qp_wr send WRs or max_sge send SGEs,
 * create_cq with more than max_cqe entries, connect with initiator_depth
 * above max_qp_init_rd_atom and accept with responder_resources above
 * max_qp_rd_atom fail with EINVAL; a READ WR with more than max_sge_rd
 * SGEs fails post_send with EINVAL. Defaults: 16384 WRs, 16 SGEs (READs
 * too), 65536 CQEs, 16 READs in flight each way.
 */
struct rsim_limits {
	unsigned max_qp_wr, max_sge, max_sge_rd, max_cqe;
	unsigned max_qp_rd_atom, max_qp_init_rd_atom;
};
/* Set dev's limits (a 0 field keeps the current value): 0, -ENODEV. */
int rsim_set_limits(const char *dev, const struct rsim_limits *lim);

/* Faults of the node listening at addr ("a.b.c.d:port"); each returns 0 or
 * -EINVAL for an address it cannot parse. They may be set before the
 * node listens. */
/* Each WR on its connections runs min_us..max_us after being posted (after
 * the previous WR of its QP). Default 0..50. */
int rsim_set_delay(const char *addr, unsigned min_us, unsigned max_us);
/* The node's WRs never complete (held) until unsilenced or killed. */
int rsim_silence(const char *addr, bool on);
/* The QPs connected through the node now (both sides) hold their WRs
 * for good, as rsim_silence does, until destroyed or the node is killed;
 * QPs connected later are not affected (a black hole on some paths). */
int rsim_silence_qps(const char *addr);
/* The node dies (see above). */
int rsim_kill(const char *addr);
/* The next n WRs on its connections fail with status (then flush). */
int rsim_fail_next(const char *addr, unsigned n, enum ibv_wc_status status);
/* Connect requests to it are never answered (no event at all). */
int rsim_silence_cm(const char *addr, bool on);

/*
 * Asynchronous events (ibv_get_async_event on a context's async_fd, an
 * eventfd, non-blocking from the start, readable while events wait), on
 * rdma_cm's context of the device. rsim_async_port: a port event on port
 * 1 of dev (IBV_EVENT_PORT_ERR takes the port down, IBV_EVENT_PORT_ACTIVE
 * brings it up; others change nothing): 0 or -ENODEV. rsim_async_qp: the
 * QPs the node at addr accepted (its side of each connection) go to the
 * error state and each gets event type: how many. Events of
 * a QP not got yet are dropped when it is destroyed, as uverbs does.
 */
int rsim_async_port(const char *dev, enum ibv_event_type type);
int rsim_async_qp(const char *addr, enum ibv_event_type type);

void rsim_stats(struct rsim_stats *out);
/* Some MR of the fabric has this rkey (a peer could still use it). */
bool rsim_rkey_live(uint32_t rkey);
/* What the fabric still holds (live objects of every kind, events got and
 * not acked): the count, and in what a list like "2 QPs, 1 ids". 0 when a
 * user freed everything it made. */
uint64_t rsim_leftovers(char *what, size_t len);

#endif /* PC_TESTS_FAKE_RDMA_SIM_H */
