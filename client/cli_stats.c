/*
 * client/cli_stats.c — `peercache stats`: the node's id, uptime and
 * members, then its peercache_* counters and gauges read from its metrics
 * endpoint (GET /metrics, Prometheus text); `stats --watch [INTERVAL]`
 * samples them again every INTERVAL and shows counters as rates per second
 * (the first sample absolute), until Ctrl-C or --count samples.
 *
 * Owns: the HTTP fetch of one /metrics response (blocking, within the
 * call timeout) and its parse. Single-threaded; Ctrl-C during --watch ends
 * the loop after the sample in progress (exit 0).
 *
 * What is shown: samples of a peercache_* family whose # TYPE is counter or
 * gauge and whose only label is node (labelled series such as
 * peercache_copy_bytes_total{op=...} and histograms are left out), sorted
 * by name. A counter that went down between two samples (the node
 * restarted) shows its new value as the rate's base: the rate is then
 * left out for that sample ("-").
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "client/cli.h"
#include "common/endpoint.h"
#include "common/json.h"

#define CLI_METRICS_BYTES_MAX (16u << 20) /* one /metrics response */

/* GET /metrics from "host:port" into in: the whole response, which ends
 * when the node closes (Connection: close). 0 or -errno. */
static int http_fetch(const char *addr, unsigned timeout_ms,
		      struct pc_wbuf *in)
{
	uint64_t deadline = pc_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	struct sockaddr_storage ss;
	socklen_t sl;
	int ret = pc_endpoint_parse(addr, &ss, &sl);
	if (ret < 0)
		return ret;
	int fd = rpc_connect_by(&ss, sl, deadline);
	if (fd < 0)
		return fd;
	char req[512];
	int rlen = snprintf(req, sizeof(req), "GET /metrics HTTP/1.1\r\nHost: "
			    "%s\r\nUser-Agent: peercache/%s\r\nConnection: "
			    "close\r\n\r\n", addr, PEERCACHE_VERSION);
	/* The request is far smaller than any socket buffer: one send. */
	if (ret == 0 && send(fd, req, (size_t)rlen, MSG_NOSIGNAL) != rlen)
		ret = -EIO;
	while (ret == 0) {
		uint8_t chunk[65536];
		ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
		if (n == 0)
			break; /* the whole response */
		if (n > 0)
			ret = pc_wbuf_append(in, chunk, (size_t)n) < 0 ? -EMSGSIZE
								       : 0;
		else if (errno == EAGAIN)
			ret = rpc_wait_fd(fd, POLLIN, deadline);
		else if (errno != EINTR)
			ret = -errno;
	}
	close(fd);
	return ret;
}

/* The body of a 200 response, or NULL with *why set. */
static const char *http_body(struct pc_wbuf *in, size_t *len,
			     const char **why)
{
	char *p = (char *)in->data;
	char *end = in->len ? memmem(p, in->len, "\r\n\r\n", 4) : NULL;
	if (!end || in->len < 12 || strncmp(p, "HTTP/1.", 7) != 0) {
		*why = "not an HTTP response";
		return NULL;
	}
	if (strncmp(p + 8, " 200", 4) != 0) {
		*why = "the response is not 200 OK";
		return NULL;
	}
	*end = '\0'; /* headers are a C string from here */
	if (strcasestr(p, "\r\ntransfer-encoding:")) {
		*why = "a chunked response (unsupported)";
		return NULL;
	}
	*len = in->len - (size_t)(end + 4 - p);
	return end + 4;
}

/* Keep a sample line: a peercache_* counter or gauge of the family
 * announced by the last # TYPE line, with no label but node. */
static bool metric_wanted(const char *line, size_t len, const char *family)
{
	size_t nl = strcspn(line, "{ ");
	if (!*family || nl != strlen(family) || memcmp(line, family, nl) ||
	    nl >= len)
		return false;
	const char *p = line + nl, *end = line + len;
	if (*p != '{')
		return true;
	for (p++; p < end && *p != '}';) {
		const char *eq = memchr(p, '=', (size_t)(end - p));
		if (!eq || eq + 1 >= end || eq[1] != '"')
			return false;
		if (eq - p != 4 || memcmp(p, "node", 4) != 0)
			return false;
		for (p = eq + 2; p < end && *p != '"'; p++)
			if (*p == '\\')
				p++;
		if (p >= end)
			return false; /* no closing quote */
		p++;
		if (p < end && *p == ',')
			p++;
	}
	return p < end;
}

/* "0.0.0.0:9" or "[::]:9" is where the node listens, not where to reach
 * it: use the host of --node (or loopback for a Unix socket). */
