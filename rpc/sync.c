/*
 * rpc/sync.c — the blocking MessagePack-RPC client (see client.h).
 *
 * Owns: struct rpc_sync, a pool of idle connections to one endpoint. Any
 * thread; the pool mutex guards only the idle list. A call leases a
 * connection (or opens one), sends with one sendmsg (carrying descriptors on
 * Unix endpoints), reads until one whole reply is in (scanned with the same
 * limits as the server), and gives the connection back only if all of that
 * succeeded; any error closes it. Deadlines use poll(2) on non-blocking
 * sockets, so a silent server costs a timeout, never a hang.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/sha256.h"
#include "common/util.h"
#include "rpc/auth.h"
#include "rpc/client.h"
#include "rpc/msg.h"

#define IDLE_MAX_CAP 64

/* A connection: leased to one thread at a time, pooled when idle. */
struct rpc_sync_conn {
	int fd;
	bool broken;                 /* an exchange failed: never reuse */
	void *udata;                 /* the caller's per-connection state */
	void (*udata_free)(void *udata);
};

struct rpc_sync {
	char *endpoint;
	struct sockaddr_storage addr;
	socklen_t addrlen;
	struct rpc_sync_opts o;
	char *secret;
	struct mp_limits mpl;
	pthread_mutex_t lock;
	struct rpc_sync_conn *idle[IDLE_MAX_CAP];
	unsigned nidle;
	uint32_t next_msgid; /* atomic */
};

/* An idle connection has nothing to read: readable means EOF or junk. */
static bool idle_alive(int fd)
{
	struct pollfd pf = {.fd = fd, .events = POLLIN | POLLRDHUP};
	return poll(&pf, 1, 0) == 0;
}

void rpc_sync_opts_default(struct rpc_sync_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->timeout_ms = 5000;
	o->max_idle = 8;
	o->max_message_bytes = 64u << 20;
}

static uint64_t deadline_after(unsigned ms)
{
	return pc_now_ns() + (uint64_t)ms * 1000000ull;
}

int rpc_wait_fd(int fd, short events, uint64_t deadline)
{
	for (;;) {
		uint64_t now = pc_now_ns();
		if (now >= deadline)
			return -ETIMEDOUT;
		struct pollfd pf = {.fd = fd, .events = events};
		int ms = (int)PC_MIN((deadline - now) / 1000000ull + 1,
				     (uint64_t)INT32_MAX);
		int n = poll(&pf, 1, ms);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n > 0)
			return 0;
	}
}

static int send_all(int fd, const uint8_t *p, size_t len, const int *fds,
		    unsigned nfds, uint64_t deadline)
{
	size_t off = 0;
	while (off < len) {
		struct iovec iov = {(void *)(p + off), len - off};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
		union {
			char buf[CMSG_SPACE(sizeof(int) * 64)];
			struct cmsghdr align;
		} ctl;
		if (nfds && off == 0) { /* descriptors ride with the first byte */
			memset(&ctl, 0, sizeof(ctl));
			mh.msg_control = ctl.buf;
			mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
			struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
			memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
		}
		ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (n > 0) {
			off += (size_t)n;
			continue;
		}
		if (n < 0 && errno != EAGAIN && errno != EINTR)
			return -errno;
		int ret = rpc_wait_fd(fd, POLLOUT, deadline);
		if (ret < 0)
			return ret;
	}
	return 0;
}

/* Read one whole message into *buf (grown as needed). Returns its size. */
static ssize_t recv_msg(struct rpc_sync *s, int fd, struct pc_wbuf *in,
			uint64_t deadline)
{
	size_t need = 1;
	struct mp_scan_state scan;
	mp_scan_begin(&scan);
	for (;;) {
		if (in->len >= need) {
			size_t size;
			int ret = mp_scan_resume(&scan, in->data, in->len, &s->mpl,
						 &size);
			if (ret == MP_COMPLETE)
				return (ssize_t)size;
			if (ret < 0)
				return -EPROTO;
			need = size;
		}
		uint8_t chunk[65536];
		size_t want = PC_MIN(sizeof(chunk), PC_MAX(need - PC_MIN(need,
							in->len),
						   (size_t)4096));
		ssize_t n = recv(fd, chunk, want, 0);
		if (n > 0) {
			if (pc_wbuf_append(in, chunk, (size_t)n) < 0)
				return -EMSGSIZE;
			continue;
		}
		if (n == 0)
			return -ECONNRESET;
		if (errno != EAGAIN && errno != EINTR)
			return -errno;
		int ret = rpc_wait_fd(fd, POLLIN, deadline);
		if (ret < 0)
			return ret;
	}
}

