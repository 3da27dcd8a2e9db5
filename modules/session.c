/*
 * modules/session.c — local-client sessions over the Unix socket: shared
 * memory regions, and page moves by (key, offset, length) inside them.
 *
 * Owns: per connection, the regions its client registered: memfds (or any
 * shared file) passed with SCM_RIGHTS, checked, mapped, and unmapped when the
 * client unregisters them or goes away. Threading: a session lives on the
 * reactor of its connection; every step of a move completes there.
 *
 * Lifetime (a client may vanish at any point of any call):
 *  - session.register maps the region on the offload thread (rx_offload:
 *    an mmap waits for the process's mmap lock) and replies when that is
 *    done; the slot is reserved meanwhile, and the open call keeps the
 *    connection's cleanup from running; unmapping a region is offloaded too
 *    (tearing down a large region's page tables takes milliseconds). The
 *    detach below stays on the reactor: it must be complete before the
 *    unregister reply or the close returns;
 *  - a move (session.set/get) holds a reference on its region and one on
 *    the session; the region stays mapped until its last move ended, and the
 *    session is freed only when the connection's cleanup ran and no move is
 *    left (whatever order rpc/server.c runs them in);
 *  - the region reference is dropped before the reply, because the reply may
 *    end the connection's last call;
 *  - when the client gives a region up while moves still use it — it
 *    unregisters it, or its connection closes (death, timeout, close) — the
 *    client's pages are swapped out at once (region_detach): an anonymous
 *    mapping replaces the shared one at the same address, so a remote page
 *    still on its way lands in node memory, never in memory the client may
 *    have reused, and the node never touches an unmapped address. The
 *    detached mapping goes when the last move on it ends. A transport that
 *    needs registered memory (RDMA: tp_ops.reg_local, taken on the offload
 *    thread when the region is mapped) loses the region first, so its
 *    reads still on their way fail instead of landing in the client's
 *    pages through the registration;
 *  - publish copies (set) and local copies (get) run inside one kv call, so
 *    a pool reservation or pin never outlives it (modules/kv.c);
 *  - a move is cut into steps (move_step) of at most session_slice_bytes of
 *    pages and KV_STEP_KEYS pages, one per loop pass, so no reactor copies
 *    or checksums a whole batch at once; no step starts once the client
 *    gave its region up;
 *  - the first touch of a page of a freshly mapped region is a page fault
 *    (and, in a guest with shadow paging, an exit to the hypervisor: ~13 us
 *    a 4 KiB page, 1.6 ms a 512 KiB copy slice, measured); with
 *    session_prefault a step whose pages lie in chunks (WARM_CHUNK) no move
 *    touched yet first has them faulted in on the offload thread's bulk
 *    lane (warm_work; mapping and unmapping have a lane of their own, so no
 *    amount of warming delays another client's register), holding the
 *    move's region reference, and starts when that is done. A set only
 *    reads the region: a read of each page. A get writes into it, and the
 *    first write to a page that was only read is a second exit of the same
 *    cost (a page the client never wrote, read-faulted in, then written:
 *    ~8 us a page with no guest page fault, measured), so a get's chunks
 *    are touched by a write that changes nothing (an atomic add of 0, safe
 *    against the client's own stores). The region's two bitmaps remember
 *    the chunks warm for reading and for writing.
 *    A region no move uses is never touched (its memory is not committed).
 *
 * Copies (DESIGN §5): set is one copy, from the region into the publish
 * pool; get of a local page is one copy into the region; get of a remote
 * page lands in the region straight from the network, no CPU copy by the
 * node. Every copy touching client memory is guarded (common/guard.h): a
 * client that shrinks its memfd fails its own request, not the node.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/guard.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "modules/copier.h"
#include "modules/kv.h"
#include "modules/modules.h"
#include "modules/session_req.h"
#include "modules/transport.h"
#include "reactor/stall.h"
#include "rpc/rpc.h"

#define LOG_MOD "session"
#define STEPS_INFLIGHT 4 /* steps of one move under way at once */
#define MOVE_READ_PASS 8192 /* items a large move reads per loop pass
			     * (~25 ns apiece) */
#define REGIONS_MAX 64
#define WARM_CHUNK (1u << 20) /* bytes of a region warmed at once */

struct region {
	uint32_t id;
	bool mapping;       /* session.register's mmap is under way */
	bool live;          /* registered; false once unregistered */
	bool detached;      /* client pages swapped for node memory */
	bool local;         /* registered with the transport (reg_local) */
	unsigned refs;      /* moves using it */
	uint8_t *base;
	uint64_t size;
	uint64_t *warm;     /* a bit per WARM_CHUNK already faulted in for
			     * reading; NULL: session_prefault off (or no
			     * memory for it). One allocation with warm_wr */
	uint64_t *warm_wr;  /* ... and touched by a write (implies warm) */
};

