/*
 * bench/tool/drive.c — `peercache-bench drive`: the sweep.
 *
 * For each target (the node, then each --vs baseline) and each concurrency
 * C of the sweep: fork min(P, C) processes sharing C worker threads between
 * them; every worker opens its own connection, all wait for one start time,
 * run --warmup unrecorded, then record --duration of calls (a call counts
 * when it started inside the window). Each process merges its workers'
 * histograms into its slot of a shared mapping; the parent merges the
 * processes into one row. The parent prints a progress line meanwhile.
 *
 * Owns: the shared mapping of one level (anonymous, MAP_SHARED, made before
 * the fork and unmapped after the children are reaped). The parent holds no
 * connection while it forks.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../lg_hist.h"
#include "common/config.h"
#include "common/util.h"
#include "tool.h"

/* The value of option NAME at argv[i] (see pc_opt_value). */
#define OPT(name) pc_opt_value(argc, argv, &i, name, &missing)

#define CONC_MAX 64      /* levels in --concurrencies */
#define THREADS_MAX 1024 /* workers of one level, all processes */
#define PROCS_MAX 64

enum op { OP_GET, OP_EXISTS, OP_SET, OP_MIXED };
static const char *const op_names[] = {"get", "exists", "set", "mixed"};
enum verify { VERIFY_OFF, VERIFY_SAMPLE, VERIFY_FULL };
static const char *const verify_names[] = {"off", "sample", "full"};

struct target {
	const struct pcb_backend *be;
	char addr[256];
};

struct drive {
	/* options */
	const char *node;
	bool rpc;
	const char *secret;
	char secret_buf[256];
	const char *prefix;
	enum op op;
	unsigned mix[3]; /* weights of get, exists, set */
	const char *mode_want;
	unsigned batch;
	unsigned conc[CONC_MAX], nconc;
	uint64_t duration_ms, warmup_ms, timeout_ms;
	unsigned processes, driver_id;
	uint64_t nonce; /* of this run, in the keys it sets */
	enum verify verify;
	struct target vs[PCB_VS_MAX];
	unsigned nvs;
	bool only_vs, no_files, no_register;
	const char *report;
	char report_buf[64];
	struct pcb_shape shape;
	bool shape_given;
	/* resolved */
	struct pcb_manifest m;
	bool have_ws;
	uint64_t page_bytes;
	unsigned page_tokens;
	struct pcb_node_info ni;
	char mode[32];
	int node_argc;       /* after "--": a node of our own */
	char **node_argv;
};

/* What was measured of one op (a mixed run keeps the three apart: their
 * latencies and what a "hit" is differ). */
struct figs {
	uint64_t calls, pages, hits, errors, wrong, bytes;
	struct lg_hist batch, page;
};

static void figs_add(struct figs *dst, const struct figs *src)
{
	dst->calls += src->calls;
	dst->pages += src->pages;
	dst->hits += src->hits;
	dst->errors += src->errors;
	dst->wrong += src->wrong;
	dst->bytes += src->bytes;
	lg_hist_merge(&dst->batch, &src->batch);
	lg_hist_merge(&dst->page, &src->page);
}

/* What a process measured at one level (in the shared mapping). */
struct proc_res {
	struct figs f[3]; /* by enum op (get, exists, set) */
	int done;         /* 1: the figures above are complete */
	char err[256];    /* why it failed */
};

struct live {
	_Atomic uint64_t calls, hits, errors;
	char pad[40];
};

struct shared {
	_Atomic unsigned ready, failed;
	_Atomic uint64_t go_ns;
	_Atomic int stop;
	struct live live[THREADS_MAX];
	struct proc_res res[PROCS_MAX];
};

/* One worker thread's state. */
struct worker {
	const struct drive *d;
	const struct target *tg;
	const struct pcb_target *t;
	struct shared *sh;
	void *proc;
	unsigned idx;   /* in the process */
	unsigned gidx;  /* in the level */
	struct pcb_conn *c;
	char **keys;
	size_t *keylens;
	uint64_t *index;
	struct figs f[3]; /* by enum op */
	uint64_t logged, wrong_noted;
	uint64_t rng, set_ctr;
	char err[256];
};

/* ------------------------------------------------------------ options */

static void drive_usage(FILE *out)
{
	fputs(
"usage: peercache-bench drive [OPTIONS] [-- PEERCACHED-ARGS]\n"
"\n"
"Drive get, exists, set or a mix against the node on this host (the paths\n"
"SGLang uses: its session API with shared memory; or kv.* RPC straight to a\n"
"node with --via rpc), at each concurrency of a sweep, and report hit rate,\n"
"pages/s, tokens/s, GB/s and latency per batch and per page (p50, p95, p99,\n"
"p99.9, max). get and exists read the working set `serve` published\n"
"(PREFIX/manifest); set writes fresh keys under PREFIX/s/. Arguments after\n"
"'--' start a peercached of drive's own for the run (it joins the cluster\n"
"they name; its socket is used; stopped at the end).\n"
"\n"
"Options:\n"
"  --node ADDR             session: the node's Unix socket [$PEERCACHE_SOCKET,\n"
"                          else " PCB_DEFAULT_SOCKET "];\n"
"                          rpc: host:port or unix:/path of a node\n"
"  --via session|rpc       [session]\n"
"  --secret-file F         the cluster secret, for --via rpc over TCP\n"
"                          [$PEERCACHE_SECRET_FILE]\n"
"  --prefix P              the working set's prefix (as given to serve) [pcb]\n"
"  --op get|exists|set|mixed                                          [get]\n"
"  --mix G:E:S             mixed: weights of get, exists and set [8:1:1]\n"
"  --mode p2p|slotmap      fail unless the node runs this mode [any]\n"
"  --batch N               pages per call [16]\n"
"  --concurrencies LIST    calls in flight, e.g. 1,2,4,8 [1,2,4,8]\n"
"  --processes N           spread each level's workers over up to N\n"
"                          processes (each its own client) [1]\n"
"  --duration DUR          measured time per level [10s]\n"
"  --warmup DUR            unrecorded time before it [2s]\n"
"  --timeout DUR           per call [30s]\n"
"  --verify off|sample|full  check fetched pages' bytes (sample: header and\n"
"                          last 64 bytes of each) [sample]\n"
"  --driver-id N           this driver's id, for serve --drivers [0]\n"
"  --no-register           do not register with serve\n"
"  --vs redis[=HOST:PORT]  also drive a redis-server [127.0.0.1:6379] with\n"
"                          the same ops, sizes and sweep (loads the working\n"
"                          set into it first); repeatable\n"
"  --vs memcached[=HOST:PORT]  the same with memcached [127.0.0.1:11211]\n"
"                          (start it with -I larger than a page)\n"
"  --only-vs               drive the baselines only, not the node\n"
"  --report PREFIX         write PREFIX.json, PREFIX.md and PREFIX.html\n"
"                          [peercache-bench-<UTC date and time>]\n"
"  --no-files              console table only\n"
"  -h, --help\n"
"\n"
"Without a working set (no serve), --op set and the baselines take the page\n"
"shape from the options below; with one, from its manifest.\n"
"\n",
	      out);
	pcb_shape_help(out);
}

