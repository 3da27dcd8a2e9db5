/*
 * server/main.c — peercached: load settings, start the reactors with the
 * node's modules, wait for a signal, stop cleanly.
 *
 * Owns: the process: its signal disposition and exit status. Thread: main.
 * Signals are blocked in every thread and taken here with sigtimedwait, so no
 * handler ever runs in the middle of reactor code. The first SIGINT/SIGTERM
 * starts a graceful shutdown (listeners close, in-flight work gets
 * shutdown_grace); a second one exits at once. SIGHUP reads the settings
 * again (config file, environment, command line, with the usual precedence)
 * and offers them to the modules (pc_modules_reload): today only `peers`
 * changes at run time; any other setting that differs is logged as needing
 * a restart.
 *
 * Under a Type=notify systemd unit (NOTIFY_SOCKET set) the node reports
 * READY=1 once its listeners accept, RELOADING=1 ... READY=1 around a
 * SIGHUP reload and STOPPING=1 when a shutdown starts (common/sdnotify.h).
 *
 * Exit status: 0 after a clean stop, 1 on a runtime failure, 2 on bad
 * configuration or usage.
 */
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/sdnotify.h"
#include "common/settings.h"
#include "reactor/group.h"
#include "modules/module.h"
#include "server/fault_alloc.h"
#include "server/server.h"

#define LOG_MOD "main"

extern char **environ;

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: peercached [OPTIONS]\n"
		"\n"
		"PeerCache node: the L3 KV-cache store for LLM inference.\n"
		"Runs in the foreground until SIGINT (Ctrl-C) or SIGTERM.\n"
		"\n"
		"  --help             show this help and exit\n"
		"  --version          show the version and exit\n"
		"  --config FILE      read settings from FILE (\"key = value\" "
		"lines)\n"
		"  --print-config     print the effective settings and exit\n"
		"  --check-config FILE  check FILE (its keys and values, "
		"alone: no\n"
		"                     environment, no other option); exit 0 "
		"when it is\n"
		"                     valid, 2 with the first error\n"
		"  --print-config-sample  print the annotated sample "
		"configuration\n"
		"                     (every key, its help and default) and "
		"exit\n"
		"\n"
		"Settings (also config-file keys and PEERCACHE_<KEY> "
		"variables;\n"
		"precedence: command line > environment > file > default; "
		"dashes\n"
		"and underscores are interchangeable; sizes take units like "
		"4gb):\n");
	pc_cfg_print_help(&pc_settings_table, out);
}

static bool has_flag(int argc, char **argv, const char *flag)
{
	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], flag) == 0)
			return true;
	return false;
}

/* Strip our own flags before the config engine sees argv. */
static int own_args(int argc, char **argv, char **out)
{
	int n = 0;
	for (int i = 0; i < argc; i++)
		if (i == 0 || strcmp(argv[i], "--print-config") != 0)
			out[n++] = argv[i];
	out[n] = NULL;
	return n;
}

static struct pc_ctx g_ctx;

static void free_args(char **args)
{
	for (size_t i = 0; args && args[i]; i++)
		free(args[i]);
	free(args);
}

/* A NULL-terminated copy of n arguments; NULL when out of memory. */
static char **dup_args(int n, char **args)
{
	char **out = calloc((size_t)n + 1, sizeof(*out));
	for (int i = 0; out && i < n; i++)
		if (!(out[i] = strdup(args[i]))) {
			free_args(out);
			return NULL;
		}
	return out;
}

static void resolve_node_id(struct pc_ctx *ctx, const struct pc_settings *s)
{
	if (*s->node_id) {
		snprintf(ctx->node_id, sizeof(ctx->node_id), "%s", s->node_id);
		return;
	}
	char host[64] = "localhost";
	gethostname(host, sizeof(host) - 1);
	host[sizeof(host) - 1] = '\0';
	/* Stable across restarts with a fixed port; with port 0 (tests) the
	 * pid keeps several nodes on one host apart. */
	if (s->rpc_port)
		snprintf(ctx->node_id, sizeof(ctx->node_id), "%s-%lld", host,
			 (long long)s->rpc_port);
	else
		snprintf(ctx->node_id, sizeof(ctx->node_id), "%s-p%d", host,
			 (int)getpid());
}

