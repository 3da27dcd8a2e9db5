/*
 * common/unproven.h — which reactor can drop an unproven connection for a
 * newcomer that its own reactor cannot admit.
 *
 * Owns: nothing global; a server that caps unproven connections node-wide
 * keeps one struct pc_unproven per reactor (rpc/server.c for the RPC port,
 * modules/transport_tcp.c for the data port). Threading: entry i is written
 * by reactor i alone (pc_unproven_set), read from any thread
 * (pc_unproven_pick).
 *
 * Why: the caps count connections of every reactor, but a reactor drops
 * only its own (their lists and their connections are its thread's). The
 * unproven connections can all sit on one reactor, one that accepted a
 * burst while the others were busy or descheduled, while new clients are
 * placed on the least-loaded one: that one has nothing to drop and alone
 * would refuse every newcomer until the handshake deadline freed the cap.
 * It hands such a newcomer, once, to the reactor pc_unproven_pick names,
 * which drops one of its own for it or refuses it.
 */
#ifndef PC_COMMON_UNPROVEN_H
#define PC_COMMON_UNPROVEN_H

#include <stdint.h>

struct pc_unproven {
	uint64_t n;         /* unproven connections the reactor holds */
	uint64_t oldest_ns; /* when the oldest of them began; 0: none */
};

/* Publish reactor u's count and its oldest's time (its own thread). */
void pc_unproven_set(struct pc_unproven *u, uint64_t n, uint64_t oldest_ns);

/* Of the nreactors entries of per, the reactor other than here holding
 * the most unproven connections whose oldest began at or before cut_ns
 * (past the grace that protects a new one), or -1. A guess from published
 * counts: the reactor named checks again before it drops anything. */
int pc_unproven_pick(const struct pc_unproven *per, unsigned nreactors,
		     unsigned here, uint64_t cut_ns);

#endif /* PC_COMMON_UNPROVEN_H */
