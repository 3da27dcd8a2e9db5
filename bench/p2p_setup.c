/*
 * bench/p2p_setup.c — pc-p2p-bench's setup: the keys and their stamped
 * values, storing them (kv.set on a node, SET/set on redis/memcached),
 * learning the members and every key's record (cluster.members, dir.get),
 * which keys a slotmap node holds (slot.probe, kvget --held-by), and the
 * key pools the batches draw from.
 *
 * Owns: nothing after it returns but what it fills in struct bench. Runs on
 * the main thread before any worker starts; setup_value_ok and
 * setup_rec_read are also called by the workers (they only read b, or
 * append to b->peers at setup only: may_add is false on workers).
 *
 * Invariants: every key's value carries its stamp in the first and last 8
 * bytes; every member and data endpoint the node names must be on loopback;
 * every key must be known to some directory owner with a payload of
 * value_bytes before a run starts.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "p2p_bench.h"

/* --------------------------------------------------- keys and values ---- */

/* Parses "host:port" with a loopback IPv4 host. */
static int addr_parse(const char *s, size_t n, struct addr *a)
{
	if (n == 0 || n >= sizeof(a->text))
		return wire_fail(EINVAL, "address of %zu bytes", n);
	memcpy(a->text, s, n);
	a->text[n] = '\0';
	const char *colon = strrchr(a->text, ':');
	char *end;
	unsigned long port = colon ? strtoul(colon + 1, &end, 10) : 0;
	size_t hl = colon ? (size_t)(colon - a->text) : 0;
	if (!colon || *end || port == 0 || port > 65535 || hl == 0 ||
	    hl >= sizeof(a->host))
		return wire_fail(EINVAL, "'%s' is not host:port", a->text);
	memcpy(a->host, a->text, hl);
	a->host[hl] = '\0';
	a->port = (uint16_t)port;
	if (!wire_host_ok(a->host))
		return wire_fail(EINVAL, "'%s' is not on loopback; this tool talks to"
				 " 127.0.0.0/8 only", a->text);
	return 0;
}

/* The stamp of key k: in the first and last 8 bytes of its value. */
static uint64_t stamp(const struct bench *b, unsigned k)
{
	return (0x9e3779b97f4a7c15ull * (k + 1)) ^ b->o.value_bytes;
}

static void value_fill(const struct bench *b, uint8_t *dst, unsigned k)
{
	uint64_t st = stamp(b, k);
	size_t n = b->o.value_bytes;
	memset(dst, 'a' + (int)(k % 26), n);
	memcpy(dst, &st, 8);
	memcpy(dst + n - 8, &st, 8);
}

bool setup_value_ok(const struct bench *b, const uint8_t *p, unsigned k)
{
	uint64_t st = stamp(b, k), a, z;
	memcpy(&a, p, 8);
	memcpy(&z, p + b->o.value_bytes - 8, 8);
	return a == st && z == st;
}

void setup_keys_make(struct bench *b)
{
	b->name = pc_xcalloc(b->nkeys, KEY_BYTES_MAX);
	b->name_len = pc_xcalloc(b->nkeys, 1);
	for (unsigned k = 0; k < b->nkeys; k++) {
		int n = snprintf(b->name[k], KEY_BYTES_MAX, "%s:%" PRIu64 ":%u",
				 b->o.prefix, b->o.value_bytes, k);
		PC_ASSERT(n > 0 && n < (int)KEY_BYTES_MAX);
		b->name_len[k] = (uint8_t)n;
	}
}

/* -------------------------------------------------------------- setup ---- */

static unsigned setup_keys_per_request(const struct bench *b)
{
	uint64_t n = SETUP_MSG_BYTES / (b->o.value_bytes + 128);
	return (unsigned)PC_MAX(1, PC_MIN(n, SETUP_CALL_KEYS));
}

