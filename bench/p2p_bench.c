/*
 * bench/p2p_bench.c — pc-p2p-bench, one load generator for the p2p read path
 * and for the servers it is compared with (memcached, redis, a plain socket):
 * its options, the workers and their loop, the report and main. The wire
 * (connections, MessagePack-RPC, errors) is p2p_wire.c, storing the values
 * and learning the records p2p_setup.c, each target's issue and complete
 * p2p_targets.c, the tcp sink p2p_sink.c; what they share is p2p_bench.h.
 *
 * Owns: the client side of bench/p2p_bench.sh. Threads: main parses the
 * options, stores the values (setup), learns the directory records, connects
 * every worker and starts them; each worker owns its connections, buffers and
 * histogram outright (no locks, nothing shared on the hot path but the
 * read-only key table and records); main joins them and reports.
 *
 * A worker runs a closed loop of batches: --pipeline batches in flight per
 * worker, a new one issued each time the oldest completes. One batch is
 * --batch distinct random keys:
 *   p2p        dir.get of the batch on each key's directory owner (MessagePack-
 *              RPC; skipped with --no-lookup, records cached from setup), then
 *              one READ per page pipelined on the worker's data connection to
 *              the producer, as a reading node does;
 *   redis      --batch pipelined GETs (RESP);
 *   memcached  one multi-get "get k1 ... kB" (text protocol);
 *   tcp        8 bytes asking our --serve-tcp sink for batch x value bytes;
 *   dir        dir.get of the batch only, keys/s (no payload);
 *   kvget      kv.get of the batch on a node (--port), which gets each page
 *              the way its mode does (p2p: directory and READ; slotmap: one
 *              READ of the owner's bucket) and answers with the pages.
 * Each reply goes straight into the worker's destination buffer and is
 * checked on the way (p2p_targets.c). A failure stops the worker with a
 * message naming the item; main reports it and exits 1.
 *
 * Invariants: at most THREADS_MAX workers, PIPELINE_MAX batches in flight,
 * BATCH_MAX keys per batch, MEMBERS_MAX members and data endpoints, no more
 * than DST_BYTES_MAX of destination memory over all workers (checked when
 * the options are parsed); every wait is bounded (--timeout of silence on a
 * socket).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>

#include "p2p_bench.h"
#include "lg_hist.h"
#include "common/util.h"

/* ------------------------------------------------------------ workers ---- */

/* --- the loop ------------------------------------------------------------ */

/* How each target issues a batch and receives the oldest one's reply. */
struct target_ops {
	const char *name;
	int (*issue)(struct worker *w, struct slot *s);
	/* Receives a reply on the connection of the oldest batch in flight;
	 * *done is the batch it completed (the oldest, but for dir). */
	int (*complete)(struct worker *w, struct slot *oldest, struct slot **done);
	bool payload;  /* counts value bytes (all but dir) */
};

static const struct target_ops targets[] = {
	[T_P2P] = {"p2p", target_p2p_issue, target_p2p_complete, true},
	[T_REDIS] = {"redis", target_redis_issue, target_text_complete, true},
	[T_MEMCACHED] = {"memcached", target_mc_issue, target_text_complete, true},
	[T_TCP] = {"tcp", target_tcp_issue, target_tcp_complete, true},
	[T_DIR] = {"dir", target_dir_issue, target_dir_complete, false},
	[T_KVGET] = {"kvget", target_kvget_issue, target_kvget_complete, true},
};

