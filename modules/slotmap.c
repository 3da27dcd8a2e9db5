/*
 * modules/slotmap.c — slotmap mode (module "slotmap"): directory-free
 * placement. Every key has a fixed place, a bucket of the slot region of
 * its owner on the ring; a reader goes straight to the bytes with one read
 * of that bucket and checks them itself (storage/slot_region.h).
 *
 * Owns, on the owner's side: this node's slot region (anonymous memory,
 * pool_size bytes cut into the size classes of the settings), registered
 * with the transport twice — for reads by any peer under rkey, and for
 * writes under wkey, where a write is accepted only into the payload of a
 * way a writer claimed (the claims table below); the slot.* RPC methods
 * peers call (layout, claim, commit, probe, delete); the module's metrics
 * and lifecycle. The client side — the kv API of this mode, published as
 * the "kv" service — is modules/slotmap_kv.c.
 *
 * Inactive unless mode = slotmap: then kv (the p2p pool) stands aside and
 * this module is the "kv" service that kv.* and the local sessions use.
 *
 * A remote write (docs/slotmap.md "Writes"): the writer asks the owner to
 * claim ways (slot.claim: the owner's slot_write_begin, under the bucket's
 * lock — the owner serialises writers per bucket), writes the payloads
 * into them through the transport, then commits each with the XXH3 of the
 * bytes it meant to write (slot.commit). A claim lives claim_ttl (twice
 * rpc_timeout); one that is neither committed nor being written by then is
 * aborted (the way is emptied) by the sweep. A transport write is accepted
 * only while its claim lives, and only inside its payload, so a writer that
 * comes back late never touches a way another writer holds now; and since
 * the owner commits the writer's hash, not one of its own, bytes that are
 * not the writer's page never pass a reader's check.
 *
 * Threading: the region and the claims are shared by every reactor (the
 * region locks per bucket; the claims have one mutex, held for O(1) work).
 * Handlers run on the reactor that received the call.
 */
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/guard.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "common/util.h"
#include "modules/copier.h"
#include "modules/membership.h"
#include "modules/modules.h"
#include "modules/peer_health.h"
#include "modules/services.h"
#include "modules/slotmap_int.h"
#include "modules/transport.h"
#include "rpc/client.h"
#include "rpc/rpc.h"

#define LOG_MOD "slotmap"
#define SWEEP_MS 100

struct sm_state sm_st;

/* ------------------------------------------------------------ the claims */

/* The claim on one slot (claims.st[slot number]). */
struct sm_claim {
	bool live;
	uint32_t pins;     /* transport writes landing now */
	uint64_t deadline; /* pc_now_ns() after which the sweep aborts it */
	uint64_t at;       /* live: its place in claims.ix */
	struct slot_wr w;
};

static struct {
	pthread_mutex_t lock;
	struct sm_claim *st;  /* one per slot of the region */
	uint64_t *ix;         /* the live claims' slot numbers, [0, live) */
	uint64_t nslots;
	uint64_t first[SLOT_CLASSES_MAX]; /* slot number of each class's
					   * first slot */
	uint64_t live;        /* claims live now */
	uint64_t ttl_ns;
	struct rx_timer sweep; /* on reactor 0 */
	bool sweeping;
} cl;

/* The slot number of [addr, addr+len), which must lie in one slot's
 * payload area (from its header's end to its trailer), and the offset of
 * addr in the slot: 0, or -EFAULT. */
static int slot_of(uint64_t addr, uint64_t len, uint64_t *no, uint64_t *in)
{
	uint64_t base = (uintptr_t)sm_st.base;
	if (addr < base || addr - base >= sm_st.lay.bytes)
		return -EFAULT;
	uint64_t off = addr - base;
	int c = slot_class_at(&sm_st.lay, off);
	if (c < 0)
		return -EFAULT;
	const struct slot_class *k = &sm_st.lay.cls[c];
	uint64_t rel = off - k->offset;
	*no = cl.first[c] + rel / k->stride;
	*in = rel % k->stride;
	if (*in < SLOT_HDR_BYTES || *in + len > k->stride - SLOT_TRAILER_BYTES)
		return -EFAULT;
	return 0;
}

static int claims_init(void)
{
	uint64_t n = 0;
	for (uint32_t c = 0; c < sm_st.lay.nclasses; c++) {
		cl.first[c] = n;
		n += sm_st.lay.cls[c].buckets * sm_st.lay.cls[c].ways;
	}
	cl.nslots = n;
	cl.st = calloc(n, sizeof(*cl.st));
	cl.ix = calloc(n, sizeof(*cl.ix));
	if (!cl.st || !cl.ix) {
		free(cl.st);
		free(cl.ix);
		cl.st = NULL;
		cl.ix = NULL;
		return -ENOMEM;
	}
	pthread_mutex_init(&cl.lock, NULL);
	cl.ttl_ns = RX_MS(2 * (uint64_t)sm_st.timeout_ms);
	return 0;
}

/* A claim starts or ends living (cl.lock held). The sweep walks the live
 * ones only: a region can have millions of slots, and every remote write
 * takes cl.lock. */
static void claim_on(uint64_t no)
{
	cl.st[no].live = true;
	cl.st[no].at = cl.live;
	cl.ix[cl.live++] = no;
}