struct session {
	struct region regions[REGIONS_MAX];
	unsigned moves;     /* moves in flight (each holds the session) */
	bool gone;          /* the client left: no call can come any more */
	bool released;      /* the connection's cleanup ran */
	struct rx_reactor *r; /* the connection's */
	char peer[64];
};

static struct {
	struct pc_ctx *ctx;
	const struct kv_api *kv;      /* services: looked up in init */
	const struct svc_transport *tp; /* reg_local for client regions */
	met_id regions, region_bytes, refused, moves, detached;
	met_id warm_bytes;
	met_id refused_draining; /* sets answered false: node.drain */
	uint64_t slice_bytes; /* session_slice_bytes */
	bool prefault;        /* session_prefault */
} g;

/* An unmap handed to the offload thread: tearing down the page tables of
 * a region of gigabytes takes milliseconds, too long for a reactor. */
struct unmap_job {
	struct rx_offload o;
	void *base;
	uint64_t size;
};

static void unmap_work(struct rx_offload *o)
{
	struct unmap_job *u = (struct unmap_job *)o;
	munmap(u->base, u->size);
}

static void unmap_done(struct rx_reactor *r, struct rx_offload *o)
{
	(void)r;
	free(o);
}

/* Unmap base..size off the reactor (inline if that cannot be). */
static void unmap_off(struct rx_reactor *r, void *base, uint64_t size)
{
	struct unmap_job *u = malloc(sizeof(*u));
	if (u) {
		*u = (struct unmap_job){.o = {.work = unmap_work,
					      .done = unmap_done},
					.base = base, .size = size};
		if (rx_offload(r, &u->o) == 0)
			return;
		free(u);
	}
	munmap(base, size);
}

/* The transport no longer lands reads in the region (those in flight
 * fail): before its pages are swapped or unmapped. */
static void local_drop(void *base)
{
	int ret = g.tp->ops->unreg_local(g.tp->node, base);
	if (ret < 0)
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "unregistering a region from "
			  "the transport: %s", strerror(-ret));
}

static void region_unlocal(struct region *rg)
{
	if (rg->local)
		local_drop(rg->base);
	rg->local = false;
}

static void region_unmap(struct rx_reactor *r, struct region *rg)
{
	PC_DASSERT(rg->refs == 0 && !rg->live && rg->base);
	region_unlocal(rg);
	unmap_off(r, rg->base, rg->size);
	met_gauge_add(g.regions, -1);
	met_gauge_add(g.region_bytes, -(int64_t)rg->size);
	free(rg->warm);
	memset(rg, 0, sizeof(*rg));
}

/*
 * The client gave up a region that moves still use: put anonymous memory in
 * place of its pages (same address, one mmap), so what lands there later is
 * the node's. Only pages touched by late receives take memory
 * (MAP_NORESERVE). If the kernel refuses, the shared mapping stays: the node
 * is still safe, the client may see late bytes in a slot it gave up.
 */
static void region_detach(struct session *s, struct region *rg)
{
	if (rg->detached)
		return;
	/* A page copy under way from or into the region stops here, before
	 * it could read the node's memory as the client's page. */
	copier_cancel_range(s->r, rg->base, rg->size);
	/* And a transport read under way fails rather than land in the
	 * client's pages through its registration. */
	region_unlocal(rg);
	void *p = mmap(rg->base, rg->size, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
		       -1, 0);
	if (p == MAP_FAILED) {
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: cannot detach region %u "
			  "(%s); late pages may still land in it", s->peer,
			  rg->id, strerror(errno));
		return;
	}
	rg->detached = true;
	met_inc(g.detached);
}

/* The client no longer wants the region: unmap now, or detach it and leave
 * the unmapping to its last move. */
static void region_drop(struct session *s, struct region *rg)
{
	rg->live = false;
	if (rg->refs == 0)
		region_unmap(s->r, rg);
	else
		region_detach(s, rg);
}

static void region_put(struct session *s, struct region *rg)
{
	PC_ASSERT(rg->refs > 0);
	if (--rg->refs == 0 && !rg->live)
		region_unmap(s->r, rg);
}

/* The client left (connection closed; calls may still be in flight). */
static void session_gone(void *arg)
{
	struct session *s = arg;
	if (s->gone)
		return;
	s->gone = true;
	for (unsigned i = 0; i < REGIONS_MAX; i++)
		if (s->regions[i].live)
			region_drop(s, &s->regions[i]);
}

