/*
 * bench/tool/be_node.c — target "peercache": a PeerCache node, reached
 * through its session API (via "session": libpeercache over the Unix socket,
 * pages in shared memory — the path SGLang's shim takes) or through kv.*
 * MessagePack-RPC (via "rpc": pages inside the messages, to the node's RPC
 * port over TCP or its socket — the path of tools and remote clients).
 *
 * Owns: per process one struct pcache and one shared-memory region with a
 * slice of batch * page_bytes per thread (session), or one rpc_sync pool
 * (rpc). Threading: one connection per worker thread; both clients are
 * thread-safe underneath.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client/peercache.h"
#include "common/buf.h"
#include "tool.h"
#include "rpc/client.h"
#include "rpc/mp.h"

/* ------------------------------------------------------------- session */

struct sess_proc {
	struct pcache *pc;
	uint32_t region;
	uint8_t *base;
	uint64_t slice; /* bytes per thread */
	const struct pcb_target *t;
};

struct sess_conn {
	struct pcb_conn c;
	struct sess_proc *p;
	uint64_t off;   /* of this thread's slice in the region */
	struct pcache_item *items;
	bool *ok;
};

static int sess_proc_open(const struct pcb_target *t, unsigned threads,
			  void **out, char *err, size_t errlen)
{
	struct sess_proc *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->t = t;
	p->slice = t->page_bytes * t->batch;
	struct pcache_opts o = {.socket_path = t->addr,
				.timeout_ms = t->timeout_ms,
				.max_idle = threads};
	int ret = pcache_open(&o, &p->pc);
	if (ret < 0) {
		snprintf(err, errlen, "cannot open a client of %s: %s",
			 t->addr ? t->addr : "the default socket",
			 strerror(-ret));
		free(p);
		return ret;
	}
	void *addr;
	ret = pcache_region_create(p->pc, p->slice * threads, &addr,
				   &p->region);
	if (ret < 0) {
		snprintf(err, errlen,
			 "cannot share %llu bytes with the node: %s",
			 (unsigned long long)(p->slice * threads),
			 strerror(-ret));
		pcache_close(p->pc);
		free(p);
		return ret;
	}
	p->base = addr;
	*out = p;
	return 0;
}

static void sess_proc_close(void *v)
{
	struct sess_proc *p = v;
	if (!p)
		return;
	pcache_close(p->pc);
	free(p);
}

