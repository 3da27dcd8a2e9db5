/*
 * modules/discovery_etcd.c — the etcd discovery backend
 * (discovery_backend = etcd; docs/discovery.md "etcd backend").
 *
 * Owns: this node's membership key in etcd (<etcd_prefix>members/<ring id>,
 * value {"id": ring id, "data": data endpoint}) and the lease it is attached
 * to, the keepalive of that lease, a watch on the members prefix, and the
 * member lists it reads there (handed to discovery.c's disc_view_adopt,
 * which gives them to the ring through svc_cluster.set_members, as the
 * embedded backend does). It speaks etcd's v3 HTTP/JSON gateway
 * (/v3/lease/grant, /v3/kv/put, /v3/kv/range, /v3/lease/keepalive,
 * /v3/watch, /v3/lease/revoke) with its own small HTTP/1.1 client
 * (etcd_wire.h reads the replies): no etcd library.
 *
 * Threading: one dedicated thread ("pc-etcd") does all of it with blocking
 * sockets bounded by poll() deadlines (CALL_MS per call); it never touches
 * a reactor. Other threads only set e.stop and write the wake pipe.
 *
 * Protocol: grant a lease of member_ttl rounded up to whole seconds (etcd's
 * unit), put the key with it, keep it alive every TTL / 3. Read the members
 * with a range (its header revision is the view's epoch), then watch the
 * prefix from the next revision; every watch message with events triggers a
 * new range (the watch is a doorbell, the range the truth, so no event is
 * ever applied out of order); a range also runs every RESYNC_MS without
 * events, and the watch socket has TCP keepalives, so a watch that died
 * silently is not trusted for long. A killed node's key goes when its lease
 * expires; a stopping node revokes its lease (key removed at once).
 *
 * Failures: any failed call closes the watch, moves to the next endpoint
 * (etcd_endpoints in order, round robin) and, once a whole round failed,
 * retries with a backoff doubling from BACKOFF_MIN_MS to BACKOFF_MAX_MS;
 * logs are rate-limited. The view is never changed by a failure: with etcd
 * out of reach the node keeps its last member list. A keepalive answered
 * with no TTL means the lease expired (etcd was out of reach longer than
 * the TTL): a new lease and put follow at once.
 *
 * Invariants: e.lease != 0 only while the key was put with it; the view is
 * only ever replaced by a complete range reply.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "common/util.h"
#include "modules/discovery_int.h"
#include "modules/etcd_wire.h"

#define LOG_MOD "discovery"
#define EPS_MAX 16
#define CALL_MS 1000         /* one unary call, connect to last byte */
#define REVOKE_MS 500        /* the revoke at shutdown */
#define TICK_MS 200          /* the loop wakes at least this often */
#define RESYNC_MS 10000      /* a range even without events (a watch that
				silently died is not trusted for long) */
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 1000  /* below a lease TTL: keepalives get through */
#define BODY_MAX (8u << 20)  /* a reply body (1024 members are ~300 KB) */
#define READ_CHUNK 65536
#define KEY_MAX 512
#define PFX_MAX 264          /* etcd_prefix (<= 255 bytes) and a slash */

/* One HTTP exchange on one connection (Connection: close for unary calls;
 * the watch keeps its connection and reads the stream as it comes). */
struct hconn {
	int fd;
	char *raw;                 /* received, not yet decoded */
	size_t rawn;
	struct etcd_http_head h;
	bool have_head, done;
	struct etcd_chunks ck;
	char *body;                /* decoded body bytes */
	size_t bodyn, bodycap;
	uint64_t got;              /* body bytes received (Content-Length) */
};

