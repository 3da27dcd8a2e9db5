/*
 * rpc/server.c — serving MessagePack-RPC on reactor connections.
 *
 * Owns: struct rpc_server (method hash table, limits, counters per reactor,
 * the connection count), struct rpc_sconn (one per client connection) and
 * struct rpc_call (one per request until its reply). Threading: the method
 * table and limits are read-only after rpc_server_new; a connection and its
 * calls belong to the reactor that serves it (the one it was handed to,
 * if any, never moving after it is served); counters are per reactor
 * (relaxed stores, summed by rpc_server_stats); the connection counts per
 * class, the per-host table (a mutex) and the memory budget are the shared
 * state, touched at accept, authentication and close, and per buffer growth
 * — never per request or per byte.
 *
 * Connection classes: pre-auth TCP (a secret is set and the client has not
 * proven it), authenticated TCP, and Unix-socket clients each have their own
 * cap, so a flood of one never refuses the others; TCP is also capped per
 * source address. A TCP connection is "unproven" until it authenticates
 * (or, when it was authenticated at accept, until its first request): a full
 * class or host cap drops the oldest unproven connection of the reactor
 * serving the new one instead of refusing it (when it has none, the new one
 * is handed to the reactor that has, common/unproven.h), and an unproven
 * connection has rpc_handshake_timeout to prove itself. A message must
 * arrive whole within rpc_message_timeout of its first byte (slowloris),
 * and a TCP connection without traffic or calls for rpc_idle_timeout is
 * closed. A connection of any class (Unix socket too) whose queued
 * replies took no byte for rpc_write_stall_timeout is closed: a client
 * that stopped reading (or was stopped) gives its share of the reply
 * budget back. All deadlines of a connection share one timer that re-arms
 * itself lazily, so arrivals only store a timestamp (output that begins to
 * queue arms it if it is later).
 *
 * The per-host cap counts unproven TCP connections only (it keeps one address
 * from filling the unproven slots); a proven connection gives its host slot
 * back, and proven connections are bounded by their class cap — so the many
 * peer connections of several nodes on one host are never refused.
 *
 * Memory: before authentication a client may send messages of at most
 * rpc_preauth_max_bytes (a larger declared message is refused at once);
 * input kept for incomplete messages and queued replies of every connection
 * are accounted in one rx_budget (rpc_max_buffered_bytes,
 * rpc_max_reply_bytes), and handlers reserve big reply buffers from it with
 * rpc_call_budget_take(); one connection may hold at most conn_reply_bytes
 * queued and reserved (the node sets it to a quarter of rpc_max_reply_bytes,
 * or conn_out_max if less), so a few stuck clients cannot exhaust it. A
 * connection whose output is backlogged takes no new request from its input
 * until it drains.
 *
 * Input: bytes are scanned (rpc/mp.c) before anything is read, so a message
 * declaring more than the limits is refused without allocating; a malformed
 * message closes the connection (its msgid cannot be trusted) once the
 * replies to the requests before it are sent; a well-formed
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
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <xxhash.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/sha256.h"
#include "common/unproven.h"
#include "rpc/auth.h"
#include "rpc/msg.h"
#include "rpc/peercred.h"
#include "rpc/rpc.h"
#include "reactor/stall.h"

#define LOG_MOD "rpc"
#define FD_QUEUE_MAX 16     /* descriptors held per connection */
#define UNAUTH_STRIKES 3    /* calls before auth tolerated, then close */
/* Messages of any kind before authentication: the handshake takes two
 * (auth.challenge, auth.response); a few more leave room for a client that
 * calls first and authenticates when told to. Beyond that a client is only
 * making the node queue error replies: close it. */
#define PREAUTH_MSGS_MAX 8
/* A new connection is never dropped for a newer one before this age: it
 * gets the chance to send its first message even in a burst of accepts. */
#define EVICT_GRACE_MS 100
/* A connection that has sent a whole, valid request (auth.challenge) but not
 * yet proved itself is dropped for a newer one only this long after it
 * spoke: an honest client answers its challenge within one round trip, even
 * from a loaded host, while a flood of silent connections goes first. The
 * handshake deadline still closes a client that never answers. */
#define EVICT_TALKING_GRACE_MS 1000
/* A reply is packed into the call first and reaches the connection in
 * writes of up to this many bytes (plus any object larger than it, written
 * straight through): a batch reply of many small objects (dir.get's records)
 * costs one queue operation per stage, not one per packed item. Sized so a
 * call stays about 1 KiB. */
#define RPC_REPLY_STAGE 896

/* A method with its metric series. */
struct rpc_entry {
	const struct rpc_method *m;
	met_id calls;   /* peercache_rpc_requests_total{method} */
	met_id errors;  /* peercache_rpc_errors_total{method} */
	met_id latency; /* peercache_rpc_latency_seconds{method} */
	char labels[96];
};

/* Connection classes (rpc_stats.conns_by_class[]). */
enum sc_class { SC_PREAUTH, SC_TCP, SC_LOCAL, SC__COUNT };

/* TCP connections from one source address (IPv4 as v4-mapped IPv6). */
struct host_slot {
	uint8_t addr[16];
	uint32_t count; /* 0: empty slot */
};

/* The unproven lists: connections that have not sent a whole request yet,
 * and those that have (an honest client mid-handshake); silent ones are
 * dropped first. */
enum sc_ylist { YL_SILENT, YL_TALKING, YL__COUNT };

/* Per reactor: its unproven TCP connections, oldest first on each list
 * (summed up for the other reactors in rpc_server.unproven[]). */
struct rpc_rstate {
	struct rpc_sconn *young_head[YL__COUNT], *young_tail[YL__COUNT];
	unsigned nyoung[YL__COUNT];
	uint64_t live[2]; /* atomic gauges: TCP [0], Unix [1] connections here */
};

