/*
 * modules/metrics.c — the metrics HTTP endpoint: /metrics (Prometheus text),
 * /healthz (200 "ok" when ready, 503 "starting" / "stopping"; a line per
 * degraded part, the modules' degraded hooks), and the built-in dashboard
 * at /.
 *
 * Owns: the HTTP listener on metrics_bind:metrics_port (reactor 0), its
 * connections, and the node-level metrics (uptime, build, transport, the
 * reactor's counters through a collector). Routes come from every module's
 * http_routes table. Thread: init/fini on main; the listener and every HTTP
 * connection live on reactor 0 — metrics traffic is light and must not
 * compete with the data path of the other reactors. A /metrics scrape is
 * rendered in slices (met_render_step, SCRAPE_SLICE_NS each, one per loop
 * pass from a zero-delay timer), so a scrape never holds reactor 0 for its
 * whole ~1 ms render. One scrape renders at a time; scrapes on other
 * connections wait in a queue (FIFO) holding no render buffer, so however
 * many clients scrape at once, reactor 0 spends at most one slice per pass on
 * them. Meanwhile the connection keeps receiving (a client that resets is
 * closed at once, its render dropped; one that only half-closes after its
 * request still gets the reply, then the close) but the bytes of its next
 * requests are left unconsumed, and fed again once the reply is queued.
 *
 * Limits: request head sizes (modules/http_parse.h), metrics_max_connections
 * connections and metrics_max_connections_per_host from one address (when
 * either is full, the oldest connection with nothing being sent, if it is
 * over EVICT_GRACE_MS old, is dropped for the new one, so idle connections
 * can never lock a scrape out),
 * HEAD_TIMEOUT_MS for a request head to arrive (slow clients are answered
 * 408 and closed), IDLE_TIMEOUT_MS between keep-alive requests.
 * Bodies, methods other than GET/HEAD, and anything malformed get a 4xx (or
 * 5xx for unsupported versions) and a close; the node keeps serving.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "modules/http.h"
#include "modules/modules.h"
#include "reactor/group.h"
#include "reactor/stall.h"
#include "rpc/peercred.h"

#define LOG_MOD "metrics"
#define HEAD_TIMEOUT_MS 10000
#define IDLE_TIMEOUT_MS 30000
#define ROUTES_MAX 64
/* A new connection is never dropped for a newer one before this age: it
 * gets the chance to send its request even in a burst of accepts. */
#define EVICT_GRACE_MS 100
/* Render time per slice of a scrape: well under the stall threshold. */
#define SCRAPE_SLICE_NS 200000ull

extern const unsigned char pc_dashboard_html[];
extern const unsigned long pc_dashboard_html_len;

struct hconn {
	struct rx_conn *c;
	struct rx_timer timer; /* head timeout, then idle timeout */
	bool timing_head;
	bool linked;           /* on the list and counted */
	uint64_t accepted_ns;
	uint8_t addr[16];      /* source address (IPv4 v4-mapped) */
	/* A /metrics scrape waiting or rendering (no request is taken until it
	 * is answered). */
	bool in_scrape;
	bool eof;              /* the client half-closed during it */
	struct met_render_job *scrape; /* the render, once it is this one's turn */
	struct hconn *qnext;   /* the scrape queue */
	struct rx_timer slice; /* runs the scrape's next slice */
	enum http_method scrape_method;
	bool scrape_keep;
	struct hconn *prev, *next; /* accept order, oldest first */
};

static struct {
	struct pc_ctx *ctx;
	struct rx_listener *l;
	unsigned conns;                   /* linked connections */
	struct hconn *oldest, *newest;
	struct hconn *scraping;           /* the scrape rendering now */
	struct hconn *sq_head, *sq_tail;  /* scrapes waiting their turn */
	unsigned max_conns, max_per_host;
	met_id evicted, refused;
	const struct http_route *routes[ROUTES_MAX];
	unsigned nroutes;
	struct http_limits lim;
	met_id http_requests, http_errors;
} g;