static struct {
	const struct pc_settings *s;
	bool inited;               /* disc_etcd_init ran: fds are ours */
	char self_id[DISC_ADDR_MAX], self_data[DISC_ADDR_MAX];
	char eps[EPS_MAX][DISC_ADDR_MAX];
	unsigned neps, ep;
	char key_b64[ETCD_B64_LEN(KEY_MAX) + 1];
	char val_b64[ETCD_B64_LEN(2 * DISC_ADDR_MAX + 32) + 1];
	char pfx_b64[ETCD_B64_LEN(KEY_MAX) + 1], end_b64[ETCD_B64_LEN(KEY_MAX) + 1];
	char pfx[PFX_MAX];
	int64_t ttl_s;             /* asked for */
	uint64_t ka_ns;            /* keepalive period (granted TTL / 3) */
	pthread_t thread;
	bool thread_on;
	int wake[2];
	atomic_bool stop;
	/* the thread's */
	int64_t lease;
	uint64_t ka_at, retry_at, backoff_ms, resync_at;
	unsigned fails;            /* calls failed in a row */
	int64_t rev;               /* of the last range adopted */
	struct hconn watch;        /* fd -1: none */
	char (*ids)[DISC_ADDR_MAX];
	met_id calls, errors, lease_lost, events;
} e;

/* ------------------------------------------------------------ HTTP client */

static void conn_reset(struct hconn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	free(c->raw);
	free(c->body);
	memset(c, 0, sizeof(*c));
	c->fd = -1;
}

static int ms_left(uint64_t deadline)
{
	uint64_t now = pc_now_ns();
	return now >= deadline ? 0 : (int)((deadline - now) / 1000000 + 1);
}

/* Wait for fd to be ready for ev until deadline: 0, -ETIMEDOUT. */
static int wait_fd(int fd, short ev, uint64_t deadline)
{
	for (;;) {
		struct pollfd p = {.fd = fd, .events = ev};
		int left = ms_left(deadline);
		if (left == 0)
			return -ETIMEDOUT;
		int n = poll(&p, 1, left);
		if (n > 0)
			return 0;
		if (n < 0 && errno != EINTR)
			return -errno;
	}
}

/* A non-blocking TCP connection to "host:port", connected by deadline. */
static int tcp_connect(const char *ep, uint64_t deadline)
{
	char host[DISC_ADDR_MAX];
	snprintf(host, sizeof(host), "%s", ep);
	char *colon = strrchr(host, ':');
	if (!colon)
		return -EINVAL;
	*colon = '\0';
	const char *h = host;
	size_t hl = strlen(host);
	if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
		host[hl - 1] = '\0';
		h = host + 1;
	}
	struct addrinfo hints = {.ai_family = AF_UNSPEC,
				 .ai_socktype = SOCK_STREAM};
	struct addrinfo *ai = NULL;
	int gai = getaddrinfo(h, colon + 1, &hints, &ai);
	if (gai != 0 || !ai)
		return -EHOSTUNREACH;
	int ret = -ECONNREFUSED;
	for (struct addrinfo *a = ai; a; a = a->ai_next) {
		int fd = socket(a->ai_family,
				SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			ret = -errno;
			continue;
		}
		if (connect(fd, a->ai_addr, a->ai_addrlen) < 0 &&
		    errno != EINPROGRESS) {
			ret = -errno;
			close(fd);
			continue;
		}
		int err = 0;
		socklen_t el = sizeof(err);
		if ((ret = wait_fd(fd, POLLOUT, deadline)) == 0 &&
		    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err)
			ret = -err;
		if (ret == 0) {
			freeaddrinfo(ai);
			return fd;
		}
		close(fd);
	}
	freeaddrinfo(ai);
	return ret;
}

static int send_all(int fd, const char *p, size_t n, uint64_t deadline)
{
	while (n) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
		if (k > 0) {
			p += k;
			n -= (size_t)k;
		} else if (k < 0 && errno == EAGAIN) {
			int ret = wait_fd(fd, POLLOUT, deadline);
			if (ret < 0)
				return ret;
		} else if (k < 0 && errno != EINTR) {
			return -errno;
		}
	}
	return 0;
}