static void log_endpoints(struct pc_ctx *ctx)
{
	struct pc_endpoint eps[PC_ENDPOINTS_MAX];
	unsigned n = pc_ctx_endpoints(ctx, eps, PC_ENDPOINTS_MAX);
	if (n == 0) {
		PC_LOGI(LOG_MOD, "listening on nothing: this version has no "
			"network service yet");
		return;
	}
	for (unsigned i = 0; i < n; i++)
		PC_LOGI(LOG_MOD, "listening: %s on %s", eps[i].name,
			eps[i].addr);
}

/* SIGHUP: read the settings again (same arguments and environment) and
 * offer them to the modules. A configuration that no longer loads or
 * validates changes nothing. */
static void reload_settings(int nargs, char **args,
			    const struct pc_settings *cur)
{
	struct pc_settings fresh;
	char err[PC_CFG_ERR_MAX];
	PC_LOGI(LOG_MOD, "SIGHUP received: reading the settings again");
	if (pc_settings_load(&fresh, nargs, args, environ, err,
			     sizeof(err)) < 0 ||
	    pc_settings_validate(&fresh, err, sizeof(err)) < 0) {
		PC_LOGW(LOG_MOD, "reload: %s; nothing changed", err);
		pc_settings_free(&fresh);
		return;
	}
	for (size_t i = 0; i < pc_settings_table.n; i++) {
		const struct pc_cfg_key *k = &pc_settings_table.keys[i];
		if (strcmp(k->name, "peers") != 0 &&
		    pc_cfg_differs(k, cur, &fresh))
			PC_LOGW(LOG_MOD, "reload: %s changed; it takes effect at "
				"the next restart (only peers changes at run "
				"time)", k->name);
	}
	pc_modules_reload(&g_ctx, &fresh);
	pc_settings_free(&fresh);
}

/* A Type=notify unit learns the node's state from these (sd_notify); a
 * failure to tell it is logged, never fatal: the node serves either way. */
static void notify_systemd(int ret)
{
	if (ret < 0)
		PC_LOGW(LOG_MOD, "sd_notify to NOTIFY_SOCKET=%s: %s",
			getenv("NOTIFY_SOCKET"), strerror(-ret));
}

/* Wait for SIGINT/SIGTERM or for the reactors to end on their own; SIGHUP
 * reloads the settings. */
static int wait_for_stop(struct rx_group *g, int nargs, char **args,
			 const struct pc_settings *cur)
{
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGHUP);
	bool stopping = false;
	for (;;) {
		struct timespec ts = {0, 200 * 1000 * 1000};
		int sig = sigtimedwait(&set, NULL, &ts);
		if (sig == SIGHUP) {
			if (!stopping) {
				notify_systemd(pc_sd_notifyf(
					"RELOADING=1\nMONOTONIC_USEC=%llu",
					(unsigned long long)(pc_now_ns() /
							     1000)));
				reload_settings(nargs, args, cur);
				notify_systemd(pc_sd_notifyf(
					"READY=1\nSTATUS=node %s ready "
					"(settings read again)",
					g_ctx.node_id));
			}
		} else if (sig > 0) {
			if (stopping) {
				PC_LOGW(LOG_MOD, "second %s: exiting now",
					strsignal(sig));
				_exit(1);
			}
			PC_LOGI(LOG_MOD, "%s received: shutting down",
				strsignal(sig));
			stopping = true;
			notify_systemd(pc_sd_notify("STOPPING=1\nSTATUS=shutting "
						    "down"));
			__atomic_store_n(&g_ctx.state, PC_NODE_STOPPING,
					 __ATOMIC_RELEASE);
			rx_group_stop(g);
		}
		if (rx_group_done(g))
			return stopping ? 0 : -EIO;
	}
}

/*
 * A secret on the command line is readable by every local user in
 * /proc/PID/cmdline. Overwrite it in place (the kernel reads argv from our
 * memory, so the scrubbed text is what others see from now on) and say that
 * it was visible until now, and how to avoid it.
 */
