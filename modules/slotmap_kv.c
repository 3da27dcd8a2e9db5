/*
 * modules/slotmap_kv.c — the kv API of slotmap mode (part of the slotmap
 * module; published as the "kv" service by modules/slotmap.c). kv.* and
 * the local sessions use it exactly as they use p2p's kv.
 *
 * Owns: one call's state (struct sm_op, one arena), its trip through the
 * owners, and per reactor the layouts of the owners it has read from.
 *
 * Where a key lives: its owner is the first member the ring gives for it
 * (the same ring p2p places directory records with); its place there is a
 * bucket of the owner's slot region, in the smallest size class that
 * holds the page (storage/slot_region.h).
 *
 * The paths (docs/slotmap.md):
 *   set    own key: claim a way, one copy into it (client memory: in
 *          slices, with its XXH3 taken on the way), commit. Another
 *          owner's: one copy into a staging buffer (the sources may go as
 *          soon as publish returns, or are a client's memory that can
 *          shrink), then slot.claim at the owner, one transport write per
 *          page straight into the claimed way, slot.commit with the
 *          page's XXH3. Three round trips per owner, batched.
 *   fetch  own key: a seqlock copy out of the slot, its XXH3 taken on
 *          the way: a hit if the slot did not change meanwhile and the
 *          checksum is the header's. Another owner's: its layout (slot.layout, cached per
 *          reactor until a membership change), then ONE transport read of
 *          the key's whole bucket into scratch, the way found by the
 *          header, trailer, key hash and length, and the payload moved to
 *          the destination with its XXH3 taken on the way: a hit only if
 *          the checksum of (key hash, length, payload) is the header's.
 *   get    sizes unknown: the owner is asked the length first (slot.probe),
 *          then as fetch; the page stays in the scratch (no second copy).
 *   exists own keys by the seqlock check; others' by slot.probe, where
 *          the owner makes the same check on its live slot.
 *   remove slot_del here, slot.delete at other owners.
 *
 * Never wrong: a page counts only after the full check of slot_region.h
 * (a local one also after its slot was seen unchanged around the copy: a
 * commit proves nothing about the bytes a remote writer left, see
 * slot_locate). Anything else is a miss. Deadlines: every round trip
 * and read of a call shares its request_deadline; a suspect owner's keys
 * miss at once.
 */
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/arena.h"
#include "common/blocks.h"
#include "common/checksum.h"
#include "common/copy.h"
#include "common/guard.h"
#include "common/log.h"
#include "common/util.h"
#include "modules/copier.h"
#include "modules/membership.h"
#include "modules/peer_health.h"
#include "modules/services.h"
#include "modules/slotmap_int.h"
#include "modules/transport.h"
#include "rpc/client.h"
#include "rpc/rpc.h"
#include "storage/ring.h"

#define LOG_MOD "slotmap"
#define SM_SELF (-1)
#define KV_BATCH_MAX 65536

enum { K_SET, K_FETCH, K_GET, K_EXISTS, K_DEL };
enum { PH_START, PH_PROBE, PH_LAYOUT, PH_READ, PH_CLAIM, PH_WRITE,
       PH_COMMIT, PH_DONE };
enum { CQ_LWRITE, CQ_STAGE, CQ_LREAD, CQ_RREAD };

struct sm_it {
	const char *key;
	size_t klen;
	struct slot_key sk;
	int own;            /* index in op->own, or SM_SELF */
	uint64_t want;      /* set: the page's length; fetch: the wanted one */
	uint64_t len;       /* the page's length when found */
	uint8_t *dst;       /* fetch: the caller's; get: where it is staged */
	const uint8_t *src; /* set: the page's bytes (the caller's or staged) */
	uint8_t *scratch;   /* a remote read: the bucket; a remote set: staged */
	uint64_t hash;      /* remote set: the page's XXH3; remote read: the
			     * header's checksum */
	uint64_t raddr, rseq; /* remote set: the claimed way */
	struct slot_loc loc;
	struct slot_wr w;
	int wres;           /* remote set: the write's result */
	bool ok, claimed, busy, rejected;
	bool big;           /* set: no size class holds the page */
	bool skip;          /* fetch: no destination: a miss */
};

struct sm_own {
	char node[DIR_NODE_MAX];
	struct sm_layout lay; /* a copy; lay.valid once known */
	char data[DIR_NODE_MAX]; /* from slot.claim */
	uint32_t wkey;
	unsigned n;           /* items */
	unsigned *idx;        /* their indexes */
	bool suspect;
};

enum { SM_BLK, SM_BLK_LOCAL }; /* an op's blocks (struct sm_op.blk) */

struct sm_op {
	int kind, phase;
	struct rx_reactor *r;
	struct sm_rx *x;
	unsigned n;
	struct sm_it *it;
	unsigned nown;
	struct sm_own *own;
	const struct kv_item *items; /* the caller's (set: valid until done) */
	bool client_mem; /* guarded copies: a client's memory on one side */
	bool sliced;     /* set: copies in slices (not KV_SRC_NOW) */
	kv_done_fn done;
	kv_got_fn got;
	void (*ex_done)(void *arg, unsigned count);
	void *arg;
	bool *okv;
	uint64_t *lenv;
	uint8_t **datav;
	uint64_t stage_max, staged; /* get: page bytes staged */
	int refused;
	unsigned pending;           /* round trips and batches out */
	struct pc_block_set blk;    /* b[SM_BLK]: remote scratch or staging;
				     * b[SM_BLK_LOCAL]: get's local staging */
	uint64_t held;              /* of the node's staging budget */
	struct tp_read *reads;
	unsigned read_ms;           /* the bucket reads' timeout */
	struct tp_write *writes;
	unsigned *cq;               /* copies to make: item << 2 | CQ_* */
	unsigned cq_n, cq_i;
	bool copying;
	bool cancelled;             /* a copy met the client's memory given
				     * up: none of the rest is made */
	struct copier_job job;
	uint64_t t0, deadline;
};

