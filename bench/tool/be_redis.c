/*
 * bench/tool/be_redis.c — peercache-bench: target "redis" (RESP2 over TCP,
 * via "resp"), the baseline a user compares the node with.
 *
 *   get:    one MGET k1..kn; a value of exactly page_bytes lands in its
 *           page slot, nil or any other length is a miss (slot untouched)
 *   set:    n pipelined SET k v (values sent from c->buf), then n replies;
 *           +OK counts as stored
 *   exists: n pipelined EXISTS k; the leading run of 1s counts (SGLang
 *           asks how long a prefix is stored)
 * An error reply (-ERR, -NOAUTH, -OOM, ...) fails the call with -EREMOTEIO
 * and the server's text in c->err; the replies of a pipeline are all read
 * first, so the connection stays usable.
 *
 * Owns: nothing global; a connection (net.h) belongs to one driver thread.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "net.h"
#include "pcb.h"

static int redis_proc_open(const struct pcb_target *t, unsigned threads,
			   void **proc, char *err, size_t errlen)
{
	return pcb_net_proc_open(t, &pcb_be_redis, "6379", proc, err, errlen);
}

/* A bulk string: $<n> CRLF <bytes> CRLF, all into the staging. */
static void put_bulk(struct pcb_net_out *o, const char *p, size_t n)
{
	pcb_net_out_fmt(o, "$%zu\r\n", n);
	pcb_net_out_bytes(o, p, n);
	pcb_net_out_bytes(o, "\r\n", 2);
}

/* Read one reply line; an error reply ('-...') keeps its text (the first
 * one of a call) and sets *remote. 0 or a negative errno from the read. */
static int reply_line(struct pcb_net_conn *c, const char *what,
		      const char **line, size_t *len, int *remote)
{
	int rc = pcb_net_read_line(c, line, len);

	if (rc < 0)
		return pcb_net_fail(c, rc, "%s reply", what);
	if (*len > 0 && (*line)[0] == '-' && !*remote) {
		char text[160];
		*remote = -EREMOTEIO;
		pcb_net_note(c, "%s: %s", what,
			     pcb_net_show(*line + 1, *len - 1, text,
					  sizeof(text)));
	}
	return 0;
}

static int bad_reply(struct pcb_net_conn *c, const char *what,
		     const char *line, size_t len)
{
	char text[64];

	return pcb_net_fail(c, -EPROTO, "%s: unexpected reply '%s'", what,
			    pcb_net_show(line, len, text, sizeof(text)));
}

static int redis_get(struct pcb_conn *base, char *const *keys,
		     const size_t *keylens, size_t n, size_t *hits)
{
	struct pcb_net_conn *c = (struct pcb_net_conn *)base;
	uint64_t page = c->proc->page_bytes;
	const char *line;
	size_t len;
	int64_t v;
	int remote = 0;
	int rc;

	if ((rc = pcb_net_begin(c, keylens, n, hits)) <= 0)
		return rc;
	pcb_net_out_fmt(&c->out, "*%zu\r\n$4\r\nMGET\r\n", n + 1);
	for (size_t i = 0; i < n; i++)
		put_bulk(&c->out, keys[i], keylens[i]);
	if ((rc = pcb_net_send(c, "MGET")) < 0)
		return rc;
	if ((rc = reply_line(c, "MGET", &line, &len, &remote)) < 0)
		return rc;
	if (remote)
		return remote;
	if (len < 2 || line[0] != '*' ||
	    pcb_net_parse_int(line + 1, len - 1, &v) < 0 || v != (int64_t)n)
		return bad_reply(c, "MGET", line, len);
	for (size_t i = 0; i < n; i++) {
		if ((rc = pcb_net_read_line(c, &line, &len)) < 0)
			return pcb_net_fail(c, rc, "MGET value %zu", i);
		if (len < 2 || line[0] != '$' ||
		    pcb_net_parse_int(line + 1, len - 1, &v) < 0 || v < -1 ||
		    v > (int64_t)PCB_NET_VALUE_MAX)
			return bad_reply(c, "MGET value", line, len);
		if (v == -1)
			continue; /* nil: a miss */
		uint8_t *slot = (uint64_t)v == page ? c->base.buf + i * page
						    : NULL; /* wrong size: skip */
		if ((rc = pcb_net_read_exact(c, slot, (uint64_t)v)) < 0 ||
		    (rc = pcb_net_read_crlf(c)) < 0)
			return pcb_net_fail(c, rc, "MGET value %zu (%" PRId64
					    " bytes)", i, v);
		if (slot)
			(*hits)++;
	}
	return 0;
}