struct rpc_server {
	struct rpc_limits lim;
	struct rpc_guard gd;             /* all 0 until rpc_server_set_guard */
	struct mp_limits mpl;
	struct mp_limits mpl_preauth;    /* before authentication */
	struct rpc_entry **table;        /* open addressing, pow2 size */
	unsigned table_mask;
	struct rpc_entry *entries;       /* insertion order */
	unsigned nmethods;
	char *secret;                    /* NULL: no authentication */
	struct rpc_local_rule local;     /* who may call without a secret */
	unsigned nreactors;
	struct rpc_stats *st;            /* one per reactor */
	struct rpc_rstate *rs;           /* one per reactor */
	struct pc_unproven *unproven;    /* one per reactor: rs[]'s lists */
	uint32_t cls[SC__COUNT];         /* atomic: live connections by class */
	struct rx_budget budget;         /* input and reply bytes, all conns */
	pthread_mutex_t hosts_lock;
	struct host_slot *hosts;         /* open addressing, linear probing;
					  * NULL: no per-host cap */
	unsigned hosts_mask;
	unsigned hosts_used;             /* addresses in the table */
	rpc_post_fn post;                /* to another reactor (may be NULL) */
	void *post_arg;
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
	bool paused;           /* by us, for max_inflight, draining or a call
				* keeping its request (holding) */
	unsigned holding;      /* calls that hold its input (call->holds) */
	struct rpc_call *cur;  /* the call whose handler runs now ... */
	const uint8_t *cur_msg; /* ... and its message */
	size_t cur_len;
	bool counted;          /* holds a class slot (and a host slot if TCP) */
	bool has_host;         /* holds a slot in the per-host table */
	bool proven;           /* authenticated and sent a request */
	bool young;            /* on one of the reactor's unproven lists */
	uint8_t ylist;         /* which one (enum sc_ylist) */
	enum sc_class cls;
	int drain_err;         /* set: close once the calls in flight end */
	const struct mp_limits *mpl; /* scan limits for this connection */
	struct rpc_sconn *yprev, *ynext; /* the unproven list */
	struct rx_timer timer; /* handshake, message and idle deadlines */
	uint64_t accepted_ns;
	uint64_t spoke_ns;     /* moved to YL_TALKING (0: still silent) */
	uint64_t last_act_ns;  /* last input, or last call ending */
	uint64_t partial_ns;   /* first byte of a partial message; 0: none */
	size_t reserved;       /* budget bytes taken by this conn's calls */
	uint8_t addr[16];      /* TCP source address */
	const char *refusal;   /* set: answer the first request with it */
	uint8_t strikes;
	uint8_t preauth_msgs;  /* messages received before authentication */
	uint8_t nonce[RPC_NONCE_BYTES];
	size_t need;           /* bytes a partial message needs first */
	struct mp_scan_state *scan; /* a partial message's scan so far */
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
	size_t reserved;        /* rpc_call_budget_take bytes not given back */
	bool holds;             /* holds its connection's input (sc->holding) */
	struct rx_input kept;   /* ... whose bytes are here, if they could be */
	struct rpc_entry *e;
	uint64_t t0;            /* dispatch time (0 when metrics are off) */
	msgpack_packer pk;
	uint32_t olen;          /* bytes of the reply waiting in obuf */
	uint8_t obuf[RPC_REPLY_STAGE]; /* small packs, flushed as one write */
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
	s->mpl_preauth = s->mpl;
	pthread_mutex_init(&s->hosts_lock, NULL);
	s->rs = calloc(nreactors ? nreactors : 1, sizeof(*s->rs));
	s->unproven = pc_unproven_new(nreactors);
	s->table_mask = (unsigned)pc_roundup_pow2(2u * n + 2) - 1;
	s->table = calloc(s->table_mask + 1, sizeof(*s->table));
	s->entries = calloc(n + 1, sizeof(*s->entries));
	s->st = calloc(nreactors ? nreactors : 1, sizeof(*s->st));
	s->nreactors = nreactors;
	rpc_local_rule_init(&s->local, allowed_gid);
	if (secret && *secret)
		s->secret = strdup(secret);
	int ret = 0;
	if (!s->table || !s->entries || !s->st || !s->rs || !s->unproven ||
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

void rpc_server_no_metrics(struct rpc_server *s)
{
	met_unregister_collector(rpc_collector, s);
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
	free(s->rs);
	free(s->unproven);
	free(s->hosts);
	pthread_mutex_destroy(&s->hosts_lock);
	free(s);
}

int rpc_server_set_guard(struct rpc_server *s, const struct rpc_guard *g)
{
	s->gd = *g;
	s->mpl_preauth = s->mpl;
	if (g->preauth_max_bytes && g->preauth_max_bytes < s->mpl.max_bytes) {
		s->mpl_preauth.max_bytes = g->preauth_max_bytes;
		s->mpl_preauth.max_objects = (uint32_t)g->preauth_max_bytes;
	}
	s->budget.in_max = g->max_buffered_bytes;
	s->budget.out_max = g->max_reply_bytes;
	free(s->hosts);
	s->hosts = NULL;
	if (!g->max_per_host)
		return 0;
	/* Sized for every TCP connection from its own address, at most half
	 * full; host_add refuses beyond that (unbounded classes). */
	size_t tcp_max = (size_t)s->lim.max_connections +
			 (g->max_preauth ? g->max_preauth
					 : s->lim.max_connections);
	s->hosts_mask = (unsigned)pc_roundup_pow2(2 * tcp_max + 2) - 1;
	s->hosts = calloc((size_t)s->hosts_mask + 1, sizeof(*s->hosts));
	return s->hosts ? 0 : -ENOMEM;
}

unsigned rpc_server_methods(const struct rpc_server *s,
			    const struct rpc_method **out, unsigned max)
{
	unsigned n = PC_MIN(max, s->nmethods);
	for (unsigned i = 0; i < n; i++)
		out[i] = s->entries[i].m;
	return n;
}

static uint64_t conns_here(const struct rpc_server *s, unsigned reactor,
			   bool is_unix)
{
	return reactor < s->nreactors
		       ? __atomic_load_n(&s->rs[reactor].live[is_unix],
					 __ATOMIC_RELAXED)
		       : 0;
}

uint64_t rpc_server_local_conns(const struct rpc_server *s, unsigned reactor)
{
	return conns_here(s, reactor, true);
}

uint64_t rpc_server_tcp_conns(const struct rpc_server *s, unsigned reactor)
{
	return conns_here(s, reactor, false);
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
	for (unsigned k = 0; k < SC__COUNT; k++)
		out->conns_by_class[k] = __atomic_load_n(&s->cls[k],
							 __ATOMIC_RELAXED);
}

static void rpc_collector(struct met_writer *w, void *arg)
{
	struct rpc_server *s = arg;
	struct rpc_stats st;
	rpc_server_stats(s, &st);
	/* Counters from rpc_stats, or (budget) from the shared rx_budget. */
	static const struct {
		const char *name, *help;
		size_t off;
		enum met_type type;
		bool budget;
	} rows[] = {
		{"peercache_rpc_connections", "RPC connections open",
		 offsetof(struct rpc_stats, conns_live), MET_GAUGE, false},
		{"peercache_rpc_connections_total", "RPC connections accepted",
		 offsetof(struct rpc_stats, conns_accepted), MET_COUNTER, false},
		{"peercache_rpc_connections_refused_total",
		 "RPC connections refused (limit or credentials)",
		 offsetof(struct rpc_stats, conns_refused), MET_COUNTER, false},
		{"peercache_rpc_auth_failures_total",
		 "calls or proofs refused for lack of authentication",
		 offsetof(struct rpc_stats, auth_failures), MET_COUNTER, false},
		{"peercache_rpc_late_replies_total",
		 "replies dropped because the client had left",
		 offsetof(struct rpc_stats, late_replies), MET_COUNTER, false},
		{"peercache_rpc_connections_evicted_total",
		 "unproven connections dropped to admit a new one",
		 offsetof(struct rpc_stats, conns_evicted), MET_COUNTER, false},
		{"peercache_rpc_connections_moved_total",
		 "new connections handed to the reactor that could drop an "
		 "unproven connection for them",
		 offsetof(struct rpc_stats, conns_moved), MET_COUNTER, false},
		{"peercache_rpc_connections_timed_out_total",
		 "connections closed by a handshake, message or idle deadline",
		 offsetof(struct rpc_stats, conns_timed_out), MET_COUNTER, false},
		{"peercache_rpc_connections_stalled_total",
		 "connections closed: queued replies made no progress for "
		 "rpc_write_stall_timeout",
		 offsetof(struct rpc_stats, conns_stalled), MET_COUNTER, false},
		{"peercache_rpc_connections_refused_host_total",
		 "connections refused over rpc_max_connections_per_host",
		 offsetof(struct rpc_stats, conns_refused_host), MET_COUNTER,
		 false},
		{"peercache_rpc_budget_refusals_total",
		 "reply reservations refused over the memory budget",
		 offsetof(struct rpc_stats, budget_refusals), MET_COUNTER, false},
		{"peercache_rpc_buffered_bytes",
		 "input held for incomplete messages, all connections",
		 offsetof(struct rx_budget, in_used), MET_GAUGE, true},
		{"peercache_rpc_reply_bytes",
		 "reply bytes queued or reserved, all connections",
		 offsetof(struct rx_budget, out_used), MET_GAUGE, true},
		{"peercache_rpc_buffer_closes_total",
		 "connections closed over rpc_max_buffered_bytes",
		 offsetof(struct rx_budget, in_closes), MET_COUNTER, true},
		{"peercache_rpc_reply_pauses_total",
		 "connections paused over rpc_max_reply_bytes",
		 offsetof(struct rx_budget, out_pauses), MET_COUNTER, true},
	};
	_Static_assert(sizeof(size_t) == sizeof(uint64_t), "u64 fields");
	for (size_t i = 0; i < PC_ARRAY_LEN(rows); i++) {
		const char *base = rows[i].budget ? (const char *)&s->budget
						  : (const char *)&st;
		uint64_t v = __atomic_load_n(
			(const uint64_t *)(base + rows[i].off),
			__ATOMIC_RELAXED);
		met_w_family(w, rows[i].name, rows[i].help, rows[i].type);
		met_w_sample(w, rows[i].name, NULL, (double)(int64_t)v);
	}
	static const char *const class_names[SC__COUNT] = {
		[SC_PREAUTH] = "preauth", [SC_TCP] = "tcp", [SC_LOCAL] = "unix"};
	met_w_family(w, "peercache_rpc_connections_by_class",
		     "RPC connections open, by class", MET_GAUGE);
	for (unsigned k = 0; k < SC__COUNT; k++) {
		char labels[32];
		snprintf(labels, sizeof(labels), "class=\"%s\"",
			 class_names[k]);
		met_w_sample(w, "peercache_rpc_connections_by_class", labels,
			     (double)st.conns_by_class[k]);
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
	free(sc->scan);
	free(sc);
}

static void sc_watch_output(struct rpc_sconn *sc);

static int sconn_write(void *data, const char *buf, size_t len)
{
	struct rpc_sconn *sc = data;
	if (!sc->c)
		return 0;
	bool began = !rx_conn_out_bytes(sc->c);
	rx_conn_write(sc->c, buf, len); /* fails only when closing */
	if (began)
		sc_watch_output(sc);
	return 0;
}

static void reply_flush(struct rpc_call *call)
{
	if (call->olen)
		sconn_write(call->sc, (const char *)call->obuf, call->olen);
	call->olen = 0;
}

/* The reply packer's sink: small writes gather in call->obuf. */
static int reply_write(void *data, const char *buf, size_t len)
{
	struct rpc_call *call = data;
	if (len > sizeof(call->obuf) - call->olen) {
		reply_flush(call);
		if (len >= sizeof(call->obuf))
			return sconn_write(call->sc, buf, len);
	}
	memcpy(call->obuf + call->olen, buf, len);
	call->olen += (uint32_t)len;
	return 0;
}

static int null_write(void *data, const char *buf, size_t len)
{
	(void)data;
	(void)buf;
	(void)len;
	return 0;
}

/* ------------------------------------------------- per-host connection table */

static struct host_slot *host_find(struct rpc_server *s, const uint8_t *addr,
				   bool *found)
{
	for (uint64_t i = XXH3_64bits(addr, 16);; i++) {
		struct host_slot *h = &s->hosts[i & s->hosts_mask];
		*found = h->count && memcmp(h->addr, addr, 16) == 0;
		if (!h->count || *found)
			return h;
	}
}

/* Count one more connection from addr; returns the new count, or 0 (and
 * nothing counted) when the table is as full as it may get. */
static uint32_t host_add(struct rpc_server *s, const uint8_t *addr)
{
	bool found;
	uint32_t n = 0;
	pthread_mutex_lock(&s->hosts_lock);
	struct host_slot *h = host_find(s, addr, &found);
	if (!found && s->hosts_used < (s->hosts_mask + 1) / 2) {
		memcpy(h->addr, addr, 16);
		s->hosts_used++;
		found = true;
	}
	if (found)
		n = ++h->count;
	pthread_mutex_unlock(&s->hosts_lock);
	return n;
}

/* One connection from addr less; an emptied slot is removed by shifting
 * the entries of its probe run back (no tombstones). */
static void host_del(struct rpc_server *s, const uint8_t *addr)
{
	bool found;
	pthread_mutex_lock(&s->hosts_lock);
	struct host_slot *h = host_find(s, addr, &found);
	PC_ASSERT(found);
	if (--h->count == 0) {
		s->hosts_used--;
		unsigned hole = (unsigned)(h - s->hosts);
		for (unsigned j = (hole + 1) & s->hosts_mask;
		     s->hosts[j].count; j = (j + 1) & s->hosts_mask) {
			unsigned home = (unsigned)XXH3_64bits(s->hosts[j].addr,
							      16) &
					s->hosts_mask;
			/* Movable when its home is not in (hole, j]. */
			if (((j - home) & s->hosts_mask) >=
			    ((j - hole) & s->hosts_mask)) {
				s->hosts[hole] = s->hosts[j];
				s->hosts[j].count = 0;
				hole = j;
			}
		}
	}
	pthread_mutex_unlock(&s->hosts_lock);
}

/* --------------------------------------------------- classes and eviction */

/* The time list l is ordered by, for sc. */
static uint64_t young_time(const struct rpc_sconn *sc, unsigned l)
{
	return l == YL_SILENT ? sc->accepted_ns : sc->spoke_ns;
}

static void young_publish(struct rpc_server *s, unsigned id);

static void young_del(struct rpc_sconn *sc)
{
	if (!sc->young)
		return;
	unsigned id = rx_reactor_id(sc->r);
	struct rpc_rstate *rs = &sc->srv->rs[id];
	unsigned l = sc->ylist;
	if (sc->yprev)
		sc->yprev->ynext = sc->ynext;
	else
		rs->young_head[l] = sc->ynext;
	if (sc->ynext)
		sc->ynext->yprev = sc->yprev;
	else
		rs->young_tail[l] = sc->yprev;
	sc->yprev = sc->ynext = NULL;
	sc->young = false;
	rs->nyoung[l]--;
	young_publish(sc->srv, id);
}

/* Append sc to unproven list l: YL_SILENT is in order of accepted_ns,
 * YL_TALKING in order of spoke_ns. */
static void young_add(struct rpc_sconn *sc, enum sc_ylist l)
{
	unsigned id = rx_reactor_id(sc->r);
	struct rpc_rstate *rs = &sc->srv->rs[id];
	sc->yprev = rs->young_tail[l];
	sc->ynext = NULL;
	if (rs->young_tail[l])
		rs->young_tail[l]->ynext = sc;
	else
		rs->young_head[l] = sc;
	rs->young_tail[l] = sc;
	sc->young = true;
	sc->ylist = (uint8_t)l;
	rs->nyoung[l]++;
	young_publish(sc->srv, id);
}

/* Give back the class and host slots (at close, or at once on eviction, so
 * the slot is free before the connection's teardown completes). */
static void sc_uncount(struct rpc_sconn *sc)
{
	young_del(sc);
	if (!sc->counted)
		return;
	sc->counted = false;
	__atomic_sub_fetch(&sc->srv->cls[sc->cls], 1, __ATOMIC_RELAXED);
	if (sc->has_host) {
		sc->has_host = false;
		host_del(sc->srv, sc->addr);
	}
}

/* The cap of class k; 0 in the limits means no cap of its own. */
static uint32_t class_cap(const struct rpc_server *s, enum sc_class k)
{
	uint32_t cap = k == SC_PREAUTH ? s->gd.max_preauth
		       : k == SC_TCP   ? s->lim.max_connections
				       : s->gd.max_local;
	return cap ? cap : UINT32_MAX;
}

static const char *const class_setting[SC__COUNT] = {
	[SC_PREAUTH] = "rpc_max_preauth_connections",
	[SC_TCP] = "rpc_max_connections",
	[SC_LOCAL] = "rpc_max_local_connections",
};

/* True when bytes from the peer of a silent connection wait in the kernel:
 * it has spoken and the reactor has not read it yet (a burst of accepts
 * ahead of its first read), so it is not one to drop as silent. */
static bool has_unread_bytes(const struct rpc_sconn *v)
{
	int pending = 0;
	int fd = v->c ? rx_conn_fd(v->c) : -1;
	return fd >= 0 && ioctl(fd, FIONREAD, &pending) == 0 && pending > 0;
}

/* How long the connections on list l of rs are kept from being dropped
 * for a newcomer. The longer grace of those that spoke holds only while
 * they are at most half of this reactor's share of the unproven class:
 * connections that each send one request cannot lock newcomers out for
 * longer than silent ones can. */
static uint64_t young_grace_ns(const struct rpc_server *s,
			       const struct rpc_rstate *rs, unsigned l)
{
	uint32_t talk_max = class_cap(s, SC_PREAUTH) /
			    (s->nreactors ? s->nreactors : 1) / 2;
	bool talk_grace = rs->nyoung[YL_TALKING] <= (talk_max ? talk_max : 1);
	return RX_MS(l == YL_TALKING && talk_grace ? EVICT_TALKING_GRACE_MS
						   : EVICT_GRACE_MS);
}

/* Publish reactor id's unproven connections for the other reactors: how
 * many, and from when the first of them may be dropped (evict_one's
 * view, but for the class and address it also filters by). */
static void young_publish(struct rpc_server *s, unsigned id)
{
	const struct rpc_rstate *rs = &s->rs[id];
	uint64_t first = 0;
	for (unsigned l = 0; l < YL__COUNT; l++) {
		const struct rpc_sconn *h = rs->young_head[l];
		uint64_t t = h ? young_time(h, l) + young_grace_ns(s, rs, l)
			       : 0;
		if (t && (!first || t < first))
			first = t;
	}
	pc_unproven_set(&s->unproven[id],
			rs->nyoung[YL_SILENT] + rs->nyoung[YL_TALKING], first);
}

/*
 * Drop the oldest unproven connection of reactor rs of class k (SC__COUNT:
 * any) and, when addr is set, from that address, if it is past its grace
 * (young_grace_ns): a silent one if there is one, else one that has spoken
 * but not yet proved itself. false: none to drop.
 */
static bool evict_one(const struct rpc_server *s, struct rpc_rstate *rs,
		      enum sc_class k, const uint8_t *addr)
{
	uint64_t now = pc_now_ns();
	const uint64_t before[YL__COUNT] = {
		[YL_SILENT] = now - young_grace_ns(s, rs, YL_SILENT),
		[YL_TALKING] = now - young_grace_ns(s, rs, YL_TALKING),
	};
	for (unsigned l = 0; l < YL__COUNT; l++)
	for (struct rpc_sconn *v = rs->young_head[l]; v; v = v->ynext) {
		if (young_time(v, l) > before[l])
			break; /* oldest first: the rest are younger still */
		if ((k != SC__COUNT && v->cls != k) ||
		    (addr && memcmp(v->addr, addr, 16) != 0) ||
		    (l == YL_SILENT && has_unread_bytes(v)))
			continue;
		RX_STAT_INC(v->st->conns_evicted);
		PC_LOG_RL(PC_LOG_INFO, LOG_MOD, "%s: dropped unproven "
			  "connection to admit a new one (%s)", v->peer,
			  addr ? "rpc_max_connections_per_host"
			       : class_setting[v->cls]);
		sc_uncount(v);
		rx_conn_close(v->c, RX_CLOSE_NOW, -ECONNABORTED);
		return true;
	}
	return false;
}

/* Take a slot of class k, dropping an unproven connection when full. */
static int class_take(struct rpc_server *s, struct rpc_rstate *rs,
		      enum sc_class k)
{
	if (__atomic_add_fetch(&s->cls[k], 1, __ATOMIC_RELAXED) <=
	    class_cap(s, k))
		return 0;
	if (k != SC_LOCAL && evict_one(s, rs, k, NULL))
		return 0;
	__atomic_sub_fetch(&s->cls[k], 1, __ATOMIC_RELAXED);
	return -EMFILE;
}

/* Why a newcomer was not admitted. Only the first two are for want of an
 * unproven connection of this reactor to drop: another reactor may have
 * one (sc_move). */
enum sc_admit {
	ADMIT_OK,
	ADMIT_HOST_FULL,   /* rpc_max_connections_per_host */
	ADMIT_CLASS_FULL,  /* the class cap (never the Unix socket's) */
	ADMIT_HOSTS_TABLE, /* the per-host table itself (node-wide) */
	ADMIT_LOCAL_FULL,  /* rpc_max_local_connections: none is dropped */
};

/* Admit a new connection into its class (and host), dropping an unproven
 * connection of this reactor for it when full; nothing logged or counted. */
static enum sc_admit sc_admit(struct rpc_sconn *sc)
{
	struct rpc_server *s = sc->srv;
	struct rpc_rstate *rs = &s->rs[rx_reactor_id(sc->r)];
	if (!sc->is_unix && s->hosts) {
		uint32_t n = host_add(s, sc->addr);
		if (!n)
			return ADMIT_HOSTS_TABLE;
		if (n > s->gd.max_per_host &&
		    !evict_one(s, rs, SC__COUNT, sc->addr)) {
			host_del(s, sc->addr);
			return ADMIT_HOST_FULL;
		}
		sc->has_host = true;
	}
	if (class_take(s, rs, sc->cls) < 0) {
		if (sc->has_host)
			host_del(s, sc->addr);
		sc->has_host = false;
		return sc->cls == SC_LOCAL ? ADMIT_LOCAL_FULL : ADMIT_CLASS_FULL;
	}
	sc->counted = true;
	if (!sc->is_unix || sc->cls == SC_PREAUTH) /* unproven: evictable */
		young_add(sc, YL_SILENT);
	return ADMIT_OK;
}

static void sc_refused(struct rpc_sconn *sc, enum sc_admit why)
{
	const struct rpc_server *s = sc->srv;
	RX_STAT_INC(sc->st->conns_refused);
	if (why == ADMIT_HOST_FULL || why == ADMIT_HOSTS_TABLE) {
		RX_STAT_INC(sc->st->conns_refused_host);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "refusing %s: %u connections "
			  "from one address is the limit "
			  "(rpc_max_connections_per_host)", sc->peer,
			  s->gd.max_per_host);
	} else {
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "refusing %s: %u connections "
			  "is the limit (%s)", sc->peer, class_cap(s, sc->cls),
			  class_setting[sc->cls]);
	}
}

/* The connection proved itself: no longer a candidate for eviction, no
 * handshake deadline. */
static void sc_prove(struct rpc_sconn *sc)
{
	sc->proven = true;
	young_del(sc);
	/* The per-host cap is for unproven connections only. */
	if (sc->has_host) {
		sc->has_host = false;
		host_del(sc->srv, sc->addr);
	}
}

/* ---------------------------------------------------------------- deadlines */

/* Which deadline is due (DUE_CHECK: only a time to look again). */
enum sc_due { DUE_CHECK, DUE_HANDSHAKE, DUE_AUTH, DUE_MESSAGE, DUE_IDLE,
	      DUE_STALL, DUE__COUNT };
static const char *const due_text[DUE__COUNT] = {
	[DUE_HANDSHAKE] = "no request within rpc_handshake_timeout",
	[DUE_AUTH] = "not authenticated within rpc_handshake_timeout",
	[DUE_MESSAGE] = "a message did not arrive whole within "
			"rpc_message_timeout",
	[DUE_IDLE] = "idle for rpc_idle_timeout",
	[DUE_STALL] = "its replies were not read for rpc_write_stall_timeout",
};
/* One log limiter per reason, so a flood of one kind never hides another. */
static struct pc_ratelimit due_rl[DUE__COUNT];

/* The earliest deadline of sc and, in *due, which one it is. */
static uint64_t sc_deadline(const struct rpc_sconn *sc, uint64_t now,
			    enum sc_due *due)
{
	const struct rpc_guard *l = &sc->srv->gd;
	uint64_t d = UINT64_MAX;
	*due = DUE_CHECK;
	/* A client authenticated at accept whose first message has begun is
	 * under the message deadline instead (a big first request may take
	 * longer than the handshake deadline to arrive). */
	if (!sc->proven && (!sc->is_unix || sc->refusal) &&
	    !(sc->authed && sc->partial_ns) && l->handshake_timeout_ms) {
		d = sc->accepted_ns + RX_MS(l->handshake_timeout_ms);
		*due = sc->authed ? DUE_HANDSHAKE : DUE_AUTH;
	}
	if (sc->partial_ns && l->message_timeout_ms &&
	    sc->partial_ns + RX_MS(l->message_timeout_ms) < d) {
		d = sc->partial_ns + RX_MS(l->message_timeout_ms);
		*due = DUE_MESSAGE;
	}
	if (!sc->is_unix && l->idle_timeout_ms) {
		uint64_t i = (sc->inflight ? now : sc->last_act_ns) +
			     RX_MS(l->idle_timeout_ms);
		if (i < d) {
			d = i;
			*due = sc->inflight ? DUE_CHECK : DUE_IDLE;
		}
	}
	uint64_t since = sc->c ? rx_conn_out_since(sc->c) : 0;
	if (since && l->write_stall_ms &&
	    since + RX_MS(l->write_stall_ms) < d) {
		d = since + RX_MS(l->write_stall_ms);
		*due = DUE_STALL;
	}
	return d;
}

static void sc_arm(struct rpc_sconn *sc, uint64_t now)
{
	enum sc_due due;
	uint64_t d = sc_deadline(sc, now, &due);
	if (d == UINT64_MAX) {
		rx_timer_stop(sc->r, &sc->timer);
		return;
	}
	if (rx_timer_start(sc->r, &sc->timer, d > now ? d - now : 0, 0) < 0) {
		/* No timer left: a connection without deadlines is not kept. */
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: no timer for the "
			  "connection's deadlines; closing", sc->peer);
		rx_conn_close(sc->c, RX_CLOSE_NOW, -ENOSPC);
	}
}

