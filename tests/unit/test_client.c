/*
 * tests/unit/test_client.c — libpeercache against a real peercached: shared
 * regions, set/get by offset, exists/delete, many threads at once, bad
 * arguments, and a node that goes away and comes back.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/peercache.h"
#include "testutil.h"

extern char **environ;

static char g_sock[108];
static pid_t g_node; /* the running node, stopped by teardown on failure */

/* Ready when the socket accepts: a socket file alone may be a stale one
 * (a node of an earlier run with the same pid). */
static bool node_ready(void)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", g_sock);
	bool ok = fd >= 0 &&
		  connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

static pid_t node_start(void)
{
	char *argv[] = {PC_PEERCACHED_BIN, "--rpc-port", "0", "--data-port",
			"0", "--metrics-port", "0", "--threads", "2",
			"--pool-size", "64mb", "--log-level", "warn",
			"--socket", g_sock, NULL};
	pid_t pid;
	unlink(g_sock);
	cr_assert_eq(posix_spawn(&pid, argv[0], NULL, NULL, argv, environ), 0);
	g_node = pid;
	for (int i = 0; i < 500; i++) { /* wait for the socket */
		if (node_ready())
			return pid;
		usleep(10000);
	}
	cr_assert_fail("peercached did not listen on %s", g_sock);
	return -1;
}

static void node_stop(pid_t pid)
{
	int status;
	kill(pid, SIGTERM);
	g_node = 0;
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		  "peercached did not stop cleanly (status 0x%x)", status);
}

static struct pcache *open_client(void)
{
	struct pcache_opts o = {.socket_path = g_sock, .timeout_ms = 5000};
	struct pcache *pc;
	cr_assert_eq(pcache_open(&o, &pc), 0);
	return pc;
}

static void setup(void)
{
	snprintf(g_sock, sizeof(g_sock), "/tmp/pc-client-test-%d.sock",
		 (int)getpid());
}

/* A failed assertion skips the test's node_stop: never leave the node
 * running (it would hold the test runner's output open). */
static void teardown(void)
{
	if (g_node > 0) {
		kill(g_node, SIGKILL);
		waitpid(g_node, NULL, 0);
		g_node = 0;
	}
	unlink(g_sock);
}

TestSuite(client, .init = setup, .fini = teardown);

enum { PAGE = 64 * 1024, PAGES = 32 };

static void fill_items(struct pcache_item *it, char keys[][32], int n,
		       const char *prefix, uint64_t base_off)
{
	for (int i = 0; i < n; i++) {
		snprintf(keys[i], 32, "%s-%d", prefix, i);
		it[i] = (struct pcache_item){keys[i], strlen(keys[i]),
					     base_off + (uint64_t)i * PAGE, PAGE};
	}
}

Test(client, set_get_exists_delete_through_shared_memory)
{
	pid_t node = node_start();
	struct pcache *pc = open_client();
	void *addr;
	uint32_t region;
	cr_assert_eq(pcache_region_create(pc, 2 * PAGES * PAGE, &addr, &region),
		     0);
	uint8_t *mem = addr;
	tu_fill_pattern(mem, PAGES * PAGE, 42, 0);
	struct pcache_item in[PAGES], out[PAGES];
	char keys[PAGES][32], keys2[PAGES][32];
	bool ok[PAGES];
	fill_items(in, keys, PAGES, "page", 0);
	cr_assert_eq(pcache_set(pc, region, in, PAGES, ok), 0, "%s",
		     pcache_last_error());
	for (int i = 0; i < PAGES; i++)
		cr_assert(ok[i]);
	/* Read them into the second half of the region. */
	fill_items(out, keys2, PAGES, "page", (uint64_t)PAGES * PAGE);
	cr_assert_eq(pcache_get(pc, region, out, PAGES, ok), 0);
	for (int i = 0; i < PAGES; i++)
		cr_assert(ok[i]);
	cr_assert_eq(memcmp(mem, mem + PAGES * PAGE, PAGES * PAGE), 0);
	/* A wrong length is a miss, not a truncated page. */
	struct pcache_item bad = out[0];
	bad.len = PAGE / 2;
	cr_assert_eq(pcache_get(pc, region, &bad, 1, ok), 0);
	cr_assert(!ok[0]);
	const char *ks[3] = {"page-0", "page-1", "nope"};
	size_t kl[3] = {6, 6, 4}, count;
	cr_assert_eq(pcache_exists(pc, ks, kl, 3, &count), 0);
	cr_assert_eq(count, 2);
	cr_assert_eq(pcache_delete(pc, ks, kl, 3, &count), 0);
	cr_assert_eq(count, 2);
	cr_assert_eq(pcache_exists(pc, ks, kl, 1, &count), 0);
	cr_assert_eq(count, 0);
	char info[1024];
	cr_assert_eq(pcache_info(pc, info, sizeof(info)), 0);
	cr_assert(strstr(info, "mode: p2p"), "%s", info);
	struct pcache_stats st;
	pcache_stats(pc, &st);
	cr_assert_eq(st.pages_set_ok, PAGES);
	cr_assert_eq(st.registrations, st.connections, "one per connection");
	pcache_close(pc);
	node_stop(node);
}

