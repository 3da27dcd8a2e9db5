/*
 * tests/unit/test_rpc.c — MessagePack-RPC server and clients in-process:
 * framing at every split point, pipelining with out-of-order replies,
 * timeouts, connection pools on error, reconnect backoff, authentication,
 * descriptor passing, the per-connection limits, and replies sent from
 * the handler's memory (rpc_reply_ref).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/util.h"
#include "reactor/group.h"
#include "rpc/client.h"
#include "rpc/msg.h"
#include "rpc/rpc.h"
#include "testutil.h"

/* ------------------------------------------------------- test methods */

static void m_echo(struct rpc_call *call, struct mp_rd *p)
{
	/* Reply with the first param, byte for byte. */
	struct mp_rd start = *p;
	if (mp_skip(p) < 0) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "one param expected");
		return;
	}
	msgpack_packer *pk = rpc_reply_begin(call);
	pk->callback(pk->data, (const char *)start.p,
		     (size_t)(p->p - start.p));
	rpc_reply_end(call);
}

struct sleeper {
	struct rx_timer t;
	struct rpc_call *call;
	uint64_t tag;
};

static void sleeper_fire(struct rx_reactor *r, struct rx_timer *t)
{
	struct sleeper *s = t->arg;
	(void)r;
	rpc_reply_uint(s->call, s->tag);
	free(s);
}

static void m_sleep(struct rpc_call *call, struct mp_rd *p)
{
	uint64_t ms, tag;
	if (mp_rd_uint(p, &ms) < 0 || mp_rd_uint(p, &tag) < 0) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "[ms, tag] expected");
		return;
	}
	struct sleeper *s = calloc(1, sizeof(*s));
	s->call = call;
	s->tag = tag;
	rx_timer_init(&s->t, sleeper_fire, s);
	rx_timer_start(rpc_call_reactor(call), &s->t, RX_MS(ms), 0);
}

static void m_close(struct rpc_call *call, struct mp_rd *p)
{
	(void)p;
	rpc_reply_error_close(call, RPC_E_BUSY, "closing as asked");
}

static void m_fd(struct rpc_call *call, struct mp_rd *p)
{
	(void)p;
	int fd = rpc_call_take_fd(call);
	if (fd < 0) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "no descriptor");
		return;
	}
	char buf[64];
	ssize_t n = pread(fd, buf, sizeof(buf), 0);
	close(fd);
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_bin(pk, n > 0 ? (size_t)n : 0);
	msgpack_pack_bin_body(pk, buf, n > 0 ? (size_t)n : 0);
	rpc_reply_end(call);
}

/* test.ref [len, pieces, reserve]: an array of pieces bins of len pattern
 * bytes, each sent from one buffer by reference (rpc_reply_ref), with the
 * reply budget reserved first when reserve is 1. */
static struct {
	unsigned by_ref, copied, released; /* atomics */
} R;

struct ref_buf {
	uint8_t *p;
	unsigned left; /* pieces not released yet */
};

static void ref_release(void *arg)
{
	struct ref_buf *b = arg;
	__atomic_add_fetch(&R.released, 1, __ATOMIC_RELAXED);
	if (--b->left)
		return;
	free(b->p);
	free(b);
}

static void m_ref(struct rpc_call *call, struct mp_rd *p)
{
	uint64_t len, pieces, reserve;
	if (mp_rd_uint(p, &len) < 0 || mp_rd_uint(p, &pieces) < 0 ||
	    mp_rd_uint(p, &reserve) < 0 || !len || !pieces || pieces > 64) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "[len, pieces, reserve]");
		return;
	}
	if (reserve && rpc_call_budget_take(call, len * pieces) < 0) {
		rpc_reply_error(call, RPC_E_BUSY, "no reply budget");
		return;
	}
	struct ref_buf *b = malloc(sizeof(*b));
	cr_assert(b && (b->p = malloc(len)));
	tu_fill_pattern(b->p, len, 7, 0);
	b->left = (unsigned)pieces;
	uint8_t *src = b->p; /* b may be gone after its last piece */
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_array(pk, (uint32_t)pieces);
	for (uint64_t i = 0; i < pieces; i++) {
		msgpack_pack_bin(pk, len);
		bool ref = rpc_reply_ref(call, src, len, ref_release, b);
		__atomic_add_fetch(ref ? &R.by_ref : &R.copied, 1,
				   __ATOMIC_RELAXED);
	}
	rpc_reply_end(call);
}

/* test.keep [bin, ms, seed]: keeps the request (rpc_call_keep_request),
 * then after ms (0: at once, inside the handler) checks that bin still
 * holds the pattern of seed; replies 1 (kept, intact), 0 (not kept: a
 * small request) or an error. */
struct keeper {
	struct rx_timer t;
	struct rpc_call *call;
	const uint8_t *bin;
	uint32_t len;
	uint64_t seed;
};

static void keeper_fire(struct rx_reactor *r, struct rx_timer *t)
{
	struct keeper *k = t->arg;
	(void)r;
	if (tu_check_pattern(k->bin, k->len, k->seed, 0) != -1)
		rpc_reply_error(k->call, RPC_E_INTERNAL, "the kept bytes changed");
	else
		rpc_reply_uint(k->call, 1);
	free(k);
}

static void m_keep(struct rpc_call *call, struct mp_rd *p)
{
	const uint8_t *bin;
	uint32_t len;
	uint64_t ms, seed;
	if (mp_rd_bin(p, &bin, &len) < 0 || mp_rd_uint(p, &ms) < 0 ||
	    mp_rd_uint(p, &seed) < 0) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "[bin, ms, seed]");
		return;
	}
	if (!rpc_call_keep_request(call)) {
		rpc_reply_uint(call, 0);
		return;
	}
	cr_assert_not(rpc_call_keep_request(call), "kept twice");
	struct keeper *k = calloc(1, sizeof(*k));
	*k = (struct keeper){.call = call, .bin = bin, .len = len,
			     .seed = seed};
	rx_timer_init(&k->t, keeper_fire, k);
	if (ms == 0)
		keeper_fire(rpc_call_reactor(call), &k->t); /* ends the call */
	else
		rx_timer_start(rpc_call_reactor(call), &k->t, RX_MS(ms), 0);
}