/* Open a connection to the current endpoint and send one POST. */
static int conn_post(struct hconn *c, const char *path, const char *body,
		     bool keep, uint64_t deadline)
{
	conn_reset(c);
	const char *ep = e.eps[e.ep];
	int fd = tcp_connect(ep, deadline);
	if (fd < 0)
		return fd;
	c->fd = fd;
	size_t bl = strlen(body);
	size_t cap = bl + strlen(path) + strlen(ep) + 256;
	char *req = malloc(cap);
	if (!req)
		return -ENOMEM;
	int n = snprintf(req, cap, "POST %s HTTP/1.1\r\nHost: %s\r\n"
			 "Content-Type: application/json\r\n"
			 "Content-Length: %zu\r\n%s\r\n%s", path, ep, bl,
			 keep ? "" : "Connection: close\r\n", body);
	int ret = send_all(fd, req, (size_t)n, deadline);
	free(req);
	met_inc(e.calls);
	return ret;
}

static int body_room(struct hconn *c, size_t want)
{
	if (c->bodycap - c->bodyn >= want)
		return 0;
	size_t cap = c->bodycap ? c->bodycap : 4096;
	while (cap - c->bodyn < want)
		cap *= 2;
	if (cap > BODY_MAX)
		return -EMSGSIZE;
	char *b = realloc(c->body, cap + 1);
	if (!b)
		return -ENOMEM;
	c->body = b;
	c->bodycap = cap;
	return 0;
}

/* Move received bytes into the body (head first). 0, or -errno. */
static int conn_decode(struct hconn *c)
{
	if (!c->have_head) {
		int ret = etcd_http_head(c->raw, c->rawn, &c->h);
		if (ret <= 0)
			return ret;
		c->have_head = true;
		memmove(c->raw, c->raw + c->h.head_len, c->rawn - c->h.head_len);
		c->rawn -= c->h.head_len;
		if (!c->h.chunked && c->h.content_length == 0)
			c->done = true;
	}
	while (c->rawn && !c->done) {
		size_t used = c->rawn, made = c->rawn;
		int ret;
		if ((ret = body_room(c, c->h.chunked ? 4096 : c->rawn)) < 0)
			return ret;
		if (c->h.chunked) {
			ret = etcd_chunks_decode(&c->ck, c->raw, c->rawn, &used,
						 c->body + c->bodyn,
						 c->bodycap - c->bodyn, &made);
			if (ret < 0)
				return ret;
			c->done = ret == 1;
		} else {
			if (c->h.content_length >= 0 &&
			    c->got + used > (uint64_t)c->h.content_length)
				return -EPROTO; /* more than announced */
			memcpy(c->body + c->bodyn, c->raw, used);
			c->got += used;
			c->done = c->h.content_length >= 0 &&
				  c->got == (uint64_t)c->h.content_length;
		}
		c->bodyn += made;
		memmove(c->raw, c->raw + used, c->rawn - used);
		c->rawn -= used;
	}
	return 0;
}

/* Read what is there (one recv) and decode it: 0, 1 at end of stream,
 * -errno. */
