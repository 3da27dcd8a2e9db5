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
 * Steps: a call of more than 4,096 keys goes to the kv API 4,096 keys at
 * a time, each on a loop pass of its own, its params read over passes
 * before (below, "Steps").
 *
 * Memory: one allocation per call (struct kv_call and its items, which
 * point into the request: the kv API copies what it keeps before it
 * returns); a call in steps also keeps its request (or a copy of it), and
 * a stepped kv.get one buffer of packed replies per step and an array of
 * the reply's runs.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "modules/kv.h"
#include "modules/modules.h"
#include "modules/placement.h"
#include "reactor/stall.h"
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
	met_id steps;
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

/*
 * Steps. A call of more than KV_STEP_KEYS (modules/kv.h) keys goes to the
 * kv API in steps of that many, one after the other, each started on a
 * loop pass of its own (a zero-delay timer): one call of 65,536 keys held
 * its reactor 1.5-4 ms at its start and again at its end. The keys (and a set's values) stay valid
 * until the last step: the request is kept (rpc_call_keep_request, which
 * also holds the connection's input), or, when it arrived whole in one
 * receive buffer, its params are copied. What the steps answer: exists
 * counts leading keys, so it stops at the first step that did not find all
 * of its own; delete adds up; set collects the bools; get packs each step's
 * pages as the step ends (kv's staging is then free for the next step) into
 * runs the reply sends by reference at the end.
 */
/* Keys or values a stepped call reads per loop pass before its first step
 * (each is checked; ~5 ns apiece). */
#define KV_PARSE_PASS 16384

enum kv_op { KV_OP_SET, KV_OP_GET, KV_OP_EXISTS, KV_OP_DELETE };

static const char *const op_name[] = {"kv.set", "kv.get", "kv.exists",
				      "kv.delete"};
static const char *const step_tag[] = {"kv.set step", "kv.get step",
				       "kv.exists step", "kv.delete step"};

/* A run of a stepped kv.get's reply, sent by reference at its end. */
struct get_part {
	const void *p;
	size_t len;
	void (*release)(void *arg);
	void *arg;
	bool page; /* a page (else headers, nils and small pages packed) */
};

/* A kv.* call in flight, the staging its bookkeeping holds, its items. */
struct kv_call {
	struct rpc_call *call;
	struct rx_reactor *r;
	uint64_t held;
	unsigned n;
	enum kv_op op;
	bool steps;            /* more than one step */
	enum kv_src src;       /* set: where its values are */
	unsigned from, to;     /* the step under way: items [from, to) */
	struct rx_timer next;  /* starts the next step on the next pass */
	void *copy;            /* the params, copied when they were not kept */
	struct mp_rd rd;       /* where reading the params goes on */
	unsigned parsed;       /* keys (then values) read */
	bool values;           /* set: reading the values */
	bool parsing;          /* params not all read yet */
	uint64_t key_bytes;    /* of the keys read */
	unsigned count;        /* exists: leading keys found; delete: existed */
	bool *ok;              /* set, in steps: per key */
	uint64_t stage_max;    /* get: page bytes the whole call may stage */
	uint64_t staged;       /* get: what its steps staged so far */
	struct get_part *parts;/* get, in steps: the reply after its header */
	unsigned nparts, parts_cap;
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

/* Give back what a stepped get packed and kept so far (unsent). */
static void parts_drop(struct kv_call *kc)
{
	for (unsigned i = 0; i < kc->nparts; i++)
		kc->parts[i].release(kc->parts[i].arg);
	free(kc->parts);
	kc->parts = NULL;
	kc->nparts = kc->parts_cap = 0;
}

/* Give the staging back and free the call; the call, to reply to. */
static struct rpc_call *call_release(struct kv_call *kc)
{
	struct rpc_call *call = kc->call;
	PC_DASSERT(!rx_timer_armed(&kc->next));
	parts_drop(kc);
	g.kv->release(kc->held);
	free(kc->copy);
	free(kc);
	return call;
}

/* The kv API did not start (or a later step could not): answer busy. What
 * earlier steps did stays done (a set's pages are stored: a retry finds
 * them, as sets are idempotent). */
static void call_failed(struct kv_call *kc, int err)
{
	rpc_reply_error(call_release(kc), RPC_E_BUSY, "%s",
			err == -ENOMEM ? "out of memory" : strerror(-err));
}

static void step_start(struct kv_call *kc);

static void next_fired(struct rx_reactor *r, struct rx_timer *t);

/* A step ended and the call goes on: the next one, on the next pass. */
static void step_next(struct kv_call *kc)
{
	PC_DASSERT(kc->to < kc->n);
	rx_timer_start(kc->r, &kc->next, 0, 0); /* zero delay: never fails */
}

/* ------------------------------------------------------------ kv.set */

/* kv.set: the pages are in the pool; their records' publication may wait
 * on an owner until the deadline. The kept request goes, and the client's
 * next requests are taken (a get of the same keys finds them here). */
static void set_freed(void *arg)
{
	struct kv_call *kc = arg;
	rpc_call_release_input(kc->call);
}

static void set_done(void *arg, const bool *ok, unsigned n)
{
	struct kv_call *kc = arg;
	if (!kc->steps) {
		rpc_reply_bools(call_release(kc), ok, n);
		return;
	}
	PC_DASSERT(kc->from + n == kc->to);
	memcpy(kc->ok + kc->from, ok, n * sizeof(*ok));
	if (kc->to < kc->n) {
		step_next(kc);
		return;
	}
	rpc_reply_bools(kc->call, kc->ok, kc->n);
	kc->call = NULL;
	call_release(kc);
}

/* ------------------------------------------------- kv.exists, kv.delete */

static void exists_done(void *arg, unsigned count)
{
	struct kv_call *kc = arg;
	kc->count += count;
	if (count == kc->to - kc->from && kc->to < kc->n) {
		step_next(kc); /* every key so far: the next ones may lead on */
		return;
	}
	unsigned total = kc->count;
	rpc_reply_uint(call_release(kc), total);
}

static void delete_done(void *arg, const bool *ok, unsigned n)
{
	struct kv_call *kc = arg;
	for (unsigned i = 0; i < n; i++)
		kc->count += ok[i];
	if (kc->to < kc->n) {
		step_next(kc);
		return;
	}
	unsigned total = kc->count;
	rpc_reply_uint(call_release(kc), total);
}

/* ------------------------------------------------------------ kv.get */

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
	k->refs = 1; /* the packer's own, dropped when it is done */
	return k;
}