/* test.keep_params [bin, ms, seed]: keeps its params
 * (rpc_call_keep_params), reads them from there, and after ms checks that
 * bin still holds the pattern of seed; replies 1 (the request kept) or 2
 * (copied; bin read from the copy), or an error. */
struct pkeeper {
	struct rx_timer t;
	struct rpc_call *call;
	void *copy;
	const uint8_t *bin;
	uint32_t len;
	uint64_t seed;
};

static void pkeeper_fire(struct rx_reactor *r, struct rx_timer *t)
{
	struct pkeeper *k = t->arg;
	(void)r;
	if (tu_check_pattern(k->bin, k->len, k->seed, 0) != -1)
		rpc_reply_error(k->call, RPC_E_INTERNAL, "the params changed");
	else
		rpc_reply_uint(k->call, k->copy ? 2 : 1);
	free(k->copy);
	free(k);
}

static void m_keep_params(struct rpc_call *call, struct mp_rd *p)
{
	struct pkeeper *k = calloc(1, sizeof(*k));
	uint64_t ms;
	size_t len = (size_t)(p->end - p->p);
	cr_assert_eq(rpc_call_keep_params(call, p, &k->copy), 0);
	if (mp_rd_bin(p, &k->bin, &k->len) < 0 || mp_rd_uint(p, &ms) < 0 ||
	    mp_rd_uint(p, &k->seed) < 0) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "[bin, ms, seed]");
		free(k->copy);
		free(k);
		return;
	}
	const uint8_t *c = k->copy;
	if (c) /* what p reads now is the copy */
		cr_assert(k->bin > c && k->bin + k->len <= c + len,
			  "the params were not read from the copy");
	k->call = call;
	rx_timer_init(&k->t, pkeeper_fire, k);
	rx_timer_start(rpc_call_reactor(call), &k->t, RX_MS(ms), 0);
}

static const struct rpc_method test_methods[] = {
	{"test.keep", m_keep, 0, "keep the request, check it later"},
	{"test.keep_params", m_keep_params, 0, "keep the params, check later"},
	{"test.ref", m_ref, 0, "pattern bins sent by reference"},
	{"test.echo", m_echo, 0, "echo the first param"},
	{"test.sleep", m_sleep, 0, "reply tag after ms"},
	{"test.close", m_close, 0, "error reply, then close"},
	{"test.fd", m_fd, RPC_LOCAL_ONLY, "read a passed descriptor"},
	{NULL, NULL, 0, NULL},
};

/* ------------------------------------------------------------ the server */

static struct {
	struct rpc_server *srv;
	struct rx_group *g;
	uint16_t port;
	char path[108];
	struct rx_listener *unix_l;
	const struct rpc_guard *guard; /* server_up sets it when given */
} S;

static void s_tcp(struct rx_listener *l, int fd, void *arg)
{
	(void)arg;
	rpc_server_accept(S.srv, rx_listener_reactor(l), fd, false);
}

static void s_unix(struct rx_listener *l, int fd, void *arg)
{
	(void)arg;
	rpc_server_accept(S.srv, rx_listener_reactor(l), fd, true);
}

static int s_start(struct rx_reactor *r, void *arg)
{
	(void)arg;
	int err;
	struct rx_listener *l = rx_listen_tcp(r, "127.0.0.1", S.port, true, 128,
					      s_tcp, NULL, &err);
	if (!l)
		return err;
	S.port = rx_listener_port(l);
	if (rx_reactor_id(r) == 0 &&
	    !rx_listen_unix(r, S.path, 0666, 128, s_unix, NULL, &err))
		return err;
	return 0;
}

static void server_up(unsigned threads, const char *secret,
		      const struct rpc_limits *lim_in)
{
	struct rpc_limits lim = {
		.max_message_bytes = 1 << 20,
		.max_elements = 4096,
		.max_depth = 16,
		.max_inflight = 64,
		.max_connections = 64,
		.max_fds = 4,
	};
	if (lim_in)
		lim = *lim_in;
	const struct rpc_method *tables[] = {test_methods};
	cr_assert_eq(rpc_server_new(&S.srv, &lim, tables, 1, secret, -1,
				    threads), 0);
	if (S.guard)
		cr_assert_eq(rpc_server_set_guard(S.srv, S.guard), 0);
	snprintf(S.path, sizeof(S.path), "/tmp/pc-rpc-test-%d.sock",
		 (int)getpid());
	S.port = 0;
	struct rx_params p;
	rx_params_default(&p);
	struct rx_group_hooks h = {.thread_start = s_start};
	cr_assert_eq(rx_group_start(&S.g, threads, &p, &h), 0);
}

/* Stop the server. Calls still sleeping (test.sleep) must have ended:
 * their timers would not run on a stopped reactor. */
static struct rpc_stats server_down_after(unsigned settle_ms)
{
	usleep(settle_ms * 1000);
	struct rpc_stats st;
	rpc_server_stats(S.srv, &st);
	rx_group_stop(S.g);
	rx_group_join(S.g);
	rpc_server_free(S.srv);
	return st;
}

static struct rpc_stats server_down(void)
{
	return server_down_after(0);
}

/* ------------------------------------------------- raw client helpers */

static size_t pack_req(uint8_t *out, size_t cap, uint32_t msgid,
		       const char *method, uint64_t a, uint64_t b, int nparams)
{
	struct pc_wbuf w;
	msgpack_packer pk;
	pc_wbuf_init(&w, 0);
	pc_wbuf_packer(&w, &pk);
	rpc_pack_request(&pk, msgid, method, (uint32_t)nparams);
	if (nparams > 0)
		msgpack_pack_uint64(&pk, a);
	if (nparams > 1)
		msgpack_pack_uint64(&pk, b);
	cr_assert_leq(w.len, cap);
	memcpy(out, w.data, w.len);
	size_t len = w.len;
	pc_wbuf_free(&w);
	return len;
}

