/*
 * bench/tool/pcb.h — peercache-bench: the types its parts share.
 *
 * peercache-bench is the user's benchmark tool, installed with the node
 * (`serve`, `drive`, `compare`). Its parts:
 *   main.c       command line, subcommands, page shapes, the manifest
 *   node_spawn.c a node of the tool's own (`serve|drive -- ARGS`)
 *   serve.c      publish a working set through the local node, keep it there
 *   drive.c      the sweep: processes x threads x batches, histograms, rows
 *   page.c       the working set's keys, page contents and their check
 *   be_node.c    targets "peercache": the node's session API (libpeercache,
 *                shared memory: SGLang's path) or kv.* RPC straight to a node
 *   be_redis.c   target "redis" (RESP over TCP)
 *   be_memcached.c target "memcached" (text and meta protocol over TCP)
 *   net.c        what the two share: addresses, deadlines, buffered reads
 *   report.c     console table, JSON, Markdown, HTML (inline SVG charts)
 *   json.c       reads a report's JSON back (for compare)
 *   compare.c    two reports' rows side by side, with ratios
 *
 * Owns: nothing global. A struct pcb_report and its rows are plain memory of
 * whoever filled them. Threading: drive's workers each own one pcb_conn.
 */
#ifndef PC_BENCH_TOOL_PCB_H
#define PC_BENCH_TOOL_PCB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ------------------------------------------------------------- reports */

/* Latency figures of one row, microseconds. */
struct pcb_lat {
	double mean_us, p50_us, p95_us, p99_us, p999_us, max_us;
};

/*
 * One measured point: one target, op and concurrency, after the warmup.
 * Per page latency is the batch's latency divided by its pages (what one
 * page of the batch cost); with --batch 1 the two are the same.
 */
struct pcb_row {
	char target[16];      /* "peercache", "redis", "memcached" */
	char via[16];         /* "session", "rpc", "resp", "memcache" */
	char op[16];          /* "get", "exists", "set"; "mixed/get", ... */
	char mode[12];        /* the node's mode ("p2p", "slotmap"); "-" */
	unsigned processes;
	unsigned threads;     /* per process */
	unsigned concurrency; /* processes * threads: calls in flight */
	unsigned batch;       /* pages per call */
	uint64_t page_bytes;
	unsigned page_tokens; /* 0: not known (--page-bytes) */
	double seconds;       /* measured time, after the warmup */
	uint64_t calls;       /* calls completed (errors included) */
	uint64_t pages;       /* pages asked for in those calls */
	uint64_t hits;        /* get: landed; exists: counted; set: stored */
	uint64_t errors;      /* calls that failed as a whole */
	uint64_t wrong;       /* pages that landed with bytes not theirs */
	uint64_t bytes;       /* page bytes moved by hits (get) and sets */
	double hit_rate;      /* hits / pages, 0..1 */
	double pages_s;       /* hits per second (pages that did the op) */
	double tokens_s;      /* pages_s * page_tokens; 0 when not known */
	double gbps;          /* bytes per second / 1e9 */
	struct pcb_lat batch_lat, page_lat;
	bool peak;            /* the row of most pages/s of its series */
};

/* A series is the rows of one (target, via, op, mode, batch). */
bool pcb_same_series(const struct pcb_row *a, const struct pcb_row *b);

struct pcb_kv {
	char key[48];
	char val[208];
};

#define PCB_SETTINGS_MAX 96

struct pcb_report {
	char version[64];   /* tool version and git revision */
	char build[128];    /* compiler, build type */
	char host[128];     /* host name */
	char kernel[128];   /* uname -sr */
	char cpu[128];      /* model name from /proc/cpuinfo */
	unsigned cpus;      /* online CPUs */
	uint64_t mem_bytes; /* MemTotal */
	char started[32];   /* ISO 8601 UTC, e.g. 2026-12-05T08:00:00Z */
	char command[1024]; /* the command line, as run */
	struct pcb_kv settings[PCB_SETTINGS_MAX]; /* tool options, node info */
	unsigned nsettings;
	struct pcb_row *rows; /* malloc'd */
	unsigned nrows;
};

/* Fill version, build, host, kernel, cpu, cpus, mem_bytes and started. */
void pcb_report_init(struct pcb_report *r, int argc, char **argv);
/* Add a setting (later values of one key replace earlier ones). */
void pcb_report_set(struct pcb_report *r, const char *key, const char *fmt,
		    ...) __attribute__((format(printf, 3, 4)));