/* One slot.* call to an owner: items own->idx[from, from + cnt). */
struct sm_call {
	struct sm_op *o;
	unsigned own, from, cnt;
};

static _Thread_local struct sm_rx *t_x;

/* ---------------------------------------------------------- the budget */

static int hold(uint64_t bytes)
{
	return pc_budget_hold(&sm_st.staging, bytes);
}

static void release(uint64_t bytes)
{
	pc_budget_release(&sm_st.staging, bytes);
}

/* Block which of the op (SM_BLK, SM_BLK_LOCAL), of bytes of the budget
 * (one the reactor kept, if one fits): NULL when over the budget or out of
 * memory. */
static uint8_t *take_block(struct sm_op *o, unsigned which, uint64_t bytes)
{
	if (!bytes || hold(bytes) < 0)
		return NULL;
	uint8_t *b = pc_block_set_take(&o->blk, which, bytes);
	if (!b) {
		release(bytes);
		return NULL;
	}
	o->held += bytes;
	return b;
}

/* ------------------------------------------------------------- layouts */

struct sm_layout *sm_layout_slot(struct sm_rx *x, const char *node)
{
	return &x->lay[XXH3_64bits(node, strlen(node)) % SM_LAYOUTS];
}

/* ------------------------------------------------------------ the call */

static unsigned left_ms(const struct sm_op *o)
{
	uint64_t now = pc_now_ns();
	if (now >= o->deadline)
		return 0;
	uint64_t ms = (o->deadline - now) / 1000000u;
	return (unsigned)PC_MAX(1, PC_MIN(ms, (uint64_t)sm_st.timeout_ms));
}

static struct sm_op *op_layout(struct pc_arena *a, const struct kv_item *in,
			       unsigned n, unsigned owners)
{
	struct sm_op *o = pc_arena_take(a, sizeof(*o));
	struct sm_it *it = pc_arena_take(a, n * sizeof(*it));
	struct sm_own *own = pc_arena_take(a, owners * sizeof(*own));
	unsigned *idx = pc_arena_take(a, n * sizeof(*idx));
	bool *okv = pc_arena_take(a, n * sizeof(*okv));
	uint64_t *lenv = pc_arena_take(a, n * sizeof(*lenv));
	uint8_t **datav = pc_arena_take(a, n * sizeof(*datav));
	struct tp_read *reads = pc_arena_take(a, n * sizeof(*reads));
	unsigned *cq = pc_arena_take(a, n * sizeof(*cq));
	if (o)
		*o = (struct sm_op){.n = n, .it = it, .own = own, .okv = okv,
				    .lenv = lenv, .datav = datav,
				    .reads = reads,
				    .writes = (struct tp_write *)(void *)reads,
				    .cq = cq};
	for (unsigned i = 0; i < n; i++) {
		char *k = pc_arena_take(a, in[i].klen);
		if (!it)
			continue;
		memcpy(k, in[i].key, in[i].klen);
		it[i] = (struct sm_it){.key = k, .klen = in[i].klen};
		slot_key_of(&it[i].sk, k, in[i].klen);
	}
	if (o)
		o->own = own, own[0].idx = idx; /* idx split by owner later */
	return o;
}

_Static_assert(sizeof(struct tp_write) <= sizeof(struct tp_read),
	       "writes share the reads' array");

/* A call of kind on items: its state, the owner of every key, and the
 * items grouped by owner. NULL: -EINVAL or -ENOMEM in *err. */
static struct sm_op *op_new(struct rx_reactor *r, int kind,
			    const struct kv_item *in, unsigned n, int *err)
{
	*err = -EINVAL;
	if (!sm_st.on || n == 0 || n > KV_BATCH_MAX || !t_x)
		return NULL;
	for (unsigned i = 0; i < n; i++)
		if (in[i].klen == 0 || in[i].klen > DIR_KEY_MAX)
			return NULL;
	struct ring *ring = sm_st.mb->ring();
	unsigned members = ring ? ring_size(ring) : 1;
	if (!members)
		members = 1;
	unsigned nown_max = PC_MIN(members, n);
	struct pc_arena a;
	pc_arena_plan(&a);
	op_layout(&a, in, n, nown_max);
	pc_arena_take(&a, members * sizeof(int));
	*err = -ENOMEM;
	if (!pc_arena_alloc(&a))
		return NULL;
	struct sm_op *o = op_layout(&a, in, n, nown_max);
	int *slot_of_member = pc_arena_take(&a, members * sizeof(int));
	for (unsigned m = 0; m < members; m++)
		slot_of_member[m] = -2;
	o->kind = kind;
	o->r = r;
	o->x = t_x;
	o->blk.home = rx_reactor_blocks(r);
	o->items = in;
	o->t0 = pc_now_ns();
	o->deadline = o->t0 + sm_st.deadline_ns;
	unsigned *all_idx = o->own[0].idx;
	/* owner of each item; count per owner */
	for (unsigned i = 0; i < n; i++) {
		struct sm_it *t = &o->it[i];
		unsigned mi = 0;
		if (!ring || ring_owners(ring, t->key, t->klen, 1, &mi) == 0) {
			t->own = SM_SELF; /* no ring yet: this node alone */
			continue;
		}
		if (slot_of_member[mi] == -2) {
			const char *id = ring_member(ring, mi);
			if (strcmp(id, sm_st.cl->self_id) == 0) {
				slot_of_member[mi] = SM_SELF;
			} else {
				struct sm_own *w = &o->own[o->nown];
				slot_of_member[mi] = (int)o->nown++;
				snprintf(w->node, sizeof(w->node), "%s", id);
				w->suspect = sm_st.health &&
					     sm_st.health->suspect(id);
				struct sm_layout *c =
					sm_layout_slot(o->x, id);
				if (c->valid && strcmp(c->node, id) == 0)
					w->lay = *c;
			}
		}
		t->own = slot_of_member[mi];
		if (t->own >= 0)
			o->own[t->own].n++;
	}
	unsigned at = 0;
	for (unsigned w = 0; w < o->nown; w++) {
		o->own[w].idx = all_idx + at;
		at += o->own[w].n;
		o->own[w].n = 0;
	}
	for (unsigned i = 0; i < n; i++)
		if (o->it[i].own >= 0) {
			struct sm_own *w = &o->own[o->it[i].own];
			w->idx[w->n++] = i;
		}
	return o;
}