static void metrics_addr(const struct cli *c, const char *published,
			 char *out, size_t len)
{
	const char *port = strrchr(published, ':');
	bool wild = port && (!strncmp(published, "0.0.0.0:", 8) ||
			     !strncmp(published, "[::]:", 5));
	if (!wild) {
		snprintf(out, len, "%s", published);
		return;
	}
	const char *host = c->tcp ? c->node : "127.0.0.1:";
	const char *hend = strrchr(host, ':');
	snprintf(out, len, "%.*s%s", (int)(hend - host), host, port);
}

/* ------------------------------------------------------------ one sample */

/* One series: name and value text point into the response body. */
struct series {
	const char *name;
	const char *text; /* the value as the node wrote it */
	double v;
	bool counter;
};

struct sample {
	struct pc_wbuf in; /* the HTTP response; names point into it */
	struct series *s;
	size_t n;
	double t;          /* when it was taken (CLOCK_MONOTONIC, s) */
};

static void sample_free(struct sample *sm)
{
	pc_wbuf_free(&sm->in);
	free(sm->s);
	*sm = (struct sample){0};
}

static int cmp_series(const void *a, const void *b)
{
	return strcmp(((const struct series *)a)->name,
		      ((const struct series *)b)->name);
}

/* The wanted series of a Prometheus text body, sorted by name; the body is
 * cut into C strings in place. 0 or -ENOMEM. */
static int parse_metrics(char *body, size_t len, struct sample *sm)
{
	char family[128] = "";
	bool counter = false;
	size_t cap = 0;
	body[len] = '\0'; /* fetch_sample appended a NUL past the body */
	for (char *save = NULL, *l = strtok_r(body, "\n", &save); l;
	     l = strtok_r(NULL, "\n", &save)) {
		char name[128], type[32];
		if (sscanf(l, "# TYPE %127s %31s", name, type) == 2) {
			counter = !strcmp(type, "counter");
			bool keep = strncmp(name, "peercache_", 10) == 0 &&
				    (counter || !strcmp(type, "gauge"));
			snprintf(family, sizeof(family), "%s", keep ? name : "");
			continue;
		}
		if (l[0] == '#' || !metric_wanted(l, strlen(l), family))
			continue;
		if (sm->n == cap) {
			cap = cap ? cap * 2 : 128;
			struct series *ns = realloc(sm->s, cap * sizeof(*ns));
			if (!ns)
				return -ENOMEM;
			sm->s = ns;
		}
		/* "name{node=...} value [ts]": the value follows the last
		 * '}' (or the name), up to a space. */
		size_t nlen = strcspn(l, "{ ");
		char *v = strrchr(l, '}');
		v = v ? v + 1 : l + nlen;
		v += strspn(v, " ");
		v[strcspn(v, " \r")] = '\0';
		l[nlen] = '\0';
		sm->s[sm->n++] = (struct series){l, v, strtod(v, NULL), counter};
	}
	if (sm->n)
		qsort(sm->s, sm->n, sizeof(*sm->s), cmp_series);
	return 0;
}

/* Fetch and parse /metrics at addr into sm; NULL, or why not. */
static const char *fetch_sample(const struct cli *c, const char *addr,
				struct sample *sm, char *ebuf, size_t elen)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	sm->t = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
	pc_wbuf_init(&sm->in, CLI_METRICS_BYTES_MAX);
	const char *why = NULL;
	size_t blen = 0;
	char *body = NULL;
	int ret = http_fetch(addr, c->timeout_ms, &sm->in);
	if (ret == -ETIMEDOUT) {
		why = "no complete answer in time";
	} else if (ret < 0) {
		snprintf(ebuf, elen, "%s", strerror(-ret));
		why = ebuf;
	} else if (pc_wbuf_append(&sm->in, "", 1) < 0) { /* room for a NUL */
		why = "the response is too large";
	} else {
		sm->in.len--;
		body = (char *)http_body(&sm->in, &blen, &why);
	}
	if (body && parse_metrics(body, blen, sm) < 0)
		why = "out of memory";
	return why;
}

/* Where the node publishes its metrics (from node.info), as a reachable
 * "host:port" in addr; false when it publishes none. */
static bool metrics_endpoint(const struct cli *c, struct mp_rd info,
			     char *addr, size_t len)
{
	struct mp_rd addrs, v;
	const char *a;
	uint32_t al;
	if (!cli_map_find(info, "addresses", &addrs) ||
	    !cli_map_find(addrs, "metrics", &v) || mp_rd_str(&v, &a, &al) < 0)
		return false;
	char pub[256];
	snprintf(pub, sizeof(pub), "%.*s", (int)al, a);
	metrics_addr(c, pub, addr, len);
	return true;
}

static int metrics_failed(const char *addr, const char *why)
{
	cli_err("cannot read metrics from http://%s/metrics: %s", addr, why);
	return CLI_FAIL;
}

/* ----------------------------------------------------------------- stats */

