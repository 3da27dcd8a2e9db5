/*
 * rpc/peercred.c — the local-user rule: who owns the client end of a
 * loopback TCP connection, and whether that user may use the node.
 *
 * Owns: nothing long-lived; each lookup opens a NETLINK_SOCK_DIAG socket,
 * asks the kernel for the one TCP socket with the client's 4-tuple (an exact
 * lookup, not a dump) and reads its owner's uid. Threading: any thread.
 * Cost: one netlink round trip per accepted TCP connection (tens of
 * microseconds), on node without a cluster secret only.
 *
 * Why: a node listening on loopback is reachable by every local user. The
 * Unix socket checks SO_PEERCRED; TCP has no such option, but for loopback
 * the client's socket lives in this kernel and sock_diag reports its owner
 * (the same answer `ss -tne` prints). A client whose owner cannot be found
 * (a lookup error, a non-loopback source, a client socket already closed and
 * orphaned — the kernel reports uid 0 for those) is refused: the rule fails
 * closed.
 */
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "common/util.h"
#include "rpc/peercred.h"

#define GROUPS_MAX 256

void rpc_local_rule_init(struct rpc_local_rule *rule, long allowed_gid)
{
	rule->own_uid = geteuid();
	rule->allowed_gid = allowed_gid;
}

long rpc_group_id(const char *name)
{
	if (!name || !*name)
		return -1;
	char *end;
	long gid = strtol(name, &end, 10);
	if (*end == '\0' && gid >= 0)
		return gid;
	struct group gr, *res = NULL;
	char buf[16384];
	if (getgrnam_r(name, &gr, buf, sizeof(buf), &res) != 0 || !res)
		return -2;
	return (long)res->gr_gid;
}

static bool v4_loopback(const struct in_addr *a)
{
	return (ntohl(a->s_addr) >> 24) == 127;
}

static bool v6_loopback(const struct in6_addr *a)
{
	if (IN6_IS_ADDR_LOOPBACK(a))
		return true;
	if (IN6_IS_ADDR_V4MAPPED(a))
		return a->s6_addr[12] == 127;
	return false;
}

/* Fill the diag request's id from the connection's two ends: the socket
 * wanted is the client's, so its "source" is the client's address. */
static int fill_id(int fd, struct inet_diag_req_v2 *req)
{
	struct sockaddr_storage peer, self;
	socklen_t pl = sizeof(peer), sl = sizeof(self);
	if (getpeername(fd, (struct sockaddr *)&peer, &pl) < 0 ||
	    getsockname(fd, (struct sockaddr *)&self, &sl) < 0)
		return -errno;
	if (peer.ss_family != self.ss_family)
		return -EAFNOSUPPORT;
	req->sdiag_family = (uint8_t)peer.ss_family;
	req->sdiag_protocol = IPPROTO_TCP;
	req->idiag_states = ~0u;
	req->id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
	req->id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
	if (peer.ss_family == AF_INET) {
		struct sockaddr_in *p = (struct sockaddr_in *)&peer;
		struct sockaddr_in *s = (struct sockaddr_in *)&self;
		if (!v4_loopback(&p->sin_addr))
			return -EADDRNOTAVAIL;
		req->id.idiag_sport = p->sin_port;
		req->id.idiag_dport = s->sin_port;
		memcpy(req->id.idiag_src, &p->sin_addr, 4);
		memcpy(req->id.idiag_dst, &s->sin_addr, 4);
		return 0;
	}
	if (peer.ss_family == AF_INET6) {
		struct sockaddr_in6 *p = (struct sockaddr_in6 *)&peer;
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)&self;
		if (!v6_loopback(&p->sin6_addr))
			return -EADDRNOTAVAIL;
		req->id.idiag_sport = p->sin6_port;
		req->id.idiag_dport = s->sin6_port;
		memcpy(req->id.idiag_src, &p->sin6_addr, 16);
		memcpy(req->id.idiag_dst, &s->sin6_addr, 16);
		return 0;
	}
	return -EAFNOSUPPORT;
}

/*
 * The uid in an answer, if it may be trusted. A client that closed its end
 * right after sending leaves an orphan socket (no file, inode 0) for which
 * the kernel reports uid 0: that must not pass for root. So the answer must
 * be the very socket asked for, still attached to a file, in a state a
 * connected client can be in.
 */
static int owner_of(const struct inet_diag_msg *d,
		    const struct inet_diag_sockid *want, uid_t *uid)
{
	if (d->id.idiag_sport != want->idiag_sport ||
	    d->id.idiag_dport != want->idiag_dport ||
	    memcmp(d->id.idiag_src, want->idiag_src, sizeof(want->idiag_src)) ||
	    memcmp(d->id.idiag_dst, want->idiag_dst, sizeof(want->idiag_dst)))
		return -ESRCH;
	if (d->idiag_inode == 0)
		return -ENOTCONN; /* orphaned: its owner is gone */
	switch (d->idiag_state) {
	case 1:  /* TCP_ESTABLISHED */
	case 4:  /* TCP_FIN_WAIT1: shut down for writing, still owned */
	case 5:  /* TCP_FIN_WAIT2 */
	case 8:  /* TCP_CLOSE_WAIT */
		break;
	default:
		return -ENOTCONN;
	}
	*uid = (uid_t)d->idiag_uid;
	return 0;
}