/* Free once the connection is released and the last move ended. */
static void session_maybe_free(struct session *s)
{
	if (!s->released || s->moves)
		return;
	for (unsigned i = 0; i < REGIONS_MAX; i++)
		PC_ASSERT(!s->regions[i].base);
	free(s);
}

/* The connection's cleanup: it and every call on it are gone. */
static void session_release(void *arg)
{
	struct session *s = arg;
	session_gone(s);
	s->released = true;
	session_maybe_free(s);
}

static struct session *session_of(struct rpc_call *call, bool create)
{
	struct session *s = rpc_call_conn_data(call);
	if (!s && create && (s = calloc(1, sizeof(*s)))) {
		snprintf(s->peer, sizeof(s->peer), "%s", rpc_call_peer(call));
		s->r = rpc_call_reactor(call);
		rpc_call_set_conn_data(call, s, session_release);
		rpc_call_set_conn_closed(call, session_gone);
	}
	return s;
}

static struct region *region_find(struct session *s, uint64_t id)
{
	for (unsigned i = 0; s && i < REGIONS_MAX; i++)
		if (s->regions[i].live && s->regions[i].id == id)
			return &s->regions[i];
	return NULL;
}

/* ---------------------------------------------------- register, unregister */

static int check_fd(int fd, uint64_t size, bool *sealed, char *why,
		    size_t whylen)
{
	struct stat st;
	if (fstat(fd, &st) < 0) {
		snprintf(why, whylen, "fstat: %s", strerror(errno));
		return -errno;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(why, whylen, "the descriptor is not a memfd or a "
			 "regular shared-memory file");
		return -EINVAL;
	}
	if ((uint64_t)st.st_size < size) {
		snprintf(why, whylen, "the file has %lld bytes, fewer than the "
			 "%llu registered", (long long)st.st_size,
			 (unsigned long long)size);
		return -EINVAL;
	}
	/* Sealed against shrinking is best; unsealed (SGLang's memfds cannot
	 * be sealed) is accepted: every copy is guarded anyway. */
	int seals = fcntl(fd, F_GET_SEALS);
	*sealed = seals >= 0 && (seals & F_SEAL_SHRINK);
	return 0;
}

/* Words of one warm bitmap of a region of size bytes. */
static uint64_t warm_words(uint64_t size)
{
	return (size + (uint64_t)WARM_CHUNK * 64 - 1) /
	       ((uint64_t)WARM_CHUNK * 64);
}

/*
 * session.register's mmap, on the offload thread: mapping waits for the
 * process's mmap lock, which page faults elsewhere (the pool's prefault, a
 * big copy) hold for milliseconds. The slot is reserved (mapping) and the
 * call stays open until done; the connection cannot be released before.
 */
struct map_job {
	struct rx_offload o;
	struct rpc_call *call;
	struct session *s;
	struct region *slot;
	int fd;
	uint64_t size;
	bool sealed;
	void *base;
	uint64_t *warm; /* the region's warm bitmaps (session_prefault) */
	int err;
	bool local;  /* reg_local took it */
};

static void map_work(struct rx_offload *o)
{
	struct map_job *mj = (struct map_job *)o;
	mj->base = mmap(NULL, mj->size, PROT_READ | PROT_WRITE, MAP_SHARED,
			mj->fd, 0);
	mj->err = mj->base == MAP_FAILED ? -errno : 0;
	close(mj->fd); /* the mapping keeps the memory */
	/* Reads land here without a registration per batch (RDMA); slow,
	 * hence here. Without room, reads register per batch instead. */
	if (!mj->err && g.tp && g.tp->ops->reg_local)
		mj->local = g.tp->ops->reg_local(g.tp->node, mj->base,
						 mj->size) == 0;
	/* Without memory for the bitmaps the region is simply not warmed:
	 * two of them, for reading and for writing, in one allocation. */
	if (!mj->err && g.prefault)
		mj->warm = calloc(2 * warm_words(mj->size), sizeof(uint64_t));
}

static void register_refused(struct rpc_call *call, const char *why)
{
	met_inc(g.refused);
	PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: region refused: %s",
		  rpc_call_peer(call), why);
	rpc_reply_error(call, RPC_E_BAD_PARAMS, "%s", why);
}

