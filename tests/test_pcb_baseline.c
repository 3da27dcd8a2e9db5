/*
 * tests/test_pcb_baseline.c — peercache-bench's baseline targets
 * (bench/tool/be_redis.c, be_memcached.c over net.c) against a real
 * redis-server and memcached that each test starts on a free loopback port
 * and kills by PID at its end (the server also dies with the test process:
 * PR_SET_PDEATHSIG). A missing binary skips the test and says which.
 *
 * Owns: g_srv, the one server of the test process (Criterion runs each test
 * in its own process).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pcb.h"

#define NPAGES 8
#define TIMEOUT_MS 10000 /* generous: a loaded CI machine, sanitizers */

struct server {
	pid_t pid;
	char addr[32]; /* "127.0.0.1:port" */
};
static struct server g_srv = {.pid = -1};

static void stop_server(void)
{
	if (g_srv.pid > 0) {
		kill(g_srv.pid, SIGKILL);
		waitpid(g_srv.pid, NULL, 0);
		g_srv.pid = -1;
	}
}

/* The binary's path in PATH, or NULL. */
static char *find_bin(const char *name, char *out, size_t len)
{
	const char *path = getenv("PATH");
	char dirs[4096];

	snprintf(dirs, sizeof(dirs), "%s:/usr/sbin:/usr/bin",
		 path ? path : "");
	for (char *save, *d = strtok_r(dirs, ":", &save); d;
	     d = strtok_r(NULL, ":", &save)) {
		snprintf(out, len, "%s/%s", d, name);
		if (access(out, X_OK) == 0)
			return out;
	}
	return NULL;
}

/* A port nobody listens on now: bind 127.0.0.1:0, read it, close. */
static unsigned free_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET,
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	cr_assert(fd >= 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	close(fd);
	return ntohs(a.sin_port);
}

/* true when process pid listens on 127.0.0.1:port: the LISTEN socket of
 * that port in /proc/net/tcp is one of pid's descriptors. Parallel tests
 * may draw the same free port; a server that lost the race exits, and
 * only the one that won counts. */
static bool listens(pid_t pid, unsigned port)
{
	FILE *f = fopen("/proc/net/tcp", "r");
	char line[512], path[64], link[64], want[48] = "";
	unsigned long inode;
	unsigned lport, st;

	if (!f)
		return false;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, " %*u: %*x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x "
			   "%*u %*u %lu", &lport, &st, &inode) == 3 &&
		    lport == port && st == 0x0A)
			snprintf(want, sizeof(want), "socket:[%lu]", inode);
	fclose(f);
	if (!want[0])
		return false;
	for (int fd = 0; fd < 1024; fd++) {
		snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, fd);
		ssize_t n = readlink(path, link, sizeof(link) - 1);
		if (n > 0 && (link[n] = '\0', strcmp(link, want) == 0))
			return true;
	}
	return false;
}

/* Start argv (its port given by port) and wait until it listens: true, or
 * false when it exited first (the port was taken: the caller retries). */
static bool spawn(char **argv, unsigned port)
{
	pid_t parent = getpid();
	pid_t pid = fork();

	cr_assert(pid >= 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		int devnull = open("/dev/null", O_WRONLY);
		if (devnull >= 0)
			dup2(devnull, STDOUT_FILENO);
		execv(argv[0], argv);
		_exit(127);
	}
	g_srv.pid = pid;
	snprintf(g_srv.addr, sizeof(g_srv.addr), "127.0.0.1:%u", port);
	for (int i = 0; i < 3000; i++) { /* 30 s at most */
		if (waitpid(pid, NULL, WNOHANG) == pid) {
			g_srv.pid = -1;
			return false;
		}
		if (listens(pid, port))
			return true;
		nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
	}
	cr_assert_fail("%s did not accept on port %u within 30 s", argv[0], port);
	return false;
}

/* Start the server name with args (NULL-terminated; "PORT" stands for its
 * port), on a free port: a missing binary skips the test. */