/* Read one response; returns its msgid and the result as uint (or -1 for
 * an error, code copied to code). */
static uint32_t read_resp(int fd, int64_t *val, char *code)
{
	static uint8_t buf[1 << 16];
	static size_t have;
	static const struct mp_limits lim = {1 << 20, 4096, 16, 1 << 20};
	for (;;) {
		size_t size;
		if (have && mp_scan(buf, have, &lim, &size) == MP_COMPLETE) {
			struct rpc_msg m;
			const char *why;
			cr_assert_eq(rpc_msg_parse(buf, size, &m, &why), 0);
			struct rpc_result res;
			rpc_result_from_response(&m, &res);
			uint64_t u = 0;
			if (res.err == 0) {
				struct mp_rd r = res.result;
				mp_rd_uint(&r, &u);
				*val = (int64_t)u;
			} else {
				*val = -1;
				if (code)
					strcpy(code, res.code);
			}
			uint32_t id = m.msgid;
			memmove(buf, buf + size, have - size);
			have -= size;
			return id;
		}
		ssize_t n = recv(fd, buf + have, sizeof(buf) - have, 0);
		cr_assert_gt(n, 0, "recv: %zd (%s)", n, strerror(errno));
		have += (size_t)n;
	}
}

/* ------------------------------------------------------------------ tests */

Test(rpc, framing_at_every_split_point)
{
	server_up(1, NULL, NULL);
	int fd = tu_connect(S.port);
	uint8_t req[128];
	size_t len = pack_req(req, sizeof(req), 77, "test.echo", 123456789, 0, 1);
	for (size_t cut = 1; cut < len; cut++) {
		cr_assert_eq(send(fd, req, cut, 0), (ssize_t)cut);
		usleep(2000); /* the first part arrives on its own */
		cr_assert_eq(send(fd, req + cut, len - cut, 0),
			     (ssize_t)(len - cut));
		int64_t v;
		cr_assert_eq(read_resp(fd, &v, NULL), 77);
		cr_assert_eq(v, 123456789, "cut %zu", cut);
	}
	/* Many messages in one write. */
	uint8_t many[128 * 50];
	size_t off = 0;
	for (uint32_t i = 0; i < 50; i++)
		off += pack_req(many + off, sizeof(many) - off, i, "test.echo",
				i * 3, 0, 1);
	cr_assert_eq(send(fd, many, off, 0), (ssize_t)off);
	for (uint32_t i = 0; i < 50; i++) {
		int64_t v;
		cr_assert_eq(read_resp(fd, &v, NULL), i);
		cr_assert_eq(v, i * 3);
	}
	close(fd);
	struct rpc_stats st = server_down();
	cr_assert_eq(st.rejected, 0);
}

Test(rpc, pipelined_requests_get_out_of_order_replies)
{
	server_up(1, NULL, NULL);
	int fd = tu_connect(S.port);
	/* Ten calls at once; call i sleeps (10 - i) * 20 ms. */
	uint8_t buf[128];
	for (uint32_t i = 0; i < 10; i++) {
		size_t len = pack_req(buf, sizeof(buf), 100 + i, "test.sleep",
				      (10 - i) * 20, 1000 + i, 2);
		send(fd, buf, len, 0);
	}
	for (uint32_t k = 0; k < 10; k++) {
		int64_t v;
		uint32_t id = read_resp(fd, &v, NULL);
		cr_assert_eq(id, 109 - k, "reply %u was msgid %u", k, id);
		cr_assert_eq(v, 1000 + (109 - k) - 100);
	}
	close(fd);
	server_down();
}

static void pack_keep(msgpack_packer *pk, uint32_t msgid, uint32_t len,
		      uint64_t ms, uint64_t seed)
{
	rpc_pack_request(pk, msgid, "test.keep", 3);
	msgpack_pack_bin(pk, len);
	uint8_t *b = malloc(len);
	tu_fill_pattern(b, len, seed, 0);
	msgpack_pack_bin_body(pk, b, len);
	free(b);
	msgpack_pack_uint64(pk, ms);
	msgpack_pack_uint64(pk, seed);
}

/* A test.keep request, then (sleep_id) a test.sleep [0, sleep_id * 11]
 * behind it, then (then_id) a small test.keep [512 bytes, 1 ms, then_id *
 * 11], all in the same send, so that the bytes behind the first almost
 * always arrive with its last ones (only a receive ending exactly where it
 * ends would part them). Sent apart, they often came after the connection
 * had paused for the kept request, in a receive of their own. */
static void send_keep_then(int fd, uint32_t msgid, uint32_t len, uint64_t ms,
			   uint64_t seed, uint32_t sleep_id, uint32_t then_id)
{
	struct pc_wbuf w;
	msgpack_packer pk;
	pc_wbuf_init(&w, 0);
	pc_wbuf_packer(&w, &pk);
	pack_keep(&pk, msgid, len, ms, seed);
	if (sleep_id) {
		rpc_pack_request(&pk, sleep_id, "test.sleep", 2);
		msgpack_pack_uint64(&pk, 0);
		msgpack_pack_uint64(&pk, sleep_id * 11);
	}
	if (then_id)
		pack_keep(&pk, then_id, 512, 1, then_id * 11);
	for (size_t off = 0; off < w.len;) {
		ssize_t k = send(fd, w.data + off, w.len - off, 0);
		cr_assert_gt(k, 0);
		off += (size_t)k;
	}
	pc_wbuf_free(&w);
}

static void send_keep(int fd, uint32_t msgid, uint32_t len, uint64_t ms,
		      uint64_t seed)
{
	send_keep_then(fd, msgid, len, ms, seed, 0, 0);
}

/* test.keep_params of len bytes (held ms), then a test.sleep [0, 77] in the
 * same send. */