/* kv.set of every key on the serving node, in calls under the message limit. */
int setup_p2p(struct bench *b, struct wire_conn *c)
{
	struct wire_buf w = {0};
	unsigned per = setup_keys_per_request(b);
	int ret = 0;
	for (unsigned k0 = 0, id = 1; k0 < b->nkeys && ret == 0; k0 += per, id++) {
		unsigned m = PC_MIN(per, b->nkeys - k0);
		wire_rpc_begin(&w, id, "kv.set");
		wire_mp_array(&w, 2);
		wire_mp_array(&w, m);
		for (unsigned k = k0; k < k0 + m; k++)
			wire_mp_str(&w, b->name[k], b->name_len[k]);
		wire_mp_array(&w, m);
		for (unsigned k = k0; k < k0 + m; k++) {
			wire_mp_bin_head(&w, b->o.value_bytes);
			wire_buf_reserve(&w, b->o.value_bytes);
			value_fill(b, w.p + w.len, k);
			w.len += b->o.value_bytes;
		}
		struct wire_rd r;
		uint64_t n;
		if ((ret = wire_send(c, w.p, w.len)) < 0 ||
		    (ret = wire_rpc_reply(c, "kv.set", id, &r)) < 0)
			break;
		if (wire_rd_array(&r, &n) < 0 || n != m) {
			ret = wire_fail(EPROTO, "kv.set: expected %u results", m);
			break;
		}
		for (unsigned k = k0; k < k0 + m && ret == 0; k++) {
			bool ok;
			if (wire_rd_bool(&r, &ok) < 0 || !ok)
				ret = wire_fail(ENOSPC, "kv.set refused %s (pool too small"
						" for the working set?)", b->name[k]);
		}
	}
	free(w.p);
	return ret;
}

/* SET (redis) or set (memcached) of every key, pipelined under the limit. */
int setup_text(struct bench *b, struct wire_conn *c, bool redis)
{
	static const char ok_redis[] = "+OK\r\n", ok_mc[] = "STORED\r\n";
	const char *ok = redis ? ok_redis : ok_mc;
	size_t okn = strlen(ok);
	unsigned per = setup_keys_per_request(b);
	struct wire_buf w = {0};
	uint8_t *replies = pc_xcalloc(per, okn);
	struct iovec iov = {0};
	char hdr[160], shown[96];
	int ret = 0;
	for (unsigned k0 = 0; k0 < b->nkeys && ret == 0; k0 += per) {
		unsigned m = PC_MIN(per, b->nkeys - k0);
		w.len = 0;
		for (unsigned k = k0; k < k0 + m; k++) {
			int n = redis ? snprintf(hdr, sizeof(hdr), "*3\r\n$3\r\nSET\r\n"
						 "$%u\r\n%s\r\n$%" PRIu64 "\r\n",
						 b->name_len[k], b->name[k],
						 b->o.value_bytes)
				      : snprintf(hdr, sizeof(hdr), "set %s 0 0 %"
						 PRIu64 "\r\n", b->name[k],
						 b->o.value_bytes);
			wire_buf_put(&w, hdr, (size_t)n);
			wire_buf_reserve(&w, b->o.value_bytes + 2);
			value_fill(b, w.p + w.len, k);
			w.len += b->o.value_bytes;
			wire_buf_put(&w, "\r\n", 2);
		}
		size_t got;
		iov = (struct iovec){replies, m * okn};
		if ((ret = wire_send(c, w.p, w.len)) < 0)
			break;
		int rret = wire_recv_iov(c, &iov, 1, &got);
		for (unsigned i = 0; i < m && (i + 1) * okn <= got && ret == 0; i++)
			if (memcmp(replies + i * okn, ok, okn) != 0)
				ret = wire_fail(EPROTO, "%s: storing %s: %s...", c->name,
						b->name[k0 + i],
						wire_show(replies + i * okn,
						PC_MIN(got - i * okn, 40), shown,
						sizeof(shown)));
		if (ret == 0)
			ret = rret;
	}
	free(w.p);
	free(replies);
	return ret;
}

/* Index of data endpoint text[0..n) in b->peers; adds it when may_add. */
static int peer_index(struct bench *b, const char *text, size_t n, bool may_add)
{
	for (unsigned i = 0; i < b->npeers; i++)
		if (strlen(b->peers[i].text) == n && !memcmp(b->peers[i].text, text, n))
			return (int)i;
	if (!may_add)
		return wire_fail(EPROTO, "a record names data endpoint %.*s, unknown at"
				 " setup", (int)n, text);
	if (b->npeers == MEMBERS_MAX)
		return wire_fail(ENOSPC, "more than %u data endpoints", MEMBERS_MAX);
	int ret = addr_parse(text, n, &b->peers[b->npeers]);
	return ret < 0 ? ret : (int)b->npeers++;
}