static int sess_conn_open(void *v, unsigned idx, struct pcb_conn **out,
			  char *err, size_t errlen)
{
	struct sess_proc *p = v;
	struct sess_conn *s = calloc(1, sizeof(*s));
	if (s) {
		s->items = calloc(p->t->batch, sizeof(*s->items));
		s->ok = calloc(p->t->batch, sizeof(*s->ok));
	}
	if (!s || !s->items || !s->ok) {
		if (s) {
			free(s->items);
			free(s->ok);
		}
		free(s);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	s->c.be = &pcb_be_session;
	s->p = p;
	s->off = p->slice * idx;
	s->c.buf = p->base + s->off;
	*out = &s->c;
	return 0;
}

static void sess_conn_close(struct pcb_conn *c)
{
	struct sess_conn *s = (struct sess_conn *)c;
	free(s->items);
	free(s->ok);
	free(s);
}

static int sess_fail(struct pcb_conn *c, const char *what, int ret)
{
	snprintf(c->err, sizeof(c->err), "%s: %s", what,
		 ret == -EREMOTEIO ? pcache_last_error() : strerror(-ret));
	return ret;
}

static void sess_items(struct sess_conn *s, char *const *keys,
		       const size_t *keylens, size_t n)
{
	for (size_t i = 0; i < n; i++)
		s->items[i] = (struct pcache_item){
			.key = keys[i],
			.keylen = keylens[i],
			.offset = s->off + i * s->p->t->page_bytes,
			.len = s->p->t->page_bytes};
}

static size_t count_ok(const bool *ok, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		k += ok[i];
	return k;
}

static int sess_get(struct pcb_conn *c, char *const *keys,
		    const size_t *keylens, size_t n, size_t *hits)
{
	struct sess_conn *s = (struct sess_conn *)c;
	sess_items(s, keys, keylens, n);
	int ret = pcache_get(s->p->pc, s->p->region, s->items, n, s->ok);
	if (ret < 0)
		return sess_fail(c, "session.get", ret);
	*hits = count_ok(s->ok, n);
	return 0;
}

static int sess_set(struct pcb_conn *c, char *const *keys,
		    const size_t *keylens, size_t n, size_t *hits)
{
	struct sess_conn *s = (struct sess_conn *)c;
	sess_items(s, keys, keylens, n);
	int ret = pcache_set(s->p->pc, s->p->region, s->items, n, s->ok);
	if (ret < 0)
		return sess_fail(c, "session.set", ret);
	*hits = count_ok(s->ok, n);
	return 0;
}

static int sess_exists(struct pcb_conn *c, char *const *keys,
		       const size_t *keylens, size_t n, size_t *hits)
{
	struct sess_conn *s = (struct sess_conn *)c;
	int ret = pcache_exists(s->p->pc, (const char *const *)keys, keylens,
				n, hits);
	if (ret < 0)
		return sess_fail(c, "exists", ret);
	return 0;
}

const struct pcb_backend pcb_be_session = {
	.target = "peercache",
	.via = "session",
	.proc_open = sess_proc_open,
	.proc_close = sess_proc_close,
	.conn_open = sess_conn_open,
	.conn_close = sess_conn_close,
	.get = sess_get,
	.set = sess_set,
	.exists = sess_exists,
};

/* ----------------------------------------------------------------- rpc */

struct rpc_proc {
	struct rpc_sync *rs;
	const struct pcb_target *t;
};

struct rpc_conn {
	struct pcb_conn c;
	struct rpc_proc *p;
	struct pc_wbuf params;
};

static int rpc_proc_open(const struct pcb_target *t, unsigned threads,
			 void **out, char *err, size_t errlen)
{
	struct rpc_proc *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->t = t;
	struct rpc_sync_opts o;
	rpc_sync_opts_default(&o);
	o.timeout_ms = t->timeout_ms;
	o.max_idle = threads;
	o.secret = t->secret;
	/* A batch of pages plus msgpack framing (5 bytes a key, 32 a call). */
	uint64_t need = t->page_bytes * t->batch + 8ull * t->batch + 4096;
	if (need > o.max_message_bytes)
		o.max_message_bytes = need;
	int ret;
	p->rs = rpc_sync_new(t->addr, &o, &ret);
	if (!p->rs) {
		snprintf(err, errlen, "not a node address (host:port or "
			 "unix:/path): %s (%s)", t->addr, strerror(-ret));
		free(p);
		return ret;
	}
	*out = p;
	return 0;
}

static void rpc_proc_close(void *v)
{
	struct rpc_proc *p = v;
	if (!p)
		return;
	rpc_sync_free(p->rs);
	free(p);
}

static int rpc_conn_open(void *v, unsigned idx, struct pcb_conn **out,
			 char *err, size_t errlen)
{
	(void)idx;
	struct rpc_proc *p = v;
	struct rpc_conn *s = calloc(1, sizeof(*s));
	if (s)
		s->c.buf = malloc(p->t->page_bytes * p->t->batch);
	if (!s || !s->c.buf) {
		free(s);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	s->c.be = &pcb_be_rpc;
	s->p = p;
	pc_wbuf_init(&s->params, 0);
	*out = &s->c;
	return 0;
}

static void rpc_conn_close(struct pcb_conn *c)
{
	struct rpc_conn *s = (struct rpc_conn *)c;
	pc_wbuf_free(&s->params);
	free(s->c.buf);
	free(s);
}

/* [[keys]] (+ [values] for a set) into s->params. */
static void pack_call(struct rpc_conn *s, char *const *keys,
		      const size_t *keylens, size_t n, bool values)
{
	msgpack_packer pk;
	pc_wbuf_reset(&s->params);
	pc_wbuf_packer(&s->params, &pk);
	msgpack_pack_array(&pk, values ? 2 : 1);
	msgpack_pack_array(&pk, (uint32_t)n);
	for (size_t i = 0; i < n; i++) {
		msgpack_pack_str(&pk, keylens[i]);
		msgpack_pack_str_body(&pk, keys[i], keylens[i]);
	}
	if (!values)
		return;
	msgpack_pack_array(&pk, (uint32_t)n);
	uint64_t pb = s->p->t->page_bytes;
	for (size_t i = 0; i < n; i++) {
		msgpack_pack_bin(&pk, (uint32_t)pb);
		msgpack_pack_bin_body(&pk, s->c.buf + i * pb, pb);
	}
}

/* Call and check the envelope; 0 with *rep to read, or -errno. */
static int rpc_do(struct rpc_conn *s, const char *method,
		  struct rpc_sync_reply *rep)
{
	int ret = rpc_sync_call(s->p->rs, method, s->params.data,
				s->params.len, NULL, 0, s->p->t->timeout_ms,
				rep);
	if (ret == 0 && rep->res.err)
		ret = rep->res.err < 0 ? rep->res.err : -EREMOTEIO;
	if (ret < 0) {
		char why[200];
		snprintf(s->c.err, sizeof(s->c.err), "%s: %s", method,
			 rpc_result_str(&rep->res, why, sizeof(why)));
		rpc_sync_reply_free(rep);
	}
	return ret;
}

static int rpc_bad(struct rpc_conn *s, const char *method,
		   struct rpc_sync_reply *rep)
{
	snprintf(s->c.err, sizeof(s->c.err), "%s: a reply of the wrong shape",
		 method);
	rpc_sync_reply_free(rep);
	return -EPROTO;
}

static int rpc_get(struct pcb_conn *c, char *const *keys,
		   const size_t *keylens, size_t n, size_t *hits)
{
	struct rpc_conn *s = (struct rpc_conn *)c;
	struct rpc_sync_reply rep;
	pack_call(s, keys, keylens, n, false);
	int ret = rpc_do(s, "kv.get", &rep);
	if (ret < 0)
		return ret;
	struct mp_rd r = rep.res.result;
	uint32_t m;
	if (mp_rd_array(&r, &m) < 0 || m != n)
		return rpc_bad(s, "kv.get", &rep);
	uint64_t pb = s->p->t->page_bytes;
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		const uint8_t *v;
		uint32_t len;
		if (mp_rd_try_nil(&r))
			continue;
		if (mp_rd_bin(&r, &v, &len) < 0)
			return rpc_bad(s, "kv.get", &rep);
		if (len != pb)
			continue;
		memcpy(c->buf + i * pb, v, pb);
		k++;
	}
	rpc_sync_reply_free(&rep);
	*hits = k;
	return 0;
}

static int rpc_set(struct pcb_conn *c, char *const *keys,
		   const size_t *keylens, size_t n, size_t *hits)
{
	struct rpc_conn *s = (struct rpc_conn *)c;
	struct rpc_sync_reply rep;
	pack_call(s, keys, keylens, n, true);
	int ret = rpc_do(s, "kv.set", &rep);
	if (ret < 0)
		return ret;
	struct mp_rd r = rep.res.result;
	uint32_t m;
	if (mp_rd_array(&r, &m) < 0 || m != n)
		return rpc_bad(s, "kv.set", &rep);
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		bool ok;
		if (mp_rd_bool(&r, &ok) < 0)
			return rpc_bad(s, "kv.set", &rep);
		k += ok;
	}
	rpc_sync_reply_free(&rep);
	*hits = k;
	return 0;
}

