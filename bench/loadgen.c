/*
 * bench/loadgen.c — pc-loadgen, a closed-loop TCP load generator.
 *
 * Owns: the benchmark's client side. N connections are opened up front, spread
 * round-robin over T worker threads; each thread owns its connections, its
 * epoll instance and its latency histogram outright, so the hot path shares
 * nothing and takes no locks. The main thread only parses options, connects,
 * starts the workers, joins them and merges their results.
 *
 * Closed loop: every connection keeps exactly `pipeline` requests in flight.
 * Each time one whole reply has arrived, the latency of the request it answers
 * is recorded and one new request is sent, so the offered load follows the
 * server's speed (this measures round trips, not an open-loop arrival rate).
 *
 * The wire protocol sits behind struct lg_proto: "how to build a request" and
 * "how long is the first reply in these bytes, and which msgid does it
 * answer". Two modes: raw (fixed request, fixed reply length, content not
 * checked, replies in request order) and msgpack-rpc (MessagePack-RPC
 * requests [0, msgid, method, params]; replies [1, msgid, error, result]
 * framed by skipping one msgpack object, matched to requests by msgid in
 * whatever order they come back).
 *
 * Invariants:
 *  - per connection, 0 <= inflight <= pipeline; every in-flight request owns
 *    one slot of a table of slot_count = pow2 >= pipeline entries, and its
 *    msgid carries the slot in its low bits, so a reply finds its request in
 *    O(1) and two requests in flight never share a msgid;
 *  - ordered modes use the slots as a FIFO ring (oldest at ring_head);
 *    unordered modes take them from a free stack;
 *  - unsent request bytes (tx_len - tx_off) always belong to in-flight
 *    requests, so the tx buffer never needs more than pipeline * request max;
 *  - the rx buffer holds at least one maximal reply, and a mode reports a
 *    reply longer than reply_bytes_max as an error rather than waiting for
 *    more bytes, so a partial reply never fills the buffer;
 *  - no worker runs past the end of the measured window: every wait is
 *    bounded, connects have a deadline, and a connection that stops answering
 *    is declared dead after --timeout seconds.
 *
 * Files: this one holds the connections, the worker loop, the report and
 * main; lg_opts.c the command line; lg_proto.c the modes; lg_msgpack.c the
 * MessagePack the msgpack-rpc mode frames replies with; lg_hist.c the
 * latency histogram.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include "common/util.h"
#include "lg_hist.h"
#include "lg_msgpack.h"
#include "lg_opts.h"
#include "lg_proto.h"

/* The rx buffer is sized for the replies that can be outstanding, within these
 * bounds: small enough that 10k connections stay cheap, big enough that one
 * read() usually drains a whole pipelined burst. */
#define LG_RX_BYTES_MIN 512
#define LG_RX_BYTES_CAP 65536
/* Upper bound on one epoll_wait, so workers notice the end of the window, a
 * stop signal and stalled connections promptly even when nothing arrives. */
#define LG_TICK_MS 100
#define LG_EVENTS_MAX 256

/* ------------------------------------------------------------------------ */
/* Connections and workers                                                   */
/* ------------------------------------------------------------------------ */

/* One request in flight. */
struct lg_slot {
	uint64_t send_ns;	/* when it was queued: latency starts here */
	uint32_t msgid;		/* what its reply must carry */
	uint32_t busy;		/* 1 while in flight */
};

struct lg_conn {
	int fd;
	unsigned id;		 /* index over all connections, for messages */
	bool dead;		 /* failed and closed; skipped from then on */
	bool want_out;		 /* EPOLLOUT armed: a send was short */
	uint32_t seq;		 /* requests built; the msgid's high bits */
	uint32_t inflight;	 /* requests sent or queued, not yet answered */
	uint32_t ring_head;	 /* ordered modes: slot of the oldest request */
	uint32_t nfree;		 /* unordered modes: slots on the free stack */
	uint32_t *free_slots;	 /* unordered modes: [pipeline] free stack */
	struct lg_slot *slots;	 /* [slot_count] requests, indexed by slot */
	uint64_t last_rx_ns;	 /* last progress, for the stall check */
	uint8_t *tx;		 /* requests not yet accepted by the kernel */
	size_t tx_off, tx_len, tx_cap;
	uint8_t *rx;		 /* received bytes not yet framed into replies */
	size_t rx_len, rx_cap;
};