static void sc_timer_fired(struct rx_reactor *r, struct rx_timer *t)
{
	struct rpc_sconn *sc = t->arg;
	/* Not rx_now_ns(): the loop's cached time may predate its wait. */
	uint64_t now = pc_now_ns();
	enum sc_due due;
	(void)r;
	if (sc_deadline(sc, now, &due) > now || due == DUE_CHECK) {
		sc_arm(sc, now);
		return;
	}
	if (due == DUE_STALL)
		RX_STAT_INC(sc->st->conns_stalled);
	else
		RX_STAT_INC(sc->st->conns_timed_out);
	uint64_t n = pc_ratelimit_pass(&due_rl[due], 10000);
	if (n > 1)
		PC_LOGI(LOG_MOD, "%s: %s; closing (+%llu similar suppressed)",
			sc->peer, due_text[due], (unsigned long long)(n - 1));
	else if (n == 1)
		PC_LOGI(LOG_MOD, "%s: %s; closing", sc->peer, due_text[due]);
	sc_uncount(sc);
	rx_conn_close(sc->c, RX_CLOSE_NOW, -ETIMEDOUT);
}

/* Output began to queue: its write-stall deadline must be armed (the timer
 * keeps it armed, re-arming from the last progress, while output stays). */
static void sc_watch_output(struct rpc_sconn *sc)
{
	if (!sc->srv->gd.write_stall_ms || !rx_conn_out_bytes(sc->c))
		return;
	uint64_t now = rx_now_ns(sc->r);
	if (!rx_timer_armed(&sc->timer) ||
	    sc->timer.deadline_ns > now + RX_MS(sc->srv->gd.write_stall_ms))
		sc_arm(sc, now);
}