static void claim_off(uint64_t no)
{
	struct sm_claim *c = &cl.st[no];
	uint64_t last = cl.ix[--cl.live];
	cl.ix[c->at] = last;
	cl.st[last].at = c->at;
	c->live = false;
}

/* Pin hook of the write registration: a write must land in the payload of
 * a live claim, within its length. */
static int wpin(void *ctx, uintptr_t addr, uint64_t len, struct tp_pin *pin)
{
	(void)ctx;
	uint64_t no, in;
	if (slot_of(addr, len, &no, &in) < 0)
		return -EFAULT;
	int ret = -EACCES;
	pthread_mutex_lock(&cl.lock);
	struct sm_claim *c = &cl.st[no];
	if (c->live && c->deadline > pc_now_ns() &&
	    in - SLOT_HDR_BYTES + len <= c->w.len) {
		c->pins++;
		ret = 0;
	}
	pthread_mutex_unlock(&cl.lock);
	pin->a = no;
	pin->b = 0;
	return ret;
}

static void wunpin(void *ctx, const struct tp_pin *pin)
{
	(void)ctx;
	pthread_mutex_lock(&cl.lock);
	PC_ASSERT(cl.st[pin->a].pins > 0);
	cl.st[pin->a].pins--;
	pthread_mutex_unlock(&cl.lock);
}

/* Reads need no pin: the region never goes away while the node serves,
 * and readers judge what they get. */
static int rpin(void *ctx, uintptr_t addr, uint64_t len, struct tp_pin *pin)
{
	(void)ctx;
	(void)addr;
	(void)len;
	memset(pin, 0, sizeof(*pin));
	return 0;
}

static void runpin(void *ctx, const struct tp_pin *pin)
{
	(void)ctx;
	(void)pin;
}

/* A selected read of one bucket (the key's hash as selector): send the
 * way that holds the key's committed page, header and payload then its
 * trailer, or nothing — not the whole bucket. Readers check the selection
 * as they would the bucket (slot_judge_sel); a racing write is theirs to
 * reject. */
static int rselect(void *ctx, uintptr_t addr, uint64_t len,
		   const uint8_t sel[TP_SEL_BYTES], struct tp_piece *pieces,
		   unsigned *n)
{
	(void)ctx;
	uint64_t lo, hi;
	memcpy(&lo, sel, 8);
	memcpy(&hi, sel + 8, 8);
	struct slot_sel ss;
	uintptr_t base = (uintptr_t)sm_st.base;
	int ret = slot_pick(sm_st.reg, addr - base, len, le64toh(lo),
			    le64toh(hi), &ss);
	if (ret < 0)
		return 0; /* not one bucket: send the range as asked */
	*n = 0;
	if (ret == 0)
		return 1;
	pieces[0] = (struct tp_piece){base + ss.slot_off,
				      SLOT_HDR_BYTES + ss.len};
	pieces[1] = (struct tp_piece){base + ss.slot_off + ss.trailer_off,
				      SLOT_TRAILER_BYTES};
	*n = 2;
	return 1;
}

/* Abort the claims whose time is over and that no write holds. */
static void sweep(struct rx_reactor *r, struct rx_timer *t)
{
	uint64_t now = pc_now_ns(), expired = 0;
	pthread_mutex_lock(&cl.lock);
	for (uint64_t i = 0; i < cl.live;) {
		uint64_t no = cl.ix[i];
		struct sm_claim *c = &cl.st[no];
		if (c->pins || c->deadline > now) {
			i++;
			continue;
		}
		claim_off(no); /* the last live one takes place i */
		slot_write_abort(sm_st.reg, &c->w);
		expired++;
	}
	pthread_mutex_unlock(&cl.lock);
	if (expired) {
		met_add(sm_st.claims_expired, expired);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%" PRIu64 " claimed way%s "
			  "expired before its writer committed (emptied)",
			  expired, expired == 1 ? "" : "s");
	}
	rx_timer_start(r, t, RX_MS(SWEEP_MS), 0);
}

/* ---------------------------------------------------------- the methods */

static bool rd_key(struct mp_rd *p, const char **k, uint32_t *kl)
{
	return mp_rd_str(p, k, kl) == 0 && *kl > 0 && *kl <= DIR_KEY_MAX;
}

/* Check an array of n keys (1..SM_BATCH_MAX) without consuming p. */
static bool keys_ok(const struct mp_rd *p, uint32_t *n)
{
	struct mp_rd s = *p;
	if (mp_rd_array(&s, n) < 0 || *n == 0 || *n > SM_BATCH_MAX)
		return false;
	for (uint32_t i = 0; i < *n; i++) {
		const char *k;
		uint32_t kl;
		if (!rd_key(&s, &k, &kl))
			return false;
	}
	return true;
}

static const char keys_help[] = "1..1024 keys of 1..512 bytes";

/* slot.layout [] -> {node, data, rkey, wkey, base, bytes, epoch,
 *                    classes: [[max_payload, ways, buckets, stride,
 *                               offset], ...]} */