static int rpc_exists(struct pcb_conn *c, char *const *keys,
		      const size_t *keylens, size_t n, size_t *hits)
{
	struct rpc_conn *s = (struct rpc_conn *)c;
	struct rpc_sync_reply rep;
	pack_call(s, keys, keylens, n, false);
	int ret = rpc_do(s, "kv.exists", &rep);
	if (ret < 0)
		return ret;
	struct mp_rd r = rep.res.result;
	uint64_t count;
	if (mp_rd_uint(&r, &count) < 0 || count > n)
		return rpc_bad(s, "kv.exists", &rep);
	rpc_sync_reply_free(&rep);
	*hits = (size_t)count;
	return 0;
}

const struct pcb_backend pcb_be_rpc = {
	.target = "peercache",
	.via = "rpc",
	.proc_open = rpc_proc_open,
	.proc_close = rpc_proc_close,
	.conn_open = rpc_conn_open,
	.conn_close = rpc_conn_close,
	.get = rpc_get,
	.set = rpc_set,
	.exists = rpc_exists,
};

/* --------------------------------------------------------- node.info */

static void copy_str(struct mp_rd v, char *out, size_t len)
{
	const char *s;
	uint32_t n;
	if (mp_rd_str(&v, &s, &n) == 0)
		snprintf(out, len, "%.*s", (int)n, s);
}

