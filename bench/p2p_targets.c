/*
 * bench/p2p_targets.c — pc-p2p-bench's targets: each target's issue and
 * complete (p2p, redis, memcached, tcp, dir, kvget), which the workers'
 * loop in p2p_bench.c calls, and the data port's wire structs the p2p
 * target uses.
 *
 * Owns: nothing; issue and complete run on each worker's thread, over the
 * worker's own connections and buffers, and only read struct bench.
 *
 * Checks, all cheap and all on the hot path: framing bytes are exactly what a
 * hit looks like (kvget: the reply's framing when every key is a hit); the
 * data response's magic, status, id and length; the page
 * header's magic, generation and length against the record; and for every
 * value target except tcp the first and last 8 bytes of each payload, stamped
 * at setup with the key's number (a reply for the wrong key fails the run).
 * A failure returns -errno with a message in wire_err that names the item.
 *
 * Invariants: no allocation (the worker's buffers are sized before it
 * starts); payload lengths must equal what was stored; an item's framing
 * fits in ITEM_TAIL_OFF bytes (asserted below, next to the wire structs).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>

#include "p2p_bench.h"

/* The data port (docs/protocol.md "Data port"), little-endian. */
#define DP_MAGIC_REQ 0x31444350u  /* "PCD1" */
#define DP_MAGIC_RESP 0x31524350u /* "PCR1" */
#define DP_OP_READ 1
#define PAGE_MAGIC 0x31504350u    /* "PCP1" */
#define PAGE_HDR_BYTES 64u

struct dp_req {
	uint32_t magic;
	uint16_t op;
	uint16_t flags;
	uint32_t rkey;
	uint32_t len;
	uint64_t addr;
	uint64_t id;
};
_Static_assert(sizeof(struct dp_req) == 32, "data request is 32 bytes");

struct dp_resp {
	uint32_t magic;
	int32_t status;
	uint64_t id;
	uint64_t len;
};
_Static_assert(sizeof(struct dp_resp) == 24, "data response is 24 bytes");

struct page_hdr {
	uint32_t magic;
	uint16_t version;
	uint16_t flags;
	uint64_t key_hi;
	uint64_t key_lo;
	uint64_t gen;
	uint64_t len;
	uint64_t checksum;
	uint8_t pad[16];
};
_Static_assert(sizeof(struct page_hdr) == PAGE_HDR_BYTES, "page header is 64 bytes");
_Static_assert(sizeof(struct dp_resp) + PAGE_HDR_BYTES <= ITEM_TAIL_OFF &&
	       KEY_BYTES_MAX + 40 <= ITEM_TAIL_OFF,
	       "an item's framing (data headers, \"VALUE <key> 0 <N>\") fits its area");

/* ------------------------------------------------ batches, per target ---- */

static uint64_t rng_next(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545f4914f6cdd1dull;
}

/* batch distinct random keys of pool p: a partial Fisher-Yates shuffle that
 * carries on from the previous draw, O(batch) and uniform. */
static void pick_keys(struct worker *w, struct slot *s, unsigned p)
{
	unsigned n = w->b->npool[p], *perm = w->perm[p];
	for (unsigned i = 0; i < w->b->o.batch; i++) {
		unsigned j = i + (unsigned)(((rng_next(&w->rng) >> 32) * (n - i)) >> 32);
		unsigned t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
		s->keys[i] = perm[i];
	}
}

static uint8_t *item_dst(const struct worker *w, const struct slot *s, unsigned j)
{
	return s->dst + (size_t)j * w->b->o.value_bytes;
}

/* --- p2p ---------------------------------------------------------------- */