/* One exchange on fd; the reply lands in rep. */
static int exchange(struct rpc_sync *s, int fd, const char *method,
		    const void *params, size_t plen, const int *fds,
		    unsigned nfds, uint64_t deadline,
		    struct rpc_sync_reply *rep)
{
	uint32_t msgid = __atomic_fetch_add(&s->next_msgid, 1, __ATOMIC_RELAXED);
	struct pc_wbuf out;
	msgpack_packer pk;
	pc_wbuf_init(&out, 0);
	pc_wbuf_packer(&out, &pk);
	msgpack_pack_array(&pk, 4);
	msgpack_pack_uint8(&pk, RPC_REQUEST);
	msgpack_pack_uint32(&pk, msgid);
	mp_pack_cstr(&pk, method);
	pc_wbuf_append(&out, params, plen);
	int ret = out.failed ? -ENOMEM
			     : send_all(fd, out.data, out.len, fds, nfds,
					deadline);
	pc_wbuf_free(&out);
	if (ret < 0)
		return ret;
	struct pc_wbuf in;
	pc_wbuf_init(&in, s->o.max_message_bytes + 65536);
	ssize_t size = recv_msg(s, fd, &in, deadline);
	if (size < 0) {
		pc_wbuf_free(&in);
		return (int)size;
	}
	struct rpc_msg m;
	const char *why;
	if ((size_t)size != in.len ||
	    rpc_msg_parse(in.data, (size_t)size, &m, &why) < 0 ||
	    m.type != RPC_RESPONSE || m.msgid != msgid) {
		pc_wbuf_free(&in);
		return -EPROTO; /* one call at a time: anything else is wrong */
	}
	rep->buf = in.data;
	rep->len = in.len;
	rpc_result_from_response(&m, &rep->res);
	return 0;
}

static int sync_auth(struct rpc_sync *s, int fd, uint64_t deadline)
{
	static const uint8_t empty[] = {0x90};
	uint8_t snonce[RPC_NONCE_BYTES], cnonce[RPC_NONCE_BYTES];
	struct rpc_sync_reply rep;
	int ret = exchange(s, fd, "auth.challenge", empty, 1, NULL, 0,
			   deadline, &rep);
	bool ok = ret == 0 && rep.res.err == 0 &&
		  rpc_auth_read_challenge(rep.res.result, snonce) == 0 &&
		  pc_random_bytes(cnonce, sizeof(cnonce)) == 0;
	rpc_sync_reply_free(&rep);
	if (!ok)
		return ret < 0 ? ret : -EACCES;
	struct pc_wbuf params;
	msgpack_packer pk;
	pc_wbuf_init(&params, 0);
	pc_wbuf_packer(&params, &pk);
	msgpack_pack_array(&pk, 2);
	rpc_auth_pack_response(&pk, s->secret, snonce, cnonce);
	ret = params.failed ? -ENOMEM
			    : exchange(s, fd, "auth.response", params.data,
				       params.len, NULL, 0, deadline, &rep);
	pc_wbuf_free(&params);
	ok = ret == 0 && rep.res.err == 0 &&
	     rpc_auth_check_server(rep.res.result, s->secret, snonce, cnonce);
	if (ret == 0)
		rpc_sync_reply_free(&rep);
	return ok ? 0 : (ret < 0 ? ret : -EACCES);
}

int rpc_connect_by(const struct sockaddr_storage *ss, socklen_t len,
		   uint64_t deadline)
{
	int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK |
					       SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (ss->ss_family != AF_UNIX) {
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	}
	int ret = 0;
	if (connect(fd, (const struct sockaddr *)ss, len) < 0) {
		if (errno != EINPROGRESS && errno != EAGAIN) {
			ret = -errno;
		} else if ((ret = rpc_wait_fd(fd, POLLOUT, deadline)) == 0) {
			int soerr = 0;
			socklen_t sl = sizeof(soerr);
			getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
			ret = -soerr;
		}
	}
	if (ret < 0) {
		close(fd);
		return ret;
	}
	return fd;
}

static int sync_connect(struct rpc_sync *s, uint64_t deadline)
{
	int fd = rpc_connect_by(&s->addr, s->addrlen, deadline);
	int ret = fd >= 0 && s->secret ? sync_auth(s, fd, deadline) : 0;
	if (ret < 0) {
		close(fd);
		return ret;
	}
	return fd;
}