static void op_free(struct sm_op *o)
{
	pc_block_set_put(&o->blk);
	if (o->held)
		release(o->held);
	free(o); /* the arena */
}

static void count_read(struct sm_op *o)
{
	uint64_t hits = 0, bytes = 0, local = 0, remote = 0, rej = 0;
	for (unsigned i = 0; i < o->n; i++) {
		struct sm_it *t = &o->it[i];
		rej += t->rejected;
		if (!t->ok)
			continue;
		hits++;
		bytes += t->len;
		if (t->own == SM_SELF)
			local++;
		else
			remote++;
	}
	met_add(sm_st.rd_req, o->n);
	met_add(sm_st.rd_hit, hits);
	met_add(sm_st.rd_miss, o->n - hits);
	met_add(sm_st.rd_bytes, bytes);
	met_add(sm_st.rd_local, local);
	met_add(sm_st.rd_remote, remote);
	met_add(sm_st.src_local, local);
	met_add(sm_st.src_remote, remote);
	met_add(sm_st.src_rejected, rej);
	met_add(sm_st.src_miss, o->n - hits - rej);
	met_observe_ns(sm_st.lat_read, pc_now_ns() - o->t0);
}

static void op_finish(struct sm_op *o)
{
	o->phase = PH_DONE;
	if (pc_now_ns() + RX_MS(1) >= o->deadline && o->nown)
		met_inc(sm_st.deadline_hit);
	for (unsigned i = 0; i < o->n; i++) {
		o->okv[i] = o->it[i].ok;
		o->lenv[i] = o->it[i].ok ? o->it[i].len : 0;
		o->datav[i] = o->it[i].ok ? o->it[i].dst : NULL;
	}
	switch (o->kind) {
	case K_SET: {
		uint64_t pages = 0, bytes = 0, local = 0;
		for (unsigned i = 0; i < o->n; i++) {
			struct sm_it *t = &o->it[i];
			if (t->ok) {
				pages++;
				bytes += t->want;
				local += t->own == SM_SELF;
			} else if (t->busy) {
				met_inc(sm_st.wr_fail_busy);
			} else if (t->big) {
				met_inc(sm_st.wr_fail_big);
			} else if (t->len && t->own >= 0) {
				/* t->len: the page's length (want is 0 for a
				 * page not sent: suspect owner, no staging) */
				met_inc(sm_st.wr_fail_remote);
			}
		}
		met_add(sm_st.wr_pages, pages);
		met_add(sm_st.wr_bytes, bytes);
		met_add(sm_st.wr_local, local);
		met_add(sm_st.wr_remote, pages - local);
		met_observe_ns(sm_st.lat_write, pc_now_ns() - o->t0);
		o->done(o->arg, o->okv, o->n);
		break;
	}
	case K_FETCH:
		count_read(o);
		o->done(o->arg, o->okv, o->n);
		break;
	case K_GET: {
		count_read(o);
		struct kv_got got = {o->n, o->okv, o->lenv, o->datav,
				     o->staged, o->refused, &o->blk};
		o->got(o->arg, &got);
		break;
	}
	case K_EXISTS: {
		unsigned c = 0;
		while (c < o->n && o->it[c].ok)
			c++;
		met_add(sm_st.ex_found, c);
		o->ex_done(o->arg, c);
		break;
	}
	case K_DEL:
		o->done(o->arg, o->okv, o->n);
		break;
	}
	op_free(o);
}

static void advance(struct sm_op *o);

/* --------------------------------------------------------------- copies */

static void settle_copy(struct sm_op *o, unsigned e)
{
	struct sm_it *t = &o->it[e >> 2];
	int res = o->job.res;
	if (res == -ECANCELED)
		o->cancelled = true;
	if (res == 0 && o->job.dst) /* bytes copied (not only summed) */
		met_add((e & 3) == CQ_LREAD	  ? sm_st.copy_get_local
			: (e & 3) == CQ_RREAD ? sm_st.copy_get_remote
					      : sm_st.copy_set,
			t->len);
	switch (e & 3) {
	case CQ_LWRITE:
		if (res < 0) {
			slot_write_abort(sm_st.reg, &t->w);
		} else {
			slot_write_commit_hashed(sm_st.reg, &t->w, o->job.sumv);
			t->ok = true;
		}
		break;
	case CQ_STAGE:
		if (res == 0)
			t->hash = o->job.sumv;
		else
			t->want = 0; /* not sent: a failure */
		break;
	case CQ_LREAD:
		/* unchanged around the copy, and the bytes the commit named */
		t->ok = res == 0 && slot_loc_still(&t->loc) &&
			(!sm_st.check_sum ||
			 slot_loc_sum_ok(&t->sk, &t->loc, o->job.sumv));
		t->rejected = res == 0 && !t->ok;
		break;
	case CQ_RREAD:
		t->ok = res == 0 &&
			(!sm_st.check_sum ||
			 slot_sum_hashed(&t->sk, t->len, o->job.sumv) == t->hash);
		t->rejected = res == 0 && !t->ok;
		break;
	}
}

static void pump(struct sm_op *o);
static int local_begin(struct sm_it *t);

static void copied(struct copier_job *j)
{
	struct sm_op *o = j->arg;
	settle_copy(o, o->cq[o->cq_i++]);
	o->copying = false;
	pump(o);
	advance(o);
}

/* Start the queued copies one after the other (a copy of client memory
 * or of a large page goes over loop passes). */
