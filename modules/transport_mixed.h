/*
 * modules/transport_mixed.h — RDMA with TCP beside it: what a node runs
 * when it has an RDMA device (protocol = auto or rdma), so that peers
 * without one are still reached (mixed clusters).
 *
 * Owns: the composition only. A region is registered with RDMA first (it
 * chooses the key) and then in the TCP server's table under that same key,
 * so a record names one key whichever way a peer reads it. A revoke is
 * RDMA's (TCP's peers hold nothing past their connections). A client
 * sends each operation over RDMA unless its peer is known to have no RDMA
 * listener: an RDMA connect that is refused or finds no route marks the
 * peer "TCP" for a while (TP_MIXED_TCP_HOLD_MS) and its operations go
 * again over TCP within what is left of the batch's timeout. Peer handles
 * hold one handle of each transport.
 *
 * Threading: as the transports under it (a client on its reactor).
 */
#ifndef PC_MODULES_TRANSPORT_MIXED_H
#define PC_MODULES_TRANSPORT_MIXED_H

#include "modules/transport.h"

/* How long a peer found without RDMA is reached over TCP before RDMA is
 * tried again. */
#define TP_MIXED_TCP_HOLD_MS 60000

extern const struct tp_ops tp_mixed_ops;

/* A node over an RDMA node (rdma_ops) and the TCP server's region table;
 * NULL when out of memory. Neither is owned. */
struct tp_node *tp_mixed_node_new(const struct tp_ops *rdma_ops,
				  struct tp_node *rdma, struct tp_regs *tcp);
void tp_mixed_node_free(struct tp_node *tn);

/* A client over one reactor's RDMA and TCP clients (not owned). */
struct tp_client *tp_mixed_client_new(struct rx_reactor *r,
				      const struct tp_ops *rdma_ops,
				      struct tp_client *rdma,
				      const struct tp_ops *tcp_ops,
				      struct tp_client *tcp);
/* After every batch finished. */
void tp_mixed_client_free(struct tp_client *tc);
/* Operations sent over TCP because their peer has no RDMA (counter; any
 * thread may read it). */
uint64_t tp_mixed_client_fallbacks(const struct tp_client *tc);

#endif /* PC_MODULES_TRANSPORT_MIXED_H */
