/*
 * modules/transport_tcp.h — between the TCP transport's two halves: the
 * module and server (transport_tcp.c) and the initiator side
 * (transport_tcp_client.c). Not for other modules: they use struct tp_ops.
 *
 * Owns: declarations only. Threading: a client lives on its reactor.
 */
#ifndef PC_MODULES_TRANSPORT_TCP_H
#define PC_MODULES_TRANSPORT_TCP_H

#include "common/metrics.h"
#include "modules/transport.h"

/* What every client of the node shares (set in init, read-only after). */
struct tp_tcpc_cfg {
	unsigned max_chans;          /* max_channels_per_peer */
	unsigned connect_timeout_ms;
	const char *secret;          /* cluster_secret, or NULL */
	met_id reads, read_bytes, read_errors;
	met_id writes, write_bytes, write_errors, chans_open;
};

struct rv_api;
/* Tests: the verbs the module uses for protocol = auto | rdma (NULL: the
 * real libraries). Before the module's init. */
void tp_tcp_set_verbs(const struct rv_api *api);

/* Register the client counters in cfg (main thread, once). */
void tp_tcpc_metrics(struct tp_tcpc_cfg *cfg);
/* A client on reactor r (its thread); NULL when out of memory. */
struct tp_client *tp_tcpc_new(struct rx_reactor *r,
			      const struct tp_tcpc_cfg *cfg);
/* After the reactor drained: every channel is closed by then. */
void tp_tcpc_free(struct tp_client *tc);

/* The tp_ops entries (transport.h documents them). */
int tp_tcpc_read_batch(struct tp_client *tc, struct tp_read *reads,
		       unsigned n, unsigned timeout_ms, tp_done_fn done,
		       void *arg);
int tp_tcpc_write_batch(struct tp_client *tc, struct tp_write *writes,
			unsigned n, unsigned timeout_ms, tp_wdone_fn done,
			void *arg);
int tp_tcpc_cancel(struct tp_client *tc, void *arg);
int tp_tcpc_peer_open(struct tp_client *tc, const char *endpoint,
		      const char *node, struct tp_peer **out);
int tp_tcpc_peer_health(struct tp_client *tc, struct tp_peer *p,
			struct tp_peer_info *out);
void tp_tcpc_peer_close(struct tp_client *tc, struct tp_peer *p, int err);
void tp_tcpc_fail_node(struct tp_client *tc, const char *node, int err);

#endif /* PC_MODULES_TRANSPORT_TCP_H */