static void map_done(struct rx_reactor *r, struct rx_offload *o)
{
	struct map_job *mj = (struct map_job *)o;
	struct region *slot = mj->slot;
	struct rpc_call *call = mj->call;
	slot->mapping = false;
	if (mj->err) {
		free(mj->warm);
		char why[160];
		snprintf(why, sizeof(why), "mmap: %s", strerror(-mj->err));
		register_refused(call, why);
	} else if (mj->s->gone) {
		/* the client left meanwhile: its reply is dropped */
		if (mj->local)
			local_drop(mj->base);
		free(mj->warm);
		unmap_off(r, mj->base, mj->size);
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "the client left");
	} else {
		*slot = (struct region){.id = slot->id, .live = true,
					.local = mj->local, .base = mj->base,
					.size = mj->size, .warm = mj->warm,
					.warm_wr = mj->warm
						? mj->warm + warm_words(mj->size)
						: NULL};
		met_gauge_add(g.regions, 1);
		met_gauge_add(g.region_bytes, (int64_t)mj->size);
		PC_LOGD(LOG_MOD, "%s: region %u of %llu bytes mapped%s",
			rpc_call_peer(call), slot->id,
			(unsigned long long)mj->size,
			mj->sealed ? " (sealed)" : "");
		msgpack_packer *pk = rpc_reply_begin(call);
		msgpack_pack_map(pk, 1);
		mp_pack_cstr(pk, "sealed");
		if (mj->sealed)
			msgpack_pack_true(pk);
		else
			msgpack_pack_false(pk);
		rpc_reply_end(call);
	}
	free(mj);
}

/* session.register [region_id, size] + one descriptor */
static void m_register(struct rpc_call *call, struct mp_rd *p)
{
	uint64_t id, size;
	int fd = rpc_call_take_fd(call);
	char why[160] = "";
	const char *bad = sess_req_register(p, &id, &size);
	if (bad) {
		if (fd >= 0)
			close(fd);
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "%s", bad);
		return;
	}
	if (fd < 0) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "no descriptor came with "
				"the call (send it with SCM_RIGHTS)");
		return;
	}
	struct session *s = session_of(call, true);
	bool sealed = false;
	int ret = !s ? -ENOMEM : check_fd(fd, size, &sealed, why, sizeof(why));
	if (!s)
		snprintf(why, sizeof(why), "out of memory");
	struct region *slot = NULL;
	bool dup = false;
	for (unsigned i = 0; s && i < REGIONS_MAX; i++) {
		struct region *rg = &s->regions[i];
		if (!slot && !rg->base && !rg->mapping)
			slot = rg;
		dup |= (rg->live || rg->mapping) && rg->id == id;
	}
	if (ret == 0 && dup) {
		snprintf(why, sizeof(why), "region %llu is already registered",
			 (unsigned long long)id);
		ret = -EEXIST;
	} else if (ret == 0 && !slot) {
		snprintf(why, sizeof(why), "at most %d regions per session",
			 REGIONS_MAX);
		ret = -ENOSPC;
	}
	struct map_job *mj = ret == 0 ? malloc(sizeof(*mj)) : NULL;
	if (ret == 0 && !mj) {
		snprintf(why, sizeof(why), "out of memory");
		ret = -ENOMEM;
	}
	if (ret < 0) {
		close(fd);
		register_refused(call, why);
		return;
	}
	*mj = (struct map_job){.o = {.work = map_work, .done = map_done},
			       .call = call, .s = s, .slot = slot, .fd = fd,
			       .size = size, .sealed = sealed};
	*slot = (struct region){.id = (uint32_t)id, .mapping = true};
	if (rx_offload(rpc_call_reactor(call), &mj->o) < 0) {
		map_work(&mj->o); /* no offload thread: map here */
		map_done(rpc_call_reactor(call), &mj->o);
	}
}

/* session.unregister [region_id] -> bool */
static void m_unregister(struct rpc_call *call, struct mp_rd *p)
{
	uint64_t id;
	const char *bad = sess_req_unregister(p, &id);
	if (bad) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "%s", bad);
		return;
	}
	struct session *s = session_of(call, false);
	struct region *rg = region_find(s, id);
	if (rg)
		region_drop(s, rg); /* no page lands in it after this reply */
	rpc_reply_bool(call, rg != NULL);
}

/* ------------------------------------------------------------- set, get */

/*
 * A move is cut into steps of at most session_slice_bytes of pages (at least
 * one page) and at most KV_STEP_KEYS pages: each step is one kv call,
 * started on its own loop pass (a zero-delay timer), so the copies and
 * checksums a step does on the reactor stay bounded and other requests run
 * in between. Up to STEPS_INFLIGHT steps overlap (directory rounds and
 * remote reads of some while another copies); the next starts when one
 * ends. The reply waits for all of them. Before each step the region is
 * checked: once the client gave it up, no further page is copied out of
 * (or into) it.
 */
