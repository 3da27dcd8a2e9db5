/*
 * bench/tool/serve.c — `peercache-bench serve`: publish a working set of
 * pages through the local node (libpeercache's session API, the path an
 * SGLang producer takes), write the manifest drivers read, wait for the
 * drivers, and keep the set published until Ctrl-C: when the cluster's
 * membership changes, every page is set again (a set of a page the node
 * holds publishes its record again, to the key's new owners).
 *
 * Owns: one struct pcache, one shared-memory staging region, one rpc_sync
 * to the node's socket for cluster.members. Single-threaded.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/peercache.h"
#include "common/checksum.h"
#include "common/config.h"
#include "common/util.h"
#include "rpc/client.h"
#include "rpc/mp.h"
#include "tool.h"

/* The value of option NAME at argv[i] (see pc_opt_value). */
#define OPT(name) pc_opt_value(argc, argv, &i, name, &missing)

struct serve {
	const char *socket;
	const char *prefix;
	struct pcb_shape shape;
	uint64_t pages, ws_bytes, seed;
	unsigned batch, drivers;
	uint64_t check_ms, timeout_ms;
	bool keep;
	uint64_t page_bytes;
	unsigned page_tokens;
	struct pcache *pc;
	uint32_t region;
	uint8_t *buf;
	struct rpc_sync *rs;
	char node[128], mode[32];
	int node_argc;       /* after "--": a node of our own */
	char **node_argv;
};

static void serve_usage(FILE *out)
{
	fputs(
"usage: peercache-bench serve [OPTIONS] [-- PEERCACHED-ARGS]\n"
"\n"
"Publish a working set of pages through the node on this host (its Unix\n"
"socket and shared memory: SGLang's path), write the manifest that drivers\n"
"read (PREFIX/manifest), wait for --drivers drivers, then keep the set\n"
"published until Ctrl-C or SIGTERM, setting it again whenever the cluster's\n"
"membership changes. The node joins its cluster by its own configuration\n"
"(static peers or discovery); start it first, or give its arguments after\n"
"'--': serve then starts that peercached itself (e.g. -- --peers A,B,SELF\n"
"--rpc-port N, or -- --discovery-addr HEAD), uses its socket, and stops it\n"
"on exit.\n"
"\n"
"Options:\n"
"  --node PATH             the node's Unix socket [$PEERCACHE_SOCKET, else\n"
"                          " PCB_DEFAULT_SOCKET "]\n"
"  --prefix P              key prefix of the working set [pcb]\n"
"  --pages N               pages in the working set [--working-set / page]\n"
"  --working-set BYTES     size of the working set when --pages is not\n"
"                          given [1g]\n"
"  --batch N               pages per set call [16]\n"
"  --drivers N             wait until N drivers (ids 0..N-1) registered [0]\n"
"  --seed N                page content seed [1]\n"
"  --check-interval DUR    how often the membership is checked [1s]\n"
"  --timeout DUR           per call [30s]\n"
"  --keep                  leave the pages and manifest in the cluster on\n"
"                          exit (default: delete them)\n"
"  -h, --help\n"
"\n",
	      out);
	pcb_shape_help(out);
}

