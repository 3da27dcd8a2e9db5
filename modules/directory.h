/*
 * modules/directory.h — the p2p directory as other modules use it.
 *
 * Owns: the record type and the client API of the directory module
 * (modules/directory.c), offered as the "dir" service (modules/services.h).
 * Threading: calls are made on a reactor thread, and complete on it.
 *
 * A record says where a page lives: which node produced it, where to read it
 * (data endpoint, address, rkey), its payload length and generation, and
 * whether it is resident in memory. Each record is stored on the first
 * `directory_replicas` owners of its key on the ring. Lookups ask the
 * primary and fall back to the next replica both when an owner is
 * unreachable and when it answers "not found". Owners the peer-health table
 * holds suspect (modules/peer_health.h) are skipped.
 *
 * Deadlines: deadline_ns is a pc_now_ns() value after which the call stops
 * waiting (no RPC of it outlives it) and reports what it has; 0 means
 * rpc_timeout from now.
 */
#ifndef PC_MODULES_DIRECTORY_H
#define PC_MODULES_DIRECTORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "reactor/reactor.h"

#define DIR_KEY_MAX 512 /* bytes of a key */
#define DIR_NODE_MAX 160

struct dir_rec {
	bool found;
	bool resident;
	char node[DIR_NODE_MAX]; /* producer's ring id ("host:rpc_port") */
	char data[DIR_NODE_MAX]; /* producer's data endpoint */
	uint64_t addr;           /* page header address in the producer */
	uint32_t rkey;
	uint32_t len;            /* payload bytes */
	uint64_t gen;
};

/* A batch of keys: keys[i] has klens[i] bytes. */
struct dir_keys {
	const char *const *keys;
	const size_t *klens;
	unsigned n;
};

typedef void (*dir_done_fn)(void *arg);

struct dir_api {
	/* Find records; recs[i].found tells. done runs once, later. */
	int (*lookup)(struct rx_reactor *r, const struct dir_keys *k,
		      struct dir_rec *recs, uint64_t deadline_ns,
		      dir_done_fn done, void *arg);
	/* Store records on every owner; ok[i] when at least one stored it. */
	int (*publish)(struct rx_reactor *r, const struct dir_keys *k,
		       const struct dir_rec *recs, bool *ok,
		       uint64_t deadline_ns, dir_done_fn done, void *arg);
	/* Delete records on every owner: only those of node with gens[i]
	 * (node NULL: whatever they hold). existed[i] (may be NULL) tells if
	 * an owner had one. done may be NULL (fire and forget). */
	int (*remove)(struct rx_reactor *r, const struct dir_keys *k,
		      const char *node, const uint64_t *gens, bool *existed,
		      uint64_t deadline_ns, dir_done_fn done, void *arg);
};

#endif /* PC_MODULES_DIRECTORY_H */