static void pump(struct sm_op *o)
{
	while (!o->copying && o->cq_i < o->cq_n) {
		unsigned e = o->cq[o->cq_i];
		struct sm_it *t = &o->it[e >> 2];
		if (o->cancelled) {
			/* The client gave its memory up (copier_cancel_range)
			 * and node memory replaced it: a page copied from
			 * there now would be stored as the key's. None is. */
			if ((e & 3) == CQ_STAGE)
				t->want = 0;
			o->cq_i++;
			continue;
		}
		struct copier_job *j = &o->job;
		*j = (struct copier_job){.len = t->len, .done = copied,
					 .arg = o};
		switch (e & 3) {
		case CQ_LWRITE:
			if (local_begin(t) < 0) {
				o->cq_i++; /* not stored */
				continue;
			}
			j->dst = t->w.payload;
			j->src = t->src;
			j->guarded = o->client_mem;
			j->sum = true;
			break;
		case CQ_STAGE:
			j->dst = t->scratch;
			j->src = t->src;
			j->guarded = o->client_mem;
			j->sum = true;
			break;
		case CQ_LREAD:
			j->dst = t->dst;
			j->src = t->loc.payload;
			j->guarded = o->client_mem;
			j->sum = sm_st.check_sum;
			break;
		case CQ_RREAD: /* dst NULL: the page stays where it is */
			j->dst = t->dst == t->src ? NULL : t->dst;
			j->src = t->src;
			j->guarded = j->dst && o->client_mem;
			j->sum = sm_st.check_sum;
			break;
		}
		if (copier_copy(o->r, j) == 0) {
			o->copying = true;
			return;
		}
		settle_copy(o, e);
		o->cq_i++;
	}
}

/* Claim a way of this node's region for item t's page. Claimed one at a
 * time, just before its copy, so that a batch with more pages for one
 * bucket than it has ways fills it as a run of single sets would (the
 * later pages evict the earlier), instead of finding every way busy. */
static int local_begin(struct sm_it *t)
{
	int ret = slot_write_begin(sm_st.reg, &t->sk, t->want, &t->w);
	if (ret == -EBUSY)
		t->busy = true;
	else if (ret < 0)
		t->big = true;
	return ret;
}

static void queue_copy(struct sm_op *o, unsigned i, unsigned kind)
{
	o->cq[o->cq_n++] = i << 2 | kind;
}

/* -------------------------------------------------------- owners' calls */

typedef void (*call_fn)(struct sm_call *c, const struct rpc_result *res);

static void call_done(void *arg, const struct rpc_result *res);

struct call_box {
	struct sm_call c;
	call_fn fn;
};

/* The owner did not answer: tell the health service (evidence only when
 * the call had its whole timeout). */
static void owner_failed(struct sm_op *o, struct sm_own *w,
			 const struct rpc_result *res, const char *what,
			 unsigned timeout_ms)
{
	if (res->err == -ESHUTDOWN || res->err == 0 ||
	    res->err == -EREMOTEIO)
		return;
	char why[256];
	PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s at %s failed: %s (misses)", what,
		  w->node, rpc_result_str(res, why, sizeof(why)));
	if (sm_st.health && ph_evidence(res->err, timeout_ms))
		sm_st.health->failed(w->node, res->err, what);
	(void)o;
}

/* Send method to owner w for items idx[from, from+cnt) with the params
 * pack writes; fn takes the answer. false when it could not be sent. */
static bool call_owner(struct sm_op *o, unsigned w, unsigned from,
		       unsigned cnt, const char *method, uint32_t nparams,
		       void (*pack)(struct sm_op *o, struct sm_own *w,
				    unsigned from, unsigned cnt,
				    msgpack_packer *pk),
		       call_fn fn)
{
	unsigned ms = left_ms(o);
	if (!ms)
		return false;
	struct call_box *b = malloc(sizeof(*b));
	if (!b)
		return false;
	*b = (struct call_box){{o, w, from, cnt}, fn};
	struct rpc_req *q = rpc_req_new(o->x->cl, o->own[w].node, method,
					nparams, ms, call_done, b);
	if (!q) {
		free(b);
		return false;
	}
	pack(o, &o->own[w], from, cnt, rpc_req_packer(q));
	o->pending++;
	rpc_req_send(q);
	return true;
}

static void call_done(void *arg, const struct rpc_result *res)
{
	struct call_box *b = arg;
	struct sm_op *o = b->c.o;
	b->fn(&b->c, res);
	free(b);
	o->pending--;
	advance(o);
}

/* Call method for every owner's items (not the suspect), in chunks. */
static void call_owners(struct sm_op *o, const char *method, uint32_t np,
			bool (*wants)(struct sm_op *o, struct sm_own *w),
			void (*pack)(struct sm_op *o, struct sm_own *w,
				     unsigned from, unsigned cnt,
				     msgpack_packer *pk),
			call_fn fn)
{
	for (unsigned w = 0; w < o->nown; w++) {
		struct sm_own *ow = &o->own[w];
		if (ow->suspect || !wants(o, ow))
			continue;
		for (unsigned f = 0; f < ow->n; f += SM_BATCH_MAX)
			call_owner(o, w, f, PC_MIN(SM_BATCH_MAX, ow->n - f),
				   method, np, pack, fn);
	}
}

static void pack_keys(struct sm_op *o, struct sm_own *w, unsigned from,
		      unsigned cnt, msgpack_packer *pk)
{
	msgpack_pack_array(pk, cnt);
	for (unsigned k = 0; k < cnt; k++) {
		struct sm_it *t = &o->it[w->idx[from + k]];
		msgpack_pack_str_with_body(pk, t->key, t->klen);
	}
}

static bool wants_all(struct sm_op *o, struct sm_own *w)
{
	(void)o;
	return w->n > 0;
}

/* ---- slot.probe: lengths (get) or presence (exists) */

static void pack_probe(struct sm_op *o, struct sm_own *w, unsigned from,
		       unsigned cnt, msgpack_packer *pk)
{
	pack_keys(o, w, from, cnt, pk);
	msgpack_pack_uint64(pk, 0);
}