static void start_server(const char *name, const char *const *args)
{
	char bin[512], port[16];
	char *argv[24];

	if (!find_bin(name, bin, sizeof(bin)))
		cr_skip_test("%s not found in PATH: install Debian's package %s "
			     "(scripts/deps.sh test)", name, name);
	for (int attempt = 0; attempt < 3; attempt++) {
		unsigned p = free_port(), n = 0;
		snprintf(port, sizeof(port), "%u", p);
		argv[n++] = bin;
		for (; args[n - 1] && n < 23; n++)
			argv[n] = strcmp(args[n - 1], "PORT") == 0
					  ? port
					  : (char *)args[n - 1];
		argv[n] = NULL;
		if (spawn(argv, p))
			return;
	}
	cr_assert_fail("%s exited before accepting, 3 times", name);
}

/* A redis-server without persistence; extra (two words) or NULL. */
static void start_redis(const char *extra1, const char *extra2)
{
	const char *args[] = {"--port", "PORT", "--bind", "127.0.0.1",
			      "--save", "", "--appendonly", "no",
			      extra1, extra2, NULL};
	start_server("redis-server", args);
}

/* A memcached with items up to 4 MiB (as root it wants -u). */
static void start_memcached(void)
{
	const char *args[] = {"-l", "127.0.0.1", "-p", "PORT", "-U", "0",
			      "-m", "64", "-I", "4m",
			      geteuid() == 0 ? "-u" : NULL, "root", NULL};
	start_server("memcached", args);
}

/* ------------------------------------------------------------ the client */

struct client {
	const struct pcb_backend *be;
	void *proc;
	struct pcb_conn *c;
	uint64_t page;
	char keybuf[NPAGES][64];
	char *keys[NPAGES];
	size_t lens[NPAGES];
};

static void open_client(struct client *cl, const struct pcb_backend *be,
			uint64_t page, unsigned timeout_ms)
{
	struct pcb_target t = {.addr = g_srv.addr, .timeout_ms = timeout_ms,
			       .page_bytes = page, .batch = NPAGES};
	char err[256] = "";

	memset(cl, 0, sizeof(*cl));
	cl->be = be;
	cl->page = page;
	cr_assert_eq(be->proc_open(&t, 1, &cl->proc, err, sizeof(err)), 0,
		     "proc_open: %s", err);
	cr_assert_eq(be->conn_open(cl->proc, 0, &cl->c, err, sizeof(err)), 0,
		     "conn_open: %s", err);
	cr_assert_not_null(cl->c->buf);
}

static void close_client(struct client *cl)
{
	cl->be->conn_close(cl->c);
	cl->be->proc_close(cl->proc);
}

/* Keys "t/p/<first + i>" for slots 0..n-1. */
static void name_keys(struct client *cl, unsigned first, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		snprintf(cl->keybuf[i], sizeof(cl->keybuf[i]), "t/p/%zu",
			 first + i);
		cl->keys[i] = cl->keybuf[i];
		cl->lens[i] = strlen(cl->keybuf[i]);
	}
}

static void set_key(struct client *cl, size_t i, const char *key)
{
	snprintf(cl->keybuf[i], sizeof(cl->keybuf[i]), "%s", key);
	cl->lens[i] = strlen(cl->keybuf[i]);
}

/* The test's own page content: a xorshift stream seeded by the index. */
static void fill(uint8_t *p, uint64_t len, uint64_t index)
{
	uint64_t x = index * 0x9E3779B97F4A7C15ull + 0x1234567;

	for (uint64_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (uint8_t)x;
	}
}

static bool holds(const uint8_t *p, uint64_t len, uint64_t index)
{
	uint8_t *want = malloc(len);
	bool ok;

	cr_assert_not_null(want);
	fill(want, len, index);
	ok = memcmp(p, want, len) == 0;
	free(want);
	return ok;
}

static bool all_bytes(const uint8_t *p, uint64_t len, uint8_t v)
{
	for (uint64_t i = 0; i < len; i++)
		if (p[i] != v)
			return false;
	return true;
}

static int call(struct client *cl, const char *op, size_t n, size_t *hits)
{
	const struct pcb_backend *be = cl->be;
	int (*fn)(struct pcb_conn *, char *const *, const size_t *, size_t,
		  size_t *) = strcmp(op, "get") == 0   ? be->get
			      : strcmp(op, "set") == 0 ? be->set
						       : be->exists;
	return fn(cl->c, cl->keys, cl->lens, n, hits);
}