/* --------------------------------------------------------- node metrics */

static double uptime_fn(void *arg)
{
	(void)arg;
	return (double)(pc_now_ns() - g.ctx->start_ns) / 1e9;
}

static double one_fn(void *arg)
{
	(void)arg;
	return 1;
}

/* The reactors' own counters, summed over threads at scrape time. */
static void reactor_collector(struct met_writer *w, void *arg)
{
	(void)arg;
	struct rx_group *grp = __atomic_load_n(&g.ctx->group, __ATOMIC_ACQUIRE);
	if (!grp)
		return;
	struct rx_stats st;
	rx_group_stats(grp, &st);
	static const struct {
		const char *name, *help;
		size_t off;
		enum met_type type;
	} rows[] = {
#define ROW(f, t, h) {"peercache_reactor_" #f, h, offsetof(struct rx_stats, f), t}
		ROW(loop_iterations, MET_COUNTER, "passes through the event loops"),
		ROW(waits, MET_COUNTER, "times a loop blocked in the kernel"),
		ROW(cqes, MET_COUNTER, "io_uring completions handled"),
		ROW(stale_cqes, MET_COUNTER, "completions dropped for a recycled op slot"),
		ROW(sq_full, MET_COUNTER, "times the submission queue was full"),
		ROW(ops_exhausted, MET_COUNTER, "op slot allocation failures"),
		ROW(ops_in_use, MET_GAUGE, "op slots in use"),
		ROW(bufring_exhausted, MET_COUNTER, "receives that found no provided buffer"),
		ROW(timers_fired, MET_COUNTER, "timer callbacks run"),
		ROW(msgs, MET_COUNTER, "cross-thread messages run"),
		ROW(conns_live, MET_GAUGE, "connections open (all kinds)"),
		ROW(bytes_in, MET_COUNTER, "bytes received on connections"),
		ROW(bytes_out, MET_COUNTER, "bytes sent on connections"),
		ROW(short_sends, MET_COUNTER, "sends that moved fewer bytes than queued"),
		ROW(out_pauses, MET_COUNTER, "reading paused because output was high"),
		ROW(out_cap_closes, MET_COUNTER, "connections closed: output cap exceeded"),
		ROW(in_cap_closes, MET_COUNTER, "connections closed: input cap exceeded"),
		ROW(in_taken, MET_COUNTER, "large requests a handler worked on in place, over loop passes"),
		ROW(accept_errors, MET_COUNTER, "accept completions with an error"),
		ROW(file_ops, MET_COUNTER, "file operations completed"),
		ROW(blocks_unmapped_off, MET_COUNTER, "large buffers let go of, unmapped on the offload thread"),
		ROW(idle_poll_hits, MET_COUNTER, "idle polls (reactor_idle_poll_us) that took new work without the loop sleeping"),
		ROW(idle_poll_misses, MET_COUNTER, "idle polls that found nothing: the loop slept after them"),
		ROW(idle_poll_yielded, MET_COUNTER, "of the misses, polls ended because another thread had the CPU for a while"),
#undef ROW
	};
	for (size_t i = 0; i < PC_ARRAY_LEN(rows); i++) {
		char name[96];
		snprintf(name, sizeof(name), "%s%s", rows[i].name,
			 rows[i].type == MET_COUNTER ? "_total" : "");
		met_w_family(w, name, rows[i].help, rows[i].type);
		uint64_t v;
		memcpy(&v, (const char *)&st + rows[i].off, sizeof(v));
		met_w_sample(w, name, NULL, (double)(int64_t)v);
	}
	met_w_family(w, "peercache_reactor_idle_poll_seconds_total",
		     "wall time the loops spent idle polling; the CPU it took "
		     "is at most this (each try yields to anything runnable)",
		     MET_COUNTER);
	met_w_sample(w, "peercache_reactor_idle_poll_seconds_total", NULL,
		     (double)st.idle_poll_ns / 1e9);
}