static void probed(struct sm_call *c, const struct rpc_result *res)
{
	struct sm_op *o = c->o;
	struct sm_own *w = &o->own[c->own];
	struct mp_rd rd = res->result;
	uint32_t n;
	if (res->err || mp_rd_array(&rd, &n) < 0 || n != c->cnt) {
		owner_failed(o, w, res, "slot.probe", sm_st.timeout_ms);
		return;
	}
	for (unsigned k = 0; k < c->cnt; k++) {
		struct sm_it *t = &o->it[w->idx[c->from + k]];
		uint64_t len;
		if (mp_rd_uint(&rd, &len) < 0)
			return;
		if (o->kind == K_EXISTS)
			t->ok = len > 0;
		else
			t->want = len; /* get: read it at this length */
	}
}

/* ---- slot.layout */

static bool wants_layout(struct sm_op *o, struct sm_own *w)
{
	if (w->lay.valid)
		return false;
	for (unsigned k = 0; k < w->n; k++)
		if (o->it[w->idx[k]].want)
			return true;
	return false;
}

static void pack_none(struct sm_op *o, struct sm_own *w, unsigned from,
		      unsigned cnt, msgpack_packer *pk)
{
	(void)o, (void)w, (void)from, (void)cnt, (void)pk;
}

static void got_layout(struct sm_call *c, const struct rpc_result *res)
{
	struct sm_op *o = c->o;
	struct sm_own *w = &o->own[c->own];
	struct sm_layout l;
	struct mp_rd rd = res->result;
	if (res->err) {
		owner_failed(o, w, res, "slot.layout", sm_st.timeout_ms);
		return;
	}
	if (sm_layout_read(&rd, &l) < 0 || strcmp(l.node, w->node) != 0) {
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s answered slot.layout with a "
			  "layout that is not its own or not sane (misses)",
			  w->node);
		return;
	}
	l.valid = true;
	w->lay = l;
	*sm_layout_slot(o->x, w->node) = l;
	met_inc(sm_st.layouts_fetched);
}

/* ---- the bucket reads (fetch, get) */

static void read_done(void *arg, struct tp_read *reads, unsigned n)
{
	struct sm_op *o = arg;
	for (unsigned k = 0; k < n; k++) {
		struct tp_read *rd = &reads[k];
		unsigned i = (unsigned)(uintptr_t)rd->hdr;
		struct sm_it *t = &o->it[i];
		struct sm_own *w = &o->own[t->own];
		if (rd->res < 0) {
			if (rd->res == -EFAULT) /* a new region: new layout */
				sm_layout_slot(o->x, w->node)->valid = false;
			else if (sm_st.health &&
				 ph_evidence(rd->res, o->read_ms))
				sm_st.health->failed(w->node, rd->res,
						     "data read");
			continue;
		}
		int c = slot_class_for(&w->lay.l, t->want);
		const struct slot_class *cls = &w->lay.l.cls[c];
		uint64_t len = 0;
		/* Judged without the checksum (false below): the copier takes
		 * it in slices (a batch of large pages would hold the reactor
		 * for milliseconds here). */
		const uint8_t *slot = t->scratch;
		if (rd->narrowed) { /* the owner sent the key's way only */
			enum slot_verdict v = slot_judge_sel(
				t->scratch, rd->got, cls, &t->sk, t->want,
				false, &len);
			if (v != SLOT_HIT) {
				t->rejected = v == SLOT_BAD;
				continue;
			}
		} else { /* the whole bucket */
			struct slot_scan sc = {0};
			int way = slot_find(t->scratch, cls, &t->sk, t->want,
					    false, &len, &sc);
			if (way < 0) {
				t->rejected = sc.rejected > 0;
				continue;
			}
			slot += (uint64_t)way * cls->stride;
		}
		t->len = len;
		const struct slot_hdr *h = (const struct slot_hdr *)slot;
		t->hash = h->sum;
		t->src = slot + SLOT_HDR_BYTES;
		if (o->kind == K_GET) /* the page stays in the scratch: a
				       * checksum of it, no copy */
			t->dst = (uint8_t *)t->src;
		queue_copy(o, i, CQ_RREAD);
	}
	o->pending--;
	pump(o);
	advance(o);
}

/* The class of the owner's region item t's page is read from, or NULL
 * when it is not read (own key, no length, owner suspect or without a
 * layout, or no class there holds the length). */
static const struct slot_class *read_class(const struct sm_op *o,
					   const struct sm_it *t)
{
	if (t->own < 0 || !t->want || o->own[t->own].suspect ||
	    !o->own[t->own].lay.valid)
		return NULL;
	const struct slot_layout *l = &o->own[t->own].lay.l;
	int c = slot_class_for(l, t->want);
	return c < 0 ? NULL : &l->cls[c];
}

/* One read of each remote key's bucket, all in one batch. */
static void start_reads(struct sm_op *o)
{
	uint64_t need = 0;
	for (unsigned i = 0; i < o->n; i++) {
		struct sm_it *t = &o->it[i];
		const struct slot_class *cls = read_class(o, t);
		if (!cls || o->refused) {
			t->want = 0; /* a miss */
			continue;
		}
		if (o->kind == K_GET) { /* the page goes in the reply */
			if (o->staged + t->want > o->stage_max) {
				o->refused = -E2BIG;
				t->want = 0;
				continue;
			}
			o->staged += t->want;
		}
		need += slot_bucket_bytes(cls);
	}
	unsigned ms = left_ms(o);
	if (!need || !ms)
		return;
	o->read_ms = ms;
	uint8_t *at = take_block(o, SM_BLK, need);
	if (!at) {
		if (o->kind == K_GET && !o->refused)
			o->refused = -EBUSY;
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "no staging for %llu bytes of "
			  "bucket reads (kv_staging_max %llu): misses",
			  (unsigned long long)need,
			  (unsigned long long)sm_st.staging.max);
		return;
	}
	unsigned k = 0;
	for (unsigned i = 0; i < o->n; i++) {
		struct sm_it *t = &o->it[i];
		const struct slot_class *cls = read_class(o, t);
		if (!cls)
			continue;
		const struct sm_layout *l = &o->own[t->own].lay;
		struct tp_read *rd = &o->reads[k++];
		memset(rd, 0, sizeof(*rd));
		snprintf(rd->peer, sizeof(rd->peer), "%s", l->data);
		rd->node = o->own[t->own].node;
		rd->rkey = l->rkey;
		rd->addr = l->base + slot_bucket_off(cls, &t->sk);
		rd->len = (uint32_t)slot_bucket_bytes(cls);
		/* The owner may send only the key's way (TCP); a one-sided
		 * transport brings the bucket. read_done takes either. */
		rd->select = !sm_st.whole_reads;
		uint64_t sel[2] = {htole64(t->sk.lo), htole64(t->sk.hi)};
		memcpy(rd->sel, sel, sizeof(rd->sel));
		rd->dst = at;
		/* hdr_len 0: hdr carries the item's index back */
		rd->hdr = (void *)(uintptr_t)i;
		t->scratch = at;
		at += rd->len;
	}
	if (sm_st.tp->ops->read_batch(sm_st.tp->clients[rx_reactor_id(o->r)],
				      o->reads, k, ms, read_done, o) == 0)
		o->pending++;
}

