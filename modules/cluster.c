/*
 * modules/cluster.c — membership (static, changeable at run time), the ring
 * and its epochs, membership events, and the peer-health table.
 *
 * Owns: this node's ring id ("advertise_host:rpc_port") and data endpoint,
 * the current member list (this node plus the peers) and the view built from
 * it — an immutable ring (storage/ring.h) and the health of its members —
 * offered as the "membership" service (modules/membership.h) and the
 * "health" service (modules/peer_health.h); self id and data endpoint are
 * the "cluster" service (modules/services.h). Every node builds the same ring from the same
 * list, so writers and readers agree on owners without talking.
 *
 * Views and epochs: the first view (epoch 1) is built on reactor 0 once the
 * RPC and data listeners have their ports (this module starts after them),
 * before the other reactors start. A change — cluster.set_peers (any
 * reactor), a SIGHUP reload (main thread), or svc_cluster.set_members (the
 * discovery thread; with discovery on, the first two are refused) — builds a new ring with epoch
 * + 1 and a new health table (states carried over by member id), publishes
 * the view with one release store, announces MB_JOIN / MB_LEAVE, and
 * retires the old view: a message is posted to every reactor, and the view
 * (with its ring reference and health table) is freed by the last of them
 * to run it — by then no reactor callback that loaded the old pointer is
 * still running. A view that cannot be retired that way (no reactor group,
 * a failed post) stays on the retired list until fini. Changes are
 * serialized by change_lock; a reactor only try-locks it (busy: the caller
 * retries), so no reactor ever waits for another thread's ring build.
 *
 * Invariants (asserted): epochs grow by exactly one per change; the view's
 * ring always contains this node; a health table has one entry per ring
 * member; a view is freed exactly once, after every reactor passed it.
 *
 * Peer health: a peer that left the ring (one of the last DEPARTED_MAX) is
 * suspect until it joins again, so its records are skipped rather than
 * read. Otherwise one entry per member of the current view, indexed like its
 * ring, whose state is a single atomic word — any reactor reads it (skip a
 * suspect peer) or flips it healthy -> suspect with a compare-and-swap (the
 * winner logs, counts and announces MB_SUSPECT); no lock anywhere. Only
 * reactor 0 flips it back: its timer sends node.health to each suspect peer
 * every peer_probe_interval (one probe in flight per peer, on the module's
 * own RPC client, so probe timeouts never retire the directory's
 * connections), and an answer makes the peer healthy again (MB_RECOVER). A
 * transition that races with a view change may be lost (the next failure
 * or probe repeats it).
 *
 * Events (membership.h) are posted to every reactor as one message each;
 * the subscribers run there, on the reactor's thread, and the last reactor
 * frees the message.
 *
 * Cost: a change builds a ring on the calling thread: members x vnodes
 * hashes and a sort (measured here: 0.03 ms for 4 members x 160 vnodes,
 * 0.5 ms for 32, 30 ms for 1024). So cluster.set_peers, which runs on a
 * reactor, refuses lists above SET_PEERS_POINTS_MAX ring points; those go
 * through the config file and a SIGHUP, built on the main thread.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "modules/membership.h"
#include "modules/modules.h"
#include "modules/peer_health.h"
#include "reactor/group.h"
#include "rpc/client.h"
#include "rpc/rpc.h"
#include "storage/ring.h"

#define LOG_MOD "cluster"
#define PEERS_MAX 1024
#define SUBSCRIBERS_MAX 8
/* Peers that left, remembered per view so their records are skipped. */
#define DEPARTED_MAX 64
/* Ring points (members x vnodes) cluster.set_peers builds on a reactor:
 * about 0.5 ms here (32 members x 160 vnodes). Longer lists go through the
 * config file and SIGHUP, which builds on the main thread. */
#define SET_PEERS_POINTS_MAX 5120u

enum { PH_HEALTHY = 0, PH_SUSPECT = 1 };

/* A member's health: atomics, any reactor (probing: reactor 0 writes). */
struct health {
	uint32_t state;          /* PH_HEALTHY / PH_SUSPECT */
	uint32_t probing;        /* a probe is in flight */
	uint64_t since_ns;       /* when it became suspect */
};

/* One membership view: replaced as a whole, freed after a grace period. */
struct view {
	struct ring *ring;       /* the view's reference */
	struct health *health;   /* [ring_size(ring)], ring order */
	int self_idx;
	char *departed[DEPARTED_MAX]; /* left and not back, newest first */
	unsigned ndeparted;
	uint32_t pending;        /* atomic: reactors yet to pass it */
	struct view *next;       /* retired list (retire_lock) */
};

/* A peer list being validated (config, set_peers). */
struct peer_list {
	char **ids;
	unsigned n;
};

struct sub {
	unsigned mask;
	mb_event_fn fn;
	void *arg;
};

/* One event on its way to every reactor. */
struct mb_msg {
	enum mb_event ev;
	uint64_t epoch;
	uint32_t pending;        /* atomic: reactors yet to run it */
	char peer[];
};