/* ----------------------------------------------------------------- routes */

/* /metrics is not a route of the table: it is rendered in slices over
 * several loop passes (scrape_start), which a route's one call cannot do. */
static bool is_scrape(const struct http_request *req)
{
	static const char path[] = "/metrics";
	return req->method != HTTP_OTHER && req->path_len == sizeof(path) - 1 &&
	       memcmp(req->path, path, sizeof(path) - 1) == 0;
}

/* 200 "ok" once every module started on every reactor; 503 "starting" or
 * "stopping" otherwise, so a script (or a load balancer) can wait on it.
 * A part degraded on its own (the disk tier) adds a line "<part> degraded:
 * <cause>" and keeps the 200: the node still serves from memory, and a
 * load balancer must not take it out for that. */
static void r_healthz(const struct http_request *req, struct http_response *r)
{
	(void)req;
	enum pc_node_state st = pc_ctx_state(g.ctx);
	const char *name = pc_ctx_state_name(st);
	if (st != PC_NODE_READY)
		r->status = 503;
	pc_wbuf_append(&r->body, name, strlen(name));
	pc_wbuf_append(&r->body, "\n", 1);
	struct pc_degraded dg[8];
	unsigned n = pc_modules_degraded(g.ctx, dg, PC_ARRAY_LEN(dg));
	for (unsigned i = 0; i < n && i < PC_ARRAY_LEN(dg); i++) {
		char line[sizeof(dg[i].why) + 64];
		int len = snprintf(line, sizeof(line), "%s degraded: %s\n",
				   dg[i].part, dg[i].why);
		if (len > 0)
			pc_wbuf_append(&r->body, line,
				       PC_MIN((size_t)len, sizeof(line) - 1));
	}
}

static void r_dashboard(const struct http_request *req,
			struct http_response *r)
{
	(void)req;
	r->content_type = "text/html; charset=utf-8";
	r->static_body = pc_dashboard_html;
	r->static_len = pc_dashboard_html_len;
	/* Defence in depth: the page fetches /metrics and (discovery on)
	 * /discovery/view.json, nothing else. */
	r->extra_headers =
		"Content-Security-Policy: default-src 'none'; "
		"script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
		"connect-src 'self'; img-src 'self' data:\r\n";
}

static const struct http_route metrics_routes[] = {
	{"/healthz", r_healthz},
	{NULL, NULL},
};

static const struct http_route dashboard_routes[] = {
	{"/", r_dashboard},
	{"/dashboard", r_dashboard},
	{"/index.html", r_dashboard},
	{NULL, NULL},
};

static const struct http_route *find_route(const char *path, size_t len)
{
	for (unsigned t = 0; t < g.nroutes; t++)
		for (const struct http_route *r = g.routes[t]; r->path; r++)
			if (strlen(r->path) == len &&
			    memcmp(r->path, path, len) == 0)
				return r;
	return NULL;
}

/* ------------------------------------------------------------ connections */

static void send_response(struct hconn *h, const struct http_request *req,
			  struct http_response *resp, bool keep)
{
	const void *body = resp->static_body ? resp->static_body
					     : (const void *)resp->body.data;
	size_t blen = resp->static_body ? resp->static_len : resp->body.len;
	if (resp->body.failed) {
		resp->status = 500;
		body = NULL;
		blen = 0;
	}
	if (resp->status >= 400)
		met_inc(g.http_errors);
	char head[1024];
	int n = snprintf(head, sizeof(head),
			 "HTTP/1.1 %d %s\r\n"
			 "Content-Type: %s\r\n"
			 "Content-Length: %zu\r\n"
			 "Cache-Control: no-store\r\n"
			 "X-Content-Type-Options: nosniff\r\n"
			 "%s%s"
			 "Connection: %s\r\n\r\n",
			 resp->status, http_status_text(resp->status),
			 resp->content_type ? resp->content_type
					    : "text/plain; charset=utf-8",
			 blen, resp->status == 405 ? "Allow: GET, HEAD\r\n" : "",
			 resp->extra_headers ? resp->extra_headers : "",
			 keep ? "keep-alive" : "close");
	rx_conn_write(h->c, head, (size_t)PC_MIN(n, (int)sizeof(head) - 1));
	if (blen && !(req && req->method == HTTP_HEAD))
		rx_conn_write(h->c, body, blen);
	pc_wbuf_free(&resp->body);
	if (!keep)
		rx_conn_close(h->c, RX_CLOSE_FLUSH, 0);
}