static void send_keep_params(int fd, uint32_t msgid, uint32_t len,
			     uint64_t ms, uint64_t seed)
{
	struct pc_wbuf w;
	msgpack_packer pk;
	pc_wbuf_init(&w, 0);
	pc_wbuf_packer(&w, &pk);
	rpc_pack_request(&pk, msgid, "test.keep_params", 3);
	msgpack_pack_bin(&pk, len);
	uint8_t *b = malloc(len);
	tu_fill_pattern(b, len, seed, 0);
	msgpack_pack_bin_body(&pk, b, len);
	free(b);
	msgpack_pack_uint64(&pk, ms);
	msgpack_pack_uint64(&pk, seed);
	rpc_pack_request(&pk, 7, "test.sleep", 2);
	msgpack_pack_uint64(&pk, 0);
	msgpack_pack_uint64(&pk, 77);
	for (size_t off = 0; off < w.len;) {
		ssize_t k = send(fd, w.data + off, w.len - off, 0);
		cr_assert_gt(k, 0);
		off += (size_t)k;
	}
	pc_wbuf_free(&w);
}

Test(rpc, kept_params_are_the_request_or_a_copy_and_hold_the_input)
{
	server_up(1, NULL, NULL);
	int fd = tu_connect(S.port);
	int64_t v;
	char code[64] = "";
	/* A small request arrives in one receive: copied; the call behind
	 * it waits for its reply although it could answer first. */
	send_keep_params(fd, 1, 512, 50, 11);
	cr_assert_eq(read_resp(fd, &v, code), 1, "a call behind copied "
		     "params ran while they were held");
	cr_assert_eq(v, 2, "copied: %lld (%s)", (long long)v, code);
	cr_assert_eq(read_resp(fd, &v, NULL), 7);
	cr_assert_eq(v, 77);
	/* A large one arrives in pieces: the request itself is kept. */
	send_keep_params(fd, 2, 900u << 10, 50, 22);
	cr_assert_eq(read_resp(fd, &v, code), 2);
	cr_assert_eq(v, 1, "kept: %lld (%s)", (long long)v, code);
	cr_assert_eq(read_resp(fd, &v, NULL), 7);
	cr_assert_eq(v, 77);
	close(fd);
	server_down();
}

Test(rpc, a_kept_request_stays_intact_and_holds_the_calls_after_it)
{
	server_up(1, NULL, NULL);
	int fd = tu_connect(S.port);
	/* A large request kept for 100 ms, then at once a call that would
	 * answer first if it were taken meanwhile, then a small keep. */
	send_keep_then(fd, 1, 900u << 10, 100, 11, 2, 3);
	int64_t v;
	char code[64] = "";
	cr_assert_eq(read_resp(fd, &v, code), 1, "a call after the kept "
		     "request ran while it was kept");
	cr_assert_eq(v, 1, "kept: %lld (%s)", (long long)v, code);
	cr_assert_eq(read_resp(fd, &v, NULL), 2);
	cr_assert_eq(v, 22);
	/* It waited in the input kept behind the first: that can be kept. */
	cr_assert_eq(read_resp(fd, &v, NULL), 3);
	cr_assert_eq(v, 1);
	/* Alone, a small request arrives whole in one receive: not kept. */
	send_keep(fd, 4, 512, 0, 44);
	cr_assert_eq(read_resp(fd, &v, NULL), 4);
	cr_assert_eq(v, 0, "a small request kept");
	/* Kept, then answered at once inside its handler, with a call behind
	 * it in the same buffer: the connection keeps reading that buffer. */
	send_keep_then(fd, 5, 300u << 10, 0, 55, 6, 0);
	cr_assert_eq(read_resp(fd, &v, code), 5);
	cr_assert_eq(v, 1, "kept: %lld (%s)", (long long)v, code);
	cr_assert_eq(read_resp(fd, &v, NULL), 6);
	cr_assert_eq(v, 66);
	/* Twice more on the same connection: the input goes on. */
	for (uint32_t i = 0; i < 2; i++) {
		send_keep(fd, 10 + i, (700u << 10) + i, 10, 40 + i);
		cr_assert_eq(read_resp(fd, &v, code), 10 + i);
		cr_assert_eq(v, 1, "kept: %lld (%s)", (long long)v, code);
	}
	close(fd);
	server_down();
}

Test(rpc, errors_keep_the_connection_and_bad_input_closes_it)
{
	server_up(1, NULL, NULL);
	int fd = tu_connect(S.port);
	uint8_t buf[128];
	char code[32] = "";
	int64_t v;
	size_t len = pack_req(buf, sizeof(buf), 1, "no.such", 0, 0, 0);
	send(fd, buf, len, 0);
	cr_assert_eq(read_resp(fd, &v, code), 1);
	cr_assert_str_eq(code, RPC_E_UNKNOWN_METHOD);
	len = pack_req(buf, sizeof(buf), 2, "test.sleep", 1, 0, 1);
	send(fd, buf, len, 0);
	cr_assert_eq(read_resp(fd, &v, code), 2);
	cr_assert_str_eq(code, RPC_E_BAD_PARAMS);
	len = pack_req(buf, sizeof(buf), 3, "test.fd", 0, 0, 0);
	send(fd, buf, len, 0);
	cr_assert_eq(read_resp(fd, &v, code), 3);
	cr_assert_str_eq(code, RPC_E_FORBIDDEN, "test.fd is local only");
	/* Still serving. */
	len = pack_req(buf, sizeof(buf), 4, "test.echo", 9, 0, 1);
	send(fd, buf, len, 0);
	cr_assert_eq(read_resp(fd, &v, NULL), 4);
	cr_assert_eq(v, 9);
	/* Bytes that are not MessagePack: the connection closes. */
	send(fd, "\xc1\xc1\xc1", 3, 0);
	char b;
	cr_assert_leq(recv(fd, &b, 1, 0), 0);
	close(fd);
	struct rpc_stats st = server_down();
	cr_assert_eq(st.rejected, 1);
	cr_assert_geq(st.errors, 3);
}