static void m_layout(struct rpc_call *call, struct mp_rd *p)
{
	(void)p;
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_map(pk, 8);
#define KEY(s) msgpack_pack_str_with_body(pk, s, sizeof(s) - 1)
	KEY("node");
	msgpack_pack_str_with_body(pk, sm_st.cl->self_id, strlen(sm_st.cl->self_id));
	KEY("data");
	msgpack_pack_str_with_body(pk, sm_st.cl->self_data,
				   strlen(sm_st.cl->self_data));
	KEY("rkey");
	msgpack_pack_uint32(pk, sm_st.rkey);
	KEY("wkey");
	msgpack_pack_uint32(pk, sm_st.wkey);
	KEY("base");
	msgpack_pack_uint64(pk, (uintptr_t)sm_st.base);
	KEY("bytes");
	msgpack_pack_uint64(pk, sm_st.lay.bytes);
	KEY("epoch");
	msgpack_pack_uint64(pk, sm_st.mb ? sm_st.mb->epoch() : 0);
	KEY("classes");
#undef KEY
	msgpack_pack_array(pk, sm_st.lay.nclasses);
	for (uint32_t c = 0; c < sm_st.lay.nclasses; c++) {
		const struct slot_class *k = &sm_st.lay.cls[c];
		msgpack_pack_array(pk, 5);
		msgpack_pack_uint64(pk, k->max_payload);
		msgpack_pack_uint32(pk, k->ways);
		msgpack_pack_uint64(pk, k->buckets);
		msgpack_pack_uint64(pk, k->stride);
		msgpack_pack_uint64(pk, k->offset);
	}
	rpc_reply_end(call);
}

/*
 * Which keys of a claim call later keys of the same call supersede: the
 * same key again, or `ways` other keys for the same bucket. A run of
 * single sets would write them and see them overwritten; a call claims
 * every way before the first write lands, so it would find the bucket
 * busy instead. sup[i] is set for them; false: -ENOMEM (none marked).
 */
static bool superseded(const struct mp_rd *keys, const struct mp_rd *lens,
		       uint32_t n, bool *sup)
{
	uint32_t cap = 1;
	while (cap < 2 * n)
		cap <<= 1;
	struct sup_b {
		uint64_t id; /* class << 56 | bucket offset, +1; 0: empty */
		uint32_t cnt;
	} *b = calloc(cap, sizeof(*b));
	uint64_t *seen = calloc(cap, sizeof(*seen));
	struct slot_key *k = calloc(n, sizeof(*k));
	uint64_t *len = calloc(n, sizeof(*len));
	bool ok = b && seen && k && len;
	struct mp_rd kr = *keys, lr = *lens;
	uint32_t m;
	mp_rd_array(&kr, &m);
	mp_rd_array(&lr, &m);
	for (uint32_t i = 0; ok && i < n; i++) {
		const char *s;
		uint32_t sl;
		mp_rd_str(&kr, &s, &sl);
		slot_key_of(&k[i], s, sl);
		if (mp_rd_uint(&lr, &len[i]) < 0)
			len[i] = 0;
	}
	for (uint32_t i = n; ok && i-- > 0;) {
		uint64_t kid = k[i].lo | 1, h = k[i].lo;
		uint32_t j = (uint32_t)h & (cap - 1);
		while (seen[j] && seen[j] != kid)
			j = (j + 1) & (cap - 1);
		if (seen[j]) { /* the same key later */
			sup[i] = true;
			continue;
		}
		seen[j] = kid;
		int c = len[i] ? slot_class_for(&sm_st.lay, len[i]) : -1;
		if (c < 0)
			continue;
		const struct slot_class *cls = &sm_st.lay.cls[c];
		uint64_t id = ((uint64_t)c << 56 | slot_bucket_off(cls, &k[i])) + 1;
		j = (uint32_t)(id * 0x9e3779b97f4a7c15ull >> 40) & (cap - 1);
		while (b[j].id && b[j].id != id)
			j = (j + 1) & (cap - 1);
		b[j].id = id;
		sup[i] = b[j].cnt >= cls->ways;
		b[j].cnt += !sup[i];
	}
	free(b);
	free(seen);
	free(k);
	free(len);
	return ok;
}

/* slot.claim [keys, lens] -> [data, wkey, [[addr, seq] | true | nil, ...]]:
 * claim a way for each page: [addr, seq] where to write it, true when a
 * later page of the call takes its place (stored and overwritten, as in a
 * run of single sets: nothing to write), nil when it cannot be stored (no
 * class holds it, or every way of its bucket is being written). */