static void send_status(struct hconn *h, int status)
{
	struct http_response resp;
	memset(&resp, 0, sizeof(resp));
	pc_wbuf_init(&resp.body, 0);
	resp.status = status;
	char text[96];
	int n = snprintf(text, sizeof(text), "%d %s\n", status,
			 http_status_text(status));
	pc_wbuf_append(&resp.body, text, (size_t)n);
	send_response(h, NULL, &resp, false);
}

/* ------------------------------------------------------- sliced scrapes */

static void arm_timer(struct hconn *h, bool head);

/* Send resp for req on h: a status line as the body of a bodiless error,
 * then the keep-alive timer, or the close (also when the client has
 * half-closed). */
static void respond(struct hconn *h, const struct http_request *req,
		    struct http_response *resp)
{
	if (resp->status != 200 && !resp->static_body && !resp->body.len) {
		char text[96];
		int m = snprintf(text, sizeof(text), "%d %s\n", resp->status,
				 http_status_text(resp->status));
		pc_wbuf_append(&resp->body, text, (size_t)m);
	}
	bool keep = req->keep_alive && !h->eof;
	send_response(h, req, resp, keep);
	if (keep && !rx_conn_closing(h->c))
		arm_timer(h, false);
}

static void scrape_next(struct rx_reactor *r);

/* h's scrape is rendered: answer it, then start the next one waiting. */
static void scrape_done(struct rx_reactor *r, struct hconn *h)
{
	size_t len = 0;
	char *text = h->scrape ? met_render_finish(h->scrape, &len) : NULL;
	h->scrape = NULL;
	h->in_scrape = false;
	g.scraping = NULL;
	struct http_request req = {.method = h->scrape_method,
				   .keep_alive = h->scrape_keep};
	struct http_response resp;
	memset(&resp, 0, sizeof(resp));
	pc_wbuf_init(&resp.body, 64u << 20);
	resp.status = 200;
	if (text) {
		resp.content_type = "text/plain; version=0.0.4; charset=utf-8";
		pc_wbuf_append(&resp.body, text, len);
		free(text);
	} else {
		resp.status = 500;
	}
	respond(h, &req, &resp);
	if (!rx_conn_closing(h->c)) {
		/* Requests that arrived behind this one: a pause and resume
		 * feeds the kept input to h_data again on this pass. */
		rx_conn_pause(h->c);
		rx_conn_resume(h->c);
	}
	scrape_next(r);
}


/* One slice of the current scrape; the reply goes out with the last one. */
static void scrape_slice(struct rx_reactor *r, struct rx_timer *t)
{
	struct hconn *h = t->arg;
	rx_stall_tag("metrics scrape slice");
	if (met_render_step(h->scrape, SCRAPE_SLICE_NS) <= 0)
		scrape_done(r, h);
	else
		rx_timer_start(r, &h->slice, 0, 0); /* zero delay: never fails */
}

/* Start rendering for the oldest waiting scrape, if none renders now. */
static void scrape_next(struct rx_reactor *r)
{
	while (!g.scraping && g.sq_head) {
		struct hconn *h = g.sq_head;
		g.sq_head = h->qnext;
		if (!g.sq_head)
			g.sq_tail = NULL;
		h->qnext = NULL;
		h->scrape = met_render_begin(g.ctx->node_id);
		g.scraping = h;
		if (!h->scrape) {
			scrape_done(r, h); /* answered 500: out of memory */
			return;            /* scrape_done went on with the queue */
		}
		rx_timer_start(r, &h->slice, 0, 0);
	}
}