static int serve_args(struct serve *s, int argc, char **argv)
{
	pcb_shape_default(&s->shape);
	s->socket = getenv("PEERCACHE_SOCKET");
	if (!s->socket || !*s->socket)
		s->socket = PCB_DEFAULT_SOCKET;
	s->prefix = "pcb";
	s->ws_bytes = 1ull << 30;
	s->batch = 16;
	s->seed = 1;
	s->check_ms = 1000;
	s->timeout_ms = 30000;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v;
		bool missing = false;
		uint64_t x;
		int r = pcb_shape_option(&s->shape, argc, argv, &i);
		if (r < 0)
			return 2;
		if (r > 0)
			continue;
		if (!strcmp(a, "--")) {
			s->node_argc = argc - i - 1;
			s->node_argv = argv + i + 1;
			break;
		}
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			serve_usage(stdout);
			return -1;
		} else if (!strcmp(a, "--keep")) {
			s->keep = true;
		} else if ((v = OPT("--node"))) {
			s->socket = v;
		} else if ((v = OPT("--prefix"))) {
			if (pcb_parse_prefix(v))
				return 2;
			s->prefix = v;
		} else if ((v = OPT("--pages"))) {
			if (pcb_parse_u64("--pages", v, 1, 1ull << 32, &s->pages))
				return 2;
		} else if ((v = OPT("--working-set"))) {
			if (pcb_parse_u64("--working-set", v, 64, 1ull << 50,
					  &s->ws_bytes))
				return 2;
		} else if ((v = OPT("--batch"))) {
			if (pcb_parse_u64("--batch", v, 1, 4096, &x))
				return 2;
			s->batch = (unsigned)x;
		} else if ((v = OPT("--drivers"))) {
			if (pcb_parse_u64("--drivers", v, 0, 4096, &x))
				return 2;
			s->drivers = (unsigned)x;
		} else if ((v = OPT("--seed"))) {
			if (pcb_parse_u64("--seed", v, 0, UINT64_MAX, &s->seed))
				return 2;
		} else if ((v = OPT("--check-interval"))) {
			if (pcb_parse_ms("--check-interval", v, &s->check_ms))
				return 2;
			if (!s->check_ms)
				s->check_ms = 1;
		} else if ((v = OPT("--timeout"))) {
			if (pcb_parse_ms("--timeout", v, &s->timeout_ms))
				return 2;
			if (!s->timeout_ms)
				s->timeout_ms = 1;
		} else {
			fprintf(stderr, "peercache-bench serve: %s: %s (see "
				"'peercache-bench serve --help')\n",
				missing ? "option needs a value"
					: "unknown option", a);
			return 2;
		}
	}
	if (pcb_shape_resolve(&s->shape, &s->page_bytes, &s->page_tokens) < 0)
		return 2;
	if (!s->pages) {
		s->pages = s->ws_bytes / s->page_bytes;
		if (!s->pages)
			s->pages = 1;
	}
	return 0;
}

static int node_fail(const char *what, int ret)
{
	fprintf(stderr, "peercache-bench serve: %s: %s\n", what,
		ret == -EREMOTEIO ? pcache_last_error() : strerror(-ret));
	return 1;
}

/* Set pages [0, pages) again; *stored counts them. */
static int publish(struct serve *s, uint64_t *stored, bool progress)
{
	char keys[s->batch][PCB_KEY_MAX];
	struct pcache_item items[s->batch];
	bool ok[s->batch];
	uint64_t t0 = pc_now_ns(), last = t0;
	*stored = 0;
	for (uint64_t i = 0; i < s->pages && !pcb_stop; i += s->batch) {
		size_t n = s->pages - i < s->batch ? s->pages - i : s->batch;
		for (size_t j = 0; j < n; j++) {
			pcb_key(keys[j], sizeof(keys[j]), s->prefix, i + j);
			pcb_page_fill(s->buf + j * s->page_bytes,
				      s->page_bytes, i + j, s->seed);
			items[j] = (struct pcache_item){
				.key = keys[j],
				.keylen = strlen(keys[j]),
				.offset = j * s->page_bytes,
				.len = s->page_bytes};
		}
		int ret = pcache_set(s->pc, s->region, items, n, ok);
		if (ret < 0)
			return node_fail("set", ret);
		for (size_t j = 0; j < n; j++)
			*stored += ok[j];
		uint64_t now = pc_now_ns();
		if (progress && now - last > 1000000000ull) {
			last = now;
			fprintf(stderr, "serve: published %" PRIu64 "/%" PRIu64
				" pages (%.1f s)\n", i + n, s->pages,
				(double)(now - t0) / 1e9);
		}
	}
	return 0;
}