/* ---- remote sets: slot.claim, the writes, slot.commit */

static bool wants_claim(struct sm_op *o, struct sm_own *w)
{
	for (unsigned k = 0; k < w->n; k++)
		if (o->it[w->idx[k]].want)
			return true;
	return false;
}

static void pack_claim(struct sm_op *o, struct sm_own *w, unsigned from,
		       unsigned cnt, msgpack_packer *pk)
{
	/* items without a page (staging failed) ask for 0 bytes: nil */
	pack_keys(o, w, from, cnt, pk);
	msgpack_pack_array(pk, cnt);
	for (unsigned k = 0; k < cnt; k++)
		msgpack_pack_uint64(pk, o->it[w->idx[from + k]].want);
}

static void claimed(struct sm_call *c, const struct rpc_result *res)
{
	struct sm_op *o = c->o;
	struct sm_own *w = &o->own[c->own];
	struct mp_rd rd = res->result;
	uint32_t n, three, two, dl;
	const char *d;
	uint64_t wkey;
	if (res->err || mp_rd_array(&rd, &three) < 0 || three != 3 ||
	    mp_rd_str(&rd, &d, &dl) < 0 || dl == 0 || dl >= DIR_NODE_MAX ||
	    mp_rd_uint(&rd, &wkey) < 0 || mp_rd_array(&rd, &n) < 0 ||
	    n != c->cnt) {
		owner_failed(o, w, res, "slot.claim", sm_st.timeout_ms);
		return;
	}
	memcpy(w->data, d, dl);
	w->data[dl] = 0;
	w->wkey = (uint32_t)wkey;
	for (unsigned k = 0; k < c->cnt; k++) {
		struct sm_it *t = &o->it[w->idx[c->from + k]];
		bool stored;
		if (mp_rd_try_nil(&rd)) {
			/* not stored: too large or busy there; the cluster's
			 * nodes share their classes, so ours tell which */
			t->big = t->want && slot_class_for(&sm_st.lay, t->want) < 0;
			continue;
		}
		if (mp_rd_bool(&rd, &stored) == 0) {
			/* superseded: later pages of the call take its place */
			t->ok = stored && t->want > 0;
			continue;
		}
		if (mp_rd_array(&rd, &two) < 0 || two != 2 ||
		    mp_rd_uint(&rd, &t->raddr) < 0 ||
		    mp_rd_uint(&rd, &t->rseq) < 0)
			return;
		t->claimed = t->want > 0;
		t->wres = -ECANCELED; /* not written until start_writes says */
	}
}

/* Did a failed WRITE surely not land? The owner refused it, or it was
 * never sent. Any other failure (a timeout, a lost connection) may leave
 * it on its way to the owner: if the way were given back and claimed
 * again, it would land in that claim (a WRITE names no claim). */
static bool write_never_landed(int res)
{
	return res == -EACCES || res == -EFAULT || res == -EINVAL;
}

static void written(void *arg, struct tp_write *ws, unsigned n)
{
	struct sm_op *o = arg;
	for (unsigned k = 0; k < n; k++) {
		struct sm_it *t = &o->it[(uintptr_t)ws[k].hdr];
		t->wres = ws[k].res;
		if (t->wres && !write_never_landed(t->wres))
			t->claimed = false; /* not committed: it expires */
	}
	o->pending--;
	advance(o);
}

static void start_writes(struct sm_op *o)
{
	unsigned k = 0, ms = left_ms(o);
	for (unsigned i = 0; i < o->n && ms; i++) {
		struct sm_it *t = &o->it[i];
		if (!t->claimed)
			continue;
		struct sm_own *w = &o->own[t->own];
		struct tp_write *wr = &o->writes[k++];
		memset(wr, 0, sizeof(*wr));
		snprintf(wr->peer, sizeof(wr->peer), "%s", w->data);
		wr->node = w->node;
		wr->rkey = w->wkey;
		wr->addr = t->raddr;
		wr->len = (uint32_t)t->want;
		wr->src = t->scratch;
		wr->hdr = (const void *)(uintptr_t)i; /* hdr_len 0: the index */
		t->wres = -ECANCELED;
	}
	if (k && sm_st.tp->ops->write_batch(sm_st.tp->clients[rx_reactor_id(o->r)],
					 o->writes, k, ms, written, o) == 0)
		o->pending++;
}

static bool wants_commit(struct sm_op *o, struct sm_own *w)
{
	for (unsigned k = 0; k < w->n; k++)
		if (o->it[w->idx[k]].claimed)
			return true;
	return false;
}

static void pack_commit(struct sm_op *o, struct sm_own *w, unsigned from,
			unsigned cnt, msgpack_packer *pk)
{
	unsigned m = 0;
	for (unsigned k = 0; k < cnt; k++)
		m += o->it[w->idx[from + k]].claimed;
	msgpack_pack_array(pk, m);
	for (unsigned k = 0; k < cnt; k++) {
		struct sm_it *t = &o->it[w->idx[from + k]];
		if (!t->claimed)
			continue;
		msgpack_pack_array(pk, 3);
		msgpack_pack_uint64(pk, t->raddr);
		msgpack_pack_uint64(pk, t->rseq);
		if (t->wres == 0)
			msgpack_pack_uint64(pk, t->hash);
		else
			msgpack_pack_nil(pk); /* give the way back */
	}
}

