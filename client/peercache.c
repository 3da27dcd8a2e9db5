/*
 * client/peercache.c — libpeercache (see peercache.h).
 *
 * Owns: the struct pcache of a process — its pool of connections to the
 * node (rpc/sync.c: lease, call, release; a failed connection is never
 * reused), its table of shared-memory regions, and per connection the set of
 * regions already registered there (sessions live per connection on the
 * node, so a region is registered on each connection that uses it).
 * Threading: any thread. The region table has a mutex held only to read or
 * change an entry; calls run without it. Counters are atomic.
 */
#include "peercache.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rpc/client.h"
#include "rpc/mp.h"

#define DEFAULT_SOCKET "/run/peercache/peercached.sock"

struct region {
	bool live;
	int fd;          /* our duplicate, sent on each connection */
	uint64_t size;
	void *addr;      /* set when we created and mapped it */
	uint64_t gen;    /* bumped each time the slot is reused */
};

struct pcache {
	struct rpc_sync *rs;
	unsigned timeout_ms;
	pthread_mutex_t lock;
	struct region regions[PCACHE_REGIONS_MAX];
	struct pcache_stats st; /* atomic adds */
};

/* What a connection has registered: region slot -> generation. */
struct conn_state {
	uint64_t gen[PCACHE_REGIONS_MAX]; /* 0: not registered */
};

static _Thread_local char t_err[256];

const char *pcache_last_error(void)
{
	return t_err;
}

#define STAT_ADD(pc, f, n) __atomic_add_fetch(&(pc)->st.f, (n), __ATOMIC_RELAXED)

int pcache_open(const struct pcache_opts *o, struct pcache **out)
{
	const char *path = o && o->socket_path ? o->socket_path
					       : getenv("PEERCACHE_SOCKET");
	if (!path || !*path)
		path = DEFAULT_SOCKET;
	char ep[512];
	if ((size_t)snprintf(ep, sizeof(ep), "unix:%s", path) >= sizeof(ep))
		return -ENAMETOOLONG;
	struct pcache *pc = calloc(1, sizeof(*pc));
	if (!pc)
		return -ENOMEM;
	pc->timeout_ms = o && o->timeout_ms ? o->timeout_ms : 30000;
	struct rpc_sync_opts so;
	rpc_sync_opts_default(&so);
	so.timeout_ms = pc->timeout_ms;
	if (o && o->max_idle)
		so.max_idle = o->max_idle;
	int err;
	pc->rs = rpc_sync_new(ep, &so, &err);
	if (!pc->rs) {
		free(pc);
		return err;
	}
	pthread_mutex_init(&pc->lock, NULL);
	for (unsigned i = 0; i < PCACHE_REGIONS_MAX; i++)
		pc->regions[i].fd = -1;
	*out = pc;
	return 0;
}

void pcache_close(struct pcache *pc)
{
	if (!pc)
		return;
	rpc_sync_free(pc->rs); /* closing the connections ends the sessions */
	for (unsigned i = 0; i < PCACHE_REGIONS_MAX; i++) {
		struct region *r = &pc->regions[i];
		if (r->fd >= 0)
			close(r->fd);
		if (r->addr)
			munmap(r->addr, r->size);
	}
	pthread_mutex_destroy(&pc->lock);
	free(pc);
}

/* ------------------------------------------------------------------ calls */

/* One call on a leased connection; fills t_err on any error. rep is always
 * set, so the caller frees it on every path. */
static int call(struct pcache *pc, struct rpc_sync_conn *c, const char *m,
		const struct pc_wbuf *params, const int *fds, unsigned nfds,
		struct rpc_sync_reply *rep)
{
	STAT_ADD(pc, calls, 1);
	if (params->failed) {
		/* Callers free rep whatever happened: leave nothing to free. */
		memset(rep, 0, sizeof(*rep));
		snprintf(t_err, sizeof(t_err), "request too large");
		STAT_ADD(pc, errors, 1);
		return -EMSGSIZE;
	}
	int ret = rpc_sync_conn_call(pc->rs, c, m, params->data, params->len,
				     fds, nfds, pc->timeout_ms, rep);
	if (ret == 0 && rep->res.err == -EREMOTEIO) {
		snprintf(t_err, sizeof(t_err), "%s: %s", rep->res.code,
			 rep->res.message);
		ret = strcmp(rep->res.code, "unauthorized") == 0 ? -EACCES
								: -EREMOTEIO;
	} else if (ret < 0) {
		snprintf(t_err, sizeof(t_err), "%s", strerror(-ret));
	}
	if (ret < 0)
		STAT_ADD(pc, errors, 1);
	return ret;
}