static int parse_conc(struct drive *d, const char *v)
{
	d->nconc = 0;
	char buf[512];
	snprintf(buf, sizeof(buf), "%s", v);
	char *save = NULL;
	for (char *t = strtok_r(buf, ",", &save); t;
	     t = strtok_r(NULL, ",", &save)) {
		uint64_t x;
		if (d->nconc == CONC_MAX ||
		    pcb_parse_u64("--concurrencies", t, 1, THREADS_MAX, &x))
			return -1;
		d->conc[d->nconc++] = (unsigned)x;
	}
	if (!d->nconc) {
		fprintf(stderr, "peercache-bench: --concurrencies is a list "
			"like 1,2,4,8\n");
		return -1;
	}
	return 0;
}

static int parse_vs(struct drive *d, const char *v)
{
	if (d->nvs == PCB_VS_MAX) {
		fprintf(stderr, "peercache-bench: at most %d --vs\n",
			PCB_VS_MAX);
		return -1;
	}
	struct target *t = &d->vs[d->nvs];
	const char *eq = strchr(v, '=');
	size_t n = eq ? (size_t)(eq - v) : strlen(v);
	if (n == 5 && !strncmp(v, "redis", 5)) {
		t->be = &pcb_be_redis;
		snprintf(t->addr, sizeof(t->addr), "%s",
			 eq ? eq + 1 : "127.0.0.1:6379");
	} else if (n == 9 && !strncmp(v, "memcached", 9)) {
		t->be = &pcb_be_memcached;
		snprintf(t->addr, sizeof(t->addr), "%s",
			 eq ? eq + 1 : "127.0.0.1:11211");
	} else {
		fprintf(stderr, "peercache-bench: --vs takes redis[=HOST:PORT]"
			" or memcached[=HOST:PORT]: %s\n", v);
		return -1;
	}
	d->nvs++;
	return 0;
}

static int parse_mix(struct drive *d, const char *v)
{
	unsigned g, e, s;
	char tail;
	if (sscanf(v, "%u:%u:%u%c", &g, &e, &s, &tail) != 3 ||
	    g + e + s == 0 || g > 1000000 || e > 1000000 || s > 1000000) {
		fprintf(stderr, "peercache-bench: --mix takes G:E:S weights, "
			"e.g. 8:1:1: %s\n", v);
		return -1;
	}
	d->mix[0] = g;
	d->mix[1] = e;
	d->mix[2] = s;
	return 0;
}

