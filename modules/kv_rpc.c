/*
 * modules/kv_rpc.c — the kv.* RPC methods (set, get, exists, delete) for
 * clients that carry values inline (operators, tests, other languages):
 * module "kv_rpc".
 *
 * Owns: decoding their params, the per-call limits, and encoding replies;
 * nothing else. Every method calls the kv API (modules/kv.h, the "kv"
 * service), the same one local sessions use, whichever module published
 * it: kv in p2p mode, the slotmap module in slotmap mode. So it is a module
 * of its own, listed after those two. Threads: handlers run on the reactor
 * that received the call; the kv API answers on it.
 *
 * Limits: a kv.get reply must fit one message, the connection's output cap,
 * one connection's share of the reply budget and the node's staging budget
 * (kv_staging_max): the smallest names the limit (get_call_max), and the
 * pages kv stages for one call stay within it. Every call also holds its
 * per-key state (KV_KEY_STATE) in the node's staging budget (kv_api.hold)
 * from its start to its reply. Refusals: too_large when the call alone is
 * over a limit, busy when the node is.
 *
 * Memory: one allocation per call (struct kv_call and its items, which
 * point into the request: the kv API copies what it keeps before it
 * returns).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "modules/kv.h"
#include "modules/modules.h"
#include "modules/placement.h"
#include "rpc/rpc.h"
#include "storage/pool.h"

#define LOG_MOD "kv"
#define KV_BATCH_MAX 65536
#define KV_KEY_MAX DIR_KEY_MAX

static struct {
	struct pc_ctx *ctx;
	const char *mode;           /* the mode's name, for messages */
	const struct kv_api *kv;
	uint64_t get_call_max;      /* reply bytes one kv.get may build */
	const char *get_call_limit; /* the setting that sets get_call_max */
	uint64_t staging_max;       /* kv_staging_max */
	met_id refused_large, refused_busy, copy_reply, refused_draining;
} g;

static const char keys_help[] = "keys: an array of 1..65536 strings of "
				"1..512 bytes";

/*
 * What a kv.* call holds per key while it is in flight, besides the page
 * bytes kv.get stages: the placement record and page header a lookup
 * fills, the operation's and its placement job's arrays, and two copies of
 * the key (an estimate on the high side). Without it 65,536 one-byte keys
 * (a 200 KB request) would hold ~40 MB, and a connection may have
 * rpc_max_inflight calls in flight.
 */
#define KV_KEY_STATE (sizeof(struct dir_rec) + POOL_HDR_BYTES + 224)

/* A kv.* call in flight, the staging its bookkeeping holds, its items. */
struct kv_call {
	struct rpc_call *call;
	uint64_t held;
	unsigned n;
	struct kv_item it[];
};

static void refuse_busy(struct rpc_call *call, const char *what)
{
	met_inc(g.refused_busy);
	PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: %s refused: the node already "
		  "holds kv_staging_max (%llu bytes) for other calls",
		  rpc_call_peer(call), what, (unsigned long long)g.staging_max);
	rpc_reply_error(call, RPC_E_BUSY, "the node already holds "
			"kv_staging_max (%llu bytes) for other kv.* calls; "
			"retry later", (unsigned long long)g.staging_max);
}

/*
 * Take the staging a call of n keys (key_bytes in all) holds until it
 * replies. NULL when it cannot: the call was answered (busy, or too_large
 * when it alone exceeds kv_staging_max).
 */
static struct kv_call *call_hold(struct rpc_call *call, const char *what,
				 unsigned n, uint64_t key_bytes)
{
	uint64_t need = (uint64_t)n * KV_KEY_STATE + 2 * key_bytes;
	if (need > g.staging_max) {
		met_inc(g.refused_large);
		rpc_reply_error(call, RPC_E_TOO_LARGE, "%s of %u keys needs %llu"
				" bytes of bookkeeping, over kv_staging_max "
				"(%llu); send fewer keys per call", what, n,
				(unsigned long long)need,
				(unsigned long long)g.staging_max);
		return NULL;
	}
	struct kv_call *kc = malloc(sizeof(*kc) + n * sizeof(kc->it[0]));
	if (!kc) {
		rpc_reply_error(call, RPC_E_BUSY, "out of memory");
		return NULL;
	}
	if (g.kv->hold(need) < 0) {
		free(kc);
		refuse_busy(call, what);
		return NULL;
	}
	kc->call = call;
	kc->held = need;
	kc->n = n;
	return kc;
}