static int worker_run(struct worker *w)
{
	struct bench *b = w->b;
	const struct target_ops *t = &targets[b->o.target];
	int ret;
	for (unsigned i = 0; i < b->o.pipeline; i++) {
		w->slots[i].t_issue = pc_now_ns();
		if ((ret = t->issue(w, &w->slots[i])) < 0)
			return ret;
		w->fifo[w->nfifo++] = i;
	}
	for (;;) {
		struct slot *s;
		if ((ret = t->complete(w, &w->slots[w->fifo[0]], &s)) < 0)
			return ret;
		uint64_t now = pc_now_ns();
		unsigned si = (unsigned)(s - w->slots), i = 0;
		while (w->fifo[i] != si)
			i++;
		memmove(&w->fifo[i], &w->fifo[i + 1],
			(w->nfifo - i - 1) * sizeof(w->fifo[0]));
		w->nfifo--;
		/* Counted: batches done in the window; a target slower than the
		 * window instead gets one whole batch issued in it counted,
		 * over that batch's own time (see measure). */
		bool in = now >= b->t_measure && now <= b->t_end;
		bool slow = now > b->t_end && w->batches == 0 &&
			    s->t_issue >= b->t_measure;
		if (slow)
			w->t_from = s->t_issue;
		if (in || slow) {
			w->t_last = now;
			w->batches++;
			w->items += b->o.batch;
			if (t->payload)
				w->bytes += (uint64_t)b->o.batch * b->o.value_bytes;
			lg_hist_record(&w->hist, now - s->t_issue);
		}
		if (now >= b->t_end && w->batches)
			return 0; /* else: a batch issued in the window is due */
		s->t_issue = now;
		if ((ret = t->issue(w, s)) < 0)
			return ret;
		w->fifo[w->nfifo++] = si;
	}
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	w->rc = worker_run(w);
	if (w->rc < 0)
		snprintf(w->err, sizeof(w->err), "%s", wire_err);
	return NULL;
}

/* One node.health call on c: the node has accepted and placed the
 * connection once it answers. */
static int worker_ping(struct worker *w, struct wire_conn *c)
{
	struct wire_rd r;
	return wire_rpc_call0(c, &w->req, ++w->msgid, "node.health", &r);
}

/* Opens the worker's connections: after every worker's buffers are
 * touched (up to DST_BYTES_MAX of them, seconds on a loaded machine), so
 * that no connection sits idle past the node's rpc_handshake_timeout
 * before its first request. p2p: each RPC connection is answered once
 * before the data connections open, as a node's own reads go (a lookup,
 * then the reads): the node pairs a data connection with the oldest open
 * RPC connection of its host (modules/spread.h), and an RPC connection
 * still waiting in another reactor's accept queue has not been noted. */
static int worker_connect(struct worker *w)
{
	const struct bench *b = w->b;
	const struct opts *o = &b->o;
	int ret = 0;
	if (o->target == T_P2P || o->target == T_DIR) {
		for (unsigned m = 0; m < b->nmembers && ret == 0; m++) {
			ret = wire_conn_open(&w->rpc[m], "rpc", b->members[m].host,
					     b->members[m].port, o->timeout_ms);
			if (ret == 0 && o->target == T_P2P)
				ret = worker_ping(w, &w->rpc[m]);
		}
		for (unsigned p = 0; p < b->npeers && ret == 0 && o->target == T_P2P; p++)
			ret = wire_conn_open(&w->data[p], "data", b->peers[p].host,
					     b->peers[p].port, o->timeout_ms);
	} else {
		ret = wire_conn_open(&w->srv, o->target_name, o->host, o->port,
				     o->timeout_ms);
	}
	return ret;
}

/* Buffers, made before any worker connects (worker_connect). */
static void worker_init(struct worker *w, struct bench *b, unsigned idx)
{
	const struct opts *o = &b->o;
	w->b = b;
	w->idx = idx;
	w->rng = (o->seed + idx + 1) * 0x9e3779b97f4a7c15ull | 1;
	w->srv.fd = -1;
	for (unsigned m = 0; m < MEMBERS_MAX; m++)
		w->rpc[m].fd = w->data[m].fd = -1;
	if (o->target == T_KVGET)
		w->size_text_len = target_kvget_bin_head(w->size_text, o->value_bytes);
	else
		w->size_text_len = (size_t)snprintf(w->size_text, sizeof(w->size_text),
						    o->target == T_REDIS ? "$%" PRIu64 "\r\n"
									 : " 0 %" PRIu64 "\r\n",
						    o->value_bytes);
	w->iov = pc_xcalloc(3u * o->batch + 1, sizeof(*w->iov));
	w->slots = pc_xcalloc(o->pipeline, sizeof(*w->slots));
	for (unsigned i = 0; i < o->pipeline; i++) {
		struct slot *s = &w->slots[i];
		s->keys = pc_xcalloc(o->batch, sizeof(*s->keys));
		s->recs = pc_xcalloc(o->batch, sizeof(*s->recs));
		s->hdr = pc_xcalloc((size_t)o->batch + 1, ITEM_HDR_BYTES);
		if (targets[o->target].payload) {
			/* Touched now, so page faults stay out of the run. */
			s->dst = pc_xcalloc(o->batch, o->value_bytes);
			memset(s->dst, 0xee, (size_t)o->batch * o->value_bytes);
		}
	}
	for (unsigned p = 0; p < b->npools; p++) {
		w->perm[p] = pc_xcalloc(b->npool[p], sizeof(unsigned));
		memcpy(w->perm[p], b->pool[p], b->npool[p] * sizeof(unsigned));
	}
	wire_buf_reserve(&w->req, (size_t)o->batch * (KEY_BYTES_MAX + 40) + 64);
}