static int drive_args(struct drive *d, int argc, char **argv)
{
	pcb_shape_default(&d->shape);
	const char *secret_file = getenv("PEERCACHE_SECRET_FILE");
	d->prefix = "pcb";
	d->op = OP_GET;
	d->mix[0] = 8;
	d->mix[1] = 1;
	d->mix[2] = 1;
	d->batch = 16;
	parse_conc(d, "1,2,4,8");
	d->processes = 1;
	d->duration_ms = 10000;
	d->warmup_ms = 2000;
	d->timeout_ms = 30000;
	d->verify = VERIFY_SAMPLE;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v;
		bool missing = false;
		uint64_t x;
		int r = pcb_shape_option(&d->shape, argc, argv, &i);
		if (r < 0)
			return 2;
		if (r > 0) {
			d->shape_given = true;
			continue;
		}
		if (!strcmp(a, "--")) {
			d->node_argc = argc - i - 1;
			d->node_argv = argv + i + 1;
			break;
		}
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			drive_usage(stdout);
			return -1;
		} else if (!strcmp(a, "--only-vs")) {
			d->only_vs = true;
		} else if (!strcmp(a, "--no-files")) {
			d->no_files = true;
		} else if (!strcmp(a, "--no-register")) {
			d->no_register = true;
		} else if ((v = OPT("--node"))) {
			d->node = v;
		} else if ((v = OPT("--via"))) {
			if (strcmp(v, "session") && strcmp(v, "rpc")) {
				fprintf(stderr, "peercache-bench: --via is "
					"session or rpc: %s\n", v);
				return 2;
			}
			d->rpc = !strcmp(v, "rpc");
		} else if ((v = OPT("--secret-file"))) {
			secret_file = v;
		} else if ((v = OPT("--prefix"))) {
			if (pcb_parse_prefix(v))
				return 2;
			d->prefix = v;
		} else if ((v = OPT("--op"))) {
			unsigned k;
			for (k = 0; k < 4 && strcmp(v, op_names[k]); k++)
				;
			if (k == 4) {
				fprintf(stderr, "peercache-bench: --op is get, "
					"exists, set or mixed: %s\n", v);
				return 2;
			}
			d->op = (enum op)k;
		} else if ((v = OPT("--mix"))) {
			if (parse_mix(d, v))
				return 2;
		} else if ((v = OPT("--mode"))) {
			if (strcmp(v, "p2p") && strcmp(v, "slotmap")) {
				fprintf(stderr, "peercache-bench: --mode is "
					"p2p or slotmap: %s\n", v);
				return 2;
			}
			d->mode_want = v;
		} else if ((v = OPT("--batch"))) {
			if (pcb_parse_u64("--batch", v, 1, 4096, &x))
				return 2;
			d->batch = (unsigned)x;
		} else if ((v = OPT("--concurrencies"))) {
			if (parse_conc(d, v))
				return 2;
		} else if ((v = OPT("--processes"))) {
			if (pcb_parse_u64("--processes", v, 1, PROCS_MAX, &x))
				return 2;
			d->processes = (unsigned)x;
		} else if ((v = OPT("--duration"))) {
			if (pcb_parse_ms("--duration", v, &d->duration_ms))
				return 2;
			if (d->duration_ms < 100) {
				fprintf(stderr, "peercache-bench: --duration "
					"is at least 100ms\n");
				return 2;
			}
		} else if ((v = OPT("--warmup"))) {
			if (pcb_parse_ms("--warmup", v, &d->warmup_ms))
				return 2;
		} else if ((v = OPT("--timeout"))) {
			if (pcb_parse_ms("--timeout", v, &d->timeout_ms))
				return 2;
			if (!d->timeout_ms)
				d->timeout_ms = 1;
		} else if ((v = OPT("--verify"))) {
			unsigned k;
			for (k = 0; k < 3 && strcmp(v, verify_names[k]); k++)
				;
			if (k == 3) {
				fprintf(stderr, "peercache-bench: --verify is "
					"off, sample or full: %s\n", v);
				return 2;
			}
			d->verify = (enum verify)k;
		} else if ((v = OPT("--driver-id"))) {
			if (pcb_parse_u64("--driver-id", v, 0, 4095, &x))
				return 2;
			d->driver_id = (unsigned)x;
		} else if ((v = OPT("--vs"))) {
			if (parse_vs(d, v))
				return 2;
		} else if ((v = OPT("--report"))) {
			d->report = v;
		} else {
			fprintf(stderr, "peercache-bench drive: %s: %s (see "
				"'peercache-bench drive --help')\n",
				missing ? "option needs a value"
					: "unknown option", a);
			return 2;
		}
	}
	if (d->node_argc && d->rpc) {
		fprintf(stderr, "peercache-bench: a node of drive's own ('--') "
			"is driven through its socket, not --via rpc\n");
		return 2;
	}
	if ((!d->node || !*d->node) && !d->rpc)
		d->node = getenv("PEERCACHE_SOCKET");
	if (!d->node || !*d->node)
		d->node = d->rpc ? "127.0.0.1:31999" : PCB_DEFAULT_SOCKET;
	if (d->only_vs && !d->nvs) {
		fprintf(stderr, "peercache-bench: --only-vs needs a --vs\n");
		return 2;
	}
	if (d->rpc && secret_file && *secret_file) {
		if (pcb_read_secret(secret_file, d->secret_buf,
				    sizeof(d->secret_buf)))
			return 2;
		d->secret = d->secret_buf;
	}
	if (!d->report) {
		time_t now = time(NULL);
		struct tm tm;
		gmtime_r(&now, &tm);
		strftime(d->report_buf, sizeof(d->report_buf),
			 "peercache-bench-%Y%m%d-%H%M%S", &tm);
		d->report = d->report_buf;
	}
	return 0;
}

/* ----------------------------------------------------------- workers */