static void committed(struct sm_call *c, const struct rpc_result *res)
{
	struct sm_op *o = c->o;
	struct sm_own *w = &o->own[c->own];
	struct mp_rd rd = res->result;
	uint32_t n, m = 0;
	for (unsigned k = 0; k < c->cnt; k++)
		m += o->it[w->idx[c->from + k]].claimed;
	if (res->err || mp_rd_array(&rd, &n) < 0 || n != m) {
		owner_failed(o, w, res, "slot.commit", sm_st.timeout_ms);
		return;
	}
	for (unsigned k = 0; k < c->cnt; k++) {
		struct sm_it *t = &o->it[w->idx[c->from + k]];
		bool v = false;
		if (!t->claimed)
			continue;
		if (mp_rd_bool(&rd, &v) < 0)
			return;
		t->ok = v && t->wres == 0;
		t->len = t->want;
	}
}

/* Commit calls carry only claimed items: an owner's chunk may be empty. */
static void commit_all(struct sm_op *o)
{
	for (unsigned w = 0; w < o->nown; w++) {
		struct sm_own *ow = &o->own[w];
		if (!wants_commit(o, ow))
			continue;
		for (unsigned f = 0; f < ow->n; f += SM_BATCH_MAX) {
			unsigned cnt = PC_MIN(SM_BATCH_MAX, ow->n - f), m = 0;
			for (unsigned k = 0; k < cnt; k++)
				m += o->it[ow->idx[f + k]].claimed;
			if (m && !call_owner(o, w, f, cnt, "slot.commit", 1,
					     pack_commit, committed)) {
				/* not sent: the claims expire at the owner */
			}
		}
	}
}

/* ---- slot.delete */

static void deleted(struct sm_call *c, const struct rpc_result *res)
{
	struct sm_op *o = c->o;
	struct sm_own *w = &o->own[c->own];
	struct mp_rd rd = res->result;
	uint32_t n;
	if (res->err || mp_rd_array(&rd, &n) < 0 || n != c->cnt) {
		owner_failed(o, w, res, "slot.delete", sm_st.timeout_ms);
		return;
	}
	for (unsigned k = 0; k < c->cnt; k++) {
		bool v = false;
		if (mp_rd_bool(&rd, &v) < 0)
			return;
		o->it[w->idx[c->from + k]].ok = v;
	}
}

/* --------------------------------------------------------- the phases */

/* Move the call on once nothing of the current phase is out. A set's
 * claims wait for its copies (they stage the bytes to send); a read's
 * round trips run beside its local copies; the end waits for them all. */
static void advance(struct sm_op *o)
{
	for (;;) {
		if (o->pending || o->phase == PH_DONE)
			return;
		if (o->copying && (o->phase == PH_COMMIT || o->kind == K_SET))
			return;
		switch (o->phase) {
		case PH_START:
			o->phase = o->kind == K_GET || o->kind == K_EXISTS
					   ? PH_PROBE
				   : o->kind == K_FETCH ? PH_LAYOUT
				   : o->kind == K_SET	? PH_CLAIM
							: PH_COMMIT;
			if (o->kind == K_GET || o->kind == K_EXISTS)
				call_owners(o, "slot.probe", 2, wants_all,
					    pack_probe, probed);
			else if (o->kind == K_DEL)
				call_owners(o, "slot.delete", 1, wants_all,
					    pack_keys, deleted);
			else if (o->kind == K_FETCH)
				call_owners(o, "slot.layout", 0, wants_layout,
					    pack_none, got_layout);
			else if (o->cq_i == o->cq_n) /* sets: after copies */
				call_owners(o, "slot.claim", 2, wants_claim,
					    pack_claim, claimed);
			break;
		case PH_PROBE:
			if (o->kind == K_EXISTS) {
				o->phase = PH_COMMIT; /* nothing more */
				break;
			}
			o->phase = PH_LAYOUT;
			call_owners(o, "slot.layout", 0, wants_layout,
				    pack_none, got_layout);
			break;
		case PH_LAYOUT:
			o->phase = PH_READ;
			start_reads(o);
			break;
		case PH_READ:
			o->phase = PH_COMMIT;
			break;
		case PH_CLAIM:
			o->phase = PH_WRITE;
			start_writes(o);
			break;
		case PH_WRITE:
			o->phase = PH_COMMIT;
			commit_all(o);
			break;
		case PH_COMMIT:
			op_finish(o);
			return;
		}
		if (o->cq_i < o->cq_n)
			pump(o);
	}
}

/* ------------------------------------------------------------- the API */