struct move {
	struct rpc_call *call;
	struct session *s;
	struct region *rg;
	struct rx_reactor *r;
	struct kv_item *it;
	void *keys;         /* copies of the keys when the move has steps
			     * (or of the request, when it is read over
			     * passes and was not kept) */
	struct mp_rd rd;    /* where reading the items goes on */
	unsigned parsed;    /* items read */
	const char *bad;    /* why an item is not valid: bad_params */
	bool reading;       /* items not all read yet */
	bool *ok;           /* per item, filled as steps end */
	unsigned n;
	unsigned next;      /* first item not started yet */
	unsigned pending;   /* steps started and not ended */
	unsigned started;   /* steps started */
	int first_err;      /* the first step could not start: reply an error */
	bool stepping;      /* inside move_step: do not finish yet */
	bool set;
	struct rx_timer step;
};

struct move_part {
	struct move *m;
	unsigned from;
};

static void move_free(struct move *m)
{
	free(m->it);
	free(m->keys);
	free(m->ok);
	free(m);
}

static void move_finish(struct move *m)
{
	struct session *s = m->s;
	PC_DASSERT(m->pending == 0 && m->next == m->n && s->moves > 0);
	PC_DASSERT(m->rg->refs > 0 && m->rg->base);
	/* Pages of a get that the client gave up meanwhile landed in node
	 * memory, not in its region: none of them is the client's. */
	bool lost = !m->set && m->rg->detached;
	region_put(s, m->rg);
	if (m->bad) {
		rpc_reply_error(m->call, RPC_E_BAD_PARAMS, "%s", m->bad);
	} else if (m->first_err) {
		rpc_reply_error(m->call, RPC_E_BUSY, "%s",
				strerror(-m->first_err));
	} else if (lost) {
		msgpack_packer *pk = rpc_reply_begin(m->call);
		msgpack_pack_array(pk, m->n);
		for (unsigned i = 0; i < m->n; i++)
			msgpack_pack_false(pk);
		rpc_reply_end(m->call);
	} else {
		rpc_reply_bools(m->call, m->ok, m->n);
	}
	/* The reply may have ended the connection's last call and run its
	 * cleanup; the session waited for this move. A step armed before
	 * the last one ended the move early (warm_done) never runs. */
	rx_timer_stop(m->r, &m->step);
	move_free(m);
	s->moves--;
	met_gauge_add(g.moves, -1);
	session_maybe_free(s);
}

static void move_maybe_finish(struct move *m)
{
	if (!m->stepping && m->pending == 0 && m->next == m->n)
		move_finish(m);
}

static void move_arm(struct move *m);

/* One step ended. Runs on the reactor, maybe inside move_step (kv may
 * finish at once). */
static void part_done(void *arg, const bool *ok, unsigned n)
{
	struct move_part *pt = arg;
	struct move *m = pt->m;
	PC_DASSERT(m->pending > 0 && pt->from + n <= m->n);
	memcpy(m->ok + pt->from, ok, n * sizeof(*ok));
	free(pt);
	m->pending--;
	if (m->next < m->n && !m->stepping)
		move_arm(m); /* a step's room freed: the next one may start */
	move_maybe_finish(m);
}

static void move_step_fired(struct rx_reactor *r, struct rx_timer *t);

/* Start the next step on the next loop pass, if fewer than STEPS_INFLIGHT
 * are under way (later steps' copies would only queue behind theirs, their
 * deadlines running). */
static void move_arm(struct move *m)
{
	if (m->pending >= STEPS_INFLIGHT || rx_timer_armed(&m->step))
		return;
	rx_timer_start(m->r, &m->step, 0, 0); /* zero delay: never fails */
}

/* Start kv on the step [from, to) (m->next is already past it). Nothing
 * starts, and no later step will, when the region was given up or the
 * move's first step could not start (the call then fails whole). */
static void step_start(struct move *m, unsigned from, unsigned to)
{
	/* A region given up (unregistered, client gone) is left alone: the
	 * rest of the move are misses, never pages copied from node memory. */
	if (!m->rg->live || m->first_err) {
		m->next = m->n;
		return;
	}
	struct move_part *pt = malloc(sizeof(*pt));
	int ret = pt ? 0 : -ENOMEM;
	if (pt) {
		*pt = (struct move_part){m, from};
		m->pending++;
		const struct kv_api *kv = g.kv;
		ret = m->set ? kv->publish(m->r, m->it + from, to - from,
					   KV_SRC_CLIENT, NULL, part_done, pt)
			     : kv->fetch(m->r, m->it + from, to - from, true,
					 part_done, pt);
		if (ret < 0) { /* nothing started: done did not run */
			m->pending--;
			free(pt);
		}
	}
	if (ret < 0 && m->started == 0) {
		m->first_err = ret; /* as before steps: the call fails whole */
		m->next = m->n;
	}
	m->started += ret == 0;
}

/* ------------------------------------------------- warming client pages */