/* One record [node, data, addr, rkey, len, gen, resident]. */
int setup_rec_read(struct bench *b, struct wire_rd *r, struct rec *out,
		    bool may_add)
{
	uint64_t n, addr, rkey, len, gen;
	const char *node, *data;
	size_t nn, dn;
	bool resident;
	if (wire_rd_array(r, &n) < 0 || n != 7 || wire_rd_str(r, &node, &nn) < 0 ||
	    wire_rd_str(r, &data, &dn) < 0 || wire_rd_uint(r, &addr) < 0 ||
	    wire_rd_uint(r, &rkey) < 0 || wire_rd_uint(r, &len) < 0 ||
	    wire_rd_uint(r, &gen) < 0 || wire_rd_bool(r, &resident) < 0 ||
	    rkey > UINT32_MAX || len > UINT32_MAX)
		return wire_fail(EPROTO, "dir.get: a record is not [node, data, addr,"
				 " rkey, len, gen, resident]");
	int p = peer_index(b, data, dn, may_add);
	if (p < 0)
		return p;
	*out = (struct rec){.addr = addr, .gen = gen, .rkey = (uint32_t)rkey,
			    .len = (uint32_t)len, .peer = (uint8_t)p,
			    .found = true};
	return 0;
}

/* cluster.members -> b->members (every id a loopback host:port). */
static int learn_members(struct bench *b, struct wire_conn *c)
{
	struct wire_buf w = {0};
	struct wire_rd r;
	uint64_t n;
	int ret = wire_rpc_call0(c, &w, 1, "cluster.members", &r);
	free(w.p); /* r reads c's receive buffer, not w */
	if (ret < 0)
		return ret;
	if (wire_rd_array(&r, &n) < 0 || n == 0 || n > MEMBERS_MAX)
		return wire_fail(EPROTO, "cluster.members: expected 1..%u members",
				 MEMBERS_MAX);
	for (unsigned i = 0; i < n; i++) {
		struct lg_mp_head h;
		const char *id = NULL, *s;
		size_t idn = 0, sn;
		if (wire_rd_head(&r, &h) < 0 || h.kind != LG_MP_MAP)
			return wire_fail(EPROTO, "cluster.members: member %u is not"
					 " a map", i);
		for (uint64_t j = 0; j < h.val; j++) {
			if (wire_rd_str(&r, &s, &sn) < 0)
				return wire_fail(EPROTO, "cluster.members: a key is"
						 " not a str");
			if (sn == 2 && !memcmp(s, "id", 2)) {
				if (wire_rd_str(&r, &id, &idn) < 0)
					return wire_fail(EPROTO, "cluster.members:"
							 " id not a str");
			} else if (wire_rd_skip(&r) < 0) {
				return wire_fail(EPROTO, "cluster.members: malformed");
			}
		}
		if (!id)
			return wire_fail(EPROTO, "cluster.members: member %u has no id", i);
		if ((ret = addr_parse(id, idn, &b->members[i])) < 0)
			return ret;
	}
	b->nmembers = (unsigned)n;
	return 0;
}

/*
 * Learns every key's record: asks each member dir.get for all keys and keeps
 * the first record found, and which member answered it (the owner a reader
 * asks). Every key must be known to some owner, with a payload of
 * value_bytes.
 */
int setup_learn_records(struct bench *b, struct wire_conn *seed)
{
	int ret = learn_members(b, seed);
	if (ret < 0)
		return ret;
	b->recs = pc_xcalloc(b->nkeys, sizeof(*b->recs));
	struct wire_buf w = {0};
	for (unsigned m = 0; m < b->nmembers && ret == 0; m++) {
		struct wire_conn c;
		if ((ret = wire_conn_open(&c, "member", b->members[m].host,
					  b->members[m].port, b->o.timeout_ms)) < 0)
			break;
		for (unsigned k0 = 0, id = 1; k0 < b->nkeys && ret == 0;
		     k0 += DIR_CHUNK_KEYS, id++) {
			unsigned cnt = PC_MIN(DIR_CHUNK_KEYS, b->nkeys - k0);
			struct wire_rd r;
			uint64_t n;
			wire_rpc_begin(&w, id, "dir.get");
			wire_mp_array(&w, 1);
			wire_mp_array(&w, cnt);
			for (unsigned k = k0; k < k0 + cnt; k++)
				wire_mp_str(&w, b->name[k], b->name_len[k]);
			if ((ret = wire_send(&c, w.p, w.len)) < 0 ||
			    (ret = wire_rpc_reply(&c, "dir.get", id, &r)) < 0)
				break;
			if (wire_rd_array(&r, &n) < 0 || n != cnt) {
				ret = wire_fail(EPROTO, "dir.get: expected %u entries", cnt);
				break;
			}
			for (unsigned k = k0; k < k0 + cnt && ret == 0; k++) {
				struct rec rec;
				if (wire_rd_nil(&r))
					continue;
				if ((ret = setup_rec_read(b, &r, &rec, true)) < 0)
					break;
				if (!b->recs[k].found) {
					rec.owner = (uint8_t)m;
					b->recs[k] = rec;
				}
			}
		}
		wire_conn_close(&c);
	}
	free(w.p);
	for (unsigned k = 0; k < b->nkeys && ret == 0; k++) {
		if (!b->recs[k].found)
			ret = wire_fail(ENOENT, "no directory owner knows %s (stored? "
					"evicted?)", b->name[k]);
		else if (b->recs[k].len != b->o.value_bytes)
			ret = wire_fail(EPROTO, "%s: the record says %u bytes, not %"
					PRIu64, b->name[k], b->recs[k].len,
					b->o.value_bytes);
	}
	return ret;
}