/* A probe in flight: names its peer, as views may change meanwhile. */
struct probe {
	char id[RING_ID_BYTES_MAX + 1];
};

static struct {
	struct pc_ctx *ctx;
	struct svc_cluster cl;        /* published: self id, data endpoint */
	struct peer_list boot;        /* `peers` as the node started */
	struct view *view;            /* atomic: the current view */
	pthread_mutex_t change_lock;  /* one change at a time */
	pthread_mutex_t retire_lock;  /* the retired list */
	struct view *retired;
	unsigned vnodes;
	unsigned probe_ms;
	struct rx_timer probe_timer;  /* reactor 0 */
	struct rpc_client *probe_cl;  /* reactor 0 */
	struct sub subs[SUBSCRIBERS_MAX];
	unsigned nsubs;               /* set in init, read-only after */
	met_id transitions, probes, changes, events[MB_EVENTS];
} g;

/* The port of an endpoint the node published ("host:port"). */
static int published_port(struct pc_ctx *ctx, const char *name)
{
	struct pc_endpoint eps[PC_ENDPOINTS_MAX];
	unsigned n = pc_ctx_endpoints(ctx, eps, PC_ENDPOINTS_MAX);
	for (unsigned i = 0; i < n; i++)
		if (strcmp(eps[i].name, name) == 0) {
			const char *c = strrchr(eps[i].addr, ':');
			return c ? atoi(c + 1) : -1;
		}
	return -1;
}

/* ------------------------------------------------------------ peer lists */

static void peers_free(struct peer_list *l)
{
	for (unsigned i = 0; l->ids && i < l->n; i++)
		free(l->ids[i]);
	free(l->ids);
	l->ids = NULL;
	l->n = 0;
}

/* Append one entry (len bytes at tok) after checking it is host:port. */
static int peers_add(struct peer_list *l, const char *tok, size_t len,
		     char *err, size_t errlen)
{
	char buf[RING_ID_BYTES_MAX + 1];
	if (len == 0 || len > RING_ID_BYTES_MAX) {
		snprintf(err, errlen, "peer %u: %s (1..%u bytes)", l->n,
			 len ? "too long" : "empty", RING_ID_BYTES_MAX);
		return -EINVAL;
	}
	memcpy(buf, tok, len);
	buf[len] = '\0';
	const char *c = strrchr(buf, ':');
	char *end = NULL;
	long port = c ? strtol(c + 1, &end, 10) : -1;
	if (!c || c == buf || c[1] == '\0' || port <= 0 || port > 65535 ||
	    *end || strpbrk(buf, ", \t\r\n")) {
		snprintf(err, errlen, "peer %u: '%.64s' is not host:port (each "
			 "entry is a peer's rpc_port address)", l->n, buf);
		return -EINVAL;
	}
	if (l->n >= PEERS_MAX) {
		snprintf(err, errlen, "more than %d peers", PEERS_MAX);
		return -E2BIG;
	}
	if (!l->ids && !(l->ids = calloc(PEERS_MAX, sizeof(*l->ids))))
		return -ENOMEM;
	if (!(l->ids[l->n] = strdup(buf)))
		return -ENOMEM;
	l->n++;
	return 0;
}