/* The region's chunks c0..c1 (inclusive) that hold [off, off + len). */
static void chunks_of(uint64_t off, uint64_t len, uint64_t *c0, uint64_t *c1)
{
	*c0 = off / WARM_CHUNK;
	*c1 = (off + (len ? len : 1) - 1) / WARM_CHUNK;
}

/* Chunk c is warm for what the move does to it (write: a get). */
static bool chunk_warm(const struct region *rg, uint64_t c, bool write)
{
	const uint64_t *bits = write ? rg->warm_wr : rg->warm;
	return bits[c / 64] >> (c % 64) & 1;
}

/* A step whose pages lie in chunks not warm yet: faulted in on the offload
 * thread, then started (warm_done). The move's region reference keeps the
 * region mapped meanwhile (detached at worst: then the touches find node
 * memory, harmlessly; a get's touch of the client's memory just before the
 * swap changes no byte of it either). */
struct warm_job {
	struct rx_offload o;
	struct move *m;
	unsigned from, to;
	uint8_t *base;
	uint64_t size;
	unsigned n;      /* chunks */
	bool write;      /* a get's: touched by a write, not a read */
	uint64_t bytes;  /* in them */
	int res;         /* 0, or -EFAULT: the client cut its memory short */
	uint64_t chunk[];
};

static size_t g_page; /* the system's page size */

/* A read of each page, or for a get an atomic add of 0 to its first byte:
 * a write access (the page's first, for the kernel and a hypervisor alike)
 * that leaves the byte as it is even when the client stores to it at the
 * same moment (the chunk may hold the client's live data beside the get's
 * pages). */
static void warm_touch(void *arg)
{
	const struct warm_job *w = arg;
	unsigned sink = 0;
	for (unsigned i = 0; i < w->n; i++) {
		uint64_t a = w->chunk[i] * WARM_CHUNK;
		uint64_t b = PC_MIN(a + WARM_CHUNK, w->size);
		for (uint64_t o = a; o < b; o += g_page) {
			if (w->write)
				__atomic_fetch_add(w->base + o, 0,
						   __ATOMIC_RELAXED);
			else
				sink += *(volatile const uint8_t *)(w->base + o);
		}
	}
	(void)sink;
}

static void warm_work(struct rx_offload *o)
{
	struct warm_job *w = (struct warm_job *)o;
	/* Guarded: a client that shrank its memfd meanwhile costs a SIGBUS,
	 * turned into -EFAULT here (its step then fails on its own). */
	w->res = pc_guarded_run(warm_touch, w);
}

static void warm_done(struct rx_reactor *r, struct rx_offload *o)
{
	(void)r;
	struct warm_job *w = (struct warm_job *)o;
	struct move *m = w->m;
	struct region *rg = m->rg;
	if (w->res == 0 && rg->warm) {
		for (unsigned i = 0; i < w->n; i++) {
			uint64_t bit = 1ull << (w->chunk[i] % 64);
			rg->warm[w->chunk[i] / 64] |= bit;
			if (w->write)
				rg->warm_wr[w->chunk[i] / 64] |= bit;
		}
		met_add(g.warm_bytes, w->bytes);
	}
	PC_DASSERT(m->pending > 0);
	m->pending--; /* the step's slot, now kv's */
	m->stepping = true;
	step_start(m, w->from, w->to);
	free(w);
	if (m->next < m->n)
		move_arm(m);
	m->stepping = false;
	move_maybe_finish(m);
}

/* Queue the warming of the step's cold chunks: 1 when queued (the step
 * starts in warm_done), 0 when all are warm or it cannot be queued (the
 * step starts now, as without session_prefault). */
static int warm_start(struct move *m, unsigned from, unsigned to)
{
	struct region *rg = m->rg;
	if (!rg->warm || !rg->live)
		return 0;
	unsigned n = 0, cap = 0;
	for (unsigned i = from; i < to; i++) {
		uint64_t c0, c1;
		chunks_of((uint64_t)((uint8_t *)m->it[i].data - rg->base),
			  m->it[i].len, &c0, &c1);
		cap += (unsigned)(c1 - c0 + 1);
	}
	struct warm_job *w = malloc(sizeof(*w) + cap * sizeof(uint64_t));
	if (!w)
		return 0;
	w->bytes = 0;
	for (unsigned i = from; i < to; i++) {
		uint64_t c0, c1;
		chunks_of((uint64_t)((uint8_t *)m->it[i].data - rg->base),
			  m->it[i].len, &c0, &c1);
		for (uint64_t c = c0; c <= c1; c++) {
			bool seen = chunk_warm(rg, c, !m->set);
			/* items of a step are often neighbours: skip repeats */
			for (unsigned k = n; !seen && k-- > 0;)
				seen = w->chunk[k] == c;
			if (!seen) {
				w->chunk[n++] = c;
				w->bytes += PC_MIN((c + 1) * WARM_CHUNK,
						   rg->size) - c * WARM_CHUNK;
			}
		}
	}
	if (n == 0) {
		free(w);
		return 0;
	}
	/* its own lane: however much of it clients queue, others' regions
	 * are still mapped and unmapped at once */
	w->o = (struct rx_offload){.work = warm_work, .done = warm_done,
				   .lane = RX_LANE_BULK};
	w->m = m;
	w->from = from;
	w->to = to;
	w->base = rg->base;
	w->size = rg->size;
	w->n = n;
	w->write = !m->set;
	w->res = 0;
	if (rx_offload(m->r, &w->o) < 0) {
		free(w);
		return 0;
	}
	m->pending++; /* the step is under way from now on */
	return 1;
}