static int conn_read(struct hconn *c)
{
	if (!c->raw && !(c->raw = malloc(READ_CHUNK + ETCD_HTTP_HEAD_MAX)))
		return -ENOMEM;
	size_t room = READ_CHUNK + ETCD_HTTP_HEAD_MAX - c->rawn;
	if (room == 0)
		return -EPROTO;
	ssize_t k = recv(c->fd, c->raw + c->rawn, room, 0);
	if (k < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : -errno;
	c->rawn += (size_t)k;
	int ret = conn_decode(c);
	if (ret < 0)
		return ret;
	if (k == 0) {
		if (!c->have_head)
			return -ECONNRESET;
		/* a body without length ends with the connection */
		if (!c->h.chunked && c->h.content_length < 0)
			c->done = true;
		return c->done ? 1 : -ECONNRESET;
	}
	return 0;
}

/* The error an etcd reply carries ({"error": ..., "message": ...} or
 * {"error": {"message": ...}}) into buf; false when none. */
static bool reply_error(const struct etcd_json *root, char *buf, size_t cap)
{
	struct etcd_json v;
	if (etcd_json_get(root, "error", &v) < 0)
		return false;
	if (etcd_json_get(root, "message", &v) < 0 &&
	    etcd_json_path(root, "error.message", &v) < 0 &&
	    etcd_json_get(root, "error", &v) < 0)
		return false;
	if (etcd_json_str(&v, buf, cap) < 0)
		snprintf(buf, cap, "(an error without a readable message)");
	return true;
}

/* One unary call: POST body to path on the current endpoint, read the
 * whole reply, check status 200 and JSON without "error". The reply's
 * root in *root (pointing into c->body; the caller resets c). */
static int call(struct hconn *c, const char *path, const char *body,
		unsigned ms, struct etcd_json *root, char *why, size_t whyl)
{
	uint64_t deadline = pc_now_ns() + (uint64_t)ms * 1000000;
	int ret = conn_post(c, path, body, false, deadline);
	while (ret == 0 && !c->done) {
		if ((ret = wait_fd(c->fd, POLLIN, deadline)) == 0)
			ret = conn_read(c);
		ret = ret == 1 ? 0 : ret;
	}
	if (ret < 0) {
		snprintf(why, whyl, "%s", strerror(-ret));
		return ret;
	}
	if (!c->body && body_room(c, 1) < 0)
		return -ENOMEM;
	c->body[c->bodyn] = '\0';
	if (etcd_json_parse(c->body, c->bodyn, root) < 0) {
		snprintf(why, whyl, "HTTP %d and a reply that is not JSON "
			 "(is this etcd's client URL?): %.60s", c->h.status,
			 c->body);
		return -EPROTO;
	}
	/* streams (keepalive) wrap their message in "result" */
	struct etcd_json res;
	if (reply_error(root, why, whyl))
		return -EREMOTEIO;
	if (c->h.status != 200) {
		snprintf(why, whyl, "HTTP %d", c->h.status);
		return -EREMOTEIO;
	}
	if (etcd_json_get(root, "result", &res) == 0)
		*root = res;
	return 0;
}

/* ------------------------------------------------------------ the protocol */

static void backoff_reset(void)
{
	if (e.fails)
		PC_LOGI(LOG_MOD, "etcd %s answers again (after %u failed "
			"call%s)", e.eps[e.ep], e.fails,
			e.fails == 1 ? "" : "s");
	e.fails = 0;
	e.backoff_ms = 0;
}

/* A call failed: log (rate-limited), drop the watch, try the next
 * endpoint; after a whole round, back off. */
static void failed(const char *what, const char *why)
{
	met_inc(e.errors);
	PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "etcd %s: %s failed: %s (the member "
		  "list stays as it was; retrying)", e.eps[e.ep], what, why);
	conn_reset(&e.watch);
	e.fails++;
	e.ep = (e.ep + 1) % e.neps;
	if (e.fails % e.neps == 0)
		e.backoff_ms = PC_MIN(PC_MAX(e.backoff_ms * 2, BACKOFF_MIN_MS),
				      BACKOFF_MAX_MS);
	else
		e.backoff_ms = 0;
	e.retry_at = pc_now_ns() + e.backoff_ms * 1000000;
}

static int do_register(void)
{
	struct hconn c = {.fd = -1};
	struct etcd_json root, v;
	char body[2 * sizeof(e.key_b64) + sizeof(e.val_b64)], why[256];
	int64_t id = 0, ttl = 0;
	snprintf(body, sizeof(body), "{\"TTL\":%lld}", (long long)e.ttl_s);
	int ret = call(&c, "/v3/lease/grant", body, CALL_MS, &root, why,
		       sizeof(why));
	if (ret == 0 && (etcd_json_get(&root, "ID", &v) < 0 ||
			 etcd_json_int(&v, &id) < 0 || id == 0 ||
			 etcd_json_get(&root, "TTL", &v) < 0 ||
			 etcd_json_int(&v, &ttl) < 0 || ttl <= 0)) {
		snprintf(why, sizeof(why), "the reply has no lease ID and TTL");
		ret = -EPROTO;
	}
	conn_reset(&c);
	if (ret < 0) {
		failed("lease grant", why);
		return ret;
	}
	snprintf(body, sizeof(body), "{\"key\":\"%s\",\"value\":\"%s\","
		 "\"lease\":\"%lld\"}", e.key_b64, e.val_b64, (long long)id);
	ret = call(&c, "/v3/kv/put", body, CALL_MS, &root, why, sizeof(why));
	conn_reset(&c);
	if (ret < 0) { /* the lease expires by itself */
		failed("put of this node's key", why);
		return ret;
	}
	e.lease = id;
	e.ka_ns = (uint64_t)ttl * 1000000000 / 3;
	e.ka_at = pc_now_ns() + e.ka_ns;
	PC_LOGI(LOG_MOD, "etcd %s: registered %smembers/%s with lease %llx "
		"(TTL %lld s, kept alive every %llu ms)", e.eps[e.ep], e.pfx,
		e.self_id, (unsigned long long)id, (long long)ttl,
		(unsigned long long)(e.ka_ns / 1000000));
	return 0;
}