/* dir.get of the slot's keys on their owners; the records go to s->recs. */
static int p2p_lookup(struct worker *w, struct slot *s)
{
	struct bench *b = w->b;
	unsigned batch = b->o.batch;
	uint32_t ids[MEMBERS_MAX];
	unsigned cnt[MEMBERS_MAX] = {0};
	int ret;
	for (unsigned j = 0; j < batch; j++)
		cnt[b->recs[s->keys[j]].owner]++;
	for (unsigned m = 0; m < b->nmembers; m++) {
		if (!cnt[m])
			continue;
		ids[m] = ++w->msgid;
		wire_rpc_begin(&w->req, ids[m], "dir.get");
		wire_mp_array(&w->req, 1);
		wire_mp_array(&w->req, cnt[m]);
		for (unsigned j = 0; j < batch; j++) {
			unsigned k = s->keys[j];
			if (b->recs[k].owner == m)
				wire_mp_str(&w->req, b->name[k], b->name_len[k]);
		}
		if ((ret = wire_send(&w->rpc[m], w->req.p, w->req.len)) < 0)
			return ret;
	}
	for (unsigned m = 0; m < b->nmembers; m++) {
		struct wire_rd r;
		uint64_t n;
		if (!cnt[m])
			continue;
		if ((ret = wire_rpc_reply(&w->rpc[m], "dir.get", ids[m], &r)) < 0)
			return ret;
		if (wire_rd_array(&r, &n) < 0 || n != cnt[m])
			return wire_fail(EPROTO, "dir.get: expected %u entries", cnt[m]);
		for (unsigned j = 0; j < batch; j++) {
			unsigned k = s->keys[j];
			if (b->recs[k].owner != m)
				continue;
			if (wire_rd_nil(&r))
				return wire_fail(ENOENT, "dir.get: %s not found",
						 b->name[k]);
			if ((ret = setup_rec_read(b, &r, &s->recs[j], false)) < 0)
				return ret;
			if (s->recs[j].len != b->o.value_bytes)
				return wire_fail(EPROTO, "dir.get: %s is %u bytes now",
						 b->name[k], s->recs[j].len);
		}
	}
	return 0;
}

int target_p2p_issue(struct worker *w, struct slot *s)
{
	struct bench *b = w->b;
	int ret;
	pick_keys(w, s, 0);
	if (b->o.lookup) {
		if ((ret = p2p_lookup(w, s)) < 0)
			return ret;
	} else {
		for (unsigned j = 0; j < b->o.batch; j++)
			s->recs[j] = b->recs[s->keys[j]];
	}
	s->id_base = w->seq;
	w->seq += b->o.batch;
	/* Per data endpoint, its items in batch order: one send each. */
	for (unsigned p = 0; p < b->npeers; p++) {
		w->req.len = 0;
		for (unsigned j = 0; j < b->o.batch; j++) {
			const struct rec *r = &s->recs[j];
			if (r->peer != p)
				continue;
			struct dp_req q = {
				.magic = htole32(DP_MAGIC_REQ),
				.op = htole16(DP_OP_READ),
				.rkey = htole32(r->rkey),
				.len = htole32(PAGE_HDR_BYTES + r->len),
				.addr = htole64(r->addr),
				.id = htole64(s->id_base + j),
			};
			wire_buf_put(&w->req, &q, sizeof(q));
		}
		if (w->req.len && (ret = wire_send(&w->data[p], w->req.p, w->req.len)) < 0)
			return ret;
	}
	return 0;
}