static uint64_t rnd(uint64_t *s)
{
	uint64_t x = (*s += 0x9e3779b97f4a7c15ull);
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static enum op pick(const struct drive *d, uint64_t *rng)
{
	if (d->op != OP_MIXED)
		return d->op;
	unsigned total = d->mix[0] + d->mix[1] + d->mix[2];
	unsigned x = (unsigned)(rnd(rng) % total);
	return x < d->mix[0] ? OP_GET
	       : x < d->mix[0] + d->mix[1] ? OP_EXISTS : OP_SET;
}

static void note_error(struct worker *w, const char *what)
{
	/* The first three of each worker, then every 1000th. */
	if (w->logged < 3 || w->logged % 1000 == 0)
		fprintf(stderr, "drive: %s (worker %u): %s\n",
			w->tg->be->target, w->gidx, what);
	w->logged++;
}

static bool reopen(struct worker *w, char *err, size_t errlen)
{
	if (w->c)
		w->c->be->conn_close(w->c);
	w->c = NULL;
	int ret = w->tg->be->conn_open(w->proc, w->idx, &w->c, err, errlen);
	if (ret < 0) {
		note_error(w, err);
		w->c = NULL;
		return false;
	}
	if (w->d->op == OP_SET || w->d->op == OP_MIXED)
		for (unsigned j = 0; j < w->d->batch; j++)
			pcb_page_fill(w->c->buf + j * w->t->page_bytes,
				      w->t->page_bytes, j, w->d->m.seed);
	return true;
}

/* Before a get into a slot: clear what the check reads (the header and the
 * last 64 bytes; for a full check also a word in every 4 KiB), so that a
 * page fetched into the slot it was in before cannot pass on stale bytes. */
static void clear_slot(uint8_t *p, uint64_t len, bool full)
{
	memset(p, 0, len < 32 ? len : 32);
	memset(p + (len > 64 ? len - 64 : 0), 0, len > 64 ? 64 : len);
	if (full)
		for (uint64_t off = 4096; off + 8 <= len; off += 4096)
			memset(p + off, 0, 8);
}

/* One call of op, its figures into the worker; the call's return. */
static int one_call(struct worker *w, enum op op, bool record)
{
	const struct drive *d = w->d;
	const struct pcb_backend *be = w->tg->be;
	uint64_t pb = w->t->page_bytes;
	size_t n = d->batch, hits = 0;
	if (op == OP_SET) {
		/* Fresh keys (a set of a held key would not copy again):
		 * the run's nonce, the process and worker, a counter. */
		for (size_t j = 0; j < n; j++)
			w->keylens[j] = (size_t)snprintf(
				w->keys[j], PCB_KEY_MAX,
				"%s/s/%u/%" PRIx64 "/%d/%u/%" PRIu64,
				d->prefix, d->driver_id, d->nonce,
				(int)getpid(), w->idx, w->set_ctr++);
	} else {
		uint64_t first = rnd(&w->rng) % d->m.pages;
		for (size_t j = 0; j < n; j++) {
			w->index[j] = (first + j) % d->m.pages;
			w->keylens[j] = (size_t)pcb_key(
				w->keys[j], PCB_KEY_MAX, d->prefix,
				w->index[j]);
		}
		if (op == OP_GET && d->verify != VERIFY_OFF)
			for (size_t j = 0; j < n; j++)
				clear_slot(w->c->buf + j * pb, pb,
					   d->verify == VERIFY_FULL);
	}
	uint64_t t0 = pc_now_ns();
	int ret = op == OP_GET ? be->get(w->c, w->keys, w->keylens, n, &hits)
		  : op == OP_SET ? be->set(w->c, w->keys, w->keylens, n,
					   &hits)
				 : be->exists(w->c, w->keys, w->keylens, n,
					      &hits);
	uint64_t lat = pc_now_ns() - t0;
	struct live *lv = &w->sh->live[w->gidx];
	struct figs *f = &w->f[op];
	if (ret < 0) {
		if (record) {
			f->errors++;
			f->calls++;
			f->pages += n;
		}
		atomic_fetch_add_explicit(&lv->errors, 1,
					  memory_order_relaxed);
		note_error(w, w->c->err);
		return ret;
	}
	uint64_t wrong = 0;
	if (op == OP_GET && hits && d->verify != VERIFY_OFF) {
		size_t good = 0;
		for (size_t j = 0; j < n; j++)
			good += pcb_page_check(w->c->buf + j * pb, pb,
					       w->index[j], d->m.seed,
					       d->verify == VERIFY_FULL);
		wrong = hits > good ? hits - good : 0;
		if (wrong && w->wrong_noted++ < 3)
			fprintf(stderr, "drive: %s: %" PRIu64 " of %zu pages "
				"landed with bytes that are not theirs\n",
				be->target, wrong, hits);
	}
	atomic_fetch_add_explicit(&lv->calls, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&lv->hits, hits, memory_order_relaxed);
	if (!record)
		return 0;
	f->calls++;
	f->pages += n;
	f->hits += hits;
	f->wrong += wrong;
	if (op != OP_EXISTS)
		f->bytes += hits * pb;
	lg_hist_record(&f->batch, lat);
	lg_hist_record(&f->page, lat / n);
	return 0;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct shared *sh = w->sh;
	char err[256];
	if (!reopen(w, w->err, sizeof(w->err))) {
		atomic_fetch_add(&sh->failed, 1);
		return NULL;
	}
	atomic_fetch_add(&sh->ready, 1);
	uint64_t go, give_up = pc_now_ns() + w->d->timeout_ms * 1000000ull +
			       60000000000ull;
	while (!(go = atomic_load(&sh->go_ns))) {
		if (pc_now_ns() > give_up) /* the parent never said go */
			return NULL;
		usleep(500);
	}
	uint64_t start = go + w->d->warmup_ms * 1000000ull;
	uint64_t end = start + w->d->duration_ms * 1000000ull;
	while (!atomic_load_explicit(&sh->stop, memory_order_relaxed)) {
		uint64_t now = pc_now_ns();
		if (now >= end)
			break;
		if (!w->c) {
			usleep(100000);
			reopen(w, err, sizeof(err));
			continue;
		}
		if (one_call(w, pick(w->d, &w->rng), now >= start) < 0) {
			/* A failed call: its connection is not reused. */
			usleep(50000);
			reopen(w, err, sizeof(err));
		}
	}
	return NULL;
}

/* A child's body at one level: its workers, merged into res. */
static int child_main(const struct drive *d, const struct target *tg,
		      const struct pcb_target *t, struct shared *sh,
		      unsigned pidx, unsigned nthreads, unsigned gbase)
{
	struct proc_res *res = &sh->res[pidx];
	void *proc = NULL;
	char err[256];
	int ret = tg->be->proc_open(t, nthreads, &proc, err, sizeof(err));
	if (ret < 0) {
		snprintf(res->err, sizeof(res->err), "%s", err);
		atomic_fetch_add(&sh->failed, 1);
		return 1;
	}
	struct worker *ws = calloc(nthreads, sizeof(*ws));
	pthread_t *tids = calloc(nthreads, sizeof(*tids));
	char *keybuf = calloc((size_t)nthreads * d->batch, PCB_KEY_MAX);
	char **keys = calloc((size_t)nthreads * d->batch, sizeof(char *));
	size_t *kl = calloc((size_t)nthreads * d->batch, sizeof(size_t));
	uint64_t *ix = calloc((size_t)nthreads * d->batch, sizeof(uint64_t));
	if (!ws || !tids || !keybuf || !keys || !kl || !ix) {
		snprintf(res->err, sizeof(res->err), "out of memory");
		atomic_fetch_add(&sh->failed, 1);
		return 1;
	}
	unsigned started = 0;
	for (unsigned i = 0; i < nthreads; i++) {
		struct worker *w = &ws[i];
		size_t b = (size_t)i * d->batch;
		for (size_t j = 0; j < d->batch; j++)
			keys[b + j] = keybuf + (b + j) * PCB_KEY_MAX;
		*w = (struct worker){.d = d, .tg = tg, .t = t, .sh = sh,
				     .proc = proc, .idx = i,
				     .gidx = gbase + i, .keys = keys + b,
				     .keylens = kl + b, .index = ix + b,
				     .rng = ((uint64_t)getpid() << 20) ^
					    (gbase + i) * 0x51ed27u ^
					    pc_now_ns()};
		if (pthread_create(&tids[i], NULL, worker_main, w) != 0) {
			snprintf(res->err, sizeof(res->err),
				 "cannot start a thread");
			atomic_fetch_add(&sh->failed, 1);
			break;
		}
		started++;
	}
	bool failed = false;
	for (unsigned i = 0; i < started; i++) {
		pthread_join(tids[i], NULL);
		struct worker *w = &ws[i];
		if (w->err[0]) {
			failed = true;
			if (!res->err[0])
				snprintf(res->err, sizeof(res->err), "%s",
					 w->err);
		}
		for (int o = 0; o < 3; o++)
			figs_add(&res->f[o], &w->f[o]);
		if (w->c)
			w->c->be->conn_close(w->c);
	}
	tg->be->proc_close(proc);
	res->done = started == nthreads && !failed;
	return res->done ? 0 : 1;
}

/* ------------------------------------------------------------- levels */

static void lat_of(const struct lg_hist *h, struct pcb_lat *l)
{
	l->mean_us = h->total ? (double)h->sum_ns / (double)h->total / 1e3
			      : 0;
	l->p50_us = (double)lg_hist_quantile_ns(h, 0.50) / 1e3;
	l->p95_us = (double)lg_hist_quantile_ns(h, 0.95) / 1e3;
	l->p99_us = (double)lg_hist_quantile_ns(h, 0.99) / 1e3;
	l->p999_us = (double)lg_hist_quantile_ns(h, 0.999) / 1e3;
	l->max_us = (double)h->max_ns / 1e3;
}

static void progress(const struct drive *d, const struct target *tg,
		     struct shared *sh, unsigned nthreads, unsigned level,
		     uint64_t go, uint64_t *last_calls, uint64_t *last_hits,
		     uint64_t *last_ns, bool tty)
{
	uint64_t calls = 0, hits = 0, errors = 0, now = pc_now_ns();
	for (unsigned i = 0; i < nthreads; i++) {
		calls += atomic_load(&sh->live[i].calls);
		hits += atomic_load(&sh->live[i].hits);
		errors += atomic_load(&sh->live[i].errors);
	}
	double dt = (double)(now - *last_ns) / 1e9;
	double pps = dt > 0 ? (double)(hits - *last_hits) / dt : 0;
	double cps = dt > 0 ? (double)(calls - *last_calls) / dt : 0;
	double el = go && now > go ? (double)(now - go) / 1e9 : 0;
	double warm = (double)d->warmup_ms / 1e3;
	double total = warm + (double)d->duration_ms / 1e3;
	fprintf(stderr, "%s[%s %s c=%u %u/%u] %s %4.1f/%.1f s  %.0f calls/s  "
		"%.0f pages/s  %" PRIu64 " errors%s",
		tty ? "\r" : "", tg->be->target, op_names[d->op],
		nthreads, level + 1, d->nconc,
		!go ? "starting" : el < warm ? "warmup  " : "measure ", el,
		total, cps, pps, errors, tty ? "\033[K" : "\n");
	*last_calls = calls;
	*last_hits = hits;
	*last_ns = now;
}

/* The row of one op at one level. A mixed run's rows are "mixed/get",
 * "mixed/exists" and "mixed/set": what a hit is, and the latencies, differ
 * between them. */
static void fill_row(const struct drive *d, const struct target *tg,
		     const struct pcb_target *t, unsigned conc,
		     unsigned procs, enum op op, const struct figs *f,
		     struct pcb_row *row)
{
	*row = (struct pcb_row){0};
	snprintf(row->target, sizeof(row->target), "%s", tg->be->target);
	snprintf(row->via, sizeof(row->via), "%s", tg->be->via);
	if (d->op == OP_MIXED)
		snprintf(row->op, sizeof(row->op), "mixed/%s", op_names[op]);
	else
		snprintf(row->op, sizeof(row->op), "%s", op_names[op]);
	snprintf(row->mode, sizeof(row->mode), "%.11s",
		 tg->be == &pcb_be_session || tg->be == &pcb_be_rpc
			 ? d->mode : "-");
	row->processes = procs;
	row->threads = (conc + procs - 1) / procs;
	row->concurrency = conc;
	row->batch = d->batch;
	row->page_bytes = t->page_bytes;
	row->page_tokens = d->page_tokens;
	row->seconds = (double)d->duration_ms / 1e3;
	row->calls = f->calls;
	row->pages = f->pages;
	row->hits = f->hits;
	row->errors = f->errors;
	row->wrong = f->wrong;
	row->bytes = f->bytes;
	row->hit_rate = f->pages ? (double)f->hits / (double)f->pages : 0;
	row->pages_s = (double)f->hits / row->seconds;
	/* exists moves no page: it checks keys */
	row->tokens_s = op == OP_EXISTS ? 0 : row->pages_s * row->page_tokens;
	row->gbps = (double)f->bytes / row->seconds / 1e9;
	lat_of(&f->batch, &row->batch_lat);
	lat_of(&f->page, &row->page_lat);
}

/* Run one level; fills rows[0..*nrows) (one, three for a mixed run). 0, or
 * 1 with a message printed (the rows are then not a measurement). */
static int run_level(const struct drive *d, const struct target *tg,
		     const struct pcb_target *t, unsigned level,
		     struct pcb_row *rows, unsigned *nrows)
{
	unsigned conc = d->conc[level];
	unsigned procs = d->processes < conc ? d->processes : conc;
	struct shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
				 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) {
		fprintf(stderr, "drive: cannot map %zu bytes: %s\n",
			sizeof(*sh), strerror(errno));
		return 1;
	}
	pid_t pids[PROCS_MAX];
	unsigned nforked = 0, gbase = 0;
	pid_t parent = getpid();
	fflush(stdout);
	fflush(stderr);
	for (unsigned p = 0; p < procs; p++) {
		unsigned n = conc / procs + (p < conc % procs);
		pid_t pid = fork();
		if (pid == 0) {
			signal(SIGINT, SIG_IGN); /* the parent stops us */
			/* and if it dies, so do we */
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			if (getppid() != parent)
				_exit(1);
			_exit(child_main(d, tg, t, sh, p, n, gbase));
		}
		if (pid < 0) {
			fprintf(stderr, "drive: fork: %s\n", strerror(errno));
			atomic_store(&sh->stop, 1);
			break;
		}
		pids[nforked++] = pid;
		gbase += n;
	}
	bool tty = isatty(STDERR_FILENO);
	uint64_t go = 0, last_calls = 0, last_hits = 0, last_ns = pc_now_ns();
	uint64_t last_print = 0, every = tty ? 1000000000ull : 5000000000ull;
	uint64_t ready_by = pc_now_ns() + d->timeout_ms * 1000000ull +
			    10000000000ull;
	unsigned alive = nforked;
	bool exited[PROCS_MAX] = {0};
	int status_bad = 0;
	while (alive) {
		for (unsigned p = 0; p < nforked; p++) {
			int st;
			if (exited[p] || waitpid(pids[p], &st, WNOHANG) <= 0)
				continue;
			exited[p] = true;
			alive--;
			if (!WIFEXITED(st) || WEXITSTATUS(st))
				status_bad++;
		}
		uint64_t now = pc_now_ns();
		if (!go) {
			bool all = atomic_load(&sh->ready) == conc;
			bool bad = atomic_load(&sh->failed) || status_bad ||
				   nforked < procs || now > ready_by ||
				   pcb_stop;
			if (all || bad) {
				go = now;
				atomic_store(&sh->go_ns, go);
				if (bad)
					atomic_store(&sh->stop, 1);
			}
		}
		if (pcb_stop)
			atomic_store(&sh->stop, 1);
		if (now - last_print >= every && alive) {
			last_print = now;
			progress(d, tg, sh, conc, level, go, &last_calls,
				 &last_hits, &last_ns, tty);
		}
		usleep(20000);
	}
	if (tty)
		fputs("\r\033[K", stderr);
	int rc = 0;
	struct figs sum[3];
	memset(sum, 0, sizeof(sum));
	for (unsigned p = 0; p < procs; p++) {
		struct proc_res *r = &sh->res[p];
		if (p >= nforked || !r->done) {
			fprintf(stderr, "drive: %s c=%u: process %u failed: "
				"%s\n", tg->be->target, conc, p,
				r->err[0] ? r->err
					  : "it did not finish (see above)");
			rc = 1;
			continue;
		}
		for (int o = 0; o < 3; o++)
			figs_add(&sum[o], &r->f[o]);
	}
	munmap(sh, sizeof(*sh));
	if (pcb_stop)
		rc = 1;
	*nrows = 0;
	for (int o = 0; o < 3; o++) {
		if (d->op == OP_MIXED ? !sum[o].calls : (int)d->op != o)
			continue;
		struct pcb_row *row = &rows[(*nrows)++];
		fill_row(d, tg, t, conc, procs, (enum op)o, &sum[o], row);
		fprintf(stderr, "drive: %s/%s %s c=%u: %.1f%% hits, %.0f "
			"pages/s, %.3f GB/s, batch p50 %.0f us p99 %.0f us, %"
			PRIu64 " errors, %" PRIu64 " wrong\n", row->target,
			row->via, row->op, conc, row->hit_rate * 100,
			row->pages_s, row->gbps, row->batch_lat.p50_us,
			row->batch_lat.p99_us, row->errors, row->wrong);
	}
	return rc;
}

