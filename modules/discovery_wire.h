/*
 * modules/discovery_wire.h — what the embedded discovery protocol reads off
 * the meta port (docs/protocol.md "Meta port"), as pure functions: the
 * [id, meta, head] of discovery.register / .heartbeat, a heartbeat's answer
 * and a member list (discovery.register's and discovery.members' answer).
 *
 * Owns: the member entry and member list types and their decoders; no
 * state. Threading: any (the discovery thread is the only caller in the
 * node). Fuzzed by tests/fuzz/fuzz_discovery.c; unit-tested by
 * tests/unit/test_discovery_wire.c.
 *
 * Invariants of a decoded list: at most DISC_MEMBERS_MAX members, each with
 * an id that passes disc_addr_ok (and a meta that does, or ""), at most
 * DISC_MASTERS_MAX masters that pass it; members are counted in l->n and
 * l->e holds n + 1 entries.
 */
#ifndef PC_MODULES_DISCOVERY_WIRE_H
#define PC_MODULES_DISCOVERY_WIRE_H

#include <stdbool.h>
#include <stdint.h>

#include "rpc/mp.h"

#define DISC_ADDR_MAX 160
#define DISC_MEMBERS_MAX 1024
#define DISC_MASTERS_MAX 16

/* A member: of this node's table, or of a list read from a master. */
struct disc_entry {
	char id[DISC_ADDR_MAX];   /* ring id: host:rpc_port */
	char meta[DISC_ADDR_MAX]; /* host:meta_port, "" when it serves none */
	bool head;
	bool suspect;
	uint64_t seen_ns;         /* last heartbeat (or register) */
};

/* A member list: a table, or a copy of a master's. */
struct disc_list {
	struct disc_entry *e;
	unsigned n;
	uint64_t epoch;           /* + 1 per member added or removed */
	uint64_t states;          /* + 1 per suspect / alive flip */
	char masters[DISC_MASTERS_MAX][DISC_ADDR_MAX];
	unsigned nmasters;
};

/* A heartbeat's answer: {known, epoch, states, warm}. */
struct disc_hb_reply {
	bool known, warm;
	uint64_t epoch, states;
};

/* "host:port" (1..DISC_ADDR_MAX-1 bytes, a port 1..65535, no separators)
 * copied NUL-terminated into out. */
bool disc_addr_ok(const char *s, uint32_t len, char *out);

/* Read {epoch, states, masters, members: [{id, meta, head, state,
 * age_ms}]} into l (zeroed first; ages taken from now). Members whose id
 * is not an address are left out, masters too. 0, -EPROTO (malformed, too
 * many members, members given twice) or -ENOMEM. The caller frees l->e
 * whatever the result. */
int disc_list_read(struct mp_rd r, struct disc_list *l, uint64_t now);

/* Read a heartbeat's answer: 0 or -EPROTO. */
int disc_hb_reply_read(struct mp_rd r, struct disc_hb_reply *h);

/* Read the [id, meta, head] of a register or heartbeat from p into e
 * (zeroed first): 0 or -EINVAL. */
int disc_node_read(struct mp_rd *p, struct disc_entry *e);

#endif /* PC_MODULES_DISCOVERY_WIRE_H */