Test(rpc, inflight_cap_pauses_reading_without_losing_calls)
{
	struct rpc_limits lim = {1 << 20, 4096, 16, 4, 64, 4};
	server_up(1, NULL, &lim);
	int fd = tu_connect(S.port);
	uint8_t buf[128];
	for (uint32_t i = 0; i < 40; i++) {
		size_t len = pack_req(buf, sizeof(buf), i, "test.sleep", 5, i, 2);
		send(fd, buf, len, 0);
	}
	bool seen[40] = {false};
	for (int k = 0; k < 40; k++) {
		int64_t v;
		uint32_t id = read_resp(fd, &v, NULL);
		cr_assert_lt(id, 40);
		cr_assert(!seen[id]);
		seen[id] = true;
		cr_assert_eq(v, id);
	}
	close(fd);
	server_down();
}

/* ------------------------------------------------------- blocking client */

static void packed(struct pc_wbuf *w, uint64_t a, uint64_t b, int n)
{
	msgpack_packer pk;
	pc_wbuf_init(w, 0);
	pc_wbuf_packer(w, &pk);
	msgpack_pack_array(&pk, (size_t)n);
	if (n > 0)
		msgpack_pack_uint64(&pk, a);
	if (n > 1)
		msgpack_pack_uint64(&pk, b);
}

static int64_t sync_uint(struct rpc_sync *c, const char *m, uint64_t a,
			 uint64_t b, int n, unsigned timeout_ms, int *err)
{
	struct pc_wbuf w;
	struct rpc_sync_reply rep;
	packed(&w, a, b, n);
	*err = rpc_sync_call(c, m, w.data, w.len, NULL, 0, timeout_ms, &rep);
	pc_wbuf_free(&w);
	uint64_t u = 0;
	if (*err == 0 && rep.res.err == 0)
		mp_rd_uint(&rep.res.result, &u);
	else if (*err == 0)
		*err = rep.res.err;
	rpc_sync_reply_free(&rep);
	return (int64_t)u;
}

Test(rpc, blocking_pool_reuses_good_connections_and_drops_bad_ones)
{
	server_up(2, NULL, NULL);
	char ep[160];
	snprintf(ep, sizeof(ep), "127.0.0.1:%u", S.port);
	struct rpc_sync_opts o;
	rpc_sync_opts_default(&o);
	int err;
	struct rpc_sync *c = rpc_sync_new(ep, &o, &err);
	cr_assert(c);
	for (int i = 0; i < 20; i++) {
		cr_assert_eq(sync_uint(c, "test.echo", (uint64_t)i, 0, 1, 0, &err),
			     i);
		cr_assert_eq(err, 0);
	}
	struct rpc_stats st;
	rpc_server_stats(S.srv, &st);
	cr_assert_eq(st.conns_accepted, 1, "one pooled connection");
	/* The server closes this one: the next call must not reuse it. */
	sync_uint(c, "test.close", 0, 0, 0, 0, &err);
	cr_assert_eq(err, -EREMOTEIO);
	usleep(50000);
	cr_assert_eq(sync_uint(c, "test.echo", 5, 0, 1, 0, &err), 5);
	cr_assert_eq(err, 0);
	/* A timeout closes the connection rather than pooling it. */
	sync_uint(c, "test.sleep", 300, 1, 2, 50, &err);
	cr_assert_eq(err, -ETIMEDOUT);
	cr_assert_eq(sync_uint(c, "test.echo", 6, 0, 1, 0, &err), 6);
	cr_assert_eq(err, 0);
	rpc_server_stats(S.srv, &st);
	cr_assert_eq(st.conns_accepted, 3);
	rpc_sync_free(c);
	server_down_after(400);
}

Test(rpc, descriptors_pass_over_the_unix_socket)
{
	server_up(1, NULL, NULL);
	char ep[140];
	snprintf(ep, sizeof(ep), "unix:%s", S.path);
	struct rpc_sync_opts o;
	rpc_sync_opts_default(&o);
	int err;
	struct rpc_sync *c = rpc_sync_new(ep, &o, &err);
	cr_assert(c);
	int mfd = memfd_create("pc-test", MFD_CLOEXEC);
	cr_assert_eq(write(mfd, "shared bytes", 12), 12);
	struct rpc_sync_reply rep;
	static const uint8_t none[] = {0x90};
	cr_assert_eq(rpc_sync_call(c, "test.fd", none, 1, &mfd, 1, 0, &rep), 0);
	cr_assert_eq(rep.res.err, 0, "%s", rep.res.message);
	const uint8_t *b;
	uint32_t bl;
	cr_assert_eq(mp_rd_bin(&rep.res.result, &b, &bl), 0);
	cr_assert_eq(bl, 12);
	cr_assert_eq(memcmp(b, "shared bytes", 12), 0);
	rpc_sync_reply_free(&rep);
	close(mfd);
	rpc_sync_free(c);
	server_down();
}

Test(rpc, authentication_with_a_cluster_secret)
{
	server_up(1, "s3cret", NULL);
	char ep[160];
	snprintf(ep, sizeof(ep), "127.0.0.1:%u", S.port);
	struct rpc_sync_opts o;
	rpc_sync_opts_default(&o);
	int err;
	/* Right secret. */
	o.secret = "s3cret";
	struct rpc_sync *good = rpc_sync_new(ep, &o, &err);
	cr_assert_eq(sync_uint(good, "test.echo", 42, 0, 1, 0, &err), 42);
	cr_assert_eq(err, 0);
	rpc_sync_free(good);
	/* Wrong secret. */
	o.secret = "guess";
	struct rpc_sync *bad = rpc_sync_new(ep, &o, &err);
	sync_uint(bad, "test.echo", 1, 0, 1, 0, &err);
	cr_assert_eq(err, -EACCES);
	rpc_sync_free(bad);
	/* No secret: refused with a clear error. */
	o.secret = NULL;
	struct rpc_sync *none = rpc_sync_new(ep, &o, &err);
	struct pc_wbuf w;
	struct rpc_sync_reply rep;
	packed(&w, 1, 0, 1);
	cr_assert_eq(rpc_sync_call(none, "test.echo", w.data, w.len, NULL, 0,
				   0, &rep), 0);
	cr_assert_eq(rep.res.err, -EREMOTEIO);
	cr_assert_str_eq(rep.res.code, RPC_E_UNAUTHORIZED);
	rpc_sync_reply_free(&rep);
	pc_wbuf_free(&w);
	rpc_sync_free(none);
	/* The Unix socket needs no secret (peer credentials instead). */
	snprintf(ep, sizeof(ep), "unix:%s", S.path);
	struct rpc_sync *local = rpc_sync_new(ep, &o, &err);
	cr_assert_eq(sync_uint(local, "test.echo", 7, 0, 1, 0, &err), 7);
	cr_assert_eq(err, 0);
	rpc_sync_free(local);
	struct rpc_stats st = server_down();
	cr_assert_geq(st.auth_failures, 2);
}