/* Queue a sliced scrape for req on h; the last slice answers it. */
static void scrape_start(struct hconn *h, const struct http_request *req)
{
	struct rx_reactor *r = rx_conn_reactor(h->c);
	h->in_scrape = true;
	h->scrape_method = req->method;
	h->scrape_keep = req->keep_alive;
	rx_timer_stop(r, &h->timer);
	h->qnext = NULL;
	if (g.sq_tail)
		g.sq_tail->qnext = h;
	else
		g.sq_head = h;
	g.sq_tail = h;
	scrape_next(r);
}

/* h goes away: drop its render, or its place in the queue. */
static void scrape_abandon(struct rx_reactor *r, struct hconn *h)
{
	if (!h->in_scrape)
		return;
	h->in_scrape = false;
	if (g.scraping == h) {
		size_t len;
		free(met_render_finish(h->scrape, &len)); /* abandoned */
		h->scrape = NULL;
		g.scraping = NULL;
		scrape_next(r);
		return;
	}
	struct hconn **link = &g.sq_head, *prev = NULL;
	while (*link && *link != h) {
		prev = *link;
		link = &(*link)->qnext;
	}
	if (*link) {
		*link = h->qnext;
		if (g.sq_tail == h)
			g.sq_tail = prev;
	}
	h->qnext = NULL;
}

/* The client half-closed: a scrape it asked for is still answered. */
static bool h_eof(struct rx_conn *c)
{
	struct hconn *h = rx_conn_udata(c);
	h->eof = true;
	return h->in_scrape;
}

static void arm_timer(struct hconn *h, bool head)
{
	h->timing_head = head;
	rx_timer_start(rx_conn_reactor(h->c), &h->timer,
		       RX_MS(head ? HEAD_TIMEOUT_MS : IDLE_TIMEOUT_MS), 0);
}

static void timer_fired(struct rx_reactor *r, struct rx_timer *t)
{
	struct hconn *h = t->arg;
	(void)r;
	if (h->timing_head) {
		PC_LOG_RL(PC_LOG_INFO, LOG_MOD, "a client took over %d ms to "
			  "send a request head; answered 408", HEAD_TIMEOUT_MS);
		send_status(h, 408);
	} else {
		rx_conn_close(h->c, RX_CLOSE_NOW, 0);
	}
}

static ssize_t h_data(struct rx_conn *c, const uint8_t *data, size_t len)
{
	struct hconn *h = rx_conn_udata(c);
	size_t used = 0;
	while (used < len && !rx_conn_closing(c) && !h->in_scrape) {
		struct http_request req;
		int n = http_parse_request((const char *)data + used,
					   len - used, &g.lim, &req);
		if (n == 0) {
			if (!h->timing_head)
				arm_timer(h, true); /* a head has begun */
			break;
		}
		if (n < 0) {
			PC_LOG_RL(PC_LOG_INFO, LOG_MOD, "refused a request: %d "
				  "%s", -n, http_status_text(-n));
			send_status(h, -n);
			return (ssize_t)len;
		}
		used += (size_t)n;
		met_inc(g.http_requests);
		if (req.has_body) {
			send_status(h, 413); /* nothing here takes a body */
			return (ssize_t)len;
		}
		if (is_scrape(&req)) {
			scrape_start(h, &req);
			break; /* answered by the last slice */
		}
		const struct http_route *r = req.method == HTTP_OTHER ? NULL :
			find_route(req.path, req.path_len);
		struct http_response resp;
		memset(&resp, 0, sizeof(resp));
		pc_wbuf_init(&resp.body, 64u << 20);
		resp.status = 200;
		if (req.method == HTTP_OTHER) {
			resp.status = 405;
		} else {
			if (r)
				r->fn(&req, &resp);
			else
				resp.status = 404;
		}
		respond(h, &req, &resp);
	}
	return (ssize_t)used;
}

