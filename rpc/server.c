/*
 * rpc/server.c — serving MessagePack-RPC on reactor connections.
 *
 * Owns: struct rpc_server (method hash table, limits, counters per reactor,
 * the connection count), struct rpc_sconn (one per client connection) and
 * struct rpc_call (one per request until its reply). Threading: the method
 * table and limits are read-only after rpc_server_new; a connection and its
 * calls belong to the reactor that accepted it; counters are per reactor
 * (relaxed stores, summed by rpc_server_stats); the connection count is the
 * only shared atomic (touched at accept and close, not per request).
 *
 * Input: bytes are scanned (rpc/mp.c) before anything is read, so a message
 * declaring more than the limits is refused without allocating; a malformed
 * message closes the connection (its msgid cannot be trusted); a well-formed
 * message with a bad shape, an unknown method or bad params gets an error
 * reply and the connection goes on. HTTP and TLS on the RPC port are named
 * in the log and closed.
 *
 * Lifetime: a connection holds one reference on its rpc_sconn and each live
 * call another, so an asynchronous reply after the client left finds the
 * sconn (marked gone) and is dropped. A module's per-connection data gets
 * mod_closed when the socket closes and mod_cleanup after the last call.
 */
#include <errno.h>
#include <grp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <xxhash.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/sha256.h"
#include "rpc/auth.h"
#include "rpc/msg.h"
#include "rpc/rpc.h"

#define LOG_MOD "rpc"
#define FD_QUEUE_MAX 16     /* descriptors held per connection */
#define UNAUTH_STRIKES 3    /* calls before auth tolerated, then close */

/* A method with its metric series. */
struct rpc_entry {
	const struct rpc_method *m;
	met_id calls;   /* peercache_rpc_requests_total{method} */
	met_id errors;  /* peercache_rpc_errors_total{method} */
	met_id latency; /* peercache_rpc_latency_seconds{method} */
	char labels[96];
};

struct rpc_server {
	struct rpc_limits lim;
	struct mp_limits mpl;
	struct rpc_entry **table;        /* open addressing, pow2 size */
	unsigned table_mask;
	struct rpc_entry *entries;       /* insertion order */
	unsigned nmethods;
	char *secret;                    /* NULL: no authentication */
	long allowed_gid;
	uid_t own_uid;
	unsigned nreactors;
	struct rpc_stats *st;            /* one per reactor */
	uint32_t conns;                  /* atomic: live connections */
};

struct rpc_sconn {
	struct rpc_server *srv;
	struct rx_conn *c;     /* NULL once the connection is gone */
	struct rx_reactor *r;
	struct rpc_stats *st;  /* this reactor's counters */
	unsigned refs;         /* the connection + each live call */
	uint32_t inflight;
	bool is_unix;
	bool authed;
	bool seen_bytes;
	bool nonce_issued;     /* auth.challenge answered, nonce below */
	bool paused;           /* by us, for max_inflight */
	const char *refusal;   /* set: answer the first request with it */
	uint8_t strikes;
	uint8_t nonce[RPC_NONCE_BYTES];
	size_t need;           /* bytes a partial message needs first */
	int fds[FD_QUEUE_MAX];
	unsigned nfds;
	void *mod_data;
	void (*mod_cleanup)(void *data);
	void (*mod_closed)(void *data); /* at close, calls maybe in flight */
	char peer[64];
};

struct rpc_call {
	struct rpc_sconn *sc;
	uint32_t msgid;
	bool notify;
	bool failed;            /* an error reply was sent */
	struct rpc_entry *e;
	uint64_t t0;            /* dispatch time (0 when metrics are off) */
	msgpack_packer pk;
};

/* ------------------------------------------------------------ the table */

static uint64_t name_hash(const char *s, size_t len)
{
	return XXH3_64bits(s, len);
}

static struct rpc_entry *find_entry(const struct rpc_server *s,
				    const char *name, size_t len)
{
	for (uint64_t i = name_hash(name, len);; i++) {
		struct rpc_entry *e = s->table[i & s->table_mask];
		if (!e)
			return NULL;
		if (strlen(e->m->name) == len &&
		    memcmp(e->m->name, name, len) == 0)
			return e;
	}
}