static void scrub_secret_args(int argc, char **argv)
{
	static const char *const names[] = {"--cluster-secret",
					    "--cluster_secret"};
	for (int i = 1; i < argc; i++) {
		for (size_t j = 0; j < PC_ARRAY_LEN(names); j++) {
			size_t n = strlen(names[j]);
			if (strncmp(argv[i], names[j], n) != 0)
				continue;
			char *v = NULL;
			if (argv[i][n] == '=')
				v = argv[i] + n + 1;
			else if (argv[i][n] == '\0' && i + 1 < argc)
				v = argv[++i];
			if (!v)
				continue;
			memset(v, 'x', strlen(v));
			PC_LOGW(LOG_MOD, "cluster_secret was given on the "
				"command line, where every local user could "
				"read it until now (it has been blanked out); "
				"use cluster_secret_file or "
				"PEERCACHE_CLUSTER_SECRET instead");
		}
	}
}

/*
 * Every connection costs a file descriptor: raise the soft RLIMIT_NOFILE to
 * the hard limit, and warn when the connection caps together (plus room for
 * peers' channels, files and the pool) could still run out of descriptors,
 * after which accept fails for everyone, the owner's clients included.
 */
#define FD_HEADROOM 256
static void raise_fd_limit(const struct pc_settings *s)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0) {
		PC_LOGW(LOG_MOD, "getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
		return;
	}
	if (rl.rlim_cur < rl.rlim_max) {
		struct rlimit want = {rl.rlim_max, rl.rlim_max};
		if (setrlimit(RLIMIT_NOFILE, &want) == 0)
			rl.rlim_cur = rl.rlim_max;
		else
			PC_LOGW(LOG_MOD, "setrlimit(RLIMIT_NOFILE, %llu): %s",
				(unsigned long long)rl.rlim_max,
				strerror(errno));
	}
	uint64_t caps = (uint64_t)s->rpc_max_connections +
			(uint64_t)s->rpc_max_preauth_connections +
			(uint64_t)s->rpc_max_local_connections +
			(uint64_t)s->metrics_max_connections +
			(uint64_t)s->data_max_connections + FD_HEADROOM;
	if (rl.rlim_cur == RLIM_INFINITY) {
		PC_LOGI(LOG_MOD, "file descriptors: unlimited");
		return;
	}
	PC_LOGI(LOG_MOD, "file descriptors: at most %llu",
		(unsigned long long)rl.rlim_cur);
	if (caps > rl.rlim_cur)
		PC_LOGW(LOG_MOD, "the connection caps (rpc_max_connections + "
			"rpc_max_preauth_connections + rpc_max_local_connections "
			"+ metrics_max_connections + data_max_connections + %d) "
			"add up to %llu, more than the %llu file descriptors "
			"this process may open: floods can then exhaust them "
			"(raise the hard limit, e.g. LimitNOFILE=, or lower "
			"the caps)", FD_HEADROOM, (unsigned long long)caps,
			(unsigned long long)rl.rlim_cur);
}

static const char sample_intro[] =
	"peercached configuration.\n"
	"\n"
	"Format: \"key = value\" per line; '#' starts a comment; values with "
	"spaces or '#' go in double quotes. Every key can also be given as "
	"--key on the command line or as PEERCACHE_<KEY> in the environment "
	"(those win over this file). Every key is listed below, commented "
	"out at its default: uncomment what you change, so that an upgrade's "
	"new defaults apply to the rest. `peercached --check-config FILE` "
	"checks a file; `peercached --config FILE --print-config` prints the "
	"effective settings. Generated by `peercached --print-config-sample`.";

/*
 * --check-config FILE: the file alone (defaults, then FILE; no environment,
 * no other option) must load and validate. Prints "FILE: ok" and the keys
 * it sets to something other than their default.
 */
static int check_config(const char *path)
{
	struct pc_settings s, d;
	char err[PC_CFG_ERR_MAX];
	char *args[] = {"peercached", "--config", (char *)path, NULL};
	char *noenv[] = {NULL};
	if (pc_settings_load(&s, 3, args, noenv, err, sizeof(err)) < 0 ||
	    pc_settings_validate(&s, err, sizeof(err)) < 0) {
		fprintf(stderr, "peercached: %s\n", err);
		pc_settings_free(&s);
		return 2;
	}
	if (pc_settings_defaults(&d, err, sizeof(err)) < 0) {
		fprintf(stderr, "peercached: %s\n", err);
		pc_settings_free(&s);
		return 1;
	}
	unsigned n = 0;
	for (size_t i = 0; i < pc_settings_table.n; i++)
		n += pc_cfg_differs(&pc_settings_table.keys[i], &s, &d);
	printf("%s: ok (%u key%s not at the default%s)\n", path, n,
	       n == 1 ? "" : "s", n ? ":" : "");
	for (size_t i = 0; i < pc_settings_table.n; i++)
		if (pc_cfg_differs(&pc_settings_table.keys[i], &s, &d))
			printf("  %s\n", pc_settings_table.keys[i].name);
	pc_settings_free(&s);
	pc_settings_free(&d);
	return 0;
}

