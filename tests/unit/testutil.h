/*
 * tests/unit/testutil.h — helpers shared by the Criterion unit tests.
 *
 * Owns: nothing global. Each Criterion test runs in its own process, so these
 * helpers may keep process-local state.
 */
#ifndef PC_TESTS_TESTUTIL_H
#define PC_TESTS_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

/* Fill buf with bytes derived from (seed, offset): a content oracle. */
void tu_fill_pattern(uint8_t *buf, size_t len, uint64_t seed, uint64_t offset);
/* Check buf against the oracle; returns the first bad offset or -1. */
long tu_check_pattern(const uint8_t *buf, size_t len, uint64_t seed,
		      uint64_t offset);
/* Write a temp file with the given text; returns a malloc'd path. */
char *tu_write_temp(const char *text);


#include "reactor/reactor.h"

/* A reactor on the calling thread with default (or given) parameters. */
struct rx_reactor *tu_reactor(const struct rx_params *p);
/* Run r until it stops; a watchdog stops it (and fails the test) after
 * limit_ms. Returns the time it ran, in ms. */
uint64_t tu_run(struct rx_reactor *r, unsigned limit_ms);
/* Plain blocking TCP client connected to 127.0.0.1:port. */
int tu_connect(uint16_t port);
/* A port of 127.0.0.1 nobody listens on now: bound, read and closed. */
uint16_t tu_dead_port(void);
/* Set O_NONBLOCK on fd. */
void tu_nonblock(int fd);
/* Send the MessagePack-RPC request [0, msgid, method, [v[0], ...]] (n
 * uint params) on blocking fd: 0 when all of it went, else -1. */
int tu_rpc_send_uints(int fd, uint32_t msgid, const char *method,
		      const uint64_t *v, unsigned n);
struct rpc_result;
/* Receive one whole MessagePack-RPC response (the only one in flight, at
 * most cap bytes) into buf on blocking fd and parse it: its msgid and its
 * result, which points into buf. 0, or -1 with why (closed, too long,
 * bytes after it, not a response). */
int tu_rpc_read_reply(int fd, uint8_t *buf, size_t cap, uint32_t *msgid,
		      struct rpc_result *res, const char **why);

#endif