/* {"name": value, ...} of sm's series. */
static void json_series(struct pc_wbuf *b, const struct sample *sm)
{
	pc_wbuf_append(b, "{", 1);
	for (size_t i = 0; i < sm->n; i++) {
		if (i)
			pc_wbuf_append(b, ",", 1);
		pc_json_str(b, sm->s[i].name, strlen(sm->s[i].name));
		pc_wbuf_append(b, ":", 1);
		pc_json_double(b, sm->s[i].v);
	}
	pc_wbuf_append(b, "}", 1);
}

/* One `stats`: id, uptime, members, metrics. */
static int stats_once(struct cli *c, struct mp_rd info, const char *id,
		      uint32_t idl, double up)
{
	char addr[256], ebuf[160];
	bool have = metrics_endpoint(c, info, addr, sizeof(addr));
	struct sample sm = {0};
	const char *why = have ? fetch_sample(c, addr, &sm, ebuf,
					      sizeof(ebuf))
			       : NULL;
	int rc = CLI_OK;
	if (c->json) {
		struct pc_wbuf b;
		pc_wbuf_init(&b, 0);
		pc_wbuf_append(&b, "{\"node_id\":", 11);
		pc_json_str(&b, id, idl);
		pc_wbuf_append(&b, ",\"uptime_s\":", 12);
		pc_json_double(&b, up);
		pc_wbuf_append(&b, ",\"members\":", 11);
		struct rpc_sync_reply rep;
		rc = cli_call_simple(c, "cluster.members", &rep);
		if (rc == CLI_OK) {
			struct mp_rd r = rep.res.result;
			if (cli_json_mp(&b, &r, 0) < 0)
				rc = cli_bad_reply(c, &rep);
			else
				rpc_sync_reply_free(&rep);
		}
		pc_wbuf_append(&b, ",\"metrics_address\":", 19);
		if (have)
			pc_json_str(&b, addr, strlen(addr));
		else
			pc_wbuf_append(&b, "null", 4);
		pc_wbuf_append(&b, ",\"metrics\":", 11);
		if (have && !why)
			json_series(&b, &sm);
		else
			pc_wbuf_append(&b, "null", 4);
		pc_wbuf_append(&b, "}", 1);
		if (rc == CLI_OK && !why)
			rc = cli_json_out(&b);
		else
			pc_wbuf_free(&b);
	} else {
		fputs("node_id: ", stdout);
		cli_print_str(id, idl);
		printf("\nuptime_s: %.3f\n", up);
		unsigned members;
		rc = cli_print_members(c, "  ", &members);
		if (rc == CLI_OK && !have)
			puts("metrics: not published by the node "
			     "(metrics_enabled off?)");
		else if (rc == CLI_OK)
			printf("metrics: %s\n", addr);
		for (size_t i = 0; rc == CLI_OK && !why && i < sm.n; i++)
			printf("%s %s\n", sm.s[i].name, sm.s[i].text);
	}
	fflush(stdout);
	sample_free(&sm);
	if (rc == CLI_OK && why)
		rc = metrics_failed(addr, why);
	return rc;
}

/* --------------------------------------------------------- stats --watch */

static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig)
{
	(void)sig;
	g_interrupted = 1;
}

/* The previous sample's value of series s (both sorted by name), or NULL. */
static const struct series *find_prev(const struct sample *prev,
				      const struct series *s, size_t *from)
{
	while (*from < prev->n) {
		int d = strcmp(prev->s[*from].name, s->name);
		if (d == 0)
			return &prev->s[*from];
		if (d > 0)
			return NULL;
		(*from)++;
	}
	return NULL;
}

/* Sample k of a watch: text (a header line, then "name value" for gauges
 * and "name rate/s" for counters) or one JSON line. */