/* Give the staging back; the call, to reply to. */
static struct rpc_call *call_release(struct kv_call *kc)
{
	struct rpc_call *call = kc->call;
	g.kv->release(kc->held);
	free(kc);
	return call;
}

static void reply_bools(void *arg, const bool *ok, unsigned n)
{
	rpc_reply_bools(call_release(arg), ok, n);
}

/* kv.set: the pages are in the pool; their records' publication may wait
 * on an owner until the deadline. The kept request goes, and the client's
 * next requests are taken (a get of the same keys finds them here). */
static void set_freed(void *arg)
{
	struct kv_call *kc = arg;
	rpc_call_release_input(kc->call);
}

static void reply_count(void *arg, unsigned count)
{
	rpc_reply_uint(call_release(arg), count);
}

static void reply_existed(void *arg, const bool *ok, unsigned n)
{
	unsigned count = 0;
	for (unsigned i = 0; i < n; i++)
		count += ok[i];
	rpc_reply_uint(call_release(arg), count);
}

/* Draining (node.drain): the set stores nothing and answers n falses, a
 * normal "not stored" for every client; the reason goes to the log and
 * peercache_writes_refused_draining_total. */
static void refuse_draining(struct rpc_call *call, uint32_t n)
{
	met_add(g.refused_draining, n);
	PC_LOG_RL(PC_LOG_INFO, LOG_MOD, "kv.set of %u page%s from %s not "
		  "stored: the node is draining (peercache drain --off ends "
		  "it)", n, n == 1 ? "" : "s", rpc_call_peer(call));
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_array(pk, n);
	for (uint32_t i = 0; i < n; i++)
		msgpack_pack_false(pk);
	rpc_reply_end(call);
}

/* The kv API did not start: answer busy. */
static void call_failed(struct kv_call *kc, int err)
{
	rpc_reply_error(call_release(kc), RPC_E_BUSY, "%s",
			err == -ENOMEM ? "out of memory" : strerror(-err));
}

static void m_set(struct rpc_call *call, struct mp_rd *p)
{
	uint32_t nk, nv;
	struct mp_rd keys = *p;
	if (mp_rd_array(p, &nk) < 0 || nk == 0 || nk > KV_BATCH_MAX) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected [keys, values]"
				"; %s", keys_help);
		return;
	}
	/* The keys' bytes: what the call's bookkeeping copies of them. */
	uint64_t key_bytes = 0;
	for (uint32_t i = 0; i < nk; i++) {
		const uint8_t *before = p->p;
		mp_skip(p);
		key_bytes += (uint64_t)(p->p - before);
	}
	struct kv_call *kc = call_hold(call, "kv.set", nk, key_bytes);
	if (!kc)
		return;
	/* Items point into the request: kept until set_freed, or copied
	 * before publish returns. */
	bool bad = mp_rd_array(p, &nv) < 0 || nv != nk ||
		   mp_rd_array(&keys, &nk) < 0;
	for (uint32_t i = 0; i < nk && !bad; i++) {
		const char *k;
		uint32_t kl;
		const uint8_t *v;
		uint32_t vl;
		bad = mp_rd_str(&keys, &k, &kl) < 0 || kl == 0 ||
		      kl > KV_KEY_MAX || mp_rd_bin(p, &v, &vl) < 0;
		kc->it[i] = (struct kv_item){k, kl, (void *)(uintptr_t)v, vl};
	}
	if (bad) {
		rpc_reply_error(call_release(kc), RPC_E_BAD_PARAMS,
				"expected [keys, values] with one bin value "
				"per key; %s", keys_help);
		return;
	}
	if (pc_ctx_draining(g.ctx)) {
		refuse_draining(call_release(kc), nk);
		return;
	}
	/* A large request stays where it arrived while its pages are
	 * copied and summed into the pool in slices; the connection takes
	 * nothing new until they are (set_freed). A small one is copied at
	 * once. */
	enum kv_src src = rpc_call_keep_request(call) ? KV_SRC_KEPT
						      : KV_SRC_NOW;
	int ret = g.kv->publish(rpc_call_reactor(call), kc->it, nk, src,
				src == KV_SRC_KEPT ? set_freed : NULL,
				reply_bools, kc);
	if (ret < 0)
		call_failed(kc, ret);
}