/* ---------------------------------------------------- asynchronous client */

static struct {
	int done;
	int want;
	int errs[64];
	uint64_t vals[64];
	struct rx_reactor *r;
} A;

static void a_done(void *arg, const struct rpc_result *res)
{
	uintptr_t i = (uintptr_t)arg;
	A.errs[i] = res->err;
	if (res->err == 0) {
		struct mp_rd r = res->result;
		mp_rd_uint(&r, &A.vals[i]);
	}
	if (++A.done == A.want)
		rx_reactor_stop(A.r);
}

static void a_call_to(struct rpc_client *cl, const char *ep, uintptr_t i,
		      const char *m, uint64_t a, uint64_t b, unsigned timeout,
		      rpc_done_fn done)
{
	struct rpc_req *q = rpc_req_new(cl, ep, m, 2, timeout, done,
					(void *)i);
	cr_assert(q);
	msgpack_pack_uint64(rpc_req_packer(q), a);
	msgpack_pack_uint64(rpc_req_packer(q), b);
	rpc_req_send(q);
}

static void a_call(struct rpc_client *cl, const char *ep, uintptr_t i,
		   const char *m, uint64_t a, uint64_t b, unsigned timeout)
{
	a_call_to(cl, ep, i, m, a, b, timeout, a_done);
}

static void a_reset(int want)
{
	memset(&A, 0, sizeof(A));
	A.want = want;
}

Test(rpc, async_client_many_calls_in_flight_and_timeouts)
{
	server_up(1, NULL, NULL);
	struct rx_reactor *r = tu_reactor(NULL);
	struct rpc_client_opts o;
	rpc_client_opts_default(&o);
	o.conns_per_endpoint = 1;
	struct rpc_client *cl = rpc_client_new(r, &o);
	char ep[160];
	snprintf(ep, sizeof(ep), "127.0.0.1:%u", S.port);
	a_reset(21);
	A.r = r;
	for (uintptr_t i = 0; i < 20; i++)
		a_call(cl, ep, i, "test.sleep", 50 - i * 2, 500 + i, 2000);
	a_call(cl, ep, 20, "test.sleep", 1000, 0, 100); /* times out */
	tu_run(r, 10000);
	for (int i = 0; i < 20; i++) {
		cr_assert_eq(A.errs[i], 0, "call %d: %d", i, A.errs[i]);
		cr_assert_eq(A.vals[i], 500u + (unsigned)i);
	}
	cr_assert_eq(A.errs[20], -ETIMEDOUT);
	struct rpc_client_stats cs;
	rpc_client_stats(cl, &cs);
	cr_assert_eq(cs.timeouts, 1);
	struct rpc_stats st;
	rpc_server_stats(S.srv, &st);
	cr_assert_eq(st.conns_accepted, 1, "all calls on one connection");
	rpc_client_free(cl);
	rx_reactor_destroy(r);
	server_down_after(1100);
}

static struct {
	struct rpc_client *cl;
	char ep[64];
	uint64_t failures_after_second;
	struct rx_timer later;
} B;

static void b_third(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	(void)t;
	a_call(B.cl, B.ep, 2, "test.echo", 1, 0, 1000);
}

static void b_first_done(void *arg, const struct rpc_result *res)
{
	a_done(arg, res);
	/* Within the backoff: must fail without a new connect. */
	a_call(B.cl, B.ep, 1, "test.echo", 1, 0, 1000);
	/* After the backoff: a new attempt. */
	rx_timer_start(A.r, &B.later, RX_MS(400), 0);
}

Test(rpc, async_client_backs_off_after_a_refused_connect)
{
	struct rx_reactor *r = tu_reactor(NULL);
	struct rpc_client_opts o;
	rpc_client_opts_default(&o);
	o.backoff_min_ms = 200;
	B.cl = rpc_client_new(r, &o);
	snprintf(B.ep, sizeof(B.ep), "127.0.0.1:%u", tu_dead_port());
	rx_timer_init(&B.later, b_third, NULL);
	a_reset(3);
	A.r = r;
	a_call_to(B.cl, B.ep, 0, "test.echo", 1, 0, 1000, b_first_done);
	tu_run(r, 5000);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(A.errs[i], -ECONNREFUSED, "call %d: %d", i,
			     A.errs[i]);
	struct rpc_client_stats cs;
	rpc_client_stats(B.cl, &cs);
	cr_assert_eq(cs.conn_failures, 2, "the second call did not connect");
	rpc_client_free(B.cl);
	rx_reactor_destroy(r);
}

/* A call that fails at once (within the backoff) still fails later, never
 * inside rpc_req_send, even with every timer slot taken: the deferral is a
 * zero-delay timer, which takes no slot. */
static bool g_in_send;
static int g_inside;
static struct rx_timer g_filler;

static void n_second_done(void *arg, const struct rpc_result *res)
{
	a_done(arg, res);
	g_inside += g_in_send;
	rx_timer_stop(A.r, &g_filler);
}

static void n_first_done(void *arg, const struct rpc_result *res)
{
	a_done(arg, res);
	/* Take the slot if it is free (the first call's timeout held it). */
	rx_timer_init(&g_filler, NULL, NULL);
	rx_timer_start(A.r, &g_filler, RX_MS(60000), 0);
	struct rx_timer more;
	rx_timer_init(&more, NULL, NULL);
	cr_assert_eq(rx_timer_start(A.r, &more, RX_MS(60000), 0), -ENOSPC);
	g_in_send = true;
	a_call_to(B.cl, B.ep, 1, "test.echo", 1, 0, 1000, n_second_done);
	g_in_send = false;
}