/* Read-only after start, shared by every worker. */
struct lg_run {
	const struct lg_opts *opts;
	struct lg_proto_cfg cfg;
	char target[300];	/* "host:port", for messages and output */
	/* msgid = seq << slot_bits | slot; slot_count = 1 << slot_bits is
	 * the smallest power of two >= pipeline. */
	unsigned slot_bits;
	uint32_t slot_mask;
	uint64_t measure_start_ns;  /* end of warmup */
	uint64_t measure_end_ns;
	uint64_t timeout_ns;
};

struct lg_worker {
	const struct lg_run *run;
	pthread_t tid;
	int epfd;
	struct lg_conn *conns;	/* owned by this worker only */
	unsigned nconns;
	unsigned live;		/* connections not dead */
	/* Results, read by main after join. */
	uint64_t ops;		/* good replies completed inside the window */
	uint64_t reply_bytes;	/* their bytes, for the mean reply size */
	uint64_t reply_errors;	/* replies carrying an error, whole run */
	uint64_t errors;	/* connections that failed */
	uint64_t stop_ns;	/* when the loop ended (early on failure) */
	int fatal;		/* negative errno from epoll itself */
	struct lg_hist hist;	/* its last line (total, sum) is hot */
	/* Workers sit side by side in one array: keep the next worker's
	 * read-mostly header off the cache line this one writes per op. */
	char pad_[64];
};

/* SIGINT/SIGTERM end the run early; workers poll it at least every tick. */
static atomic_int lg_stop;

static void lg_on_signal(int sig)
{
	atomic_store_explicit(&lg_stop, 1, memory_order_relaxed);
}

static void lg_conn_fail(struct lg_worker *w, struct lg_conn *c,
			 const char *what, int err)
{
	char buf[128];
	/* Workers fail concurrently; strerror's buffer is not theirs to share. */
	if (err)
		fprintf(stderr, "pc-loadgen: conn %u to %s: %s: %s\n", c->id,
			w->run->target, what, strerror_r(err, buf, sizeof(buf)));
	else
		fprintf(stderr, "pc-loadgen: conn %u to %s: %s\n", c->id,
			w->run->target, what);
	close(c->fd);	/* also drops it from the epoll set */
	c->fd = -1;
	c->dead = true;
	w->live--;
	w->errors++;
}

static int lg_conn_set_out(struct lg_worker *w, struct lg_conn *c, bool on)
{
	struct epoll_event ev = {
		.events = EPOLLIN | (on ? EPOLLOUT : 0),
		.data.ptr = c,
	};
	if (epoll_ctl(w->epfd, EPOLL_CTL_MOD, c->fd, &ev) < 0)
		return -errno;
	c->want_out = on;
	return 0;
}

/* Queues one request stamped with now_ns; the caller flushes. */
static int lg_conn_queue_request(struct lg_worker *w, struct lg_conn *c,
				 uint64_t now_ns)
{
	const struct lg_run *run = w->run;
	const struct lg_proto_cfg *cfg = &run->cfg;
	bool ordered = run->opts->proto->ordered;
	PC_DASSERT(c->inflight < run->opts->pipeline);

	if (c->tx_off == c->tx_len) {
		c->tx_off = c->tx_len = 0;
	} else if (c->tx_cap - c->tx_len < cfg->request_bytes_max) {
		memmove(c->tx, c->tx + c->tx_off, c->tx_len - c->tx_off);
		c->tx_len -= c->tx_off;
		c->tx_off = 0;
	}
	/* Peek at the slot; it is taken only once the request is built. */
	uint32_t slot = ordered ? (c->ring_head + c->inflight) & run->slot_mask
				: c->free_slots[c->nfree - 1];
	uint32_t msgid = c->seq << run->slot_bits | slot;
	ssize_t n = run->opts->proto->request_build(
		cfg, msgid, c->tx + c->tx_len, c->tx_cap - c->tx_len);
	if (n < 0)
		return (int)n;
	c->tx_len += (size_t)n;
	c->seq++;
	if (!ordered)
		c->nfree--;
	PC_DASSERT(!c->slots[slot].busy);
	c->slots[slot] = (struct lg_slot){
		.send_ns = now_ns, .msgid = msgid, .busy = 1 };
	c->inflight++;
	return 0;
}