/* Checks the items of endpoint p whose bytes all arrived (got of them). */
static int p2p_check(struct worker *w, struct slot *s, unsigned p, size_t got)
{
	const struct bench *b = w->b;
	size_t off = 0;
	for (unsigned j = 0; j < b->o.batch; j++) {
		const struct rec *r = &s->recs[j];
		if (r->peer != p)
			continue;
		const uint8_t *h = s->hdr + (size_t)j * ITEM_HDR_BYTES;
		struct dp_resp q;
		struct page_hdr ph;
		if (off + sizeof(q) > got)
			return 0;
		memcpy(&q, h, sizeof(q));
		if (le32toh(q.magic) != DP_MAGIC_RESP)
			return wire_fail(EPROTO, "%s: read of %s: not a data response",
					 w->data[p].name, b->name[s->keys[j]]);
		if (le64toh(q.id) != s->id_base + j)
			return wire_fail(EPROTO, "%s: read of %s: response id %" PRIu64
					 ", expected %" PRIu64, w->data[p].name,
					 b->name[s->keys[j]], (uint64_t)le64toh(q.id),
					 s->id_base + j);
		if ((int32_t)le32toh((uint32_t)q.status) != 0)
			return wire_fail(EPROTO, "%s: read of %s refused: %s",
					 w->data[p].name, b->name[s->keys[j]],
					 strerror(-(int32_t)le32toh((uint32_t)q.status)));
		if (le64toh(q.len) != PAGE_HDR_BYTES + r->len)
			return wire_fail(EPROTO, "%s: read of %s: %" PRIu64 " bytes, "
					 "expected %u", w->data[p].name,
					 b->name[s->keys[j]], (uint64_t)le64toh(q.len),
					 PAGE_HDR_BYTES + r->len);
		off += sizeof(q) + PAGE_HDR_BYTES + r->len;
		if (off > got)
			return 0;
		memcpy(&ph, h + sizeof(q), sizeof(ph));
		if (le32toh(ph.magic) != PAGE_MAGIC || le64toh(ph.len) != r->len ||
		    le64toh(ph.gen) != r->gen)
			return wire_fail(ESTALE, "%s: %s: page header does not match the "
					 "record (magic %08x, gen %" PRIu64 "/%" PRIu64
					 ", len %" PRIu64 "/%u)", w->data[p].name,
				    b->name[s->keys[j]], le32toh(ph.magic),
				    (uint64_t)le64toh(ph.gen), r->gen,
				    (uint64_t)le64toh(ph.len), r->len);
		if (!setup_value_ok(b, item_dst(w, s, j), s->keys[j]))
			return wire_fail(EPROTO, "%s: %s: payload of another key",
					 w->data[p].name, b->name[s->keys[j]]);
	}
	return 0;
}

int target_p2p_complete(struct worker *w, struct slot *s, struct slot **done)
{
	const struct bench *b = w->b;
	*done = s;
	for (unsigned p = 0; p < b->npeers; p++) {
		unsigned n = 0;
		for (unsigned j = 0; j < b->o.batch; j++) {
			if (s->recs[j].peer != p)
				continue;
			uint8_t *h = s->hdr + (size_t)j * ITEM_HDR_BYTES;
			w->iov[n++] = (struct iovec){h, sizeof(struct dp_resp) +
							 PAGE_HDR_BYTES};
			w->iov[n++] = (struct iovec){item_dst(w, s, j),
						     s->recs[j].len};
		}
		if (!n)
			continue;
		size_t got;
		int ret = wire_recv_iov(&w->data[p], w->iov, n, &got);
		int chk = p2p_check(w, s, p, got);
		if (chk < 0 || ret < 0)
			return chk < 0 ? chk : ret;
	}
	return 0;
}

/* --- redis, memcached ---------------------------------------------------- */

/* Text framing is built with memcpy, not snprintf: the client's CPU is the
 * servers' CPU on this machine, and every target should cost it alike. */
static size_t put_dec(char *out, uint64_t v)
{
	char t[24];
	size_t n = 0;
	do
		t[n++] = (char)('0' + v % 10);
	while ((v /= 10));
	for (size_t i = 0; i < n; i++)
		out[i] = t[n - 1 - i];
	return n;
}

int target_redis_issue(struct worker *w, struct slot *s)
{
	const struct bench *b = w->b;
	char t[KEY_BYTES_MAX + 40];
	pick_keys(w, s, 0);
	w->req.len = 0;
	for (unsigned j = 0; j < b->o.batch; j++) {
		unsigned k = s->keys[j];
		size_t n = sizeof("*2\r\n$3\r\nGET\r\n$") - 1;
		memcpy(t, "*2\r\n$3\r\nGET\r\n$", n);
		n += put_dec(t + n, b->name_len[k]);
		memcpy(t + n, "\r\n", 2);
		memcpy(t + n + 2, b->name[k], b->name_len[k]);
		n += 2 + b->name_len[k];
		memcpy(t + n, "\r\n", 2);
		wire_buf_put(&w->req, t, n + 2);
	}
	return wire_send(&w->srv, w->req.p, w->req.len);
}