static void worker_free(struct worker *w)
{
	for (unsigned m = 0; m < MEMBERS_MAX; m++) {
		wire_conn_close(&w->rpc[m]);
		wire_conn_close(&w->data[m]);
	}
	wire_conn_close(&w->srv);
	for (unsigned i = 0; w->slots && i < w->b->o.pipeline; i++) {
		free(w->slots[i].keys);
		free(w->slots[i].recs);
		free(w->slots[i].hdr);
		free(w->slots[i].dst);
	}
	for (unsigned p = 0; p < MEMBERS_MAX; p++)
		free(w->perm[p]);
	free(w->slots);
	free(w->iov);
	free(w->req.p);
}

/* ------------------------------------------------------------ options ---- */

static void usage(FILE *out)
{
	fprintf(out,
		"usage: pc-p2p-bench --target T --port P [options]\n"
		"       pc-p2p-bench --serve-tcp [--port P]\n"
		"\n"
		"One closed-loop load generator for the p2p read path and the servers\n"
		"it is compared with. Per batch of --batch distinct random keys:\n"
		"  p2p        dir.get of the batch on the key owners, then one READ per\n"
		"             page pipelined on the data port (--port: the node's RPC)\n"
		"  redis      pipelined GET of each key (RESP)\n"
		"  memcached  one multi-get 'get k1 ... kB' (text protocol)\n"
		"  tcp        batch x value bytes from a --serve-tcp sink\n"
		"  dir        dir.get of the batch only; keys/s\n"
		"  kvget      kv.get of the batch on the node at --port, which gets\n"
		"             each page as its mode does (p2p or slotmap)\n"
		"Payloads are received straight into each thread's destination buffer.\n"
		"\n"
		"  --target T         p2p | redis | memcached | tcp | dir | kvget\n"
		"                     (required)\n"
		"  --host H           server address, loopback only (default 127.0.0.1)\n"
		"  --port P           RPC port (p2p, dir), server port, or sink port\n"
		"  --threads T        reader threads, one connection each (default 1, max %u)\n"
		"  --batch B          keys per batch (default 32, max %u)\n"
		"  --pipeline P       batches in flight per thread (default 1, max %u;\n"
		"                     kvget: 1)\n"
		"  --value-bytes N    value size, suffixes k m (KiB, MiB) (default 1m;\n"
		"                     %u .. 64m)\n"
		"  --keys K           working set (default max(64, 512 MiB / N), at\n"
		"                     most 1M; max %u)\n"
		"  --no-lookup        p2p: no dir.get per batch, records from setup\n"
		"  --held-by P        kvget: read only the keys whose pages the node\n"
		"                     with RPC port P holds in its slots (slot.probe;\n"
		"                     slotmap mode), so that every read is of that node\n"
		"  --no-setup         values already stored (p2p, dir still learn the\n"
		"                     records with dir.get)\n"
		"  --setup-only       store the values and exit\n"
		"  --duration SEC     measured window (default 3)\n"
		"  --warmup SEC       load before the window, not measured (default 1)\n"
		"  --timeout SEC      longest silence on a socket (default 5)\n"
		"  --prefix STR       key prefix (default pcb); keys are PREFIX:N:i\n"
		"  --seed S           random seed (default 1)\n"
		"  --json             one JSON object on stdout\n"
		"  --server-pid PID   also report the CPU time (user + system,\n"
		"                     all threads) process PID spent in the\n"
		"                     measured window, and per GB moved; the\n"
		"                     bench's own CPU is reported either way\n"
		"  --serve-tcp        be the tcp sink: listen (port 0: any) and print\n"
		"                     'listening: tcp on HOST:PORT' on stderr\n"
		"\n"
		"Exit status: 0 on a clean run, 1 on a failure (message on stderr),\n"
		"2 on bad usage.\n",
		THREADS_MAX, BATCH_MAX, PIPELINE_MAX, VALUE_BYTES_MIN, KEYS_MAX);
}