/* Start the next step: the pages from m->next up to the slice, once they
 * are warm. */
static void move_step(struct move *m)
{
	if (m->next >= m->n) /* ended early after this step was armed */
		return;
	m->stepping = true;
	unsigned from = m->next, to = from;
	uint64_t bytes = 0;
	while (to < m->n && to - from < KV_STEP_KEYS &&
	       (to == from || bytes + m->it[to].len <= g.slice_bytes))
		bytes += m->it[to++].len;
	m->next = to;
	if (!warm_start(m, from, to))
		step_start(m, from, to);
	if (m->next < m->n)
		move_arm(m);
	m->stepping = false;
	move_maybe_finish(m);
}

static void move_read(struct move *m);

static void move_step_fired(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	struct move *m = t->arg;
	rx_stall_tag(m->set ? "session.set step" : "session.get step");
	if (m->reading)
		move_read(m);
	else
		move_step(m);
}

/* A move of more than one step reads its items over loop passes, from its
 * request kept (or copied) until the reply. */
static bool move_passes(const struct move *m)
{
	return m->n > KV_STEP_KEYS;
}

/* Steps, and the slices of a step's copies, run after the handler
 * returned, when the request's bytes are gone: the keys live in one copy
 * owned by the move. */
static int move_keep_keys(struct move *m)
{
	size_t total = 0;
	for (unsigned i = 0; i < m->n; i++)
		total += m->it[i].klen;
	if (!(m->keys = malloc(total ? total : 1)))
		return -ENOMEM;
	char *p = m->keys;
	for (unsigned i = 0; i < m->n; i++) {
		memcpy(p, m->it[i].key, m->it[i].klen);
		m->it[i].key = p;
		p += m->it[i].klen;
	}
	return 0;
}

/* Read [region_id, [ of a move into m: its region, and room for its
 * items (m->n). */
static const char *read_head(struct rpc_call *call, struct mp_rd *p,
			     struct move *m)
{
	uint64_t id;
	uint32_t n;
	const char *bad = sess_req_move_head(p, &id, &n);
	if (bad)
		return bad;
	m->rg = region_find(session_of(call, false), id);
	if (!m->rg)
		return "no such region on this connection (register it first)";
	if (!(m->it = malloc(n * sizeof(*m->it))) ||
	    !(m->ok = calloc(n, sizeof(*m->ok))))
		return "out of memory";
	m->n = n;
	return NULL;
}

/*
 * Read the move's items, [key, offset, len] each, into m->it — a move of
 * more than KV_STEP_KEYS items MOVE_READ_PASS a loop pass (going on from
 * m->step): 65,536 of them in one callback took ~2 ms — then start its
 * steps. Every item is checked before any step starts: a move with a bad
 * one changes nothing. Ends the move (move_finish) when one is bad or the
 * node is draining (a set then stores nothing: n falses).
 */
static void move_read(struct move *m)
{
	unsigned budget = move_passes(m) ? MOVE_READ_PASS : UINT_MAX;
	for (; m->parsed < m->n && budget && !m->bad; budget--, m->parsed++) {
		struct sess_item si;
		if ((m->bad = sess_req_item(&m->rd, m->rg->size, &si)))
			break;
		m->it[m->parsed] = (struct kv_item){si.key, si.klen,
						    m->rg->base + si.off,
						    si.len};
	}
	if (!m->bad && m->parsed < m->n) {
		rx_timer_start(m->r, &m->step, 0, 0); /* zero delay */
		return;
	}
	m->reading = false;
	/* A request kept (or copied) stays until the reply; else the keys
	 * are copied (move_keep_keys), the request's bytes going now. */
	if (!m->bad && !move_passes(m) && move_keep_keys(m) < 0)
		m->bad = "out of memory";
	if (!m->bad && m->set && pc_ctx_draining(g.ctx)) {
		/* node.drain: nothing stored, n falses (HiCache's normal
		 * "not stored"); the reason is in the log and the metric. */
		met_add(g.refused_draining, m->n);
		PC_LOG_RL(PC_LOG_INFO, "session", "session.set of %u page%s "
			  "from %s not stored: the node is draining", m->n,
			  m->n == 1 ? "" : "s", rpc_call_peer(m->call));
		m->next = m->n;
	}
	if (m->bad)
		m->next = m->n;
	if (m->next == m->n)
		move_finish(m);
	else
		move_step(m);
}