/* Store pages first..first+n-1 (content of their index). */
static void store(struct client *cl, unsigned first, size_t n)
{
	size_t hits = 0;

	name_keys(cl, first, n);
	for (size_t i = 0; i < n; i++)
		fill(cl->c->buf + i * cl->page, cl->page, first + i);
	int rc = call(cl, "set", n, &hits);
	cr_assert_eq(rc, 0, "set: %d %s", rc, cl->c->err);
	cr_assert_eq(hits, n, "set stored %zu of %zu: %s", hits, n,
		     cl->c->err);
}

/* ------------------------------------------------------------- scenarios */

static void roundtrip(const struct pcb_backend *be, uint64_t page)
{
	struct client cl;
	size_t hits = 0;

	open_client(&cl, be, page, TIMEOUT_MS);
	store(&cl, 0, NPAGES);
	memset(cl.c->buf, 0, NPAGES * page);
	int rc = call(&cl, "get", NPAGES, &hits);
	cr_assert_eq(rc, 0, "get: %d %s", rc, cl.c->err);
	cr_assert_eq(hits, NPAGES);
	for (unsigned i = 0; i < NPAGES; i++)
		cr_assert(holds(cl.c->buf + i * page, page, i),
			  "%s page %u (%llu bytes) came back different",
			  be->target, i, (unsigned long long)page);
	close_client(&cl);
}

static void roundtrips(const struct pcb_backend *be)
{
	roundtrip(be, 256 * 1024); /* past the reader's buffer */
	roundtrip(be, 1000);       /* through it */
}

/* A missing key in the middle: 7 hits, its slot left as it was; exists
 * counts the run before the gap. */
static void gap(const struct pcb_backend *be)
{
	const uint64_t page = 4096;
	struct client cl;
	size_t hits = 99;

	open_client(&cl, be, page, TIMEOUT_MS);
	store(&cl, 0, NPAGES);
	set_key(&cl, 3, "t/p/missing");
	memset(cl.c->buf, 0xAB, NPAGES * page);
	cr_assert_eq(call(&cl, "get", NPAGES, &hits), 0, "%s", cl.c->err);
	cr_assert_eq(hits, NPAGES - 1);
	for (unsigned i = 0; i < NPAGES; i++) {
		if (i == 3)
			cr_assert(all_bytes(cl.c->buf + i * page, page, 0xAB),
				  "the missing key's slot was written");
		else
			cr_assert(holds(cl.c->buf + i * page, page, i));
	}
	cr_assert_eq(call(&cl, "exists", NPAGES, &hits), 0, "%s", cl.c->err);
	cr_assert_eq(hits, 3, "exists counted %zu, not the 3 before the gap",
		     hits);
	name_keys(&cl, 0, NPAGES);
	cr_assert_eq(call(&cl, "exists", NPAGES, &hits), 0, "%s", cl.c->err);
	cr_assert_eq(hits, NPAGES);
	set_key(&cl, 0, "t/p/missing");
	cr_assert_eq(call(&cl, "exists", NPAGES, &hits), 0, "%s", cl.c->err);
	cr_assert_eq(hits, 0);
	/* n == 0 asks nothing */
	cr_assert_eq(call(&cl, "get", 0, &hits), 0);
	cr_assert_eq(hits, 0);
	close_client(&cl);
}

/* Values of another size (stored through a client of that page size) are
 * misses, their slots untouched, and the connection stays usable. */
static void wrong_size(const struct pcb_backend *be)
{
	const uint64_t page = 8192;
	struct client cl, small, big;
	size_t hits;

	open_client(&cl, be, page, TIMEOUT_MS);
	open_client(&small, be, page / 2, TIMEOUT_MS);
	open_client(&big, be, page * 2 + 100, TIMEOUT_MS);
	store(&cl, 0, NPAGES);
	store(&small, 100, 1);
	store(&big, 200, 1);
	name_keys(&cl, 0, NPAGES);
	set_key(&cl, 2, "t/p/100");
	set_key(&cl, 5, "t/p/200");
	memset(cl.c->buf, 0xCD, NPAGES * page);
	cr_assert_eq(call(&cl, "get", NPAGES, &hits), 0, "%s", cl.c->err);
	cr_assert_eq(hits, NPAGES - 2);
	for (unsigned i = 0; i < NPAGES; i++) {
		if (i == 2 || i == 5)
			cr_assert(all_bytes(cl.c->buf + i * page, page, 0xCD),
				  "slot %u of a wrong-size value was written", i);
		else
			cr_assert(holds(cl.c->buf + i * page, page, i));
	}
	name_keys(&cl, 0, NPAGES);
	cr_assert_eq(call(&cl, "get", NPAGES, &hits), 0, "%s", cl.c->err);
	cr_assert_eq(hits, NPAGES);
	close_client(&big);
	close_client(&small);
	close_client(&cl);
}