/* Parse "host:port, host:port ..." (the `peers` setting's syntax). */
static int peers_parse(struct peer_list *l, const char *list, char *err,
		       size_t errlen)
{
	const char *sep = ", \t\r\n";
	for (const char *p = list; *p;) {
		p += strspn(p, sep);
		size_t len = strcspn(p, sep);
		if (len == 0)
			break;
		int ret = peers_add(l, p, len, err, errlen);
		if (ret < 0)
			return ret;
		p += len;
	}
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* set_peers is an explicit list: a repeated entry is a mistake. */
static int peers_check_unique(const struct peer_list *l, char *err,
			      size_t errlen)
{
	if (l->n < 2)
		return 0;
	char **sorted = malloc(l->n * sizeof(*sorted));
	if (!sorted)
		return -ENOMEM;
	memcpy(sorted, l->ids, l->n * sizeof(*sorted));
	qsort(sorted, l->n, sizeof(*sorted), cmp_str);
	int ret = 0;
	for (unsigned i = 1; i < l->n && !ret; i++)
		if (strcmp(sorted[i - 1], sorted[i]) == 0) {
			snprintf(err, errlen, "'%s' is listed twice", sorted[i]);
			ret = -EINVAL;
		}
	free(sorted);
	return ret;
}

/* ----------------------------------------------------------------- views */

static struct view *view_current(void)
{
	return __atomic_load_n(&g.view, __ATOMIC_ACQUIRE);
}

static void view_free(struct view *v)
{
	for (unsigned i = 0; i < v->ndeparted; i++)
		free(v->departed[i]);
	ring_unref(v->ring);
	free(v->health);
	free(v);
}

static void view_add_departed(struct view *v, const char *id)
{
	if (v->ndeparted < DEPARTED_MAX && ring_find(v->ring, id) < 0 &&
	    (v->departed[v->ndeparted] = strdup(id)))
		v->ndeparted++;
}

/* A view of ring (whose reference it takes over), the health of members it
 * shares with old carried over, and the peers that left: old's members
 * that are not in ring, then old's departed that did not come back (the
 * oldest fall off past DEPARTED_MAX). */
static struct view *view_new(struct ring *ring, const struct view *old)
{
	struct view *v = calloc(1, sizeof(*v));
	unsigned n = ring_size(ring);
	if (!v || !(v->health = calloc(n ? n : 1, sizeof(*v->health)))) {
		free(v);
		return NULL;
	}
	v->ring = ring;
	v->self_idx = ring_find(ring, g.cl.self_id);
	PC_ASSERT(v->self_idx >= 0); /* this node is always a member */
	for (unsigned i = 0; old && i < n; i++) {
		int j = ring_find(old->ring, ring_member(ring, i));
		if (j < 0)
			continue;
		const struct health *h = &old->health[j];
		v->health[i].state = __atomic_load_n(&h->state, __ATOMIC_ACQUIRE);
		v->health[i].since_ns = __atomic_load_n(&h->since_ns,
							__ATOMIC_RELAXED);
	}
	for (unsigned i = 0; old && i < ring_size(old->ring); i++)
		view_add_departed(v, ring_member(old->ring, i));
	for (unsigned i = 0; old && i < old->ndeparted; i++)
		view_add_departed(v, old->departed[i]);
	return v;
}

/* One reactor passed the view; the last one frees it. */
static void view_release(struct view *v)
{
	uint32_t left = __atomic_sub_fetch(&v->pending, 1, __ATOMIC_ACQ_REL);
	PC_ASSERT(left != UINT32_MAX); /* never released more than posted */
	if (left)
		return;
	pthread_mutex_lock(&g.retire_lock);
	struct view **pp = &g.retired;
	while (*pp && *pp != v)
		pp = &(*pp)->next;
	PC_ASSERT(*pp == v); /* freed exactly once */
	*pp = v->next;
	pthread_mutex_unlock(&g.retire_lock);
	view_free(v);
}

static void view_quiesced(struct rx_reactor *r, void *arg)
{
	(void)r; /* also at teardown: this reactor is past it either way */
	view_release(arg);
}

/* The view is no longer current: free it once every reactor has run a
 * message posted now (their callbacks that loaded it have returned). */
static void view_retire(struct view *v)
{
	struct rx_group *grp = __atomic_load_n(&g.ctx->group, __ATOMIC_ACQUIRE);
	unsigned n = grp ? rx_group_size(grp) : 0;
	/* +1: ours, dropped after posting, so no reactor frees it early. */
	v->pending = n + 1;
	pthread_mutex_lock(&g.retire_lock);
	v->next = g.retired;
	g.retired = v;
	pthread_mutex_unlock(&g.retire_lock);
	if (!grp)
		return; /* reactors not reachable: fini frees it */
	bool stuck = false;
	for (unsigned t = 0; t < n; t++) {
		int ret = rx_group_post(grp, t, view_quiesced, v);
		if (ret == -ESHUTDOWN) /* that reactor has ended */
			view_release(v);
		else if (ret < 0)
			stuck = true; /* cannot know when it passes: keep */
	}
	if (stuck)
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "a replaced ring stays in "
			  "memory until exit (a reactor could not be told)");
	else
		view_release(v);
}

/* ---------------------------------------------------------------- events */

static bool ph_suspect(const char *peer);

static void mb_msg_release(struct mb_msg *m)
{
	if (__atomic_sub_fetch(&m->pending, 1, __ATOMIC_ACQ_REL) == 0)
		free(m);
}

/* On each reactor: run the subscribers. */
static void mb_deliver(struct rx_reactor *r, void *arg)
{
	struct mb_msg *m = arg;
	/* A suspect peer that answered a probe meanwhile is not news. */
	if (!rx_reactor_stopping(r) &&
	    (m->ev != MB_SUSPECT || ph_suspect(m->peer))) {
		met_inc(g.events[m->ev]);
		for (unsigned i = 0; i < g.nsubs; i++)
			if (g.subs[i].mask & MB_ON(m->ev))
				g.subs[i].fn(r, m->ev, m->peer, m->epoch,
					     g.subs[i].arg);
	}
	mb_msg_release(m);
}

static void mb_announce(enum mb_event ev, const char *peer, uint64_t epoch)
{
	struct rx_group *grp = __atomic_load_n(&g.ctx->group, __ATOMIC_ACQUIRE);
	if (!grp)
		return; /* no reactor runs (shutting down) */
	size_t len = strlen(peer) + 1;
	struct mb_msg *m = malloc(sizeof(*m) + len);
	if (!m) {
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "out of memory: %s of %s not "
			  "announced", mb_event_name(ev), peer);
		return;
	}
	m->ev = ev;
	m->epoch = epoch;
	memcpy(m->peer, peer, len);
	unsigned n = rx_group_size(grp);
	m->pending = n + 1; /* ours, dropped last */
	for (unsigned t = 0; t < n; t++) {
		int ret = rx_group_post(grp, t, mb_deliver, m);
		if (ret < 0) {
			if (ret != -ESHUTDOWN)
				PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "cannot tell "
					  "reactor %u that %s: %s", t, peer,
					  mb_event_name(ev));
			mb_msg_release(m);
		}
	}
	mb_msg_release(m);
}