Test(rpc, a_call_failing_at_once_fails_later_even_with_no_timer_slot)
{
	struct rx_params p;
	rx_params_default(&p);
	p.timers_max = 1;
	struct rx_reactor *r = tu_reactor(&p);
	struct rpc_client_opts o;
	rpc_client_opts_default(&o);
	o.backoff_min_ms = 5000;
	B.cl = rpc_client_new(r, &o);
	snprintf(B.ep, sizeof(B.ep), "127.0.0.1:%u", tu_dead_port());
	a_reset(2);
	A.r = r;
	g_inside = 0;
	a_call_to(B.cl, B.ep, 0, "test.echo", 1, 0, 1000, n_first_done);
	tu_run(r, 5000);
	cr_assert_eq(A.done, 2);
	cr_assert_eq(A.errs[0], -ECONNREFUSED);
	cr_assert_eq(A.errs[1], -ECONNREFUSED, "%d", A.errs[1]);
	cr_assert_eq(g_inside, 0, "the second call failed inside "
		     "rpc_req_send");
	rpc_client_free(B.cl);
	rx_reactor_destroy(r);
}

Test(rpc, async_client_authenticates)
{
	server_up(1, "topsecret", NULL);
	struct rx_reactor *r = tu_reactor(NULL);
	struct rpc_client_opts o;
	rpc_client_opts_default(&o);
	o.secret = "topsecret";
	struct rpc_client *cl = rpc_client_new(r, &o);
	char ep[160];
	snprintf(ep, sizeof(ep), "127.0.0.1:%u", S.port);
	a_reset(3);
	A.r = r;
	for (uintptr_t i = 0; i < 3; i++)
		a_call(cl, ep, i, "test.sleep", 1, 40 + i, 2000);
	tu_run(r, 5000);
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(A.errs[i], 0);
		cr_assert_eq(A.vals[i], 40u + (unsigned)i);
	}
	rpc_client_free(cl);
	rx_reactor_destroy(r);
	/* With a wrong secret the calls fail with EACCES. */
	r = tu_reactor(NULL);
	o.secret = "wrong";
	cl = rpc_client_new(r, &o);
	a_reset(1);
	A.r = r;
	a_call(cl, ep, 0, "test.sleep", 1, 1, 2000);
	tu_run(r, 5000);
	cr_assert_eq(A.errs[0], -EACCES);
	rpc_client_free(cl);
	rx_reactor_destroy(r);
	server_down();
}

/* A peer known not to answer (issue 10, frozen peers): every call to it,
 * in flight or waiting for a connection, ends at once with the given error
 * instead of at its own timeout. */
static struct {
	struct rpc_client *cl;
	char ep[64];
	struct rx_timer fail;
} F;

static void f_fail(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	(void)t;
	rpc_client_fail_endpoint(F.cl, "127.0.0.1:1", -EHOSTDOWN); /* unknown */
	rpc_client_fail_endpoint(F.cl, F.ep, -EHOSTDOWN);
}

/* After the three failed calls, one more to the same endpoint, in the same
 * run (a stopped reactor does not run again): the client still works. */
static void f_failed(void *arg, const struct rpc_result *res)
{
	a_done(arg, res);
	if (A.done == 3)
		a_call(F.cl, F.ep, 3, "test.echo", 7, 0, 2000);
}

Test(rpc, async_client_fails_one_endpoint_at_once)
{
	server_up(1, NULL, NULL);
	struct rx_reactor *r = tu_reactor(NULL);
	struct rpc_client_opts o;
	rpc_client_opts_default(&o);
	o.conns_per_endpoint = 1;
	o.inflight_per_conn = 2; /* the third call waits for a slot */
	F.cl = rpc_client_new(r, &o);
	snprintf(F.ep, sizeof(F.ep), "127.0.0.1:%u", S.port);
	rx_timer_init(&F.fail, f_fail, NULL);
	a_reset(4);
	A.r = r;
	for (uintptr_t i = 0; i < 3; i++)
		a_call_to(F.cl, F.ep, i, "test.sleep", 1500, i, 10000,
			  f_failed);
	rx_timer_start(r, &F.fail, RX_MS(100), 0);
	uint64_t t0 = pc_now_ns();
	tu_run(r, 5000);
	/* Semantics, not speed: the calls would otherwise end after 1.5 s. */
	cr_assert_lt(pc_now_ns() - t0, RX_MS(1400));
	for (int i = 0; i < 3; i++)
		cr_assert_eq(A.errs[i], -EHOSTDOWN, "call %d: %d", i, A.errs[i]);
	/* The client still works for the endpoint afterwards. */
	cr_assert_eq(A.done, 4);
	cr_assert_eq(A.errs[3], 0, "%d", A.errs[3]);
	cr_assert_eq(A.vals[3], 7);
	rpc_client_free(F.cl);
	rx_reactor_destroy(r);
	server_down_after(1600);
}

/* Shutdown (issue 10): calls pending on a peer that never answers — in
 * flight, waiting for a connection, or sent by a completion during the stop
 * — all end with -ESHUTDOWN as soon as the reactor stops, and the loop ends
 * well within shutdown_grace with nothing left behind. */
static struct {
	struct rpc_client *cl;
	char ep[64];
	struct rx_timer stop;
} Z;

static void z_stop(struct rx_reactor *r, struct rx_timer *t)
{
	(void)t;
	rx_reactor_stop(r);
}

static void z_first_done(void *arg, const struct rpc_result *res)
{
	a_done(arg, res);
	/* As a lookup does: on to the next owner, during the stop. */
	a_call(Z.cl, Z.ep, 3, "test.echo", 1, 0, 10000);
}