/*
 * kvget --held-by: asks the node at o->held_port slot.probe [keys,
 * value_bytes] for every key (slotmap mode: the committed length of each
 * key's page in its own slots, 0 if none) and keeps in b->held which keys
 * it holds whole, so that a reader elsewhere reads each of them from that
 * one owner.
 */
int setup_learn_held(struct bench *b)
{
	struct wire_conn c;
	struct wire_buf w = {0};
	int ret = wire_conn_open(&c, "held-by node", b->o.host, b->o.held_port,
				 b->o.timeout_ms);
	if (ret < 0)
		return ret;
	b->held = pc_xcalloc(b->nkeys, sizeof(*b->held));
	for (unsigned k0 = 0, id = 1; k0 < b->nkeys && ret == 0;
	     k0 += SETUP_CALL_KEYS, id++) {
		unsigned cnt = PC_MIN(SETUP_CALL_KEYS, b->nkeys - k0);
		struct wire_rd r;
		uint64_t n, len;
		wire_rpc_begin(&w, id, "slot.probe");
		wire_mp_array(&w, 2);
		wire_mp_array(&w, cnt);
		for (unsigned k = k0; k < k0 + cnt; k++)
			wire_mp_str(&w, b->name[k], b->name_len[k]);
		wire_mp_uint(&w, b->o.value_bytes);
		if ((ret = wire_send(&c, w.p, w.len)) < 0 ||
		    (ret = wire_rpc_reply(&c, "slot.probe", id, &r)) < 0)
			break;
		if (wire_rd_array(&r, &n) < 0 || n != cnt) {
			ret = wire_fail(EPROTO, "slot.probe: expected %u lengths", cnt);
			break;
		}
		for (unsigned k = k0; k < k0 + cnt && ret == 0; k++) {
			if (wire_rd_uint(&r, &len) < 0)
				ret = wire_fail(EPROTO, "slot.probe: a length is not a uint");
			b->held[k] = len == b->o.value_bytes;
		}
	}
	wire_conn_close(&c);
	free(w.p);
	return ret;
}

/* The key pools batches draw from (see struct bench). */
int setup_pools_make(struct bench *b)
{
	b->npools = b->o.target == T_DIR ? b->nmembers : 1;
	for (unsigned p = 0; p < b->npools; p++)
		b->pool[p] = pc_xcalloc(b->nkeys, sizeof(unsigned));
	for (unsigned k = 0; k < b->nkeys; k++) {
		unsigned p = b->o.target == T_DIR ? b->recs[k].owner : 0;
		if (!b->held || b->held[k])
			b->pool[p][b->npool[p]++] = k;
	}
	/* Drop empty pools (a member that owns none of our keys). */
	unsigned kept = 0;
	for (unsigned p = 0; p < b->npools; p++) {
		if (b->npool[p] >= b->o.batch) {
			b->pool[kept] = b->pool[p];
			b->npool[kept++] = b->npool[p];
		} else {
			free(b->pool[p]);
		}
	}
	b->npools = kept;
	if (!kept)
		return wire_fail(EINVAL, "no owner holds --batch %u of the keys; raise"
				 " --keys%s", b->o.batch,
				 b->held ? " (or the --held-by node's slots)" : "");
	return 0;
}