static void m_claim(struct rpc_call *call, struct mp_rd *p)
{
	uint32_t n, nl;
	if (!keys_ok(p, &n)) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected [keys, lens]; "
				"%s", keys_help);
		return;
	}
	struct mp_rd lens_at = *p;
	mp_skip(&lens_at);
	struct mp_rd lens = lens_at;
	if (mp_rd_array(&lens, &nl) < 0 || nl != n) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected [keys, lens] "
				"with one length per key");
		return;
	}
	bool sup[SM_BATCH_MAX] = {0};
	superseded(p, &lens_at, n, sup);
	mp_rd_array(p, &n);
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_array(pk, 3);
	msgpack_pack_str_with_body(pk, sm_st.cl->self_data,
				   strlen(sm_st.cl->self_data));
	msgpack_pack_uint32(pk, sm_st.wkey);
	msgpack_pack_array(pk, n);
	uint64_t now = pc_now_ns(), got = 0;
	for (uint32_t i = 0; i < n; i++) {
		const char *k;
		uint32_t kl;
		uint64_t len = 0;
		rd_key(p, &k, &kl);
		struct slot_wr w;
		struct slot_key sk;
		slot_key_of(&sk, k, kl);
		uint64_t no, in;
		if (mp_rd_uint(&lens, &len) < 0 || len == 0) {
			msgpack_pack_nil(pk);
			continue;
		}
		if (sup[i] && slot_class_for(&sm_st.lay, len) >= 0) {
			msgpack_pack_true(pk);
			continue;
		}
		if (slot_write_begin(sm_st.reg, &sk, len, &w) < 0) {
			msgpack_pack_nil(pk);
			continue;
		}
		PC_ASSERT(slot_of((uintptr_t)w.payload, len, &no, &in) == 0);
		pthread_mutex_lock(&cl.lock);
		struct sm_claim *c = &cl.st[no];
		PC_ASSERT(!c->live); /* begin never hands out a busy way */
		*c = (struct sm_claim){.deadline = now + cl.ttl_ns, .w = w};
		claim_on(no);
		pthread_mutex_unlock(&cl.lock);
		got++;
		msgpack_pack_array(pk, 2);
		msgpack_pack_uint64(pk, (uintptr_t)w.payload);
		msgpack_pack_uint64(pk, w.seq);
	}
	met_add(sm_st.claims, got);
	rpc_reply_end(call);
}

/* A slot.commit under way: the claimed ways it ends, each payload's hash
 * taken (in copier slices) before the way is published. */
struct commit {
	struct rpc_call *call;
	struct rx_reactor *r;
	uint32_t n, i;            /* items; the next to hash */
	struct copier_job job;
	bool ok[SM_BATCH_MAX];
	struct {
		struct slot_wr w;
		uint64_t hash;    /* the writer's */
		bool hashing;     /* a claim of this call to publish */
	} it[];
};

static void commit_run(struct commit *cm);

/* Item cm->i's payload was hashed: publish it if the bytes are the ones
 * the writer hashed, else empty the way — a commit is never a header over
 * bytes it does not describe, so every committed way here is proven (the
 * seqlock checks of exists and slot.probe then say all a checksum would). */
static void commit_settle(struct commit *cm)
{
	uint32_t i = cm->i++;
	if (cm->job.res == 0 && cm->job.sumv == cm->it[i].hash) {
		slot_write_commit_hashed(sm_st.reg, &cm->it[i].w,
					 cm->it[i].hash);
		cm->ok[i] = true;
		return;
	}
	slot_write_abort(sm_st.reg, &cm->it[i].w);
	met_inc(sm_st.commits_refused);
	PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: refused a commit of %llu bytes "
		  "whose payload is not the bytes the writer hashed (a WRITE "
		  "that did not land, or one that landed late); the way is "
		  "empty", rpc_call_peer(cm->call),
		  (unsigned long long)cm->it[i].w.len);
}

static void commit_hashed(struct copier_job *j)
{
	struct commit *cm = j->arg;
	commit_settle(cm);
	commit_run(cm);
}

static void commit_run(struct commit *cm)
{
	while (cm->i < cm->n) {
		if (!cm->it[cm->i].hashing) {
			cm->i++;
			continue;
		}
		cm->job = (struct copier_job){.src = cm->it[cm->i].w.payload,
					      .len = cm->it[cm->i].w.len,
					      .sum = true,
					      .done = commit_hashed,
					      .arg = cm};
		if (copier_copy(cm->r, &cm->job) == 0)
			return; /* commit_hashed goes on */
		commit_settle(cm);
	}
	rpc_reply_bools(cm->call, cm->ok, cm->n);
	free(cm);
}

/* slot.commit [[addr, seq, hash | nil], ...] -> [bool, ...]: publish each
 * claimed way with the writer's hash of its payload (nil: give it back).
 * The owner hashes each payload first: one that is not the writer's bytes
 * is refused (false) and its way emptied. */
static void m_commit(struct rpc_call *call, struct mp_rd *p)
{
	uint32_t n;
	struct mp_rd s = *p;
	bool bad = mp_rd_array(&s, &n) < 0 || n == 0 || n > SM_BATCH_MAX;
	for (uint32_t i = 0; i < n && !bad; i++) {
		uint32_t m;
		uint64_t v;
		bad = mp_rd_array(&s, &m) < 0 || m != 3 ||
		      mp_rd_uint(&s, &v) < 0 || mp_rd_uint(&s, &v) < 0 ||
		      (!mp_rd_try_nil(&s) && mp_rd_uint(&s, &v) < 0);
	}
	if (bad) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected [[addr, seq, "
				"hash | nil], ...] (1..%d)", SM_BATCH_MAX);
		return;
	}
	mp_rd_array(p, &n);
	struct commit *cm = calloc(1, sizeof(*cm) + n * sizeof(cm->it[0]));
	if (!cm) {
		rpc_reply_error(call, RPC_E_BUSY, "out of memory");
		return;
	}
	cm->call = call;
	cm->r = rpc_call_reactor(call);
	cm->n = n;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t m;
		uint64_t addr, seq, hash = 0;
		mp_rd_array(p, &m);
		mp_rd_uint(p, &addr);
		mp_rd_uint(p, &seq);
		bool give_back = mp_rd_try_nil(p);
		if (!give_back)
			mp_rd_uint(p, &hash);
		uint64_t no, in;
		if (slot_of(addr, 1, &no, &in) < 0 || in != SLOT_HDR_BYTES)
			continue;
		struct slot_wr w;
		pthread_mutex_lock(&cl.lock);
		struct sm_claim *c = &cl.st[no];
		/* no write lands once the claim is off (wpin): the bytes
		 * hashed below are the ones published */
		bool mine = c->live && c->w.seq == seq && c->pins == 0;
		if (mine) {
			w = c->w;
			claim_off(no);
		}
		pthread_mutex_unlock(&cl.lock);
		if (!mine)
			continue; /* expired, or not this writer's claim */
		if (give_back) {
			slot_write_abort(sm_st.reg, &w);
			continue;
		}
		cm->it[i].w = w;
		cm->it[i].hash = hash;
		cm->it[i].hashing = true;
	}
	commit_run(cm);
}