const struct rpc_method *rpc_server_find(const struct rpc_server *s,
					 const char *name, size_t len)
{
	struct rpc_entry *e = find_entry(s, name, len);
	return e ? e->m : NULL;
}

static int table_add(struct rpc_server *s, const struct rpc_method *m)
{
	size_t len = strlen(m->name);
	if (find_entry(s, m->name, len)) {
		PC_LOGE(LOG_MOD, "method %s is registered twice", m->name);
		return -EEXIST;
	}
	struct rpc_entry *e = &s->entries[s->nmethods++];
	e->m = m;
	snprintf(e->labels, sizeof(e->labels), "method=\"%s\"", m->name);
	e->calls = met_register(MET_COUNTER, "peercache_rpc_requests_total",
				"RPC requests and notifications by method",
				e->labels);
	e->errors = met_register(MET_COUNTER, "peercache_rpc_errors_total",
				 "RPC error replies by method", e->labels);
	e->latency = met_register(MET_HISTOGRAM, "peercache_rpc_latency_seconds",
				  "RPC latency from dispatch to reply, by "
				  "method", e->labels);
	for (uint64_t i = name_hash(m->name, len);; i++) {
		if (!s->table[i & s->table_mask]) {
			s->table[i & s->table_mask] = e;
			break;
		}
	}
	return 0;
}

static const struct rpc_method builtin_methods[];
static void rpc_collector(struct met_writer *w, void *arg);

int rpc_server_new(struct rpc_server **out, const struct rpc_limits *lim,
		   const struct rpc_method *const *user_tables,
		   unsigned nuser, const char *secret, long allowed_gid,
		   unsigned nreactors)
{
	const struct rpc_method *tables[nuser + 1];
	unsigned ntables = nuser + 1;
	tables[0] = builtin_methods;
	for (unsigned t = 0; t < nuser; t++)
		tables[t + 1] = user_tables[t];
	unsigned n = 0;
	for (unsigned t = 0; t < ntables; t++)
		for (const struct rpc_method *m = tables[t]; m && m->name; m++)
			n++;
	struct rpc_server *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->lim = *lim;
	s->mpl.max_bytes = lim->max_message_bytes;
	s->mpl.max_elements = lim->max_elements;
	s->mpl.max_depth = lim->max_depth;
	/* Scan work is bounded by objects per message: one per byte at most. */
	s->mpl.max_objects = (uint32_t)PC_MIN(lim->max_message_bytes,
					      (size_t)UINT32_MAX);
	s->table_mask = (unsigned)pc_roundup_pow2(2u * n + 2) - 1;
	s->table = calloc(s->table_mask + 1, sizeof(*s->table));
	s->entries = calloc(n + 1, sizeof(*s->entries));
	s->st = calloc(nreactors ? nreactors : 1, sizeof(*s->st));
	s->nreactors = nreactors;
	s->allowed_gid = allowed_gid;
	s->own_uid = geteuid();
	if (secret && *secret)
		s->secret = strdup(secret);
	int ret = 0;
	if (!s->table || !s->entries || !s->st ||
	    (secret && *secret && !s->secret))
		ret = -ENOMEM;
	for (unsigned t = 0; t < ntables && !ret; t++)
		for (const struct rpc_method *m = tables[t];
		     m && m->name && !ret; m++)
			ret = table_add(s, m);
	if (ret) {
		rpc_server_free(s);
		return ret;
	}
	met_register_collector(rpc_collector, s);
	*out = s;
	return 0;
}

void rpc_server_free(struct rpc_server *s)
{
	if (!s)
		return;
	met_unregister_collector(rpc_collector, s);
	if (s->secret) {
		explicit_bzero(s->secret, strlen(s->secret));
		free(s->secret);
	}
	free(s->table);
	free(s->entries);
	free(s->st);
	free(s);
}

unsigned rpc_server_methods(const struct rpc_server *s,
			    const struct rpc_method **out, unsigned max)
{
	unsigned n = PC_MIN(max, s->nmethods);
	for (unsigned i = 0; i < n; i++)
		out[i] = s->entries[i].m;
	return n;
}