/* Append a row (copied); -ENOMEM. */
int pcb_report_add_row(struct pcb_report *r, const struct pcb_row *row);
/* Mark in each series the row of most pages/s (ties: the first). */
void pcb_report_mark_peaks(struct pcb_report *r);
void pcb_report_free(struct pcb_report *r);

/* The four forms. Each returns 0 or a negative errno (a failed write). */
int pcb_report_console(const struct pcb_report *r, FILE *out);
int pcb_report_json(const struct pcb_report *r, FILE *out);
int pcb_report_markdown(const struct pcb_report *r, FILE *out);
int pcb_report_html(const struct pcb_report *r, FILE *out);
/* PREFIX.json, PREFIX.md and PREFIX.html; on failure err says which file
 * and why. */
int pcb_report_write_files(const struct pcb_report *r, const char *prefix,
			   char *err, size_t errlen);

/* Read a report written by pcb_report_json (unknown keys are skipped). On
 * failure err says where and why (file, byte offset). */
int pcb_report_load_json(const char *path, struct pcb_report *out, char *err,
			 size_t errlen);

/* `compare A B`: rows of B matched to rows of A by series and concurrency,
 * with B/A ratios of pages/s, GB/s and p99; rows found in one only are
 * listed as such. Returns 0, or -ENOENT when no row matched. */
int pcb_compare(const struct pcb_report *a, const struct pcb_report *b,
		const char *name_a, const char *name_b, FILE *out);

/* ----------------------------------------------------------- working set */

/* The keys of the working set: "<prefix>/p/<index>". */
#define PCB_KEY_MAX 256
int pcb_key(char *buf, size_t len, const char *prefix, uint64_t index);

/* Page bytes for a page index: a 32-byte header (magic, index, length,
 * seed) then a pattern derived from them, so any page can be checked alone. */
void pcb_page_fill(uint8_t *p, uint64_t len, uint64_t index, uint64_t seed);
/* true when p holds exactly what pcb_page_fill wrote for this index. full:
 * check every byte, else the header and the last 64 bytes. */
bool pcb_page_check(const uint8_t *p, uint64_t len, uint64_t index,
		    uint64_t seed, bool full);

/* -------------------------------------------------------------- targets */

/* Where and how a target is reached. */
struct pcb_target {
	const char *addr;       /* session: socket path; rpc: host:port or
				   unix:/path; redis/memcached: host:port */
	const char *secret;     /* rpc over TCP: the cluster secret, or NULL */
	unsigned timeout_ms;    /* per call */
	uint64_t page_bytes;    /* size of every page */
	unsigned batch;         /* most pages in one call */
};

/* One worker's connection; backends embed it first in their own struct. */
struct pcb_conn {
	const struct pcb_backend *be;
	uint8_t *buf;   /* batch * page_bytes: page i at buf + i * page_bytes */
	char err[256];  /* the last failure, for the log */
};

/*
 * A target. A process calls proc_open once (after fork), each of its
 * threads conn_open once, then the ops from that thread only. Ops take n
 * keys (keys[i] of keylens[i] bytes, NUL-terminated) and the pages at
 * c->buf; they return 0 or a negative errno for a call that failed as a
 * whole (c->err says why; the driver closes and reopens the connection).
 *   get:    fetch n pages into c->buf; *hits = pages that landed with
 *           exactly page_bytes bytes (others are misses; their slots are
 *           left as they were)
 *   set:    store the n pages from c->buf; *hits = pages stored
 *   exists: *hits = how many keys, from the first, exist without a gap
 */
struct pcb_backend {
	const char *target; /* "peercache", "redis", "memcached" */
	const char *via;    /* "session", "rpc", "resp", "memcache" */
	int (*proc_open)(const struct pcb_target *t, unsigned threads,
			 void **proc, char *err, size_t errlen);
	void (*proc_close)(void *proc);
	int (*conn_open)(void *proc, unsigned idx, struct pcb_conn **out,
			 char *err, size_t errlen);
	void (*conn_close)(struct pcb_conn *c);
	int (*get)(struct pcb_conn *c, char *const *keys,
		   const size_t *keylens, size_t n, size_t *hits);
	int (*set)(struct pcb_conn *c, char *const *keys,
		   const size_t *keylens, size_t n, size_t *hits);
	int (*exists)(struct pcb_conn *c, char *const *keys,
		      const size_t *keylens, size_t n, size_t *hits);
};

extern const struct pcb_backend pcb_be_session;
extern const struct pcb_backend pcb_be_rpc;
extern const struct pcb_backend pcb_be_redis;
extern const struct pcb_backend pcb_be_memcached;

#endif /* PC_BENCH_TOOL_PCB_H */