static void state_free(void *p)
{
	free(p);
}

/* Lease a connection with region `region` registered on it (or none when
 * region < 0). */
static int lease(struct pcache *pc, int region, struct rpc_sync_conn **out)
{
	struct rpc_sync_conn *c;
	int ret = rpc_sync_lease(pc->rs, pc->timeout_ms, &c);
	if (ret < 0) {
		snprintf(t_err, sizeof(t_err), "cannot reach the node: %s",
			 strerror(-ret));
		return ret;
	}
	struct conn_state *cs = rpc_sync_conn_udata(c);
	if (!cs) {
		if (!(cs = calloc(1, sizeof(*cs)))) {
			rpc_sync_release(pc->rs, c);
			return -ENOMEM;
		}
		rpc_sync_conn_set_udata(c, cs, state_free);
		STAT_ADD(pc, connections, 1);
	}
	if (region >= 0) {
		pthread_mutex_lock(&pc->lock);
		struct region r = pc->regions[region];
		pthread_mutex_unlock(&pc->lock);
		if (!r.live) {
			rpc_sync_release(pc->rs, c);
			return -EINVAL;
		}
		if (cs->gen[region] != r.gen) {
			struct pc_wbuf w;
			msgpack_packer pk;
			struct rpc_sync_reply rep;
			pc_wbuf_init(&w, 0);
			pc_wbuf_packer(&w, &pk);
			msgpack_pack_array(&pk, 2);
			msgpack_pack_uint32(&pk, (uint32_t)region);
			msgpack_pack_uint64(&pk, r.size);
			/* A slot reused since: drop the old registration. */
			if (cs->gen[region]) {
				struct pc_wbuf u;
				msgpack_packer upk;
				pc_wbuf_init(&u, 0);
				pc_wbuf_packer(&u, &upk);
				msgpack_pack_array(&upk, 1);
				msgpack_pack_uint32(&upk, (uint32_t)region);
				ret = call(pc, c, "session.unregister", &u, NULL,
					   0, &rep);
				pc_wbuf_free(&u);
				rpc_sync_reply_free(&rep);
			}
			if (ret == 0)
				ret = call(pc, c, "session.register", &w, &r.fd,
					   1, &rep);
			pc_wbuf_free(&w);
			rpc_sync_reply_free(&rep);
			if (ret < 0) {
				rpc_sync_release(pc->rs, c);
				return ret;
			}
			cs->gen[region] = r.gen;
			STAT_ADD(pc, registrations, 1);
		}
	}
	*out = c;
	return 0;
}

/* Read a [bool, ...] result of n entries. */
static int read_bools(struct rpc_sync_reply *rep, size_t n, bool *ok,
		      uint64_t *count)
{
	struct mp_rd r = rep->res.result;
	uint32_t m;
	if (mp_rd_array(&r, &m) < 0 || m != n) {
		snprintf(t_err, sizeof(t_err), "unexpected reply");
		return -EPROTO;
	}
	for (uint32_t i = 0; i < m; i++) {
		if (mp_rd_bool(&r, &ok[i]) < 0)
			return -EPROTO;
		*count += ok[i];
	}
	return 0;
}

static int check_items(const struct pcache_item *it, size_t n)
{
	if (n == 0 || n > PCACHE_BATCH_MAX)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (!it[i].key || it[i].keylen == 0 ||
		    it[i].keylen > PCACHE_KEY_MAX || it[i].len == 0)
			return -EINVAL;
	return 0;
}