/* slot.probe [keys, len] -> [len, ...]: each key's committed page length
 * here (0: none), of length len when len is not 0. */
static void m_probe(struct rpc_call *call, struct mp_rd *p)
{
	uint32_t n;
	if (!keys_ok(p, &n)) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected [keys, len]; "
				"%s", keys_help);
		return;
	}
	struct mp_rd rest = *p;
	uint64_t want = 0;
	mp_skip(&rest);
	if (mp_rd_uint(&rest, &want) < 0) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected [keys, len]");
		return;
	}
	mp_rd_array(p, &n);
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_array(pk, n);
	for (uint32_t i = 0; i < n; i++) {
		const char *k;
		uint32_t kl;
		rd_key(p, &k, &kl);
		struct slot_key sk;
		struct slot_loc loc;
		slot_key_of(&sk, k, kl);
		int64_t len = slot_locate(sm_st.reg, &sk, want, &loc);
		msgpack_pack_uint64(pk, len > 0 ? (uint64_t)len : 0);
	}
	rpc_reply_end(call);
}

/* slot.delete [keys] -> [bool, ...] (existed) */
static void m_delete(struct rpc_call *call, struct mp_rd *p)
{
	uint32_t n;
	if (!keys_ok(p, &n)) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected [keys]; %s",
				keys_help);
		return;
	}
	mp_rd_array(p, &n);
	bool ok[SM_BATCH_MAX];
	for (uint32_t i = 0; i < n; i++) {
		const char *k;
		uint32_t kl;
		rd_key(p, &k, &kl);
		struct slot_key sk;
		slot_key_of(&sk, k, kl);
		ok[i] = slot_del(sm_st.reg, &sk) > 0;
	}
	rpc_reply_bools(call, ok, n);
}

/* Every method answers "unsupported" on a node not in slotmap mode. */
#define GUARD(fn)                                                              \
	static void g_##fn(struct rpc_call *call, struct mp_rd *p)             \
	{                                                                      \
		if (!sm_st.on) {                                                  \
			rpc_reply_error(call, RPC_E_UNSUPPORTED,               \
					"this node runs mode = p2p, not "      \
					"slotmap");                            \
			return;                                                \
		}                                                              \
		fn(call, p);                                                   \
	}
GUARD(m_layout)
GUARD(m_claim)
GUARD(m_commit)
GUARD(m_probe)
GUARD(m_delete)
#undef GUARD

static const struct rpc_method methods[] = {
	{"slot.layout", g_m_layout, 0,
	 "[] -> {node, data, rkey, wkey, base, bytes, epoch, classes}: this "
	 "node's slot region (slotmap mode)"},
	{"slot.claim", g_m_claim, 0,
	 "[keys, lens] -> [data, wkey, [[addr, seq] | nil, ...]]: claim a way "
	 "for each page a peer will write"},
	{"slot.commit", g_m_commit, 0,
	 "[[addr, seq, hash | nil], ...] -> [bool, ...]: publish claimed ways "
	 "(nil: give back)"},
	{"slot.probe", g_m_probe, 0,
	 "[keys, len] -> [len, ...]: committed page length of each key here, "
	 "0 if none"},
	{"slot.delete", g_m_delete, 0, "[keys] -> [existed, ...]"},
	{NULL, NULL, 0, NULL},
};

/* ------------------------------------------------------------- lifecycle */

/* The size classes the settings derived (pc_settings_validate: the
 * original's single class when slot_num_buckets > 0, the auto classes, or
 * the slot_classes list). */
static unsigned class_specs(const struct pc_settings *s,
			    struct slot_class_spec *sp)
{
	_Static_assert(PC_SLOT_CLASSES_MAX <= SLOT_CLASSES_MAX,
		       "the settings' classes fit the layout");
	for (unsigned i = 0; i < s->slot_ncls; i++)
		sp[i] = (struct slot_class_spec){
			.max_payload = s->slot_cls[i].max_payload,
			.ways = s->slot_cls[i].ways,
			.buckets = s->slot_cls[i].buckets,
			.share_pm = s->slot_cls[i].share_pm};
	return s->slot_ncls;
}