void rpc_server_stats(struct rpc_server *s, struct rpc_stats *out)
{
	memset(out, 0, sizeof(*out));
	uint64_t *dst = (uint64_t *)out;
	for (unsigned r = 0; r < s->nreactors; r++) {
		const uint64_t *src = (const uint64_t *)&s->st[r];
		for (size_t k = 0; k < sizeof(*out) / sizeof(uint64_t); k++)
			dst[k] += __atomic_load_n(&src[k], __ATOMIC_RELAXED);
	}
}

static void rpc_collector(struct met_writer *w, void *arg)
{
	struct rpc_stats st;
	rpc_server_stats(arg, &st);
	static const struct {
		const char *name, *help;
		size_t off;
		enum met_type type;
	} rows[] = {
		{"peercache_rpc_connections", "RPC connections open",
		 offsetof(struct rpc_stats, conns_live), MET_GAUGE},
		{"peercache_rpc_connections_total", "RPC connections accepted",
		 offsetof(struct rpc_stats, conns_accepted), MET_COUNTER},
		{"peercache_rpc_connections_refused_total",
		 "RPC connections refused (limit or credentials)",
		 offsetof(struct rpc_stats, conns_refused), MET_COUNTER},
		{"peercache_rpc_auth_failures_total",
		 "calls or proofs refused for lack of authentication",
		 offsetof(struct rpc_stats, auth_failures), MET_COUNTER},
		{"peercache_rpc_late_replies_total",
		 "replies dropped because the client had left",
		 offsetof(struct rpc_stats, late_replies), MET_COUNTER},
	};
	for (size_t i = 0; i < PC_ARRAY_LEN(rows); i++) {
		uint64_t v;
		memcpy(&v, (const char *)&st + rows[i].off, sizeof(v));
		met_w_family(w, rows[i].name, rows[i].help, rows[i].type);
		met_w_sample(w, rows[i].name, NULL, (double)(int64_t)v);
	}
	met_w_family(w, "peercache_rpc_rejected_total",
		     "inputs refused on the RPC port, by reason", MET_COUNTER);
	for (unsigned k = 0; k < RPC_REJ__COUNT; k++) {
		char labels[64];
		snprintf(labels, sizeof(labels), "reason=\"%s\"",
			 rpc_reject_names[k]);
		met_w_sample(w, "peercache_rpc_rejected_total", labels,
			     (double)st.rejected_by[k]);
	}
}

/* ------------------------------------------------------------ connections */

static void sconn_unref(struct rpc_sconn *sc)
{
	PC_ASSERT(sc->refs > 0);
	if (--sc->refs)
		return;
	for (unsigned i = 0; i < sc->nfds; i++)
		close(sc->fds[i]);
	if (sc->mod_cleanup)
		sc->mod_cleanup(sc->mod_data);
	free(sc);
}

static int sconn_write(void *data, const char *buf, size_t len)
{
	struct rpc_sconn *sc = data;
	if (sc->c)
		rx_conn_write(sc->c, buf, len); /* fails only when closing */
	return 0;
}

static int null_write(void *data, const char *buf, size_t len)
{
	(void)data;
	(void)buf;
	(void)len;
	return 0;
}

static void on_close(struct rx_conn *c, int err)
{
	struct rpc_sconn *sc = rx_conn_udata(c);
	PC_LOGD(LOG_MOD, "%s: connection closed (%s)", sc->peer,
		err ? strerror(-err) : "orderly");
	sc->c = NULL;
	if (sc->mod_closed)
		sc->mod_closed(sc->mod_data);
	RX_STAT_ADD(sc->st->conns_live, (uint64_t)-1);
	__atomic_sub_fetch(&sc->srv->conns, 1, __ATOMIC_RELAXED);
	sconn_unref(sc);
}

static void on_fds(struct rx_conn *c, const int *fds, unsigned n)
{
	struct rpc_sconn *sc = rx_conn_udata(c);
	for (unsigned i = 0; i < n; i++) {
		if (sc->nfds < FD_QUEUE_MAX) {
			sc->fds[sc->nfds++] = fds[i];
			continue;
		}
		close(fds[i]);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: more than %d unclaimed "
			  "descriptors; closing", sc->peer, FD_QUEUE_MAX);
		rx_conn_close(c, RX_CLOSE_NOW, -EPROTO);
	}
}