static bool parse_u64(const char *s, uint64_t lo, uint64_t hi, bool sized,
		      uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *s == '-')
		return false;
	if (sized && (*end == 'k' || *end == 'K')) {
		v <<= 10;
		end++;
	} else if (sized && (*end == 'm' || *end == 'M')) {
		v <<= 20;
		end++;
	}
	if (*end || v < lo || v > hi)
		return false;
	*out = v;
	return true;
}

static bool parse_secs(const char *s, double lo, double hi, double *out)
{
	char *end;
	double v = strtod(s, &end);
	if (end == s || *end || !(v >= lo && v <= hi))
		return false;
	*out = v;
	return true;
}

enum { O_TARGET = 256, O_HOST, O_PORT, O_THREADS, O_BATCH, O_PIPELINE,
       O_VALUE, O_KEYS, O_NO_LOOKUP, O_NO_SETUP, O_SETUP_ONLY, O_DURATION,
       O_WARMUP, O_TIMEOUT, O_PREFIX, O_SEED, O_JSON, O_SERVE, O_HELD_BY,
       O_SERVER_PID, O_HELP };

/* Returns 0, 1 for --help, or -EINVAL with the message printed. */
static int parse_opts(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{"target", 1, NULL, O_TARGET}, {"host", 1, NULL, O_HOST},
		{"port", 1, NULL, O_PORT}, {"threads", 1, NULL, O_THREADS},
		{"batch", 1, NULL, O_BATCH}, {"pipeline", 1, NULL, O_PIPELINE},
		{"value-bytes", 1, NULL, O_VALUE}, {"keys", 1, NULL, O_KEYS},
		{"no-lookup", 0, NULL, O_NO_LOOKUP}, {"no-setup", 0, NULL, O_NO_SETUP},
		{"setup-only", 0, NULL, O_SETUP_ONLY},
		{"duration", 1, NULL, O_DURATION}, {"warmup", 1, NULL, O_WARMUP},
		{"timeout", 1, NULL, O_TIMEOUT}, {"prefix", 1, NULL, O_PREFIX},
		{"seed", 1, NULL, O_SEED}, {"json", 0, NULL, O_JSON},
		{"serve-tcp", 0, NULL, O_SERVE}, {"held-by", 1, NULL, O_HELD_BY},
		{"server-pid", 1, NULL, O_SERVER_PID}, {"help", 0, NULL, O_HELP},
		{NULL, 0, NULL, 0},
	};
	*o = (struct opts){.host = "127.0.0.1", .threads = 1, .batch = 32,
			   .pipeline = 1, .value_bytes = 1u << 20,
			   .duration_s = 3, .warmup_s = 1, .timeout_ms = 5000,
			   .lookup = true, .setup = true, .run = true,
			   .prefix = "pcb", .seed = 1};
	bool have_target = false, have_port = false;
	int c;
