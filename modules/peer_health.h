/*
 * modules/peer_health.h — which peers answer, for the modules that call them.
 *
 * Owns: the interface of the peer-health table (implemented by the cluster
 * module, modules/cluster.c, which owns membership), offered as the "health"
 * service (modules/services.h). Threading: every call is safe from any
 * reactor thread; suspect() is one lookup in the current ring and one atomic
 * load. A module that must act when a peer becomes suspect (or recovers)
 * subscribes to the membership events (modules/membership.h).
 *
 * A peer is named by its ring id ("host:rpc_port", as in directory records'
 * `node`). It is healthy until a call to it gets no answer — an RPC timeout,
 * a data-port read timeout, a connect timeout, refusal or reset — and then
 * suspect from that first failure: users skip it (directory lookups ask the
 * next replica, publishes store on the other owners, reads of its pages are
 * misses at once) until it answers a probe (node.health, sent from reactor 0
 * every peer_probe_interval while it is suspect). Each change of state is
 * logged once.
 */
#ifndef PC_MODULES_PEER_HEALTH_H
#define PC_MODULES_PEER_HEALTH_H

#include <errno.h>
#include <stdbool.h>


struct ph_api {
	/* True while peer is suspect, and for a peer that left the ring (one
	 * of the last 64 that did, until it joins again). Other names that
	 * are not members, and this node itself, are never suspect. */
	bool (*suspect)(const char *peer);
	/* A call to peer got no answer (err: a negative errno for which
	 * ph_no_answer() holds); what names the call for the log ("dir.get",
	 * "data read"). Marks the peer suspect; the first caller logs. */
	void (*failed)(const char *peer, int err, const char *what);
};

/* A timeout shorter than this says nothing about the peer (the caller's
 * deadline had almost run out): callers do not report it. */
#define PH_EVIDENCE_MS 50

/* Errors that mean the peer did not answer: as opposed to an answer that is
 * an error (-EREMOTEIO), a refused handshake (-EACCES), a bad request of our
 * own, this node shutting down (-ESHUTDOWN), or a call cut short because the
 * peer was already suspect or left (-EHOSTDOWN, from the MB_SUSPECT and
 * MB_LEAVE subscribers: not news, and it must not undo a probe that just
 * succeeded). */
static inline bool ph_no_answer(int err)
{
	switch (-err) {
	case ETIMEDOUT:
	case ECONNREFUSED:
	case ECONNRESET:
	case ECONNABORTED:
	case EHOSTUNREACH:
	case ENETUNREACH:
	case EPIPE:
		return true;
	default:
		return false;
	}
}

/* Is a call's failure with err, after a timeout of timeout_ms, evidence
 * that the peer does not answer (worth ph_api.failed)? */
static inline bool ph_evidence(int err, unsigned timeout_ms)
{
	return ph_no_answer(err) &&
	       (err != -ETIMEDOUT || timeout_ms >= PH_EVIDENCE_MS);
}

#endif /* PC_MODULES_PEER_HEALTH_H */