int target_mc_issue(struct worker *w, struct slot *s)
{
	const struct bench *b = w->b;
	pick_keys(w, s, 0);
	w->req.len = 0;
	wire_buf_put(&w->req, "get", 3);
	for (unsigned j = 0; j < b->o.batch; j++) {
		unsigned k = s->keys[j];
		wire_buf_put(&w->req, " ", 1);
		wire_buf_put(&w->req, b->name[k], b->name_len[k]);
	}
	wire_buf_put(&w->req, "\r\n", 2);
	return wire_send(&w->srv, w->req.p, w->req.len);
}

/* What a hit of item j looks like before its value: "$N\r\n" (redis) or
 * "VALUE <key> 0 N\r\n" (memcached); out holds ITEM_TAIL_OFF bytes. */
static size_t text_head(const struct worker *w, const struct slot *s,
			unsigned j, char *out)
{
	const struct bench *b = w->b;
	unsigned k = s->keys[j];
	if (b->o.target == T_REDIS) {
		memcpy(out, w->size_text, w->size_text_len);
		return w->size_text_len;
	}
	memcpy(out, "VALUE ", 6);
	memcpy(out + 6, b->name[k], b->name_len[k]);
	memcpy(out + 6 + b->name_len[k], w->size_text, w->size_text_len);
	return 6 + b->name_len[k] + w->size_text_len;
}

/* redis: "$N\r\n" value "\r\n" per key; memcached: "VALUE k 0 N\r\n" value
 * "\r\n" per key, then "END\r\n". */
int target_text_complete(struct worker *w, struct slot *s, struct slot **done)
{
	const struct bench *b = w->b;
	*done = s;
	bool mc = b->o.target == T_MEMCACHED;
	char want[ITEM_TAIL_OFF], shown[160];
	size_t hl[BATCH_MAX];
	unsigned n = 0;
	for (unsigned j = 0; j < b->o.batch; j++) {
		uint8_t *h = s->hdr + (size_t)j * ITEM_HDR_BYTES;
		hl[j] = text_head(w, s, j, want);
		w->iov[n++] = (struct iovec){h, hl[j]};
		w->iov[n++] = (struct iovec){item_dst(w, s, j), b->o.value_bytes};
		w->iov[n++] = (struct iovec){h + ITEM_TAIL_OFF, 2};
	}
	uint8_t *end = s->hdr + (size_t)b->o.batch * ITEM_HDR_BYTES;
	if (mc)
		w->iov[n++] = (struct iovec){end, 5};
	size_t got, off = 0;
	int ret = wire_recv_iov(&w->srv, w->iov, n, &got);
	for (unsigned j = 0; j < b->o.batch && off < got; j++) {
		const uint8_t *h = s->hdr + (size_t)j * ITEM_HDR_BYTES;
		unsigned k = s->keys[j];
		size_t have = PC_MIN(hl[j], got - off);
		text_head(w, s, j, want);
		/* Even a partial head can show a miss ("$-1", no VALUE line). */
		if (memcmp(h, want, have) != 0)
			return wire_fail(EPROTO, "%s: %s: expected \"%.*s...\", got \"%s"
					 "...\" (a miss?)", w->srv.name, b->name[k],
					 (int)(hl[j] - 2), want,
					 wire_show(h, have, shown, sizeof(shown)));
		off += hl[j] + b->o.value_bytes + 2;
		if (off > got)
			return ret;
		if (memcmp(h + ITEM_TAIL_OFF, "\r\n", 2) != 0 ||
		    !setup_value_ok(b, item_dst(w, s, j), k))
			return wire_fail(EPROTO, "%s: %s: wrong value", w->srv.name,
					 b->name[k]);
	}
	if (mc && off + 5 <= got && memcmp(end, "END\r\n", 5) != 0)
		return wire_fail(EPROTO, "%s: multi-get not closed by END", w->srv.name);
	return ret;
}

/* --- tcp ----------------------------------------------------------------- */