/*
 * Keep freed buffers for reuse instead of giving them back to the kernel.
 * A kv.get's staged pages and its reply are buffers of up to tens of MiB,
 * allocated and freed per call. By default glibc maps such a buffer
 * fresh (or trims it off its heap once freed), so every call faults in
 * every page of both again: in a guest with shadow paging ~13 us a 4 KiB
 * page, and a reading node's reactor spent 75 ms on a 32 x 256 KiB
 * kv.get (0.11 GB/s; 2.1 GB/s with the buffers kept, bench/README.md
 * "Freed memory kept"). Below 32 MiB (the most glibc allows) allocations
 * come from its heaps, and each heap keeps up to its reactor's share of
 * kv_staging_max (what kv calls may hold at once; at least 64 MiB) of
 * free memory at its top, a call's buffers being taken and freed on its
 * reactor. The node's RSS then stays at its peak use of these buffers
 * instead of returning to idle; the pool, the bulk of the node, is mapped
 * on its own and unaffected.
 *
 * And no fastbins (M_MXFAST 0): glibc keeps small freed chunks in them
 * unmerged, and the next free of a chunk of 64 KiB or more, or malloc of
 * a large one, merges all of them at once (malloc_consolidate). A node
 * drops tens of thousands of directory records when its pool evicts a
 * batch of small pages, and that merge then ran in whatever callback came
 * next: 4-16 ms in an eviction flush or an accept (bench/README.md,
 * "Large session moves"). Without fastbins each small free merges as it
 * goes (tcache still serves the hot sizes); kv.*, session and p2p reads
 * measured no slower.
 */
static void keep_freed_memory(const struct pc_settings *s, unsigned threads)
{
	uint64_t keep = s->kv_staging_max / threads;
	if (keep > (1ull << 30))
		keep = 1ull << 30;
	if (keep < (64ull << 20))
		keep = 64ull << 20;
#if defined(__SANITIZE_ADDRESS__)
	/* ASan's allocator takes no mallopt (it answers 0): nothing to tune. */
	(void)keep;
#else
	if (!mallopt(M_MXFAST, 0))
		PC_LOGW(LOG_MOD, "mallopt(M_MXFAST, 0) refused; freeing many "
			"small records may stall a reactor for milliseconds");
	if (!mallopt(M_MMAP_THRESHOLD, 32 << 20) ||
	    !mallopt(M_TRIM_THRESHOLD, (int)keep))
		PC_LOGW(LOG_MOD, "mallopt refused; freed buffers go back to the "
			"kernel (kv.get pays page faults per call)");
#endif
}