Test(rpc, async_client_fails_pending_calls_when_its_reactor_stops)
{
	/* A peer that never answers: the kernel completes the handshake,
	 * nobody accepts or reads. */
	int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sin = {.sin_family = AF_INET,
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	cr_assert_eq(bind(s, (struct sockaddr *)&sin, sizeof(sin)), 0);
	cr_assert_eq(listen(s, 16), 0);
	socklen_t sl = sizeof(sin);
	getsockname(s, (struct sockaddr *)&sin, &sl);
	snprintf(Z.ep, sizeof(Z.ep), "127.0.0.1:%u", ntohs(sin.sin_port));
	struct rx_reactor *r = tu_reactor(NULL); /* shutdown_grace 5 s */
	struct rpc_client_opts o;
	rpc_client_opts_default(&o);
	o.conns_per_endpoint = 1;
	o.inflight_per_conn = 2; /* the third call waits for a slot */
	Z.cl = rpc_client_new(r, &o);
	rx_timer_init(&Z.stop, z_stop, NULL);
	a_reset(4);
	A.r = r;
	a_call_to(Z.cl, Z.ep, 0, "test.echo", 1, 0, 10000, z_first_done);
	for (uintptr_t i = 1; i < 3; i++)
		a_call(Z.cl, Z.ep, i, "test.echo", 1, 0, 10000);
	rx_timer_start(r, &Z.stop, RX_MS(200), 0);
	uint64_t ms = tu_run(r, 12000);
	cr_assert_eq(A.done, 4, "every call completed (%d)", A.done);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(A.errs[i], -ESHUTDOWN, "call %d: %d", i, A.errs[i]);
	/* Semantics, not speed: otherwise they wait for the grace (5 s). */
	cr_assert_lt(ms, 2500, "the loop took %llu ms", (unsigned long long)ms);
	rpc_client_free(Z.cl);
	rx_reactor_destroy(r);
	close(s);
}

/* ------------------------------------------- replies sent by reference */

static void send_ref(int fd, uint32_t msgid, uint64_t len, uint64_t pieces,
		     uint64_t reserve)
{
	uint64_t v[] = {len, pieces, reserve};
	cr_assert_eq(tu_rpc_send_uints(fd, msgid, "test.ref", v, 3), 0);
}

/* Reads one whole response of any size; its error code into code ("" for
 * a result), and checks a result is pieces bins of len pattern bytes. */
static void read_ref_reply(int fd, uint32_t msgid, uint64_t len,
			   uint64_t pieces, char *code)
{
	size_t cap = len * pieces + 4096;
	uint8_t *buf = malloc(cap);
	cr_assert(buf);
	uint32_t id;
	struct rpc_result res;
	const char *why = "";
	cr_assert_eq(tu_rpc_read_reply(fd, buf, cap, &id, &res, &why), 0, "%s",
		     why);
	cr_assert_eq(id, msgid);
	code[0] = 0;
	if (res.err) {
		strcpy(code, res.code);
		free(buf);
		return;
	}
	struct mp_rd r = res.result;
	uint32_t n;
	cr_assert_eq(mp_rd_array(&r, &n), 0);
	cr_assert_eq(n, pieces);
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *b;
		uint32_t bl;
		cr_assert_eq(mp_rd_bin(&r, &b, &bl), 0, "piece %u", i);
		cr_assert_eq(bl, len, "piece %u", i);
		cr_assert_eq(tu_check_pattern(b, bl, 7, 0), -1,
			     "piece %u: wrong bytes", i);
	}
	free(buf);
}

/* Waits up to 5 s for R.released to reach want. */
static void wait_released(unsigned want)
{
	for (int i = 0; i < 500 && __atomic_load_n(&R.released,
						   __ATOMIC_RELAXED) < want;
	     i++)
		usleep(10 * 1000);
	cr_assert_eq(__atomic_load_n(&R.released, __ATOMIC_RELAXED), want,
		     "released %u times, want %u", R.released, want);
}

Test(rpc, reply_by_reference_arrives_whole_and_gives_its_budget_back)
{
	/* Room in the node's reply budget for one such reply at a time:
	 * the second call finds it only if the first gave its share back. */
	const struct rpc_guard gd = {.max_reply_bytes = 3u << 20};
	S.guard = &gd;
	memset(&R, 0, sizeof(R));
	server_up(1, NULL, NULL);
	int fd = tu_connect(S.port);
	char code[32];
	for (uint32_t k = 1; k <= 3; k++) {
		send_ref(fd, k, 256 << 10, 8, 1);
		read_ref_reply(fd, k, 256 << 10, 8, code);
		cr_assert_str_eq(code, "", "call %u: %s", k, code);
		/* each piece once, after it was sent */
		wait_released(8 * k);
	}
	cr_assert_eq(R.by_ref, 24);
	cr_assert_eq(R.copied, 0);
	close(fd);
	server_down();
	S.guard = NULL;
}

Test(rpc, reply_by_reference_without_a_reservation_is_copied)
{
	memset(&R, 0, sizeof(R));
	server_up(1, NULL, NULL);
	int fd = tu_connect(S.port);
	char code[32];
	send_ref(fd, 5, 64 << 10, 4, 0);
	read_ref_reply(fd, 5, 64 << 10, 4, code);
	cr_assert_str_eq(code, "");
	cr_assert_eq(R.copied, 4);
	cr_assert_eq(R.by_ref, 0);
	cr_assert_eq(R.released, 4, "released before the reply ended");
	close(fd);
	server_down();
}

Test(rpc, reply_by_reference_to_a_client_that_left_is_released)
{
	memset(&R, 0, sizeof(R));
	server_up(1, NULL, NULL);
	/* 32 MiB the client never reads: the kernel takes a few MiB, the
	 * rest waits in the queue when the client goes. */
	int fd = tu_connect(S.port);
	send_ref(fd, 9, 4u << 20, 8, 1);
	for (int i = 0; i < 500 && __atomic_load_n(&R.by_ref,
						   __ATOMIC_RELAXED) < 8;
	     i++)
		usleep(10 * 1000);
	cr_assert_eq(R.by_ref, 8);
	close(fd);
	wait_released(8);
	/* Still serving. */
	fd = tu_connect(S.port);
	char code[32];
	send_ref(fd, 10, 4096, 2, 1);
	read_ref_reply(fd, 10, 4096, 2, code);
	cr_assert_str_eq(code, "");
	close(fd);
	server_down();
}