/* freed is not run: a remote page's write sends its source. */
static int sm_publish(struct rx_reactor *r, const struct kv_item *items,
		      unsigned n, enum kv_src src, kv_freed_fn freed,
		      kv_done_fn done, void *arg)
{
	(void)freed;
	int err;
	struct sm_op *o = op_new(r, K_SET, items, n, &err);
	if (!o)
		return err;
	o->kind = K_SET;
	o->client_mem = src == KV_SRC_CLIENT;
	o->sliced = src != KV_SRC_NOW;
	o->done = done;
	o->arg = arg;
	met_inc(sm_st.wr_req);
	uint64_t stage = 0;
	for (unsigned i = 0; i < n; i++) {
		struct sm_it *t = &o->it[i];
		t->want = items[i].len;
		t->src = items[i].data;
		t->len = t->want;
		if (!t->want || t->want > SLOT_PAYLOAD_MAX) {
			t->big = t->want > SLOT_PAYLOAD_MAX;
			t->want = 0;
			continue;
		}
		if (t->own >= 0) {
			if (o->own[t->own].suspect)
				t->want = 0;
			else
				stage += t->want;
			continue;
		}
		if (o->sliced) { /* claimed when its copy starts (pump) */
			queue_copy(o, i, CQ_LWRITE);
			continue;
		}
		if (local_begin(t) == 0) {
			pc_copy(t->w.payload, t->src, t->want);
			met_add(sm_st.copy_set, t->want);
			slot_write_commit(sm_st.reg, &t->w);
			t->ok = true;
		}
	}
	/* Other owners' pages: staged now (the sources may not outlive this
	 * call, or may shrink under a transport write). */
	uint8_t *at = stage ? take_block(o, SM_BLK, stage) : NULL;
	if (stage && !at)
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "no staging for %llu bytes of "
			  "pages to other owners (kv_staging_max %llu): not "
			  "stored", (unsigned long long)stage,
			  (unsigned long long)sm_st.staging.max);
	for (unsigned i = 0; i < n; i++) {
		struct sm_it *t = &o->it[i];
		if (t->own < 0 || !t->want)
			continue;
		if (!at) {
			t->want = 0;
			continue;
		}
		t->scratch = at;
		at += t->want;
		if (o->sliced) {
			queue_copy(o, i, CQ_STAGE);
			continue;
		}
		pc_copy(t->scratch, t->src, t->want);
		met_add(sm_st.copy_set, t->want);
		t->hash = pc_page_sum(t->scratch, t->want);
	}
	pump(o);
	advance(o);
	return 0;
}

/* Own keys of a fetch or get: find them; fetch copies to the caller. */
static void local_reads(struct sm_op *o)
{
	uint64_t stage = 0;
	for (unsigned i = 0; i < o->n; i++) {
		struct sm_it *t = &o->it[i];
		if (t->own != SM_SELF || t->skip)
			continue;
		int64_t len = slot_locate(sm_st.reg, &t->sk, t->want, &t->loc);
		if (len <= 0) {
			t->loc.slot = NULL;
			continue;
		}
		t->len = (uint64_t)len;
		if (o->kind == K_FETCH) {
			queue_copy(o, i, CQ_LREAD);
		} else if (o->refused || o->staged + t->len > o->stage_max) {
			/* the first refusal ends the staging (kv.h) */
			if (!o->refused)
				o->refused = -E2BIG;
			t->loc.slot = NULL;
		} else {
			o->staged += t->len;
			stage += t->len;
		}
	}
	if (o->kind != K_GET || !stage)
		return;
	uint8_t *at = take_block(o, SM_BLK_LOCAL, stage);
	if (!at) {
		if (!o->refused)
			o->refused = -EBUSY;
		return;
	}
	for (unsigned i = 0; i < o->n; i++) {
		struct sm_it *t = &o->it[i];
		if (t->own != SM_SELF || !t->loc.slot)
			continue;
		t->dst = at;
		at += t->len;
		queue_copy(o, i, CQ_LREAD);
	}
}

static int sm_fetch(struct rx_reactor *r, const struct kv_item *items,
		    unsigned n, bool client_mem, kv_done_fn done, void *arg)
{
	int err;
	struct sm_op *o = op_new(r, K_FETCH, items, n, &err);
	if (!o)
		return err;
	o->client_mem = client_mem;
	o->done = done;
	o->arg = arg;
	for (unsigned i = 0; i < n; i++) {
		o->it[i].dst = items[i].data;
		o->it[i].want = items[i].data ? items[i].len : 0;
		o->it[i].skip = !o->it[i].want; /* nowhere to put it: a miss */
	}
	local_reads(o);
	pump(o);
	advance(o);
	return 0;
}

static int sm_get(struct rx_reactor *r, const struct kv_item *items,
		  unsigned n, uint64_t stage_max, kv_got_fn done, void *arg)
{
	int err;
	struct sm_op *o = op_new(r, K_GET, items, n, &err);
	if (!o)
		return err;
	o->got = done;
	o->arg = arg;
	o->stage_max = stage_max;
	local_reads(o);
	pump(o);
	bool sliced = o->copying; /* a local copy goes on in slices */
	advance(o);
	return sliced;
}

static int sm_exists(struct rx_reactor *r, const struct kv_item *items,
		     unsigned n, void (*done)(void *arg, unsigned count),
		     void *arg)
{
	int err;
	struct sm_op *o = op_new(r, K_EXISTS, items, n, &err);
	if (!o)
		return err;
	o->ex_done = done;
	o->arg = arg;
	met_inc(sm_st.ex_req);
	/* Only keys before the first local miss can count. */
	for (unsigned i = 0; i < n; i++) {
		struct sm_it *t = &o->it[i];
		if (t->own != SM_SELF)
			continue;
		struct slot_loc loc;
		t->ok = slot_locate(sm_st.reg, &t->sk, 0, &loc) > 0;
		if (!t->ok) {
			for (unsigned w = 0; w < o->nown; w++) {
				struct sm_own *ow = &o->own[w];
				unsigned k = 0;
				while (k < ow->n && ow->idx[k] < i)
					k++;
				ow->n = k;
			}
			break;
		}
	}
	advance(o);
	return 0;
}

static int sm_remove(struct rx_reactor *r, const struct kv_item *items,
		     unsigned n, kv_done_fn done, void *arg)
{
	int err;
	struct sm_op *o = op_new(r, K_DEL, items, n, &err);
	if (!o)
		return err;
	o->done = done;
	o->arg = arg;
	met_add(sm_st.del_req, n);
	for (unsigned i = 0; i < n; i++)
		if (o->it[i].own == SM_SELF)
			o->it[i].ok = slot_del(sm_st.reg, &o->it[i].sk) > 0;
	advance(o);
	return 0;
}


const struct kv_api sm_kv_api = {
	.publish = sm_publish,
	.fetch = sm_fetch,
	.get = sm_get,
	.exists = sm_exists,
	.remove = sm_remove,
	.hold = hold,
	.release = release,
};

int sm_kv_start(struct rx_reactor *r)
{
	t_x = &sm_st.rx[rx_reactor_id(r)];
	return 0;
}

void sm_kv_exit(struct rx_reactor *r)
{
	(void)r;
	t_x = NULL;
}