/* ------------------------------------------------------------ set-up */

/* Open a one-connection client of tg with pages of bytes (parent only). */
static int open_one(const struct drive *d, const struct target *tg,
		    uint64_t bytes, unsigned batch, struct pcb_target *t,
		    void **proc, struct pcb_conn **c)
{
	*t = (struct pcb_target){.addr = tg->addr, .secret = d->secret,
				 .timeout_ms = (unsigned)d->timeout_ms,
				 .page_bytes = bytes, .batch = batch};
	char err[256];
	int ret = tg->be->proc_open(t, 1, proc, err, sizeof(err));
	if (ret == 0) {
		ret = tg->be->conn_open(*proc, 0, c, err, sizeof(err));
		if (ret < 0)
			tg->be->proc_close(*proc);
	}
	if (ret < 0)
		fprintf(stderr, "peercache-bench drive: %s at %s: %s\n",
			tg->be->target, tg->addr, err);
	return ret;
}

static void close_one(const struct target *tg, void *proc,
		      struct pcb_conn *c)
{
	tg->be->conn_close(c);
	tg->be->proc_close(proc);
}

/* Read the manifest (get/exists/mixed need it) and register as a driver. */
static int read_manifest(struct drive *d, const struct target *tg)
{
	struct pcb_target t;
	void *proc;
	struct pcb_conn *c;
	if (open_one(d, tg, PCB_MANIFEST_BYTES, 1, &t, &proc, &c) < 0)
		return 1;
	char key[PCB_KEY_MAX];
	char *keys[1] = {key};
	size_t kl[1], hits = 0;
	kl[0] = (size_t)pcb_manifest_key(key, sizeof(key), d->prefix);
	int ret = tg->be->get(c, keys, kl, 1, &hits);
	if (ret < 0) {
		fprintf(stderr, "peercache-bench drive: reading %s: %s\n", key,
			c->err);
		close_one(tg, proc, c);
		return 1;
	}
	if (hits == 1 && pcb_manifest_parse(c->buf, &d->m) == 0)
		d->have_ws = true;
	if (d->have_ws && !d->no_register) {
		memset(c->buf, 0, PCB_MANIFEST_BYTES);
		snprintf((char *)c->buf, PCB_MANIFEST_BYTES,
			 "peercache-bench driver %u pid %d\n", d->driver_id,
			 (int)getpid());
		kl[0] = (size_t)pcb_driver_key(key, sizeof(key), d->prefix,
					       d->driver_id);
		if (tg->be->set(c, keys, kl, 1, &hits) < 0 || hits != 1)
			fprintf(stderr, "drive: warning: could not register "
				"as driver %u (%s)\n", d->driver_id,
				hits ? c->err : "not stored");
	}
	close_one(tg, proc, c);
	return 0;
}