/* A bounded integer option into o->field (any unsigned width). */
#define NUM(field, lo_, hi_, sized)                                           \
	if ((ok = parse_u64(optarg, lo_, hi_, sized, &v)))                     \
		o->field = (__typeof__(o->field))v;                            \
	break
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		uint64_t v = 0;
		double d = 0;
		bool ok = true;
		switch (c) {
		case O_TARGET:
			ok = false;
			for (unsigned i = 0; i < PC_ARRAY_LEN(targets); i++)
				if (!strcmp(optarg, targets[i].name)) {
					o->target = (enum target_id)i;
					ok = have_target = true;
				}
			break;
		case O_HOST: o->host = optarg; break;
		case O_PORT: have_port = true; NUM(port, 0, 65535, false);
		case O_THREADS: NUM(threads, 1, THREADS_MAX, false);
		case O_BATCH: NUM(batch, 1, BATCH_MAX, false);
		case O_PIPELINE: NUM(pipeline, 1, PIPELINE_MAX, false);
		case O_VALUE: NUM(value_bytes, VALUE_BYTES_MIN, VALUE_BYTES_MAX, true);
		case O_KEYS: NUM(keys, 1, KEYS_MAX, false);
		case O_SEED: NUM(seed, 0, UINT64_MAX, false);
		case O_HELD_BY: NUM(held_port, 1, 65535, false);
		case O_SERVER_PID: NUM(server_pid, 1, INT32_MAX, false);
		case O_NO_LOOKUP: o->lookup = false; break;
		case O_NO_SETUP: o->setup = false; break;
		case O_SETUP_ONLY: o->run = false; break;
		case O_DURATION: ok = parse_secs(optarg, 0.01, 86400, &o->duration_s); break;
		case O_WARMUP: ok = parse_secs(optarg, 0, 86400, &o->warmup_s); break;
		case O_TIMEOUT:
			if ((ok = parse_secs(optarg, 0.01, 3600, &d)))
				o->timeout_ms = (unsigned)(d * 1000);
			break;
		case O_PREFIX:
			o->prefix = optarg;
			ok = strlen(optarg) >= 1 && strlen(optarg) <= 16 &&
			     !strpbrk(optarg, " \t\r\n");
			break;
		case O_JSON: o->json = true; break;
		case O_SERVE: o->serve_tcp = true; break;
		case O_HELP: usage(stdout); return 1;
		default: usage(stderr); return -EINVAL;
		}
#undef NUM
		if (!ok) {
			const char *name = "?";
			for (unsigned i = 0; lo[i].name; i++)
				if (lo[i].val == c)
					name = lo[i].name;
			fprintf(stderr, "pc-p2p-bench: bad value for --%s: '%s'\n",
				name, optarg);
			return -EINVAL;
		}
	}
	const char *why = NULL;
	if (optind < argc)
		why = "unexpected argument";
	else if (o->serve_tcp)
		return 0;
	else if (!have_target)
		why = "--target is required";
	else if (!have_port || o->port == 0)
		why = "--port is required";
	else if (!o->setup && !o->run)
		why = "--no-setup with --setup-only leaves nothing to do";
	else if (o->target == T_KVGET && o->pipeline != 1)
		why = "kvget takes --pipeline 1 (a node may answer kv.get calls in "
		      "any order)";
	else if (o->held_port && o->target != T_KVGET)
		why = "--held-by is for --target kvget";
	if (!o->keys)
		o->keys = (unsigned)PC_MAX(64, PC_MIN(1u << 20, (512ull << 20) / o->value_bytes));
	if (!why && o->keys < o->batch)
		why = "--keys must be at least --batch (keys in a batch are distinct)";
	if (!why && (double)o->threads * o->pipeline * o->batch * o->value_bytes >
			    (double)DST_BYTES_MAX)
		why = "threads x pipeline x batch x value bytes is over 4 GiB";
	if (why) {
		fprintf(stderr, "pc-p2p-bench: %s (see --help)\n", why);
		return -EINVAL;
	}
	o->target_name = targets[o->target].name;
	return 0;
}

/* ------------------------------------------------------------ cpu time -- */

/* CPU seconds (user + system, all threads) process pid has used so far,
 * from /proc/PID/stat; -1 when it cannot be read. Clock-tick resolution
 * (10 ms): enough over a window of seconds. */
static double proc_cpu_s(unsigned pid)
{
	char path[48], buf[1024];
	snprintf(path, sizeof(path), "/proc/%u/stat", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	/* pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
	 * majflt cmajflt utime stime: comm may hold spaces, so from its ')'. */
	const char *p = strrchr(buf, ')');
	unsigned long long ut, st;
	if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u "
			 "%llu %llu", &ut, &st) != 2)
		return -1;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static double self_cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
	       (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static void sleep_until(uint64_t t_ns)
{
	struct timespec ts = {(time_t)(t_ns / 1000000000u),
			      (long)(t_ns % 1000000000u)};
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) ==
	       EINTR)
		;
}

/* CPU time spent in the measured window: the bench's own, and the
 * server's (--server-pid; negative when not asked or not readable). */
struct cpu_window {
	double self_s, server_s;
};

/* Sampled from the main thread while the workers run: at the window's
 * start and end. */
static struct cpu_window cpu_window(const struct bench *b)
{
	unsigned pid = b->o.server_pid;
	sleep_until(b->t_measure);
	double c0 = self_cpu_s(), s0 = pid ? proc_cpu_s(pid) : -1;
	sleep_until(b->t_end);
	double c1 = self_cpu_s(), s1 = pid ? proc_cpu_s(pid) : -1;
	return (struct cpu_window){c1 - c0, s0 >= 0 && s1 >= 0 ? s1 - s0 : -1};
}

