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

/* A cache line each: a reactor writes its own at every accept and proof,
 * and must not bounce its neighbours'. */
struct pc_unproven {
	_Alignas(64) uint64_t n; /* unproven connections the reactor holds */
	uint64_t drop_ns; /* from when the first of them may be dropped for a
			   * newcomer (past its grace); 0: none */
};

/* nreactors zeroed entries (free() them), or NULL. */
struct pc_unproven *pc_unproven_new(unsigned nreactors);

/* Publish reactor u's count and first drop time (its own thread). */
void pc_unproven_set(struct pc_unproven *u, uint64_t n, uint64_t drop_ns);

/* Of the nreactors entries of per, the reactor other than here, with a
 * connection it may drop at now_ns, that holds the most unproven ones; or
 * -1. A guess from published values: the reactor named checks again
 * before it drops anything. */
int pc_unproven_pick(const struct pc_unproven *per, unsigned nreactors,
		     unsigned here, uint64_t now_ns);

#endif /* PC_COMMON_UNPROVEN_H */