/* Load the working set into a baseline (it has no serve). */
static int load_baseline(const struct drive *d, const struct target *tg)
{
	struct pcb_target t;
	void *proc;
	struct pcb_conn *c;
	if (open_one(d, tg, d->page_bytes, d->batch, &t, &proc, &c) < 0)
		return 1;
	char *keys[d->batch];
	char kb[d->batch][PCB_KEY_MAX];
	size_t kl[d->batch];
	uint64_t stored = 0, t0 = pc_now_ns();
	int rc = 0;
	for (uint64_t i = 0; i < d->m.pages && !pcb_stop; i += d->batch) {
		size_t n = d->m.pages - i < d->batch ? d->m.pages - i
						     : d->batch, hits = 0;
		for (size_t j = 0; j < n; j++) {
			keys[j] = kb[j];
			kl[j] = (size_t)pcb_key(kb[j], PCB_KEY_MAX, d->prefix,
						i + j);
			pcb_page_fill(c->buf + j * d->page_bytes,
				      d->page_bytes, i + j, d->m.seed);
		}
		if (tg->be->set(c, keys, kl, n, &hits) < 0) {
			fprintf(stderr, "peercache-bench drive: loading %s: "
				"%s\n", tg->be->target, c->err);
			rc = 1;
			break;
		}
		stored += hits;
	}
	if (!rc)
		fprintf(stderr, "drive: loaded %" PRIu64 "/%" PRIu64 " pages "
			"into %s at %s in %.2f s%s%s\n", stored, d->m.pages,
			tg->be->target, tg->addr,
			(double)(pc_now_ns() - t0) / 1e9,
			stored < d->m.pages ? "; not all stored: " : "",
			stored < d->m.pages ? c->err : "");
	close_one(tg, proc, c);
	return rc;
}