static void h_unlink(struct hconn *h)
{
	if (!h->linked)
		return;
	if (h->prev)
		h->prev->next = h->next;
	else
		g.oldest = h->next;
	if (h->next)
		h->next->prev = h->prev;
	else
		g.newest = h->prev;
	h->linked = false;
	g.conns--;
}

static void h_link(struct hconn *h)
{
	h->prev = g.newest;
	h->next = NULL;
	if (g.newest)
		g.newest->next = h;
	else
		g.oldest = h;
	g.newest = h;
	h->linked = true;
	g.conns++;
}

static void h_close(struct rx_conn *c, int err)
{
	struct hconn *h = rx_conn_udata(c);
	(void)err;
	rx_timer_stop(rx_conn_reactor(c), &h->timer);
	rx_timer_stop(rx_conn_reactor(c), &h->slice);
	scrape_abandon(rx_conn_reactor(c), h);
	h_unlink(h);
	free(h);
}

static const struct rx_conn_ops h_ops = {.on_data = h_data,
					 .on_close = h_close,
					 .on_eof = h_eof};

/* Drop the oldest connection (from addr, if set) with nothing being sent,
 * to make room for a new one. false: none can go. */
static bool evict_idle(const uint8_t *addr)
{
	uint64_t born_before = pc_now_ns() - RX_MS(EVICT_GRACE_MS);
	for (struct hconn *v = g.oldest; v; v = v->next) {
		if (v->accepted_ns > born_before)
			break; /* oldest first: the rest are younger still */
		if (rx_conn_out_bytes(v->c) || v->in_scrape ||
		    (addr && memcmp(v->addr, addr, 16) != 0))
			continue;
		met_inc(g.evicted);
		PC_LOG_RL(PC_LOG_INFO, LOG_MOD, "dropped an idle HTTP "
			  "connection for a new one (%s)",
			  addr ? "metrics_max_connections_per_host"
			       : "metrics_max_connections");
		h_unlink(v);
		rx_conn_close(v->c, RX_CLOSE_NOW, -ECONNABORTED);
		return true;
	}
	return false;
}

/* Room for a connection from addr: under both caps, or made by eviction. */
static bool admit(const uint8_t *addr)
{
	unsigned same = 0;
	for (struct hconn *v = g.oldest; v; v = v->next)
		same += memcmp(v->addr, addr, 16) == 0;
	if (same >= g.max_per_host && !evict_idle(addr))
		return false;
	return g.conns < g.max_conns || evict_idle(NULL);
}

static void on_accept(struct rx_listener *l, int fd, void *arg)
{
	(void)arg;
	uint8_t addr[16] = {0};
	char peer[64];
	rpc_tcp_peer_name(fd, peer, sizeof(peer), addr);
	if (!admit(addr)) {
		met_inc(g.refused);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "refusing an HTTP connection "
			  "from %s: %u connections (%u per address) are the "
			  "limit and all are busy", peer, g.max_conns,
			  g.max_per_host);
		close(fd);
		return;
	}
	struct hconn *h = calloc(1, sizeof(*h));
	if (!h) {
		close(fd);
		return;
	}
	memcpy(h->addr, addr, 16);
	h->accepted_ns = pc_now_ns();
	int err;
	h->c = rx_conn_attach(rx_listener_reactor(l), fd, &h_ops, h, &err);
	if (!h->c) {
		free(h);
		return;
	}
	h_link(h);
	rx_conn_set_limits(h->c, HTTP_HEAD_BYTES_MAX(&g.lim) + 4096, 0, 0, 0);
	rx_timer_init(&h->timer, timer_fired, h);
	rx_timer_init(&h->slice, scrape_slice, h);
	arm_timer(h, true);
}

/* -------------------------------------------------------------- lifecycle */