int target_tcp_issue(struct worker *w, struct slot *s)
{
	(void)s; /* every batch asks the same */
	uint64_t ask = htole64((uint64_t)w->b->o.batch * w->b->o.value_bytes);
	return wire_send(&w->srv, &ask, sizeof(ask));
}

int target_tcp_complete(struct worker *w, struct slot *s, struct slot **done)
{
	size_t got;
	*done = s;
	w->iov[0] = (struct iovec){s->dst,
				   (size_t)w->b->o.batch * w->b->o.value_bytes};
	return wire_recv_iov(&w->srv, w->iov, 1, &got);
}

/* --- dir ----------------------------------------------------------------- */

int target_dir_issue(struct worker *w, struct slot *s)
{
	const struct bench *b = w->b;
	unsigned p = w->next_pool++ % b->npools;
	pick_keys(w, s, p);
	s->msgid = ++w->msgid;
	wire_rpc_begin(&w->req, s->msgid, "dir.get");
	wire_mp_array(&w->req, 1);
	wire_mp_array(&w->req, b->o.batch);
	for (unsigned j = 0; j < b->o.batch; j++)
		wire_mp_str(&w->req, b->name[s->keys[j]], b->name_len[s->keys[j]]);
	return wire_send(&w->rpc[b->recs[s->keys[0]].owner], w->req.p, w->req.len);
}

/* Replies on one connection may come back in any order: the one that came
 * is matched by msgid among the slots in flight to that member. */
int target_dir_complete(struct worker *w, struct slot *oldest, struct slot **done)
{
	struct bench *b = w->b;
	unsigned m = b->recs[oldest->keys[0]].owner;
	struct wire_conn *c = &w->rpc[m];
	const uint8_t *obj;
	size_t len;
	uint64_t n, type, id;
	int ret = wire_read_obj(c, &obj, &len);
	if (ret < 0)
		return ret;
	struct wire_rd r = {obj, obj + len};
	if (wire_rd_array(&r, &n) < 0 || n != 4 || wire_rd_uint(&r, &type) < 0 ||
	    type != 1 || wire_rd_uint(&r, &id) < 0)
		return wire_fail(EPROTO, "%s: not a MessagePack-RPC response", c->name);
	struct slot *s = NULL;
	for (unsigned i = 0; i < w->nfifo && !s; i++) {
		struct slot *t = &w->slots[w->fifo[i]];
		if (t->msgid == id && b->recs[t->keys[0]].owner == m)
			s = t;
	}
	if (!s)
		return wire_fail(EPROTO, "%s: reply for msgid %" PRIu64 ", not in flight",
				 c->name, id);
	if (!wire_rd_nil(&r) || wire_rd_array(&r, &n) < 0 || n != b->o.batch)
		return wire_fail(EPROTO, "%s: dir.get failed or answered the wrong "
				 "count", c->name);
	/* The records checked against are the bench's own table, scattered
	 * over the working set: fetch them while the reply is parsed, so the
	 * check costs the reader no cache miss per key (the other targets'
	 * checks read no table). */
	for (unsigned j = 0; j < b->o.batch; j++)
		__builtin_prefetch(&b->recs[s->keys[j]]);
	for (unsigned j = 0; j < b->o.batch; j++) {
		const struct rec *want = &b->recs[s->keys[j]];
		struct rec got;
		if (wire_rd_nil(&r))
			return wire_fail(ENOENT, "%s: dir.get: %s not found", c->name,
					 b->name[s->keys[j]]);
		if ((ret = setup_rec_read(b, &r, &got, false)) < 0)
			return ret;
		if (got.addr != want->addr || got.gen != want->gen ||
		    got.len != want->len)
			return wire_fail(ESTALE, "%s: dir.get: %s changed since setup",
					 c->name, b->name[s->keys[j]]);
	}
	*done = s;
	return 0;
}

/* --- kvget --------------------------------------------------------------- */

/* The head of the node's reply when every key is a hit: [1, msgid, nil,
 * [ with msgpack-c's smallest encodings (how the node packs); its length. */