/* A killed server: a clean -ECONNRESET, then the connection refuses more
 * calls and a new one is refused. */
static void killed(const struct pcb_backend *be)
{
	struct client cl;
	struct pcb_conn *again = NULL;
	char err[256] = "";
	size_t hits;

	open_client(&cl, be, 4096, TIMEOUT_MS);
	store(&cl, 0, NPAGES);
	stop_server();
	int rc = call(&cl, "get", NPAGES, &hits);
	cr_assert_eq(rc, -ECONNRESET, "get from a killed server: %d (%s)", rc,
		     cl.c->err);
	cr_assert(strstr(cl.c->err, "closed"), "err: %s", cl.c->err);
	cr_assert_eq(call(&cl, "exists", NPAGES, &hits), -ENOTCONN);
	rc = be->conn_open(cl.proc, 1, &again, err, sizeof(err));
	cr_assert_eq(rc, -ECONNREFUSED, "conn_open: %d (%s)", rc, err);
	cr_assert_null(again);
	close_client(&cl);
}

/* SIGSTOP pid and wait until every one of its threads has stopped: kill()
 * returns before that, and a worker thread still running (memcached's)
 * could answer the next request. */
static void freeze(pid_t pid)
{
	char dir[64];
	cr_assert_eq(kill(pid, SIGSTOP), 0);
	snprintf(dir, sizeof(dir), "/proc/%d/task", (int)pid);
	for (int tries = 0; tries < 2000; tries++) {
		DIR *d = opendir(dir);
		cr_assert_not_null(d);
		bool all = true, any = false;
		struct dirent *e;
		while ((e = readdir(d))) {
			if (e->d_name[0] == '.')
				continue;
			char path[384], buf[512];
			snprintf(path, sizeof(path), "%s/%s/stat", dir,
				 e->d_name);
			FILE *f = fopen(path, "r");
			if (!f)
				continue;
			size_t n = fread(buf, 1, sizeof(buf) - 1, f);
			fclose(f);
			buf[n] = '\0';
			const char *rp = strrchr(buf, ')');
			any = true;
			if (!rp || (rp[2] != 'T' && rp[2] != 't'))
				all = false;
		}
		closedir(d);
		if (any && all)
			return;
		usleep(5000);
	}
	cr_assert_fail("process %d did not stop within 10 s", (int)pid);
}

/* A stopped server (SIGSTOP): the call gives up at its timeout. */
static void stalled(const struct pcb_backend *be)
{
	struct client cl;
	size_t hits;

	open_client(&cl, be, 4096, 300);
	name_keys(&cl, 0, NPAGES);
	freeze(g_srv.pid);
	int rc = call(&cl, "get", NPAGES, &hits);
	cr_assert_eq(rc, -ETIMEDOUT, "get from a stopped server: %d (%s)", rc,
		     cl.c->err);
	cr_assert(strstr(cl.c->err, "no answer within 300 ms"), "err: %s",
		  cl.c->err);
	close_client(&cl);
}

/* ---------------------------------------------------------------- tests */

TestSuite(redis, .fini = stop_server);
TestSuite(memcached, .fini = stop_server);

/* The scenarios every target passes. */
#define BOTH(scenario)                                                  \
	Test(redis, scenario)                                           \
	{                                                               \
		start_redis(NULL, NULL);                                \
		scenario(&pcb_be_redis);                                \
	}                                                               \
	Test(memcached, scenario)                                       \
	{                                                               \
		start_memcached();                                      \
		scenario(&pcb_be_memcached);                            \
	}

BOTH(roundtrips)
BOTH(gap)
BOTH(wrong_size)
BOTH(killed)
BOTH(stalled)

/* Error replies fail the call with the server's text; a pipeline's replies
 * are all read, so the connection stays usable. */