struct rpc_sync *rpc_sync_new(const char *endpoint,
			      const struct rpc_sync_opts *o, int *err)
{
	struct rpc_sync *s = calloc(1, sizeof(*s));
	if (!s) {
		*err = -ENOMEM;
		return NULL;
	}
	s->o = *o;
	s->o.max_idle = PC_MIN(s->o.max_idle, (unsigned)IDLE_MAX_CAP);
	if (!s->o.timeout_ms)
		s->o.timeout_ms = 5000;
	if (!s->o.max_message_bytes)
		s->o.max_message_bytes = 64u << 20;
	s->mpl.max_bytes = s->o.max_message_bytes;
	s->mpl.max_elements = 1u << 20;
	s->mpl.max_depth = 32;
	s->mpl.max_objects = (uint32_t)PC_MIN(s->o.max_message_bytes,
					      (size_t)UINT32_MAX);
	s->endpoint = strdup(endpoint);
	if (o->secret && *o->secret)
		s->secret = strdup(o->secret);
	*err = pc_endpoint_parse(endpoint, &s->addr, &s->addrlen);
	if (*err == 0 && (!s->endpoint || (o->secret && *o->secret &&
					   !s->secret)))
		*err = -ENOMEM;
	if (*err) {
		free(s->endpoint);
		free(s->secret);
		free(s);
		return NULL;
	}
	pthread_mutex_init(&s->lock, NULL);
	return s;
}

static void conn_close(struct rpc_sync_conn *c)
{
	if (c->udata_free)
		c->udata_free(c->udata);
	close(c->fd);
	free(c);
}

void rpc_sync_free(struct rpc_sync *s)
{
	if (!s)
		return;
	for (unsigned i = 0; i < s->nidle; i++)
		conn_close(s->idle[i]);
	pthread_mutex_destroy(&s->lock);
	if (s->secret) {
		explicit_bzero(s->secret, strlen(s->secret));
		free(s->secret);
	}
	free(s->endpoint);
	free(s);
}

void rpc_sync_reply_free(struct rpc_sync_reply *rep)
{
	free(rep->buf);
	rep->buf = NULL;
	rep->len = 0;
}

int rpc_sync_lease(struct rpc_sync *s, unsigned timeout_ms,
		   struct rpc_sync_conn **out)
{
	struct rpc_sync_conn *c;
	for (;;) {
		pthread_mutex_lock(&s->lock);
		c = s->nidle ? s->idle[--s->nidle] : NULL;
		pthread_mutex_unlock(&s->lock);
		if (!c || idle_alive(c->fd))
			break;
		conn_close(c); /* the server closed it while it sat idle */
	}
	if (!c) {
		uint64_t deadline = deadline_after(timeout_ms ? timeout_ms
							      : s->o.timeout_ms);
		int fd = sync_connect(s, deadline);
		if (fd < 0)
			return fd;
		if (!(c = calloc(1, sizeof(*c)))) {
			close(fd);
			return -ENOMEM;
		}
		c->fd = fd;
	}
	*out = c;
	return 0;
}

void rpc_sync_release(struct rpc_sync *s, struct rpc_sync_conn *c)
{
	if (!c->broken) {
		pthread_mutex_lock(&s->lock);
		if (s->nidle < s->o.max_idle) {
			s->idle[s->nidle++] = c;
			c = NULL;
		}
		pthread_mutex_unlock(&s->lock);
	}
	if (c)
		conn_close(c);
}

void *rpc_sync_conn_udata(const struct rpc_sync_conn *c)
{
	return c->udata;
}

void rpc_sync_conn_set_udata(struct rpc_sync_conn *c, void *udata,
			     void (*udata_free)(void *udata))
{
	c->udata = udata;
	c->udata_free = udata_free;
}

int rpc_sync_conn_call(struct rpc_sync *s, struct rpc_sync_conn *c,
		       const char *method, const void *params,
		       size_t params_len, const int *fds, unsigned nfds,
		       unsigned timeout_ms, struct rpc_sync_reply *rep)
{
	memset(rep, 0, sizeof(*rep));
	if (c->broken || nfds > 64 ||
	    (nfds && s->addr.ss_family != AF_UNIX)) {
		rep->res.err = c->broken ? -EPIPE : -EINVAL;
		return rep->res.err;
	}
	uint64_t deadline = deadline_after(timeout_ms ? timeout_ms
						      : s->o.timeout_ms);
	int ret = exchange(s, c->fd, method, params, params_len, fds, nfds,
			   deadline, rep);
	if (ret < 0) {
		c->broken = true; /* never reuse a connection that failed */
		rep->res.err = ret;
	}
	return ret;
}

int rpc_sync_call(struct rpc_sync *s, const char *method, const void *params,
		  size_t params_len, const int *fds, unsigned nfds,
		  unsigned timeout_ms, struct rpc_sync_reply *rep)
{
	struct rpc_sync_conn *c;
	memset(rep, 0, sizeof(*rep));
	int ret = rpc_sync_lease(s, timeout_ms, &c);
	if (ret < 0) {
		rep->res.err = ret;
		return ret;
	}
	ret = rpc_sync_conn_call(s, c, method, params, params_len, fds, nfds,
				 timeout_ms, rep);
	rpc_sync_release(s, c);
	return ret;
}