static int move(struct pcache *pc, bool set, uint32_t region,
		const struct pcache_item *it, size_t n, bool *ok)
{
	const char *method = set ? "session.set" : "session.get";
	memset(ok, 0, n * sizeof(*ok));
	if (region >= PCACHE_REGIONS_MAX || check_items(it, n) < 0) {
		snprintf(t_err, sizeof(t_err), "bad arguments");
		return -EINVAL;
	}
	struct rpc_sync_conn *c;
	int ret = lease(pc, (int)region, &c);
	if (ret < 0)
		return ret;
	struct pc_wbuf w;
	msgpack_packer pk;
	pc_wbuf_init(&w, 0);
	pc_wbuf_packer(&w, &pk);
	msgpack_pack_array(&pk, 2);
	msgpack_pack_uint32(&pk, region);
	msgpack_pack_array(&pk, n);
	for (size_t i = 0; i < n; i++) {
		msgpack_pack_array(&pk, 3);
		msgpack_pack_str(&pk, it[i].keylen);
		msgpack_pack_str_body(&pk, it[i].key, it[i].keylen);
		msgpack_pack_uint64(&pk, it[i].offset);
		msgpack_pack_uint64(&pk, it[i].len);
	}
	struct rpc_sync_reply rep;
	ret = call(pc, c, method, &w, NULL, 0, &rep);
	pc_wbuf_free(&w);
	uint64_t good = 0;
	if (ret == 0)
		ret = read_bools(&rep, n, ok, &good);
	rpc_sync_reply_free(&rep);
	rpc_sync_release(pc->rs, c);
	STAT_ADD(pc, pages_set, set ? n : 0);
	STAT_ADD(pc, pages_set_ok, set ? good : 0);
	STAT_ADD(pc, pages_get, set ? 0 : n);
	STAT_ADD(pc, pages_get_ok, set ? 0 : good);
	if (ret == 0) {
		uint64_t moved = 0;
		for (size_t i = 0; i < n; i++)
			moved += ok[i] ? it[i].len : 0;
		if (set)
			STAT_ADD(pc, bytes_set, moved);
		else
			STAT_ADD(pc, bytes_got, moved);
	}
	return ret;
}

int pcache_set(struct pcache *pc, uint32_t region,
	       const struct pcache_item *items, size_t n, bool *ok)
{
	return move(pc, true, region, items, n, ok);
}

int pcache_get(struct pcache *pc, uint32_t region,
	       const struct pcache_item *items, size_t n, bool *ok)
{
	return move(pc, false, region, items, n, ok);
}

/* kv.exists / kv.delete: [keys] -> uint */
static int keys_call(struct pcache *pc, const char *method,
		     const char *const *keys, const size_t *kl, size_t n,
		     size_t *count)
{
	*count = 0;
	if (n == 0 || n > PCACHE_BATCH_MAX)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (!keys[i] || kl[i] == 0 || kl[i] > PCACHE_KEY_MAX)
			return -EINVAL;
	struct rpc_sync_conn *c;
	int ret = lease(pc, -1, &c);
	if (ret < 0)
		return ret;
	struct pc_wbuf w;
	msgpack_packer pk;
	pc_wbuf_init(&w, 0);
	pc_wbuf_packer(&w, &pk);
	msgpack_pack_array(&pk, 1);
	msgpack_pack_array(&pk, n);
	for (size_t i = 0; i < n; i++) {
		msgpack_pack_str(&pk, kl[i]);
		msgpack_pack_str_body(&pk, keys[i], kl[i]);
	}
	struct rpc_sync_reply rep;
	ret = call(pc, c, method, &w, NULL, 0, &rep);
	pc_wbuf_free(&w);
	uint64_t v = 0;
	struct mp_rd r = rep.res.result;
	if (ret == 0 && mp_rd_uint(&r, &v) < 0)
		ret = -EPROTO;
	*count = (size_t)v;
	rpc_sync_reply_free(&rep);
	rpc_sync_release(pc->rs, c);
	return ret;
}

int pcache_exists(struct pcache *pc, const char *const *keys,
		  const size_t *keylens, size_t n, size_t *count)
{
	return keys_call(pc, "kv.exists", keys, keylens, n, count);
}

int pcache_delete(struct pcache *pc, const char *const *keys,
		  const size_t *keylens, size_t n, size_t *count)
{
	return keys_call(pc, "kv.delete", keys, keylens, n, count);
}

/* ----------------------------------------------------------------- regions */