static double stat_fn(void *arg)
{
	struct slot_stats st;
	slot_region_stats(sm_st.reg, &st);
	return (double)*(const uint64_t *)((const char *)&st + (uintptr_t)arg);
}

static double const_fn(void *arg)
{
	return (double)*(const uint64_t *)arg;
}

static uint64_t nslots_v;

static void register_metrics(void)
{
#define CTR(var, name, help, lab) var = met_register(MET_COUNTER, name, help, lab)
	CTR(sm_st.rd_req, "peercache_read_requests_total", "pages asked for", NULL);
	CTR(sm_st.rd_hit, "peercache_read_hits_total", "pages found", NULL);
	CTR(sm_st.rd_miss, "peercache_read_misses_total", "pages not found", NULL);
	CTR(sm_st.rd_local, "peercache_read_local_hits_total",
	    "pages served from this node's memory (no network)", NULL);
	CTR(sm_st.rd_remote, "peercache_read_remote_hits_total",
	    "pages read from another node's memory", NULL);
	CTR(sm_st.rd_bytes, "peercache_bytes_read_total",
	    "page bytes read (found pages, local or remote, on every path)",
	    NULL);
	static const char src_help[] =
		"slotmap reads by what they found: the key's page in this "
		"node's region (local_slot) or in its owner's (remote_slot), "
		"no page (miss), or a snapshot of the key's slot that failed "
		"validation — torn, or changed under the read (rejected; also "
		"counted as a miss)";
	CTR(sm_st.src_local, "peercache_slotmap_reads_total", src_help,
	    "source=\"local_slot\"");
	CTR(sm_st.src_remote, "peercache_slotmap_reads_total", src_help,
	    "source=\"remote_slot\"");
	CTR(sm_st.src_miss, "peercache_slotmap_reads_total", src_help,
	    "source=\"miss\"");
	CTR(sm_st.src_rejected, "peercache_slotmap_reads_total", src_help,
	    "source=\"rejected\"");
	CTR(sm_st.wr_req, "peercache_write_requests_total", "set calls", NULL);
	CTR(sm_st.wr_pages, "peercache_write_pages_total", "pages stored", NULL);
	CTR(sm_st.wr_bytes, "peercache_bytes_written_total", "page bytes stored",
	    NULL);
	static const char wr_help[] =
		"pages slotmap stored, by path: into this node's region "
		"(local) or into the owner's through a claim (remote)";
	CTR(sm_st.wr_local, "peercache_slotmap_writes_total", wr_help,
	    "path=\"local\"");
	CTR(sm_st.wr_remote, "peercache_slotmap_writes_total", wr_help,
	    "path=\"remote\"");
	static const char wf_help[] =
		"pages slotmap could not store, by reason: every way of the "
		"bucket was being written (busy), no size class holds the page "
		"(too_large), the owner did not claim, take or commit it "
		"(remote)";
	CTR(sm_st.wr_fail_busy, "peercache_slotmap_write_failures_total", wf_help,
	    "reason=\"busy\"");
	CTR(sm_st.wr_fail_big, "peercache_slotmap_write_failures_total", wf_help,
	    "reason=\"too_large\"");
	CTR(sm_st.wr_fail_remote, "peercache_slotmap_write_failures_total",
	    wf_help, "reason=\"remote\"");
	CTR(sm_st.ex_req, "peercache_exists_requests_total", "exists calls", NULL);
	CTR(sm_st.ex_found, "peercache_exists_pages_found_total",
	    "pages reported by exists", NULL);
	CTR(sm_st.del_req, "peercache_delete_requests_total", "keys deleted", NULL);
	CTR(sm_st.deadline_hit, "peercache_request_deadline_exceeded_total",
	    "page calls (set, get, exists) that ran into request_deadline",
	    NULL);
	CTR(sm_st.claims, "peercache_slotmap_claims_total",
	    "ways this node claimed for peers' writes", NULL);
	CTR(sm_st.claims_expired, "peercache_slotmap_claims_expired_total",
	    "claimed ways emptied because their writer did not commit within "
	    "twice rpc_timeout", NULL);
	CTR(sm_st.commits_refused, "peercache_slotmap_commits_refused_total",
	    "peers' commits refused: the claimed way's payload was not the "
	    "bytes the writer hashed (the way is emptied)", NULL);
	CTR(sm_st.layouts_fetched, "peercache_slotmap_layouts_fetched_total",
	    "slot.layout answers this node took from owners", NULL);
#undef CTR
	static const char copy_help[] =
		"page bytes the node copied with its CPU, by operation";
	sm_st.copy_set = met_register(MET_COUNTER, "peercache_copy_bytes_total",
				      copy_help, "op=\"set\"");
	sm_st.copy_get_local = met_register(MET_COUNTER,
					    "peercache_copy_bytes_total",
					    copy_help, "op=\"get_local\"");
	sm_st.copy_get_remote = met_register(MET_COUNTER,
					     "peercache_copy_bytes_total",
					     copy_help, "op=\"get_remote\"");
	sm_st.lat_read = met_register(MET_HISTOGRAM, "peercache_op_latency_seconds",
				   "latency of page operations", "op=\"read\"");
	sm_st.lat_write = met_register(MET_HISTOGRAM,
				    "peercache_op_latency_seconds",
				    "latency of page operations", "op=\"write\"");
	pc_budget_metric(&sm_st.staging, KV_STAGED_METRIC, KV_STAGED_HELP);
	met_register_fn("peercache_slotmap_region_bytes",
			"bytes of this node's slot region", NULL, const_fn,
			&sm_st.lay.bytes);
	nslots_v = cl.nslots;
	met_register_fn("peercache_slotmap_slots", "slots of this node's region",
			NULL, const_fn, &nslots_v);
#define STAT(name, help, f)                                                    \
	met_register_counter_fn(name, help, NULL, stat_fn,                     \
				(void *)offsetof(struct slot_stats, f))
	STAT("peercache_slotmap_evictions_total",
	     "pages overwritten by another key's (oldest way of a full bucket)",
	     evictions);
	STAT("peercache_slotmap_busy_refusals_total",
	     "writes refused because every way of the bucket was being written",
	     busy_refusals);
	STAT("peercache_slotmap_local_read_retries_total",
	     "local reads that met a write and looked again", read_retries);
#undef STAT
}