/* The slot of the in-flight request msgid names, or NULL: a reply to a
 * request never sent, already answered, or from a previous slot user. */
static struct lg_slot *lg_conn_slot_find(const struct lg_run *run,
					 struct lg_conn *c, uint32_t msgid)
{
	struct lg_slot *s = &c->slots[msgid & run->slot_mask];
	return s->busy && s->msgid == msgid ? s : NULL;
}

static void lg_conn_slot_release(const struct lg_run *run, struct lg_conn *c,
				 struct lg_slot *s)
{
	uint32_t slot = (uint32_t)(s - c->slots);
	s->busy = 0;
	c->inflight--;
	if (run->opts->proto->ordered) {
		/* The framer answered with the oldest msgid, so this is it. */
		PC_ASSERT(slot == c->ring_head);
		c->ring_head = (c->ring_head + 1) & run->slot_mask;
	} else {
		c->free_slots[c->nfree++] = slot;
	}
}

/* First few error replies of the whole process go to stderr; the rest are
 * only counted, so a server failing every call cannot flood the terminal. */
#define LG_ERRORS_SHOWN_MAX 5
static atomic_uint lg_errors_shown;

static void lg_reply_error_show(const struct lg_worker *w,
				const struct lg_conn *c, uint32_t msgid,
				const uint8_t *err, size_t err_len)
{
	unsigned k = atomic_fetch_add_explicit(&lg_errors_shown, 1,
					       memory_order_relaxed);
	if (k >= LG_ERRORS_SHOWN_MAX)
		return;
	char buf[320];
	struct lg_text t = { .buf = buf, .cap = sizeof(buf) };
	buf[0] = '\0';
	if (lg_mp_render(err, err_len, 0, &t) < 0)
		lg_text_add(&t, "<%zu bytes that do not render>", err_len);
	fprintf(stderr, "pc-loadgen: conn %u to %s: msgid %u answered with error %s%s\n",
		c->id, w->run->target, msgid, buf,
		k + 1 == LG_ERRORS_SHOWN_MAX ? " (further errors only counted)" : "");
}

/* Why a mode rejected reply bytes, in words, into buf. */
static const char *lg_frame_strerror(const struct lg_run *run, int err,
				     char *buf, size_t cap)
{
	switch (err) {
	case EPROTO:
		return run->opts->proto->ordered
			       ? "malformed reply"
			       : "malformed reply: not msgpack (byte 0xc1)";
	case EBADMSG:
		return "reply is not a MessagePack-RPC response [1, msgid, error, result]";
	case EMSGSIZE:
		snprintf(buf, cap,
			 "reply longer than %zu bytes (raise --reply-bytes)",
			 run->cfg.reply_bytes_max);
		return buf;
	default:
		return "malformed reply";
	}
}

/* Hands queued bytes to the kernel; arms EPOLLOUT only while a send is short,
 * so the common case costs no epoll_ctl. Returns 0 or a negative errno. */