int rpc_tcp_peer_uid(int fd, uid_t *uid)
{
	struct {
		struct nlmsghdr nlh;
		struct inet_diag_req_v2 req;
	} msg;
	memset(&msg, 0, sizeof(msg));
	int ret = fill_id(fd, &msg.req);
	if (ret < 0)
		return ret;
	msg.nlh.nlmsg_len = sizeof(msg);
	msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
	msg.nlh.nlmsg_flags = NLM_F_REQUEST;
	msg.nlh.nlmsg_seq = 1;

	int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC,
			NETLINK_SOCK_DIAG);
	if (nl < 0)
		return -errno;
	struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
	if (sendto(nl, &msg, sizeof(msg), 0, (struct sockaddr *)&kernel,
		   sizeof(kernel)) < 0) {
		ret = -errno;
		close(nl);
		return ret;
	}
	/* One answer: the socket's inet_diag_msg, or an error. A short
	 * timeout: the kernel answers at once or not at all. */
	struct timeval tv = {.tv_sec = 0, .tv_usec = 200000};
	setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	union {
		struct nlmsghdr h;
		char raw[8192];
	} buf;
	ssize_t n = recv(nl, &buf, sizeof(buf), 0);
	ret = n < 0 ? -errno : -ENOENT;
	close(nl);
	for (struct nlmsghdr *h = &buf.h; n > 0 && NLMSG_OK(h, (size_t)n);
	     h = NLMSG_NEXT(h, n)) {
		if (h->nlmsg_type == NLMSG_ERROR) {
			const struct nlmsgerr *e = NLMSG_DATA(h);
			if (h->nlmsg_len >= NLMSG_LENGTH(sizeof(*e)) &&
			    e->error < 0)
				ret = e->error;
			break;
		}
		if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY &&
		    h->nlmsg_len >= NLMSG_LENGTH(sizeof(struct inet_diag_msg))) {
			const struct inet_diag_msg *d = NLMSG_DATA(h);
			return owner_of(d, &msg.req.id, uid);
		}
		if (h->nlmsg_type == NLMSG_DONE)
			break;
	}
	return ret;
}

/* Is uid in group want (its passwd primary group or a supplementary one)? */
static bool uid_in_group(uid_t uid, long want)
{
	struct passwd pw, *res = NULL;
	char buf[16384];
	if (getpwuid_r(uid, &pw, buf, sizeof(buf), &res) != 0 || !res)
		return false;
	if ((long)res->pw_gid == want)
		return true;
	gid_t groups[GROUPS_MAX];
	int n = GROUPS_MAX;
	if (getgrouplist(res->pw_name, res->pw_gid, groups, &n) < 0)
		n = GROUPS_MAX; /* more than fit: check those that did */
	for (int i = 0; i < n; i++)
		if ((long)groups[i] == want)
			return true;
	return false;
}

/*
 * Group answers per thread, for GROUP_CACHE_NS: the lookup behind them
 * (passwd and group databases, maybe LDAP) must not run for every
 * connection a flood of one user opens. A change of group membership takes
 * effect within that time.
 */
#define GROUP_CACHE 8
#define GROUP_CACHE_NS (10ull * 1000000000ull)
static _Thread_local struct {
	uid_t uid;
	long want;
	bool in;
	uint64_t until_ns;
} t_groups[GROUP_CACHE];
static _Thread_local unsigned t_groups_next;

static bool uid_in_group_cached(uid_t uid, long want)
{
	uint64_t now = pc_now_ns();
	for (unsigned i = 0; i < GROUP_CACHE; i++)
		if (t_groups[i].until_ns > now && t_groups[i].uid == uid &&
		    t_groups[i].want == want)
			return t_groups[i].in;
	bool in = uid_in_group(uid, want);
	unsigned i = t_groups_next++ % GROUP_CACHE;
	t_groups[i].uid = uid;
	t_groups[i].want = want;
	t_groups[i].in = in;
	t_groups[i].until_ns = now + GROUP_CACHE_NS;
	return in;
}

bool rpc_local_allowed(const struct rpc_local_rule *rule, uid_t uid,
		       long gid)
{
	if (uid == rule->own_uid || uid == 0)
		return true;
	if (rule->allowed_gid < 0)
		return false;
	/* A known primary group decides at once; else ask (cached). */
	if (gid >= 0 && gid == rule->allowed_gid)
		return true;
	return uid_in_group_cached(uid, rule->allowed_gid);
}

int rpc_tcp_peer_check(const struct rpc_local_rule *rule, int fd, char *who,
		       size_t wholen)
{
	uid_t uid;
	int ret = rpc_tcp_peer_uid(fd, &uid);
	if (ret < 0) {
		if (who)
			snprintf(who, wholen, "uid=?");
		return ret;
	}
	if (who)
		snprintf(who, wholen, "uid=%u", (unsigned)uid);
	return rpc_local_allowed(rule, uid, -1) ? 0 : -EACCES;
}

void rpc_tcp_peer_name(int fd, char *out, size_t outlen, uint8_t *addr16)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char host[INET6_ADDRSTRLEN] = "?";
	unsigned port = 0;
	if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) {
		if (ss.ss_family == AF_INET) {
			struct sockaddr_in *a = (struct sockaddr_in *)&ss;
			inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
			port = ntohs(a->sin_port);
			if (addr16) { /* v4-mapped */
				memset(addr16, 0, 10);
				addr16[10] = addr16[11] = 0xff;
				memcpy(addr16 + 12, &a->sin_addr, 4);
			}
		} else if (ss.ss_family == AF_INET6) {
			struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
			inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
			port = ntohs(a->sin6_port);
			if (addr16)
				memcpy(addr16, &a->sin6_addr, 16);
		}
	}
	snprintf(out, outlen, "%s:%u", host, port);
}