int main(int argc, char **argv)
{
	pc_log_set_thread("main");
	if (has_flag(argc, argv, "--help") || has_flag(argc, argv, "-h")) {
		usage(stdout);
		return 0;
	}
	if (has_flag(argc, argv, "--print-config-sample")) {
		pc_cfg_print_sample(&pc_settings_table, sample_intro, stdout);
		return 0;
	}
	for (int i = 1; i < argc; i++) {
		bool missing = false;
		const char *f = pc_opt_value(argc, argv, &i, "--check-config",
					     &missing);
		if (missing) {
			fprintf(stderr, "peercached: --check-config needs a "
				"file path\n");
			return 2;
		}
		if (f)
			return check_config(f);
	}
	if (has_flag(argc, argv, "--version")) {
		printf("peercached %s (%s)\n", PEERCACHE_VERSION,
		       PEERCACHE_GIT_REV);
		return 0;
	}
	char **args = calloc((size_t)argc + 1, sizeof(*args));
	if (!args)
		return 1;
	int nargs = own_args(argc, argv, args);
	struct pc_settings s;
	char err[PC_CFG_ERR_MAX];
	if (pc_settings_load(&s, nargs, args, environ, err, sizeof(err)) < 0 ||
	    pc_settings_validate(&s, err, sizeof(err)) < 0) {
		fprintf(stderr, "peercached: %s\n", err);
		fprintf(stderr, "peercached: see 'peercached --help'\n");
		free(args);
		pc_settings_free(&s);
		return 2;
	}
	/* A copy for SIGHUP reloads, taken before the secret is blanked out
	 * of argv (the settings hold it in memory anyway). */
	char **keep = dup_args(nargs, args);
	free(args);
	scrub_secret_args(argc, argv);
	if (!keep) {
		pc_settings_free(&s);
		return 1;
	}
	if (has_flag(argc, argv, "--print-config")) {
		free_args(keep);
		if (*s.cluster_secret_file) /* print the file, not its secret */
			s.cluster_secret[0] = '\0';
		pc_cfg_dump(&pc_settings_table, &s, stdout);
		pc_settings_free(&s);
		return 0;
	}
	pc_log_set_level((enum pc_log_level)s.log_level);

	/* Block the stop and reload signals before any thread exists; main
	 * takes them. */
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);

	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned threads = s.threads ? (unsigned)s.threads
				     : (unsigned)(ncpu > 0 ? ncpu : 1);
	keep_freed_memory(&s, threads); /* before any thread allocates */
	int ret = pc_ctx_init(&g_ctx, &s, threads, pc_node_modules,
			      pc_node_modules_count);
	if (ret < 0) {
		pc_settings_free(&s);
		free_args(keep);
		return 1;
	}
	resolve_node_id(&g_ctx, &s);
	PC_LOGI(LOG_MOD, "peercached %s (%s) starting: node %s, mode %s, "
		"%u reactor thread%s", PEERCACHE_VERSION, PEERCACHE_GIT_REV,
		g_ctx.node_id, s.mode == PC_MODE_P2P ? "p2p" : "slotmap",
		threads, threads == 1 ? "" : "s");
	pc_settings_warn_inactive(&s);
	raise_fd_limit(&s);

	int status = 1;
	if ((ret = pc_modules_init(&g_ctx)) < 0)
		goto out_ctx;
	/* Every module registered its metrics in init: freeze the table. */
	if ((ret = met_start(threads)) < 0) {
		PC_LOGE(LOG_MOD, "metrics: %s", strerror(-ret));
		goto out_modules;
	}
	struct rx_params p;
	pc_server_reactor_params(&s, &p);
	struct rx_group_hooks hooks;
	pc_modules_group_hooks(&g_ctx, &hooks);
	struct rx_group *g;
	ret = rx_group_start(&g, threads, &p, &hooks);
	if (ret < 0) {
		PC_LOGE(LOG_MOD, "start-up failed: %s", strerror(-ret));
		goto out_modules;
	}
	__atomic_store_n(&g_ctx.group, g, __ATOMIC_RELEASE);
	/* Every module started on every reactor: /healthz and node.health
	 * say ok from now on, and the pool prefault may begin. */
	__atomic_store_n(&g_ctx.state, PC_NODE_READY, __ATOMIC_RELEASE);
	log_endpoints(&g_ctx);
	PC_LOGI(LOG_MOD, "node %s ready (Ctrl-C or SIGTERM stops it)",
		g_ctx.node_id);
	notify_systemd(pc_sd_notifyf("READY=1\nSTATUS=node %s ready",
				     g_ctx.node_id));
	pc_fault_alloc_arm(); /* test builds, when asked */
	ret = wait_for_stop(g, nargs, keep, &s);
	uint64_t alloc_failed = pc_fault_alloc_disarm();
	if (alloc_failed)
		PC_LOGW(LOG_MOD, "test-only allocation failures injected: %llu",
			(unsigned long long)alloc_failed);
	__atomic_store_n(&g_ctx.state, PC_NODE_STOPPING, __ATOMIC_RELEASE);
	__atomic_store_n(&g_ctx.group, NULL, __ATOMIC_RELEASE);
	int run_err = rx_group_join(g);
	if (ret < 0)
		PC_LOGE(LOG_MOD, "reactors stopped on their own%s%s",
			run_err ? ": " : "", run_err ? strerror(-run_err) : "");
	else
		status = run_err ? 1 : 0;
out_modules:
	pc_modules_fini(&g_ctx);
out_ctx:
	met_reset();
	pc_ctx_fini(&g_ctx);
	pc_settings_free(&s);
	free_args(keep);
	if (status == 0)
		PC_LOGI(LOG_MOD, "stopped cleanly");
	return status;
}