static int lg_conn_flush(struct lg_worker *w, struct lg_conn *c)
{
	while (c->tx_off < c->tx_len) {
		ssize_t n = send(c->fd, c->tx + c->tx_off, c->tx_len - c->tx_off,
				 MSG_NOSIGNAL);
		if (n > 0) {
			c->tx_off += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return c->want_out ? 0 : lg_conn_set_out(w, c, true);
		return n < 0 ? -errno : -EIO;
	}
	return c->want_out ? lg_conn_set_out(w, c, false) : 0;
}

/*
 * One read per readiness event: epoll is level-triggered, so whatever the
 * read leaves behind is reported again on the next wait, and we save the
 * EAGAIN read that draining would cost on every round trip.
 */
static void lg_conn_on_readable(struct lg_worker *w, struct lg_conn *c)
{
	const struct lg_run *run = w->run;
	const struct lg_proto *proto = run->opts->proto;
	ssize_t n;

	/* Framing consumes every complete reply and fails a reply that would
	 * outgrow reply_bytes_max <= rx_cap, so what stays leaves room. */
	PC_ASSERT(c->rx_len < c->rx_cap);
	do {
		n = read(c->fd, c->rx + c->rx_len, c->rx_cap - c->rx_len);
	} while (n < 0 && errno == EINTR);
	if (n < 0) {
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			lg_conn_fail(w, c, "read", errno);
		return;
	}
	if (n == 0) {
		lg_conn_fail(w, c, "server closed the connection", 0);
		return;
	}
	/* One clock read per batch: it is both the arrival time of every reply
	 * in this read and the send time of the requests they trigger. */
	uint64_t now_ns = pc_now_ns();
	bool in_window = now_ns >= run->measure_start_ns &&
			 now_ns < run->measure_end_ns;
	c->rx_len += (size_t)n;
	c->last_rx_ns = now_ns;

	size_t off = 0;
	while (off < c->rx_len) {
		if (c->inflight == 0) {
			lg_conn_fail(w, c, "server sent bytes with no request in flight (is --reply-bytes right?)", 0);
			return;
		}
		struct lg_reply rep = { 0 };
		ssize_t len = proto->reply_frame(&run->cfg,
						 c->slots[c->ring_head].msgid,
						 c->rx + off, c->rx_len - off,
						 &rep);
		if (len == 0)
			break;
		if (len < 0) {
			char why[96];
			lg_conn_fail(w, c, lg_frame_strerror(run, (int)-len, why,
							     sizeof(why)), 0);
			return;
		}
		struct lg_slot *s = lg_conn_slot_find(run, c, rep.msgid);
		if (!s) {
			char what[128];
			snprintf(what, sizeof(what),
				 "reply for msgid %u, which no request in flight carries",
				 rep.msgid);
			lg_conn_fail(w, c, what, 0);
			return;
		}
		if (rep.err_len) {
			w->reply_errors++;
			lg_reply_error_show(w, c, rep.msgid,
					    c->rx + off + rep.err_off, rep.err_len);
		} else if (in_window) {
			lg_hist_record(&w->hist, now_ns - s->send_ns);
			w->ops++;
			w->reply_bytes += (uint64_t)len;
		}
		off += (size_t)len;
		lg_conn_slot_release(run, c, s);
		int rc = lg_conn_queue_request(w, c, now_ns);
		if (rc == -ENOSPC) {
			/* The tx buffer holds pipeline requests, so it is only
			 * full when a request still in it got "answered": the
			 * server sent more bytes than the requests we sent. */
			lg_conn_fail(w, c, "reply bytes ran ahead of the requests sent (is --reply-bytes right?)", 0);
			return;
		}
		if (rc < 0) {
			lg_conn_fail(w, c, "building a request", -rc);
			return;
		}
	}
	if (off > 0) {
		c->rx_len -= off;
		memmove(c->rx, c->rx + off, c->rx_len);
	}
	int rc = lg_conn_flush(w, c);
	if (rc < 0)
		lg_conn_fail(w, c, "send", -rc);
}

/* A connection with requests out and nothing back for --timeout is dead:
 * without this an unresponsive server would only show as a low figure. */
static void lg_worker_check_stalls(struct lg_worker *w, uint64_t now_ns)
{
	for (unsigned i = 0; i < w->nconns; i++) {
		struct lg_conn *c = &w->conns[i];
		if (c->dead || c->inflight == 0 ||
		    now_ns - c->last_rx_ns < w->run->timeout_ns)
			continue;
		char what[192];
		snprintf(what, sizeof(what),
			 "no complete reply for %.1f s with %u request(s) in flight and %zu byte(s) of a partial reply; server unresponsive%s",
			 (double)(now_ns - c->last_rx_ns) / 1e9, c->inflight,
			 c->rx_len,
			 c->rx_len ? ", or --reply-bytes too large" : "");
		lg_conn_fail(w, c, what, 0);
	}
}

static void *lg_worker_main(void *arg)
{
	struct lg_worker *w = arg;
	const struct lg_run *run = w->run;
	struct epoll_event events[LG_EVENTS_MAX];
	uint64_t now_ns = pc_now_ns();
	uint64_t next_check_ns = now_ns + LG_TICK_MS * 1000000ull;

	/* Fill every pipeline before the first wait. */
	for (unsigned i = 0; i < w->nconns; i++) {
		struct lg_conn *c = &w->conns[i];
		c->last_rx_ns = now_ns;
		int rc = 0;
		for (unsigned k = 0; k < run->opts->pipeline && rc == 0; k++)
			rc = lg_conn_queue_request(w, c, now_ns);
		if (rc == 0)
			rc = lg_conn_flush(w, c);
		if (rc < 0)
			lg_conn_fail(w, c, "send", -rc);
	}

	while (w->live > 0 &&
	       !atomic_load_explicit(&lg_stop, memory_order_relaxed)) {
		now_ns = pc_now_ns();
		if (now_ns >= run->measure_end_ns)
			break;
		uint64_t left_ms = (run->measure_end_ns - now_ns + 999999) / 1000000;
		int timeout_ms = (int)PC_MIN(left_ms, (uint64_t)LG_TICK_MS);
		int n = epoll_wait(w->epfd, events, LG_EVENTS_MAX, timeout_ms);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			w->fatal = -errno;
			break;
		}
		for (int i = 0; i < n; i++) {
			struct lg_conn *c = events[i].data.ptr;
			if (c->dead)
				continue;
			/* ERR/HUP go through read, which names the error. */
			if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
				lg_conn_on_readable(w, c);
			if (!c->dead && (events[i].events & EPOLLOUT)) {
				int rc = lg_conn_flush(w, c);
				if (rc < 0)
					lg_conn_fail(w, c, "send", -rc);
			}
		}
		now_ns = pc_now_ns();
		if (now_ns >= next_check_ns) {
			lg_worker_check_stalls(w, now_ns);
			next_check_ns = now_ns + LG_TICK_MS * 1000000ull;
		}
	}
	w->stop_ns = pc_now_ns();
	return NULL;
}