const char *const rpc_reject_names[RPC_REJ__COUNT] = {
	[RPC_REJ_NOT_RPC] = "not_rpc",
	[RPC_REJ_NOT_MSGPACK] = "not_msgpack",
	[RPC_REJ_TOO_LARGE] = "too_large",
	[RPC_REJ_TOO_MANY] = "too_many_elements",
	[RPC_REJ_TOO_DEEP] = "too_deep",
	[RPC_REJ_HTTP] = "http",
	[RPC_REJ_TLS] = "tls",
	[RPC_REJ_UNAUTH] = "unauthenticated",
	[RPC_REJ_BAD_SHAPE] = "bad_shape",
};

/* One log limiter per reason, so a flood of one kind never hides another. */
static struct pc_ratelimit reject_rl[RPC_REJ__COUNT];

static void reject(struct rpc_sconn *sc, enum rpc_reject why,
		   const char *what)
{
	RX_STAT_INC(sc->st->rejected);
	RX_STAT_INC(sc->st->rejected_by[why]);
	if (why == RPC_REJ_BAD_SHAPE)
		return; /* answered with an error reply; not worth a log line */
	uint64_t n = pc_ratelimit_pass(&reject_rl[why], 10000);
	if (n > 1)
		PC_LOGW(LOG_MOD, "%s: %s; closing (+%llu similar suppressed)",
			sc->peer, what, (unsigned long long)(n - 1));
	else if (n == 1)
		PC_LOGW(LOG_MOD, "%s: %s; closing", sc->peer, what);
}

/* Name the protocol of a stray client, for the log line. */
static bool sniff(struct rpc_sconn *sc, const uint8_t *p, size_t len)
{
	static const char *const http[] = {"GET ", "POST", "PUT ", "HEAD",
					   "DELE", "OPTI", "PATC", "CONN",
					   "PRI ", "TRAC"};
	if (len >= 2 && p[0] == 0x16 && p[1] == 0x03) {
		reject(sc, RPC_REJ_TLS, "a TLS handshake on the RPC port (it "
		       "speaks plain MessagePack-RPC)");
		return true;
	}
	for (size_t i = 0; len >= 4 && i < PC_ARRAY_LEN(http); i++) {
		if (memcmp(p, http[i], 4) == 0) {
			reject(sc, RPC_REJ_HTTP, "an HTTP request on the RPC "
			       "port (it speaks MessagePack-RPC, not HTTP)");
			return true;
		}
	}
	return false;
}

static struct rpc_call *call_new(struct rpc_sconn *sc, uint32_t msgid,
				 bool notify, struct rpc_entry *e)
{
	struct rpc_call *call = malloc(sizeof(*call));
	if (!call)
		return NULL;
	call->sc = sc;
	call->msgid = msgid;
	call->notify = notify;
	call->failed = false;
	call->e = e;
	call->t0 = met_enabled ? pc_now_ns() : 0;
	sc->refs++;
	sc->inflight++;
	return call;
}

static void call_free(struct rpc_call *call)
{
	struct rpc_sconn *sc = call->sc;
	met_inc(call->e->calls);
	if (call->failed)
		met_inc(call->e->errors);
	if (call->t0)
		met_observe_ns(call->e->latency, pc_now_ns() - call->t0);
	sc->inflight--;
	if (sc->paused && sc->c && sc->inflight < sc->srv->lim.max_inflight) {
		sc->paused = false;
		rx_conn_resume(sc->c);
	}
	free(call);
	sconn_unref(sc);
}

/* An error reply for a message whose method never ran. */
static void early_error(struct rpc_sconn *sc, uint32_t msgid,
			const char *code, const char *fmt, ...)
	PC_PRINTF(4, 5);