static int put_page(struct serve *s, const char *key, const uint8_t *page)
{
	memcpy(s->buf, page, PCB_MANIFEST_BYTES);
	struct pcache_item it = {.key = key, .keylen = strlen(key),
				 .offset = 0, .len = PCB_MANIFEST_BYTES};
	bool ok = false;
	int ret = pcache_set(s->pc, s->region, &it, 1, &ok);
	if (ret < 0)
		return node_fail("set of the manifest", ret);
	if (!ok) {
		fprintf(stderr, "peercache-bench serve: the node did not store "
			"%s (its log says why)\n", key);
		return 1;
	}
	return 0;
}

/* A fingerprint of the ring's members (their ids, in order; not their
 * health, which changes without changing placement): 0 when unknown. */
static uint64_t members_sig(struct serve *s, unsigned *count)
{
	static const uint8_t empty[] = {0x90};
	struct rpc_sync_reply rep;
	int ret = rpc_sync_call(s->rs, "cluster.members", empty, 1, NULL, 0,
				(unsigned)s->timeout_ms, &rep);
	struct pc_sum_state st;
	pc_sum_reset(&st);
	*count = 0;
	struct mp_rd r;
	uint32_t n;
	if (ret < 0 || rep.res.err)
		goto out;
	r = rep.res.result;
	if (mp_rd_array(&r, &n) < 0)
		goto out;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t m;
		if (mp_rd_map(&r, &m) < 0)
			break;
		for (uint32_t j = 0; j < m; j++) {
			const char *k, *v;
			uint32_t kl, vl;
			if (mp_rd_str(&r, &k, &kl) < 0)
				goto out;
			if (mp_str_eq(k, kl, "id") &&
			    mp_rd_str(&r, &v, &vl) == 0) {
				pc_sum_update(&st, v, vl);
				pc_sum_update(&st, "", 1); /* a separator */
			} else if (mp_skip(&r) < 0) {
				goto out;
			}
		}
	}
	*count = n;
out:
	rpc_sync_reply_free(&rep);
	if (!*count)
		return 0;
	uint64_t h = pc_sum_digest(&st);
	return h ? h : 1; /* 0 says "unknown" */
}

/* Delete keys [0, n) of kind (pages or driver registrations) under the
 * prefix, 256 a call; how many existed. */
static uint64_t delete_range(struct serve *s, uint64_t n, bool drivers)
{
	enum { PER_CALL = 256 };
	char keys[PER_CALL][PCB_KEY_MAX];
	const char *kp[PER_CALL];
	size_t kl[PER_CALL], count;
	uint64_t gone = 0;
	for (uint64_t i = 0; i < n; i += PER_CALL) {
		size_t k = n - i < PER_CALL ? n - i : PER_CALL;
		for (size_t j = 0; j < k; j++) {
			if (drivers)
				pcb_driver_key(keys[j], sizeof(keys[j]),
					       s->prefix, (unsigned)(i + j));
			else
				pcb_key(keys[j], sizeof(keys[j]), s->prefix,
					i + j);
			kp[j] = keys[j];
			kl[j] = strlen(keys[j]);
		}
		if (pcache_delete(s->pc, kp, kl, k, &count) == 0)
			gone += count;
	}
	return gone;
}

static void delete_manifest(struct serve *s)
{
	char key[PCB_KEY_MAX];
	const char *kp[1] = {key};
	size_t kl[1], count;
	pcb_manifest_key(key, sizeof(key), s->prefix);
	kl[0] = strlen(key);
	pcache_delete(s->pc, kp, kl, 1, &count);
}

/* Driver ids a serve clears: any a drive may take. */
#define DRIVER_IDS 4096

static void delete_all(struct serve *s)
{
	uint64_t gone = delete_range(s, s->pages, false);
	delete_range(s, DRIVER_IDS, true);
	delete_manifest(s);
	fprintf(stderr, "serve: deleted %" PRIu64 " pages, the manifest and "
		"the driver registrations\n", gone);
}

/* A working set left under the prefix (by serve --keep, or a serve that was
 * killed) would be kept by the node as it is: a set of a key it holds does
 * not copy again. Delete it, so that drivers never measure a shape other
 * than this one. */