Test(redis, error_reply)
{
	struct client cl;
	size_t hits;

	start_redis("--requirepass", "not-given");
	open_client(&cl, &pcb_be_redis, 4096, TIMEOUT_MS);
	name_keys(&cl, 0, NPAGES);
	for (int round = 0; round < 2; round++) {
		const char *ops[] = {"get", "set", "exists"};
		for (unsigned i = 0; i < 3; i++) {
			int rc = call(&cl, ops[i], NPAGES, &hits);
			cr_assert_eq(rc, -EREMOTEIO, "%s: %d (%s)", ops[i], rc,
				     cl.c->err);
			cr_assert(strstr(cl.c->err, "NOAUTH"), "err: %s",
				  cl.c->err);
		}
	}
	close_client(&cl);
}

/* Keys the text protocol cannot carry fail with -EINVAL before anything is
 * sent; the connection stays usable. */
Test(memcached, bad_keys)
{
	struct client cl;
	char longkey[252];
	size_t hits;

	start_memcached();
	open_client(&cl, &pcb_be_memcached, 4096, TIMEOUT_MS);
	store(&cl, 0, NPAGES);
	memset(longkey, 'k', 251);
	longkey[251] = '\0';
	const char *bad[] = {"t/p/a b", "t/p/a\nb", "t/p/\x7f", longkey};
	for (unsigned b = 0; b < 4; b++) {
		const char *ops[] = {"get", "set", "exists"};
		for (unsigned i = 0; i < 3; i++) {
			name_keys(&cl, 0, NPAGES);
			cl.keys[4] = (char *)bad[b];
			cl.lens[4] = strlen(bad[b]);
			int rc = call(&cl, ops[i], NPAGES, &hits);
			cr_assert_eq(rc, -EINVAL, "%s of key %u: %d (%s)",
				     ops[i], b, rc, cl.c->err);
			cr_assert(strstr(cl.c->err, "key 4"), "err: %s",
				  cl.c->err);
		}
	}
	cr_assert(strstr(cl.c->err, "250"), "err: %s", cl.c->err);
	name_keys(&cl, 0, NPAGES);
	cr_assert_eq(call(&cl, "get", NPAGES, &hits), 0, "%s", cl.c->err);
	cr_assert_eq(hits, NPAGES);
	close_client(&cl);
}

/* Pages over memcached's item limit (-I 4m here) are not stored: misses,
 * not a failed call, with the reason left in c->err. Under the limit, a
 * large page goes through whole. */
Test(memcached, item_limit)
{
	struct client cl;
	size_t hits = 99;

	start_memcached();
	open_client(&cl, &pcb_be_memcached, 5u << 20, TIMEOUT_MS);
	name_keys(&cl, 0, 2);
	int rc = call(&cl, "set", 2, &hits);
	cr_assert_eq(rc, 0, "set of 5 MiB pages: %d (%s)", rc, cl.c->err);
	cr_assert_eq(hits, 0);
	cr_assert(strstr(cl.c->err, "too large"), "err: %s", cl.c->err);
	cr_assert(strstr(cl.c->err, "1 MiB"), "err: %s", cl.c->err);
	cr_assert_eq(call(&cl, "exists", 2, &hits), 0, "%s", cl.c->err);
	cr_assert_eq(hits, 0);
	close_client(&cl);
	roundtrip(&pcb_be_memcached, 3u << 20);
}

/* Addresses: host:port, a name, [v6]:port, a bare IPv6 address, a host
 * alone (the default port); malformed ones fail with a message. */
Test(net, addresses)
{
	const char *good[] = {"127.0.0.1:6379", "localhost:1", "localhost",
			      "[::1]:6379", "::1", "127.0.0.1"};
	const char *bad[] = {"[::1", "[::1]x", "localhost:", ":6379"};
	char err[256];
	void *proc;

	for (unsigned i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		struct pcb_target t = {.addr = good[i], .timeout_ms = 100,
				       .page_bytes = 4096, .batch = 4};
		err[0] = '\0';
		cr_assert_eq(pcb_be_redis.proc_open(&t, 1, &proc, err,
						    sizeof(err)), 0,
			     "%s: %s", good[i], err);
		pcb_be_redis.proc_close(proc);
	}
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct pcb_target t = {.addr = bad[i], .timeout_ms = 100,
				       .page_bytes = 4096, .batch = 4};
		err[0] = '\0';
		cr_assert_eq(pcb_be_memcached.proc_open(&t, 1, &proc, err,
							sizeof(err)), -EINVAL,
			     "%s was taken", bad[i]);
		cr_assert(strstr(err, bad[i]), "err: %s", err);
	}
}