static void move(struct rpc_call *call, struct mp_rd *p, bool set)
{
	struct move *m = calloc(1, sizeof(*m));
	if (!m) {
		rpc_reply_error(call, RPC_E_BUSY, "out of memory");
		return;
	}
	m->call = call;
	m->set = set;
	const char *bad = read_head(call, p, m);
	if (bad) {
		move_free(m);
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "%s", bad);
		return;
	}
	/* A large move's items are read over loop passes: its request stays
	 * (kept, or copied when it came in one receive) until the reply. */
	m->rd = *p;
	if (move_passes(m) && rpc_call_keep_params(call, &m->rd, &m->keys) < 0) {
		move_free(m);
		rpc_reply_error(call, RPC_E_BUSY, "out of memory");
		return;
	}
	m->reading = true;
	/* The region stays mapped and the session allocated until
	 * move_finish, whatever happens to the connection meanwhile. */
	m->s = session_of(call, false);
	m->r = rpc_call_reactor(call);
	rx_timer_init(&m->step, move_step_fired, m);
	m->rg->refs++;
	m->s->moves++;
	met_gauge_add(g.moves, 1);
	move_read(m);
}

/* session.set [region_id, [[key, offset, len], ...]] -> [bool, ...] */
static void m_set(struct rpc_call *call, struct mp_rd *p)
{
	move(call, p, true);
}

/* session.get [region_id, [[key, offset, len], ...]] -> [bool, ...] */
static void m_get(struct rpc_call *call, struct mp_rd *p)
{
	move(call, p, false);
}

static const struct rpc_method session_methods[] = {
	{"session.register", m_register, RPC_LOCAL_ONLY,
	 "[region_id, size] + a memfd (SCM_RIGHTS) -> {sealed}"},
	{"session.unregister", m_unregister, RPC_LOCAL_ONLY,
	 "[region_id] -> bool"},
	{"session.set", m_set, RPC_LOCAL_ONLY,
	 "[region_id, [[key, offset, len], ...]] -> [stored, ...]"},
	{"session.get", m_get, RPC_LOCAL_ONLY,
	 "[region_id, [[key, offset, len], ...]] -> [found, ...]"},
	{NULL, NULL, 0, NULL},
};

static int s_init(struct pc_ctx *ctx)
{
	memset(&g, 0, sizeof(g));
	g.ctx = ctx;
	g.slice_bytes = ctx->cfg->session_slice_bytes;
	g.prefault = ctx->cfg->session_prefault;
	long pg = sysconf(_SC_PAGESIZE);
	g_page = pg > 0 ? (size_t)pg : 4096;
	copier_set_slice(ctx->cfg->copy_slice_bytes);
	copier_set_pass_max((uint64_t)ctx->cfg->slice_pass_max_us * 1000);
	if (!(g.kv = svc_need_kv(ctx, "session")))
		return -ENOENT;
	g.tp = svc_find_transport(ctx);
	g.regions = met_register(MET_GAUGE, "peercache_session_regions",
				 "client memory regions mapped", NULL);
	g.region_bytes = met_register(MET_GAUGE,
				      "peercache_session_region_bytes",
				      "bytes of client memory mapped", NULL);
	g.moves = met_register(MET_GAUGE, "peercache_session_moves",
			       "session.set/get calls in flight", NULL);
	g.detached = met_register(MET_COUNTER,
				  "peercache_session_regions_detached_total",
				  "regions given up (unregistered, client gone) "
				  "while pages were still on their way into "
				  "them", NULL);
	g.warm_bytes = met_register(MET_COUNTER,
				    "peercache_session_prefault_bytes_total",
				    "bytes of client regions faulted in on the "
				    "offload thread before a move first touched "
				    "them (session_prefault)", NULL);
	g.refused_draining = met_register(
		MET_COUNTER, "peercache_writes_refused_draining_total",
		DRAIN_REFUSED_HELP, "method=\"session.set\"");
	g.refused = met_register(MET_COUNTER,
				 "peercache_session_regions_refused_total",
				 "regions refused (not shared memory, too "
				 "small, ...)", NULL);
	return 0;
}

const struct pc_module pc_mod_session = {
	.name = "session",
	.init = s_init,
	.rpc_methods = session_methods,
};