/* Non-blocking connect with a deadline, so a black-holed address cannot hold
 * us for the kernel's SYN retry time. Returns the fd or a negative errno. */
static int lg_connect_one(const struct addrinfo *ai, uint64_t timeout_ns)
{
	int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK |
					       SOCK_CLOEXEC,
			ai->ai_protocol);
	if (fd < 0)
		return -errno;
	/* Small requests must leave at once; Nagle would hold pipelined ones. */
	int one = 1;
	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0)
		goto fail;
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		if (errno != EINPROGRESS)
			goto fail;
		struct pollfd pfd = { .fd = fd, .events = POLLOUT };
		int ms = (int)PC_MIN(timeout_ns / 1000000ull, (uint64_t)INT_MAX);
		int rc;
		do {
			rc = poll(&pfd, 1, ms);
		} while (rc < 0 && errno == EINTR);
		if (rc < 0)
			goto fail;
		if (rc == 0) {
			close(fd);
			return -ETIMEDOUT;
		}
		int err = 0;
		socklen_t len = sizeof(err);
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
			goto fail;
		if (err) {
			close(fd);
			return -err;
		}
	}
	return fd;
fail:;
	int err = errno;
	close(fd);
	return -err;
}

/* Many connections outrun the usual soft limit of 1024 descriptors; raise it
 * to the hard limit instead of failing half-way through connecting. */
static void lg_raise_fd_limit(unsigned conns)
{
	struct rlimit rl;
	rlim_t want = (rlim_t)conns + 64;  /* + epoll fds, stdio, slack */
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= want)
		return;
	rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want
						   : PC_MIN(want, rl.rlim_max);
	setrlimit(RLIMIT_NOFILE, &rl);  /* best effort: connect says if short */
}

/* Allocates every connection's buffers and connects it. Start-up only; says
 * what failed on stderr itself, the caller only exits. */