Test(client, bad_arguments_are_refused_cleanly)
{
	pid_t node = node_start();
	struct pcache *pc = open_client();
	void *addr;
	uint32_t region;
	bool ok[1];
	cr_assert_eq(pcache_region_create(pc, PAGE, &addr, &region), 0);
	/* Outside the region: the node says so; nothing crashes. */
	struct pcache_item it = {"k", 1, PAGE / 2, PAGE};
	cr_assert_eq(pcache_set(pc, region, &it, 1, ok), -EREMOTEIO);
	cr_assert(strstr(pcache_last_error(), "outside its region"), "%s",
		  pcache_last_error());
	/* Unknown region, empty key, zero length. */
	it = (struct pcache_item){"k", 1, 0, PAGE};
	cr_assert_eq(pcache_set(pc, region + 7, &it, 1, ok), -EINVAL);
	it.keylen = 0;
	cr_assert_eq(pcache_set(pc, region, &it, 1, ok), -EINVAL);
	/* A descriptor that is not shared memory (a pipe) is refused. */
	int p[2];
	cr_assert_eq(pipe(p), 0);
	uint32_t r2;
	cr_assert_eq(pcache_region_add(pc, p[0], 4096, &r2), 0);
	it = (struct pcache_item){"k", 1, 0, 16};
	cr_assert_eq(pcache_set(pc, r2, &it, 1, ok), -EREMOTEIO);
	cr_assert(strstr(pcache_last_error(), "not a memfd"), "%s",
		  pcache_last_error());
	close(p[0]);
	close(p[1]);
	/* The client still works. */
	it = (struct pcache_item){"k", 1, 0, 16};
	cr_assert_eq(pcache_set(pc, region, &it, 1, ok), 0);
	cr_assert(ok[0]);
	pcache_close(pc);
	node_stop(node);
}

struct worker {
	struct pcache *pc;
	uint32_t region;
	uint8_t *mem;
	int id;
	int errors;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	enum { N = 8 };
	for (int round = 0; round < 20; round++) {
		struct pcache_item it[N], back[N];
		char keys[N][32], keys2[N][32];
		bool ok[N];
		uint64_t base = (uint64_t)w->id * 2 * N * 4096;
		for (int i = 0; i < N; i++) {
			snprintf(keys[i], 32, "w%d-r%d-%d", w->id, round, i);
			it[i] = (struct pcache_item){keys[i], strlen(keys[i]),
						     base + (uint64_t)i * 4096,
						     4096};
			tu_fill_pattern(w->mem + it[i].offset, 4096,
					(uint64_t)(w->id * 1000 + round), i);
			snprintf(keys2[i], 32, "%s", keys[i]);
			back[i] = it[i];
			back[i].key = keys2[i];
			back[i].offset += N * 4096;
		}
		if (pcache_set(w->pc, w->region, it, N, ok) < 0)
			w->errors++;
		if (pcache_get(w->pc, w->region, back, N, ok) < 0)
			w->errors++;
		for (int i = 0; i < N; i++)
			if (!ok[i] || tu_check_pattern(w->mem + back[i].offset,
						       4096,
						       (uint64_t)(w->id * 1000 +
								  round),
						       i) != -1)
				w->errors++;
	}
	return NULL;
}