static void info_line(const char *info, const char *key, char *out,
		      size_t len)
{
	size_t kl = strlen(key);
	for (const char *l = info; *l;) {
		if (!strncmp(l, key, kl) && l[kl] == ':') {
			const char *v = l + kl + 1;
			while (*v == ' ')
				v++;
			snprintf(out, len, "%.*s", (int)strcspn(v, "\n"), v);
			return;
		}
		const char *nl = strchr(l, '\n');
		if (!nl)
			break;
		l = nl + 1;
	}
}

int pcb_node_info(const char *addr, bool rpc, const char *secret,
		  unsigned timeout_ms, struct pcb_node_info *out, char *err,
		  size_t errlen)
{
	*out = (struct pcb_node_info){"?", "?", "?", "?"};
	int ret;
	if (!rpc) {
		struct pcache *pc;
		struct pcache_opts o = {.socket_path = addr,
					.timeout_ms = timeout_ms};
		char info[4096];
		if ((ret = pcache_open(&o, &pc)) < 0) {
			snprintf(err, errlen, "%s", strerror(-ret));
			return ret;
		}
		ret = pcache_info(pc, info, sizeof(info));
		if (ret < 0)
			snprintf(err, errlen, "%s", ret == -EREMOTEIO
				 ? pcache_last_error() : strerror(-ret));
		pcache_close(pc);
		if (ret < 0)
			return ret;
		info_line(info, "node_id", out->id, sizeof(out->id));
		info_line(info, "mode", out->mode, sizeof(out->mode));
		info_line(info, "transport", out->transport,
			  sizeof(out->transport));
		info_line(info, "version", out->version,
			  sizeof(out->version));
		return 0;
	}
	struct rpc_sync_opts o;
	rpc_sync_opts_default(&o);
	o.timeout_ms = timeout_ms;
	o.max_idle = 1;
	o.secret = secret;
	struct rpc_sync *rs = rpc_sync_new(addr, &o, &ret);
	if (!rs) {
		snprintf(err, errlen, "not a node address: %s", addr);
		return ret;
	}
	static const uint8_t empty[] = {0x90};
	struct rpc_sync_reply rep;
	ret = rpc_sync_call(rs, "node.info", empty, 1, NULL, 0, timeout_ms,
			    &rep);
	if (ret == 0 && rep.res.err)
		ret = rep.res.err;
	if (ret < 0) {
		char why[200];
		snprintf(err, errlen, "%s",
			 rpc_result_str(&rep.res, why, sizeof(why)));
	} else {
		struct mp_rd r = rep.res.result;
		uint32_t n;
		if (mp_rd_map(&r, &n) == 0)
			for (uint32_t i = 0; i < n; i++) {
				const char *k;
				uint32_t kl;
				if (mp_rd_str(&r, &k, &kl) < 0)
					break;
				struct mp_rd v = r;
				if (mp_skip(&r) < 0)
					break;
				if (mp_str_eq(k, kl, "node_id"))
					copy_str(v, out->id, sizeof(out->id));
				else if (mp_str_eq(k, kl, "mode"))
					copy_str(v, out->mode,
						 sizeof(out->mode));
				else if (mp_str_eq(k, kl, "transport"))
					copy_str(v, out->transport,
						 sizeof(out->transport));
				else if (mp_str_eq(k, kl, "version"))
					copy_str(v, out->version,
						 sizeof(out->version));
			}
	}
	rpc_sync_reply_free(&rep);
	rpc_sync_free(rs);
	return ret;
}