static int lg_workers_setup(struct lg_run *run, struct lg_worker *workers,
			    const struct addrinfo *ai)
{
	const struct lg_opts *o = run->opts;
	size_t rx_cap = PC_MAX((size_t)o->pipeline * run->cfg.reply_bytes_max,
			       (size_t)LG_RX_BYTES_MIN);
	rx_cap = PC_MAX(PC_MIN(rx_cap, (size_t)LG_RX_BYTES_CAP),
			run->cfg.reply_bytes_max);
	size_t tx_cap = (size_t)o->pipeline * run->cfg.request_bytes_max;

	for (unsigned t = 0; t < o->threads; t++) {
		struct lg_worker *w = &workers[t];
		w->run = run;
		w->nconns = o->conns / o->threads + (t < o->conns % o->threads);
		w->conns = pc_xcalloc(w->nconns, sizeof(*w->conns));
		w->epfd = epoll_create1(EPOLL_CLOEXEC);
		if (w->epfd < 0) {
			int err = errno;
			fprintf(stderr, "pc-loadgen: epoll_create1: %s\n",
				strerror(err));
			return -err;
		}
		for (unsigned i = 0; i < w->nconns; i++)
			w->conns[i].fd = -1;
	}
	for (unsigned id = 0; id < o->conns; id++) {
		struct lg_worker *w = &workers[id % o->threads];
		struct lg_conn *c = &w->conns[id / o->threads];
		c->id = id;
		c->slots = pc_xcalloc((size_t)run->slot_mask + 1,
				      sizeof(*c->slots));
		if (!o->proto->ordered) {
			c->free_slots = pc_xcalloc(o->pipeline,
						   sizeof(*c->free_slots));
			/* Reversed, so slot 0 is taken first. */
			for (uint32_t k = 0; k < o->pipeline; k++)
				c->free_slots[k] = o->pipeline - 1 - k;
			c->nfree = o->pipeline;
		}
		c->tx = pc_xcalloc(tx_cap, 1);
		c->tx_cap = tx_cap;
		c->rx = pc_xcalloc(rx_cap, 1);
		c->rx_cap = rx_cap;
		int fd = lg_connect_one(ai, run->timeout_ns);
		if (fd < 0) {
			fprintf(stderr, "pc-loadgen: connect %u of %u to %s: %s\n",
				id + 1, o->conns, run->target, strerror(-fd));
			return fd;
		}
		c->fd = fd;
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };
		if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
			int err = errno;
			fprintf(stderr, "pc-loadgen: epoll_ctl: %s\n",
				strerror(err));
			return -err;
		}
		w->live++;
	}
	return 0;
}

static void lg_workers_free(struct lg_worker *workers, unsigned n)
{
	for (unsigned t = 0; t < n; t++) {
		struct lg_worker *w = &workers[t];
		for (unsigned i = 0; w->conns && i < w->nconns; i++) {
			struct lg_conn *c = &w->conns[i];
			if (c->fd >= 0)
				close(c->fd);
			free(c->slots);
			free(c->free_slots);
			free(c->tx);
			free(c->rx);
		}
		free(w->conns);
		if (w->epfd >= 0)
			close(w->epfd);
	}
	free(workers);
}

/* ------------------------------------------------------------------------ */
/* Report                                                                    */
/* ------------------------------------------------------------------------ */

struct lg_result {
	double duration_s;
	uint64_t ops;
	double ops_per_s;
	double p50_us, p90_us, p99_us, p999_us, max_us, mean_us;
	double reply_bytes_mean;  /* over the good replies in the window */
	uint64_t errors;	  /* connections that failed */
	uint64_t reply_errors;	  /* replies whose error was not nil */
};

/* JSON string body: the target comes from the command line, so escape it. */
static void lg_json_str(FILE *out, const char *s)
{
	fputc('"', out);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			fprintf(out, "\\%c", ch);
		else if (ch < 0x20)
			fprintf(out, "\\u%04x", ch);
		else
			fputc(ch, out);
	}
	fputc('"', out);
}