static size_t kvget_reply_head(uint8_t *out, uint32_t msgid, unsigned batch)
{
	size_t n = 0;
	out[n++] = 0x94;
	out[n++] = 0x01;
	if (msgid < 128)
		out[n++] = (uint8_t)msgid;
	else
		n += msgid <= 0xff ? wire_put_field(out + n, 0xcc, msgid, 1)
		     : msgid <= 0xffff ? wire_put_field(out + n, 0xcd, msgid, 2)
				       : wire_put_field(out + n, 0xce, msgid, 4);
	out[n++] = 0xc0;
	n += batch < 16 ? wire_put_field(out + n, (uint8_t)(0x90 | batch), 0, 0)
			: wire_put_field(out + n, 0xdc, batch, 2);
	return n;
}

/* A value's bin header, as the node packs it: the same for every item. */
size_t target_kvget_bin_head(char *out, uint64_t value_bytes)
{
	uint8_t *o = (uint8_t *)out;
	return value_bytes <= 0xff ? wire_put_field(o, 0xc4, value_bytes, 1)
	       : value_bytes <= 0xffff ? wire_put_field(o, 0xc5, value_bytes, 2)
				       : wire_put_field(o, 0xc6, value_bytes, 4);
}

int target_kvget_issue(struct worker *w, struct slot *s)
{
	const struct bench *b = w->b;
	pick_keys(w, s, 0);
	s->msgid = ++w->msgid;
	wire_rpc_begin(&w->req, s->msgid, "kv.get");
	wire_mp_array(&w->req, 1);
	wire_mp_array(&w->req, b->o.batch);
	for (unsigned j = 0; j < b->o.batch; j++)
		wire_mp_str(&w->req, b->name[s->keys[j]], b->name_len[s->keys[j]]);
	return wire_send(&w->srv, w->req.p, w->req.len);
}

/* The reply is received in place: its head into the slot's last header
 * area, each value's bin header into the item's, the value into its
 * destination. Anything but the framing of all hits (a miss, an error, a
 * reply to another call) fails the run, naming what came instead. */
int target_kvget_complete(struct worker *w, struct slot *s, struct slot **done)
{
	const struct bench *b = w->b;
	uint8_t want[16], *end = s->hdr + (size_t)b->o.batch * ITEM_HDR_BYTES;
	size_t hn = kvget_reply_head(want, s->msgid, b->o.batch), got, off;
	size_t bn = w->size_text_len;
	char shown[96];
	unsigned n = 0;
	*done = s;
	w->iov[n++] = (struct iovec){end, hn};
	for (unsigned j = 0; j < b->o.batch; j++) {
		w->iov[n++] = (struct iovec){s->hdr + (size_t)j * ITEM_HDR_BYTES, bn};
		w->iov[n++] = (struct iovec){item_dst(w, s, j), b->o.value_bytes};
	}
	int ret = wire_recv_iov(&w->srv, w->iov, n, &got);
	if (memcmp(end, want, PC_MIN(hn, got)) != 0)
		return wire_fail(EPROTO, "%s: kv.get: not the reply of all hits to "
				 "msgid %u: %s...", w->srv.name, s->msgid,
				 wire_show(end, PC_MIN(hn, got), shown, sizeof(shown)));
	off = hn;
	for (unsigned j = 0; j < b->o.batch && off < got; j++) {
		const uint8_t *h = s->hdr + (size_t)j * ITEM_HDR_BYTES;
		unsigned k = s->keys[j];
		if (memcmp(h, w->size_text, PC_MIN(bn, got - off)) != 0)
			return wire_fail(EPROTO, "%s: kv.get: %s: not a %" PRIu64
					 "-byte value (a miss?): %s", w->srv.name,
					 b->name[k], b->o.value_bytes,
					 wire_show(h, PC_MIN(bn, got - off), shown,
						   sizeof(shown)));
		off += bn + b->o.value_bytes;
		if (off > got)
			return ret;
		if (!setup_value_ok(b, item_dst(w, s, j), k))
			return wire_fail(EPROTO, "%s: kv.get: %s: payload of another key",
					 w->srv.name, b->name[k]);
	}
	return ret;
}