static int clear_old(struct serve *s)
{
	char key[PCB_KEY_MAX];
	pcb_manifest_key(key, sizeof(key), s->prefix);
	struct pcache_item it = {.key = key, .keylen = strlen(key),
				 .offset = 0, .len = PCB_MANIFEST_BYTES};
	bool ok = false;
	int ret = pcache_get(s->pc, s->region, &it, 1, &ok);
	if (ret < 0)
		return node_fail("get of an older manifest", ret);
	struct pcb_manifest old;
	uint64_t gone = 0;
	if (ok && pcb_manifest_parse(s->buf, &old) == 0) {
		fprintf(stderr, "serve: an older working set is under %s "
			"(%" PRIu64 " pages of %" PRIu64 " bytes from %s): "
			"deleting it first\n", s->prefix, old.pages,
			old.page_bytes, old.node);
		gone = delete_range(s, old.pages, false);
		delete_manifest(s);
	}
	delete_range(s, DRIVER_IDS, true);
	if (gone)
		fprintf(stderr, "serve: deleted %" PRIu64 " older pages\n",
			gone);
	return 0;
}

static int serve_run(struct serve *sp);

int pcb_serve_main(int argc, char **argv)
{
	struct serve s = {0};
	int rc = serve_args(&s, argc, argv);
	if (rc)
		return rc < 0 ? 0 : rc;
	pcb_catch_signals();
	struct pcb_spawned node = {.pid = -1};
	if (s.node_argc) {
		if (pcb_node_spawn(s.node_argc, s.node_argv, 60000, &node))
			return 1;
		s.socket = node.socket;
	}
	rc = serve_run(&s);
	pcb_node_reap(&node);
	return rc;
}