static void pack_error(msgpack_packer *pk, const char *code, const char *msg)
{
	msgpack_pack_map(pk, 2);
	mp_pack_cstr(pk, "code");
	mp_pack_cstr(pk, code);
	mp_pack_cstr(pk, "message");
	mp_pack_cstr(pk, msg);
}

static void early_error(struct rpc_sconn *sc, uint32_t msgid,
			const char *code, const char *fmt, ...)
{
	char msg[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	msgpack_packer pk;
	msgpack_packer_init(&pk, sc, sconn_write);
	msgpack_pack_array(&pk, 4);
	msgpack_pack_uint8(&pk, RPC_RESPONSE);
	msgpack_pack_uint32(&pk, msgid);
	pack_error(&pk, code, msg);
	msgpack_pack_nil(&pk);
	RX_STAT_INC(sc->st->errors);
}

/* Dispatch one complete message. false: the connection is closing. */
static bool handle_message(struct rpc_sconn *sc, const uint8_t *p, size_t len)
{
	struct rpc_msg m;
	const char *why = NULL;
	int ret = rpc_msg_parse(p, len, &m, &why);
	if (ret == -EBADMSG || (ret == 0 && m.type == RPC_RESPONSE)) {
		reject(sc, RPC_REJ_NOT_RPC,
		       ret ? why : "a response sent to the server");
		return false;
	}
	bool notify = m.type == RPC_NOTIFY;
	if (ret < 0) {
		reject(sc, RPC_REJ_BAD_SHAPE, why);
		early_error(sc, m.msgid, RPC_E_BAD_REQUEST, "%s", why);
		return true;
	}
	if (sc->refusal) {
		RX_STAT_INC(sc->st->auth_failures);
		if (!notify)
			early_error(sc, m.msgid, RPC_E_UNAUTHORIZED, "%s",
				    sc->refusal);
		rx_conn_close(sc->c, RX_CLOSE_FLUSH, -EACCES);
		return false;
	}
	struct rpc_entry *ent = find_entry(sc->srv, m.method, m.method_len);
	const struct rpc_method *meth = ent ? ent->m : NULL;
	if (!meth) {
		if (!notify)
			early_error(sc, m.msgid, RPC_E_UNKNOWN_METHOD,
				    "no method '%.*s'",
				    (int)PC_MIN(m.method_len, 64u), m.method);
		return true;
	}
	if (!sc->authed && !(meth->flags & RPC_PUBLIC)) {
		RX_STAT_INC(sc->st->auth_failures);
		if (!notify)
			early_error(sc, m.msgid, RPC_E_UNAUTHORIZED,
				    "authenticate first: call auth.challenge, "
				    "then auth.response");
		if (++sc->strikes >= UNAUTH_STRIKES) {
			reject(sc, RPC_REJ_UNAUTH,
			       "repeated calls without authentication");
			rx_conn_close(sc->c, RX_CLOSE_FLUSH, -EACCES);
			return false;
		}
		return true;
	}
	if ((meth->flags & RPC_LOCAL_ONLY) && !sc->is_unix) {
		if (!notify)
			early_error(sc, m.msgid, RPC_E_FORBIDDEN,
				    "%s is served on the Unix socket only",
				    meth->name);
		return true;
	}
	struct rpc_call *call = call_new(sc, m.msgid, notify, ent);
	if (!call) {
		if (!notify)
			early_error(sc, m.msgid, RPC_E_BUSY, "out of memory");
		return true;
	}
	RX_STAT_INC(sc->st->requests);
	uint32_t nparams;
	mp_rd_array(&m.params, &nparams); /* checked by rpc_msg_parse */
	meth->fn(call, &m.params);
	return sc->c && !rx_conn_closing(sc->c);
}

static ssize_t on_data(struct rx_conn *c, const uint8_t *data, size_t len)
{
	struct rpc_sconn *sc = rx_conn_udata(c);
	if (!sc->seen_bytes) {
		sc->seen_bytes = true;
		if (sniff(sc, data, len))
			return -EPROTO;
	}
	if (len < sc->need)
		return 0; /* a partial message still short of what it needs */
	size_t used = 0;
	while (used < len && !sc->paused) {
		size_t size;
		int ret = mp_scan(data + used, len - used, &sc->srv->mpl, &size);
		if (ret == MP_NEED_MORE) {
			sc->need = size;
			break;
		}
		sc->need = 0;
		if (ret < 0) {
			if (ret == -EMSGSIZE)
				reject(sc, RPC_REJ_TOO_LARGE,
				       "message over the size limit");
			else if (ret == -E2BIG)
				reject(sc, RPC_REJ_TOO_MANY, "array or map over "
				       "the element limit");
			else if (ret == -ELOOP)
				reject(sc, RPC_REJ_TOO_DEEP,
				       "nesting over the depth limit");
			else
				reject(sc, RPC_REJ_NOT_MSGPACK,
				       "bytes that are not MessagePack");
			return ret;
		}
		if (!handle_message(sc, data + used, size))
			return (ssize_t)(used + size);
		used += size;
		if (sc->inflight >= sc->srv->lim.max_inflight && sc->c) {
			sc->paused = true; /* resumes when calls complete */
			rx_conn_pause(c);
		}
	}
	return (ssize_t)used;
}

static const struct rx_conn_ops rpc_conn_ops = {
	.on_data = on_data,
	.on_fds = on_fds,
	.on_close = on_close,
};

static bool in_group(int fd, long gid)
{
	gid_t groups[64];
	socklen_t len = sizeof(groups);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0)
		return false;
	for (size_t i = 0; i < len / sizeof(gid_t); i++)
		if ((long)groups[i] == gid)
			return true;
	return false;
}