static int run_target(struct drive *d, const struct target *tg,
		      struct pcb_report *r, bool *bad)
{
	struct pcb_target t = {.addr = tg->addr, .secret = d->secret,
			       .timeout_ms = (unsigned)d->timeout_ms,
			       .page_bytes = d->page_bytes,
			       .batch = d->batch};
	for (unsigned l = 0; l < d->nconc && !pcb_stop; l++) {
		struct pcb_row rows[3];
		unsigned n = 0;
		/* An interrupted level, or one a process failed in, is not a
		 * measurement: it is not reported. */
		if (run_level(d, tg, &t, l, rows, &n))
			return 1;
		for (unsigned i = 0; i < n; i++) {
			if (pcb_report_add_row(r, &rows[i]) < 0) {
				fprintf(stderr, "drive: out of memory\n");
				return 1;
			}
			if (rows[i].wrong || rows[i].errors == rows[i].calls)
				*bad = true;
		}
	}
	return 0;
}

static void settings(const struct drive *d, struct pcb_report *r)
{
	pcb_report_set(r, "node", "%s", d->only_vs ? "-" : d->node);
	pcb_report_set(r, "via", "%s", d->rpc ? "rpc" : "session");
	pcb_report_set(r, "node_id", "%s", d->ni.id);
	pcb_report_set(r, "node_mode", "%s", d->ni.mode);
	pcb_report_set(r, "node_transport", "%s", d->ni.transport);
	pcb_report_set(r, "node_version", "%s", d->ni.version);
	pcb_report_set(r, "op", "%s", op_names[d->op]);
	if (d->op == OP_MIXED)
		pcb_report_set(r, "mix", "get %u : exists %u : set %u",
			       d->mix[0], d->mix[1], d->mix[2]);
	pcb_report_set(r, "prefix", "%s", d->prefix);
	pcb_report_set(r, "batch", "%u", d->batch);
	pcb_report_set(r, "processes", "%u", d->processes);
	pcb_report_set(r, "duration_s", "%.3f", (double)d->duration_ms / 1e3);
	pcb_report_set(r, "warmup_s", "%.3f", (double)d->warmup_ms / 1e3);
	pcb_report_set(r, "verify", "%s", verify_names[d->verify]);
	pcb_report_set(r, "page_bytes", "%" PRIu64, d->page_bytes);
	pcb_report_set(r, "page_tokens", "%u", d->page_tokens);
	pcb_report_set(r, "layout", "%s", d->m.layout);
	pcb_report_set(r, "working_set_pages", "%" PRIu64, d->m.pages);
	pcb_report_set(r, "working_set_producer", "%s",
		       d->have_ws ? d->m.node : "-");
	for (unsigned i = 0; i < d->nvs; i++)
		pcb_report_set(r, d->vs[i].be == &pcb_be_redis
				   ? "vs_redis" : "vs_memcached",
			       "%s", d->vs[i].addr);
}

static int drive_run(struct drive *dp, int argc, char **argv);