/* The refusal a get's staging met, answered: true when there was one. */
static bool get_refused(struct kv_call *kc, const struct kv_got *got)
{
	if (!got->refused)
		return false;
	struct rpc_call *call = call_release(kc);
	if (got->refused == -E2BIG) {
		met_inc(g.refused_large);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: kv.get refused: its pages "
			  "exceed %llu bytes per call (%s)",
			  rpc_call_peer(call), (unsigned long long)g.get_call_max,
			  g.get_call_limit);
		rpc_reply_error(call, RPC_E_TOO_LARGE, "the pages of this kv.get "
				"exceed %llu reply bytes per call (setting %s); "
				"ask for fewer keys per call",
				(unsigned long long)g.get_call_max,
				g.get_call_limit);
	} else {
		refuse_busy(call, "kv.get");
	}
	return true;
}

/* Take reply budget for bytes of the call's reply: false when it was
 * refused, and the call answered busy. */
static bool get_budget(struct kv_call *kc, size_t bytes)
{
	if (rpc_call_budget_take(kc->call, bytes) == 0)
		return true;
	met_inc(g.refused_busy);
	rpc_reply_error(call_release(kc), RPC_E_BUSY, "no room for a "
			"%zu-byte reply: this connection's unread replies or "
			"all connections' (rpc_max_reply_bytes) are at their "
			"limit; read the replies, or retry later", bytes);
	return false;
}

/* A call of one step: its reply, built at once — large pages by reference
 * to their staging, the rest copied into it. */