/* Membership changed: the layouts this reactor holds are dropped (epoch
 * in the layout: a restarted or replaced owner announces a new one); a
 * suspect or departed owner's calls and reads fail now. */
static void on_member(struct rx_reactor *r, enum mb_event ev,
		      const char *peer, uint64_t epoch, void *arg)
{
	(void)epoch;
	(void)arg;
	struct sm_rx *x = &sm_st.rx[rx_reactor_id(r)];
	if (ev == MB_JOIN || ev == MB_LEAVE)
		for (unsigned i = 0; i < SM_LAYOUTS; i++)
			x->lay[i].valid = false;
	if (ev == MB_SUSPECT || ev == MB_LEAVE) {
		struct tp_client *tc = sm_st.tp->clients[rx_reactor_id(r)];
		if (tc)
			sm_st.tp->ops->fail_node(tc, peer, -EHOSTDOWN);
		if (x->cl)
			rpc_client_fail_endpoint(x->cl, peer, -EHOSTDOWN);
	}
}

static void sm_fini(struct pc_ctx *ctx);


#ifdef PEERCACHE_FAULT_INJECTION
/* A test setting of fault-injection builds: set, and not "0". */
static bool test_flag(const char *name)
{
	const char *v = getenv(name);
	return v && *v && strcmp(v, "0") != 0;
}
#endif

static int sm_init(struct pc_ctx *ctx)
{
	const struct pc_settings *s = ctx->cfg;
	memset(&sm_st, 0, sizeof(sm_st));
	memset(&cl, 0, sizeof(cl));
	if (s->mode != PC_MODE_SLOTMAP)
		return 0;
	sm_st.ctx = ctx;
	sm_st.timeout_ms = (unsigned)s->rpc_timeout_ms;
	sm_st.deadline_ns = RX_MS(s->request_deadline_ms);
	pc_budget_init(&sm_st.staging, s->kv_staging_max);
	sm_st.secret = s->cluster_secret;
	sm_st.msg_max = s->rpc_max_message_bytes;
	sm_st.check_sum = true;
	if (!(sm_st.cl = svc_need_cluster(ctx, "slotmap")) ||
	    !(sm_st.tp = svc_need_transport(ctx, "slotmap")) ||
	    !(sm_st.mb = svc_need_membership(ctx, "slotmap")))
		return -ENOENT;
	sm_st.health = svc_find_health(ctx);
	struct slot_class_spec sp[SLOT_CLASSES_MAX];
	unsigned nsp = class_specs(s, sp);
	const char *why = NULL;
	int ret = slot_layout_plan(&sm_st.lay, s->pool_size, sp, nsp, &why);
	if (ret < 0) {
		PC_LOGE(LOG_MOD, "cannot lay out a %llu-byte slot region "
			"(pool_size): %s", (unsigned long long)s->pool_size,
			why ? why : strerror(-ret));
		return ret;
	}
	for (uint32_t c = 0; c < sm_st.lay.nclasses; c++)
		if (slot_bucket_bytes(&sm_st.lay.cls[c]) > TP_IO_MAX) {
			PC_LOGE(LOG_MOD, "class %u: a bucket of %u ways x %llu B "
				"is over the largest transfer (%u B): fewer "
				"ways or smaller pages", c,
				sm_st.lay.cls[c].ways,
				(unsigned long long)sm_st.lay.cls[c].stride,
				TP_IO_MAX);
			return -EINVAL;
		}
	sm_st.on = true;
	sm_st.bytes = sm_st.lay.bytes;
	void *m = mmap(NULL, sm_st.bytes, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED) {
		ret = -errno;
		PC_LOGE(LOG_MOD, "cannot map a %llu-byte slot region: %s",
			(unsigned long long)sm_st.bytes, strerror(-ret));
		sm_st.on = false;
		return ret;
	}
	sm_st.base = m;
#ifdef PEERCACHE_FAULT_INJECTION
	if (test_flag("PEERCACHE_TEST_SLOT_NOCHECK")) {
		sm_st.check_sum = false;
		PC_LOGW(LOG_MOD, "PEERCACHE_TEST_SLOT_NOCHECK: readers skip the "
			"payload checksum (a test's negative control: torn and "
			"foreign pages can pass)");
	}
	if (test_flag("PEERCACHE_TEST_SLOT_WHOLE_READS")) {
		sm_st.whole_reads = true;
		PC_LOGW(LOG_MOD, "PEERCACHE_TEST_SLOT_WHOLE_READS: readers "
			"read whole buckets, as over a one-sided transport "
			"(a test's setting)");
	}
#endif
	if ((ret = slot_region_new(&sm_st.reg, sm_st.base, &sm_st.lay)) < 0 ||
	    (ret = claims_init()) < 0)
		goto fail;
	struct tp_region rr = {.base = (uintptr_t)sm_st.base, .len = sm_st.bytes,
			       .access = TP_ACCESS_READ, .pin = rpin,
			       .unpin = runpin, .select = rselect};
	struct tp_region wr = {.base = (uintptr_t)sm_st.base, .len = sm_st.bytes,
			       .access = TP_ACCESS_WRITE, .pin = wpin,
			       .unpin = wunpin};
	if ((ret = sm_st.tp->ops->reg_region(sm_st.tp->node, &rr, &sm_st.rkey)) < 0 ||
	    (ret = sm_st.tp->ops->reg_region(sm_st.tp->node, &wr, &sm_st.wkey)) < 0)
		goto fail;
	if ((ret = pc_guard_init()) < 0)
		goto fail;
	sm_st.rx = calloc(ctx->threads, sizeof(*sm_st.rx));
	if (!sm_st.rx) {
		ret = -ENOMEM;
		goto fail;
	}
	if ((ret = svc_publish_kv(ctx, "slotmap", &sm_kv_api)) < 0)
		goto fail;
	/* No unsubscribe: a failed init ends the process before any event. */
	if ((ret = sm_st.mb->subscribe(MB_ON(MB_JOIN) | MB_ON(MB_LEAVE) |
					    MB_ON(MB_SUSPECT),
				    on_member, NULL)) < 0)
		goto fail;
	register_metrics();
	for (uint32_t c = 0; c < sm_st.lay.nclasses; c++) {
		const struct slot_class *k = &sm_st.lay.cls[c];
		PC_LOGI(LOG_MOD, "class %u: pages up to %llu B, %llu buckets x "
			"%u ways x %llu B (%llu slots)", c,
			(unsigned long long)k->max_payload,
			(unsigned long long)k->buckets, k->ways,
			(unsigned long long)k->stride,
			(unsigned long long)(k->buckets * k->ways));
	}
	PC_LOGI(LOG_MOD, "slot region: %llu bytes of pool_size %llu (%.2f%% "
		"used), %llu slots", (unsigned long long)sm_st.lay.bytes,
		(unsigned long long)s->pool_size,
		100.0 * (double)sm_st.lay.bytes / (double)s->pool_size,
		(unsigned long long)cl.nslots);
	return 0;
fail:
	sm_fini(ctx);
	return ret;
}