int pcb_drive_main(int argc, char **argv)
{
	struct drive d = {0};
	int rc = drive_args(&d, argc, argv);
	if (rc)
		return rc < 0 ? 0 : rc;
	pcb_catch_signals();
	struct pcb_spawned node = {.pid = -1};
	if (d.node_argc) {
		if (pcb_node_spawn(d.node_argc, d.node_argv, 60000, &node))
			return 1;
		d.node = node.socket;
	}
	rc = drive_run(&d, argc, argv);
	pcb_node_reap(&node);
	return rc;
}

static int drive_run(struct drive *dp, int argc, char **argv)
{
	struct drive d = *dp;
	int rc;
	struct target node = {.be = d.rpc ? &pcb_be_rpc : &pcb_be_session};
	snprintf(node.addr, sizeof(node.addr), "%s", d.node);
	snprintf(d.mode, sizeof(d.mode), "-");
	if (!d.only_vs) {
		char why[256];
		if (pcb_node_info(d.node, d.rpc, d.secret,
				  (unsigned)d.timeout_ms, &d.ni, why,
				  sizeof(why)) < 0) {
			fprintf(stderr, "peercache-bench drive: no node answers"
				" at %s: %s\n", d.node, why);
			return 1;
		}
		snprintf(d.mode, sizeof(d.mode), "%s", d.ni.mode);
		if (d.mode_want && strcmp(d.mode_want, d.ni.mode)) {
			fprintf(stderr, "peercache-bench drive: --mode %s, but"
				" node %s runs %s\n", d.mode_want, d.ni.id,
				d.ni.mode);
			return 1;
		}
		if (read_manifest(&d, &node))
			return 1;
	}
	if (d.have_ws && d.shape_given && d.op != OP_SET) {
		fprintf(stderr, "peercache-bench drive: the page shape options "
			"are for --op set; --op %s reads the working set's "
			"pages, of its own size (%" PRIu64 " bytes)\n",
			op_names[d.op], d.m.page_bytes);
		return 2;
	}
	if (!d.have_ws || d.shape_given) {
		if (!d.have_ws && d.op != OP_SET && !d.only_vs) {
			char key[PCB_KEY_MAX];
			pcb_manifest_key(key, sizeof(key), d.prefix);
			fprintf(stderr, "peercache-bench drive: --op %s reads "
				"the working set, but %s is not in the cluster:"
				" start 'peercache-bench serve --prefix %s' "
				"first (or use --op set)\n", op_names[d.op],
				key, d.prefix);
			return 1;
		}
		if (pcb_shape_resolve(&d.shape, &d.page_bytes,
				      &d.page_tokens) < 0)
			return 2;
		if (!d.have_ws) {
			d.m.pages = (1ull << 30) / d.page_bytes;
			if (!d.m.pages)
				d.m.pages = 1;
			d.m.seed = 1;
		}
		d.m.page_bytes = d.page_bytes;
		d.m.page_tokens = d.page_tokens;
		snprintf(d.m.layout, sizeof(d.m.layout), "%s",
			 d.page_tokens ? d.shape.layout : "raw");
	} else {
		d.page_bytes = d.m.page_bytes;
		d.page_tokens = d.m.page_tokens;
	}
	/* kv RPC carries the pages inside one message each way. */
	uint64_t call_bytes = d.page_bytes * d.batch + 5ull * d.batch + 64;
	if (d.rpc && call_bytes > (64ull << 20)) {
		fprintf(stderr, "peercache-bench drive: a kv call of %u pages of "
			"%" PRIu64 " bytes is over 64 MiB, a node's default "
			"limit of a message (rpc_max_message_bytes, "
			"conn_out_max, kv_staging_max); use a --batch of at "
			"most %" PRIu64 " with --via rpc\n", d.batch,
			d.page_bytes,
			(uint64_t)(((64ull << 20) - 64) / (d.page_bytes + 5)));
		return 2;
	}
	d.nonce = pc_now_ns();
	struct pcb_report r;
	pcb_report_init(&r, argc + 1, argv - 1);
	settings(&d, &r);
	fprintf(stderr, "drive: %s of %" PRIu64 "-byte pages (working set %"
		PRIu64 " pages%s%s), batch %u, concurrencies", op_names[d.op],
		d.page_bytes, d.m.pages, d.have_ws ? " from " : "",
		d.have_ws ? d.m.node : "", d.batch);
	for (unsigned i = 0; i < d.nconc; i++)
		fprintf(stderr, "%s%u", i ? "," : " ", d.conc[i]);
	fprintf(stderr, ", %.1f s each after %.1f s warmup\n",
		(double)d.duration_ms / 1e3, (double)d.warmup_ms / 1e3);
	bool bad = false;
	rc = 0;
	if (!d.only_vs)
		rc = run_target(&d, &node, &r, &bad);
	for (unsigned i = 0; i < d.nvs && !rc && !pcb_stop; i++) {
		if (d.op != OP_SET && (rc = load_baseline(&d, &d.vs[i])))
			break;
		rc = run_target(&d, &d.vs[i], &r, &bad);
	}
	if (pcb_stop) {
		fprintf(stderr, "drive: interrupted; reporting the levels "
			"that finished\n");
		rc = 1;
	}
	pcb_report_mark_peaks(&r);
	if (r.nrows) {
		if (pcb_report_console(&r, stdout) < 0)
			rc = 1;
		fflush(stdout);
		if (!d.no_files) {
			char err[512];
			if (pcb_report_write_files(&r, d.report, err,
						   sizeof(err)) < 0) {
				fprintf(stderr, "peercache-bench drive: %s\n",
					err);
				rc = 1;
			} else {
				fprintf(stderr, "drive: wrote %s.json, %s.md "
					"and %s.html\n", d.report, d.report,
					d.report);
			}
		}
	}
	if (bad) {
		fprintf(stderr, "peercache-bench drive: some rows had wrong "
			"bytes or no successful call (see above)\n");
		rc = 1;
	}
	pcb_report_free(&r);
	return rc;
}