/* Note whether input ended inside a message: its deadline starts with it.
 * fresh: that message began in this batch (an earlier one completed). */
static void sc_note_partial(struct rpc_sconn *sc, bool partial, bool fresh)
{
	if (!partial) {
		sc->partial_ns = 0; /* the timer finds nothing due and re-arms */
		return;
	}
	if (sc->partial_ns && !fresh)
		return;
	uint64_t now = pc_now_ns();
	sc->partial_ns = now;
	enum sc_due due;
	if (!rx_timer_armed(&sc->timer) ||
	    sc->timer.deadline_ns > sc_deadline(sc, now, &due))
		sc_arm(sc, now);
}

/* Close once the calls in flight have replied (their replies go out first);
 * no more input is read meanwhile. */
static void sc_drain_close(struct rpc_sconn *sc, int err)
{
	if (sc->inflight == 0) {
		rx_conn_close(sc->c, RX_CLOSE_FLUSH, err);
		return;
	}
	sc->drain_err = err;
	if (!sc->paused) {
		sc->paused = true;
		rx_conn_pause(sc->c);
	}
}

static void on_close(struct rx_conn *c, int err)
{
	struct rpc_sconn *sc = rx_conn_udata(c);
	PC_LOGD(LOG_MOD, "%s: connection closed (%s)", sc->peer,
		err ? strerror(-err) : "orderly");
	rx_timer_stop(sc->r, &sc->timer);
	sc_uncount(sc);
	sc->c = NULL;
	if (sc->mod_closed)
		sc->mod_closed(sc->mod_data);
	RX_STAT_ADD(sc->st->conns_live, (uint64_t)-1);
	__atomic_sub_fetch(&sc->srv->rs[rx_reactor_id(sc->r)].live[sc->is_unix],
			   1, __ATOMIC_RELAXED);
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
	call->reserved = 0;
	call->holds = false;
	call->kept = (struct rx_input){0};
	call->olen = 0;
	call->e = e;
	call->t0 = met_enabled ? pc_now_ns() : 0;
	sc->refs++;
	sc->inflight++;
	return call;
}