/*
 * Read the n replies of a pipeline and compare each with want (the whole
 * line): *matched = how many are want, *leading = the run of them from the
 * first. Error replies are read past and fail the call (-EREMOTEIO) once
 * all n are in, so the connection stays in step.
 */
static int pipeline_replies(struct pcb_net_conn *c, const char *what,
			    size_t n, const char *want, size_t *matched,
			    size_t *leading)
{
	size_t wantlen = strlen(want);
	bool run = true;
	int remote = 0;
	int rc;

	*matched = *leading = 0;
	for (size_t i = 0; i < n; i++) {
		const char *line;
		size_t len;
		if ((rc = reply_line(c, what, &line, &len, &remote)) < 0)
			return rc;
		if (len > 0 && line[0] == '-') {
			run = false;
			continue;
		}
		if (len == 0 || (line[0] != '+' && line[0] != ':'))
			return bad_reply(c, what, line, len);
		bool hit = len == wantlen && memcmp(line, want, len) == 0;
		if (hit)
			(*matched)++;
		run = run && hit;
		if (run)
			(*leading)++;
	}
	return remote;
}

/* `cmd key`, or `cmd key <value>` up to the value's bytes. */
static void head(struct pcb_net_out *o, const char *cmd, const char *key,
		 size_t keylen, bool values, uint64_t value_bytes)
{
	pcb_net_out_fmt(o, "*%d\r\n", values ? 3 : 2);
	put_bulk(o, cmd, strlen(cmd));
	put_bulk(o, key, keylen);
	if (values)
		pcb_net_out_fmt(o, "$%" PRIu64 "\r\n", value_bytes);
}

/* set and exists: one command per key, its replies compared with want;
 * hits are all of them (leading false) or the run from the first. */
static int pipeline(struct pcb_conn *base, char *const *keys,
		    const size_t *keylens, size_t n, size_t *hits,
		    const char *cmd, bool values, const char *want, bool leading)
{
	struct pcb_net_conn *c = (struct pcb_net_conn *)base;
	size_t all, run;
	int rc;

	if ((rc = pcb_net_begin(c, keylens, n, hits)) <= 0 ||
	    (rc = pcb_net_send_each(c, cmd, keys, keylens, n, values,
				     head)) < 0)
		return rc;
	rc = pipeline_replies(c, cmd, n, want, &all, &run);
	*hits = leading ? run : all;
	return rc;
}

static int redis_set(struct pcb_conn *base, char *const *keys,
		     const size_t *keylens, size_t n, size_t *hits)
{
	return pipeline(base, keys, keylens, n, hits, "SET", true, "+OK",
			false);
}

static int redis_exists(struct pcb_conn *base, char *const *keys,
			const size_t *keylens, size_t n, size_t *hits)
{
	return pipeline(base, keys, keylens, n, hits, "EXISTS", false, ":1",
			true);
}

const struct pcb_backend pcb_be_redis = {
	.target = "redis",
	.via = "resp",
	.proc_open = redis_proc_open,
	.proc_close = pcb_net_proc_close,
	.conn_open = pcb_net_conn_open,
	.conn_close = pcb_net_conn_close,
	.get = redis_get,
	.set = redis_set,
	.exists = redis_exists,
};