/* ------------------------------------------------------------- report ---- */

static void report(const struct bench *b, const struct lg_hist *h,
		   uint64_t batches, uint64_t items, uint64_t bytes, double d,
		   struct cpu_window cpu)
{
	const struct opts *o = &b->o;
	double gbps = (double)bytes / d / 1e9, ips = (double)items / d;
	/* CPU seconds per GB moved in the window. */
	double gb = (double)bytes / 1e9;
	double self_gb = gb > 0 ? cpu.self_s / gb : 0;
	double server_gb = gb > 0 && cpu.server_s >= 0 ? cpu.server_s / gb : -1;
	char server_json[64] = "null";
	if (server_gb >= 0)
		snprintf(server_json, sizeof(server_json), "%.4f", server_gb);
	double us[6] = {
		(double)lg_hist_quantile_ns(h, 0.5) / 1e3,
		(double)lg_hist_quantile_ns(h, 0.9) / 1e3,
		(double)lg_hist_quantile_ns(h, 0.99) / 1e3,
		(double)lg_hist_quantile_ns(h, 0.999) / 1e3,
		(double)h->max_ns / 1e3,
		h->total ? (double)h->sum_ns / (double)h->total / 1e3 : 0,
	};
	if (o->json) {
		printf("{\"target\":\"%s\",\"lookup\":%s,\"value_bytes\":%" PRIu64
		       ",\"batch\":%u,\"threads\":%u,\"pipeline\":%u,\"keys\":%u,"
		       "\"members\":%u,\"warmup_s\":%g,\"duration_s\":%g,"
		       "\"setup_s\":%.3f,\"batches\":%" PRIu64 ",\"items\":%" PRIu64
		       ",\"bytes\":%" PRIu64 ",\"gb_per_s\":%.4f,"
		       "\"items_per_s\":%.1f,\"batches_per_s\":%.1f,"
		       "\"p50_us\":%.1f,\"p90_us\":%.1f,\"p99_us\":%.1f,"
		       "\"p999_us\":%.1f,\"max_us\":%.1f,\"mean_us\":%.1f,"
		       "\"client_cpu_s_per_gb\":%.4f,\"server_cpu_s_per_gb\":%s,"
		       "\"errors\":0}\n",
		       o->target_name,
		       o->target == T_P2P && o->lookup ? "true" : "false",
		       o->value_bytes, o->batch, o->threads, o->pipeline, o->keys,
		       b->nmembers, o->warmup_s, d, b->setup_s, batches, items,
		       bytes, gbps, ips, (double)batches / d, us[0], us[1], us[2],
		       us[3], us[4], us[5], self_gb, server_json);
		return;
	}
	printf("%s%s: %u threads x %u keys x %" PRIu64 " B, pipeline %u, %u keys:"
	       " %.3f GB/s, %.0f %s/s; batch latency p50 %.1f us, p99 %.1f us,"
	       " max %.1f us (%" PRIu64 " batches in %g s)\n",
	       o->target_name, o->target == T_P2P && !o->lookup ? " (no lookup)" : "",
	       o->threads, o->batch, o->value_bytes, o->pipeline, o->keys, gbps,
	       ips, o->target == T_DIR ? "keys" : "values", us[0], us[2], us[4],
	       batches, d);
	if (o->target != T_DIR) {
		printf("  CPU per GB moved: this bench %.3f s", self_gb);
		if (server_gb >= 0)
			printf(", server (pid %u) %.3f s", o->server_pid,
			       server_gb);
		printf("\n");
	}
}

/* --------------------------------------------------------------- main ---- */

/* Stores the values and learns the records, on the main thread. */
static int setup(struct bench *b)
{
	const struct opts *o = &b->o;
	struct wire_conn c;
	uint64_t t0 = pc_now_ns();
	int ret;
	if (o->target == T_TCP)
		return 0;
	if ((ret = wire_conn_open(&c, o->target_name, o->host, o->port, o->timeout_ms)) < 0)
		return ret;
	if (o->setup)
		ret = o->target == T_REDIS || o->target == T_MEMCACHED
			      ? setup_text(b, &c, o->target == T_REDIS)
			      : setup_p2p(b, &c);
	if (ret == 0 && o->run && (o->target == T_P2P || o->target == T_DIR))
		ret = setup_learn_records(b, &c);
	if (ret == 0 && o->run && o->held_port)
		ret = setup_learn_held(b);
	wire_conn_close(&c);
	b->setup_s = (double)(pc_now_ns() - t0) / 1e9;
	return ret;
}