static int mb_subscribe(unsigned mask, mb_event_fn fn, void *arg)
{
	if (g.nsubs == SUBSCRIBERS_MAX)
		return -ENOSPC;
	g.subs[g.nsubs++] = (struct sub){mask, fn, arg};
	return 0;
}

static struct ring *mb_ring(void)
{
	struct view *v = view_current();
	return v ? v->ring : NULL;
}

static uint64_t mb_epoch(void)
{
	struct view *v = view_current();
	return v ? ring_epoch(v->ring) : 0;
}

static const struct mb_api membership_api = {
	.ring = mb_ring,
	.epoch = mb_epoch,
	.subscribe = mb_subscribe,
};

/* --------------------------------------------------------------- changes */

/* Members of b that are not in a, passed to fn (or counted). */
static unsigned ring_minus(const struct ring *b, const struct ring *a,
			   void (*fn)(const char *id, void *arg), void *arg)
{
	unsigned n = 0;
	for (unsigned i = 0; i < ring_size(b); i++)
		if (ring_find(a, ring_member(b, i)) < 0) {
			if (fn)
				fn(ring_member(b, i), arg);
			n++;
		}
	return n;
}

static void log_join(const char *id, void *arg)
{
	uint64_t epoch = *(const uint64_t *)arg;
	PC_LOGI(LOG_MOD, "peer %s joined the ring (epoch %llu)", id,
		(unsigned long long)epoch);
	mb_announce(MB_JOIN, id, epoch);
}

static void log_leave(const char *id, void *arg)
{
	uint64_t epoch = *(const uint64_t *)arg;
	PC_LOGI(LOG_MOD, "peer %s left the ring (epoch %llu)", id,
		(unsigned long long)epoch);
	mb_announce(MB_LEAVE, id, epoch);
}

/*
 * Make this node plus peers the membership (change_lock held). Returns 1
 * when the membership changed, 0 when it already was that, or -errno (err
 * says why). why names the source for the log.
 */
static int membership_apply(const struct peer_list *peers, const char *why,
			    char *err, size_t errlen)
{
	struct view *old = view_current();
	if (!old) {
		snprintf(err, errlen, "the cluster module has not started");
		return -EAGAIN;
	}
	const char **members = malloc((peers->n + 1) * sizeof(*members));
	if (!members) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	unsigned n = 0;
	members[n++] = g.cl.self_id;
	for (unsigned i = 0; i < peers->n; i++) {
		bool dup = false;
		for (unsigned j = 0; j < n && !dup; j++)
			dup = strcmp(members[j], peers->ids[i]) == 0;
		if (!dup) /* the list may name this node too */
			members[n++] = peers->ids[i];
	}
	bool same = n == ring_size(old->ring);
	for (unsigned i = 0; same && i < n; i++)
		same = ring_find(old->ring, members[i]) >= 0;
	if (same) {
		free(members);
		return 0;
	}
	uint64_t epoch = ring_epoch(old->ring) + 1;
	struct ring *ring;
	int ret = ring_build_epoch(&ring, members, n, g.vnodes, epoch);
	free(members);
	if (ret < 0) {
		snprintf(err, errlen, "cannot build the ring: %s",
			 strerror(-ret));
		return ret;
	}
	struct view *v = view_new(ring, old);
	if (!v) {
		ring_unref(ring);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	PC_ASSERT(ring_epoch(v->ring) == ring_epoch(old->ring) + 1);
	__atomic_store_n(&g.view, v, __ATOMIC_RELEASE);
	met_inc(g.changes);
	unsigned joined = ring_minus(ring, old->ring, NULL, NULL);
	unsigned left = ring_minus(old->ring, ring, NULL, NULL);
	PC_LOGI(LOG_MOD, "membership epoch %llu (%s): %u member%s, %u joined, "
		"%u left", (unsigned long long)epoch, why, n, n == 1 ? "" : "s",
		joined, left);
	ring_minus(ring, old->ring, log_join, &epoch);
	ring_minus(old->ring, ring, log_leave, &epoch);
	view_retire(old);
	return 1;
}

/* svc_cluster.set_members: the discovery module's path to a new view. */
static int cl_set_members(const char *const *ids, unsigned n,
			  const char *why)
{
	struct peer_list l = {0};
	char err[256] = "";
	int ret = 0;
	for (unsigned i = 0; i < n && ret == 0; i++)
		ret = peers_add(&l, ids[i], strlen(ids[i]), err, sizeof(err));
	if (ret == 0 && pthread_mutex_trylock(&g.change_lock) != 0)
		ret = -EBUSY; /* never wait: the caller retries */
	else if (ret == 0) {
		ret = membership_apply(&l, why, err, sizeof(err));
		pthread_mutex_unlock(&g.change_lock);
	}
	if (ret < 0 && ret != -EBUSY)
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: membership not changed: %s",
			  why, err);
	peers_free(&l);
	return ret;
}