/* SO_PEERCRED: the node's own uid, root, or the allowed group. */
static void check_peer_cred(struct rpc_sconn *sc, int fd)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0) {
		sc->refusal = "peer credentials are unavailable";
		return;
	}
	snprintf(sc->peer, sizeof(sc->peer), "unix uid=%u pid=%d",
		 (unsigned)cr.uid, (int)cr.pid);
	if (cr.uid == sc->srv->own_uid || cr.uid == 0)
		return;
	if (sc->srv->allowed_gid >= 0 &&
	    ((long)cr.gid == sc->srv->allowed_gid ||
	     in_group(fd, sc->srv->allowed_gid)))
		return;
	sc->refusal = "this user may not use the node's socket (allowed: "
		      "the node's own user, root, or the group in "
		      "socket_group)";
	PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "refusing %s: not the node's user, "
		  "root, or the allowed group", sc->peer);
}

static void describe_tcp_peer(struct rpc_sconn *sc, int fd)
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
		} else if (ss.ss_family == AF_INET6) {
			struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
			inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
			port = ntohs(a->sin6_port);
		}
	}
	snprintf(sc->peer, sizeof(sc->peer), "%s:%u", host, port);
}

void rpc_server_accept(struct rpc_server *s, struct rx_reactor *r, int fd,
		       bool is_unix)
{
	struct rpc_stats *st = &s->st[rx_reactor_id(r)];
	uint32_t n = __atomic_add_fetch(&s->conns, 1, __ATOMIC_RELAXED);
	if (n > s->lim.max_connections) {
		__atomic_sub_fetch(&s->conns, 1, __ATOMIC_RELAXED);
		RX_STAT_INC(st->conns_refused);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "refusing a connection: %u "
			  "connections is the limit (rpc_max_connections)",
			  s->lim.max_connections);
		close(fd);
		return;
	}
	struct rpc_sconn *sc = calloc(1, sizeof(*sc));
	if (!sc) {
		__atomic_sub_fetch(&s->conns, 1, __ATOMIC_RELAXED);
		close(fd);
		return;
	}
	sc->srv = s;
	sc->r = r;
	sc->st = st;
	sc->refs = 1;
	sc->is_unix = is_unix;
	/* The secret guards TCP; Unix clients are checked by credentials. */
	sc->authed = is_unix || !s->secret;
	if (is_unix)
		check_peer_cred(sc, fd);
	else
		describe_tcp_peer(sc, fd);
	int err;
	sc->c = rx_conn_attach(r, fd, &rpc_conn_ops, sc, &err);
	if (!sc->c) {
		__atomic_sub_fetch(&s->conns, 1, __ATOMIC_RELAXED);
		free(sc);
		return;
	}
	/* Room for one whole message plus the start of the next. */
	rx_conn_set_limits(sc->c, s->lim.max_message_bytes + 65536, 0, 0, 0);
	if (is_unix && s->lim.max_fds)
		rx_conn_enable_fds(sc->c, s->lim.max_fds);
	RX_STAT_INC(st->conns_accepted);
	RX_STAT_INC(st->conns_live);
	PC_LOGD(LOG_MOD, "%s: connected", sc->peer);
}