static void lg_report(const struct lg_run *run, const struct lg_result *r)
{
	const struct lg_opts *o = run->opts;
	if (o->json) {
		printf("{\"target\":");
		lg_json_str(stdout, run->target);
		printf(",\"mode\":\"%s\",", o->proto->name);
		if (o->method) {
			printf("\"method\":");
			lg_json_str(stdout, o->method);
			printf(",");
		}
		/* reply_bytes: the fixed length (raw) or the largest accepted
		 * (msgpack-rpc); reply_bytes_mean: what actually came back. */
		printf("\"conns\":%u,\"threads\":%u,\"pipeline\":%u,"
		       "\"request_bytes\":%zu,\"reply_bytes\":%zu,"
		       "\"warmup_s\":%.3f,\"duration_s\":%.3f,\"ops\":%llu,"
		       "\"ops_per_s\":%.1f,\"p50_us\":%.2f,\"p90_us\":%.2f,"
		       "\"p99_us\":%.2f,\"p999_us\":%.2f,\"max_us\":%.2f,"
		       "\"mean_us\":%.2f,\"errors\":%llu,"
		       "\"reply_errors\":%llu,\"reply_bytes_mean\":%.1f}\n",
		       o->conns, o->threads, o->pipeline,
		       run->cfg.request_bytes_max, run->cfg.reply_bytes_max,
		       o->warmup_s, r->duration_s, (unsigned long long)r->ops,
		       r->ops_per_s, r->p50_us, r->p90_us, r->p99_us,
		       r->p999_us, r->max_us, r->mean_us,
		       (unsigned long long)r->errors,
		       (unsigned long long)r->reply_errors,
		       r->reply_bytes_mean);
	} else {
		printf("%s %s%s%s conns=%u threads=%u pipeline=%u: %llu ops in "
		       "%.2f s = %.0f ops/s; latency us p50=%.1f p90=%.1f "
		       "p99=%.1f p99.9=%.1f max=%.1f mean=%.1f; errors=%llu "
		       "reply_errors=%llu\n",
		       run->target, o->proto->name, o->method ? " " : "",
		       o->method ? o->method : "", o->conns, o->threads,
		       o->pipeline, (unsigned long long)r->ops, r->duration_s,
		       r->ops_per_s, r->p50_us, r->p90_us, r->p99_us,
		       r->p999_us, r->max_us, r->mean_us,
		       (unsigned long long)r->errors,
		       (unsigned long long)r->reply_errors);
	}
	fflush(stdout);
}