Test(client, many_threads_share_one_client)
{
	pid_t node = node_start();
	struct pcache *pc = open_client();
	void *addr;
	uint32_t region;
	cr_assert_eq(pcache_region_create(pc, 8 * 2 * 8 * 4096, &addr, &region),
		     0);
	struct worker w[8];
	pthread_t th[8];
	for (int i = 0; i < 8; i++) {
		w[i] = (struct worker){pc, region, addr, i, 0};
		pthread_create(&th[i], NULL, worker_main, &w[i]);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(th[i], NULL);
		cr_assert_eq(w[i].errors, 0, "thread %d: %d errors", i,
			     w[i].errors);
	}
	pcache_close(pc);
	node_stop(node);
}

Test(client, a_node_that_restarts_is_found_again)
{
	pid_t node = node_start();
	struct pcache *pc = open_client();
	void *addr;
	uint32_t region;
	bool ok[1];
	cr_assert_eq(pcache_region_create(pc, PAGE, &addr, &region), 0);
	struct pcache_item it = {"restart", 7, 0, PAGE};
	cr_assert_eq(pcache_set(pc, region, &it, 1, ok), 0);
	node_stop(node);
	int ret = pcache_set(pc, region, &it, 1, ok);
	cr_assert(ret == -ENOENT || ret == -ECONNREFUSED || ret == -ECONNRESET,
		  "node down: %d (%s)", ret, pcache_last_error());
	node = node_start();
	/* Reconnects and registers the region on the new connection. */
	cr_assert_eq(pcache_set(pc, region, &it, 1, ok), 0, "%s",
		     pcache_last_error());
	cr_assert(ok[0]);
	pcache_close(pc);
	node_stop(node);
}

/* A client that truncates its (unsealed) memfd while the node copies from
 * it fails its own request; the node keeps serving. */
Test(client, a_client_that_shrinks_its_memory_fails_only_itself)
{
	pid_t node = node_start();
	struct pcache *pc = open_client();
	int fd = memfd_create("shrink", MFD_CLOEXEC);
	cr_assert(fd >= 0);
	cr_assert_eq(ftruncate(fd, 4 * PAGE), 0);
	uint8_t *mem = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED,
			    fd, 0);
	cr_assert(mem != MAP_FAILED);
	memset(mem, 0x5a, 4 * PAGE);
	uint32_t region;
	cr_assert_eq(pcache_region_add(pc, fd, 4 * PAGE, &region), 0);
	struct pcache_item it[2] = {{"shrink-a", 8, 0, PAGE},
				    {"shrink-b", 8, 2 * PAGE, PAGE}};
	bool ok[2];
	cr_assert_eq(pcache_set(pc, region, it, 1, ok), 0, "%s",
		     pcache_last_error());
	cr_assert(ok[0]);
	munmap(mem, 4 * PAGE);
	cr_assert_eq(ftruncate(fd, PAGE), 0); /* the node's mapping now ends */
	/* set reads past the end; get writes past it: both SIGBUS in the
	 * node without the guard. */
	cr_assert_eq(pcache_set(pc, region, &it[1], 1, ok), 0, "%s",
		     pcache_last_error());
	cr_assert(!ok[0], "a page the node could not read was stored");
	struct pcache_item back = {"shrink-a", 8, 3 * PAGE, PAGE};
	cr_assert_eq(pcache_get(pc, region, &back, 1, ok), 0, "%s",
		     pcache_last_error());
	cr_assert(!ok[0], "a page landed in memory that is gone");
	close(fd);
	/* The node is alive and serves: a fresh region works. */
	void *addr;
	uint32_t r2;
	cr_assert_eq(pcache_region_create(pc, PAGE, &addr, &r2), 0);
	back.offset = 0;
	cr_assert_eq(pcache_get(pc, r2, &back, 1, ok), 0, "%s",
		     pcache_last_error());
	cr_assert(ok[0]);
	cr_assert_eq(((uint8_t *)addr)[PAGE - 1], 0x5a);
	pcache_close(pc);
	node_stop(node);
}