int pcache_region_add(struct pcache *pc, int fd, uint64_t size,
		      uint32_t *region)
{
	if (fd < 0 || size == 0)
		return -EINVAL;
	int dup = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (dup < 0)
		return -errno;
	pthread_mutex_lock(&pc->lock);
	int slot = -1;
	for (unsigned i = 0; i < PCACHE_REGIONS_MAX && slot < 0; i++)
		if (!pc->regions[i].live && pc->regions[i].fd < 0)
			slot = (int)i;
	if (slot >= 0) {
		struct region *r = &pc->regions[slot];
		r->live = true;
		r->fd = dup;
		r->size = size;
		r->addr = NULL;
		r->gen++;
	}
	pthread_mutex_unlock(&pc->lock);
	if (slot < 0) {
		close(dup);
		return -ENOSPC;
	}
	*region = (uint32_t)slot;
	return 0;
}

int pcache_region_create(struct pcache *pc, uint64_t size, void **addr,
			 uint32_t *region)
{
	int fd = memfd_create("peercache-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	void *p = MAP_FAILED;
	int ret = ftruncate(fd, (off_t)size) < 0 ? -errno : 0;
	/* Sealed against shrinking: the node may copy from it at any time. */
	if (ret == 0)
		fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK);
	if (ret == 0 && (p = mmap(NULL, size, PROT_READ | PROT_WRITE,
				  MAP_SHARED, fd, 0)) == MAP_FAILED)
		ret = -errno;
	if (ret == 0)
		ret = pcache_region_add(pc, fd, size, region);
	close(fd);
	if (ret < 0) {
		if (p != MAP_FAILED)
			munmap(p, size);
		return ret;
	}
	pthread_mutex_lock(&pc->lock);
	pc->regions[*region].addr = p;
	pthread_mutex_unlock(&pc->lock);
	*addr = p;
	return 0;
}

int pcache_region_remove(struct pcache *pc, uint32_t region)
{
	if (region >= PCACHE_REGIONS_MAX)
		return -EINVAL;
	pthread_mutex_lock(&pc->lock);
	struct region *r = &pc->regions[region];
	int ret = r->live ? 0 : -ENOENT;
	if (r->live) {
		/* Connections still holding it drop it when the slot is
		 * reused (or when they close). */
		r->live = false;
		close(r->fd);
		r->fd = -1;
		if (r->addr)
			munmap(r->addr, r->size);
		r->addr = NULL;
	}
	pthread_mutex_unlock(&pc->lock);
	return ret;
}

/* -------------------------------------------------------------- info, stats */

int pcache_info(struct pcache *pc, char *buf, size_t len)
{
	if (len)
		buf[0] = '\0';
	struct rpc_sync_conn *c;
	int ret = lease(pc, -1, &c);
	if (ret < 0)
		return ret;
	static const uint8_t empty[] = {0x90};
	struct pc_wbuf w = {(uint8_t *)empty, 1, 1, 1, false};
	struct rpc_sync_reply rep;
	ret = call(pc, c, "node.info", &w, NULL, 0, &rep);
	rpc_sync_release(pc->rs, c);
	struct mp_rd r = rep.res.result;
	uint32_t n;
	size_t off = 0;
	if (ret == 0 && mp_rd_map(&r, &n) == 0) {
		for (uint32_t i = 0; i < n && off + 1 < len; i++) {
			const char *k, *s;
			uint32_t kl, sl;
			uint64_t u;
			double d;
			if (mp_rd_str(&r, &k, &kl) < 0)
				break;
			int m = 0;
			if (mp_rd_str(&r, &s, &sl) == 0)
				m = snprintf(buf + off, len - off, "%.*s: %.*s\n",
					     (int)kl, k, (int)sl, s);
			else if (mp_rd_uint(&r, &u) == 0)
				m = snprintf(buf + off, len - off, "%.*s: %llu\n",
					     (int)kl, k, (unsigned long long)u);
			else if (mp_rd_float(&r, &d) == 0)
				m = snprintf(buf + off, len - off, "%.*s: %.3f\n",
					     (int)kl, k, d);
			else
				mp_skip(&r);
			off += m > 0 ? (size_t)m : 0;
			if (off >= len)
				off = len - 1;
		}
	}
	rpc_sync_reply_free(&rep);
	return ret;
}

void pcache_stats(struct pcache *pc, struct pcache_stats *out)
{
	uint64_t *dst = (uint64_t *)out;
	const uint64_t *src = (const uint64_t *)&pc->st;
	for (size_t i = 0; i < sizeof(*out) / sizeof(uint64_t); i++)
		dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}
