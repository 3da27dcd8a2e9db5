/*
 * bench/tool/be_memcached.c — peercache-bench: target "memcached" (the
 * text and meta protocols over TCP, via "memcache"), the other baseline.
 *
 *   get:    one multi-get `get k1 .. kn`; memcached answers the hits only,
 *           in request order, each VALUE mapped back to its key's index; a
 *           value of exactly page_bytes lands in its slot, any other length
 *           is a miss (slot untouched)
 *   set:    n pipelined `set k 0 0 <bytes>` (values sent from c->buf), then
 *           n replies; STORED counts. SERVER_ERROR (an item over memcached's
 *           limit, -I, 1 MiB by default with the item's header and key
 *           included: a page of exactly 1 MiB does not fit; out of memory)
 *           is a miss, not a failed call: its text is kept in c->err
 *   exists: n pipelined meta gets `mg k` without flags (memcached 1.6: HD
 *           for a hit, EN for a miss); the leading run of hits counts
 * Keys memcached's text protocol cannot carry (over 250 bytes, spaces,
 * control characters) fail the call with -EINVAL before anything is sent.
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

/* memcached's KEY_MAX_LENGTH */
#define MC_KEY_MAX 250

static int mc_proc_open(const struct pcb_target *t, unsigned threads,
			void **proc, char *err, size_t errlen)
{
	return pcb_net_proc_open(t, &pcb_be_memcached, "11211", proc, err,
				 errlen);
}

/* pcb_net_begin, then the keys memcached can take. */
static int mc_begin(struct pcb_net_conn *c, char *const *keys,
		    const size_t *keylens, size_t n, size_t *hits)
{
	int rc = pcb_net_begin(c, keylens, n, hits);
	char show[64];

	if (rc <= 0)
		return rc;
	for (size_t i = 0; i < n; i++) {
		const unsigned char *k = (const unsigned char *)keys[i];
		if (keylens[i] > MC_KEY_MAX)
			return pcb_net_fail(c, -EINVAL, "key %zu is %zu bytes: "
					    "memcached takes at most %d", i,
					    keylens[i], MC_KEY_MAX);
		for (size_t j = 0; j < keylens[i]; j++)
			if (k[j] <= ' ' || k[j] == 0x7f)
				return pcb_net_fail(
					c, -EINVAL, "key %zu ('%s') has a space "
					"or control character at byte %zu: "
					"memcached's text protocol cannot take "
					"it", i,
					pcb_net_show(k, keylens[i], show,
						     sizeof(show)), j);
	}
	return 1;
}

/* A reply that is an error of the server's (ERROR, CLIENT_ERROR,
 * SERVER_ERROR): fail the call with its text. The connection may be out of
 * step (memcached may have dropped part of the request): broken. */
static int server_error(struct pcb_net_conn *c, const char *what,
			const char *line, size_t len)
{
	char text[160];

	pcb_net_fail(c, -EREMOTEIO, "%s: %s", what,
		     pcb_net_show(line, len, text, sizeof(text)));
	c->broken = true;
	return -EREMOTEIO;
}

static bool starts(const char *line, size_t len, const char *word)
{
	size_t n = strlen(word);

	return len >= n && memcmp(line, word, n) == 0;
}

static bool is_error(const char *line, size_t len)
{
	return (len == 5 && memcmp(line, "ERROR", 5) == 0) ||
	       starts(line, len, "CLIENT_ERROR") ||
	       starts(line, len, "SERVER_ERROR");
}

static int bad_reply(struct pcb_net_conn *c, const char *what,
		     const char *line, size_t len)
{
	char text[64];

	return pcb_net_fail(c, -EPROTO, "%s: unexpected reply '%s'", what,
			    pcb_net_show(line, len, text, sizeof(text)));
}

/* Next space-separated token of line[*pos..len). */
static bool token(const char *line, size_t len, size_t *pos, const char **t,
		  size_t *tlen)
{
	size_t p = *pos;

	while (p < len && line[p] == ' ')
		p++;
	size_t s = p;
	while (p < len && line[p] != ' ')
		p++;
	*t = line + s;
	*tlen = p - s;
	*pos = p;
	return p > s;
}

/*
 * One `VALUE <key> <flags> <bytes>[ <cas>]` line: the key's index (from
 * *next on: memcached answers in request order) and the value's length.
 */
static int value_line(struct pcb_net_conn *c, const char *line, size_t len,
		      char *const *keys, const size_t *keylens, size_t n,
		      size_t *next, size_t *idx, uint64_t *bytes)
{
	size_t pos = 6, kl, fl, bl;
	const char *k, *f, *b;
	int64_t v;

	if (!token(line, len, &pos, &k, &kl) ||
	    !token(line, len, &pos, &f, &fl) ||
	    !token(line, len, &pos, &b, &bl) ||
	    pcb_net_parse_int(b, bl, &v) < 0 || v < 0 ||
	    (uint64_t)v > PCB_NET_VALUE_MAX)
		return bad_reply(c, "get", line, len);
	for (size_t i = *next; i < n; i++) {
		if (keylens[i] == kl && memcmp(keys[i], k, kl) == 0) {
			*idx = i;
			*next = i + 1;
			*bytes = (uint64_t)v;
			return 0;
		}
	}
	char show[64];
	return pcb_net_fail(c, -EPROTO, "get: VALUE for key '%s', not asked "
			    "for (or out of order)",
			    pcb_net_show(k, kl, show, sizeof(show)));
}

