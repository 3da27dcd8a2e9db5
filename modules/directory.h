/*
 * modules/directory.h — the p2p directory as other modules see it.
 *
 * Owns: nothing but this description; the directory module
 * (modules/directory.c) is p2p's placement (modules/placement.h) and offers
 * itself as the "placement" service when mode = p2p. Threading: calls are
 * made on a reactor thread, and complete on it.
 *
 * Each record is stored on the first `directory_replicas` owners of its key
 * on the ring. Lookups ask the primary and fall back to the next replica
 * both when an owner is unreachable and when it answers "not found"; a node
 * that is one of the owners asks its own replica first (PL_LOOKUP_IN_ORDER
 * and PL_LOOKUP_ELSEWHERE change that). Owners the peer-health table holds
 * suspect (modules/peer_health.h) are skipped.
 * "Is it here" is: the record names this node as its producer.
 */
#ifndef PC_MODULES_DIRECTORY_H
#define PC_MODULES_DIRECTORY_H

#include "modules/placement.h"

#endif /* PC_MODULES_DIRECTORY_H */