/* Read again once nothing holds the connection's input and it has room
 * for another call. */
static void sconn_maybe_resume(struct rpc_sconn *sc)
{
	if (sc->paused && sc->c && !sc->drain_err && !sc->holding &&
	    sc->inflight < sc->srv->lim.max_inflight) {
		sc->paused = false;
		rx_conn_resume(sc->c);
	}
}

static void call_free(struct rpc_call *call)
{
	struct rpc_sconn *sc = call->sc;
	met_inc(call->e->calls);
	if (call->failed)
		met_inc(call->e->errors);
	if (call->t0)
		met_observe_ns(call->e->latency, pc_now_ns() - call->t0);
	if (call->reserved)
		rpc_call_budget_give(call, call->reserved);
	rx_input_put(&call->kept);
	if (call->holds)
		sc->holding--;
	if (--sc->inflight == 0)
		sc->last_act_ns = pc_now_ns();
	if (sc->drain_err && sc->c && sc->inflight == 0)
		rx_conn_close(sc->c, RX_CLOSE_FLUSH, sc->drain_err);
	else
		sconn_maybe_resume(sc);
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

/*
 * Untrusted bytes for an error message: printable ASCII as is, every other
 * byte (and '\\') as \xNN, so the text is valid UTF-8 whatever the client
 * sent; cut with "..." to fit len (>= 8).
 */
static const char *show_bytes(const char *p, size_t n, char *buf, size_t len)
{
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)p[i];
		bool plain = ch >= 0x20 && ch < 0x7f && ch != '\\';
		if (o + (plain ? 1 : 4) + 4 > len) {
			memcpy(buf + o, "...", 4);
			return buf;
		}
		if (plain)
			buf[o++] = (char)ch;
		else
			o += (size_t)snprintf(buf + o, len - o, "\\x%02x", ch);
	}
	buf[o] = '\0';
	return buf;
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
		sc_drain_close(sc, -EPROTO);
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
	if (!sc->authed && ++sc->preauth_msgs > PREAUTH_MSGS_MAX) {
		RX_STAT_INC(sc->st->auth_failures);
		reject(sc, RPC_REJ_UNAUTH, "too many messages before "
		       "authentication");
		rx_conn_close(sc->c, RX_CLOSE_FLUSH, -EACCES);
		return false;
	}
	struct rpc_entry *ent = find_entry(sc->srv, m.method, m.method_len);
	const struct rpc_method *meth = ent ? ent->m : NULL;
	if (!meth) {
		char shown[64 * 4 + 4];
		if (!notify)
			early_error(sc, m.msgid, RPC_E_UNKNOWN_METHOD,
				    "no method '%s'",
				    show_bytes(m.method, m.method_len, shown,
					       sizeof(shown)));
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
	rx_stall_tag(meth->name); /* named in a stall report */
	sc->cur = call; /* for rpc_call_keep_request; call may end in fn */
	sc->cur_msg = p;
	sc->cur_len = len;
	meth->fn(call, &m.params);
	sc->cur = NULL;
	if (sc->authed && !sc->proven)
		sc_prove(sc); /* auth.response, or the first request */
	else if (!notify && sc->young && sc->ylist == YL_SILENT) {
		/* A whole, valid request awaiting its answer (auth.challenge):
		 * an honest client mid-handshake goes after the silent ones. */
		young_del(sc);
		sc->spoke_ns = pc_now_ns();
		young_add(sc, YL_TALKING);
	}
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
	sc->last_act_ns = pc_now_ns();
	if (len < sc->need)
		return 0; /* a partial message still short of what it needs */
	size_t used = 0;
	bool partial = false;
	/* A backlogged connection takes no new work until its output drains:
	 * the rest stays in its input and comes back on resume. */
	while (used < len && !sc->paused && !rx_conn_backlogged(c)) {
		size_t size;
		int ret = mp_scan_held(&sc->scan, data + used, len - used,
				       sc->mpl, &size);
		if (ret == MP_NEED_MORE) {
			sc->need = size;
			rx_conn_expect(c, size); /* its buffer, sized at once */
			partial = true;
			break;
		}
		sc->need = 0;
		if (ret < 0) {
			if (ret == -EMSGSIZE && !sc->authed)
				reject(sc, RPC_REJ_TOO_LARGE, "message over the "
				       "size limit before authentication "
				       "(rpc_preauth_max_bytes)");
			else if (ret == -EMSGSIZE)
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
			/* Replies to the requests before it still go out. */
			sc_drain_close(sc, ret);
			return (ssize_t)len;
		}
		if (!handle_message(sc, data + used, size))
			return (ssize_t)len; /* closing: the rest is not read */
		used += size;
		if (sc->inflight >= sc->srv->lim.max_inflight && sc->c) {
			sc->paused = true; /* resumes when calls complete */
			rx_conn_pause(c);
		}
	}
	sc_note_partial(sc, partial, used > 0);
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
	long want = sc->srv->local.allowed_gid;
	if (cr.uid == sc->srv->local.own_uid || cr.uid == 0)
		return;
	if (want >= 0 && ((long)cr.gid == want || in_group(fd, want)))
		return;
	sc->refusal = "this user may not use the node's socket (allowed: "
		      "the node's own user, root, or the group in "
		      "socket_group)";
	PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "refusing %s: not the node's user, "
		  "root, or the allowed group", sc->peer);
}