static void get_reply_now(struct kv_call *kc, const struct kv_got *got)
{
	/* The RPC layer's reply budget (per connection and node-wide) must
	 * have room first; the queue accounts for copied bytes once written,
	 * referenced ones keep their share until they have left. */
	size_t reply = (size_t)(got->staged + get_reply_overhead(got->n));
	if (!get_budget(kc, reply))
		return;
	struct rpc_call *call = call_release(kc);
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

/* A step's packed bytes: headers, nils and small pages, in order. */
struct get_run {
	unsigned refs;
	uint8_t b[];
};

static void get_run_unref(void *arg)
{
	struct get_run *run = arg;
	if (!--run->refs)
		free(run);
}

/* A MessagePack bin header for len bytes at p: its size. */
static size_t bin_head(uint8_t *p, uint64_t len)
{
	if (len < 256) {
		p[0] = 0xc4;
		p[1] = (uint8_t)len;
		return 2;
	}
	if (len < 65536) {
		p[0] = 0xc5;
		p[1] = (uint8_t)(len >> 8);
		p[2] = (uint8_t)len;
		return 3;
	}
	p[0] = 0xc6;
	for (int k = 0; k < 4; k++)
		p[1 + k] = (uint8_t)(len >> (24 - 8 * k));
	return 5;
}

static size_t bin_head_len(uint64_t len)
{
	return len < 256 ? 2 : len < 65536 ? 3 : 5;
}

static bool part_add(struct kv_call *kc, struct get_part part)
{
	if (kc->nparts == kc->parts_cap) {
		unsigned cap = kc->parts_cap ? 2 * kc->parts_cap : 16;
		struct get_part *np = realloc(kc->parts, cap * sizeof(*np));
		if (!np) {
			part.release(part.arg);
			return false;
		}
		kc->parts = np;
		kc->parts_cap = cap;
	}
	kc->parts[kc->nparts++] = part;
	return true;
}

/* Pack a step's pages into the call's parts: false when out of memory
 * (the call was answered). */
static bool get_pack_step(struct kv_call *kc, const struct kv_got *got)
{
	struct get_kept *kept = get_keep(got);
	size_t packed = 0, refd = 0;
	for (unsigned i = 0; i < got->n; i++) {
		if (!got->ok[i]) {
			packed++;
			continue;
		}
		packed += bin_head_len(got->len[i]);
		if (kept && got->len[i] >= GET_REF_MIN)
			refd += got->len[i];
		else
			packed += got->len[i];
	}
	if (!get_budget(kc, packed + refd)) {
		if (kept)
			get_kept_unref(kept);
		return false;
	}
	struct get_run *run = malloc(sizeof(*run) + packed);
	bool good = run != NULL;
	if (run)
		run->refs = 1; /* the packer's own */
	uint8_t *pos = run ? run->b : NULL, *seg = pos;
	for (unsigned i = 0; i < got->n && good; i++) {
		if (!got->ok[i]) {
			*pos++ = 0xc0; /* nil */
			continue;
		}
		pos += bin_head(pos, got->len[i]);
		if (!kept || got->len[i] < GET_REF_MIN) {
			memcpy(pos, got->data[i], got->len[i]);
			pos += got->len[i];
			met_add(g.copy_reply, got->len[i]);
			continue;
		}
		/* The run so far, then the page from its staging (each
		 * part holds a reference; part_add drops it on failure). */
		run->refs++;
		good = part_add(kc, (struct get_part){seg, (size_t)(pos - seg),
					get_run_unref, run, false});
		if (good) {
			kept->refs++;
			good = part_add(kc, (struct get_part){got->data[i],
						got->len[i], get_kept_unref,
						kept, true});
		}
		seg = pos;
	}
	if (good && pos > seg) {
		run->refs++;
		good = part_add(kc, (struct get_part){seg, (size_t)(pos - seg),
					get_run_unref, run, false});
	}
	PC_DASSERT(!good || (size_t)(pos - run->b) == packed);
	if (run)
		get_run_unref(run);
	if (kept)
		get_kept_unref(kept);
	if (!good)
		call_failed(kc, -ENOMEM);
	return good;
}

/* The last step ended: the reply, every part by reference. */
static void get_reply_parts(struct kv_call *kc)
{
	struct rpc_call *call = kc->call;
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_array(pk, kc->n);
	for (unsigned i = 0; i < kc->nparts; i++) {
		const struct get_part *pt = &kc->parts[i];
		if (!rpc_reply_ref(call, pt->p, pt->len, pt->release, pt->arg) &&
		    pt->page)
			met_add(g.copy_reply, pt->len);
	}
	kc->nparts = 0; /* each released by the reply */
	kc->call = NULL;
	call_release(kc);
	rpc_reply_end(call);
}

static void get_done(void *arg, const struct kv_got *got)
{
	struct kv_call *kc = arg;
	if (get_refused(kc, got))
		return;
	if (!kc->steps) {
		get_reply_now(kc, got);
		return;
	}
	kc->staged += got->staged;
	if (!get_pack_step(kc, got))
		return;
	if (kc->to < kc->n)
		step_next(kc);
	else
		get_reply_parts(kc);
}

/* --------------------------------------------------------------- steps */

/* Start the next step. Its done callback may run before the kv API
 * returns and end the call: kc is not touched after a start that
 * succeeded unless the API said it goes on. */
static void step_start(struct kv_call *kc)
{
	unsigned from = kc->to, to = PC_MIN(kc->n, from + KV_STEP_KEYS);
	bool last = to == kc->n, steps = kc->steps;
	struct rpc_call *call = kc->call;
	const struct kv_item *it = kc->it + from;
	kc->from = from;
	kc->to = to;
	met_inc(g.steps);
	int ret = -EINVAL;
	switch (kc->op) {
	case KV_OP_SET: {
		/* freed, once the last step reads its items no more, lets
		 * the connection take requests again (not a copy: it is
		 * the call's until the end). */
		bool freed = last && kc->src == KV_SRC_KEPT && !kc->copy;
		ret = g.kv->publish(kc->r, it, to - from, kc->src,
				    freed ? set_freed : NULL, set_done, kc);
		break;
	}
	case KV_OP_GET:
		ret = g.kv->get(kc->r, it, to - from, kc->stage_max - kc->staged,
				get_done, kc);
		break;
	case KV_OP_EXISTS:
		ret = g.kv->exists(kc->r, it, to - from, exists_done, kc);
		break;
	case KV_OP_DELETE:
		ret = g.kv->remove(kc->r, it, to - from, delete_done, kc);
		break;
	}
	if (ret < 0)
		call_failed(kc, ret); /* nothing started: done did not run */
	else if (ret > 0 && !steps) /* a get going on over loop passes */
		rpc_call_hold_input(call);
}

/* ----------------------------------------------------------- requests */

/*
 * A call of n items for op (n checked). For more than one step the params
 * must outlive the handler: the request is kept, or copied into the call
 * (kc->rd reads the copy). NULL when out of memory (the call was answered).
 */
static struct kv_call *call_new(struct rpc_call *call, const struct mp_rd *p,
				enum kv_op op, unsigned n)
{
	bool steps = n > KV_STEP_KEYS;
	size_t oks = op == KV_OP_SET && steps ? n * sizeof(bool) : 0;
	struct kv_call *kc = malloc(sizeof(*kc) + n * sizeof(kc->it[0]) + oks);
	if (!kc) {
		rpc_reply_error(call, RPC_E_BUSY, "out of memory");
		return NULL;
	}
	*kc = (struct kv_call){.call = call, .r = rpc_call_reactor(call),
			       .n = n, .op = op, .steps = steps,
			       .src = KV_SRC_NOW, .rd = *p, .parsing = true};
	if (oks)
		kc->ok = (bool *)(void *)&kc->it[n];
	if (op == KV_OP_GET) {
		uint64_t over = get_reply_overhead(n);
		kc->stage_max = g.get_call_max > over ? g.get_call_max - over
						      : 0;
	}
	rx_timer_init(&kc->next, next_fired, kc);
	/* A set's pages stay where they arrived while they are copied and
	 * summed into the pool in slices, when the request came in pieces; a
	 * small one is copied at once. */
	if (steps && rpc_call_keep_params(call, &kc->rd, &kc->copy) < 0) {
		free(kc);
		rpc_reply_error(call, RPC_E_BUSY, "out of memory");
		return NULL;
	}
	/* Kept or copied, a set's pages are node memory until done. */
	if (op == KV_OP_SET && (steps || rpc_call_keep_request(call)))
		kc->src = KV_SRC_KEPT;
	return kc;
}

/* Take the staging the call's bookkeeping holds until it replies: false
 * when it cannot (the call was answered: busy, or too_large when it alone
 * exceeds kv_staging_max). */
static bool call_hold(struct kv_call *kc)
{
	const char *what = op_name[kc->op];
	uint64_t need = (uint64_t)kc->n * KV_KEY_STATE + 2 * kc->key_bytes;
	if (kc->copy)
		need += kc->key_bytes + 5 * (uint64_t)kc->n; /* the copy's keys */
	if (need > g.staging_max) {
		met_inc(g.refused_large);
		rpc_reply_error(call_release(kc), RPC_E_TOO_LARGE, "%s of %u "
				"keys needs %llu bytes of bookkeeping, over "
				"kv_staging_max (%llu); send fewer keys per "
				"call", what, kc->n, (unsigned long long)need,
				(unsigned long long)g.staging_max);
		return false;
	}
	if (g.kv->hold(need) < 0) {
		refuse_busy(call_release(kc), what);
		return false;
	}
	kc->held = need;
	return true;
}

/*
 * Read up to budget more of the call's keys, then (set) its values, from
 * kc->rd into its items: 1 when all are read, 0 when some remain, -1 when
 * one is not what it must be.
 */
static int params_read(struct kv_call *kc, unsigned budget)
{
	for (; budget && kc->parsed < kc->n; budget--, kc->parsed++) {
		struct kv_item *it = &kc->it[kc->parsed];
		if (kc->values) {
			const uint8_t *v;
			uint32_t vl;
			if (mp_rd_bin(&kc->rd, &v, &vl) < 0)
				return -1;
			it->data = (void *)(uintptr_t)v;
			it->len = vl;
			continue;
		}
		const char *k;
		uint32_t kl;
		if (mp_rd_str(&kc->rd, &k, &kl) < 0 || kl == 0 ||
		    kl > KV_KEY_MAX)
			return -1;
		*it = (struct kv_item){k, kl, NULL, 0};
		kc->key_bytes += kl;
	}
	if (kc->parsed < kc->n)
		return 0;
	if (kc->op != KV_OP_SET || kc->values)
		return 1;
	uint32_t nv; /* the keys are read: now the values */
	if (mp_rd_array(&kc->rd, &nv) < 0 || nv != kc->n)
		return -1;
	kc->values = true;
	kc->parsed = 0;
	return params_read(kc, budget);
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

/*
 * Read the call's params — a stepped call's KV_PARSE_PASS elements a loop
 * pass, going on from kc->next — then hold its bookkeeping and start its
 * first step. Every key and value is checked before any step starts: a
 * call with a bad one changes nothing.
 */
static void call_go(struct kv_call *kc)
{
	int ret = params_read(kc, kc->steps ? KV_PARSE_PASS : UINT_MAX);
	if (ret == 0) {
		rx_timer_start(kc->r, &kc->next, 0, 0); /* never fails */
		return;
	}
	if (ret < 0) {
		rpc_reply_error(call_release(kc), RPC_E_BAD_PARAMS, "%s; %s",
				kc->op == KV_OP_SET
					? "expected [keys, values] with one "
					  "bin value per key"
					: "expected [keys]",
				keys_help);
		return;
	}
	kc->parsing = false;
	if (kc->op == KV_OP_SET && pc_ctx_draining(g.ctx)) {
		unsigned n = kc->n;
		refuse_draining(call_release(kc), n);
		return;
	}
	if (call_hold(kc))
		step_start(kc);
}

static void next_fired(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	struct kv_call *kc = t->arg;
	rx_stall_tag(step_tag[kc->op]);
	if (kc->parsing)
		call_go(kc);
	else
		step_start(kc);
}

/* A call for op whose params start with an array of n keys (p after its
 * header); answered when that is not 1..KV_BATCH_MAX. */
static void call_start(struct rpc_call *call, struct mp_rd *p, enum kv_op op)
{
	uint32_t n;
	if (mp_rd_array(p, &n) < 0 || n == 0 || n > KV_BATCH_MAX) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected %s; %s",
				op == KV_OP_SET ? "[keys, values]" : "[keys]",
				keys_help);
		return;
	}
	struct kv_call *kc = call_new(call, p, op, n);
	if (kc)
		call_go(kc);
}

static void m_set(struct rpc_call *call, struct mp_rd *p)
{
	call_start(call, p, KV_OP_SET);
}

static void m_get(struct rpc_call *call, struct mp_rd *p)
{
	call_start(call, p, KV_OP_GET);
}

static void m_exists(struct rpc_call *call, struct mp_rd *p)
{
	call_start(call, p, KV_OP_EXISTS);
}

static void m_delete(struct rpc_call *call, struct mp_rd *p)
{
	call_start(call, p, KV_OP_DELETE);
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
	g.steps = met_register(MET_COUNTER, "peercache_kv_rpc_steps_total",
			       "kv API calls the kv.* methods made: one per "
			       "call, or one per 4,096 keys of a larger call",
			       NULL);
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