static int m_init(struct pc_ctx *ctx)
{
	const struct pc_settings *s = ctx->cfg;
	memset(&g, 0, sizeof(g));
	g.ctx = ctx;
	g.lim = (struct http_limits)HTTP_LIMITS_DEFAULT;
	met_set_enabled(s->metrics_enabled);
	met_register_fn("peercache_uptime_seconds", "seconds since start", NULL,
			uptime_fn, NULL);
	static char build_labels[160];
	snprintf(build_labels, sizeof(build_labels),
		 "version=\"%s\",revision=\"%s\"", PEERCACHE_VERSION,
		 PEERCACHE_GIT_REV);
	met_register_fn("peercache_build_info", "version of this node",
			build_labels, one_fn, NULL);
	met_register_fn("peercache_transport_info",
			"the data transport in use", "transport=\"tcp\"", one_fn,
			NULL);
	met_register_fn("peercache_mode_info",
			"the placement mode this node runs (setting mode)",
			s->mode == PC_MODE_SLOTMAP ? "mode=\"slotmap\""
						   : "mode=\"p2p\"",
			one_fn, NULL);
	met_register_collector(reactor_collector, NULL);
	int ret = rx_stall_setup(ctx->threads,
				 (uint64_t)s->reactor_stall_threshold_us * 1000u,
				 s->reactor_stall_cpu_clock);
	if (ret < 0)
		return ret;
	g.http_requests = met_register(MET_COUNTER,
				       "peercache_http_requests_total",
				       "requests on the metrics port", NULL);
	g.http_errors = met_register(MET_COUNTER, "peercache_http_errors_total",
				     "metrics-port answers with status >= 400",
				     NULL);
	g.evicted = met_register(MET_COUNTER,
				 "peercache_http_connections_evicted_total",
				 "idle metrics-port connections dropped for a "
				 "new one", NULL);
	g.refused = met_register(MET_COUNTER,
				 "peercache_http_connections_refused_total",
				 "metrics-port connections refused (all busy)",
				 NULL);
	g.max_conns = (unsigned)s->metrics_max_connections;
	g.max_per_host = (unsigned)s->metrics_max_connections_per_host;
	if (!s->metrics_enabled)
		return 0;
	g.routes[g.nroutes++] = metrics_routes;
	if (s->metrics_dashboard)
		g.routes[g.nroutes++] = dashboard_routes;
	for (size_t i = 0; i < ctx->n_modules && g.nroutes < ROUTES_MAX; i++)
		if (ctx->modules[i]->http_routes)
			g.routes[g.nroutes++] = ctx->modules[i]->http_routes;
	return 0;
}

static int m_start(struct rx_reactor *r, struct pc_ctx *ctx)
{
	const struct pc_settings *s = ctx->cfg;
	if (!s->metrics_enabled || rx_reactor_id(r) != 0)
		return 0;
	const char *host = *s->metrics_bind ? s->metrics_bind : s->bind;
	int err;
	g.l = rx_listen_tcp(r, host, (uint16_t)s->metrics_port, false, 128,
			    on_accept, NULL, &err);
	if (!g.l) {
		if (err == -EADDRINUSE)
			PC_LOGE(LOG_MOD, "metrics_port %lld is in use (another "
				"node on this host?): set --metrics-port 0 to "
				"pick a free port, another port, or "
				"--metrics-enabled false",
				(long long)s->metrics_port);
		return err;
	}
	char addr[300];
	snprintf(addr, sizeof(addr), "%s%s%s:%u", strchr(host, ':') ? "[" : "",
		 host, strchr(host, ':') ? "]" : "", rx_listener_port(g.l));
	pc_ctx_publish(ctx, "metrics", addr);
	return 0;
}

static void m_stop(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	if (rx_reactor_id(r) == 0 && g.l) {
		rx_listener_close(g.l);
		g.l = NULL;
	}
}

const struct pc_module pc_mod_metrics = {
	.name = "metrics",
	.init = m_init,
	.start = m_start,
	.stop = m_stop,
};