/* No secret: the loopback client's socket must belong to the node's user,
 * root or socket_group (rpc/peercred.h), as on the Unix socket. */
static void check_tcp_peer(struct rpc_sconn *sc, int fd)
{
	char who[32];
	int ret = rpc_tcp_peer_check(&sc->srv->local, fd, who, sizeof(who));
	if (ret == 0)
		return;
	sc->refusal = ret == -EACCES
		? "this user may not use the node (allowed without a cluster "
		  "secret: the node's own user, root, or the group in "
		  "socket_group)"
		: "the local user of this connection cannot be verified (set "
		  "a cluster secret to admit TCP clients by the secret)";
	PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "refusing %s (%s): %s", sc->peer, who,
		  ret == -EACCES ? "not the node's user, root, or the allowed "
		  "group" : strerror(-ret));
}

static void describe_tcp_peer(struct rpc_sconn *sc, int fd)
{
	rpc_tcp_peer_name(fd, sc->peer, sizeof(sc->peer), sc->addr);
}

/* A newcomer on its way to the reactor that can drop an unproven
 * connection for it (common/unproven.h). */
struct sc_move {
	struct rpc_server *s;
	int fd;
	bool is_unix;
};

static void accept_on(struct rpc_server *s, struct rx_reactor *r, int fd,
		      bool is_unix, bool may_move);