/* 0 kept, -ENOENT the lease is gone, other -errno: the call failed. */
static int do_keepalive(void)
{
	struct hconn c = {.fd = -1};
	struct etcd_json root, v;
	char body[64], why[256];
	int64_t ttl = 0;
	snprintf(body, sizeof(body), "{\"ID\":\"%lld\"}", (long long)e.lease);
	int ret = call(&c, "/v3/lease/keepalive", body, CALL_MS, &root, why,
		       sizeof(why));
	/* proto3 JSON omits zero fields: no TTL means TTL 0, lease gone */
	if (ret == 0 && etcd_json_get(&root, "TTL", &v) == 0 &&
	    etcd_json_int(&v, &ttl) < 0) {
		snprintf(why, sizeof(why), "the reply's TTL is not an integer");
		ret = -EPROTO;
	}
	conn_reset(&c);
	if (ret < 0) {
		failed("lease keepalive", why);
		return ret;
	}
	if (ttl <= 0) {
		met_inc(e.lease_lost);
		PC_LOGW(LOG_MOD, "etcd %s: lease %llx expired (etcd did not "
			"hear from this node for its TTL): registering again",
			e.eps[e.ep], (unsigned long long)e.lease);
		e.lease = 0;
		return -ENOENT;
	}
	return 0;
}

/* Range the members prefix and adopt it as the view. */
static int do_range(void)
{
	struct hconn c = {.fd = -1};
	struct etcd_json root, v, kvs, kv, val;
	char body[2 * sizeof(e.pfx_b64) + 64], why[256];
	int64_t rev = 0;
	snprintf(body, sizeof(body), "{\"key\":\"%s\",\"range_end\":\"%s\"}",
		 e.pfx_b64, e.end_b64);
	int ret = call(&c, "/v3/kv/range", body, CALL_MS, &root, why,
		       sizeof(why));
	if (ret == 0 && (etcd_json_path(&root, "header.revision", &v) < 0 ||
			 etcd_json_int(&v, &rev) < 0 || rev <= 0)) {
		snprintf(why, sizeof(why), "the reply has no header.revision");
		ret = -EPROTO;
	}
	unsigned n = 0;
	size_t pos = 0;
	if (ret == 0 && etcd_json_get(&root, "kvs", &kvs) == 0) {
		int k;
		while ((k = etcd_json_next(&kvs, &pos, &kv)) == 1) {
			char b64[ETCD_B64_LEN(1024) + 1], raw[1024];
			struct etcd_json doc, idv;
			int rl = -1;
			if (etcd_json_get(&kv, "value", &val) == 0 &&
			    etcd_json_str(&val, b64, sizeof(b64)) >= 0)
				rl = etcd_b64_dec(b64, strlen(b64), raw,
						  sizeof(raw));
			char id[DISC_ADDR_MAX];
			int il = -1;
			if (rl >= 0 && etcd_json_parse(raw, (size_t)rl,
						       &doc) == 0 &&
			    etcd_json_get(&doc, "id", &idv) == 0)
				il = etcd_json_str(&idv, raw, sizeof(raw));
			if (il < 0 || !disc_addr_ok(raw, (uint32_t)il, id)) {
				PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "etcd %s: a "
					  "key under %smembers/ has no "
					  "{\"id\": \"host:port\"} value: "
					  "skipped", e.eps[e.ep], e.pfx);
				continue;
			}
			if (n == DISC_MEMBERS_MAX) {
				PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "etcd: more "
					  "than %d members: the rest are "
					  "ignored", DISC_MEMBERS_MAX);
				break;
			}
			memcpy(e.ids[n++], id, sizeof(id));
		}
		if (k < 0) {
			snprintf(why, sizeof(why), "malformed kvs");
			ret = -EPROTO;
		}
	}
	conn_reset(&c);
	if (ret < 0) {
		failed("range of the members", why);
		return ret;
	}
	char from[DISC_ADDR_MAX + 8];
	snprintf(from, sizeof(from), "etcd %s", e.eps[e.ep]);
	if (rev != e.rev)
		PC_LOGD(LOG_MOD, "etcd %s: %u members at revision %lld",
			e.eps[e.ep], n, (long long)rev);
	e.rev = rev;
	e.resync_at = pc_now_ns() + (uint64_t)RESYNC_MS * 1000000;
	disc_view_adopt((const char (*)[DISC_ADDR_MAX])e.ids, n,
			(uint64_t)rev, from);
	return 0;
}