static int mc_get(struct pcb_conn *base, char *const *keys,
		  const size_t *keylens, size_t n, size_t *hits)
{
	struct pcb_net_conn *c = (struct pcb_net_conn *)base;
	uint64_t page = c->proc->page_bytes;
	size_t next = 0;
	int rc;

	if ((rc = mc_begin(c, keys, keylens, n, hits)) <= 0)
		return rc;
	pcb_net_out_bytes(&c->out, "get", 3);
	for (size_t i = 0; i < n; i++) {
		pcb_net_out_bytes(&c->out, " ", 1);
		pcb_net_out_bytes(&c->out, keys[i], keylens[i]);
	}
	pcb_net_out_bytes(&c->out, "\r\n", 2);
	if ((rc = pcb_net_send(c, "get")) < 0)
		return rc;
	for (;;) {
		const char *line;
		size_t len, i = 0;
		uint64_t bytes = 0;
		if ((rc = pcb_net_read_line(c, &line, &len)) < 0)
			return pcb_net_fail(c, rc, "get reply");
		if (len == 3 && memcmp(line, "END", 3) == 0)
			return 0;
		if (is_error(line, len))
			return server_error(c, "get", line, len);
		if (!starts(line, len, "VALUE "))
			return bad_reply(c, "get", line, len);
		if ((rc = value_line(c, line, len, keys, keylens, n, &next, &i,
				     &bytes)) < 0)
			return rc;
		uint8_t *slot = bytes == page ? c->base.buf + i * page : NULL;
		if ((rc = pcb_net_read_exact(c, slot, bytes)) < 0 ||
		    (rc = pcb_net_read_crlf(c)) < 0)
			return pcb_net_fail(c, rc, "get: value of key %zu (%"
					    PRIu64 " bytes)", i, bytes);
		if (slot)
			(*hits)++;
	}
}

/* `cmd key`, or `cmd key 0 0 <bytes>` before a value. */
static void head(struct pcb_net_out *o, const char *cmd, const char *key,
		 size_t keylen, bool values, uint64_t value_bytes)
{
	pcb_net_out_fmt(o, "%s ", cmd);
	pcb_net_out_bytes(o, key, keylen);
	if (values)
		pcb_net_out_fmt(o, " 0 0 %" PRIu64 "\r\n", value_bytes);
	else
		pcb_net_out_bytes(o, "\r\n", 2);
}

/*
 * set and exists: one command per key, each reply hit (the word hit), miss
 * (the word miss; for set also SERVER_ERROR: the item was refused, its
 * value read past) or an error of the call. hits are all of them (leading
 * false) or the run from the first.
 */
static int pipeline(struct pcb_conn *base, char *const *keys,
		    const size_t *keylens, size_t n, size_t *hits,
		    const char *cmd, bool values, const char *hit,
		    const char *miss, bool leading)
{
	struct pcb_net_conn *c = (struct pcb_net_conn *)base;
	bool run = true, noted = false;
	int rc;

	if ((rc = mc_begin(c, keys, keylens, n, hits)) <= 0 ||
	    (rc = pcb_net_send_each(c, cmd, keys, keylens, n, values,
				     head)) < 0)
		return rc;
	for (size_t i = 0; i < n; i++) {
		const char *line;
		size_t len;
		char text[120];
		if ((rc = pcb_net_read_line(c, &line, &len)) < 0)
			return pcb_net_fail(c, rc, "%s reply %zu", cmd, i);
		if (len == strlen(hit) && memcmp(line, hit, len) == 0) {
			if (run || !leading)
				(*hits)++;
			continue;
		}
		run = false;
		if (len == strlen(miss) && memcmp(line, miss, len) == 0)
			continue;
		if (!values || !starts(line, len, "SERVER_ERROR"))
			return is_error(line, len)
				       ? server_error(c, cmd, line, len)
				       : bad_reply(c, cmd, line, len);
		if (!noted) /* the first refusal, for the log */
			pcb_net_note(c, "%s of key %zu refused: %s (pages of %"
				     PRIu64 " bytes; a memcached item, its "
				     "header and key included, is at most 1 "
				     "MiB unless started with -I)", cmd, i,
				     pcb_net_show(line, len, text,
						  sizeof(text)),
				     c->proc->page_bytes);
		noted = true;
	}
	return 0;
}

static int mc_set(struct pcb_conn *base, char *const *keys,
		  const size_t *keylens, size_t n, size_t *hits)
{
	return pipeline(base, keys, keylens, n, hits, "set", true, "STORED",
			"NOT_STORED", false);
}

static int mc_exists(struct pcb_conn *base, char *const *keys,
		     const size_t *keylens, size_t n, size_t *hits)
{
	return pipeline(base, keys, keylens, n, hits, "mg", false, "HD", "EN",
			true);
}

const struct pcb_backend pcb_be_memcached = {
	.target = "memcached",
	.via = "memcache",
	.proc_open = mc_proc_open,
	.proc_close = pcb_net_proc_close,
	.conn_open = pcb_net_conn_open,
	.conn_close = pcb_net_conn_close,
	.get = mc_get,
	.set = mc_set,
	.exists = mc_exists,
};