/* On the reactor a newcomer was handed to (sc_move); counted here, before
 * the client can have an answer. */
static void move_run(struct rx_reactor *r, void *arg)
{
	struct sc_move m = *(struct sc_move *)arg;
	struct rpc_stats *st = &m.s->st[rx_reactor_id(r)];
	free(arg);
	RX_STAT_INC(st->conns_moved);
	if (rx_reactor_stopping(r)) {
		RX_STAT_INC(st->conns_refused);
		close(m.fd);
		return;
	}
	accept_on(m.s, r, m.fd, m.is_unix, false);
}

/* Hand fd, which sc's reactor could not admit (why), to the reactor that
 * can drop an unproven connection for it: true when on its way. A client
 * refused for who it is waits among the unproven only for its refusal
 * (already logged): it is not worth a hand-over. */
static bool sc_move(struct rpc_sconn *sc, int fd, enum sc_admit why)
{
	struct rpc_server *s = sc->srv;
	if (!s->post || sc->refusal ||
	    (why != ADMIT_HOST_FULL && why != ADMIT_CLASS_FULL))
		return false;
	int to = pc_unproven_pick(s->unproven, s->nreactors,
				  rx_reactor_id(sc->r), pc_now_ns());
	struct sc_move *m = to >= 0 ? malloc(sizeof(*m)) : NULL;
	if (!m)
		return false;
	*m = (struct sc_move){s, fd, sc->is_unix};
	if (s->post(s->post_arg, (unsigned)to, move_run, m) < 0) {
		free(m);
		return false;
	}
	PC_LOGD(LOG_MOD, "%s: handed to r%d, which holds unproven "
		"connections to drop for it", sc->peer, to);
	return true;
}

void rpc_server_set_post(struct rpc_server *s, rpc_post_fn post, void *arg)
{
	s->post = post;
	s->post_arg = arg;
}

void rpc_server_accept(struct rpc_server *s, struct rx_reactor *r, int fd,
		       bool is_unix)
{
	accept_on(s, r, fd, is_unix, true);
}

/* may_move: a newcomer this reactor cannot admit may go to another one
 * (once: the one it goes to admits it or refuses it). */
static void accept_on(struct rpc_server *s, struct rx_reactor *r, int fd,
		      bool is_unix, bool may_move)
{
	struct rpc_stats *st = &s->st[rx_reactor_id(r)];
	struct rpc_sconn *sc = calloc(1, sizeof(*sc));
	if (!sc) {
		RX_STAT_INC(st->conns_refused);
		close(fd);
		return;
	}
	sc->srv = s;
	sc->r = r;
	sc->st = st;
	sc->refs = 1;
	sc->is_unix = is_unix;
	/* The secret guards TCP; Unix clients, and TCP clients of a node
	 * without a secret, are checked by who they run as. */
	if (is_unix) {
		check_peer_cred(sc, fd);
	} else {
		describe_tcp_peer(sc, fd);
		if (!s->secret)
			check_tcp_peer(sc, fd);
	}
	/* A refused client is held as unproven until its first request gets
	 * the refusal (or its handshake deadline passes). */
	sc->authed = !sc->refusal && (is_unix || !s->secret);
	/* The class follows the authentication state at accept. A refused
	 * client (another user, on either transport) waits for its refusal
	 * among the unproven, where it can be evicted: it never takes a slot
	 * of the node's own local clients. */
	sc->cls = sc->refusal ? SC_PREAUTH
		: is_unix     ? SC_LOCAL
		: sc->authed  ? SC_TCP
			      : SC_PREAUTH;
	sc->mpl = sc->authed ? &s->mpl : &s->mpl_preauth;
	sc->accepted_ns = sc->last_act_ns = pc_now_ns();
	rx_timer_init(&sc->timer, sc_timer_fired, sc);
	enum sc_admit why = sc_admit(sc);
	if (why != ADMIT_OK) {
		if (!may_move || !sc_move(sc, fd, why)) {
			sc_refused(sc, why);
			close(fd);
		}
		free(sc);
		return;
	}
	int err;
	sc->c = rx_conn_attach(r, fd, &rpc_conn_ops, sc, &err);
	if (!sc->c) {
		sc_uncount(sc);
		free(sc);
		return;
	}
	rx_conn_set_budget(sc->c, &s->budget);
	/* Room for one whole message plus the start of the next; before
	 * authentication, for one small message only. */
	rx_conn_set_limits(sc->c, sc->mpl->max_bytes +
				  (sc->authed ? 65536 : 0), 0, 0, 0);
	if (is_unix && s->lim.max_fds)
		rx_conn_enable_fds(sc->c, s->lim.max_fds);
	RX_STAT_INC(st->conns_accepted);
	RX_STAT_INC(st->conns_live);
	__atomic_add_fetch(&s->rs[rx_reactor_id(r)].live[is_unix], 1,
			   __ATOMIC_RELAXED);
	sc_arm(sc, sc->accepted_ns);
	PC_LOGD(LOG_MOD, "%s: connected", sc->peer);
}