static int serve_run(struct serve *sp)
{
	struct serve s = *sp;
	int rc;
	struct pcache_opts po = {.socket_path = s.socket,
				 .timeout_ms = (unsigned)s.timeout_ms};
	int ret = pcache_open(&po, &s.pc);
	if (ret < 0)
		return node_fail("open", ret);
	struct pcb_node_info ni;
	char why[256];
	ret = pcb_node_info(s.socket, false, NULL, (unsigned)s.timeout_ms,
			    &ni, why, sizeof(why));
	if (ret < 0) {
		fprintf(stderr, "peercache-bench serve: no node answers at %s: "
			"%s\n", s.socket, why);
		pcache_close(s.pc);
		return 1;
	}
	snprintf(s.node, sizeof(s.node), "%s", ni.id);
	snprintf(s.mode, sizeof(s.mode), "%s", ni.mode);
	uint64_t stage = s.page_bytes * s.batch;
	if (stage < PCB_MANIFEST_BYTES)
		stage = PCB_MANIFEST_BYTES;
	void *addr;
	ret = pcache_region_create(s.pc, stage, &addr, &s.region);
	if (ret < 0) {
		pcache_close(s.pc);
		return node_fail("sharing memory with the node", ret);
	}
	s.buf = addr;
	char ep[600];
	snprintf(ep, sizeof(ep), "unix:%s", s.socket);
	struct rpc_sync_opts ro;
	rpc_sync_opts_default(&ro);
	ro.timeout_ms = (unsigned)s.timeout_ms;
	ro.max_idle = 1;
	s.rs = rpc_sync_new(ep, &ro, &ret);
	if (!s.rs) {
		pcache_close(s.pc);
		return node_fail("socket address", ret);
	}
	fprintf(stderr, "serve: node %s (mode %s) at %s: publishing %" PRIu64
		" pages of %" PRIu64 " bytes (%s, %u tokens) as %s/p/0..%"
		PRIu64 "\n", s.node, s.mode, s.socket, s.pages, s.page_bytes,
		s.page_tokens ? s.shape.layout : "raw", s.page_tokens,
		s.prefix, s.pages - 1);
	unsigned members;
	uint64_t sig = members_sig(&s, &members);
	uint64_t stored, t0 = pc_now_ns();
	if ((rc = clear_old(&s)))
		goto out;
	rc = publish(&s, &stored, true);
	if (rc)
		goto out;
	if (pcb_stop) /* interrupted: no manifest, no "ready" */
		goto cleanup;
	fprintf(stderr, "serve: %" PRIu64 "/%" PRIu64 " pages stored in "
		"%.2f s\n", stored, s.pages, (double)(pc_now_ns() - t0) / 1e9);
	if (stored < s.pages)
		fprintf(stderr, "serve: warning: %" PRIu64 " pages were not "
			"stored (pool too small for the working set? see the "
			"node's log); drivers will see misses\n",
			s.pages - stored);
	struct pcb_manifest m = {.pages = s.pages,
				 .page_bytes = s.page_bytes,
				 .page_tokens = s.page_tokens,
				 .seed = s.seed};
	snprintf(m.layout, sizeof(m.layout), "%s",
		 s.page_tokens ? s.shape.layout : "raw");
	snprintf(m.node, sizeof(m.node), "%s", s.node);
	uint8_t page[PCB_MANIFEST_BYTES];
	pcb_manifest_page(&m, page);
	char mkey[PCB_KEY_MAX];
	pcb_manifest_key(mkey, sizeof(mkey), s.prefix);
	if ((rc = put_page(&s, mkey, page)))
		goto out;
	/* Readiness for scripts: one line on stdout. */
	printf("ready %s pages=%" PRIu64 " page_bytes=%" PRIu64 "\n", s.prefix,
	       s.pages, s.page_bytes);
	fflush(stdout);
	unsigned seen = 0;
	uint64_t last_note = 0;
	while (!pcb_stop && seen < s.drivers) {
		char dk[s.drivers][PCB_KEY_MAX];
		const char *kp[s.drivers];
		size_t kl[s.drivers], count = 0;
		for (unsigned d = 0; d < s.drivers; d++) {
			pcb_driver_key(dk[d], sizeof(dk[d]), s.prefix, d);
			kp[d] = dk[d];
			kl[d] = strlen(dk[d]);
		}
		if (pcache_exists(s.pc, kp, kl, s.drivers, &count) == 0 &&
		    count != seen) {
			seen = (unsigned)count;
			fprintf(stderr, "serve: %u/%u drivers\n", seen,
				s.drivers);
		}
		if (seen >= s.drivers)
			break;
		uint64_t now = pc_now_ns();
		if (now - last_note > 10000000000ull) {
			last_note = now;
			fprintf(stderr, "serve: waiting for drivers: %u/%u "
				"(drive --driver-id 0..%u)\n", seen,
				s.drivers, s.drivers - 1);
		}
		usleep(100000);
	}
	if (!pcb_stop)
		fprintf(stderr, "serve: serving; Ctrl-C ends\n");
	while (!pcb_stop) {
		struct timespec ts = {.tv_sec = (time_t)(s.check_ms / 1000),
				      .tv_nsec = (long)(s.check_ms % 1000) *
						 1000000};
		nanosleep(&ts, NULL);
		if (pcb_stop)
			break;
		unsigned now_members;
		uint64_t now_sig = members_sig(&s, &now_members);
		if (!now_sig || now_sig == sig)
			continue;
		fprintf(stderr, "serve: membership changed (%u -> %u "
			"members): republishing\n", members, now_members);
		sig = now_sig;
		members = now_members;
		t0 = pc_now_ns();
		if ((rc = publish(&s, &stored, false)) ||
		    (rc = put_page(&s, mkey, page)))
			goto out;
		fprintf(stderr, "serve: republished %" PRIu64 "/%" PRIu64
			" pages in %.2f s\n", stored, s.pages,
			(double)(pc_now_ns() - t0) / 1e9);
	}
cleanup:
	if (!s.keep)
		delete_all(&s);
	fprintf(stderr, "serve: stopped\n");
out:
	rpc_sync_free(s.rs);
	pcache_close(s.pc);
	return rc;
}