static int measure(struct bench *b)
{
	const struct opts *o = &b->o;
	struct worker *w = pc_xcalloc(o->threads, sizeof(*w));
	unsigned started = 0;
	int ret = setup_pools_make(b);
	for (unsigned i = 0; i < o->threads && ret == 0; i++)
		worker_init(&w[i], b, i);
	for (unsigned i = 0; i < o->threads && ret == 0; i++)
		ret = worker_connect(&w[i]);
	if (ret == 0) {
		uint64_t t0 = pc_now_ns();
		b->t_measure = t0 + (uint64_t)(o->warmup_s * 1e9);
		b->t_end = b->t_measure + (uint64_t)(o->duration_s * 1e9);
		for (; started < o->threads; started++)
			if (pthread_create(&w[started].th, NULL, worker_main,
					   &w[started]) != 0) {
				ret = wire_fail(EAGAIN, "pthread_create failed");
				break;
			}
	}
	struct cpu_window cpu = {0, -1};
	if (ret == 0)
		cpu = cpu_window(b);
	struct lg_hist *h = pc_xcalloc(1, sizeof(*h));
	uint64_t batches = 0, items = 0, bytes = 0;
	/* The duration the totals are over: the window, unless a worker's
	 * batches outlasted it; then the one that makes the sum of the
	 * workers' own rates come out (they ran at the same time). */
	double rate_items = 0, d = o->duration_s;
	for (unsigned i = 0; i < started; i++) {
		pthread_join(w[i].th, NULL);
		if (w[i].rc < 0 && ret == 0) {
			/* %.480s: the worker message fits with its prefix. */
			snprintf(wire_err, sizeof(wire_err), "thread %u: %.480s", i,
				 w[i].err);
			ret = w[i].rc;
		}
		lg_hist_merge(h, &w[i].hist);
		batches += w[i].batches;
		items += w[i].items;
		bytes += w[i].bytes;
		double dw = w[i].t_last > b->t_end
				    ? (double)(w[i].t_last - w[i].t_from) / 1e9
				    : o->duration_s;
		rate_items += dw > 0 ? (double)w[i].items / dw : 0;
	}
	if (items && rate_items > 0)
		d = (double)items / rate_items;
	if (ret == 0 && batches == 0)
		ret = wire_fail(ETIMEDOUT, "no batch completed in the measured window");
	if (ret == 0)
		report(b, h, batches, items, bytes, d, cpu);
	for (unsigned i = 0; i < o->threads; i++)
		if (w[i].b)
			worker_free(&w[i]);
	free(w);
	free(h);
	return ret;
}

int main(int argc, char **argv)
{
	static struct bench b;
	int ret = parse_opts(argc, argv, &b.o);
	if (ret)
		return ret > 0 ? 0 : 2;
	if (b.o.serve_tcp) {
		sink_serve_tcp(&b.o);
		fprintf(stderr, "pc-p2p-bench: %s\n", wire_err);
		return 1;
	}
	b.nkeys = b.o.keys;
	setup_keys_make(&b);
	ret = setup(&b);
	if (ret == 0 && !b.o.run) {
		if (b.o.json)
			printf("{\"target\":\"%s\",\"setup_only\":true,\"keys\":%u,"
			       "\"value_bytes\":%" PRIu64 ",\"setup_s\":%.3f}\n",
			       b.o.target_name, b.nkeys, b.o.value_bytes, b.setup_s);
		else
			printf("%s: stored %u values of %" PRIu64 " B in %.2f s\n",
			       b.o.target_name, b.nkeys, b.o.value_bytes, b.setup_s);
	}
	if (ret == 0 && b.o.run)
		ret = measure(&b);
	if (ret < 0) {
		fprintf(stderr, "pc-p2p-bench: %s: %s\n", b.o.target_name, wire_err);
		return 1;
	}
	return 0;
}
