/*
 * tests/unit/testutil.c — see testutil.h.
 */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/buf.h"
#include "rpc/client.h"
#include "rpc/mp.h"
#include "rpc/msg.h"

static inline uint8_t pattern_byte(uint64_t seed, uint64_t pos)
{
	uint64_t x = (seed ^ (pos / 8)) * 0x9E3779B97F4A7C15ull;
	x ^= x >> 29;
	return (uint8_t)(x >> ((pos % 8) * 8));
}

void tu_fill_pattern(uint8_t *buf, size_t len, uint64_t seed, uint64_t offset)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = pattern_byte(seed, offset + i);
}

long tu_check_pattern(const uint8_t *buf, size_t len, uint64_t seed,
		      uint64_t offset)
{
	for (size_t i = 0; i < len; i++)
		if (buf[i] != pattern_byte(seed, offset + i))
			return (long)i;
	return -1;
}

char *tu_write_temp(const char *text)
{
	char tmpl[] = "/tmp/pc-test-XXXXXX";
	int fd = mkstemp(tmpl);
	if (fd < 0)
		return NULL;
	size_t len = strlen(text);
	if (write(fd, text, len) != (ssize_t)len) {
		close(fd);
		return NULL;
	}
	close(fd);
	return strdup(tmpl);
}

#include <criterion/criterion.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "common/util.h"

struct rx_reactor *tu_reactor(const struct rx_params *p)
{
	struct rx_params def;
	if (!p) {
		rx_params_default(&def);
		p = &def;
	}
	struct rx_reactor *r = NULL;
	int ret = rx_reactor_create(&r, 0, p);
	cr_assert_eq(ret, 0, "rx_reactor_create: %s", strerror(-ret));
	return r;
}

static void watchdog_fired(struct rx_reactor *r, struct rx_timer *t)
{
	bool *fired = t->arg;
	*fired = true;
	rx_reactor_stop(r);
}

uint64_t tu_run(struct rx_reactor *r, unsigned limit_ms)
{
	struct rx_timer wd;
	bool fired = false;
	rx_timer_init(&wd, watchdog_fired, &fired);
	/* A case that filled the timer heap on purpose leaves no slot for the
	 * watchdog: SIGALRM then ends a loop that hangs (the case crashes). */
	bool armed = rx_timer_start(r, &wd, RX_MS(limit_ms), 0) == 0;
	if (!armed)
		alarm(limit_ms / 1000 + 2);
	uint64_t t0 = pc_now_ns();
	int ret = rx_reactor_run(r);
	rx_timer_stop(r, &wd);
	if (!armed)
		alarm(0);
	cr_assert_eq(ret, 0, "loop failed: %s", strerror(-ret));
	cr_assert(!fired, "watchdog: the loop did not stop within %u ms",
		  limit_ms);
	return (pc_now_ns() - t0) / 1000000ull;
}

int tu_connect(uint16_t port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert(fd >= 0);
	struct sockaddr_in sin = {.sin_family = AF_INET,
				  .sin_port = htons(port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	cr_assert_eq(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0,
		     "connect: %s", strerror(errno));
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

uint16_t tu_dead_port(void)
{
	int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert(s >= 0);
	struct sockaddr_in sin = {.sin_family = AF_INET,
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sin);
	cr_assert_eq(bind(s, (struct sockaddr *)&sin, sizeof(sin)), 0);
	cr_assert_eq(getsockname(s, (struct sockaddr *)&sin, &sl), 0);
	close(s);
	return ntohs(sin.sin_port);
}

void tu_nonblock(int fd)
{
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

#include "common/log.h"

/* Tests log at WARN unless PEERCACHE_TEST_LOG says otherwise. */
__attribute__((constructor)) static void tu_log_level(void)
{
	const char *lv = getenv("PEERCACHE_TEST_LOG");
	enum pc_log_level level = PC_LOG_WARN;
	if (lv)
		pc_log_level_parse(lv, &level);
	pc_log_set_level(level);
}

int tu_rpc_send_uints(int fd, uint32_t msgid, const char *method,
		      const uint64_t *v, unsigned n)
{
	struct pc_wbuf w;
	msgpack_packer pk;
	pc_wbuf_init(&w, 0);
	pc_wbuf_packer(&w, &pk);
	rpc_pack_request(&pk, msgid, method, n);
	for (unsigned i = 0; i < n; i++)
		msgpack_pack_uint64(&pk, v[i]);
	ssize_t sent = send(fd, w.data, w.len, 0);
	int ret = sent == (ssize_t)w.len ? 0 : -1;
	pc_wbuf_free(&w);
	return ret;
}

int tu_rpc_read_reply(int fd, uint8_t *buf, size_t cap, uint32_t *msgid,
		      struct rpc_result *res, const char **why)
{
	const struct mp_limits lim = {cap, 65536, 16, (uint32_t)PC_MIN(cap, UINT32_MAX)};
	size_t have = 0, size = 0;
	while (have == 0 || mp_scan(buf, have, &lim, &size) != MP_COMPLETE) {
		if (have == cap) {
			*why = "reply longer than the buffer";
			return -1;
		}
		ssize_t n = recv(fd, buf + have, cap - have, 0);
		if (n <= 0) {
			*why = "the server closed the connection";
			return -1;
		}
		have += (size_t)n;
	}
	struct rpc_msg m;
	if (size != have) {
		*why = "bytes after the reply";
		return -1;
	}
	if (rpc_msg_parse(buf, size, &m, why) < 0)
		return -1;
	*msgid = m.msgid;
	rpc_result_from_response(&m, res);
	return 0;
}