/* Reply bytes besides the pages: the envelope, the array header and one
 * bin header (or nil) per key. */
static uint64_t get_reply_overhead(unsigned n)
{
	return 32 + 5 * (uint64_t)n;
}

/* Pages of at least this many bytes leave in a kv.get reply from where kv
 * staged them (rpc_reply_ref); smaller ones are copied into the reply (a
 * reference costs an allocation and a send vector of its own). */
#define GET_REF_MIN (64u * 1024)

/* The staging a kv.get reply sends from: back to the reactor's warm
 * blocks when the last page sent from it has left. */
struct get_kept {
	struct pc_block_set set;
	unsigned refs;
};

static void get_kept_unref(void *arg)
{
	struct get_kept *k = arg;
	if (--k->refs)
		return;
	pc_block_set_put(&k->set);
	free(k);
}

/* The got's staging, moved out to send from; NULL when no page is large
 * enough to be worth it, or out of memory (then the pages are copied). */
static struct get_kept *get_keep(const struct kv_got *got)
{
	bool large = false;
	for (unsigned i = 0; i < got->n && !large; i++)
		large = got->ok[i] && got->len[i] >= GET_REF_MIN;
	struct get_kept *k = large && got->stage ? malloc(sizeof(*k)) : NULL;
	if (!k)
		return NULL;
	k->set = *got->stage;
	*got->stage = (struct pc_block_set){0};
	k->refs = 1; /* get_reply's own, dropped when the reply is built */
	return k;
}

static void get_reply(void *arg, const struct kv_got *got)
{
	struct rpc_call *call = call_release(arg);
	if (got->refused == -E2BIG) {
		met_inc(g.refused_large);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: kv.get of %u keys refused: "
			  "its pages exceed %llu bytes per call (%s)",
			  rpc_call_peer(call), got->n,
			  (unsigned long long)g.get_call_max, g.get_call_limit);
		rpc_reply_error(call, RPC_E_TOO_LARGE, "the pages of this kv.get "
				"exceed %llu reply bytes per call (setting %s); "
				"ask for fewer keys per call",
				(unsigned long long)g.get_call_max,
				g.get_call_limit);
		return;
	}
	if (got->refused) {
		refuse_busy(call, "kv.get");
		return;
	}
	/* The reply goes into the connection's output queue, large pages by
	 * reference to their staging, the rest copied: the RPC layer's reply
	 * budget (per connection and node-wide) must have room for it first;
	 * the queue accounts for copied bytes once written, referenced ones
	 * keep their share until they have left (rpc_reply_ref). */
	size_t reply = (size_t)(got->staged + get_reply_overhead(got->n));
	int ret = rpc_call_budget_take(call, reply);
	if (ret < 0) {
		met_inc(g.refused_busy);
		rpc_reply_error(call, RPC_E_BUSY, "no room for a %zu-byte reply: "
				"this connection's unread replies or all "
				"connections' (rpc_max_reply_bytes) are at "
				"their limit; read the replies, or retry later",
				reply);
		return;
	}
	struct get_kept *kept = get_keep(got);
	size_t refd = 0;
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_array(pk, got->n);
	for (unsigned i = 0; i < got->n; i++) {
		if (!got->ok[i]) {
			msgpack_pack_nil(pk);
			continue;
		}
		msgpack_pack_bin(pk, got->len[i]);
		if (kept && got->len[i] >= GET_REF_MIN) {
			kept->refs++;
			if (rpc_reply_ref(call, got->data[i], got->len[i],
					  get_kept_unref, kept)) {
				refd += got->len[i];
				continue;
			}
		} else {
			msgpack_pack_bin_body(pk, got->data[i], got->len[i]);
		}
		met_add(g.copy_reply, got->len[i]);
	}
	if (kept)
		get_kept_unref(kept);
	rpc_call_budget_give(call, reply - refd);
	rpc_reply_end(call);
}