/* --------------------------------------------------------------- health */

/* The entry of a member other than this node in v; NULL for anything
 * else. */
static struct health *health_of(struct view *v, const char *peer)
{
	int i = v && peer ? ring_find(v->ring, peer) : -1;
	if (i < 0 || i == v->self_idx)
		return NULL;
	return &v->health[i];
}

static bool ph_suspect(const char *peer)
{
	struct view *v = view_current();
	if (!v || !peer)
		return false;
	struct health *h = health_of(v, peer);
	if (h)
		return __atomic_load_n(&h->state, __ATOMIC_ACQUIRE) == PH_SUSPECT;
	/* Not a member: one that left is skipped like a suspect one (its
	 * pages are misses at once, not a connect that may hang). */
	for (unsigned i = 0; i < v->ndeparted; i++)
		if (strcmp(v->departed[i], peer) == 0)
			return true;
	return false;
}

static void ph_failed(const char *peer, int err, const char *what)
{
	struct view *v = view_current();
	struct health *h = health_of(v, peer);
	uint32_t healthy = PH_HEALTHY;
	if (!h || !ph_no_answer(err) ||
	    !__atomic_compare_exchange_n(&h->state, &healthy, PH_SUSPECT, false,
					 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return;
	__atomic_store_n(&h->since_ns, pc_now_ns(), __ATOMIC_RELAXED);
	met_inc(g.transitions);
	PC_LOGW(LOG_MOD, "peer %s is suspect (%s: %s): skipped until it answers "
		"a probe", peer, what, strerror(-err));
	mb_announce(MB_SUSPECT, peer, ring_epoch(v->ring));
}

static const struct ph_api health_api = {
	.suspect = ph_suspect,
	.failed = ph_failed,
};

static double members_fn(void *arg)
{
	(void)arg;
	struct view *v = view_current();
	return v ? ring_size(v->ring) : 0;
}

static double epoch_fn(void *arg)
{
	(void)arg;
	return (double)mb_epoch();
}

static double suspect_fn(void *arg)
{
	(void)arg;
	struct view *v = view_current();
	unsigned n = 0;
	for (unsigned i = 0; v && i < ring_size(v->ring); i++)
		n += __atomic_load_n(&v->health[i].state, __ATOMIC_RELAXED) ==
		     PH_SUSPECT;
	return n;
}

/* peercache_member_info: one series per ring member, value 1 (scraped on
 * reactor 0, so the view it loads stays alive while it runs). */
static void member_info_collector(struct met_writer *w, void *arg)
{
	(void)arg;
	struct view *v = view_current();
	if (!v)
		return;
	met_w_family(w, "peercache_member_info",
		     "ring members: member and addr (its rpc address), self, "
		     "state (self, alive or suspect)", MET_GAUGE);
	for (unsigned i = 0; i < ring_size(v->ring); i++) {
		char esc[2 * RING_ID_BYTES_MAX + 4], labels[5 * RING_ID_BYTES_MAX];
		bool self = (int)i == v->self_idx;
		met_escape_label(ring_member(v->ring, i), esc, sizeof(esc));
		snprintf(labels, sizeof(labels),
			 "member=\"%s\",addr=\"%s\",self=\"%s\",state=\"%s\"",
			 esc, esc, self ? "true" : "false",
			 self ? "self"
			 : __atomic_load_n(&v->health[i].state,
					   __ATOMIC_RELAXED) == PH_SUSPECT
				 ? "suspect" : "alive");
		met_w_sample(w, "peercache_member_info", labels, 1);
	}
}

/* Reactor 0: a probe came back. The view may have changed meanwhile. */
static void probe_done(void *arg, const struct rpc_result *res)
{
	struct probe *pr = arg;
	struct view *v = view_current();
	struct health *h = health_of(v, pr->id);
	if (h)
		__atomic_store_n(&h->probing, 0, __ATOMIC_RELAXED);
	uint32_t suspect = PH_SUSPECT;
	if (h && res->err == 0 &&
	    __atomic_compare_exchange_n(&h->state, &suspect, PH_HEALTHY, false,
					__ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
		uint64_t since = __atomic_load_n(&h->since_ns, __ATOMIC_RELAXED);
		PC_LOGI(LOG_MOD, "peer %s answers again after %.1f s suspect: "
			"healthy", pr->id, (double)(pc_now_ns() - since) / 1e9);
		mb_announce(MB_RECOVER, pr->id, ring_epoch(v->ring));
	}
	free(pr);
}

/* Reactor 0, every peer_probe_interval: probe each suspect peer. */
static void probe_tick(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	(void)t;
	struct view *v = view_current();
	for (unsigned i = 0; v && i < ring_size(v->ring); i++) {
		struct health *h = &v->health[i];
		if (__atomic_load_n(&h->probing, __ATOMIC_RELAXED) ||
		    __atomic_load_n(&h->state, __ATOMIC_ACQUIRE) != PH_SUSPECT)
			continue;
		struct probe *pr = malloc(sizeof(*pr));
		if (!pr)
			continue;
		snprintf(pr->id, sizeof(pr->id), "%s", ring_member(v->ring, i));
		/* Twice the interval: a node just thawed gets a moment to work
		 * through its backlog, and one probe at a time keeps the rate. */
		struct rpc_req *q = rpc_req_new(g.probe_cl, pr->id,
						"node.health", 0,
						2 * g.probe_ms, probe_done, pr);
		if (!q) {
			free(pr);
			continue;
		}
		__atomic_store_n(&h->probing, 1, __ATOMIC_RELAXED);
		met_inc(g.probes);
		rpc_req_send(q);
	}
}

/* ------------------------------------------------------------- lifecycle */

static int c_init(struct pc_ctx *ctx)
{
	const struct pc_settings *s = ctx->cfg;
	memset(&g, 0, sizeof(g));
	g.ctx = ctx;
	const char *host = *s->advertise_host ? s->advertise_host : s->bind;
	if (!strcmp(host, "0.0.0.0") || !strcmp(host, "::") || !*host) {
		PC_LOGE(LOG_MOD, "bind is a wildcard address: set advertise_host "
			"to the address other nodes use to reach this one");
		return -EINVAL;
	}
	char err[256];
	int ret = peers_parse(&g.boot, s->peers, err, sizeof(err));
	if (ret < 0) {
		PC_LOGE(LOG_MOD, "peers: %s", err);
		peers_free(&g.boot);
		return ret;
	}
	pthread_mutex_init(&g.change_lock, NULL);
	pthread_mutex_init(&g.retire_lock, NULL);
	g.vnodes = (unsigned)s->vnodes;
	g.cl.set_members = cl_set_members;
	g.probe_ms = (unsigned)s->peer_probe_interval_ms;
	rx_timer_init(&g.probe_timer, probe_tick, NULL); /* stop may run */
	if ((ret = svc_publish_health(ctx, "cluster", &health_api)) < 0 ||
	    (ret = svc_publish_membership(ctx, "cluster", &membership_api)) < 0 ||
	    (ret = svc_publish_cluster(ctx, "cluster", &g.cl)) < 0)
		return ret;
	met_register_fn("peercache_members", "members of the ring", NULL,
			members_fn, NULL);
	met_register_collector(member_info_collector, NULL);
	met_register_fn("peercache_ring_epoch", "epoch of the current ring "
			"(1 at start, +1 per membership change)", NULL,
			epoch_fn, NULL);
	met_register_fn("peercache_peers_suspect",
			"peers that did not answer and are skipped until a probe "
			"succeeds", NULL, suspect_fn, NULL);
	g.transitions = met_register(MET_COUNTER,
				     "peercache_peer_suspect_transitions_total",
				     "times a peer became suspect (it did not "
				     "answer a call)", NULL);
	g.probes = met_register(MET_COUNTER, "peercache_peer_probes_total",
				"node.health probes sent to suspect peers",
				NULL);
	g.changes = met_register(MET_COUNTER,
				 "peercache_membership_changes_total",
				 "membership changes applied (cluster.set_peers, "
				 "SIGHUP reload)", NULL);
	/* The table keeps the label strings: static, in enum order. */
	static const char *const labels[MB_EVENTS] = {
		"event=\"join\"", "event=\"leave\"", "event=\"suspect\"",
		"event=\"recover\""};
	for (unsigned e = 0; e < MB_EVENTS; e++)
		g.events[e] = met_register(MET_COUNTER,
					   "peercache_membership_events_total",
					   "membership events delivered to "
					   "subscribers (once per reactor)",
					   labels[e]);
	return 0;
}

static int c_start(struct rx_reactor *r, struct pc_ctx *ctx)
{
	if (rx_reactor_id(r) != 0)
		return 0;
	const struct pc_settings *s = ctx->cfg;
	const char *host = *s->advertise_host ? s->advertise_host : s->bind;
	int rpc = published_port(ctx, "rpc"), data = published_port(ctx, "data");
	if (rpc <= 0 || data <= 0) {
		PC_LOGE(LOG_MOD, "the rpc and data listeners must start before "
			"the cluster module");
		return -EINVAL;
	}
	snprintf(g.cl.self_id, sizeof(g.cl.self_id), "%s:%d", host, rpc);
	snprintf(g.cl.self_data, sizeof(g.cl.self_data), "%s:%d", host,
		 data);
	const char *members[PEERS_MAX + 1];
	unsigned n = 0;
	members[n++] = g.cl.self_id;
	for (unsigned i = 0; i < g.boot.n; i++) {
		bool dup = false;
		for (unsigned j = 0; j < n; j++)
			dup |= strcmp(members[j], g.boot.ids[i]) == 0;
		if (!dup) /* the list may name this node too */
			members[n++] = g.boot.ids[i];
	}
	struct ring *ring;
	int ret = ring_build_epoch(&ring, members, n, g.vnodes, 1);
	if (ret < 0) {
		PC_LOGE(LOG_MOD, "cannot build the ring: %s", strerror(-ret));
		return ret;
	}
	struct view *v = view_new(ring, NULL);
	if (!v) {
		ring_unref(ring);
		return -ENOMEM;
	}
	__atomic_store_n(&g.view, v, __ATOMIC_RELEASE);
	struct rpc_client_opts o;
	rpc_client_opts_default(&o);
	o.secret = s->cluster_secret;
	o.conns_per_endpoint = 1;
	o.connect_timeout_ms = 2 * g.probe_ms;
	o.backoff_max_ms = g.probe_ms; /* a refused probe retries next tick */
	if (!(g.probe_cl = rpc_client_new(r, &o)))
		return -ENOMEM;
	rx_timer_start(r, &g.probe_timer, RX_MS(g.probe_ms), RX_MS(g.probe_ms));
	PC_LOGI(LOG_MOD, "ring of %u member%s (%lld vnodes each, epoch 1): this "
		"node is %s, data on %s", n, n == 1 ? "" : "s",
		(long long)s->vnodes, g.cl.self_id, g.cl.self_data);
	return 0;
}

static void c_stop(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	if (rx_reactor_id(r) == 0)
		rx_timer_stop(r, &g.probe_timer);
}

static void c_exit(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	if (rx_reactor_id(r) == 0 && g.probe_cl) {
		rpc_client_free(g.probe_cl); /* fails a probe in flight */
		g.probe_cl = NULL;
	}
}

/* SIGHUP: the peers of the configuration read again become the members. */
static int c_reload(struct pc_ctx *ctx, const struct pc_settings *fresh)
{
	if (pc_settings_discovery_on(ctx->cfg))
		return 0; /* discovery owns the membership */
	struct peer_list l = {0};
	char err[256];
	int ret = peers_parse(&l, fresh->peers, err, sizeof(err));
	if (ret == 0) {
		pthread_mutex_lock(&g.change_lock);
		ret = membership_apply(&l, "reload", err, sizeof(err));
		pthread_mutex_unlock(&g.change_lock);
	}
	if (ret < 0)
		PC_LOGW(LOG_MOD, "reload: peers not changed: %s", err);
	else if (ret == 0)
		PC_LOGI(LOG_MOD, "reload: peers unchanged (epoch %llu)",
			(unsigned long long)mb_epoch());
	peers_free(&l);
	return ret < 0 ? ret : 0;
}

static void c_fini(struct pc_ctx *ctx)
{
	met_unregister_collector(member_info_collector, NULL);
	svc_withdraw_health(ctx);
	svc_withdraw_membership(ctx);
	svc_withdraw_cluster(ctx);
	if (g.view)
		view_free(g.view);
	while (g.retired) { /* reactors have ended: nobody reads these */
		struct view *v = g.retired;
		g.retired = v->next;
		view_free(v);
	}
	peers_free(&g.boot);
	pthread_mutex_destroy(&g.change_lock);
	pthread_mutex_destroy(&g.retire_lock);
	memset(&g, 0, sizeof(g));
}

/* ------------------------------------------------------------------ RPC */

static void m_members(struct rpc_call *call, struct mp_rd *params)
{
	(void)params;
	struct view *v = view_current();
	unsigned n = v ? ring_size(v->ring) : 0;
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_array(pk, n);
	for (unsigned i = 0; i < n; i++) {
		msgpack_pack_map(pk, 3);
		mp_pack_cstr(pk, "id");
		mp_pack_cstr(pk, ring_member(v->ring, i));
		mp_pack_cstr(pk, "self");
		if ((int)i == v->self_idx)
			msgpack_pack_true(pk);
		else
			msgpack_pack_false(pk);
		mp_pack_cstr(pk, "state");
		mp_pack_cstr(pk, __atomic_load_n(&v->health[i].state,
						 __ATOMIC_ACQUIRE) == PH_SUSPECT
					 ? "suspect"
				 : pc_settings_discovery_on(g.ctx->cfg)
					 ? "discovered"
					 : "static");
	}
	rpc_reply_end(call);
}

static void pack_id(const char *id, void *arg)
{
	mp_pack_cstr(arg, id);
}

/* The params of set_peers: [[ "host:port", ... ]] or ["host:port, ..."]. */
static int read_peer_params(struct mp_rd *p, struct peer_list *l, char *err,
			    size_t errlen)
{
	const char *s;
	uint32_t n, len;
	if (mp_peek(p) == MP_T_STR) {
		if (mp_rd_str(p, &s, &len) < 0)
			return -EINVAL;
		char *list = strndup(s, len);
		if (!list)
			return -ENOMEM;
		int ret = memchr(s, '\0', len)
				  ? (snprintf(err, errlen, "NUL in the list"),
				     -EINVAL)
				  : peers_parse(l, list, err, errlen);
		free(list);
		return ret;
	}
	if (mp_rd_array(p, &n) < 0) {
		snprintf(err, errlen, "expected [[\"host:port\", ...]] or "
			 "[\"host:port,host:port\"]");
		return -EINVAL;
	}
	if (n > PEERS_MAX) {
		snprintf(err, errlen, "%u peers, at most %d", n, PEERS_MAX);
		return -E2BIG;
	}
	for (uint32_t i = 0; i < n; i++) {
		if (mp_rd_str(p, &s, &len) < 0) {
			snprintf(err, errlen, "peer %u is not a string", i);
			return -EINVAL;
		}
		if (memchr(s, '\0', len)) {
			snprintf(err, errlen, "peer %u contains NUL", i);
			return -EINVAL;
		}
		int ret = peers_add(l, s, len, err, errlen);
		if (ret < 0)
			return ret;
	}
	return 0;
}

static void m_set_peers(struct rpc_call *call, struct mp_rd *params)
{
	if (pc_settings_discovery_on(g.ctx->cfg)) {
		rpc_reply_error(call, RPC_E_FORBIDDEN, "membership is managed by "
				"discovery on this node (discovery_addr or "
				"discovery_backend = etcd is set)");
		return;
	}
	struct peer_list l = {0};
	char err[256] = "";
	int ret = read_peer_params(params, &l, err, sizeof(err));
	if (ret == 0)
		ret = peers_check_unique(&l, err, sizeof(err));
	if (ret == 0 && (uint64_t)(l.n + 1) * g.vnodes > SET_PEERS_POINTS_MAX) {
		snprintf(err, sizeof(err), "%u members x %u vnodes is more than "
			 "this call builds on a reactor (%u ring points); put "
			 "the list in the config file and send SIGHUP", l.n + 1,
			 g.vnodes, SET_PEERS_POINTS_MAX);
		ret = -E2BIG;
	}
	if (ret < 0) {
		peers_free(&l);
		if (ret == -ENOMEM)
			rpc_reply_error(call, RPC_E_BUSY, "out of memory");
		else if (ret == -E2BIG)
			rpc_reply_error(call, RPC_E_TOO_LARGE, "%s", err);
		else
			rpc_reply_error(call, RPC_E_BAD_PARAMS, "%s", err);
		return;
	}
	/* Never wait on a reactor: a change in progress elsewhere (a reload
	 * building a large ring) answers busy. */
	if (pthread_mutex_trylock(&g.change_lock) != 0) {
		peers_free(&l);
		rpc_reply_error(call, RPC_E_BUSY, "another membership change is "
				"in progress; retry");
		return;
	}
	struct view *before = view_current();
	/* Kept past the swap: this callback is within the grace period. */
	struct ring *old = before ? ring_ref(before->ring) : NULL;
	ret = membership_apply(&l, "cluster.set_peers", err, sizeof(err));
	pthread_mutex_unlock(&g.change_lock);
	peers_free(&l);
	if (ret < 0) {
		ring_unref(old);
		rpc_reply_error(call, ret == -EAGAIN ? RPC_E_UNAVAILABLE
						     : RPC_E_INTERNAL, "%s", err);
		return;
	}
	struct ring *now = view_current()->ring;
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_map(pk, 5);
	mp_pack_cstr(pk, "epoch");
	msgpack_pack_uint64(pk, ring_epoch(now));
	mp_pack_cstr(pk, "changed");
	if (ret > 0)
		msgpack_pack_true(pk);
	else
		msgpack_pack_false(pk);
	mp_pack_cstr(pk, "members");
	msgpack_pack_array(pk, ring_size(now));
	for (unsigned i = 0; i < ring_size(now); i++)
		mp_pack_cstr(pk, ring_member(now, i));
	mp_pack_cstr(pk, "joined");
	msgpack_pack_array(pk, ring_minus(now, old, NULL, NULL));
	ring_minus(now, old, pack_id, pk);
	mp_pack_cstr(pk, "left");
	msgpack_pack_array(pk, ring_minus(old, now, NULL, NULL));
	ring_minus(old, now, pack_id, pk);
	rpc_reply_end(call);
	ring_unref(old);
}

static const struct rpc_method cluster_methods[] = {
	{"cluster.members", m_members, 0,
	 "members of the ring: [{id, self, state}]"},
	{"cluster.set_peers", m_set_peers, 0,
	 "[[\"host:port\", ...]] -> {epoch, changed, members, joined, left}: "
	 "this node plus these peers become the members"},
	{NULL, NULL, 0, NULL},
};

const struct pc_module pc_mod_cluster = {
	.name = "cluster",
	.init = c_init,
	.start = c_start,
	.stop = c_stop,
	.exit = c_exit,
	.fini = c_fini,
	.reload = c_reload,
	.rpc_methods = cluster_methods,
};