/* ------------------------------------------------------------------ calls */

void rpc_call_hold_input(struct rpc_call *call)
{
	struct rpc_sconn *sc = call->sc;
	if (call->holds || !sc->c)
		return;
	call->holds = true;
	sc->holding++;
	if (!sc->paused) {
		sc->paused = true; /* resumes when the call ends (call_free) */
		rx_conn_pause(sc->c);
	}
}

bool rpc_call_keep_request(struct rpc_call *call)
{
	struct rpc_sconn *sc = call->sc;
	if (sc->cur != call || call->kept.r || !sc->c ||
	    !rx_conn_take_input(sc->c, sc->cur_msg, sc->cur_len, &call->kept))
		return false;
	rpc_call_hold_input(call);
	return true;
}

int rpc_call_keep_params(struct rpc_call *call, struct mp_rd *p, void **copy)
{
	*copy = NULL;
	if (rpc_call_keep_request(call))
		return 0;
	size_t len = (size_t)(p->end - p->p);
	void *c = malloc(len ? len : 1);
	if (!c)
		return -ENOMEM;
	memcpy(c, p->p, len);
	mp_rd_init(p, c, len);
	rpc_call_hold_input(call);
	*copy = c;
	return 0;
}

void rpc_call_release_input(struct rpc_call *call)
{
	struct rpc_sconn *sc = call->sc;
	rx_input_put(&call->kept);
	if (!call->holds)
		return;
	call->holds = false;
	sc->holding--;
	sconn_maybe_resume(sc);
}

int rpc_call_budget_take(struct rpc_call *call, size_t bytes)
{
	struct rpc_sconn *sc = call->sc;
	struct rpc_server *s = sc->srv;
	size_t queued = sc->c ? rx_conn_out_bytes(sc->c) : 0;
	if (!sc->c ||
	    (s->gd.conn_reply_bytes &&
	     sc->reserved + queued + bytes > s->gd.conn_reply_bytes) ||
	    rx_budget_take(&s->budget, bytes) < 0) {
		RX_STAT_INC(sc->st->budget_refusals);
		return -ENOBUFS;
	}
	sc->reserved += bytes;
	call->reserved += bytes;
	return 0;
}

void rpc_call_budget_give(struct rpc_call *call, size_t bytes)
{
	PC_ASSERT(bytes <= call->reserved);
	call->reserved -= bytes;
	call->sc->reserved -= bytes;
	rx_budget_give(&call->sc->srv->budget, bytes);
}

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
	msgpack_packer_init(&call->pk, call, reply_write);
	msgpack_pack_array(&call->pk, 4);
	msgpack_pack_uint8(&call->pk, RPC_RESPONSE);
	msgpack_pack_uint32(&call->pk, call->msgid);
	msgpack_pack_nil(&call->pk);
	return &call->pk;
}

/* A run of reply bytes sent from the handler's memory (rpc_reply_ref). */
struct reply_ref {
	struct rpc_server *srv;
	size_t len;               /* of the node's reply budget until sent */
	void (*release)(void *arg);
	void *arg;
};

static void reply_ref_sent(void *arg)
{
	struct reply_ref *x = arg;
	rx_budget_give(&x->srv->budget, x->len);
	if (x->release)
		x->release(x->arg);
	free(x);
}

bool rpc_reply_ref(struct rpc_call *call, const void *p, size_t len,
		   void (*release)(void *arg), void *arg)
{
	struct rpc_sconn *sc = call->sc;
	struct reply_ref *x = NULL;
	if (call->notify || !sc->c || len == 0 || len > call->reserved ||
	    !(x = malloc(sizeof(*x)))) {
		/* Nobody to answer (the packer packs into nothing), nothing
		 * reserved for it, or out of memory: the bytes go the way of
		 * every other reply byte, copied. */
		msgpack_pack_bin_body(&call->pk, p, len);
		if (release)
			release(arg);
		return false;
	}
	reply_flush(call); /* what was packed before goes first */
	/* The call's reservation moves to these bytes: the connection's
	 * queue counts them for its own cap, and the node's budget keeps
	 * them until they have left. */
	call->reserved -= len;
	sc->reserved -= len;
	*x = (struct reply_ref){sc->srv, len, release, arg};
	bool began = !rx_conn_out_bytes(sc->c);
	/* On failure (closing, no memory) reply_ref_sent runs at once. */
	if (rx_conn_write_ref(sc->c, p, len, reply_ref_sent, x) == 0 && began)
		sc_watch_output(sc);
	return true;
}

void rpc_reply_end(struct rpc_call *call)
{
	reply_flush(call);
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
	if (!pc_auth_check(sc->srv->secret, sc->nonce, cnonce, false, proof)) {
		RX_STAT_INC(sc->st->auth_failures);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: wrong cluster secret; "
			  "closing", sc->peer);
		rpc_reply_error_close(call, RPC_E_UNAUTHORIZED,
				      "wrong proof: the cluster secrets differ");
		return;
	}
	if (sc->cls == SC_PREAUTH) {
		/* Move to the authenticated class, with the full limits. */
		struct rpc_server *s = sc->srv;
		if (class_take(s, &s->rs[rx_reactor_id(sc->r)], SC_TCP) < 0) {
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: %u authenticated "
				  "connections is the limit "
				  "(rpc_max_connections); closing", sc->peer,
				  s->lim.max_connections);
			rpc_reply_error_close(call, RPC_E_BUSY, "too many "
					      "connections; retry later");
			return;
		}
		__atomic_sub_fetch(&s->cls[SC_PREAUTH], 1, __ATOMIC_RELAXED);
		sc->cls = SC_TCP;
		sc->mpl = &s->mpl;
		rx_conn_set_limits(sc->c, s->mpl.max_bytes + 65536, 0, 0, 0);
	}
	sc->authed = true;
	sc->strikes = 0;
	uint8_t mine[PC_SHA256_BYTES];
	pc_auth_proof(sc->srv->secret, sc->nonce, cnonce, true, mine);
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
