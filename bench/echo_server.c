/*
 * bench/echo_server.c — pc-echo-server: an echo service on the reactor, for
 * the reactor benchmark (bench/echo_bench.sh) and as a usage example.
 *
 * Owns: its listeners (one per reactor, SO_REUSEPORT) and connections.
 * Each reactor thread echoes what its connections send, through the same
 * receive path (provided buffers) and send queue (one sendmsg per connection
 * per loop iteration) that the node uses. Prints "listening <host>:<port>"
 * on stdout once every reactor is ready; stops on SIGINT/SIGTERM.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "reactor/group.h"

static const char *g_host = "127.0.0.1";
static unsigned g_port;
static uint16_t g_bound;

static ssize_t echo_data(struct rx_conn *c, const uint8_t *data, size_t len)
{
	int ret = rx_conn_write(c, data, len);
	return ret < 0 ? ret : (ssize_t)len;
}

static const struct rx_conn_ops echo_ops = {.on_data = echo_data};

static void on_accept(struct rx_listener *l, int fd, void *arg)
{
	int err;
	(void)arg;
	rx_conn_attach(rx_listener_reactor(l), fd, &echo_ops, NULL, &err);
}

static int start(struct rx_reactor *r, void *arg)
{
	int err;
	(void)arg;
	/* Reactor 0 picks the port (maybe 0 = any); the others join it. */
	uint16_t port = rx_reactor_id(r) == 0 ? (uint16_t)g_port : g_bound;
	struct rx_listener *l = rx_listen_tcp(r, g_host, port, true, 4096,
					      on_accept, NULL, &err);
	if (!l)
		return err;
	if (rx_reactor_id(r) == 0)
		g_bound = rx_listener_port(l);
	return 0;
}

int main(int argc, char **argv)
{
	unsigned threads = 1;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--port") && i + 1 < argc)
			g_port = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			threads = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--host") && i + 1 < argc)
			g_host = argv[++i];
		else {
			fprintf(stderr, "usage: pc-echo-server [--host H] "
				"[--port P] [--threads N]\n");
			return strcmp(argv[i], "--help") ? 2 : 0;
		}
	}
	if (threads == 0 || threads > 256 || g_port > 65535) {
		fprintf(stderr, "pc-echo-server: bad --threads or --port\n");
		return 2;
	}
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
	struct rx_params p;
	rx_params_default(&p);
	struct rx_group_hooks h = {.thread_start = start};
	struct rx_group *g;
	int ret = rx_group_start(&g, threads, &p, &h);
	if (ret < 0) {
		fprintf(stderr, "pc-echo-server: start failed: %s\n",
			strerror(-ret));
		return 1;
	}
	printf("listening %s:%u\n", g_host, g_bound);
	fflush(stdout);
	int sig;
	sigwait(&set, &sig);
	rx_group_stop(g);
	return rx_group_join(g) ? 1 : 0;
}