static int sm_start(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	if (!sm_st.on)
		return 0;
	struct sm_rx *x = &sm_st.rx[rx_reactor_id(r)];
	x->r = r;
	struct rpc_client_opts o;
	rpc_client_opts_default(&o);
	o.secret = sm_st.secret;
	o.max_message_bytes = sm_st.msg_max;
	if (!(x->cl = rpc_client_new(r, &o)))
		return -ENOMEM;
	if (rx_reactor_id(r) == 0) {
		rx_timer_init(&cl.sweep, sweep, NULL);
		rx_timer_start(r, &cl.sweep, RX_MS(SWEEP_MS), 0);
		cl.sweeping = true;
	}
	return sm_kv_start(r);
}

static void sm_stop(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	if (!sm_st.on)
		return;
	if (rx_reactor_id(r) == 0 && cl.sweeping) {
		rx_timer_stop(r, &cl.sweep);
		cl.sweeping = false;
	}
}

static void sm_exit(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	if (!sm_st.on || !sm_st.rx)
		return;
	struct sm_rx *x = &sm_st.rx[rx_reactor_id(r)];
	sm_kv_exit(r);
	if (x->cl)
		rpc_client_free(x->cl);
	x->cl = NULL;
}

static void sm_fini(struct pc_ctx *ctx)
{
	if (sm_st.ctx && svc_find_kv(ctx) == &sm_kv_api)
		svc_withdraw_kv(ctx);
	if (sm_st.tp && sm_st.rkey)
		sm_st.tp->ops->dereg_region(sm_st.tp->node, sm_st.rkey);
	if (sm_st.tp && sm_st.wkey)
		sm_st.tp->ops->dereg_region(sm_st.tp->node, sm_st.wkey);
	slot_region_free(sm_st.reg);
	free(cl.ix);
	free(cl.st);
	if (cl.st)
		pthread_mutex_destroy(&cl.lock);
	if (sm_st.base)
		munmap(sm_st.base, sm_st.bytes);
	free(sm_st.rx);
	memset(&cl, 0, sizeof(cl));
	memset(&sm_st, 0, sizeof(sm_st));
}

const struct pc_module pc_mod_slotmap = {
	.name = "slotmap",
	.init = sm_init,
	.start = sm_start,
	.stop = sm_stop,
	.exit = sm_exit,
	.fini = sm_fini,
	.rpc_methods = methods,
};
