/*
 * rpc/peercred.h — who is on the other end of a local connection.
 *
 * Owns: the "local user" rule of the node (docs/security.md): without a
 * cluster secret, a client may use a node only when it runs as the node's
 * own user, as root, or as a member of socket_group — on the Unix socket
 * (SO_PEERCRED) and on loopback TCP alike. For a loopback TCP connection the
 * kernel knows which user owns the client's socket; sock_diag (the netlink
 * interface `ss -e` uses) tells it. Threading: any thread; every call is a
 * few short syscalls (one netlink round trip), no shared state.
 */
#ifndef PC_RPC_PEERCRED_H
#define PC_RPC_PEERCRED_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* Who may use the node without the secret. */
struct rpc_local_rule {
	uid_t own_uid;    /* the node's effective uid */
	long allowed_gid; /* socket_group's gid, or -1 */
};

void rpc_local_rule_init(struct rpc_local_rule *rule, long allowed_gid);

/* A group by name or number: its gid; -1 for "" (none); -2 if unknown. */
long rpc_group_id(const char *name);

/*
 * The uid owning the client socket of the accepted TCP connection fd.
 * 0 and *uid; -EADDRNOTAVAIL when the client is not on a loopback address
 * (its owner cannot be known); another -errno when the lookup failed.
 */
int rpc_tcp_peer_uid(int fd, uid_t *uid);

/* May a process of uid (primary group gid, or -1 when unknown) use the
 * node? The group is checked against the uid's supplementary groups too. */
bool rpc_local_allowed(const struct rpc_local_rule *rule, uid_t uid,
		       long gid);

/*
 * The whole check for an accepted TCP connection on a node without a
 * secret: 0 when its client is a permitted local user; -EACCES when it is
 * another user; another -errno when the owner could not be found (refuse
 * then, too). who (may be NULL) gets "uid=N" for logs.
 */
int rpc_tcp_peer_check(const struct rpc_local_rule *rule, int fd, char *who,
		       size_t wholen);

/* "host:port" of the client of the accepted TCP connection fd, for logs
 * ("?:0" when unknown); addr16 (may be NULL) gets its address as 16 bytes
 * (IPv4 v4-mapped), left as it was when unknown. */
void rpc_tcp_peer_name(int fd, char *out, size_t outlen, uint8_t *addr16);

#endif /* PC_RPC_PEERCRED_H */