/*
 * Read [keys] into a call's items (pointing into the request) and hold its
 * bookkeeping: NULL when the call was answered.
 */
static struct kv_call *keys_call(struct rpc_call *call, struct mp_rd *p,
				 const char *what)
{
	struct mp_rd scan = *p;
	uint32_t n;
	uint64_t key_bytes = 0;
	bool bad = mp_rd_array(&scan, &n) < 0 || n == 0 || n > KV_BATCH_MAX;
	for (uint32_t i = 0; i < n && !bad; i++) {
		const char *s;
		uint32_t len;
		bad = mp_rd_str(&scan, &s, &len) < 0 || len == 0 ||
		      len > KV_KEY_MAX;
		key_bytes += len;
	}
	if (bad) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected [keys]; %s",
				keys_help);
		return NULL;
	}
	struct kv_call *kc = call_hold(call, what, n, key_bytes);
	if (!kc)
		return NULL;
	mp_rd_array(p, &n);
	for (uint32_t i = 0; i < n; i++) {
		const char *s;
		uint32_t len;
		mp_rd_str(p, &s, &len); /* checked above */
		kc->it[i] = (struct kv_item){s, len, NULL, 0};
	}
	return kc;
}

static void m_get(struct rpc_call *call, struct mp_rd *p)
{
	struct kv_call *kc = keys_call(call, p, "kv.get");
	if (!kc)
		return;
	uint64_t over = get_reply_overhead(kc->n);
	uint64_t stage_max = g.get_call_max > over ? g.get_call_max - over : 0;
	int ret = g.kv->get(rpc_call_reactor(call), kc->it, kc->n, stage_max,
			    get_reply, kc);
	if (ret < 0)
		call_failed(kc, ret);
	else if (ret > 0) /* going on over loop passes (copies, pins) */
		rpc_call_hold_input(call);
}

static void m_exists(struct rpc_call *call, struct mp_rd *p)
{
	struct kv_call *kc = keys_call(call, p, "kv.exists");
	if (!kc)
		return;
	int ret = g.kv->exists(rpc_call_reactor(call), kc->it, kc->n,
			       reply_count, kc);
	if (ret < 0)
		call_failed(kc, ret);
}

static void m_delete(struct rpc_call *call, struct mp_rd *p)
{
	struct kv_call *kc = keys_call(call, p, "kv.delete");
	if (!kc)
		return;
	int ret = g.kv->remove(rpc_call_reactor(call), kc->it, kc->n,
			       reply_existed, kc);
	if (ret < 0)
		call_failed(kc, ret);
}

static void flushed(void *arg, const struct kv_flushed *f)
{
	struct rpc_call *call = arg;
	if (f->res < 0) {
		rpc_reply_error(call, RPC_E_UNAVAILABLE, "the node is stopping "
				"(%llu pool and %llu disk pages were dropped)",
				(unsigned long long)f->pages,
				(unsigned long long)f->disk_pages);
		return;
	}
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_map(pk, 2);
	mp_pack_cstr(pk, "pages");
	msgpack_pack_uint64(pk, f->pages);
	mp_pack_cstr(pk, "disk_pages");
	msgpack_pack_uint64(pk, f->disk_pages);
	rpc_reply_end(call);
}