/* Range, then watch the prefix from the revision after it. */
static int do_sync(void)
{
	int ret = do_range();
	if (ret < 0)
		return ret;
	char body[2 * sizeof(e.pfx_b64) + 128];
	snprintf(body, sizeof(body), "{\"create_request\":{\"key\":\"%s\","
		 "\"range_end\":\"%s\",\"start_revision\":\"%lld\"}}",
		 e.pfx_b64, e.end_b64, (long long)e.rev + 1);
	uint64_t deadline = pc_now_ns() + (uint64_t)CALL_MS * 1000000;
	if ((ret = conn_post(&e.watch, "/v3/watch", body, true, deadline)) < 0) {
		failed("watch", strerror(-ret));
		return ret;
	}
	/* a peer that vanished without a FIN is noticed within ~11 s */
	int on = 1, idle = 5, intvl = 2, cnt = 3;
	setsockopt(e.watch.fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
	setsockopt(e.watch.fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
	setsockopt(e.watch.fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl,
		   sizeof(intvl));
	setsockopt(e.watch.fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
	return 0;
}

/* One watch message (a line of the stream): 1 when it carries events,
 * 0 nothing to do, -errno when the watch must be made again. */
static int watch_message(const char *p, size_t n, char *why, size_t whyl)
{
	struct etcd_json root, res, v;
	bool b = false;
	if (etcd_json_parse(p, n, &root) < 0) {
		snprintf(why, whyl, "a watch message that is not JSON");
		return -EPROTO;
	}
	if (reply_error(&root, why, whyl))
		return -EREMOTEIO;
	if (etcd_json_get(&root, "result", &res) < 0) {
		snprintf(why, whyl, "a watch message without result");
		return -EPROTO;
	}
	if (etcd_json_get(&res, "canceled", &v) == 0 &&
	    etcd_json_bool(&v, &b) == 0 && b) {
		snprintf(why, whyl, "etcd canceled the watch");
		return -ECANCELED;
	}
	if (etcd_json_get(&res, "compact_revision", &v) == 0) {
		snprintf(why, whyl, "the watch revision was compacted");
		return -ECANCELED;
	}
	size_t pos = 0;
	struct etcd_json ev;
	if (etcd_json_get(&res, "events", &v) == 0 &&
	    etcd_json_next(&v, &pos, &ev) == 1) {
		met_inc(e.events);
		return 1;
	}
	return 0;
}

/* The watch socket is readable: read, handle every complete message. */
static void watch_read(void)
{
	struct hconn *c = &e.watch;
	char why[256] = "";
	int ret = conn_read(c);
	if (ret == 0 && c->have_head && c->h.status != 200) {
		snprintf(why, sizeof(why), "HTTP %d", c->h.status);
		ret = -EREMOTEIO;
	}
	bool news = false;
	while (ret >= 0 && c->bodyn) {
		char *nl = memchr(c->body, '\n', c->bodyn);
		size_t len = nl ? (size_t)(nl - c->body) : c->bodyn;
		struct etcd_json tmp;
		if (!nl && etcd_json_parse(c->body, len, &tmp) < 0)
			break; /* the rest of the message is still coming */
		size_t blank = 0;
		while (blank < len && (c->body[blank] == ' ' ||
				       c->body[blank] == '\r'))
			blank++;
		int k = blank == len ? 0 /* an empty line: nothing */
				     : watch_message(c->body, len, why,
						     sizeof(why));
		if (k < 0) {
			ret = k;
			break;
		}
		news |= k == 1;
		len += nl != NULL;
		memmove(c->body, c->body + len, c->bodyn - len);
		c->bodyn -= len;
	}
	if (ret == 1) { /* the stream ended */
		snprintf(why, sizeof(why), "etcd closed the watch stream");
		ret = -ECONNRESET;
	}
	if (ret < 0) {
		if (!why[0])
			snprintf(why, sizeof(why), "%s", strerror(-ret));
		failed("watch", why);
		return;
	}
	if (news && do_range() == 0)
		backoff_reset();
}

static void *etcd_thread(void *arg)
{
	(void)arg;
	pthread_setname_np(pthread_self(), "pc-etcd");
	pc_log_set_thread("etcd"); /* its log lines read [etcd/discovery] */
	met_bind_thread(0); /* the shared shard: counters from any thread */
	while (!atomic_load(&e.stop)) {
		uint64_t now = pc_now_ns();
		if (e.lease && now >= e.ka_at) {
			int ret = do_keepalive();
			if (ret == 0) {
				e.ka_at = now + e.ka_ns;
				backoff_reset();
			} else if (ret != -ENOENT) {
				e.ka_at = e.retry_at;
			}
		}
		now = pc_now_ns();
		if (now >= e.retry_at && (!e.lease || e.watch.fd < 0) &&
		    (e.lease || do_register() == 0) && do_sync() == 0)
			backoff_reset();
		else if (e.watch.fd >= 0 && now >= e.resync_at)
			do_range();
		disc_view_reapply(); /* the ring was busy: try again */
		now = pc_now_ns();
		uint64_t until = now + (uint64_t)TICK_MS * 1000000;
		if (e.lease && e.ka_at < until)
			until = e.ka_at;
		if ((!e.lease || e.watch.fd < 0) && e.retry_at < until)
			until = e.retry_at;
		struct pollfd p[2] = {{.fd = e.wake[0], .events = POLLIN},
				      {.fd = e.watch.fd, .events = POLLIN}};
		int n = poll(p, e.watch.fd >= 0 ? 2 : 1,
			     until > now ? (int)((until - now) / 1000000) : 0);
		if (n > 0 && e.watch.fd >= 0 && p[1].revents)
			watch_read();
	}
	conn_reset(&e.watch);
	if (e.lease) {
		struct hconn c = {.fd = -1};
		struct etcd_json root;
		char body[64], why[256];
		snprintf(body, sizeof(body), "{\"ID\":\"%lld\"}",
			 (long long)e.lease);
		if (call(&c, "/v3/lease/revoke", body, REVOKE_MS, &root, why,
			 sizeof(why)) == 0)
			PC_LOGI(LOG_MOD, "etcd %s: left (lease %llx revoked)",
				e.eps[e.ep], (unsigned long long)e.lease);
		else
			PC_LOGW(LOG_MOD, "etcd %s: lease revoke failed: %s "
				"(this node's key goes when the lease expires)",
				e.eps[e.ep], why);
		conn_reset(&c);
	}
	return NULL;
}

/* ------------------------------------------------------------ lifecycle */

int disc_etcd_init(struct pc_ctx *ctx)
{
	memset(&e, 0, sizeof(e));
	e.wake[0] = e.wake[1] = -1;
	e.watch.fd = -1;
	e.s = ctx->cfg;
	e.inited = true;
	int ret = disc_parse_addrs(e.s->etcd_endpoints, "etcd_endpoints",
				   "host:port (of etcd's client URL, plain "
				   "http)", e.eps, EPS_MAX, &e.neps);
	if (ret < 0)
		return ret;
	if (e.neps == 0) {
		PC_LOGE(LOG_MOD, "etcd_endpoints: no host:port in '%s'",
			e.s->etcd_endpoints);
		return -EINVAL;
	}
	const char *pf = e.s->etcd_prefix;
	/* room for members/<id> after it (checked in settings: <= 255) */
	snprintf(e.pfx, sizeof(e.pfx), "%s%s", pf,
		 pf[strlen(pf) - 1] == '/' ? "" : "/");
	char key[KEY_MAX];
	/* the members prefix, and its range end: the prefix with its last
	 * byte + 1 ('/' + 1 = '0') */
	snprintf(key, sizeof(key), "%smembers/", e.pfx);
	size_t n = strlen(key);
	etcd_b64_enc(key, n, e.pfx_b64);
	key[n - 1]++;
	etcd_b64_enc(key, n, e.end_b64);
	e.ttl_s = (int64_t)((e.s->member_ttl_ms + 999) / 1000);
	if (!(e.ids = calloc(DISC_MEMBERS_MAX, sizeof(*e.ids))))
		return -ENOMEM;
	if (pipe2(e.wake, O_CLOEXEC | O_NONBLOCK) < 0)
		return -errno;
	e.calls = met_register(MET_COUNTER,
			       "peercache_discovery_etcd_calls_total",
			       "HTTP calls to etcd (grant, put, range, "
			       "keepalive, watch, revoke)", NULL);
	e.errors = met_register(MET_COUNTER,
				"peercache_discovery_etcd_errors_total",
				"etcd calls that failed (unreachable, timed "
				"out, refused, malformed)", NULL);
	e.lease_lost = met_register(MET_COUNTER,
				    "peercache_discovery_etcd_lease_lost_total",
				    "times this node's lease had expired and "
				    "it registered again", NULL);
	e.events = met_register(MET_COUNTER,
				"peercache_discovery_etcd_watch_events_total",
				"watch messages with membership events", NULL);
	return 0;
}

int disc_etcd_start(const char *self_id, const char *self_data)
{
	snprintf(e.self_id, sizeof(e.self_id), "%s", self_id);
	snprintf(e.self_data, sizeof(e.self_data), "%s", self_data);
	char key[KEY_MAX + DISC_ADDR_MAX];
	snprintf(key, sizeof(key), "%smembers/%s", e.pfx, e.self_id);
	if (strlen(key) >= KEY_MAX)
		return -ENAMETOOLONG;
	etcd_b64_enc(key, strlen(key), e.key_b64);
	char val[2 * DISC_ADDR_MAX + 32];
	snprintf(val, sizeof(val), "{\"id\":\"%s\",\"data\":\"%s\"}",
		 e.self_id, e.self_data);
	etcd_b64_enc(val, strlen(val), e.val_b64);
	int ret = pthread_create(&e.thread, NULL, etcd_thread, NULL);
	if (ret != 0)
		return -ret;
	e.thread_on = true;
	PC_LOGI(LOG_MOD, "discovery on: etcd backend, endpoints %s, members "
		"under %smembers/, lease TTL %lld s", e.s->etcd_endpoints,
		e.pfx, (long long)e.ttl_s);
	return 0;
}

void disc_etcd_stop(void)
{
	if (!e.thread_on || atomic_exchange(&e.stop, true))
		return;
	char b = 1;
	if (write(e.wake[1], &b, 1) < 0) {
		/* the thread still sees stop within TICK_MS */
	}
}

void disc_etcd_fini(void)
{
	if (!e.inited)
		return;
	disc_etcd_stop();
	if (e.thread_on)
		pthread_join(e.thread, NULL);
	conn_reset(&e.watch);
	for (int i = 0; i < 2; i++)
		if (e.wake[i] >= 0)
			close(e.wake[i]);
	free(e.ids);
	memset(&e, 0, sizeof(e));
}