int main(int argc, char **argv)
{
	struct lg_opts *o = pc_xcalloc(1, sizeof(*o));
	int rc = lg_opts_parse(argc, argv, o);
	if (rc != 0) {
		free(o);
		return rc > 0 ? 0 : 2;
	}

	struct lg_run run = { .opts = o };
	run.cfg.request = o->request;
	run.cfg.request_bytes = o->request_bytes;
	run.cfg.request_given = o->request_given;
	run.cfg.reply_bytes = o->reply_bytes;
	run.cfg.method = o->method;
	run.cfg.params = o->params_given ? o->params : NULL;
	run.cfg.params_bytes = o->params_bytes;
	const char *why = "invalid options";
	rc = o->proto->setup(&run.cfg, &why);
	if (rc < 0) {
		fprintf(stderr, "pc-loadgen: --mode %s: %s\n", o->proto->name,
			why);
		free(o);
		return 2;
	}
	/* Limits checked at parse time keep both inside their types. */
	PC_ASSERT(run.cfg.reply_bytes_max <= LG_REPLY_BYTES_MAX);
	uint64_t slot_count = pc_roundup_pow2(o->pipeline);
	run.slot_bits = (unsigned)__builtin_ctzll(slot_count);
	run.slot_mask = (uint32_t)(slot_count - 1);
	run.timeout_ns = (uint64_t)(o->timeout_s * 1e9);
	if (strchr(o->host, ':'))
		snprintf(run.target, sizeof(run.target), "[%s]:%s", o->host,
			 o->port);
	else
		snprintf(run.target, sizeof(run.target), "%s:%s", o->host,
			 o->port);

	struct addrinfo hints = { .ai_family = AF_UNSPEC,
				  .ai_socktype = SOCK_STREAM };
	struct addrinfo *ai = NULL;
	int gai = getaddrinfo(o->host, o->port, &hints, &ai);
	if (gai != 0) {
		fprintf(stderr, "pc-loadgen: cannot resolve %s: %s\n",
			run.target, gai_strerror(gai));
		free(run.cfg.tmpl);
		free(o);
		return 1;
	}

	struct sigaction sa = { .sa_handler = lg_on_signal };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	lg_raise_fd_limit(o->conns);
	struct lg_worker *workers = pc_xcalloc(o->threads, sizeof(*workers));
	for (unsigned t = 0; t < o->threads; t++)
		workers[t].epfd = -1;  /* so a partial setup frees cleanly */
	rc = lg_workers_setup(&run, workers, ai);
	freeaddrinfo(ai);
	if (rc < 0) {
		lg_workers_free(workers, o->threads);
		free(run.cfg.tmpl);
		free(o);
		return 1;
	}

	/* Window boundaries are fixed before the first worker starts, so every
	 * thread measures the same interval without talking to the others. */
	uint64_t start_ns = pc_now_ns();
	run.measure_start_ns = start_ns + (uint64_t)(o->warmup_s * 1e9);
	run.measure_end_ns = run.measure_start_ns + (uint64_t)(o->duration_s * 1e9);

	unsigned started = 0;
	for (; started < o->threads; started++) {
		rc = pthread_create(&workers[started].tid, NULL, lg_worker_main,
				    &workers[started]);
		if (rc != 0) {
			fprintf(stderr, "pc-loadgen: pthread_create: %s\n",
				strerror(rc));
			atomic_store(&lg_stop, 1);
			break;
		}
	}

	struct lg_hist *hist = pc_xcalloc(1, sizeof(*hist));
	struct lg_result r = { 0 };
	uint64_t stop_ns = run.measure_start_ns;
	uint64_t reply_bytes = 0;
	int fatal = 0;
	for (unsigned t = 0; t < started; t++) {
		pthread_join(workers[t].tid, NULL);
		lg_hist_merge(hist, &workers[t].hist);
		r.ops += workers[t].ops;
		r.errors += workers[t].errors;
		r.reply_errors += workers[t].reply_errors;
		reply_bytes += workers[t].reply_bytes;
		stop_ns = PC_MAX(stop_ns, workers[t].stop_ns);
		if (workers[t].fatal)
			fatal = workers[t].fatal;
	}
	if (fatal)
		fprintf(stderr, "pc-loadgen: epoll_wait: %s\n", strerror(-fatal));

	/* A run cut short (signal, every connection dead) is rated over the
	 * time it actually measured, not the window it asked for. */
	stop_ns = PC_MIN(stop_ns, run.measure_end_ns);
	r.duration_s = (double)(stop_ns - run.measure_start_ns) / 1e9;
	r.ops_per_s = r.duration_s > 0 ? (double)r.ops / r.duration_s : 0.0;
	r.p50_us = (double)lg_hist_quantile_ns(hist, 0.50) / 1e3;
	r.p90_us = (double)lg_hist_quantile_ns(hist, 0.90) / 1e3;
	r.p99_us = (double)lg_hist_quantile_ns(hist, 0.99) / 1e3;
	r.p999_us = (double)lg_hist_quantile_ns(hist, 0.999) / 1e3;
	r.max_us = (double)hist->max_ns / 1e3;
	r.mean_us = hist->total ? (double)hist->sum_ns / (double)hist->total / 1e3
				: 0.0;
	r.reply_bytes_mean = r.ops ? (double)reply_bytes / (double)r.ops : 0.0;
	lg_report(&run, &r);

	int status = 0;
	if (r.errors || fatal || started < o->threads) {
		fprintf(stderr, "pc-loadgen: %llu of %u connection(s) failed; figures are not trustworthy\n",
			(unsigned long long)r.errors, o->conns);
		status = 1;
	} else if (r.reply_errors) {
		fprintf(stderr, "pc-loadgen: %llu repl%s carried an error (not counted in ops); figures are not trustworthy\n",
			(unsigned long long)r.reply_errors,
			r.reply_errors == 1 ? "y" : "ies");
		status = 1;
	} else if (atomic_load(&lg_stop)) {
		fprintf(stderr, "pc-loadgen: interrupted; figures cover %.2f s\n",
			r.duration_s);
		status = 1;
	} else if (r.ops == 0) {
		fprintf(stderr, "pc-loadgen: no request completed in the measured window\n");
		status = 1;
	}
	free(hist);
	lg_workers_free(workers, o->threads);
	free(run.cfg.tmpl);
	free(o);
	return status;
}