static void watch_print(const struct cli *c, unsigned k,
			const struct sample *sm, const struct sample *prev)
{
	double dt = prev ? sm->t - prev->t : 0;
	time_t now = time(NULL);
	struct tm tm;
	char when[32];
	localtime_r(&now, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S%z", &tm);
	struct pc_wbuf b, rates;
	pc_wbuf_init(&b, 0);
	pc_wbuf_init(&rates, 0);
	if (c->json)
		pc_wbuf_printf(&b, "{\"sample\":%u,\"time\":\"%s\","
			       "\"interval_s\":", k, when);
	if (c->json && prev)
		pc_json_double(&b, dt);
	else if (c->json)
		pc_wbuf_append(&b, "null", 4);
	else if (prev)
		printf("--- %s sample %u: counters per second over %.3f s\n",
		       when, k, dt);
	else
		printf("--- %s sample %u: counters since the node started\n",
		       when, k);
	if (c->json)
		pc_wbuf_append(&b, ",\"gauges\":{", 11);
	pc_wbuf_append(&rates, "{", 1);
	size_t from = 0;
	bool first_g = true, first_r = true;
	for (size_t i = 0; i < sm->n; i++) {
		const struct series *s = &sm->s[i];
		const struct series *p = prev ? find_prev(prev, s, &from)
					      : NULL;
		bool rate = s->counter && p && dt > 0 && s->v >= p->v;
		double r = rate ? (s->v - p->v) / dt : 0;
		if (!c->json) {
			if (!s->counter || !prev)
				printf("%s %s\n", s->name, s->text);
			else if (rate)
				printf("%s %.6g/s\n", s->name, r);
			else
				printf("%s -\n", s->name);
			continue;
		}
		if (!s->counter) {
			pc_wbuf_append(&b, first_g ? "" : ",", !first_g);
			first_g = false;
			pc_json_str(&b, s->name, strlen(s->name));
			pc_wbuf_append(&b, ":", 1);
			pc_json_double(&b, s->v);
		} else if (rate) {
			pc_wbuf_append(&rates, first_r ? "" : ",", !first_r);
			first_r = false;
			pc_json_str(&rates, s->name, strlen(s->name));
			pc_wbuf_append(&rates, ":", 1);
			pc_json_double(&rates, r);
		}
	}
	pc_wbuf_append(&rates, "}", 1);
	if (c->json) {
		/* counters: the totals; rates: per second since the
		 * previous sample ({} in the first) */
		pc_wbuf_append(&b, "},\"counters\":{", 14);
		first_g = true;
		for (size_t i = 0; i < sm->n; i++) {
			if (!sm->s[i].counter)
				continue;
			pc_wbuf_append(&b, first_g ? "" : ",", !first_g);
			first_g = false;
			pc_json_str(&b, sm->s[i].name, strlen(sm->s[i].name));
			pc_wbuf_append(&b, ":", 1);
			pc_json_double(&b, sm->s[i].v);
		}
		pc_wbuf_append(&b, "},\"rates\":", 10);
		pc_wbuf_append(&b, rates.data, rates.len);
		pc_wbuf_append(&b, "}", 1);
		cli_json_out(&b);
	} else {
		pc_wbuf_free(&b);
	}
	pc_wbuf_free(&rates);
	fflush(stdout);
}

/* Sleep until t0 + ms, or Ctrl-C. */
static void watch_sleep(double t0, unsigned ms)
{
	for (;;) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		double left = t0 + ms / 1e3 -
			      ((double)ts.tv_sec + (double)ts.tv_nsec / 1e9);
		if (left <= 0 || g_interrupted)
			return;
		struct timespec d = {(time_t)left,
				     (long)((left - floor(left)) * 1e9)};
		nanosleep(&d, NULL); /* EINTR: the loop looks again */
	}
}

static int stats_watch(struct cli *c, struct mp_rd info)
{
	char addr[256], ebuf[160];
	if (!metrics_endpoint(c, info, addr, sizeof(addr))) {
		cli_err("stats --watch: the node publishes no metrics "
			"endpoint (metrics_enabled off?)");
		return CLI_FAIL;
	}
	struct sigaction sa = {.sa_handler = on_sigint};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	struct sample prev = {0}, cur;
	int rc = CLI_OK;
	for (unsigned k = 1; !g_interrupted; k++) {
		cur = (struct sample){0};
		const char *why = fetch_sample(c, addr, &cur, ebuf,
					       sizeof(ebuf));
		if (why) {
			sample_free(&cur);
			if (!g_interrupted) /* Ctrl-C cut the fetch: not an error */
				rc = metrics_failed(addr, why);
			break;
		}
		watch_print(c, k, &cur, k > 1 ? &prev : NULL);
		sample_free(&prev);
		prev = cur;
		if (c->count > 0 && k >= (unsigned long)c->count)
			break;
		watch_sleep(cur.t, c->watch_ms);
	}
	sample_free(&prev);
	return rc;
}

int cli_cmd_stats(struct cli *c, int argc, char **argv)
{
	(void)argc; /* operands: none (checked by the table) */
	(void)argv;
	struct rpc_sync_reply rep;
	int rc = cli_call_simple(c, "node.info", &rep);
	if (rc)
		return rc;
	struct mp_rd info = rep.res.result, v;
	const char *id;
	uint32_t idl;
	double up;
	if (!cli_map_find(info, "node_id", &v) || mp_rd_str(&v, &id, &idl) < 0 ||
	    !cli_map_find(info, "uptime_s", &v) || mp_rd_float(&v, &up) < 0)
		return cli_bad_reply(c, &rep);
	rc = c->watch ? stats_watch(c, info) : stats_once(c, info, id, idl, up);
	rpc_sync_reply_free(&rep);
	return rc;
}