/* ------------------------------------------------------------------ calls */

struct rx_reactor *rpc_call_reactor(const struct rpc_call *call)
{
	return call->sc->r;
}

struct rpc_server *rpc_call_server(const struct rpc_call *call)
{
	return call->sc->srv;
}

bool rpc_call_is_local(const struct rpc_call *call)
{
	return call->sc->is_unix;
}

const char *rpc_call_peer(const struct rpc_call *call)
{
	return call->sc->peer;
}

int rpc_call_take_fd(struct rpc_call *call)
{
	struct rpc_sconn *sc = call->sc;
	if (!sc->nfds)
		return -1;
	int fd = sc->fds[0];
	memmove(sc->fds, sc->fds + 1, --sc->nfds * sizeof(int));
	return fd;
}

void *rpc_call_conn_data(const struct rpc_call *call)
{
	return call->sc->mod_data;
}

void rpc_call_set_conn_data(struct rpc_call *call, void *data,
			    void (*cleanup)(void *data))
{
	call->sc->mod_data = data;
	call->sc->mod_cleanup = cleanup;
}

void rpc_call_set_conn_closed(struct rpc_call *call,
			      void (*closed)(void *data))
{
	call->sc->mod_closed = closed;
}



msgpack_packer *rpc_reply_begin(struct rpc_call *call)
{
	struct rpc_sconn *sc = call->sc;
	if (call->notify || !sc->c) {
		/* Nobody to answer: the result is packed into nothing. */
		if (!sc->c && !call->notify)
			RX_STAT_INC(sc->st->late_replies);
		msgpack_packer_init(&call->pk, NULL, null_write);
		return &call->pk;
	}
	msgpack_packer_init(&call->pk, sc, sconn_write);
	msgpack_pack_array(&call->pk, 4);
	msgpack_pack_uint8(&call->pk, RPC_RESPONSE);
	msgpack_pack_uint32(&call->pk, call->msgid);
	msgpack_pack_nil(&call->pk);
	return &call->pk;
}

void rpc_reply_end(struct rpc_call *call)
{
	call_free(call);
}

PC_PRINTF(3, 0)
static void reply_error_v(struct rpc_call *call, const char *code,
			  const char *fmt, va_list ap)
{
	struct rpc_sconn *sc = call->sc;
	char msg[256];
	vsnprintf(msg, sizeof(msg), fmt, ap);
	call->failed = true;
	if (!call->notify && sc->c) {
		msgpack_packer pk;
		msgpack_packer_init(&pk, sc, sconn_write);
		msgpack_pack_array(&pk, 4);
		msgpack_pack_uint8(&pk, RPC_RESPONSE);
		msgpack_pack_uint32(&pk, call->msgid);
		pack_error(&pk, code, msg);
		msgpack_pack_nil(&pk);
	}
	RX_STAT_INC(sc->st->errors);
}

void rpc_reply_error(struct rpc_call *call, const char *code, const char *fmt,
		     ...)
{
	va_list ap;
	va_start(ap, fmt);
	reply_error_v(call, code, fmt, ap);
	va_end(ap);
	call_free(call);
}

void rpc_reply_error_close(struct rpc_call *call, const char *code,
			   const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	reply_error_v(call, code, fmt, ap);
	va_end(ap);
	if (call->sc->c)
		rx_conn_close(call->sc->c, RX_CLOSE_FLUSH, -EACCES);
	call_free(call);
}

void rpc_reply_nil(struct rpc_call *call)
{
	msgpack_pack_nil(rpc_reply_begin(call));
	rpc_reply_end(call);
}