/* kv.flush [] -> {pages, disk_pages}: drop every page this node holds. */
static void m_flush(struct rpc_call *call, struct mp_rd *p)
{
	if (p->p < p->end) { /* params after their array header: none */
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "kv.flush takes no "
				"parameters ([]); nothing was dropped");
		return;
	}
	if (!g.kv->flush) {
		rpc_reply_error(call, RPC_E_UNSUPPORTED, "kv.flush is not "
				"supported in %s mode", g.mode);
		return;
	}
	PC_LOGI(LOG_MOD, "kv.flush asked by %s", rpc_call_peer(call));
	int ret = g.kv->flush(rpc_call_reactor(call), flushed, call);
	if (ret == -EBUSY)
		rpc_reply_error(call, RPC_E_BUSY, "a flush is under way");
	else if (ret < 0)
		rpc_reply_error(call, RPC_E_BUSY, "%s", strerror(-ret));
}

static const struct rpc_method kv_rpc_methods[] = {
	{"kv.set", m_set, 0,
	 "[keys, values] -> [stored: bool, ...] (idempotent)"},
	{"kv.get", m_get, 0, "[keys] -> [bin | nil, ...]"},
	{"kv.exists", m_exists, 0,
	 "[keys] -> how many leading keys exist"},
	{"kv.delete", m_delete, 0, "[keys] -> how many existed"},
	{"kv.flush", m_flush, 0,
	 "[] -> {pages, disk_pages}: drop every page this node holds, and "
	 "its records of them (p2p)"},
	{NULL, NULL, 0, NULL},
};

/* Read the limits and register the metrics (main thread). */
static int kv_rpc_init(struct pc_ctx *ctx)
{
	const struct pc_settings *s = ctx->cfg;
	memset(&g, 0, sizeof(g));
	g.ctx = ctx;
	g.mode = s->mode == PC_MODE_P2P ? "p2p" : "slotmap";
	if (!(g.kv = svc_need_kv(ctx, "kv_rpc")))
		return -ENOENT;
	/* A kv.get reply must fit one message, the connection's output cap
	 * and the node's staging budget: the smallest names the limit. */
	g.staging_max = s->kv_staging_max;
	g.get_call_max = s->rpc_max_message_bytes;
	g.get_call_limit = "rpc_max_message_bytes";
	if (s->conn_out_max < g.get_call_max) {
		g.get_call_max = s->conn_out_max;
		g.get_call_limit = "conn_out_max";
	}
	if (s->kv_staging_max < g.get_call_max) {
		g.get_call_max = s->kv_staging_max;
		g.get_call_limit = "kv_staging_max";
	}
	/* One connection's share of the reply budget (rpc_server.c): a
	 * reply above it could only ever get busy; say too_large instead. */
	if (s->rpc_max_reply_bytes / 4 < g.get_call_max) {
		g.get_call_max = s->rpc_max_reply_bytes / 4;
		g.get_call_limit = "rpc_max_reply_bytes / 4";
	}
	static const char refused_help[] =
		"kv.* calls refused for memory (kv_staging_max, or a kv.get "
		"reply over its cap), by reason";
	g.refused_large = met_register(MET_COUNTER, "peercache_kv_refused_total",
				       refused_help, "reason=\"too_large\"");
	g.refused_busy = met_register(MET_COUNTER, "peercache_kv_refused_total",
				      refused_help, "reason=\"busy\"");
	g.refused_draining = met_register(
		MET_COUNTER, "peercache_writes_refused_draining_total",
		DRAIN_REFUSED_HELP, "method=\"kv.set\"");
	g.copy_reply = met_register(MET_COUNTER, "peercache_copy_bytes_total",
				    "page bytes the node copied with its CPU, "
				    "by operation", "op=\"rpc_reply\"");
	return 0;
}

const struct pc_module pc_mod_kv_rpc = {
	.name = "kv_rpc",
	.init = kv_rpc_init,
	.rpc_methods = kv_rpc_methods,
};