static void pack_bool(msgpack_packer *pk, bool v)
{
	if (v)
		msgpack_pack_true(pk);
	else
		msgpack_pack_false(pk);
}

void rpc_reply_bool(struct rpc_call *call, bool v)
{
	msgpack_packer *pk = rpc_reply_begin(call);
	pack_bool(pk, v);
	rpc_reply_end(call);
}

void rpc_reply_bools(struct rpc_call *call, const bool *v, size_t n)
{
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_array(pk, n);
	for (size_t i = 0; i < n; i++)
		pack_bool(pk, v[i]);
	rpc_reply_end(call);
}

void rpc_reply_uint(struct rpc_call *call, uint64_t v)
{
	msgpack_pack_uint64(rpc_reply_begin(call), v);
	rpc_reply_end(call);
}

/* --------------------------------------------------- built-in auth methods */

static void m_auth_challenge(struct rpc_call *call, struct mp_rd *params)
{
	(void)params;
	struct rpc_sconn *sc = call->sc;
	if (!sc->srv->secret) {
		rpc_reply_error(call, RPC_E_UNSUPPORTED,
				"this node has no cluster_secret; "
				"authentication is not needed");
		return;
	}
	if (pc_random_bytes(sc->nonce, sizeof(sc->nonce)) < 0) {
		rpc_reply_error(call, RPC_E_INTERNAL, "no random bytes");
		return;
	}
	sc->nonce_issued = true;
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_map(pk, 3);
	mp_pack_cstr(pk, "nonce");
	msgpack_pack_bin(pk, sizeof(sc->nonce));
	msgpack_pack_bin_body(pk, sc->nonce, sizeof(sc->nonce));
	mp_pack_cstr(pk, "alg");
	mp_pack_cstr(pk, "hmac-sha256");
	mp_pack_cstr(pk, "version");
	msgpack_pack_uint8(pk, 1);
	rpc_reply_end(call);
}

static void m_auth_response(struct rpc_call *call, struct mp_rd *params)
{
	struct rpc_sconn *sc = call->sc;
	const uint8_t *proof, *cnonce;
	uint32_t plen, clen;
	if (!sc->srv->secret) {
		rpc_reply_error(call, RPC_E_UNSUPPORTED,
				"this node has no cluster_secret");
		return;
	}
	if (mp_rd_bin(params, &proof, &plen) < 0 ||
	    mp_rd_bin(params, &cnonce, &clen) < 0 ||
	    plen != PC_SHA256_BYTES || clen != RPC_NONCE_BYTES) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS,
				"expected [proof: bin 32, client_nonce: bin 32]");
		return;
	}
	if (!sc->nonce_issued) {
		rpc_reply_error(call, RPC_E_BAD_REQUEST,
				"call auth.challenge first");
		return;
	}
	sc->nonce_issued = false; /* one answer per challenge */
	uint8_t want[PC_SHA256_BYTES];
	rpc_auth_proof(sc->srv->secret, sc->nonce, cnonce, false, want);
	if (!pc_ct_equal(want, proof, sizeof(want))) {
		RX_STAT_INC(sc->st->auth_failures);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: wrong cluster secret; "
			  "closing", sc->peer);
		rpc_reply_error_close(call, RPC_E_UNAUTHORIZED,
				      "wrong proof: the cluster secrets differ");
		return;
	}
	sc->authed = true;
	sc->strikes = 0;
	uint8_t mine[PC_SHA256_BYTES];
	rpc_auth_proof(sc->srv->secret, sc->nonce, cnonce, true, mine);
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_map(pk, 1);
	mp_pack_cstr(pk, "proof");
	msgpack_pack_bin(pk, sizeof(mine));
	msgpack_pack_bin_body(pk, mine, sizeof(mine));
	rpc_reply_end(call);
}

static const struct rpc_method builtin_methods[] = {
	{"auth.challenge", m_auth_challenge, RPC_PUBLIC,
	 "start cluster authentication: returns a fresh nonce"},
	{"auth.response", m_auth_response, RPC_PUBLIC,
	 "prove the cluster secret; returns the node's own proof"},
	{NULL, NULL, 0, NULL},
};
